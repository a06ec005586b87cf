//! Authorize now, capture later: holds, captures (whole, partial, lost),
//! voids, expiry, and what the provider did, counted in the sandbox's
//! ledger and in our rows.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay_testkit::ready;

/// The order's amount (`order_body`).
const AMOUNT: i64 = 2800;

/// A service whose reconciler reads a capture whose answer was lost at
/// once, rather than after the default ten seconds.
fn options() -> Options {
    Options::default().serve("ONCEPAY_RECONCILE_AFTER", "100ms")
}

/// An order paid with `capture_method: manual`: `(order_id, payment)`.
async fn held(app: &TestApp, token: &str) -> (String, Value) {
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order_id, "payment_method": token, "capture_method": "manual"}),
        )
        .await;
    let status = r.status();
    let payment = json_of(r).await;
    assert_eq!(status, StatusCode::CREATED, "{payment}");
    (order_id, payment)
}

fn id_of(payment: &Value) -> String {
    payment["id"].as_str().expect("id").to_string()
}

async fn capture(app: &TestApp, payment_id: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let r = app
        .post(&format!("/payments/{payment_id}/capture"), key, &body)
        .await;
    let status = r.status();
    (status, json_of(r).await)
}

async fn void(app: &TestApp, payment_id: &str, key: &str) -> (StatusCode, Value) {
    let r = app
        .post(&format!("/payments/{payment_id}/void"), key, &json!({}))
        .await;
    let status = r.status();
    (status, json_of(r).await)
}

/// The sandbox's charge of `payment_id` (its key is the payment's id).
async fn sandbox_charge(app: &TestApp, payment_id: &str) -> Value {
    app.ledger().await["charges"]
        .as_array()
        .expect("charges")
        .iter()
        .find(|c| c["idempotency_key"] == payment_id)
        .cloned()
        .expect("the sandbox holds the charge")
}

/// The sandbox's captures of `charge_id`.
async fn sandbox_captures(app: &TestApp, charge_id: &Value) -> Vec<Value> {
    app.ledger().await["captures"]
        .as_array()
        .expect("captures")
        .iter()
        .filter(|c| &c["charge_id"] == charge_id)
        .cloned()
        .collect()
}

async fn event_count(app: &TestApp, object_id: &str, event_type: &str) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM event WHERE object_id = '{object_id}' AND type = '{event_type}'"
    ))
    .await
}

async fn order_status(app: &TestApp, order_id: &str) -> String {
    app.status_of(&format!("/orders/{order_id}")).await
}

#[tokio::test]
async fn a_manual_payment_is_held_then_captured_whole_once() {
    let app = spawn_app_with(options()).await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    assert_eq!(payment["status"], "requires_capture");
    assert_eq!(payment["capture_method"], "manual");
    assert_eq!(payment["amount_capturable"], AMOUNT);
    assert_eq!(payment["amount_captured"], 0);
    assert_eq!(payment["void_reason"], Value::Null);
    let deadline = chrono::DateTime::parse_from_rfc3339(
        payment["capture_before"].as_str().expect("capture_before"),
    )
    .expect("RFC 3339");
    let window = deadline.signed_duration_since(chrono::Utc::now());
    assert!(
        window > chrono::Duration::days(6) && window <= chrono::Duration::days(7),
        "the sandbox's default window is 7 days: {window}"
    );
    assert_eq!(order_status(&app, &order_id).await, "authorized");
    let charge = sandbox_charge(&app, &payment_id).await;
    assert_eq!(
        (
            charge["status"].as_str(),
            charge["amount_captured"].as_i64()
        ),
        (Some("authorized"), Some(0))
    );

    let (status, captured) = capture(&app, &payment_id, "cap-1", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{captured}");
    assert_eq!(captured["status"], "succeeded");
    assert_eq!(captured["amount_captured"], AMOUNT);
    assert_eq!(captured["amount_capturable"], 0);
    assert_eq!(captured["capture_before"], Value::Null);
    assert_eq!(order_status(&app, &order_id).await, "paid");

    // The repeat replays the answer, and captures nothing more.
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            "cap-1",
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(r).await, captured);

    let charge = sandbox_charge(&app, &payment_id).await;
    assert_eq!(
        (
            charge["status"].as_str(),
            charge["amount_captured"].as_i64()
        ),
        (Some("captured"), Some(AMOUNT))
    );
    let captures = sandbox_captures(&app, &charge["id"]).await;
    assert_eq!(captures.len(), 1, "{captures:?}");
    assert_eq!(captures[0]["amount"], AMOUNT);
    let rows = app
        .count(&format!(
            "SELECT count(*) FROM payment_capture WHERE payment_id = '{payment_id}' AND status = 'succeeded'"
        ))
        .await;
    assert_eq!(rows, 1);
    // The capture's own id was the provider's key, never the amount.
    let key: Uuid = sqlx::query_scalar("SELECT id FROM payment_capture WHERE payment_id = $1")
        .bind(Uuid::parse_str(&payment_id).expect("uuid"))
        .fetch_one(&app.db)
        .await
        .expect("capture row");
    assert_eq!(captures[0]["idempotency_key"], key.to_string());

    for (object, event) in [
        (payment_id.as_str(), "payment.requires_capture"),
        (payment_id.as_str(), "payment.succeeded"),
        (order_id.as_str(), "order.authorized"),
        (order_id.as_str(), "order.paid"),
    ] {
        assert_eq!(event_count(&app, object, event).await, 1, "{event}");
    }
}

#[tokio::test]
async fn a_partial_capture_releases_the_rest_and_caps_refunds() {
    let app = spawn_app_with(options()).await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let (status, captured) = capture(&app, &payment_id, "cap", json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::OK, "{captured}");
    assert_eq!(
        (
            captured["status"].as_str(),
            captured["amount_captured"].as_i64()
        ),
        (Some("succeeded"), Some(1000))
    );
    let charge = sandbox_charge(&app, &payment_id).await;
    assert_eq!(charge["amount_captured"], 1000);

    let refunds = format!("/payments/{payment_id}/refunds");
    let r = app.post(&refunds, "r1", &json!({"amount": 1001})).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["code"], "refund_exceeds_payment");
    let r = app.post(&refunds, "r2", &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        json_of(r).await["amount"],
        1000,
        "the rest is what was captured"
    );
    assert_eq!(order_status(&app, &order_id).await, "refunded");
}

#[tokio::test]
async fn every_capture_error_is_a_problem_kept_and_replayed() {
    let app = spawn_app_with(options()).await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);

    let (status, problem) = capture(&app, &payment_id, "zero", json!({"amount": 0})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        (problem["code"].as_str(), problem["field"].as_str()),
        (Some("validation_failed"), Some("amount"))
    );
    let (status, problem) = capture(&app, &payment_id, "huge", json!({"amount": AMOUNT + 1})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["code"], "amount_exceeds_capturable");
    assert_eq!(problem["field"], "amount");
    assert_eq!(problem["amount_capturable"], AMOUNT);
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            "huge",
            &json!({"amount": AMOUNT + 1}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let (status, problem) = capture(&app, &payment_id, "shape", json!({"amount": "all"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    let (status, _) = capture(&app, &Uuid::new_v4().to_string(), "nobody", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let r = app
        .post_raw(
            &format!("/payments/{payment_id}/capture"),
            None,
            Some(&app.key),
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "the key is required");

    // An automatic payment was captured at once: nothing to capture or void.
    let order_id = app.create_order().await;
    let (_, automatic) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(automatic["capture_method"], "automatic");
    assert_eq!(automatic["amount_captured"], AMOUNT);
    let (status, problem) = capture(&app, &id_of(&automatic), "auto", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_capturable");
    assert_eq!(problem["payment_status"], "succeeded");
    assert!(problem["detail"]
        .as_str()
        .expect("detail")
        .contains("succeeded"));
    let (status, problem) = void(&app, &id_of(&automatic), "auto-void").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_voidable");

    // Captured once: a second capture (another key) and a void are refused.
    let (status, first) = capture(&app, &payment_id, "first", json!({"amount": 5})).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, problem) = capture(&app, &payment_id, "second", json!({"amount": 5})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_capturable");
    let (status, problem) = void(&app, &payment_id, "late-void").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_voidable");
    let charge = sandbox_charge(&app, &payment_id).await;
    assert_eq!(sandbox_captures(&app, &charge["id"]).await.len(), 1);
}

#[tokio::test]
async fn a_void_releases_the_hold_and_the_order_is_payable_again() {
    let app = spawn_app_with(options()).await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let (status, voided) = void(&app, &payment_id, "v1").await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    assert_eq!(voided["status"], "voided");
    assert_eq!(voided["void_reason"], "requested");
    assert_eq!(voided["amount_capturable"], 0);
    assert_eq!(voided["capture_before"], Value::Null);
    let r = app
        .post(&format!("/payments/{payment_id}/void"), "v1", &json!({}))
        .await;
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(r).await, voided);
    assert_eq!(order_status(&app, &order_id).await, "awaiting_payment");
    assert_eq!(sandbox_charge(&app, &payment_id).await["status"], "voided");

    let (status, problem) = void(&app, &payment_id, "v2").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_voidable");
    let (status, problem) = capture(&app, &payment_id, "after-void", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_capturable");
    assert_eq!(problem["payment_status"], "voided");
    let charge = sandbox_charge(&app, &payment_id).await;
    assert!(sandbox_captures(&app, &charge["id"]).await.is_empty());
    assert_eq!(event_count(&app, &payment_id, "payment.voided").await, 1);

    let (status, again) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again["status"], "succeeded");
}

#[tokio::test]
async fn cancelling_an_authorized_order_voids_its_hold() {
    let app = spawn_app_with(options()).await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let r = app
        .post(&format!("/orders/{order_id}/cancel"), "c1", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["status"], "cancelled");
    let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("order_cancelled"))
    );
    assert_eq!(sandbox_charge(&app, &payment_id).await["status"], "voided");
    assert_eq!(
        app.count("SELECT count(*) FROM refund").await,
        0,
        "a hold is voided, never refunded"
    );
    assert_eq!(event_count(&app, &order_id, "order.cancelled").await, 1);
}

/// A service whose sandbox holds authorizations for `window`.
async fn with_window(window: &str) -> TestApp {
    spawn_app_with(options().sandbox("ONCEPAY_SANDBOX_CAPTURE_WINDOW", window)).await
}

/// Waits until `payment`'s `capture_before` has passed.
async fn past_deadline(payment: &Value) {
    let deadline = chrono::DateTime::parse_from_rfc3339(
        payment["capture_before"].as_str().expect("capture_before"),
    )
    .expect("RFC 3339");
    let passed = ready::until(Duration::from_secs(10), || async {
        chrono::Utc::now() > deadline
    })
    .await;
    assert!(passed.is_ok(), "the deadline never passed");
}

#[tokio::test]
async fn an_expired_hold_is_refused_then_voided_by_the_sweeper() {
    // Webhooks off: the sweeper alone ends the hold.
    let app = spawn_app_with(
        options()
            .sandbox("ONCEPAY_SANDBOX_CAPTURE_WINDOW", "1s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    past_deadline(&payment).await;
    let (status, problem) = capture(&app, &payment_id, "late", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "authorization_expired");

    // The sweeper's passes void it: a pass whose void answer is late (a
    // loaded machine) leaves it for the next look, as the deployed
    // sweeper does, so passes run until one has voided it, each within
    // the hold's next look. One void at the provider either way.
    let voided = std::cell::Cell::new(0);
    let (ctx, count) = (&app.ctx, &voided);
    let ended = ready::until(Duration::from_secs(20), || async move {
        let holds = oncepay::workers::sweeper::authorizations(ctx)
            .await
            .expect("sweep");
        count.set(count.get() + holds.voided);
        count.get() > 0
    })
    .await;
    assert!(ended.is_ok(), "no pass voided the hold");
    assert_eq!(voided.get(), 1);
    let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired"))
    );
    assert_eq!(order_status(&app, &order_id).await, "awaiting_payment");
    assert_eq!(sandbox_charge(&app, &payment_id).await["status"], "expired");
    let again = oncepay::workers::sweeper::authorizations(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(again.voided, 0, "once");
    assert_eq!(event_count(&app, &payment_id, "payment.voided").await, 1);
    let (status, problem) = capture(&app, &payment_id, "later", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_capturable");
}

/// A hold that begins after the payment's answer — an asynchronous charge
/// settling, a customer approving at the bank — is authorized, dated and
/// expires like one held at once. (The sandbox once deadlocked there: it
/// scheduled the expiry while holding its own books.)
#[tokio::test]
async fn a_hold_that_begins_later_is_authorized_then_expires() {
    let app = with_window("2s").await;
    let mut payments = Vec::new();
    for token in ["tok_async", "tok_3ds"] {
        let order_id = app.create_order().await;
        let r = app
            .post(
                "/payments",
                &Uuid::new_v4().to_string(),
                &json!({"order_id": order_id, "payment_method": token, "capture_method": "manual"}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED, "{token}");
        let payment = json_of(r).await;
        assert_eq!(payment["status"], "pending", "{payment}");
        payments.push((order_id, payment));
    }
    let url = payments[1].1["next_action"]["url"]
        .as_str()
        .expect("the bank's page")
        .to_string();
    let approved = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{url}/approve"))
        .send()
        .await
        .expect("the sandbox answers the bank's page");
    assert!(
        approved.status().is_success() || approved.status().is_redirection(),
        "{}",
        approved.status()
    );
    for (order_id, payment) in &payments {
        let payment_id = id_of(payment);
        let voided = app
            .poll_until(&format!("/payments/{payment_id}"), |p| {
                p["status"] == "voided"
            })
            .await;
        assert_eq!(voided["void_reason"], "expired");
        // Held first (the window is short: the hold is read from its events).
        assert_eq!(
            event_count(&app, &payment_id, "payment.requires_capture").await,
            1
        );
        let charge = sandbox_charge(&app, &payment_id).await;
        assert_eq!(charge["status"], "expired", "{charge}");
        assert!(charge["capture_before"].is_i64(), "{charge}");
        assert_eq!(order_status(&app, order_id).await, "awaiting_payment");
    }
}

#[tokio::test]
async fn the_providers_expiry_event_voids_the_hold() {
    let app = with_window("1s").await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let p = app
        .poll_until(&format!("/payments/{payment_id}"), |p| {
            p["status"] == "voided"
        })
        .await;
    assert_eq!(p["void_reason"], "expired");
    assert_eq!(order_status(&app, &order_id).await, "awaiting_payment");
}

#[tokio::test]
async fn a_capture_the_provider_refuses_as_expired_voids_the_payment() {
    let app = spawn_app_with(
        options()
            .sandbox("ONCEPAY_SANDBOX_CAPTURE_WINDOW", "1s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    past_deadline(&payment).await;
    // Our clock (the deadline as we hold it) still allows the capture: the
    // provider's answer decides.
    sqlx::query(
        "UPDATE payment_attempt SET capture_before = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(Uuid::parse_str(&payment_id).expect("uuid"))
    .execute(&app.db)
    .await
    .expect("skew");
    let (status, problem) = capture(&app, &payment_id, "racing", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["code"], "authorization_expired");
    let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired"))
    );
    let charge = sandbox_charge(&app, &payment_id).await;
    assert!(sandbox_captures(&app, &charge["id"]).await.is_empty());
    let failed = app
        .count("SELECT count(*) FROM payment_capture WHERE status = 'failed'")
        .await;
    assert_eq!(failed, 1, "the capture row records the refusal");
}

#[tokio::test]
async fn a_capture_whose_answer_is_lost_is_202_then_settled_without_capturing_twice() {
    // Webhooks off: the reconciler alone learns what happened.
    let app = spawn_app_with(options().sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")).await;
    // `+drop=20`: the first twenty answers to each call of this card are
    // lost (the charge's, then the capture's, retries included); the
    // effect is made.
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "pay",
            &json!({"order_id": order_id, "payment_method": "tok_visa+drop=20", "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let payment = json_of(r).await;
    let payment = app.reconciled_to(&payment["id"], "requires_capture").await;
    let payment_id = id_of(&payment);

    let (status, pending) = capture(&app, &payment_id, "cap", json!({"amount": 700})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "requires_capture");
    assert_eq!(pending["amount_captured"], 0);
    let (status, problem) = capture(&app, &payment_id, "other", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "one capture per payment");
    assert_eq!(problem["code"], "payment_not_capturable");
    let charge = sandbox_charge(&app, &payment_id).await;
    let sent = sandbox_captures(&app, &charge["id"]).await[0]["requests"].clone();

    let settled = app.reconciled_to(&payment["id"], "succeeded").await;
    assert_eq!(settled["amount_captured"], 700);
    assert_eq!(order_status(&app, &order_id).await, "paid");
    let captures = sandbox_captures(&app, &charge["id"]).await;
    assert_eq!(captures.len(), 1);
    assert_eq!(
        captures[0]["requests"], sent,
        "the provider was read first: the capture was not sent again"
    );
    assert_eq!(event_count(&app, &payment_id, "payment.succeeded").await, 1);
}

#[tokio::test]
async fn a_capture_resumed_after_a_crash_reads_the_provider_then_sends_once() {
    let app = spawn_app_with(options()).await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let (status, _) = capture(&app, &payment_id, "crashy", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    // As if the process died after the capture row was recorded and
    // before it was settled: the same capture, read from the provider.
    sqlx::query(
        "UPDATE idempotency_record
            SET state = 'executing', recovery_point = 'capture_created', lease_token = gen_random_uuid(),
                lease_expires_at = now() - interval '1 second', response_status = NULL,
                response_body = NULL, response_location = NULL
          WHERE idempotency_key = 'crashy'",
    )
    .execute(&app.db)
    .await
    .expect("crash");
    let pass = oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("pass");
    assert_eq!(pass.resumed, 1);
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            "crashy",
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["status"], "succeeded");
    let charge = sandbox_charge(&app, &payment_id).await;
    let captures = sandbox_captures(&app, &charge["id"]).await;
    assert_eq!(captures.len(), 1);
    assert_eq!(captures[0]["requests"], 1);
}

/// Fires `captures` captures and `voids` voids at one hold at once; returns
/// how many of each were answered `200`.
async fn storm_hold(
    app: &TestApp,
    payment_id: &str,
    captures: usize,
    voids: usize,
) -> (usize, usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..captures + voids {
        let (http, key) = (app.http.clone(), app.key.clone());
        let idem = format!("storm-{payment_id}-{i}");
        let is_capture = i < captures;
        let url = format!(
            "{}/payments/{payment_id}/{}",
            app.base,
            if is_capture { "capture" } else { "void" }
        );
        tasks.spawn(async move {
            let body = if is_capture {
                json!({"amount": 100 + i as i64})
            } else {
                json!({})
            };
            let r = http
                .post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", idem)
                .json(&body)
                .send()
                .await
                .expect("sent");
            (
                is_capture,
                r.status(),
                r.json::<Value>().await.expect("json"),
            )
        });
    }
    let (mut captured, mut voided) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (is_capture, status, body) = done.expect("task");
        match (is_capture, status) {
            (true, StatusCode::OK) => captured += 1,
            (false, StatusCode::OK) => voided += 1,
            (true, StatusCode::CONFLICT) => {
                assert_eq!(body["code"], "payment_not_capturable", "{body}")
            }
            (false, StatusCode::CONFLICT) => {
                assert_eq!(body["code"], "payment_not_voidable", "{body}")
            }
            other => panic!("unexpected {other:?}: {body}"),
        }
    }
    (captured, voided)
}

/// Exactly one outcome of a hold, the same in our rows and at the provider.
async fn one_outcome(app: &TestApp, payment_id: &str) -> String {
    let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    let charge = sandbox_charge(app, payment_id).await;
    let provider_captures = sandbox_captures(app, &charge["id"]).await.len();
    let rows = app
        .count(&format!(
            "SELECT count(*) FROM payment_capture WHERE payment_id = '{payment_id}' AND status <> 'failed'"
        ))
        .await;
    let status = p["status"].as_str().expect("status").to_string();
    match status.as_str() {
        "succeeded" => {
            assert_eq!((provider_captures, rows), (1, 1), "{p}");
            assert_eq!(charge["status"], "captured");
            assert_eq!(charge["amount_captured"], p["amount_captured"]);
        }
        "voided" => {
            assert_eq!((provider_captures, rows), (0, 0), "{p}");
            assert!(matches!(
                charge["status"].as_str(),
                Some("voided" | "expired")
            ));
        }
        other => panic!("a hold ended {other}: {p}"),
    }
    status
}

#[tokio::test]
async fn concurrent_captures_with_different_keys_capture_once() {
    let app = spawn_app_with(options()).await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let (captured, voided) = storm_hold(&app, &payment_id, 16, 0).await;
    assert_eq!((captured, voided), (1, 0));
    assert_eq!(one_outcome(&app, &payment_id).await, "succeeded");
    let rows = app.count("SELECT count(*) FROM payment_capture").await;
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn concurrent_captures_and_voids_on_one_hold_have_one_outcome() {
    let app = spawn_app_with(options()).await;
    for _ in 0..3 {
        let (_, payment) = held(&app, "tok_visa").await;
        let payment_id = id_of(&payment);
        let (captured, voided) = storm_hold(&app, &payment_id, 8, 8).await;
        assert_eq!(captured + voided, 1, "captured {captured}, voided {voided}");
        let outcome = one_outcome(&app, &payment_id).await;
        assert_eq!(outcome == "succeeded", captured == 1);
    }
}

#[tokio::test]
async fn a_capture_racing_the_expiry_sweep_has_one_outcome() {
    let app = spawn_app_with(
        options()
            .sandbox("ONCEPAY_SANDBOX_CAPTURE_WINDOW", "2s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let deadline = chrono::DateTime::parse_from_rfc3339(
        payment["capture_before"].as_str().expect("capture_before"),
    )
    .expect("RFC 3339");
    // Captures and sweeps from just before the deadline to just after it.
    let near = ready::until(Duration::from_secs(10), || async {
        chrono::Utc::now() + chrono::Duration::milliseconds(150) >= deadline
    })
    .await;
    assert!(near.is_ok());
    let sweeps = {
        let ctx = app.ctx.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                oncepay::workers::sweeper::authorizations(&ctx).await.ok();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..6 {
        let (http, key) = (app.http.clone(), app.key.clone());
        let url = format!("{}/payments/{payment_id}/capture", app.base);
        tasks.spawn(async move {
            http.post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", format!("race-{i}"))
                .json(&json!({}))
                .send()
                .await
                .expect("sent")
                .status()
        });
    }
    let mut ok = 0;
    while let Some(status) = tasks.join_next().await {
        match status.expect("task") {
            StatusCode::OK => ok += 1,
            StatusCode::CONFLICT | StatusCode::ACCEPTED => {}
            other => panic!("unexpected {other}"),
        }
    }
    sweeps.await.expect("sweeps");
    // Whatever is still open ends: the sweeper voids the hold, the
    // reconciler settles a capture left unknown.
    let final_status = ready::until_some(Duration::from_secs(20), || async {
        oncepay::workers::sweeper::authorizations(&app.ctx)
            .await
            .ok();
        oncepay::workers::reconciler::pass(&app.ctx).await.ok();
        let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
        matches!(p["status"].as_str(), Some("succeeded" | "voided")).then_some(p)
    })
    .await
    .expect("the hold ends");
    assert!(ok <= 1);
    let outcome = one_outcome(&app, &payment_id).await;
    assert_eq!(outcome, final_status["status"].as_str().expect("status"));
}

#[tokio::test]
async fn the_deadline_reminder_is_written_once() {
    let app = spawn_app_with(options().serve("ONCEPAY_CAPTURE_REMINDER", "8d")).await;
    let (_, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let first = oncepay::workers::sweeper::authorizations(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(first.reminded, 1);
    let second = oncepay::workers::sweeper::authorizations(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(second.reminded, 0);
    assert_eq!(
        event_count(&app, &payment_id, "payment.capture_deadline_approaching").await,
        1
    );
}

#[tokio::test]
async fn a_checkout_page_can_authorize_only() {
    let app = spawn_app_with(options()).await;
    let order_id = app.create_order().await;
    let r = app
        .post(
            &format!("/orders/{order_id}/checkout"),
            &Uuid::new_v4().to_string(),
            &json!({"capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let session = json_of(r).await;
    assert_eq!(session["capture_method"], "manual");
    let url = session["url"].as_str().expect("url").to_string();
    let page = app
        .http
        .get(&url)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(
        page.contains("id=\"authorize-note\""),
        "the page says it only authorizes"
    );
    assert!(page.contains("data-capture=\"manual\""));
    let r = app.pay_on_page(&url, "page-key", "tok_visa").await;
    let paid = json_of(r).await;
    assert_eq!(paid["status"], "requires_capture", "{paid}");
    assert_eq!(order_status(&app, &order_id).await, "authorized");
    let page = app
        .http
        .get(&url)
        .send()
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(
        page.contains("data-initial=\"authorized\""),
        "a held order's page shows it authorized, not paid"
    );
}

#[tokio::test]
async fn capture_method_is_checked_and_part_of_the_fingerprint() {
    let app = spawn_app_with(options()).await;
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "k",
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "later"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["field"], "capture_method");
    let r = app
        .post(
            "/payments",
            "k2",
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app
        .post(
            "/payments",
            "k2",
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "automatic"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "idempotency_key_reused");
    // A held order takes no second payment.
    let (status, problem) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "order_not_payable");
}

#[tokio::test]
async fn a_void_whose_answer_is_lost_blocks_captures_and_is_asked_again_by_the_sweeper() {
    let app = spawn_app_with(options().sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")).await;
    // `+drop=5`: the first five answers to each call of this card are lost
    // (the charge's, then the void's); the effect is made.
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "pay",
            &json!({"order_id": order_id, "payment_method": "tok_visa+drop=5", "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let payment = json_of(r).await;
    let payment = app.reconciled_to(&payment["id"], "requires_capture").await;
    let payment_id = id_of(&payment);

    let (status, pending) = void(&app, &payment_id, "v").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "requires_capture");
    let (status, problem) = capture(&app, &payment_id, "too-late", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a void is under way");
    assert_eq!(problem["code"], "payment_not_capturable");

    let voided = ready::until_some(Duration::from_secs(20), || async {
        oncepay::workers::sweeper::authorizations(&app.ctx)
            .await
            .ok();
        let p = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
        (p["status"] == "voided").then_some(p)
    })
    .await
    .expect("the sweeper asks again until the provider answers");
    assert_eq!(voided["void_reason"], "requested");
    assert_eq!(order_status(&app, &order_id).await, "awaiting_payment");
    let charge = sandbox_charge(&app, &payment_id).await;
    assert_eq!(charge["status"], "voided");
    assert!(sandbox_captures(&app, &charge["id"]).await.is_empty());
    assert_eq!(event_count(&app, &payment_id, "payment.voided").await, 1);
}

/// A capture answered as refused while the provider captured the charge
/// all the same (the refusal replaced on its way, or the request reaching
/// the provider after the read that confirmed the refusal: `make chaos`
/// saw it): the refusal's confirming read, later, finds the charge
/// captured and settles it; the refused capture becomes the one made, and
/// no second capture is sent. Webhooks off: the read alone tells.
#[tokio::test]
async fn a_refused_capture_the_provider_made_after_all_is_settled_by_its_confirming_read() {
    refused_capture_made_after_all(false).await;
}

/// The same, told by the provider's webhook before the confirming read:
/// the capture settles, and nothing is left for the read to do.
#[tokio::test]
async fn a_refused_capture_the_provider_made_after_all_is_settled_by_its_webhook() {
    refused_capture_made_after_all(true).await;
}

async fn refused_capture_made_after_all(webhooks: bool) {
    let app = spawn_app_with(options().sandbox(
        "ONCEPAY_SANDBOX_WEBHOOKS",
        if webhooks { "on" } else { "off" },
    ))
    .await;
    let (order_id, payment) = held(&app, "tok_visa").await;
    let payment_id = id_of(&payment);
    let charge = payment["provider_charge_id"].as_str().expect("charge id");
    let r = app
        .http
        .post(format!(
            "{}/v1/charges/{charge}/refuse_capture",
            app.sandbox
        ))
        .json(&json!({"code": "card_declined"}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(r.status(), StatusCode::OK);
    let (status, problem) = capture(&app, &payment_id, "refused", json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{problem}");
    // The provider captures it after all (as a late request would).
    let r = app
        .http
        .post(format!("{}/v1/charges/{charge}/capture", app.sandbox))
        .header("Idempotency-Key", format!("late-{payment_id}"))
        .json(&json!({"amount": 1000}))
        .send()
        .await
        .expect("the sandbox answers");
    assert!(r.status().is_success(), "{}", r.status());
    let settled = match webhooks {
        true => {
            app.poll_until(&format!("/payments/{payment_id}"), |p| {
                p["status"] == "succeeded"
            })
            .await
        }
        false => app.reconciled_to(&payment["id"], "succeeded").await,
    };
    assert_eq!(settled["amount_captured"], 1000, "{settled}");
    assert_eq!(
        app.count("SELECT count(*) FROM payment_capture WHERE decline_check_at IS NOT NULL")
            .await,
        0,
        "no confirming read left waiting"
    );
    assert_eq!(order_status(&app, &order_id).await, "paid");
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT status, failure_code FROM payment_capture WHERE payment_id = $1::uuid",
    )
    .bind(&payment_id)
    .fetch_all(&app.db)
    .await
    .expect("capture rows");
    assert_eq!(rows, vec![("succeeded".to_string(), None)]);
    assert_eq!(
        sandbox_captures(&app, &sandbox_charge(&app, &payment_id).await["id"])
            .await
            .len(),
        1,
        "one capture at the provider"
    );
}
