//! `oncepay-chaos` (run by `make chaos`): a soak of payment intents through
//! three `oncepay serve` processes on one private PostgreSQL cluster, while a
//! fault driver SIGKILLs serve processes, restarts (or crashes) PostgreSQL
//! and cuts the service's database connections, and the sandbox answers
//! `5xx`, drops answers after charging, answers late, and delivers webhooks
//! twice and out of order, and the merchant's webhook receiver fails a
//! fifth of its deliveries. With `--provider stripe` new payments go to
//! localstripe behind the testkit's Stripe layer instead, which answers
//! `429`, `500` (with `Stripe-Should-Retry` either way), `401`, `409 key in
//! use`, drops answers after the effect and saves a `500` after it, saves
//! a `500` before any effect and replays it, and refuses captures (`402
//! card_declined`, `400 amount_too_small`), in spells; a tenth of the
//! customers go to the 3-D Secure bank, and a third of the bank's refund
//! failures and dispute changes come without their webhook, so the books
//! pass (`oncepay reconcile`, run once the faults stop) must apply them.
//! When the faults stop and the reconciler has
//! settled everything, it checks the invariants by counting, prints them
//! with the faults and retries, and exits non-zero on any breach.

/// SQL: whether the payment `$p` (an alias of `payment_attempt`) is a
/// manual one that was authorized here at some point: held now, captured,
/// or voided after it said so (its `payment.requires_capture`, written in
/// the transaction that moved it) or after its deadline's reminder. A
/// manual payment whose hold the provider ended while its answer was
/// still unknown here went from pending to voided, never authorized.
macro_rules! was_authorized {
    ($p:literal) => {
        concat!(
            "(", $p, ".capture_method = 'manual' AND (",
            $p, ".status IN ('requires_capture', 'succeeded') OR (",
            $p, ".status = 'voided' AND (",
            $p, ".capture_reminded_at IS NOT NULL OR EXISTS (SELECT 1 FROM event e WHERE e.object_id = ",
            $p, ".id AND e.type = 'payment.requires_capture')))))"
        )
    };
}

mod answers;
mod balances;
mod bank;
mod clients;
mod ha;
mod holds;
mod invariants;
mod outbox;
mod restore;
mod stock;
mod stripe;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser, ValueEnum};
use sqlx::PgPool;

use clients::{Clients, Intent, PaymentMethods};
use oncepay_testkit::fault_proxy::{Fault, FaultProxy, Route};
use oncepay_testkit::lossy_tcp::LossyTcp;
use oncepay_testkit::patroni::HaCluster;
use oncepay_testkit::ports::free_port;
use oncepay_testkit::processes::{sibling_binary, PgCluster, Service};
use oncepay_testkit::receiver::{Policy, Receiver};

/// oncepay-chaos — break the stack on purpose, then prove nothing was
/// charged twice or lost.
#[derive(Debug, Parser)]
#[command(name = "oncepay-chaos", version)]
struct Args {
    /// How many intents to run.
    #[arg(long, default_value_t = 2000)]
    intents: usize,
    /// Instead of a number of intents: start new ones until this much time
    /// has passed (a soak), e.g. 10m.
    #[arg(long, value_parser = duration)]
    duration: Option<Duration>,
    /// Intents in flight at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// With --intents: stop starting new intents after this long.
    #[arg(long, default_value = "8m", value_parser = duration)]
    max_duration: Duration,
    /// How many `oncepay serve` processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    processes: u16,
    /// Run on PostgreSQL under Patroni (three nodes, synchronous_mode, etcd,
    /// HAProxy) and fail it over again and again (`make chaos-ha`).
    #[arg(long)]
    ha: bool,
    /// With --ha: intents go on until this many failovers were made.
    #[arg(long, default_value_t = 12, requires = "ha")]
    failovers: usize,
    /// With --ha: the misconfiguration — asynchronous replication, and
    /// failovers that promote a standby left behind.
    #[arg(long, requires = "ha")]
    async_replication: bool,
    /// Where oncepay's new payments go: the sandbox (behind the fault
    /// proxy), or Stripe (localstripe from `make localstripe`, behind the
    /// testkit's Stripe layer, which makes Stripe's faults). Not with --ha.
    #[arg(long, value_enum, default_value_t = Provider::Sandbox)]
    provider: Provider,
    /// The restore drill (`make chaos-restore`): PostgreSQL with WAL
    /// archiving, destroyed and restored to a point 30–120 s in the past
    /// again and again while customers pay and refund.
    #[arg(long, conflicts_with_all = ["ha", "duration"])]
    restore: bool,
    /// With --restore: how many restores.
    #[arg(long, default_value_t = 5, requires = "restore")]
    restores: usize,
    /// With --restore: how long customers pay before each restore (default:
    /// 45 to 65 s, at random; at least 31 s, so a point 30 s back exists).
    #[arg(long, value_parser = duration, requires = "restore")]
    traffic: Option<Duration>,
    /// With --restore, the mutation run: the sandbox keeps none of the
    /// trace oncepay writes into its metadata, so the books can rebuild
    /// nothing; the drill must then report double charges.
    #[arg(long, requires = "restore")]
    without_adoption: bool,
}

/// Where new payments go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Provider {
    /// `oncepay sandbox`, behind the fault proxy.
    Sandbox,
    /// localstripe behind the Stripe layer.
    Stripe,
}

/// The provider-side fault maker of the run.
enum Faulting<'a> {
    /// The fault proxy in front of the sandbox.
    Sandbox(&'a FaultProxy),
    /// The Stripe layer in front of localstripe.
    Stripe(&'a stripe::Stack),
}

/// The database under the soak.
pub enum Database {
    /// One private PostgreSQL server, crashed and restarted by the driver.
    Single(PgCluster),
    /// PostgreSQL under Patroni, failed over by the HA driver.
    Ha(Box<HaCluster>, ha::Driver),
}

impl Database {
    fn url(&self, name: &str) -> String {
        match self {
            Database::Single(pg) => pg.url(name),
            Database::Ha(cluster, _) => cluster.url(name),
        }
    }
}

/// How long a manual payment's authorization lasts at the provider (the
/// sandbox's ONCEPAY_SANDBOX_CAPTURE_WINDOW, the Stripe layer's window):
/// short, so that intents left to expire do within the soak, and some
/// captures meet the deadline.
const CAPTURE_WINDOW: &str = "8s";

fn duration(text: &str) -> Result<Duration, String> {
    oncepay::config::parse_duration(text)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.ha && args.provider == Provider::Stripe {
        Args::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--provider stripe cannot be used with --ha (the HA soak runs on the sandbox only)",
            )
            .exit();
    }
    let root = std::env::temp_dir().join(format!("oncepay-chaos-{}", std::process::id()));
    let result = if args.restore {
        let drill = restore::Drill {
            restores: args.restores,
            traffic: args.traffic,
            without_adoption: args.without_adoption,
        };
        match std::fs::create_dir_all(&root) {
            Ok(()) => restore::run(&drill, &root).await,
            Err(e) => Err(e.to_string()),
        }
    } else {
        run(&args, &root).await
    };
    if !matches!(result, Ok(true)) {
        keep_logs(&root);
    }
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

/// After a breach or an error: copies the run's logs (the serve processes'
/// and the sandbox's) out of its root, which is removed, and says where.
fn keep_logs(root: &std::path::Path) {
    let kept = root.with_file_name(format!(
        "{}-logs",
        root.file_name().unwrap_or_default().to_string_lossy()
    ));
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    if std::fs::create_dir_all(&kept).is_err() {
        return;
    }
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::copy(&path, kept.join(entry.file_name()));
        }
    }
    eprintln!(
        "oncepay-chaos: the run's logs are kept in {}",
        kept.display()
    );
}

/// Faults the driver injected, counted.
#[derive(Default)]
pub struct Faults {
    kills: u64,
    pg_crashes: u64,
    pg_restarts: u64,
    terminations: u64,
    /// Provider-side spells by kind (through the fault proxy).
    provider: std::collections::BTreeMap<&'static str, u64>,
    /// Client answers lost after the request committed.
    lost_answers: u64,
    /// With `--provider stripe`: what the Stripe layer counted.
    stripe_layer: Option<LayerCounts>,
}

/// What the Stripe layer counted over the run.
pub struct LayerCounts {
    /// Calls that met a fault.
    faulted: u64,
    /// Calls forwarded to localstripe.
    forwarded: u64,
    /// Repeats answered from a saved answer.
    replayed: u64,
    /// Captures Stripe refused (a spell's refusal, or an intent no longer
    /// capturable).
    captures_refused: u64,
}

async fn run(args: &Args, root: &std::path::Path) -> Result<bool, String> {
    std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
    let bin = sibling_binary("oncepay")?;
    let mut database = if args.ha {
        eprintln!(
            "PostgreSQL under Patroni (3 nodes, synchronous_mode: {}), etcd and HAProxy in {} ...",
            !args.async_replication,
            root.display()
        );
        let options = oncepay_testkit::patroni::Options {
            nodes: 3,
            synchronous: !args.async_replication,
        };
        let cluster = HaCluster::start(&root.join("ha"), options).await?;
        Database::Ha(Box::new(cluster), ha::Driver::new(args.async_replication))
    } else {
        eprintln!("private PostgreSQL cluster in {} ...", root.display());
        Database::Single(PgCluster::create(root).await?)
    };
    let outcome = soak(args, root, &mut database, &bin).await;
    match database {
        Database::Single(pg) => pg.stop().await,
        Database::Ha(cluster, _) => cluster.stop().await,
    }
    outcome
}

async fn soak(
    args: &Args,
    root: &std::path::Path,
    database: &mut Database,
    bin: &std::path::Path,
) -> Result<bool, String> {
    let db_url = database.url("oncepay");
    oncepay::store::prepare_database(&db_url)
        .await
        .map_err(|e| e.to_string())?;
    let setup = oncepay::store::pool(&db_url, 1).map_err(|e| e.to_string())?;
    let api_key = oncepay::api_keys::create(&setup, "chaos")
        .await
        .map_err(|e| e.to_string())?;
    setup.close().await;
    let ports: Vec<u16> = (0..args.processes.into())
        .map(|_| free_port())
        .collect::<Result<_, _>>()?;
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let sandbox_base = format!("http://127.0.0.1:{}", free_port()?);
    let mut sandbox = start_sandbox(
        bin,
        root,
        (&sandbox_base, &format!("{}/webhooks/sandbox", bases[0])),
        &[
            ("ONCEPAY_SANDBOX_ERROR_RATE", "0.05".into()),
            ("ONCEPAY_SANDBOX_DROP_RATE", "0.05".into()),
            ("ONCEPAY_SANDBOX_DELAY_RATE", "0.03".into()),
            ("ONCEPAY_SANDBOX_DELAY", "1500ms".into()),
            ("ONCEPAY_SANDBOX_REORDER_WEBHOOKS", "on".into()),
            // Manual payments' authorizations expire during the soak:
            // some are captured as they expire.
            ("ONCEPAY_SANDBOX_CAPTURE_WINDOW", CAPTURE_WINDOW.into()),
        ],
    )
    .await?;
    // The faults the sandbox cannot make come from a proxy in front of it.
    let proxy = FaultProxy::start(&sandbox_base).map_err(|e| format!("fault proxy: {e}"))?;
    // With Stripe, new payments go to localstripe behind the Stripe layer;
    // the sandbox stays registered (and idle).
    let stripe = match args.provider {
        Provider::Sandbox => None,
        Provider::Stripe => {
            eprintln!("localstripe behind the Stripe layer ...");
            let stack = stripe::Stack::start().await?;
            stack.layer.set_capture_window(
                oncepay::config::parse_duration(CAPTURE_WINDOW)
                    .map_err(|e| format!("capture window: {e}"))?,
            );
            Some(stack)
        }
    };
    // Its 3-D Secure customers pay with one card, made at start.
    let three_d_secure = match &stripe {
        Some(stack) => Some(stack.card(stripe::THREE_D_SECURE_CARD).await?),
        None => None,
    };
    let stripe_env = stripe.as_ref().map(stripe::Stack::serve_env);
    // Every serve process's environment but its address (and `oncepay
    // reconcile`'s, at the end).
    let serve_env: Vec<(String, String)> = env(&[
        ("DATABASE_URL", db_url.clone()),
        ("ONCEPAY_PROVIDER_URL", proxy.url().to_string()),
        ("ONCEPAY_PROVIDER_TIMEOUT", "1s".into()),
        ("ONCEPAY_STRIPE_TIMEOUT", "1s".into()),
        ("ONCEPAY_IDEMPOTENCY_LEASE", "3s".into()),
        ("ONCEPAY_RECONCILE_INTERVAL", "500ms".into()),
        ("ONCEPAY_RECONCILE_AFTER", "2s".into()),
        // A customer who never comes back from the bank: the
        // payment is given up after this (cancelled at the provider
        // first: a later approval moves nothing; one just before it
        // stands, or its hold is released as abandoned).
        ("ONCEPAY_ACTION_TIMEOUT", "4s".into()),
        ("ONCEPAY_SWEEP_INTERVAL", "1s".into()),
        // Some authorizations are reminded of their deadline
        // before they are captured, some not.
        ("ONCEPAY_CAPTURE_REMINDER", "5s".into()),
        (
            "ONCEPAY_STOCK_RESERVATION_TTL",
            format!("{}s", clients::STOCK_TTL.as_secs()),
        ),
        ("ONCEPAY_HTTP_WORKERS", "2".into()),
        ("ONCEPAY_LOG", "warn".into()),
        // The soak measures correctness, not the limiter.
        ("ONCEPAY_RATE_LIMIT_PER_SECOND", "0".into()),
        // The merchant's receiver is on loopback; retries come
        // fast (12 waits, ~16 s in all) so the soak settles.
        ("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "true".into()),
        ("ONCEPAY_WEBHOOK_TIMEOUT", "1s".into()),
        ("ONCEPAY_WEBHOOK_INTERVAL", "100ms".into()),
        (
            "ONCEPAY_WEBHOOK_SCHEDULE",
            "200ms,400ms,800ms,1s,1s,1s,2s,2s,2s,2s,2s,2s".into(),
        ),
    ])
    .into_iter()
    .chain(
        stripe_env
            .iter()
            .flatten()
            .map(|(k, v)| (k.to_string(), v.clone())),
    )
    .collect();
    let mut services: Vec<Service> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let mut vars = vec![("ONCEPAY_BIND".to_string(), format!("127.0.0.1:{port}"))];
            vars.extend(serve_env.iter().cloned());
            Service::new(
                bin,
                &["serve"],
                vars,
                bases[i].clone(),
                root.join(format!("serve-{i}.log")),
            )
        })
        .collect();
    for s in services.iter_mut() {
        s.start("/readyz").await?;
    }
    if let Some(stripe) = &stripe {
        // localstripe posts each event once, to the first process.
        stripe
            .register_webhook(&format!("{}/webhooks/stripe", bases[0]))
            .await?;
    }
    // Clients reach each process through a proxy that loses some answers.
    let mut lossy = Vec::new();
    for port in &ports {
        lossy.push(
            LossyTcp::start(*port, 20)
                .await
                .map_err(|e| format!("lossy proxy: {e}"))?,
        );
    }
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&db_url)
        .await
        .map_err(|e| e.to_string())?;

    let run_id = format!("{}", std::process::id());
    let clients = Arc::new(Clients::new(
        lossy.iter().map(|l| l.url.clone()).collect(),
        api_key,
        Duration::from_secs(3),
        Duration::from_secs(90),
        match args.provider {
            Provider::Sandbox => PaymentMethods::SANDBOX,
            Provider::Stripe => PaymentMethods {
                authenticated: three_d_secure.map(leak),
                ..PaymentMethods::STRIPE
            },
        },
    ));
    // The merchant's receiver, failing a fifth of its deliveries.
    let receiver =
        Receiver::start(Policy::FailRandomly(0.2)).map_err(|e| format!("webhook receiver: {e}"))?;
    let (status, endpoint) = clients
        .post(
            "/webhook_endpoints",
            &format!("endpoint-{run_id}"),
            &serde_json::json!({"url": receiver.url(), "events": ["*"]}),
        )
        .await?;
    let secret = endpoint["secret"]
        .as_str()
        .and_then(|s| oncepay::standard_webhooks::WebhookSecret::parse(s).ok())
        .ok_or_else(|| format!("registering the webhook endpoint: {status} {endpoint}"))?;
    // In HA mode a probe writes all along, to measure each failover's window.
    let successes: ha::Successes = Default::default();
    let stop_probe = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = args.ha.then(|| {
        tokio::spawn(ha::probe(
            bases.clone(),
            clients.api_key.clone(),
            successes.clone(),
            stop_probe.clone(),
        ))
    });
    // The customers' banks and cards, acting on what was paid and
    // refunded while the faults go on.
    let side = match &stripe {
        Some(stack) => bank::Side::Stripe {
            stack,
            webhooks: bases.clone(),
        },
        None => bank::Side::Sandbox {
            base: sandbox_base.clone(),
        },
    };
    let mut bank = bank::Bank::new(side, db.clone(), clients.clone());
    stock::count_in(&clients, &run_id).await?;
    let started = Instant::now();
    let started_at = chrono::Utc::now();
    match args.duration {
        Some(d) => eprintln!(
            "intents for {d:?} through {} serve processes, with faults ...",
            args.processes
        ),
        None => eprintln!(
            "{} intents through {} serve processes, with faults ...",
            args.intents, args.processes
        ),
    }
    let mut faults = Faults::default();
    let faulting = match &stripe {
        Some(stack) => Faulting::Stripe(stack),
        None => Faulting::Sandbox(&proxy),
    };
    let intents = drive(
        args,
        &clients,
        &run_id,
        &mut faults,
        database,
        &mut services,
        &faulting,
        (&db, &mut bank),
    )
    .await?;
    // While reservations are still open: each SKU's reserved stock is
    // its open reservations.
    let reserved_at_the_end = stock::reserved_is_open_reservations(&db).await;
    proxy.heal();
    if let Some(stack) = &stripe {
        stack.layer.heal();
    }
    for l in &lossy {
        l.stop_losing();
    }
    let mut failovers = String::new();
    if let Database::Ha(cluster, driver) = database {
        driver.heal(cluster).await?;
        stop_probe.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(probe) = probe {
            let _ = probe.await;
        }
        let windows = ha::windows(&driver.events, &successes.lock().await);
        failovers = ha::table(&windows);
    }
    // Every provider event the bank sent is acknowledged, every refund it
    // asked for answered.
    bank.finish().await;
    faults.lost_answers = lossy.iter().map(LossyTcp::lost).sum();
    let soak_time = started.elapsed();
    eprintln!(
        "{} intents; faults stopped after {soak_time:.0?}; waiting for the reconciler to settle everything ...",
        intents.len()
    );
    // The reconciler's pauses grow to 5 minutes for a row that met faults
    // at every look; patience covers one such pause.
    let books = match &stripe {
        Some(stack) => Books::Stripe(stack),
        None => Books::Sandbox(&sandbox_base),
    };
    let settled = settle(&db, &books, Duration::from_secs(400)).await?;
    // With Stripe some changes came without their webhook: the books pass
    // over the soak, as an operator runs it, reads them back.
    let books_pass = match &stripe {
        Some(_) => {
            eprintln!(
                "settled in {settled:.1?}; the books pass (oncepay reconcile) over the soak ..."
            );
            let since = started_at - chrono::Duration::seconds(120);
            let pass = answers::books_pass(bin, &serve_env, &db, since).await?;
            settle(&db, &books, Duration::from_secs(400)).await?;
            Some(pass)
        }
        None => None,
    };
    eprintln!("settled in {settled:.1?}; expiring every key and sending every intent again ...");
    let expiry = invariants::after_expiry(&db, &clients, &intents).await?;
    settle(&db, &books, Duration::from_secs(400)).await?;
    if let Some(stack) = &stripe {
        let (forwarded, replayed) = stack.traffic();
        faults.stripe_layer = Some(LayerCounts {
            faulted: stack.faulted(),
            forwarded,
            replayed,
            captures_refused: stack.captures_refused(),
        });
    }
    let webhooks = outbox::Receipts {
        received: receiver.received(),
        secret,
    };
    let ledger_check = balances::ledger_check(bin, &db_url).await?;
    let record = bank.record.lock().await;
    // What the provider holds of what only webhooks carry, read from it
    // (the sandbox's: what the bank made it do).
    let at_provider = match &stripe {
        Some(stack) => answers::AtProvider::stripe(stack),
        None => answers::AtProvider::sandbox(&record),
    };
    let soak = invariants::Soak {
        bank: &record,
        intents: &intents,
        faults: &faults,
        clients: &clients,
        expiry: &expiry,
        times: (soak_time, settled),
        webhooks: &webhooks,
        ledger_check: &ledger_check,
        reserved_at_the_end,
        at_provider: &at_provider,
        books_pass: books_pass.as_ref(),
    };
    let ledger = books.read().await?;
    let report = invariants::check(&db, &ledger, &soak).await?;
    println!("{}{failovers}", report.text);
    for s in services.iter_mut() {
        s.kill().await;
    }
    sandbox.kill().await;
    drop(stripe);
    db.close().await;
    Ok(report.ok)
}

/// `text` for the rest of the run (one PaymentMethod id, made at start).
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// Pairs as a child's environment.
pub(crate) fn env(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Starts `oncepay sandbox` at `base`, posting its webhooks to `webhooks`:
/// async charges settle after 1 s and every webhook is sent twice; `faults`
/// adds the run's own (`ONCEPAY_SANDBOX_*`). Its log is `sandbox.log` in
/// `root`.
pub(crate) async fn start_sandbox(
    bin: &std::path::Path,
    root: &std::path::Path,
    (base, webhooks): (&str, &str),
    faults: &[(&str, String)],
) -> Result<Service, String> {
    let mut pairs = vec![
        (
            "ONCEPAY_SANDBOX_BIND",
            base.trim_start_matches("http://").to_string(),
        ),
        ("ONCEPAY_SANDBOX_WEBHOOK_URL", webhooks.to_string()),
        ("ONCEPAY_SANDBOX_ASYNC_DELAY", "1s".into()),
        ("ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS", "2".into()),
        ("ONCEPAY_LOG", "warn".into()),
    ];
    pairs.extend(faults.iter().cloned());
    let mut sandbox = Service::new(
        bin,
        &["sandbox"],
        env(&pairs),
        base.to_string(),
        root.join("sandbox.log"),
    );
    sandbox.start("/healthz").await?;
    Ok(sandbox)
}

/// The provider's books, read for the invariants.
enum Books<'a> {
    /// The sandbox's ledger at this base URL.
    Sandbox(&'a str),
    /// localstripe's PaymentIntents and Refunds, in the ledger's shape.
    Stripe(&'a stripe::Stack),
}

impl Books<'_> {
    /// The books in the sandbox ledger's shape.
    async fn read(&self) -> Result<serde_json::Value, String> {
        match self {
            Books::Sandbox(base) => {
                oncepay_testkit::ledger::read(&reqwest::Client::new(), base).await
            }
            Books::Stripe(stack) => stack.books().await,
        }
    }

    /// Work the provider still has to do on its own (the sandbox's async
    /// settlements and webhook deliveries; localstripe's deliveries, due a
    /// second after each event: any event in the last 3 s counts as one).
    async fn work_in_flight(&self, http: &reqwest::Client) -> Result<u64, String> {
        match self {
            Books::Sandbox(base) => oncepay_testkit::ledger::totals(http, base)
                .await
                .map(|t| t["work_in_flight"].as_u64().unwrap_or(u64::MAX)),
            Books::Stripe(stack) => stack
                .events_recently(Duration::from_secs(3))
                .await
                .map(u64::from),
        }
    }
}

/// Runs the intents while injecting faults; returns what each intent saw.
#[allow(clippy::too_many_arguments)]
async fn drive(
    args: &Args,
    clients: &Arc<Clients>,
    run_id: &str,
    faults: &mut Faults,
    database: &mut Database,
    services: &mut [Service],
    faulting: &Faulting<'_>,
    (db, bank): (&PgPool, &mut bank::Bank<'_>),
) -> Result<Vec<Intent>, String> {
    let started = Instant::now();
    let more = |spawned: usize, database: &Database| match (args.duration, database) {
        (Some(d), _) => started.elapsed() < d,
        (None, Database::Ha(_, driver)) => {
            driver.events.len() < args.failovers && started.elapsed() < args.max_duration
        }
        (None, Database::Single(_)) => {
            spawned < args.intents && started.elapsed() < args.max_duration
        }
    };
    let mut next_failover = Instant::now() + Duration::from_secs(3);
    let gate = Arc::new(tokio::sync::Semaphore::new(args.concurrency.into()));
    let mut work = tokio::task::JoinSet::new();
    let mut intents = Vec::new();
    let mut spawned = 0usize;
    let mut next_fault = Instant::now() + Duration::from_millis(500);
    let mut next_bank = Instant::now() + Duration::from_secs(2);
    loop {
        let room = more(spawned, database) && gate.available_permits() > 0;
        if room {
            let permit = gate
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| e.to_string())?;
            let (clients, run_id, i) = (clients.clone(), run_id.to_string(), spawned);
            work.spawn(async move {
                let _permit = permit;
                clients.run_intent(&run_id, i).await
            });
            spawned += 1;
            continue;
        }
        if work.is_empty() && !more(spawned, database) {
            break;
        }
        let failing_over = matches!(database, Database::Ha(..)) && more(spawned, database);
        tokio::select! {
            finished = work.join_next(), if !work.is_empty() => match finished {
                Some(Ok(intent)) => intents.push(intent),
                Some(Err(e)) => return Err(format!("a client task failed: {e}")),
                None => {}
            },
            _ = tokio::time::sleep_until(next_fault.into()) => {
                inject(faults, database, services, faulting, db).await?;
                next_fault = Instant::now() + Duration::from_millis(fastrand::u64(150..700));
            }
            _ = tokio::time::sleep_until(next_bank.into()) => {
                bank.act().await;
                next_bank = Instant::now() + Duration::from_millis(fastrand::u64(150..600));
            }
            _ = tokio::time::sleep_until(next_failover.into()), if failing_over => {
                if let Database::Ha(cluster, driver) = database {
                    driver.next(cluster).await?;
                    eprintln!("failover {}: {}", driver.events.len(), driver.events.last().map_or("", |e| e.kind.describe()));
                }
                next_failover = Instant::now() + Duration::from_secs(4);
            }
        }
    }
    Ok(intents)
}

/// One random fault; every kill is followed by a restart, every provider
/// fault lasts a spell and heals by itself.
async fn inject(
    faults: &mut Faults,
    database: &Database,
    services: &mut [Service],
    faulting: &Faulting<'_>,
    db: &PgPool,
) -> Result<(), String> {
    let kind = fastrand::u8(0..18);
    match (kind, faulting) {
        (0..=7, _) => kill_or_cut(kind, faults, database, services, db).await,
        (8..=15, Faulting::Sandbox(proxy)) => {
            let name = sandbox_spell(kind, proxy);
            *faults.provider.entry(name).or_insert(0) += 1;
            Ok(())
        }
        // With Stripe its layer makes the provider's faults, as often as
        // the proxy makes the sandbox's.
        (8..=15, Faulting::Stripe(stack)) => {
            let name = stack.spell();
            *faults.provider.entry(name).or_insert(0) += 1;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A process or database fault (`kind` 0 to 7).
async fn kill_or_cut(
    kind: u8,
    faults: &mut Faults,
    database: &Database,
    services: &mut [Service],
    db: &PgPool,
) -> Result<(), String> {
    match kind {
        0..=3 => {
            let i = fastrand::usize(0..services.len());
            services[i].kill().await;
            faults.kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(200..800))).await;
            // Under Patroni a failover may leave no primary for a while: the
            // process is up when it lives, and ready when the database is.
            let up = if matches!(database, Database::Ha(..)) {
                "/healthz"
            } else {
                "/readyz"
            };
            services[i].start(up).await?;
        }
        // Under Patroni the database fails over on its own clock instead.
        4..=5 if matches!(database, Database::Ha(..)) => {}
        4..=5 => {
            let Database::Single(pg) = database else {
                return Ok(());
            };
            let crash = fastrand::bool();
            pg.restart(crash).await?;
            if crash {
                faults.pg_crashes += 1;
            } else {
                faults.pg_restarts += 1;
            }
        }
        _ => {
            let cut = sqlx::query("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'oncepay%'")
                .execute(db)
                .await;
            if cut.is_ok() {
                faults.terminations += 1;
            }
        }
    }
    Ok(())
}

/// A spell of the fault proxy in front of the sandbox (`kind` 8 to 15);
/// returns its name.
fn sandbox_spell(kind: u8, proxy: &FaultProxy) -> &'static str {
    let ms = |lo, hi| Duration::from_millis(fastrand::u64(lo..hi));
    let (name, routes, fault, lasting): (&'static str, &[Route], Fault, Duration) = match kind {
        8 => (
            "status reads refused (403, a rotated credential)",
            &[Route::StatusRead],
            Fault::answer(403, "forbidden"),
            ms(300, 1500),
        ),
        9 => (
            "status reads timed out (408)",
            &[Route::StatusRead],
            Fault::answer(408, "request_timeout"),
            ms(300, 1500),
        ),
        10 => (
            "status reads redirected (302)",
            &[Route::StatusRead],
            Fault::answer(302, "moved"),
            ms(300, 1500),
        ),
        11 => (
            "status reads answered with garbage",
            &[Route::StatusRead],
            Fault::Garbage,
            ms(300, 1500),
        ),
        12 => (
            "charges answered 409 (provider key in use)",
            &[Route::Charge],
            Fault::answer(409, "idempotency_key_in_use"),
            ms(300, 1000),
        ),
        13 => (
            "provider fully down (credential outage)",
            &[Route::StatusRead, Route::Charge, Route::Refund],
            Fault::Down,
            ms(500, 2000),
        ),
        14 => (
            "refunds unreachable",
            &[Route::Refund],
            Fault::Down,
            ms(1000, 3000),
        ),
        _ => (
            "charge made, answer replaced by a decline (lying provider)",
            &[Route::Charge],
            Fault::ForwardThenAnswer {
                status: 402,
                body: r#"{"code":"card_declined","detail":"injected"}"#.into(),
            },
            ms(100, 400),
        ),
    };
    proxy.spell(routes, fault, lasting);
    name
}

/// Waits until nothing is pending or executing here (merchant webhook
/// deliveries included), and the provider has no webhook delivery or async
/// settlement left to make (the sandbox's ledger says; for localstripe, no
/// event in the last 3 s). Returns how long it took; past `patience` it
/// says what is still open and goes on (the invariants will count it).
async fn settle(db: &PgPool, books: &Books<'_>, patience: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let http = reqwest::Client::new();
    loop {
        let open: Result<i64, _> = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM payment_attempt WHERE status = 'pending')
                  + (SELECT count(*) FROM refund WHERE status = 'pending')
                  + (SELECT count(*) FROM payment_attempt WHERE decline_check_at IS NOT NULL)
                  + (SELECT count(*) FROM refund WHERE decline_check_at IS NOT NULL)
                  + (SELECT count(*) FROM payment_capture WHERE status = 'pending')
                  + (SELECT count(*) FROM payment_capture WHERE decline_check_at IS NOT NULL)
                  -- Every authorization and balance hold of the soak ends
                  -- within seconds (captured, voided or expired).
                  + (SELECT count(*) FROM payment_attempt WHERE status = 'requires_capture')
                  + (SELECT count(*) FROM ledger_open_pending)
                  + (SELECT count(*) FROM idempotency_record WHERE state = 'executing')
                  + (SELECT count(*) FROM webhook_delivery WHERE state = 'pending')",
        )
        .fetch_one(db)
        .await;
        let provider_busy = books.work_in_flight(&http).await;
        if open.as_ref().is_ok_and(|n| *n == 0) && provider_busy.as_ref().is_ok_and(|n| *n == 0) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > patience {
            eprintln!(
                "not settled after {patience:?}: open rows {open:?}, provider work in flight {provider_busy:?}"
            );
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
