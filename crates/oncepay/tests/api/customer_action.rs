//! A payment that waits for its customer (3-D Secure at the bank): it stays
//! `pending` with `next_action`, paying again is the same payment, and it
//! ends like any other — approved, declined, or abandoned and expired.
//! The sandbox's bank page is driven over HTTP as a browser's form would.

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

/// Pays `order` with `token` under a new key.
async fn pay(app: &TestApp, order: &str, token: &str) -> (StatusCode, Value) {
    app.pay(order, token).await
}

/// Presses a button of the sandbox's bank page at `url`, as its form does
/// (without following the redirect back).
async fn press(url: &str, button: &str) -> StatusCode {
    let page = reqwest::get(url).await.unwrap().text().await.unwrap();
    assert!(
        page.contains(&format!("id=\"{button}\"")),
        "the bank page has a {button} button: {page}"
    );
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{url}/{button}"))
        .send()
        .await
        .unwrap()
        .status()
}

fn bank_url(payment: &Value) -> String {
    assert_eq!(payment["status"], "pending", "{payment}");
    assert_eq!(payment["next_action"]["type"], "redirect", "{payment}");
    payment["next_action"]["url"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_payment_waits_for_its_customer_and_paying_again_is_the_same_payment() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (status, waiting) = pay(&app, &order, "tok_3ds").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let url = bank_url(&waiting);
    assert!(url.starts_with(&format!("{}/v1/authenticate/", app.sandbox)));

    // A double click, a reload, a second tab: each a new key, all the same
    // payment, one charge.
    let tries = futures_join(&app, &order).await;
    for (status, body) in &tries {
        assert_eq!(*status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["id"], waiting["id"]);
        assert_eq!(body["next_action"], waiting["next_action"]);
    }
    assert_eq!(app.charges_for(&order).await.len(), 1);
    let id = waiting["id"].as_str().unwrap();
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM event WHERE object_id = '{id}' AND type = 'payment.requires_action'"
        ))
        .await,
        1
    );

    assert_eq!(press(&url, "approve").await, StatusCode::OK);
    let paid = app
        .poll_until(&format!("/payments/{id}"), |p| p["status"] == "succeeded")
        .await;
    assert_eq!(paid["next_action"], Value::Null);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.charges_for(&order).await.len(), 1);
}

async fn futures_join(app: &TestApp, order: &str) -> Vec<(StatusCode, Value)> {
    let (a, b, c) = tokio::join!(
        pay(app, order, "tok_3ds"),
        pay(app, order, "tok_3ds"),
        pay(app, order, "tok_visa")
    );
    vec![a, b, c]
}

#[tokio::test]
async fn declined_at_the_bank_fails_and_the_order_can_be_paid_again_once() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, waiting) = pay(&app, &order, "tok_3ds").await;
    assert_eq!(press(&bank_url(&waiting), "decline").await, StatusCode::OK);
    let id = waiting["id"].as_str().unwrap();
    let failed = app
        .poll_until(&format!("/payments/{id}"), |p| p["status"] == "failed")
        .await;
    assert_eq!(failed["failure_code"], "authentication_failed");
    assert_eq!(failed["next_action"], Value::Null);
    let (status, again) = pay(&app, &order, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_ne!(again["id"], waiting["id"]);
    let succeeded = app
        .charges_for(&order)
        .await
        .iter()
        .filter(|c| c["status"] == "succeeded")
        .count();
    assert_eq!(succeeded, 1);

    // A card its bank declines after the customer approved.
    let order = app.create_order().await;
    let (_, waiting) = pay(&app, &order, "tok_3ds_declined").await;
    press(&bank_url(&waiting), "approve").await;
    let id = waiting["id"].as_str().unwrap();
    let failed = app
        .poll_until(&format!("/payments/{id}"), |p| p["status"] == "failed")
        .await;
    assert_eq!(failed["failure_code"], "card_declined");
}

/// A charge the provider never received (down at the time) is sent again
/// by the reconciler, with the same `return_url` the request gave: after
/// 3-D Secure the bank still sends the customer back to the shop.
#[tokio::test]
async fn a_charge_sent_again_later_still_returns_the_customer_to_the_shop() {
    use oncepay_testkit::fault_proxy::{Fault, Route};
    let app = spawn_app_with(
        Options::default()
            .with_fault_proxy()
            .serve("ONCEPAY_RECONCILE_AFTER", "0s"),
    )
    .await;
    let order = app.create_order().await;
    let back = "http://127.0.0.1:9/shop/back";
    app.proxy
        .as_ref()
        .expect("proxy")
        .set(Route::Charge, Fault::Down);
    let r = app
        .post(
            "/payments",
            "pay-down-then-3ds",
            &serde_json::json!({"order_id": order, "payment_method": "tok_3ds", "return_url": back}),
        )
        .await;
    let first = json_of(r).await;
    assert_eq!(first["status"], "pending", "{first}");
    assert_eq!(
        first["next_action"],
        Value::Null,
        "the provider was never reached"
    );
    app.proxy().heal();
    let waiting =
        oncepay_testkit::ready::until_some(std::time::Duration::from_secs(20), || async {
            oncepay::workers::reconciler::pass(&app.ctx).await.ok();
            let p = json_of(
                app.get(&format!("/payments/{}", first["id"].as_str().unwrap()))
                    .await,
            )
            .await;
            p["next_action"]["url"].is_string().then_some(p)
        })
        .await
        .expect("the reconciler charged it, and it waits for its customer");
    let url = bank_url(&waiting);
    let answer = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{url}/approve"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    assert_eq!(answer.headers()["location"], back);
    assert_eq!(app.charges_for(&order).await.len(), 1);
}
