-- Hosted checkout sessions: a page a shop sends its customer to. The token
-- in the page's URL is the browser's only credential; only its SHA-256 is
-- stored here.
CREATE TABLE checkout_session (
    id           uuid PRIMARY KEY,
    merchant_id  uuid NOT NULL REFERENCES merchant (id),
    order_id     uuid NOT NULL REFERENCES orders (id),
    token_hash   bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    expires_at   timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX checkout_session_order_idx ON checkout_session (order_id);
