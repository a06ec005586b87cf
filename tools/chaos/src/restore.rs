//! `make chaos-restore`: the worst day of the database, drilled. PostgreSQL
//! archives its WAL continuously from a base backup; customers pay and
//! refund through two `oncepay serve` processes with the persisted-intent
//! client (`crates/oncepay-client`) while the sandbox fails some calls,
//! drops some answers and sends each webhook twice; then, at a random
//! moment, the database is destroyed and restored to a point 30–120 s in
//! the past (`recovery_target_time`), and oncepay starts again on it. The
//! clients then send every intent again with its key: the open ones to
//! finish them, the finished ones to compare the answer with the one they
//! had. After the last restore, once everything settled, the invariants are
//! counted against the sandbox's books:
//!
//! - every provider charge and refund has its row again (or is an orphan
//!   refunded as an incident; a declined charge of an order the restore
//!   lost moved no money and needs none);
//! - no order is charged twice (charges not refunded, per order);
//! - every retry after a restore got the answer it had before (the same
//!   payment or refund id, its status the same or settled since), or a
//!   documented safe one (an order whose creation was lost is created
//!   anew; a payment of a lost order is `404`, its charge refunded);
//! - no money is stranded: each succeeded charge belongs to a succeeded
//!   payment, or was refunded in full.
//!
//! `--without-adoption` is the mutation run: the sandbox forgets the trace
//! oncepay writes into its metadata, so nothing can be rebuilt, and the
//! drill must report the double charges the adoption prevents.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::env;
use chrono::{TimeDelta, Utc};
use oncepay_client::{
    Client, Command, FileStore, IntentRecord, IntentStore, LineItem, NewOrder, RetryPolicy, Status,
    StoreError,
};
use oncepay_testkit::pitr::ArchivedCluster;
use oncepay_testkit::ports::free_port;
use oncepay_testkit::processes::{sibling_binary, Service};
use serde_json::Value;
use sqlx::PgPool;

/// The drill's settings.
pub struct Drill {
    /// How many restores.
    pub restores: usize,
    /// How long customers pay before each restore (`None`: 45–65 s).
    pub traffic: Option<Duration>,
    /// The mutation run: providers keep no trace.
    pub without_adoption: bool,
}

/// What the retries after one restore got, against what they had.
#[derive(Default, Debug)]
struct Answers {
    same: u64,
    safe: u64,
    breaches: Vec<String>,
}

/// One process's client and where its intents are kept.
struct Customer {
    client: Client,
    store: Arc<FileStore>,
    /// The process it talks to, and the merchant's key, for raw resends.
    base: String,
    api_key: String,
}

/// A store shared by the client and the drill, which reads it back.
struct Shared(Arc<FileStore>);

impl IntentStore for Shared {
    fn load(&self, name: &str) -> Result<Option<IntentRecord>, StoreError> {
        self.0.load(name)
    }
    fn insert_new(&self, record: IntentRecord) -> Result<IntentRecord, StoreError> {
        self.0.insert_new(record)
    }
    fn update(&self, record: &IntentRecord) -> Result<(), StoreError> {
        self.0.update(record)
    }
    fn list(&self) -> Result<Vec<IntentRecord>, StoreError> {
        self.0.list()
    }
    fn remove(&self, name: &str) -> Result<(), StoreError> {
        self.0.remove(name)
    }
}

async fn count(db: &PgPool, sql: &str) -> Result<i64, String> {
    sqlx::query_scalar(sql)
        .fetch_one(db)
        .await
        .map_err(|e| format!("{sql}: {e}"))
}

/// Rows of each kind, to say what a restore lost.
async fn rows(db: &PgPool) -> Result<[i64; 3], String> {
    Ok([
        count(db, "SELECT count(*) FROM orders").await?,
        count(db, "SELECT count(*) FROM payment_attempt").await?,
        count(db, "SELECT count(*) FROM refund").await?,
    ])
}

/// Runs the drill in `root`; `Ok(true)` when every invariant holds.
pub async fn run(drill: &Drill, root: &Path) -> Result<bool, String> {
    let bin = sibling_binary("oncepay")?;
    eprintln!(
        "PostgreSQL with WAL archiving in {} ...",
        root.join("pg").display()
    );
    let pg = ArchivedCluster::create(&root.join("pg")).await?;
    let outcome = drive(drill, root, &pg, &bin).await;
    pg.stop().await;
    outcome
}

async fn drive(
    drill: &Drill,
    root: &Path,
    pg: &ArchivedCluster,
    bin: &Path,
) -> Result<bool, String> {
    let url = pg.url("oncepay");
    oncepay::store::prepare_database(&url)
        .await
        .map_err(|e| e.to_string())?;
    let setup = oncepay::store::pool(&url, 1).map_err(|e| e.to_string())?;
    let api_key = oncepay::api_keys::create(&setup, "drill")
        .await
        .map_err(|e| e.to_string())?;
    setup.close().await;

    let ports = [free_port()?, free_port()?];
    let bases: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let sandbox_base = format!("http://127.0.0.1:{}", free_port()?);
    let mut sandbox = crate::start_sandbox(
        bin,
        root,
        (&sandbox_base, &format!("{}/webhooks/sandbox", bases[0])),
        &[
            ("ONCEPAY_SANDBOX_ERROR_RATE", "0.03".into()),
            ("ONCEPAY_SANDBOX_DROP_RATE", "0.03".into()),
            (
                "ONCEPAY_SANDBOX_FORGET_TRACE",
                drill.without_adoption.to_string(),
            ),
        ],
    )
    .await?;
    let mut services: Vec<Service> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            Service::new(
                bin,
                &["serve"],
                env(&[
                    ("DATABASE_URL", url.clone()),
                    ("ONCEPAY_BIND", format!("127.0.0.1:{port}")),
                    ("ONCEPAY_PROVIDER_URL", sandbox_base.clone()),
                    ("ONCEPAY_PROVIDER_TIMEOUT", "1s".into()),
                    ("ONCEPAY_STRIPE_TIMEOUT", "1s".into()),
                    ("ONCEPAY_IDEMPOTENCY_LEASE", "3s".into()),
                    ("ONCEPAY_RECONCILE_INTERVAL", "500ms".into()),
                    ("ONCEPAY_RECONCILE_AFTER", "2s".into()),
                    ("ONCEPAY_HTTP_WORKERS", "2".into()),
                    ("ONCEPAY_RATE_LIMIT_PER_SECOND", "0".into()),
                    ("ONCEPAY_DB_START_TIMEOUT", "60s".into()),
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
    let mut db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .map_err(|e| e.to_string())?;
    let policy = RetryPolicy {
        deadline: Duration::from_secs(20),
        ..RetryPolicy::default()
    };
    let mut customers = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        let store = Arc::new(
            FileStore::open(root.join(format!("intents-{i}"))).map_err(|e| e.to_string())?,
        );
        let client = Client::builder(base, &api_key)
            .store(Shared(store.clone()))
            .policy(policy)
            .build()
            .map_err(|e| e.to_string())?;
        customers.push(Customer {
            client,
            store,
            base: base.clone(),
            api_key: api_key.clone(),
        });
    }
    let customers = Arc::new(customers);

    let started = Instant::now();
    let mut next = 0usize;
    let mut all = Answers::default();
    let mut report = String::new();
    let (mut lost_total, mut adopted_total, mut refunded_total) = (0i64, 0i64, 0i64);
    for n in 1..=drill.restores {
        let backed_up = pg.base_backup().await?;
        // Customers pay for a while; the database is destroyed at a
        // random moment in it, under load.
        let traffic = drill
            .traffic
            .map(|t| t.max(Duration::from_secs(31)))
            .unwrap_or_else(|| Duration::from_millis(45_000 + fastrand::u64(0..20_000)));
        let mut work = tokio::task::JoinSet::new();
        let until = Instant::now() + traffic;
        for lane in 0..LANES {
            let customers = customers.clone();
            let first = next + lane;
            work.spawn(async move {
                let mut i = first;
                while Instant::now() < until {
                    customer(&customers[i % 2].client, i).await;
                    i += LANES;
                }
            });
        }
        tokio::time::sleep(traffic).await;
        next += LANES * 10_000;
        // The machine dies: the service, the clients' requests and the
        // database with it.
        for s in services.iter_mut() {
            s.kill().await;
        }
        work.abort_all();
        while work.join_next().await.is_some() {}
        let before = rows(&db).await?;
        let since_backup = (Utc::now() - backed_up).num_seconds();
        let back = fastrand::i64(30..=since_backup.clamp(31, 120) - 1).max(30);
        let target = Utc::now() - TimeDelta::seconds(back);
        let restored = pg.restore_to(target).await?;
        db.close().await;
        db = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .map_err(|e| e.to_string())?;
        let after = rows(&db).await?;
        let lost: Vec<i64> = before.iter().zip(after).map(|(b, a)| b - a).collect();
        let runs_before = count(&db, "SELECT count(*) FROM books_run").await?;
        for s in services.iter_mut() {
            s.start("/readyz").await?;
        }
        // The service notices the new timeline and reconciles the gap
        // before it takes money commands again.
        let reconciled = oncepay_testkit::ready::until(Duration::from_secs(60), || async {
            count(
                &db,
                "SELECT count(*) FROM database_lineage WHERE gap_from IS NULL",
            )
            .await
            .is_ok_and(|n| n == 1)
                && count(
                    &db,
                    &format!(
                        "SELECT count(*) FROM (SELECT 1 FROM books_run WHERE trigger = 'restore' \
                         AND finished_at IS NOT NULL OFFSET {runs_before}) r"
                    ),
                )
                .await
                .is_ok_and(|n| n >= 1)
        })
        .await;
        if reconciled.is_err() {
            return Err(format!("restore {n}: the gap was never reconciled"));
        }
        let adopted = count(
            &db,
            "SELECT coalesce(sum(adopted), 0)::bigint FROM books_run WHERE trigger = 'restore'",
        )
        .await?
            - adopted_total;
        let refunded = count(
            &db,
            "SELECT coalesce(sum(refunded), 0)::bigint FROM books_run WHERE trigger = 'restore'",
        )
        .await?
            - refunded_total;
        adopted_total += adopted;
        refunded_total += refunded;
        lost_total += lost[1] + lost[2];
        // Every intent again, with its key.
        let answers = resend_all(&customers).await?;
        let line = format!(
            "restore {n}: back {back} s to {} (timeline {}, restored in {:.1?}); lost {} orders, {} payments, {} refunds; rebuilt {adopted} payments and refunds from the provider's books, refunded {refunded} orphan charges; retries: {} same answer, {} documented safe, {} breaches",
            target.format("%H:%M:%S"),
            restored.timeline,
            restored.took,
            lost[0],
            lost[1],
            lost[2],
            answers.same,
            answers.safe,
            answers.breaches.len()
        );
        println!("{line}");
        report.push_str(&line);
        report.push('\n');
        all.same += answers.same;
        all.safe += answers.safe;
        all.breaches.extend(answers.breaches);
    }
    settle(&db, &sandbox_base).await?;
    let ledger = oncepay_testkit::ledger::read(&reqwest::Client::new(), &sandbox_base).await?;
    let mut checks = invariants(&db, &ledger, &all).await?;
    let (check_failed, not_once, detail) =
        ledger_after_restores(bin, &url, &db, &customers).await?;
    checks.push(("oncepay ledger check passes", check_failed, detail.clone()));
    checks.push((
        "balance moves retried after a restore: one effect each",
        not_once,
        detail,
    ));
    let ok = checks.iter().all(|(_, breaches, _)| *breaches == 0);
    println!(
        "\n{} restores in {:.0?}: {lost_total} payment and refund rows lost; {adopted_total} rebuilt from the provider's books, {refunded_total} orphan charges refunded",
        drill.restores,
        started.elapsed()
    );
    println!("{:<58} {:>9}  detail", "invariant", "breaches");
    for (name, breaches, detail) in &checks {
        println!("{name:<58} {breaches:>9}  {detail}");
    }
    for b in all.breaches.iter().take(10) {
        println!("  breach: {b}");
    }
    if ok {
        println!("All invariants hold.");
    }
    for s in services.iter_mut() {
        s.kill().await;
    }
    sandbox.kill().await;
    db.close().await;
    Ok(ok)
}

/// Customers at once.
const LANES: usize = 48;

/// One customer: an order; a few seconds later (as a customer fills in a
/// checkout), its payment (a share declined, a share settled later); for
/// some a partial refund a little later — each one intent with its key.
/// The pauses put a restore point between an order and its payment, or a
/// payment and its refund, as often as not.
async fn customer(client: &Client, i: usize) {
    let items = vec![LineItem {
        sku: "drill".into(),
        quantity: 1 + (i % 3) as i64,
        unit_amount: 1000 + (i % 7) as i64 * 100,
    }];
    let Ok(order) = client
        .intent(&format!("order {i}"))
        .create_order(&NewOrder::new(&format!("cus-{i}"), "EUR", items))
        .await
    else {
        return;
    };
    tokio::time::sleep(Duration::from_millis(fastrand::u64(2_000..25_000))).await;
    let token = match i % 10 {
        7 => "tok_declined",
        8 => "tok_async",
        _ => "tok_visa",
    };
    let Ok(payment) = client
        .intent(&format!("pay {i}"))
        .pay(order.id, token)
        .await
    else {
        return;
    };
    if payment.status == Status::Succeeded && i.is_multiple_of(3) {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(1_000..10_000))).await;
        let _ = client
            .intent(&format!("refund {i}"))
            .refund(payment.id, Some(300), Some("drill"))
            .await;
    }
    if i.is_multiple_of(2) {
        balance_moves(client, i).await;
    }
}

/// Half the customers also move their balance, each move one intent with
/// its key, pauses between them so that restore points fall between them:
/// store credit, a debit, a hold and its capture. After a restore, a move
/// whose transfer the restore lost is made again, once, by its key's
/// retry; one it kept answers as before (`oncepay ledger check` and one
/// transfer per key are then counted).
async fn balance_moves(client: &Client, i: usize) {
    let customer = format!("cus-{i}");
    let pause = || tokio::time::sleep(Duration::from_millis(fastrand::u64(1_000..8_000)));
    if client
        .intent(&format!("credit {i}"))
        .credit_balance(&customer, 2_000, "EUR", Some("drill"))
        .await
        .is_err()
    {
        return;
    }
    pause().await;
    let _ = client
        .intent(&format!("debit {i}"))
        .debit_balance(&customer, 700, "EUR", Some("drill"))
        .await;
    pause().await;
    let Ok(hold) = client
        .intent(&format!("hold {i}"))
        .hold_balance(&customer, 500, "EUR", Some(3_600))
        .await
    else {
        return;
    };
    pause().await;
    let _ = client
        .intent(&format!("capture hold {i}"))
        .capture_hold(hold.id, Some(300))
        .await;
}

/// `oncepay ledger check` on the restored database, and every balance
/// move a client holds as done made at most one transfer under its key (a
/// credit exactly one): (check failed, moves made twice or lost, detail).
async fn ledger_after_restores(
    bin: &Path,
    url: &str,
    db: &PgPool,
    customers: &[Customer],
) -> Result<(u64, u64, String), String> {
    let check = tokio::process::Command::new(bin)
        .args(["ledger", "check"])
        .env("DATABASE_URL", url)
        .env("ONCEPAY_LOG", "warn")
        .output()
        .await
        .map_err(|e| format!("running oncepay ledger check: {e}"))?;
    let output = String::from_utf8_lossy(&check.stdout).to_string();
    let lines = output.lines().skip(1).count();
    let mut moved = 0u64;
    let mut missing = 0u64;
    for customer in customers {
        for record in customer.store.list().map_err(|e| e.to_string())? {
            let balance = matches!(
                record.request.command,
                Command::CreditBalance
                    | Command::DebitBalance
                    | Command::HoldBalance
                    | Command::CaptureHold
            );
            let done = record
                .closed
                .as_ref()
                .is_some_and(|c| (200..300).contains(&c.status));
            if !(balance && done) {
                continue;
            }
            moved += 1;
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM ledger_transfer WHERE idempotency_key = $1",
            )
            .bind(&record.key)
            .fetch_one(db)
            .await
            .map_err(|e| e.to_string())?;
            // A credit is made again by its retry if the restore lost it;
            // a debit, hold or capture retried after the restore may now be
            // refused (its credit or hold not back yet, or lost): at most
            // one effect.
            let once = match record.request.command {
                Command::CreditBalance => n == 1,
                _ => n <= 1,
            };
            missing += u64::from(!once);
        }
    }
    Ok((
        u64::from(!check.status.success()),
        missing,
        format!("{lines} merchant and unit lines; {moved} balance moves done, none made twice"),
    ))
}

/// Sends every intent of every customer again: an open one is finished
/// (`Client::resume`); a finished one is sent again with its key, raw, and
/// its answer compared with the one it had.
async fn resend_all(customers: &[Customer]) -> Result<Answers, String> {
    let mut answers = Answers::default();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .map_err(|e| e.to_string())?;
    for customer in customers {
        let records = customer.store.list().map_err(|e| e.to_string())?;
        let mut lanes = tokio::task::JoinSet::new();
        let gate = Arc::new(tokio::sync::Semaphore::new(8));
        for record in records {
            let (client, http, gate) = (customer.client.clone(), http.clone(), gate.clone());
            let target = (customer.base.clone(), customer.api_key.clone());
            lanes.spawn(async move {
                let _permit = gate.acquire_owned().await;
                match &record.closed {
                    None => {
                        let _ = client.resume(&record).await;
                        Verdict::Same
                    }
                    Some(closed) => {
                        let again = send_again(&target, &http, &record).await;
                        match compare(&record, closed.status, &closed.body, again) {
                            // A stored answer is replayed as it was (a
                            // `202 pending`): the resource itself says
                            // whether it is where the client saw it.
                            Verdict::Recheck(path, had) => {
                                let now = read(&target, &http, &path).await;
                                if now["status"] == had {
                                    Verdict::Same
                                } else {
                                    Verdict::Breach(format!(
                                        "{}: {path} is {} now, was {had}",
                                        record.name, now["status"]
                                    ))
                                }
                            }
                            other => other,
                        }
                    }
                }
            });
        }
        while let Some(done) = lanes.join_next().await {
            match done.map_err(|e| e.to_string())? {
                Verdict::Same => answers.same += 1,
                Verdict::Safe => answers.safe += 1,
                Verdict::Breach(why) => answers.breaches.push(why),
                Verdict::Recheck(path, _) => answers.breaches.push(format!("{path}: unread")),
            }
        }
    }
    Ok(answers)
}

enum Verdict {
    Same,
    Safe,
    Breach(String),
    /// The same id: read it to compare its status with the one seen.
    Recheck(String, Value),
}

/// `GET path` on oncepay (the resource as it is now).
async fn read((base, api_key): &(String, String), http: &reqwest::Client, path: &str) -> Value {
    match http
        .get(format!("{base}{path}"))
        .bearer_auth(api_key)
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// Sends a finished intent's request again with its key, through 503s.
async fn send_again(
    (base, api_key): &(String, String),
    http: &reqwest::Client,
    record: &IntentRecord,
) -> Result<(u16, Value), String> {
    for _ in 0..60 {
        let sent = http
            .post(format!("{base}{}", record.request.path))
            .bearer_auth(api_key)
            .header("Idempotency-Key", &record.key)
            .json(&record.request.body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().as_u16() == 503 || r.status().as_u16() == 409 => {
                let body: Value = r.json().await.unwrap_or(Value::Null);
                if body["code"] == "idempotency_key_reused" {
                    return Ok((409, body));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(r) => {
                let status = r.status().as_u16();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                return Ok((status, body));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    Err(format!("{}: no answer", record.name))
}

/// What a finished intent's second answer is worth.
fn compare(
    record: &IntentRecord,
    had_status: u16,
    had: &Value,
    again: Result<(u16, Value), String>,
) -> Verdict {
    let (status, body) = match again {
        Ok(a) => a,
        Err(e) => return Verdict::Breach(e),
    };
    let name = &record.name;
    match record.request.command {
        // Like an order: the same object, or (its creation lost with the
        // database) one made anew; neither moves money.
        Command::CreateOrder | Command::CreateCheckout | Command::CreateWebhookEndpoint => {
            if body["id"] == had["id"] {
                Verdict::Same
            } else if status == 201 {
                // Its creation was lost with the database: created anew,
                // nothing charged.
                Verdict::Safe
            } else {
                Verdict::Breach(format!("{name}: {status} {body} after {had_status} {had}"))
            }
        }
        // A balance move: its transfer and its key's record live in one
        // transaction of the restored database, so either both came back
        // (the same answer) or neither (the retry made it once, anew).
        Command::CreditBalance
        | Command::DebitBalance
        | Command::HoldBalance
        | Command::CaptureHold
        | Command::ReleaseHold => {
            if body["id"] == had["id"] && status == had_status {
                Verdict::Same
            } else if status < 500 {
                Verdict::Safe
            } else {
                Verdict::Breach(format!("{name}: {status} {body} after {had_status} {had}"))
            }
        }
        // A hold, its capture and its void answer the payment, as a pay.
        Command::Pay | Command::PayManual | Command::Capture | Command::Void | Command::Refund => {
            let settled = |then: &Value, now: &Value| {
                then["status"] == now["status"]
                    || then["status"] == "pending"
                    || then["status"] == "requires_capture"
            };
            if !(200..300).contains(&had_status) {
                // A rejection before (order not payable…): any rejection now.
                return if (200..300).contains(&status) && body["id"] != had["id"] {
                    Verdict::Breach(format!(
                        "{name}: now {status} {body}, had {had_status} {had}"
                    ))
                } else {
                    Verdict::Safe
                };
            }
            if body["id"] == had["id"] && settled(had, &body) {
                Verdict::Same
            } else if body["id"] == had["id"] {
                let kind = match record.request.command {
                    Command::Refund => "refunds",
                    _ => "payments",
                };
                let id = body["id"].as_str().unwrap_or_default();
                Verdict::Recheck(format!("/{kind}/{id}"), had["status"].clone())
            } else if status == 404 {
                // Its order (or payment) was lost with the database; its
                // charge is refunded as an orphan (checked by the books
                // invariants).
                Verdict::Safe
            } else {
                Verdict::Breach(format!(
                    "{name}: had {had_status} {} {}, now {status} {} {}",
                    had["id"], had["status"], body["id"], body["status"]
                ))
            }
        }
        Command::Cancel => Verdict::Same,
    }
}

/// Waits until nothing is pending here or at the sandbox.
async fn settle(db: &PgPool, sandbox: &str) -> Result<(), String> {
    let http = reqwest::Client::new();
    let settled = oncepay_testkit::ready::until(Duration::from_secs(120), || async {
        let pending = count(
            db,
            "SELECT (SELECT count(*) FROM payment_attempt WHERE status = 'pending')
                  + (SELECT count(*) FROM refund WHERE status = 'pending')",
        )
        .await
        .unwrap_or(1);
        let busy = oncepay_testkit::ledger::totals(&http, sandbox)
            .await
            .map(|t| t["work_in_flight"].as_u64().unwrap_or(1))
            .unwrap_or(1);
        pending == 0 && busy == 0
    })
    .await;
    settled.map_err(|waited| format!("nothing settled after {waited:?}"))
}

/// The invariants, each with its breaches and a detail.
async fn invariants(
    db: &PgPool,
    ledger: &Value,
    answers: &Answers,
) -> Result<Vec<(&'static str, u64, String)>, String> {
    let attempts: HashMap<String, String> = sqlx::query_as::<_, (String, String)>(
        "SELECT provider_charge_id, status FROM payment_attempt WHERE provider_charge_id IS NOT NULL",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?
    .into_iter()
    .collect();
    let refunds: std::collections::HashSet<String> = sqlx::query_scalar::<_, String>(
        "SELECT provider_refund_id FROM refund WHERE provider_refund_id IS NOT NULL",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?
    .into_iter()
    .collect();
    let orphans: std::collections::HashSet<String> = sqlx::query_scalar::<_, String>(
        "SELECT provider_object_id FROM incident WHERE kind = 'orphan_charge'",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?
    .into_iter()
    .collect();
    let empty = Vec::new();
    let charges = ledger["charges"].as_array().unwrap_or(&empty);
    let ledger_refunds = ledger["refunds"].as_array().unwrap_or(&empty);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();

    let (mut rowless, mut declined_of_lost) = (0u64, 0u64);
    for c in charges {
        let id = text(&c["id"]);
        if attempts.contains_key(&id) || orphans.contains(&id) {
            continue;
        }
        if c["status"] == "failed" {
            declined_of_lost += 1;
        } else {
            rowless += 1;
        }
    }
    let orphan_refunds = ledger_refunds
        .iter()
        .filter(|r| orphans.contains(&text(&r["charge"])))
        .count() as u64;
    let refunds_rowless = ledger_refunds
        .iter()
        .filter(|r| !refunds.contains(&text(&r["id"])) && !orphans.contains(&text(&r["charge"])))
        .count() as u64;

    let mut kept_per_order: BTreeMap<String, u64> = BTreeMap::new();
    let mut stranded = 0u64;
    for c in charges.iter().filter(|c| c["status"] == "succeeded") {
        let fully_refunded = c["amount_refunded"] == c["amount"];
        if !fully_refunded {
            *kept_per_order.entry(text(&c["order_id"])).or_default() += 1;
        }
        let owned = attempts
            .get(&text(&c["id"]))
            .is_some_and(|s| s == "succeeded");
        if !owned && !fully_refunded {
            stranded += 1;
        }
    }
    let twice = kept_per_order.values().filter(|n| **n > 1).count() as u64;
    let orphan_count = orphans.len();
    Ok(vec![
        (
            "every provider charge has its row again",
            rowless,
            format!(
                "{} charges; {orphan_count} orphans refunded; {declined_of_lost} declined charges of lost orders (no money moved)",
                charges.len()
            ),
        ),
        (
            "every provider refund has its row again",
            refunds_rowless,
            format!(
                "{} refunds, {orphan_refunds} of them of orphans",
                ledger_refunds.len()
            ),
        ),
        (
            "no order charged twice",
            twice,
            format!("{} orders charged", kept_per_order.len()),
        ),
        (
            "retries after a restore got their answer (or a safe one)",
            answers.breaches.len() as u64,
            format!("{} same, {} documented safe", answers.same, answers.safe),
        ),
        (
            "no money stranded",
            stranded,
            "each succeeded charge is a succeeded payment's, or refunded in full".into(),
        ),
    ])
}
