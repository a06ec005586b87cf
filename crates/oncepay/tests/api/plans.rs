//! The plans a new deployment runs on. Every statement runs on its generic
//! plan (`store::GENERIC_PLANS`), made once per connection and kept until
//! the table's statistics change; plans made from statistics of a nearly
//! empty table scan it whole while it grows. Migration V7 makes autovacuum
//! take a growing table's first statistics only once key lookups beat a
//! scan; this holds it to that.

use crate::helpers::*;
use sqlx::{Executor, PgConnection, Row};

/// The tables that grow with traffic: each must wait as long as the ones
/// whose lookups are planned below.
const GROWING: &[&str] = &[
    "orders",
    "payment_attempt",
    "refund",
    "idempotency_record",
    "webhook_event",
    "checkout_session",
    "event",
    "webhook_delivery",
    "webhook_attempt",
    "ledger_account",
    "ledger_transfer",
    "ledger_open_pending",
    "payment_capture",
];

/// The lookups every create and payment makes, each in the shape of the
/// store's statement that makes it (same table, same key columns), with
/// arguments (`{m}` is the merchant): the record by key, the order,
/// the order's live attempt, the attempt of a provider charge (webhooks),
/// the record under our lease (every write that completes or settles a
/// command), the webhook's statement that finds its attempt (whether its
/// command still executes), the object's last event sequence.
const LOOKUPS: &[(&str, &str, &str)] = &[
    (
        "record_by_key",
        "SELECT state FROM idempotency_record WHERE merchant_id = $1 AND idempotency_key = $2",
        "'{m}', 'k'",
    ),
    (
        "order_by_id",
        "SELECT status FROM orders WHERE id = $1",
        "'{m}'",
    ),
    (
        "live_attempt",
        oncepay::store::payments::LIVE_ATTEMPT,
        "'{m}'",
    ),
    (
        "attempt_by_charge",
        "SELECT id FROM payment_attempt WHERE provider = $1 AND provider_charge_id = $2",
        "'sandbox', 'ch_x'",
    ),
    (
        "record_under_lease",
        "SELECT 1 FROM idempotency_record
          WHERE merchant_id = $1 AND idempotency_key = $2 AND lease_token = $3
            AND state = 'executing' FOR UPDATE",
        "'{m}', 'k', gen_random_uuid()",
    ),
    (
        "attempt_of_an_event",
        oncepay::store::payments::FIND_BY_CHARGE_OR_RECORD_REPEAT,
        "'sandbox', 'ch_x', gen_random_uuid(), 'evt_x', 'charge.succeeded', '{}', 'succeeded'",
    ),
    (
        "last_sequence",
        "SELECT max(sequence) FROM event WHERE object_id = $1",
        "'{m}'",
    ),
];

/// How many rows change in a table before autovacuum first vacuums or
/// analyses it (the least of its three thresholds; PostgreSQL's defaults
/// where the table sets none).
async fn first_automatic_pass(db: &mut PgConnection, table: &str) -> i64 {
    let options: Vec<String> = sqlx::query_scalar(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = $1 AND relkind = 'r'",
    )
    .bind(table)
    .fetch_one(&mut *db)
    .await
    .expect("the table exists");
    let option = |name: &str, default: i64| {
        options
            .iter()
            .find_map(|o| o.strip_prefix(&format!("{name}=")))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    option("autovacuum_analyze_threshold", 50)
        .min(option("autovacuum_vacuum_threshold", 50))
        .min(option("autovacuum_vacuum_insert_threshold", 1000))
}

#[tokio::test]
async fn a_growing_tables_first_statistics_keep_key_lookups_on_their_indexes() {
    let app = spawn_app().await;
    // A connection of its own: the settings below stay on it.
    let mut db = app.db.acquire().await.expect("connects").detach();

    let n = first_automatic_pass(&mut db, "orders").await;
    for table in GROWING {
        assert_eq!(
            first_automatic_pass(&mut db, table).await,
            n,
            "{table} waits for as many rows as orders before its first statistics"
        );
    }

    // The table as autovacuum first finds it: n rows of each kind, the
    // soonest a pass can start. Then the statistics that pass takes.
    let merchant: uuid::Uuid = sqlx::query_scalar("SELECT id FROM merchant LIMIT 1")
        .fetch_one(&mut db)
        .await
        .expect("the test merchant");
    let fill = format!(
        "INSERT INTO orders SELECT gen_random_uuid(), '{merchant}', 'cus_1',
                '[{{\"sku\":\"book\",\"quantity\":1,\"unit_amount\":1250}}]', 1250, 'EUR', 'paid',
                '{{}}', now(), now()
           FROM generate_series(1, {n});
         INSERT INTO payment_attempt (id, merchant_id, order_id, idempotency_key, amount, currency,
                status, provider, payment_method, provider_charge_id, next_check_at, created_at,
                updated_at)
         SELECT gen_random_uuid(), merchant_id, id, 'pay-' || id, 1250, 'EUR', 'succeeded',
                'sandbox', 'tok_visa', 'ch_' || md5(id::text), now(), now(), now()
           FROM orders;
         INSERT INTO event (id, merchant_id, type, object_type, object_id, order_id, sequence,
                data, cause)
         SELECT gen_random_uuid(), merchant_id, 'order.paid', 'order', id, id, 1,
                '{{\"object\":{{\"status\":\"paid\"}}}}', 'request'
           FROM orders;
         INSERT INTO idempotency_record (merchant_id, idempotency_key, fingerprint, command,
                request, state, recovery_point, response_status, response_body, expires_at)
         SELECT merchant_id, 'create-' || id, '\\x00', 'create_order', '{{}}', 'completed',
                'done', 201, '\\x00', now() + interval '1 day'
           FROM orders;
         ANALYZE orders, payment_attempt, event, idempotency_record;"
    );
    db.execute(fill.as_str())
        .await
        .expect("filled and analysed");

    generic_plans(&mut db).await;
    for (name, sql, args) in LOOKUPS {
        let args = args.replace("{m}", &merchant.to_string());
        let plan = generic_plan(&mut db, name, sql, &args).await;
        assert!(
            plan.contains("Index") && !plan.contains("Seq Scan"),
            "{name} uses an index after the first automatic statistics ({n} rows):\n{plan}"
        );
        // The lease index holds every record that was executing until the
        // next vacuum: a lookup by key that scans it reads them all.
        assert!(
            !plan.contains("idempotency_record_lease_idx"),
            "{name} finds the record by its key, not by scanning the lease index:\n{plan}"
        );
    }
}

/// The group commit's statements (`store::group_commit`) take their rows
/// as arrays, which the planner guesses at ten rows, and join them to the
/// tables by key. Planned on a new deployment's empty tables, a join of
/// ten rows is cheaper as a hash over a scan of the table than as ten key
/// lookups, and that plan stays with the connection as the table grows
/// (until its first statistics): every payment then read whole tables.
/// The statements of several rows (`_MANY`) say their rows are few
/// (`LIMIT` by a parameter, guessed at a tenth), so every table is read by
/// key from the first plan on; the statements of one row read by key.
#[tokio::test]
async fn the_group_commits_statements_read_tables_by_key_from_an_empty_start() {
    let app = spawn_app().await;
    let mut db = app.db.acquire().await.expect("connects").detach();
    generic_plans(&mut db).await;
    use oncepay::store::payments::*;
    for (name, sql) in [
        ("claim", INSERT_CLAIMING),
        ("claim_many", INSERT_CLAIMING_MANY),
        ("settle", SETTLE_COMPLETING),
        ("settle_many", SETTLE_COMPLETING_MANY),
        ("repeat", FIND_BY_CHARGE_OR_RECORD_REPEAT),
        ("repeat_many", FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY),
    ] {
        let params = (1..)
            .take_while(|i| sql.contains(&format!("${i}")))
            .map(|_| "NULL")
            .collect::<Vec<_>>()
            .join(", ");
        let plan = generic_plan(&mut db, name, sql, &params).await;
        for table in GROWING {
            assert!(
                !plan.contains(&format!("Seq Scan on {table} "))
                    && !plan.ends_with(&format!("Seq Scan on {table}")),
                "{name} reads {table} by key, not whole:\n{plan}"
            );
        }
    }
}

/// Makes every statement prepared on `db` run on its generic plan, as the
/// service's do.
async fn generic_plans(db: &mut PgConnection) {
    let (setting, value) = oncepay::store::GENERIC_PLANS;
    db.execute(format!("SET {setting} = {value}").as_str())
        .await
        .expect("generic plans");
}

/// `sql`'s generic plan, prepared as `name` and explained with `args`.
async fn generic_plan(db: &mut PgConnection, name: &str, sql: &str, args: &str) -> String {
    db.execute(format!("PREPARE {name} AS {sql}").as_str())
        .await
        .expect("prepared");
    let plan: Vec<String> = sqlx::query(&format!("EXPLAIN EXECUTE {name}({args})"))
        .fetch_all(&mut *db)
        .await
        .expect("explained")
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect();
    plan.join("\n")
}
