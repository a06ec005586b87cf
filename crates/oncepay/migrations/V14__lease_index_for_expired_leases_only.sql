-- The lease index serves one question: which executing records' leases
-- have expired (the reconciler's take-over, `lease_expires_at < now()`).
--
-- Its predicate was `state = 'executing'` alone, which every write under a
-- lease also states (with the record's primary key and our lease token).
-- With statistics taken while few records were executing, the planner
-- judged the whole partial index smaller than one primary-key lookup and
-- scanned it, filtering by the key (alone, or ANDed with the key's bitmap).
-- But every record that completes leaves a dead entry in that index until
-- the next vacuum, so under load each such write read thousands of them:
-- after create-order's run in `make bench`, a third of PostgreSQL's time
-- during pay (BENCHMARKS.md, "Group commit").
--
-- A predicate that also states `lease_expires_at IS NOT NULL` is implied
-- by the take-over's `lease_expires_at < now()` (a strict comparison), and
-- by no write that names only the key, the token and the state: those are
-- left with the primary key. tests/api/plans.rs holds it.
DROP INDEX idempotency_record_lease_idx;
CREATE INDEX idempotency_record_lease_idx ON idempotency_record (lease_expires_at)
    WHERE state = 'executing' AND lease_expires_at IS NOT NULL;
