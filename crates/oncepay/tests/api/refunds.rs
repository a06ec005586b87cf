//! Refunds and cancelling paid orders.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

async fn paid_order(app: &TestApp) -> (String, String) {
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    (order_id, payment["id"].as_str().expect("id").to_string())
}

#[tokio::test]
async fn a_refund_defaults_to_what_is_left_and_refunds_the_order() {
    let app = spawn_app().await;
    let (order_id, payment_id) = paid_order(&app).await;
    let r = app
        .post(
            &format!("/payments/{payment_id}/refunds"),
            "r1",
            &json!({"amount": 800, "reason": "damaged"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let location = r.headers()["location"].to_str().expect("ascii").to_string();
    let first = json_of(r).await;
    assert_eq!(
        (first["amount"].as_i64(), first["status"].as_str()),
        (Some(800), Some("succeeded"))
    );
    assert_eq!(first["reason"], "damaged");
    assert_eq!(json_of(app.get(&location).await).await, first);
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "paid"
    );

    let rest = json_of(
        app.post(&format!("/payments/{payment_id}/refunds"), "r2", &json!({}))
            .await,
    )
    .await;
    assert_eq!(rest["amount"], 2000);
    let payment = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(payment["refunded_amount"], 2800);
    assert_eq!(
        payment["status"], "succeeded",
        "a refund never moves the payment backwards"
    );
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "refunded"
    );

    let r = app
        .post(
            &format!("/payments/{payment_id}/refunds"),
            "r3",
            &json!({"amount": 1}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["code"], "refund_exceeds_payment");
    assert_eq!(app.ledger().await["totals"]["refunded_amount"], 2800);
}

#[tokio::test]
async fn only_a_succeeded_payment_is_refundable() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (_, failed) = app.pay(&order_id, "tok_declined").await;
    let id = failed["id"].as_str().expect("id");
    let r = app
        .post(&format!("/payments/{id}/refunds"), "r", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_not_refundable");
    let r = app
        .post(
            &format!("/payments/{id}/refunds"),
            "r2",
            &json!({"amount": 0}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["field"], "amount");
}

#[tokio::test]
async fn concurrent_refunds_never_exceed_the_payment() {
    let app = spawn_app().await;
    let (_, payment_id) = paid_order(&app).await;
    // 20 refunds of 300 against 2800: at most 9 can succeed.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (http, key) = (app.http.clone(), app.key.clone());
        let url = format!("{}/payments/{payment_id}/refunds", app.base);
        tasks.spawn(async move {
            http.post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", format!("refund-{i}"))
                .json(&json!({"amount": 300}))
                .send()
                .await
                .expect("sent")
                .status()
        });
    }
    let mut created = 0;
    while let Some(status) = tasks.join_next().await {
        match status.expect("task") {
            StatusCode::CREATED => created += 1,
            StatusCode::UNPROCESSABLE_ENTITY => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(created, 9);
    let total = app
        .count("SELECT COALESCE(sum(amount), 0)::bigint FROM refund WHERE status <> 'failed'")
        .await;
    assert_eq!(total, 2700);
    assert_eq!(app.ledger().await["totals"]["refunded_amount"], 2700);
    let payment = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(payment["refunded_amount"], 2700);
}

#[tokio::test]
async fn cancelling_a_paid_order_refunds_it_in_full() {
    let app = spawn_app().await;
    let (order_id, payment_id) = paid_order(&app).await;
    app.post(
        &format!("/payments/{payment_id}/refunds"),
        "part",
        &json!({"amount": 500}),
    )
    .await;
    let r = app
        .post(&format!("/orders/{order_id}/cancel"), "cancel", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let order = json_of(r).await;
    assert_eq!(order["status"], "cancelled");
    let payment = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(payment["refunded_amount"], 2800);
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["refunded_amount"], 2800);
    assert_eq!(ledger["totals"]["refunds"], 2);
    let replay = app
        .post(&format!("/orders/{order_id}/cancel"), "cancel", &json!({}))
        .await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        app.ledger().await["totals"]["refunds"],
        2,
        "the replay refunded nothing"
    );
}

#[tokio::test]
async fn an_order_with_a_pending_payment_cannot_be_cancelled() {
    let app = spawn_app_with(Options::default().sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "5s")).await;
    let order_id = app.create_order().await;
    app.pay(&order_id, "tok_async").await;
    let r = app
        .post(&format!("/orders/{order_id}/cancel"), "c", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_in_progress");
}
