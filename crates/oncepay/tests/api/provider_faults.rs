//! Money safety under the faults real providers produce, which the sandbox
//! cannot make itself: a fault proxy sits between oncepay and the sandbox.
//! Each test counts what the provider's books hold at the end.

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay::workers::reconciler;
use oncepay_testkit::fault_proxy::{Fault, FaultProxy, Route};

/// Webhooks off (the reconciler must settle everything), async charges
/// settled by the sandbox after 300 ms, every check due at once.
fn through_a_fault_proxy() -> Options {
    Options::default()
        .with_fault_proxy()
        .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
        .serve("ONCEPAY_RECONCILE_AFTER", "0s")
}

impl TestApp {
    pub(crate) fn proxy(&self) -> &FaultProxy {
        self.proxy
            .as_ref()
            .expect("this test runs with a fault proxy")
    }

    /// One reconciler pass with every pending row and every decline to
    /// confirm due now.
    pub(crate) async fn reconcile(&self) -> reconciler::Pass {
        sqlx::query("UPDATE payment_attempt SET next_check_at = now() WHERE status = 'pending'")
            .execute(&self.db)
            .await
            .expect("due");
        for table in ["payment_attempt", "refund"] {
            sqlx::query(&format!(
                "UPDATE {table} SET decline_check_at = now() WHERE decline_check_at IS NOT NULL"
            ))
            .execute(&self.db)
            .await
            .expect("due");
        }
        for table in ["refund", "payment_capture"] {
            sqlx::query(&format!(
                "UPDATE {table} SET next_check_at = now() WHERE status = 'pending'"
            ))
            .execute(&self.db)
            .await
            .expect("due");
        }
        reconciler::pass(&self.ctx).await.expect("reconciler pass")
    }
}

/// A lying gateway: the call reaches the provider and moves the money, and
/// the answer that comes back is a decline.
fn declined_after_the_fact() -> Fault {
    Fault::ForwardThenAnswer {
        status: 402,
        body: r#"{"code":"card_declined","detail":"declined"}"#.into(),
    }
}

fn succeeded(charges: &[Value]) -> usize {
    charges
        .iter()
        .filter(|c| c["status"] == "succeeded")
        .count()
}

#[tokio::test]
async fn a_refused_or_unreadable_status_read_is_not_a_decline() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let payment_path = format!("/payments/{}", payment["id"].as_str().expect("id"));
    wait_for_charge_status(&app, payment["id"].as_str().expect("id"), "succeeded").await;

    // A credential outage, a gateway timeout, a redirect, a WAF page, and a
    // provider that is down: none of them says anything about the charge.
    let faults = [
        Fault::answer(403, "forbidden"),
        Fault::answer(401, "unauthorized"),
        Fault::answer(408, "request_timeout"),
        Fault::answer(302, "moved"),
        Fault::answer(409, "conflict"),
        Fault::Garbage,
        Fault::Down,
    ];
    for fault in faults {
        app.proxy().set(Route::StatusRead, fault.clone());
        app.reconcile().await;
        assert_eq!(app.status_of(&payment_path).await, "pending", "{fault:?}");
        assert_eq!(
            app.status_of(&format!("/orders/{order_id}")).await,
            "awaiting_payment"
        );
        // The order is not payable again while the outcome is unknown.
        let (again, body) = app.pay(&order_id, "tok_visa").await;
        assert_eq!(again, StatusCode::CONFLICT, "{fault:?}");
        assert_eq!(body["code"], "payment_in_progress");
    }
    assert!(app.proxy().faulted(Route::StatusRead) >= 7);
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE status = 'failed'")
            .await,
        0,
        "no decline was invented"
    );

    app.proxy().heal();
    app.reconcile().await;
    assert_eq!(app.status_of(&payment_path).await, "succeeded");
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1, "one charge in the provider's books");
    assert_eq!(succeeded(&charges), 1);
}

#[tokio::test]
async fn a_409_on_a_charge_leaves_the_payment_pending_not_failed() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    app.proxy()
        .set(Route::Charge, Fault::answer(409, "idempotency_key_in_use"));
    let (status, payment) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{payment}");
    assert_eq!(payment["status"], "pending");
    assert!(payment["failure_code"].is_null());
    let (again, body) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(again, StatusCode::CONFLICT);
    assert_eq!(body["code"], "payment_in_progress");

    app.proxy().heal();
    app.reconcile().await;
    let id = payment["id"].as_str().expect("id");
    assert_eq!(app.status_of(&format!("/payments/{id}")).await, "succeeded");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["charges"], 1);
}

#[tokio::test]
async fn a_refund_retried_after_its_key_expired_is_not_paid_twice() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_IDEMPOTENCY_TTL", "2s")
            .serve("ONCEPAY_REPLAY_CACHE_ENTRIES", "0"),
    )
    .await;
    let order_id = app.create_order().await;
    let (_, payment) = app.pay(&order_id, "tok_visa").await;
    let refunds = format!("/payments/{}/refunds", payment["id"].as_str().expect("id"));
    let body = json!({"amount": 1000});
    let first = app.post(&refunds, "refund-once", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = json_of(first).await;

    // The key expires and the sweeper deletes its record.
    sqlx::query("UPDATE idempotency_record SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .expect("expire");
    oncepay::workers::sweeper::sweep(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record WHERE idempotency_key = 'refund-once'")
            .await,
        0
    );

    let again = app.post(&refunds, "refund-once", &body).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(json_of(again).await["id"], first["id"], "the same refund");
    // The same key asking for another amount is a conflict, not a refund.
    let other = app
        .post(&refunds, "refund-once", &json!({"amount": 500}))
        .await;
    assert_eq!(other.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(other).await["code"], "idempotency_key_reused");

    assert_eq!(app.count("SELECT count(*) FROM refund").await, 1);
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["refunds"], 1);
    assert_eq!(ledger["totals"]["refunded_amount"], 1000);
}

#[tokio::test]
async fn cancel_is_refused_while_a_refund_is_pending_and_never_leaves_money_captured() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    let (_, payment) = app.pay(&order_id, "tok_visa").await;
    let payment_id = payment["id"].as_str().expect("id");
    let amount = payment["amount"].as_i64().expect("amount");

    // A partial refund that cannot reach the provider stays pending.
    app.proxy().set(Route::Refund, Fault::Down);
    let r = app
        .post(
            &format!("/payments/{payment_id}/refunds"),
            "partial",
            &json!({"amount": 1000}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let cancel = app
        .post(&format!("/orders/{order_id}/cancel"), "cancel", &json!({}))
        .await;
    assert_eq!(cancel.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(cancel).await["code"], "refund_in_progress");
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
    assert_eq!(app.count("SELECT count(*) FROM refund").await, 1);

    // Once the refund settles, a cancel (new intent) refunds the rest.
    app.proxy().heal();
    app.reconcile().await;
    let cancel = app
        .post(
            &format!("/orders/{order_id}/cancel"),
            "cancel-2",
            &json!({}),
        )
        .await;
    assert_eq!(cancel.status(), StatusCode::OK);
    assert_eq!(json_of(cancel).await["status"], "cancelled");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(
        charges[0]["amount_refunded"], amount,
        "nothing left captured"
    );
    let cancelled_with_money = app
        .count(
            "SELECT count(*) FROM orders o JOIN payment_attempt p ON p.order_id = o.id
              WHERE o.status = 'cancelled' AND p.status = 'succeeded'
                AND p.refunded_amount < p.amount",
        )
        .await;
    assert_eq!(cancelled_with_money, 0);
}

#[tokio::test]
async fn money_taken_for_a_payment_held_as_failed_is_refunded_as_an_incident() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    // The provider charges, but its answer says declined (a lying gateway).
    app.proxy().set(Route::Charge, declined_after_the_fact());
    let (status, payment) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(payment["status"], "failed");
    app.proxy().heal();
    let payment_id = payment["id"].as_str().expect("id");
    let charge = wait_for_charge_status(&app, payment_id, "succeeded").await;

    // The provider reports the success; its own read confirms it.
    let event = json!({
        "id": format!("evt_{}", Uuid::now_v7().simple()),
        "type": "charge.succeeded",
        "data": {"object": {
            "id": charge["id"], "object": "charge", "idempotency_key": payment_id,
            "status": "succeeded", "amount": charge["amount"], "currency": "EUR",
        }},
    });
    let deliver = || post_signed_webhook(&app, &event);
    // While the provider cannot be asked, the report is not spent: it is
    // refused with 503 so the provider delivers it again.
    app.proxy().set(Route::StatusRead, Fault::Down);
    let r = deliver().await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(app.count("SELECT count(*) FROM webhook_event").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    app.proxy().heal();
    let r = deliver().await;
    assert_eq!(r.status(), StatusCode::OK);

    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'charge_on_failed_attempt'")
            .await,
        1
    );
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_incidents_total{kind=\"charge_on_failed_attempt\"} 1"));
    // The compensating refund goes through the ordinary refund path.
    app.reconcile().await;
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["amount_refunded"], charges[0]["amount"]);
    assert_eq!(
        app.count("SELECT count(*) FROM refund WHERE incident AND status = 'succeeded'")
            .await,
        1
    );
    // The report repeated (a duplicate or a reconciler pass) changes nothing.
    app.reconcile().await;
    assert_eq!(app.ledger().await["totals"]["refunds"], 1);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 1);
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "failed"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "awaiting_payment",
        "the incident refund does not touch the order"
    );
    // The order is paid once, by a new intent.
    let (status, second) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(second["status"], "succeeded");
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
}

/// A manual payment of the default order (2800), authorized.
async fn authorized(app: &TestApp) -> (String, String) {
    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "manual"}),
        )
        .await;
    let payment = json_of(r).await;
    assert_eq!(payment["status"], "requires_capture", "{payment}");
    (order_id, payment["id"].as_str().expect("id").to_string())
}

/// A decline answering a capture that was made (a gateway on the way)
/// proves nothing about the hold, so the payment is not voided on its
/// word, nor the capture failed: a refused capture is read back at the
/// provider before it is final, and the payment succeeds with the capture
/// the provider made, captured once, nothing refunded. (`make chaos` found
/// payments voided here while the provider had captured them.)
#[tokio::test]
async fn a_capture_answered_with_a_decline_is_read_at_the_provider_not_taken_as_a_void() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let (order_id, payment_id) = authorized(&app).await;
    app.proxy().set(Route::Charge, declined_after_the_fact());
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            &Uuid::new_v4().to_string(),
            &json!({"amount": 1000}),
        )
        .await;
    app.proxy().heal();
    let status = r.status();
    let captured = json_of(r).await;
    assert_eq!(status, StatusCode::OK, "read back at once: {captured}");
    assert_eq!(captured["status"], "succeeded");
    app.reconcile().await;
    let payment = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    assert_eq!(payment["amount_captured"], 1000);
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["amount_captured"], 1000);
    assert_eq!(charges[0]["amount_refunded"], 0);
    assert_eq!(
        app.ledger().await["captures"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
}

/// A capture the provider declined, whose answer was lost on the way
/// (`202`): the reconciler reads the charge still held, sends the capture
/// again with its own key, meets the same decline (the sandbox answers a
/// declined key the same, as Stripe replays a saved answer) and ends the
/// capture `failed` with its code. The hold stands: the payment is still
/// `requires_capture`, and a new capture (a new key) is made, once.
#[tokio::test]
async fn a_declined_capture_whose_answer_was_lost_ends_failed_at_the_reconciler() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let (order_id, payment_id) = authorized(&app).await;
    let payment = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    let charge = payment["provider_charge_id"].as_str().expect("charge id");
    let r = app
        .http
        .post(format!(
            "{}/v1/charges/{charge}/refuse_capture",
            app.sandbox
        ))
        .json(&json!({"code": "insufficient_funds"}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(r.status(), StatusCode::OK);
    app.proxy().set(
        Route::Charge,
        Fault::ForwardThenAnswer {
            status: 503,
            body: r#"{"code":"unavailable"}"#.into(),
        },
    );
    let (status, pending) = {
        let r = app
            .post(
                &format!("/payments/{payment_id}/capture"),
                "lost-decline",
                &json!({"amount": 1000}),
            )
            .await;
        (r.status(), json_of(r).await)
    };
    app.proxy().heal();
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "requires_capture");
    app.reconcile().await;
    let row: (String, Option<String>) = sqlx::query_as(
        "SELECT status, failure_code FROM payment_capture WHERE payment_id = $1::uuid",
    )
    .bind(&payment_id)
    .fetch_one(&app.db)
    .await
    .expect("the capture row");
    assert_eq!(
        row,
        ("failed".to_string(), Some("insufficient_funds".to_string()))
    );
    let held = json_of(app.get(&format!("/payments/{payment_id}")).await).await;
    assert_eq!(held["status"], "requires_capture", "{held}");
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "authorized"
    );
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            "after-the-decline",
            &json!({"amount": 900}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["amount_captured"], 900);
    assert_eq!(
        app.ledger().await["captures"].as_array().map(Vec::len),
        Some(1)
    );
}

/// A manual payment answered with a decline the provider did not make
/// (it authorized the charge): failed here, held there. Its order and id.
async fn failed_behind_a_held_charge(app: &TestApp) -> (String, String) {
    let order_id = app.create_order().await;
    app.proxy().set(Route::Charge, declined_after_the_fact());
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order_id, "payment_method": "tok_visa", "capture_method": "manual"}),
        )
        .await;
    app.proxy().heal();
    let payment = json_of(r).await;
    assert_eq!(payment["status"], "failed", "{payment}");
    let payment_id = payment["id"].as_str().expect("id").to_string();
    (order_id, payment_id)
}

/// A manual payment behind a lying decline: the provider holds the
/// customer's funds for a payment that failed here. The decline's
/// confirming read finds the authorization and releases it at once,
/// instead of leaving it to expire days later; the payment stays failed,
/// the order payable, nothing was captured or refunded.
#[tokio::test]
async fn an_authorization_behind_a_declined_answer_is_released_not_left_to_expire() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let (order_id, payment_id) = failed_behind_a_held_charge(&app).await;
    let payment_id = payment_id.as_str();
    assert_eq!(
        wait_for_charge_status(&app, payment_id, "authorized").await["status"],
        "authorized"
    );
    app.reconcile().await;
    let charge = &app.charges_for(&order_id).await[0];
    assert_eq!(charge["status"], "voided", "{charge}");
    assert_eq!(charge["amount_captured"], 0);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE id = '{payment_id}' AND status = 'failed' AND decline_check_at IS NULL"
        ))
        .await,
        1
    );
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "awaiting_payment"
    );
}

/// The same stray hold heard of from the provider (as when a customer
/// approves at the bank after the payment failed): the report, confirmed
/// by a read, queues the read that releases it.
#[tokio::test]
async fn a_reported_authorization_of_a_failed_payment_is_released() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let (order_id, payment_id) = failed_behind_a_held_charge(&app).await;
    let payment_id = payment_id.as_str();
    let held = wait_for_charge_status(&app, payment_id, "authorized").await;
    // The decline stands confirmed already: only the report can tell.
    sqlx::query("UPDATE payment_attempt SET decline_check_at = NULL")
        .execute(&app.db)
        .await
        .expect("confirmed");
    let event = json!({
        "id": format!("evt_{}", Uuid::now_v7().simple()),
        "type": "charge.authorized",
        "data": {"object": held},
    });
    let r = post_signed_webhook(&app, &event).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE id = '{payment_id}' AND decline_check_at IS NOT NULL"
        ))
        .await,
        1,
        "the report queues a confirming read"
    );
    app.reconcile().await;
    let charge = &app.charges_for(&order_id).await[0];
    assert_eq!(charge["status"], "voided", "{charge}");
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "failed"
    );
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
}

/// If a hold we hold as voided turns out captured in part at the provider
/// (its refusal of the capture was a lie), the incident refunds what the
/// provider took, not the payment's whole amount, which it would refuse.
#[tokio::test]
async fn a_hold_captured_behind_our_void_is_refunded_as_an_incident_for_what_was_taken() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let (order_id, payment_id) = authorized(&app).await;
    let charge = &app.charges_for(&order_id).await[0];
    // The capture goes through; the answer says the hold was voided.
    let mut voided = charge.clone();
    voided["status"] = json!("voided");
    app.proxy().set(
        Route::Charge,
        Fault::ForwardThenAnswer {
            status: 409,
            body: json!({"code": "charge_voided", "detail": "voided", "charge": voided})
                .to_string(),
        },
    );
    let r = app
        .post(
            &format!("/payments/{payment_id}/capture"),
            &Uuid::new_v4().to_string(),
            &json!({"amount": 1000}),
        )
        .await;
    app.proxy().heal();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "voided"
    );
    // The provider reports the capture; its own read confirms it.
    let captured = wait_for_charge_status(&app, &payment_id, "captured").await;
    let event = json!({
        "id": format!("evt_{}", Uuid::now_v7().simple()),
        "type": "charge.captured",
        "data": {"object": captured},
    });
    let r = post_signed_webhook(&app, &event).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'charge_on_failed_attempt' AND amount = 1000")
            .await,
        1
    );
    app.reconcile().await;
    let charge = &app.charges_for(&order_id).await[0];
    assert_eq!(charge["amount_refunded"], 1000, "{charge}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM refund WHERE incident AND status = 'succeeded' AND amount = 1000"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_charge_behind_a_declined_answer_is_found_and_refunded_without_any_webhook() {
    // Webhooks off: the provider never reports the charge it took.
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    app.proxy().set(Route::Charge, declined_after_the_fact());
    let (status, first) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(first["status"], "failed");
    app.proxy().heal();
    let first_id = first["id"].as_str().expect("id");
    wait_for_charge_status(&app, first_id, "succeeded").await;
    // The customer, told "declined", pays again, and that charge is real.
    let (status, second) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(second["status"], "succeeded");

    // A read that proves nothing concludes nothing: the decline stays to
    // be confirmed.
    app.proxy()
        .set(Route::StatusRead, Fault::answer(403, "forbidden"));
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 0);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    app.proxy().heal();
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'charge_on_failed_attempt'")
            .await,
        1
    );

    // The incident's refund returns the first charge whole; the second
    // stays: the customer paid once.
    app.reconcile().await;
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 2);
    for charge in &charges {
        let refunded = if charge["idempotency_key"] == first_id {
            charge["amount"].clone()
        } else {
            json!(0)
        };
        assert_eq!(charge["amount_refunded"], refunded, "{charge}");
    }
    assert_eq!(
        app.status_of(&format!("/payments/{first_id}")).await,
        "failed"
    );
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
    // Confirmed once: later passes neither read it again nor record more.
    let reads = app.proxy().forwarded(Route::StatusRead);
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 0);
    assert_eq!(app.proxy().forwarded(Route::StatusRead), reads);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 1);
    assert_eq!(app.ledger().await["totals"]["refunds"], 1);
}

#[tokio::test]
async fn a_true_decline_costs_one_confirming_read_and_nothing_else() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    let (status, declined) = app.pay(&order_id, "tok_declined").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(declined["status"], "failed");
    let (status, paid) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE decline_check_at IS NOT NULL")
            .await,
        1,
        "only the decline waits for its confirming read"
    );

    let reads = app.proxy().forwarded(Route::StatusRead);
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 1);
    assert_eq!(app.proxy().forwarded(Route::StatusRead), reads + 1);
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 0);
    assert_eq!(app.proxy().forwarded(Route::StatusRead), reads + 1);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    assert_eq!(app.ledger().await["totals"]["refunds"], 0);
    assert_eq!(
        app.status_of(&format!(
            "/payments/{}",
            declined["id"].as_str().expect("id")
        ))
        .await,
        "failed"
    );
}

#[tokio::test]
async fn a_refund_paid_behind_a_declined_answer_is_found_without_any_webhook() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let order_id = app.create_order().await;
    let (_, payment) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(payment["status"], "succeeded");
    let refunds = format!("/payments/{}/refunds", payment["id"].as_str().expect("id"));
    // The provider pays the refund, but its answer says declined.
    app.proxy().set(Route::Refund, declined_after_the_fact());
    let r = app
        .post(&refunds, "refund-1", &json!({"amount": 1000}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "failed");
    app.proxy().heal();
    assert_eq!(app.ledger().await["totals"]["refunds"], 1, "the money went");

    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'refund_on_failed_refund'")
            .await,
        1,
        "a person is told"
    );
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_incidents_total{kind=\"refund_on_failed_refund\"} 1"));
    // Confirmed once; never sent again.
    let pass = app.reconcile().await;
    assert_eq!(pass.declines_confirmed, 0);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 1);
    assert_eq!(app.ledger().await["totals"]["refunds"], 1);
}

#[tokio::test]
async fn a_pending_payment_past_the_alarm_threshold_is_logged_and_counted_once() {
    let app = spawn_app_with(through_a_fault_proxy().serve("ONCEPAY_PENDING_ALARM", "100ms")).await;
    let order_id = app.create_order().await;
    app.proxy().set(Route::Charge, Fault::Down);
    app.proxy().set(Route::StatusRead, Fault::Down);
    let (status, _) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    sqlx::query("UPDATE payment_attempt SET created_at = now() - interval '1 minute'")
        .execute(&app.db)
        .await
        .expect("age it");
    assert_eq!(app.reconcile().await.alarms, 1);
    assert_eq!(app.reconcile().await.alarms, 0, "once per payment");
    let metrics = app.ctx.metrics.render();
    assert!(
        metrics.contains("oncepay_pending_alarms_total{kind=\"payment\"} 1"),
        "{metrics}"
    );
    let oldest = metrics
        .lines()
        .find(|l| l.starts_with("oncepay_oldest_pending_seconds{kind=\"payment\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .expect("gauge");
    assert!(oldest >= 60.0, "{oldest}");
}

/// The look for rows past the threshold reads every row pending since the
/// last vacuum, so a process makes it a thirtieth of the threshold apart
/// (2 s of 60 s here), not at every pass; an alarm is at most that late.
#[tokio::test]
async fn the_alarm_is_looked_for_a_thirtieth_of_its_threshold_apart_not_at_every_pass() {
    // The reconciler asks the provider about neither payment (that is
    // an hour away), so a pass takes milliseconds, well inside 2 s.
    let app = spawn_app_with(
        through_a_fault_proxy()
            .serve("ONCEPAY_PENDING_ALARM", "60s")
            .serve("ONCEPAY_RECONCILE_AFTER", "1h"),
    )
    .await;
    app.proxy().set(Route::Charge, Fault::Down);
    app.proxy().set(Route::StatusRead, Fault::Down);
    // Two payments whose outcome stays unknown, each made older than the
    // threshold when the test says.
    let mut pending = Vec::new();
    for _ in 0..2 {
        let (status, payment) = app.pay(&app.create_order().await, "tok_visa").await;
        assert_eq!(status, StatusCode::ACCEPTED);
        pending.push(payment["id"].as_str().expect("id").to_string());
    }
    let age = |id: &str| {
        sqlx::query(
            "UPDATE payment_attempt SET created_at = now() - interval '2 minutes' WHERE id = $1::uuid",
        )
        .bind(id.to_string())
        .execute(&app.db)
    };
    age(&pending[0]).await.expect("aged");
    assert_eq!(app.reconcile().await.alarms, 1, "the first pass looks");
    age(&pending[1]).await.expect("aged");
    assert_eq!(
        app.reconcile().await.alarms,
        0,
        "a pass within 2 s of the last look does not look"
    );
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        app.reconcile().await.alarms,
        1,
        "the next look, 2 s later, finds the second payment"
    );
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_pending_alarms_total{kind=\"payment\"} 2"));
}

#[tokio::test]
async fn a_decline_the_provider_never_confirms_raises_the_alarm_once() {
    let app = spawn_app_with(through_a_fault_proxy().serve("ONCEPAY_PENDING_ALARM", "100ms")).await;
    let order_id = app.create_order().await;
    let (_, declined) = app.pay(&order_id, "tok_declined").await;
    assert_eq!(declined["status"], "failed");
    app.proxy()
        .set(Route::StatusRead, Fault::answer(403, "forbidden"));
    sqlx::query("UPDATE payment_attempt SET created_at = now() - interval '1 minute'")
        .execute(&app.db)
        .await
        .expect("age it");
    let pass = app.reconcile().await;
    assert_eq!((pass.declines_confirmed, pass.alarms), (0, 1));
    let pass = app.reconcile().await;
    assert_eq!((pass.declines_confirmed, pass.alarms), (0, 0), "once");
    assert!(app
        .ctx
        .metrics
        .render()
        .contains("oncepay_pending_alarms_total{kind=\"payment\"} 1"));
    app.proxy().heal();
    assert_eq!(app.reconcile().await.declines_confirmed, 1);
}

#[tokio::test]
async fn the_end_of_an_outage_rechecks_backed_off_payments_at_once() {
    let app = spawn_app_with(through_a_fault_proxy()).await;
    let mut payments = Vec::new();
    app.proxy().set(Route::Charge, Fault::Down);
    app.proxy().set(Route::StatusRead, Fault::Down);
    for _ in 0..3 {
        let order_id = app.create_order().await;
        let (status, payment) = app.pay(&order_id, "tok_visa").await;
        assert_eq!(
            status,
            StatusCode::ACCEPTED,
            "unknown while the provider is down"
        );
        payments.push(payment["id"].as_str().expect("id").to_string());
    }
    // The outage goes on: every check proves nothing and backs off, until
    // the next one is minutes away.
    for _ in 0..3 {
        app.reconcile().await;
    }
    sqlx::query("UPDATE payment_attempt SET next_check_at = now() + interval '5 minutes'")
        .execute(&app.db)
        .await
        .expect("backed off");
    // A plain pass while the provider is still down settles nothing and
    // resets nothing.
    let pass = reconciler::pass(&app.ctx).await.expect("pass");
    assert_eq!((pass.payments_settled, pass.rechecked), (0, 0));
    // The provider recovers. The next pass notices it (its one cheap read
    // answers) and checks every backed-off payment now, not in 5 minutes.
    app.proxy().heal();
    let pass = reconciler::pass(&app.ctx).await.expect("pass");
    assert_eq!(pass.rechecked, 3);
    assert_eq!(pass.payments_settled, 3);
    for id in &payments {
        assert_eq!(app.status_of(&format!("/payments/{id}")).await, "succeeded");
    }
    // Once only: the next pass has nothing to reset.
    assert_eq!(reconciler::pass(&app.ctx).await.expect("pass").rechecked, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'")
            .await,
        3
    );
}
