//! Test harness: every test gets a fresh PostgreSQL database, a real
//! sandbox provider and a real oncepay server on free ports, talking HTTP.
//! Multi-process tests run the compiled `oncepay` binary as child processes.

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use oncepay::commands::AppContext;
use oncepay::config::{Env, SandboxConfig, ServeConfig};
use oncepay::startup::Application;
use oncepay_testkit::fault_proxy::FaultProxy;
use oncepay_testkit::ready;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// Server URL of the test PostgreSQL (without a database name).
pub fn pg_server() -> String {
    oncepay_testkit::test_db::server()
}

/// A new database, migrated, with merchant A and a key of theirs: for
/// tests that run `oncepay serve` as child processes. Returns its URL, a
/// pool on it and the key.
pub async fn migrated_database_with_key() -> (String, PgPool, String) {
    let db_url = fresh_database_url();
    oncepay::store::prepare_database(&db_url)
        .await
        .expect("migrate");
    let db = PgPool::connect(&db_url).await.expect("pool");
    let key = oncepay::api_keys::create(&db, "merchant-a")
        .await
        .expect("key");
    (db_url, db, key)
}

/// A URL of a new, unique database (created by the first process that
/// migrates), named after this test run (`oncepay_testkit::test_db`), so
/// that `make test-dbs-drop` drops it and no other run's.
pub fn fresh_database_url() -> String {
    oncepay_testkit::test_db::database_url()
}

/// Knobs a test may turn.
#[derive(Clone)]
pub struct Options {
    /// Extra environment for `serve` (as `oncepay serve` would read it).
    pub serve_env: Vec<(&'static str, String)>,
    /// Extra environment for the sandbox.
    pub sandbox_env: Vec<(&'static str, String)>,
    /// Put a fault proxy between oncepay and the sandbox.
    pub fault_proxy: bool,
    /// The database to use instead of a fresh one on the test server.
    pub database_url: Option<String>,
    /// Where new payments go: the sandbox, or Stripe (localstripe behind
    /// the Stripe-semantics layer).
    pub provider: Provider,
}

/// A provider the service can be started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// The sandbox.
    Sandbox,
    /// localstripe, behind `oncepay_testkit::stripe_layer`.
    Stripe,
}

/// The Stripe key the tests use (localstripe takes any `sk_` key).
pub const STRIPE_KEY: &str = "sk_test_oncepay";
/// The webhook secret localstripe signs with in the tests.
pub const STRIPE_WEBHOOK_SECRET: &str = "whsec_oncepay_tests";

/// localstripe and the Stripe-semantics layer in front of it.
pub struct StripeStack {
    /// localstripe itself (read its books directly, not through the layer).
    pub localstripe: oncepay_testkit::localstripe::LocalStripe,
    /// The layer oncepay talks to, where faults are injected.
    pub layer: oncepay_testkit::stripe_layer::StripeLayer,
}

/// Whether localstripe can run here; where it cannot and the run does not
/// require it (`ONCEPAY_REQUIRE_LOCALSTRIPE`, set by `.ci/run`), a loud
/// skip.
pub fn localstripe_or_skip() -> bool {
    if oncepay_testkit::localstripe::available() {
        return true;
    }
    assert!(
        std::env::var_os("ONCEPAY_REQUIRE_LOCALSTRIPE").is_none(),
        "ONCEPAY_REQUIRE_LOCALSTRIPE is set but {} is missing (make localstripe)",
        oncepay_testkit::localstripe::python().display()
    );
    eprintln!("SKIPPED: no localstripe (make localstripe installs it)");
    false
}

impl Default for Options {
    fn default() -> Self {
        Options {
            serve_env: vec![
                // Tests drive the workers themselves unless they ask otherwise.
                ("ONCEPAY_RECONCILE_INTERVAL", "1h".into()),
                ("ONCEPAY_SWEEP_INTERVAL", "1h".into()),
                ("ONCEPAY_HTTP_WORKERS", "2".into()),
                ("ONCEPAY_DB_POOL_SIZE", "10".into()),
                // Tests fire bursts; the rate-limit tests turn limits on.
                ("ONCEPAY_RATE_LIMIT_PER_SECOND", "0".into()),
                ("ONCEPAY_CHECKOUT_RATE_LIMIT_PER_SECOND", "0".into()),
                ("ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_PER_SECOND", "0".into()),
                ("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND", "0".into()),
                // Test receivers listen on loopback.
                ("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "true".into()),
            ],
            sandbox_env: vec![("ONCEPAY_SANDBOX_ASYNC_DELAY", "300ms".into())],
            fault_proxy: false,
            database_url: None,
            provider: Provider::Sandbox,
        }
    }
}

impl Options {
    /// Adds or replaces a `serve` variable.
    pub fn serve(mut self, name: &'static str, value: &str) -> Self {
        self.serve_env.retain(|(n, _)| *n != name);
        self.serve_env.push((name, value.to_string()));
        self
    }

    /// Routes oncepay's provider calls through a [`FaultProxy`].
    pub fn with_fault_proxy(mut self) -> Self {
        self.fault_proxy = true;
        self
    }

    /// New payments go to `provider`.
    pub fn provider(mut self, provider: Provider) -> Self {
        self.provider = provider;
        self
    }

    /// Adds or replaces a sandbox variable.
    pub fn sandbox(mut self, name: &'static str, value: &str) -> Self {
        self.sandbox_env.retain(|(n, _)| *n != name);
        self.sandbox_env.push((name, value.to_string()));
        self
    }
}

fn env_of(pairs: Vec<(&'static str, String)>) -> Env<impl Fn(&str) -> Option<String>> {
    Env::from_fn(move |name| {
        pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    })
}

/// A running service with its sandbox and a merchant's API key.
pub struct TestApp {
    /// `http://127.0.0.1:PORT` of oncepay.
    pub base: String,
    /// `http://127.0.0.1:PORT` of the sandbox.
    pub sandbox: String,
    /// A pool on the test database, for counting rows.
    pub db: PgPool,
    /// Merchant A's key.
    pub key: String,
    /// HTTP client.
    pub http: reqwest::Client,
    /// The service's context (to run worker passes directly).
    pub ctx: Arc<AppContext>,
    /// The fault proxy in front of the sandbox, if the test asked for one.
    pub proxy: Option<FaultProxy>,
    /// localstripe and its layer, when the test asked for Stripe.
    pub stripe: Option<StripeStack>,
    /// The environment `serve` was configured from: what another
    /// `oncepay` process (`oncepay reconcile`) on the same stack needs.
    pub serve_env: Vec<(&'static str, String)>,
}

/// Starts a fresh database, sandbox and service with default options.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(Options::default()).await
}

/// Starts a fresh database, sandbox and service.
pub async fn spawn_app_with(options: Options) -> TestApp {
    let db_url = options
        .database_url
        .clone()
        .unwrap_or_else(fresh_database_url);
    let sandbox_listener = TcpListener::bind("127.0.0.1:0").expect("bind sandbox");
    let sandbox = format!("http://{}", sandbox_listener.local_addr().expect("addr"));

    let proxy = options
        .fault_proxy
        .then(|| FaultProxy::start(&sandbox).expect("fault proxy starts"));
    let provider_url = proxy
        .as_ref()
        .map_or(sandbox.clone(), |p| p.url().to_string());
    let mut serve_env = options.serve_env.clone();
    serve_env.push(("DATABASE_URL", db_url.clone()));
    serve_env.push(("ONCEPAY_BIND", "127.0.0.1:0".into()));
    serve_env.push(("ONCEPAY_PROVIDER_URL", provider_url));
    let stripe = match options.provider {
        Provider::Sandbox => None,
        Provider::Stripe => {
            let localstripe = oncepay_testkit::localstripe::LocalStripe::start()
                .await
                .expect("localstripe starts (make localstripe)");
            let layer = oncepay_testkit::stripe_layer::StripeLayer::start(localstripe.url())
                .expect("the Stripe layer starts");
            serve_env.push(("ONCEPAY_PROVIDER", "stripe".into()));
            // A test's own key (a live one, say) stands.
            if !serve_env
                .iter()
                .any(|(n, _)| *n == "ONCEPAY_STRIPE_SECRET_KEY")
            {
                serve_env.push(("ONCEPAY_STRIPE_SECRET_KEY", STRIPE_KEY.into()));
            }
            serve_env.push(("ONCEPAY_STRIPE_API_BASE", layer.url().to_string()));
            serve_env.push((
                "ONCEPAY_STRIPE_WEBHOOK_SECRET",
                STRIPE_WEBHOOK_SECRET.into(),
            ));
            Some(StripeStack { localstripe, layer })
        }
    };
    let config: ServeConfig = env_of(serve_env.clone())
        .serve_config()
        .expect("serve config");
    let app = Application::build(config).await.expect("service starts");
    let base = format!("http://{}", app.addr());
    let ctx = app.context();

    let mut sandbox_env = options.sandbox_env.clone();
    sandbox_env.push((
        "ONCEPAY_SANDBOX_WEBHOOK_URL",
        format!("{base}/webhooks/sandbox"),
    ));
    let sandbox_config: SandboxConfig = env_of(sandbox_env)
        .sandbox_config()
        .expect("sandbox config");
    let sandbox_server =
        oncepay::sandbox_server::start(sandbox_config, sandbox_listener).expect("sandbox starts");
    tokio::spawn(sandbox_server);
    tokio::spawn(app.run_until_stopped());
    if let Some(stack) = &stripe {
        // localstripe posts its events, signed, to the service.
        let registered = reqwest::Client::new()
            .post(format!(
                "{}/_config/webhooks/oncepay",
                stack.localstripe.url()
            ))
            .form(&[
                ("url", format!("{base}/webhooks/stripe")),
                ("secret", STRIPE_WEBHOOK_SECRET.to_string()),
            ])
            .send()
            .await
            .expect("localstripe answers");
        assert!(registered.status().is_success(), "webhook registered");
    }

    let db = PgPool::connect(&db_url).await.expect("test pool");
    let key = oncepay::api_keys::create(&db, "merchant-a")
        .await
        .expect("api key");
    TestApp {
        base,
        sandbox,
        db,
        key,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client"),
        ctx,
        proxy,
        stripe,
        serve_env,
    }
}

/// A valid order body.
pub fn order_body() -> Value {
    json!({
        "customer_id": "cus_42",
        "currency": "EUR",
        "items": [{"sku": "book", "quantity": 2, "unit_amount": 1250}, {"sku": "pen", "quantity": 1, "unit_amount": 300}],
        "metadata": {"channel": "web"}
    })
}

impl TestApp {
    /// Opens a checkout session for `order_id`; returns its body.
    pub async fn checkout(&self, order_id: &str) -> Value {
        let r = self
            .post(
                &format!("/orders/{order_id}/checkout"),
                &Uuid::new_v4().to_string(),
                &json!({}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        json_of(r).await
    }

    /// A new checkout session's page URL for `order_id`.
    pub async fn checkout_url(&self, order_id: &str) -> String {
        self.checkout(order_id).await["url"]
            .as_str()
            .expect("url")
            .to_string()
    }

    /// Pays on the checkout page at `url` as its script does.
    pub async fn pay_on_page(&self, url: &str, key: &str, payment_method: &str) -> Response {
        self.http
            .post(format!("{url}/payments"))
            .header("Idempotency-Key", key)
            .json(&json!({ "payment_method": payment_method }))
            .send()
            .await
            .expect("post")
    }

    /// A key for another merchant.
    pub async fn other_merchant_key(&self) -> String {
        oncepay::api_keys::create(&self.db, "merchant-b")
            .await
            .expect("api key")
    }

    /// POSTs JSON with merchant A's key and an idempotency key.
    pub async fn post(&self, path: &str, idem: &str, body: &Value) -> Response {
        self.post_raw(
            path,
            Some(idem),
            Some(&self.key),
            body.to_string().into_bytes(),
        )
        .await
    }

    /// POSTs raw bytes with optional keys.
    pub async fn post_raw(
        &self,
        path: &str,
        idem: Option<&str>,
        api_key: Option<&str>,
        body: Vec<u8>,
    ) -> Response {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(idem) = idem {
            req = req.header("Idempotency-Key", idem);
        }
        if let Some(key) = api_key {
            req = req.bearer_auth(key);
        }
        req.send().await.expect("request sent")
    }

    /// GETs with merchant A's key.
    pub async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await
            .expect("request sent")
    }

    /// Creates an order and returns its id.
    pub async fn create_order(&self) -> String {
        let r = self
            .post("/orders", &Uuid::new_v4().to_string(), &order_body())
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        json_of(r).await["id"].as_str().expect("id").to_string()
    }

    /// Pays an order with a token under a new key; returns (status, payment).
    pub async fn pay(&self, order_id: &str, token: &str) -> (StatusCode, Value) {
        let r = self
            .post(
                "/payments",
                &Uuid::new_v4().to_string(),
                &json!({"order_id": order_id, "payment_method": token}),
            )
            .await;
        let status = r.status();
        (status, json_of(r).await)
    }

    /// Runs reconciler passes until payment `id` is `status` (at most
    /// 30 s), as a process's reconciler would; returns the payment.
    pub async fn reconciled_to(&self, id: &Value, status: &str) -> Value {
        let id = id.as_str().expect("a payment id").to_string();
        ready::until_some(Duration::from_secs(30), || async {
            oncepay::workers::reconciler::pass(&self.ctx).await.ok();
            let p = json_of(self.get(&format!("/payments/{id}")).await).await;
            (p["status"] == status).then_some(p)
        })
        .await
        .unwrap_or_else(|_| panic!("payment {id} never became {status}"))
    }

    /// Waits (up to 10 s) until merchant A's idempotency record for `key`
    /// exists and matches the SQL condition `condition`: how a test waits
    /// for a request to be in a given state instead of sleeping.
    pub async fn wait_for_record(&self, key: &str, condition: &str) {
        let sql = format!(
            "SELECT count(*) FROM idempotency_record WHERE idempotency_key = $1 AND {condition}"
        );
        let reached = ready::until(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, i64>(&sql)
                .bind(key)
                .fetch_one(&self.db)
                .await
                .is_ok_and(|n| n == 1)
        })
        .await;
        assert!(reached.is_ok(), "record {key} never reached {condition}");
    }

    /// The sandbox's charges made for `order_id`.
    pub async fn charges_for(&self, order_id: &str) -> Vec<Value> {
        self.ledger().await["charges"]
            .as_array()
            .expect("charges")
            .iter()
            .filter(|c| c["order_id"] == order_id)
            .cloned()
            .collect()
    }

    /// The `status` of the resource at `path`.
    pub async fn status_of(&self, path: &str) -> String {
        json_of(self.get(path).await).await["status"]
            .as_str()
            .expect("status")
            .to_string()
    }

    /// Counts rows with a query returning one bigint. A pooled connection
    /// a failover cut (the failover tests) is dropped and the query asked
    /// again on a fresh one, a few times.
    pub async fn count(&self, sql: &str) -> i64 {
        let mut tries = 0;
        loop {
            match sqlx::query(sql).fetch_one(&self.db).await {
                Ok(row) => return row.try_get::<i64, _>(0).expect("bigint"),
                Err(sqlx::Error::Io(e)) if tries < 5 => {
                    tries += 1;
                    eprintln!("count query: a cut connection ({e}); asking again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("count query: {e:?}"),
            }
        }
    }

    /// Cuts every connection the service has to its database, as a
    /// restart of the database or a failover does (the test's own pool
    /// keeps the one that asks).
    pub async fn cut_service_connections(&self) {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(&self.db)
        .await
        .expect("terminate the service's connections");
    }

    /// The sandbox ledger.
    pub async fn ledger(&self) -> Value {
        ledger(&self.http, &self.sandbox).await
    }

    /// Polls `GET path` until `done(body)`, for up to 10 s.
    pub async fn poll_until(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let reached = ready::until_some(Duration::from_secs(10), || async {
            let body = json_of(self.get(path).await).await;
            done(&body).then_some(body)
        })
        .await;
        reached.unwrap_or_else(|waited| panic!("condition not reached on {path} in {waited:?}"))
    }
}

/// The ledger of the sandbox at `base`: requests and effects per key.
pub async fn ledger(http: &reqwest::Client, base: &str) -> Value {
    oncepay_testkit::ledger::read(http, base)
        .await
        .expect("sandbox ledger")
}

/// Waits (up to 10 s) until the sandbox ledger's total `name` is `value`,
/// then asserts it (so a timeout fails with both numbers).
pub async fn wait_for_ledger_total(http: &reqwest::Client, base: &str, name: &str, value: u64) {
    let totals = || async {
        oncepay_testkit::ledger::totals(http, base)
            .await
            .expect("sandbox ledger totals")
    };
    let _ = ready::until(Duration::from_secs(10), || async {
        totals().await[name] == value
    })
    .await;
    assert_eq!(totals().await[name], value, "ledger total {name}");
    assert_eq!(
        ledger(http, base).await["totals"][name],
        value,
        "the whole ledger's total {name}, as its totals alone say"
    );
}

/// POSTs `event` to the sandbox webhook endpoint with the given signature
/// header (none if `None`) and timestamp.
pub async fn post_webhook(
    app: &TestApp,
    event: &Value,
    signature: Option<String>,
    timestamp: i64,
) -> reqwest::Response {
    let body = event.to_string();
    let id = event["id"].as_str().unwrap_or("evt_x").to_string();
    let mut req = app
        .http
        .post(format!("{}/webhooks/sandbox", app.base))
        .header("webhook-id", &id)
        .header("webhook-timestamp", timestamp.to_string())
        .body(body.clone());
    if let Some(sig) = signature {
        req = req.header("webhook-signature", sig);
    }
    req.send().await.expect("sent")
}

/// POSTs `event` signed with the development secret, as the sandbox would.
pub async fn post_signed_webhook(app: &TestApp, event: &Value) -> reqwest::Response {
    let id = event["id"].as_str().unwrap_or("evt_x");
    let ts = chrono::Utc::now().timestamp();
    let sig =
        oncepay::standard_webhooks::WebhookSecret::dev().sign(id, ts, event.to_string().as_bytes());
    post_webhook(app, event, Some(sig), ts).await
}

/// Parses a response body as JSON.
pub async fn json_of(r: Response) -> Value {
    let bytes = r.bytes().await.expect("body");
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
}

/// Picks a free local port.
pub fn free_port() -> u16 {
    oncepay_testkit::ports::free_port().expect("free port")
}

/// An `oncepay` child process.
pub struct Child {
    /// The process.
    pub process: tokio::process::Child,
    /// Its base URL.
    pub base: String,
}

/// Starts `oncepay <subcommand>` with the given environment on a free port
/// (`port_var` names the variable of its bind address).
pub async fn spawn_binary(subcommand: &str, port_var: &str, env: &[(&str, String)]) -> Child {
    let port = free_port();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.arg(subcommand)
        .env(port_var, format!("127.0.0.1:{port}"))
        .env("ONCEPAY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let process = cmd.spawn().expect("spawn oncepay");
    let base = format!("http://127.0.0.1:{port}");
    let ready = if subcommand == "serve" {
        "/readyz"
    } else {
        "/healthz"
    };
    ready::until_ready(&format!("{base}{ready}"), Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("oncepay {subcommand}: {e}"));
    Child { process, base }
}

/// Environment for a `serve` child on `db_url` using the sandbox at `sandbox`.
pub fn serve_env(db_url: &str, sandbox: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db_url.to_string()),
        ("ONCEPAY_PROVIDER_URL", sandbox.to_string()),
        ("ONCEPAY_HTTP_WORKERS", "2".into()),
        ("ONCEPAY_DB_POOL_SIZE", "10".into()),
        ("ONCEPAY_RATE_LIMIT_PER_SECOND", "0".into()),
        // The revocation tests hammer revoked keys from one address.
        ("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND", "0".into()),
        ("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "true".into()),
    ]
}

/// Fires `n` identical POSTs with one idempotency key at once, spread over
/// `bases` in turn. Every answer must be a 2xx or `409 in_flight`; returns
/// the 2xx bodies and the number of in-flight refusals.
pub async fn storm(
    bases: &[&str],
    api_key: &str,
    path: &str,
    idem: &str,
    body: &Value,
    n: usize,
) -> (Vec<Vec<u8>>, usize) {
    let http = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let request = http
            .post(format!("{}{path}", bases[i % bases.len()]))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idem)
            .json(body);
        tasks.spawn(async move {
            let r = request.send().await.expect("sent");
            (r.status(), r.bytes().await.expect("body").to_vec())
        });
    }
    let (mut ok, mut in_flight) = (Vec::new(), 0);
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.expect("task");
        if status.is_success() {
            ok.push(body);
        } else {
            assert_eq!(
                status,
                StatusCode::CONFLICT,
                "{}",
                String::from_utf8_lossy(&body)
            );
            let v: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["code"], "idempotency_key_in_flight");
            in_flight += 1;
        }
    }
    assert_eq!(ok.len() + in_flight, n);
    assert!(!ok.is_empty(), "at least the executing request answers 2xx");
    assert!(
        ok.iter().all(|b| *b == ok[0]),
        "every 2xx body is identical"
    );
    (ok, in_flight)
}

/// Waits (up to ~10 s) until the sandbox holds the charge made with
/// `payment_id` as its key in `status`; returns the ledger's charge entry.
pub async fn wait_for_charge_status(app: &TestApp, payment_id: &str, status: &str) -> Value {
    let found = ready::until_some(Duration::from_secs(10), || async {
        let ledger = app.ledger().await;
        oncepay_testkit::ledger::charge(&ledger, payment_id)
            .filter(|c| c["status"] == status)
            .cloned()
    })
    .await;
    found.unwrap_or_else(|_| panic!("the sandbox never held charge {payment_id} as {status}"))
}

/// Runs `python3 args…` in `dir` (a checker the tests share with people:
/// it prints what is wrong and exits non-zero) and fails with its output
/// if it does.
pub fn python_passes(dir: impl AsRef<std::path::Path>, args: &[&str]) {
    let out = std::process::Command::new("python3")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("python3 runs (make test installs PyYAML with schemathesis)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Everything oncepay stored that a client or provider sent it, as one
/// text to search (a card number must be in none of it): idempotency
/// requests and responses, payment methods, events, provider events.
pub async fn stored_text(db: &sqlx::PgPool) -> String {
    sqlx::query_scalar(
        "SELECT concat_ws(' ',
            (SELECT string_agg(request::text || coalesce(convert_from(response_body, 'UTF8'), ''), ' ') FROM idempotency_record),
            (SELECT string_agg(payment_method, ' ') FROM payment_attempt),
            (SELECT string_agg(data::text, ' ') FROM event),
            (SELECT string_agg(payload::text, ' ') FROM webhook_event))",
    )
    .fetch_one(db)
    .await
    .expect("dump")
}

/// Holds every insert into `table` (a table lock in an open transaction)
/// until the returned transaction ends: requests sent meanwhile queue for
/// the batch or group-commit writers, so they arrive together.
pub async fn hold_inserts(
    app: &TestApp,
    table: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut held = app.db.begin().await.expect("begin");
    sqlx::query(&format!("LOCK TABLE {table} IN SHARE MODE"))
        .execute(&mut *held)
        .await
        .expect("lock");
    held
}
