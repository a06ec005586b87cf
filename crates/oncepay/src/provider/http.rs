//! A provider reached over HTTP with the sandbox's protocol (section 7 of
//! the contract; documented in the README).

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Client;
use serde_json::json;
use uuid::Uuid;

use super::classify::{classify, CallKind, Verdict};
use super::{BoxFuture, CallOutcome, ChargeRequest, PaymentProvider, RefundRequest};
use crate::metrics::Metrics;

/// Retry policy: exponential backoff with full jitter, bounded by a count and
/// a total budget so that a call always ends well inside the command's lease.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// Backoff base: the n-th pause is uniform in `[0, base · 2^n]`...
    pub base: Duration,
    /// ...but never longer than this.
    pub cap: Duration,
    /// No new try starts after this much time.
    pub budget: Duration,
}

impl RetryPolicy {
    /// The pause before retry number `n` (0-based): full jitter.
    pub fn pause(&self, n: u32) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << n.min(16)).min(self.cap);
        ceiling.mul_f64(fastrand::f64())
    }
}

/// The HTTP provider client.
pub struct HttpProvider {
    client: Client,
    base_url: String,
    retry: RetryPolicy,
    metrics: Arc<Metrics>,
    health: super::Health,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the provider HTTP client: {0}")]
pub struct BuildError(#[from] reqwest::Error);

impl HttpProvider {
    /// A client for `base_url` with per-request `timeout`.
    pub fn new(
        base_url: &str,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, BuildError> {
        let client = Client::builder()
            .connect_timeout(Duration::from_secs(2).min(timeout))
            .timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(HttpProvider {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            retry: RetryPolicy {
                attempts: 4,
                base: Duration::from_millis(100),
                cap: Duration::from_secs(2),
                budget: timeout.saturating_mul(2),
            },
            metrics,
            health: super::Health::default(),
        })
    }

    /// One try: send, then classify the answer (see [`super::classify`]).
    async fn once(&self, request: reqwest::RequestBuilder, kind: CallKind) -> Verdict {
        let response = match request.send().await {
            Ok(r) => r,
            // Timeouts, refused and dropped connections: nothing tells us
            // whether the provider acted, so the outcome is unknown; the same
            // key makes trying again safe.
            Err(e) => return Verdict::Retry(describe(&e)),
        };
        let status = response.status().as_u16();
        match response.bytes().await {
            Err(e) => Verdict::Retry(describe(&e)),
            Ok(body) => classify(kind, status, &body),
        }
    }

    /// Runs a safe call with retries: every repeat carries the same provider
    /// idempotency key (or is a read), so retrying can never double an effect.
    async fn call(
        &self,
        operation: &'static str,
        kind: CallKind,
        build: impl Fn(&Client) -> reqwest::RequestBuilder,
    ) -> CallOutcome {
        let started = Instant::now();
        let mut last = String::new();
        for n in 0..self.retry.attempts {
            if n > 0 {
                let pause = self.retry.pause(n - 1);
                if started.elapsed() + pause > self.retry.budget {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            match self.once(build(&self.client), kind).await {
                Verdict::Done(outcome) => {
                    self.observe(operation, &outcome, started);
                    return outcome;
                }
                Verdict::Retry(reason) => {
                    tracing::warn!(operation, attempt = n + 1, %reason, "provider call failed; retrying with the same key");
                    last = reason;
                }
            }
        }
        let outcome = CallOutcome::Unknown(last);
        self.observe(operation, &outcome, started);
        outcome
    }

    fn observe(&self, operation: &'static str, outcome: &CallOutcome, started: Instant) {
        self.health.observe(outcome);
        let label = match outcome {
            CallOutcome::Known(o) => o.status.as_str(),
            CallOutcome::NotFound => "not_found",
            CallOutcome::Unknown(_) => "unknown",
        };
        self.metrics
            .provider_calls
            .with_label_values(&[operation, label])
            .inc();
        self.metrics
            .provider_latency
            .with_label_values(&[operation])
            .observe(started.elapsed().as_secs_f64());
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        "connection lost before an answer".into()
    }
}

impl PaymentProvider for HttpProvider {
    fn name(&self) -> &'static str {
        "sandbox"
    }

    fn health(&self) -> &super::Health {
        &self.health
    }

    fn charge<'a>(&'a self, r: &'a ChargeRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(self.call("charge", CallKind::Write, move |client| {
            client
                .post(format!("{}/v1/charges", self.base_url))
                .header("Idempotency-Key", r.idempotency_key.to_string())
                .json(&json!({
                    "amount": r.amount,
                    "currency": r.currency,
                    "source": r.payment_method,
                    "metadata": {"order_id": r.order_id, "payment_id": r.idempotency_key},
                }))
        }))
    }

    fn refund<'a>(&'a self, r: &'a RefundRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin(self.call("refund", CallKind::Write, move |client| {
            client
                .post(format!("{}/v1/refunds", self.base_url))
                .header("Idempotency-Key", r.idempotency_key.to_string())
                .json(&json!({"charge": r.charge_id, "amount": r.amount}))
        }))
    }

    fn find_charge(&self, key: Uuid) -> BoxFuture<'_, CallOutcome> {
        Box::pin(self.call("find_charge", CallKind::Read, move |client| {
            client.get(format!(
                "{}/v1/charges?idempotency_key={key}",
                self.base_url
            ))
        }))
    }

    fn find_refund(&self, key: Uuid) -> BoxFuture<'_, CallOutcome> {
        Box::pin(self.call("find_refund", CallKind::Read, move |client| {
            client.get(format!(
                "{}/v1/refunds?idempotency_key={key}",
                self.base_url
            ))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_exponential_ceiling() {
        let policy = RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
            budget: Duration::from_secs(10),
        };
        for n in 0..8 {
            let ceiling = Duration::from_millis(100 * (1 << n)).min(Duration::from_secs(1));
            for _ in 0..50 {
                assert!(policy.pause(n) <= ceiling);
            }
        }
    }
}
