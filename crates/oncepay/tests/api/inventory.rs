//! Stock of tracked SKUs (issue 46) over HTTP: adjustments, reads and the
//! list; orders that reserve stock (lines of one SKU summed, all or
//! nothing, replays), conversion on payment and on a manual-capture
//! authorization, release on cancel and on expiry (without a sweep, then
//! by the sweeper), the shortfall of a payment after expiry; concurrent
//! orders counted in rows; the database's own refusals.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;

pub(crate) fn key() -> String {
    Uuid::new_v4().to_string()
}

/// Adjusts `sku` by `quantity`; returns the status and body.
pub(crate) async fn adjust(app: &TestApp, sku: &str, quantity: i64) -> (StatusCode, Value) {
    let r = app
        .post(
            &format!("/inventory/{sku}/adjustments"),
            &key(),
            &json!({"quantity": quantity, "reason": "count"}),
        )
        .await;
    let status = r.status();
    (status, json_of(r).await)
}

pub(crate) async fn stock(app: &TestApp, sku: &str, quantity: i64) {
    let (status, body) = adjust(app, sku, quantity).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// `(on_hand, reserved, available)` of a tracked SKU.
pub(crate) async fn levels(app: &TestApp, sku: &str) -> (i64, i64, i64) {
    let r = app.get(&format!("/inventory/{sku}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let v = json_of(r).await;
    (
        v["on_hand"].as_i64().expect("on_hand"),
        v["reserved"].as_i64().expect("reserved"),
        v["available"].as_i64().expect("available"),
    )
}

pub(crate) fn order_of(items: &[(&str, i64)], reserve: bool) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(sku, q)| json!({"sku": sku, "quantity": q, "unit_amount": 500}))
        .collect();
    json!({"customer_id": "cus_1", "currency": "EUR", "items": items, "reserve_stock": reserve})
}

/// Creates an order under `idem`: (status, body).
pub(crate) async fn order_with(app: &TestApp, idem: &str, body: &Value) -> (StatusCode, Value) {
    let r = app.post("/orders", idem, body).await;
    let status = r.status();
    (status, json_of(r).await)
}

/// A reserving order that must be created; returns it.
pub(crate) async fn reserving(app: &TestApp, items: &[(&str, i64)]) -> Value {
    let (status, order) = order_with(app, &key(), &order_of(items, true)).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    order
}

/// Sends every order at once, each on its own task and connection, and
/// joins them all: real concurrent requests, ordered by nothing.
async fn all_at_once(app: &TestApp, orders: Vec<(String, Value)>) -> Vec<(StatusCode, Value)> {
    let mut set = tokio::task::JoinSet::new();
    for (idem, body) in orders {
        let (http, base, api_key) = (app.http.clone(), app.base.clone(), app.key.clone());
        set.spawn(async move {
            let r = http
                .post(format!("{base}/orders"))
                .bearer_auth(api_key)
                .header("Idempotency-Key", idem)
                .json(&body)
                .send()
                .await
                .expect("sent");
            let status = r.status();
            (status, json_of(r).await)
        });
    }
    set.join_all().await
}

pub(crate) fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

/// The types of an order's events, oldest first.
pub(crate) async fn trail(app: &TestApp, order_id: &str) -> Vec<String> {
    let page = json_of(app.get(&format!("/orders/{order_id}/events")).await).await;
    let mut types: Vec<String> = page["data"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].as_str().expect("type").to_string())
        .collect();
    types.sort();
    types
}

/// Pays an order with `tok_visa` and waits until the payment succeeded.
pub(crate) async fn pay(app: &TestApp, order_id: &str, body: Value) -> Value {
    let mut body = body;
    body["order_id"] = json!(order_id);
    let r = app.post("/payments", &key(), &body).await;
    let status = r.status();
    let payment = json_of(r).await;
    assert!(status.is_success(), "{payment}");
    payment
}

pub(crate) async fn count(app: &TestApp, sql: &str) -> i64 {
    app.count(sql).await
}

/// The stock ledger's lines of `oncepay ledger check` all hold.
pub(crate) async fn ledger_holds(app: &TestApp) {
    let lines = oncepay::store::ledger::check(&app.db, None)
        .await
        .expect("check runs");
    assert!(lines.iter().any(|l| l.ledger == "stock"), "{lines:?}");
    for line in lines {
        assert!(line.holds(), "{line:?}");
    }
}

pub(crate) fn short_app() -> Options {
    Options::default().serve("ONCEPAY_STOCK_RESERVATION_TTL", "1s")
}

/// Waits out a one-second reservation: time must pass for a deadline to,
/// and nothing here races against it.
pub(crate) async fn past_deadline(order: &Value) {
    let until = chrono::DateTime::parse_from_rfc3339(
        order["stock_reserved_until"].as_str().expect("reserved"),
    )
    .expect("a time");
    let left = until.with_timezone(&chrono::Utc) - chrono::Utc::now();
    let wait = left.to_std().unwrap_or_default() + Duration::from_millis(200);
    tokio::time::sleep(wait).await;
}

#[tokio::test]
async fn adjustments_track_a_sku_and_never_remove_more_than_is_available() {
    let app = spawn_app().await;
    let r = app.get("/inventory/book").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "inventory_item_not_found");

    let r = app
        .post(
            "/inventory/book/adjustments",
            "first",
            &json!({"quantity": 10}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        r.headers()["location"].to_str().expect("ascii"),
        "/inventory/book"
    );
    let item = json_of(r).await;
    assert_eq!(item["sku"], "book");
    assert_eq!(
        (&item["on_hand"], &item["reserved"], &item["available"]),
        (&json!(10), &json!(0), &json!(10))
    );
    assert!(item["updated_at"].is_string());
    // A replay adds nothing.
    let r = app
        .post(
            "/inventory/book/adjustments",
            "first",
            &json!({"quantity": 10}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(levels(&app, "book").await, (10, 0, 10));

    stock(&app, "book", -4).await;
    assert_eq!(levels(&app, "book").await, (6, 0, 6));
    // Removing more than is available: refused, kept under its key.
    let body = json!({"quantity": -7});
    let r = app
        .post("/inventory/book/adjustments", "too-many", &body)
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "insufficient_stock");
    assert_eq!(
        problem["skus"],
        json!([{"sku": "book", "requested": 7, "available": 6}])
    );
    stock(&app, "book", 10).await;
    let r = app
        .post("/inventory/book/adjustments", "too-many", &body)
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT, "the answer is the key's");
    assert_eq!(levels(&app, "book").await, (16, 0, 16));
    // A removal from an untracked SKU starts nothing.
    let (status, _) = adjust(&app, "ghost", -1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let r = app.get("/inventory/ghost").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // No key: refused before anything.
    let r = app
        .post_raw(
            "/inventory/book/adjustments",
            None,
            Some(&app.key),
            b"{\"quantity\": 1}".to_vec(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["code"], "idempotency_key_missing");

    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM event WHERE type = 'inventory.adjusted'"
        )
        .await,
        3
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM audit_event WHERE action = 'inventory.adjusted'"
        )
        .await,
        3
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn bad_adjustments_and_orders_are_problems_naming_their_field() {
    let app = spawn_app().await;
    let cases: Vec<(String, Value, u16, &str, &str)> = vec![
        (
            "book".into(),
            json!({"quantity": 0}),
            422,
            "validation_failed",
            "quantity",
        ),
        (
            "book".into(),
            json!({"quantity": 1.5}),
            400,
            "invalid_field",
            "quantity",
        ),
        (
            "book".into(),
            json!({"quantity": "3"}),
            400,
            "invalid_field",
            "quantity",
        ),
        (
            "book".into(),
            json!({"quantity": 1_000_000_001i64}),
            422,
            "validation_failed",
            "quantity",
        ),
        (
            "book".into(),
            json!({"quantity": -1_000_000_001i64}),
            422,
            "validation_failed",
            "quantity",
        ),
        ("book".into(), json!({}), 400, "invalid_field", "quantity"),
        (
            "book".into(),
            json!({"quantity": 1, "colour": "red"}),
            400,
            "invalid_field",
            "colour",
        ),
        (
            "book".into(),
            json!({"quantity": 1, "reason": "x".repeat(501)}),
            422,
            "validation_failed",
            "reason",
        ),
        (
            "x".repeat(65),
            json!({"quantity": 1}),
            400,
            "invalid_field",
            "sku",
        ),
    ];
    for (sku, body, status, code, field) in cases {
        let r = app
            .post(&format!("/inventory/{sku}/adjustments"), &key(), &body)
            .await;
        assert_eq!(r.status().as_u16(), status, "{body}");
        assert!(r.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("application/problem+json"));
        let problem = json_of(r).await;
        assert_eq!(problem["code"], code, "{body}: {problem}");
        assert_eq!(problem["field"], field, "{body}: {problem}");
        assert!(problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains(field)));
    }
    let mut bad_order = order_of(&[("book", 1)], true);
    bad_order["reserve_stock"] = json!("yes");
    let (status, problem) = order_with(&app, &key(), &bad_order).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["field"], "reserve_stock");
    let r = app.get("/inventory?limit=0").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["field"], "limit");
    let r = app.get("/inventory?ending_before=a").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["field"], "ending_before");
    // Nothing was tracked by any of them.
    assert_eq!(count(&app, "SELECT count(*) FROM ledger_transfer").await, 0);
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 0);
}

#[tokio::test]
async fn stock_is_per_merchant_and_listed_in_sku_order() {
    let app = spawn_app().await;
    for sku in ["c", "a", "b", "B"] {
        stock(&app, sku, 1).await;
    }
    let page = json_of(app.get("/inventory?limit=2").await).await;
    let skus: Vec<&str> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|i| i["sku"].as_str().expect("sku"))
        .collect();
    assert_eq!(skus, ["B", "a"], "bytewise SKU order");
    assert_eq!(page["has_more"], true);
    let page = json_of(app.get("/inventory?limit=2&starting_after=a").await).await;
    let skus: Vec<&str> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|i| i["sku"].as_str().expect("sku"))
        .collect();
    assert_eq!(skus, ["b", "c"]);
    assert_eq!(page["has_more"], false);

    // Merchant B: A's SKU does not exist for it; its own "a" is its own.
    let other = app.other_merchant_key().await;
    let r = app
        .http
        .get(format!("{}/inventory/a", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = app
        .post_raw(
            "/inventory/a/adjustments",
            Some(&key()),
            Some(&other),
            json!({"quantity": 7}).to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["on_hand"], 7);
    assert_eq!(levels(&app, "a").await, (1, 0, 1));
    let theirs = app
        .http
        .get(format!("{}/inventory", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        json_of(theirs).await["data"].as_array().map(Vec::len),
        Some(1)
    );
}

#[tokio::test]
async fn an_order_reserves_its_tracked_skus_with_lines_of_one_sku_summed_and_a_replay_reserves_nothing_more(
) {
    let app = spawn_app().await;
    stock(&app, "book", 5).await;
    stock(&app, "pen", 1).await;
    let body = order_of(&[("book", 2), ("mug", 4), ("book", 3)], true);
    let (status, order) = order_with(&app, "reserve-1", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert!(order["stock_reserved_until"].is_string(), "{order}");
    assert_eq!(order["stock_shortfall"], json!([]));
    assert_eq!(levels(&app, "book").await, (5, 5, 0));
    assert_eq!(levels(&app, "pen").await, (1, 0, 1), "not in the order");
    assert!(trail(&app, &id(&order))
        .await
        .contains(&"order.stock_reserved".to_string()));
    // An operator sees how long the reservation held the SKUs' rows.
    let hold = app
        .ctx
        .metrics
        .last_write_hold_seconds
        .with_label_values(&["create_order"]);
    assert_eq!(hold.get_sample_count(), 1);
    assert!(hold.get_sample_sum() > 0.0);

    // The same key and body: the same answer, nothing reserved again.
    let r = app.post("/orders", "reserve-1", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(json_of(r).await, order);
    assert_eq!(levels(&app, "book").await, (5, 5, 0));
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE phase = 'pending'"
        )
        .await,
        1
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 1);

    // Two lines of 3 against 5 reserved of 5: the sum decides.
    stock(&app, "book", 5).await;
    let (status, problem) =
        order_with(&app, &key(), &order_of(&[("book", 3), ("book", 3)], true)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        problem["skus"],
        json!([{"sku": "book", "requested": 6, "available": 5}])
    );

    // Without reserve_stock, or with untracked SKUs only: nothing reserved.
    let (status, plain) = order_with(&app, &key(), &order_of(&[("book", 9)], false)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(plain["stock_reserved_until"], Value::Null);
    let untracked = reserving(&app, &[("mug", 9)]).await;
    assert_eq!(untracked["stock_reserved_until"], Value::Null);
    assert_eq!(levels(&app, "book").await, (10, 5, 5));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn an_order_short_of_one_sku_out_of_three_creates_and_reserves_nothing() {
    let app = spawn_app().await;
    stock(&app, "a", 5).await;
    stock(&app, "b", 5).await;
    stock(&app, "c", 1).await;
    let (status, problem) = order_with(
        &app,
        "short",
        &order_of(&[("a", 1), ("c", 2), ("b", 1)], true),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "insufficient_stock");
    assert_eq!(
        problem["skus"],
        json!([{"sku": "c", "requested": 2, "available": 1}])
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE phase <> 'single'"
        )
        .await,
        0
    );
    for sku in ["a", "b"] {
        assert_eq!(levels(&app, sku).await, (5, 0, 5));
    }
    assert_eq!(levels(&app, "c").await, (1, 0, 1));
}

#[tokio::test]
async fn payment_converts_the_reservation_and_cancel_releases_it() {
    let app = spawn_app().await;
    stock(&app, "book", 5).await;
    let paid = reserving(&app, &[("book", 2)]).await;
    let payment = pay(&app, &id(&paid), json!({"payment_method": "tok_visa"})).await;
    app.reconciled_to(&payment["id"], "succeeded").await;
    assert_eq!(
        app.status_of(&format!("/orders/{}", id(&paid))).await,
        "paid"
    );
    assert_eq!(levels(&app, "book").await, (3, 0, 3), "converted");

    let cancelled = reserving(&app, &[("book", 3)]).await;
    assert_eq!(levels(&app, "book").await, (3, 3, 0));
    let r = app
        .post(
            &format!("/orders/{}/cancel", id(&cancelled)),
            &key(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(levels(&app, "book").await, (3, 0, 3), "released");
    assert!(trail(&app, &id(&cancelled))
        .await
        .contains(&"order.stock_released".to_string()));
    let r = app
        .post(
            &format!("/orders/{}/cancel", id(&cancelled)),
            &key(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(levels(&app, "book").await, (3, 0, 3), "released once");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE code IN ('conversion', 'release')"
        )
        .await,
        2
    );
    ledger_holds(&app).await;
}

/// An authorization keeps the order's units reserved, not sold (issue
/// 54): the capture sells them, once.
#[tokio::test]
async fn a_manual_capture_authorization_keeps_the_reservation_until_the_capture_sells_it() {
    let app = spawn_app().await;
    stock(&app, "book", 5).await;
    let order = reserving(&app, &[("book", 2)]).await;
    let payment = pay(
        &app,
        &id(&order),
        json!({"payment_method": "tok_visa", "capture_method": "manual"}),
    )
    .await;
    app.reconciled_to(&payment["id"], "requires_capture").await;
    assert_eq!(
        app.status_of(&format!("/orders/{}", id(&order))).await,
        "authorized"
    );
    assert_eq!(levels(&app, "book").await, (5, 2, 3), "reserved, not sold");
    let pid = payment["id"].as_str().expect("id");
    let r = app
        .post(&format!("/payments/{pid}/capture"), &key(), &json!({}))
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    app.reconciled_to(&payment["id"], "succeeded").await;
    assert_eq!(
        app.status_of(&format!("/orders/{}", id(&order))).await,
        "paid"
    );
    assert_eq!(levels(&app, "book").await, (3, 0, 3), "converted once");
    ledger_holds(&app).await;
}

#[tokio::test]
async fn an_expired_reservation_stops_counting_without_a_sweep_and_the_sweeper_releases_it() {
    let app = spawn_app_with(short_app()).await;
    stock(&app, "book", 1).await;
    let first = reserving(&app, &[("book", 1)]).await;
    let (status, _) = order_with(&app, &key(), &order_of(&[("book", 1)], true)).await;
    assert_eq!(status, StatusCode::CONFLICT, "reserved while live");
    past_deadline(&first).await;
    // No sweep has run: the ledger still holds the reservation open...
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE phase = 'void'"
        )
        .await,
        0
    );
    // ...and it no longer counts.
    assert_eq!(levels(&app, "book").await, (1, 0, 1));
    let swept = oncepay::workers::sweeper::expire_reservations(&app.ctx)
        .await
        .expect("sweeps");
    assert_eq!(swept, 1);
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE code = 'reservation_expiry'"
        )
        .await,
        1
    );
    assert!(trail(&app, &id(&first))
        .await
        .contains(&"order.stock_released".to_string()));
    let again = oncepay::workers::sweeper::expire_reservations(&app.ctx)
        .await
        .expect("sweeps");
    assert_eq!(again, 0, "released once");
    assert_eq!(levels(&app, "book").await, (1, 0, 1));
    // An expired, released order still awaits payment.
    assert_eq!(
        app.status_of(&format!("/orders/{}", id(&first))).await,
        "awaiting_payment"
    );
    ledger_holds(&app).await;
}

/// An order that finds the stock held only by a reservation past its
/// deadline, unswept, gets it: the one-statement reservation finds the
/// row short, and the order then voids what is overdue and reserves.
#[tokio::test]
async fn an_order_takes_stock_an_unswept_expired_reservation_held() {
    let app = spawn_app_with(short_app()).await;
    stock(&app, "lamp", 2).await;
    let first = reserving(&app, &[("lamp", 2)]).await;
    past_deadline(&first).await;
    let (status, second) = order_with(&app, &key(), &order_of(&[("lamp", 2)], true)).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert!(second["stock_reserved_until"].is_string(), "{second}");
    assert_eq!(levels(&app, "lamp").await, (2, 2, 0));
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE code = 'reservation_expiry'"
        )
        .await,
        1,
        "the first order's reservation voided by the second"
    );
    assert!(trail(&app, &id(&first))
        .await
        .contains(&"order.stock_released".to_string()));
    let (status, third) = order_with(&app, &key(), &order_of(&[("lamp", 1)], true)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{third}");
    assert_eq!(third["code"], "insufficient_stock");
    assert_eq!(third["skus"][0]["available"], 0, "{third}");
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_payment_after_expiry_takes_stock_if_there_and_otherwise_the_order_is_paid_short() {
    let app = spawn_app_with(short_app()).await;
    stock(&app, "book", 1).await;
    stock(&app, "pen", 5).await;
    let late = reserving(&app, &[("book", 1), ("pen", 2)]).await;
    past_deadline(&late).await;
    // Another order takes the book meanwhile (voiding the expired hold).
    let taker = reserving(&app, &[("book", 1)]).await;
    assert!(trail(&app, &id(&late))
        .await
        .contains(&"order.stock_released".to_string()));
    assert_eq!(levels(&app, "book").await, (1, 1, 0));

    let payment = pay(&app, &id(&late), json!({"payment_method": "tok_visa"})).await;
    app.reconciled_to(&payment["id"], "succeeded").await;
    let order = json_of(app.get(&format!("/orders/{}", id(&late))).await).await;
    assert_eq!(order["status"], "paid");
    assert_eq!(
        order["stock_shortfall"],
        json!([{"sku": "book", "missing": 1}])
    );
    assert!(trail(&app, &id(&late))
        .await
        .contains(&"order.stock_shortfall".to_string()));
    // The pens were still there: taken. The book was not oversold.
    assert_eq!(levels(&app, "pen").await, (3, 0, 3));
    assert_eq!(levels(&app, "book").await, (1, 1, 0));
    let payment = pay(&app, &id(&taker), json!({"payment_method": "tok_visa"})).await;
    app.reconciled_to(&payment["id"], "succeeded").await;
    assert_eq!(levels(&app, "book").await, (0, 0, 0));
    let taker = json_of(app.get(&format!("/orders/{}", id(&taker))).await).await;
    assert_eq!(taker["stock_shortfall"], json!([]));
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_account WHERE posted < 0 OR held > posted"
        )
        .await,
        0
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn sixty_four_concurrent_orders_for_k_units_get_exactly_k_reservations() {
    const K: i64 = 10;
    let app = spawn_app_with(Options::default().serve("ONCEPAY_DB_POOL_SIZE", "20")).await;
    stock(&app, "hot", K).await;
    let body = order_of(&[("hot", 1)], true);
    let answers = all_at_once(
        &app,
        (0..64)
            .map(|i| (format!("flash-{i}"), body.clone()))
            .collect(),
    )
    .await;
    let created = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count() as i64;
    let refused = answers
        .iter()
        .filter(|(s, p)| *s == StatusCode::CONFLICT && p["code"] == "insufficient_stock")
        .count() as i64;
    assert_eq!(created, K, "{answers:?}");
    assert_eq!(refused, 64 - K, "every other one is refused for stock");
    // Counted from rows.
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, K);
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_transfer WHERE phase = 'pending' AND unit = 'hot'"
        )
        .await,
        K
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM orders WHERE stock_reserved_until IS NOT NULL"
        )
        .await,
        K
    );
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM ledger_account WHERE posted < 0 OR held > posted"
        )
        .await,
        0
    );
    assert_eq!(levels(&app, "hot").await, (K, K, 0));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn orders_sharing_skus_in_opposite_line_order_never_deadlock() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_DB_POOL_SIZE", "20")).await;
    stock(&app, "x", 100).await;
    stock(&app, "y", 100).await;
    let answers = all_at_once(
        &app,
        (0..32)
            .map(|i| {
                let items = match i % 2 {
                    0 => [("x", 1), ("y", 2)],
                    _ => [("y", 2), ("x", 1)],
                };
                (format!("pair-{i}"), order_of(&items, true))
            })
            .collect(),
    )
    .await;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::CREATED, "{body}");
    }
    assert_eq!(levels(&app, "x").await, (100, 32, 68));
    assert_eq!(levels(&app, "y").await, (100, 64, 36));
    ledger_holds(&app).await;
}

/// An order whose read of the row said the stock was there, but whose
/// reservation finds it gone once it gets the row's lock (another writer
/// took the last unit between the read and the write): the row's own
/// check refuses it, and the order answers `409` as if it had read the
/// truth, writing nothing. The other writer holds the row until the
/// order is waiting for it: ordered by the database's lock, not a sleep.
#[tokio::test]
async fn a_reservation_the_row_refuses_after_its_read_answers_409_and_writes_nothing() {
    let app = spawn_app().await;
    stock(&app, "last", 1).await;
    let mut other = app.db.begin().await.expect("begin");
    sqlx::query(
        "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                credit_account_id, amount, phase, code, holder_account_id, holder)
         SELECT gen_random_uuid(), a.merchant_id, 'stock', a.unit, a.id, s.id, 1, 'single',
                'adjustment_out', a.id, a.owner
           FROM ledger_account a JOIN ledger_account s
             ON s.merchant_id = a.merchant_id AND s.ledger = 'stock' AND s.unit = a.unit
            AND s.owner = 'adjustments'
          WHERE a.ledger = 'stock' AND a.kind = 'holder' AND a.unit = 'last'",
    )
    .execute(&mut *other)
    .await
    .expect("the last unit taken, uncommitted");
    let (body, idem) = (order_of(&[("last", 1)], true), key());
    let release = async {
        let waiting = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
            count(&app, "SELECT count(*) FROM pg_locks WHERE NOT granted").await > 0
        })
        .await;
        other.commit().await.expect("commit");
        waiting
    };
    let ((status, problem), waiting) = tokio::join!(order_with(&app, &idem, &body), release);
    assert!(waiting.is_ok(), "the order never waited for the row");
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["code"], "insufficient_stock");
    assert_eq!(
        problem["skus"],
        json!([{"sku": "last", "requested": 1, "available": 0}])
    );
    assert_eq!(count(&app, "SELECT count(*) FROM orders").await, 0);
    assert_eq!(levels(&app, "last").await, (0, 0, 0));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn the_database_refuses_a_second_resolution_and_reserving_more_than_on_hand() {
    let app = spawn_app().await;
    stock(&app, "book", 2).await;
    let order = reserving(&app, &[("book", 1)]).await;
    let pending: Uuid = sqlx::query_scalar(
        "SELECT id FROM ledger_transfer WHERE phase = 'pending' AND order_id = $1",
    )
    .bind(Uuid::parse_str(&id(&order)).expect("uuid"))
    .fetch_one(&app.db)
    .await
    .expect("the reservation");
    let resolve = |phase: &'static str| {
        sqlx::query(
            "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                    credit_account_id, amount, phase, pending_id, code, holder_account_id, holder)
             SELECT gen_random_uuid(), merchant_id, ledger, unit, debit_account_id,
                    credit_account_id, amount, $2, id, 'release', holder_account_id, holder
               FROM ledger_transfer WHERE id = $1",
        )
        .bind(pending)
        .bind(phase)
    };
    resolve("void").execute(&app.db).await.expect("one release");
    let second = resolve("post").execute(&app.db).await.expect_err("refused");
    assert!(second.to_string().contains("already resolved"), "{second}");
    let third = resolve("void").execute(&app.db).await.expect_err("refused");
    assert!(third.to_string().contains("already resolved"), "{third}");

    // Reserving more than is on hand, whatever the code does.
    let over = sqlx::query(
        "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                credit_account_id, amount, phase, expires_at, code, holder_account_id, holder)
         SELECT gen_random_uuid(), merchant_id, ledger, unit, debit_account_id,
                credit_account_id, 3, 'pending', now() + interval '1 hour', 'reservation',
                holder_account_id, holder
           FROM ledger_transfer WHERE id = $1",
    )
    .bind(pending)
    .execute(&app.db)
    .await
    .expect_err("refused");
    assert!(
        over.to_string().contains("ledger_account_never_negative"),
        "{over}"
    );
    // Totals change through transfers only (issue 54), whatever they
    // would become.
    for set in ["held = posted + 1", "posted = -1", "posted = posted + 1"] {
        let e = sqlx::query(&format!(
            "UPDATE ledger_account SET {set} WHERE ledger = 'stock' AND kind = 'holder'"
        ))
        .execute(&app.db)
        .await
        .expect_err("refused");
        assert!(
            e.to_string().contains("only through a ledger transfer"),
            "{set}: {e}"
        );
    }
    // An order paid with its reservation open, by a statement no code
    // would write: refused at commit.
    stock(&app, "pen", 1).await;
    let open = reserving(&app, &[("pen", 1)]).await;
    let e = sqlx::query("UPDATE orders SET status = 'paid' WHERE id = $1")
        .bind(Uuid::parse_str(&id(&open)).expect("uuid"))
        .execute(&app.db)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("stock reservation"), "{e}");
    assert_eq!(levels(&app, "book").await, (2, 0, 2));
}

#[tokio::test]
async fn a_customer_token_reserves_through_its_own_orders_but_never_adjusts() {
    use crate::identity::{claims, keys, pyjwt_or_skip, sign, trust, Idp, ISSUER};
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let idp = Idp::start(&[&made[0]]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(&made[0], claims("alice", "customer")).await;
    stock(&app, "book", 3).await;

    let r = app
        .call_as(
            &alice,
            reqwest::Method::POST,
            "/inventory/book/adjustments",
            Some(&key()),
            Some(&json!({"quantity": 100})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(json_of(r).await["code"], "insufficient_scope");
    let r = app
        .call_as(&alice, reqwest::Method::GET, "/inventory/book", None, None)
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(levels(&app, "book").await, (3, 0, 3));

    let mut body = order_of(&[("book", 2)], true);
    body["customer_id"] = json!("alice");
    let r = app
        .call_as(
            &alice,
            reqwest::Method::POST,
            "/orders",
            Some(&key()),
            Some(&body),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(json_of(r).await["stock_reserved_until"].is_string());
    assert_eq!(levels(&app, "book").await, (3, 2, 1));
}
