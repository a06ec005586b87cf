//! The payment provider, behind a small trait: the sandbox speaks it over
//! HTTP today, and a real provider is one more implementation.
//!
//! Every charge and refund carries our own id (attempt or refund) as the
//! provider's idempotency key, so repeating a call never repeats its effect.
//! A call whose outcome we cannot know (timeout, dropped connection) says so
//! with [`CallOutcome::Unknown`]: it is never taken for a failure.

pub mod classify;
pub mod http;
pub mod stripe;

use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;
use uuid::Uuid;

use crate::domain::payment::PaymentStatus;

/// A boxed future, so the trait can be used as `dyn PaymentProvider`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A charge to make (or to repeat, with the same key).
#[derive(Debug, Clone)]
pub struct ChargeRequest {
    /// Our payment attempt id: the provider's idempotency key.
    pub idempotency_key: Uuid,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The client's provider token (`tok_…`).
    pub payment_method: String,
    /// The order paid, passed as metadata so provider records can be traced.
    pub order_id: Uuid,
}

/// A refund to make (or to repeat, with the same key).
#[derive(Debug, Clone)]
pub struct RefundRequest {
    /// Our refund id: the provider's idempotency key.
    pub idempotency_key: Uuid,
    /// The provider's charge id.
    pub charge_id: String,
    /// Minor units.
    pub amount: i64,
}

/// What the provider reports about one charge or refund.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProviderObject {
    /// The provider's id (`ch_…`, `re_…`).
    pub id: String,
    /// Its status in the provider's books.
    #[serde(deserialize_with = "status_from_str")]
    pub status: PaymentStatus,
    /// Why it failed.
    #[serde(default)]
    pub failure_code: Option<String>,
    /// A readable reason.
    #[serde(default)]
    pub failure_message: Option<String>,
}

fn status_from_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PaymentStatus, D::Error> {
    let text = String::deserialize(d)?;
    PaymentStatus::parse(&text)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown status {text}")))
}

/// The result of a provider call, after [`classify`] decided what the
/// answer proves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider answered with the object's state.
    Known(ProviderObject),
    /// The provider has no such object (only for lookups).
    NotFound,
    /// We cannot know what happened (timeout, dropped connection, 5xx after
    /// retries, a refused or unreadable answer). The effect may or may not
    /// exist; only a later look can tell.
    Unknown(String),
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

/// A payment provider.
pub trait PaymentProvider: Send + Sync {
    /// The provider's name, stored on attempts and used in webhook paths.
    fn name(&self) -> &'static str;
    /// Whether this process last saw the provider answer.
    fn health(&self) -> &Health;
    /// Makes a charge, or returns the one already made with this key.
    fn charge<'a>(&'a self, request: &'a ChargeRequest) -> BoxFuture<'a, CallOutcome>;
    /// Makes a refund, or returns the one already made with this key.
    fn refund<'a>(&'a self, request: &'a RefundRequest) -> BoxFuture<'a, CallOutcome>;
    /// Reads the charge made with this key (a safe, retried read).
    fn find_charge(&self, idempotency_key: Uuid) -> BoxFuture<'_, CallOutcome>;
    /// Reads the refund made with this key (a safe, retried read).
    fn find_refund(&self, idempotency_key: Uuid) -> BoxFuture<'_, CallOutcome>;
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
