//! How every adapter calls its provider over HTTP: one client per provider
//! (rustls, the platform's roots), retries with the same key under a
//! budget, and one place that counts calls, times them and tells
//! [`Health`](super::Health) what they came to. What an answer proves is
//! the adapter's table, passed in as `classify`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use reqwest::header::HeaderMap;
use reqwest::Client;

use super::classify::Verdict;
use super::CallOutcome;
use crate::metrics::Metrics;

/// The share of a command's lease (`ONCEPAY_IDEMPOTENCY_LEASE`) that its
/// provider calls may take, tries, pauses and reading the answers
/// included. The rest of the lease is for recording what they answered:
/// a call still running when the lease ends would be resumed by another
/// process while it runs, and its answer lost (review N5). A quarter of
/// the default 30 s lease (7.5 s) is far more than that transaction takes.
pub const LEASE_SHARE: f64 = 0.75;

/// How long the provider calls of a command leased for `lease` may take,
/// from the moment the lease was taken.
pub fn share_of_lease(lease: Duration) -> Duration {
    lease.mul_f64(LEASE_SHARE)
}

tokio::task_local! {
    /// When the command this task runs must be done with its provider:
    /// its lease's start plus [`share_of_lease`]. A command may call more
    /// than once (Stripe's create, then its confirm), so each call's
    /// budget is also cut to what is left of the command's.
    static CALLS_END: Instant;
}

/// Runs a command's `work` so that no provider call it makes outlives
/// `end`; calls made outside such a scope (the
/// reconciler's reads, webhooks' read-backs) have their policy's budget
/// only, itself within the share of a lease.
pub async fn ending_by<F: Future>(end: Instant, work: F) -> F::Output {
    CALLS_END.scope(end, work).await
}

/// What is left of the current command's time for provider calls, if the
/// task runs a command.
fn command_time_left() -> Option<Duration> {
    CALLS_END
        .try_with(|end| end.saturating_duration_since(Instant::now()))
        .ok()
}

/// Retry policy: exponential backoff with full jitter, bounded by a count and
/// a total budget so that a call always ends inside the command's lease.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// Backoff base: the n-th pause is uniform in `[0, base · 2^n]`...
    pub base: Duration,
    /// ...but never longer than this.
    pub cap: Duration,
    /// No new try starts after this much time, and no try waits past it.
    pub budget: Duration,
}

impl RetryPolicy {
    /// The policy of a client whose tries wait at most `timeout` each,
    /// under commands leased for `lease`: four tries, and in all no longer
    /// than twice `timeout` nor [`share_of_lease`], whichever is shorter.
    /// Derived, not checked: no setting of the two variables can make a
    /// call outlive a lease (a `timeout` longer than the share is cut to
    /// it, as the README's rows say).
    pub fn new(timeout: Duration, lease: Duration) -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            budget: timeout.saturating_mul(2).min(share_of_lease(lease)),
        }
    }

    /// The pause before retry number `n` (0-based): full jitter.
    pub fn pause(&self, n: u32) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << n.min(16)).min(self.cap);
        ceiling.mul_f64(fastrand::f64())
    }

    /// How long a try that starts `elapsed` into a call whose budget is
    /// `budget` may wait for its whole answer: its `timeout`, cut to what
    /// is left of the budget; `None` when nothing is left, and no try
    /// starts. So a call ends by `budget` whatever the provider does.
    pub fn try_limit(timeout: Duration, budget: Duration, elapsed: Duration) -> Option<Duration> {
        let left = budget.checked_sub(elapsed)?;
        (!left.is_zero()).then_some(timeout.min(left))
    }
}

/// An adapter's HTTP side.
pub struct Caller {
    provider: &'static str,
    client: Client,
    /// One try's own limit (`ONCEPAY_STRIPE_TIMEOUT`, `ONCEPAY_PROVIDER_TIMEOUT`).
    timeout: Duration,
    retry: RetryPolicy,
    metrics: Arc<Metrics>,
    health: super::Health,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the provider HTTP client: {0}")]
pub struct BuildError(#[from] reqwest::Error);

impl Caller {
    /// A client of `provider` with per-request `timeout`, for commands
    /// leased for `lease` (`ONCEPAY_IDEMPOTENCY_LEASE`), from which its
    /// retry budget is derived ([`RetryPolicy::new`]).
    pub fn new(
        provider: &'static str,
        timeout: Duration,
        lease: Duration,
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
            timeout,
            retry: RetryPolicy::new(timeout, lease),
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
        // Within a command, its calls together end with its share of the
        // lease; each call also within its own budget.
        let budget = match command_time_left() {
            Some(left) => self.retry.budget.min(left),
            None => self.retry.budget,
        };
        let mut last = String::from("no time was left in the command's lease to call the provider");
        let mut tried = false;
        for n in 0..self.retry.attempts {
            if n > 0 {
                let pause = self.retry.pause(n - 1);
                if started.elapsed() + pause >= budget {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            let Some(limit) = RetryPolicy::try_limit(self.timeout, budget, started.elapsed())
            else {
                break;
            };
            // reqwest's timeout covers connecting, sending and reading the
            // whole body; the outer one makes the bound hold by
            // construction, whatever the client does.
            let request = build(&self.client).timeout(limit);
            tried = true;
            let verdict = tokio::time::timeout(limit, self.once(operation, request, &classify))
                .await
                .unwrap_or_else(|_| Verdict::Retry("timed out".into()));
            match verdict {
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
        if tried {
            self.observe(operation, &outcome, started);
        } else {
            // Nothing was sent: the provider's health is not in question,
            // and the command's row waits for the reconciler.
            tracing::warn!(
                operation,
                "no provider call made: the command's share of its lease is spent"
            );
        }
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
    fn the_budget_is_the_shorter_of_twice_the_timeout_and_three_quarters_of_the_lease() {
        let lease = Duration::from_secs(30);
        // The defaults: Stripe's 30 s tries fit in 22.5 s in all, the
        // sandbox's 5 s in 10 s.
        assert_eq!(
            RetryPolicy::new(Duration::from_secs(30), lease).budget,
            Duration::from_millis(22_500)
        );
        assert_eq!(
            RetryPolicy::new(Duration::from_secs(5), lease).budget,
            Duration::from_secs(10)
        );
        // A short lease cuts a long timeout.
        assert_eq!(
            RetryPolicy::new(Duration::from_secs(10), Duration::from_secs(4)).budget,
            Duration::from_secs(3)
        );
        for (timeout, lease) in [(1, 1), (10, 4), (30, 30), (80, 30), (1, 3600)] {
            let (timeout, lease) = (Duration::from_secs(timeout), Duration::from_secs(lease));
            let budget = RetryPolicy::new(timeout, lease).budget;
            assert!(
                budget <= lease.mul_f64(LEASE_SHARE),
                "{timeout:?} {lease:?}"
            );
            assert!(budget < lease, "{timeout:?} {lease:?}");
        }
    }

    #[test]
    fn no_try_waits_past_the_budget() {
        let budget = Duration::from_secs(3);
        let timeout = Duration::from_secs(10);
        assert_eq!(
            RetryPolicy::try_limit(timeout, budget, Duration::ZERO),
            Some(budget),
            "the first try is cut to the budget"
        );
        assert_eq!(
            RetryPolicy::try_limit(timeout, budget, Duration::from_millis(2_500)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            RetryPolicy::try_limit(Duration::from_secs(1), budget, Duration::from_millis(500)),
            Some(Duration::from_secs(1)),
            "a try's own timeout when it fits"
        );
        assert_eq!(RetryPolicy::try_limit(timeout, budget, budget), None);
        assert_eq!(
            RetryPolicy::try_limit(timeout, budget, Duration::from_secs(4)),
            None
        );
        for elapsed in (0..=3_500).step_by(125).map(Duration::from_millis) {
            if let Some(limit) = RetryPolicy::try_limit(timeout, budget, elapsed) {
                assert!(elapsed + limit <= budget, "{elapsed:?} + {limit:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_command_whose_share_of_the_lease_is_spent_calls_nobody() {
        let caller = Caller::new(
            "test",
            Duration::from_secs(5),
            Duration::from_secs(30),
            Arc::new(Metrics::new()),
        )
        .expect("a client");
        let built = std::sync::atomic::AtomicUsize::new(0);
        let outcome = ending_by(
            Instant::now(),
            caller.call(
                "probe",
                |client| {
                    built.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    client.get("http://127.0.0.1:9/")
                },
                |_, _, _| Verdict::Done(CallOutcome::NotFound),
            ),
        )
        .await;
        assert!(
            matches!(&outcome, CallOutcome::Unknown(why) if why.contains("lease")),
            "{outcome:?}"
        );
        assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(!caller.health().is_degraded(), "nothing was asked");
    }

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
