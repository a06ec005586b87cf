-- Reconciliation against the provider's books (issue 25).

-- The request fingerprint of the command that made the attempt or refund:
-- sent to the provider in the object's metadata (with a hash of the key),
-- so an attempt or refund rebuilt from the provider's books rebuilds its
-- idempotency record too. NULL for rows made before this migration.
ALTER TABLE payment_attempt ADD COLUMN request_fingerprint bytea;
ALTER TABLE refund ADD COLUMN request_fingerprint bytea;

-- Incidents the books reconciliation finds. A charge no order of ours can
-- own (an orphan) has no attempt; a mismatch or a missing object may be
-- about an attempt or a refund.
ALTER TABLE incident ALTER COLUMN payment_id DROP NOT NULL;
ALTER TABLE incident ALTER COLUMN refund_id DROP NOT NULL;
ALTER TABLE incident DROP CONSTRAINT incident_kind_check;
ALTER TABLE incident ADD CONSTRAINT incident_kind_check CHECK (kind IN (
    'charge_on_failed_attempt', 'refund_on_failed_refund',
    'orphan_charge', 'books_mismatch', 'missing_at_provider'));
ALTER TABLE incident ADD COLUMN provider text;
ALTER TABLE incident ADD COLUMN detail text;
-- What was done about it: `refunded`, `refund_pending` (the refund's
-- outcome is not known yet; the next pass asks again with the same key),
-- `held` (ONCEPAY_ORPHAN_POLICY=hold: a person decides), or NULL.
ALTER TABLE incident ADD COLUMN resolution text;
CREATE UNIQUE INDEX incident_books_once ON incident (kind, provider, provider_object_id)
    WHERE kind IN ('orphan_charge', 'books_mismatch', 'missing_at_provider');

-- One row per reconciliation run over a window of the provider's books,
-- with its report. `position` is the high-water mark: objects created up
-- to it were handled, so a run cut off by a crash resumes there.
CREATE TABLE books_run (
    id           uuid PRIMARY KEY,
    provider     text NOT NULL,
    trigger      text NOT NULL CHECK (trigger IN ('cli', 'schedule', 'restore')),
    dry_run      boolean NOT NULL,
    window_from  timestamptz NOT NULL,
    window_until timestamptz NOT NULL CHECK (window_until > window_from),
    -- Charges are walked first, then refunds, then our own rows the
    -- provider lacks; `position` is the creation time reached in the phase.
    phase        text NOT NULL DEFAULT 'charges'
                 CHECK (phase IN ('charges', 'refunds', 'missing', 'done')),
    position     timestamptz NOT NULL,
    matched      bigint NOT NULL DEFAULT 0,
    adopted      bigint NOT NULL DEFAULT 0,
    refunded     bigint NOT NULL DEFAULT 0,
    held         bigint NOT NULL DEFAULT 0,
    mismatched   bigint NOT NULL DEFAULT 0,
    missing      bigint NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX books_run_provider_idx ON books_run (provider, started_at DESC);
-- At most one unfinished run per provider: a crashed run is resumed, not
-- started again beside itself.
CREATE UNIQUE INDEX books_run_one_open ON books_run (provider)
    WHERE finished_at IS NULL AND NOT dry_run;

-- The database's lineage, as the last `oncepay serve` saw it: a restore
-- from a backup (or a failover) starts a new PostgreSQL timeline, while
-- this row comes back as it was at the restore point. A process that
-- finds the timeline moved opens a gap from `seen_at` (minus the lease),
-- reconciles it with the provider's books, and only then takes money
-- commands; `gap_from` is set while that is under way.
-- The cluster's system identifier is kept too: a logical dump restored
-- into a new cluster may start on timeline 1 again, but not on the same
-- system.
CREATE TABLE database_lineage (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    timeline   bigint NOT NULL,
    system_id  bigint,
    seen_at    timestamptz NOT NULL,
    gap_from   timestamptz
);
