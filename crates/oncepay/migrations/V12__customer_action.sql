-- A payment waiting for its customer (3-D Secure at the bank): still
-- `pending`, with where to send the customer, and since when, so the
-- reconciler can give up on it after ONCEPAY_ACTION_TIMEOUT (asking the
-- provider first). The URL is cleared once the payment is final; when it
-- began to wait is kept (it did wait: its `payment.requires_action` event).
ALTER TABLE payment_attempt ADD COLUMN next_action_url text;
ALTER TABLE payment_attempt ADD COLUMN action_required_at timestamptz;

-- The way back to the shop: where the checkout page sends the customer
-- after paying or giving up, and the page's language (`en`, `ru`, `zh`;
-- NULL: the browser's Accept-Language).
ALTER TABLE checkout_session ADD COLUMN success_url text;
ALTER TABLE checkout_session ADD COLUMN cancel_url text;
ALTER TABLE checkout_session ADD COLUMN locale text CHECK (locale IN ('en', 'ru', 'zh'));

-- The name customers see on the checkout page (`oncepay merchant set
-- --display-name`); NULL: the merchant's name.
ALTER TABLE merchant ADD COLUMN display_name text
    CHECK (length(display_name) BETWEEN 1 AND 100);
