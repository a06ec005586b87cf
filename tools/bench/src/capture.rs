//! The capture scenario (issue 44): `POST /payments/{id}/capture` on
//! manual payments held in `requires_capture`, authorized by the sandbox
//! beforehand (outside the measured window), every request a new key; its
//! same-SQL floor (`floor::capture_script`); and its open loops at 50 % and
//! 80 % of the closed loop's rate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::harness::{count, measure_floor, open_loop, quiesce, sandbox_drained, verdict, Bench};
use crate::load::MakeRequest;
use crate::report::Row;
use crate::{cpu, floor, load, pay};

/// Captures a second the closed loop is given held payments for (about
/// four times what it reached on this machine, 373/s: a capture that met a
/// captured payment would be a 409, not a measurement; the bench says so
/// if they run out).
const CLOSED_LOOP_BUDGET: f64 = 1_500.0;

/// The held payments the requests take in turn, topped up between phases.
#[derive(Clone, Default)]
struct Holds {
    ids: Arc<RwLock<Vec<Uuid>>>,
    next: Arc<AtomicUsize>,
}

impl Holds {
    fn left(&self) -> usize {
        let len = self.ids.read().map_or(0, |ids| ids.len());
        len.saturating_sub(self.next.load(Ordering::Relaxed))
    }

    fn extend(&self, more: Vec<Uuid>) {
        if let Ok(mut ids) = self.ids.write() {
            ids.extend(more);
        }
    }
}

/// capture: held payments made beforehand; every request a new key.
pub async fn capture(b: &Bench<'_>) -> Result<Row, String> {
    let (c, d) = (usize::from(b.args.connections), b.args.duration);
    let holds = Holds::default();
    let wanted = (d.as_secs_f64() * CLOSED_LOOP_BUDGET) as usize;
    eprintln!("capture: authorizing {wanted} manual payments beforehand ...");
    holds.extend(authorize(b, wanted, "hold").await?);
    // The floor's holds are copies of one the service authorized and
    // nothing captures.
    let template = authorize(b, 1, "floor-template").await?[0];
    let captures_before = sandbox_captures(b).await?;
    let rows_before = captured_rows(b).await?;
    let make = capture_requests(b, &holds);
    eprintln!("capture: {c} connections, {d:?} ...");
    quiesce(b).await;
    let meter = cpu::Meter::start(b.stack.watched());
    let outcome = load::run(c, d, make.clone()).await;
    // Each capture's `charge.captured` webhook belongs to it.
    let drained = sandbox_drained(b, Duration::from_secs(30)).await;
    let spent = meter.stop().await;
    b.sample_rss();
    let ok = outcome.count(200) as i64;
    let provider = sandbox_captures(b).await? - captures_before;
    let rows = captured_rows(b).await? - rows_before;
    let check = verdict(
        provider == ok && rows == ok,
        format!("{provider} sandbox captures, {rows} succeeded capture rows for {ok} answers 200"),
    );
    let mut row = Row {
        drained: Some(drained),
        cpu: Some(spent.per(ok as f64)),
        ..Row::closed_loop("capture", c, outcome, check)
    };
    // The open loops at 50 % and 80 % of that rate, half the duration
    // each, with held payments of their own (made now, outside them).
    let rate = row.sustained_rate();
    let needed = (rate * d.as_secs_f64() / 2.0 * (0.5 + 0.8) * 1.1) as usize;
    let more = needed.saturating_sub(holds.left());
    if more > 0 {
        eprintln!("capture: authorizing {more} more for the open loops ...");
        holds.extend(authorize(b, more, "hold-open").await?);
    }
    row.open = open_loop(b, rate, &make, &[]).await;
    row.floor = if !b.args.no_floor {
        eprintln!("  floor (pgbench) ...");
        // Enough for the floor at up to 3,000 captures a second.
        let n = (d.as_secs_f64() * 3_000.0) as i32;
        floor::prepare_holds(b.db, template, n).await?;
        Some(measure_floor(b.stack, &floor::capture_script(&b.fixture), c, d).await?)
    } else {
        None
    };
    Ok(row)
}

/// Capturing the held payments in turn, all of each, every request a new
/// key.
fn capture_requests(b: &Bench<'_>, holds: &Holds) -> MakeRequest {
    let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
    let holds = holds.clone();
    Arc::new(move |client, conn, n| {
        let n_th = holds.next.fetch_add(1, Ordering::Relaxed);
        let id = {
            let ids = holds.ids.read().unwrap_or_else(|p| p.into_inner());
            if n_th == ids.len() {
                eprintln!("    (the held payments ran out: captures from now on meet captured payments and count as errors)");
            }
            ids[n_th % ids.len()]
        };
        client
            .post(format!("{base}/payments/{id}/capture"))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("capture-{conn}-{n}"))
            .json(&json!({}))
    })
}

/// `n` manual payments authorized by the sandbox, each paying an order of
/// its own: their ids. Made 32 at a time; a payment that is not
/// `requires_capture` once answered stops the bench (the scenario would
/// measure something else).
async fn authorize(b: &Bench<'_>, n: usize, keys: &str) -> Result<Vec<Uuid>, String> {
    let orders = Arc::new(pay::prepare_orders(b.db, b.merchant, n).await?);
    let mut tasks = tokio::task::JoinSet::new();
    const WORKERS: usize = 32;
    for worker in 0..WORKERS {
        let (client, base, key, orders) = (
            b.client.clone(),
            b.stack.base.clone(),
            b.stack.api_key.clone(),
            orders.clone(),
        );
        let keys = keys.to_string();
        tasks.spawn(async move {
            let mut held = Vec::new();
            for i in (worker..orders.len()).step_by(WORKERS) {
                let answer = client
                    .post(format!("{base}/payments"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("{keys}-{i}"))
                    .json(&json!({"order_id": orders[i], "payment_method": "tok_visa", "capture_method": "manual"}))
                    .send()
                    .await
                    .map_err(|e| format!("authorizing a payment: {e}"))?;
                let status = answer.status().as_u16();
                let body: Value = answer
                    .json()
                    .await
                    .map_err(|e| format!("an authorization's answer: {e}"))?;
                match (status, body["status"].as_str(), body["id"].as_str()) {
                    (201, Some("requires_capture"), Some(id)) => {
                        held.push(id.parse::<Uuid>().map_err(|e| e.to_string())?)
                    }
                    _ => return Err(format!("a manual payment answered {status}: {body}")),
                }
            }
            Ok::<_, String>(held)
        });
    }
    let mut held = Vec::with_capacity(n);
    while let Some(done) = tasks.join_next().await {
        held.extend(done.map_err(|e| e.to_string())??);
    }
    Ok(held)
}

async fn sandbox_captures(b: &Bench<'_>) -> Result<i64, String> {
    let totals = oncepay_testkit::ledger::totals(&b.client, &b.stack.sandbox).await?;
    totals["captures"]
        .as_i64()
        .ok_or_else(|| "the sandbox's totals without captures".to_string())
}

async fn captured_rows(b: &Bench<'_>) -> Result<i64, String> {
    count(
        b.db,
        "SELECT count(*) FROM payment_capture WHERE status = 'succeeded'",
    )
    .await
}
