//! Tables grown before the scenarios (`--records`, `--old-events`): how
//! cost grows with them, and how fast the sweepers work through them.

use std::time::Instant;

use sqlx::PgPool;
use uuid::Uuid;

use crate::floor;
use crate::harness::{metric, Bench};

/// Where the sweepers stood when the scenarios started.
pub struct Baseline {
    retained: u64,
    swept: u64,
    started: Instant,
}

/// Grows the tables as `--records` and `--old-events` ask: what the report
/// says of them, and where the sweepers stood then.
pub async fn grow(b: &Bench<'_>) -> Result<(String, Baseline), String> {
    let mut grown = String::new();
    if b.args.records > 0 {
        records(b.db, b.merchant, b.args.records, &b.fixture).await?;
        grown += &format!(
            "\nTables before the scenarios: {} completed idempotency records (half expired) and their orders; {}.\n",
            b.args.records,
            sizes(b.db).await
        );
    }
    if b.args.old_events > 0 {
        old_events(b.db, b.merchant, b.args.old_events).await?;
        grown += &format!(
            "\nOld events before the scenarios: {} (40 days old, delivered, one attempt each; {} of them past retention and not an object's newest).\n",
            b.args.old_events,
            b.args.old_events / 4 * 3
        );
    }
    let baseline = Baseline {
        retained: metric(b, "oncepay_retention_deleted_total{table=\"event\"} ").await,
        swept: sweeper_deleted(b).await,
        started: Instant::now(),
    };
    Ok((grown, baseline))
}

/// What the sweepers did with the grown tables since `baseline`, for the
/// report.
pub async fn swept(b: &Bench<'_>, baseline: Baseline) -> String {
    let mut grown = String::new();
    if b.args.records > 0 {
        let swept = sweeper_deleted(b).await.saturating_sub(baseline.swept);
        let secs = baseline.started.elapsed().as_secs_f64();
        grown += &format!(
            "After them: {}; the sweeper deleted {swept} expired records meanwhile ({:.0} rows/s over {secs:.0} s).\n",
            sizes(b.db).await,
            swept as f64 / secs
        );
    }
    if b.args.old_events > 0 {
        let deleted = metric(b, "oncepay_retention_deleted_total{table=\"event\"} ")
            .await
            .saturating_sub(baseline.retained);
        let secs = baseline.started.elapsed().as_secs_f64();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM event")
            .fetch_one(b.db)
            .await
            .unwrap_or(-1);
        grown += &format!(
            "After them: the retention sweeper deleted {deleted} events (with their deliveries and attempts) in {secs:.0} s ({:.0} events/s), {left} events left.\n",
            deleted as f64 / secs
        );
    }
    grown
}

/// Puts `n` completed idempotency records with their orders in the tables,
/// a million per statement; every other one already expired. Ids are
/// time-ordered (older than the run), as the service's UUID v7 are.
async fn records(db: &PgPool, merchant: Uuid, n: u64, f: &floor::Fixture) -> Result<(), String> {
    const CHUNK: u64 = 1_000_000;
    let mut done = 0;
    while done < n {
        let upto = (done + CHUNK).min(n);
        eprintln!("populating records {done}..{upto} of {n} ...");
        sqlx::query(
            "WITH o AS (
               INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status, metadata, created_at, updated_at)
               SELECT (lpad(to_hex(1700000000000 + i), 12, '0') || substr(md5(i::text), 1, 20))::uuid, $1,
                      'cus_pre', '[{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1250}]', 2500, 'EUR',
                      'awaiting_payment', '{}', now(), now()
                 FROM generate_series($2::bigint, $3::bigint - 1) AS i
               RETURNING id)
             INSERT INTO idempotency_record (merchant_id, idempotency_key, fingerprint, command, request,
                 state, recovery_point, resource_id, response_status, response_body, response_location,
                 created_at, updated_at, expires_at)
             SELECT $1, 'pre-' || o.id, sha256(convert_to(o.id::text, 'UTF8')), 'create_order', $4::jsonb,
                    'completed', 'finished', o.id, 201, convert_to($5, 'UTF8'), '/orders/' || o.id,
                    now(), now(),
                    CASE WHEN get_byte(decode(md5(o.id::text), 'hex'), 0) % 2 = 0
                         THEN now() - interval '1 minute' ELSE now() + interval '1 day' END
               FROM o",
        )
        .bind(merchant)
        .bind(done as i64)
        .bind(upto as i64)
        .bind(&f.order_request)
        .bind(&f.order_response)
        .execute(db)
        .await
        .map_err(|e| format!("populating: {e}"))?;
        done = upto;
    }
    // One statement each: VACUUM runs outside a transaction block.
    for table in ["idempotency_record", "orders"] {
        sqlx::raw_sql(&format!("VACUUM ANALYZE {table}"))
            .execute(db)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Puts `n` delivered events 40 days old in the tables, with a delivery
/// and an attempt each, half a million per statement, in objects of four
/// events (sequences 1 to 4). Ids are time-ordered and 40 days old, as the
/// service's UUID v7 would be.
async fn old_events(db: &PgPool, merchant: Uuid, n: u64) -> Result<(), String> {
    const CHUNK: u64 = 500_000;
    let endpoint = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhook_endpoint (id, merchant_id, url, events, secret_key, deleted_at)
         VALUES ($1, $2, 'http://127.0.0.1:9/old', ARRAY['*'], decode(repeat('ab', 32), 'hex'), now())",
    )
    .bind(endpoint)
    .bind(merchant)
    .execute(db)
    .await
    .map_err(|e| format!("an endpoint for the old events: {e}"))?;
    let mut done = 0;
    while done < n {
        let upto = (done + CHUNK).min(n);
        eprintln!("populating old events {done}..{upto} of {n} ...");
        sqlx::query(
            "WITH t AS (SELECT (extract(epoch FROM now() - interval '40 days') * 1000)::bigint AS ms),
             ev AS (
               INSERT INTO event (id, merchant_id, type, object_type, object_id, order_id, sequence, data, cause, created_at)
               SELECT (lpad(to_hex(t.ms + i / 4), 12, '0') || '7' || substr(md5(i::text), 1, 19))::uuid, $1,
                      'payment.succeeded', 'payment',
                      (lpad(to_hex(t.ms + i / 4), 12, '0') || 'a' || substr(md5('o' || (i / 4)::text), 1, 19))::uuid,
                      (lpad(to_hex(t.ms + i / 4), 12, '0') || 'b' || substr(md5('r' || (i / 4)::text), 1, 19))::uuid,
                      (i % 4) + 1, '{}'::jsonb, 'request', now() - interval '40 days'
                 FROM generate_series($2::bigint, $3::bigint - 1) AS i, t
               RETURNING id, object_id, sequence),
             d AS (
               INSERT INTO webhook_delivery (event_id, endpoint_id, object_id, sequence, state, attempts, delivered_at, created_at)
               SELECT ev.id, $4, ev.object_id, ev.sequence, 'delivered', 1, now() - interval '40 days', now() - interval '40 days'
                 FROM ev
               RETURNING id, event_id)
             INSERT INTO webhook_attempt (delivery_id, event_id, endpoint_id, attempted_at, response_status, latency_ms)
             SELECT d.id, d.event_id, $4, now() - interval '40 days', 200, 5 FROM d",
        )
        .bind(merchant)
        .bind(done as i64)
        .bind(upto as i64)
        .bind(endpoint)
        .execute(db)
        .await
        .map_err(|e| format!("populating old events: {e}"))?;
        done = upto;
    }
    for table in ["event", "webhook_delivery", "webhook_attempt"] {
        sqlx::raw_sql(&format!("VACUUM ANALYZE {table}"))
            .execute(db)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The sizes of the two tables that grow with every create.
async fn sizes(db: &PgPool) -> String {
    let row: Result<(i64, i64, i64, i64, i64), _> = sqlx::query_as(
        "SELECT (SELECT count(*) FROM idempotency_record),
                pg_table_size('idempotency_record'), pg_indexes_size('idempotency_record'),
                pg_table_size('orders'), pg_indexes_size('orders')",
    )
    .fetch_one(db)
    .await;
    let mib = |b: i64| b as f64 / 1048576.0;
    match row {
        Ok((records, rt, ri, ot, oi)) => format!(
            "{records} records; idempotency_record {:.0} MiB + {:.0} MiB of indexes, orders {:.0} MiB + {:.0} MiB of indexes",
            mib(rt), mib(ri), mib(ot), mib(oi)
        ),
        Err(e) => format!("sizes unreadable: {e}"),
    }
}

/// `oncepay_sweeper_deleted_total` from the service's metrics.
async fn sweeper_deleted(b: &Bench<'_>) -> u64 {
    metric(b, "oncepay_sweeper_deleted_total ").await
}
