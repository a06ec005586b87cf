-- A revocation answers only once every running `oncepay serve` process has
-- forgotten the key (issue: a revoked key was accepted by another process
-- right after DELETE /api_keys/{id} answered, and a request that verified
-- the key just before the revocation could cache it again afterwards).
--
-- `api_key_revocation` is one row whose `seq` every revocation (and every
-- rotation that expires a key) increments in its own transaction. The row
-- lock it takes makes commit order the order of `seq`, and lets a process
-- that starts listening read a `seq` no revocation still in flight can be
-- below (SELECT ... FOR SHARE waits for it).
CREATE TABLE api_key_revocation (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq bigint NOT NULL DEFAULT 0 CHECK (seq >= 0)
);
INSERT INTO api_key_revocation DEFAULT VALUES;

-- One row per process's key cache: the highest `seq` it has applied, and
-- when its listening connection last answered. The revoker waits until
-- every process seen within the staleness bound has applied its `seq`; a
-- process that has not answered within that bound does not use its cache
-- (it verifies every key from the database), so it need not be waited for.
CREATE TABLE key_cache_process (
    id uuid PRIMARY KEY,
    applied bigint NOT NULL CHECK (applied >= 0),
    seen_at timestamptz NOT NULL DEFAULT now()
);
