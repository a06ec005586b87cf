//! What only Stripe does: each of its faults, met through the
//! Stripe-semantics layer in front of localstripe, and classified by what
//! it proves. Each test fails loudly if a fault is taken for what it is
//! not (a `401` for a decline, a `429` for a failure, a replayed answer for
//! a second charge). The scenarios both providers share are in
//! `provider_contract.rs`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::provider_contract::{app_with, payment, post_stripe_event, report_of, stripe_list};
use oncepay_testkit::ready;
use oncepay_testkit::stripe_layer::{Call, StripeFault, StripeLayer};

impl TestApp {
    fn layer(&self) -> &StripeLayer {
        &self.stripe.as_ref().expect("a Stripe app").layer
    }

    async fn pay_visa(&self) -> (String, StatusCode, Value) {
        let order = self.create_order().await;
        let (status, body) = self.pay(&order, "pm_card_visa").await;
        (order, status, body)
    }

    /// The metric line's value, 0 if absent.
    fn metric(&self, prefix: &str) -> u64 {
        self.ctx
            .metrics
            .render()
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

async fn stripe_app() -> Option<TestApp> {
    app_with(Provider::Stripe).await
}

#[tokio::test]
async fn transient_answers_are_retried_with_the_same_key_and_charge_once() {
    let Some(app) = stripe_app().await else {
        return;
    };
    for (call, fault, times) in [
        (Call::CreateIntent, StripeFault::LockTimeout, 1),
        (Call::Confirm, StripeFault::LockTimeout, 1),
        (Call::Confirm, StripeFault::RateLimited, 2),
        (Call::Confirm, StripeFault::KeyInUse, 1),
        (
            Call::Confirm,
            StripeFault::ServerError {
                should_retry: Some(true),
            },
            1,
        ),
        (
            Call::Confirm,
            StripeFault::ServerError { should_retry: None },
            1,
        ),
    ] {
        app.layer().set_times(call, fault.clone(), times);
        let (order, status, body) = app.pay_visa().await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::CREATED, Some("succeeded")),
            "{fault:?} on {call:?} is retried at once: {body}"
        );
        assert_eq!(app.charges_at_provider(&order).await, (1, 1), "{fault:?}");
    }
}

#[tokio::test]
async fn stripe_should_retry_false_is_honoured_and_proves_nothing() {
    let Some(app) = stripe_app().await else {
        return;
    };
    app.layer().set(
        Call::Confirm,
        StripeFault::ServerError {
            should_retry: Some(false),
        },
    );
    let (order, status, pending) = app.pay_visa().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending", "never a decline");
    assert_eq!(app.layer().forwarded(Call::Confirm), 0);
    // Not retried within the request: one refused confirm, then the answer.
    assert_eq!(
        app.metric("oncepay_provider_calls_total{operation=\"charge\",outcome=\"unknown\"}"),
        1
    );
    app.layer().heal();
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "succeeded");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

#[tokio::test]
async fn a_refused_key_is_an_outage_never_a_decline() {
    let Some(app) = stripe_app().await else {
        return;
    };
    // On the create: nothing exists at Stripe yet.
    app.layer()
        .set(Call::CreateIntent, StripeFault::Unauthorized);
    let (order, status, pending) = app.pay_visa().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending");
    assert_eq!(pending["provider_charge_id"], Value::Null);
    assert_eq!(app.charges_at_provider(&order).await, (0, 0));
    // On the reconciler's reads too: still pending, never failed.
    app.layer().set(Call::Read, StripeFault::Unauthorized);
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "pending");
    app.layer().heal();
    app.reconcile().await;
    let paid = payment(&app, &pending["id"]).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

#[tokio::test]
async fn an_idempotency_error_is_our_bug_logged_and_counted_never_a_decline() {
    let Some(app) = stripe_app().await else {
        return;
    };
    app.layer()
        .set(Call::Confirm, StripeFault::IdempotencyError);
    let (order, status, pending) = app.pay_visa().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending");
    assert_eq!(
        app.metric("oncepay_provider_calls_total{operation=\"charge\",outcome=\"our_bug\"}"),
        1,
        "counted once, not retried"
    );
    app.layer().heal();
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "succeeded");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

#[tokio::test]
async fn a_dropped_answer_is_replayed_under_the_same_key_not_charged_again() {
    let Some(app) = stripe_app().await else {
        return;
    };
    // The create's answer lost: the retry gets the same PaymentIntent.
    app.layer()
        .set_times(Call::CreateIntent, StripeFault::DropAfterEffect, 1);
    // The confirm's answer lost: the retry gets the saved answer.
    app.layer()
        .set_times(Call::Confirm, StripeFault::DropAfterEffect, 1);
    let (order, status, paid) = app.pay_visa().await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(
        app.layer().replayed(),
        2,
        "both repeats answered from Stripe's record"
    );
    assert_eq!(app.layer().forwarded(Call::CreateIntent), 1);
    assert_eq!(app.layer().forwarded(Call::Confirm), 1);
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

#[tokio::test]
async fn a_declined_card_fails_with_stripes_decline_code_and_the_order_stays_payable() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let order = app.create_order().await;
    let (status, failed) = app.pay(&order, "pm_card_chargeCustomerFail").await;
    assert_eq!(status, StatusCode::CREATED, "{failed}");
    assert_eq!(failed["status"], "failed");
    // The layer answers as Stripe does: card_error with a decline_code.
    assert_eq!(failed["failure_code"], "generic_decline");
    // An unknown PaymentMethod: refused at the create, nothing charged.
    let (status, unknown) = app.pay(&order, "pm_card_doesNotExist").await;
    assert_eq!(status, StatusCode::CREATED, "{unknown}");
    assert_eq!(unknown["status"], "failed");
    assert_eq!(unknown["failure_code"], "invalid_payment_method");
    let (_, paid) = app.pay(&order, "pm_card_visa").await;
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(app.charges_at_provider(&order).await.0, 1);
}

#[tokio::test]
async fn payment_methods_are_in_the_current_providers_form() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let order = app.create_order().await;
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order, "payment_method": "tok_visa"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem = json_of(r).await;
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("payment_method") && d.contains("pm_")),
        "{problem}"
    );
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 0);
    // And with the sandbox, a Stripe id is refused the same way.
    let sandbox = spawn_app().await;
    let order = sandbox.create_order().await;
    let (status, problem) = sandbox.pay(&order, "pm_card_visa").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert!(problem["detail"]
        .as_str()
        .is_some_and(|d| d.contains("tok_")));
}

#[tokio::test]
async fn localstripes_own_signed_event_settles_a_payment() {
    let Some(app) = stripe_app().await else {
        return;
    };
    app.layer()
        .set(Call::Confirm, StripeFault::ErrorAfterEffect);
    let (_, status, pending) = app.pay_visa().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    // The reconciler is not run: only the event (confirmed by a read of
    // the PaymentIntent) can settle it.
    let settled = ready::until(Duration::from_secs(10), || async {
        payment(&app, &pending["id"]).await["status"] == "succeeded"
    })
    .await;
    assert!(
        settled.is_ok(),
        "payment_intent.succeeded from localstripe settles it"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM webhook_event WHERE provider = 'stripe'
               AND event_type = 'payment_intent.succeeded' AND outcome = 'processed'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn stripe_webhooks_are_verified_before_anything_is_read() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let event = json!({"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {}}});
    let body = event.to_string();
    let now = chrono::Utc::now().timestamp();
    let post = |signature: String| {
        app.http
            .post(format!("{}/webhooks/stripe", app.base))
            .header("Stripe-Signature", signature)
            .body(body.clone())
            .send()
    };
    let sign = |secret: &str, t: i64| {
        oncepay::provider::stripe::signature::sign(secret, t, body.as_bytes())
    };
    for (why, signature) in [
        ("another secret", sign("whsec_other", now)),
        ("ten minutes old", sign(STRIPE_WEBHOOK_SECRET, now - 600)),
        ("no v1", format!("t={now}")),
    ] {
        let r = post(signature).await.expect("sent");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{why}");
        assert_eq!(
            json_of(r).await["code"],
            "webhook_signature_invalid",
            "{why}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM webhook_event").await, 0);
    // Two signatures while a secret is rolled: either may match.
    let good = sign(STRIPE_WEBHOOK_SECRET, now);
    let v1 = good.split_once(",v1=").expect("v1").1;
    let rolled = format!("t={now},v1={},v1={v1}", "00".repeat(32));
    let r = post(rolled).await.expect("sent");
    assert_eq!(r.status(), StatusCode::OK);
    // The same event again is a duplicate.
    let r = post_stripe_event(&app, &event).await;
    assert_eq!(json_of(r).await["outcome"], "duplicate");
}

#[tokio::test]
async fn attempts_are_settled_with_the_provider_they_were_made_with() {
    let Some(stripe) = stripe_app().await else {
        return;
    };
    // The same database, a process whose new payments go to the sandbox:
    // its attempt stays the sandbox's after the switch back to Stripe.
    let sandbox_first = spawn_app_with(
        Options {
            database_url: Some(db_url_of(&stripe).await),
            ..Options::default()
        }
        .with_fault_proxy()
        .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    let order = sandbox_first.create_order().await;
    sandbox_first.proxy().set(
        oncepay_testkit::fault_proxy::Route::Charge,
        oncepay_testkit::fault_proxy::Fault::Down,
    );
    let (status, pending) = sandbox_first.pay(&order, "tok_visa").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["provider"], "sandbox");
    // The Stripe process's reconciler settles it, with its sandbox.
    stripe.reconcile().await;
    let settled = payment(&stripe, &pending["id"]).await;
    assert_eq!(settled["status"], "succeeded", "{settled}");
    assert_eq!(settled["provider"], "sandbox");
    assert!(settled["provider_charge_id"]
        .as_str()
        .is_some_and(|c| c.starts_with("ch_")));
    let stack = stripe.stripe.as_ref().expect("stripe");
    assert!(
        stripe_list(stack, "/v1/payment_intents?limit=100")
            .await
            .is_empty(),
        "nothing went to Stripe"
    );
}

async fn db_url_of(app: &TestApp) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.db)
        .await
        .expect("name");
    format!("{}/{name}", pg_server())
}

#[tokio::test]
async fn serve_reaches_stripe_over_https_with_the_default_build() {
    if !localstripe_or_skip() {
        return;
    }
    let localstripe = oncepay_testkit::localstripe::LocalStripe::start()
        .await
        .expect("localstripe starts");
    let layer = StripeLayer::start(localstripe.url()).expect("layer");
    let tls = oncepay_testkit::tls::TlsForward::start(layer.url())
        .await
        .expect("a TLS server with a test certificate");
    let (db_url, _db, key) = migrated_database_with_key().await;
    // No sandbox runs: nothing may go there.
    let mut env = serve_env(&db_url, "http://127.0.0.1:9");
    env.push(("ONCEPAY_PROVIDER", "stripe".into()));
    env.push(("ONCEPAY_STRIPE_SECRET_KEY", STRIPE_KEY.into()));
    env.push(("ONCEPAY_STRIPE_API_BASE", tls.url().to_string()));
    // The platform's roots, as the release binary reads them, told to
    // trust the test CA.
    env.push(("SSL_CERT_FILE", tls.ca().display().to_string()));
    let serve = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{}{path}", serve.base))
            .bearer_auth(&key)
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&body)
            .send()
    };
    let order = json_of(post("/orders", order_body()).await.expect("order")).await;
    let r = post(
        "/payments",
        json!({"order_id": order["id"], "payment_method": "pm_card_visa"}),
    )
    .await
    .expect("payment");
    assert_eq!(r.status(), StatusCode::CREATED);
    let paid = json_of(r).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert!(tls.url().starts_with("https://"));
    assert_eq!(layer.forwarded(Call::Confirm), 1, "reached through TLS");
}

#[tokio::test]
async fn a_stripe_charge_and_refund_whose_rows_were_lost_are_adopted_from_stripes_books() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let order = app.create_order().await;
    let body = json!({"order_id": order, "payment_method": "pm_card_visa"});
    let r = app.post("/payments", "stripe-pay-1", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let paid = json_of(r).await;
    let id = paid["id"].as_str().unwrap().to_string();
    let refund_body = json!({"amount": 700});
    let r = app
        .post(
            &format!("/payments/{id}/refunds"),
            "stripe-refund-1",
            &refund_body,
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    crate::books::lose_payment(&app, &id).await;

    let (ok, report) = crate::books::reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    let [_, adopted, refunded, _, mismatched, missing] = crate::books::counts(&report, "stripe");
    assert_eq!(
        (adopted, refunded, mismatched, missing),
        (2, 0, 0, 0),
        "{report}"
    );
    // Stripe was asked for the window only (`created[gte]`, `created[lt]`),
    // answered by the layer as Stripe filters.
    assert!(
        app.layer().filtered_lists() >= 2,
        "both lists were filtered"
    );

    let r = app.post("/payments", "stripe-pay-1", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let again = json_of(r).await;
    assert_eq!(
        (&again["id"], &again["status"]),
        (&paid["id"], &paid["status"])
    );
    assert_eq!(again["provider_charge_id"], paid["provider_charge_id"]);
    let r = app
        .post(
            &format!("/payments/{id}/refunds"),
            "stripe-refund-1",
            &refund_body,
        )
        .await;
    let again = json_of(r).await;
    assert_eq!(
        (&again["id"], &again["status"]),
        (&refund["id"], &refund["status"])
    );
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    let intents = stripe_list(
        app.stripe.as_ref().unwrap(),
        "/v1/payment_intents?limit=100",
    )
    .await;
    let ours = intents
        .iter()
        .filter(|pi| pi["metadata"]["oncepay_order_id"] == order.as_str())
        .count();
    assert_eq!(ours, 1, "one PaymentIntent for the order");
}

/// A PaymentMethod for `number` made at localstripe directly, as Stripe.js
/// (Elements) makes it from the customer's browser: oncepay only ever
/// sees its `pm_` id.
pub(crate) async fn stripe_card(app: &TestApp, number: &str) -> String {
    let stack = app.stripe.as_ref().expect("a Stripe app");
    let pm: Value = reqwest::Client::new()
        .post(format!("{}/v1/payment_methods", stack.localstripe.url()))
        .bearer_auth(STRIPE_KEY)
        .form(&[
            ("type", "card"),
            ("card[number]", number),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ])
        .send()
        .await
        .expect("localstripe answers")
        .json()
        .await
        .expect("a PaymentMethod");
    pm["id"].as_str().expect("its id").to_string()
}

/// Pays `order` with `pm`, asking to come back to `return_url`.
pub(crate) async fn pay_returning(
    app: &TestApp,
    order: &str,
    pm: &str,
    back: &str,
) -> (StatusCode, Value) {
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order, "payment_method": pm, "return_url": back}),
        )
        .await;
    (r.status(), json_of(r).await)
}

/// Presses `button` on the bank page at `url`; where the bank sends the
/// customer.
pub(crate) async fn at_the_bank(url: &str, button: &str) -> String {
    let page = reqwest::get(url).await.unwrap().text().await.unwrap();
    assert!(page.contains(&format!("id=\"{button}\"")), "{page}");
    let answer = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{url}/{button}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    answer.headers()["location"].to_str().unwrap().to_string()
}

pub(crate) fn redirect_of(payment: &Value) -> String {
    assert_eq!(payment["status"], "pending", "{payment}");
    assert_eq!(payment["next_action"]["type"], "redirect", "{payment}");
    payment["next_action"]["url"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn three_d_secure_at_stripe_redirects_to_the_bank_and_back_and_charges_once() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let back = "http://127.0.0.1:9/shop/checkout?step=return";
    let order = app.create_order().await;
    let card = stripe_card(&app, "4000002760003184").await;
    let (status, waiting) = pay_returning(&app, &order, &card, back).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{waiting}");
    let bank = redirect_of(&waiting);
    let intent = app.layer().url().to_string() + "/_bank/pi_";
    assert!(
        bank.starts_with(&intent),
        "Stripe's redirect_to_url: {bank}"
    );
    assert_eq!(
        app.layer().forwarded(Call::Confirm),
        1,
        "confirmed once, with return_url"
    );

    // A double click, a reload, a second tab while the bank waits: the
    // same payment, one PaymentIntent.
    let (a, b) = tokio::join!(
        pay_returning(&app, &order, &card, back),
        app.pay(&order, "pm_card_visa")
    );
    for (_, again) in [a, b] {
        assert_eq!(again["id"], waiting["id"], "{again}");
    }
    assert_eq!(app.charges_at_provider(&order).await, (0, 1));

    // Approved: back to the shop with Stripe's parameters, and settled
    // (by localstripe's event or a read).
    let location = at_the_bank(&bank, "approve").await;
    assert!(
        location.starts_with(&format!("{back}&payment_intent=pi_"))
            && location.ends_with("redirect_status=succeeded"),
        "{location}"
    );
    let paid = app.reconciled_to(&waiting["id"], "succeeded").await;
    assert_eq!(paid["next_action"], Value::Null);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));

    // Declined at the bank: failed with Stripe's code, and the order is
    // paid by a new attempt, once.
    let order = app.create_order().await;
    let (_, waiting) = pay_returning(&app, &order, &card, back).await;
    let location = at_the_bank(&redirect_of(&waiting), "decline").await;
    assert!(location.ends_with("redirect_status=failed"), "{location}");
    let failed = app.reconciled_to(&waiting["id"], "failed").await;
    assert_eq!(
        failed["failure_code"], "payment_intent_authentication_failure",
        "{failed}"
    );
    assert_eq!(failed["next_action"], Value::Null);
    let (status, paid) = app.pay(&order, "pm_card_visa").await;
    assert_eq!(
        (status, &paid["status"]),
        (StatusCode::CREATED, &json!("succeeded"))
    );
    assert_eq!(app.charges_at_provider(&order).await, (1, 2));
}

impl TestApp {
    /// An order of `total` minor units of `currency`, as one item.
    async fn order_in(&self, currency: &str, total: i64) -> String {
        let body = json!({
            "customer_id": "cus_units",
            "currency": currency,
            "items": [{"sku": "one", "quantity": 1, "unit_amount": total}],
        });
        let r = self
            .post("/orders", &Uuid::new_v4().to_string(), &body)
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        json_of(r).await["id"].as_str().expect("id").to_string()
    }
}

/// oncepay counts in ISO 4217 minor units, Stripe in its own: ISK is
/// two-decimal at Stripe (100 = 1 króna), MGA zero-decimal, three-decimal
/// amounts end in 0. Each amount goes out and comes back converted, and
/// one Stripe cannot take exactly is refused before anything is written
/// or sent.
#[tokio::test]
async fn stripe_is_charged_and_refunded_in_its_own_units() {
    let Some(app) = stripe_app().await else {
        return;
    };
    for (currency, ours, at_stripe) in [
        ("ISK", 5000, 500_000),
        ("JPY", 1000, 1000),
        ("MGA", 500_000, 5000),
        ("KWD", 12_300, 12_300),
    ] {
        let order = app.order_in(currency, ours).await;
        let (status, paid) = app.pay(&order, "pm_card_visa").await;
        assert_eq!(status, StatusCode::CREATED, "{currency}: {paid}");
        assert_eq!(paid["status"], "succeeded");
        assert_eq!(paid["amount"], ours);
        let intent = &stripe_list(
            app.stripe.as_ref().expect("stripe"),
            "/v1/payment_intents?limit=100",
        )
        .await
        .into_iter()
        .find(|pi| pi["metadata"]["oncepay_order_id"] == order.as_str())
        .expect("its PaymentIntent")["amount"]
            .clone();
        assert_eq!(intent, at_stripe, "{currency} at Stripe");
        // A tenth of it back, in each unit.
        let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
        let r = app
            .post(
                &path,
                &format!("r-{currency}"),
                &json!({"amount": ours / 10}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        let refund = json_of(r).await;
        assert_eq!(refund["status"], "succeeded", "{currency}: {refund}");
        let refunds = stripe_list(
            app.stripe.as_ref().expect("stripe"),
            &format!(
                "/v1/refunds?payment_intent={}",
                paid["provider_charge_id"].as_str().expect("pi")
            ),
        )
        .await;
        assert_eq!(
            refunds[0]["amount"],
            at_stripe / 10,
            "{currency} refund at Stripe"
        );
        assert_eq!(
            payment(&app, &paid["id"]).await["refunded_amount"],
            ours / 10
        );
    }

    // What Stripe cannot take exactly, or below its minimum: 422 before
    // any attempt row or call.
    let intents_before = app.layer().forwarded(Call::CreateIntent);
    let attempts_before = app.count("SELECT count(*) FROM payment_attempt").await;
    for (currency, amount, rule) in [
        ("MGA", 500_050, "multiple of 100"),
        ("KWD", 1234, "last digit 0"),
        ("EUR", 49, "minimum"),
        ("EUR", 100_000_000, "at most"),
    ] {
        let order = app.order_in(currency, amount).await;
        let (status, problem) = app.pay(&order, "pm_card_visa").await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{currency} {amount}: {problem}"
        );
        assert_eq!(problem["code"], "amount_not_supported_by_provider");
        assert_eq!(problem["currency"], currency);
        assert_eq!(problem["field"], "order_id");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(
            detail.contains(currency) && detail.contains(rule),
            "{detail}"
        );
        // The hosted page is refused too: its Pay could only fail.
        let r = app
            .post(
                &format!("/orders/{order}/checkout"),
                &Uuid::new_v4().to_string(),
                &json!({}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(json_of(r).await["code"], "amount_not_supported_by_provider");
        // Nothing was held: the order is as it was.
        assert_eq!(
            app.status_of(&format!("/orders/{order}")).await,
            "awaiting_payment"
        );
    }
    assert_eq!(app.layer().forwarded(Call::CreateIntent), intents_before);
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt").await,
        attempts_before
    );

    // A refund in a unit Stripe cannot take: refused before the refund row.
    let order = app.order_in("KWD", 12_340).await;
    let (_, paid) = app.pay(&order, "pm_card_visa").await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "kwd-odd", &json!({"amount": 1001})).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "amount_not_supported_by_provider");
    assert_eq!(problem["field"], "amount");
    assert_eq!(app.count("SELECT count(*) FROM refund").await, 4);
}

/// A 3-D Secure payment made through the API without a `return_url`:
/// Stripe asks for `use_stripe_sdk`. The payment shows it (with the
/// intent's client secret, for Stripe.js `handleNextAction`), its deadline
/// runs from then, and when it passes the intent is cancelled at Stripe
/// and the payment fails `authentication_expired`, so the order is free.
#[tokio::test]
async fn a_payment_without_return_url_shows_use_stripe_sdk_and_has_a_deadline() {
    if !localstripe_or_skip() {
        return;
    }
    let app = spawn_app_with(
        Options::default()
            .provider(Provider::Stripe)
            .serve("ONCEPAY_ACTION_TIMEOUT", "1s")
            .serve("ONCEPAY_RECONCILE_AFTER", "0s"),
    )
    .await;
    let order = app.create_order().await;
    let card = stripe_card(&app, "4000002760003184").await;
    let (status, waiting) = app.pay(&order, &card).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{waiting}");
    assert_eq!(waiting["status"], "pending");
    assert_eq!(
        waiting["next_action"]["type"], "use_stripe_sdk",
        "{waiting}"
    );
    let secret = waiting["next_action"]["client_secret"]
        .as_str()
        .expect("client_secret");
    let intent = waiting["provider_charge_id"].as_str().expect("intent");
    assert!(secret.starts_with(&format!("{intent}_secret_")), "{secret}");
    // While it waits, the order is held: cancelling it is refused.
    let r = app
        .post(
            &format!("/orders/{order}/cancel"),
            &Uuid::new_v4().to_string(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_in_progress");
    // The deadline ends it: the intent is cancelled at Stripe first.
    let expired = app.reconciled_to(&waiting["id"], "failed").await;
    assert_eq!(expired["failure_code"], "authentication_expired");
    assert_eq!(expired["next_action"], Value::Null);
    let pi: Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/payment_intents/{intent}",
            app.stripe.as_ref().expect("stripe").localstripe.url()
        ))
        .bearer_auth(STRIPE_KEY)
        .send()
        .await
        .expect("localstripe")
        .json()
        .await
        .expect("intent");
    assert_eq!(pi["status"], "canceled", "{pi}");
    assert_eq!(app.layer().forwarded(Call::Cancel), 1);
    let r = app
        .post(
            &format!("/orders/{order}/cancel"),
            &Uuid::new_v4().to_string(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK, "the order is free again");
}

// ---- holds Stripe refuses to capture, and holds cancelled at Stripe
// (issue 55) ----

/// A manual payment of `order` with Stripe's test card: held.
async fn held_at_stripe(app: &TestApp, order: &str) -> Value {
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order, "payment_method": "pm_card_visa", "capture_method": "manual"}),
        )
        .await;
    let status = r.status();
    let held = json_of(r).await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    assert_eq!(held["status"], "requires_capture", "{held}");
    held
}

async fn capture_at(app: &TestApp, payment: &Value, key: &str, body: Value) -> (StatusCode, Value) {
    let id = payment["id"].as_str().expect("id");
    let r = app
        .post(&format!("/payments/{id}/capture"), key, &body)
        .await;
    let status = r.status();
    (status, json_of(r).await)
}

/// `payment`'s PaymentIntent as localstripe holds it (past the layer).
async fn intent_at_stripe(app: &TestApp, payment: &Value) -> Value {
    let intent = payment["provider_charge_id"].as_str().expect("intent");
    reqwest::Client::new()
        .get(format!(
            "{}/v1/payment_intents/{intent}",
            app.stripe.as_ref().expect("stripe").localstripe.url()
        ))
        .bearer_auth(STRIPE_KEY)
        .send()
        .await
        .expect("localstripe answers")
        .json()
        .await
        .expect("an intent")
}

/// Issue 55, item 1. A capture amount Stripe cannot take in its currency
/// (three-decimal not ending in 0, MGA not whole ariary, under Stripe's
/// minimum: docs/providers/stripe.md, currency units) is `422
/// amount_not_supported_by_provider` (`field` `amount`) before any
/// capture row or call: the payment stays `requires_capture`, the hold
/// stands at Stripe, and a capture of an amount Stripe takes is then made.
/// It used to end the payment `voided`, `expired`, `409
/// authorization_expired`, with nothing cancelled at Stripe. (A capture
/// Stripe declines, `402 card_error`, is the provider contract's
/// `a_declined_capture_leaves_the_hold_to_capture_again`.)
#[tokio::test]
async fn a_capture_amount_stripe_cannot_take_is_refused_before_anything_and_the_hold_stands() {
    let Some(app) = stripe_app().await else {
        return;
    };
    for (currency, total, refused, rule, taken) in [
        ("KWD", 10_000, 5125, "last digit 0", 5120),
        ("MGA", 100_000, 50_050, "multiple of 100", 50_000),
        ("EUR", 1000, 49, "minimum", 50),
    ] {
        let order = app.order_in(currency, total).await;
        let held = held_at_stripe(&app, &order).await;
        let sent = app.layer().forwarded(Call::Capture);
        let rows = app.count("SELECT count(*) FROM payment_capture").await;
        let (status, problem) = capture_at(
            &app,
            &held,
            &format!("odd-{currency}"),
            json!({"amount": refused}),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{currency} {refused}: {problem}"
        );
        assert_eq!(problem["code"], "amount_not_supported_by_provider");
        assert_eq!(problem["field"], "amount");
        assert_eq!(problem["currency"], currency);
        let detail = problem["detail"].as_str().expect("detail");
        assert!(detail.contains(rule), "{detail}");
        assert_eq!(app.layer().forwarded(Call::Capture), sent, "no call");
        assert_eq!(
            app.count("SELECT count(*) FROM payment_capture").await,
            rows,
            "no capture row"
        );
        let p = payment(&app, &held["id"]).await;
        assert_eq!(
            (p["status"].as_str(), p["void_reason"].as_str()),
            (Some("requires_capture"), None),
            "{p}"
        );
        assert_eq!(
            intent_at_stripe(&app, &held).await["status"],
            "requires_capture",
            "the hold stands at Stripe"
        );
        let (status, paid) = capture_at(
            &app,
            &held,
            &format!("even-{currency}"),
            json!({"amount": taken}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{currency} {taken}: {paid}");
        assert_eq!(
            (paid["status"].as_str(), paid["amount_captured"].as_i64()),
            (Some("succeeded"), Some(taken))
        );
        assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    }
}

/// Issue 55, item 2. Stripe refuses a capture without naming the intent
/// (`400 invalid_request_error` `amount_too_small`, saved under the key
/// and replayed: PaymentIntents API, error codes). The capture is final:
/// `402 capture_refused` with Stripe's code, the capture row `failed`,
/// nothing sent again by the reconciler, the payment `requires_capture`,
/// and a void right after is `200 voided`. Stripe's
/// `charge_expired_for_capture` reads the intent back and applies what it
/// says: the hold Stripe cancelled at its deadline is `voided`, `expired`.
/// Both used to be `202`, the key re-sent on every pass, and a void
/// refused while the payment was "being captured".
#[tokio::test]
async fn a_capture_stripe_refuses_without_the_intent_is_final_and_the_hold_can_be_voided() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let order = app.create_order().await;
    let held = held_at_stripe(&app, &order).await;
    let id = held["id"].as_str().expect("id").to_string();
    app.layer().set_times(
        Call::Capture,
        StripeFault::Refuse {
            status: 400,
            kind: "invalid_request_error",
            code: "amount_too_small",
        },
        1,
    );
    let (status, problem) = capture_at(&app, &held, "small", json!({"amount": 60})).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{problem}");
    assert_eq!(problem["code"], "capture_refused");
    assert_eq!(problem["failure_code"], "amount_too_small");
    assert_eq!(problem["payment_status"], "requires_capture");
    let row: (String, Option<String>) = sqlx::query_as(
        "SELECT status, failure_code FROM payment_capture WHERE payment_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(&app.db)
    .await
    .expect("the capture row");
    assert_eq!(
        row,
        ("failed".to_string(), Some("amount_too_small".to_string()))
    );
    // Final: the reconciler sends nothing again, under any key.
    let replayed = app.layer().replayed();
    app.reconcile().await;
    assert_eq!(app.layer().replayed(), replayed, "the key is not re-sent");
    assert_eq!(app.layer().refused(Call::Capture), 1);
    assert_eq!(app.layer().forwarded(Call::Capture), 0);
    let p = payment(&app, &held["id"]).await;
    assert_eq!(p["status"], "requires_capture", "{p}");
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "authorized"
    );
    // The hold can be released at once.
    let r = app
        .post(&format!("/payments/{id}/void"), "void-after", &json!({}))
        .await;
    let status = r.status();
    let voided = json_of(r).await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    assert_eq!(
        (voided["status"].as_str(), voided["void_reason"].as_str()),
        (Some("voided"), Some("requested"))
    );
    assert_eq!(intent_at_stripe(&app, &held).await["status"], "canceled");

    // charge_expired_for_capture: Stripe refuses, and the intent, read
    // back, was cancelled at its deadline (`automatic`).
    let order = app.create_order().await;
    let held = held_at_stripe(&app, &order).await;
    app.layer().set_times(
        Call::Capture,
        StripeFault::Refuse {
            status: 400,
            kind: "invalid_request_error",
            code: "charge_expired_for_capture",
        },
        1,
    );
    app.layer()
        .expire_hold(held["provider_charge_id"].as_str().expect("intent"));
    let (status, problem) = capture_at(&app, &held, "late", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["code"], "authorization_expired");
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired")),
        "{p}"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(intent_at_stripe(&app, &held).await["status"], "canceled");
    assert_eq!(app.layer().forwarded(Call::Capture), 0, "nothing captured");
}

/// Issue 55, item 8. A hold cancelled in Stripe's Dashboard (here
/// `fraudulent`, through the layer, which shows a cancel's
/// `cancellation_reason` on the intent as Stripe does) reads `voided`,
/// `void_reason: cancelled_at_provider`, with Stripe's reason in
/// `failure_code`, and the order is payable again; it used to read
/// `expired`. A hold Stripe cancels at its deadline (`automatic`) still
/// reads `expired` (the contract's `an_expiry_event_voids_the_hold`), and
/// our own void `requested` (`voids_a_hold`).
#[tokio::test]
async fn a_hold_cancelled_in_stripes_dashboard_reads_cancelled_at_provider() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let order = app.create_order().await;
    let held = held_at_stripe(&app, &order).await;
    let intent = held["provider_charge_id"].as_str().expect("intent");
    let cancelled: Value = reqwest::Client::new()
        .post(format!(
            "{}/v1/payment_intents/{intent}/cancel",
            app.layer().url()
        ))
        .bearer_auth(STRIPE_KEY)
        .form(&[("cancellation_reason", "fraudulent")])
        .send()
        .await
        .expect("the layer answers")
        .json()
        .await
        .expect("an intent");
    assert_eq!(
        (
            cancelled["status"].as_str(),
            cancelled["cancellation_reason"].as_str()
        ),
        (Some("canceled"), Some("fraudulent")),
        "{cancelled}"
    );
    let event = json!({
        "id": format!("evt_{}", Uuid::new_v4().simple()),
        "object": "event",
        "type": "payment_intent.canceled",
        "created": chrono::Utc::now().timestamp(),
        "data": {"object": cancelled},
    });
    let r = post_stripe_event(&app, &event).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["outcome"], "processed");
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (
            p["status"].as_str(),
            p["void_reason"].as_str(),
            p["failure_code"].as_str()
        ),
        (
            Some("voided"),
            Some("cancelled_at_provider"),
            Some("fraudulent")
        ),
        "{p}"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
}

// ---- a 500 Stripe replays for a key, and the lease (issue 55, items 4
// and 5) ----

impl TestApp {
    /// Where the keys of the row `id` of `table` stand: its generation and
    /// whether the provider spent its key.
    async fn provider_keys(&self, table: &str, id: &Value) -> (i32, bool) {
        sqlx::query_as(&format!(
            "SELECT provider_key_generation, provider_key_spent FROM {table} WHERE id = $1::uuid"
        ))
        .bind(id.as_str().expect("an id"))
        .fetch_one(&self.db)
        .await
        .expect("the row's keys")
    }
}

/// Issue 55, item 4 (review N4). Stripe saves a `500` under the confirm's
/// key and replays it (`Stripe-Should-Retry: false`: the layer's
/// `ErrorSaved`), and the PaymentIntent stays `requires_confirmation`.
/// The attempt used to stay `pending` until Stripe forgot the key, a day
/// later, and then charge. The spent key is recorded; the reconciler's
/// read proves the intent unconfirmed, so it confirms it under a new key
/// of its own, recorded first (`oncepay_<attempt>_confirm_1`): the payment
/// succeeds at the first pass, charged once.
#[tokio::test]
async fn a_confirm_answered_with_a_replayed_500_is_sent_again_under_a_new_key() {
    let Some(app) = stripe_app().await else {
        return;
    };
    app.layer().set_times(
        Call::Confirm,
        StripeFault::ErrorSaved {
            should_retry: Some(false),
        },
        1,
    );
    let (order, status, pending) = app.pay_visa().await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending", "never a decline");
    assert_eq!(app.layer().forwarded(Call::Confirm), 0);
    assert_eq!(
        app.provider_keys("payment_attempt", &pending["id"]).await,
        (0, true),
        "the spent key is recorded"
    );
    // Stripe replays the 500 to the key, and the intent is unconfirmed.
    let id = pending["id"].as_str().expect("id");
    let intent = pending["provider_charge_id"].as_str().expect("intent");
    let replay = reqwest::Client::new()
        .post(format!(
            "{}/v1/payment_intents/{intent}/confirm",
            app.layer().url()
        ))
        .bearer_auth(STRIPE_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("Idempotency-Key", format!("oncepay_{id}_confirm"))
        .body("")
        .send()
        .await
        .expect("the layer answers");
    assert_eq!(replay.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["stripe-should-retry"], "false");
    assert_eq!(
        intent_at_stripe(&app, &pending).await["status"],
        "requires_confirmation"
    );

    app.reconcile().await;
    let paid = payment(&app, &pending["id"]).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(
        app.charges_at_provider(&order).await,
        (1, 1),
        "charged once"
    );
    assert_eq!(
        app.layer().forwarded(Call::Confirm),
        1,
        "one confirm got through"
    );
    assert_eq!(
        app.provider_keys("payment_attempt", &pending["id"]).await,
        (1, false),
        "the new key was recorded before it was used"
    );
    assert_eq!(
        app.metric("oncepay_reconciler_total{kind=\"payment\",outcome=\"new_provider_key\"}"),
        1
    );
    // Settled: nothing is sent again.
    app.reconcile().await;
    assert_eq!(app.layer().forwarded(Call::Confirm), 1);
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

/// Issue 55, item 4, for a refund: Stripe saves a `500` under the
/// refund's key and replays it; no refund exists at Stripe. The refund
/// used to stay `pending`, its amount held, until Stripe forgot the key. A
/// read of the PaymentIntent's refunds, made after the spent key was
/// recorded, finds none carrying the refund's id, so it is made under a
/// new key (`oncepay_<refund>_refund_1`): succeeded at the first pass,
/// refunded once.
#[tokio::test]
async fn a_refund_answered_with_a_replayed_500_is_sent_again_under_a_new_key() {
    let Some(app) = stripe_app().await else {
        return;
    };
    let (order, status, paid) = app.pay_visa().await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    app.layer().set_times(
        Call::Refund,
        StripeFault::ErrorSaved {
            should_retry: Some(false),
        },
        1,
    );
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app
        .post(&path, "replayed-500", &json!({"amount": 700}))
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let pending = json_of(r).await;
    assert_eq!(pending["status"], "pending", "{pending}");
    assert_eq!(app.layer().forwarded(Call::Refund), 0);
    assert_eq!(
        app.provider_keys("refund", &pending["id"]).await,
        (0, true),
        "the spent key is recorded"
    );
    let intent = paid["provider_charge_id"].as_str().expect("intent");
    let stack = app.stripe.as_ref().expect("stripe");
    let refunds_path = format!("/v1/refunds?payment_intent={intent}&limit=100");
    assert!(stripe_list(stack, &refunds_path).await.is_empty());

    app.reconcile().await;
    let refund_id = pending["id"].as_str().expect("id");
    let refund = json_of(app.get(&format!("/refunds/{refund_id}")).await).await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    let refunds = stripe_list(stack, &refunds_path).await;
    assert_eq!(refunds.len(), 1, "refunded once: {refunds:?}");
    assert_eq!(refunds[0]["amount"], 700);
    assert_eq!(refunds[0]["metadata"]["oncepay_refund_id"], refund_id);
    assert_eq!(
        app.provider_keys("refund", &pending["id"]).await,
        (1, false)
    );
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 700);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    app.reconcile().await;
    assert_eq!(stripe_list(stack, &refunds_path).await.len(), 1);
    assert_eq!(app.layer().forwarded(Call::Refund), 1);
}

/// Issue 55, item 5 (review N5). A lease of 4 s, a Stripe timeout of 10 s
/// (whose retry budget, twice that, used to be 20 s), and a confirm Stripe
/// holds past the lease: the command's calls end within three quarters of
/// its lease, so it answers `202` before the lease ends, and a
/// reconciler passing all along (as another process's would, past the
/// lease's end too) never resumes it. Released, the confirm charges, and
/// the reconciler settles the payment, charged once.
#[tokio::test]
async fn a_confirm_slower_than_the_lease_is_cut_within_it_and_never_resumed_while_it_runs() {
    if !localstripe_or_skip() {
        return;
    }
    let lease = Duration::from_secs(4);
    let app = spawn_app_with(
        Options::default()
            .provider(Provider::Stripe)
            .serve("ONCEPAY_IDEMPOTENCY_LEASE", "4s")
            .serve("ONCEPAY_STRIPE_TIMEOUT", "10s"),
    )
    .await;
    app.layer().set_times(Call::Confirm, StripeFault::Stall, 1);
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let body = json!({"order_id": order, "payment_method": "pm_card_visa"});
    let started = std::time::Instant::now();
    let pay = async {
        let r = app.post("/payments", &key, &body).await;
        (started.elapsed(), r.status(), json_of(r).await)
    };
    let other_process = async {
        let mut resumed = 0;
        while started.elapsed() < lease + Duration::from_secs(1) {
            let pass = oncepay::workers::reconciler::pass(&app.ctx)
                .await
                .expect("a pass");
            resumed += pass.resumed;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        resumed
    };
    let ((took, status, pending), resumed) = tokio::join!(pay, other_process);
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending");
    assert!(took < lease, "answered in {took:?}, within the lease");
    assert_eq!(resumed, 0, "never resumed while it ran");
    assert_eq!(
        app.metric("oncepay_idempotency_total{outcome=\"resumed\"}"),
        0
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM idempotency_record
              WHERE idempotency_key = '{key}' AND state = 'completed'"
        ))
        .await,
        1,
        "its answer is the stored one"
    );
    assert_eq!(app.layer().stalled(), 1, "Stripe still holds the confirm");
    // Released, it charges; the reconciler settles what Stripe did.
    app.layer().heal();
    let settled = ready::until(Duration::from_secs(20), || async {
        app.reconcile().await;
        payment(&app, &pending["id"]).await["status"] == "succeeded"
    })
    .await;
    assert!(settled.is_ok(), "settled after the release");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
    let again = app.post("/payments", &key, &body).await;
    assert_eq!(again.status(), StatusCode::ACCEPTED, "the stored answer");
}

/// A Stripe service with no `ONCEPAY_STRIPE_WEBHOOK_SECRET`: every Stripe
/// webhook is refused, so only reading back learns what only webhooks
/// carry.
async fn stripe_app_without_webhooks() -> Option<TestApp> {
    if !localstripe_or_skip() {
        return None;
    }
    let options = Options::default()
        .provider(Provider::Stripe)
        .serve("ONCEPAY_RECONCILE_AFTER", "0s")
        // Set empty, it is unset (and the helper's secret comes after it).
        .serve("ONCEPAY_STRIPE_WEBHOOK_SECRET", "");
    let app = spawn_app_with(options).await;
    let event = json!({
        "id": format!("evt_{}", Uuid::new_v4().simple()),
        "object": "event",
        "type": "refund.failed",
        "created": chrono::Utc::now().timestamp(),
        "data": {"object": {"id": "re_x", "object": "refund", "status": "failed"}},
    });
    let refused = post_stripe_event(&app, &event).await;
    assert_eq!(
        refused.status(),
        StatusCode::UNAUTHORIZED,
        "webhooks refused"
    );
    Some(app)
}

/// An order paid with a card and refunded in full (Stripe says
/// `succeeded`): the order and the refund.
async fn refunded_in_full(app: &TestApp) -> (String, Value) {
    let (order, status, paid) = app.pay_visa().await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let refund = json_of(
        app.post(&path, &Uuid::new_v4().to_string(), &json!({}))
            .await,
    )
    .await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
    (order, refund)
}

/// Stripe fails `refund` after it succeeded (the card was closed), as its
/// reads show from then on, and sends no event.
async fn fails_at_stripe(app: &TestApp, refund: &Value) {
    let id: String =
        sqlx::query_scalar("SELECT provider_refund_id FROM refund WHERE id = $1::uuid")
            .bind(refund["id"].as_str().expect("id"))
            .fetch_one(&app.db)
            .await
            .expect("the refund's Stripe id");
    app.layer().fail_refund(&id, "expired_or_canceled_card");
}

/// Moves `refund`'s creation and success `days` into the past.
async fn aged(app: &TestApp, refund: &Value, days: i32) {
    sqlx::query(
        "UPDATE refund SET created_at = created_at - make_interval(days => $2),
                           updated_at = updated_at - make_interval(days => $2)
          WHERE id = $1::uuid",
    )
    .bind(refund["id"].as_str().expect("id"))
    .bind(days)
    .execute(&app.db)
    .await
    .expect("aged");
}

/// `refund` failed after it succeeded and oncepay applied it as the
/// webhook would have: failed with Stripe's `failure_reason`, its amount
/// refundable again, the order paid again, a `refund.failed` caused by the
/// reconciler; `incidents` `refund_failed_after_success` in all.
async fn applied_as_failed(app: &TestApp, order: &str, refund: &Value, incidents: i64) {
    let id = refund["id"].as_str().expect("id");
    let now = json_of(app.get(&format!("/refunds/{id}")).await).await;
    assert_eq!(now["status"], "failed", "{now}");
    assert_eq!(now["failure_code"], "expired_or_canceled_card");
    assert_eq!(
        payment(app, &refund["payment_id"]).await["refunded_amount"],
        0
    );
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'refund_failed_after_success'")
            .await,
        incidents
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM event WHERE type = 'refund.failed' AND object_id = '{id}' AND cause = 'reconciler'"
        ))
        .await,
        1
    );
}

/// Issue 55, item 3 (the second reading's N2). With no webhook secret, a
/// refund Stripe fails after it succeeded (Refunds API: `status` `failed`
/// with a `failure_reason` such as `expired_or_canceled_card`; the layer's
/// `fail_refund`) is applied by the books, never recorded as a mismatch:
/// by `oncepay reconcile` an hour later (its `--dry-run` only says so), by
/// the scheduled pass 29 days after it succeeded, when no window holds it
/// any more (our succeeded refunds are read again); past 30 days it is
/// not read again.
#[tokio::test]
async fn with_no_webhook_secret_a_refund_stripe_fails_later_is_applied_by_the_books() {
    let Some(app) = stripe_app_without_webhooks().await else {
        return;
    };
    let (order, refund) = refunded_in_full(&app).await;
    fails_at_stripe(&app, &refund).await;
    let (ok, dry) = crate::books::reconcile(&app, &["--since", "26h", "--dry-run"]).await;
    assert!(ok, "{dry}");
    assert_eq!(crate::books::read_back_counts(&dry, "stripe").0, 1, "{dry}");
    let id = refund["id"].as_str().expect("id");
    assert_eq!(app.status_of(&format!("/refunds/{id}")).await, "succeeded");
    let (ok, report) = crate::books::reconcile(&app, &["--since", "26h"]).await;
    assert!(ok, "{report}");
    assert_eq!(
        crate::books::counts(&report, "stripe")[4],
        0,
        "no mismatch: {report}"
    );
    assert_eq!(
        crate::books::read_back_counts(&report, "stripe").0,
        1,
        "{report}"
    );
    applied_as_failed(&app, &order, &refund, 1).await;

    // 29 days after its success: no books window lists it any more.
    let (order, refund) = refunded_in_full(&app).await;
    aged(&app, &refund, 29).await;
    fails_at_stripe(&app, &refund).await;
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, "stripe").reversed, 1, "{runs:?}");
    applied_as_failed(&app, &order, &refund, 2).await;

    // 31 days: past the watch, it is not read again.
    let (order, refund) = refunded_in_full(&app).await;
    aged(&app, &refund, 31).await;
    fails_at_stripe(&app, &refund).await;
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, "stripe").reversed, 0, "{runs:?}");
    let id = refund["id"].as_str().expect("id");
    assert_eq!(app.status_of(&format!("/refunds/{id}")).await, "succeeded");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
}

/// Issue 55, item 3. With no webhook secret, a dispute opened at Stripe
/// (an inquiry), escalated to a chargeback, then won, each without an
/// event, is applied by the books as its events would have been (the
/// Disputes API's list, `created` filtered, and each Dispute read by id:
/// the layer answers both as Stripe does): `oncepay reconcile` lists it
/// (a dispute of a charge made elsewhere on the account is left alone),
/// later passes read it again by id while it is open;
/// `dispute.created|updated|closed` once each, caused by the reconciler,
/// counted in `oncepay_disputes_total`, its evidence deadline kept (what
/// the evidence alert reads).
#[tokio::test]
async fn with_no_webhook_secret_a_dispute_opened_and_moved_at_stripe_is_applied_by_the_books() {
    let Some(app) = stripe_app_without_webhooks().await else {
        return;
    };
    let (_, status, paid) = app.pay_visa().await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    let pid = paid["id"].as_str().expect("id").to_string();
    let intent = paid["provider_charge_id"]
        .as_str()
        .expect("intent")
        .to_string();
    let amount = paid["amount"].as_i64().expect("amount");
    let opened = app.layer().open_dispute(
        (intent.as_str(), "ch_disputed"),
        (amount, "eur"),
        "fraudulent",
        "warning_needs_response",
    );
    app.layer().open_dispute(
        ("pi_made_elsewhere", "ch_made_elsewhere"),
        (500, "eur"),
        "fraudulent",
        "needs_response",
    );
    let id = opened["id"].as_str().expect("id").to_string();
    let shown = |pid: String| {
        let app = &app;
        async move { json_of(app.get(&format!("/payments/{pid}")).await).await["dispute"].clone() }
    };

    let (ok, report) = crate::books::reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    assert_eq!(
        crate::books::read_back_counts(&report, "stripe"),
        (0, 1),
        "{report}"
    );
    let dispute = shown(pid.clone()).await;
    assert_eq!(
        (
            dispute["status"].as_str(),
            dispute["provider_status"].as_str()
        ),
        (Some("needs_response"), Some("warning_needs_response")),
        "{dispute}"
    );
    assert!(dispute["evidence_due_by"].is_string(), "{dispute}");
    assert_eq!(
        app.count("SELECT count(*) FROM dispute").await,
        1,
        "another charge's dispute is not stored"
    );

    // The inquiry becomes a chargeback at Stripe: read again by id.
    app.layer()
        .set_dispute_status(&id, "needs_response")
        .expect("the dispute");
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, "stripe").disputes, 1, "{runs:?}");
    assert_eq!(
        shown(pid.clone()).await["provider_status"],
        "needs_response"
    );
    let r = app
        .post(
            &format!("/payments/{pid}/refunds"),
            "during-chargeback",
            &json!({"amount": 100}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "payment_disputed");

    // Won.
    app.layer().close_dispute(&id, "won").expect("the dispute");
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, "stripe").disputes, 1, "{runs:?}");
    assert_eq!(shown(pid.clone()).await["status"], "won");
    // Nothing moves any more.
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, "stripe").disputes, 0, "{runs:?}");
    let events: Vec<(String, String)> = sqlx::query_as(
        "SELECT type, cause FROM event WHERE object_type = 'dispute' ORDER BY sequence",
    )
    .fetch_all(&app.db)
    .await
    .expect("events");
    let reconciler = |t: &str| (t.to_string(), "reconciler".to_string());
    assert_eq!(
        events,
        vec![
            reconciler("dispute.created"),
            reconciler("dispute.updated"),
            reconciler("dispute.closed"),
        ]
    );
    // The dispute was opened by `oncepay reconcile` (another process,
    // whose metrics are its own) and closed by this process's pass: its
    // metric counts the close, as a webhook's would.
    let rendered = app.ctx.metrics.render();
    let line = "oncepay_disputes_total{provider=\"stripe\",status=\"won\"} 1";
    assert!(rendered.contains(line), "{line} in:\n{rendered}");
}
