//! The order scenarios: create-order (every request a new key), replay
//! (one key, many connections) and mixed (mostly replays); pay has a
//! module of its own (`pay.rs`).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::harness::{
    count, measure_ceiling, measure_floor, metric, open_loop, quiesce, verdict, Bench,
};
use crate::load::{self, MakeRequest};
use crate::report::Row;
use crate::stack::Stack;
use crate::{cpu, floor};

/// The scenarios, in the order they run; `--scenarios` picks among them.
pub const SCENARIOS: &[&str] = &[
    "create-order",
    "pay",
    "replay",
    "mixed",
    "capture",
    "transfers",
    "reserve-hot",
    "reserve-spread",
];

pub fn order_body() -> Value {
    json!({"customer_id": "cus_42", "currency": "EUR", "items": [{"sku": "book", "quantity": 2, "unit_amount": 1250}]})
}

fn post(
    client: &reqwest::Client,
    stack: &Stack,
    path: &str,
    key: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{}{path}", stack.base))
        .bearer_auth(&stack.api_key)
        .header("Idempotency-Key", key)
        .json(body)
}

/// create-order: every request a new key.
pub async fn create_order(b: &Bench<'_>) -> Result<Row, String> {
    let (c, d) = (usize::from(b.args.connections), b.args.duration);
    // 1. create-order: every request a new key.
    eprintln!("create-order: {c} connections, {d:?} ...");
    let before = count(b.db, "SELECT count(*) FROM orders").await?;
    let make: MakeRequest = {
        let stack_base = (b.stack.base.clone(), b.stack.api_key.clone());
        Arc::new(move |client, conn, n| {
            client
                .post(format!("{}/orders", stack_base.0))
                .bearer_auth(&stack_base.1)
                .header("Idempotency-Key", format!("create-{conn}-{n}"))
                .json(&order_body())
        })
    };
    quiesce(b).await;
    let rows_before = metric(b, "oncepay_order_batch_rows_sum ").await;
    let statements_before = metric(b, "oncepay_order_batch_rows_count ").await;
    let meter = cpu::Meter::start(b.stack.watched());
    let outcome = load::run(c, d, make.clone()).await;
    let spent = meter.stop().await;
    let created = count(b.db, "SELECT count(*) FROM orders").await? - before;
    let statements = metric(b, "oncepay_order_batch_rows_count ")
        .await
        .saturating_sub(statements_before);
    let batched = metric(b, "oncepay_order_batch_rows_sum ")
        .await
        .saturating_sub(rows_before);
    b.sample_rss();
    let check = verdict(
        created as u64 == outcome.count(201),
        format!(
            "{created} order rows for {} answers 201; {:.1} orders per statement (ONCEPAY_ORDER_BATCH_MAX={})",
            outcome.count(201),
            batched as f64 / statements.max(1) as f64,
            std::env::var("ONCEPAY_ORDER_BATCH_MAX").unwrap_or_else(|_| "64".into())
        ),
    );
    let open = open_loop(b, outcome.rate(), &make, &b.args.open_at).await;
    let floor = if !b.args.no_floor {
        eprintln!("  floor (pgbench) ...");
        Some(measure_floor(b.stack, &floor::create_order_script(&b.fixture), c, d).await?)
    } else {
        None
    };
    let ceiling = measure_ceiling(b, &floor::minimal_create_script(&b.fixture)).await?;
    Ok(Row {
        floor,
        ceiling,
        open,
        cpu: Some(spent.per(created as f64)),
        ..Row::closed_loop("create-order", c, outcome, check)
    })
}

/// replay: one key, many connections.
pub async fn replay(b: &Bench<'_>) -> Result<Row, String> {
    let d = b.args.duration;
    // 3. replay: one key, many connections.
    let rc = usize::from(b.args.replay_connections);
    eprintln!("replay: {rc} connections, {d:?} ...");
    let before = count(b.db, "SELECT count(*) FROM orders").await?;
    post(&b.client, b.stack, "/orders", "replay-key", &order_body())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let make: MakeRequest = {
        let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
        Arc::new(move |client, _, _| {
            client
                .post(format!("{base}/orders"))
                .bearer_auth(&key)
                .header("Idempotency-Key", "replay-key")
                .json(&order_body())
        })
    };
    quiesce(b).await;
    let outcome = load::run(rc, d, make).await;
    b.sample_rss();
    let executions = count(b.db, "SELECT count(*) FROM orders").await? - before;
    let check = verdict(
        executions == 1 && outcome.replayed == outcome.latency.len(),
        format!(
            "{executions} execution(s); {} of {} answers replayed",
            outcome.replayed,
            outcome.latency.len()
        ),
    );
    let floor = if !b.args.no_floor {
        eprintln!("  floor (pgbench) ...");
        // The floor's key exists and is completed, as the service's is.
        sqlx::raw_sql(&format!(
            "INSERT INTO idempotency_record (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, response_status, response_body, expires_at)
             VALUES ('{}', 'floor-replay', sha256('fp'), 'create_order', '{{}}', 'completed', 'finished',
                201, convert_to('{{}}', 'UTF8'), now() + interval '1 day')",
            b.merchant
        ))
        .execute(b.db)
        .await
        .map_err(|e| e.to_string())?;
        Some(measure_floor(b.stack, &floor::replay_script(&b.fixture), rc, d).await?)
    } else {
        None
    };
    let ceiling = measure_ceiling(b, &floor::minimal_replay_script(&b.fixture)).await?;
    Ok(Row {
        floor,
        ceiling,
        ..Row::closed_loop("replay", rc, outcome, check)
    })
}

/// mixed: 90 % replays over a pool of 1,000 keys, 10 % new keys.
pub async fn mixed(b: &Bench<'_>) -> Result<Row, String> {
    let (c, d) = (usize::from(b.args.connections), b.args.duration);
    // 4. mixed: 90 % replays over a pool of 1,000 keys, 10 % new keys.
    eprintln!("mixed: warming 1,000 keys ...");
    let mut warm = tokio::task::JoinSet::new();
    for chunk in 0..16 {
        let (client, base, key) = (
            b.client.clone(),
            b.stack.base.clone(),
            b.stack.api_key.clone(),
        );
        warm.spawn(async move {
            for i in (chunk..1000).step_by(16) {
                let _ = client
                    .post(format!("{base}/orders"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("pool-{i}"))
                    .json(&order_body())
                    .send()
                    .await;
            }
        });
    }
    while warm.join_next().await.is_some() {}
    let before = count(b.db, "SELECT count(*) FROM orders").await?;
    eprintln!("mixed: {c} connections, {d:?} ...");
    let make: MakeRequest = {
        let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
        Arc::new(move |client, conn, n| {
            let idem = if fastrand::u8(0..10) == 0 {
                format!("mixed-new-{conn}-{n}")
            } else {
                format!("pool-{}", fastrand::usize(0..1000))
            };
            client
                .post(format!("{base}/orders"))
                .bearer_auth(&key)
                .header("Idempotency-Key", idem)
                .json(&order_body())
        })
    };
    quiesce(b).await;
    let outcome = load::run(c, d, make).await;
    b.sample_rss();
    let executed = count(b.db, "SELECT count(*) FROM orders").await? - before;
    let expected = outcome.count(201) as i64 - outcome.replayed as i64;
    let check = verdict(
        executed == expected,
        format!(
            "{executed} new orders for {expected} non-replayed answers; {} replayed",
            outcome.replayed
        ),
    );
    Ok(Row::closed_loop("mixed", c, outcome, check))
}
