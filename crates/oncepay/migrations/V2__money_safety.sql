-- Money safety under the faults real providers produce, and webhooks that
-- the provider must confirm.

-- Second line of defence for refunds, as payments have: the key that made
-- a refund stays on it, so a retry after the idempotency record expired
-- finds the refund it made instead of paying out again. Refunds oncepay
-- makes on its own (incidents) carry no client key; NULLs never conflict.
ALTER TABLE refund ADD COLUMN idempotency_key text;
ALTER TABLE refund ADD CONSTRAINT refund_payment_key_uniq UNIQUE (payment_id, idempotency_key);

-- A refund oncepay made to return money the provider took for an attempt
-- it holds as failed. Settling it never moves the order.
ALTER TABLE refund ADD COLUMN incident boolean NOT NULL DEFAULT false;

-- When a payment or refund first stayed pending past the alarm threshold
-- (logged and counted once).
ALTER TABLE payment_attempt ADD COLUMN alarmed_at timestamptz;
ALTER TABLE refund ADD COLUMN alarmed_at timestamptz;

-- Money the provider moved that oncepay's books did not expect: a charge
-- for an attempt held as failed (answered with one refund through the
-- ordinary refund path: pending, sent by the reconciler with the refund id
-- as the provider key), or a refund paid out that is held as failed
-- (recorded for a person; nothing can be taken back automatically).
CREATE TABLE incident (
    id                  uuid PRIMARY KEY,
    kind                text NOT NULL
                        CHECK (kind IN ('charge_on_failed_attempt', 'refund_on_failed_refund')),
    merchant_id         uuid NOT NULL REFERENCES merchant (id),
    payment_id          uuid NOT NULL REFERENCES payment_attempt (id),
    -- The compensating refund, or the refund the provider paid out.
    refund_id           uuid NOT NULL REFERENCES refund (id),
    provider_object_id  text,
    amount              bigint NOT NULL,
    detected_by         text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
-- Once per attempt, once per refund: a repeated report records nothing new.
CREATE UNIQUE INDEX incident_charge_once ON incident (payment_id)
    WHERE kind = 'charge_on_failed_attempt';
CREATE UNIQUE INDEX incident_refund_once ON incident (refund_id)
    WHERE kind = 'refund_on_failed_refund';

-- What the provider said when asked to confirm an event: set when a read
-- confirmed it; `detail` says why one was not applied.
ALTER TABLE webhook_event ADD COLUMN confirmed_at timestamptz;
ALTER TABLE webhook_event ADD COLUMN detail text;
