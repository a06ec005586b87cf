-- What only webhooks carry, read back by the books pass (issue 55, item 3).
-- (V27 is another change's.)
--
-- 1. A refund that fails after it succeeded (a card refund its issuer
-- returned) is told by its webhook alone. The books pass reads our
-- succeeded refunds of the last 30 days again, the least recently read
-- first, a bounded number per pass (ONCEPAY_BOOKS_READ_BACK_LIMIT):
-- `reversal_checked_at` is when one was last read (NULL: never). A
-- succeeded refund's `updated_at` is its success (or a little later, when
-- its provider id is learned; writing `reversal_checked_at` leaves it
-- alone), so the index keeps the look to the recent ones.
ALTER TABLE refund ADD COLUMN reversal_checked_at timestamptz;
CREATE INDEX refund_reversal_watch_idx ON refund (updated_at) WHERE status = 'succeeded';

-- 2. A dispute that moves at the provider (a chargeback after an inquiry,
-- evidence under review, won, lost) is told by its webhook alone: the
-- books pass reads ours still open again by id, the least recently read
-- first (`read_back_at`: when one was last read from its provider).
ALTER TABLE dispute ADD COLUMN read_back_at timestamptz;
CREATE INDEX dispute_open_read_back_idx ON dispute (provider, read_back_at NULLS FIRST)
    WHERE status NOT IN ('won', 'lost');

-- 3. A run's phase after `missing`: `read_back`; its report counts the
-- refunds found failed since they succeeded (`reversed`) and the disputes
-- read back that changed what we hold (`disputes`).
ALTER TABLE books_run DROP CONSTRAINT books_run_phase_check;
ALTER TABLE books_run ADD CONSTRAINT books_run_phase_check
    CHECK (phase IN ('charges', 'refunds', 'missing', 'read_back', 'done'));
ALTER TABLE books_run ADD COLUMN reversed bigint NOT NULL DEFAULT 0;
ALTER TABLE books_run ADD COLUMN disputes bigint NOT NULL DEFAULT 0;
