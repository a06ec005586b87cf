//! One provider contract, run against every adapter: the same scenarios
//! pass with the sandbox and with Stripe (localstripe behind the
//! Stripe-semantics layer). A scenario speaks of cards, faults, provider
//! books and events in general terms; [`Books`] turns each into the
//! provider's own (a `tok_` or a `pm_`, a fault proxy rule or a layer
//! fault, the sandbox's ledger or localstripe's PaymentIntents, a Standard
//! Webhooks or a `Stripe-Signature` event). Each scenario counts what the
//! provider holds at the end.
//!
//! The third adapter, `balance` (a customer's balance on oncepay's own
//! ledger), runs its own form of each scenario that applies to a balance,
//! under the scenario's name, and skips by name, with the reason, each one
//! that cannot apply (3-D Secure, disputes, webhooks, credentials, manual
//! capture): see `balance_contract!`.
//!
//! `make test` prints how many scenarios ran per provider, and the balance
//! adapter's skips with their reasons.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay::store::books::{Counts, Run};
use oncepay_testkit::fault_proxy::{Fault, Route};
use oncepay_testkit::ready;
use oncepay_testkit::stripe_layer::{Call, StripeFault};

/// What can go wrong on the call that moves the money (the sandbox's
/// charge, Stripe's confirm).
#[derive(Debug, Clone, Copy)]
enum Trouble {
    /// The provider refuses our credentials (a rotated key): `401`.
    Unauthorized,
    /// The call never gets through (the sandbox is unreachable; Stripe
    /// answers `500` and asks not to retry).
    NotThrough,
    /// The provider moves the money and the answer is lost or an error
    /// (the sandbox's answer replaced by a `503`; Stripe's saved `500`).
    AfterTheCharge,
}

/// The provider's side of a test app.
trait Books {
    fn under(&self) -> Provider;
    fn card(&self) -> &'static str;
    fn declined_card(&self) -> &'static str;
    fn trouble(&self, trouble: Trouble);
    fn heal(&self);
}

impl Books for TestApp {
    fn under(&self) -> Provider {
        if self.stripe.is_some() {
            Provider::Stripe
        } else {
            Provider::Sandbox
        }
    }

    fn card(&self) -> &'static str {
        match self.under() {
            Provider::Sandbox => "tok_visa",
            Provider::Stripe => "pm_card_visa",
        }
    }

    fn declined_card(&self) -> &'static str {
        match self.under() {
            Provider::Sandbox => "tok_declined",
            // localstripe's card 4000000000000341.
            Provider::Stripe => "pm_card_chargeCustomerFail",
        }
    }

    fn trouble(&self, trouble: Trouble) {
        match &self.stripe {
            None => {
                let fault = match trouble {
                    Trouble::Unauthorized => Fault::answer(401, "unauthorized"),
                    Trouble::NotThrough => Fault::Down,
                    Trouble::AfterTheCharge => Fault::ForwardThenAnswer {
                        status: 503,
                        body: r#"{"code":"unavailable"}"#.into(),
                    },
                };
                self.proxy().set(Route::Charge, fault);
            }
            Some(stack) => {
                let fault = match trouble {
                    Trouble::Unauthorized => StripeFault::Unauthorized,
                    Trouble::NotThrough => StripeFault::ServerError {
                        should_retry: Some(false),
                    },
                    Trouble::AfterTheCharge => StripeFault::ErrorAfterEffect,
                };
                stack.layer.set(Call::Confirm, fault);
            }
        }
    }

    fn heal(&self) {
        match &self.stripe {
            None => self.proxy().heal(),
            Some(stack) => stack.layer.heal(),
        }
    }
}

impl TestApp {
    /// The provider's money-moving charges for `order_id`, and every
    /// object it holds for it (charges, or PaymentIntents in any state).
    pub async fn charges_at_provider(&self, order_id: &str) -> (usize, usize) {
        let objects: Vec<Value> = match &self.stripe {
            None => self.charges_for(order_id).await,
            Some(stack) => stripe_list(stack, "/v1/payment_intents?limit=100")
                .await
                .into_iter()
                .filter(|pi| pi["metadata"]["oncepay_order_id"] == order_id)
                .collect(),
        };
        let succeeded = objects
            .iter()
            .filter(|o| o["status"] == "succeeded")
            .count();
        (succeeded, objects.len())
    }

    /// What the provider refunded of `payment`'s charge.
    async fn refunded_at_provider(&self, payment: &Value) -> i64 {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        let refunds: Vec<Value> = match &self.stripe {
            None => self.ledger().await["refunds"]
                .as_array()
                .expect("refunds")
                .iter()
                .filter(|r| r["charge"] == charge)
                .cloned()
                .collect(),
            Some(stack) => {
                stripe_list(
                    stack,
                    &format!("/v1/refunds?payment_intent={charge}&limit=100"),
                )
                .await
            }
        };
        refunds
            .iter()
            .filter(|r| r["status"] == "succeeded")
            .map(|r| r["amount"].as_i64().expect("amount"))
            .sum()
    }

    /// Refunds `amount` of `payment`'s charge at the provider itself, past
    /// oncepay (a refund from the provider's dashboard).
    async fn refund_at_provider(&self, payment: &Value, amount: i64) {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        let answer = match &self.stripe {
            None => {
                self.http
                    .post(format!("{}/v1/refunds", self.sandbox))
                    .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                    .json(&json!({"charge": charge, "amount": amount}))
                    .send()
                    .await
            }
            Some(stack) => {
                reqwest::Client::new()
                    .post(format!("{}/v1/refunds", stack.localstripe.url()))
                    .bearer_auth(STRIPE_KEY)
                    .form(&[("payment_intent", charge), ("amount", &amount.to_string())])
                    .send()
                    .await
            }
        }
        .expect("the provider answers");
        assert!(answer.status().is_success(), "{}", answer.status());
    }

    /// Pays a new order with a card whose issuer asks the customer to
    /// authenticate (3-D Secure, by redirect to the bank); returns the
    /// order, the waiting payment and its bank page.
    async fn pay_waiting(&self) -> (String, Value, String) {
        let order = self.create_order().await;
        let waiting = match &self.stripe {
            None => self.pay(&order, "tok_3ds").await.1,
            Some(_) => {
                let card = crate::stripe::stripe_card(self, "4000002760003184").await;
                crate::stripe::pay_returning(self, &order, &card, "http://127.0.0.1:9/back")
                    .await
                    .1
            }
        };
        assert_eq!(waiting["status"], "pending", "{waiting}");
        assert_eq!(waiting["next_action"]["type"], "redirect", "{waiting}");
        let bank = waiting["next_action"]["url"]
            .as_str()
            .expect("url")
            .to_string();
        (order, waiting, bank)
    }

    /// As [`TestApp::pay_waiting`], a manual payment (`capture_method:
    /// manual`): authorized, not charged, when the customer approves.
    async fn pay_waiting_held(&self) -> (String, Value, String) {
        let order = self.create_order().await;
        let method = match &self.stripe {
            None => "tok_3ds".to_string(),
            Some(_) => crate::stripe::stripe_card(self, "4000002760003184").await,
        };
        let r = self
            .post(
                "/payments",
                &Uuid::new_v4().to_string(),
                &json!({
                    "order_id": order,
                    "payment_method": method,
                    "capture_method": "manual",
                    "return_url": "http://127.0.0.1:9/back",
                }),
            )
            .await;
        let waiting = json_of(r).await;
        assert_eq!(waiting["status"], "pending", "{waiting}");
        assert_eq!(waiting["next_action"]["type"], "redirect", "{waiting}");
        let bank = waiting["next_action"]["url"]
            .as_str()
            .expect("url")
            .to_string();
        (order, waiting, bank)
    }

    /// Presses `button` on the bank page as the customer would; the page's
    /// answer status.
    async fn at_bank(&self, bank: &str, button: &str) -> StatusCode {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
            .post(format!("{bank}/{button}"))
            .send()
            .await
            .expect("the bank answers")
            .status()
    }

    /// Holds the provider call that gives up on a charge (the sandbox's
    /// cancel, Stripe's PaymentIntent cancel) until [`Books::release`].
    fn hold_cancel(&self) {
        match &self.stripe {
            None => self.proxy().set(Route::Cancel, Fault::Hold),
            Some(stack) => stack.layer.set(Call::Cancel, StripeFault::Stall),
        }
    }

    fn cancels_held(&self) -> u64 {
        match &self.stripe {
            None => self.proxy().held(),
            Some(stack) => stack.layer.stalled(),
        }
    }

    fn release_cancel(&self) {
        match &self.stripe {
            None => {
                self.proxy().set(Route::Cancel, Fault::Pass);
                self.proxy().release();
            }
            Some(stack) => {
                stack.layer.clear(Call::Cancel);
                stack.layer.release();
            }
        }
    }

    /// The provider's own status of `payment`'s charge.
    async fn provider_status(&self, payment: &Value) -> String {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        let object: Value = match &self.stripe {
            None => {
                json_of(
                    self.http
                        .get(format!("{}/v1/charges/{charge}", self.sandbox))
                        .send()
                        .await
                        .expect("the sandbox answers"),
                )
                .await
            }
            Some(stack) => reqwest::Client::new()
                .get(format!(
                    "{}/v1/payment_intents/{charge}",
                    stack.localstripe.url()
                ))
                .bearer_auth(STRIPE_KEY)
                .send()
                .await
                .expect("localstripe answers")
                .json()
                .await
                .expect("an intent"),
        };
        object["status"].as_str().unwrap_or_default().to_string()
    }

    /// Makes `refund`, which succeeded, fail at the provider afterwards (a
    /// card closed or expired), and delivers the provider's event of it
    /// (`refund.failed`); returns the event's outcome.
    async fn refund_fails_later(&self, refund: &Value) -> String {
        let object = self.refund_fails_unheard(refund).await;
        let r = match &self.stripe {
            None => {
                let event = json!({
                    "id": format!("evt_{}", Uuid::new_v4().simple()),
                    "type": "refund.failed",
                    "created": chrono::Utc::now().timestamp(),
                    "data": {"object": object},
                });
                post_signed_webhook(self, &event).await
            }
            Some(_) => {
                let event = json!({
                    "id": format!("evt_{}", Uuid::new_v4().simple()),
                    "object": "event",
                    "type": "refund.failed",
                    "created": chrono::Utc::now().timestamp(),
                    "data": {"object": object},
                });
                post_stripe_event(self, &event).await
            }
        };
        assert_eq!(r.status(), StatusCode::OK);
        json_of(r).await["outcome"]
            .as_str()
            .expect("outcome")
            .to_string()
    }

    /// Makes `refund`, which succeeded, fail at the provider afterwards (a
    /// card closed or expired; the sandbox's `POST /v1/refunds/{id}/fail`,
    /// the layer's `fail_refund`), and no event of it comes; returns the
    /// provider's refund as it now reads (`failed`).
    async fn refund_fails_unheard(&self, refund: &Value) -> Value {
        let id = refund["id"].as_str().expect("id");
        let provider_id: String =
            sqlx::query_scalar("SELECT provider_refund_id FROM refund WHERE id = $1::uuid")
                .bind(id)
                .fetch_one(&self.db)
                .await
                .expect("the refund's provider id");
        let object = match &self.stripe {
            None => {
                let failed = self
                    .http
                    .post(format!("{}/v1/refunds/{provider_id}/fail", self.sandbox))
                    .json(&json!({"failure_code": "expired_or_canceled_card"}))
                    .send()
                    .await
                    .expect("the sandbox answers");
                assert_eq!(failed.status(), StatusCode::OK);
                json_of(failed).await
            }
            Some(stack) => {
                stack
                    .layer
                    .fail_refund(&provider_id, "expired_or_canceled_card");
                reqwest::Client::new()
                    .get(format!("{}/v1/refunds/{provider_id}", stack.layer.url()))
                    .bearer_auth(STRIPE_KEY)
                    .send()
                    .await
                    .expect("the layer answers")
                    .json::<Value>()
                    .await
                    .expect("a refund")
            }
        };
        assert_eq!(object["status"], "failed", "{object}");
        object
    }

    /// Every refund object the provider holds for `payment`'s charge, in
    /// any status: a refund oncepay refused before calling adds none.
    async fn refunds_at_provider(&self, payment: &Value) -> usize {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        match &self.stripe {
            None => self.ledger().await["refunds"]
                .as_array()
                .expect("refunds")
                .iter()
                .filter(|r| r["charge"] == charge)
                .count(),
            Some(stack) => stripe_list(
                stack,
                &format!("/v1/refunds?payment_intent={charge}&limit=100"),
            )
            .await
            .len(),
        }
    }

    /// The customer's bank disputes `amount` (the whole charge if `None`)
    /// of `payment`'s charge at the provider, and the provider's event of
    /// it is delivered (`charge.dispute.created`); returns the provider's
    /// dispute and the event's outcome.
    async fn dispute_opens(&self, payment: &Value, amount: Option<i64>) -> (Value, String) {
        let dispute = self.dispute_opens_unheard(payment, amount).await;
        let outcome = self.dispute_event(&dispute, "created").await;
        (dispute, outcome)
    }

    /// The customer's bank disputes `amount` (the whole charge if `None`)
    /// of `payment`'s charge at the provider, and its event has not come
    /// yet; returns the provider's dispute.
    async fn dispute_opens_unheard(&self, payment: &Value, amount: Option<i64>) -> Value {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        let amount_or_all = amount.unwrap_or(payment["amount"].as_i64().expect("amount"));
        let dispute = match &self.stripe {
            None => {
                let body = match amount {
                    Some(a) => json!({"amount": a}),
                    None => json!({}),
                };
                let opened = self
                    .http
                    .post(format!("{}/v1/charges/{charge}/disputes", self.sandbox))
                    .json(&body)
                    .send()
                    .await
                    .expect("the sandbox answers");
                assert_eq!(opened.status(), StatusCode::CREATED);
                let dispute = json_of(opened).await;
                assert_eq!(dispute["status"], "needs_response", "{dispute}");
                assert_eq!(dispute["reason"], "fraudulent");
                assert_eq!(dispute["charge_id"], charge);
                assert_eq!(dispute["amount"], amount_or_all);
                dispute
            }
            // A chargeback: the bank took the money (an inquiry, Stripe's
            // `warning_*`, holds nothing: tests/api/disputes.rs).
            Some(stack) => stack.layer.open_dispute(
                (charge, &format!("ch_of_{charge}")),
                (
                    amount_or_all,
                    payment["currency"].as_str().expect("currency"),
                ),
                "fraudulent",
                "needs_response",
            ),
        };
        dispute
    }

    /// The bank decides `dispute` (`won` or `lost`) at the provider and the
    /// provider's event of it is delivered (`charge.dispute.closed`);
    /// returns the event's outcome.
    async fn dispute_closes(&self, dispute: &Value, outcome: &str) -> String {
        let closed = self.dispute_closes_unheard(dispute, outcome).await;
        self.dispute_event(&closed, "closed").await
    }

    /// The bank decides `dispute` (`won` or `lost`) at the provider, and no
    /// event of it comes; returns the provider's dispute.
    async fn dispute_closes_unheard(&self, dispute: &Value, outcome: &str) -> Value {
        let id = dispute["id"].as_str().expect("id");
        let closed = match &self.stripe {
            None => {
                let closed = self
                    .http
                    .post(format!("{}/v1/disputes/{id}/close", self.sandbox))
                    .json(&json!({"outcome": outcome}))
                    .send()
                    .await
                    .expect("the sandbox answers");
                assert_eq!(closed.status(), StatusCode::OK);
                json_of(closed).await
            }
            Some(stack) => stack
                .layer
                .close_dispute(id, outcome)
                .expect("the layer's dispute"),
        };
        assert_eq!(closed["status"], outcome, "{closed}");
        closed
    }

    /// One books pass over `window`, as `serve` runs one every
    /// `ONCEPAY_BOOKS_INTERVAL` (and `oncepay reconcile` the same); its
    /// report per provider.
    pub async fn books_pass(
        &self,
        window: (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>),
    ) -> Vec<Run> {
        let options = oncepay::books::Options {
            dry_run: false,
            policy: oncepay::books::OrphanPolicy::Refund,
            trigger: oncepay::books::Trigger::Schedule,
            read_back: 1000,
        };
        oncepay::books::reconcile(&self.ctx, window, options)
            .await
            .expect("a books pass")
            .expect("no other pass holds the books")
    }

    /// The scheduled books pass now: the last 26 hours
    /// (`ONCEPAY_BOOKS_WINDOW`).
    pub async fn books_now(&self) -> Vec<Run> {
        let now = chrono::Utc::now();
        self.books_pass((now - chrono::Duration::hours(26), now))
            .await
    }

    /// A books pass as one days later sees the provider's lists: its window
    /// ends an hour ago, so it lists nothing made now, and only reading
    /// back finds what changed since.
    pub async fn books_later(&self) -> Vec<Run> {
        let now = chrono::Utc::now();
        self.books_pass((
            now - chrono::Duration::hours(27),
            now - chrono::Duration::hours(1),
        ))
        .await
    }

    /// The name of the provider under test, as runs and metrics say it.
    fn provider_name(&self) -> &'static str {
        match self.under() {
            Provider::Sandbox => "sandbox",
            Provider::Stripe => "stripe",
        }
    }

    /// The line of `/metrics` that starts with `prefix`, if any.
    fn metric_line(&self, prefix: &str) -> Option<String> {
        self.ctx
            .metrics
            .render()
            .lines()
            .find(|l| l.starts_with(prefix))
            .map(str::to_string)
    }

    /// Delivers the provider's `charge.dispute.<kind>` event carrying
    /// `dispute`, signed as the provider signs; returns its outcome.
    async fn dispute_event(&self, dispute: &Value, kind: &str) -> String {
        let event = json!({
            "id": format!("evt_{}", Uuid::new_v4().simple()),
            "object": "event",
            "type": format!("charge.dispute.{kind}"),
            "created": chrono::Utc::now().timestamp(),
            "data": {"object": dispute},
        });
        let r = match &self.stripe {
            None => post_signed_webhook(self, &event).await,
            Some(_) => post_stripe_event(self, &event).await,
        };
        assert_eq!(r.status(), StatusCode::OK, "the event is accepted");
        json_of(r).await["outcome"]
            .as_str()
            .expect("outcome")
            .to_string()
    }

    /// Posts a provider-shaped event, signed as the provider signs, saying
    /// `payment`'s charge is `status` (`succeeded` or `failed`); returns
    /// the recorded outcome.
    async fn provider_event(&self, payment: &Value, status: &str, event_id: &str) -> String {
        let charge = payment["provider_charge_id"].as_str().unwrap_or_default();
        let r = match &self.stripe {
            None => {
                let event = json!({
                    "id": event_id,
                    "type": format!("charge.{status}"),
                    "data": {"object": {
                        "id": charge,
                        "status": status,
                        "amount": payment["amount"],
                        "currency": payment["currency"],
                        "idempotency_key": payment["id"],
                        "failure_code": if status == "failed" { json!("card_declined") } else { Value::Null },
                    }},
                });
                post_signed_webhook(self, &event).await
            }
            Some(_) => {
                let (stripe_status, error) = match status {
                    "succeeded" => ("succeeded", Value::Null),
                    _ => (
                        "requires_payment_method",
                        json!({"type": "card_error", "code": "card_declined"}),
                    ),
                };
                let event = json!({
                    "id": event_id,
                    "object": "event",
                    "type": if status == "succeeded" { "payment_intent.succeeded" } else { "payment_intent.payment_failed" },
                    "created": chrono::Utc::now().timestamp(),
                    "data": {"object": {
                        "id": charge,
                        "object": "payment_intent",
                        "status": stripe_status,
                        "amount": payment["amount"],
                        "currency": payment["currency"].as_str().map(str::to_ascii_lowercase),
                        "last_payment_error": error,
                        "metadata": {"oncepay_attempt_id": payment["id"]},
                    }},
                });
                post_stripe_event(self, &event).await
            }
        };
        assert_eq!(r.status(), StatusCode::OK, "the event is accepted");
        json_of(r).await["outcome"]
            .as_str()
            .expect("outcome")
            .to_string()
    }

    /// Makes what a crash leaves: `key`'s record executing again from
    /// `point` with a dead lease, as if its process died there.
    pub async fn crash_at(&self, key: &str, point: &str) {
        let n = sqlx::query(
            "UPDATE idempotency_record
                SET state = 'executing', recovery_point = $2, lease_token = gen_random_uuid(),
                    lease_expires_at = now() - interval '1 second', response_status = NULL,
                    response_body = NULL, response_location = NULL
              WHERE idempotency_key = $1",
        )
        .bind(key)
        .bind(point)
        .execute(&self.db)
        .await
        .expect("crash")
        .rows_affected();
        assert_eq!(n, 1);
    }

    pub async fn pay_with(&self, key: &str, order_id: &str, card: &str) -> (StatusCode, Value) {
        let body = json!({"order_id": order_id, "payment_method": card});
        let r = self.post("/payments", key, &body).await;
        let status = r.status();
        (status, json_of(r).await)
    }
}

/// What `provider`'s run of a books pass counted.
pub fn report_of(runs: &[Run], provider: &str) -> Counts {
    runs.iter()
        .find(|r| r.provider == provider)
        .map(|r| r.counts)
        .unwrap_or_else(|| panic!("no run of {provider} in {runs:?}"))
}

/// Every object of a localstripe list (read from localstripe itself, not
/// through the layer).
pub async fn stripe_list(stack: &StripeStack, path: &str) -> Vec<Value> {
    let list: Value = reqwest::Client::new()
        .get(format!("{}{path}", stack.localstripe.url()))
        .bearer_auth(STRIPE_KEY)
        .send()
        .await
        .expect("localstripe answers")
        .json()
        .await
        .expect("a list");
    list["data"].as_array().expect("data").clone()
}

/// Posts `event` to `/webhooks/stripe` with Stripe's signature.
pub async fn post_stripe_event(app: &TestApp, event: &Value) -> reqwest::Response {
    let body = event.to_string();
    let signature = oncepay::provider::stripe::signature::sign(
        STRIPE_WEBHOOK_SECRET,
        chrono::Utc::now().timestamp(),
        body.as_bytes(),
    );
    app.http
        .post(format!("{}/webhooks/stripe", app.base))
        .header("Stripe-Signature", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("sent")
}

/// Starts the service with `provider`: provider faults injectable, the
/// reconciler driven by the test, every check due at once.
pub async fn app_with(provider: Provider) -> Option<TestApp> {
    if provider == Provider::Stripe && !localstripe_or_skip() {
        return None;
    }
    // A customer who never authenticates is given up on after a second.
    let mut options = Options::default()
        .provider(provider)
        .serve("ONCEPAY_RECONCILE_AFTER", "0s")
        .serve("ONCEPAY_ACTION_TIMEOUT", "1s");
    if provider == Provider::Sandbox {
        options = options
            .with_fault_proxy()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off");
    }
    Some(spawn_app_with(options).await)
}

pub async fn payment(app: &TestApp, id: &Value) -> Value {
    json_of(
        app.get(&format!("/payments/{}", id.as_str().expect("id")))
            .await,
    )
    .await
}

// ---- the scenarios ----

async fn pays(app: TestApp) {
    let order = app.create_order().await;
    let (status, paid) = app.pay(&order, app.card()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(paid["provider"], app.ctx.providers.current().name());
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

async fn declines(app: TestApp) {
    let order = app.create_order().await;
    let (status, failed) = app.pay(&order, app.declined_card()).await;
    assert_eq!(status, StatusCode::CREATED, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert!(
        failed["failure_code"]
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "a decline says why: {failed}"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.charges_at_provider(&order).await.0, 0);
}

async fn pays_again_after_a_decline(app: TestApp) {
    let order = app.create_order().await;
    let (_, failed) = app.pay(&order, app.declined_card()).await;
    assert_eq!(failed["status"], "failed");
    let (status, paid) = app.pay(&order, app.card()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_ne!(paid["id"], failed["id"], "a new attempt");
    let (succeeded, objects) = app.charges_at_provider(&order).await;
    assert_eq!(
        (succeeded, objects),
        (1, 2),
        "one charge, and the declined one"
    );
}

async fn replays(app: TestApp) {
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let (first_status, first) = app.pay_with(&key, &order, app.card()).await;
    let again = app
        .post(
            "/payments",
            &key,
            &json!({"order_id": order, "payment_method": app.card()}),
        )
        .await;
    assert_eq!(again.status(), first_status);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(json_of(again).await, first);
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

async fn resumes_after_a_crash_between_opening_and_charging(app: TestApp) {
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    app.trouble(Trouble::NotThrough);
    let (status, pending) = app.pay_with(&key, &order, app.card()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending");
    // What a crash leaves: the record executing from its last recorded
    // step. With Stripe the PaymentIntent was created and its id recorded
    // before the confirm; with the sandbox the attempt exists.
    let point = match app.under() {
        Provider::Stripe => {
            assert!(
                pending["provider_charge_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("pi_")),
                "the PaymentIntent is recorded before it is confirmed: {pending}"
            );
            "charge_opened"
        }
        Provider::Sandbox => "attempt_created",
    };
    app.crash_at(&key, point).await;
    app.heal();
    let pass = app.reconcile().await;
    assert_eq!(pass.resumed, 1, "{pass:?}");
    let paid = payment(&app, &pending["id"]).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    // A retry gets the resumed command's answer (read from the record:
    // this process's replay cache still holds the answer the "crash"
    // rewrote, which a real crash would have taken with it).
    let stored: i16 = sqlx::query_scalar(
        "SELECT response_status FROM idempotency_record WHERE idempotency_key = $1",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .expect("record");
    assert_eq!(stored, 201);
    assert_eq!(
        app.charges_at_provider(&order).await,
        (1, 1),
        "one object, charged once"
    );
}

async fn settles_an_answer_lost_after_the_charge(app: TestApp) {
    let order = app.create_order().await;
    app.trouble(Trouble::AfterTheCharge);
    let (status, pending) = app.pay(&order, app.card()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending", "an error is not a decline");
    assert_eq!(
        app.charges_at_provider(&order).await.0,
        1,
        "the money moved"
    );
    // Paying again while it is pending is refused, not charged.
    let (again, _) = app.pay(&order, app.card()).await;
    assert_eq!(again, StatusCode::CONFLICT);
    app.heal();
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "succeeded");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

async fn paid(app: &TestApp) -> (String, Value) {
    let order = app.create_order().await;
    let (status, paid) = app.pay(&order, app.card()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    (order, paid)
}

async fn refunds_part(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "r1", &json!({"amount": 1000})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    assert_eq!(app.refunded_at_provider(&paid).await, 1000);
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 1000);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
}

async fn refunds_all(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "r1", &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["amount"], paid["amount"]);
    assert_eq!(
        app.refunded_at_provider(&paid).await,
        paid["amount"].as_i64().expect("amount")
    );
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
}

async fn refunds_twice_at_once(app: TestApp) {
    let (_, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let part = json!({"amount": amount * 6 / 10});
    let (a, b) = tokio::join!(app.post(&path, "ra", &part), app.post(&path, "rb", &part));
    let mut statuses = [a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [201, 422],
        "one refund; the other exceeds the payment"
    );
    assert_eq!(app.refunded_at_provider(&paid).await, amount * 6 / 10);
    assert_eq!(
        app.count("SELECT count(*) FROM refund WHERE status = 'succeeded'")
            .await,
        1
    );
}

/// A refund the provider refuses (here: more than what a refund made at
/// the provider's dashboard left) fails at once with the provider's
/// reason, and its amount is free again: the rest can be refunded.
async fn refund_refused_by_the_provider(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let elsewhere = amount * 6 / 10;
    app.refund_at_provider(&paid, elsewhere).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app
        .post(
            &path,
            "too-much",
            &json!({"amount": amount - elsewhere + 1}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refused = json_of(r).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    let reason = match app.under() {
        Provider::Sandbox => "amount_exceeds_charge",
        Provider::Stripe => "amount_too_large",
    };
    assert_eq!(refused["failure_code"], reason, "{refused}");
    // The key replays the refusal; the provider is not asked again.
    let again = app
        .post(
            &path,
            "too-much",
            &json!({"amount": amount - elsewhere + 1}),
        )
        .await;
    assert_eq!(json_of(again).await["id"], refused["id"]);
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 0);
    // Nothing is held by the failed refund: what is left can be refunded.
    let rest = app
        .post(&path, "the-rest", &json!({"amount": amount - elsewhere}))
        .await;
    assert_eq!(rest.status(), StatusCode::CREATED);
    assert_eq!(json_of(rest).await["status"], "succeeded");
    assert_eq!(app.refunded_at_provider(&paid).await, amount);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    if let Some(stack) = &app.stripe {
        // Now nothing is left: Stripe's charge_already_refunded.
        let r = app.post(&path, "nothing-left", &json!({"amount": 1})).await;
        let refund = json_of(r).await;
        assert_eq!(refund["status"], "failed", "{refund}");
        assert_eq!(refund["failure_code"], "charge_already_refunded");
        assert_eq!(stack.layer.refused(Call::Refund), 2);
    }
}

/// A refund the provider paid that fails afterwards (the card was closed):
/// the refund becomes `failed` with the provider's reason, an incident is
/// recorded once, `refund.failed` is sent, the amount is refundable again
/// and the refunded order is `paid` again.
async fn refund_failing_after_success(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "all", &json!({})).await;
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");

    assert_eq!(app.refund_fails_later(&refund).await, "processed");
    let now = app
        .get(&format!("/refunds/{}", refund["id"].as_str().expect("id")))
        .await;
    let now = json_of(now).await;
    assert_eq!(now["status"], "failed", "{now}");
    assert_eq!(now["failure_code"], "expired_or_canceled_card");
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 0);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(
        app.count("SELECT count(*) FROM incident WHERE kind = 'refund_failed_after_success'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM event WHERE type = 'refund.failed'")
            .await,
        1
    );
    // The merchant refunds again: the whole amount is open.
    let again = app.post(&path, "again", &json!({})).await;
    let again = json_of(again).await;
    assert_eq!(again["status"], "succeeded", "{again}");
    assert_eq!(again["amount"], amount);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
}

/// A refund fails at the provider after it succeeded, and its event never
/// comes (no webhook: an endpoint down, no secret, the provider's retries
/// over). A books pass days later, whose window no longer holds the
/// refund, reads our succeeded refunds again and applies the failure as
/// the event would have (`refund_failing_after_success`): failed with the
/// provider's reason, the amount refundable again, the order paid again,
/// one `refund_failed_after_success` incident, one `refund.failed` (caused
/// by the reconciler). Passes after it change nothing.
async fn refund_failing_later_without_a_webhook(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let refund = json_of(app.post(&path, "all", &json!({})).await).await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
    app.refund_fails_unheard(&refund).await;
    let id = refund["id"].as_str().expect("id");
    assert_eq!(
        app.status_of(&format!("/refunds/{id}")).await,
        "succeeded",
        "no event came"
    );

    let runs = app.books_later().await;
    let report = report_of(&runs, app.provider_name());
    assert_eq!((report.reversed, report.mismatched), (1, 0), "{report:?}");
    let now = json_of(app.get(&format!("/refunds/{id}")).await).await;
    assert_eq!(now["status"], "failed", "{now}");
    assert_eq!(now["failure_code"], "expired_or_canceled_card");
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 0);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    let incidents = "SELECT count(*) FROM incident WHERE kind = 'refund_failed_after_success'";
    assert_eq!(app.count(incidents).await, 1);
    let failed = format!(
        "SELECT count(*) FROM event WHERE type = 'refund.failed' AND object_id = '{id}' AND cause = 'reconciler'"
    );
    assert_eq!(app.count(&failed).await, 1);

    // Again, now and later: nothing more.
    let runs = app.books_now().await;
    let report = report_of(&runs, app.provider_name());
    assert_eq!((report.reversed, report.mismatched), (0, 0), "{report:?}");
    app.books_later().await;
    assert_eq!(app.count(incidents).await, 1);
    assert_eq!(app.count(&failed).await, 1);
    // The merchant refunds again: the whole amount is open.
    let again = json_of(app.post(&path, "again", &json!({})).await).await;
    assert_eq!(again["status"], "succeeded", "{again}");
    assert_eq!(again["amount"], amount);
}

/// A customer who never authenticates: past `ONCEPAY_ACTION_TIMEOUT` the
/// provider's charge is cancelled first, then the payment fails
/// `authentication_expired`; an approval after that moves no money.
async fn abandoned_action_is_cancelled(app: TestApp) {
    let (order, waiting, bank) = app.pay_waiting().await;
    let failed = app.reconciled_to(&waiting["id"], "failed").await;
    assert_eq!(failed["failure_code"], "authentication_expired", "{failed}");
    assert_eq!(failed["next_action"], Value::Null);
    let cancelled = match app.under() {
        Provider::Sandbox => "failed",
        Provider::Stripe => "canceled",
    };
    assert_eq!(app.provider_status(&failed).await, cancelled);
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    // The customer comes back too late: nothing moves.
    let _ = app.at_bank(&bank, "approve").await;
    assert_eq!(app.charges_at_provider(&order).await.0, 0, "no money moved");
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
    // The order can be paid again.
    let (status, paid) = app.pay(&order, app.card()).await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
}

/// The customer approves while oncepay is giving up on the payment (the
/// cancel is in flight): the provider refuses to cancel a charge that
/// succeeded, and the payment succeeds, once.
async fn abandoned_action_approved_at_the_last_moment(app: TestApp) {
    let (order, waiting, bank) = app.pay_waiting().await;
    let id = waiting["id"].as_str().expect("id").to_string();
    // Past the deadline (a second after it first waited).
    let due = ready::until(Duration::from_secs(10), || async {
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE id = '{id}' AND action_required_at < now() - interval '1 second'"
        ))
        .await
            == 1
    })
    .await;
    assert!(due.is_ok(), "the action's deadline passed");
    app.hold_cancel();
    let ctx = app.ctx.clone();
    let pass = tokio::spawn(async move { oncepay::workers::reconciler::pass(&ctx).await });
    let held = ready::until(Duration::from_secs(10), || async {
        app.cancels_held() == 1
    })
    .await;
    assert!(held.is_ok(), "the cancel is in flight");
    let _ = app.at_bank(&bank, "approve").await;
    app.release_cancel();
    pass.await.expect("the pass ran").expect("the pass");
    let paid = app.reconciled_to(&waiting["id"], "succeeded").await;
    assert_eq!(paid["failure_code"], Value::Null);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.charges_at_provider(&order).await.0, 1);
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
}

/// The same race for a manual payment (issue 55, item 6; review N6): the
/// customer approves while the cancel is in flight. The payment never
/// reads `failed`, `authentication_expired` (it used to, with Stripe). The
/// sandbox cancels only a charge still waiting, so the approval stands:
/// `requires_capture`, its order `authorized`. Stripe cancels a hold as
/// readily as a waiting intent, so the cancel released the authorization:
/// `voided`, `void_reason: abandoned` (released by oncepay), the intent
/// `canceled`, the order payable again. No money moves either way.
async fn abandoned_hold_approved_at_the_last_moment(app: TestApp) {
    let (order, waiting, bank) = app.pay_waiting_held().await;
    let id = waiting["id"].as_str().expect("id").to_string();
    let due = ready::until(Duration::from_secs(10), || async {
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE id = '{id}' AND action_required_at < now() - interval '1 second'"
        ))
        .await
            == 1
    })
    .await;
    assert!(due.is_ok(), "the action's deadline passed");
    app.hold_cancel();
    let ctx = app.ctx.clone();
    let pass = tokio::spawn(async move { oncepay::workers::reconciler::pass(&ctx).await });
    let held = ready::until(Duration::from_secs(10), || async {
        app.cancels_held() == 1
    })
    .await;
    assert!(held.is_ok(), "the cancel is in flight");
    let _ = app.at_bank(&bank, "approve").await;
    app.release_cancel();
    pass.await.expect("the pass ran").expect("the pass");
    let p = payment(&app, &waiting["id"]).await;
    assert_ne!(p["failure_code"], "authentication_expired", "{p}");
    assert_ne!(p["status"], "failed", "{p}");
    match app.under() {
        Provider::Sandbox => {
            assert_eq!(p["status"], "requires_capture", "{p}");
            assert_eq!(
                app.status_of(&format!("/orders/{order}")).await,
                "authorized"
            );
        }
        Provider::Stripe => {
            assert_eq!(
                (
                    p["status"].as_str(),
                    p["void_reason"].as_str(),
                    p["failure_code"].as_str()
                ),
                (Some("voided"), Some("abandoned"), None),
                "{p}"
            );
            assert_eq!(app.provider_status(&p).await, "canceled");
            assert_eq!(
                app.status_of(&format!("/orders/{order}")).await,
                "awaiting_payment"
            );
            // Read again (a webhook, the reconciler): the same.
            app.reconcile().await;
            let again = payment(&app, &waiting["id"]).await;
            assert_eq!(again["void_reason"], "abandoned", "{again}");
            let (status, paid) = app.pay(&order, app.card()).await;
            assert_eq!(status, StatusCode::CREATED, "payable again: {paid}");
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM incident").await, 0);
}

/// A refund of `payment` answered `409 payment_disputed`, having called
/// no provider.
async fn refused_as_disputed(app: &TestApp, payment: &Value, key: &str, body: Value) {
    let before = app.refunds_at_provider(payment).await;
    let path = format!("/payments/{}/refunds", payment["id"].as_str().expect("id"));
    let r = app.post(&path, key, &body).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "payment_disputed", "{problem}");
    assert_eq!(
        app.refunds_at_provider(payment).await,
        before,
        "no provider call"
    );
}

/// How many events of `event_type` the order's trail holds.
async fn in_trail(app: &TestApp, order: &str, event_type: &str) -> usize {
    let trail = json_of(app.get(&format!("/orders/{order}/events")).await).await;
    let items = trail["data"]
        .as_array()
        .or_else(|| trail.as_array())
        .cloned()
        .unwrap_or_default();
    items.iter().filter(|e| e["type"] == event_type).count()
}

/// The customer's bank disputes the whole charge: the payment shows the
/// dispute (`needs_response`), `GET /disputes` and `GET /disputes/{id}`
/// show it, `dispute.created` is written once (a duplicate event changes
/// nothing) and is in the order's trail, and a refund is `409
/// payment_disputed` before any provider call.
async fn dispute_opened(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let (at_provider, outcome) = app.dispute_opens(&paid, None).await;
    assert_eq!(outcome, "processed");
    let payment = payment(&app, &paid["id"]).await;
    let dispute = payment["dispute"].clone();
    assert_eq!(dispute["status"], "needs_response", "{payment}");
    assert_eq!(dispute["amount"], amount);
    assert_eq!(dispute["currency"], paid["currency"]);
    assert_eq!(dispute["payment_id"], paid["id"]);
    assert_eq!(dispute["reason"], "fraudulent");
    assert_eq!(dispute["provider_status"], at_provider["status"]);
    assert!(dispute["evidence_due_by"].is_string(), "{dispute}");
    assert_eq!(payment["status"], "succeeded");
    let id = dispute["id"].as_str().expect("id");
    let one = json_of(app.get(&format!("/disputes/{id}")).await).await;
    assert_eq!(
        one, dispute,
        "GET /disputes/{{id}} shows the payment's dispute"
    );
    for query in [
        String::new(),
        "?status=needs_response".to_string(),
        format!("?payment_id={}", paid["id"].as_str().expect("id")),
    ] {
        let list = json_of(app.get(&format!("/disputes{query}")).await).await;
        assert_eq!(list["data"][0], dispute, "{query}: {list}");
        assert_eq!(list["has_more"], false);
    }
    let none = json_of(app.get("/disputes?status=won").await).await;
    assert_eq!(none["data"], json!([]));
    assert_eq!(
        app.count("SELECT count(*) FROM event WHERE type = 'dispute.created'")
            .await,
        1
    );
    assert_eq!(in_trail(&app, &order, "dispute.created").await, 1);

    refused_as_disputed(&app, &paid, "r-all", json!({})).await;
    refused_as_disputed(&app, &paid, "r-one", json!({"amount": 1})).await;
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");

    // The provider sends it again under another id: nothing more.
    assert_eq!(
        app.dispute_event(&at_provider, "created").await,
        "processed"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM event WHERE type LIKE 'dispute.%'")
            .await,
        1
    );
}

/// The merchant wins: `dispute.closed` carries `won`, the whole amount is
/// refundable again, and a late `created` event does not reopen it.
async fn dispute_won(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let (opened, _) = app.dispute_opens(&paid, None).await;
    refused_as_disputed(&app, &paid, "before", json!({})).await;
    assert_eq!(app.dispute_closes(&opened, "won").await, "processed");
    let dispute = payment(&app, &paid["id"]).await["dispute"].clone();
    assert_eq!(dispute["status"], "won", "{dispute}");
    let closed: Vec<(String,)> =
        sqlx::query_as("SELECT data->>'status' FROM event WHERE type = 'dispute.closed'")
            .fetch_all(&app.db)
            .await
            .expect("events");
    assert_eq!(closed, vec![("won".to_string(),)]);
    assert_eq!(in_trail(&app, &order, "dispute.closed").await, 1);
    // A stale event: the provider's dispute is won, and stays so here.
    app.dispute_event(&opened, "created").await;
    assert_eq!(payment(&app, &paid["id"]).await["dispute"]["status"], "won");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "after", &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["amount"], amount, "{refund}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
}

/// The merchant loses part of the charge: `dispute.closed` carries `lost`,
/// what the dispute took stays unrefundable, the rest can be refunded.
async fn dispute_lost(app: TestApp) {
    let (_, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let (opened, _) = app.dispute_opens(&paid, Some(1000)).await;
    assert_eq!(app.dispute_closes(&opened, "lost").await, "processed");
    let dispute = payment(&app, &paid["id"]).await["dispute"].clone();
    assert_eq!(dispute["status"], "lost", "{dispute}");
    assert_eq!(dispute["amount"], 1000);
    let closed: Vec<(String,)> =
        sqlx::query_as("SELECT data->>'status' FROM event WHERE type = 'dispute.closed'")
            .fetch_all(&app.db)
            .await
            .expect("events");
    assert_eq!(closed, vec![("lost".to_string(),)]);
    let list = json_of(app.get("/disputes?status=lost").await).await;
    assert_eq!(list["data"][0]["id"], dispute["id"]);
    refused_as_disputed(&app, &paid, "all", json!({})).await;
    refused_as_disputed(&app, &paid, "over", json!({"amount": amount - 999})).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app
        .post(&path, "rest", &json!({"amount": amount - 1000}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    refused_as_disputed(&app, &paid, "one-more", json!({"amount": 1})).await;
}

/// The bank took part of the money back and its event has not come yet:
/// oncepay lets a refund of it all through, and the provider refuses what
/// was charged back (Stripe's `charge_disputed`): the refund ends failed,
/// nothing refunded, nothing held; what the dispute left is refundable.
async fn refund_of_a_dispute_not_yet_heard_of_is_refused_by_the_provider(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    app.dispute_opens_unheard(&paid, Some(1000)).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "all", &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refused = json_of(r).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    assert_eq!(refused["failure_code"], "charge_disputed", "{refused}");
    assert_eq!(app.refunded_at_provider(&paid).await, 0);
    let rest = app
        .post(&path, "the-rest", &json!({"amount": amount - 1000}))
        .await;
    assert_eq!(rest.status(), StatusCode::CREATED);
    assert_eq!(json_of(rest).await["status"], "succeeded");
    assert_eq!(app.refunded_at_provider(&paid).await, amount - 1000);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
}

/// A dispute opens at the provider, then closes, and no event of either
/// ever comes. The books pass lists the provider's disputes of its window
/// and applies the new one as its event would have: the payment shows it,
/// `dispute.created` is written once (caused by the reconciler), it is
/// counted in `oncepay_disputes_total`, a refund is `409
/// payment_disputed`. A pass days later, whose window no longer lists it,
/// reads the open dispute again by id and applies its close
/// (`dispute.closed` once); passes after that change nothing.
async fn dispute_without_a_webhook(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let amount = paid["amount"].as_i64().expect("amount");
    let at_provider = app.dispute_opens_unheard(&paid, None).await;
    assert_eq!(
        payment(&app, &paid["id"]).await["dispute"],
        Value::Null,
        "no event came"
    );

    let runs = app.books_now().await;
    assert_eq!(report_of(&runs, app.provider_name()).disputes, 1);
    let dispute = payment(&app, &paid["id"]).await["dispute"].clone();
    assert_eq!(dispute["status"], "needs_response", "{dispute}");
    assert_eq!(dispute["provider_status"], at_provider["status"]);
    assert_eq!(dispute["amount"], amount);
    assert!(dispute["evidence_due_by"].is_string(), "{dispute}");
    let created =
        "SELECT count(*) FROM event WHERE type = 'dispute.created' AND cause = 'reconciler'";
    assert_eq!(app.count(created).await, 1);
    assert_eq!(in_trail(&app, &order, "dispute.created").await, 1);
    let counted = |status: &str| {
        app.metric_line(&format!(
            "oncepay_disputes_total{{provider=\"{}\",status=\"{status}\"}}",
            app.provider_name()
        ))
    };
    assert_eq!(
        counted("needs_response")
            .as_deref()
            .and_then(|l| l.rsplit(' ').next()),
        Some("1")
    );
    refused_as_disputed(&app, &paid, "r-all", json!({})).await;

    // The bank decides, and still no event: a later pass reads it by id.
    app.dispute_closes_unheard(&at_provider, "lost").await;
    let runs = app.books_later().await;
    assert_eq!(report_of(&runs, app.provider_name()).disputes, 1);
    let dispute = payment(&app, &paid["id"]).await["dispute"].clone();
    assert_eq!(dispute["status"], "lost", "{dispute}");
    let closed: Vec<(String, String)> =
        sqlx::query_as("SELECT data->>'status', cause FROM event WHERE type = 'dispute.closed'")
            .fetch_all(&app.db)
            .await
            .expect("events");
    assert_eq!(closed, vec![("lost".to_string(), "reconciler".to_string())]);
    assert_eq!(
        counted("lost")
            .as_deref()
            .and_then(|l| l.rsplit(' ').next()),
        Some("1")
    );

    // Again, now and later: nothing more.
    for runs in [app.books_now().await, app.books_later().await] {
        assert_eq!(report_of(&runs, app.provider_name()).disputes, 0);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM event WHERE type LIKE 'dispute.%'")
            .await,
        2
    );
    refused_as_disputed(&app, &paid, "r-after", json!({})).await;
}

async fn cancels_a_paid_order(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let r = app
        .post(&format!("/orders/{order}/cancel"), "c1", &json!({}))
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(json_of(r).await["status"], "cancelled");
    assert_eq!(
        app.refunded_at_provider(&paid).await,
        paid["amount"].as_i64().expect("amount")
    );
}

async fn takes_a_duplicate_event_once(app: TestApp) {
    let order = app.create_order().await;
    app.trouble(Trouble::AfterTheCharge);
    let (_, pending) = app.pay(&order, app.card()).await;
    assert_eq!(pending["status"], "pending");
    app.heal();
    let event = format!("evt_{}", Uuid::new_v4().simple());
    let first = app.provider_event(&pending, "succeeded", &event).await;
    assert_eq!(first, "processed");
    assert_eq!(payment(&app, &pending["id"]).await["status"], "succeeded");
    let second = app.provider_event(&pending, "succeeded", &event).await;
    assert_eq!(second, "duplicate");
    assert_eq!(
        app.count("SELECT count(*) FROM event WHERE type = 'payment.succeeded'")
            .await,
        1,
        "one payment.succeeded for the merchant"
    );
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

async fn ignores_an_event_out_of_order(app: TestApp) {
    let (order, paid) = paid(&app).await;
    let stale = format!("evt_{}", Uuid::new_v4().simple());
    let outcome = app.provider_event(&paid, "failed", &stale).await;
    assert_ne!(outcome, "duplicate");
    assert_eq!(payment(&app, &paid["id"]).await["status"], "succeeded");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

async fn refuses_an_event_the_provider_does_not_confirm(app: TestApp) {
    let order = app.create_order().await;
    app.trouble(Trouble::NotThrough);
    let (_, pending) = app.pay(&order, app.card()).await;
    assert_eq!(pending["status"], "pending");
    app.heal();
    let forged = format!("evt_{}", Uuid::new_v4().simple());
    let outcome = app.provider_event(&pending, "succeeded", &forged).await;
    assert_eq!(outcome, "unconfirmed");
    assert_eq!(payment(&app, &pending["id"]).await["status"], "pending");
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.charges_at_provider(&order).await.0, 0);
}

async fn waits_out_a_credential_outage(app: TestApp) {
    let order = app.create_order().await;
    app.trouble(Trouble::Unauthorized);
    let (status, pending) = app.pay(&order, app.card()).await;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a refused key is not a decline: {pending}"
    );
    assert_eq!(pending["status"], "pending");
    let (again, _) = app.pay(&order, app.card()).await;
    assert_eq!(
        again,
        StatusCode::CONFLICT,
        "the order is not payable again"
    );
    // Still refused: still pending, however often it is asked.
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "pending");
    app.heal();
    app.reconcile().await;
    assert_eq!(payment(&app, &pending["id"]).await["status"], "succeeded");
    assert_eq!(app.charges_at_provider(&order).await, (1, 1));
}

// ---- holds (authorize now, capture later) ----

impl TestApp {
    /// A manual payment of a new order: `(order, payment)`, held.
    async fn held(&self) -> (String, Value) {
        let order = self.create_order().await;
        let r = self
            .post(
                "/payments",
                &Uuid::new_v4().to_string(),
                &json!({"order_id": order, "payment_method": self.card(), "capture_method": "manual"}),
            )
            .await;
        let status = r.status();
        let held = json_of(r).await;
        assert_eq!(status, StatusCode::CREATED, "{held}");
        assert_eq!(held["status"], "requires_capture", "{held}");
        (order, held)
    }

    /// The hold at the provider: `authorized`, `captured` or `released`,
    /// and how many captures the provider made of it.
    async fn hold_at_provider(&self, payment: &Value) -> (String, usize) {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        match &self.stripe {
            None => {
                let ledger = self.ledger().await;
                let status = ledger["charges"]
                    .as_array()
                    .expect("charges")
                    .iter()
                    .find(|c| c["id"] == charge)
                    .map(|c| c["status"].as_str().unwrap_or_default().to_string())
                    .expect("the charge");
                let captures = ledger["captures"]
                    .as_array()
                    .expect("captures")
                    .iter()
                    .filter(|c| c["charge_id"] == charge)
                    .count();
                let state = match status.as_str() {
                    "voided" | "expired" => "released",
                    other => other,
                };
                (state.to_string(), captures)
            }
            Some(stack) => {
                let get = |path: String| async move {
                    reqwest::Client::new()
                        .get(format!("{}{path}", stack.localstripe.url()))
                        .bearer_auth(STRIPE_KEY)
                        .send()
                        .await
                        .expect("localstripe answers")
                        .json::<Value>()
                        .await
                        .expect("json")
                };
                let pi = get(format!("/v1/payment_intents/{charge}")).await;
                let latest = match &pi["latest_charge"] {
                    Value::String(id) => id.clone(),
                    charge => charge["id"]
                        .as_str()
                        .unwrap_or_else(|| panic!("no latest charge: {pi}"))
                        .to_string(),
                };
                let captured = get(format!("/v1/charges/{latest}")).await["captured"] == true;
                let state = match pi["status"].as_str() {
                    Some("requires_capture") => "authorized",
                    Some("succeeded") => "captured",
                    Some("canceled") => "released",
                    other => panic!("a hold in {other:?}"),
                };
                (state.to_string(), usize::from(captured))
            }
        }
    }

    /// The provider lets the hold expire now (its window ran out).
    async fn provider_expires(&self, payment: &Value) {
        let charge = payment["provider_charge_id"].as_str().expect("charge id");
        match &self.stripe {
            None => {
                let r = self
                    .http
                    .post(format!("{}/v1/charges/{charge}/expire", self.sandbox))
                    .send()
                    .await
                    .expect("sandbox answers");
                assert!(r.status().is_success());
            }
            Some(stack) => stack.layer.expire_hold(charge),
        }
    }

    /// The capture's answer is lost after the provider captured (the
    /// sandbox's replaced by a `503`; Stripe's saved `500`).
    fn capture_answer_lost(&self) {
        match &self.stripe {
            None => self.proxy().set(
                Route::Charge,
                Fault::ForwardThenAnswer {
                    status: 503,
                    body: r#"{"code":"unavailable"}"#.into(),
                },
            ),
            Some(stack) => stack
                .layer
                .set(Call::Capture, StripeFault::ErrorAfterEffect),
        }
    }

    /// The provider declines the next capture of `payment`'s hold, as a
    /// card's issuer may: the sandbox's lever (`refuse_capture`, `402
    /// card_declined`), Stripe's `402 card_error` `card_declined`, saved
    /// under the capture's key as Stripe saves an answer.
    async fn provider_declines_next_capture(&self, payment: &Value) {
        match &self.stripe {
            None => {
                let charge = payment["provider_charge_id"].as_str().expect("charge id");
                let r = self
                    .http
                    .post(format!(
                        "{}/v1/charges/{charge}/refuse_capture",
                        self.sandbox
                    ))
                    .json(&json!({"code": "card_declined"}))
                    .send()
                    .await
                    .expect("the sandbox answers");
                assert_eq!(r.status(), StatusCode::OK);
            }
            Some(stack) => stack.layer.set_times(
                Call::Capture,
                StripeFault::Refuse {
                    status: 402,
                    kind: "card_error",
                    code: "card_declined",
                },
                1,
            ),
        }
    }

    async fn capture(&self, payment: &Value, key: &str, body: Value) -> (StatusCode, Value) {
        let path = format!("/payments/{}/capture", payment["id"].as_str().expect("id"));
        let r = self.post(&path, key, &body).await;
        let status = r.status();
        (status, json_of(r).await)
    }

    async fn void(&self, payment: &Value, key: &str) -> (StatusCode, Value) {
        let path = format!("/payments/{}/void", payment["id"].as_str().expect("id"));
        let r = self.post(&path, key, &json!({})).await;
        let status = r.status();
        (status, json_of(r).await)
    }
}

async fn authorizes(app: TestApp) {
    let (order, held) = app.held().await;
    assert_eq!(held["amount_capturable"], held["amount"]);
    assert_eq!(held["amount_captured"], 0);
    let deadline = chrono::DateTime::parse_from_rfc3339(
        held["capture_before"].as_str().expect("capture_before"),
    )
    .expect("RFC 3339");
    assert!(
        deadline > chrono::Utc::now() + chrono::Duration::days(6),
        "{deadline}"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "authorized"
    );
    assert_eq!(app.hold_at_provider(&held).await, ("authorized".into(), 0));
}

async fn captures_in_full(app: TestApp) {
    let (order, held) = app.held().await;
    let (status, paid) = app.capture(&held, "cap", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(paid["amount_captured"], held["amount"]);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.hold_at_provider(&held).await, ("captured".into(), 1));
}

async fn captures_in_part(app: TestApp) {
    let (_, held) = app.held().await;
    let (status, paid) = app.capture(&held, "cap", json!({"amount": 1000})).await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(paid["amount_captured"], 1000);
    assert_eq!(app.hold_at_provider(&held).await, ("captured".into(), 1));
    let refunds = format!("/payments/{}/refunds", held["id"].as_str().expect("id"));
    let r = app.post(&refunds, "over", &json!({"amount": 1001})).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

async fn voids_a_hold(app: TestApp) {
    let (order, held) = app.held().await;
    let (status, voided) = app.void(&held, "void").await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    assert_eq!(
        (voided["status"].as_str(), voided["void_reason"].as_str()),
        (Some("voided"), Some("requested"))
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

async fn expires_a_hold(app: TestApp) {
    let (order, held) = app.held().await;
    app.provider_expires(&held).await;
    // Our clock reaches the deadline too: the sweeper ends the hold.
    sqlx::query(
        "UPDATE payment_attempt SET capture_before = now() - interval '1 second' WHERE id = $1",
    )
    .bind(Uuid::parse_str(held["id"].as_str().expect("id")).expect("uuid"))
    .execute(&app.db)
    .await
    .expect("deadline");
    let holds = oncepay::workers::sweeper::authorizations(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(holds.voided, 1, "{holds:?}");
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired"))
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

async fn refuses_a_capture_after_a_void(app: TestApp) {
    let (_, held) = app.held().await;
    assert_eq!(app.void(&held, "void").await.0, StatusCode::OK);
    let (status, problem) = app.capture(&held, "cap", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "payment_not_capturable");
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

async fn refuses_a_capture_after_expiry(app: TestApp) {
    let (_, held) = app.held().await;
    app.provider_expires(&held).await;
    // Our deadline has not passed: the provider's refusal decides.
    let (status, problem) = app.capture(&held, "cap", json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["code"], "authorization_expired");
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired"))
    );
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

async fn captures_once_with_two_keys(app: TestApp) {
    let (_, held) = app.held().await;
    let (a, b) = tokio::join!(
        app.capture(&held, "first", json!({"amount": 500})),
        app.capture(&held, "second", json!({"amount": 700})),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CONFLICT],
        "{a:?} {b:?}"
    );
    let refused = if a.0 == StatusCode::CONFLICT {
        &a.1
    } else {
        &b.1
    };
    assert_eq!(refused["code"], "payment_not_capturable");
    assert_eq!(app.hold_at_provider(&held).await, ("captured".into(), 1));
    assert_eq!(app.count("SELECT count(*) FROM payment_capture").await, 1);
}

async fn settles_a_lost_capture_answer(app: TestApp) {
    let (order, held) = app.held().await;
    app.capture_answer_lost();
    let (status, pending) = app.capture(&held, "cap", json!({"amount": 900})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "requires_capture");
    assert_eq!(
        app.hold_at_provider(&held).await,
        ("captured".into(), 1),
        "the money moved"
    );
    app.heal();
    app.reconcile().await;
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (p["status"].as_str(), p["amount_captured"].as_i64()),
        (Some("succeeded"), Some(900))
    );
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.hold_at_provider(&held).await, ("captured".into(), 1));
}

/// A capture the provider declines (a card's issuer may decline one) ends
/// `failed` with the provider's code and moves nothing: `402
/// capture_refused`, kept for its key; the payment stays
/// `requires_capture`, its order `authorized`, the hold stands at the
/// provider and the reconciler sends nothing again; then a new capture
/// (another key, another amount) is made, once.
async fn a_declined_capture_leaves_the_hold_to_capture_again(app: TestApp) {
    let (order, held) = app.held().await;
    let id = held["id"].as_str().expect("id").to_string();
    app.provider_declines_next_capture(&held).await;
    let (status, problem) = app
        .capture(&held, "declined", json!({"amount": 1000}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{problem}");
    assert_eq!(problem["code"], "capture_refused");
    assert_eq!(problem["failure_code"], "card_declined");
    assert_eq!(problem["payment_status"], "requires_capture");
    assert_eq!(
        app.capture(&held, "declined", json!({"amount": 1000}))
            .await,
        (status, problem.clone()),
        "kept for its key"
    );
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (
            p["status"].as_str(),
            p["void_reason"].as_str(),
            p["amount_captured"].as_i64()
        ),
        (Some("requires_capture"), None, Some(0)),
        "{p}"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "authorized"
    );
    app.reconcile().await;
    assert_eq!(app.hold_at_provider(&held).await, ("authorized".into(), 0));
    let (status, paid) = app.capture(&held, "again", json!({"amount": 900})).await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(
        (paid["status"].as_str(), paid["amount_captured"].as_i64()),
        (Some("succeeded"), Some(900))
    );
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.hold_at_provider(&held).await, ("captured".into(), 1));
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT status, failure_code FROM payment_capture WHERE payment_id = $1::uuid ORDER BY created_at, id",
    )
    .bind(&id)
    .fetch_all(&app.db)
    .await
    .expect("capture rows");
    assert_eq!(
        rows,
        vec![
            ("failed".to_string(), Some("card_declined".to_string())),
            ("succeeded".to_string(), None),
        ],
        "two captures, two keys: the declined one and the one made"
    );
}

/// Right after a declined capture the hold can be voided (no capture is
/// under way): `voided`, `requested`, released at the provider.
async fn a_declined_capture_leaves_the_hold_to_void(app: TestApp) {
    let (order, held) = app.held().await;
    app.provider_declines_next_capture(&held).await;
    let (status, problem) = app.capture(&held, "declined", json!({})).await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{problem}");
    assert_eq!(problem["code"], "capture_refused");
    let (status, voided) = app.void(&held, "void").await;
    assert_eq!(status, StatusCode::OK, "{voided}");
    assert_eq!(
        (voided["status"].as_str(), voided["void_reason"].as_str()),
        (Some("voided"), Some("requested"))
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

impl TestApp {
    /// Posts the provider's event saying `payment`'s hold is `state`
    /// (`authorized`, or `expired`): the sandbox's `charge.authorized` /
    /// `charge.expired`, Stripe's `payment_intent.amount_capturable_updated`
    /// / `payment_intent.canceled` (`automatic`); returns the outcome.
    async fn hold_event(&self, payment: &Value, state: &str) -> String {
        let charge = payment["provider_charge_id"].as_str().unwrap_or_default();
        let event_id = format!("evt_{}", Uuid::new_v4().simple());
        let r = match &self.stripe {
            None => {
                let event = json!({
                    "id": event_id,
                    "type": format!("charge.{state}"),
                    "data": {"object": {
                        "id": charge, "status": state, "amount": payment["amount"],
                        "currency": payment["currency"], "idempotency_key": payment["id"],
                    }},
                });
                post_signed_webhook(self, &event).await
            }
            Some(_) => {
                let (kind, status, reason) = match state {
                    "authorized" => (
                        "payment_intent.amount_capturable_updated",
                        "requires_capture",
                        Value::Null,
                    ),
                    _ => ("payment_intent.canceled", "canceled", json!("automatic")),
                };
                let event = json!({
                    "id": event_id, "object": "event", "type": kind,
                    "created": chrono::Utc::now().timestamp(),
                    "data": {"object": {
                        "id": charge, "object": "payment_intent", "status": status,
                        "capture_method": "manual", "cancellation_reason": reason,
                        "amount": payment["amount"],
                        "currency": payment["currency"].as_str().map(str::to_ascii_lowercase),
                        "metadata": {"oncepay_attempt_id": payment["id"]},
                    }},
                });
                post_stripe_event(self, &event).await
            }
        };
        assert_eq!(r.status(), StatusCode::OK, "the event is accepted");
        json_of(r).await["outcome"]
            .as_str()
            .expect("outcome")
            .to_string()
    }
}

async fn an_expiry_event_voids_the_hold(app: TestApp) {
    let (order, held) = app.held().await;
    app.provider_expires(&held).await;
    assert_eq!(app.hold_event(&held, "expired").await, "processed");
    let p = payment(&app, &held["id"]).await;
    assert_eq!(
        (p["status"].as_str(), p["void_reason"].as_str()),
        (Some("voided"), Some("expired"))
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    let events = app
        .count(&format!(
            "SELECT count(*) FROM event WHERE object_id = '{}' AND type = 'payment.voided'",
            held["id"].as_str().expect("id")
        ))
        .await;
    assert_eq!(events, 1);
    assert_eq!(
        app.hold_event(&held, "expired").await,
        "processed",
        "a repeat moves nothing"
    );
    assert_eq!(app.hold_at_provider(&held).await, ("released".into(), 0));
}

async fn an_authorization_event_is_read_back(app: TestApp) {
    let order = app.create_order().await;
    app.trouble(Trouble::AfterTheCharge);
    let r = app
        .post(
            "/payments",
            "held-late",
            &json!({"order_id": order, "payment_method": app.card(), "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let pending = json_of(r).await;
    app.heal();
    let pending = payment(&app, &pending["id"]).await;
    assert_eq!(app.hold_event(&pending, "authorized").await, "processed");
    let p = payment(&app, &pending["id"]).await;
    assert_eq!(p["status"], "requires_capture", "{p}");
    assert!(p["capture_before"].is_string());
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "authorized"
    );
}

/// Declares each scenario once per card provider, and lists them (what
/// the balance adapter's declaration is checked against).
macro_rules! contract {
    ($($scenario:ident),+ $(,)?) => {
        /// Every scenario of the card providers' contract.
        const SCENARIOS: &[&str] = &[$(stringify!($scenario)),+];

        mod sandbox {
            $(
                #[tokio::test]
                async fn $scenario() {
                    if let Some(app) = super::app_with(super::Provider::Sandbox).await {
                        super::$scenario(app).await;
                    }
                }
            )+
        }

        mod stripe {
            $(
                #[tokio::test]
                async fn $scenario() {
                    if let Some(app) = super::app_with(super::Provider::Stripe).await {
                        super::$scenario(app).await;
                    }
                }
            )+
        }
    };
}

contract!(
    pays,
    declines,
    pays_again_after_a_decline,
    replays,
    resumes_after_a_crash_between_opening_and_charging,
    settles_an_answer_lost_after_the_charge,
    refunds_part,
    refunds_all,
    refunds_twice_at_once,
    refund_refused_by_the_provider,
    refund_failing_after_success,
    refund_failing_later_without_a_webhook,
    abandoned_action_is_cancelled,
    abandoned_action_approved_at_the_last_moment,
    abandoned_hold_approved_at_the_last_moment,
    dispute_opened,
    dispute_won,
    dispute_lost,
    refund_of_a_dispute_not_yet_heard_of_is_refused_by_the_provider,
    dispute_without_a_webhook,
    cancels_a_paid_order,
    takes_a_duplicate_event_once,
    ignores_an_event_out_of_order,
    refuses_an_event_the_provider_does_not_confirm,
    waits_out_a_credential_outage,
    authorizes,
    captures_in_full,
    captures_in_part,
    voids_a_hold,
    expires_a_hold,
    refuses_a_capture_after_a_void,
    refuses_a_capture_after_expiry,
    captures_once_with_two_keys,
    settles_a_lost_capture_answer,
    a_declined_capture_leaves_the_hold_to_capture_again,
    a_declined_capture_leaves_the_hold_to_void,
    an_expiry_event_voids_the_hold,
    an_authorization_event_is_read_back,
);

// ---- the balance adapter ----
//
// `payment_method: "balance"` goes to the `balance` adapter beside the
// current card provider (here the sandbox). Its books are oncepay's own
// ledger: what "the provider holds" is read from `ledger_transfer` (the
// payment's transfer keyed by the attempt, a refund's by the refund) and
// from the customer's balance over the API.

/// The customer of `order_body()`'s orders, and its order's amount.
const BALANCE_CUSTOMER: &str = "cus_42";
const ORDER_AMOUNT: i64 = 2800;

async fn balance_app() -> TestApp {
    app_with(Provider::Sandbox)
        .await
        .expect("the sandbox needs nothing installed")
}

impl TestApp {
    /// Credits the orders' customer `amount` (a new key).
    async fn credit_balance(&self, amount: i64) {
        let r = self
            .post(
                &format!("/customers/{BALANCE_CUSTOMER}/balance/credits"),
                &Uuid::new_v4().to_string(),
                &json!({"amount": amount, "currency": "EUR"}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }

    /// The orders' customer's `available`, read over the API.
    async fn available(&self) -> i64 {
        let r = self
            .get(&format!(
                "/customers/{BALANCE_CUSTOMER}/balance?currency=EUR"
            ))
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        json_of(r).await["available"].as_i64().expect("available")
    }

    /// The balance's books for `order`: the payment transfers of its
    /// payments, and what they took.
    async fn balance_payments_of(&self, order: &str) -> (i64, i64) {
        sqlx::query_as(
            "SELECT count(*), COALESCE(sum(t.amount), 0)::bigint
               FROM ledger_transfer t JOIN payment_attempt p ON p.id = t.payment_id
              WHERE t.code = 'payment' AND p.order_id = $1::uuid",
        )
        .bind(order)
        .fetch_one(&self.db)
        .await
        .expect("the ledger's payments")
    }

    /// What the balance took back for `payment` in refunds: (transfers,
    /// amount).
    async fn balance_refunds_of(&self, payment: &Value) -> (i64, i64) {
        sqlx::query_as(
            "SELECT count(*), COALESCE(sum(amount), 0)::bigint FROM ledger_transfer
              WHERE code = 'refund' AND payment_id = $1::uuid",
        )
        .bind(payment["id"].as_str().expect("id"))
        .fetch_one(&self.db)
        .await
        .expect("the ledger's refunds")
    }

    /// `ledger check` of every merchant: every rule holds.
    async fn ledger_holds(&self) {
        let lines = oncepay::store::ledger::check(&self.db, None)
            .await
            .expect("check");
        assert!(lines.iter().all(|l| l.holds()), "{lines:?}");
    }
}

/// A balance payment of a new order, the customer credited the order's
/// amount first.
async fn paid_from_balance(app: &TestApp) -> (String, Value) {
    app.credit_balance(ORDER_AMOUNT).await;
    let order = app.create_order().await;
    let (status, paid) = app.pay(&order, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded", "{paid}");
    (order, paid)
}

async fn balance_pays(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT + 500).await;
    let order = app.create_order().await;
    let (status, paid) = app.pay(&order, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(paid["provider"], "balance");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(app.balance_payments_of(&order).await, (1, ORDER_AMOUNT));
    assert_eq!(app.available().await, 500);
    app.ledger_holds().await;
}

async fn balance_declines(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT - 1).await;
    let order = app.create_order().await;
    let (status, failed) = app.pay(&order, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["failure_code"], "insufficient_funds", "{failed}");
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "awaiting_payment"
    );
    // A decline in a command's own answer is confirmed by one status read
    // (the reconciler's): the balance's books say nothing was taken.
    app.reconcile().await;
    assert_eq!(payment(&app, &failed["id"]).await["status"], "failed");
    assert_eq!(app.balance_payments_of(&order).await, (0, 0));
    assert_eq!(app.available().await, ORDER_AMOUNT - 1, "nothing moved");
}

async fn balance_pays_again_after_a_decline(app: TestApp) {
    let order = app.create_order().await;
    let (_, failed) = app.pay(&order, "balance").await;
    assert_eq!(failed["failure_code"], "insufficient_funds", "{failed}");
    app.credit_balance(ORDER_AMOUNT).await;
    let (status, paid) = app.pay(&order, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_ne!(paid["id"], failed["id"], "a new attempt");
    assert_eq!(
        app.balance_payments_of(&order).await,
        (1, ORDER_AMOUNT),
        "one payment; the declined one took nothing"
    );
    assert_eq!(app.available().await, 0);
}

async fn balance_replays(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT * 3).await;
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let (first_status, first) = app.pay_with(&key, &order, "balance").await;
    assert_eq!(first_status, StatusCode::CREATED, "{first}");
    let again = app
        .post(
            "/payments",
            &key,
            &json!({"order_id": order, "payment_method": "balance"}),
        )
        .await;
    assert_eq!(again.status(), first_status);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(json_of(again).await, first);
    assert_eq!(app.balance_payments_of(&order).await, (1, ORDER_AMOUNT));
    assert_eq!(app.available().await, ORDER_AMOUNT * 2);
}

/// One key sent eight times at once: one execution, one transfer, the
/// balance debited once; every answer the first one.
async fn pays_once_under_concurrent_replays(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT * 8).await;
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let body = json!({"order_id": order, "payment_method": "balance"});
    let pay = || app.post("/payments", &key, &body);
    let (a, b, c, d, e, f, g, h) =
        tokio::join!(pay(), pay(), pay(), pay(), pay(), pay(), pay(), pay());
    let mut bodies = Vec::new();
    let answers = [a, b, c, d, e, f, g, h];
    for answer in answers {
        let status = answer.status();
        // A repeat that finds the first still executing is told to retry.
        if status == StatusCode::CONFLICT {
            continue;
        }
        assert_eq!(status, StatusCode::CREATED);
        bodies.push(json_of(answer).await);
    }
    assert!(!bodies.is_empty());
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    assert_eq!(bodies[0]["status"], "succeeded");
    assert_eq!(app.balance_payments_of(&order).await, (1, ORDER_AMOUNT));
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM payment_attempt WHERE order_id = '{order}'"
        ))
        .await,
        1
    );
    assert_eq!(app.available().await, ORDER_AMOUNT * 7);
    app.ledger_holds().await;
}

/// The balance form of a lost answer: the process dies after the balance's
/// transfer committed and before the payment was settled (what that
/// leaves is made here: the attempt pending again, its order awaiting
/// payment, the record executing from the attempt with a dead lease). The
/// reconciler resumes it, the balance's books (the transfer under the
/// attempt's key) answer, and nothing is taken twice.
async fn resumes_after_a_crash_after_the_transfer(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT * 2).await;
    let order = app.create_order().await;
    let key = Uuid::new_v4().to_string();
    let (status, paid) = app.pay_with(&key, &order, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    sqlx::raw_sql(&format!(
        "UPDATE payment_attempt SET status = 'pending', provider_charge_id = NULL,
                amount_captured = 0, next_check_at = now()
          WHERE id = '{}';
         UPDATE orders SET status = 'awaiting_payment' WHERE id = '{order}';",
        paid["id"].as_str().expect("id")
    ))
    .execute(&app.db)
    .await
    .expect("the state a crash leaves");
    app.crash_at(&key, "attempt_created").await;
    let pass = app.reconcile().await;
    assert_eq!(pass.resumed, 1, "{pass:?}");
    let p = payment(&app, &paid["id"]).await;
    assert_eq!(p["status"], "succeeded", "{p}");
    assert_eq!(p["provider_charge_id"], paid["provider_charge_id"], "{p}");
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    let stored: i16 = sqlx::query_scalar(
        "SELECT response_status FROM idempotency_record WHERE idempotency_key = $1",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .expect("record");
    assert_eq!(stored, 201);
    assert_eq!(
        app.balance_payments_of(&order).await,
        (1, ORDER_AMOUNT),
        "taken once"
    );
    assert_eq!(app.available().await, ORDER_AMOUNT);
    app.ledger_holds().await;
}

async fn balance_refunds_part(app: TestApp) {
    let (order, paid) = paid_from_balance(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "r1", &json!({"amount": 1000})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "succeeded", "{refund}");
    assert_eq!(app.balance_refunds_of(&paid).await, (1, 1000));
    assert_eq!(app.available().await, 1000, "credited back to the balance");
    assert_eq!(payment(&app, &paid["id"]).await["refunded_amount"], 1000);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    // The key replays the refund; the balance is credited once.
    let again = app.post(&path, "r1", &json!({"amount": 1000})).await;
    assert_eq!(json_of(again).await, refund);
    assert_eq!(app.balance_refunds_of(&paid).await, (1, 1000));
}

async fn balance_refunds_all(app: TestApp) {
    let (order, paid) = paid_from_balance(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "r1", &json!({})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["amount"], ORDER_AMOUNT);
    assert_eq!(app.balance_refunds_of(&paid).await, (1, ORDER_AMOUNT));
    assert_eq!(app.available().await, ORDER_AMOUNT);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "refunded");
    app.ledger_holds().await;
}

async fn balance_refunds_twice_at_once(app: TestApp) {
    let (_, paid) = paid_from_balance(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let part = json!({"amount": ORDER_AMOUNT * 6 / 10});
    let (a, b) = tokio::join!(app.post(&path, "ra", &part), app.post(&path, "rb", &part));
    let mut statuses = [a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [201, 422],
        "one refund; the other exceeds the payment"
    );
    assert_eq!(
        app.balance_refunds_of(&paid).await,
        (1, ORDER_AMOUNT * 6 / 10)
    );
    assert_eq!(app.available().await, ORDER_AMOUNT * 6 / 10);
}

/// A refund over what the payment took is refused before the balance is
/// touched, and the whole amount can still be refunded.
async fn refuses_a_refund_over_the_payment(app: TestApp) {
    let (_, paid) = paid_from_balance(&app).await;
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app
        .post(&path, "over", &json!({"amount": ORDER_AMOUNT + 1}))
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["code"], "refund_exceeds_payment");
    assert_eq!(app.balance_refunds_of(&paid).await, (0, 0));
    assert_eq!(app.available().await, 0);
    let r = app
        .post(&path, "all", &json!({"amount": ORDER_AMOUNT}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(app.balance_refunds_of(&paid).await, (1, ORDER_AMOUNT));
}

async fn balance_cancels_a_paid_order(app: TestApp) {
    let (order, paid) = paid_from_balance(&app).await;
    let r = app
        .post(&format!("/orders/{order}/cancel"), "c1", &json!({}))
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(json_of(r).await["status"], "cancelled");
    assert_eq!(app.balance_refunds_of(&paid).await, (1, ORDER_AMOUNT));
    assert_eq!(app.available().await, ORDER_AMOUNT);
    app.ledger_holds().await;
}

/// A balance authorizes nothing to capture later: a manual payment with it
/// is refused before anything is called or taken.
async fn refuses_to_hold(app: TestApp) {
    app.credit_balance(ORDER_AMOUNT).await;
    let order = app.create_order().await;
    let r = app
        .post(
            "/payments",
            &Uuid::new_v4().to_string(),
            &json!({"order_id": order, "payment_method": "balance", "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem = json_of(r).await;
    assert_eq!(problem["field"], "capture_method", "{problem}");
    assert_eq!(app.balance_payments_of(&order).await, (0, 0));
    assert_eq!(app.available().await, ORDER_AMOUNT);
}

/// Declares the balance adapter's side of the contract: each scenario it
/// runs (under the contract's name where it is the balance's form of one,
/// `name => function`), and each contract scenario it skips, with the
/// reason (an ignored test of that name, the reason its message). A check
/// holds the two lists to [`SCENARIOS`]: a scenario added to the contract
/// must be given a balance form or a reason, never passed over.
macro_rules! balance_contract {
    (
        runs: { $($name:ident => $scenario:ident),+ $(,)? }
        skips: { $($skipped:ident => $reason:literal),+ $(,)? }
    ) => {
        mod balance {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$scenario(super::balance_app().await).await;
                }
            )+
        }

        /// Each contract scenario that cannot apply to a balance, by name,
        /// ignored with its reason (`cargo test` prints it).
        mod balance_skipped {
            $(
                #[test]
                #[ignore = $reason]
                fn $skipped() {
                    println!("{}: skipped against balance: {}", stringify!($skipped), $reason);
                }
            )+
        }

        mod balance_skips {
            /// Every contract scenario runs against the balance or is
            /// skipped with a reason, none both; prints the skips (`make
            /// test` shows them under the balance's count).
            #[test]
            fn every_scenario_runs_against_balance_or_is_skipped_with_its_reason() {
                let runs = [$(stringify!($name)),+];
                let skips = [$((stringify!($skipped), $reason)),+];
                for scenario in super::SCENARIOS {
                    let skipped = skips.iter().any(|(name, _)| name == scenario);
                    assert!(
                        runs.contains(scenario) != skipped,
                        "{scenario}: must either run against balance or be skipped with a reason, not {}",
                        if skipped { "both" } else { "neither" }
                    );
                }
                for (name, reason) in skips {
                    assert!(super::SCENARIOS.contains(&name), "{name} is no contract scenario");
                    assert!(!reason.is_empty());
                    println!("skipped against balance: {name}: {reason}");
                }
            }
        }
    };
}

balance_contract!(
    runs: {
        pays => balance_pays,
        declines => balance_declines,
        pays_again_after_a_decline => balance_pays_again_after_a_decline,
        replays => balance_replays,
        pays_once_under_concurrent_replays => pays_once_under_concurrent_replays,
        settles_an_answer_lost_after_the_charge => resumes_after_a_crash_after_the_transfer,
        refunds_part => balance_refunds_part,
        refunds_all => balance_refunds_all,
        refunds_twice_at_once => balance_refunds_twice_at_once,
        refuses_a_refund_over_the_payment => refuses_a_refund_over_the_payment,
        cancels_a_paid_order => balance_cancels_a_paid_order,
        refuses_to_hold => refuses_to_hold,
    }
    skips: {
        resumes_after_a_crash_between_opening_and_charging => "needs the charge call not to get through; the balance's charge is a transaction in oncepay's own database, nothing between to fail (its crash after the transfer runs as settles_an_answer_lost_after_the_charge)",
        refund_refused_by_the_provider => "needs a refund made at the provider past oncepay (a dashboard); the balance's books are oncepay's ledger, so its only refusal is oncepay's cap (refuses_a_refund_over_the_payment)",
        refund_failing_after_success => "a credit posted to a balance cannot fail later: ledger entries are append-only, and no card or bank stands behind it",
        refund_failing_later_without_a_webhook => "a credit posted to a balance cannot fail later, and the balance sends no webhooks to miss: its books are oncepay's own ledger",
        abandoned_action_is_cancelled => "3-D Secure: a balance payment asks the customer for nothing",
        abandoned_action_approved_at_the_last_moment => "3-D Secure: a balance payment asks the customer for nothing",
        abandoned_hold_approved_at_the_last_moment => "3-D Secure and manual capture: a balance payment asks the customer for nothing and authorizes nothing (refuses_to_hold)",
        dispute_opened => "disputes: no card network or bank stands behind a balance payment to dispute it",
        dispute_won => "disputes: no card network or bank stands behind a balance payment to dispute it",
        dispute_lost => "disputes: no card network or bank stands behind a balance payment to dispute it",
        refund_of_a_dispute_not_yet_heard_of_is_refused_by_the_provider => "disputes: no card network or bank stands behind a balance payment to dispute it",
        dispute_without_a_webhook => "disputes: no card network or bank stands behind a balance payment to dispute it",
        takes_a_duplicate_event_once => "provider events: the balance sends no webhooks (its transfer and the answer commit in oncepay's database)",
        ignores_an_event_out_of_order => "provider events: the balance sends no webhooks (its transfer and the answer commit in oncepay's database)",
        refuses_an_event_the_provider_does_not_confirm => "provider events: the balance sends no webhooks (its transfer and the answer commit in oncepay's database)",
        waits_out_a_credential_outage => "credentials: the balance's books are oncepay's own database, reached with no provider key",
        authorizes => "manual capture: a balance pays at once and authorizes nothing (a manual payment with it is refused: refuses_to_hold); holds on a balance are the ledger's own, tests/api/balances.rs",
        captures_in_full => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        captures_in_part => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        voids_a_hold => "manual capture: a balance authorizes nothing to void (refuses_to_hold)",
        expires_a_hold => "manual capture: a balance authorizes nothing to expire (refuses_to_hold)",
        refuses_a_capture_after_a_void => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        refuses_a_capture_after_expiry => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        captures_once_with_two_keys => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        settles_a_lost_capture_answer => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        a_declined_capture_leaves_the_hold_to_capture_again => "manual capture: a balance authorizes nothing to capture (refuses_to_hold)",
        a_declined_capture_leaves_the_hold_to_void => "manual capture: a balance authorizes nothing to capture or void (refuses_to_hold)",
        an_expiry_event_voids_the_hold => "manual capture and provider events: the balance holds nothing and sends no webhooks",
        an_authorization_event_is_read_back => "manual capture and provider events: the balance holds nothing and sends no webhooks",
    }
);
