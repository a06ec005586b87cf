-- A payment waiting for its customer (3-D Secure at the bank): still
-- `pending`, with where to send the customer, and since when, so the
-- reconciler can give up on it after ONCEPAY_ACTION_TIMEOUT (asking the
-- provider first). Both are cleared once the payment is final.
ALTER TABLE payment_attempt ADD COLUMN next_action_url text;
ALTER TABLE payment_attempt ADD COLUMN action_required_at timestamptz;
