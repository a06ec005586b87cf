-- The first statistics of a table that grows with traffic are taken only
-- once it holds a thousand rows.
--
-- The service runs every statement on its generic plan (store::GENERIC_PLANS),
-- made once per connection and kept until the table's statistics next
-- change. A table never vacuumed nor analysed is planned as if it had ten
-- pages, so its key lookups use their indexes. Autovacuum's defaults analyse
-- a table after its first 50 changed rows and vacuum it after its first 50
-- dead ones: plans made then see a table of two or three pages, where a
-- sequential scan is cheaper, and keep scanning it while it grows, until
-- the next automatic pass (up to `autovacuum_naptime`, a minute, later). On
-- a new deployment that took a smoke test before its traffic, that was a
-- minute of every payment scanning `payment_attempt` and `event` whole
-- (BENCHMARKS.md, step 15). Measured on this schema, key lookups beat a scan
-- from about 200 to 300 rows; a thousand leaves room for wider rows. Past
-- the first thousand rows the usual scale factors govern, so large tables
-- are vacuumed and analysed as before (a thousand instead of fifty rows on
-- top of 10 or 20 %).
--
-- Setting autovacuum parameters takes a SHARE UPDATE EXCLUSIVE lock: reads
-- and writes go on while this applies to a live database.
--
-- tests/api/plans.rs holds the service to this.
DO $$
DECLARE
    growing text;
BEGIN
    FOREACH growing IN ARRAY ARRAY['orders', 'payment_attempt', 'refund',
        'idempotency_record', 'webhook_event', 'checkout_session', 'event',
        'webhook_delivery', 'webhook_attempt']
    LOOP
        EXECUTE format('ALTER TABLE %I SET (autovacuum_analyze_threshold = 1000, '
            'autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_threshold = 1000)',
            growing);
    END LOOP;
END
$$;
