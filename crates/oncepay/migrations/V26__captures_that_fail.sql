-- Captures that fail, and holds cancelled at the provider (issue 55).
--
-- 1. A capture the provider refuses (a decline of the capture, an amount
-- it will not take) ends `failed` while the hold stands: the payment stays
-- `requires_capture` and may be captured again, by a new capture row whose
-- id, the provider's idempotency key, is new (a refused key is never sent
-- again: the provider answers it the same). So a payment has at most one
-- capture pending or succeeded, and any number that failed. The index
-- keeps the name of the constraint it replaces: the store maps that name
-- to `payment_not_capturable`, and a unique index's violation is reported
-- under the index's name.
ALTER TABLE payment_capture DROP CONSTRAINT payment_capture_one_per_payment;
CREATE UNIQUE INDEX payment_capture_one_per_payment
    ON payment_capture (payment_id) WHERE status IN ('pending', 'succeeded');
-- The payment's captures, failed ones included, are read by payment (the
-- unique constraint dropped above was that index).
CREATE INDEX payment_capture_payment_idx ON payment_capture (payment_id);

-- 2. A hold cancelled at its provider by someone other than oncepay (a
-- cancel in Stripe's Dashboard: `requested_by_customer`, `fraudulent`,
-- `duplicate`) while it could still be captured is told apart from an
-- expiry; the provider's reason is kept in the payment's `failure_code`.
ALTER TABLE payment_attempt DROP CONSTRAINT payment_attempt_void_reason_check;
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_void_reason_check
    CHECK (void_reason IN ('requested', 'order_cancelled', 'expired', 'cancelled_at_provider'));
