-- What a merchant's backend is told: every state change it cares about is
-- one `event` row, written in the same transaction as the change (a
-- transactional outbox), and delivered to each subscribed endpoint by the
-- delivery workers of every `oncepay serve` process.

-- Per-merchant rate limits (requests per second and burst); NULL: the
-- process default (ONCEPAY_RATE_LIMIT).
ALTER TABLE merchant ADD COLUMN rate_limit_per_second integer CHECK (rate_limit_per_second > 0);
ALTER TABLE merchant ADD COLUMN rate_limit_burst integer CHECK (rate_limit_burst > 0);

CREATE TABLE event (
    id           uuid PRIMARY KEY,
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    type         text NOT NULL,
    object_type  text NOT NULL CHECK (object_type IN ('order', 'payment', 'refund')),
    object_id    uuid NOT NULL,
    -- The order the object belongs to: an order's history is one index scan.
    order_id     uuid NOT NULL,
    -- 1, 2, 3... per object, in the order of its changes: receivers drop an
    -- event whose sequence is not above the last one they applied. The
    -- object's row lock (held by every change) makes max + 1 race-free; the
    -- constraint is the guard.
    sequence     integer NOT NULL CHECK (sequence >= 1),
    -- The object as it is after the change, as the API's GET shows it.
    data         jsonb NOT NULL,
    -- Who made the change: request, webhook, reconciler or incident.
    cause        text NOT NULL CHECK (cause IN ('request', 'webhook', 'reconciler', 'incident')),
    request_id   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT event_object_sequence_uniq UNIQUE (object_id, sequence)
);
CREATE INDEX event_merchant_id_idx ON event (merchant_id, id);
CREATE INDEX event_order_idx ON event (order_id, id);

CREATE TABLE webhook_endpoint (
    id           uuid PRIMARY KEY,
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    url          text NOT NULL,
    events       text[] NOT NULL CHECK (cardinality(events) >= 1),
    -- The HMAC key of the endpoint's whsec_ secret. Signing needs the key
    -- itself (HMAC is symmetric), so a hash would be useless; see README,
    -- "Outbound webhooks", for why it is not encrypted with a second key.
    secret_key   bytea NOT NULL CHECK (length(secret_key) >= 24),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when the receiver answered 410 Gone: nothing more is sent.
    disabled_at  timestamptz,
    disabled_reason text,
    -- Set by DELETE: kept, so past deliveries still name it.
    deleted_at   timestamptz
);
CREATE INDEX webhook_endpoint_merchant_idx ON webhook_endpoint (merchant_id, id);

-- One row per (event, endpoint): the outbox's work items. Written with the
-- event, for every endpoint subscribed at that moment.
CREATE TABLE webhook_delivery (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event_id         uuid NOT NULL REFERENCES event (id),
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoint (id),
    -- Copied from the event: deliveries of one object to one endpoint go
    -- in sequence order (see store::deliveries::CLAIM).
    object_id        uuid NOT NULL,
    sequence         integer NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivered', 'failed', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    -- When it is due; a claim moves it past the lease, so a killed
    -- process's delivery is due again once the lease is over.
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- Fencing token of the current claim: only its holder records the result.
    claim_token      uuid,
    delivered_at     timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_delivery_once UNIQUE (event_id, endpoint_id)
);
CREATE INDEX webhook_delivery_due_idx
    ON webhook_delivery (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_delivery_order_idx
    ON webhook_delivery (endpoint_id, object_id, sequence) WHERE state = 'pending';

-- Every attempt, as the receiver answered it (or why it could not).
CREATE TABLE webhook_attempt (
    id             bigserial PRIMARY KEY,
    delivery_id    uuid NOT NULL REFERENCES webhook_delivery (id),
    event_id       uuid NOT NULL,
    endpoint_id    uuid NOT NULL,
    attempted_at   timestamptz NOT NULL DEFAULT now(),
    response_status integer,
    latency_ms     integer NOT NULL,
    error          text
);
CREATE INDEX webhook_attempt_event_idx ON webhook_attempt (event_id, id);
