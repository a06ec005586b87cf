//! What one of Stripe's answers proves, as a pure table (the sandbox's
//! rules of `provider::classify`, with Stripe's own answers):
//!
//! | answer | read (`GET` by id) | create, confirm, refund (`POST`, with a key) |
//! |---|---|---|
//! | `2xx`, a readable PaymentIntent or Refund | the object, its status mapped ([`intent_status`], [`refund_status`]) | the same |
//! | `2xx`, unreadable | unknown | unknown |
//! | `402` `card_error` with a code | unknown | **declined**, `decline_code` (else `code`) as the failure code |
//! | `404` `resource_missing` | no such object | unknown |
//! | `400` `idempotency_error` | unknown | unknown, and a bug of ours ([`Verdict::Bug`]): never a decline |
//! | `409` `idempotency_key_in_use`, `429` (`lock_timeout`, `rate_limit`) | retried now | retried now, same key |
//! | `5xx` | retried now | retried now, same key |
//! | `Stripe-Should-Retry: true` / `false` | retried now / not | retried now / not (unknown) |
//! | `401`, `403` (a credential outage) | unknown | unknown, never a decline |
//! | anything else | unknown | unknown |
//!
//! A refund's create differs in one row ([`refund_creation`]): any other
//! `4xx` carrying Stripe's error object is Stripe refusing the refund
//! (nothing was created, and Stripe replays the refusal for the key), so
//! the refund fails with Stripe's `code`. So does a hold's capture
//! ([`capture_answer`]): the capture is refused, `failed` with Stripe's
//! code, and the hold is read back before the capture ends.
//!
//! "Unknown" settles nothing: the attempt stays `pending` and the
//! reconciler reads the intent by id later.

use serde::Deserialize;

use std::collections::HashMap;

use uuid::Uuid;

use crate::domain::payment::{NextAction, PaymentStatus};
pub use crate::provider::classify::{CallKind, Verdict};
use crate::provider::{CallOutcome, ProviderObject};

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    error: StripeError,
}

#[derive(Deserialize, Default)]
struct StripeError {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// A PaymentIntent or Refund, as far as its state goes.
#[derive(Deserialize)]
struct Object {
    id: String,
    object: String,
    status: String,
    #[serde(default)]
    last_payment_error: Option<StripeError>,
    #[serde(default)]
    failure_reason: Option<String>,
    #[serde(default)]
    metadata: Option<HashMap<String, String>>,
    #[serde(default)]
    next_action: Option<serde_json::Value>,
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    cancellation_reason: Option<String>,
    /// `manual`: authorized, then captured (`POST …/capture`) or cancelled.
    #[serde(default)]
    capture_method: Option<String>,
    /// Its charge: an id, or the Charge where `expand[]=latest_charge`.
    #[serde(default)]
    latest_charge: Option<serde_json::Value>,
    /// What the intent took (Stripe's units of `currency`).
    #[serde(default)]
    amount_received: Option<i64>,
    #[serde(default)]
    currency: Option<String>,
    /// Unix seconds.
    #[serde(default)]
    created: Option<i64>,
}

/// How long Stripe holds a card authorization (online card payments: "7
/// days", Stripe's docs on placing a hold): the deadline of a hold whose
/// charge does not say (`payment_method_details.card.capture_before`).
pub(crate) const DOCUMENTED_WINDOW: i64 = 7 * 86_400;

impl Object {
    fn manual(&self) -> bool {
        self.capture_method.as_deref() == Some("manual")
    }

    /// A hold's deadline: its latest charge's
    /// `payment_method_details.card.capture_before`, else Stripe's
    /// documented window from the intent's creation.
    fn capture_before(&self) -> Option<i64> {
        self.latest_charge
            .as_ref()
            .and_then(|c| c.pointer("/payment_method_details/card/capture_before"))
            .and_then(serde_json::Value::as_i64)
            .or_else(|| self.created.map(|c| c + DOCUMENTED_WINDOW))
    }

    /// Whether its charge was authorized: its latest charge, where
    /// expanded, `succeeded` (Stripe's status of an authorized charge,
    /// captured or not). A manual intent cancelled `abandoned` that has one
    /// was approved by its customer before oncepay's cancel reached it
    /// (Stripe cancels an intent in `requires_capture` too, releasing the
    /// hold: PaymentIntents API, cancel): a released hold, not an
    /// authentication that never came. A charge not expanded (an id)
    /// tells nothing, and abandoned intents are read expanded.
    fn authorized(&self) -> bool {
        self.latest_charge
            .as_ref()
            .and_then(|c| c.get("status"))
            .and_then(serde_json::Value::as_str)
            == Some("succeeded")
    }

    /// What a manual intent that succeeded captured, in minor units: its
    /// charge's `amount_captured`, else the intent's `amount_received`.
    fn amount_captured(&self) -> Option<i64> {
        let stripe = self
            .latest_charge
            .as_ref()
            .and_then(|c| c.get("amount_captured"))
            .and_then(serde_json::Value::as_i64)
            .or(self.amount_received)?;
        super::units::from_stripe_code(stripe, self.currency.as_deref()?)
    }
}

/// The metadata key of our attempt id on a PaymentIntent.
pub(crate) const ATTEMPT_KEY: &str = crate::provider::trace::ATTEMPT;
/// The metadata key of our refund id on a Refund.
pub(crate) const REFUND_KEY: &str = crate::provider::trace::REFUND;

impl Object {
    fn ours(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.get(key).map(String::as_str)
    }
}

/// A PaymentIntent's status as oncepay's: `None` for one that cannot
/// happen in oncepay's flow (`requires_capture`: oncepay captures
/// automatically), which proves nothing.
pub(crate) fn intent_status(status: &str, has_error: bool) -> Option<PaymentStatus> {
    Some(match status {
        "succeeded" => PaymentStatus::Succeeded,
        // After a confirm, a decline puts the intent back to waiting for a
        // payment method, with the error that says why.
        "requires_payment_method" if has_error => PaymentStatus::Failed,
        "canceled" => PaymentStatus::Failed,
        // Not confirmed yet, waiting for the customer (3-D Secure), or
        // processing: the outcome is still to come.
        "requires_payment_method" | "requires_confirmation" | "requires_action" | "processing" => {
            PaymentStatus::Pending
        }
        _ => return None,
    })
}

/// A Refund's status as oncepay's.
pub(crate) fn refund_status(status: &str) -> Option<PaymentStatus> {
    Some(match status {
        "succeeded" => PaymentStatus::Succeeded,
        "pending" | "requires_action" => PaymentStatus::Pending,
        "failed" | "canceled" => PaymentStatus::Failed,
        _ => return None,
    })
}

/// A readable PaymentIntent or Refund in our terms.
pub fn known(body: &[u8]) -> CallOutcome {
    let object: Object = match serde_json::from_slice(body) {
        Ok(o) => o,
        Err(e) => return CallOutcome::Unknown(format!("unreadable Stripe answer: {e}")),
    };
    let (status, failure_code, failure_message) = match object.object.as_str() {
        "payment_intent" => {
            let error = object.last_payment_error.as_ref();
            let status = match object.status.as_str() {
                // A hold: only a manual intent is ever left uncaptured.
                "requires_capture" if object.manual() => Some(PaymentStatus::RequiresCapture),
                // A manual intent cancelled (by our void, or by Stripe when
                // the authorization expired: `automatic`) released its
                // hold; one we gave up waiting for its customer failed,
                // unless its customer approved before the cancel: then a
                // hold was released (`crate::provider::ABANDONED`).
                "canceled"
                    if object.manual()
                        && (object.cancellation_reason.as_deref() != Some("abandoned")
                            || object.authorized()) =>
                {
                    Some(PaymentStatus::Voided)
                }
                other => intent_status(other, error.is_some()),
            };
            let failed = status == Some(PaymentStatus::Failed);
            let voided = status == Some(PaymentStatus::Voided);
            let code = match (failed, error) {
                // Cancelled by us because its customer never authenticated
                // (`PaymentProvider::abandon`): the same code whichever
                // path learns it first, the reconciler or the webhook.
                (true, _) if object.cancellation_reason.as_deref() == Some("abandoned") => {
                    Some("authentication_expired".to_string())
                }
                (true, Some(e)) => e.decline_code.clone().or_else(|| e.code.clone()),
                (true, None) => Some(object.status.clone()),
                // A released hold: who cancelled it, where someone did
                // (`requested_by_customer`, `fraudulent`, `duplicate`: the
                // Dashboard's, or our void's); nothing where Stripe let it
                // lapse (`automatic`, and `expired` from 2025-03-31.basil:
                // PaymentIntents API, `cancellation_reason`).
                _ if voided => object
                    .cancellation_reason
                    .clone()
                    .filter(|r| !matches!(r.as_str(), "automatic" | "expired")),
                _ => None,
            };
            let message = error.filter(|_| failed).and_then(|e| e.message.clone());
            (status, code, message)
        }
        "refund" => {
            let status = refund_status(&object.status);
            let code = object
                .failure_reason
                .clone()
                .filter(|_| status == Some(PaymentStatus::Failed));
            (status, code, None)
        }
        other => {
            return CallOutcome::Unknown(format!("a Stripe {other}, not an intent or a refund"))
        }
    };
    match status {
        Some(status) if !object.id.is_empty() => CallOutcome::Known(ProviderObject {
            // A redirect the customer follows to their bank (with the
            // `return_url` given at confirm); any other action
            // (`use_stripe_sdk`, without a `return_url`) is Stripe.js's to
            // run in the shop's page with the intent's client secret.
            next_action: object
                .next_action
                .as_ref()
                .filter(|n| !n.is_null())
                .filter(|_| status == PaymentStatus::Pending)
                .and_then(
                    |n| match n.pointer("/redirect_to_url/url").and_then(|u| u.as_str()) {
                        Some(url) => Some(NextAction::redirect(url)),
                        None => object
                            .client_secret
                            .clone()
                            .map(|client_secret| NextAction::UseStripeSdk { client_secret }),
                    },
                ),
            capture_before: object
                .capture_before()
                .filter(|_| status == PaymentStatus::RequiresCapture),
            amount_captured: object
                .amount_captured()
                .filter(|_| status == PaymentStatus::Succeeded && object.manual()),
            id: object.id,
            status,
            failure_code,
            failure_message,
        }),
        _ => CallOutcome::Unknown(format!(
            "Stripe {} in status {}, which oncepay never leaves it in",
            object.object, object.status
        )),
    }
}

/// Classifies one answer; `should_retry` is the `Stripe-Should-Retry`
/// header, if sent. See the module docs for the table.
pub(crate) fn classify(
    kind: CallKind,
    status: u16,
    should_retry: Option<bool>,
    body: &[u8],
) -> Verdict {
    let error = || {
        serde_json::from_slice::<ErrorBody>(body)
            .unwrap_or_default()
            .error
    };
    let unknown = |why: String| Verdict::Done(CallOutcome::Unknown(why));
    if (200..300).contains(&status) {
        return Verdict::Done(known(body));
    }
    // Stripe's own word on retrying comes first, both ways.
    match should_retry {
        Some(true) => return Verdict::Retry(format!("Stripe answered {status}, retry")),
        Some(false) if status >= 429 => {
            return unknown(format!("Stripe answered {status} and asked not to retry"))
        }
        _ => {}
    }
    let e = error();
    match (status, e.kind.as_deref(), e.code.as_deref()) {
        (402, Some("card_error"), Some(code)) if kind == CallKind::Write => {
            Verdict::Done(CallOutcome::Known(ProviderObject {
                id: String::new(),
                status: PaymentStatus::Failed,
                failure_code: Some(e.decline_code.clone().unwrap_or_else(|| code.to_string())),
                failure_message: Some(e.message.unwrap_or_else(|| "declined".into())),
                next_action: None,
                capture_before: None,
                amount_captured: None,
            }))
        }
        (404, _, _) if kind == CallKind::Read => Verdict::Done(CallOutcome::NotFound),
        (400, Some("idempotency_error"), _) => Verdict::Bug(format!(
            "Stripe refused an idempotency key reused with other parameters: {}",
            e.message.unwrap_or_default()
        )),
        (409, _, _) | (429, _, _) | (500..=599, _, _) => Verdict::Retry(format!(
            "Stripe answered {status} {}",
            e.code.unwrap_or_default()
        )),
        (401 | 403, _, _) => unknown(format!(
            "Stripe refused our credentials ({status}): a credential outage, never a decline"
        )),
        _ => unknown(format!(
            "Stripe answered {status} {}, which proves nothing about the outcome",
            e.code.unwrap_or_default()
        )),
    }
}

/// Whether an answer to a `POST` spends its idempotency key: a `5xx`
/// carrying Stripe's error object. Stripe saved it under the key and
/// replays it to every repeat for a day (Idempotent requests: the result
/// of a request that began executing is saved, "including 500 errors";
/// stripe-node, `RequestSender`: "we expect the stripe-should-retry header
/// to be false in most cases when a 500 is returned, since our idempotency
/// framework would typically replay it anyway"), so the key can tell
/// nothing more, and the request under it has ended. Not when Stripe asks
/// for a retry (`Stripe-Should-Retry: true`: the key is worth repeating),
/// nor for a body that is not Stripe's (a proxy's page: Stripe may never
/// have seen the request). What a spent key's send did is then read
/// (`commands::payments`, `commands::refunds`), and a send proved to have
/// made nothing is made again under a new key.
pub(crate) fn spends_key(status: u16, should_retry: Option<bool>, body: &[u8]) -> bool {
    (500..600).contains(&status)
        && should_retry != Some(true)
        && serde_json::from_slice::<ErrorBody>(body)
            .ok()
            .and_then(|b| b.error.kind)
            .is_some()
}

/// The answer to creating an unconfirmed PaymentIntent. A create moves no
/// money whatever happens, so a refusal of the request itself (`400`
/// `invalid_request_error` other than `idempotency_error`, `404`: an
/// unknown payment method) is a fact: nothing exists to be charged, and
/// the attempt fails with `invalid_payment_method` (when Stripe names that
/// parameter or the method is missing) or `invalid_request`. The rest is
/// the table of [`classify`].
pub fn creation(status: u16, should_retry: Option<bool>, body: &[u8]) -> Verdict {
    if matches!(status, 400 | 404) && should_retry != Some(true) {
        let e = serde_json::from_slice::<ErrorBody>(body)
            .unwrap_or_default()
            .error;
        let wrong_request = e.kind.as_deref() == Some("invalid_request_error");
        if wrong_request {
            let about_method = status == 404
                || e.code.as_deref() == Some("resource_missing")
                || body_names_param(body, "payment_method");
            let code = if about_method {
                "invalid_payment_method"
            } else {
                "invalid_request"
            };
            return Verdict::Done(CallOutcome::Known(ProviderObject {
                id: String::new(),
                status: PaymentStatus::Failed,
                failure_code: Some(code.into()),
                failure_message: Some(
                    e.message
                        .unwrap_or_else(|| "Stripe refused the payment".into()),
                ),
                next_action: None,
                capture_before: None,
                amount_captured: None,
            }));
        }
    }
    classify(CallKind::Write, status, should_retry, body)
}

/// The answer to capturing or cancelling a hold: Stripe refuses one that
/// can no longer be (captured already, cancelled, expired) with `400
/// payment_intent_unexpected_state`, its error carrying the PaymentIntent
/// as it is: that intent is the answer, a fact. Anything else as any write.
pub fn hold_answer(status: u16, should_retry: Option<bool>, body: &[u8]) -> Verdict {
    if let Some(intent) = intent_of_refusal(status, body) {
        return Verdict::Done(CallOutcome::Known(intent));
    }
    classify(CallKind::Write, status, should_retry, body)
}

/// The PaymentIntent a `400 payment_intent_unexpected_state` carries, in
/// our terms.
fn intent_of_refusal(status: u16, body: &[u8]) -> Option<ProviderObject> {
    if status != 400 {
        return None;
    }
    let intent = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .filter(|v| {
            v.pointer("/error/code").and_then(serde_json::Value::as_str)
                == Some("payment_intent_unexpected_state")
        })
        .and_then(|v| v.pointer("/error/payment_intent").cloned())
        .filter(|pi| pi.is_object())?;
    match known(intent.to_string().as_bytes()) {
        CallOutcome::Known(object) => Some(object),
        _ => None,
    }
}

/// The answer to capturing a hold: [`hold_answer`]'s fact (the intent a
/// `payment_intent_unexpected_state` carries), and Stripe's refusal of
/// the capture itself. A `4xx` carrying Stripe's error object is a
/// content error (PaymentIntents API error codes: `amount_too_small`,
/// `charge_expired_for_capture`; a `402 card_error` decline): nothing was
/// captured under the key, and Stripe answers a repeat of it the same, so
/// left unknown the capture would be sent again on every pass until the
/// hold dies. It is `failed` with Stripe's code (a decline's
/// `decline_code` first); the caller reads the PaymentIntent back before
/// the capture ends, and applies what it says (a hold Stripe cancelled as
/// expired is `voided`). The exceptions are [`refund_creation`]'s: `400
/// idempotency_error` (our bug), `409` and `429` (retried, same key),
/// `401` and `403` (our credentials), Stripe's own "retry", and a body
/// that is not Stripe's error object.
pub fn capture_answer(status: u16, should_retry: Option<bool>, body: &[u8]) -> Verdict {
    if let Some(intent) = intent_of_refusal(status, body) {
        return Verdict::Done(CallOutcome::Known(intent));
    }
    let refused = (400..500).contains(&status)
        && !matches!(status, 401 | 403 | 409 | 429)
        && should_retry != Some(true);
    if refused {
        let e = serde_json::from_slice::<ErrorBody>(body)
            .unwrap_or_default()
            .error;
        if let Some(kind) = e.kind.as_deref().filter(|k| *k != "idempotency_error") {
            let code = e
                .decline_code
                .clone()
                .or_else(|| e.code.clone())
                .unwrap_or_else(|| kind.to_string());
            return Verdict::Done(CallOutcome::Known(ProviderObject {
                id: String::new(),
                status: PaymentStatus::Failed,
                failure_code: Some(code),
                failure_message: Some(
                    e.message
                        .unwrap_or_else(|| "Stripe refused the capture".into()),
                ),
                next_action: None,
                capture_before: None,
                amount_captured: None,
            }));
        }
    }
    classify(CallKind::Write, status, should_retry, body)
}

/// The answer to creating a Refund. Stripe answers a refund it will not
/// make (`charge_already_refunded` after a refund from the Dashboard,
/// `charge_disputed`, `amount_too_large`, `refund_disputed_payment`, a
/// `404 resource_missing` charge) with a `4xx` before it creates anything,
/// and replays that answer for the same key: left unknown, the refund
/// would stay `pending` for ever, holding its amount. So a Stripe error
/// body with a `4xx` is a fact, the refund fails with Stripe's `code` —
/// except where it is not Stripe's word on the refund:
/// - `400 idempotency_error`: our bug (the key with other parameters);
/// - `409` and `429`: a lock or a rate limit, retried with the same key;
/// - `401` and `403`: a credential outage of ours; Stripe saves nothing
///   for a request it did not authenticate, so the reconciler's resend
///   with the same key makes the refund once the key works again;
/// - a body that is not Stripe's error object (a proxy's page): unknown.
pub fn refund_creation(status: u16, should_retry: Option<bool>, body: &[u8]) -> Verdict {
    let refused = (400..500).contains(&status)
        && !matches!(status, 401 | 403 | 409 | 429)
        && should_retry != Some(true);
    if refused {
        let e = serde_json::from_slice::<ErrorBody>(body)
            .unwrap_or_default()
            .error;
        if let Some(kind) = e.kind.as_deref().filter(|k| *k != "idempotency_error") {
            let code = e.code.clone().unwrap_or_else(|| kind.to_string());
            return Verdict::Done(CallOutcome::Known(ProviderObject {
                id: String::new(),
                status: PaymentStatus::Failed,
                failure_code: Some(code),
                failure_message: Some(
                    e.message
                        .unwrap_or_else(|| "Stripe refused the refund".into()),
                ),
                next_action: None,
                capture_before: None,
                amount_captured: None,
            }));
        }
    }
    classify(CallKind::Write, status, should_retry, body)
}

fn body_names_param(body: &[u8], param: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.pointer("/error/param")?.as_str().map(|p| p == param))
        .unwrap_or(false)
}

/// The answer to reading the PaymentIntent we recorded for `attempt_id`:
/// - one still unconfirmed (`requires_confirmation`, or
///   `requires_payment_method` with no error) has moved no money:
///   "not found", so the caller confirms it;
/// - one whose metadata names another attempt proves nothing about ours;
/// - `404` for an id we recorded cannot be trusted as "never charged" (a
///   key of another account, a restored test mode): unknown.
pub(crate) fn intent_read(
    attempt_id: Uuid,
    status: u16,
    should_retry: Option<bool>,
    body: &[u8],
) -> Verdict {
    if (200..300).contains(&status) {
        if let Ok(object) = serde_json::from_slice::<Object>(body) {
            if object.object == "payment_intent" {
                if let Some(other) = object
                    .ours(ATTEMPT_KEY)
                    .filter(|a| *a != attempt_id.to_string())
                {
                    return Verdict::Done(CallOutcome::Unknown(format!(
                        "PaymentIntent {} belongs to attempt {other}",
                        object.id
                    )));
                }
                let unconfirmed = object.status == "requires_confirmation"
                    || (object.status == "requires_payment_method"
                        && object.last_payment_error.is_none());
                if unconfirmed {
                    return Verdict::Done(CallOutcome::NotFound);
                }
            }
        }
    }
    if status == 404 {
        return Verdict::Done(CallOutcome::Unknown(
            "Stripe has no PaymentIntent of the id we recorded: another account or key?".into(),
        ));
    }
    classify(CallKind::Read, status, should_retry, body)
}

/// One page of a Stripe list (PaymentIntents or Refunds).
#[derive(Deserialize)]
pub struct ListPage {
    data: Vec<serde_json::Value>,
    #[serde(default)]
    has_more: bool,
}

impl ListPage {
    /// The refund of ours with `refund_id` on this page, in our terms; and
    /// the id to continue after, if Stripe has more.
    pub fn find(&self, refund_id: Uuid) -> (Option<CallOutcome>, Option<String>) {
        let wanted = refund_id.to_string();
        let found = self.data.iter().find(|r| {
            r.pointer(&format!("/metadata/{REFUND_KEY}"))
                .and_then(serde_json::Value::as_str)
                == Some(wanted.as_str())
        });
        let next = self
            .has_more
            .then(|| self.data.last()?.get("id")?.as_str().map(str::to_string))
            .flatten();
        (found.map(|r| known(r.to_string().as_bytes())), next)
    }
}

impl ListPage {
    /// This page as a page of the books: the PaymentIntents (`kind`
    /// charge) or Refunds on it created in `[from, until)`, and the cursor
    /// of the next page. A PaymentIntent never confirmed moved no money and
    /// is left out. Stripe lists newest first: a page that reaches below
    /// `from` is the last one needed (a list in the other order, as
    /// localstripe's, is read to its end).
    pub fn books(
        &self,
        kind: crate::provider::SubjectKind,
        (from, until): (i64, i64),
    ) -> crate::provider::BooksPage {
        use crate::provider::{BookEntry, BooksPage, SubjectKind};
        let created = |o: &serde_json::Value| o.get("created").and_then(serde_json::Value::as_i64);
        let entries = self
            .data
            .iter()
            .filter(|o| created(o).is_some_and(|c| c >= from && c < until))
            .filter(|o| {
                let status = o.get("status").and_then(serde_json::Value::as_str);
                let declined = o.get("last_payment_error").is_some_and(|e| !e.is_null());
                !matches!(
                    (status, declined),
                    (Some("requires_confirmation"), _) | (Some("requires_payment_method"), false)
                )
            })
            .filter_map(|o| {
                let CallOutcome::Known(state) = known(o.to_string().as_bytes()) else {
                    return None;
                };
                let metadata: HashMap<String, String> = o
                    .get("metadata")
                    .and_then(|m| serde_json::from_value(m.clone()).ok())
                    .unwrap_or_default();
                let currency = o
                    .get("currency")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_ascii_uppercase();
                // Stripe's units, as oncepay's (ISO 4217).
                let ours = |amount: i64| super::units::from_stripe_code(amount, &currency);
                Some(BookEntry {
                    kind,
                    state,
                    amount: ours(o.get("amount")?.as_i64()?)?,
                    created: created(o)?,
                    charge: match kind {
                        SubjectKind::Refund => o
                            .get("payment_intent")
                            .and_then(serde_json::Value::as_str)
                            .map(str::to_string),
                        SubjectKind::Charge => None,
                    },
                    // With `expand[]=data.latest_charge`, the charge says.
                    refunded: o
                        .pointer("/latest_charge/amount_refunded")
                        .and_then(serde_json::Value::as_i64)
                        .and_then(ours)
                        .unwrap_or(0),
                    currency,
                    trace: crate::provider::trace::Trace::read(&metadata),
                })
            })
            .collect();
        BooksPage {
            entries,
            next: self.next_from(from),
        }
    }

    /// This page as a page of disputes: the Disputes on it created in
    /// `[from, until)`, each in our terms ([`dispute`]; one it cannot read
    /// is left out), and the cursor of the next page, as for the books.
    pub fn disputes(&self, (from, until): (i64, i64)) -> crate::provider::DisputesPage {
        let disputes = self
            .data
            .iter()
            .filter(|o| created_of(o).is_some_and(|c| c >= from && c < until))
            .filter_map(|o| dispute(o.to_string().as_bytes()))
            .collect();
        crate::provider::DisputesPage {
            disputes,
            next: self.next_from(from),
        }
    }

    /// The cursor of the page after this one, for a window starting at
    /// `from`. Stripe lists newest first: a page that reaches below `from`
    /// is the last one needed (a list in the other order, as localstripe's,
    /// is read to its end).
    fn next_from(&self, from: i64) -> Option<String> {
        let (first, last) = (
            self.data.first().and_then(created_of),
            self.data.last().and_then(created_of),
        );
        let newest_first_and_done =
            matches!((first, last), (Some(f), Some(l)) if f > l && l < from);
        (self.has_more && !newest_first_and_done)
            .then(|| self.data.last()?.get("id")?.as_str().map(str::to_string))
            .flatten()
    }
}

/// A listed object's creation time, Unix seconds.
fn created_of(o: &serde_json::Value) -> Option<i64> {
    o.get("created").and_then(serde_json::Value::as_i64)
}

/// The events the adapter reads: the ones to enable on the Stripe
/// webhook endpoint (docs/providers/stripe.md, "Set up a Stripe account",
/// holds the same list; a test compares them). Any other is stored,
/// answered `200` and moves nothing.
pub const EVENTS: &[&str] = &[
    "payment_intent.succeeded",
    "payment_intent.payment_failed",
    "payment_intent.processing",
    "payment_intent.requires_action",
    "payment_intent.canceled",
    "payment_intent.amount_capturable_updated",
    "charge.refunded",
    "charge.refund.updated",
    "refund.created",
    "refund.updated",
    "refund.failed",
    "charge.dispute.created",
    "charge.dispute.updated",
    "charge.dispute.closed",
    "charge.dispute.funds_withdrawn",
    "charge.dispute.funds_reinstated",
];

/// What a Stripe event says: `payment_intent.*` is about the charge of
/// the attempt in its metadata; `refund.*` and `charge.refund.updated`
/// about the refund in its metadata (the Refund is the event's object);
/// `charge.refunded` about the refund of ours its charge lists where the
/// endpoint's API version embeds `refunds` (before 2022-11-15), and
/// otherwise a hint to read the charge's pending refunds (`refunds_of`,
/// its PaymentIntent). Events not in [`EVENTS`] are about nothing we hold.
pub fn event(payload: &serde_json::Value) -> crate::provider::Event {
    use crate::provider::{Event, Subject, SubjectKind};
    let Some(envelope) = crate::provider::Envelope::read(payload) else {
        return Event::unrecognised(payload);
    };
    let object = &envelope.data.object;
    if envelope.event_type.starts_with("charge.dispute.") {
        // A hint naming the Dispute: read from Stripe before anything.
        return Event {
            id: envelope.id,
            dispute: object
                .get("id")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            event_type: envelope.event_type,
            subject: None,
            refunds_of: None,
        };
    }
    let handled = EVENTS.contains(&envelope.event_type.as_str());
    let mut refunds_of = None;
    let (kind, object, key) = match envelope.event_type.split('.').next() {
        _ if !handled => (SubjectKind::Charge, None, ATTEMPT_KEY),
        Some("payment_intent") => (SubjectKind::Charge, Some(object), ATTEMPT_KEY),
        Some("refund") => (SubjectKind::Refund, Some(object), REFUND_KEY),
        // The charge's own word on one of its refunds: the Refund itself.
        Some("charge") if envelope.event_type == "charge.refund.updated" => {
            (SubjectKind::Refund, Some(object), REFUND_KEY)
        }
        Some("charge") if envelope.event_type == "charge.refunded" => {
            let ours = object
                .pointer("/refunds/data")
                .and_then(|d| d.as_array())
                .and_then(|refunds| {
                    refunds
                        .iter()
                        .find(|r| r.pointer(&format!("/metadata/{REFUND_KEY}")).is_some())
                });
            // Even where the charge embeds its refunds (endpoint versions
            // before 2022-11-15) only one is the subject: the charge's other
            // pending refunds are made due too.
            refunds_of = object
                .get("payment_intent")
                .and_then(|v| v.as_str())
                .map(str::to_string);
            (SubjectKind::Refund, ours, REFUND_KEY)
        }
        _ => (SubjectKind::Charge, None, ATTEMPT_KEY),
    };
    let subject = object.and_then(|o| {
        let CallOutcome::Known(state) = known(o.to_string().as_bytes()) else {
            return None;
        };
        Some(Subject {
            kind,
            state,
            our_id: o
                .pointer(&format!("/metadata/{key}"))
                .and_then(|v| v.as_str())
                .and_then(|v| Uuid::parse_str(v).ok()),
            amount: o
                .get("amount")
                .and_then(serde_json::Value::as_i64)
                .and_then(|a| {
                    let code = o
                        .get("currency")
                        .and_then(|v| v.as_str())
                        .unwrap_or_default();
                    super::units::from_stripe_code(a, code)
                }),
            currency: o
                .get("currency")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        })
    });
    Event {
        id: envelope.id,
        event_type: envelope.event_type,
        subject,
        refunds_of,
        dispute: None,
    }
}

/// Stripe's dispute statuses in ours: the `warning_*` ones (an inquiry,
/// before a chargeback) map onto the first two, and an inquiry closed
/// without a chargeback (`warning_closed`) is won. `prevented` (Disputes
/// API, the status's list; added with 2025-08-27.basil, "Add preventions
/// to Dispute") is a dispute closed before any chargeback by a prevention
/// the merchant's account runs, which resolves it by giving the customer
/// the money back (a Visa RDR resolution read `lost` before this status
/// existed): closed, the money gone, so `lost`, which holds the amount
/// back from oncepay's refunds (a refund of it would pay the customer
/// twice). `None` for a status this adapter does not know (a newer API's):
/// the dispute is stored all the same (`ProviderDispute::status`).
pub fn dispute_status(stripe: &str) -> Option<crate::domain::dispute::DisputeStatus> {
    use crate::domain::dispute::DisputeStatus::*;
    Some(match stripe {
        "warning_needs_response" | "needs_response" => NeedsResponse,
        "warning_under_review" | "under_review" => UnderReview,
        "warning_closed" | "won" => Won,
        "lost" | "prevented" => Lost,
        _ => return None,
    })
}

/// A Stripe Dispute (`GET /v1/disputes/{id}`) in our terms: its amount
/// converted from Stripe's units, its charge named as our payments record
/// it (the PaymentIntent, else the Charge). `None`: not a readable Dispute.
pub fn dispute(body: &[u8]) -> Option<crate::provider::ProviderDispute> {
    let o: serde_json::Value = serde_json::from_slice(body).ok()?;
    if o.get("object").and_then(|v| v.as_str()) != Some("dispute") {
        return None;
    }
    let text = |k: &str| o.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let id = text("id").filter(|i| !i.is_empty())?;
    let provider_status = text("status")?;
    let status = dispute_status(&provider_status);
    let currency = text("currency").unwrap_or_default();
    let amount = o
        .get("amount")
        .and_then(|v| v.as_i64())
        .and_then(|a| super::units::from_stripe_code(a, &currency))
        .filter(|a| *a >= 1)?;
    let charge = text("payment_intent").or_else(|| text("charge"))?;
    Some(crate::provider::ProviderDispute {
        id,
        charge,
        amount,
        status,
        // Stripe's inquiries (`warning_needs_response`, `warning_under_review`,
        // `warning_closed`) are the only statuses that withdrew nothing.
        inquiry: provider_status.starts_with("warning_"),
        provider_status,
        reason: text("reason").unwrap_or_else(|| "general".into()),
        evidence_due_by: o
            .pointer("/evidence_details/due_by")
            .and_then(|v| v.as_i64()),
    })
}

#[cfg(test)]
mod hold_tests {
    use super::*;

    fn status_of(body: serde_json::Value) -> Option<(PaymentStatus, Option<i64>, Option<i64>)> {
        match known(body.to_string().as_bytes()) {
            CallOutcome::Known(o) => Some((o.status, o.capture_before, o.amount_captured)),
            _ => None,
        }
    }

    /// A manual PaymentIntent in `status`, cancelled for `reason` if any.
    fn held(status: &str, reason: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "id": "pi_1", "object": "payment_intent", "status": status,
            "capture_method": "manual", "cancellation_reason": reason,
            "currency": "eur", "amount_received": 0, "created": 100,
        })
    }

    #[test]
    fn a_released_hold_says_who_cancelled_it_and_an_expiry_says_nothing() {
        let code_of =
            |reason: Option<&str>| match known(held("canceled", reason).to_string().as_bytes()) {
                CallOutcome::Known(o) => {
                    assert_eq!(o.status, PaymentStatus::Voided, "{reason:?}");
                    o.failure_code
                }
                other => panic!("{reason:?}: {other:?}"),
            };
        for reason in ["requested_by_customer", "fraudulent", "duplicate"] {
            assert_eq!(code_of(Some(reason)).as_deref(), Some(reason));
        }
        for expiry in [Some("automatic"), Some("expired"), None] {
            assert_eq!(code_of(expiry), None, "{expiry:?}");
        }
    }

    #[test]
    fn a_capture_stripe_refuses_fails_with_its_code_and_the_rest_stays_a_holds_answer() {
        let err = |kind: &str, code: &str| {
            format!(r#"{{"error":{{"type":"{kind}","code":"{code}","message":"m"}}}}"#)
        };
        let of = |status, retry, body: &str| match capture_answer(status, retry, body.as_bytes()) {
            Verdict::Done(CallOutcome::Known(o)) => format!(
                "{}:{}",
                o.status.as_str(),
                o.failure_code.unwrap_or_default()
            ),
            Verdict::Done(CallOutcome::Unknown(_)) => "unknown".into(),
            Verdict::Done(CallOutcome::NotFound) => "not_found".into(),
            Verdict::Retry(_) => "retry".into(),
            Verdict::Bug(_) => "bug".into(),
        };
        // Content errors Stripe documents for a capture: final, with its code.
        for code in ["amount_too_small", "charge_expired_for_capture"] {
            assert_eq!(
                of(400, None, &err("invalid_request_error", code)),
                format!("failed:{code}")
            );
        }
        let declined = r#"{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"m"}}"#;
        assert_eq!(of(402, None, declined), "failed:insufficient_funds");
        // The intent a refusal carries is the answer, as for a void.
        let refused = serde_json::json!({"error": {
            "type": "invalid_request_error", "code": "payment_intent_unexpected_state",
            "payment_intent": held("canceled", Some("automatic")),
        }});
        assert_eq!(of(400, None, &refused.to_string()), "voided:");
        // Not Stripe's word on the capture: as any write.
        assert_eq!(
            of(
                400,
                None,
                r#"{"error":{"type":"idempotency_error","message":"m"}}"#
            ),
            "bug"
        );
        assert_eq!(
            of(
                409,
                None,
                &err("invalid_request_error", "idempotency_key_in_use")
            ),
            "retry"
        );
        assert_eq!(
            of(429, None, &err("invalid_request_error", "lock_timeout")),
            "retry"
        );
        for status in [401, 403] {
            assert_eq!(
                of(status, None, &err("authentication_error", "")),
                "unknown"
            );
        }
        assert_eq!(
            of(400, Some(true), &err("invalid_request_error", "x")),
            "retry"
        );
        assert_eq!(of(400, None, "<html>bad</html>"), "unknown");
        assert_eq!(of(500, None, &err("api_error", "")), "retry");
        // A void's answer is unchanged: a bare 400 proves nothing there.
        assert!(matches!(
            hold_answer(
                400,
                None,
                err("invalid_request_error", "amount_too_small").as_bytes()
            ),
            Verdict::Done(CallOutcome::Unknown(_))
        ));
    }

    #[test]
    fn a_manual_intent_reads_as_a_hold_then_captured_or_released() {
        let intent = |status: &str, reason: Option<&str>| {
            serde_json::json!({
                "id": "pi_1", "object": "payment_intent", "status": status,
                "capture_method": "manual", "cancellation_reason": reason,
                "currency": "eur", "amount_received": 1000, "created": 100,
                "latest_charge": {"id": "ch_1", "amount_captured": 1000,
                    "payment_method_details": {"card": {"capture_before": 5000}}},
            })
        };
        assert_eq!(
            status_of(intent("requires_capture", None)),
            Some((PaymentStatus::RequiresCapture, Some(5000), None))
        );
        assert_eq!(
            status_of(intent("succeeded", None)),
            Some((PaymentStatus::Succeeded, None, Some(1000)))
        );
        for reason in ["automatic", "requested_by_customer"] {
            assert_eq!(
                status_of(intent("canceled", Some(reason))).map(|s| s.0),
                Some(PaymentStatus::Voided)
            );
        }
        assert_eq!(
            status_of(intent("canceled", Some("abandoned"))).map(|s| s.0),
            Some(PaymentStatus::Failed)
        );
        // Approved before oncepay's cancel took it (review N6): its charge
        // was authorized, so a hold was released, never an
        // authentication that expired.
        let mut approved = intent("canceled", Some("abandoned"));
        approved["latest_charge"]["status"] = serde_json::json!("succeeded");
        approved["latest_charge"]["captured"] = serde_json::json!(false);
        match known(approved.to_string().as_bytes()) {
            CallOutcome::Known(o) => {
                assert_eq!(o.status, PaymentStatus::Voided);
                assert_eq!(o.failure_code.as_deref(), Some(crate::provider::ABANDONED));
            }
            other => panic!("{other:?}"),
        }
        // Cancelled while it waited for its customer: no authorized charge.
        let mut waited = intent("canceled", Some("abandoned"));
        waited["latest_charge"] = serde_json::Value::Null;
        assert_eq!(status_of(waited).map(|s| s.0), Some(PaymentStatus::Failed));
        let mut unexpanded = intent("canceled", Some("abandoned"));
        unexpanded["latest_charge"] = serde_json::json!("ch_1");
        assert_eq!(
            status_of(unexpanded).map(|s| s.0),
            Some(PaymentStatus::Failed),
            "an id tells nothing"
        );
        let mut unexpanded = intent("requires_capture", None);
        unexpanded["latest_charge"] = serde_json::json!("ch_1");
        assert_eq!(
            status_of(unexpanded).and_then(|s| s.1),
            Some(100 + DOCUMENTED_WINDOW),
            "without the charge, Stripe's documented window"
        );
        let mut automatic = intent("requires_capture", None);
        automatic["capture_method"] = serde_json::json!("automatic");
        assert_eq!(status_of(automatic), None, "never held");
        let refused = serde_json::json!({"error": {
            "type": "invalid_request_error", "code": "payment_intent_unexpected_state",
            "payment_intent": intent("canceled", Some("automatic")),
        }});
        assert!(matches!(
            hold_answer(400, None, refused.to_string().as_bytes()),
            Verdict::Done(CallOutcome::Known(ProviderObject {
                status: PaymentStatus::Voided,
                ..
            }))
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CallKind::{Read, Write};

    fn outcome(kind: CallKind, status: u16, retry: Option<bool>, body: &str) -> String {
        match classify(kind, status, retry, body.as_bytes()) {
            Verdict::Retry(_) => "retry".into(),
            Verdict::Bug(_) => "bug".into(),
            Verdict::Done(CallOutcome::NotFound) => "not_found".into(),
            Verdict::Done(CallOutcome::Unknown(_)) => "unknown".into(),
            Verdict::Done(CallOutcome::Known(o)) => match o.failure_code {
                Some(code) => format!("{}:{code}", o.status.as_str()),
                None => o.status.as_str().into(),
            },
        }
    }

    fn intent(status: &str, error: &str) -> String {
        format!(
            r#"{{"id":"pi_1","object":"payment_intent","status":"{status}","last_payment_error":{error}}}"#
        )
    }

    #[test]
    fn dispute_statuses_map_warnings_onto_ours() {
        use crate::domain::dispute::DisputeStatus::*;
        for (stripe, ours) in [
            ("warning_needs_response", Some(NeedsResponse)),
            ("needs_response", Some(NeedsResponse)),
            ("warning_under_review", Some(UnderReview)),
            ("under_review", Some(UnderReview)),
            ("warning_closed", Some(Won)),
            ("won", Some(Won)),
            ("lost", Some(Lost)),
            ("prevented", Some(Lost)),
            ("charge_refunded", None),
            ("a_status_from_a_newer_api", None),
        ] {
            assert_eq!(dispute_status(stripe), ours, "{stripe}");
        }
    }

    #[test]
    fn a_dispute_is_read_in_our_units_with_its_payment_intent() {
        let body = r#"{"id":"dp_1","object":"dispute","amount":1000,"currency":"jpy","charge":"ch_1","payment_intent":"pi_1","status":"warning_needs_response","reason":"fraudulent","evidence_details":{"due_by":1700000000},"created":1690000000}"#;
        let d = dispute(body.as_bytes()).expect("a dispute");
        assert_eq!(d.id, "dp_1");
        assert_eq!(d.charge, "pi_1");
        assert_eq!(d.amount, 1000);
        assert_eq!(
            d.status,
            Some(crate::domain::dispute::DisputeStatus::NeedsResponse)
        );
        assert_eq!(d.provider_status, "warning_needs_response");
        // A status this adapter does not know is read all the same: stored
        // with its provider status, never refused.
        let newer = body.replace("warning_needs_response", "a_status_from_a_newer_api");
        let d = dispute(newer.as_bytes()).expect("a dispute");
        assert_eq!(d.status, None);
        assert_eq!(d.provider_status, "a_status_from_a_newer_api");
        assert!(!d.inquiry);
        assert_eq!(d.evidence_due_by, Some(1_700_000_000));
        assert_eq!(dispute(br#"{"id":"pi_1","object":"payment_intent"}"#), None);
        let event = event(&serde_json::json!({
            "id": "evt_1", "type": "charge.dispute.created",
            "data": {"object": {"id": "dp_1", "object": "dispute", "status": "needs_response"}}
        }));
        assert_eq!(event.dispute.as_deref(), Some("dp_1"));
        assert_eq!(event.subject, None);
    }

    #[test]
    fn a_page_of_disputes_is_read_in_our_terms_within_its_window() {
        let dispute = |id: &str, created: i64, status: &str| {
            serde_json::json!({
                "id": id, "object": "dispute", "amount": 1000, "currency": "eur",
                "charge": "ch_1", "payment_intent": "pi_1", "status": status,
                "reason": "fraudulent", "evidence_details": {"due_by": 1_700_000_000},
                "created": created,
            })
        };
        // Newest first, as Stripe lists: one past the window's end, one
        // unreadable (no amount), one below its start ends the paging.
        let mut unreadable = dispute("dp_2", 150, "needs_response");
        unreadable["amount"] = serde_json::Value::Null;
        let page: ListPage = serde_json::from_value(serde_json::json!({
            "object": "list",
            "data": [
                dispute("dp_4", 300, "needs_response"),
                dispute("dp_3", 200, "warning_under_review"),
                unreadable,
                dispute("dp_1", 50, "lost"),
            ],
            "has_more": true,
        }))
        .expect("a list");
        let read = page.disputes((100, 300));
        let ids: Vec<&str> = read.disputes.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["dp_3"]);
        assert_eq!(read.disputes[0].charge, "pi_1");
        assert!(read.disputes[0].inquiry);
        assert_eq!(read.next, None, "below the window's start: no more pages");
        // A page wholly inside the window, with more: the cursor is its last.
        let page: ListPage = serde_json::from_value(serde_json::json!({
            "data": [dispute("dp_4", 250, "under_review"), dispute("dp_3", 200, "won")],
            "has_more": true,
        }))
        .expect("a list");
        let read = page.disputes((100, 300));
        assert_eq!(read.disputes.len(), 2);
        assert_eq!(read.next.as_deref(), Some("dp_3"));
    }

    #[test]
    fn intents_map_to_our_statuses() {
        let declined = r#"{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds","message":"no"}"#;
        for (status, error, expected) in [
            ("succeeded", "null", "succeeded"),
            ("processing", "null", "pending"),
            ("requires_action", "null", "pending"),
            ("requires_confirmation", "null", "pending"),
            ("requires_payment_method", "null", "pending"),
            (
                "requires_payment_method",
                declined,
                "failed:insufficient_funds",
            ),
            ("canceled", "null", "failed:canceled"),
            ("requires_capture", "null", "unknown"),
            ("something_new", "null", "unknown"),
        ] {
            for kind in [Read, Write] {
                assert_eq!(
                    outcome(kind, 200, None, &intent(status, error)),
                    expected,
                    "{status} {kind:?}"
                );
            }
        }
        for (status, expected) in [
            ("succeeded", "succeeded"),
            ("pending", "pending"),
            ("requires_action", "pending"),
            ("failed", "failed:expired_or_canceled_card"),
            ("canceled", "failed"),
        ] {
            let body = format!(
                r#"{{"id":"re_1","object":"refund","status":"{status}","failure_reason":"expired_or_canceled_card"}}"#
            );
            let got = outcome(Read, 200, None, &body);
            assert!(got.starts_with(expected), "{status}: {got}");
        }
        assert_eq!(outcome(Read, 200, None, "<html>"), "unknown");
        assert_eq!(
            outcome(
                Read,
                200,
                None,
                r#"{"id":"ch_1","object":"charge","status":"succeeded"}"#
            ),
            "unknown"
        );
    }

    #[test]
    fn a_stripe_5xx_spends_its_key_and_nothing_else_does() {
        let err = |kind: &str| format!(r#"{{"error":{{"type":"{kind}","message":"m"}}}}"#);
        let api = err("api_error");
        assert!(spends_key(500, Some(false), api.as_bytes()));
        assert!(
            spends_key(500, None, api.as_bytes()),
            "a replay need not carry the header"
        );
        assert!(spends_key(503, None, api.as_bytes()));
        assert!(
            !spends_key(500, Some(true), api.as_bytes()),
            "Stripe asks for a retry: the key is worth repeating"
        );
        assert!(
            !spends_key(502, None, b"<html>bad gateway</html>"),
            "not Stripe's answer"
        );
        for status in [400, 401, 402, 404, 409, 429] {
            assert!(
                !spends_key(status, Some(false), err("invalid_request_error").as_bytes()),
                "{status}"
            );
        }
        assert!(!spends_key(
            200,
            None,
            br#"{"id":"pi_1","object":"payment_intent","status":"succeeded"}"#
        ));
    }

    #[test]
    fn the_table_of_errors() {
        let err = |kind: &str, code: &str| {
            format!(r#"{{"error":{{"type":"{kind}","code":"{code}","message":"m"}}}}"#)
        };
        let card = err("card_error", "card_declined");
        // A decline is a fact only where money could have moved.
        assert_eq!(outcome(Write, 402, None, &card), "failed:card_declined");
        assert_eq!(outcome(Read, 402, None, &card), "unknown");
        // A 402 that is not a card error proves nothing (localstripe's
        // invalid_request_error included: the layer reshapes it).
        assert_eq!(
            outcome(
                Write,
                402,
                None,
                &err("invalid_request_error", "card_declined")
            ),
            "unknown"
        );
        assert_eq!(
            outcome(
                Read,
                404,
                None,
                &err("invalid_request_error", "resource_missing")
            ),
            "not_found"
        );
        assert_eq!(
            outcome(
                Write,
                404,
                None,
                &err("invalid_request_error", "resource_missing")
            ),
            "unknown"
        );
        assert_eq!(
            outcome(
                Write,
                400,
                None,
                r#"{"error":{"type":"idempotency_error","message":"m"}}"#
            ),
            "bug"
        );
        assert_eq!(
            outcome(
                Write,
                409,
                None,
                &err("invalid_request_error", "idempotency_key_in_use")
            ),
            "retry"
        );
        assert_eq!(
            outcome(
                Write,
                429,
                None,
                &err("invalid_request_error", "lock_timeout")
            ),
            "retry"
        );
        assert_eq!(
            outcome(Read, 429, None, &err("invalid_request_error", "rate_limit")),
            "retry"
        );
        assert_eq!(outcome(Write, 500, None, &err("api_error", "")), "retry");
        assert_eq!(outcome(Write, 503, None, "garbage"), "retry");
        // Stripe-Should-Retry is honoured both ways.
        assert_eq!(
            outcome(Write, 500, Some(false), &err("api_error", "")),
            "unknown"
        );
        assert_eq!(
            outcome(Write, 400, Some(true), &err("invalid_request_error", "x")),
            "retry"
        );
        // A credential outage is never a decline, for a write or a read.
        for kind in [Read, Write] {
            for status in [401, 403] {
                assert_eq!(
                    outcome(kind, status, None, &err("invalid_request_error", "")),
                    "unknown"
                );
            }
        }
        assert_eq!(
            outcome(
                Write,
                400,
                None,
                &err("invalid_request_error", "parameter_missing")
            ),
            "unknown"
        );
        assert_eq!(outcome(Write, 302, None, ""), "unknown");
    }

    #[test]
    fn a_refund_stripe_refuses_fails_and_the_rest_stays_the_table() {
        let err = |kind: &str, code: &str| {
            format!(r#"{{"error":{{"type":"{kind}","code":"{code}","message":"m"}}}}"#)
        };
        let of = |status, retry, body: &str| match refund_creation(status, retry, body.as_bytes()) {
            Verdict::Done(CallOutcome::Known(o)) => {
                format!(
                    "{}:{}",
                    o.status.as_str(),
                    o.failure_code.unwrap_or_default()
                )
            }
            Verdict::Done(CallOutcome::Unknown(_)) => "unknown".into(),
            Verdict::Done(CallOutcome::NotFound) => "not_found".into(),
            Verdict::Retry(_) => "retry".into(),
            Verdict::Bug(_) => "bug".into(),
        };
        for code in [
            "charge_already_refunded",
            "charge_disputed",
            "amount_too_large",
            "refund_disputed_payment",
        ] {
            assert_eq!(
                of(400, None, &err("invalid_request_error", code)),
                format!("failed:{code}")
            );
        }
        assert_eq!(
            of(404, None, &err("invalid_request_error", "resource_missing")),
            "failed:resource_missing"
        );
        assert_eq!(
            of(
                400,
                None,
                r#"{"error":{"type":"invalid_request_error","message":"m"}}"#
            ),
            "failed:invalid_request_error"
        );
        assert_eq!(
            of(
                400,
                None,
                r#"{"error":{"type":"idempotency_error","message":"m"}}"#
            ),
            "bug"
        );
        assert_eq!(
            of(
                409,
                None,
                &err("invalid_request_error", "idempotency_key_in_use")
            ),
            "retry"
        );
        assert_eq!(
            of(429, None, &err("invalid_request_error", "lock_timeout")),
            "retry"
        );
        for status in [401, 403] {
            assert_eq!(
                of(status, None, &err("authentication_error", "")),
                "unknown"
            );
        }
        // Stripe's own "retry" wins; a page that is not Stripe's proves nothing.
        assert_eq!(
            of(400, Some(true), &err("invalid_request_error", "x")),
            "retry"
        );
        assert_eq!(of(403, None, "<html>blocked</html>"), "unknown");
        assert_eq!(of(400, None, "<html>bad</html>"), "unknown");
        assert_eq!(of(500, None, &err("api_error", "")), "retry");
    }

    #[test]
    fn the_setup_guide_enables_exactly_the_events_the_adapter_reads() {
        let guide = include_str!("../../../../../docs/providers/stripe.md");
        let start = guide
            .find("<!-- stripe-events -->")
            .expect("the list's start");
        let end = guide
            .find("<!-- /stripe-events -->")
            .expect("the list's end");
        let listed: Vec<&str> = guide[start..end]
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- `"))
            .filter_map(|l| l.strip_suffix('`'))
            .collect();
        assert_eq!(listed, EVENTS);
    }

    #[test]
    fn every_refund_event_shape_names_the_refund_or_its_charge() {
        let refund = serde_json::json!({"id": "re_1", "object": "refund", "status": "failed",
            "failure_reason": "expired_or_canceled_card", "amount": 500, "currency": "eur",
            "metadata": {"oncepay_refund_id": "01a21b2b-d4a7-7190-bd66-427805d8227a"}});
        for kind in ["refund.failed", "refund.updated", "charge.refund.updated"] {
            let e = event(
                &serde_json::json!({"id": "evt_1", "type": kind, "data": {"object": refund}}),
            );
            let subject = e.subject.expect(kind);
            assert_eq!(subject.kind, crate::provider::SubjectKind::Refund, "{kind}");
            assert_eq!(subject.state.status, PaymentStatus::Failed, "{kind}");
            assert_eq!(
                subject.state.failure_code.as_deref(),
                Some("expired_or_canceled_card")
            );
        }
        // Since 2022-11-15 a charge embeds no refunds: a hint about its intent.
        let charge = serde_json::json!({"id": "ch_1", "object": "charge", "payment_intent": "pi_1",
            "amount_refunded": 500});
        let e = event(
            &serde_json::json!({"id": "evt_2", "type": "charge.refunded", "data": {"object": charge}}),
        );
        assert!(e.subject.is_none());
        assert_eq!(e.refunds_of.as_deref(), Some("pi_1"));
        // An event the endpoint should not send is about nothing.
        let e = event(
            &serde_json::json!({"id": "evt_3", "type": "payment_intent.created",
            "data": {"object": {"id": "pi_1", "object": "payment_intent", "status": "requires_payment_method"}}}),
        );
        assert!(e.subject.is_none() && e.refunds_of.is_none());
    }
}
