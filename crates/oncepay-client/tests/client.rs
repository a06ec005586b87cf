//! The client against the real service and the real sandbox over TCP: lost
//! answers, errors and slow answers, a storm of one intent, a crash and
//! resume in another process, declines, pending payments, unknown outcomes.
//! Every test counts charges in the sandbox's ledger.

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oncepay::config::Env;
use oncepay_client::{Client, Error, FileStore, LineItem, NewOrder, RetryPolicy, Status};
use oncepay_testkit::{ledger, ready};
use serde_json::Value;
use uuid::Uuid;

/// A fresh database, the sandbox and `oncepay serve`, in this process.
struct Stack {
    base: String,
    sandbox: String,
    key: String,
    db: sqlx::PgPool,
    http: reqwest::Client,
}

async fn stack(sandbox_env: &[(&'static str, &str)]) -> Stack {
    // Named after this test run: `make test-dbs-drop` drops it, and no other run's.
    let db_url = oncepay_testkit::test_db::database_url();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let sandbox = format!("http://{}", listener.local_addr().expect("addr"));
    let serve_vars: Vec<(&str, String)> = vec![
        ("DATABASE_URL", db_url.clone()),
        ("ONCEPAY_BIND", "127.0.0.1:0".into()),
        ("ONCEPAY_PROVIDER_URL", sandbox.clone()),
        ("ONCEPAY_HTTP_WORKERS", "2".into()),
        ("ONCEPAY_RECONCILE_INTERVAL", "1h".into()),
        // The tests' webhook receiver listens on loopback.
        ("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "true".into()),
        ("ONCEPAY_WEBHOOK_INTERVAL", "50ms".into()),
    ];
    let lookup = move |vars: Vec<(&'static str, String)>| {
        Env::from_fn(move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
    };
    let config = lookup(serve_vars).serve_config().expect("serve config");
    let app = oncepay::startup::Application::build(config)
        .await
        .expect("serve starts");
    let base = format!("http://{}", app.addr());
    // The test's own variables first: the lookup takes the first match.
    let mut sandbox_vars: Vec<(&'static str, String)> = sandbox_env
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect();
    sandbox_vars.push((
        "ONCEPAY_SANDBOX_WEBHOOK_URL",
        format!("{base}/webhooks/sandbox"),
    ));
    sandbox_vars.push(("ONCEPAY_SANDBOX_ASYNC_DELAY", "300ms".to_string()));
    let sandbox_config = lookup(sandbox_vars)
        .sandbox_config()
        .expect("sandbox config");
    tokio::spawn(oncepay::sandbox_server::start(sandbox_config, listener).expect("sandbox"));
    tokio::spawn(app.run_until_stopped());
    let db = sqlx::PgPool::connect(&db_url).await.expect("pool");
    let key = oncepay::api_keys::create(&db, "client-tests")
        .await
        .expect("key");
    Stack {
        base,
        sandbox,
        key,
        db,
        http: reqwest::Client::new(),
    }
}

impl Stack {
    fn client(&self, policy: RetryPolicy) -> Client {
        Client::builder(&self.base, &self.key)
            .policy(policy)
            .build()
            .expect("client")
    }

    async fn order(&self, client: &Client) -> Uuid {
        let items = vec![LineItem {
            sku: "book".into(),
            quantity: 1,
            unit_amount: 2500,
        }];
        client
            .intent(&format!("order {}", Uuid::new_v4()))
            .create_order(&NewOrder::new("cus_1", "EUR", items))
            .await
            .expect("order")
            .id
    }

    /// The sandbox's ledger entry for the charge made with `payment`'s key.
    async fn charge(&self, payment: Uuid) -> Value {
        let ledger = ledger::read(&self.http, &self.sandbox)
            .await
            .expect("ledger");
        ledger::charge(&ledger, &payment.to_string())
            .cloned()
            .unwrap_or(Value::Null)
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db)
            .await
            .expect("count")
    }
}

/// A client of whatever is on `port` on loopback that gives up after 800 ms.
fn short_lived_client(port: u16) -> Client {
    Client::builder(&format!("http://127.0.0.1:{port}"), "opk_x")
        .policy(RetryPolicy {
            deadline: Duration::from_millis(800),
            ..quick()
        })
        .build()
        .expect("client")
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        attempt_timeout: Duration::from_secs(1),
        base: Duration::from_millis(50),
        cap: Duration::from_millis(500),
        deadline: Duration::from_secs(20),
    }
}

#[tokio::test]
async fn lost_answers_errors_and_slow_answers_end_in_one_charge() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    for token in ["tok_visa+drop", "tok_visa+error=2", "tok_visa+delay=2500"] {
        let order = stack.order(&client).await;
        let payment = client
            .intent(&format!("pay {order}"))
            .pay(order, token)
            .await
            .unwrap_or_else(|e| panic!("{token}: {e}"));
        assert_eq!(payment.status, Status::Succeeded, "{token}");
        let charge = stack.charge(payment.id).await;
        assert_eq!(charge["charges"], 1, "{token}: one charge");
        assert_eq!(charge["status"], "succeeded");
    }
}

#[tokio::test]
async fn fifty_concurrent_sends_of_one_intent_charge_once_and_agree() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    let order = stack.order(&client).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let client = client.clone();
        tasks.spawn(async move {
            client
                .intent("pay the storm order")
                .pay(order, "tok_visa+delay=300")
                .await
        });
    }
    let mut ids = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let payment = done.expect("task").expect("every caller gets the payment");
        assert_eq!(payment.status, Status::Succeeded);
        ids.push(payment.id);
    }
    assert_eq!(ids.len(), 50);
    assert!(ids.iter().all(|id| *id == ids[0]), "one payment for all");
    assert_eq!(stack.charge(ids[0]).await["charges"], 1);
    assert_eq!(stack.count("SELECT count(*) FROM payment_attempt").await, 1);
}

#[tokio::test]
async fn a_process_killed_mid_payment_is_finished_by_the_next_with_the_same_key() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    let order = stack.order(&client).await;
    let dir = std::env::temp_dir().join(format!("oncepay-client-crash-{}", Uuid::new_v4()));
    // The first process pays; the sandbox charges at once and answers 3 s
    // later; the process dies before it reads the answer.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay-client"))
        .args([
            "--base",
            &stack.base,
            "--key",
            &stack.key,
            "--deadline",
            "60",
        ])
        .arg("--store")
        .arg(&dir)
        .args(["pay", "--order", &order.to_string()])
        .args([
            "--token",
            "tok_visa+delay=3000",
            "--intent",
            "pay the crash order",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn oncepay-client");
    let charged = ready::until(Duration::from_secs(10), || async {
        let l = ledger::read(&stack.http, &stack.sandbox)
            .await
            .expect("ledger");
        l["totals"]["charges"] == 1
    })
    .await;
    assert!(
        charged.is_ok(),
        "the first process's charge reached the provider"
    );
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");

    // A new process opens the same store and finishes the open intent.
    let resumed = Client::builder(&stack.base, &stack.key)
        .store(FileStore::open(&dir).expect("store"))
        .policy(quick())
        .build()
        .expect("client");
    let open = resumed.open_intents().expect("open intents");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].name, "pay the crash order");
    let body = resumed.resume(&open[0]).await.expect("resumed");
    assert_eq!(body["status"], "succeeded");
    assert!(resumed.open_intents().expect("open").is_empty(), "closed");
    // Asking the intent again answers from the store, no request sent.
    let again = resumed
        .intent("pay the crash order")
        .pay(order, "tok_visa+delay=3000")
        .await
        .expect("again");
    assert_eq!(again.id.to_string(), body["id"].as_str().expect("id"));
    assert_eq!(stack.count("SELECT count(*) FROM payment_attempt").await, 1);
    let charge = stack.charge(again.id).await;
    assert_eq!(charge["charges"], 1, "exactly one charge");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_hold_is_captured_once_per_intent_and_another_is_voided() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    let order = stack.order(&client).await;
    let held = client
        .intent("authorize order")
        .authorize(order, "tok_visa")
        .await
        .expect("held");
    assert_eq!(held.status, Status::RequiresCapture);
    assert_eq!(held.amount_capturable, 2500);
    assert!(held.capture_before.is_some());
    let shipping = client.intent("ship order");
    let paid = shipping
        .capture(held.id, Some(1500))
        .await
        .expect("captured");
    assert_eq!(paid.status, Status::Succeeded);
    assert_eq!(paid.amount_captured, 1500);
    // The same intent again: the same capture, replayed.
    let again = shipping
        .capture(held.id, Some(1500))
        .await
        .expect("replayed");
    assert_eq!(again, paid);
    // Another intent is another capture: refused, the payment captured once.
    let err = client
        .intent("ship order again")
        .capture(held.id, None)
        .await
        .expect_err("one capture per payment");
    assert_eq!(err.code(), Some("payment_not_capturable"));
    assert_eq!(stack.count("SELECT count(*) FROM payment_capture").await, 1);

    let other = stack.order(&client).await;
    let held = client
        .intent("authorize other")
        .authorize(other, "tok_visa")
        .await
        .expect("held");
    let released = client
        .intent("release other")
        .void(held.id)
        .await
        .expect("voided");
    assert_eq!(released.status, Status::Voided);
    assert_eq!(released.void_reason.as_deref(), Some("requested"));
}

#[tokio::test]
async fn a_decline_is_final_and_a_new_intent_pays_with_a_new_key() {
    let stack = stack(&[]).await;
    let tries = Arc::new(AtomicU32::new(0));
    let counted = tries.clone();
    let client = Client::builder(&stack.base, &stack.key)
        .policy(quick())
        .on_attempt(move |a| {
            if a.request == "POST /payments" {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        })
        .build()
        .expect("client");
    let order = stack.order(&client).await;
    let declined = client
        .intent("pay order, first card")
        .pay(order, "tok_declined")
        .await
        .expect("a decline is an answer");
    assert_eq!(declined.status, Status::Failed);
    assert_eq!(declined.failure_code.as_deref(), Some("card_declined"));
    assert_eq!(tries.load(Ordering::Relaxed), 1, "never retried");
    assert_eq!(stack.charge(declined.id).await["requests"], 1);
    let paid = client
        .intent("pay order, second card")
        .pay(order, "tok_visa")
        .await
        .expect("paid");
    assert_eq!(paid.status, Status::Succeeded);
    assert_ne!(paid.id, declined.id);
    assert_eq!(
        stack
            .count("SELECT count(DISTINCT idempotency_key) FROM payment_attempt")
            .await,
        2
    );
    // A final 4xx is returned, not retried.
    let before = tries.load(Ordering::Relaxed);
    let err = client
        .intent("pay a paid order")
        .pay(order, "tok_visa")
        .await
        .expect_err("not payable");
    assert_eq!(err.code(), Some("order_not_payable"));
    assert!(err.outcome_known());
    assert!(matches!(&err, Error::Api(api) if api.request_id.is_some()));
    assert_eq!(tries.load(Ordering::Relaxed), before + 1);
}

#[tokio::test]
async fn a_pending_payment_is_polled_until_final_or_returned_pending() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    let order = stack.order(&client).await;
    let paid = client
        .intent("pay async")
        .pay(order, "tok_async")
        .await
        .expect("paid");
    assert_eq!(paid.status, Status::Succeeded, "polled until settled");

    let slow = self::stack(&[("ONCEPAY_SANDBOX_ASYNC_DELAY", "1h")]).await;
    let client = slow.client(RetryPolicy {
        deadline: Duration::from_secs(2),
        ..quick()
    });
    let order = slow.order(&client).await;
    let pending = client
        .intent("pay slowly")
        .pay(order, "tok_async")
        .await
        .expect("pending is not an error");
    assert_eq!(pending.status, Status::Pending);
    assert_eq!(client.open_intents().expect("open").len(), 1, "still open");
}

#[tokio::test]
async fn no_answer_by_the_deadline_is_unknown_and_the_intent_stays_open() {
    // A listener that takes connections (the kernel's backlog) and never
    // answers: the request is sent, its outcome unknown.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let client = short_lived_client(port);
    let err = client
        .intent("pay into the void")
        .pay(Uuid::now_v7(), "tok_visa")
        .await
        .expect_err("nobody answers");
    assert!(!err.outcome_known(), "{err}");
    assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
    let open = client.open_intents().expect("open");
    assert_eq!(open.len(), 1);
    // Another request under the same intent is refused locally.
    let reused = client
        .intent("pay into the void")
        .pay(Uuid::now_v7(), "tok_visa")
        .await
        .expect_err("one intent, one request");
    assert!(matches!(reused, Error::IntentReused(_)));
    drop(silent);
}

/// Issue 48: every try refused while connecting sent nothing: that is
/// not an unknown outcome, and the intent is still safe to send.
#[tokio::test]
async fn a_connection_refused_to_the_deadline_is_not_sent_not_unknown() {
    let port = oncepay_testkit::ports::free_port().expect("port");
    let client = short_lived_client(port);
    let err = client
        .intent("pay nobody")
        .pay(Uuid::now_v7(), "tok_visa")
        .await
        .expect_err("nobody listens");
    assert!(
        matches!(&err, Error::NotSent { opened_before: false, reason, .. } if reason.contains("could not connect")),
        "{err}"
    );
    assert!(err.not_sent() && err.outcome_known(), "{err}");
    assert!(!err.to_string().contains("outcome unknown"), "{err}");
    assert_eq!(client.open_intents().expect("open").len(), 1, "still open");
}

/// Issue 48: `https://` on the plain-HTTP port. The TLS handshake fails
/// before a byte of the request is sent: a clear error saying so, at once
/// (not retried to the deadline, not "outcome unknown"), the intent open
/// with its key; sent to `http://` afterwards, it pays once, with that key.
#[tokio::test]
async fn https_to_the_plain_port_is_not_sent_and_the_intent_then_pays_once_over_http() {
    let stack = stack(&[]).await;
    let order = stack.order(&stack.client(quick())).await;
    let dir = std::env::temp_dir().join(format!("oncepay-client-tls-{}", Uuid::new_v4()));
    let tries = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = tries.clone();
    let tls = Client::builder(&stack.base.replacen("http://", "https://", 1), &stack.key)
        .store(FileStore::open(&dir).expect("store"))
        .policy(quick())
        .on_attempt(move |a| seen.lock().expect("tries").push(a.outcome.clone()))
        .build()
        .expect("client");
    let started = std::time::Instant::now();
    let err = tls
        .intent("pay over the wrong scheme")
        .pay(order, "tok_visa")
        .await
        .expect_err("no TLS on that port");
    assert!(
        matches!(
            &err,
            Error::NotSent {
                opened_before: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.not_sent(), "{err}");
    assert!(
        err.outcome_known(),
        "never sent, so nothing happened: {err}"
    );
    let text = err.to_string();
    for part in ["not sent", "TLS handshake", "does not speak TLS", "http://"] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    assert!(!text.contains("outcome unknown"), "{text}");
    assert!(
        started.elapsed() < quick().deadline / 4,
        "not retried to the deadline: {:?}",
        started.elapsed()
    );
    {
        let tries = tries.lock().expect("tries");
        assert_eq!(tries.len(), 1, "one try, not retried: {tries:?}");
        assert!(tries[0].contains("not retried"), "{tries:?}");
    }
    let open = tls.open_intents().expect("open");
    assert_eq!(open.len(), 1, "the intent stays open");
    let key = open[0].key.clone();
    assert_eq!(stack.count("SELECT count(*) FROM payment_attempt").await, 0);
    // Sent again over TLS: the same key, still nothing sent; the intent
    // existed before this call, so its outcome is no longer "known".
    let again = tls
        .intent("pay over the wrong scheme")
        .pay(order, "tok_visa")
        .await
        .expect_err("still no TLS");
    assert!(
        matches!(&again, Error::NotSent { opened_before: true, key: k, .. } if *k == key),
        "{again}"
    );
    assert!(!again.outcome_known());
    drop(tls);

    // The same store, the right scheme: the same intent, the same key.
    let plain = Client::builder(&stack.base, &stack.key)
        .store(FileStore::open(&dir).expect("store"))
        .policy(quick())
        .build()
        .expect("client");
    let paid = plain
        .intent("pay over the wrong scheme")
        .pay(order, "tok_visa")
        .await
        .expect("paid over http");
    assert_eq!(paid.status, Status::Succeeded);
    assert!(plain.open_intents().expect("open").is_empty(), "closed");
    assert_eq!(stack.count("SELECT count(*) FROM payment_attempt").await, 1);
    assert_eq!(
        stack
            .count(&format!(
                "SELECT count(*) FROM payment_attempt WHERE idempotency_key = '{key}'"
            ))
            .await,
        1,
        "sent with the intent's key"
    );
    assert_eq!(stack.charge(paid.id).await["charges"], 1, "one charge");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_payment_waiting_for_its_customer_returns_at_once_with_where_to_send_them() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    let order = stack.order(&client).await;
    let started = std::time::Instant::now();
    let waiting = client
        .intent("pay 3ds")
        .pay(order, "tok_3ds")
        .await
        .expect("waiting is not an error");
    assert_eq!(waiting.status, Status::Pending);
    let action = waiting.next_action.clone().expect("next_action");
    assert_eq!(action.kind, "redirect");
    assert!(
        started.elapsed() < quick().deadline,
        "not polled to the deadline"
    );
    assert_eq!(client.open_intents().expect("open").len(), 1, "still open");

    // The customer approves at the bank; resuming the intent finishes it.
    let approved = reqwest::Client::new()
        .post(format!("{}/approve", action.url))
        .send()
        .await
        .expect("bank");
    assert!(approved.status().is_success());
    let open = client.open_intents().expect("open").remove(0);
    let body = ready::until_some(Duration::from_secs(10), || async {
        let body = client.resume(&open).await.ok()?;
        (body["status"] == "succeeded").then_some(body)
    })
    .await
    .expect("settled");
    assert_eq!(body["id"].as_str(), Some(waiting.id.to_string().as_str()));
    assert!(client.open_intents().expect("open").is_empty());
    let charges = ledger::read(&stack.http, &stack.sandbox)
        .await
        .expect("ledger");
    assert_eq!(charges["totals"]["charges"], 1);
}

/// Every endpoint family through the typed API: lists paged and
/// filtered, a checkout session, a webhook endpoint whose deliveries the
/// client's own verifier accepts (and a forged one it refuses), events,
/// API keys; deleting and revoking are retried safely.
#[tokio::test]
async fn every_endpoint_family_is_typed_and_deliveries_verify() {
    use oncepay_client::webhooks::{Headers, Verifier, VerifyError};
    use oncepay_client::{CheckoutOptions, ListQuery};
    let s = stack(&[]).await;
    let client = s.client(quick());
    let receiver =
        oncepay_testkit::receiver::Receiver::start(oncepay_testkit::receiver::Policy::Accept)
            .expect("receiver");
    let endpoint = client
        .intent("hooks")
        .create_webhook_endpoint(receiver.url(), &["payment.succeeded", "order.paid"])
        .await
        .expect("endpoint");
    let secret = endpoint.secret.clone().expect("the secret, shown once");
    let listed = client.list_webhook_endpoints().await.expect("endpoints");
    assert_eq!(listed.data.len(), 1);
    assert_eq!(listed.data[0].secret, None, "never listed");

    let order = s.order(&client).await;
    let session = client
        .intent("checkout")
        .create_checkout(
            order,
            &CheckoutOptions {
                success_url: Some("https://shop.example/thanks".into()),
                ..Default::default()
            },
        )
        .await
        .expect("checkout");
    assert_eq!(session.order_id, order);
    assert!(session.url.contains("/checkout/"), "{}", session.url);
    let paid = client
        .intent("pay")
        .pay(order, "tok_visa")
        .await
        .expect("pay");
    assert_eq!(paid.status, Status::Succeeded);

    let by_order = client
        .list_payments_page(&ListQuery {
            order_id: Some(order),
            ..Default::default()
        })
        .await
        .expect("payments");
    assert_eq!(by_order.data.len(), 1);
    assert!(!by_order.has_more);
    let orders = client
        .list_orders(&ListQuery {
            status: Some("paid".into()),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .expect("orders");
    assert_eq!(orders.data[0].id, order);
    let refund = client
        .intent("refund")
        .refund(paid.id, Some(500), None)
        .await
        .expect("refund");
    assert_eq!(refund.currency.as_deref(), Some("EUR"));
    let refunds = client
        .list_refunds(&ListQuery {
            payment_id: Some(paid.id),
            ..Default::default()
        })
        .await
        .expect("refunds");
    assert_eq!(refunds.data[0].id, refund.id);
    let events = client
        .list_events(&ListQuery {
            object_id: Some(order),
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(events.data.iter().any(|e| e.event_type == "order.paid"));
    let first = &events.data[0];
    assert_eq!(
        client.get_event(&first.id).await.expect("event")["id"],
        first.id
    );

    // The deliveries: each verifies with the endpoint's secret; altered,
    // it does not.
    let delivered = ready::until_some(Duration::from_secs(20), || async {
        let got = receiver.accepted();
        (got.len() >= 2).then_some(got)
    })
    .await
    .expect("two deliveries");
    let verifier = Verifier::new(&secret).expect("verifier");
    for d in &delivered {
        let headers = Headers {
            id: Some(&d.id),
            timestamp: Some(&d.timestamp),
            signature: Some(&d.signature),
        };
        let event = verifier.verify(&headers, &d.body).expect("verifies");
        assert!(["payment.succeeded", "order.paid"].contains(&event.event_type.as_str()));
        let mut forged = d.body.to_vec();
        forged.extend_from_slice(b" ");
        assert_eq!(
            verifier.verify(&headers, &forged),
            Err(VerifyError::Mismatch)
        );
    }

    client
        .delete_webhook_endpoint(endpoint.id)
        .await
        .expect("deleted");
    assert!(client
        .list_webhook_endpoints()
        .await
        .expect("list")
        .data
        .is_empty());
    let keys = client.list_api_keys().await.expect("keys");
    assert_eq!(keys.data.len(), 1);
    assert!(keys.data[0].prefix.starts_with("opk_"));
}

/// The CLI's demo, as docs/clients.md promises it: `checkout` loses the
/// payment's first answer on its way back (oncepay paid, the client never
/// heard), retries with the same key, is answered with the first answer
/// replayed, and the order has one payment, charged once.
#[tokio::test]
async fn the_checkout_demo_loses_an_answer_and_its_retry_gets_the_replay() {
    let stack = stack(&[]).await;
    let dir = std::env::temp_dir().join(format!("oncepay-client-demo-{}", Uuid::new_v4()));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay-client"))
        .args(["--base", &stack.base, "--key", &stack.key])
        .arg("--store")
        .arg(&dir)
        .args(["checkout", "--name", "demo"])
        .kill_on_drop(true)
        .output()
        .await
        .expect("oncepay-client runs");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stdout}{stderr}");
    let tries: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("POST /payments try"))
        .collect();
    assert_eq!(tries.len(), 2, "{stderr}");
    assert!(
        tries[0].contains("try 1: ") && tries[0].contains("(retrying, same key)"),
        "{stderr}"
    );
    assert!(
        tries[1].contains("try 2: 201, Idempotent-Replayed: true"),
        "{stderr}"
    );
    let key_of = |line: &str| {
        line.split(" key ")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .map(str::to_string)
    };
    assert!(key_of(tries[0]).is_some(), "{stderr}");
    assert_eq!(key_of(tries[0]), key_of(tries[1]), "one key: {stderr}");
    assert!(
        stdout.contains("answers lost on the way back: 1"),
        "{stdout}"
    );
    assert!(stdout.contains("has 1 payment(s)"), "{stdout}");
    assert_eq!(stack.count("SELECT count(*) FROM payment_attempt").await, 1);
    let payment: Uuid = sqlx::query_scalar("SELECT id FROM payment_attempt")
        .fetch_one(&stack.db)
        .await
        .expect("the payment");
    assert_eq!(stack.charge(payment).await["charges"], 1, "charged once");
}

/// docs/clients.md's table of endpoints names every route the service
/// serves (`oncepay::http::ROUTES`), each as `METHOD /path`, and only
/// calls the client has.
#[test]
fn the_docs_endpoint_table_is_every_route_and_real_calls() {
    let docs = include_str!("../../../docs/clients.md");
    let client = include_str!("../src/client.rs");
    let start = docs
        .find("### Endpoints and the client's calls")
        .expect("the section");
    let end = docs[start..]
        .find("\n## ")
        .map_or(docs.len(), |e| start + e);
    let rows: Vec<&str> = docs[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .collect();
    let cell = |row: &str, n: usize| row.split(" | ").nth(n).unwrap_or_default().to_string();
    let ticked = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let documented: Vec<String> = rows.iter().flat_map(|r| ticked(&cell(r, 0))).collect();
    let mut served = Vec::new();
    for route in oncepay::http::ROUTES {
        served.push(format!("{} {}", route.method, route.path));
    }
    let missing: Vec<_> = served.iter().filter(|r| !documented.contains(r)).collect();
    let unknown: Vec<_> = documented.iter().filter(|r| !served.contains(r)).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "not in docs/clients.md: {missing:?}; not served: {unknown:?}"
    );
    for row in &rows {
        let calls = cell(row, 1);
        for call in ticked(&calls) {
            if call.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                assert!(
                    client.contains(&format!("pub async fn {call}(")),
                    "docs/clients.md names `{call}`, which the client does not have"
                );
            }
        }
    }
}

#[tokio::test]
async fn balances_and_holds_take_one_key_per_intent() {
    let stack = stack(&[]).await;
    let client = stack.client(quick());
    // A customer id that needs escaping in a path.
    let customer = "cus 1/ü";
    let credit = client
        .intent("goodwill 1")
        .credit_balance(customer, 1000, "EUR", Some("sorry"))
        .await
        .expect("credited");
    assert_eq!(credit.kind, "credit");
    assert_eq!(credit.customer_id, customer);
    assert_eq!(credit.balance.available, 1000);
    // The same intent again: the same transaction, not a second credit.
    let again = client
        .intent("goodwill 1")
        .credit_balance(customer, 1000, "EUR", Some("sorry"))
        .await
        .expect("the same answer");
    assert_eq!(again, credit);
    let refused = client
        .intent("spend 5000")
        .debit_balance(customer, 5000, "EUR", None)
        .await
        .expect_err("not covered");
    assert_eq!(refused.code(), Some("insufficient_funds"));
    client
        .intent("goodwill 2")
        .credit_balance(customer, 5000, "EUR", None)
        .await
        .expect("credited");
    let still = client
        .intent("spend 5000")
        .debit_balance(customer, 5000, "EUR", None)
        .await
        .expect_err("the intent's answer stands");
    assert_eq!(still.code(), Some("insufficient_funds"));

    let hold = client
        .intent("hold cart 7")
        .hold_balance(customer, 600, "EUR", Some(600))
        .await
        .expect("held");
    assert_eq!(hold.status, "held");
    assert_eq!(
        client
            .get_balance(customer, "EUR")
            .await
            .expect("balance")
            .available,
        5400
    );
    let captured = client
        .intent("capture cart 7")
        .capture_hold(hold.id, Some(400))
        .await
        .expect("captured");
    assert_eq!(
        (captured.status.as_str(), captured.captured_amount),
        ("captured", 400)
    );
    let not_active = client
        .intent("release cart 7")
        .release_hold(hold.id)
        .await
        .expect_err("already captured");
    assert_eq!(not_active.code(), Some("hold_not_active"));
    assert_eq!(
        client.get_balance_hold(hold.id).await.expect("hold"),
        captured
    );
    let balance = client.get_balance(customer, "EUR").await.expect("balance");
    assert_eq!(
        (balance.posted, balance.held, balance.available),
        (5600, 0, 5600)
    );
    let page = client
        .list_balance_transactions(customer, Some("EUR"), &Default::default())
        .await
        .expect("page");
    let kinds: Vec<&str> = page.data.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, ["hold_capture", "hold", "credit", "credit"]);
    assert_eq!(
        client
            .get_balance_transaction(credit.id)
            .await
            .expect("transaction"),
        credit
    );
    assert_eq!(stack.count("SELECT count(*) FROM ledger_transfer").await, 4);

    // A card payment refunded to the balance.
    let order = stack.order(&client).await;
    let paid = client
        .intent("pay for store credit test")
        .pay(order, "tok_visa")
        .await
        .expect("paid");
    let refund = client
        .intent("refund to credit")
        .refund_to_balance(paid.id, Some(500), None)
        .await
        .expect("refunded");
    assert_eq!(refund.destination.as_deref(), Some("balance"));
    assert_eq!(
        client
            .get_balance("cus_1", "EUR")
            .await
            .expect("balance")
            .available,
        500
    );
}
