//! Cards go to the provider's tokenization, never to oncepay: the
//! sandbox's `POST /v1/tokens` (Stripe's form fields) and what its test
//! numbers do once paid with; a card number sent to oncepay is refused.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// Tokenizes a card at the sandbox, from another origin as a page would.
async fn tokenize(
    app: &TestApp,
    number: &str,
    month: &str,
    year: &str,
    cvc: &str,
) -> (StatusCode, Value, bool) {
    let r = app
        .http
        .post(format!("{}/v1/tokens", app.sandbox))
        .header("Origin", "https://shop.example")
        .form(&[
            ("card[number]", number),
            ("card[exp_month]", month),
            ("card[exp_year]", year),
            ("card[cvc]", cvc),
        ])
        .send()
        .await
        .expect("tokenize");
    let cors = r
        .headers()
        .get("access-control-allow-origin")
        .is_some_and(|v| v == "*");
    (r.status(), r.json().await.expect("json"), cors)
}

#[tokio::test]
async fn stripes_test_numbers_behave_as_theirs_once_tokenized() {
    let app = spawn_app().await;
    for (number, brand, status, failure) in [
        ("4242 4242 4242 4242", "visa", "succeeded", Value::Null),
        (
            "4000 0000 0000 0002",
            "visa",
            "failed",
            "card_declined".into(),
        ),
        (
            "4000000000009995",
            "visa",
            "failed",
            "insufficient_funds".into(),
        ),
        (
            "5555-5555-5555-4444",
            "mastercard",
            "succeeded",
            Value::Null,
        ),
    ] {
        let (code, token, cors) = tokenize(&app, number, "12", "2040", "123").await;
        assert_eq!(code, StatusCode::OK, "{token}");
        assert!(cors, "any origin may tokenize");
        assert!(token["id"].as_str().unwrap().starts_with("tok_"));
        assert_eq!(token["card"]["brand"], brand);
        let digits: String = number.chars().filter(char::is_ascii_digit).collect();
        assert_eq!(token["card"]["last4"], digits[digits.len() - 4..]);
        let order = app.create_order().await;
        let (_, payment) = app.pay(&order, token["id"].as_str().unwrap()).await;
        assert_eq!(payment["status"], status, "{number}: {payment}");
        assert_eq!(payment["failure_code"], failure, "{number}");
    }
    // The 3-D Secure card waits for its customer.
    let (_, token, _) = tokenize(&app, "4000 0027 6000 3184", "1", "40", "123").await;
    let order = app.create_order().await;
    let (status, payment) = app.pay(&order, token["id"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(payment["next_action"]["type"], "redirect", "{payment}");
}

#[tokio::test]
async fn a_card_the_provider_cannot_take_is_refused_by_the_provider() {
    let app = spawn_app().await;
    for (number, month, year, cvc, code) in [
        (
            "4242 4242 4242 4241",
            "12",
            "2040",
            "123",
            "incorrect_number",
        ),
        (
            "4242 4242 4242 4242",
            "13",
            "2040",
            "123",
            "invalid_expiry_month",
        ),
        ("4242 4242 4242 4242", "1", "2020", "123", "expired_card"),
        ("4242 4242 4242 4242", "12", "2040", "12", "invalid_cvc"),
        ("3782 822463 10005", "12", "2040", "123", "invalid_cvc"),
    ] {
        let (status, body, _) = tokenize(&app, number, month, year, cvc).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{number}");
        assert_eq!(body["error"]["code"], code, "{number}: {body}");
    }
}

#[tokio::test]
async fn a_card_number_sent_to_oncepay_is_refused_naming_the_field_never_echoing_it() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    for card in [
        "4242424242424242",
        "4000 0027 6000 3184",
        "5555-5555-5555-4444",
    ] {
        let (status, problem) = app.pay(&order, card).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
        assert_eq!(problem["field"], "payment_method");
        let text = problem.to_string();
        assert!(
            !text.contains("4242") && !text.contains("3184") && !text.contains("4444"),
            "{text}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 0);
    assert_eq!(app.ledger().await["totals"]["charges"], 0);
}
