-- Authorize now, capture later (issue 44). A manual payment is authorized
-- by its provider (`requires_capture`), then captured once, for at most
-- what was authorized, or voided (asked for, by its order's cancel, or
-- because the authorization expired). The rules below are the database's
-- line of defence behind the commands: one capture per payment, never
-- more than the amount, never a capture of a voided payment.

ALTER TABLE payment_attempt
    ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic'
        CHECK (capture_method IN ('automatic', 'manual')),
    ADD COLUMN amount_captured bigint NOT NULL DEFAULT 0,
    -- Until when the provider holds the authorization (requires_capture).
    ADD COLUMN capture_before timestamptz,
    -- Set when a void is asked for (still requires_capture: the void is in
    -- flight, and no capture may start) and kept once voided.
    ADD COLUMN void_reason text
        CHECK (void_reason IN ('requested', 'order_cancelled', 'expired')),
    -- payment.capture_deadline_approaching was written (once per payment).
    ADD COLUMN capture_reminded_at timestamptz;

-- Every payment succeeded so far was captured whole at once.
UPDATE payment_attempt SET amount_captured = amount WHERE status = 'succeeded';

ALTER TABLE payment_attempt DROP CONSTRAINT payment_attempt_status_check;
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_status_check
    CHECK (status IN ('pending', 'requires_capture', 'succeeded', 'failed', 'voided'));
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_captured_within_amount
    CHECK (amount_captured >= 0 AND amount_captured <= amount);
-- Money captured only by a succeeded payment; a voided one captured nothing.
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_captured_only_if_succeeded
    CHECK (status = 'succeeded' OR amount_captured = 0);
-- Refunds return at most what was captured (an incident's refund of a
-- failed attempt's stray charge is the exception: nothing was captured
-- for that attempt in our books).
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_refunds_within_captured
    CHECK (status <> 'succeeded' OR refunded_amount <= amount_captured);
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_authorization_is_manual
    CHECK (capture_method = 'manual' OR status NOT IN ('requires_capture', 'voided'));
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_void_reason_of_a_hold
    CHECK (void_reason IS NULL OR status IN ('requires_capture', 'voided'));
ALTER TABLE payment_attempt ADD CONSTRAINT payment_attempt_voided_says_why
    CHECK (status <> 'voided' OR void_reason IS NOT NULL);

-- An automatic payment captures its whole amount when it succeeds,
-- whichever statement moves it (a command, a webhook, the reconciler, an
-- adoption by the books reconciliation).
CREATE FUNCTION payment_attempt_automatic_capture() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'succeeded' AND NEW.capture_method = 'automatic' THEN
        NEW.amount_captured := NEW.amount;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER payment_attempt_automatic_capture
    BEFORE INSERT OR UPDATE OF status ON payment_attempt
    FOR EACH ROW EXECUTE FUNCTION payment_attempt_automatic_capture();

-- An authorized payment is live: its order takes no other payment while
-- the hold stands.
DROP INDEX payment_attempt_one_live_per_order;
CREATE UNIQUE INDEX payment_attempt_one_live_per_order
    ON payment_attempt (order_id) WHERE status IN ('pending', 'requires_capture', 'succeeded');
-- The sweeper reads holds by their deadline.
CREATE INDEX payment_attempt_capture_before_idx
    ON payment_attempt (capture_before) WHERE status = 'requires_capture';

-- One row per capture: its own id is the provider's idempotency key for
-- it (never a key made from the amount), and a payment has at most one.
CREATE TABLE payment_capture (
    id                   uuid PRIMARY KEY,
    merchant_id          uuid NOT NULL REFERENCES merchant (id),
    payment_id           uuid NOT NULL REFERENCES payment_attempt (id),
    amount               bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    status               text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    idempotency_key      text NOT NULL,
    request_fingerprint  bytea,
    failure_code         text,
    -- The reconciler's queue (store::queue), as for payments and refunds:
    -- a pending capture is read at the provider, then sent again with its
    -- own key only if the provider still holds the charge uncaptured.
    next_check_at        timestamptz NOT NULL,
    check_count          integer NOT NULL DEFAULT 0,
    decline_check_at     timestamptz,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    CONSTRAINT payment_capture_one_per_payment UNIQUE (payment_id)
);
CREATE INDEX payment_capture_pending_idx
    ON payment_capture (next_check_at) WHERE status = 'pending';

-- No capture of a voided payment, and none beyond its amount: checked on
-- the row whatever statement writes it.
CREATE FUNCTION payment_capture_of_a_hold() RETURNS trigger AS $$
DECLARE
    p payment_attempt%ROWTYPE;
BEGIN
    SELECT * INTO p FROM payment_attempt WHERE id = NEW.payment_id;
    IF NEW.amount > p.amount THEN
        RAISE EXCEPTION 'a capture of % exceeds its payment''s amount %', NEW.amount, p.amount
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_capture_within_amount';
    END IF;
    IF NEW.status <> 'failed' AND (p.status = 'voided'
            OR (TG_OP = 'INSERT' AND (p.status <> 'requires_capture' OR p.void_reason IS NOT NULL))) THEN
        RAISE EXCEPTION 'payment % is %: it cannot be captured', p.id, p.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_capture_of_a_hold';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER payment_capture_of_a_hold
    BEFORE INSERT OR UPDATE ON payment_capture
    FOR EACH ROW EXECUTE FUNCTION payment_capture_of_a_hold();

-- A payment cannot be voided once one of its captures succeeded.
CREATE FUNCTION payment_attempt_void_without_capture() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'voided' AND OLD.status <> 'voided' AND EXISTS (
            SELECT 1 FROM payment_capture c
             WHERE c.payment_id = NEW.id AND c.status = 'succeeded') THEN
        RAISE EXCEPTION 'payment % was captured: it cannot be voided', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payment_attempt_void_without_capture';
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER payment_attempt_void_without_capture
    BEFORE UPDATE OF status ON payment_attempt
    FOR EACH ROW EXECUTE FUNCTION payment_attempt_void_without_capture();

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('awaiting_payment', 'authorized', 'paid', 'refunded', 'cancelled'));

-- Grows with traffic: its first statistics wait for a thousand rows, as
-- the other such tables' do (V7__first_statistics.sql).
ALTER TABLE payment_capture SET (autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000);

-- A checkout page may authorize only (`POST /orders/{id}/checkout` with
-- `capture_method: manual`): its payments are made so.
ALTER TABLE checkout_session ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic'
    CHECK (capture_method IN ('automatic', 'manual'));
