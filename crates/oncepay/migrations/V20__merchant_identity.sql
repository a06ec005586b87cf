-- A merchant's own identity provider (issue 47): bearer tokens (JWTs) its
-- sign-in issues are accepted when signed by a key of `jwks_url`, issued by
-- `issuer` for `audience`. An issuer belongs to at most one merchant (the
-- unique index): a token's `iss` selects the merchant, so two merchants
-- trusting one issuer would let one's customers act at the other.
CREATE TABLE merchant_identity (
    merchant_id  uuid PRIMARY KEY REFERENCES merchant (id),
    issuer       text NOT NULL CHECK (length(issuer) BETWEEN 1 AND 2048),
    jwks_url     text NOT NULL CHECK (length(jwks_url) BETWEEN 1 AND 2048),
    audience     text NOT NULL CHECK (length(audience) BETWEEN 1 AND 2048),
    roles_claim  text NOT NULL DEFAULT 'roles' CHECK (length(roles_claim) BETWEEN 1 AND 100),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX merchant_identity_issuer_uniq ON merchant_identity (issuer);

-- Who acted, for a token: the role it acted in (`customer`, `seller`), its
-- `sub` (in `actor`) and its issuer.
ALTER TABLE audit_event DROP CONSTRAINT audit_event_actor_type_check;
ALTER TABLE audit_event ADD CONSTRAINT audit_event_actor_type_check
    CHECK (actor_type IN ('api_key', 'cli', 'customer', 'seller'));
ALTER TABLE audit_event ADD COLUMN actor_issuer text;

-- Who asked for the change an event reports (`{"type": "api_key", "id"}`,
-- `{"type": "customer" | "seller", "sub", "issuer"}`); NULL for a change
-- no authenticated caller asked for (a checkout page, a provider's webhook,
-- the reconciler on its own).
ALTER TABLE event ADD COLUMN actor jsonb;
