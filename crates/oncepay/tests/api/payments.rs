//! Payments end to end (contract sections 3, 6, 7): the real sandbox over
//! HTTP, counted in its ledger.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

/// Waits until the sandbox has settled `n` charges as succeeded (async
/// tokens settle there after a delay, whatever the machine's load).
async fn wait_for_sandbox_successes(app: &TestApp, n: u64) {
    wait_for_ledger_total(&app.http, &app.sandbox, "charges_succeeded", n).await;
}

#[tokio::test]
async fn a_visa_payment_succeeds_and_pays_the_order() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "p1",
            &json!({"order_id": order_id, "payment_method": "tok_visa"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let location = r.headers()["location"].to_str().expect("ascii").to_string();
    let payment = json_of(r).await;
    assert_eq!(
        location,
        format!("/payments/{}", payment["id"].as_str().expect("id"))
    );
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount"], 2800);
    assert_eq!(payment["currency"], "EUR");
    assert_eq!(payment["provider"], "sandbox");
    assert!(payment["provider_charge_id"]
        .as_str()
        .is_some_and(|c| c.starts_with("ch_")));
    assert!(
        payment.get("payment_method").is_none(),
        "the token is never shown"
    );
    assert_eq!(json_of(app.get(&location).await).await, payment);
    let order = json_of(app.get(&format!("/orders/{order_id}")).await).await;
    assert_eq!(order["status"], "paid");
    let list = json_of(app.get(&format!("/orders/{order_id}/payments")).await).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn a_decline_is_201_failed_and_leaves_the_order_payable() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, failed) = app.pay(&order_id, "tok_declined").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["failure_code"], "card_declined");
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "awaiting_payment"
    );
    let (status, ok) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(ok["status"], "succeeded");
    let list = json_of(app.get(&format!("/orders/{order_id}/payments")).await).await;
    assert_eq!(list.as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn a_paid_order_is_not_payable_and_a_pending_one_is_in_progress() {
    let app = spawn_app_with(Options::default().sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "5s")).await;
    let paid = app.create_order().await;
    app.pay(&paid, "tok_visa").await;
    let (status, problem) = app.pay(&paid, "tok_visa").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_not_payable"))
    );

    let pending = app.create_order().await;
    let (status, payment) = app.pay(&pending, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(payment["status"], "pending");
    let (status, problem) = app.pay(&pending, "tok_visa").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (StatusCode::CONFLICT, Some("payment_in_progress"))
    );
    assert_eq!(
        app.ledger().await["totals"]["charges"],
        2,
        "no second charge for the pending order"
    );
}

/// The order's live attempt as the store reads it
/// (`store::payments::LIVE_ATTEMPT`): its id and status.
async fn live_attempt(app: &TestApp, order_id: &str) -> Option<(String, &'static str)> {
    let order_id = uuid::Uuid::parse_str(order_id).expect("an order id");
    let mut conn = app.db.acquire().await.expect("a connection");
    oncepay::store::payments::live_attempt(&mut conn, order_id)
        .await
        .expect("the live attempt is read")
        .map(|p| (p.id.to_string(), p.status.as_str()))
}

/// "No live attempt", the one rule by which a payment's first step claims
/// its order and by which its locking path refuses it: an order with a
/// pending attempt is refused another, one whose attempt failed is paid,
/// and a paid one is not paid again.
#[tokio::test]
async fn an_order_is_paid_again_only_once_its_live_attempt_is_final() {
    // Long enough for the second payment to meet the first still pending.
    let app = spawn_app_with(Options::default().sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "3s")).await;
    let order_id = app.create_order().await;
    assert_eq!(live_attempt(&app, &order_id).await, None);

    let (status, first) = app.pay(&order_id, "tok_async_declined").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let first_id = first["id"].as_str().expect("id").to_string();
    assert_eq!(
        live_attempt(&app, &order_id).await,
        Some((first_id.clone(), "pending"))
    );

    let (status, problem) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (StatusCode::CONFLICT, Some("payment_in_progress"))
    );
    let attempts = format!("SELECT count(*) FROM payment_attempt WHERE order_id = '{order_id}'");
    assert_eq!(
        app.count(&attempts).await,
        1,
        "the refused payment made no attempt"
    );

    app.reconciled_to(&first["id"], "failed").await;
    assert_eq!(
        live_attempt(&app, &order_id).await,
        None,
        "a failed attempt is not live"
    );

    let (status, second) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(second["status"], "succeeded");
    let second_id = second["id"].as_str().expect("id").to_string();
    assert_eq!(
        live_attempt(&app, &order_id).await,
        Some((second_id, "succeeded"))
    );
    let (status, problem) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_not_payable"))
    );
    assert_eq!(app.count(&attempts).await, 2);
}

#[tokio::test]
async fn an_async_payment_succeeds_through_the_webhook_alone() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = payment["id"].as_str().expect("id");
    let settled = app
        .poll_until(&format!("/payments/{id}"), |p| p["status"] == "succeeded")
        .await;
    assert_eq!(settled["provider_charge_id"], payment["provider_charge_id"]);
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "paid"
    );
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_webhooks_total{outcome=\"processed\"}"));
}

#[tokio::test]
async fn an_async_payment_succeeds_through_the_reconciler_alone() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
            .serve("ONCEPAY_RECONCILE_AFTER", "100ms"),
    )
    .await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = payment["id"].as_str().expect("id").to_string();
    // The sandbox settles the charge after 300 ms; nothing tells us but the
    // reconciler asking.
    wait_for_sandbox_successes(&app, 1).await;
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "pending"
    );
    let pass = oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("pass");
    assert_eq!(pass.payments_settled, 1);
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "succeeded"
    );
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "paid"
    );
    assert_eq!(app.ledger().await["totals"]["webhooks_delivered"], 0);
}

#[tokio::test]
async fn a_lost_response_is_retried_with_the_same_key_and_charges_once() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    // The sandbox charges, then drops the connection; the provider client
    // repeats the call with the same key and gets the first charge back.
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+drop"});
    let r = app.post("/payments", "lost", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let payment = json_of(r).await;
    assert_eq!(payment["status"], "succeeded");
    let retry = app.post("/payments", "lost", &body).await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(retry).await, payment);
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["charges"], 1);
    assert_eq!(ledger["charges"][0]["charges"], 1);
    assert_eq!(ledger["charges"][0]["requests"], 2);
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 1);
}

#[tokio::test]
async fn when_every_answer_is_lost_the_payment_is_pending_then_settled_once() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
            .serve("ONCEPAY_RECONCILE_AFTER", "0s"),
    )
    .await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+drop=20"});
    let r = app.post("/payments", "lost", &body).await;
    // The outcome is unknown: never a failure, never a second charge.
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let pending = json_of(r).await;
    assert_eq!(pending["status"], "pending");
    let retry = app.post("/payments", "lost", &body).await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        json_of(retry).await,
        pending,
        "the retry answers consistently"
    );
    let (status, problem) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (StatusCode::CONFLICT, Some("payment_in_progress"))
    );
    oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("pass");
    let id = pending["id"].as_str().expect("id");
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "succeeded"
    );
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["charges"], 1);
    assert_eq!(ledger["charges"][0]["charges"], 1);
}

#[tokio::test]
async fn a_provider_error_before_charging_is_retried_safely() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_visa+error=2").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(payment["status"], "succeeded");
    let ledger = app.ledger().await;
    assert_eq!(ledger["charges"][0]["requests"], 3);
    assert_eq!(ledger["totals"]["charges"], 1);
}

#[tokio::test]
async fn a_storm_of_identical_payments_makes_one_attempt_and_one_charge() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa"});
    storm(&[&app.base], &app.key, "/payments", "pay-storm", &body, 100).await;
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 1);
    assert_eq!(app.ledger().await["totals"]["charges"], 1);
}

#[tokio::test]
async fn invalid_payment_requests_are_refused_before_execution() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let cases = [
        (
            json!({"order_id": "nope", "payment_method": "tok_visa"}),
            400,
            "order_id",
        ),
        (json!({"order_id": order_id}), 400, "payment_method"),
        (
            json!({"order_id": order_id, "payment_method": "card_4242"}),
            422,
            "payment_method",
        ),
        (
            json!({"order_id": order_id, "payment_method": "tok_visa", "amount": 5}),
            400,
            "amount",
        ),
    ];
    for (body, status, field) in cases {
        let r = app.post("/payments", "same-key", &body).await;
        assert_eq!(r.status().as_u16(), status, "{body}");
        assert_eq!(json_of(r).await["field"], field);
    }
    let r = app
        .post(
            "/payments",
            "same-key",
            &json!({"order_id": uuid::Uuid::now_v7(), "payment_method": "tok_visa"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "order_not_found");
    assert_eq!(app.ledger().await["totals"]["requests"], 0);
}

#[tokio::test]
async fn an_unknown_token_fails_cleanly() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_nonsense").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(payment["status"], "failed");
    assert_eq!(payment["failure_code"], "invalid_payment_method");
}

#[tokio::test]
async fn reconcilers_running_at_once_settle_each_payment_once() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
            .serve("ONCEPAY_RECONCILE_AFTER", "0s"),
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..30 {
        let order_id = app.create_order().await;
        let (status, payment) = app.pay(&order_id, "tok_async").await;
        assert_eq!(status, StatusCode::ACCEPTED);
        ids.push(payment["id"].as_str().expect("id").to_string());
    }
    wait_for_sandbox_successes(&app, 30).await;
    // Four passes at once, as four processes would run them.
    let passes = futures_join4(&app).await;
    let settled: u32 = passes.iter().map(|p| p.payments_settled).sum();
    assert_eq!(
        settled, 30,
        "every payment settled exactly once across the passes"
    );
    let metrics = app.ctx.metrics.render();
    assert!(
        metrics.contains(
            "oncepay_payment_transitions_total{cause=\"reconciler\",status=\"succeeded\"} 30"
        ),
        "{metrics}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'")
            .await,
        30
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'paid'")
            .await,
        30
    );
}

async fn futures_join4(app: &TestApp) -> Vec<oncepay::workers::reconciler::Pass> {
    let pass = || oncepay::workers::reconciler::pass(&app.ctx);
    let (a, b, c, d) = tokio::join!(pass(), pass(), pass(), pass());
    [a, b, c, d].into_iter().map(|p| p.expect("pass")).collect()
}

#[tokio::test]
async fn concurrent_payments_of_one_order_under_different_keys_charge_once() {
    // Ten clients pay the same order at once, each with its own key: one
    // attempt is made and charged; every other request is refused as in
    // progress (while the first is pending) or not payable (once paid),
    // and a repeat of any key answers what it answered first.
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+delay=100"});
    let keys: Vec<String> = (0..10).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, key) in keys.iter().enumerate() {
        let request = app
            .http
            .post(format!("{}/payments", app.base))
            .bearer_auth(&app.key)
            .header("Idempotency-Key", key)
            .json(&body);
        tasks.spawn(async move {
            let r = request.send().await.expect("sent");
            (i, r.status(), json_of(r).await)
        });
    }
    let mut answers = vec![(StatusCode::OK, serde_json::Value::Null); keys.len()];
    while let Some(done) = tasks.join_next().await {
        let (i, status, body) = done.expect("task");
        answers[i] = (status, body);
    }
    let created: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    assert_eq!(created[0].1["status"], "succeeded");
    for (status, body) in &answers {
        if *status != StatusCode::CREATED {
            assert_eq!(*status, StatusCode::CONFLICT, "{body}");
            assert!(
                matches!(
                    body["code"].as_str(),
                    Some("payment_in_progress" | "order_not_payable")
                ),
                "{body}"
            );
        }
    }
    assert_eq!(app.charges_for(&order_id).await.len(), 1);
    let attempts = app
        .count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE order_id = '{order_id}'"
        ))
        .await;
    assert_eq!(attempts, 1);
    let pending_events = app
        .count(&format!(
            "SELECT count(*) FROM event WHERE order_id = '{order_id}' AND type = 'payment.pending'"
        ))
        .await;
    assert_eq!(pending_events, 1);
    for (key, (status, answer)) in keys.iter().zip(&answers) {
        let again = app.post("/payments", key, &body).await;
        assert_eq!(again.status(), *status);
        assert_eq!(&json_of(again).await, answer);
    }
}

#[tokio::test]
async fn writes_that_share_a_statement_each_get_their_own_outcome() {
    // Payments of one kind taken together are rows of one statement. Each
    // row is checked as it would be alone: a paid order's row writes
    // nothing (409), a declined charge's settlement fails only its own
    // attempt, and every other payment is made once.
    let app = std::sync::Arc::new(spawn_app().await);
    let paid = app.create_order().await;
    let (status, _) = app.pay(&paid, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    let declined = app.create_order().await;
    let mut payable = Vec::new();
    for _ in 0..12 {
        payable.push(app.create_order().await);
    }
    let rows = &app.ctx.metrics.group_commit_rows;
    let (rows_before, statements_before) = (rows.get_sample_sum(), rows.get_sample_count());
    let held = hold_inserts(&app, "payment_attempt").await;
    let sent: Vec<(String, &str)> = payable
        .iter()
        .map(|o| (o.clone(), "tok_visa"))
        .chain([
            (paid.clone(), "tok_visa"),
            (declined.clone(), "tok_declined"),
        ])
        .collect();
    let mut requests = tokio::task::JoinSet::new();
    for (order, token) in sent.clone() {
        let app = app.clone();
        let token = token.to_string();
        requests.spawn(async move {
            let body = json!({"order_id": order, "payment_method": token});
            let key = format!("shared-{order}");
            let r = app.post("/payments", &key, &body).await;
            (order, r.status(), json_of(r).await)
        });
    }
    // Every payment's first write is queued or taken (the paid order's
    // claim may already have been answered: it inserts nothing).
    until_grouped(&app, sent.len() as f64 - 1.0).await;
    held.rollback().await.expect("release");
    let mut answers = std::collections::BTreeMap::new();
    while let Some(done) = requests.join_next().await {
        let (order, status, body) = done.expect("request");
        answers.insert(order, (status, body));
    }
    for order in &payable {
        let (status, body) = &answers[order];
        assert_eq!(*status, StatusCode::CREATED, "{body}");
        assert_eq!(body["status"], "succeeded", "{body}");
    }
    let (status, body) = &answers[&paid];
    assert_eq!(*status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "order_not_payable", "{body}");
    let (status, body) = &answers[&declined];
    assert_eq!(*status, StatusCode::CREATED, "{body}");
    assert_eq!(body["status"], "failed", "{body}");
    assert_eq!(body["failure_code"], "card_declined", "{body}");

    // The rows in the database: one attempt per payment, each order as
    // its own payment left it, one event per change.
    let count = |sql: String| {
        let app = app.clone();
        async move { app.count(&sql).await }
    };
    assert_eq!(
        count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'".into()).await,
        13
    );
    assert_eq!(
        count(format!(
            "SELECT count(*) FROM payment_attempt WHERE order_id = '{paid}'"
        ))
        .await,
        1
    );
    assert_eq!(
        count(format!(
            "SELECT count(*) FROM payment_attempt WHERE order_id = '{declined}' AND status = 'failed'"
        ))
        .await,
        1
    );
    assert_eq!(
        count(format!(
            "SELECT count(*) FROM orders WHERE id = '{declined}' AND status = 'awaiting_payment'"
        ))
        .await,
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM orders WHERE status = 'paid'".into()).await,
        13
    );
    assert_eq!(
        count("SELECT count(*) FROM event WHERE type = 'payment.pending'".into()).await,
        14
    );
    assert_eq!(
        count("SELECT count(*) FROM event WHERE type = 'payment.succeeded'".into()).await,
        13
    );
    assert_eq!(
        count("SELECT count(*) FROM event WHERE type = 'payment.failed'".into()).await,
        1
    );
    assert_eq!(
        count("SELECT count(*) FROM event WHERE type = 'order.paid'".into()).await,
        13
    );
    assert_eq!(
        count(
            "SELECT count(*) FROM idempotency_record
              WHERE command = 'create_payment' AND state = 'completed'"
                .into()
        )
        .await,
        15
    );
    // And they were made by statements of several rows.
    let (rows_made, statements) = (
        rows.get_sample_sum() - rows_before,
        rows.get_sample_count() - statements_before,
    );
    assert!(
        rows_made > statements as f64,
        "{rows_made} writes in {statements} statements: none shared one"
    );
}

/// Waits until `n` statements reached the group commit: queued, or taken
/// by a writer (and counted in the group-size histogram).
async fn until_grouped(app: &TestApp, n: f64) {
    let metrics = &app.ctx.metrics;
    oncepay_testkit::ready::until(std::time::Duration::from_secs(30), || async {
        metrics.group_commit_statements.get_sample_sum() + metrics.group_commit_queued.get() as f64
            >= n
    })
    .await
    .expect("every payment's first statement reached the group commit");
}

#[tokio::test]
async fn payments_that_arrive_together_share_a_commit_and_each_gets_its_own_answer() {
    let app = std::sync::Arc::new(spawn_app().await);
    let mut orders = Vec::new();
    for _ in 0..24 {
        orders.push(app.create_order().await);
    }
    let held = hold_inserts(&app, "payment_attempt").await;
    // 24 payments, the first four sent three times each with their key:
    // 32 requests at once.
    let sent: Vec<(String, String)> = orders
        .iter()
        .enumerate()
        .map(|(i, order)| (format!("together-{i}"), order.clone()))
        .chain(
            (0..4)
                .flat_map(|i| std::iter::repeat_n((format!("together-{i}"), orders[i].clone()), 2)),
        )
        .collect();
    let mut requests = tokio::task::JoinSet::new();
    for (key, order) in sent.clone() {
        let app = app.clone();
        requests.spawn(async move {
            let body = json!({"order_id": order, "payment_method": "tok_visa"});
            let r = app.post("/payments", &key, &body).await;
            (key, r.status(), json_of(r).await)
        });
    }
    until_grouped(&app, sent.len() as f64).await;
    // The lock stays held a known while after every statement queued, so
    // that each statement's time until its answer is at least that long.
    let queued_by = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held_for = queued_by.elapsed();
    held.rollback().await.expect("release");
    let mut answers: std::collections::BTreeMap<String, Vec<serde_json::Value>> =
        Default::default();
    while let Some(done) = requests.join_next().await {
        let (key, status, body) = done.expect("request");
        assert_eq!(status, StatusCode::CREATED, "{key}: {body}");
        assert_eq!(body["status"], "succeeded", "{key}: {body}");
        answers.entry(key).or_default().push(body);
    }
    assert_eq!(answers.len(), 24);
    for (key, bodies) in &answers {
        assert!(
            bodies.iter().all(|b| b == &bodies[0]),
            "{key}: every repeat got the first answer: {bodies:?}"
        );
    }
    // One charge and one succeeded attempt per order, every order paid.
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'")
            .await,
        24
    );
    assert_eq!(
        app.count("SELECT count(DISTINCT order_id) FROM payment_attempt")
            .await,
        24
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'paid'")
            .await,
        24
    );
    wait_for_sandbox_successes(&app, 24).await;
    assert_eq!(
        ledger(&app.http, &app.sandbox).await["totals"]["charges"],
        24
    );
    // The statements that queued behind the lock shared commits.
    let groups = &app.ctx.metrics.group_commit_statements;
    assert!(
        groups.get_sample_count() < groups.get_sample_sum() as u64,
        "{} commits for {} statements: none shared",
        groups.get_sample_count(),
        groups.get_sample_sum()
    );
    // An operator sees where a payment's time went: each of the 32
    // statements waited at least the lock's hold before its answer, and
    // its wait for a writer is a part of that time.
    let seconds = &app.ctx.metrics.group_commit_seconds;
    let answered = seconds.with_label_values(&["answered"]);
    let (answered_sum, answered_count) = (answered.get_sample_sum(), answered.get_sample_count());
    let taken = seconds.with_label_values(&["taken"]);
    assert!(answered_count >= 32 && taken.get_sample_count() >= 32);
    assert!(
        answered_sum >= 32.0 * held_for.as_secs_f64(),
        "{answered_sum:.3} s until answered for {answered_count} statements, each held {held_for:?}"
    );
    assert!(
        taken.get_sample_sum() < answered_sum,
        "taken {:.3} s, answered {answered_sum:.3} s",
        taken.get_sample_sum()
    );
}

#[tokio::test]
async fn a_statement_the_database_refuses_fails_only_its_own_payment_of_a_group() {
    let app = std::sync::Arc::new(spawn_app().await);
    // A fault no input can cause: the database refuses some keys.
    sqlx::query(
        "ALTER TABLE payment_attempt ADD CONSTRAINT no_poison CHECK (idempotency_key NOT LIKE 'poison-%')",
    )
    .execute(&app.db)
    .await
    .expect("constraint");
    let mut orders = Vec::new();
    for _ in 0..16 {
        orders.push(app.create_order().await);
    }
    let held = hold_inserts(&app, "payment_attempt").await;
    let mut requests = tokio::task::JoinSet::new();
    for (i, order) in orders.iter().enumerate() {
        let app = app.clone();
        let key = if i % 4 == 0 {
            format!("poison-{i}")
        } else {
            format!("fine-{i}")
        };
        let body = json!({"order_id": order, "payment_method": "tok_visa"});
        requests.spawn(async move {
            let r = app.post("/payments", &key, &body).await;
            (key, body, r.status())
        });
    }
    until_grouped(&app, 16.0).await;
    held.rollback().await.expect("release");
    let mut refused = Vec::new();
    while let Some(done) = requests.join_next().await {
        let (key, body, status) = done.expect("request");
        if key.starts_with("poison") {
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{key}");
            refused.push((key, body));
        } else {
            assert_eq!(status, StatusCode::CREATED, "{key}");
        }
    }
    assert_eq!(refused.len(), 4);
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 12);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record WHERE idempotency_key LIKE 'poison-%'")
            .await,
        0,
        "a refused statement left its key free"
    );
    wait_for_sandbox_successes(&app, 12).await;
    // Its key was free: once the database takes it, the retry pays.
    sqlx::query("ALTER TABLE payment_attempt DROP CONSTRAINT no_poison")
        .execute(&app.db)
        .await
        .expect("drop");
    for (key, body) in refused {
        let r = app.post("/payments", &key, &body).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{key}");
    }
    wait_for_sandbox_successes(&app, 16).await;
}

/// A group commit writer keeps its connection between payments; a
/// database restart or a failover cuts it. The payment that meets the cut
/// connection is answered `503` with `Retry-After` (nothing of it
/// written), the writer closes that connection instead of keeping it, and
/// the client's retry with the same key pays the order once. One writer,
/// so that every payment's statements meet the same connection.
#[tokio::test]
async fn a_writer_whose_connection_was_cut_takes_a_new_one_and_the_retry_pays_once() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_GROUP_COMMIT_WRITERS", "1")
            .serve("ONCEPAY_IDEMPOTENCY_LEASE", "1s"),
    )
    .await;
    let (first, second) = (app.create_order().await, app.create_order().await);
    let (status, _) = app.pay(&first, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    // Every connection of the service cut, as a restart of the database
    // does; the writer's among them.
    app.cut_service_connections().await;
    let body = json!({"order_id": second, "payment_method": "tok_visa"});
    let mut refused = 0;
    let paid = loop {
        let r = app.post("/payments", "after-the-cut", &body).await;
        let status = r.status();
        if status == StatusCode::CREATED {
            break json_of(r).await;
        }
        assert!(
            r.headers().contains_key("retry-after"),
            "{status} without Retry-After"
        );
        let problem = json_of(r).await;
        assert!(
            status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::CONFLICT,
            "{status}: {problem}"
        );
        refused += 1;
        // Each cut connection fails at most one request before it is
        // closed: the writer's, and the pool's few.
        assert!(
            refused <= 10,
            "still refused after {refused} tries: {problem}"
        );
        if status == StatusCode::CONFLICT {
            // Its key is held by a lease until it expires (1 s).
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert_eq!(app.charges_for(&second).await.len(), 1);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE order_id = '{second}'"
        ))
        .await,
        1
    );
    assert_eq!(app.status_of(&format!("/orders/{second}")).await, "paid");
}
