//! `balance`: paying an order from its customer's balance, as a provider
//! behind the same trait as the sandbox and Stripe, so that the payment
//! command, the reconciler and the refund path treat it like any other.
//! Its "books" are the ledger in oncepay's own database (`store::ledger`):
//!
//! - a charge is one transfer from the order's customer's balance (in the
//!   order's currency) to the merchant's `payments` account, keyed by the
//!   attempt id (`payment:<id>`): repeated, it finds the transfer it made.
//!   It succeeds at once when `available` covers the amount, and fails
//!   with `insufficient_funds` (moving nothing) when it does not;
//! - a refund (of a balance payment, or of any payment refunded with
//!   `destination: balance`) is one transfer back to the customer's
//!   balance, keyed by the refund id;
//! - "not found" can always be trusted: the transfer and the answer are in
//!   the same database, written in one transaction.
//!
//! It is not an `ONCEPAY_PROVIDER` (new card payments never go here): a
//! payment reaches it by naming `payment_method: "balance"`.

use std::sync::Arc;

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::card_form::CardForm;
use super::{
    BooksPage, BoxFuture, CallOutcome, CaptureRequest, ChargeRequest, DisputeRead, DisputesPage,
    Event, Headers, Health, Opened, PaymentProvider, ProviderObject, RefundRequest, Sent,
    SubjectKind,
};
use crate::balances::{self as ledger_ops, Paid};
use crate::domain::payment::PaymentStatus;
use crate::metrics::Metrics;
use crate::store;

/// The adapter's name, stored on its attempts.
pub const NAME: &str = "balance";

/// The one payment method it takes.
pub const PAYMENT_METHOD: &str = "balance";

/// The failure code of a charge the balance does not cover.
pub const INSUFFICIENT_FUNDS: &str = "insufficient_funds";

/// The balance provider.
pub struct Balance {
    pool: PgPool,
    metrics: Arc<Metrics>,
    health: Health,
}

impl Balance {
    /// The adapter over the service's database.
    pub fn new(pool: PgPool, metrics: Arc<Metrics>) -> Self {
        Balance {
            pool,
            metrics,
            health: Health::default(),
        }
    }

    fn succeeded(id: Uuid) -> CallOutcome {
        CallOutcome::Known(ProviderObject {
            id: id.to_string(),
            status: PaymentStatus::Succeeded,
            failure_code: None,
            failure_message: None,
            next_action: None,
            amount_captured: None,
            capture_before: None,
        })
    }

    fn unknown(e: impl std::fmt::Display) -> CallOutcome {
        CallOutcome::Unknown(format!("the balance ledger: {e}"))
    }

    async fn pay(&self, attempt_id: Uuid) -> CallOutcome {
        let party = match self.pool.acquire().await {
            Ok(mut conn) => store::balances::payer(&mut conn, attempt_id).await,
            Err(e) => return Self::unknown(e),
        };
        let party = match party {
            Ok(Some(party)) => party,
            Ok(None) => return Self::unknown(format!("no payment {attempt_id}")),
            Err(e) => return Self::unknown(e),
        };
        match ledger_ops::pay(&self.pool, &self.metrics, &party).await {
            Ok(Paid::Done(transfer)) => Self::succeeded(transfer.id),
            Ok(Paid::Insufficient(available)) => CallOutcome::Known(ProviderObject {
                id: String::new(),
                status: PaymentStatus::Failed,
                failure_code: Some(INSUFFICIENT_FUNDS.into()),
                failure_message: Some(format!(
                    "the customer's balance has {available} available, less than {}",
                    party.amount
                )),
                next_action: None,
                amount_captured: None,
                capture_before: None,
            }),
            Err(e) => Self::unknown(e),
        }
    }

    async fn find_payment(&self, attempt_id: Uuid) -> CallOutcome {
        let party = match self.pool.acquire().await {
            Ok(mut conn) => store::balances::payer(&mut conn, attempt_id).await,
            Err(e) => return Self::unknown(e),
        };
        match party {
            Ok(Some(party)) => {
                match ledger_ops::payment_made(&self.pool, &self.metrics, &party).await {
                    Ok(Some(transfer)) => Self::succeeded(transfer.id),
                    Ok(None) => CallOutcome::NotFound,
                    Err(e) => Self::unknown(e),
                }
            }
            Ok(None) => CallOutcome::NotFound,
            Err(e) => Self::unknown(e),
        }
    }

    async fn credit(&self, refund_id: Uuid, send: bool) -> CallOutcome {
        let party = match self.pool.acquire().await {
            Ok(mut conn) => store::balances::payee(&mut conn, refund_id).await,
            Err(e) => return Self::unknown(e),
        };
        let party = match party {
            Ok(Some(party)) => party,
            Ok(None) if send => return Self::unknown(format!("no refund {refund_id}")),
            Ok(None) => return CallOutcome::NotFound,
            Err(e) => return Self::unknown(e),
        };
        if !send {
            return match ledger_ops::refund_made(&self.pool, &self.metrics, &party, refund_id).await
            {
                Ok(Some(transfer)) => Self::succeeded(transfer.id),
                Ok(None) => CallOutcome::NotFound,
                Err(e) => Self::unknown(e),
            };
        }
        match ledger_ops::credit_refund(&self.pool, &self.metrics, &party, refund_id).await {
            Ok(transfer) => Self::succeeded(transfer.id),
            Err(e) => Self::unknown(e),
        }
    }
}

impl PaymentProvider for Balance {
    fn name(&self) -> &str {
        NAME
    }
    fn health(&self) -> &Health {
        &self.health
    }
    fn check_payment_method(&self, payment_method: &str) -> Result<(), &'static str> {
        if payment_method == PAYMENT_METHOD {
            Ok(())
        } else {
            Err("must be \"balance\" to pay from the customer's balance")
        }
    }
    fn example_payment_method(&self) -> &'static str {
        PAYMENT_METHOD
    }
    fn test_mode(&self) -> bool {
        false
    }
    fn card_form(&self) -> Option<&dyn CardForm> {
        None
    }
    fn open_charge<'a>(&'a self, _: &'a ChargeRequest) -> BoxFuture<'a, Opened> {
        Box::pin(async { Opened::NotNeeded })
    }
    fn charge<'a>(&'a self, request: &'a ChargeRequest, _: Option<&'a str>) -> BoxFuture<'a, Sent> {
        Box::pin(async move { Sent::from(self.pay(request.idempotency_key).await) })
    }
    fn find_charge<'a>(
        &'a self,
        attempt_id: Uuid,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(self.find_payment(attempt_id))
    }
    fn refund<'a>(&'a self, request: &'a RefundRequest) -> BoxFuture<'a, Sent> {
        Box::pin(async move { Sent::from(self.credit(request.idempotency_key, true).await) })
    }
    fn abandon<'a>(&'a self, attempt_id: Uuid, _: Option<&'a str>) -> BoxFuture<'a, CallOutcome> {
        // Nothing waits for a customer here: the charge is what it is.
        Box::pin(self.find_payment(attempt_id))
    }
    // A balance pays at once: it authorizes nothing to capture later, so a
    // manual payment with it is refused before any call, and these are
    // never reached.
    fn captures_later(&self) -> bool {
        false
    }
    fn capture<'a>(&'a self, _: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async { Self::unknown("a balance payment holds nothing to capture") })
    }
    fn find_capture<'a>(&'a self, _: &'a CaptureRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async { Self::unknown("a balance payment holds nothing to capture") })
    }
    fn void<'a>(&'a self, _: Uuid, _: &'a str) -> BoxFuture<'a, CallOutcome> {
        Box::pin(async { Self::unknown("a balance payment holds nothing to void") })
    }
    fn find_refund<'a>(
        &'a self,
        request: &'a RefundRequest,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, CallOutcome> {
        Box::pin(self.credit(request.idempotency_key, false))
    }
    fn find_dispute<'a>(&'a self, id: &'a str) -> BoxFuture<'a, DisputeRead> {
        let _ = id;
        Box::pin(async { DisputeRead::NotFound })
    }
    fn probe(&self) -> BoxFuture<'_, CallOutcome> {
        Box::pin(async move {
            match store::is_writable(&self.pool).await {
                Ok(_) => CallOutcome::NotFound,
                Err(e) => Self::unknown(e),
            }
        })
    }
    fn verify_webhook(&self, _: Headers<'_>, _: &[u8], _: i64) -> Result<Option<String>, String> {
        Err("the balance provider sends no webhooks".into())
    }
    fn parse_event(&self, payload: &Value) -> Event {
        Event::unrecognised(payload)
    }
    fn list_books<'a>(
        &'a self,
        _: SubjectKind,
        _: (i64, i64),
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<BooksPage, String>> {
        // Its books are this database's ledger: a restore takes both back
        // together, so there is nothing of it to adopt from elsewhere.
        Box::pin(async { Ok(BooksPage::default()) })
    }
    fn list_disputes<'a>(
        &'a self,
        _: (i64, i64),
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<DisputesPage, String>> {
        // No card network or bank stands behind a balance payment to
        // dispute it.
        Box::pin(async { Ok(DisputesPage::default()) })
    }
}
