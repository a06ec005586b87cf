//! API keys: generated from the OS's random source, shown once, stored only
//! as SHA-256 (so a leaked table leaks no key).

use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::store::{self, StoreError};

/// Every key starts with this, so a leaked key is easy to recognise and scan for.
pub(crate) const PREFIX: &str = "opk_";

/// A new random key: `opk_` + 64 hex digits (244 random bits from two v4
/// UUIDs, which draw on the operating system's secure random source).
pub fn generate() -> String {
    let mut key = String::with_capacity(PREFIX.len() + 64);
    key.push_str(PREFIX);
    for _ in 0..2 {
        key.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    key
}

/// The stored form of a key.
pub fn hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Creates a key with every scope for `merchant` (creating the merchant if
/// needed), as the operator at this terminal (`oncepay api-key create`).
pub async fn create(pool: &PgPool, merchant: &str) -> Result<String, StoreError> {
    create_scoped(pool, merchant, Scopes::ALL, &crate::audit::Actor::cli()).await
}

/// Creates a key with `scopes` for `merchant` (creating the merchant if
/// needed); the audit trail names `actor`.
pub async fn create_scoped(
    pool: &PgPool,
    merchant: &str,
    scopes: Scopes,
    actor: &crate::audit::Actor,
) -> Result<String, StoreError> {
    let key = generate();
    let new = store::merchants::NewKey {
        hash: &hash(&key),
        prefix: &key[..PREFIX.len() + 6],
        scopes,
    };
    store::merchants::add_api_key(pool, merchant, &new, actor).await?;
    Ok(key)
}

pub use crate::domain::scopes::{Scope, Scopes};

/// Who a verified key speaks for, and that merchant's own rate limit (if
/// it has one; otherwise the process default applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The merchant.
    pub merchant_id: uuid::Uuid,
    /// The key's id (the audit trail's actor).
    pub key_id: uuid::Uuid,
    /// What the key may do.
    pub scopes: Scopes,
    /// When the key stops working (its `expires_at`, on this process's
    /// monotonic clock), if it has an expiry. A cached key is never
    /// accepted past it, whatever the cache's TTL.
    pub expires_at: Option<std::time::Instant>,
    /// Its own rate limit.
    pub limit: Option<crate::rate_limit::Limit>,
}

impl From<store::merchants::KeyOwner> for Caller {
    fn from(owner: store::merchants::KeyOwner) -> Caller {
        Caller {
            merchant_id: owner.merchant_id,
            key_id: owner.key_id,
            scopes: owner.scopes,
            expires_at: owner.expires_at,
            limit: owner
                .rate_limit
                .and_then(|(rate, burst)| crate::rate_limit::Limit::new(rate.into(), burst.into())),
        }
    }
}

/// Verified keys remembered for a short time, so that a request does not
/// pay a database round trip to authenticate. Unknown keys are never
/// remembered, and a key with an expiry is remembered only until it
/// expires (a rotated key's grace period ends on time in every process). A revocation reaches every process at once through
/// PostgreSQL `NOTIFY` ([`listen_for_revocations`]); if a notification is
/// missed, a revoked key keeps working for at most the TTL.
pub struct KeyCache {
    ttl: std::time::Duration,
    entries: std::sync::Mutex<std::collections::HashMap<[u8; 32], (Caller, std::time::Instant)>>,
}

/// Keys remembered at most; past that the cache starts over.
const KEY_CACHE_MAX: usize = 10_000;

impl KeyCache {
    /// A cache trusting a verified key for `ttl` (zero: always ask the database).
    pub fn new(ttl: std::time::Duration) -> KeyCache {
        KeyCache {
            ttl,
            entries: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The caller of a key hash, if verified within the TTL.
    pub fn get(&self, hash: &[u8; 32]) -> Option<Caller> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        entries
            .get(hash)
            .filter(|(caller, at)| {
                now.duration_since(*at) < self.ttl && caller.expires_at.is_none_or(|end| now < end)
            })
            .map(|(caller, _)| *caller)
    }

    /// Forgets a key (revoked, or expiring).
    pub fn forget(&self, hash: &[u8; 32]) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(hash);
    }

    /// Forgets every key (after missing notifications).
    pub fn clear(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.clear();
    }

    /// Remembers a verified key.
    pub fn put(&self, hash: [u8; 32], caller: Caller) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= KEY_CACHE_MAX {
            entries.clear();
        }
        entries.insert(hash, (caller, std::time::Instant::now()));
    }
}

/// Listens for revocations (`LISTEN oncepay_api_keys`) and forgets each
/// revoked key, until `stop`. If the listening connection breaks, the cache
/// is cleared (a notification may have been missed) and it listens again.
pub(crate) async fn listen_for_revocations(
    pool: PgPool,
    cache: std::sync::Arc<KeyCache>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(store::merchants::REVOCATIONS).await?;
            loop {
                let note = listener.recv().await?;
                if let Some(hash) = parse_hex_hash(note.payload()) {
                    cache.forget(&hash);
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            ended = listener => {
                if let Err(e) = ended {
                    tracing::warn!(error = %e, "revocation listener lost its connection; clearing the key cache and listening again");
                }
                cache.clear();
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            _ = stop.changed() => return,
        }
    }
}

fn parse_hex_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn notification_payloads_parse_as_hashes() {
        let hash = super::hash("opk_x");
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(super::parse_hex_hash(&hex), Some(hash));
        assert_eq!(super::parse_hex_hash("zz"), None);
    }

    #[test]
    fn a_cached_key_is_refused_at_its_expiry_whatever_the_ttl() {
        let cache = super::KeyCache::new(std::time::Duration::from_secs(30));
        let soon = super::Caller {
            merchant_id: uuid::Uuid::nil(),
            key_id: uuid::Uuid::nil(),
            scopes: super::Scopes::ALL,
            limit: None,
            expires_at: Some(std::time::Instant::now() + std::time::Duration::from_millis(50)),
        };
        cache.put([1; 32], soon);
        assert_eq!(cache.get(&[1; 32]), Some(soon));
        std::thread::sleep(std::time::Duration::from_millis(80));
        assert_eq!(cache.get(&[1; 32]), None);
    }

    #[test]
    fn scopes_are_named_and_compared() {
        use super::{Scope, Scopes};
        let rw = Scopes::parse(["read", "write"]).expect("scopes");
        assert!(rw.has(Scope::Read) && rw.has(Scope::Write) && !rw.has(Scope::Admin));
        assert_eq!(rw.names(), ["read", "write"]);
        assert!(rw.within(Scopes::ALL));
        assert!(!Scopes::ALL.within(rw));
        assert_eq!(Scopes::ALL.first_outside(rw), Some(Scope::Admin));
        assert_eq!(rw.first_outside(Scopes::ALL), None);
        assert!(Scopes::parse([]).is_err());
        assert!(Scopes::parse(["root"]).is_err());
    }

    #[test]
    fn keys_are_long_random_and_distinct() {
        let a = super::generate();
        let b = super::generate();
        assert_ne!(a, b);
        assert_eq!(a.len(), 68);
        assert!(a.starts_with("opk_"));
        assert_ne!(super::hash(&a), super::hash(&b));
    }
}
