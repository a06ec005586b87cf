//! What every scenario runs in: the stack and its database, counting rows
//! and reading the service's metrics, letting the stack settle before a
//! measurement, the open loops at shares of the closed loop's rate, and the
//! database's own floor and ceiling for the same work.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::load::{self, MakeRequest};
use crate::stack::Stack;
use crate::{cpu, floor, Args};

/// What every scenario needs: the stack, its database, the fixture the
/// floors use, and the run's settings.
pub struct Bench<'a> {
    pub args: &'a Args,
    pub stack: &'a Stack,
    pub db: &'a PgPool,
    pub client: reqwest::Client,
    pub fixture: floor::Fixture,
    pub merchant: Uuid,
    /// Highest resident memory of `oncepay serve` seen right after a load.
    pub peak_rss: std::cell::Cell<u64>,
    /// The same, in the current scenario.
    pub scenario_rss: std::cell::Cell<u64>,
}

impl Bench<'_> {
    pub fn sample_rss(&self) {
        let now = self.stack.memory_kib().map(|m| m.0).unwrap_or(0);
        self.peak_rss.set(self.peak_rss.get().max(now));
        self.scenario_rss.set(self.scenario_rss.get().max(now));
    }
}

pub async fn count(db: &PgPool, sql: &str) -> Result<i64, String> {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())
}

pub fn verdict(ok: bool, what: String) -> String {
    if ok {
        format!("ok: {what}")
    } else {
        format!("BREACH: {what}")
    }
}

/// The value of the series whose line starts with `prefix` (0 if absent).
pub async fn metric(b: &Bench<'_>, prefix: &str) -> u64 {
    metric_f64(b, prefix).await as u64
}

/// The value of the first line of the service's `/metrics` that starts
/// with `prefix`, unrounded (0 when absent or unreadable).
pub async fn metric_f64(b: &Bench<'_>, prefix: &str) -> f64 {
    let text = match b
        .client
        .get(format!("{}/metrics", b.stack.base))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// Lets the service and the database finish what earlier phases left them
/// before a phase is measured: without it, an open loop run right after a
/// pgbench sweep measured the sweep's aftermath (create-order at 80 %: p99
/// 197 ms after the sweep, 25 ms without it), and one run right after
/// pay's closed loop began with that loop's provider webhooks still
/// arriving. Waits (at most 30 s in all) until the sandbox has no webhook
/// left to deliver, then checkpoints and waits for any autovacuum. It does
/// not vacuum or analyse itself: analysing a table while it is nearly
/// empty leaves the service's generic plans scanning it whole as it fills
/// (BENCHMARKS.md, step 15), which a bench should report, not cause.
pub async fn quiesce(b: &Bench<'_>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    sandbox_drained(b, Duration::from_secs(30)).await;
    let _ = sqlx::query("CHECKPOINT").execute(b.db).await;
    while std::time::Instant::now() < deadline {
        let busy: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'",
        )
        .fetch_one(b.db)
        .await
        .unwrap_or(0);
        if busy == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (at most `patience`) until the sandbox has no webhook left to
/// deliver; returns how long that took.
pub async fn sandbox_drained(b: &Bench<'_>, patience: Duration) -> Duration {
    let started = std::time::Instant::now();
    while started.elapsed() < patience {
        let in_flight = oncepay_testkit::ledger::totals(&b.client, &b.stack.sandbox)
            .await
            .map(|t| t["work_in_flight"].as_u64().unwrap_or(0))
            .unwrap_or(0);
        if in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// The scenario again at a constant 50 % and 80 % of the rate the closed
/// loop reached, half the duration each: latencies at a load the service
/// carries, not queueing at saturation.
pub async fn open_loop(
    b: &Bench<'_>,
    max_rate: f64,
    make: &MakeRequest,
    extra_rates: &[f64],
) -> Vec<(f64, load::Outcome, cpu::Cpu)> {
    let mut runs = Vec::new();
    let shares = [0.5, 0.8]
        .into_iter()
        .chain(extra_rates.iter().map(|rate| rate / max_rate));
    for share in shares {
        let rate = max_rate * share;
        eprintln!(
            "  open loop at {rate:.0} req/s ({:.0} % of the maximum) ...",
            share * 100.0
        );
        quiesce(b).await;
        let d = b.args.duration / 2;
        // Connection numbers of their own, so no key meets the closed loop's.
        let space = 1_000_000 * (1 + runs.len());
        let inner = make.clone();
        let make: MakeRequest = Arc::new(move |client, c, n| inner(client, space + c, n));
        // As many connections as the closed loop, as wrk2 keeps a fixed
        // set: a request that finds them all busy waits, and its wait
        // counts. (Up to 256 opened under a backlog cost more in new
        // connections than they relieved, and tipped 80 % into overload.)
        let connections = usize::from(b.args.connections);
        let meter = cpu::Meter::start(b.stack.watched());
        let outcome = load::run_open(rate, d, connections, make).await;
        // pay's webhooks belong to its payments (none for other scenarios).
        sandbox_drained(b, Duration::from_secs(30)).await;
        // What each answered request cost: a create or a payment answers
        // 201, a capture 200.
        let answered = outcome.count(201) + outcome.count(200);
        let spent = meter.stop().await.per(answered as f64);
        eprintln!("    each second's p99, ms: {}", seconds(&outcome));
        if let Some(e) = &outcome.first_error {
            eprintln!("    no answer: {} (the first: {e})", outcome.errors);
        }
        // What the provider's webhooks came to so far: a webhook that gave
        // up waiting for its command is confirmed by a provider read.
        if let Ok(rows) = sqlx::query_as::<_, (String, bool, i64)>(
            "SELECT outcome, confirmed_at IS NOT NULL, count(*) FROM webhook_event GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(b.db)
        .await
        {
            if !rows.is_empty() {
                eprintln!("    webhooks so far (outcome, confirmed by a read, count): {rows:?}");
            }
        }
        runs.push((share, outcome, spent));
    }
    runs
}

/// The ceiling of a scenario: its minimal script swept over connection
/// counts, each point at most 4 s (five points per scenario).
pub async fn measure_ceiling(
    b: &Bench<'_>,
    script: &str,
) -> Result<Vec<(usize, floor::Floor)>, String> {
    if b.args.no_floor {
        return Ok(Vec::new());
    }
    eprintln!("  ceiling (pgbench, minimal SQL, 4–64 connections) ...");
    floor::sweep(
        &b.stack.db_url,
        script,
        b.args.duration.min(Duration::from_secs(4)),
    )
    .await
}

/// The floor of a scenario run on `connections` (capped: PostgreSQL allows
/// 100 connections by default, and the service and this program hold some).
pub async fn measure_floor(
    stack: &Stack,
    script: &str,
    connections: usize,
    d: Duration,
) -> Result<(usize, floor::Floor), String> {
    let clients = connections.min(64);
    Ok((
        clients,
        floor::run(&stack.db_url, script, clients, d).await?,
    ))
}

/// Each second's p99 of an open loop, in order: where its tail sits (right
/// after the bench's checkpoint, or spread).
pub fn seconds(outcome: &load::Outcome) -> String {
    let each: Vec<String> = outcome
        .seconds_p99
        .iter()
        .map(|ms| format!("{ms:.0}"))
        .collect();
    each.join(" ")
}
