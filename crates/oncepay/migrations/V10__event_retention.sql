-- The retention sweeper deletes old deliveries together with their
-- attempts: each deleted delivery's foreign-key check looks its attempts
-- up by delivery, which without this index is a scan of every attempt.
CREATE INDEX webhook_attempt_delivery_idx ON webhook_attempt (delivery_id);
