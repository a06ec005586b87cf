-- What a key may do: `read` (GETs), `write` (orders, payments, refunds,
-- cancel, checkout sessions), `admin` (API keys, webhook endpoints,
-- redelivery, the audit trail). Keys made before scopes existed keep every
-- scope (the column's default), so no client breaks on upgrade.
ALTER TABLE api_key
    ADD COLUMN scopes text[] NOT NULL DEFAULT ARRAY['read', 'write', 'admin']::text[]
        CHECK (scopes <@ ARRAY['read', 'write', 'admin']::text[] AND cardinality(scopes) >= 1);

-- Who did what to a merchant's settings: every administrative action, by
-- API or by the CLI, written in the same transaction as the change. Never
-- a secret. Append-only: the trigger refuses every UPDATE and DELETE, so
-- nothing in oncepay (or a mistaken statement) can rewrite history.
CREATE TABLE audit_event (
    id          uuid PRIMARY KEY,
    merchant_id uuid NOT NULL REFERENCES merchant (id),
    -- `api_key` (actor: the key's id) or `cli` (actor: the OS user).
    actor_type  text NOT NULL CHECK (actor_type IN ('api_key', 'cli')),
    actor       text NOT NULL,
    action      text NOT NULL,
    target_type text NOT NULL,
    target_id   text NOT NULL,
    request_id  text,
    change      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_event_merchant_idx ON audit_event (merchant_id, id DESC);

CREATE FUNCTION audit_event_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_event is append-only';
END
$$;
CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON audit_event
    FOR EACH ROW EXECUTE FUNCTION audit_event_append_only();
