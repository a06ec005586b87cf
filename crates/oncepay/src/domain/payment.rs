//! The one-way state machine shared by payment attempts and refunds:
//! `pending → succeeded | failed`, and for a payment captured later
//! (`capture_method: manual`) `pending → requires_capture → succeeded |
//! voided`; nothing leaves a final state. A capture the provider refuses
//! moves nothing: the hold stands. Which holds may be captured or
//! voided is decided here too ([`capture_plan`], [`void_plan`]). No I/O.

/// Status of a payment attempt or a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Sent to the provider, outcome not known yet.
    Pending,
    /// The provider confirmed it.
    Succeeded,
    /// The provider refused it.
    Failed,
    /// A manual payment the provider authorized: the money is held until
    /// it is captured, voided, or the hold expires. Payments only.
    RequiresCapture,
    /// A manual payment's hold released without a capture (asked for, its
    /// order cancelled, or expired). Payments only.
    Voided,
}

/// What applying an observed status to a stored one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The status moves forward to the given one.
    Advance(PaymentStatus),
    /// The observation repeats what is stored: nothing to do.
    Unchanged,
    /// The observation would move backwards or between final states: it is
    /// stale or contradictory and is ignored (and recorded by the caller).
    Ignored,
    /// The provider reports `succeeded` for what we hold as `failed`: money
    /// moved that our books do not account for. Never ignored: the caller
    /// records an incident (and, for a charge, returns the money).
    Contradicted,
    /// The provider reports `failed` for a refund we hold as `succeeded`:
    /// it paid the refund out and it came back (Stripe: the card was
    /// closed or expired). For refunds only ([`crate::domain::refund::transition`]):
    /// a fact, which reopens the refunded amount.
    Reversed,
    /// The provider holds an authorization for an attempt we hold as
    /// `failed` (its customer approved after it failed, or a lying
    /// decline): no money moved, but the customer's funds are held. Never
    /// ignored: the caller has it released at the provider.
    StrayHold,
}

impl PaymentStatus {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Failed => "failed",
            PaymentStatus::RequiresCapture => "requires_capture",
            PaymentStatus::Voided => "voided",
        }
    }

    /// Parses a stored or provider-reported status.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => PaymentStatus::Pending,
            "succeeded" => PaymentStatus::Succeeded,
            "failed" => PaymentStatus::Failed,
            "requires_capture" => PaymentStatus::RequiresCapture,
            "voided" => PaymentStatus::Voided,
            _ => return None,
        })
    }

    /// True for `succeeded`, `failed` and `voided`.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            PaymentStatus::Succeeded | PaymentStatus::Failed | PaymentStatus::Voided
        )
    }

    /// True once the provider's answer is known: final, or authorized and
    /// held (`requires_capture`), which a payment's request answers `201`.
    pub fn is_known(self) -> bool {
        self != PaymentStatus::Pending
    }

    /// Decides what an observed status does to this one. Only `pending →
    /// succeeded | failed | requires_capture | voided` and
    /// `requires_capture → succeeded | voided` move anything.
    pub fn transition(self, observed: PaymentStatus) -> Transition {
        use PaymentStatus::*;
        match (self, observed) {
            (Pending, Succeeded | Failed | RequiresCapture | Voided)
            | (RequiresCapture, Succeeded | Voided) => Transition::Advance(observed),
            // A hold that failed at the provider was never ours to hold:
            // the payment is over, as a void.
            (RequiresCapture, Failed) => Transition::Advance(Voided),
            (Failed | Voided, Succeeded) => Transition::Contradicted,
            (Failed, RequiresCapture) => Transition::StrayHold,
            (a, b) if a == b => Transition::Unchanged,
            _ => Transition::Ignored,
        }
    }
}

/// A payment attempt as the API shows it (contract section 3).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Payment {
    /// UUID v7; also the provider idempotency key of its charge.
    pub id: uuid::Uuid,
    /// The order it pays.
    pub order_id: uuid::Uuid,
    /// The order's amount, in minor units.
    pub amount: i64,
    /// The order's currency.
    pub currency: String,
    /// Where it is in the one-way state machine.
    pub status: PaymentStatus,
    /// Which provider charged it.
    pub provider: String,
    /// The provider's id of the charge, once known.
    pub provider_charge_id: Option<String>,
    /// Why it failed (`card_declined`, ...).
    pub failure_code: Option<String>,
    /// A readable reason for the failure.
    pub failure_message: Option<String>,
    /// Sum of its succeeded refunds.
    pub refunded_amount: i64,
    /// `automatic` (captured as it is authorized) or `manual` (held, then
    /// captured or voided by the merchant).
    pub capture_method: CaptureMethod,
    /// What a capture may take now: the amount while `requires_capture`,
    /// 0 otherwise.
    pub amount_capturable: i64,
    /// What was captured: the amount of an automatic payment that
    /// succeeded, a manual one's capture; 0 otherwise. Refunds are capped
    /// by it.
    pub amount_captured: i64,
    /// Until when the hold can be captured: `null` unless
    /// `requires_capture`.
    pub capture_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Why the hold was released (`requested`, `order_cancelled`,
    /// `expired`, `cancelled_at_provider`, `abandoned`): `null` unless
    /// `voided`.
    pub void_reason: Option<VoidReason>,
    /// What the customer must do before the payment can settle (3-D
    /// Secure at their bank): `null` unless the payment is `pending` and
    /// waits for them.
    pub next_action: Option<NextAction>,
    /// Its dispute (chargeback), if its customer's bank opened one: shown
    /// by `GET /payments/{id}` and the payment lists; `null` otherwise.
    pub dispute: Option<Box<crate::domain::dispute::Dispute>>,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The provider token, kept to repeat the charge with the same key; never shown.
    #[serde(skip)]
    pub payment_method: String,
    /// Since when it waits for the customer (`next_action`).
    #[serde(skip)]
    pub action_required_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Where the customer's bank sends them back, as the request gave it
    /// (every charge of the attempt carries it, however late).
    #[serde(skip)]
    pub return_url: Option<String>,
    /// The merchant: not in the payment's JSON (the caller is the merchant).
    #[serde(skip)]
    pub merchant_id: uuid::Uuid,
    /// The key's hash and request's fingerprint, sent in the provider's
    /// metadata.
    #[serde(skip)]
    pub origin: crate::domain::origin::Origin,
    /// A void asked for and not answered yet (the hold is still
    /// `requires_capture`, and no capture may start); internal.
    #[serde(skip)]
    pub void_requested: Option<VoidReason>,
}

/// Whether a payment is captured as it is authorized, or held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptureMethod {
    /// Captured at once (today's payments).
    #[default]
    Automatic,
    /// Authorized and held; captured or voided later.
    Manual,
}

impl CaptureMethod {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureMethod::Automatic => "automatic",
            CaptureMethod::Manual => "manual",
        }
    }

    /// Parses a stored or requested method.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "automatic" => Some(CaptureMethod::Automatic),
            "manual" => Some(CaptureMethod::Manual),
            _ => None,
        }
    }
}

/// Why a hold was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VoidReason {
    /// `POST /payments/{id}/void`.
    Requested,
    /// Its order was cancelled.
    OrderCancelled,
    /// Not captured before `capture_before` (voided by oncepay's sweeper,
    /// or reported expired by the provider).
    Expired,
    /// Cancelled at the provider by someone other than oncepay, while it
    /// could still be captured (Stripe's Dashboard: `requested_by_customer`,
    /// `fraudulent`, `duplicate`); the payment's `failure_code` keeps the
    /// provider's own reason.
    CancelledAtProvider,
    /// oncepay gave up waiting for the customer's action
    /// (`ONCEPAY_ACTION_TIMEOUT`), and the cancel found the customer had
    /// approved just before: the authorization was released by oncepay.
    Abandoned,
}

impl VoidReason {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            VoidReason::Requested => "requested",
            VoidReason::OrderCancelled => "order_cancelled",
            VoidReason::Expired => "expired",
            VoidReason::CancelledAtProvider => "cancelled_at_provider",
            VoidReason::Abandoned => "abandoned",
        }
    }

    /// Parses a stored reason.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "requested" => Some(VoidReason::Requested),
            "order_cancelled" => Some(VoidReason::OrderCancelled),
            "expired" => Some(VoidReason::Expired),
            "cancelled_at_provider" => Some(VoidReason::CancelledAtProvider),
            "abandoned" => Some(VoidReason::Abandoned),
            _ => None,
        }
    }
}

/// Why a hold cannot be captured now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureRefusal {
    /// Not `requires_capture`, or a capture (pending or made) or a void
    /// already started.
    #[error("{0}")]
    NotCapturable(String),
    /// More than the hold.
    #[error("amount: {requested} asked, at most {capturable} capturable")]
    ExceedsCapturable {
        /// What was asked for.
        requested: i64,
        /// What the hold allows.
        capturable: i64,
    },
    /// `capture_before` has passed.
    #[error("the authorization expired at {0}; it can no longer be captured")]
    Expired(chrono::DateTime<chrono::Utc>),
}

/// What a capture of `payment` for `amount` (`None`: all that is
/// capturable) takes, given whether a capture of it is under way or made
/// (`capture_started`; one the provider refused is neither: the hold
/// stands and may be captured again) and the time now: the amount, or why
/// not.
pub fn capture_plan(
    payment: &Payment,
    capture_started: bool,
    amount: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<i64, CaptureRefusal> {
    if payment.status != PaymentStatus::RequiresCapture {
        return Err(CaptureRefusal::NotCapturable(format!(
            "the payment is {}; only a payment in requires_capture can be captured",
            payment.status.as_str()
        )));
    }
    if capture_started {
        return Err(CaptureRefusal::NotCapturable(
            "the payment is requires_capture with a capture already under way or made for it; a payment is captured once".into(),
        ));
    }
    if payment.void_requested.is_some() {
        return Err(CaptureRefusal::NotCapturable(
            "the payment is requires_capture with a void in progress; it can no longer be captured"
                .into(),
        ));
    }
    if let Some(deadline) = payment.capture_before {
        if now >= deadline {
            return Err(CaptureRefusal::Expired(deadline));
        }
    }
    let capturable = payment.amount;
    match amount {
        None => Ok(capturable),
        Some(a) if a > capturable => Err(CaptureRefusal::ExceedsCapturable {
            requested: a,
            capturable,
        }),
        Some(a) => Ok(a),
    }
}

/// Whether `payment` can be voided now, given whether a capture of it is
/// under way or made (one the provider refused is neither): only a hold
/// with no capture or void under way.
pub fn void_plan(payment: &Payment, capture_started: bool) -> Result<(), String> {
    if payment.status != PaymentStatus::RequiresCapture {
        return Err(format!(
            "the payment is {}; only a payment in requires_capture can be voided",
            payment.status.as_str()
        ));
    }
    if capture_started {
        return Err("the payment is being captured; it can no longer be voided".into());
    }
    if payment.void_requested.is_some() {
        return Err("a void of the payment is already in progress".into());
    }
    Ok(())
}

impl Payment {
    /// A new attempt, pending, as it is stored (`now` rounded to the
    /// database's microseconds), for the order `order_id` and its amount
    /// and currency.
    pub fn pending(
        id: uuid::Uuid,
        (order_id, amount, currency): (uuid::Uuid, i64, &str),
        provider: &str,
        payment_method: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Payment {
        Payment {
            id,
            order_id,
            amount,
            currency: currency.to_string(),
            status: PaymentStatus::Pending,
            provider: provider.to_string(),
            provider_charge_id: None,
            failure_code: None,
            failure_message: None,
            refunded_amount: 0,
            capture_method: CaptureMethod::Automatic,
            amount_capturable: 0,
            amount_captured: 0,
            capture_before: None,
            void_reason: None,
            next_action: None,
            dispute: None,
            created_at: now,
            updated_at: now,
            payment_method: payment_method.to_string(),
            action_required_at: None,
            return_url: None,
            merchant_id: uuid::Uuid::nil(),
            origin: crate::domain::origin::Origin::default(),
            void_requested: None,
        }
    }

    /// This attempt after the provider's facts are written with `status`,
    /// as `store::payments::set_status` writes them: a charge id once known
    /// is kept, a failure is kept unless a new one is reported.
    pub fn with_facts(
        &self,
        status: PaymentStatus,
        charge_id: Option<&str>,
        failure_code: Option<&str>,
        failure_message: Option<&str>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Payment {
        Payment {
            status,
            provider_charge_id: self
                .provider_charge_id
                .clone()
                .or_else(|| charge_id.map(str::to_string)),
            failure_code: failure_code
                .map(str::to_string)
                .or_else(|| self.failure_code.clone()),
            failure_message: failure_message
                .map(str::to_string)
                .or_else(|| self.failure_message.clone()),
            updated_at: now,
            // As the database's trigger writes it: an automatic payment
            // captures its amount when it succeeds.
            amount_captured: match (status, self.capture_method) {
                (PaymentStatus::Succeeded, CaptureMethod::Automatic) => self.amount,
                _ => self.amount_captured,
            },
            amount_capturable: 0,
            ..self.clone()
        }
    }
}

/// What a customer must do for a pending payment. Either way the payment
/// waits at most `ONCEPAY_ACTION_TIMEOUT` from the first time it did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NextAction {
    /// Follow a redirect to their bank's authentication page, then come
    /// back (`{"type": "redirect", "url"}`).
    Redirect {
        /// Where to send the customer.
        url: String,
    },
    /// Authenticate in the shop's own page with the provider's script:
    /// Stripe's `next_action` for a payment made without a `return_url`
    /// (`use_stripe_sdk`, or any other type Stripe.js handles), run with
    /// `stripe.handleNextAction({clientSecret})`.
    UseStripeSdk {
        /// The PaymentIntent's client secret, for Stripe.js.
        client_secret: String,
    },
}

impl NextAction {
    /// A redirect to `url`.
    pub fn redirect(url: &str) -> NextAction {
        NextAction::Redirect {
            url: url.to_string(),
        }
    }
}

/// A refund as the API shows it (contract section 3).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refund {
    /// UUID v7; also the provider idempotency key of the refund.
    pub id: uuid::Uuid,
    /// The payment it refunds.
    pub payment_id: uuid::Uuid,
    /// How much, in minor units.
    pub amount: i64,
    /// Its payment's currency (ISO 4217).
    pub currency: String,
    /// Same one-way state machine as payments.
    pub status: PaymentStatus,
    /// Why the provider did not make it (its own code, e.g. Stripe's
    /// `charge_already_refunded`); `None` unless `failed`.
    pub failure_code: Option<String>,
    /// The merchant's reason, if given.
    pub reason: Option<String>,
    /// Where the money goes: `original` (the payment's method) or
    /// `balance` (the order's customer's balance).
    pub destination: String,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The provider's id of the refund, once known; internal.
    #[serde(skip)]
    pub provider_refund_id: Option<String>,
    /// True when settling it cancels its order; internal.
    #[serde(skip)]
    pub cancels_order: bool,
    /// True for a refund oncepay made on its own to return money taken for
    /// a failed attempt; settling it never moves the order. Internal.
    #[serde(skip)]
    pub incident: bool,
    /// The key's hash and request's fingerprint, sent in the provider's
    /// metadata.
    #[serde(skip)]
    pub origin: crate::domain::origin::Origin,
}

#[cfg(test)]
mod tests {
    use super::PaymentStatus::*;
    use super::*;

    #[test]
    fn every_transition_legal_and_illegal() {
        let table = [
            (Pending, Pending, Transition::Unchanged),
            (Pending, Succeeded, Transition::Advance(Succeeded)),
            (Pending, Failed, Transition::Advance(Failed)),
            (Succeeded, Pending, Transition::Ignored),
            (Succeeded, Succeeded, Transition::Unchanged),
            (Succeeded, Failed, Transition::Ignored),
            (Failed, Pending, Transition::Ignored),
            (Failed, Succeeded, Transition::Contradicted),
            (Failed, Failed, Transition::Unchanged),
            (
                Pending,
                RequiresCapture,
                Transition::Advance(RequiresCapture),
            ),
            (Pending, Voided, Transition::Advance(Voided)),
            (RequiresCapture, RequiresCapture, Transition::Unchanged),
            (RequiresCapture, Succeeded, Transition::Advance(Succeeded)),
            (RequiresCapture, Voided, Transition::Advance(Voided)),
            (RequiresCapture, Failed, Transition::Advance(Voided)),
            (RequiresCapture, Pending, Transition::Ignored),
            (Succeeded, RequiresCapture, Transition::Ignored),
            (Succeeded, Voided, Transition::Ignored),
            (Voided, RequiresCapture, Transition::Ignored),
            (Voided, Succeeded, Transition::Contradicted),
            (Voided, Voided, Transition::Unchanged),
            (Failed, RequiresCapture, Transition::StrayHold),
        ];
        for (from, observed, expected) in table {
            assert_eq!(
                from.transition(observed),
                expected,
                "{from:?} + {observed:?}"
            );
        }
    }

    #[test]
    fn names_round_trip() {
        for s in [Pending, Succeeded, Failed, RequiresCapture, Voided] {
            assert_eq!(PaymentStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(PaymentStatus::parse("refunded"), None);
        assert!(!Pending.is_final() && !RequiresCapture.is_final());
        assert!(Succeeded.is_final() && Failed.is_final() && Voided.is_final());
        assert!(RequiresCapture.is_known() && !Pending.is_known());
        for m in [CaptureMethod::Automatic, CaptureMethod::Manual] {
            assert_eq!(CaptureMethod::parse(m.as_str()), Some(m));
        }
        for r in [
            VoidReason::Requested,
            VoidReason::OrderCancelled,
            VoidReason::Expired,
            VoidReason::CancelledAtProvider,
            VoidReason::Abandoned,
        ] {
            assert_eq!(VoidReason::parse(r.as_str()), Some(r));
        }
    }

    fn hold(amount: i64) -> Payment {
        let now = chrono::Utc::now();
        Payment {
            status: RequiresCapture,
            capture_method: CaptureMethod::Manual,
            amount_capturable: amount,
            capture_before: Some(now + chrono::Duration::days(7)),
            ..Payment::pending(
                uuid::Uuid::nil(),
                (uuid::Uuid::nil(), amount, "EUR"),
                "sandbox",
                "tok_visa",
                now,
            )
        }
    }

    #[test]
    fn a_hold_is_captured_once_within_its_amount_and_deadline() {
        let now = chrono::Utc::now();
        let p = hold(1000);
        assert_eq!(capture_plan(&p, false, None, now), Ok(1000));
        assert_eq!(capture_plan(&p, false, Some(1), now), Ok(1));
        assert_eq!(capture_plan(&p, false, Some(1000), now), Ok(1000));
        assert_eq!(
            capture_plan(&p, false, Some(1001), now),
            Err(CaptureRefusal::ExceedsCapturable {
                requested: 1001,
                capturable: 1000
            })
        );
        assert!(matches!(
            capture_plan(&p, true, None, now),
            Err(CaptureRefusal::NotCapturable(_))
        ));
        let late = p.capture_before.expect("deadline");
        assert_eq!(
            capture_plan(&p, false, None, late),
            Err(CaptureRefusal::Expired(late))
        );
        let voiding = Payment {
            void_requested: Some(VoidReason::Requested),
            ..hold(1000)
        };
        assert!(matches!(
            capture_plan(&voiding, false, None, now),
            Err(CaptureRefusal::NotCapturable(_))
        ));
        for status in [Pending, Succeeded, Failed, Voided] {
            let p = Payment {
                status,
                ..hold(1000)
            };
            match capture_plan(&p, false, None, now) {
                Err(CaptureRefusal::NotCapturable(why)) => {
                    assert!(why.contains(status.as_str()), "{why}")
                }
                other => panic!("{status:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_a_hold_with_nothing_under_way_is_voided() {
        assert_eq!(void_plan(&hold(10), false), Ok(()));
        assert!(void_plan(&hold(10), true).is_err());
        let voiding = Payment {
            void_requested: Some(VoidReason::Expired),
            ..hold(10)
        };
        assert!(void_plan(&voiding, false).is_err());
        for status in [Pending, Succeeded, Failed, Voided] {
            let p = Payment { status, ..hold(10) };
            assert!(void_plan(&p, false).is_err(), "{status:?}");
        }
    }
}
