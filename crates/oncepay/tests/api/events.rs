//! The outbox and outbound webhooks: one event per state change, written
//! with the change; delivered to a real HTTP receiver, signed (checked with
//! the Standard Webhooks reference library, not ours), retried with the
//! same id, given up or disabled as configured; endpoints on private
//! addresses refused; the event list and trails.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use oncepay_testkit::ready;
use oncepay_testkit::receiver::{Policy, Received, Receiver};
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;

/// Fast retries, so a test sees a whole schedule in well under a second.
fn fast_webhooks() -> Options {
    Options::default()
        .serve("ONCEPAY_WEBHOOK_SCHEDULE", "100ms,100ms,100ms")
        .serve("ONCEPAY_WEBHOOK_INTERVAL", "50ms")
        .serve("ONCEPAY_WEBHOOK_TIMEOUT", "2s")
}

impl TestApp {
    /// Registers an endpoint for `events`; returns its id and secret.
    async fn subscribe(&self, url: &str, events: &[&str]) -> (String, String) {
        let r = self
            .post(
                "/webhook_endpoints",
                &Uuid::new_v4().to_string(),
                &json!({"url": url, "events": events}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let body = json_of(r).await;
        let secret = body["secret"].as_str().expect("secret").to_string();
        assert!(secret.starts_with("whsec_"));
        (body["id"].as_str().expect("id").to_string(), secret)
    }

    /// Creates an order and pays it with `token`; returns (order, payment).
    async fn paid_order(&self, token: &str) -> (String, Value) {
        let order_id = self.create_order().await;
        let (_, payment) = self.pay(&order_id, token).await;
        (order_id, payment)
    }

    async fn events_of(&self, path: &str) -> Vec<Value> {
        let r = self.get(path).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        json_of(r).await["data"].as_array().expect("data").clone()
    }
}

/// `(type, sequence)` of every event of the merchant, by object id.
async fn events_by_object(app: &TestApp) -> BTreeMap<String, Vec<(String, i64)>> {
    let mut out: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    let rows: Vec<(Uuid, String, i32)> =
        sqlx::query_as("SELECT object_id, type, sequence FROM event ORDER BY object_id, sequence")
            .fetch_all(&app.db)
            .await
            .expect("events");
    for (object, kind, seq) in rows {
        out.entry(object.to_string())
            .or_default()
            .push((kind, seq.into()));
    }
    out
}

/// Waits until the receiver accepted `n` distinct event ids.
async fn wait_for_accepted(receiver: &Receiver, n: usize) -> Vec<Received> {
    let done = ready::until(Duration::from_secs(15), || async {
        let ids: BTreeSet<String> = receiver.accepted().into_iter().map(|r| r.id).collect();
        ids.len() >= n
    })
    .await;
    let accepted = receiver.accepted();
    assert!(
        done.is_ok(),
        "only {} of {n} events accepted",
        accepted.len()
    );
    accepted
}

/// Verifies a delivery with the Standard Webhooks reference library.
fn verify(secret: &str, r: &Received) {
    let webhook = standardwebhooks::Webhook::new(secret).expect("secret parses");
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in [
        ("webhook-id", &r.id),
        ("webhook-timestamp", &r.timestamp),
        ("webhook-signature", &r.signature),
    ] {
        headers.insert(name, value.parse().expect("header value"));
    }
    webhook
        .verify(&r.body, &headers)
        .unwrap_or_else(|e| panic!("delivery {} does not verify: {e:?}", r.id));
}

#[tokio::test]
async fn one_event_per_change_whatever_repeats() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS", "3")
            .serve("ONCEPAY_RECONCILE_AFTER", "1ms"),
    )
    .await;
    let order_id = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let body = json!({"order_id": order_id, "payment_method": "tok_visa"});
    // A replay storm of one payment, over two connections' worth of tasks.
    let (ok, _) = storm(&[&app.base], &app.key, "/payments", &key, &body, 20).await;
    let payment: Value = serde_json::from_slice(&ok[0]).expect("json");
    assert_eq!(payment["status"], "succeeded");
    // The sandbox's three copies of each webhook arrive; the reconciler
    // looks at everything; neither changes anything.
    wait_for_ledger_total(&app.http, &app.sandbox, "webhooks_delivered", 3).await;
    oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("pass");
    let payment_id = payment["id"].as_str().expect("id");
    let events = events_by_object(&app).await;
    assert_eq!(
        events.get(payment_id),
        Some(&vec![
            ("payment.pending".to_string(), 1),
            ("payment.succeeded".to_string(), 2)
        ])
    );
    assert_eq!(
        events.get(&order_id),
        Some(&vec![("order.paid".to_string(), 1)])
    );
    assert_eq!(app.count("SELECT count(*) FROM event").await, 3);

    // A refund then a cancel move the order on, one event each.
    let r = app
        .post(
            &format!("/payments/{payment_id}/refunds"),
            &Uuid::new_v4().to_string(),
            &json!({"amount": 100}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    let r = app
        .post(
            &format!("/orders/{order_id}/cancel"),
            &Uuid::new_v4().to_string(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let events = events_by_object(&app).await;
    assert_eq!(
        events.get(refund["id"].as_str().expect("id")),
        Some(&vec![("refund.succeeded".to_string(), 1)])
    );
    assert_eq!(
        events.get(&order_id),
        Some(&vec![
            ("order.paid".to_string(), 1),
            ("order.cancelled".to_string(), 2)
        ])
    );
    // Another refund.succeeded (the cancel's), and nothing else.
    assert_eq!(app.count("SELECT count(*) FROM event").await, 6);
}

#[tokio::test]
async fn a_trail_names_the_cause_and_the_request() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let r = app
        .http
        .post(format!("{}/payments", app.base))
        .bearer_auth(&app.key)
        .header("Idempotency-Key", Uuid::new_v4().to_string())
        .header("X-Request-Id", "req-trail-1")
        .json(&json!({"order_id": order_id, "payment_method": "tok_async"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let payment_id = json_of(r).await["id"].as_str().expect("id").to_string();
    // The sandbox's webhook settles it.
    app.poll_until(&format!("/payments/{payment_id}"), |p| {
        p["status"] == "succeeded"
    })
    .await;
    let trail = app
        .events_of(&format!("/payments/{payment_id}/events"))
        .await;
    let summary: Vec<(&str, &str, Option<&str>)> = trail
        .iter()
        .map(|e| {
            (
                e["type"].as_str().expect("type"),
                e["cause"].as_str().expect("cause"),
                e["request_id"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary[0],
        ("payment.pending", "request", Some("req-trail-1"))
    );
    assert_eq!(summary[1].0, "payment.succeeded");
    assert_eq!(summary[1].1, "webhook");
    assert_eq!(trail[1]["data"]["object"]["status"], "succeeded");
    assert_eq!(trail[1]["sequence"], 2);

    let history = app.events_of(&format!("/orders/{order_id}/events")).await;
    let types: Vec<&str> = history
        .iter()
        .map(|e| e["type"].as_str().expect("t"))
        .collect();
    assert_eq!(
        types,
        ["payment.pending", "payment.succeeded", "order.paid"]
    );
    // The object is what GET shows.
    let order = json_of(app.get(&format!("/orders/{order_id}")).await).await;
    assert_eq!(history[2]["data"]["object"], order);

    // Listed newest first, filtered by type and object.
    let page = app.events_of("/events?type=order.paid").await;
    assert_eq!(page.len(), 1);
    assert_eq!(page[0]["id"], history[2]["id"]);
    let page = app
        .events_of(&format!("/events?object_id={payment_id}&limit=1"))
        .await;
    assert_eq!(page[0]["type"], "payment.succeeded");
    let r = app.get("/events?type=payment.created").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["field"], "type");
    // Another merchant sees none of it.
    let other = app.other_merchant_key().await;
    let r = app
        .http
        .get(format!("{}/payments/{payment_id}/events", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_failing_receiver_gets_every_event_signed_with_one_id_per_event() {
    let app = spawn_app_with(fast_webhooks()).await;
    let receiver = Receiver::start(Policy::FailFirst(2)).expect("receiver");
    let (_, secret) = app.subscribe(receiver.url(), &["*"]).await;
    let (order_id, payment) = app.paid_order("tok_visa").await;
    let accepted = wait_for_accepted(&receiver, 3).await;

    let events = app.events_of("/events").await;
    let ids: BTreeSet<String> = events
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let received = receiver.received();
    let mut by_id: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    for r in &received {
        verify(&secret, r);
        by_id.entry(r.id.clone()).or_default().push(r);
    }
    assert_eq!(
        by_id.keys().cloned().collect::<BTreeSet<_>>(),
        ids,
        "nothing but our events"
    );
    for (id, copies) in &by_id {
        assert_eq!(copies.len(), 3, "two failures and a success for {id}");
        assert!(
            copies.iter().all(|c| c.body == copies[0].body),
            "the same body on every attempt"
        );
        let body: Value = serde_json::from_slice(&copies[0].body).expect("json");
        assert_eq!(body["id"].as_str(), Some(id.as_str()));
        // `actor` when an authenticated caller asked for the change
        // (issue 47); nothing else.
        let keys: BTreeSet<&str> = body
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "actor")
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from(["id", "type", "created_at", "sequence", "data"])
        );
    }
    assert_eq!(accepted.len(), 3, "each event accepted once");
    let paid = accepted
        .iter()
        .map(|r| serde_json::from_slice::<Value>(&r.body).expect("json"))
        .find(|b| b["type"] == "order.paid")
        .expect("order.paid delivered");
    assert_eq!(paid["data"]["object"]["id"], order_id.as_str());
    assert_eq!(paid["data"]["object"]["status"], "paid");

    // The event's own page shows the attempts as the receiver answered them.
    let succeeded = events
        .iter()
        .find(|e| e["type"] == "payment.succeeded")
        .expect("payment.succeeded");
    assert_eq!(succeeded["data"]["object"]["id"], payment["id"]);
    let detail = json_of(
        app.get(&format!(
            "/events/{}",
            succeeded["id"].as_str().expect("id")
        ))
        .await,
    )
    .await;
    let statuses: Vec<i64> = detail["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["response_status"].as_i64().expect("status"))
        .collect();
    assert_eq!(statuses, [500, 500, 200]);
    assert_eq!(detail["deliveries"][0]["state"], "delivered");
}

#[tokio::test]
async fn deliveries_follow_their_object_sequence_and_subscriptions() {
    // Twenty retries: a delivery failing every one of them at even odds is
    // a one-in-a-million chance (with twelve, one CI run in a few hundred
    // met it among the eight deliveries).
    let app =
        spawn_app_with(fast_webhooks().serve("ONCEPAY_WEBHOOK_SCHEDULE", &["50ms"; 20].join(",")))
            .await;
    let receiver = Receiver::start(Policy::FailRandomly(0.5)).expect("receiver");
    app.subscribe(receiver.url(), &["payment.succeeded", "payment.pending"])
        .await;
    for _ in 0..4 {
        app.paid_order("tok_visa").await;
    }
    let accepted = wait_for_accepted(&receiver, 8).await;
    let mut last_seq: BTreeMap<String, i64> = BTreeMap::new();
    for r in &accepted {
        let body: Value = serde_json::from_slice(&r.body).expect("json");
        assert!(
            body["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("payment.")),
            "only subscribed types: {body}"
        );
        let object = body["data"]["object"]["id"]
            .as_str()
            .expect("id")
            .to_string();
        let seq = body["sequence"].as_i64().expect("sequence");
        let previous = last_seq.insert(object, seq).unwrap_or(0);
        assert_eq!(seq, previous + 1, "delivered in sequence: {body}");
    }
}

#[tokio::test]
async fn a_gone_receiver_disables_its_endpoint_and_an_exhausted_schedule_gives_up() {
    let app = spawn_app_with(fast_webhooks()).await;
    let gone = Receiver::start(Policy::Gone).expect("receiver");
    let (gone_id, _) = app.subscribe(gone.url(), &["order.paid"]).await;
    let failing = Receiver::start(Policy::FailFirst(1000)).expect("receiver");
    let (failing_id, _) = app.subscribe(failing.url(), &["order.paid"]).await;
    app.paid_order("tok_visa").await;

    let disabled = ready::until(Duration::from_secs(10), || async {
        let list = app.events_of("/webhook_endpoints").await;
        list.iter()
            .any(|e| e["id"] == gone_id.as_str() && e["status"] == "disabled")
    })
    .await;
    assert!(disabled.is_ok(), "410 disables the endpoint");
    // The schedule has three waits: four attempts, then given up.
    let given_up = ready::until(Duration::from_secs(10), || async {
        app.count(&format!(
            "SELECT count(*) FROM webhook_delivery
              WHERE state = 'failed' AND endpoint_id = '{failing_id}'"
        ))
        .await
            == 1
    })
    .await;
    assert!(given_up.is_ok(), "the failing delivery is given up");
    assert_eq!(failing.received().len(), 4);
    assert_eq!(gone.received().len(), 1, "nothing after the 410");

    // Redelivery starts a fresh schedule to the live endpoint only.
    failing.set_policy(Policy::Accept);
    let event_id = app.events_of("/events?type=order.paid").await[0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = app
        .post_raw(
            &format!("/events/{event_id}/redeliver"),
            None,
            Some(&app.key),
            Vec::new(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(json_of(r).await["deliveries"], 1);
    let accepted = wait_for_accepted(&failing, 1).await;
    assert_eq!(accepted[0].id, event_id, "the same id as before");
    assert_eq!(gone.received().len(), 1);
    let r = app
        .post_raw(
            &format!("/events/{}/redeliver", Uuid::now_v7()),
            None,
            Some(&app.key),
            Vec::new(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn private_addresses_are_refused_at_registration_and_at_delivery() {
    let app = spawn_app_with(fast_webhooks().serve("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "false")).await;
    let receiver = Receiver::start(Policy::Accept).expect("receiver");
    let key = Uuid::new_v4().to_string();
    for url in [
        receiver.url().to_string(),
        "http://localhost:9/hook".into(),
        "http://169.254.169.254/latest/meta-data".into(),
        "http://[::1]:9/".into(),
        "http://10.0.0.1/".into(),
    ] {
        let r = app
            .post(
                "/webhook_endpoints",
                &key,
                &json!({"url": url, "events": ["*"]}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{url}");
        let problem = json_of(r).await;
        assert_eq!(problem["field"], "url");
        assert!(problem["detail"]
            .as_str()
            .expect("detail")
            .contains("public"));
    }
    for (url, field) in [
        (json!("ftp://example.com/"), "url"),
        (json!("https://user:pw@example.com/"), "url"),
        (json!(42), "url"),
    ] {
        let r = app
            .post(
                "/webhook_endpoints",
                &key,
                &json!({"url": url, "events": ["*"]}),
            )
            .await;
        assert!(r.status().is_client_error());
        assert_eq!(json_of(r).await["field"], field);
    }
    let r = app
        .post(
            "/webhook_endpoints",
            &key,
            &json!({"url": "https://example.com/h", "events": ["payment.refunded"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["field"], "events[0]");
    // Every refusal left the key free: it now creates an endpoint.
    let r = app
        .post(
            "/webhook_endpoints",
            &key,
            &json!({"url": "https://hooks.example.com/oncepay", "events": ["*"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // An endpoint whose address turned private after registration (here
    // written directly, as DNS rebinding would leave it) gets nothing.
    sqlx::query(
        "INSERT INTO webhook_endpoint (id, merchant_id, url, events, secret_key)
         SELECT $1, merchant_id, $2, ARRAY['*'], decode(repeat('ab', 32), 'hex')
           FROM api_key LIMIT 1",
    )
    .bind(Uuid::now_v7())
    .bind(receiver.url())
    .execute(&app.db)
    .await
    .expect("endpoint");
    app.paid_order("tok_visa").await;
    let refused = ready::until(Duration::from_secs(10), || async {
        app.count(
            "SELECT count(*) FROM webhook_attempt WHERE error LIKE '%only to public addresses%'",
        )
        .await
            >= 3
    })
    .await;
    assert!(refused.is_ok(), "every delivery attempt is refused");
    assert!(receiver.received().is_empty(), "nothing reached 127.0.0.1");
}

#[tokio::test]
async fn endpoints_are_created_once_per_key_listed_and_deleted() {
    let app = spawn_app_with(fast_webhooks()).await;
    let receiver = Receiver::start(Policy::Accept).expect("receiver");
    let key = Uuid::new_v4().to_string();
    let body = json!({"url": receiver.url(), "events": ["order.paid", "order.paid"]});
    let first = app.post("/webhook_endpoints", &key, &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = json_of(first).await;
    let again = app.post("/webhook_endpoints", &key, &body).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(again).await, first, "the same endpoint and secret");
    assert_eq!(first["events"], json!(["order.paid"]));
    let list = app.events_of("/webhook_endpoints").await;
    assert_eq!(list.len(), 1);
    assert!(list[0].get("secret").is_none(), "the secret is shown once");

    let id = first["id"].as_str().expect("id");
    let delete = |id: String| {
        let app = &app;
        async move {
            app.http
                .delete(format!("{}/webhook_endpoints/{id}", app.base))
                .bearer_auth(&app.key)
                .send()
                .await
                .expect("sent")
                .status()
        }
    };
    assert_eq!(delete(id.to_string()).await, StatusCode::NO_CONTENT);
    assert_eq!(delete(id.to_string()).await, StatusCode::NOT_FOUND);
    app.paid_order("tok_visa").await;
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_delivery").await,
        0,
        "a deleted endpoint is sent nothing"
    );
    assert!(app.events_of("/webhook_endpoints").await.is_empty());
}

#[tokio::test]
async fn old_events_go_with_their_deliveries_but_never_an_undelivered_one_or_an_objects_newest() {
    // Everything is "old" a millisecond after it is written.
    let app = spawn_app_with(fast_webhooks().serve("ONCEPAY_EVENT_RETENTION", "1ms")).await;
    let accepting = Receiver::start(Policy::Accept).expect("receiver");
    app.subscribe(accepting.url(), &["*"]).await;
    app.paid_order("tok_visa").await;
    let delivered = ready::until(Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM webhook_delivery WHERE state <> 'delivered'")
            .await
            == 0
    })
    .await;
    assert!(delivered.is_ok(), "the first order's events are delivered");
    // From now on one receiver hangs: the second order's events stay undelivered.
    let hanging = Receiver::start(Policy::Stall).expect("receiver");
    app.subscribe(hanging.url(), &["*"]).await;
    app.paid_order("tok_visa").await;
    let deletable = app
        .count(
            "SELECT count(*) FROM event e
              WHERE EXISTS (SELECT 1 FROM event n WHERE n.object_id = e.object_id AND n.sequence > e.sequence)
                AND NOT EXISTS (SELECT 1 FROM webhook_delivery d WHERE d.event_id = e.id AND d.state = 'pending')",
        )
        .await;
    assert!(deletable > 0, "the first order has superseded events");
    let objects = app
        .count("SELECT count(DISTINCT object_id) FROM event")
        .await;
    let undelivered: Vec<Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT event_id FROM webhook_delivery WHERE state = 'pending'",
    )
    .fetch_all(&app.db)
    .await
    .expect("pending");
    assert!(!undelivered.is_empty());
    let newest = |db: sqlx::PgPool| async move {
        sqlx::query_as::<_, (Uuid, i32)>(
            "SELECT object_id, max(sequence) FROM event GROUP BY object_id ORDER BY object_id",
        )
        .fetch_all(&db)
        .await
        .expect("newest")
    };
    let newest_before = newest(app.db.clone()).await;

    let deleted = oncepay::workers::sweeper::retention(&app.ctx)
        .await
        .expect("retention");
    assert!(deleted.held);
    assert_eq!(deleted.events, u64::try_from(deletable).expect("count"));
    assert!(
        deleted.deliveries > 0 && deleted.attempts > 0,
        "{deleted:?}"
    );
    assert_eq!(
        app.count("SELECT count(DISTINCT object_id) FROM event")
            .await,
        objects,
        "every object keeps its newest event"
    );
    for id in &undelivered {
        let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM event WHERE id = $1")
            .bind(id)
            .fetch_one(&app.db)
            .await
            .expect("count");
        assert_eq!(kept, 1, "an undelivered event is never deleted");
    }
    assert_eq!(
        app.count(
            "SELECT count(*) FROM webhook_attempt a WHERE NOT EXISTS (SELECT 1 FROM event e WHERE e.id = a.event_id)"
        )
        .await,
        0,
        "no attempt outlives its event"
    );
    // Every object keeps its newest sequence (whatever its age), which its
    // next event goes on from: receivers never see a number again.
    assert_eq!(newest(app.db.clone()).await, newest_before);
    let metrics = app.ctx.metrics.render();
    assert!(
        metrics.contains(&format!(
            "oncepay_retention_deleted_total{{table=\"event\"}} {}",
            deleted.events
        )),
        "{metrics}"
    );
    // A second pass finds nothing more to delete.
    let again = oncepay::workers::sweeper::retention(&app.ctx)
        .await
        .expect("retention");
    assert_eq!(again.events, 0);
}
