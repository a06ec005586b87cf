//! How every adapter calls its provider over HTTP: one client per provider
//! (rustls, the platform's roots), retries with the same key under a
//! budget, and one place that counts calls, times them and tells
//! [`Health`](super::Health) what they came to. What an answer proves is
//! the adapter's table, passed in as `classify`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use reqwest::Client;

use super::classify::Verdict;
use super::CallOutcome;
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

/// An adapter's HTTP side.
pub struct Caller {
    provider: &'static str,
    client: Client,
    retry: RetryPolicy,
    metrics: Arc<Metrics>,
    health: super::Health,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the provider HTTP client: {0}")]
pub struct BuildError(#[from] reqwest::Error);

impl Caller {
    /// A client of `provider` with per-request `timeout`.
    pub fn new(
        provider: &'static str,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, BuildError> {
        let client = Client::builder()
            .connect_timeout(Duration::from_secs(2).min(timeout))
            .timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?;
        Ok(Caller {
            provider,
            client,
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

    /// Whether the provider last answered.
    pub fn health(&self) -> &super::Health {
        &self.health
    }

    /// One try: send, then classify the answer.
    async fn once(
        &self,
        operation: &'static str,
        request: reqwest::RequestBuilder,
        classify: &(dyn Fn(u16, &HeaderMap, &[u8]) -> Verdict + Sync),
    ) -> Verdict {
        let response = match request.send().await {
            Ok(r) => r,
            // Timeouts, refused and dropped connections: nothing tells us
            // whether the provider acted, so the outcome is unknown; the same
            // key makes trying again safe.
            Err(e) => return Verdict::Retry(describe(&e)),
        };
        let status = response.status().as_u16();
        if matches!(status, 401 | 403) {
            // A credential outage: counted apart so it can page on its
            // own; the adapter's table still decides what it proves.
            self.metrics
                .provider_auth_refused
                .with_label_values(&[self.provider, operation])
                .inc();
        }
        let headers = response.headers().clone();
        match response.bytes().await {
            Err(e) => Verdict::Retry(describe(&e)),
            Ok(body) => classify(status, &headers, &body),
        }
    }

    /// Runs a safe call with retries: every repeat carries the same provider
    /// idempotency key (or is a read), so retrying can never double an
    /// effect. `operation` labels the metrics.
    pub async fn call(
        &self,
        operation: &'static str,
        build: impl Fn(&Client) -> reqwest::RequestBuilder,
        classify: impl Fn(u16, &HeaderMap, &[u8]) -> Verdict + Sync,
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
            match self.once(operation, build(&self.client), &classify).await {
                Verdict::Done(outcome) => {
                    self.observe(operation, &outcome, started);
                    return outcome;
                }
                Verdict::Retry(reason) => {
                    tracing::warn!(operation, attempt = n + 1, %reason, "provider call failed; retrying with the same key");
                    last = reason;
                }
                Verdict::Bug(reason) => {
                    tracing::error!(operation, %reason, "BUG: the provider refused our request as one only a bug of ours can send; the outcome is unknown and left to the reconciler");
                    self.metrics
                        .provider_calls
                        .with_label_values(&[operation, "our_bug"])
                        .inc();
                    let outcome = CallOutcome::Unknown(reason);
                    self.observe(operation, &outcome, started);
                    return outcome;
                }
            }
        }
        let outcome = CallOutcome::Unknown(last);
        self.observe(operation, &outcome, started);
        outcome
    }

    /// A safe read whose answer the adapter parses itself (a page of a
    /// list): the body of a `2xx`, retried as [`Caller::call`] retries;
    /// any other answer (`classify` decides which are retried) is an
    /// error that says why.
    pub async fn read_body(
        &self,
        operation: &'static str,
        build: impl Fn(&Client) -> reqwest::RequestBuilder,
        classify: impl Fn(u16, &HeaderMap, &[u8]) -> Verdict + Sync,
    ) -> Result<Vec<u8>, String> {
        let slot = std::sync::Mutex::new(None);
        let outcome = self
            .call(operation, build, |status, headers, body| {
                if (200..300).contains(&status) {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(body.to_vec());
                    return Verdict::Done(CallOutcome::NotFound);
                }
                classify(status, headers, body)
            })
            .await;
        match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(body) => Ok(body),
            None => Err(match outcome {
                CallOutcome::Unknown(reason) => reason,
                other => format!("unexpected answer: {other:?}"),
            }),
        }
    }

    /// A safe read of one object whose answer the adapter parses itself
    /// (a dispute): the body of a `2xx`, `Ok(None)` for a `404`, retried
    /// as [`Caller::call`] retries; any other answer is an error that says
    /// why.
    pub async fn read_object(
        &self,
        operation: &'static str,
        build: impl Fn(&Client) -> reqwest::RequestBuilder,
        classify: impl Fn(u16, &HeaderMap, &[u8]) -> Verdict + Sync,
    ) -> Result<Option<Vec<u8>>, String> {
        let slot = std::sync::Mutex::new(None);
        let outcome = self
            .call(operation, build, |status, headers, body| {
                if (200..300).contains(&status) {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(body.to_vec());
                    return Verdict::Done(CallOutcome::NotFound);
                }
                if status == 404 {
                    return Verdict::Done(CallOutcome::NotFound);
                }
                classify(status, headers, body)
            })
            .await;
        match (
            slot.into_inner().unwrap_or_else(|e| e.into_inner()),
            outcome,
        ) {
            (Some(body), _) => Ok(Some(body)),
            (None, CallOutcome::NotFound) => Ok(None),
            (None, CallOutcome::Unknown(reason)) => Err(reason),
            (None, other) => Err(format!("unexpected answer: {other:?}")),
        }
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
