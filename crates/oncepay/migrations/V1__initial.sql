-- oncepay schema. Every guarantee the service makes is enforced here, by
-- constraints and row locks, so that any number of `oncepay serve` processes
-- sharing this database stay correct.

CREATE TABLE merchant (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 100),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Only a SHA-256 of each API key is stored: a leaked table leaks no key.
CREATE TABLE api_key (
    key_hash     bytea PRIMARY KEY CHECK (length(key_hash) = 32),
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    key_prefix   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_key_merchant_idx ON api_key (merchant_id);

CREATE TABLE orders (
    id           uuid PRIMARY KEY,
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    customer_id  text NOT NULL,
    items        jsonb NOT NULL,
    amount       bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    currency     char(3) NOT NULL,
    status       text NOT NULL
                 CHECK (status IN ('awaiting_payment', 'paid', 'refunded', 'cancelled')),
    metadata     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX orders_merchant_idx ON orders (merchant_id, created_at);

CREATE TABLE payment_attempt (
    id                  uuid PRIMARY KEY,
    merchant_id         uuid NOT NULL REFERENCES merchant (id),
    order_id            uuid NOT NULL REFERENCES orders (id),
    idempotency_key     text NOT NULL,
    amount              bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    currency            char(3) NOT NULL,
    status              text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider            text NOT NULL,
    -- The token is needed to repeat the charge with the same provider key
    -- when a command is resumed after a crash or settled by the reconciler.
    payment_method      text NOT NULL,
    provider_charge_id  text,
    failure_code        text,
    failure_message     text,
    refunded_amount     bigint NOT NULL DEFAULT 0 CHECK (refunded_amount >= 0 AND refunded_amount <= amount),
    -- Reconciler lease: a pending attempt is checked when this time has come.
    next_check_at       timestamptz NOT NULL,
    check_count         integer NOT NULL DEFAULT 0,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    -- Second line of defence: one attempt per (order, key), even after the
    -- idempotency record has expired.
    CONSTRAINT payment_attempt_order_key_uniq UNIQUE (order_id, idempotency_key)
);
-- Third line of defence: at most one attempt per order that is pending or
-- succeeded, so an unknown outcome is never answered with a second charge.
CREATE UNIQUE INDEX payment_attempt_one_live_per_order
    ON payment_attempt (order_id) WHERE status IN ('pending', 'succeeded');
CREATE UNIQUE INDEX payment_attempt_charge_idx
    ON payment_attempt (provider, provider_charge_id) WHERE provider_charge_id IS NOT NULL;
CREATE INDEX payment_attempt_pending_idx
    ON payment_attempt (next_check_at) WHERE status = 'pending';

CREATE TABLE refund (
    id                  uuid PRIMARY KEY,
    merchant_id         uuid NOT NULL REFERENCES merchant (id),
    payment_id          uuid NOT NULL REFERENCES payment_attempt (id),
    amount              bigint NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000),
    status              text NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    reason              text,
    -- Set when the refund was made by cancelling a paid order: settling it
    -- also moves the order to `cancelled`.
    cancels_order       boolean NOT NULL DEFAULT false,
    provider_refund_id  text,
    failure_code        text,
    next_check_at       timestamptz NOT NULL,
    check_count         integer NOT NULL DEFAULT 0,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);
CREATE INDEX refund_payment_idx ON refund (payment_id);
CREATE INDEX refund_pending_idx ON refund (next_check_at) WHERE status = 'pending';

-- The idempotency engine's table (contract section 4).
CREATE TABLE idempotency_record (
    merchant_id        uuid NOT NULL REFERENCES merchant (id),
    idempotency_key    text NOT NULL,
    fingerprint        bytea NOT NULL,
    -- Which command and with what input, so that any process (a retry or
    -- the reconciler) can resume it after a crash.
    command            text NOT NULL,
    request            jsonb NOT NULL,
    state              text NOT NULL CHECK (state IN ('executing', 'completed')),
    recovery_point     text NOT NULL,
    resource_id        uuid,
    -- Fencing token: only the holder of the current lease may advance or
    -- complete the record.
    lease_token        uuid,
    lease_expires_at   timestamptz,
    response_status    smallint,
    response_body      bytea,
    response_location  text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    expires_at         timestamptz NOT NULL,
    PRIMARY KEY (merchant_id, idempotency_key),
    CHECK (state <> 'completed' OR response_status IS NOT NULL)
);
CREATE INDEX idempotency_record_expires_idx ON idempotency_record (expires_at);
CREATE INDEX idempotency_record_lease_idx
    ON idempotency_record (lease_expires_at) WHERE state = 'executing';

-- Inbound provider events, deduplicated by (provider, event id). The payload
-- is kept, including events for charges we do not know: nothing is lost.
CREATE TABLE webhook_event (
    provider     text NOT NULL,
    event_id     text NOT NULL,
    event_type   text NOT NULL,
    payload      jsonb NOT NULL,
    outcome      text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
