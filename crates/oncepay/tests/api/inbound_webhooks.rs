//! Inbound webhooks (contract section 5): signed per Standard Webhooks,
//! deduplicated, forward-only.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use oncepay::standard_webhooks::WebhookSecret;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn charge_event(event_id: &str, payment: &Value, status: &str) -> Value {
    json!({
        "id": event_id,
        "type": format!("charge.{status}"),
        "created": now(),
        "data": {"object": {
            "id": payment["provider_charge_id"],
            "object": "charge",
            "idempotency_key": payment["id"],
            "status": status,
            "amount": payment["amount"],
        }}
    })
}

/// A pending payment whose webhooks the sandbox does not send (the test does).
async fn pending_payment(app: &TestApp) -> Value {
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    payment
}

fn quiet_sandbox() -> Options {
    Options::default()
        .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
        .sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "1h")
}

/// A sandbox that sends no webhook (the test does) and settles `tok_async`
/// charges at once, so that the provider confirms the test's events.
fn settling_quiet_sandbox() -> Options {
    Options::default()
        .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
        .sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "100ms")
}

/// A pending payment whose charge the sandbox has settled (no webhook sent).
async fn settled_at_provider(app: &TestApp) -> Value {
    let payment = pending_payment(app).await;
    wait_for_charge_status(app, payment["id"].as_str().expect("id"), "succeeded").await;
    payment
}

#[tokio::test]
async fn bad_missing_and_stale_signatures_are_401_and_change_nothing() {
    let app = spawn_app_with(quiet_sandbox()).await;
    let payment = pending_payment(&app).await;
    let event = charge_event("evt_1", &payment, "succeeded");
    let body = event.to_string();
    let other_secret = WebhookSecret::parse("whsec_c29tZS1vdGhlci1zZWNyZXQta2V5").expect("secret");
    let stale = now() - 301;
    let cases = [
        (None, now()),
        (Some("v1,AAAA".to_string()), now()),
        (
            Some(other_secret.sign("evt_1", now(), body.as_bytes())),
            now(),
        ),
        (
            Some(WebhookSecret::dev().sign("evt_1", stale, body.as_bytes())),
            stale,
        ),
        (
            Some(WebhookSecret::dev().sign("evt_1", now(), b"{\"other\":1}")),
            now(),
        ),
    ];
    for (i, (signature, ts)) in cases.into_iter().enumerate() {
        let r = post_webhook(&app, &event, signature, ts).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "case {i}");
        assert_eq!(json_of(r).await["code"], "webhook_signature_invalid");
    }
    assert_eq!(app.count("SELECT count(*) FROM webhook_event").await, 0);
    let id = payment["id"].as_str().expect("id");
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "pending"
    );
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_webhooks_total{outcome=\"bad_signature\"} 5"));
}

#[tokio::test]
async fn the_same_event_ten_times_changes_state_once() {
    let app = spawn_app_with(settling_quiet_sandbox()).await;
    let payment = settled_at_provider(&app).await;
    let event = charge_event("evt_dup", &payment, "succeeded");
    for _ in 0..10 {
        assert_eq!(
            post_signed_webhook(&app, &event).await.status(),
            StatusCode::OK
        );
    }
    let id = payment["id"].as_str().expect("id");
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "succeeded"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_event").await, 1);
    let metrics = app.ctx.metrics.render();
    assert!(
        metrics.contains("oncepay_webhooks_total{outcome=\"processed\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("oncepay_webhooks_total{outcome=\"duplicate\"} 9"));
    assert!(metrics
        .contains("oncepay_payment_transitions_total{cause=\"webhook\",status=\"succeeded\"} 1"));
}

#[tokio::test]
async fn a_late_pending_after_succeeded_is_recorded_and_ignored() {
    let app = spawn_app_with(settling_quiet_sandbox()).await;
    let payment = settled_at_provider(&app).await;
    post_signed_webhook(&app, &charge_event("evt_a", &payment, "succeeded")).await;
    let r = post_signed_webhook(&app, &charge_event("evt_b", &payment, "pending")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["outcome"], "ignored");
    let r = post_signed_webhook(&app, &charge_event("evt_c", &payment, "failed")).await;
    assert_eq!(json_of(r).await["outcome"], "ignored");
    let id = payment["id"].as_str().expect("id");
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "succeeded"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE outcome = 'ignored'")
            .await,
        2
    );
}

#[tokio::test]
async fn an_event_for_an_unknown_charge_is_stored_and_answered_200() {
    let app = spawn_app().await;
    let stranger =
        json!({"id": uuid::Uuid::now_v7(), "provider_charge_id": "ch_unknown", "amount": 5});
    let r = post_signed_webhook(&app, &charge_event("evt_u", &stranger, "succeeded")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["outcome"], "unknown_charge");
    let kept = app
        .count("SELECT count(*) FROM webhook_event WHERE event_id = 'evt_u' AND payload->'data'->'object'->>'id' = 'ch_unknown'")
        .await;
    assert_eq!(kept, 1);
}

#[tokio::test]
async fn duplicated_and_reordered_sandbox_webhooks_end_in_the_right_state() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async+dup+reorder").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = payment["id"].as_str().expect("id");
    app.poll_until(&format!("/payments/{id}"), |p| p["status"] == "succeeded")
        .await;
    // Wait until the late `pending` copies have arrived too (6 deliveries).
    wait_for_ledger_total(&app.http, &app.sandbox, "webhooks_delivered", 6).await;
    assert_eq!(
        json_of(app.get(&format!("/payments/{id}")).await).await["status"],
        "succeeded"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_event").await, 2);
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "paid"
    );
}

#[tokio::test]
async fn a_signed_event_of_an_unknown_shape_is_kept_not_refused() {
    let app = spawn_app().await;
    let event = json!({"id": "evt_odd", "kind": "something.else", "payload": [1, 2]});
    let r = post_signed_webhook(&app, &event).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["outcome"], "ignored");
    let kept = app
        .count("SELECT count(*) FROM webhook_event WHERE event_id = 'evt_odd' AND payload->>'kind' = 'something.else'")
        .await;
    assert_eq!(kept, 1);
}

/// The causes of the events of one object, in sequence order.
async fn event_causes(app: &TestApp, object_id: &str, event_type: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT cause FROM event WHERE object_id = $1::uuid AND type = $2 ORDER BY sequence",
    )
    .bind(object_id)
    .bind(event_type)
    .fetch_all(&app.db)
    .await
    .expect("events")
}

#[tokio::test]
async fn a_webhook_that_overtakes_its_command_waits_for_it_and_needs_no_confirmation_read() {
    // The sandbox charges, sends `charge.succeeded` at once, and answers
    // the charge 400 ms later: the webhook arrives while the command is
    // still executing, and waits for it (up to the configured 30 s).
    let app = spawn_app_with(Options::default().serve("ONCEPAY_WEBHOOK_COMMAND_WAIT", "30s")).await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_visa+delay=400").await;
    assert_eq!(status, StatusCode::CREATED, "{payment}");
    assert_eq!(payment["status"], "succeeded");
    wait_for_ledger_total(&app.http, &app.sandbox, "webhooks_delivered", 1).await;
    let id = payment["id"].as_str().expect("id");

    // The command settled it with the provider's answer to its call; the
    // webhook then changed nothing, so it needed no provider read.
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE outcome = 'processed' AND confirmed_at IS NULL")
            .await,
        1
    );
    assert_eq!(
        event_causes(&app, id, "payment.succeeded").await,
        ["request"]
    );
    assert_eq!(
        event_causes(&app, &order_id, "order.paid").await,
        ["request"]
    );
    assert_eq!(app.charges_for(&order_id).await.len(), 1);
    assert_events_show_the_payment_as_stored(&app, id).await;
}

/// A payment's two events carry the payment as GET shows it: as created
/// (pending), then as settled.
async fn assert_events_show_the_payment_as_stored(app: &TestApp, id: &str) {
    let stored = json_of(app.get(&format!("/payments/{id}")).await).await;
    let r = app.get(&format!("/payments/{id}/events")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let trail = json_of(r).await;
    let objects: Vec<&Value> = trail["data"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| &e["data"]["object"])
        .collect();
    let mut created = stored.clone();
    created["status"] = json!("pending");
    created["provider_charge_id"] = Value::Null;
    created["amount_captured"] = json!(0);
    created["updated_at"] = stored["created_at"].clone();
    assert_eq!(objects, [&created, &stored]);
}

#[tokio::test]
async fn a_webhook_that_settles_first_leaves_the_command_one_answer_and_one_set_of_events() {
    // The webhook waits only 50 ms for the command, whose charge is
    // answered after 2.5 s: the webhook confirms with the provider and
    // settles the payment first. The command's one-statement settlement
    // then finds the attempt moved, writes nothing, and settles under
    // locks, where it finds nothing left to change.
    let app =
        spawn_app_with(Options::default().serve("ONCEPAY_WEBHOOK_COMMAND_WAIT", "50ms")).await;
    let order_id = app.create_order().await;
    let key = uuid::Uuid::new_v4().to_string();
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+delay=2500"});
    let first = app.post("/payments", &key, &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let payment = json_of(first).await;
    assert_eq!(payment["status"], "succeeded");
    let id = payment["id"].as_str().expect("id");

    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE outcome = 'processed' AND confirmed_at IS NOT NULL")
            .await,
        1
    );
    assert_eq!(event_causes(&app, id, "payment.pending").await, ["request"]);
    assert_eq!(
        event_causes(&app, id, "payment.succeeded").await,
        ["webhook"]
    );
    assert_eq!(
        event_causes(&app, &order_id, "order.paid").await,
        ["webhook"]
    );
    assert_eq!(app.charges_for(&order_id).await.len(), 1);
    assert_events_show_the_payment_as_stored(&app, id).await;
    // The answer is the payment as stored, and a repeat replays it.
    let stored = json_of(app.get(&format!("/payments/{id}")).await).await;
    assert_eq!(payment, stored);
    let again = app.post("/payments", &key, &body).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(json_of(again).await, payment);
}
