-- Issue 55, items 4 and 6.
--
-- 1. A provider that saves an error under an idempotency key and replays
-- it (Stripe keeps a `500` for a day) pins a send to that answer: a
-- confirm or refund re-sent under the same key stays unknown, then acts a
-- day late. A payment attempt (its confirm) and a refund are sent under
-- generations of keys: 0 is the key they always had; a later one is used
-- only once the row records it, after the provider spent the one before
-- (`provider_key_spent`) and a read proved that send made nothing
-- (`store::provider_keys`). A key is derived from the row's id and its
-- generation, so the generation records every key the row was sent under.
ALTER TABLE payment_attempt
    ADD COLUMN provider_key_generation integer NOT NULL DEFAULT 0
        CHECK (provider_key_generation >= 0),
    ADD COLUMN provider_key_spent boolean NOT NULL DEFAULT false;
ALTER TABLE refund
    ADD COLUMN provider_key_generation integer NOT NULL DEFAULT 0
        CHECK (provider_key_generation >= 0),
    ADD COLUMN provider_key_spent boolean NOT NULL DEFAULT false;

-- 2. A hold its customer approved just before oncepay gave up waiting for
-- them (`ONCEPAY_ACTION_TIMEOUT`), released by that give-up's cancel, is
-- `voided` with `void_reason` `abandoned`: never `failed`,
-- `authentication_expired`.
ALTER TABLE payment_attempt DROP CONSTRAINT payment_attempt_void_reason_check;
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_void_reason_check
    CHECK (void_reason IN ('requested', 'order_cancelled', 'expired', 'cancelled_at_provider',
                           'abandoned'));
