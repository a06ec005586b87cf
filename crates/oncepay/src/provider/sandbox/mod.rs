//! The sandbox (`oncepay sandbox`, contract section 7), oncepay's own test
//! provider: charges in one call (`POST /v1/charges`, our attempt id as the
//! `Idempotency-Key`), finds a charge or refund by that key (so its "no
//! such charge" can be trusted: nothing it holds escapes the lookup), takes
//! `tok_…` payment methods and signs webhooks with Standard Webhooks.

mod card;
pub mod classify;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use self::card::TokenizedCard;
use self::classify::{classify, Object};
use super::call::{BuildError, Caller};
use super::card_form::CardForm;
use super::classify::CallKind;
use super::trace::Trace;
use super::{
    BookEntry, BooksPage, BoxFuture, CallOutcome, CaptureRequest, ChargeRequest, DisputeRead,
    DisputesPage, Envelope, Event, Headers, Health, Opened, PaymentProvider, RefundRequest, Sent,
    Subject, SubjectKind,
};
use crate::metrics::Metrics;
use crate::standard_webhooks::WebhookSecret;

/// The name stored on attempts and used in `/webhooks/sandbox`.
pub const NAME: &str = "sandbox";

/// The sandbox adapter.
pub struct Sandbox {
    caller: Caller,
    base_url: String,
    webhook_secret: WebhookSecret,
    /// The checkout's card form, posting to `POST /v1/tokens` as
    /// customers' browsers reach it.
    card: TokenizedCard,
}

impl Sandbox {
    /// An adapter for the sandbox at `base_url`, verifying its webhooks
    /// with `webhook_secret`; each request waits `timeout` at most, and
    /// every call ends within its share of the commands' `lease`
    /// (`call::RetryPolicy::new`).
    pub fn new(
        (base_url, public_url): (&str, &str),
        webhook_secret: WebhookSecret,
        (timeout, lease): (Duration, Duration),
        metrics: Arc<Metrics>,
    ) -> Result<Self, BuildError> {
        Ok(Sandbox {
            caller: Caller::new(NAME, timeout, lease, metrics)?,
            base_url: base_url.trim_end_matches('/').to_string(),
            webhook_secret,
            card: TokenizedCard::new(format!("{}/v1/tokens", public_url.trim_end_matches('/'))),
        })
    }

    async fn read(&self, operation: &'static str, url: String) -> CallOutcome {
        self.caller
            .call(
                operation,
                |c| c.get(&url),
                |s, _, b| classify(CallKind::Read, s, b),
            )
            .await
    }
}

/// A `tok_` token: up to 255 visible ASCII characters.
pub(crate) fn check_token(payment_method: &str) -> Result<(), &'static str> {
    let valid = payment_method.starts_with("tok_")
        && payment_method.len() <= 255
        && payment_method.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if valid {
        Ok(())
    } else {
        Err("must be a provider token: tok_ followed by up to 251 visible ASCII characters")
    }
}

/// An event's charge or refund: the object, with our key and its money.
#[derive(Deserialize)]
struct EventObject {
    #[serde(flatten)]
    object: Object,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    amount: Option<i64>,
    #[serde(default)]
    currency: Option<String>,
}

/// What a sandbox event says (`charge.*`, `refund.*`).
pub(crate) fn parse_event(payload: &Value) -> Event {
    let Some(envelope) = Envelope::read(payload) else {
        return Event::unrecognised(payload);
    };
    if envelope.event_type.starts_with("charge.dispute.") {
        // A hint naming the dispute: read from the sandbox before anything.
        let dispute = envelope
            .data
            .object
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string);
        return Event {
            id: envelope.id,
            event_type: envelope.event_type,
            subject: None,
            dispute,
            refunds_of: None,
        };
    }
    let kind = match envelope.event_type.split('.').next() {
        Some("charge") => Some(SubjectKind::Charge),
        Some("refund") => Some(SubjectKind::Refund),
        _ => None,
    };
    let subject = kind.and_then(|kind| {
        let o: EventObject = serde_json::from_value(envelope.data.object).ok()?;
        Some(Subject {
            kind,
            state: o.object.to_provider_object()?,
            our_id: o
                .idempotency_key
                .as_deref()
                .and_then(|k| Uuid::parse_str(k).ok()),
            amount: o.amount,
            currency: o.currency,
        })
    });
    Event {
        id: envelope.id,
        event_type: envelope.event_type,
        subject,
        refunds_of: None,
        dispute: None,
    }
}

impl PaymentProvider for Sandbox {
    fn name(&self) -> &str {
        NAME
    }

    fn health(&self) -> &Health {
        self.caller.health()
    }

    fn check_payment_method(&self, payment_method: &str) -> Result<(), &'static str> {
        check_token(payment_method)
    }

    fn example_payment_method(&self) -> &'static str {
        "tok_visa"
    }

    fn test_mode(&self) -> bool {
        true
    }

    fn card_form(&self) -> Option<&dyn CardForm> {
        Some(&self.card)
    }

    fn open_charge<'a>(&'a self, _: &'a ChargeRequest) -> BoxFuture<'a, Opened> {
        Box::pin(async { Opened::NotNeeded })
    }

    // The sandbox keeps no error under a key (a charge it did not make
    // is found by the key, and sent again under it): its keys are never
    // spent, and `key_generation` is always 0.
    fn charge<'a>(&'a self, r: &'a ChargeRequest, _: Option<&'a str>) -> BoxFuture<'a, Sent> {
        let url = format!("{}/v1/charges", self.base_url);
        Box::pin(async move {
            let outcome = self
                .caller
                .call(
                    "charge",
                    move |client| {
                        client
                            .post(&url)
                            .header("Idempotency-Key", r.idempotency_key.to_string())
                            .json(&json!({
                                "amount": r.amount,
                                "currency": r.currency,
                                "source": r.payment_method,
                                "metadata": r.trace.metadata_json(),
                                "return_url": r.return_url,
                                "capture": r.capture_method == crate::domain::payment::CaptureMethod::Automatic,
                            }))
                    },
                    |s, _, b| classify(CallKind::Write, s, b),
                )
                .await;
            Sent::from(outcome)
        })
    }

    fn find_charge<'a>(&'a self, key: Uuid, _: Option<&'a str>) -> BoxFuture<'a, CallOutcome> {
        let url = format!("{}/v1/charges?idempotency_key={key}", self.base_url);
        Box::pin(self.read("find_charge", url))
    }

    fn abandon<'a>(&'a self, key: Uuid, reference: Option<&'a str>) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move {
            let Some(charge) = reference else {
                // Never created at the sandbox: nothing to cancel, nothing
                // to approve later.
                return self.find_charge(key, None).await;
            };
            let url = format!("{}/v1/charges/{charge}/cancel", self.base_url);
            self.caller
                .call(
                    "abandon",
                    move |client| client.post(&url),
                    |s, _, b| classify(CallKind::Write, s, b),
                )
                .await
        })
    }

    fn refund<'a>(&'a self, r: &'a RefundRequest) -> BoxFuture<'a, Sent> {
        let url = format!("{}/v1/refunds", self.base_url);
        Box::pin(async move {
            let outcome = self
                .caller
                .call(
                    "refund",
                    move |client| {
                        client
                            .post(&url)
                            .header("Idempotency-Key", r.idempotency_key.to_string())
                            .json(&json!({
                                "charge": r.charge_id,
                                "amount": r.amount,
                                "metadata": r.trace.metadata_json(),
                            }))
                    },
                    |s, _, b| classify(CallKind::Write, s, b),
                )
                .await;
            Sent::from(outcome)
        })
    }

    fn captures_later(&self) -> bool {
        true
    }

    fn capture<'a>(&'a self, r: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        let url = format!("{}/v1/charges/{}/capture", self.base_url, r.charge_id);
        Box::pin(self.caller.call(
            "capture",
            move |client| {
                client
                    .post(&url)
                    .header("Idempotency-Key", r.idempotency_key.to_string())
                    .json(&json!({ "amount": r.amount }))
            },
            |s, _, b| classify::classify_capture(s, b),
        ))
    }

    fn find_capture<'a>(&'a self, r: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        let url = format!("{}/v1/charges/{}", self.base_url, r.charge_id);
        Box::pin(async move {
            match self.read("find_capture", url).await {
                // Still held: the capture never happened, and sending it
                // again (same key) is safe.
                CallOutcome::Known(o)
                    if o.status == crate::domain::payment::PaymentStatus::RequiresCapture =>
                {
                    CallOutcome::NotFound
                }
                // The charge named by an authorized attempt exists: a 404
                // proves nothing about a capture.
                CallOutcome::NotFound => {
                    CallOutcome::Unknown("the authorized charge is not found".into())
                }
                other => other,
            }
        })
    }

    fn void<'a>(&'a self, payment_id: Uuid, charge_id: &'a str) -> BoxFuture<'a, CallOutcome> {
        let url = format!("{}/v1/charges/{charge_id}/void", self.base_url);
        Box::pin(self.caller.call(
            "void",
            move |client| {
                client
                    .post(&url)
                    .header("Idempotency-Key", format!("void_{payment_id}"))
            },
            |s, _, b| classify::classify_hold(s, b),
        ))
    }

    fn find_refund<'a>(
        &'a self,
        r: &'a RefundRequest,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        let url = format!(
            "{}/v1/refunds?idempotency_key={}",
            self.base_url, r.idempotency_key
        );
        Box::pin(self.read("find_refund", url))
    }

    fn find_dispute<'a>(&'a self, id: &'a str) -> BoxFuture<'a, DisputeRead> {
        let url = format!("{}/v1/disputes/{id}", self.base_url);
        Box::pin(async move {
            let read = self
                .caller
                .read_object(
                    "find_dispute",
                    |c| c.get(&url),
                    |s, _, b| classify(CallKind::Read, s, b),
                )
                .await;
            match read {
                Ok(Some(body)) => match classify::dispute(&body) {
                    Some(dispute) => DisputeRead::Known(dispute),
                    None => DisputeRead::Unknown("unreadable sandbox dispute".into()),
                },
                Ok(None) => DisputeRead::NotFound,
                Err(reason) => DisputeRead::Unknown(reason),
            }
        })
    }

    fn probe(&self) -> BoxFuture<'_, CallOutcome> {
        // A charge that cannot exist: "no such charge" is an answer.
        let url = format!(
            "{}/v1/charges?idempotency_key={}",
            self.base_url,
            Uuid::nil()
        );
        Box::pin(self.read("probe", url))
    }

    fn verify_webhook(
        &self,
        headers: Headers<'_>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Option<String>, String> {
        let id = headers("webhook-id");
        self.webhook_secret
            .verify(
                id.as_deref(),
                headers("webhook-timestamp").as_deref(),
                headers("webhook-signature").as_deref(),
                body,
                now_unix,
            )
            .map_err(|e| e.to_string())?;
        Ok(id)
    }

    fn parse_event(&self, payload: &Value) -> Event {
        parse_event(payload)
    }

    fn list_books<'a>(
        &'a self,
        kind: SubjectKind,
        (from, until): (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BooksPage, String>> {
        let what = match kind {
            SubjectKind::Charge => "charges",
            SubjectKind::Refund => "refunds",
        };
        let mut url = format!(
            "{}/v1/{what}?created[gte]={from}&created[lt]={until}&limit=100",
            self.base_url
        );
        if let Some(after) = after {
            url.push_str(&format!("&starting_after={after}"));
        }
        Box::pin(async move {
            let body = self
                .caller
                .read_body(
                    "list_books",
                    |c| c.get(&url),
                    |s, _, b| classify(CallKind::Read, s, b),
                )
                .await?;
            books_page(kind, &body)
        })
    }

    fn list_disputes<'a>(
        &'a self,
        (from, until): (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputesPage, String>> {
        let mut url = format!(
            "{}/v1/disputes?created[gte]={from}&created[lt]={until}&limit=100",
            self.base_url
        );
        if let Some(after) = after {
            url.push_str(&format!("&starting_after={after}"));
        }
        Box::pin(async move {
            let body = self
                .caller
                .read_body(
                    "list_disputes",
                    |c| c.get(&url),
                    |s, _, b| classify(CallKind::Read, s, b),
                )
                .await?;
            disputes_page(&body)
        })
    }
}

/// A listed charge or refund.
#[derive(Deserialize)]
struct Listed {
    #[serde(flatten)]
    object: Object,
    amount: i64,
    #[serde(default)]
    currency: Option<String>,
    created: i64,
    #[serde(default)]
    charge: Option<String>,
    #[serde(default)]
    amount_refunded: i64,
    #[serde(default)]
    metadata: Value,
}

#[derive(Deserialize)]
struct List {
    data: Vec<Listed>,
    has_more: bool,
}

/// A page of the sandbox's list in our terms. A refund's currency is its
/// charge's: the row it is checked against says it.
fn books_page(kind: SubjectKind, body: &[u8]) -> Result<BooksPage, String> {
    let list: List =
        serde_json::from_slice(body).map_err(|e| format!("unreadable sandbox list: {e}"))?;
    let next = list
        .has_more
        .then(|| list.data.last().map(|o| o.object.id.clone()))
        .flatten();
    let entries = list
        .data
        .into_iter()
        .filter_map(|o| {
            Some(BookEntry {
                kind,
                state: o.object.to_provider_object()?,
                amount: o.amount,
                currency: o.currency.unwrap_or_default().to_ascii_uppercase(),
                created: o.created,
                charge: o.charge,
                refunded: o.amount_refunded,
                trace: Trace::read_json(&o.metadata),
            })
        })
        .collect();
    Ok(BooksPage { entries, next })
}

/// A page of the sandbox's disputes.
#[derive(Deserialize)]
struct DisputeList {
    data: Vec<Value>,
    has_more: bool,
}

/// A page of the sandbox's disputes in our terms; one it cannot read is
/// left out.
fn disputes_page(body: &[u8]) -> Result<DisputesPage, String> {
    let list: DisputeList =
        serde_json::from_slice(body).map_err(|e| format!("unreadable sandbox list: {e}"))?;
    let next = list
        .has_more
        .then(|| list.data.last()?.get("id")?.as_str().map(str::to_string))
        .flatten();
    let disputes = list
        .data
        .iter()
        .filter_map(|d| classify::dispute(d.to_string().as_bytes()))
        .collect();
    Ok(DisputesPage { disputes, next })
}
