//! Completed idempotency records, kept in process memory until they expire.
//!
//! A completed record never changes before it expires (only expiry frees its
//! key), so any process may answer a repeat from memory without asking the
//! database: the answer is the one the database would give. Each entry
//! expires no later than its record does, so after expiry the database
//! decides again. Executing records are never cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Fingerprint;
use crate::idempotency::persistence::{RecordId, StoredResponse};

struct Entry {
    fingerprint: Fingerprint,
    response: Arc<StoredResponse>,
    valid_until: Instant,
}

/// What the cache knows about a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Cached {
    /// The key completed with this fingerprint: replay this.
    Replay(Arc<StoredResponse>),
    /// The key completed with another fingerprint.
    Mismatch,
    /// Not cached (or expired): ask the database.
    Unknown,
}

/// A bounded map of completed records, kept in two generations: new
/// entries go into the current one; once it holds half the capacity it
/// becomes the previous one and the old previous one is dropped whole.
/// So the newest half of what was put is always kept, and making room
/// costs one swap under the lock. The entries dropped (thousands of keys
/// and bodies, milliseconds of freeing) are freed after the lock is let
/// go: when the cache used to empty itself under its lock, every request
/// of every worker waited for that (BENCHMARKS.md, twelfth round).
pub struct ReplayCache {
    generations: Mutex<Generations>,
    capacity: usize,
}

#[derive(Default)]
struct Generations {
    current: HashMap<RecordId, Entry>,
    previous: HashMap<RecordId, Entry>,
}

#[cfg(test)]
impl Generations {
    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

impl ReplayCache {
    /// A cache of at most `capacity` records, rounded up to an even number
    /// (0 disables it).
    pub fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            generations: Mutex::new(Generations::default()),
            capacity,
        }
    }

    fn generations(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.generations.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a key up.
    pub fn get(&self, id: &RecordId, fingerprint: &Fingerprint) -> Cached {
        if self.capacity == 0 {
            return Cached::Unknown;
        }
        let mut generations = self.generations();
        let g = &mut *generations;
        for generation in [&mut g.current, &mut g.previous] {
            let Some(e) = generation.get(id) else {
                continue;
            };
            return if e.valid_until <= Instant::now() {
                generation.remove(id);
                Cached::Unknown
            } else if e.fingerprint == *fingerprint {
                Cached::Replay(e.response.clone())
            } else {
                Cached::Mismatch
            };
        }
        Cached::Unknown
    }

    /// Remembers a completed record for `valid_for` (at most what is left
    /// of its life in the database).
    pub fn put(
        &self,
        id: RecordId,
        fingerprint: Fingerprint,
        response: Arc<StoredResponse>,
        valid_for: Duration,
    ) {
        if self.capacity == 0 || valid_for.is_zero() {
            return;
        }
        let entry = Entry {
            fingerprint,
            response,
            valid_until: Instant::now() + valid_for,
        };
        let dropped = {
            let mut g = self.generations();
            let dropped = if g.current.len() >= self.capacity.div_ceil(2) {
                let full = std::mem::take(&mut g.current);
                std::mem::replace(&mut g.previous, full)
            } else {
                HashMap::new()
            };
            g.previous.remove(&id);
            g.current.insert(id, entry);
            dropped
        };
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str) -> RecordId {
        RecordId {
            merchant_id: uuid::Uuid::nil(),
            key: key.into(),
        }
    }

    fn response() -> Arc<StoredResponse> {
        Arc::new(StoredResponse {
            status: 201,
            body: b"{}".to_vec(),
            location: None,
        })
    }

    #[test]
    fn replays_matches_and_refuses_mismatches() {
        let cache = ReplayCache::new(10);
        let (a, b) = (Fingerprint([1; 32]), Fingerprint([2; 32]));
        cache.put(id("k"), a, response(), Duration::from_secs(60));
        assert_eq!(cache.get(&id("k"), &a), Cached::Replay(response()));
        assert_eq!(cache.get(&id("k"), &b), Cached::Mismatch);
        assert_eq!(cache.get(&id("other"), &a), Cached::Unknown);
    }

    #[test]
    fn entries_expire_and_the_cache_stays_bounded() {
        let cache = ReplayCache::new(2);
        let f = Fingerprint([1; 32]);
        cache.put(id("gone"), f, response(), Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cache.get(&id("gone"), &f), Cached::Unknown);
        for k in ["a", "b", "c"] {
            cache.put(id(k), f, response(), Duration::from_secs(60));
        }
        assert!(cache.generations().len() <= 2);
        assert_eq!(cache.get(&id("c"), &f), Cached::Replay(response()));
        assert_eq!(ReplayCache::new(0).get(&id("c"), &f), Cached::Unknown);
    }

    #[test]
    fn a_full_cache_keeps_replaying_its_newest_half() {
        let cache = ReplayCache::new(4);
        let f = Fingerprint([1; 32]);
        for k in ["a", "b", "c", "d", "e"] {
            cache.put(id(k), f, response(), Duration::from_secs(60));
        }
        // Emptying itself when full (as it once did) would keep only "e".
        for k in ["c", "d", "e"] {
            assert_eq!(cache.get(&id(k), &f), Cached::Replay(response()), "{k}");
        }
        assert_eq!(cache.get(&id("a"), &f), Cached::Unknown);
        // A key put again is held once.
        cache.put(id("d"), f, response(), Duration::from_secs(60));
        assert_eq!(cache.generations().len(), 3);
    }
}
