//! `oncepay-bench` (run by `make bench`): throughput, latency and memory of
//! `oncepay serve`, next to what PostgreSQL alone does with the same SQL.
//!
//! It creates a fresh database, starts the sandbox and the service from the
//! release binaries, drives closed-loop load with its own HTTP client, checks
//! each scenario's effects by counting rows and sandbox charges, runs the
//! pgbench floor, and prints one table, which it also writes into
//! `BENCHMARKS.md` between markers (the rest of that file is kept).

mod capacity;
mod capture;
mod cpu;
mod disk;
mod floor;
mod harness;
mod load;
mod pay;
mod populate;
mod report;
mod reserve;
mod scenarios;
mod stack;
mod statements;
mod transfers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use harness::Bench;
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
    /// Client connections for create-order, pay, mixed, capture,
    /// reserve-hot and reserve-spread.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    connections: u16,
    /// Client connections for replay.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u16).range(1..))]
    replay_connections: u16,
    /// Which scenarios, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "create-order,pay,replay,mixed,capture,transfers,reserve-hot,reserve-spread"
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
        order_request: json!({"path_id": null, "body": scenarios::order_body()}).to_string(),
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
    let (mut grown, baseline) = populate::grow(&bench).await?;
    let mut rows = Vec::new();
    for scenario in scenarios::SCENARIOS.iter().filter(|s| args.wants(s)) {
        bench.scenario_rss.set(0);
        let mut row = match *scenario {
            "create-order" => scenarios::create_order(&bench).await?,
            "pay" => pay::pay(&bench).await?,
            "replay" => scenarios::replay(&bench).await?,
            "capture" => capture::capture(&bench).await?,
            "transfers" => transfers::transfers(&bench).await?,
            "reserve-hot" => reserve::reserve(&bench, false).await?,
            "reserve-spread" => reserve::reserve(&bench, true).await?,
            _ => scenarios::mixed(&bench).await?,
        };
        bench.sample_rss();
        row.rss_kib = bench.scenario_rss.get();
        rows.push(row);
    }
    if args.wants("pay") && args.statements > 0 {
        eprintln!("statements per payment, counted on the wire ...");
        grown += &statements::per_payment(&pg_server, &serve_env, args.statements).await?;
    }
    grown += &populate::swept(&bench, baseline).await;
    let peak_rss_under_load = bench.peak_rss.get();
    let (_, peak_rss) = stack.memory_kib().unwrap_or((0, 0));
    let report = report::report(
        &db,
        &args,
        &rows,
        idle_rss,
        peak_rss_under_load.max(peak_rss),
    )
    .await;
    let report = report + &grown;
    println!("{report}");
    report::write(&args.out, &report)?;
    eprintln!("written to {}", args.out.display());
    drop(stack);
    db.close().await;
    stack::drop_database(&pg_server, &database).await;
    if rows.iter().any(|r| r.check.starts_with("BREACH")) {
        return Err("an effect check failed: see the table".into());
    }
    Ok(())
}
