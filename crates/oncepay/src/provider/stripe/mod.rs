//! Stripe, through its PaymentIntents API: the adapter ([`Stripe`]), what
//! its answers prove ([`classify`]) and how its webhooks are verified
//! ([`signature`]).
//!
//! The protocol this adapter is built for (a careful payments engineer's):
//! the PaymentIntent is created **unconfirmed**, with an `Idempotency-Key`
//! derived from our attempt id and `metadata[oncepay_attempt_id]`; its id is
//! recorded as a recovery point; then it is confirmed by id with a key of
//! its own. Only the confirm moves money, and an intent succeeds at most
//! once, so once its id is recorded no retry, crash or expired Stripe key
//! can charge twice. Resuming and reconciling read the intent by id.
//!
//! Tested against localstripe through `oncepay_testkit::stripe_layer`,
//! which adds the Stripe semantics localstripe lacks
//! (`docs/providers/localstripe.md`).

//!
//! Past Stripe's key lifetime (24 hours) a create re-sent for an attempt
//! whose PaymentIntent id was never recorded (a crash between the create
//! and its record, then a day of outage) makes a second, unconfirmed
//! PaymentIntent: it moves no money, and the first one, also never
//! confirmed, is left in `requires_confirmation` (Stripe's dashboard can
//! cancel it; it costs nothing). Refunds carry `metadata[oncepay_refund_id]`
//! and are looked up in the PaymentIntent's list of refunds, so a refund
//! whose key expired is found before it could be sent twice.

mod card;
pub mod classify;
pub mod signature;
pub mod units;

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;
use uuid::Uuid;

use self::card::Elements;
use self::classify::{CallKind, ListPage, Verdict};
use super::call::{BuildError, Caller};
use super::card_form::CardForm;
use super::trace::Trace;
use super::{
    BooksPage, BoxFuture, CallOutcome, CaptureRequest, ChargeRequest, DisputeRead, DisputesPage,
    Event, Headers, Health, Opened, PaymentProvider, RefundRequest, Sent, SubjectKind,
};
use crate::domain::money::Currency;
use crate::metrics::Metrics;

/// The name stored on attempts and used in `/webhooks/stripe`.
pub const NAME: &str = "stripe";

/// The API version whose shapes this adapter reads.
pub(crate) const API_VERSION: &str = "2024-06-20";

/// A Stripe secret or restricted key (`sk_test_…`, `sk_live_…`, `rk_…`).
/// Its `Debug` never shows it.
#[derive(Clone)]
pub struct SecretKey(String);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

impl SecretKey {
    /// Whether it moves real money (`sk_live_…`, `rk_live_…`).
    pub fn is_live(&self) -> bool {
        self.0.contains("_live_")
    }

    /// Checks the form of a key; the error never repeats it.
    pub fn parse(text: &str) -> Result<SecretKey, &'static str> {
        let prefixed = ["sk_test_", "sk_live_", "rk_test_", "rk_live_"]
            .iter()
            .any(|p| text.starts_with(p) && text.len() > p.len());
        if prefixed && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            Ok(SecretKey(text.to_string()))
        } else {
            Err("expected a Stripe secret key: sk_test_…, sk_live_… or rk_…")
        }
    }
}

/// Webhook signing secrets (`whsec_…`), several while one is rolled.
#[derive(Clone, Default)]
pub struct WebhookSecrets(Vec<String>);

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookSecrets({} redacted)", self.0.len())
    }
}

impl WebhookSecrets {
    /// One secret, or several separated by commas.
    pub fn parse(text: &str) -> Result<WebhookSecrets, &'static str> {
        let secrets: Vec<String> = text.split(',').map(|s| s.trim().to_string()).collect();
        let valid = secrets.iter().all(|s| {
            s.len() > "whsec_".len()
                && s.starts_with("whsec_")
                && s.bytes().all(|b| b.is_ascii_graphic())
        });
        if valid {
            Ok(WebhookSecrets(secrets))
        } else {
            Err("expected whsec_… (several separated by commas while one is rolled)")
        }
    }
}

/// What the adapter needs.
#[derive(Debug, Clone)]
pub struct StripeConfig {
    /// `ONCEPAY_STRIPE_SECRET_KEY`.
    pub secret_key: SecretKey,
    /// `ONCEPAY_STRIPE_API_BASE`.
    pub api_base: String,
    /// `ONCEPAY_STRIPE_WEBHOOK_SECRET`; none: Stripe webhooks are refused.
    pub webhook_secrets: Option<WebhookSecrets>,
    /// `ONCEPAY_STRIPE_PUBLISHABLE_KEY`: the checkout page's Stripe
    /// Elements; none (test keys only): the page takes a `pm_` id.
    pub publishable_key: Option<PublishableKey>,
    /// `ONCEPAY_STRIPE_TIMEOUT`: how long one request to Stripe may take.
    /// Longer than the sandbox's: a confirm waits for the card's issuer
    /// (Stripe's own SDKs wait 80 s), and a confirm cut short is an
    /// unknown outcome the reconciler must settle later. Cut to what is
    /// left of the command's share of its lease (`provider::call`).
    pub timeout: Duration,
}

/// A publishable key (`pk_test_…`, `pk_live_…`): public by design, it is
/// what the customer's browser gives Stripe.js.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishableKey(pub String);

impl PublishableKey {
    /// Checks its form, and that it is of the secret key's mode (a test
    /// page must never tokenize for a live account, nor the reverse).
    pub fn parse(text: &str, secret: &SecretKey) -> Result<PublishableKey, &'static str> {
        let live = secret.is_live();
        let prefix = if live { "pk_live_" } else { "pk_test_" };
        let valid = text.starts_with(prefix)
            && text.len() > prefix.len()
            && text.len() <= 255
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match (valid, live) {
            (true, _) => Ok(PublishableKey(text.to_string())),
            (false, true) => Err("expected pk_live_…, as the secret key is live"),
            (false, false) => Err("expected pk_test_…, as the secret key is a test key"),
        }
    }
}

/// The Stripe adapter.
pub struct Stripe {
    caller: Caller,
    config: StripeConfig,
    /// The checkout's card form, where a publishable key is configured.
    elements: Option<Elements>,
}

fn should_retry(headers: &HeaderMap) -> Option<bool> {
    match headers.get("stripe-should-retry")?.to_str().ok()? {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// The idempotency key of one of our calls: derived from our id and the
/// call, so that each call has its own key and repeats reuse it.
/// The trace as Stripe's form fields (`metadata[k]=v`).
fn metadata(trace: &Trace) -> impl Iterator<Item = (String, String)> {
    trace
        .metadata()
        .into_iter()
        .map(|(k, v)| (format!("metadata[{k}]"), v))
}

fn key(id: Uuid, call: &str) -> String {
    format!("oncepay_{id}_{call}")
}

/// The key of generation `generation` of a send (`ChargeRequest::key_generation`):
/// the first is the key sends always had, so the rows made before
/// generations existed keep theirs; each later one is new to Stripe
/// (`oncepay_<id>_confirm_1`, …).
fn key_of(id: Uuid, call: &str, generation: i32) -> String {
    match generation {
        0 => key(id, call),
        n => format!("oncepay_{id}_{call}_{n}"),
    }
}

impl Stripe {
    /// The adapter, for commands leased for `lease`
    /// (`ONCEPAY_IDEMPOTENCY_LEASE`): its calls end within their share of
    /// it (`call::RetryPolicy::new`).
    pub fn new(
        config: StripeConfig,
        lease: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, BuildError> {
        Ok(Stripe {
            caller: Caller::new(NAME, config.timeout, lease, metrics)?,
            elements: config.publishable_key.clone().map(Elements::new),
            config,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.config.api_base)
    }

    fn authed(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        request
            .bearer_auth(&self.config.secret_key.0)
            .header("Stripe-Version", API_VERSION)
    }

    async fn post(
        &self,
        operation: &'static str,
        path: String,
        idempotency_key: String,
        form: Vec<(String, String)>,
        classify: impl Fn(u16, Option<bool>, &[u8]) -> Verdict + Sync,
    ) -> CallOutcome {
        let url = self.url(&path);
        self.caller
            .call(
                operation,
                |client| {
                    self.authed(client.post(&url))
                        .header("Idempotency-Key", &idempotency_key)
                        .form(&form)
                },
                |status, headers, body| classify(status, should_retry(headers), body),
            )
            .await
    }

    /// A `POST` that sends money's way (a confirm, a refund): as
    /// [`Stripe::post`], and whether Stripe's last answer spent its key
    /// (`classify::spends_key`: an error Stripe keeps under the key and
    /// replays), when the outcome is unknown.
    async fn post_send(
        &self,
        operation: &'static str,
        path: String,
        idempotency_key: String,
        form: Vec<(String, String)>,
        classify: impl Fn(u16, Option<bool>, &[u8]) -> Verdict + Sync,
    ) -> Sent {
        use std::sync::atomic::{AtomicBool, Ordering};
        let url = self.url(&path);
        let spent = AtomicBool::new(false);
        let outcome = self
            .caller
            .call(
                operation,
                |client| {
                    // A new try: only the last answer says what the key holds.
                    spent.store(false, Ordering::SeqCst);
                    self.authed(client.post(&url))
                        .header("Idempotency-Key", &idempotency_key)
                        .form(&form)
                },
                |status, headers, body| {
                    let retry = should_retry(headers);
                    spent.store(classify::spends_key(status, retry, body), Ordering::SeqCst);
                    classify(status, retry, body)
                },
            )
            .await;
        let key_spent = spent.into_inner() && matches!(outcome, CallOutcome::Unknown(_));
        Sent { outcome, key_spent }
    }

    async fn get(
        &self,
        operation: &'static str,
        path: String,
        classify: impl Fn(u16, Option<bool>, &[u8]) -> Verdict + Sync,
    ) -> CallOutcome {
        let url = self.url(&path);
        self.caller
            .call(
                operation,
                |client| self.authed(client.get(&url)),
                |status, headers, body| classify(status, should_retry(headers), body),
            )
            .await
    }

    /// Finds our refund among the PaymentIntent's refunds, page by page.
    async fn list_refunds(&self, r: &RefundRequest) -> CallOutcome {
        let mut after: Option<String> = None;
        for _ in 0..20 {
            let mut path = format!("/v1/refunds?payment_intent={}&limit=100", r.charge_id);
            if let Some(last) = &after {
                path.push_str(&format!("&starting_after={last}"));
            }
            let page = std::sync::Mutex::new(None);
            let read = self
                .get("find_refund", path, |status, retry, body| {
                    if (200..300).contains(&status) {
                        if let Ok(p) = serde_json::from_slice::<ListPage>(body) {
                            let mut slot = page.lock().unwrap_or_else(|e| e.into_inner());
                            *slot = Some(p);
                            return Verdict::Done(CallOutcome::NotFound);
                        }
                    }
                    classify::classify(CallKind::Read, status, retry, body)
                })
                .await;
            let page = page.into_inner().unwrap_or_else(|e| e.into_inner());
            let (Some(page), CallOutcome::NotFound) = (page, &read) else {
                // A 404 for a PaymentIntent we charged is not "no refund".
                return match read {
                    CallOutcome::NotFound => CallOutcome::Unknown(
                        "Stripe has no PaymentIntent of the id we recorded".into(),
                    ),
                    other => other,
                };
            };
            match page.find(r.idempotency_key) {
                (Some(found), _) => return found,
                (None, Some(next)) => after = Some(next),
                // Every refund of the PaymentIntent was read: ours is not
                // among them, so none was made with any key.
                (None, None) => return CallOutcome::NotFound,
            }
        }
        CallOutcome::Unknown("too many refunds to look through".into())
    }
}

/// `expand[]=latest_charge` for a hold's confirm: its deadline
/// (`payment_method_details.card.capture_before`) is on its charge.
fn expand_charge(
    method: crate::domain::payment::CaptureMethod,
) -> impl Iterator<Item = (String, String)> {
    (method == crate::domain::payment::CaptureMethod::Manual)
        .then(|| ("expand[]".to_string(), "latest_charge".to_string()))
        .into_iter()
}

/// A `pm_…` PaymentMethod id.
pub(crate) fn check_payment_method(payment_method: &str) -> Result<(), &'static str> {
    let valid = payment_method.starts_with("pm_")
        && payment_method.len() > 3
        && payment_method.len() <= 255
        && payment_method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err("must be a Stripe PaymentMethod id: pm_ followed by up to 252 letters, digits or underscores")
    }
}

impl PaymentProvider for Stripe {
    fn name(&self) -> &str {
        NAME
    }

    fn health(&self) -> &Health {
        self.caller.health()
    }

    fn check_payment_method(&self, payment_method: &str) -> Result<(), &'static str> {
        check_payment_method(payment_method)
    }

    fn example_payment_method(&self) -> &'static str {
        "pm_card_visa"
    }

    fn test_mode(&self) -> bool {
        let key = &self.config.secret_key.0;
        key.starts_with("sk_test_") || key.starts_with("rk_test_")
    }

    fn card_form(&self) -> Option<&dyn CardForm> {
        self.elements.as_ref().map(|e| e as &dyn CardForm)
    }

    fn check_amount(&self, amount: i64, currency: &Currency) -> Result<(), String> {
        units::to_stripe(amount, currency)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn restricts_amounts(&self) -> bool {
        true
    }

    fn check_refund_amount(&self, amount: i64, currency: &Currency) -> Result<(), String> {
        units::refund_to_stripe(amount, currency)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn open_charge<'a>(&'a self, r: &'a ChargeRequest) -> BoxFuture<'a, Opened> {
        Box::pin(async move {
            let amount = match units::of_request(&r.currency, r.amount, units::to_stripe) {
                Ok(amount) => amount,
                // Refused before the attempt was written, unless it was
                // written before this rule existed: nothing was created.
                Err(refused) => return Opened::Settled(*refused),
            };
            let form: Vec<(String, String)> = [
                ("amount".to_string(), amount.to_string()),
                ("currency".into(), r.currency.to_ascii_lowercase()),
                ("payment_method".into(), r.payment_method.clone()),
                ("payment_method_types[]".into(), "card".into()),
                ("capture_method".into(), r.capture_method.as_str().into()),
            ]
            .into_iter()
            .chain(metadata(&r.trace))
            .collect();
            let created = self
                .post(
                    "open_charge",
                    "/v1/payment_intents".into(),
                    key(r.idempotency_key, "create"),
                    form,
                    classify::creation,
                )
                .await;
            match created {
                // A PaymentIntent just created is waiting for its confirm.
                CallOutcome::Known(intent)
                    if !intent.id.is_empty()
                        && intent.status == crate::domain::payment::PaymentStatus::Pending =>
                {
                    Opened::Created(intent.id)
                }
                other => Opened::Settled(other),
            }
        })
    }

    fn charge<'a>(
        &'a self,
        r: &'a ChargeRequest,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, Sent> {
        Box::pin(async move {
            let Some(intent) = reference else {
                return Sent::from(CallOutcome::Unknown(
                    "no PaymentIntent recorded to confirm".into(),
                ));
            };
            // Where the bank sends the customer back after 3-D Secure:
            // given here, Stripe answers `next_action.redirect_to_url`
            // (without it, only Stripe.js could follow the action).
            let form = r
                .return_url
                .iter()
                .map(|u| ("return_url".to_string(), u.clone()))
                // A hold's deadline is on its charge.
                .chain(expand_charge(r.capture_method))
                .collect();
            // A PaymentIntent succeeds at most once: a confirm under a new
            // key (after a read proved this one unconfirmed) cannot charge
            // twice.
            self.post_send(
                "charge",
                format!("/v1/payment_intents/{intent}/confirm"),
                key_of(r.idempotency_key, "confirm", r.key_generation),
                form,
                |status, retry, body| classify::classify(CallKind::Write, status, retry, body),
            )
            .await
        })
    }

    fn find_charge<'a>(
        &'a self,
        attempt_id: Uuid,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            // Only a confirm moves money, and only a recorded PaymentIntent
            // is ever confirmed: with none recorded, nothing was charged.
            let Some(intent) = reference else {
                return CallOutcome::NotFound;
            };
            self.get(
                "find_charge",
                format!("/v1/payment_intents/{intent}?expand[]=latest_charge"),
                move |status, retry, body| classify::intent_read(attempt_id, status, retry, body),
            )
            .await
        })
    }

    fn abandon<'a>(
        &'a self,
        attempt_id: Uuid,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let Some(intent) = reference else {
                return self.find_charge(attempt_id, None).await;
            };
            // Its own key: a cancel retried after a lost answer is the
            // same cancel. Stripe cancels a hold its customer approved
            // meanwhile (`requires_capture`) as readily: the intent comes
            // back with its charge, which tells an approval from an
            // authentication that never came (`classify::known`, review
            // N6).
            let cancelled = self
                .post(
                    "abandon",
                    format!("/v1/payment_intents/{intent}/cancel"),
                    key(attempt_id, "cancel"),
                    vec![
                        ("cancellation_reason".into(), "abandoned".into()),
                        ("expand[]".into(), "latest_charge".into()),
                    ],
                    |status, retry, body| classify::classify(CallKind::Write, status, retry, body),
                )
                .await;
            match cancelled {
                CallOutcome::Known(intent) if intent.status.is_final() => {
                    CallOutcome::Known(intent)
                }
                // Stripe refuses to cancel an intent that succeeded or is
                // processing (`payment_intent_unexpected_state`): what it
                // is now is the answer.
                _ => self.find_charge(attempt_id, Some(intent)).await,
            }
        })
    }

    fn captures_later(&self) -> bool {
        true
    }

    fn capture<'a>(&'a self, r: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let amount = match units::of_request(&r.currency, r.amount, units::to_stripe) {
                Ok(amount) => amount,
                Err(refused) => return *refused,
            };
            // The capture's own id makes its key: a repeat is the same
            // capture, never one made from the amount.
            self.post(
                "capture",
                format!("/v1/payment_intents/{}/capture", r.charge_id),
                key(r.idempotency_key, "capture"),
                vec![
                    ("amount_to_capture".into(), amount.to_string()),
                    ("expand[]".into(), "latest_charge".into()),
                ],
                classify::capture_answer,
            )
            .await
        })
    }

    fn find_capture<'a>(&'a self, r: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            match self.find_charge(r.payment_id, Some(&r.charge_id)).await {
                // Still held: never captured, and capturing again (same
                // key) is safe.
                CallOutcome::Known(intent)
                    if intent.status == crate::domain::payment::PaymentStatus::RequiresCapture =>
                {
                    CallOutcome::NotFound
                }
                CallOutcome::NotFound => {
                    CallOutcome::Unknown("the held PaymentIntent reads as unconfirmed".into())
                }
                other => other,
            }
        })
    }

    fn void<'a>(&'a self, payment_id: Uuid, charge_id: &'a str) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            self.post(
                "void",
                format!("/v1/payment_intents/{charge_id}/cancel"),
                key(payment_id, "void"),
                vec![
                    ("cancellation_reason".into(), "requested_by_customer".into()),
                    ("expand[]".into(), "latest_charge".into()),
                ],
                classify::hold_answer,
            )
            .await
        })
    }

    fn refund<'a>(&'a self, r: &'a RefundRequest) -> BoxFuture<'a, Sent> {
        Box::pin(async move {
            let amount = match units::of_request(&r.currency, r.amount, units::refund_to_stripe) {
                Ok(amount) => amount,
                Err(refused) => return Sent::from(*refused),
            };
            let form: Vec<(String, String)> = [
                ("payment_intent".to_string(), r.charge_id.clone()),
                ("amount".into(), amount.to_string()),
            ]
            .into_iter()
            .chain(metadata(&r.trace))
            .collect();
            // Under a new generation's key only once a read found no
            // refund with our metadata after Stripe answered the last key
            // with an error it keeps (`commands::refunds`): that request
            // had ended, and made nothing.
            self.post_send(
                "refund",
                "/v1/refunds".into(),
                key_of(r.idempotency_key, "refund", r.key_generation),
                form,
                classify::refund_creation,
            )
            .await
        })
    }

    fn find_refund<'a>(
        &'a self,
        r: &'a RefundRequest,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            match reference {
                Some(id) => {
                    self.get("find_refund", format!("/v1/refunds/{id}"), |s, retry, b| {
                        if s == 404 {
                            return Verdict::Done(CallOutcome::Unknown(
                                "Stripe has no Refund of the id we recorded".into(),
                            ));
                        }
                        classify::classify(CallKind::Read, s, retry, b)
                    })
                    .await
                }
                None => self.list_refunds(r).await,
            }
        })
    }

    fn find_dispute<'a>(&'a self, id: &'a str) -> BoxFuture<'a, DisputeRead> {
        let url = self.url(&format!("/v1/disputes/{id}"));
        Box::pin(async move {
            let read = self
                .caller
                .read_object(
                    "find_dispute",
                    |client| self.authed(client.get(&url)),
                    |status, headers, body| {
                        classify::classify(CallKind::Read, status, should_retry(headers), body)
                    },
                )
                .await;
            match read {
                Ok(Some(body)) => match classify::dispute(&body) {
                    Some(dispute) => DisputeRead::Known(dispute),
                    None => DisputeRead::Unknown("unreadable Stripe Dispute".into()),
                },
                Ok(None) => DisputeRead::NotFound,
                Err(reason) => DisputeRead::Unknown(reason),
            }
        })
    }

    fn probe(&self) -> BoxFuture<'_, CallOutcome> {
        Box::pin(self.get(
            "probe",
            "/v1/payment_intents?limit=1".into(),
            |status, retry, body| {
                if (200..300).contains(&status) {
                    Verdict::Done(CallOutcome::NotFound)
                } else {
                    classify::classify(CallKind::Read, status, retry, body)
                }
            },
        ))
    }

    fn verify_webhook(
        &self,
        headers: Headers<'_>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Option<String>, String> {
        let Some(secrets) = &self.config.webhook_secrets else {
            return Err(
                "Stripe webhooks are refused: ONCEPAY_STRIPE_WEBHOOK_SECRET is not set".into(),
            );
        };
        let secrets: Vec<&str> = secrets.0.iter().map(String::as_str).collect();
        signature::verify(
            &secrets,
            headers("stripe-signature").as_deref(),
            body,
            now_unix,
        )
        .map_err(|e| e.to_string())?;
        Ok(None)
    }

    fn parse_event(&self, payload: &Value) -> Event {
        classify::event(payload)
    }

    fn list_books<'a>(
        &'a self,
        kind: SubjectKind,
        window: (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BooksPage, String>> {
        // Stripe filters by creation (`created[gte]`, `created[lt]`), so a
        // pass reads only its window, not every newer object; the page
        // checks the window again (`ListPage::books`).
        let what = match kind {
            // Each with its charge, which says how much is refunded.
            SubjectKind::Charge => "payment_intents?limit=100&expand[]=data.latest_charge",
            SubjectKind::Refund => "refunds?limit=100",
        };
        let (from, until) = window;
        let mut url = self.url(&format!(
            "/v1/{what}&created[gte]={from}&created[lt]={until}"
        ));
        if let Some(after) = after {
            url.push_str(&format!("&starting_after={after}"));
        }
        Box::pin(async move {
            let body = self
                .caller
                .read_body(
                    "list_books",
                    |client| self.authed(client.get(&url)),
                    |status, headers, body| {
                        classify::classify(CallKind::Read, status, should_retry(headers), body)
                    },
                )
                .await?;
            let page: ListPage = serde_json::from_slice(&body)
                .map_err(|e| format!("unreadable Stripe list: {e}"))?;
            Ok(page.books(kind, window))
        })
    }

    fn list_disputes<'a>(
        &'a self,
        window: (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputesPage, String>> {
        // `GET /v1/disputes` filters by creation as the books' lists do
        // (Disputes API, list parameters: `created`, "disputes that were
        // created during the given date interval"); a dispute that moved
        // later is read again by id (`find_dispute`) while it is open.
        let (from, until) = window;
        let mut url = self.url(&format!(
            "/v1/disputes?limit=100&created[gte]={from}&created[lt]={until}"
        ));
        if let Some(after) = after {
            url.push_str(&format!("&starting_after={after}"));
        }
        Box::pin(async move {
            let body = self
                .caller
                .read_body(
                    "list_disputes",
                    |client| self.authed(client.get(&url)),
                    |status, headers, body| {
                        classify::classify(CallKind::Read, status, should_retry(headers), body)
                    },
                )
                .await?;
            let page: ListPage = serde_json::from_slice(&body)
                .map_err(|e| format!("unreadable Stripe list: {e}"))?;
            Ok(page.disputes(window))
        })
    }
}
