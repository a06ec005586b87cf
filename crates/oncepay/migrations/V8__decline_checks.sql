-- A decline learned from a charge's or refund's own answer is confirmed
-- once by a status read: an answer can be replaced on its way (a gateway, a
-- proxy, a provider bug) while the money moved, and without this read it
-- would be seen only if the provider's webhook arrives. NULL: nothing to
-- confirm. Adding a nullable column without a default rewrites nothing.
ALTER TABLE payment_attempt ADD COLUMN decline_check_at timestamptz;
ALTER TABLE refund ADD COLUMN decline_check_at timestamptz;

-- The reconciler's queues of declines to confirm; empty in the steady state.
CREATE INDEX payment_attempt_decline_check_idx
    ON payment_attempt (decline_check_at) WHERE decline_check_at IS NOT NULL;
CREATE INDEX refund_decline_check_idx
    ON refund (decline_check_at) WHERE decline_check_at IS NOT NULL;
