//! Payment providers. Each provider is one adapter module that owns its
//! protocol: how requests are encoded, what every answer proves (its own
//! table, under the rules of [`classify`]), how its statuses map to ours,
//! which payment methods it takes, how its webhooks are signed, what its
//! events say and how the checkout page takes its cards ([`card_form`]).
//! The commands, the reconciler, the webhook path and the checkout page
//! speak only the vocabulary of this module.
//!
//! - [`sandbox`]: oncepay's own test provider (`oncepay sandbox`).
//! - [`stripe`]: Stripe's PaymentIntents API.
//! - [`balance`]: the customer's balance on oncepay's own ledger
//!   (`payment_method: "balance"`), always registered, never
//!   `ONCEPAY_PROVIDER`.
//!
//! [`Providers`] is the registry, keyed by name: a payment attempt stores
//! the name of the provider it was made with, and is charged, looked up,
//! reconciled, refunded and confirmed with that provider whatever
//! `ONCEPAY_PROVIDER` says today, so switching providers strands nothing.
//!
//! Every charge and refund carries our own id (attempt or refund) in the
//! provider's idempotency key, so repeating a call never repeats its effect.
//! A call whose outcome we cannot know (timeout, dropped connection) says so
//! with [`CallOutcome::Unknown`]: it is never taken for a failure.

pub mod balance;
pub mod call;
pub mod card_form;
pub mod classify;
pub mod sandbox;
pub mod stripe;
pub mod trace;

/// The `failure_code` an adapter reports on a hold it reads `voided`
/// because oncepay gave up on it ([`PaymentProvider::abandon`]) after its
/// customer approved it: the cancel released an authorization, and the
/// payment reads `void_reason: abandoned`, never `authentication_expired`
/// (`domain::settlement::release_reason`). Stripe's own word for the
/// cancel (`cancellation_reason=abandoned`), kept as the vocabulary of all
/// adapters.
pub const ABANDONED: &str = "abandoned";

/// Every provider oncepay speaks, by name: `ONCEPAY_PROVIDER`'s values and
/// the labels its metrics start at 0 with (`Metrics::know_providers`,
/// called by startup). A new adapter adds its name here.
pub const NAMES: &[&str] = &[sandbox::NAME, stripe::NAME];

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use self::card_form::CardForm;
use crate::domain::money::Currency;
use crate::domain::payment::PaymentStatus;

/// A boxed future, so the trait can be used as `dyn PaymentProvider`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A charge to make (or to repeat, with the same key).
#[derive(Debug, Clone)]
pub struct ChargeRequest {
    /// Our payment attempt id, from which the provider's idempotency keys
    /// are derived.
    pub idempotency_key: Uuid,
    /// Which of the attempt's keys the charge is sent under: 0, the key
    /// it always had, unless its provider spent a key on an error it keeps
    /// ([`Sent::key_spent`]) and a read then proved nothing was charged;
    /// each later generation is recorded on the attempt before it is used
    /// (`store::provider_keys`). Providers whose keys never keep an error
    /// (the sandbox, the balance) only ever see 0.
    pub key_generation: i32,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The client's payment method, in the provider's form
    /// ([`PaymentProvider::check_payment_method`]).
    pub payment_method: String,
    /// Where it came from, written into the provider's metadata.
    pub trace: trace::Trace,
    /// Where the customer comes back after acting at their bank.
    pub return_url: Option<String>,
    /// `manual`: authorize only; the charge waits for [`PaymentProvider::capture`].
    pub capture_method: crate::domain::payment::CaptureMethod,
}

/// A capture of an authorized charge (or its repeat, with the same key).
#[derive(Debug, Clone)]
pub struct CaptureRequest {
    /// Our capture's id: the provider's idempotency key for it, never
    /// derived from the amount.
    pub idempotency_key: Uuid,
    /// The payment attempt captured.
    pub payment_id: Uuid,
    /// The provider's id of the authorized charge, as the attempt records it.
    pub charge_id: String,
    /// Minor units, at most what was authorized.
    pub amount: i64,
    /// The payment's ISO 4217 code (the unit of `amount`).
    pub currency: String,
}

/// A refund to make (or to repeat, with the same key), or to look up.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    /// Our refund id, from which the provider's idempotency key is derived.
    pub idempotency_key: Uuid,
    /// Which of the refund's keys it is sent under, as
    /// [`ChargeRequest::key_generation`]: 0 for a first send; a send after
    /// a read takes the refund row's.
    pub key_generation: i32,
    /// The provider's id of the charge refunded.
    pub charge_id: String,
    /// Minor units.
    pub amount: i64,
    /// The payment's ISO 4217 code (the unit of `amount`).
    pub currency: String,
    /// Where it came from, written into the provider's metadata.
    pub trace: trace::Trace,
}

/// What the provider reports about one charge or refund, in our terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderObject {
    /// The provider's id (`ch_…`, `pi_…`, `re_…`); empty when the answer
    /// (a decline) named none.
    pub id: String,
    /// Its status in the provider's books.
    pub status: PaymentStatus,
    /// Why it failed. For a hold released (`voided`): the provider's
    /// reason when someone cancelled it (Stripe's `cancellation_reason`,
    /// `requested_by_customer`, `fraudulent`, `duplicate`), `None` when it
    /// lapsed (an expiry); settling tells oncepay's own void from a cancel
    /// at the provider (`domain::settlement::release_reason`).
    pub failure_code: Option<String>,
    /// A readable reason.
    pub failure_message: Option<String>,
    /// For a pending charge that waits for its customer (3-D Secure): where
    /// to send them.
    pub next_action: Option<crate::domain::payment::NextAction>,
    /// For an authorized charge (`requires_capture`): until when it can be
    /// captured, Unix seconds, where the provider says.
    pub capture_before: Option<i64>,
    /// For a captured charge: how much was captured, where the provider
    /// says (`None`: the whole amount).
    pub amount_captured: Option<i64>,
}

impl ProviderObject {
    /// An object of `id` in `status`, with no other facts.
    pub fn bare(id: impl Into<String>, status: PaymentStatus) -> ProviderObject {
        ProviderObject {
            id: id.into(),
            status,
            failure_code: None,
            failure_message: None,
            next_action: None,
            capture_before: None,
            amount_captured: None,
        }
    }
}

/// The result of a provider call, after the adapter's table decided what
/// the answer proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider answered with the object's state.
    Known(ProviderObject),
    /// For a lookup: the provider holds nothing that can have moved money
    /// for this attempt or refund, so sending it (again, with the same key)
    /// is safe. Each adapter says when it can trust that.
    NotFound,
    /// We cannot know what happened (timeout, dropped connection, 5xx after
    /// retries, a refused or unreadable answer). The effect may or may not
    /// exist; only a later look can tell.
    Unknown(String),
}

/// What sending a charge or a refund came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// What the answer proves.
    pub outcome: CallOutcome,
    /// The provider's last answer under the send's idempotency key was an
    /// error it keeps for that key and replays to every repeat (Stripe
    /// saves a `500` under the key), and the outcome is unknown: the key
    /// can tell nothing more, and re-sending it would stay unknown until
    /// the provider forgets the key (Stripe: a day), then act late. Once a
    /// read proves the send made nothing, it is sent again under the next
    /// generation of keys. Never set by a provider that keeps no error
    /// under a key (the sandbox, the balance).
    pub key_spent: bool,
}

impl From<CallOutcome> for Sent {
    /// An answer that spends no key.
    fn from(outcome: CallOutcome) -> Sent {
        Sent {
            outcome,
            key_spent: false,
        }
    }
}

/// The first phase of a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// The provider charges in one call ([`PaymentProvider::charge`]).
    NotNeeded,
    /// The provider created an object that moves no money until confirmed
    /// (a Stripe PaymentIntent): its id must be recorded before the charge
    /// confirms it, so that no retry can ever charge through another one.
    Created(String),
    /// The provider refused to create it (a fact: nothing can be charged),
    /// or the outcome is unknown.
    Settled(CallOutcome),
}

/// What a provider event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// A charge (one payment attempt).
    Charge,
    /// A refund.
    Refund,
}

/// What an event says about a charge or refund: a hint, never applied as
/// it is (see `inbound`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// A charge or a refund.
    pub kind: SubjectKind,
    /// Its state, as the event tells it.
    pub state: ProviderObject,
    /// Our attempt or refund id, as the provider object carries it.
    pub our_id: Option<Uuid>,
    /// Minor units, if the event says.
    pub amount: Option<i64>,
    /// ISO 4217 code, if the event says.
    pub currency: Option<String>,
}

/// A provider event, parsed by its adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The provider's event id.
    pub id: Option<String>,
    /// The provider's event type (`charge.succeeded`, `payment_intent.succeeded`).
    pub event_type: String,
    /// The charge or refund it is about, if it is about one we handle.
    pub subject: Option<Subject>,
    /// A charge (the provider's id, as we record it) whose refunds
    /// changed, when the event does not say which (Stripe's
    /// `charge.refunded` since 2022-11-15 embeds no refunds): a hint to
    /// read that charge's pending refunds now.
    pub refunds_of: Option<String>,
    /// For a dispute event (`charge.dispute.*`): the provider's id of the
    /// dispute, to be read from the provider ([`PaymentProvider::find_dispute`]);
    /// nothing else of the event is trusted.
    pub dispute: Option<String>,
}

/// A dispute as the provider reports it, in our terms (the adapter maps
/// its statuses and units).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderDispute {
    /// The provider's id (`dp_…`).
    pub id: String,
    /// The provider's id of the disputed charge, as our payment records it
    /// (`provider_charge_id`: Stripe's PaymentIntent, the sandbox's charge).
    pub charge: String,
    /// Minor units.
    pub amount: i64,
    /// In our terms; `None` for a status its adapter does not know (a
    /// newer API's): the dispute is stored all the same, with its
    /// `provider_status`, held open when new
    /// (`DisputeStatus::UNRECOGNISED`), and counted for an operator
    /// (`oncepay_dispute_statuses_unrecognised_total`).
    pub status: Option<crate::domain::dispute::DisputeStatus>,
    /// The provider's own status.
    pub provider_status: String,
    /// An inquiry, not a chargeback (Stripe's `warning_*`): the bank took
    /// no money, so it holds nothing back from refunds (refunding is how a
    /// merchant closes one). Each adapter says what its provider calls one.
    pub inquiry: bool,
    /// The bank's reason.
    pub reason: String,
    /// When evidence is due, Unix seconds, if the provider says.
    pub evidence_due_by: Option<i64>,
}

/// What reading a dispute from its provider came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DisputeRead {
    /// The provider's dispute.
    Known(ProviderDispute),
    /// The provider holds no dispute of this id.
    NotFound,
    /// The provider could not be asked, or its answer proves nothing.
    Unknown(String),
}

/// The envelope both providers' events share: `{id, type, data: {object}}`.
#[derive(Debug, serde::Deserialize)]
pub struct Envelope {
    /// The provider's event id.
    #[serde(default)]
    pub id: Option<String>,
    /// The event type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// What the event carries.
    pub data: EnvelopeData,
}

/// An envelope's `data`.
#[derive(Debug, serde::Deserialize)]
pub struct EnvelopeData {
    /// The object the event is about, as the provider saw it.
    pub object: Value,
}

impl Envelope {
    /// The envelope of a verified event; `None` for a shape no adapter
    /// reads (see [`Event::unrecognised`]).
    pub fn read(payload: &Value) -> Option<Envelope> {
        serde_json::from_value(payload.clone()).ok()
    }
}

impl Event {
    /// A verified event of a shape no adapter reads: recorded as
    /// `unrecognised` (kept, never lost), about nothing.
    pub fn unrecognised(payload: &Value) -> Event {
        Event {
            id: payload
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string),
            event_type: "unrecognised".into(),
            subject: None,
            refunds_of: None,
            dispute: None,
        }
    }
}

/// One charge or refund in a provider's books, as its list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BookEntry {
    /// A charge or a refund.
    pub kind: SubjectKind,
    /// Its id and state.
    pub state: ProviderObject,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code, upper case.
    pub currency: String,
    /// When the provider created it, Unix seconds.
    pub created: i64,
    /// For a refund: the provider's id of the charge refunded.
    pub charge: Option<String>,
    /// For a charge: how much of it is refunded already (0 if the list
    /// does not say).
    pub refunded: i64,
    /// What oncepay wrote into its metadata; `None` for an object oncepay
    /// did not make (or made before it wrote traces).
    pub trace: Option<trace::Trace>,
}

/// A page of a provider's books.
#[derive(Debug, Clone, Default)]
pub struct BooksPage {
    /// The objects on it created in the window asked for.
    pub entries: Vec<BookEntry>,
    /// The cursor of the next page, if there is one.
    pub next: Option<String>,
}

/// A page of a provider's disputes.
#[derive(Debug, Clone, Default)]
pub struct DisputesPage {
    /// The disputes on it created in the window asked for, in our terms;
    /// one its adapter cannot read is left out (as a list's unreadable
    /// charge is).
    pub disputes: Vec<ProviderDispute>,
    /// The cursor of the next page, if there is one.
    pub next: Option<String>,
}

/// A webhook's headers, by lower-case name.
pub type Headers<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A payment provider's adapter.
pub trait PaymentProvider: Send + Sync {
    /// The provider's name, stored on attempts and used in webhook paths.
    fn name(&self) -> &str;
    /// Whether this process last saw the provider answer.
    fn health(&self) -> &Health;
    /// Whether `payment_method` has this provider's form; the error says
    /// which form is expected.
    fn check_payment_method(&self, payment_method: &str) -> Result<(), &'static str>;
    /// Whether the provider can charge `amount` minor units of `currency`
    /// exactly and within its limits; the error names the currency and
    /// the rule. Asked before any attempt row is written.
    fn check_amount(&self, _amount: i64, _currency: &Currency) -> Result<(), String> {
        Ok(())
    }
    /// True when [`PaymentProvider::check_amount`] refuses some amounts: a
    /// payment then takes the engine's full protocol, whose first step
    /// reads the order before it writes (the one-statement fast path
    /// takes the amount from the order's row as it inserts).
    fn restricts_amounts(&self) -> bool {
        false
    }
    /// [`PaymentProvider::check_amount`] for a refund of `amount` (no
    /// minimum applies to a refund, the unit rules do).
    fn check_refund_amount(&self, _amount: i64, _currency: &Currency) -> Result<(), String> {
        Ok(())
    }
    /// A test-mode payment method that succeeds, offered on the checkout
    /// page behind "Use a test token" (test mode only).
    fn example_payment_method(&self) -> &'static str;
    /// Whether no real money moves (the sandbox; a Stripe test key): the
    /// checkout page says so.
    fn test_mode(&self) -> bool;
    /// How a checkout page takes a card so that its number goes to the
    /// provider from the customer's browser, never to oncepay; `None`: no
    /// card form, the page takes a payment-method id (test mode only).
    fn card_form(&self) -> Option<&dyn CardForm>;
    /// The first phase of a charge, for providers that create before they
    /// charge; [`Opened::NotNeeded`] (without a call) for the others.
    fn open_charge<'a>(&'a self, request: &'a ChargeRequest) -> BoxFuture<'a, Opened>;
    /// Makes a charge (confirms the opened one, `reference`), or returns
    /// the one already made with this key (`request.key_generation`'s).
    fn charge<'a>(
        &'a self,
        request: &'a ChargeRequest,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, Sent>;
    /// Reads the charge of attempt `attempt_id` (`reference`: the id we
    /// recorded, if any); a safe, retried read.
    fn find_charge<'a>(
        &'a self,
        attempt_id: Uuid,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome>;
    /// Makes a refund, or returns the one already made with this key
    /// (`request.key_generation`'s).
    fn refund<'a>(&'a self, request: &'a RefundRequest) -> BoxFuture<'a, Sent>;
    /// Gives up on the charge of `attempt_id` (the provider's object
    /// `reference`) whose customer never completed the action it waits
    /// for: cancels it at the provider, so a late approval cannot move
    /// money. `Known` with the provider's word: `failed` (cancelled),
    /// `succeeded` or `requires_capture` (the customer approved in time,
    /// which stands), or `voided` with [`ABANDONED`] as its
    /// `failure_code` (a hold approved just before the cancel, which
    /// released it); anything else, or `Unknown`, settles nothing yet.
    fn abandon<'a>(
        &'a self,
        attempt_id: Uuid,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome>;
    /// Whether it authorizes now and captures later (`capture_method:
    /// manual`); a manual payment is refused (`422`) by one that does not.
    fn captures_later(&self) -> bool;
    /// Captures `request.amount` of an authorized charge, releasing the
    /// rest; repeated with the same key, answers the capture already made.
    /// `Known` with the charge as it is after the call: `succeeded` (with
    /// `amount_captured`), or `voided` when the provider refused because
    /// the hold expired or was released (the provider decides, never our
    /// clock), or `requires_capture` if it still holds it uncaptured; or
    /// `failed` when the provider refused this capture itself (a decline,
    /// an amount or a state it will not take; nothing captured under the
    /// key, its code in `failure_code`): the caller reads the charge back
    /// ([`PaymentProvider::find_capture`]) before the capture ends
    /// `failed` with the hold standing.
    fn capture<'a>(&'a self, request: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome>;
    /// Reads whether a capture that may have been sent happened: `Known`
    /// with the charge once it is captured or released, `NotFound` while
    /// the provider still holds it uncaptured (sending the capture again,
    /// same key, is then safe); a safe, retried read.
    fn find_capture<'a>(&'a self, request: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome>;
    /// Releases the authorization of `payment_id`'s charge `charge_id`
    /// without capturing it; idempotent. `Known` with the charge: `voided`,
    /// or `succeeded` if it was captured first (which stands).
    fn void<'a>(&'a self, payment_id: Uuid, charge_id: &'a str) -> BoxFuture<'a, CallOutcome>;
    /// Reads a refund (`reference`: its id we recorded, if any).
    fn find_refund<'a>(
        &'a self,
        request: &'a RefundRequest,
        reference: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome>;
    /// Reads the dispute `id` (the provider's id, as its event named it):
    /// a safe, retried read.
    fn find_dispute<'a>(&'a self, id: &'a str) -> BoxFuture<'a, DisputeRead>;
    /// One cheap read whose only purpose is to learn whether the provider
    /// answers (`NotFound` or `Known`: it does).
    fn probe(&self) -> BoxFuture<'_, CallOutcome>;
    /// Verifies a webhook's signature on its raw body, before anything is
    /// parsed or stored; returns the delivery's id if its headers carry one.
    fn verify_webhook(
        &self,
        headers: Headers<'_>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<Option<String>, String>;
    /// Reads a verified event.
    fn parse_event(&self, payload: &Value) -> Event;
    /// One page of the provider's `kind` objects created in
    /// `[from, until)` (Unix seconds), after the cursor `after`; objects
    /// that never moved money (a PaymentIntent never confirmed) are left
    /// out. A safe, retried read; `Err` says why there is no page.
    fn list_books<'a>(
        &'a self,
        kind: SubjectKind,
        window: (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BooksPage, String>>;
    /// One page of the provider's disputes created in `[from, until)`
    /// (Unix seconds), after the cursor `after`, in our terms: how the
    /// books pass learns of a dispute whose webhook never came (an
    /// endpoint down, no secret set, the provider's retries over). A safe,
    /// retried read; `Err` says why there is no page.
    fn list_disputes<'a>(
        &'a self,
        window: (i64, i64),
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputesPage, String>>;
}

/// The providers this process can speak to, by name, and the one new
/// payments go to (`ONCEPAY_PROVIDER`).
#[derive(Clone)]
pub struct Providers {
    all: Vec<Arc<dyn PaymentProvider>>,
    current: usize,
}

impl Providers {
    /// The registry; `current` names where new payments go.
    pub fn new(all: Vec<Arc<dyn PaymentProvider>>, current: &str) -> Option<Providers> {
        let current = all.iter().position(|p| p.name() == current)?;
        Some(Providers { all, current })
    }

    /// Where new payments go.
    pub fn current(&self) -> &Arc<dyn PaymentProvider> {
        &self.all[self.current]
    }

    /// Where a new payment with `payment_method` goes: the customer's
    /// balance for `"balance"` (when registered), else the current provider.
    pub fn for_payment_method(&self, payment_method: &str) -> &Arc<dyn PaymentProvider> {
        if payment_method == balance::PAYMENT_METHOD {
            if let Some(p) = self.all.iter().find(|p| p.name() == balance::NAME) {
                return p;
            }
        }
        self.current()
    }

    /// The provider named `name`: the one an attempt was made with. A name
    /// this process has no configuration for answers every call with an
    /// unknown outcome, so its rows wait (and raise alarms) rather than
    /// being settled by a provider that never saw them.
    pub fn named(&self, name: &str) -> Arc<dyn PaymentProvider> {
        match self.all.iter().find(|p| p.name() == name) {
            Some(p) => p.clone(),
            None => Arc::new(Unconfigured {
                name: name.to_string(),
                health: Health::default(),
            }),
        }
    }

    /// Whether this process speaks to a provider of this name.
    pub fn has(&self, name: &str) -> bool {
        self.all.iter().any(|p| p.name() == name)
    }

    /// Every configured provider.
    pub fn all(&self) -> &[Arc<dyn PaymentProvider>] {
        &self.all
    }

    /// The providers whose books are kept outside this database, the ones
    /// a reconciliation of books walks: not the balance, whose books are
    /// this database's ledger (a restore takes both back together).
    pub fn with_outside_books(&self) -> impl Iterator<Item = &Arc<dyn PaymentProvider>> {
        self.all.iter().filter(|p| p.name() != balance::NAME)
    }
}

/// A provider named by a stored row but not configured in this process.
struct Unconfigured {
    name: String,
    health: Health,
}

impl Unconfigured {
    fn unknown(&self) -> CallOutcome {
        CallOutcome::Unknown(format!(
            "provider {} is not configured in this process",
            self.name
        ))
    }
}

impl PaymentProvider for Unconfigured {
    fn name(&self) -> &str {
        &self.name
    }
    fn health(&self) -> &Health {
        &self.health
    }
    fn check_payment_method(&self, _: &str) -> Result<(), &'static str> {
        Err("cannot be checked: the provider is not configured")
    }
    fn example_payment_method(&self) -> &'static str {
        ""
    }
    fn open_charge<'a>(&'a self, _: &'a ChargeRequest) -> BoxFuture<'a, Opened> {
        Box::pin(async move { Opened::Settled(self.unknown()) })
    }
    fn charge<'a>(&'a self, _: &'a ChargeRequest, _: Option<&'a str>) -> BoxFuture<'a, Sent> {
        Box::pin(async move { Sent::from(self.unknown()) })
    }
    fn find_charge<'a>(&'a self, _: Uuid, _: Option<&'a str>) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn abandon<'a>(&'a self, _: Uuid, _: Option<&'a str>) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn refund<'a>(&'a self, _: &'a RefundRequest) -> BoxFuture<'a, Sent> {
        Box::pin(async move { Sent::from(self.unknown()) })
    }
    fn captures_later(&self) -> bool {
        false
    }
    fn capture<'a>(&'a self, _: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn find_capture<'a>(&'a self, _: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn void<'a>(&'a self, _: Uuid, _: &'a str) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn find_refund<'a>(
        &'a self,
        _: &'a RefundRequest,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn probe(&self) -> BoxFuture<'_, CallOutcome> {
        Box::pin(async move { self.unknown() })
    }
    fn find_dispute<'a>(&'a self, _: &'a str) -> BoxFuture<'a, DisputeRead> {
        Box::pin(async move {
            DisputeRead::Unknown(format!(
                "provider {} is not configured in this process",
                self.name
            ))
        })
    }
    fn verify_webhook(&self, _: Headers<'_>, _: &[u8], _: i64) -> Result<Option<String>, String> {
        Err("no such webhook provider".into())
    }
    fn parse_event(&self, _: &Value) -> Event {
        Event {
            id: None,
            event_type: "unrecognised".into(),
            subject: None,
            refunds_of: None,
            dispute: None,
        }
    }
    fn test_mode(&self) -> bool {
        false
    }
    fn card_form(&self) -> Option<&dyn CardForm> {
        None
    }
    fn list_books<'a>(
        &'a self,
        _: SubjectKind,
        _: (i64, i64),
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BooksPage, String>> {
        Box::pin(async { Err(format!("provider {} is not configured", self.name)) })
    }
    fn list_disputes<'a>(
        &'a self,
        _: (i64, i64),
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputesPage, String>> {
        Box::pin(async { Err(format!("provider {} is not configured", self.name)) })
    }
}

/// Whether this process last saw the provider answer, so that the end of
/// an outage is noticed at once: rows that met the outage backed off (up
/// to five minutes), and without this they would keep waiting after the
/// provider is healthy again, with customers watching "checking status".
#[derive(Debug, Default)]
pub struct Health {
    degraded: std::sync::atomic::AtomicBool,
    recovered: std::sync::atomic::AtomicBool,
    last_taken: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Health {
    /// Notes what a call came to: an unknown outcome means the provider
    /// is not answering; any fact (an object, a decline, "no such object")
    /// means it is, and, after an unknown, that it has recovered.
    pub fn observe(&self, outcome: &CallOutcome) {
        use std::sync::atomic::Ordering::SeqCst;
        match outcome {
            CallOutcome::Unknown(_) => self.degraded.store(true, SeqCst),
            CallOutcome::Known(_) | CallOutcome::NotFound => {
                if self.degraded.swap(false, SeqCst) {
                    self.recovered.store(true, SeqCst);
                }
            }
        }
    }

    /// Whether the last call proved nothing.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the provider answered again since the last ask (once), at
    /// most once per `spacing`: a provider that flaps would otherwise undo
    /// every row's back-off at every pass. A recovery within the spacing
    /// is kept for the next ask after it.
    pub fn take_recovered(&self, spacing: std::time::Duration) -> bool {
        let mut last = self.last_taken.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < spacing) {
            return false;
        }
        let recovered = self
            .recovered
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        if recovered {
            *last = Some(std::time::Instant::now());
        }
        recovered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_recovery_is_an_answer_after_an_unknown_taken_once_per_spacing() {
        let health = Health::default();
        let known = CallOutcome::NotFound;
        let unknown = CallOutcome::Unknown("down".into());
        health.observe(&known);
        assert!(!health.take_recovered(Duration::ZERO), "never down");
        health.observe(&unknown);
        assert!(health.is_degraded());
        assert!(!health.take_recovered(Duration::ZERO), "still down");
        health.observe(&known);
        assert!(!health.is_degraded());
        assert!(health.take_recovered(Duration::from_secs(60)));
        assert!(!health.take_recovered(Duration::ZERO), "once");
        health.observe(&unknown);
        health.observe(&known);
        assert!(
            !health.take_recovered(Duration::from_secs(60)),
            "a flap within the spacing waits"
        );
        assert!(
            health.take_recovered(Duration::ZERO),
            "and is kept for later"
        );
    }
}
