//! `oncepay-chaos` (run by `make chaos`): a soak of payment intents through
//! three `oncepay serve` processes on one private PostgreSQL cluster, while a
//! fault driver SIGKILLs serve processes, restarts (or crashes) PostgreSQL
//! and cuts the service's database connections, and the sandbox answers
//! `5xx`, drops answers after charging, answers late, and delivers webhooks
//! twice and out of order. When the faults stop and the reconciler has
//! settled everything, it checks the invariants by counting, prints them
//! with the faults and retries, and exits non-zero on any breach.

mod clients;
mod cluster;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::{PgPool, Row};

use clients::{Clients, Intent};
use cluster::{free_port, PgCluster, Service};

const USAGE: &str = "\
oncepay-chaos — break the stack on purpose, then prove nothing was charged twice or lost

USAGE: oncepay-chaos [--intents 2000] [--concurrency 32] [--max-duration 8m] [--processes 3]";

struct Args {
    intents: usize,
    concurrency: usize,
    max_duration: Duration,
    processes: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        intents: 2000,
        concurrency: 32,
        max_duration: Duration::from_secs(480),
        processes: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n\n{USAGE}"))
        };
        let number = |v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--intents" => args.intents = number(value()?)?,
            "--concurrency" => args.concurrency = number(value()?)?.max(1),
            "--processes" => args.processes = number(value()?)?.max(1),
            "--max-duration" => args.max_duration = oncepay::config::parse_duration(&value()?)?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown option {other}\n\n{USAGE}")),
        }
    }
    Ok(args)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let root = std::env::temp_dir().join(format!("oncepay-chaos-{}", std::process::id()));
    let result = run(&args, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("oncepay-chaos: INVARIANT BREACHED (see the table)");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("oncepay-chaos: {message}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Default)]
struct Faults {
    kills: u64,
    pg_crashes: u64,
    pg_restarts: u64,
    terminations: u64,
}

async fn run(args: &Args, root: &std::path::Path) -> Result<bool, String> {
    std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
    let bin = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("oncepay");
    eprintln!("private PostgreSQL cluster in {} ...", root.display());
    let pg = PgCluster::create(root).await?;
    let outcome = soak(args, root, &pg, &bin).await;
    pg.stop().await;
    outcome
}

async fn soak(
    args: &Args,
    root: &std::path::Path,
    pg: &PgCluster,
    bin: &std::path::Path,
) -> Result<bool, String> {
    let db_url = pg.url("oncepay");
    oncepay::store::prepare_database(&db_url)
        .await
        .map_err(|e| e.to_string())?;
    let setup = oncepay::store::pool(&db_url, 1).map_err(|e| e.to_string())?;
    let api_key = oncepay::api_keys::create(&setup, "chaos")
        .await
        .map_err(|e| e.to_string())?;
    setup.close().await;
    let ports: Vec<u16> = (0..args.processes)
        .map(|_| free_port())
        .collect::<Result<_, _>>()?;
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let sandbox_base = format!("http://127.0.0.1:{}", free_port()?);
    let env = |pairs: &[(&str, String)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect::<Vec<_>>()
    };
    let mut sandbox = Service::new(
        bin,
        &["sandbox"],
        env(&[
            (
                "ONCEPAY_SANDBOX_BIND",
                sandbox_base.trim_start_matches("http://").to_string(),
            ),
            (
                "ONCEPAY_SANDBOX_WEBHOOK_URL",
                format!("{}/webhooks/sandbox", bases[0]),
            ),
            ("ONCEPAY_SANDBOX_ASYNC_DELAY", "1s".into()),
            ("ONCEPAY_SANDBOX_ERROR_RATE", "0.05".into()),
            ("ONCEPAY_SANDBOX_DROP_RATE", "0.05".into()),
            ("ONCEPAY_SANDBOX_DELAY_RATE", "0.03".into()),
            ("ONCEPAY_SANDBOX_DELAY", "1500ms".into()),
            ("ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS", "2".into()),
            ("ONCEPAY_SANDBOX_REORDER_WEBHOOKS", "on".into()),
            ("ONCEPAY_LOG", "warn".into()),
        ]),
        sandbox_base.clone(),
        root.join("sandbox.log"),
    );
    sandbox.start("/healthz").await?;
    let mut services: Vec<Service> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            Service::new(
                bin,
                &["serve"],
                env(&[
                    ("DATABASE_URL", db_url.clone()),
                    ("ONCEPAY_BIND", format!("127.0.0.1:{port}")),
                    ("ONCEPAY_PROVIDER_URL", sandbox_base.clone()),
                    ("ONCEPAY_PROVIDER_TIMEOUT", "1s".into()),
                    ("ONCEPAY_IDEMPOTENCY_LEASE", "3s".into()),
                    ("ONCEPAY_RECONCILE_INTERVAL", "500ms".into()),
                    ("ONCEPAY_RECONCILE_AFTER", "2s".into()),
                    ("ONCEPAY_HTTP_WORKERS", "2".into()),
                    ("ONCEPAY_LOG", "warn".into()),
                ]),
                bases[i].clone(),
                root.join(format!("serve-{i}.log")),
            )
        })
        .collect();
    for s in services.iter_mut() {
        s.start("/readyz").await?;
    }
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&db_url)
        .await
        .map_err(|e| e.to_string())?;

    let run_id = format!("{}", std::process::id());
    let clients = Arc::new(Clients::new(
        bases.clone(),
        api_key,
        Duration::from_secs(3),
        Duration::from_secs(90),
    ));
    let started = Instant::now();
    let deadline = started + args.max_duration;
    let gate = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let mut work = tokio::task::JoinSet::new();
    for i in 0..args.intents {
        let (clients, gate, run_id) = (clients.clone(), gate.clone(), run_id.clone());
        work.spawn(async move {
            let _permit = gate.acquire_owned().await;
            if Instant::now() > deadline {
                return (i, None);
            }
            (i, Some(clients.run_intent(&run_id, i).await))
        });
    }
    eprintln!(
        "{} intents through {} serve processes, with faults ...",
        args.intents, args.processes
    );
    let mut faults = Faults::default();
    let mut intents: Vec<Option<Intent>> = vec![None; args.intents];
    let mut done = 0;
    let mut next_fault = Instant::now() + Duration::from_millis(500);
    while done < args.intents {
        tokio::select! {
            finished = work.join_next() => match finished {
                Some(Ok((i, intent))) => { intents[i] = intent; done += 1; }
                Some(Err(e)) => return Err(format!("a client task failed: {e}")),
                None => break,
            },
            _ = tokio::time::sleep_until(next_fault.into()) => {
                inject(&mut faults, pg, &mut services, &db).await?;
                next_fault = Instant::now() + Duration::from_millis(fastrand::u64(150..700));
            }
        }
    }
    let soak_time = started.elapsed();
    eprintln!(
        "faults stopped after {soak_time:.0?}; waiting for the reconciler to settle everything ..."
    );
    let settled = settle(&db, Duration::from_secs(120)).await?;
    let report = check(
        &db,
        &sandbox_base,
        &intents,
        &faults,
        &clients,
        soak_time,
        settled,
    )
    .await?;
    println!("{}", report.text);
    for s in services.iter_mut() {
        s.kill().await;
    }
    sandbox.kill().await;
    db.close().await;
    Ok(report.ok)
}

/// One random fault; every kill is followed by a restart.
async fn inject(
    faults: &mut Faults,
    pg: &PgCluster,
    services: &mut [Service],
    db: &PgPool,
) -> Result<(), String> {
    match fastrand::u8(0..10) {
        0..=3 => {
            let i = fastrand::usize(0..services.len());
            services[i].kill().await;
            faults.kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(200..800))).await;
            services[i].start("/readyz").await?;
        }
        4..=5 => {
            let crash = fastrand::bool();
            pg.restart(crash).await?;
            if crash {
                faults.pg_crashes += 1;
            } else {
                faults.pg_restarts += 1;
            }
        }
        6..=7 => {
            let cut = sqlx::query("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'oncepay%'")
                .execute(db)
                .await;
            if cut.is_ok() {
                faults.terminations += 1;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Waits until nothing is pending or executing.
async fn settle(db: &PgPool, patience: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let open: Result<i64, _> = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM payment_attempt WHERE status = 'pending')
                  + (SELECT count(*) FROM refund WHERE status = 'pending')
                  + (SELECT count(*) FROM idempotency_record WHERE state = 'executing')",
        )
        .fetch_one(db)
        .await;
        if open.as_ref().is_ok_and(|n| *n == 0) || started.elapsed() > patience {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct Report {
    text: String,
    ok: bool,
}

struct Table {
    rows: Vec<(String, u64, u64)>,
}

impl Table {
    fn row(&mut self, name: &str, checked: u64, breaches: u64) {
        self.rows.push((name.to_string(), checked, breaches));
    }
}

async fn check(
    db: &PgPool,
    sandbox: &str,
    intents: &[Option<Intent>],
    faults: &Faults,
    clients: &Clients,
    soak_time: Duration,
    settle_time: Duration,
) -> Result<Report, String> {
    let ledger: Value = reqwest::get(format!("{sandbox}/v1/ledger"))
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let empty = Vec::new();
    let charges = ledger["charges"].as_array().unwrap_or(&empty);
    let mut charges_by_order: HashMap<String, Vec<&Value>> = HashMap::new();
    for c in charges {
        if let Some(order) = c["order_id"].as_str() {
            charges_by_order
                .entry(order.to_string())
                .or_default()
                .push(c);
        }
    }
    let charge_by_key: HashMap<&str, &Value> = charges
        .iter()
        .filter_map(|c| Some((c["idempotency_key"].as_str()?, c)))
        .collect();
    let rows = sqlx::query(
        "SELECT p.id::text AS id, p.order_id::text AS order_id, p.status, p.amount, p.refunded_amount,
                COALESCE((SELECT sum(amount) FROM refund r WHERE r.payment_id = p.id AND r.status <> 'failed'), 0)::bigint AS committed,
                COALESCE((SELECT sum(amount) FROM refund r WHERE r.payment_id = p.id AND r.status = 'succeeded'), 0)::bigint AS refunded
           FROM payment_attempt p",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut payments: HashMap<String, (String, String, i64)> = HashMap::new();
    let mut t = Table { rows: Vec::new() };

    // 1. Exactly one charge for a succeeded payment, none for a failed one.
    let (mut checked, mut breaches) = (0, 0);
    let mut refund_checked = 0;
    let mut refund_breaches = 0;
    for row in &rows {
        let get = |c: &str| row.try_get::<String, _>(c).unwrap_or_default();
        let (id, order, status) = (get("id"), get("order_id"), get("status"));
        let amount: i64 = row.try_get("amount").unwrap_or(0);
        let succeeded_charges = charges_by_order
            .get(&order)
            .map(|cs| cs.iter().filter(|c| c["status"] == "succeeded").count())
            .unwrap_or(0);
        let own = charge_by_key.get(id.as_str());
        checked += 1;
        let ok = match status.as_str() {
            "succeeded" => {
                succeeded_charges == 1 && own.is_some_and(|c| c["status"] == "succeeded")
            }
            "failed" => own.is_none_or(|c| c["status"] != "succeeded"),
            _ => false,
        };
        breaches += u64::from(!ok);
        // Refunds never exceed the payment, here or at the provider.
        let committed: i64 = row.try_get("committed").unwrap_or(0);
        let refunded: i64 = row.try_get("refunded").unwrap_or(0);
        let recorded: i64 = row.try_get("refunded_amount").unwrap_or(0);
        let at_provider = own.and_then(|c| c["amount_refunded"].as_i64()).unwrap_or(0);
        refund_checked += 1;
        refund_breaches += u64::from(
            committed > amount
                || refunded != recorded
                || at_provider != recorded
                || at_provider > amount,
        );
        payments.insert(id, (order, status, amount));
    }
    let double_charged_orders = charges_by_order
        .values()
        .filter(|cs| cs.iter().filter(|c| c["status"] == "succeeded").count() > 1)
        .count() as u64;
    t.row(
        "a succeeded payment has exactly one charge, a failed one none",
        checked,
        breaches,
    );
    t.row(
        "no order charged twice (sandbox ledger)",
        charges_by_order.len() as u64,
        double_charged_orders,
    );
    let multi = ledger["totals"]["keys_with_more_than_one_effect"]
        .as_u64()
        .unwrap_or(u64::MAX);
    t.row(
        "no provider key with more than one effect",
        charges.len() as u64,
        multi,
    );

    // 2. Every 2xx a client received matches what is stored.
    let (mut checked, mut breaches) = (0, 0);
    let (mut fwd_checked, mut fwd_breaches) = (0, 0);
    let mut gave_up = 0;
    let mut finished = 0;
    for intent in intents.iter().flatten() {
        finished += 1;
        if intent.gave_up.is_some() {
            gave_up += 1;
        }
        if let Some(order_id) = &intent.order_id {
            checked += 1;
            let stored: Option<i64> =
                sqlx::query_scalar("SELECT amount FROM orders WHERE id = $1::uuid")
                    .bind(order_id)
                    .fetch_optional(db)
                    .await
                    .map_err(|e| e.to_string())?;
            breaches += u64::from(stored != intent.amount);
        }
        if let Some(first) = intent.payment_answers.first() {
            checked += 1;
            let same = intent.payment_answers.iter().all(|a| a == first);
            let id = first["id"].as_str().unwrap_or_default();
            let answered = first["status"].as_str().unwrap_or_default();
            let stored = payments.get(id).map(|(_, s, _)| s.as_str());
            let consistent = match (answered, stored) {
                (_, None) => false,
                ("pending", Some(s)) => s != "pending",
                (a, Some(s)) => a == s,
            };
            breaches += u64::from(!(same && consistent));
            // States only moved forward: once final, every later look agrees,
            // and so does the database.
            fwd_checked += 1;
            let finals: Vec<&String> = intent
                .payment_statuses
                .iter()
                .skip_while(|s| *s == "pending")
                .collect();
            let forward = finals.iter().all(|s| Some(s.as_str()) == stored)
                && finals.windows(2).all(|w| w[0] == w[1]);
            fwd_breaches += u64::from(!forward);
        }
        if let Some(first) = intent.refund_answers.first() {
            checked += 1;
            let exists: Option<String> =
                sqlx::query_scalar("SELECT status FROM refund WHERE id = $1::uuid")
                    .bind(first["id"].as_str().unwrap_or_default())
                    .fetch_optional(db)
                    .await
                    .map_err(|e| e.to_string())?;
            breaches +=
                u64::from(exists.is_none() || intent.refund_answers.iter().any(|a| a != first));
        }
    }
    t.row(
        "every 2xx a client received matches what is stored",
        checked,
        breaches,
    );
    t.row(
        "states only moved forward (as clients saw them)",
        fwd_checked,
        fwd_breaches,
    );
    t.row(
        "refunds never exceed their payment (db and provider agree)",
        refund_checked,
        refund_breaches,
    );
    let open = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(db)
            .await
            .unwrap_or(-1)
    };
    let pending = open("SELECT count(*) FROM payment_attempt WHERE status = 'pending'").await
        + open("SELECT count(*) FROM refund WHERE status = 'pending'").await;
    let executing = open("SELECT count(*) FROM idempotency_record WHERE state = 'executing'").await;
    let (attempts, refunds) = (
        open("SELECT count(*) FROM payment_attempt").await,
        open("SELECT count(*) FROM refund").await,
    );
    t.row(
        "no payment or refund left pending",
        (attempts + refunds) as u64,
        pending.unsigned_abs(),
    );
    t.row(
        "no idempotency record left executing",
        open("SELECT count(*) FROM idempotency_record").await as u64,
        executing.unsigned_abs(),
    );
    t.row(
        "intents finished by their clients (no give-up)",
        finished,
        gave_up,
    );

    let ok = t.rows.iter().all(|(_, _, b)| *b == 0);
    let mut text = String::new();
    text += &format!(
        "\n{} intents in {soak_time:.1?} (+{settle_time:.1?} to settle); {} payments, {} refunds.\n\n",
        intents.iter().flatten().count(),
        attempts,
        refunds
    );
    text += "| invariant | checked | breaches |\n|---|---:|---:|\n";
    for (name, checked, breaches) in &t.rows {
        text += &format!("| {name} | {checked} | {breaches} |\n");
    }
    let f = &ledger["totals"]["faults"];
    let events = open("SELECT count(*) FROM webhook_event").await;
    let delivered = ledger["totals"]["webhooks_delivered"].as_i64().unwrap_or(0);
    let provider = |name: &str| f[name].as_u64().unwrap_or(0);
    let fault_rows = [
        ("serve process SIGKILLed and restarted", faults.kills),
        (
            "PostgreSQL crashed (immediate stop) and restarted",
            faults.pg_crashes,
        ),
        ("PostgreSQL restarted (fast stop)", faults.pg_restarts),
        (
            "service connections terminated (pg_terminate_backend)",
            faults.terminations,
        ),
        ("provider 5xx before charging", provider("error_5xx")),
        (
            "provider charged, answer lost",
            provider("dropped_response"),
        ),
        (
            "provider answered past the client timeout",
            provider("delayed_response"),
        ),
        (
            "webhook deliveries beyond the first (duplicates)",
            (delivered - events).max(0) as u64,
        ),
    ];
    text += "\n| fault injected | count |\n|---|---:|\n";
    for (name, count) in fault_rows {
        text += &format!("| {name} | {count} |\n");
    }
    text += "\n| client retry (same key) | count |\n|---|---:|\n";
    for (reason, n) in &clients.retries.lock().await.by_reason {
        text += &format!("| {reason} | {n} |\n");
    }
    text += if ok {
        "\nAll invariants hold.\n"
    } else {
        "\nINVARIANT BREACHED.\n"
    };
    Ok(Report { text, ok })
}
