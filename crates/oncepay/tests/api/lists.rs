//! `GET /orders`, `/payments`, `/refunds`: pages newest first, cursors,
//! filters, merchant isolation, and pages that stay correct while new
//! orders arrive.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

async fn page(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status(), StatusCode::OK, "{path}");
    json_of(r).await
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|o| o["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn pages_walk_newest_first_with_cursors_both_ways() {
    let app = spawn_app().await;
    let mut created = Vec::new();
    for _ in 0..25 {
        created.push(app.create_order().await);
    }
    created.reverse(); // newest first
    let first = page(&app, "/orders?limit=10").await;
    assert_eq!(ids(&first), created[..10]);
    assert_eq!(first["has_more"], true);
    let second = page(
        &app,
        &format!("/orders?limit=10&starting_after={}", created[9]),
    )
    .await;
    assert_eq!(ids(&second), created[10..20]);
    let third = page(
        &app,
        &format!("/orders?limit=10&starting_after={}", created[19]),
    )
    .await;
    assert_eq!(ids(&third), created[20..]);
    assert_eq!(third["has_more"], false);
    let back = page(
        &app,
        &format!("/orders?limit=10&ending_before={}", created[10]),
    )
    .await;
    assert_eq!(ids(&back), created[..10], "the previous page, newest first");
    // Another merchant sees none of them.
    let other = app.other_merchant_key().await;
    let r = app
        .http
        .get(format!("{}/orders", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("get");
    assert_eq!(json_of(r).await["data"], json!([]));
}

#[tokio::test]
async fn a_walk_sees_every_order_once_while_new_ones_arrive() {
    let app = spawn_app().await;
    let mut before = HashSet::new();
    for _ in 0..30 {
        before.insert(app.create_order().await);
    }
    let writer = {
        let (base, key, http) = (app.base.clone(), app.key.clone(), app.http.clone());
        tokio::spawn(async move {
            for i in 0..30 {
                let _ = http
                    .post(format!("{base}/orders"))
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("arriving-{i}"))
                    .json(&order_body())
                    .send()
                    .await;
            }
        })
    };
    let mut seen: Vec<String> = Vec::new();
    let mut path = "/orders?limit=7".to_string();
    loop {
        let p = page(&app, &path).await;
        let page_ids = ids(&p);
        seen.extend(page_ids.iter().cloned());
        if p["has_more"] != true {
            break;
        }
        path = format!(
            "/orders?limit=7&starting_after={}",
            page_ids.last().expect("id")
        );
    }
    writer.await.expect("writer");
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no order seen twice");
    assert!(
        before.iter().all(|id| unique.contains(id)),
        "no order that existed before the walk was skipped"
    );
}

#[tokio::test]
async fn filters_and_bad_parameters() {
    let app = spawn_app().await;
    let paid = app.create_order().await;
    let (_, payment) = app.pay(&paid, "tok_visa").await;
    let _unpaid = app.create_order().await;
    let p = page(&app, "/orders?status=paid").await;
    assert_eq!(ids(&p), vec![paid.clone()]);
    let p = page(&app, "/orders?customer_id=cus_42&status=awaiting_payment").await;
    assert_eq!(ids(&p).len(), 1);
    let p = page(&app, "/orders?customer_id=nobody").await;
    assert_eq!(ids(&p).len(), 0);
    let p = page(&app, "/payments?status=succeeded&customer_id=cus_42").await;
    assert_eq!(p["data"][0]["id"], payment["id"]);
    let refund = app
        .post(
            &format!("/payments/{}/refunds", payment["id"].as_str().expect("id")),
            "r1",
            &json!({"amount": 100}),
        )
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let p = page(&app, "/refunds").await;
    assert_eq!(ids(&p).len(), 1);
    let p = page(&app, "/orders?created_gte=2999-01-01T00:00:00Z").await;
    assert_eq!(ids(&p).len(), 0);
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("starting_after=nope", "starting_after"),
        ("status=lost", "status"),
        ("created_gte=yesterday", "created_gte"),
        ("colour=blue", "colour"),
    ] {
        let r = app.get(&format!("/orders?{query}")).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
        let body = json_of(r).await;
        assert_eq!(body["field"], field, "{query}: {body}");
    }
}

/// `GET /payments?order_id=` is the paged form of `GET /orders/{id}/payments`
/// (which keeps its bare array); `GET /refunds?payment_id=` the same for
/// refunds; a refund carries its payment's currency.
#[tokio::test]
async fn payments_by_order_and_refunds_by_payment_and_a_refunds_currency() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, declined) = app.pay(&order, "tok_declined").await;
    let (_, paid) = app.pay(&order, "tok_visa").await;
    let other = app.create_order().await;
    let (_, elsewhere) = app.pay(&other, "tok_visa").await;
    let p = page(&app, &format!("/payments?order_id={order}")).await;
    assert_eq!(
        ids(&p),
        [
            paid["id"].as_str().unwrap(),
            declined["id"].as_str().unwrap()
        ],
        "newest first, this order's only"
    );
    let bare = json_of(app.get(&format!("/orders/{order}/payments")).await).await;
    assert_eq!(bare.as_array().map(Vec::len), Some(2), "still a bare array");
    let p = page(
        &app,
        &format!("/payments?order_id={order}&status=failed&limit=1"),
    )
    .await;
    assert_eq!(ids(&p), [declined["id"].as_str().unwrap()]);

    let refund_of = |payment: &Value, key: &'static str| {
        let path = format!("/payments/{}/refunds", payment["id"].as_str().unwrap());
        let app = &app;
        async move { json_of(app.post(&path, key, &json!({"amount": 100})).await).await }
    };
    let refund = refund_of(&paid, "r-paid").await;
    refund_of(&elsewhere, "r-elsewhere").await;
    assert_eq!(refund["currency"], paid["currency"], "{refund}");
    let p = page(
        &app,
        &format!("/refunds?payment_id={}", paid["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(ids(&p), [refund["id"].as_str().unwrap()]);
    assert_eq!(p["data"][0]["currency"], "EUR");
    let fetched = json_of(
        app.get(&format!("/refunds/{}", refund["id"].as_str().unwrap()))
            .await,
    )
    .await;
    assert_eq!(fetched["currency"], "EUR");
    for query in [
        "/payments?order_id=nope",
        "/refunds?payment_id=nope",
        "/orders?order_id=x",
    ] {
        let r = app.get(query).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
    }
}
