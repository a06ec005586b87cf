//! Several real `oncepay serve` processes on one database: storms spread over
//! two processes, a SIGKILL between the charge and its commit, a SIGKILL
//! mid-delivery of a merchant webhook, three
//! processes migrating a fresh database at once, SIGTERM draining, and a
//! SIGKILL while a batch of new orders is being written.

use std::net::TcpListener;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::*;

/// A sandbox in this process, webhooks off.
fn start_sandbox() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let mut config = oncepay::config::Env::from_fn(|_| None)
        .sandbox_config()
        .expect("config");
    config.webhooks_enabled = false;
    tokio::spawn(oncepay::sandbox_server::start(config, listener).expect("sandbox"));
    base
}

struct Cluster {
    db_url: String,
    db: PgPool,
    sandbox: String,
    key: String,
    http: reqwest::Client,
}

impl Cluster {
    /// A fresh database with a merchant, and a sandbox with webhooks off, so
    /// that only the service's own calls and its reconciler settle payments.
    async fn new() -> Cluster {
        let (db_url, db, key) = migrated_database_with_key().await;
        let sandbox = start_sandbox();
        Cluster {
            db_url,
            db,
            sandbox,
            key,
            http: reqwest::Client::new(),
        }
    }

    async fn serve(&self, extra: &[(&str, &str)]) -> Child {
        let mut env = serve_env(&self.db_url, &self.sandbox);
        for (k, v) in extra {
            env.push((leak(k), v.to_string()));
        }
        spawn_binary("serve", "ONCEPAY_BIND", &env).await
    }

    async fn post(
        &self,
        base: &str,
        path: &str,
        idem: &str,
        body: &Value,
    ) -> reqwest::Result<reqwest::Response> {
        self.http
            .post(format!("{base}{path}"))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", idem)
            .json(body)
            .send()
            .await
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.db)
            .await
            .expect("count")
    }

    async fn ledger(&self) -> Value {
        ledger(&self.http, &self.sandbox).await
    }

    /// Creates an order through `base` and returns it.
    async fn create_order(&self, base: &str, idem: &str) -> Value {
        json_of(
            self.post(base, "/orders", idem, &order_body())
                .await
                .expect("order"),
        )
        .await
    }

    /// Sends a payment in the background, to be killed or drained mid-flight.
    fn spawn_payment(
        &self,
        base: &str,
        idem: &str,
        body: &Value,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let request = self
            .http
            .post(format!("{base}/payments"))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", idem)
            .json(body);
        tokio::spawn(request.send())
    }

    /// Waits until the sandbox ledger's total `name` reaches `value`.
    async fn wait_for_ledger(&self, name: &str, value: u64) {
        wait_for_ledger_total(&self.http, &self.sandbox, name, value).await;
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

#[tokio::test]
async fn a_storm_over_two_processes_creates_one_order() {
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.serve(&[]).await, cluster.serve(&[]).await);
    storm(
        &[&a.base, &b.base],
        &cluster.key,
        "/orders",
        "storm",
        &order_body(),
        100,
    )
    .await;
    assert_eq!(cluster.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn a_payment_storm_over_two_processes_charges_once() {
    let cluster = Cluster::new().await;
    let (a, b) = (cluster.serve(&[]).await, cluster.serve(&[]).await);
    let order = cluster.create_order(&a.base, "o").await;
    let body = json!({"order_id": order["id"], "payment_method": "tok_visa"});
    storm(
        &[&a.base, &b.base],
        &cluster.key,
        "/payments",
        "pay",
        &body,
        100,
    )
    .await;
    assert_eq!(
        cluster.count("SELECT count(*) FROM payment_attempt").await,
        1
    );
    let ledger = cluster.ledger().await;
    assert_eq!(ledger["totals"]["charges"], 1);
    assert_eq!(ledger["charges"][0]["charges"], 1);
}

/// Starts a payment whose charge is made but answered only after 3 s, and
/// SIGKILLs the process once the sandbox holds the charge: the process dies
/// after the provider call and before step 3 commits. Its lease (4 s) is
/// long enough for the call to wait for that answer: a command's calls end
/// within three quarters of its lease (issue 55, item 5), and a shorter
/// lease would answer `202` before the kill.
async fn kill_between_charge_and_commit(cluster: &Cluster, idem: &str) -> Value {
    let mut a = cluster.serve(&[("ONCEPAY_IDEMPOTENCY_LEASE", "4s")]).await;
    let order = cluster
        .create_order(&a.base, &format!("order-{idem}"))
        .await;
    let body = json!({"order_id": order["id"], "payment_method": "tok_visa+delay=3000"});
    let pending = cluster.spawn_payment(&a.base, idem, &body);
    cluster.wait_for_ledger("charges", 1).await;
    a.process.start_kill().expect("SIGKILL");
    a.process.wait().await.expect("reaped");
    assert!(
        pending.await.expect("task").is_err(),
        "the client lost its answer"
    );
    let stuck: (String, String) = sqlx::query_as(
        "SELECT state, recovery_point FROM idempotency_record WHERE idempotency_key = $1",
    )
    .bind(idem)
    .fetch_one(&cluster.db)
    .await
    .expect("record");
    assert_eq!(
        stuck,
        ("executing".to_string(), "attempt_created".to_string())
    );
    assert_eq!(
        cluster
            .count("SELECT count(*) FROM payment_attempt WHERE status = 'pending'")
            .await,
        1
    );
    body
}

#[tokio::test]
async fn a_crash_between_charge_and_commit_is_resumed_by_the_retry() {
    let cluster = Cluster::new().await;
    let body = kill_between_charge_and_commit(&cluster, "crash").await;
    let b = cluster.serve(&[("ONCEPAY_IDEMPOTENCY_LEASE", "1s")]).await;
    // The retry comes once the dead process's lease has run out.
    let expired = oncepay_testkit::ready::until(Duration::from_secs(35), || async {
        cluster
            .count("SELECT count(*) FROM idempotency_record WHERE idempotency_key = 'crash' AND lease_expires_at < now()")
            .await
            == 1
    })
    .await;
    assert!(expired.is_ok(), "the dead process's lease expires");
    let r = cluster
        .post(&b.base, "/payments", "crash", &body)
        .await
        .expect("retry");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["status"], "succeeded");
    assert_eq!(
        cluster.count("SELECT count(*) FROM payment_attempt").await,
        1
    );
    assert_eq!(
        cluster
            .count("SELECT count(*) FROM orders WHERE status = 'paid'")
            .await,
        1
    );
    let ledger = cluster.ledger().await;
    assert_eq!(ledger["totals"]["charges"], 1);
    assert_eq!(ledger["charges"][0]["charges"], 1);
    assert_eq!(
        ledger["charges"][0]["requests"], 1,
        "the resume looked the charge up instead of sending it again"
    );
}

#[tokio::test]
async fn a_crash_between_charge_and_commit_is_resumed_by_the_reconciler() {
    let cluster = Cluster::new().await;
    let body = kill_between_charge_and_commit(&cluster, "crash").await;
    let b = cluster
        .serve(&[
            ("ONCEPAY_IDEMPOTENCY_LEASE", "1s"),
            ("ONCEPAY_RECONCILE_INTERVAL", "200ms"),
        ])
        .await;
    // The dead process's lease (4 s) runs out first.
    let finished = oncepay_testkit::ready::until(Duration::from_secs(20), || async {
        cluster.count("SELECT count(*) FROM idempotency_record WHERE state = 'completed' AND idempotency_key = 'crash'").await == 1
    })
    .await;
    assert!(finished.is_ok(), "the reconciler finished the command");
    assert_eq!(
        cluster
            .count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'")
            .await,
        1
    );
    // The client's retry now gets the stored answer.
    let r = cluster
        .post(&b.base, "/payments", "crash", &body)
        .await
        .expect("retry");
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(cluster.ledger().await["totals"]["charges"], 1);
}

#[tokio::test]
async fn three_processes_migrate_a_fresh_database_at_once() {
    let db_url = fresh_database_url();
    let sandbox = start_sandbox();
    let env = serve_env(&db_url, &sandbox);
    let (a, b, c) = tokio::join!(
        spawn_binary("serve", "ONCEPAY_BIND", &env),
        spawn_binary("serve", "ONCEPAY_BIND", &env),
        spawn_binary("serve", "ONCEPAY_BIND", &env)
    );
    let db = PgPool::connect(&db_url).await.expect("pool");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM refinery_schema_history")
        .fetch_one(&db)
        .await
        .expect("history");
    assert_eq!(applied, oncepay::store::migrate::MIGRATIONS.len() as i64);
    for child in [a, b, c] {
        let r = reqwest::get(format!("{}/readyz", child.base))
            .await
            .expect("readyz");
        assert_eq!(r.status(), StatusCode::OK);
    }
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_then_exits() {
    let cluster = Cluster::new().await;
    let mut a = cluster.serve(&[]).await;
    let order = cluster.create_order(&a.base, "o").await;
    let body = json!({"order_id": order["id"], "payment_method": "tok_visa+delay=1000"});
    let in_flight = cluster.spawn_payment(&a.base, "p", &body);
    // In flight for sure: the sandbox holds the charge and delays its answer.
    cluster.wait_for_ledger("requests", 1).await;
    let pid = a.process.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let response = in_flight
        .await
        .expect("task")
        .expect("answered despite SIGTERM");
    assert_eq!(response.status(), StatusCode::CREATED);
    let exit = tokio::time::timeout(Duration::from_secs(10), a.process.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(exit.success(), "clean exit: {exit:?}");
}

#[tokio::test]
async fn a_delivery_cut_off_by_sigkill_is_made_by_another_process() {
    use oncepay_testkit::receiver::{Policy, Receiver};
    let cluster = Cluster::new().await;
    let receiver = Receiver::start(Policy::Stall).expect("receiver");
    let webhooks = [
        ("ONCEPAY_WEBHOOK_TIMEOUT", "1s"),
        ("ONCEPAY_WEBHOOK_INTERVAL", "50ms"),
        ("ONCEPAY_WEBHOOK_SCHEDULE", "100ms,100ms,100ms,100ms"),
    ];
    let mut a = cluster.serve(&webhooks).await;
    let r = cluster
        .post(
            &a.base,
            "/webhook_endpoints",
            "endpoint",
            &json!({"url": receiver.url(), "events": ["*"]}),
        )
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::CREATED);
    for i in 0..3 {
        let order = cluster.create_order(&a.base, &format!("order-{i}")).await;
        let r = cluster
            .post(
                &a.base,
                "/payments",
                &format!("pay-{i}"),
                &json!({"order_id": order["id"], "payment_method": "tok_visa"}),
            )
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    // A is mid-delivery (the receiver holds its request): kill it there.
    let caught = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        !receiver.received().is_empty()
    })
    .await;
    assert!(caught.is_ok(), "A started delivering");
    a.process.start_kill().expect("SIGKILL");
    a.process.wait().await.expect("reaped");
    receiver.set_policy(Policy::Accept);

    let _b = cluster.serve(&webhooks).await;
    let events: Vec<(uuid::Uuid,)> = sqlx::query_as("SELECT id FROM event")
        .fetch_all(&cluster.db)
        .await
        .expect("events");
    assert_eq!(
        events.len(),
        9,
        "3 × (payment.pending, payment.succeeded, order.paid)"
    );
    let wanted: std::collections::BTreeSet<String> =
        events.iter().map(|(id,)| id.to_string()).collect();
    let delivered = oncepay_testkit::ready::until(Duration::from_secs(30), || async {
        let got: std::collections::BTreeSet<String> =
            receiver.accepted().into_iter().map(|r| r.id).collect();
        got == wanted
    })
    .await;
    assert!(delivered.is_ok(), "B delivered every event A had claimed");
    // Duplicates are only repeats of one event, byte for byte.
    let mut bodies = std::collections::BTreeMap::new();
    for r in receiver.received() {
        assert!(wanted.contains(&r.id), "only our events");
        let first = bodies.entry(r.id.clone()).or_insert_with(|| r.body.clone());
        assert_eq!(*first, r.body, "a retry repeats the event exactly");
    }
}

/// One sample of the process's `/metrics`, 0 if absent.
async fn metric(http: &reqwest::Client, base: &str, name: &str) -> f64 {
    let Ok(r) = http.get(format!("{base}/metrics")).send().await else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_sigkill_mid_batch_leaves_each_order_done_or_free_to_retry() {
    let cluster = Cluster::new().await;
    let mut a = cluster.serve(&[]).await;
    // Every insert into orders waits while this transaction holds the
    // table: the batch writers' statements are in flight when A dies.
    let mut held = cluster.db.begin().await.expect("begin");
    sqlx::query("LOCK TABLE orders IN SHARE MODE")
        .execute(&mut *held)
        .await
        .expect("lock");
    let keys: Vec<String> = (0..40).map(|i| format!("mid-batch-{i}")).collect();
    let mut sent = tokio::task::JoinSet::new();
    for key in keys.clone() {
        let request = cluster
            .http
            .post(format!("{}/orders", a.base))
            .bearer_auth(&cluster.key)
            .header("Idempotency-Key", key)
            .json(&order_body());
        sent.spawn(request.send());
    }
    oncepay_testkit::ready::until(Duration::from_secs(30), || async {
        metric(&cluster.http, &a.base, "oncepay_order_batch_rows_sum").await
            + metric(&cluster.http, &a.base, "oncepay_order_batch_queued").await
            >= keys.len() as f64
    })
    .await
    .expect("every order reached A's batcher");
    a.process.start_kill().expect("SIGKILL");
    a.process.wait().await.expect("reaped");
    // The statements A left behind may still commit once the table is
    // free (PostgreSQL finds its client gone only when it answers).
    held.rollback().await.expect("release");
    while let Some(done) = sent.join_next().await {
        assert!(done.expect("task").is_err(), "A died before it answered");
    }
    oncepay_testkit::ready::until(Duration::from_secs(30), || async {
        cluster
            .count("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'oncepay' AND state = 'active' AND query LIKE 'WITH %'")
            .await
            == 0
    })
    .await
    .expect("A's statements ended");
    // Done means both the order and its record; free means neither.
    assert_eq!(
        cluster
            .count(
                "SELECT count(*) FROM orders o FULL JOIN idempotency_record r ON r.resource_id = o.id
                  WHERE o.id IS NULL OR r.resource_id IS NULL"
            )
            .await,
        0,
        "an order without its record, or a record without its order"
    );
    // Every client retries through another process: one order per key.
    let b = cluster.serve(&[]).await;
    for key in &keys {
        let order = cluster.create_order(&b.base, key).await;
        assert!(order["id"].is_string(), "{key}: {order}");
    }
    assert_eq!(
        cluster.count("SELECT count(*) FROM orders").await,
        keys.len() as i64
    );
    assert_eq!(
        cluster
            .count("SELECT count(DISTINCT resource_id) FROM idempotency_record")
            .await,
        keys.len() as i64
    );
}

/// A pool of three connections, as behind PgBouncer or on a managed
/// database with few: `serve` starts with no writers instead of refusing
/// the pool, says so once naming the variables and the values it uses,
/// never holds more than three connections for effects, and pays orders
/// that arrive together.
#[tokio::test]
async fn a_pool_of_three_starts_with_fewer_writers_and_pays() {
    use tokio::io::AsyncReadExt;
    let cluster = Cluster::new().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.arg("serve")
        .env("ONCEPAY_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in serve_env(&cluster.db_url, &cluster.sandbox) {
        cmd.env(k, v);
    }
    cmd.env("ONCEPAY_BIND", format!("127.0.0.1:{port}"))
        .env("ONCEPAY_DB_POOL_SIZE", "3");
    let mut serve = cmd.spawn().expect("spawn oncepay serve");
    oncepay_testkit::ready::until_ready(&format!("{base}/readyz"), Duration::from_secs(10))
        .await
        .expect("serve starts with a pool of three");
    // The process's effect connections (the claims' pool is apart), at
    // their most while the orders are created and paid.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let db = cluster.db.clone();
    let sampler = tokio::spawn(async move {
        let mut most = 0i64;
        loop {
            let now: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'oncepay'",
            )
            .fetch_one(&db)
            .await
            .expect("pg_stat_activity");
            most = most.max(now);
            tokio::select! {
                _ = &mut stopped => return most,
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    });
    let post = |path: &str, idem: String, body: &Value| {
        cluster
            .http
            .post(format!("{base}{path}"))
            .bearer_auth(&cluster.key)
            .header("Idempotency-Key", idem)
            .json(body)
            .send()
    };
    let n = 8;
    let mut orders = tokio::task::JoinSet::new();
    for i in 0..n {
        let sent = post("/orders", format!("small-pool-order-{i}"), &order_body());
        orders.spawn(async move { json_of(sent.await.expect("order")).await });
    }
    let mut payments = tokio::task::JoinSet::new();
    while let Some(order) = orders.join_next().await {
        let order = order.expect("task");
        assert!(order["id"].is_string(), "{order}");
        let body = json!({"order_id": order["id"], "payment_method": "tok_visa"});
        let idem = format!("pay-{}", order["id"].as_str().unwrap_or_default());
        let sent = post("/payments", idem, &body);
        payments.spawn(async move {
            let r = sent.await.expect("payment");
            (r.status(), json_of(r).await)
        });
    }
    while let Some(paid) = payments.join_next().await {
        let (status, payment) = paid.expect("task");
        assert_eq!(status, StatusCode::CREATED, "{payment}");
        assert_eq!(payment["status"], "succeeded", "{payment}");
    }
    cluster.wait_for_ledger("charges", n).await;
    stop.send(()).expect("the sampler runs");
    let most = sampler.await.expect("sampler");
    assert!(
        (1..=3).contains(&most),
        "{most} connections of the process's pool were open at once"
    );
    serve.start_kill().expect("SIGKILL");
    let mut log = String::new();
    serve
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut log)
        .await
        .expect("the log");
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("leaves room for"))
        .collect();
    assert_eq!(said.len(), 1, "one warning: {log}");
    for part in [
        "WARN",
        "ONCEPAY_DB_POOL_SIZE=3",
        "ONCEPAY_ORDER_BATCH_WRITERS=0 (asked 1)",
        "ONCEPAY_GROUP_COMMIT_WRITERS=0 (asked 2)",
    ] {
        assert!(said[0].contains(part), "{part}: {}", said[0]);
    }
}

/// `serve` started while its database takes no writes (a standby, or a
/// primary demoted in a failover: here `default_transaction_read_only`)
/// waits for it to become writable, then migrates and serves (issue 54:
/// `make chaos-ha` saw a process exit on `cannot execute CREATE TABLE in
/// a read-only transaction`, wrapped in refinery's error).
#[tokio::test]
async fn serve_started_on_a_read_only_database_waits_until_it_is_writable() {
    let url = fresh_database_url();
    let name = url.rsplit('/').next().expect("a database name").to_string();
    let admin = PgPool::connect(&format!("{}/postgres", pg_server()))
        .await
        .expect("the server");
    for sql in [
        format!("CREATE DATABASE \"{name}\""),
        format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"),
    ] {
        sqlx::query(&sql).execute(&admin).await.expect(&sql);
    }
    let options = Options {
        database_url: Some(url.clone()),
        ..Options::default()
    }
    .serve("ONCEPAY_DB_START_TIMEOUT", "60s");
    let mut starting = Box::pin(spawn_app_with(options));
    // The window in which the database is read-only: `serve` must still be
    // waiting at its end, not gone (a start that fails panics here).
    tokio::select! {
        _ = &mut starting => panic!("serve started on a read-only database"),
        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
    }
    sqlx::query(&format!(
        "ALTER DATABASE \"{name}\" RESET default_transaction_read_only"
    ))
    .execute(&admin)
    .await
    .expect("writable again");
    let app = tokio::time::timeout(Duration::from_secs(30), starting)
        .await
        .expect("serve started once the database took writes");
    let order = app.create_order().await;
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
}
