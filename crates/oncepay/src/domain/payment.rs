//! The one-way state machine shared by payment attempts and refunds:
//! `pending → succeeded | failed`, and nothing leaves a final state. No I/O.

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
}

impl PaymentStatus {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Failed => "failed",
        }
    }

    /// Parses a stored or provider-reported status.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => PaymentStatus::Pending,
            "succeeded" => PaymentStatus::Succeeded,
            "failed" => PaymentStatus::Failed,
            _ => return None,
        })
    }

    /// True for `succeeded` and `failed`.
    pub fn is_final(self) -> bool {
        self != PaymentStatus::Pending
    }

    /// Decides what an observed status does to this one. Only
    /// `pending → succeeded` and `pending → failed` move anything.
    pub fn transition(self, observed: PaymentStatus) -> Transition {
        use PaymentStatus::*;
        match (self, observed) {
            (Pending, Succeeded) | (Pending, Failed) => Transition::Advance(observed),
            (Failed, Succeeded) => Transition::Contradicted,
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
            next_action: None,
            dispute: None,
            created_at: now,
            updated_at: now,
            payment_method: payment_method.to_string(),
            action_required_at: None,
            return_url: None,
            merchant_id: uuid::Uuid::nil(),
            origin: crate::domain::origin::Origin::default(),
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
        for s in [Pending, Succeeded, Failed] {
            assert_eq!(PaymentStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(PaymentStatus::parse("refunded"), None);
        assert!(!Pending.is_final());
        assert!(Succeeded.is_final() && Failed.is_final());
    }
}
