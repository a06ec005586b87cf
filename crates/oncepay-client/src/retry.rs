//! Which answers are retried, and how long to wait: the one table every
//! call of the client follows.
//!
//! | answer | what the client does |
//! |---|---|
//! | `2xx` | final: the result (a `202 pending` payment or refund is then polled) |
//! | could not connect (refused, DNS, connect timeout) | retry, same key; nothing was sent |
//! | TLS handshake failed | final, not retried: nothing was sent ([`crate::Error::NotSent`] for an intent) |
//! | timeout, connection lost, a body cut short | retry, same key |
//! | `5xx` | retry, same key |
//! | `409 idempotency_key_in_flight` | retry, same key, after `Retry-After` |
//! | `429` | retry, same key, after `Retry-After` |
//! | any other `4xx` | final: returned as [`crate::Error::Api`], never retried |
//!
//! Pauses are exponential with full jitter (uniform in
//! `[0, min(cap, base · 2^n)]`), or what `Retry-After` asks (capped too),
//! and no try starts past the deadline: then the outcome is unknown, or,
//! when every try failed while connecting, the request was not sent
//! ([`crate::Error::NotSent`]).

use std::time::Duration;

/// How the client retries. The defaults suit a checkout: a few seconds per
/// try, about half a minute in all.
///
/// ```
/// use std::time::Duration;
/// use oncepay_client::RetryPolicy;
/// let policy = RetryPolicy { deadline: Duration::from_secs(10), ..RetryPolicy::default() };
/// assert!(policy.pause(3, None) <= policy.cap);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Timeout of one try (`5s`).
    pub attempt_timeout: Duration,
    /// Backoff base (`200ms`): the n-th pause is at most `base · 2^n`…
    pub base: Duration,
    /// …and at most this (`5s`), `Retry-After` included.
    pub cap: Duration,
    /// No try starts after this much time (`30s`); a pending payment is
    /// polled until then.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempt_timeout: Duration::from_secs(5),
            base: Duration::from_millis(200),
            cap: Duration::from_secs(5),
            deadline: Duration::from_secs(30),
        }
    }
}

/// What to do with one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The answer is final.
    Final,
    /// Try again (same key), after the server's `Retry-After` if it gave one.
    Retry {
        /// Why.
        reason: String,
        /// The server's `Retry-After`.
        after: Option<Duration>,
    },
}

/// Decides on an HTTP answer with `status` and problem `code`.
pub fn decide(status: u16, code: Option<&str>, retry_after: Option<Duration>) -> Decision {
    let retry = |reason: String| Decision::Retry {
        reason,
        after: retry_after,
    };
    match status {
        200..=299 => Decision::Final,
        409 if code == Some("idempotency_key_in_flight") => retry("409 in flight".into()),
        429 => retry("429 rate limited".into()),
        500..=599 => retry(format!("{status}")),
        _ => Decision::Final,
    }
}

impl RetryPolicy {
    /// The pause before retry `n` (0-based): `Retry-After` if given, else
    /// full jitter; never above `cap`.
    pub fn pause(&self, n: u32, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(after) => after.min(self.cap),
            None => {
                let ceiling = self.base.saturating_mul(1u32 << n.min(16)).min(self.cap);
                ceiling.mul_f64(fastrand::f64())
            }
        }
    }
}

/// Reads `Retry-After` in seconds (the only form the API sends).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_answers_are_retried() {
        let retried = |status, code| matches!(decide(status, code, None), Decision::Retry { .. });
        for status in [500, 502, 503, 504, 599, 429] {
            assert!(retried(status, None), "{status}");
        }
        assert!(retried(409, Some("idempotency_key_in_flight")));
        for (status, code) in [
            (200, None),
            (201, None),
            (202, None),
            (400, Some("idempotency_key_missing")),
            (401, Some("unauthorized")),
            (404, Some("order_not_found")),
            (409, Some("idempotency_key_reused")),
            (409, Some("order_not_payable")),
            (409, Some("payment_in_progress")),
            (413, Some("payload_too_large")),
            (422, Some("validation_failed")),
        ] {
            assert!(!retried(status, code), "{status} {code:?} is final");
        }
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let policy = RetryPolicy::default();
        assert_eq!(
            policy.pause(0, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(policy.pause(0, Some(Duration::from_secs(600))), policy.cap);
        let d = decide(429, None, Some(Duration::from_secs(2)));
        assert_eq!(
            d,
            Decision::Retry {
                reason: "429 rate limited".into(),
                after: Some(Duration::from_secs(2))
            }
        );
    }

    #[test]
    fn backoff_stays_within_its_exponential_ceiling() {
        let policy = RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            ..RetryPolicy::default()
        };
        for n in 0..20 {
            let ceiling = Duration::from_millis(100)
                .saturating_mul(1 << n.min(16))
                .min(Duration::from_secs(2));
            for _ in 0..100 {
                assert!(policy.pause(n, None) <= ceiling);
            }
        }
        // Full jitter: pauses spread over the range, not all at the top.
        let pauses: Vec<Duration> = (0..200).map(|_| policy.pause(4, None)).collect();
        assert!(pauses.iter().any(|p| *p < Duration::from_millis(800)));
        assert!(pauses.iter().any(|p| *p > Duration::from_millis(800)));
    }

    #[test]
    fn retry_after_header_parses_seconds() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "3".parse().expect("value"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(reqwest::header::RETRY_AFTER, "soon".parse().expect("value"));
        assert_eq!(retry_after(&h), None);
    }
}
