//! Per-merchant rate limits: one merchant's runaway retry loop must not
//! take the service from everyone else. Checked right after
//! authentication, before anything is read or written, so a limited
//! request is effect-free: its idempotency key stays free for the retry.
//!
//! Each merchant has a GCRA limiter of its rate and burst: the process
//! default (`ONCEPAY_RATE_LIMIT_PER_SECOND`, `_BURST`), or the merchant's
//! own (`oncepay merchant rate-limit`), which its keys and its identity
//! provider's tokens both carry. The limit is per process: N `oncepay
//! serve` processes behind a balancer admit up to N times the rate
//! (documented in openapi.yaml); a global limit would cost a database
//! round trip per request.
//!
//! A limit that changes keeps the bucket's state: what was used stays used,
//! in proportion, under the new limit. Callers may carry the old limit and
//! the new one side by side for a while (a key's is cached for
//! `ONCEPAY_AUTH_CACHE_TTL`, a token's is read per request), and a bucket
//! refilled on every change would hand out a fresh burst each time they
//! alternate.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

    /// The time one request takes out of the bucket.
    fn emission(self) -> Duration {
        Duration::from_secs(1) / self.per_second.get()
    }

    /// The most time the bucket may owe: a full burst.
    fn tolerance(self) -> Duration {
        self.emission().saturating_mul(self.burst.get())
    }
}

/// The most a bucket may owe after a limit change (a bound for `Instant`'s
/// arithmetic; a real debt is at most a burst).
const MAX_DEBT: Duration = Duration::from_secs(86_400);

/// One key's bucket (GCRA): `tat` is when it is full again.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    limit: Limit,
    tat: Instant,
}

impl Bucket {
    fn full(limit: Limit, now: Instant) -> Bucket {
        Bucket { limit, tat: now }
    }

    /// The same bucket under `limit`: its debt, counted in requests, kept.
    fn relimit(&mut self, limit: Limit, now: Instant) {
        let debt = self.tat.saturating_duration_since(now).as_secs_f64();
        let requests = debt * f64::from(self.limit.per_second.get());
        // Not capped at the new burst: a debt cut short would be handed
        // back as soon as the other limit is seen again.
        let owed = Duration::try_from_secs_f64(requests / f64::from(limit.per_second.get()))
            .unwrap_or(MAX_DEBT)
            .min(MAX_DEBT);
        self.limit = limit;
        self.tat = now.checked_add(owed).unwrap_or(now);
    }

    fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        let tat = self.tat.max(now) + self.limit.emission();
        let ahead = tat.saturating_duration_since(now);
        let tolerance = self.limit.tolerance();
        if ahead > tolerance {
            return Err(ahead - tolerance);
        }
        self.tat = tat;
        Ok(())
    }
}

/// Every merchant's limiter in this process (or, keyed otherwise, every
/// checkout session's or client address's: see `http::checkout`).
pub struct RateLimits<K = Uuid> {
    default: Option<Limit>,
    buckets: Mutex<HashMap<K, Bucket>>,
}

/// Keys remembered at most; past that the map starts over (a key then gets
/// a full burst again, which is harmless).
const MAX_KEYS: usize = 100_000;

impl<K: std::hash::Hash + Eq> RateLimits<K> {
    /// Limits with this default (`None`: no limit unless a key has its own).
    pub fn new(default: Option<Limit>) -> RateLimits<K> {
        RateLimits {
            default,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Admits one request of `key` (whose own limit, if set, is `own`), or
    /// says how long to wait before the next would be admitted.
    pub fn check(&self, key: K, own: Option<Limit>) -> Result<(), Duration> {
        let Some(limit) = own.or(self.default) else {
            return Ok(());
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_KEYS && !buckets.contains_key(&key) {
            buckets.clear();
        }
        let bucket = buckets
            .entry(key)
            .or_insert_with(|| Bucket::full(limit, now));
        if bucket.limit != limit {
            bucket.relimit(limit, now);
        }
        bucket.admit(now)
    }

    /// How long `key` must wait before a request would be admitted, without
    /// counting one (`None`: it would be admitted now). For a limit on
    /// some requests only, known once they are answered (failed
    /// authentications, `http::auth`): the next request of a key over it
    /// is refused before anything is looked up, and only those that fail
    /// are counted, with [`RateLimits::check`].
    pub fn waiting(&self, key: &K, own: Option<Limit>) -> Option<Duration> {
        let limit = own.or(self.default)?;
        let now = Instant::now();
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut bucket = *buckets.get(key)?;
        if bucket.limit != limit {
            bucket.relimit(limit, now);
        }
        bucket.admit(now).err()
    }
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
    fn alternating_limits_never_refill_the_bucket() {
        // A key's cached limit and a token's fresh one, side by side.
        let limits: RateLimits = RateLimits::new(None);
        let m = Uuid::now_v7();
        let (old, new) = (Limit::new(1, 4), Limit::new(1, 3));
        let admitted = (0..20)
            .filter(|n| limits.check(m, if n % 2 == 0 { old } else { new }).is_ok())
            .count();
        assert!(admitted <= 4, "{admitted} admitted");
        // The same debt in requests under a slower limit is a longer wait.
        let slow = Limit::new(1, 2);
        let fast = Limit::new(1000, 2);
        let m = Uuid::now_v7();
        assert_eq!(limits.check(m, fast), Ok(()));
        assert_eq!(limits.check(m, fast), Ok(()));
        assert!(limits.check(m, slow).is_err(), "two used of two");
    }

    #[test]
    fn waiting_counts_nothing() {
        let limits: RateLimits<u8> = RateLimits::new(Limit::new(1, 2));
        assert_eq!(limits.waiting(&7, None), None, "never seen");
        for _ in 0..10 {
            assert_eq!(limits.waiting(&7, None), None, "asking counts nothing");
        }
        assert_eq!(limits.check(7, None), Ok(()));
        assert_eq!(limits.check(7, None), Ok(()));
        assert!(limits.waiting(&7, None).is_some(), "two counted of two");
        assert_eq!(limits.waiting(&8, None), None, "another key");
        let off: RateLimits<u8> = RateLimits::new(None);
        assert_eq!(off.check(7, None), Ok(()));
        assert_eq!(off.waiting(&7, None), None);
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
