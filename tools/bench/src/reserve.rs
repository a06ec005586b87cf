//! The reserving-order scenarios (issue 46): `POST /orders` with
//! `"reserve_stock": true`, one unit of one tracked SKU an order, every
//! request a new key, the SKUs stocked beforehand with more than any run
//! takes. `reserve-hot`: every order the same SKU, the flash sale, where
//! the orders queue on the SKU's one stock row. `reserve-spread`: each
//! order's SKU at random among 1,000. Each against the same SQL as
//! pgbench runs it (`floor::reserve_script`, on the bench's connections
//! and on the service's pool's) and against the database's own floor for
//! the row (`floor::one_row_script`: one row lock and one synchronous
//! commit, nothing else; swept over connection counts as a ceiling, the
//! best taken), on the same SKU choice, in the same run: how much longer
//! than the database's own minimum the orders queue.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::floor::Protocol;
use crate::harness::{
    count, measure_ceiling, measure_floor, metric, metric_f64, open_loop, quiesce, verdict, Bench,
};
use crate::load::MakeRequest;
use crate::report::Row;
use crate::{cpu, floor, load};

/// The row's sweeps (`Row::row_sweeps`), by name.
const ROW_FLOOR: &str = "the row's own floor";
const RESERVATION_FLOOR: &str = "a reservation's own floor";
const ORDER_HOLD: &str = "the row as an order holds it";

/// How many SKUs `reserve-spread` chooses among.
pub const SPREAD: usize = 1_000;

/// What each SKU is stocked with beforehand: more than any run reserves,
/// so that every order is a `201` and none a `409 insufficient_stock`.
pub const STOCK: i64 = 1_000_000_000;

/// The price of a unit in the bench's orders.
const UNIT_AMOUNT: i64 = 1_500;

/// The SKUs a scenario's orders choose among (the service's; the floor
/// has its own, `floor_skus`).
fn skus(spread: bool) -> Vec<String> {
    match spread {
        false => vec!["hot".to_string()],
        true => (0..SPREAD).map(|i| format!("sku-{i:04}")).collect(),
    }
}

/// The floor's SKUs, stocked alike, so that the floor's reservations and
/// the service's meet neither each other's rows nor their counts.
fn floor_skus(spread: bool) -> Vec<String> {
    skus(spread).iter().map(|s| format!("floor-{s}")).collect()
}

/// A reserving order of one unit of `sku`.
pub fn order_body(sku: &str) -> Value {
    json!({
        "customer_id": "cus_42",
        "currency": "EUR",
        "items": [{"sku": sku, "quantity": 1, "unit_amount": UNIT_AMOUNT}],
        "reserve_stock": true
    })
}

/// reserve-hot (`spread` false) or reserve-spread (true).
pub async fn reserve(b: &Bench<'_>, spread: bool) -> Result<Row, String> {
    let name = if spread {
        "reserve-spread"
    } else {
        "reserve-hot"
    };
    let (c, d) = (usize::from(b.args.connections), b.args.duration);
    let skus = skus(spread);
    eprintln!(
        "{name}: stocking {} SKU(s) with {STOCK} units each beforehand ...",
        skus.len()
    );
    stock(b, &skus).await?;
    let make: MakeRequest = {
        let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
        let skus = Arc::new(skus.clone());
        Arc::new(move |client, conn, n| {
            let sku = &skus[fastrand::usize(0..skus.len())];
            client
                .post(format!("{base}/orders"))
                .bearer_auth(&key)
                .header("Idempotency-Key", format!("{name}-{conn}-{n}"))
                .json(&order_body(sku))
        })
    };
    let before = effects(b, &skus).await?;
    eprintln!("{name}: {c} connections, {d:?} ...");
    quiesce(b).await;
    let held_before = hold_seconds(b).await;
    let meter = cpu::Meter::start(b.stack.watched());
    let outcome = load::run(c, d, make.clone()).await;
    let spent = meter.stop().await;
    b.sample_rss();
    let held_after = hold_seconds(b).await;
    let after = effects(b, &skus).await?;
    let ok = outcome.count(201) as i64;
    let orders = after.orders - before.orders;
    let reservations = after.reservations - before.reservations;
    let held = after.held - before.held;
    let on_hand = STOCK * skus.len() as i64;
    let check = verdict(
        orders == ok
            && reservations == ok
            && held == ok
            && after.on_hand == on_hand
            && after.over == 0,
        format!(
            "{orders} reserving orders and {reservations} pending reservations for {ok} answers 201; held +{held}; on hand {} of {on_hand}; {} SKU(s) holding more than on hand",
            after.on_hand, after.over
        ),
    );
    let mut row = Row {
        cpu: Some(spent.per(ok as f64)),
        ..Row::closed_loop(name, c, outcome, check)
    };
    let holds = held_after.1 - held_before.1;
    if holds > 0.0 {
        row.service_hold_ms = Some(1000.0 * (held_after.0 - held_before.0) / holds);
    }
    row.open = open_loop(b, row.outcome.rate(), &make, &[]).await;
    if !b.args.no_floor {
        let floor_skus = floor_skus(spread);
        floor::prepare_stock(
            b.db,
            b.merchant,
            floor::stock_table(spread),
            &floor_skus,
            STOCK,
        )
        .await?;
        eprintln!("  floor (pgbench, the same SQL) ...");
        quiesce(b).await;
        let script = floor::reserve_script(&b.fixture, spread, floor_skus.len());
        row.floor = Some(measure_floor(b.stack, &script, c, d).await?);
        // The service's transactions queue on its main pool's connections,
        // pgbench's on all of its own: the same SQL on the pool's count
        // tells what the queue's length costs the database.
        let pool = metric(b, "oncepay_db_pool_max_connections{pool=\"main\"} ").await as usize;
        if pool > 0 && pool != c {
            eprintln!("  the same SQL on {pool} connections, the service's pool (pgbench) ...");
            quiesce(b).await;
            row.at_pool = Some(measure_floor(b.stack, &script, pool, d).await?);
        }
        // The database's own floor for the row: one row lock and one
        // commit, swept over connection counts, the best taken.
        quiesce(b).await;
        let script = floor::one_row_script(Protocol::Simple, spread, floor_skus.len());
        row.ceiling = measure_ceiling(b, &script).await?;
        // The row's hold, in the protocol the service sends: the row's own
        // floor, a reservation's own floor, and the row as an order holds
        // it (the reservation's statement and the commit, alone).
        let n = floor_skus.len();
        let f = &b.fixture;
        for (what, script) in [
            (
                ROW_FLOOR,
                floor::one_row_script(Protocol::Prepared, spread, n),
            ),
            (
                RESERVATION_FLOOR,
                floor::reservation_floor_script(Protocol::Prepared, f, spread, n),
            ),
            (
                ORDER_HOLD,
                floor::row_hold_script(Protocol::Prepared, f, spread, n),
            ),
        ] {
            eprintln!("  {what} (pgbench, prepared, 4–64 connections) ...");
            quiesce(b).await;
            let each = b.args.duration.min(std::time::Duration::from_secs(4));
            let points =
                floor::sweep_in(Protocol::Prepared, &b.stack.db_url, &script, each).await?;
            row.row_sweeps.push((what, points));
        }
    }
    Ok(row)
}

/// The service's `oncepay_last_write_hold_seconds` of reserving orders:
/// (sum, count).
async fn hold_seconds(b: &Bench<'_>) -> (f64, f64) {
    let series = "oncepay_last_write_hold_seconds";
    let label = "{command=\"create_order\"} ";
    (
        metric_f64(b, &format!("{series}_sum{label}")).await,
        metric_f64(b, &format!("{series}_count{label}")).await,
    )
}

/// Stocks each of `skus` with [`STOCK`] units through the API (its first
/// adjustment starts tracking it), 16 at a time.
async fn stock(b: &Bench<'_>, skus: &[String]) -> Result<(), String> {
    let skus = Arc::new(skus.to_vec());
    let mut tasks = tokio::task::JoinSet::new();
    const WORKERS: usize = 16;
    for worker in 0..WORKERS {
        let (client, base, key, skus) = (
            b.client.clone(),
            b.stack.base.clone(),
            b.stack.api_key.clone(),
            skus.clone(),
        );
        tasks.spawn(async move {
            for sku in skus.iter().skip(worker).step_by(WORKERS) {
                let answer = client
                    .post(format!("{base}/inventory/{sku}/adjustments"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("stock-{sku}"))
                    .json(&json!({"quantity": STOCK, "reason": "bench"}))
                    .send()
                    .await
                    .map_err(|e| format!("stocking {sku}: {e}"))?;
                if answer.status().as_u16() != 201 {
                    let status = answer.status();
                    let body = answer.text().await.unwrap_or_default();
                    return Err(format!("stocking {sku} answered {status}: {body}"));
                }
            }
            Ok::<_, String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// What a scenario's orders leave in the rows, counted.
struct Effects {
    /// Orders with a reservation (`stock_reserved_until` set).
    orders: i64,
    /// Pending reservation transfers on the scenario's SKUs.
    reservations: i64,
    /// The SKUs' `held`, summed.
    held: i64,
    /// Their `posted` (on hand), summed.
    on_hand: i64,
    /// SKUs whose row holds more than it has on hand (the database refuses
    /// it; counted anyway).
    over: i64,
}

async fn effects(b: &Bench<'_>, skus: &[String]) -> Result<Effects, String> {
    let orders = count(
        b.db,
        "SELECT count(*) FROM orders WHERE stock_reserved_until IS NOT NULL",
    )
    .await?;
    let (reservations, held, on_hand, over): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ledger_transfer
                  WHERE merchant_id = $1 AND ledger = 'stock' AND phase = 'pending'
                    AND code = 'reservation' AND unit = ANY($2)),
                COALESCE(sum(held), 0)::bigint, COALESCE(sum(posted), 0)::bigint,
                count(*) FILTER (WHERE held > posted)
           FROM ledger_account
          WHERE merchant_id = $1 AND ledger = 'stock' AND kind = 'holder' AND unit = ANY($2)",
    )
    .bind(b.merchant)
    .bind(skus)
    .fetch_one(b.db)
    .await
    .map_err(|e| e.to_string())?;
    Ok(Effects {
        orders,
        reservations,
        held,
        on_hand,
        over,
    })
}

/// The report's line on the flash sale: the service against the same SQL
/// and against the database's own floor for the row(s).
pub fn verdict_line(row: &Row) -> Option<String> {
    let what = match row.scenario {
        "reserve-hot" => "one SKU (the flash sale)",
        "reserve-spread" => "SKUs at random among 1,000",
        _ => return None,
    };
    let rate = row.outcome.rate();
    let mut line = format!(
        "\n{} (issue 46): {rate:.0} reserving orders/s on {what}, p50 {:.2} ms, p99 {:.2} ms ({} connections)",
        row.scenario,
        row.outcome.ms(0.5),
        row.outcome.ms(0.99),
        row.connections,
    );
    if let Some((clients, same)) = row.floor {
        line += &format!(
            "; the same SQL (pgbench, {clients} connections): {:.0} tx/s, the service **{:.2}×** of it",
            same.tps,
            rate / same.tps
        );
    }
    if let Some((clients, pool)) = row.at_pool {
        line += &format!(
            "; the same SQL on {clients} connections (the service's pool): {:.0} tx/s, the service {:.2}× of it",
            pool.tps,
            rate / pool.tps
        );
    }
    if let Some((clients, one)) = floor::best(&row.ceiling) {
        line += &format!(
            "; the database's own floor for the row (`BEGIN; UPDATE ledger_account SET updated_at = now() WHERE id = …; COMMIT`, the best of 4–64 connections, at {clients}): {:.0} tx/s, the service **{:.2}×** of it",
            one.tps,
            rate / one.tps
        );
        if let Some((_, same)) = row.floor {
            line += &format!(", the same SQL {:.2}× of it", same.tps / one.tps);
        }
    }
    if let Some(ms) = row.service_hold_ms {
        line += &format!(
                "; the service's reservation statement and its commit took {ms:.3} ms on average, its wait for the row's lock and the busy cores' queue included (`oncepay_last_write_hold_seconds`)"
            );
    }
    let best = |what: &str| {
        row.row_sweeps
            .iter()
            .find(|(w, _)| *w == what)
            .and_then(|(_, points)| floor::best(points))
    };
    if let (Some((_, own)), Some((_, least)), Some((clients, hold))) =
        (best(ROW_FLOOR), best(RESERVATION_FLOOR), best(ORDER_HOLD))
    {
        line += &format!(
                "; prepared as the service sends them (the best of 4–64 connections): the row's own floor {:.0} tx/s ({:.3} ms a hold), a reservation's own floor (one pending transfer's `INSERT`, whose trigger locks and moves the row, and the commit) {:.0} tx/s ({:.3} ms), the row as an order holds it (`ledger::HOLD_ALL` and the commit, at {clients}) {:.0} tx/s ({:.3} ms): **{:.2}×** a reservation's own floor, {:.2}× the row's",
                own.tps,
                1000.0 / own.tps,
                least.tps,
                1000.0 / least.tps,
                hold.tps,
                1000.0 / hold.tps,
                hold.tps / least.tps,
                hold.tps / own.tps
            );
    }
    Some(line + ".\n")
}
