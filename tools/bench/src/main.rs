//! `oncepay-bench` (run by `make bench`): throughput, latency and memory of
//! `oncepay serve`, next to what PostgreSQL alone does with the same SQL.
//!
//! It creates a fresh database, starts the sandbox and the service from the
//! release binaries, drives closed-loop load with its own HTTP client, checks
//! each scenario's effects by counting rows and sandbox charges, runs the
//! pgbench floor, and prints one table, which it also writes into
//! `BENCHMARKS.md` between markers (the rest of that file is kept).

mod cpu;
mod disk;
mod floor;
mod load;
mod stack;
mod statements;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use load::{MakeRequest, Outcome};
use stack::Stack;

/// oncepay-bench — load the service and compare it with the database's own
/// ceiling. Environment: BENCH_DATABASE_SERVER (default
/// postgres://postgres@127.0.0.1:5432); ONCEPAY_* variables are passed to
/// `oncepay serve` unchanged.
#[derive(Debug, Parser)]
#[command(name = "oncepay-bench", version)]
struct Args {
    /// How long each scenario runs.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    duration: Duration,
    /// Client connections for create-order, pay and mixed.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    connections: u16,
    /// Client connections for replay.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(1..))]
    replay_connections: u16,
    /// Which scenarios, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "create-order,pay,replay,mixed"
    )]
    scenarios: Vec<String>,
    /// Where the results table is written.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Skip the pgbench floor.
    #[arg(long)]
    no_floor: bool,
    /// Completed idempotency records (with their orders) put in the tables
    /// before the scenarios, half of them already expired for the sweeper
    /// (`make bench BENCH_ARGS="--records 10000000 --scenarios
    /// create-order,replay"`, with `ONCEPAY_SWEEP_INTERVAL=1s`): how cost
    /// grows with the tables.
    #[arg(long, default_value_t = 0)]
    records: u64,
    /// Delivered events 40 days old (past ONCEPAY_EVENT_RETENTION's 30
    /// days), each with its delivery and attempt, put in the tables before
    /// the scenarios, in objects of four (the newest of each is kept): the
    /// retention sweeper works through them while the scenarios run (`make
    /// bench BENCH_ARGS="--old-events 3000000 --scenarios create-order"`,
    /// with `ONCEPAY_SWEEP_INTERVAL=1s`), and the table says how fast.
    #[arg(long, default_value_t = 0)]
    old_events: u64,
    /// pay's capacity: how long each constant-rate probe must hold p99
    /// under 25 ms.
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    sustain: Duration,
    /// pay's capacity: how many probes the bisection makes (0: none).
    #[arg(long, default_value_t = 5)]
    probes: u32,
    /// Extra open-loop rates for create-order, in req/s besides 50 % and
    /// 80 % of its maximum (`--open-at 1149,1839`): latency at the same
    /// load as another run, e.g. one with `ONCEPAY_ORDER_BATCH_MAX=1`.
    #[arg(long, value_delimiter = ',')]
    open_at: Vec<f64>,
    /// Extra open-loop rates for pay, in req/s (`--pay-open-at 600,900`):
    /// latency and CPU per payment at the same rate as another run, e.g.
    /// one with other `ONCEPAY_GROUP_COMMIT_*` settings.
    #[arg(long, value_delimiter = ',')]
    pay_open_at: Vec<f64>,
    /// Payments counted on the wire for statements and round trips per
    /// payment (0: not counted).
    #[arg(long, default_value_t = 300)]
    statements: usize,
}

impl Args {
    fn wants(&self, scenario: &str) -> bool {
        self.scenarios.iter().any(|s| s.trim() == scenario)
    }
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match oncepay::config::parse_duration(text)? {
        d if d.is_zero() => Err("must be positive".into()),
        d => Ok(d),
    }
}

/// One line of the table.
struct Row {
    scenario: &'static str,
    connections: usize,
    outcome: Outcome,
    floor: Option<(usize, floor::Floor)>,
    /// The minimal-SQL ceiling at each connection count of the sweep.
    ceiling: Vec<(usize, floor::Floor)>,
    /// Open-loop runs: (share of the closed-loop maximum, outcome, CPU
    /// per request).
    open: Vec<(f64, load::Outcome, cpu::Cpu)>,
    /// pay only: the ceiling's SQL plus the outbox's event rows, at the
    /// ceiling's best connection count (an explanation, not the ceiling).
    with_outbox: Option<(usize, floor::Floor)>,
    /// pay only: how long after the closed loop ended its provider webhooks
    /// went on arriving. Their work belongs to the loop's payments, so the
    /// rate the service sustains counts this time too.
    drained: Option<Duration>,
    /// pay only: the highest rate it holds (see [`capacity`]).
    capacity: Option<Capacity>,
    /// Highest resident memory of `oncepay serve` seen during it, KiB.
    rss_kib: u64,
    /// The closed loop's CPU per request, ms (pay: with its webhooks).
    cpu: Option<cpu::Cpu>,
    check: String,
}

/// A scenario's capacity: the highest constant rate it holds for
/// `--sustain` with p99 under [`CAPACITY_P99_MS`], every request answered
/// 2xx and its deferred work keeping up; and every probe made.
struct Capacity {
    held: Option<(f64, Outcome)>,
    probes: Vec<Probe>,
}

/// The latency a rate must hold to count as sustained.
const CAPACITY_P99_MS: f64 = 25.0;

impl Row {
    /// A scenario's closed loop and its check; the references and open
    /// loops that go with it, where it has them, are set by the caller.
    fn closed_loop(
        scenario: &'static str,
        connections: usize,
        outcome: Outcome,
        check: String,
    ) -> Row {
        Row {
            scenario,
            connections,
            outcome,
            floor: None,
            ceiling: Vec::new(),
            open: Vec::new(),
            with_outbox: None,
            drained: None,
            capacity: None,
            rss_kib: 0,
            cpu: None,
            check,
        }
    }

    /// The closed loop's rate with its deferred work counted: what the open
    /// loop's shares are taken of.
    fn sustained_rate(&self) -> f64 {
        let d = self.outcome.elapsed.as_secs_f64();
        let tail = self.drained.unwrap_or_default().as_secs_f64();
        self.outcome.rate() * d / (d + tail)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("oncepay-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn order_body() -> Value {
    json!({"customer_id": "cus_42", "currency": "EUR", "items": [{"sku": "book", "quantity": 2, "unit_amount": 1250}]})
}

async fn count(db: &PgPool, sql: &str) -> Result<i64, String> {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(db)
        .await
        .map_err(|e| e.to_string())
}

async fn ledger_charges(stack: &Stack) -> Result<i64, String> {
    let totals = oncepay_testkit::ledger::totals(&reqwest::Client::new(), &stack.sandbox).await?;
    totals["charges"]
        .as_i64()
        .ok_or_else(|| "ledger without totals".to_string())
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

fn verdict(ok: bool, what: String) -> String {
    if ok {
        format!("ok: {what}")
    } else {
        format!("BREACH: {what}")
    }
}

async fn run(args: Args) -> Result<(), String> {
    let pg_server = std::env::var("BENCH_DATABASE_SERVER")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let database = format!("oncepay_bench_{}", Uuid::new_v4().simple());
    let serve_env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("ONCEPAY_"))
        .collect();
    eprintln!("starting the stack on database {database} ...");
    let stack = Stack::start(&pg_server, &database, &serve_env).await?;
    let db = PgPool::connect(&stack.db_url)
        .await
        .map_err(|e| e.to_string())?;
    let merchant: Uuid = sqlx::query_scalar("SELECT id FROM merchant WHERE name = 'bench'")
        .fetch_one(&db)
        .await
        .map_err(|e| e.to_string())?;
    let (idle_rss, _) = stack.memory_kib().unwrap_or((0, 0));
    let fixture = floor::Fixture {
        merchant: merchant.to_string(),
        order_request: json!({"path_id": null, "body": order_body()}).to_string(),
        order_response: floor::ORDER_RESPONSE.into(),
    };
    let bench = Bench {
        args: &args,
        stack: &stack,
        db: &db,
        client: reqwest::Client::new(),
        fixture,
        merchant,
        peak_rss: std::cell::Cell::new(0),
        scenario_rss: std::cell::Cell::new(0),
    };
    let mut grown = String::new();
    if args.records > 0 {
        populate(&db, merchant, args.records, &bench.fixture).await?;
        grown += &format!(
            "\nTables before the scenarios: {} completed idempotency records (half expired) and their orders; {}.\n",
            args.records,
            sizes(&db).await
        );
    }
    if args.old_events > 0 {
        populate_old_events(&db, merchant, args.old_events).await?;
        grown += &format!(
            "\nOld events before the scenarios: {} (40 days old, delivered, one attempt each; {} of them past retention and not an object's newest).\n",
            args.old_events,
            args.old_events / 4 * 3
        );
    }
    let retained_before = metric(&bench, "oncepay_retention_deleted_total{table=\"event\"} ").await;
    let swept_before = sweeper_deleted(&bench).await;
    let scenarios_started = std::time::Instant::now();
    let mut rows = Vec::new();
    for scenario in SCENARIOS.iter().filter(|s| args.wants(s)) {
        bench.scenario_rss.set(0);
        let mut row = match *scenario {
            "create-order" => create_order(&bench).await?,
            "pay" => pay(&bench).await?,
            "replay" => replay(&bench).await?,
            _ => mixed(&bench).await?,
        };
        bench.sample_rss();
        row.rss_kib = bench.scenario_rss.get();
        rows.push(row);
    }
    if args.wants("pay") && args.statements > 0 {
        eprintln!("statements per payment, counted on the wire ...");
        grown += &statements::per_payment(&pg_server, &serve_env, args.statements).await?;
    }
    if args.records > 0 {
        let swept = sweeper_deleted(&bench).await.saturating_sub(swept_before);
        let secs = scenarios_started.elapsed().as_secs_f64();
        grown += &format!(
            "After them: {}; the sweeper deleted {swept} expired records meanwhile ({:.0} rows/s over {secs:.0} s).\n",
            sizes(&db).await,
            swept as f64 / secs
        );
    }
    if args.old_events > 0 {
        let deleted = metric(&bench, "oncepay_retention_deleted_total{table=\"event\"} ")
            .await
            .saturating_sub(retained_before);
        let secs = scenarios_started.elapsed().as_secs_f64();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM event")
            .fetch_one(&db)
            .await
            .unwrap_or(-1);
        grown += &format!(
            "After them: the retention sweeper deleted {deleted} events (with their deliveries and attempts) in {secs:.0} s ({:.0} events/s), {left} events left.\n",
            deleted as f64 / secs
        );
    }
    let peak_rss_under_load = bench.peak_rss.get();
    let (_, peak_rss) = stack.memory_kib().unwrap_or((0, 0));
    let report = report(
        &db,
        &args,
        &rows,
        idle_rss,
        peak_rss_under_load.max(peak_rss),
    )
    .await;
    let report = report + &grown;
    println!("{report}");
    write_report(&args.out, &report)?;
    eprintln!("written to {}", args.out.display());
    drop(stack);
    db.close().await;
    drop_database(&pg_server, &database).await;
    if rows.iter().any(|r| r.check.starts_with("BREACH")) {
        return Err("an effect check failed: see the table".into());
    }
    Ok(())
}

/// Puts `n` completed idempotency records with their orders in the tables,
/// a million per statement; every other one already expired. Ids are
/// time-ordered (older than the run), as the service's UUID v7 are.
async fn populate(db: &PgPool, merchant: Uuid, n: u64, f: &floor::Fixture) -> Result<(), String> {
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
async fn populate_old_events(db: &PgPool, merchant: Uuid, n: u64) -> Result<(), String> {
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

/// The value of the series whose line starts with `prefix` (0 if absent).
async fn metric(b: &Bench<'_>, prefix: &str) -> u64 {
    let text = match b
        .client
        .get(format!("{}/metrics", b.stack.base))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0,
    };
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
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
async fn quiesce(b: &Bench<'_>) {
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
async fn sandbox_drained(b: &Bench<'_>, patience: Duration) -> Duration {
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
async fn open_loop(
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
        let spent = meter.stop().await.per(outcome.count(201) as f64);
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
async fn measure_ceiling(
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
async fn measure_floor(
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

fn machine() -> (String, String) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    (format!("{cores} cores ({cpu})"), mem)
}

async fn report(db: &PgPool, args: &Args, rows: &[Row], idle_rss: u64, peak_rss: u64) -> String {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(db)
        .await
        .unwrap_or_default();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let (cores, mem) = machine();
    let mut out = String::new();
    out += &format!(
        "Machine: {cores}, {mem}; PostgreSQL {version}; commit {commit}; {} per scenario.\n",
        humanize(args.duration)
    );
    out += "The load driver, the sandbox, oncepay and PostgreSQL share the same cores.\n\n";
    out += "| scenario | conns | req/s | p50 ms | p99 ms | p99.9 ms | errors | ceiling tx/s (best conns) | of ceiling | same-SQL floor tx/s (conns) | of same-SQL | RSS MiB | effects |\n";
    out += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    // A database measurement as "tx/s (conns)" and the service's rate over it.
    let against = |point: Option<(usize, floor::Floor)>, rate: f64| match point {
        Some((clients, f)) => (
            format!("{:.0} ({clients})", f.tps),
            format!("{:.2}×", rate / f.tps),
        ),
        None => ("—".to_string(), "—".to_string()),
    };
    for r in rows {
        let o = &r.outcome;
        let (ceiling, of_ceiling) = against(floor::best(&r.ceiling), o.rate());
        let (floor, of_floor) = against(r.floor, o.rate());
        out += &format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {:.1} | {} |\n",
            r.scenario,
            r.connections,
            o.rate(),
            o.ms(0.5),
            o.ms(0.99),
            o.ms(0.999),
            o.failures(),
            ceiling,
            of_ceiling,
            floor,
            of_floor,
            r.rss_kib as f64 / 1024.0,
            r.check
        );
    }
    let opened: Vec<&Row> = rows.iter().filter(|r| !r.open.is_empty()).collect();
    if !opened.is_empty() {
        out += "\nOpen loop (a constant rate; each latency from the request's scheduled send time, coordinated omission corrected):\n\n";
        out += "| scenario | share of max | target req/s | achieved req/s | p50 ms | p99 ms | p99.9 ms | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in opened {
            for (share, o, _) in &r.open {
                out += &format!(
                    "| {} | {:.0} % | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |\n",
                    r.scenario,
                    share * 100.0,
                    r.outcome.rate() * share,
                    o.rate(),
                    o.ms(0.5),
                    o.ms(0.99),
                    o.ms(0.999),
                    o.failures()
                );
            }
        }
    }
    let swept: Vec<&Row> = rows.iter().filter(|r| !r.ceiling.is_empty()).collect();
    if !swept.is_empty() {
        out += "\nThe ceilings' sweep (pgbench, minimal SQL; tx/s at each connection count):\n\n| scenario |";
        for c in floor::SWEEP {
            out += &format!(" {c} |");
        }
        out += "\n|---|";
        for _ in floor::SWEEP {
            out += "---:|";
        }
        out += "\n";
        for r in swept {
            out += &format!("| {} |", r.scenario);
            for (_, f) in &r.ceiling {
                out += &format!(" {:.0} |", f.tps);
            }
            out += "\n";
        }
    }
    for r in rows {
        if let Some(tail) = r.drained {
            out += &format!(
                "\n{}'s provider webhooks went on arriving {:.1} s after its closed loop ended: counting that time, {:.0} req/s{}; the open loop's shares are of this rate.\n",
                r.scenario,
                tail.as_secs_f64(),
                r.sustained_rate(),
                floor::best(&r.ceiling).map_or(String::new(), |(_, f)| format!(
                    " ({:.2}× of the ceiling)",
                    r.sustained_rate() / f.tps
                ))
            );
        }
        if let Some(cap) = &r.capacity {
            let ceiling = floor::best(&r.ceiling).map(|(_, f)| f.tps);
            match &cap.held {
                Some((rate, o)) => {
                    let ratio = ceiling.map_or(String::new(), |tps| {
                        let ratio = rate / tps;
                        format!(
                            ", {ratio:.2}× its minimal ceiling ({tps:.0} tx/s; target ≥ 0.75×: {})",
                            if ratio >= 0.75 { "met" } else { "not met" }
                        )
                    });
                    out += &format!(
                        "\n{}'s capacity: {rate:.0} req/s held for {} with p99 {:.2} ms (p50 {:.2} ms, 0 errors, its webhooks keeping up){ratio}.",
                        r.scenario,
                        humanize(args.sustain),
                        o.ms(0.99),
                        o.ms(0.5),
                    );
                }
                None => {
                    out += &format!(
                        "\n{}'s capacity: no probed rate held p99 under {CAPACITY_P99_MS} ms for {}.",
                        r.scenario,
                        humanize(args.sustain)
                    );
                }
            }
            out += " Probes (asked → achieved req/s, p99 ms; of each second's p99, the median and the worst; the worst of the 8 KiB flushes the bench timed every 10 ms on the system's temporary directory's disk, where a commit's stall shows whatever the service does):";
            for p in &cap.probes {
                let disk = p.flushes.map_or(String::new(), |f| {
                    format!(
                        "; the disk's worst flush {:.1} ms, {} over 20 ms",
                        f.worst_ms, f.over_20_ms
                    )
                });
                out += &format!(
                    " {:.0} → {:.0}, {:.1}; {:.1}, {:.1}{disk} ({});",
                    p.asked,
                    p.achieved,
                    p.p99,
                    p.seconds_median,
                    p.seconds_worst,
                    if p.held { "held" } else { "not held" }
                );
            }
            out.pop();
            out += ".\n";
        }
        if let Some((clients, f)) = r.with_outbox {
            out += &format!(
                "\n{}'s ceiling with the outbox's event rows added (three per payment, as the service writes them; {clients} connections): {:.0} tx/s, the service {:.2}× of it.\n",
                r.scenario,
                f.tps,
                r.outcome.rate() / f.tps
            );
        }
    }
    out += &cpu_table(rows);
    out += &format!(
        "\nRSS of `oncepay serve`: {:.1} MiB idle, {:.1} MiB peak under load.\n",
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
    out
}

/// Whose CPU each request cost (see [`cpu`]), and for pay the arithmetic
/// it gives: how many payments the cores allow at all, against the ceiling.
fn cpu_table(rows: &[Row]) -> String {
    let measured: Vec<&Row> = rows.iter().filter(|r| r.cpu.is_some()).collect();
    if measured.is_empty() {
        return String::new();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut out = format!(
        "\nCPU per request, in ms of CPU time (read from /proc while each ran; the machine's column is every process and the kernel; {cores:.0} cores give {:.0} ms a second):\n\n| run | req/s | PostgreSQL | oncepay serve | sandbox | driver | machine | cores busy |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        cores * 1000.0
    );
    let ms = |v: f64| {
        if v > 0.0 {
            format!("{v:.3}")
        } else {
            "—".to_string()
        }
    };
    // The driver is this program, or pgbench for a ceiling (the other idles).
    let mut line = |run: String, rate: f64, c: &cpu::Cpu| {
        out += &format!(
            "| {run} | {rate:.0} | {} | {} | {} | {} | {} | {:.2} |\n",
            ms(c.postgres),
            ms(c.serve),
            ms(c.sandbox),
            ms(c.driver + c.pgbench),
            ms(c.machine),
            c.cores_busy
        );
    };
    let mut arithmetic = String::new();
    for r in measured {
        let Some(c) = r.cpu else { continue };
        let what = if r.drained.is_some() {
            "closed loop, its webhooks included"
        } else {
            "closed loop"
        };
        line(format!("{} ({what})", r.scenario), r.outcome.rate(), &c);
        for (share, o, spent) in &r.open {
            line(
                format!("{} at {:.0} % (open loop)", r.scenario, share * 100.0),
                o.rate(),
                spent,
            );
        }
        let held = r.capacity.as_ref().and_then(|cap| {
            cap.probes
                .iter()
                .filter(|p| p.held)
                .max_by(|a, b| a.asked.total_cmp(&b.asked))
        });
        if let Some(p) = held {
            line(
                format!("{} at its capacity", r.scenario),
                p.achieved,
                &p.cpu,
            );
        }
        let ceiling = floor::best(&r.ceiling);
        if let Some((clients, f)) = ceiling {
            let t = f.cpu_per_transaction();
            line(
                format!(
                    "{}'s minimal ceiling (pgbench, {clients} connections)",
                    r.scenario
                ),
                f.tps,
                &t,
            );
            if r.capacity.is_some() {
                let most = cores * 1000.0 / c.machine.max(1e-9);
                let target = 0.75 * f.tps;
                let budget = cores * 1000.0 * 0.85 / target;
                let mut measured = held.map_or(String::new(), |p| {
                    format!(
                        " At its capacity ({:.0}/s) a request cost {:.3} ms.",
                        p.achieved, p.cpu.machine
                    )
                });
                // What the budget leaves the service at the measured rate
                // nearest the target: the database, the provider, the
                // driver and the kernel spend theirs first.
                let nearest = r
                    .open
                    .iter()
                    .map(|(_, o, spent)| (o.rate(), spent))
                    .chain(held.map(|p| (p.achieved, &p.cpu)))
                    .min_by(|a, b| (a.0 - target).abs().total_cmp(&(b.0 - target).abs()));
                if let Some((rate, spent)) = nearest {
                    let others = spent.machine - spent.serve;
                    measured += &format!(
                        " At {rate:.0}/s, the measured rate nearest {target:.0}, everything but `oncepay serve` (PostgreSQL, the sandbox, the driver, the kernel) cost {others:.3} ms a request, which leaves the service {:.3} ms of that budget; it spent {:.3}.",
                        budget - others,
                        spent.serve
                    );
                }
                arithmetic += &format!(
                    "\n{}'s arithmetic: a request costs the machine {:.3} ms (closed loop), so {cores:.0} cores allow at most {most:.0}/s with both busy all the time: {:.2}× the minimal ceiling, whose transaction costs {:.3} ms. Holding 0.75× the ceiling ({target:.0}/s) with the cores 85 % busy needs at most {:.3} ms a request at that rate.{measured}\n",
                    r.scenario,
                    c.machine,
                    most / f.tps,
                    t.machine,
                    budget
                );
            }
        }
    }
    out + &arithmetic
}

fn humanize(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Replaces the block between the markers in `path`, or writes a new file.
fn write_report(path: &PathBuf, report: &str) -> Result<(), String> {
    const START: &str = "<!-- bench:start -->";
    const END: &str = "<!-- bench:end -->";
    let block = format!("{START}\n{report}{END}");
    let text = match std::fs::read_to_string(path) {
        Ok(old) => match (old.find(START), old.find(END)) {
            (Some(a), Some(b)) if a < b => format!("{}{block}{}", &old[..a], &old[b + END.len()..]),
            _ => format!("{old}\n{block}\n"),
        },
        Err(_) => format!("# Benchmarks\n\nLatest `make bench`:\n\n{block}\n"),
    };
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// What every scenario needs: the stack, its database, the fixture the
/// floors use, and the run's settings.
struct Bench<'a> {
    args: &'a Args,
    stack: &'a Stack,
    db: &'a PgPool,
    client: reqwest::Client,
    fixture: floor::Fixture,
    merchant: Uuid,
    /// Highest resident memory of `oncepay serve` seen right after a load.
    peak_rss: std::cell::Cell<u64>,
    /// The same, in the current scenario.
    scenario_rss: std::cell::Cell<u64>,
}

impl Bench<'_> {
    fn sample_rss(&self) {
        let now = self.stack.memory_kib().map(|m| m.0).unwrap_or(0);
        self.peak_rss.set(self.peak_rss.get().max(now));
        self.scenario_rss.set(self.scenario_rss.get().max(now));
    }
}

/// The scenarios, in the order they run; `--scenarios` picks among them.
const SCENARIOS: &[&str] = &["create-order", "pay", "replay", "mixed"];

/// create-order: every request a new key.
async fn create_order(b: &Bench<'_>) -> Result<Row, String> {
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

/// pay: orders made beforehand; every request a new key, `tok_visa`.
async fn pay(b: &Bench<'_>) -> Result<Row, String> {
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

/// `n` orders awaiting payment, made in one statement.
pub(crate) async fn prepare_orders(
    db: &PgPool,
    merchant: Uuid,
    n: usize,
) -> Result<Vec<Uuid>, String> {
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

/// One capacity probe: the rate asked and achieved, its p99, and how its
/// seconds' p99s spread (a worst second far above the median is a stall,
/// not a rate the service cannot hold).
struct Probe {
    asked: f64,
    achieved: f64,
    p99: f64,
    seconds_median: f64,
    seconds_worst: f64,
    held: bool,
    /// CPU per request, ms, webhooks included.
    cpu: cpu::Cpu,
    /// The disk's flushes meanwhile ([`disk`]).
    flushes: Option<disk::Flushes>,
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

/// Each second's p99 of an open loop, in order: where its tail sits (right
/// after the bench's checkpoint, or spread).
fn seconds(outcome: &load::Outcome) -> String {
    let each: Vec<String> = outcome
        .seconds_p99
        .iter()
        .map(|ms| format!("{ms:.0}"))
        .collect();
    each.join(" ")
}

/// Drops a bench database (they are disposable; runs must not pile up).
pub(crate) async fn drop_database(pg_server: &str, database: &str) {
    if let Ok(admin) = PgPool::connect(&format!("{pg_server}/postgres")).await {
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&admin)
            .await;
        admin.close().await;
    }
}

/// replay: one key, many connections.
async fn replay(b: &Bench<'_>) -> Result<Row, String> {
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
async fn mixed(b: &Bench<'_>) -> Result<Row, String> {
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
