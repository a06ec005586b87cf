-- Disputes (chargebacks): a customer's bank takes a payment's money back
-- while the provider reviews the merchant's evidence. One row per provider
-- dispute, on the merchant's payment; its amount cannot be refunded while
-- the dispute is open or after it is lost (`domain::refund::refundable`).
-- Statuses only move forward (needs_response -> under_review -> won|lost);
-- a closed dispute never reopens: every update is
-- `UPDATE ... WHERE status NOT IN ('won', 'lost')`.
CREATE TABLE dispute (
    id                   uuid PRIMARY KEY,
    merchant_id          uuid NOT NULL REFERENCES merchant (id),
    payment_id           uuid NOT NULL REFERENCES payment_attempt (id),
    order_id             uuid NOT NULL,
    provider             text NOT NULL,
    provider_dispute_id  text NOT NULL,
    amount               bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    currency             text NOT NULL,
    status               text NOT NULL
                         CHECK (status IN ('needs_response', 'under_review', 'won', 'lost')),
    provider_status      text NOT NULL,
    reason               text NOT NULL,
    evidence_due_by      timestamptz,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    UNIQUE (provider, provider_dispute_id)
);
CREATE INDEX dispute_payment_idx ON dispute (payment_id);
-- GET /disputes: newest first per merchant.
CREATE INDEX dispute_merchant_idx ON dispute (merchant_id, id);
-- The evidence-due alert reads open disputes by their deadline.
CREATE INDEX dispute_evidence_due_idx ON dispute (evidence_due_by)
    WHERE status = 'needs_response';

ALTER TABLE event DROP CONSTRAINT event_object_type_check;
ALTER TABLE event ADD CONSTRAINT event_object_type_check
    CHECK (object_type IN ('order', 'payment', 'refund', 'dispute'));
