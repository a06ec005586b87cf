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

/// A bounded map of completed records.
pub struct ReplayCache {
    entries: Mutex<HashMap<RecordId, Entry>>,
    capacity: usize,
}

impl ReplayCache {
    /// A cache of at most `capacity` records (0 disables it).
    pub fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks a key up.
    pub fn get(&self, id: &RecordId, fingerprint: &Fingerprint) -> Cached {
        if self.capacity == 0 {
            return Cached::Unknown;
        }
        let mut entries = self.entries();
        match entries.get(id) {
            Some(e) if e.valid_until <= Instant::now() => {
                entries.remove(id);
                Cached::Unknown
            }
            Some(e) if e.fingerprint == *fingerprint => Cached::Replay(e.response.clone()),
            Some(_) => Cached::Mismatch,
            None => Cached::Unknown,
        }
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
        let now = Instant::now();
        let mut entries = self.entries();
        if entries.len() >= self.capacity {
            entries.retain(|_, e| e.valid_until > now);
            if entries.len() >= self.capacity {
                // Still full of live entries: start over rather than track
                // recency; a miss only costs a database read.
                entries.clear();
            }
        }
        entries.insert(
            id,
            Entry {
                fingerprint,
                response,
                valid_until: now + valid_for,
            },
        );
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
        assert!(cache.entries().len() <= 2);
        assert_eq!(cache.get(&id("c"), &f), Cached::Replay(response()));
        assert_eq!(ReplayCache::new(0).get(&id("c"), &f), Cached::Unknown);
    }
}
