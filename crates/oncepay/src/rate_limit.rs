//! Per-merchant rate limits: one merchant's runaway retry loop must not
//! take the service from everyone else. Checked right after
//! authentication, before anything is read or written, so a limited
//! request is effect-free: its idempotency key stays free for the retry.
//!
//! Each merchant has a GCRA limiter (governor) of its rate and burst: the
//! process default (`ONCEPAY_RATE_LIMIT_PER_SECOND`, `_BURST`), or the
//! merchant's own (`oncepay merchant rate-limit`). The limit is per
//! process: N `oncepay serve` processes behind a balancer admit up to N
//! times the rate (documented in openapi.yaml); a global limit would cost
//! a database round trip per request.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use uuid::Uuid;

/// A rate and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Requests per second, sustained.
    pub per_second: NonZeroU32,
    /// Requests allowed at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl Limit {
    /// A limit from the numbers stored or configured; `None` if either is
    /// not positive.
    pub fn new(per_second: i64, burst: i64) -> Option<Limit> {
        let nz = |n: i64| u32::try_from(n).ok().and_then(NonZeroU32::new);
        Some(Limit {
            per_second: nz(per_second)?,
            burst: nz(burst)?,
        })
    }
}

/// Every merchant's limiter in this process (or, keyed otherwise, every
/// checkout session's or client address's: see `http::checkout`).
pub struct RateLimits<K = Uuid> {
    default: Option<Limit>,
    limiters: Mutex<HashMap<K, (Limit, Arc<DefaultDirectRateLimiter>)>>,
    clock: DefaultClock,
}

/// Keys remembered at most; past that the map starts over (a key then gets
/// a full burst again, which is harmless).
const MAX_KEYS: usize = 100_000;

impl<K: std::hash::Hash + Eq> RateLimits<K> {
    /// Limits with this default (`None`: no limit unless a key has its own).
    pub fn new(default: Option<Limit>) -> RateLimits<K> {
        RateLimits {
            default,
            limiters: Mutex::new(HashMap::new()),
            clock: DefaultClock::default(),
        }
    }

    /// Admits one request of `key` (whose own limit, if set, is `own`), or
    /// says how long to wait before the next would be admitted.
    pub fn check(&self, key: K, own: Option<Limit>) -> Result<(), Duration> {
        let Some(limit) = own.or(self.default) else {
            return Ok(());
        };
        let limiter = {
            let mut limiters = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
            if limiters.len() >= MAX_KEYS && !limiters.contains_key(&key) {
                limiters.clear();
            }
            let entry = limiters.entry(key).or_insert_with(|| fresh(limit));
            // The merchant's limit changed: start its new limiter.
            if entry.0 != limit {
                *entry = fresh(limit);
            }
            entry.1.clone()
        };
        limiter
            .check()
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

fn fresh(limit: Limit) -> (Limit, Arc<DefaultDirectRateLimiter>) {
    let quota = Quota::per_second(limit.per_second).allow_burst(limit.burst);
    (limit, Arc::new(DefaultDirectRateLimiter::direct(quota)))
}

/// Whole seconds for `Retry-After`, rounded up and at least 1, so a client
/// that waits as told is admitted.
pub(crate) fn retry_after_secs(wait: Duration) -> u32 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_then_the_rest_wait() {
        let limits: RateLimits = RateLimits::new(Limit::new(1, 3));
        let m = Uuid::now_v7();
        for _ in 0..3 {
            assert_eq!(limits.check(m, None), Ok(()));
        }
        let wait = limits.check(m, None).expect_err("over the burst");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        assert_eq!(
            limits.check(Uuid::now_v7(), None),
            Ok(()),
            "another merchant is not affected"
        );
    }

    #[test]
    fn a_merchant_limit_overrides_the_default_and_none_means_unlimited() {
        let limits: RateLimits = RateLimits::new(None);
        let m = Uuid::now_v7();
        for _ in 0..1000 {
            assert_eq!(limits.check(m, None), Ok(()));
        }
        let own = Limit::new(1, 1);
        assert_eq!(limits.check(m, own), Ok(()));
        assert!(limits.check(m, own).is_err());
        assert_eq!(
            limits.check(m, Limit::new(1000, 1000)),
            Ok(()),
            "a raised limit applies at once"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(Limit::new(0, 5), None);
        assert_eq!(Limit::new(5, -1), None);
    }
}
