//! The money errors a client reads (issue 54), in one style: the detail
//! names the field, what was asked and the most allowed; `field` names it
//! for a program, with the members `requested` and `allowed`.

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;

async fn post(app: &TestApp, path: &str, body: Value) -> (StatusCode, Value) {
    let r = app.post(path, &Uuid::new_v4().to_string(), &body).await;
    let status = r.status();
    (status, json_of(r).await)
}

/// The one style: `field` `amount`, a detail that begins with it and says
/// both figures, and the members.
fn one_style(problem: &Value, code: &str, requested: i64, allowed: i64) {
    assert_eq!(problem["code"], code, "{problem}");
    assert_eq!(problem["field"], "amount", "{problem}");
    assert_eq!(problem["requested"], requested, "{problem}");
    assert_eq!(problem["allowed"], allowed, "{problem}");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(
        detail.starts_with(&format!("amount: {requested} asked, at most {allowed} ")),
        "{detail}"
    );
}

#[tokio::test]
async fn money_errors_name_their_field_and_what_was_asked_and_allowed() {
    let app = spawn_app().await;
    // A balance that does not cover a debit, nor a hold's capture above it.
    let (status, _) = post(
        &app,
        "/customers/cus_1/balance/credits",
        json!({"amount": 500, "currency": "EUR"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, problem) = post(
        &app,
        "/customers/cus_1/balance/debits",
        json!({"amount": 700, "currency": "EUR"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    one_style(&problem, "insufficient_funds", 700, 500);
    let (status, hold) = post(
        &app,
        "/customers/cus_1/balance/holds",
        json!({"amount": 200, "currency": "EUR"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{hold}");
    let (status, problem) = post(
        &app,
        &format!("/balance_holds/{}/capture", hold["id"].as_str().unwrap()),
        json!({"amount": 250}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    one_style(&problem, "amount_exceeds_hold", 250, 200);

    // A refund above what is left, a capture above the hold.
    let order_id = app.create_order().await;
    let (_, paid) = app.pay(&order_id, "tok_visa").await;
    let (status, problem) = post(
        &app,
        &format!("/payments/{}/refunds", paid["id"].as_str().unwrap()),
        json!({"amount": 2801}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    one_style(&problem, "refund_exceeds_payment", 2801, 2800);

    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "manual"}),
        )
        .await;
    let held = json_of(r).await;
    assert_eq!(held["status"], "requires_capture", "{held}");
    let (status, problem) = post(
        &app,
        &format!("/payments/{}/capture", held["id"].as_str().unwrap()),
        json!({"amount": 3000}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    one_style(&problem, "amount_exceeds_capturable", 3000, 2800);
}
