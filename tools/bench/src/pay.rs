//! The pay scenario: orders made beforehand, every request a new key; and
//! its capacity, the highest constant rate it holds, by bisection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::capacity::{Capacity, Probe, CAPACITY_P99_MS};
use crate::harness::{
    count, measure_ceiling, measure_floor, open_loop, quiesce, sandbox_drained, seconds, verdict,
    Bench,
};
use crate::load::{self, MakeRequest};
use crate::report::Row;
use crate::stack::Stack;
use crate::{cpu, disk, floor};

/// pay: orders made beforehand; every request a new key, `tok_visa`.
pub async fn pay(b: &Bench<'_>) -> Result<Row, String> {
    let (c, d) = (usize::from(b.args.connections), b.args.duration);
    // 2. pay: orders made beforehand; every request a new key, tok_visa.
    eprintln!("pay: preparing orders ...");
    // Enough for the closed loop and both open loops (1.65 times the
    // closed loop's count) at up to 5,000 payments a second, and for the
    // extra open loops asked: a payment that met a paid order would be a
    // 409, not a measurement.
    let extra: f64 = b.args.pay_open_at.iter().sum();
    let enough = (d.as_secs_f64() * (5_000.0 + extra / 2.0) * 1.05) as usize;
    let prepared = prepare_orders(b.db, b.merchant, enough.max(40_000)).await?;
    let charges_before = ledger_charges(b.stack).await?;
    let attempts_before = count(
        b.db,
        "SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'",
    )
    .await?;
    eprintln!("pay: {c} connections, {d:?} ...");
    let make = pay_requests(b, prepared, "pay".into());
    quiesce(b).await;
    let meter = cpu::Meter::start(b.stack.watched());
    let outcome = load::run(c, d, make.clone()).await;
    let drained = sandbox_drained(b, Duration::from_secs(30)).await;
    let spent = meter.stop().await;
    b.sample_rss();
    let charges = ledger_charges(b.stack).await? - charges_before;
    let attempts = count(
        b.db,
        "SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'",
    )
    .await?
        - attempts_before;
    let ok = outcome.count(201) as i64;
    let check = verdict(
        charges == ok && attempts == ok,
        format!("{charges} sandbox charges, {attempts} succeeded attempts for {ok} answers 201"),
    );
    let mut row = Row {
        drained: Some(drained),
        cpu: Some(spent.per(ok as f64)),
        ..Row::closed_loop("pay", c, outcome, check)
    };
    row.open = open_loop(b, row.sustained_rate(), &make, &b.args.pay_open_at).await;
    if b.args.probes > 0 {
        eprintln!(
            "  capacity (the highest rate held for {:?}) ...",
            b.args.sustain
        );
        row.capacity = Some(capacity(b, row.outcome.rate()).await?);
    }
    row.floor = if !b.args.no_floor {
        eprintln!("  floor (pgbench) ...");
        floor::prepare_pay_orders(b.db, b.merchant, 60_000).await?;
        Some(measure_floor(b.stack, &floor::pay_script(&b.fixture), c, d).await?)
    } else {
        None
    };
    row.ceiling = measure_ceiling(b, &floor::minimal_pay_script(&b.fixture)).await?;
    row.with_outbox = match floor::best(&row.ceiling) {
        Some((clients, _)) => {
            eprintln!("  the ceiling with the outbox's events ({clients} connections) ...");
            let script = floor::minimal_pay_with_outbox_script(&b.fixture);
            let each = d.min(Duration::from_secs(4));
            Some((
                clients,
                floor::run(&b.stack.db_url, &script, clients, each).await?,
            ))
        }
        None => None,
    };
    Ok(row)
}

async fn ledger_charges(stack: &Stack) -> Result<i64, String> {
    let totals = oncepay_testkit::ledger::totals(&reqwest::Client::new(), &stack.sandbox).await?;
    totals["charges"]
        .as_i64()
        .ok_or_else(|| "ledger without totals".to_string())
}

/// `n` orders awaiting payment, made in one statement.
pub async fn prepare_orders(db: &PgPool, merchant: Uuid, n: usize) -> Result<Vec<Uuid>, String> {
    sqlx::query_scalar(
        "INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status, metadata, created_at, updated_at)
         SELECT gen_random_uuid(), $1, 'cus_bench', '[{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1400}]', 2800, 'EUR',
                'awaiting_payment', '{}', now(), now()
           FROM generate_series(1, $2) RETURNING id",
    )
    .bind(merchant)
    .bind(i32::try_from(n).unwrap_or(i32::MAX))
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())
}

/// Paying `orders` in turn, every request a new key, `tok_visa`.
fn pay_requests(b: &Bench<'_>, orders: Vec<Uuid>, keys: String) -> MakeRequest {
    let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
    let next = AtomicUsize::new(0);
    Arc::new(move |client, conn, n| {
        let n_th = next.fetch_add(1, Ordering::Relaxed);
        if n_th == orders.len() {
            eprintln!("    (the prepared orders ran out: payments from now on meet paid orders and count as errors)");
        }
        let i = n_th % orders.len();
        client
            .post(format!("{base}/payments"))
            .bearer_auth(&key)
            .header("Idempotency-Key", format!("{keys}-{conn}-{n}"))
            .json(&json!({"order_id": orders[i], "payment_method": "tok_visa"}))
    })
}

impl Probe {
    fn of(
        asked: f64,
        outcome: &load::Outcome,
        held: bool,
        cpu: cpu::Cpu,
        flushes: Option<disk::Flushes>,
    ) -> Probe {
        let mut seconds = outcome.seconds_p99.clone();
        seconds.sort_by(f64::total_cmp);
        Probe {
            asked,
            achieved: outcome.rate(),
            p99: outcome.ms(0.99),
            seconds_median: seconds.get(seconds.len() / 2).copied().unwrap_or(0.0),
            seconds_worst: seconds.last().copied().unwrap_or(0.0),
            held,
            cpu: cpu.per(outcome.count(201) as f64),
            flushes,
        }
    }
}

/// pay's capacity: the highest constant rate it holds for `--sustain`
/// with p99 under 25 ms, every request answered 2xx, and its provider
/// webhooks keeping up (none left to deliver 2 s after the probe), by
/// bisection between 0 and the closed loop's rate (`--probes` probes). A
/// probe pays orders of its own, so no payment meets a paid order. The
/// closed loop's maximum is not such a rate: each payment's webhook and its
/// confirmation arrive after the answer and keep costing database time.
async fn capacity(b: &Bench<'_>, max_rate: f64) -> Result<Capacity, String> {
    let (mut low, mut high) = (0.0, max_rate);
    let mut found = Capacity {
        held: None,
        probes: Vec::new(),
    };
    for probe in 0..b.args.probes {
        let rate = (low + high) / 2.0;
        let n = (rate * b.args.sustain.as_secs_f64() * 1.05) as usize + 1;
        let orders = prepare_orders(b.db, b.merchant, n).await?;
        let make = pay_requests(b, orders, format!("capacity{probe}"));
        quiesce(b).await;
        eprintln!(
            "  capacity probe {} at {rate:.0} req/s for {:?} ...",
            probe + 1,
            b.args.sustain
        );
        let connections = usize::from(b.args.connections);
        let meter = cpu::Meter::start(b.stack.watched());
        let witness = disk::Witness::start();
        let outcome = load::run_open(rate, b.args.sustain, connections, make).await;
        let flushes = witness.map(disk::Witness::stop);
        let tail = sandbox_drained(b, Duration::from_secs(30)).await;
        let spent = meter.stop().await;
        b.sample_rss();
        let held = outcome.ms(0.99) < CAPACITY_P99_MS
            && outcome.failures() == 0
            && outcome.rate() >= rate * 0.97
            && tail <= Duration::from_secs(2);
        let probe = Probe::of(rate, &outcome, held, spent, flushes);
        eprintln!(
            "    achieved {:.0} req/s, p99 {:.2} ms (each second's p99: median {:.2}, worst {:.2}), {} failures, webhooks drained {:.1} s after: {}",
            probe.achieved,
            probe.p99,
            probe.seconds_median,
            probe.seconds_worst,
            outcome.failures(),
            tail.as_secs_f64(),
            if held { "held" } else { "not held" }
        );
        eprintln!("    each second's p99, ms: {}", seconds(&outcome));
        if outcome.failures() > 0 {
            eprintln!(
                "    answers by status: {:?}; no answer: {}{}",
                outcome.statuses,
                outcome.errors,
                outcome
                    .first_error
                    .as_deref()
                    .map(|e| format!(" (the first: {e})"))
                    .unwrap_or_default()
            );
        }
        if let Some(f) = &probe.flushes {
            eprintln!(
                "    the disk meanwhile: {} flushes of 8 KiB, median {:.2} ms, worst {:.1} ms, {} over 20 ms",
                f.count, f.median_ms, f.worst_ms, f.over_20_ms
            );
        }
        found.probes.push(probe);
        if held {
            low = rate;
            found.held = Some((rate, outcome));
        } else {
            high = rate;
        }
    }
    Ok(found)
}
