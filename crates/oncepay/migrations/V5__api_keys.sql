-- API keys a merchant can list, rotate and revoke: an id to name a key by,
-- when it was last used, and when it stops working (rotation with overlap).
ALTER TABLE api_key ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid();
ALTER TABLE api_key ADD CONSTRAINT api_key_id_uniq UNIQUE (id);
ALTER TABLE api_key ADD COLUMN last_used_at timestamptz;
ALTER TABLE api_key ADD COLUMN expires_at timestamptz;
