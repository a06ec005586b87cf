//! An order's stock follows its payments (issue 54), over HTTP: an
//! authorization keeps the units reserved until a capture sells them or a
//! void, an expiry or a cancel gives them back (once, also when a capture
//! and a void race); a paid order that reserved nothing still takes its
//! tracked SKUs; a customer's token always reserves and holds a bounded
//! number of unpaid orders; a payment in flight keeps its reservation
//! past the order's deadline; a `409 insufficient_stock` says what `GET
//! /inventory/{sku}` says.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::inventory::{
    count, id, key, ledger_holds, levels, order_of, order_with, past_deadline, pay, reserving,
    stock, trail,
};

/// A manual payment of `order`, authorized: the payment.
async fn authorized(app: &TestApp, order: &Value) -> Value {
    let payment = pay(
        app,
        &id(order),
        json!({"payment_method": "tok_visa", "capture_method": "manual"}),
    )
    .await;
    app.reconciled_to(&payment["id"], "requires_capture").await
}

async fn order_now(app: &TestApp, order: &Value) -> Value {
    json_of(app.get(&format!("/orders/{}", id(order))).await).await
}

async fn post(app: &TestApp, path: &str, body: Value) -> (StatusCode, Value) {
    let r = app.post(path, &key(), &body).await;
    let status = r.status();
    (status, json_of(r).await)
}

/// How many stock transfers of `code` the order has.
async fn transfers(app: &TestApp, order: &Value, code: &str) -> i64 {
    count(
        app,
        &format!(
            "SELECT count(*) FROM ledger_transfer WHERE order_id = '{}' AND code = '{code}'",
            id(order)
        ),
    )
    .await
}

fn released(trail: &[String]) -> usize {
    trail
        .iter()
        .filter(|t| *t == "order.stock_released")
        .count()
}

#[tokio::test]
async fn an_authorization_keeps_the_units_reserved_and_its_void_gives_them_back() {
    let app = spawn_app().await;
    stock(&app, "book", 5).await;
    let order = reserving(&app, &[("book", 2)]).await;
    assert_eq!(order["stock_reservation"], "reserved", "{order}");
    let payment = authorized(&app, &order).await;
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "authorized");
    assert_eq!(levels(&app, "book").await, (5, 2, 3), "reserved, not sold");
    assert_eq!(now["stock_reservation"], "reserved", "{now}");
    // The reservation lasts as long as the authorization.
    let until = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().expect(field)).expect("a time")
    };
    assert_eq!(
        until(&now, "stock_reserved_until"),
        until(&payment, "capture_before")
    );

    let (status, voided) = post(
        &app,
        &format!("/payments/{}/void", payment["id"].as_str().unwrap()),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "awaiting_payment");
    assert_eq!(now["stock_reservation"], "released", "{now}");
    assert_eq!(
        levels(&app, "book").await,
        (5, 0, 5),
        "on hand and available as before the order"
    );
    assert_eq!(released(&trail(&app, &id(&order)).await), 1);
    assert_eq!(transfers(&app, &order, "conversion").await, 0);
    ledger_holds(&app).await;
}

#[tokio::test]
async fn cancelling_an_authorized_order_and_an_expired_authorization_give_the_units_back() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_RECONCILE_AFTER", "100ms")
            .sandbox("ONCEPAY_SANDBOX_CAPTURE_WINDOW", "2s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    stock(&app, "book", 4).await;
    let cancelled = reserving(&app, &[("book", 1)]).await;
    let expiring = reserving(&app, &[("book", 2)]).await;
    authorized(&app, &cancelled).await;
    let payment = authorized(&app, &expiring).await;
    assert_eq!(levels(&app, "book").await, (4, 3, 1));

    let (status, order) = post(
        &app,
        &format!("/orders/{}/cancel", id(&cancelled)),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{order}");
    assert_eq!(order["status"], "cancelled");
    assert_eq!(order["stock_reservation"], "released");
    assert_eq!(levels(&app, "book").await, (4, 2, 2));

    // The authorization expires at the provider; the sweeper ends it here.
    let deadline = chrono::DateTime::parse_from_rfc3339(
        payment["capture_before"].as_str().expect("capture_before"),
    )
    .expect("a time");
    let gone = oncepay_testkit::ready::until(Duration::from_secs(30), || async {
        if chrono::Utc::now() > deadline {
            oncepay::workers::sweeper::authorizations(&app.ctx)
                .await
                .ok();
        }
        order_now(&app, &expiring).await["status"] == "awaiting_payment"
    })
    .await;
    assert!(gone.is_ok(), "the expired authorization was never voided");
    assert_eq!(levels(&app, "book").await, (4, 0, 4));
    let now = order_now(&app, &expiring).await;
    assert_eq!(now["stock_reservation"], "released", "{now}");
    for order in [&cancelled, &expiring] {
        assert_eq!(released(&trail(&app, &id(order)).await), 1);
    }
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_partial_capture_sells_the_units_and_the_order_says_what_was_captured() {
    let app = spawn_app().await;
    stock(&app, "book", 5).await;
    // 2 × 2000 = 4000.
    let mut body = order_of(&[("book", 2)], true);
    body["items"][0]["unit_amount"] = json!(2000);
    let (status, order) = order_with(&app, &key(), &body).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert_eq!(
        (&order["amount_captured"], &order["amount_refunded"]),
        (&json!(0), &json!(0))
    );
    let payment = authorized(&app, &order).await;
    let (status, captured) = post(
        &app,
        &format!("/payments/{}/capture", payment["id"].as_str().unwrap()),
        json!({"amount": 3000}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{captured}");
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "paid");
    assert_eq!(now["amount"], 4000);
    assert_eq!(now["amount_captured"], 3000, "{now}");
    assert_eq!(now["stock_reservation"], "converted");
    assert_eq!(levels(&app, "book").await, (3, 0, 3), "sold");

    let (status, refund) = post(
        &app,
        &format!("/payments/{}/refunds", payment["id"].as_str().unwrap()),
        json!({"amount": 1000}),
    )
    .await;
    assert!(status.is_success(), "{refund}");
    app.poll_until(&format!("/orders/{}", id(&order)), |o| {
        o["amount_refunded"] == 1000
    })
    .await;
    assert_eq!(
        levels(&app, "book").await,
        (3, 0, 3),
        "a refund restocks nothing"
    );
    ledger_holds(&app).await;
}

/// Captures and voids fired at once at the authorization of a reserving
/// order: one of them wins, and the stock moves once, the winner's way.
#[tokio::test]
async fn captures_and_voids_racing_on_a_reserving_order_sell_or_release_once() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_RECONCILE_AFTER", "100ms")).await;
    stock(&app, "book", 30).await;
    for round in 0..3 {
        let order = reserving(&app, &[("book", 2)]).await;
        let payment = authorized(&app, &order).await;
        let pid = payment["id"].as_str().unwrap().to_string();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..12 {
            let (http, base, api_key, pid) = (
                app.http.clone(),
                app.base.clone(),
                app.key.clone(),
                pid.clone(),
            );
            tasks.spawn(async move {
                let action = if i % 2 == 0 { "capture" } else { "void" };
                http.post(format!("{base}/payments/{pid}/{action}"))
                    .bearer_auth(api_key)
                    .header("Idempotency-Key", format!("race-{round}-{i}"))
                    .json(&json!({}))
                    .send()
                    .await
                    .expect("sent")
                    .status()
            });
        }
        let answers = tasks.join_all().await;
        assert_eq!(
            answers.iter().filter(|s| **s == StatusCode::OK).count(),
            1,
            "{answers:?}"
        );
        let now = order_now(&app, &order).await;
        let (sold, back) = (
            transfers(&app, &order, "conversion").await,
            transfers(&app, &order, "release").await,
        );
        match now["status"].as_str() {
            Some("paid") => assert_eq!((sold, back), (1, 0), "{now}"),
            Some("awaiting_payment") => assert_eq!((sold, back), (0, 1), "{now}"),
            other => panic!("the race ended {other:?}: {now}"),
        }
    }
    let converted = count(
        &app,
        "SELECT count(*) FROM ledger_transfer WHERE code = 'conversion'",
    )
    .await;
    assert_eq!(
        levels(&app, "book").await,
        (30 - 2 * converted, 0, 30 - 2 * converted)
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_paid_order_that_reserved_nothing_takes_its_tracked_skus() {
    let app = spawn_app().await;
    stock(&app, "book", 1).await;
    let (status, order) = order_with(
        &app,
        &key(),
        &order_of(&[("book", 5), ("untracked", 1)], false),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    assert!(order["stock_reserved_until"].is_null());
    assert!(order["stock_reservation"].is_null());
    let payment = pay(&app, &id(&order), json!({"payment_method": "tok_visa"})).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "paid");
    assert_eq!(
        now["stock_shortfall"],
        json!([{"sku": "book", "missing": 4}]),
        "{now}"
    );
    assert!(now["stock_reservation"].is_null(), "it reserved nothing");
    assert_eq!(
        levels(&app, "book").await,
        (0, 0, 0),
        "the unit left the stock"
    );
    assert!(trail(&app, &id(&order))
        .await
        .contains(&"order.stock_shortfall".to_string()));
    // Paid in full where the stock has it: nothing short.
    stock(&app, "book", 3).await;
    let (_, second) = order_with(&app, &key(), &order_of(&[("book", 2)], false)).await;
    pay(&app, &id(&second), json!({"payment_method": "tok_visa"})).await;
    assert_eq!(order_now(&app, &second).await["stock_shortfall"], json!([]));
    assert_eq!(levels(&app, "book").await, (1, 0, 1));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_customer_token_always_reserves_and_holds_at_most_its_limit_of_unpaid_orders() {
    use crate::identity::{claims, keys, pyjwt_or_skip, sign, trust, Idp, ISSUER};
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let idp = Idp::start(&[&made[0]]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(&made[0], claims("alice", "customer")).await;
    stock(&app, "book", 100).await;
    let as_alice = |body: Value, idem: String| {
        let (app, alice) = (&app, &alice);
        async move {
            let r = app
                .call_as(
                    alice,
                    reqwest::Method::POST,
                    "/orders",
                    Some(&idem),
                    Some(&body),
                )
                .await;
            let status = r.status();
            (status, json_of(r).await)
        }
    };
    let mut body = order_of(&[("book", 1)], false);
    body["customer_id"] = json!("alice");
    let (status, problem) = as_alice(body.clone(), key()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["code"], "validation_failed");
    assert_eq!(problem["field"], "reserve_stock");
    body.as_object_mut().unwrap().remove("reserve_stock");

    // Six at once: three are created, each reserving; three are refused.
    let answers = futures_join(
        (0..6)
            .map(|_| as_alice(body.clone(), key()))
            .collect::<Vec<_>>(),
    )
    .await;
    let created: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, o)| o)
        .collect();
    assert_eq!(created.len(), 3, "{answers:?}");
    for (status, body) in &answers {
        if *status != StatusCode::CREATED {
            assert_eq!(*status, StatusCode::CONFLICT, "{body}");
            assert_eq!(body["code"], "reservation_limit_reached", "{body}");
        }
    }
    assert!(created.iter().all(|o| o["stock_reservation"] == "reserved"));
    assert_eq!(levels(&app, "book").await, (100, 3, 97));

    // One paid frees a place; and a customer's own authorized order
    // cancelled gives its units back.
    pay(&app, &id(created[0]), json!({"payment_method": "tok_visa"})).await;
    let (status, fourth) = as_alice(body.clone(), key()).await;
    assert_eq!(status, StatusCode::CREATED, "{fourth}");
    authorized(&app, created[1]).await;
    let r = app
        .call_as(
            &alice,
            reqwest::Method::POST,
            &format!("/orders/{}/cancel", id(created[1])),
            Some(&key()),
            Some(&json!({})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(levels(&app, "book").await, (99, 2, 97));
    ledger_holds(&app).await;
}

/// Awaits every future at once, on this task.
async fn futures_join<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    out.into_iter().map(|v| v.expect("done")).collect()
}

fn bank_url(payment: &Value) -> String {
    assert_eq!(payment["next_action"]["type"], "redirect", "{payment}");
    payment["next_action"]["url"].as_str().unwrap().to_string()
}

/// The customer's choice at the sandbox's bank page.
async fn at_the_bank(payment: &Value, choice: &str) {
    let answer = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .post(format!("{}/{choice}", bank_url(payment)))
        .send()
        .await
        .expect("the bank answers");
    assert!(
        answer.status().is_redirection() || answer.status().is_success(),
        "{}",
        answer.status()
    );
}

#[tokio::test]
async fn a_payment_in_flight_keeps_its_reservation_past_the_orders_deadline() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_STOCK_RESERVATION_TTL", "2s")).await;
    stock(&app, "lamp", 1).await;
    let order = reserving(&app, &[("lamp", 1)]).await;
    let r = app
        .post(
            "/payments",
            &key(),
            &json!({"order_id": id(&order), "payment_method": "tok_3ds"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let payment = json_of(r).await;
    past_deadline(&order).await;
    assert_eq!(
        levels(&app, "lamp").await,
        (1, 1, 0),
        "held while in flight"
    );
    let swept = oncepay::workers::sweeper::expire_reservations(&app.ctx)
        .await
        .expect("sweeps");
    assert_eq!(swept, 0, "nothing to release");
    let (status, problem) = order_with(&app, &key(), &order_of(&[("lamp", 1)], true)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");

    at_the_bank(&payment, "approve").await;
    app.reconciled_to(&payment["id"], "succeeded").await;
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "paid");
    assert_eq!(now["stock_shortfall"], json!([]), "nobody took its unit");
    assert_eq!(now["stock_reservation"], "converted");
    assert_eq!(levels(&app, "lamp").await, (0, 0, 0));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_payment_that_fails_after_the_deadline_releases_the_reservation() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_STOCK_RESERVATION_TTL", "2s")).await;
    stock(&app, "lamp", 1).await;
    let order = reserving(&app, &[("lamp", 1)]).await;
    let r = app
        .post(
            "/payments",
            &key(),
            &json!({"order_id": id(&order), "payment_method": "tok_3ds_declined"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let payment = json_of(r).await;
    past_deadline(&order).await;
    assert_eq!(levels(&app, "lamp").await, (1, 1, 0));
    at_the_bank(&payment, "approve").await;
    app.reconciled_to(&payment["id"], "failed").await;
    assert_eq!(levels(&app, "lamp").await, (1, 0, 1), "released at once");
    let now = order_now(&app, &order).await;
    assert_eq!(now["status"], "awaiting_payment");
    assert_eq!(now["stock_reservation"], "released", "{now}");
    assert_eq!(released(&trail(&app, &id(&order)).await), 1);
    let (status, other) = order_with(&app, &key(), &order_of(&[("lamp", 1)], true)).await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_payment_that_fails_before_the_deadline_leaves_the_reservation_to_its_deadline() {
    let app = spawn_app().await;
    stock(&app, "lamp", 1).await;
    let order = reserving(&app, &[("lamp", 1)]).await;
    let payment = pay(&app, &id(&order), json!({"payment_method": "tok_declined"})).await;
    assert_eq!(payment["status"], "failed", "{payment}");
    assert_eq!(levels(&app, "lamp").await, (1, 1, 0), "still reserved");
    let open_until: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT o.expires_at FROM ledger_open_pending o
           JOIN ledger_transfer t ON t.id = o.pending_id WHERE t.order_id = $1::uuid",
    )
    .bind(id(&order))
    .fetch_one(&app.db)
    .await
    .expect("one open reservation");
    let until =
        chrono::DateTime::parse_from_rfc3339(order["stock_reserved_until"].as_str().unwrap())
            .expect("a time");
    assert_eq!(open_until, until, "back to the order's own deadline");
    assert_eq!(
        order_now(&app, &order).await["stock_reservation"],
        "reserved"
    );
    // Paid again with another method: sold.
    pay(&app, &id(&order), json!({"payment_method": "tok_visa"})).await;
    assert_eq!(levels(&app, "lamp").await, (0, 0, 0));
    ledger_holds(&app).await;
}

/// An order refused for stock says what `GET /inventory/{sku}` says at
/// that moment, also when the stock was held by a reservation past its
/// deadline whose order another transaction holds (being paid or
/// cancelled right now): the order waits for that transaction instead of
/// counting the lapsed reservation. Ordered by the database's lock.
#[tokio::test]
async fn a_409_insufficient_stock_says_what_the_stock_read_says() {
    let app = spawn_app_with(crate::inventory::short_app()).await;
    stock(&app, "vase", 1).await;
    let first = reserving(&app, &[("vase", 1)]).await;
    past_deadline(&first).await;
    let mut other = app.db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM orders WHERE id = $1::uuid FOR UPDATE")
        .bind(id(&first))
        .execute(&mut *other)
        .await
        .expect("the first order held by another transaction");
    let (body, idem) = (order_of(&[("vase", 2)], true), key());
    let done = std::sync::atomic::AtomicBool::new(false);
    let release = async {
        let waiting = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
            done.load(std::sync::atomic::Ordering::SeqCst)
                || count(&app, "SELECT count(*) FROM pg_locks WHERE NOT granted").await > 0
        })
        .await;
        other.commit().await.expect("commit");
        waiting
    };
    let order = async {
        let answer = order_with(&app, &idem, &body).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        answer
    };
    let ((status, problem), waiting) = tokio::join!(order, release);
    assert!(waiting.is_ok());
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    let (_, _, available) = levels(&app, "vase").await;
    assert_eq!(available, 1);
    assert_eq!(
        problem["skus"],
        json!([{"sku": "vase", "requested": 2, "available": available}])
    );
    ledger_holds(&app).await;
}
