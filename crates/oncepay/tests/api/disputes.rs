//! Disputes end to end with the sandbox sending its own webhooks (the
//! provider contract, `provider_contract.rs`, covers both adapters with
//! the events posted by the test): a dispute reaches the merchant by the
//! provider's webhook, is its merchant's only, is counted, and its
//! evidence deadline feeds the alert's gauge.

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;

async fn paid(app: &TestApp) -> Value {
    let order = app.create_order().await;
    let (status, payment) = app.pay(&order, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED, "{payment}");
    payment
}

#[tokio::test]
async fn a_dispute_arrives_by_the_providers_webhook_and_is_its_merchants_only() {
    let app = spawn_app().await;
    let payment = paid(&app).await;
    let id = payment["id"].as_str().expect("id");
    let charge = payment["provider_charge_id"].as_str().expect("charge");
    let opened = app
        .http
        .post(format!("{}/v1/charges/{charge}/disputes", app.sandbox))
        .json(&json!({"amount": 500, "reason": "product_not_received"}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(opened.status(), StatusCode::CREATED);
    let at_provider = json_of(opened).await;
    let shown = app
        .poll_until(&format!("/payments/{id}"), |p| !p["dispute"].is_null())
        .await;
    let dispute = &shown["dispute"];
    assert_eq!(dispute["status"], "needs_response");
    assert_eq!(dispute["amount"], 500);
    assert_eq!(dispute["reason"], "product_not_received");
    assert_eq!(
        app.ctx
            .metrics
            .disputes
            .with_label_values(&["sandbox", "needs_response"])
            .get(),
        1
    );
    let dispute_id = dispute["id"].as_str().expect("id");
    let path = format!("/disputes/{dispute_id}");
    assert_eq!(app.get(&path).await.status(), StatusCode::OK);

    // Another merchant's key: as if it did not exist.
    let other = app.other_merchant_key().await;
    let get = |path: String| {
        let http = app.http.clone();
        let url = format!("{}{path}", app.base);
        let key = other.clone();
        async move { http.get(url).bearer_auth(key).send().await.expect("sent") }
    };
    let theirs = get(path.clone()).await;
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND);
    let nonexistent = get(format!("/disputes/{}", Uuid::now_v7())).await;
    assert_eq!(json_of(theirs).await, json_of(nonexistent).await);
    let list = json_of(get("/disputes".into()).await).await;
    assert_eq!(list["data"], json!([]));
    let not_uuid = app.get("/disputes/dp_1").await;
    assert_eq!(not_uuid.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(not_uuid).await["code"], "dispute_not_found");
    let bad = app.get("/disputes?status=open").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    // Part of the charge is held: the rest is refundable, no more.
    let amount = payment["amount"].as_i64().expect("amount");
    let refunds = format!("/payments/{id}/refunds");
    let over = app
        .post(&refunds, "over", &json!({"amount": amount - 499}))
        .await;
    assert_eq!(over.status(), StatusCode::CONFLICT);
    let rest = app
        .post(&refunds, "rest", &json!({"amount": amount - 500}))
        .await;
    assert_eq!(rest.status(), StatusCode::CREATED);
    // The provider pays it: it is not what the bank took back.
    let rest = json_of(rest).await;
    let rest = app
        .poll_until(
            &format!("/refunds/{}", rest["id"].as_str().expect("id")),
            |r| r["status"] != "pending",
        )
        .await;
    assert_eq!(rest["status"], "succeeded", "{rest}");

    // The sandbox closes it, and its webhook says so.
    let closed = app
        .http
        .post(format!(
            "{}/v1/disputes/{}/close",
            app.sandbox,
            at_provider["id"].as_str().expect("id")
        ))
        .json(&json!({"outcome": "won"}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(closed.status(), StatusCode::OK);
    app.poll_until(&path, |d| d["status"] == "won").await;
    // A closed dispute is not closed again.
    let again = app
        .http
        .post(format!(
            "{}/v1/disputes/{}/close",
            app.sandbox,
            at_provider["id"].as_str().expect("id")
        ))
        .json(&json!({"outcome": "lost"}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let won = app
        .post(&refunds, "after-won", &json!({"amount": 500}))
        .await;
    assert_eq!(won.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn the_database_refuses_a_refund_of_a_charged_back_amount_whatever_the_code_does() {
    let app = spawn_app().await;
    let payment = paid(&app).await;
    let id = payment["id"].as_str().expect("id");
    let amount = payment["amount"].as_i64().expect("amount");
    let charge = payment["provider_charge_id"].as_str().expect("charge");
    let opened = app
        .http
        .post(format!("{}/v1/charges/{charge}/disputes", app.sandbox))
        .json(&json!({"amount": 300}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(opened.status(), StatusCode::CREATED);
    app.poll_until(&format!("/payments/{id}"), |p| !p["dispute"].is_null())
        .await;
    // A refund row written past the command (as a bug would): what the
    // dispute leaves fits, one unit more does not.
    let insert = |amount: i64, key: &'static str| {
        sqlx::query(
            "INSERT INTO refund (id, merchant_id, payment_id, amount, status, next_check_at,
                                 created_at, updated_at, idempotency_key)
             SELECT gen_random_uuid(), merchant_id, id, $2, 'pending', now(), now(), now(), $3
               FROM payment_attempt WHERE id = $1::uuid",
        )
        .bind(id)
        .bind(amount)
        .bind(key)
        .execute(&app.db)
    };
    let refused = insert(amount - 299, "past-the-code")
        .await
        .expect_err("refused");
    let refused = refused.as_database_error().expect("a database error");
    assert_eq!(
        refused.constraint(),
        Some("refund_within_disputes"),
        "{refused}"
    );
    insert(amount - 300, "what-is-left")
        .await
        .expect("what the dispute leaves fits");
    let refunds: i64 =
        sqlx::query_scalar("SELECT count(*) FROM refund WHERE payment_id = $1::uuid")
            .bind(id)
            .fetch_one(&app.db)
            .await
            .expect("count");
    assert_eq!(refunds, 1);
}

#[tokio::test]
async fn a_dispute_event_the_provider_does_not_confirm_changes_nothing() {
    let app = spawn_app().await;
    let payment = paid(&app).await;
    let event = json!({
        "id": format!("evt_{}", Uuid::new_v4().simple()),
        "type": "charge.dispute.created",
        "data": {"object": {
            "id": "dp_forged",
            "charge_id": payment["provider_charge_id"],
            "amount": payment["amount"],
            "status": "needs_response",
            "reason": "fraudulent",
        }},
    });
    let r = post_signed_webhook(&app, &event).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["outcome"], "unconfirmed");
    assert_eq!(app.count("SELECT count(*) FROM dispute").await, 0);
    let refund = app
        .post(
            &format!("/payments/{}/refunds", payment["id"].as_str().expect("id")),
            "r",
            &json!({}),
        )
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn evidence_due_within_72_hours_is_what_the_alert_reads() {
    let app = spawn_app().await;
    let payment = paid(&app).await;
    let charge = payment["provider_charge_id"].as_str().expect("charge");
    let opened = app
        .http
        .post(format!("{}/v1/charges/{charge}/disputes", app.sandbox))
        .json(&json!({}))
        .send()
        .await
        .expect("the sandbox answers");
    assert_eq!(opened.status(), StatusCode::CREATED);
    let id = payment["id"].as_str().expect("id");
    app.poll_until(&format!("/payments/{id}"), |p| !p["dispute"].is_null())
        .await;
    let gauge = |body: String| {
        body.lines()
            .find(|l| l.starts_with("oncepay_disputes_evidence_due_soon "))
            .map(str::to_string)
    };
    let scrape = || async {
        app.http
            .get(format!("{}/metrics", app.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    };
    // Due in seven days: not yet.
    assert_eq!(
        gauge(scrape().await).as_deref(),
        Some("oncepay_disputes_evidence_due_soon 0")
    );
    sqlx::query("UPDATE dispute SET evidence_due_by = now() + interval '2 days'")
        .execute(&app.db)
        .await
        .expect("update");
    assert_eq!(
        gauge(scrape().await).as_deref(),
        Some("oncepay_disputes_evidence_due_soon 1")
    );
}

/// Stripe: an inquiry (`warning_needs_response`), its review
/// (`warning_under_review`: `dispute.updated`) — no money withdrawn, so the
/// payment can still be refunded — then the inquiry escalates to a
/// chargeback (`needs_response`: a new phase, not a step back, and now
/// refunds are refused), then `lost`; a stale event read back after that
/// changes nothing, and a dispute Stripe does not hold is `unconfirmed`.
#[tokio::test]
async fn with_stripe_a_dispute_moves_forward_and_never_back() {
    use crate::provider_contract::{app_with, post_stripe_event};
    let Some(app) = app_with(Provider::Stripe).await else {
        return;
    };
    let Some(stack) = app.stripe.as_ref() else {
        return;
    };
    let paid = paid_with(&app, "pm_card_visa").await;
    let intent = paid["provider_charge_id"].as_str().expect("intent");
    let opened = stack.layer.open_dispute(
        (intent, "ch_x"),
        (paid["amount"].as_i64().expect("amount"), "eur"),
        "duplicate",
        "warning_needs_response",
    );
    let id = opened["id"].as_str().expect("id").to_string();
    let send = |kind: &'static str, object: Value| {
        let app = &app;
        async move {
            let event = json!({
                "id": format!("evt_{}", Uuid::new_v4().simple()),
                "object": "event",
                "type": format!("charge.dispute.{kind}"),
                "created": chrono::Utc::now().timestamp(),
                "data": {"object": object},
            });
            let r = post_stripe_event(app, &event).await;
            assert_eq!(r.status(), StatusCode::OK);
            json_of(r).await["outcome"]
                .as_str()
                .expect("outcome")
                .to_string()
        }
    };
    assert_eq!(send("created", opened.clone()).await, "processed");
    let review = stack
        .layer
        .set_dispute_status(&id, "warning_under_review")
        .expect("dispute");
    assert_eq!(send("updated", review).await, "processed");
    let pid = paid["id"].as_str().expect("id");
    let shown = json_of(app.get(&format!("/payments/{pid}")).await).await;
    assert_eq!(shown["dispute"]["status"], "under_review");
    assert_eq!(shown["dispute"]["provider_status"], "warning_under_review");
    // An inquiry holds nothing: refunding is how a merchant closes one.
    let refunds = format!("/payments/{pid}/refunds");
    let r = app
        .post(&refunds, "during-inquiry", &json!({"amount": 100}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED, "{}", json_of(r).await);
    // The inquiry becomes a chargeback: the bank takes the money.
    let chargeback = stack
        .layer
        .set_dispute_status(&id, "needs_response")
        .expect("dispute");
    assert_eq!(send("updated", chargeback).await, "processed");
    let shown = json_of(app.get(&format!("/payments/{pid}")).await).await;
    assert_eq!(shown["dispute"]["status"], "needs_response");
    assert_eq!(shown["dispute"]["provider_status"], "needs_response");
    let r = app
        .post(&refunds, "during-chargeback", &json!({"amount": 100}))
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_disputed");
    let lost = stack.layer.close_dispute(&id, "lost").expect("dispute");
    assert_eq!(send("closed", lost).await, "processed");
    // The first event again: Stripe says lost, and lost it stays.
    assert_eq!(send("funds_withdrawn", opened.clone()).await, "processed");
    let shown = json_of(app.get(&format!("/payments/{pid}")).await).await;
    assert_eq!(shown["dispute"]["status"], "lost");
    let types: Vec<(String,)> =
        sqlx::query_as("SELECT type FROM event WHERE object_type = 'dispute' ORDER BY sequence")
            .fetch_all(&app.db)
            .await
            .expect("events");
    assert_eq!(
        types,
        vec![
            ("dispute.created".to_string(),),
            ("dispute.updated".to_string(),),
            ("dispute.updated".to_string(),),
            ("dispute.closed".to_string(),),
        ]
    );
    let mut forged = opened.clone();
    forged["id"] = json!("dp_forged");
    assert_eq!(send("created", forged).await, "unconfirmed");
}

/// Issue 55, item 7. A dispute in a status oncepay does not map is no
/// longer refused (`503` on every delivery until Stripe gave up, never
/// stored). Stripe's `prevented` (Disputes API, `status`; added with
/// 2025-08-27.basil) is closed, the money given back to the customer:
/// `lost`, its amount not refundable. A status from a newer API is stored
/// with its `provider_status`, held open (`under_review`: its amount not
/// refundable), answered `200` and counted
/// (`oncepay_dispute_statuses_unrecognised_total`, the alert's); a status
/// oncepay knows then moves it on.
#[tokio::test]
async fn with_stripe_a_dispute_status_oncepay_does_not_know_is_stored_not_refused() {
    use crate::provider_contract::{app_with, post_stripe_event};
    let Some(app) = app_with(Provider::Stripe).await else {
        return;
    };
    let Some(stack) = app.stripe.as_ref() else {
        return;
    };
    let send = |kind: &'static str, object: Value| {
        let app = &app;
        async move {
            let event = json!({
                "id": format!("evt_{}", Uuid::new_v4().simple()),
                "object": "event",
                "type": format!("charge.dispute.{kind}"),
                "created": chrono::Utc::now().timestamp(),
                "data": {"object": object},
            });
            let r = post_stripe_event(app, &event).await;
            assert_eq!(r.status(), StatusCode::OK, "answered, never refused");
            json_of(r).await["outcome"]
                .as_str()
                .expect("outcome")
                .to_string()
        }
    };
    let shown = |pid: String| {
        let app = &app;
        async move { json_of(app.get(&format!("/payments/{pid}")).await).await["dispute"].clone() }
    };
    let unrecognised = || {
        app.ctx
            .metrics
            .render()
            .lines()
            .find(|l| {
                l.starts_with("oncepay_dispute_statuses_unrecognised_total{provider=\"stripe\"}")
            })
            .map(str::to_string)
    };

    // prevented: closed, lost.
    let paid = paid_with(&app, "pm_card_visa").await;
    let pid = paid["id"].as_str().expect("id").to_string();
    let intent = paid["provider_charge_id"].as_str().expect("intent");
    let amount = paid["amount"].as_i64().expect("amount");
    let opened = stack.layer.open_dispute(
        (intent, "ch_prevented"),
        (amount, "eur"),
        "fraudulent",
        "needs_response",
    );
    let id = opened["id"].as_str().expect("id").to_string();
    assert_eq!(send("created", opened).await, "processed");
    let prevented = stack
        .layer
        .set_dispute_status(&id, "prevented")
        .expect("dispute");
    assert_eq!(send("closed", prevented).await, "processed");
    let dispute = shown(pid.clone()).await;
    assert_eq!(
        (
            dispute["status"].as_str(),
            dispute["provider_status"].as_str()
        ),
        (Some("lost"), Some("prevented")),
        "{dispute}"
    );
    let r = app
        .post(
            &format!("/payments/{pid}/refunds"),
            "after-prevented",
            &json!({"amount": 100}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_disputed");
    assert_eq!(
        unrecognised().as_deref(),
        Some("oncepay_dispute_statuses_unrecognised_total{provider=\"stripe\"} 0"),
        "prevented is mapped"
    );

    // A status from a newer API: stored, held open, counted.
    let paid = paid_with(&app, "pm_card_visa").await;
    let pid = paid["id"].as_str().expect("id").to_string();
    let intent = paid["provider_charge_id"].as_str().expect("intent");
    let opened = stack.layer.open_dispute(
        (intent, "ch_newer"),
        (amount, "eur"),
        "fraudulent",
        "escalated_to_a_status_from_a_newer_api",
    );
    let id = opened["id"].as_str().expect("id").to_string();
    assert_eq!(send("created", opened).await, "processed");
    let dispute = shown(pid.clone()).await;
    assert_eq!(
        (
            dispute["status"].as_str(),
            dispute["provider_status"].as_str()
        ),
        (
            Some("under_review"),
            Some("escalated_to_a_status_from_a_newer_api")
        ),
        "{dispute}"
    );
    let r = app
        .post(
            &format!("/payments/{pid}/refunds"),
            "while-unrecognised",
            &json!({"amount": 100}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT, "held open");
    assert_eq!(
        unrecognised().as_deref(),
        Some("oncepay_dispute_statuses_unrecognised_total{provider=\"stripe\"} 1")
    );
    // A status oncepay knows moves it on.
    let won = stack.layer.close_dispute(&id, "won").expect("dispute");
    assert_eq!(send("closed", won).await, "processed");
    let dispute = shown(pid).await;
    assert_eq!(
        (
            dispute["status"].as_str(),
            dispute["provider_status"].as_str()
        ),
        (Some("won"), Some("won"))
    );
}

async fn paid_with(app: &TestApp, card: &str) -> Value {
    let order = app.create_order().await;
    let (status, payment) = app.pay(&order, card).await;
    assert_eq!(status, StatusCode::CREATED, "{payment}");
    payment
}

/// `GET /disputes` pages as the other lists: newest first, `limit`,
/// cursors both ways, filters.
#[tokio::test]
async fn disputes_page_newest_first_with_cursors() {
    let app = spawn_app().await;
    let mut payments = Vec::new();
    for _ in 0..3 {
        let payment = paid(&app).await;
        let charge = payment["provider_charge_id"].as_str().expect("charge");
        let opened = app
            .http
            .post(format!("{}/v1/charges/{charge}/disputes", app.sandbox))
            .json(&json!({}))
            .send()
            .await
            .expect("the sandbox answers");
        assert_eq!(opened.status(), StatusCode::CREATED);
        let id = payment["id"].as_str().expect("id").to_string();
        // One at a time: the list's order is the order they arrived in.
        app.poll_until(&format!("/payments/{id}"), |p| !p["dispute"].is_null())
            .await;
        payments.push(id);
    }
    let all = json_of(app.get("/disputes?limit=100").await).await;
    let ids: Vec<String> = all["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let by_payment: Vec<&str> = all["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d["payment_id"].as_str().expect("payment"))
        .collect();
    let newest_first: Vec<&str> = payments.iter().rev().map(String::as_str).collect();
    assert_eq!(by_payment, newest_first);
    let first = json_of(app.get("/disputes?limit=2").await).await;
    assert_eq!(first["has_more"], true);
    assert_eq!(first["data"].as_array().expect("data").len(), 2);
    let next = json_of(
        app.get(&format!("/disputes?limit=2&starting_after={}", ids[1]))
            .await,
    )
    .await;
    assert_eq!(next["has_more"], false);
    assert_eq!(next["data"][0]["id"], ids[2].as_str());
    let back = json_of(
        app.get(&format!("/disputes?limit=1&ending_before={}", ids[2]))
            .await,
    )
    .await;
    assert_eq!(back["data"][0]["id"], ids[1].as_str());
    let one = json_of(
        app.get(&format!("/disputes?payment_id={}", payments[0]))
            .await,
    )
    .await;
    assert_eq!(one["data"].as_array().expect("data").len(), 1);
    assert_eq!(one["data"][0]["id"], ids[2].as_str());
    let bad = app.get("/disputes?payment_id=nope").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let unknown = app.get("/disputes?order_id=x").await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
}
