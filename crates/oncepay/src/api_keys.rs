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

/// Revokes a key (of `merchant_id` if given) and returns once every
/// running process has forgotten it (or stopped using its cache, see
/// [`KeyCache`]); `None` if there is no such live key.
pub async fn revoke(
    pool: &PgPool,
    merchant_id: Option<uuid::Uuid>,
    id: uuid::Uuid,
    actor: &crate::audit::Actor,
) -> Result<Option<(store::merchants::ApiKeyInfo, [u8; 32])>, StoreError> {
    let Some((info, hash, seq)) = store::merchants::revoke(pool, merchant_id, id, actor).await?
    else {
        return Ok(None);
    };
    wait_until_forgotten(pool, seq).await?;
    Ok(Some((info, hash)))
}

/// Waits until every running process has applied revocation `seq`.
pub(crate) async fn wait_until_forgotten(
    pool: &PgPool,
    seq: store::revocations::Seq,
) -> Result<(), StoreError> {
    let behind =
        store::revocations::wait_until_applied(pool, seq, LISTENER_STALE, REVOCATION_WAIT).await?;
    if behind > 0 {
        // Unreachable while the bounds hold (a process not heard from
        // within LISTENER_STALE no longer uses its cache); said aloud if
        // a clock or a bound is wrong.
        tracing::warn!(
            processes = behind,
            "a key revocation was not acknowledged by every process within the wait"
        );
    }
    Ok(())
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
/// expires (a rotated key's grace period ends on time in every process).
///
/// A revocation reaches every process before it answers: each process's
/// listener ([`listen_for_revocations`]) forgets the key and acknowledges
/// it, and the revoking request waits for every acknowledgement
/// (`store::revocations`). Two rules keep that promise:
/// - a key verified from the database is remembered only if nothing was
///   forgotten while it was being verified (the cache's epoch), so a
///   verification that raced a revocation cannot put the key back;
/// - the cache is used only while its listener has answered within
///   [`CACHE_TRUST`]; a process whose listener is late or disconnected
///   verifies every key from the database, which is why the revoker need
///   not wait for a process it has not seen within [`LISTENER_STALE`].
pub struct KeyCache {
    ttl: std::time::Duration,
    inner: std::sync::Mutex<Entries>,
    /// Until when the cache may be used, in milliseconds after `origin`
    /// (0: not yet, or no longer).
    trusted_until_ms: std::sync::atomic::AtomicU64,
    origin: std::time::Instant,
}

struct Entries {
    keys: std::collections::HashMap<[u8; 32], (Caller, std::time::Instant)>,
    /// Incremented by every forget and clear.
    epoch: u64,
}

/// The cache's state when a verification from the database began: a key
/// is remembered only if the cache has forgotten nothing since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

/// Keys remembered at most; past that the cache starts over.
const KEY_CACHE_MAX: usize = 10_000;

/// How often a listener tells the database it is alive (and what it has
/// applied).
pub const LISTENER_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// A process whose listener has not answered for this long is not waited
/// for by a revocation: it no longer uses its cache.
pub const LISTENER_STALE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after its listener last answered a process still uses its
/// cache: less than [`LISTENER_STALE`] by a margin that covers a round
/// trip and the two clocks' drift, so that a process the revoker stops
/// waiting for has already stopped using its cache.
pub const CACHE_TRUST: std::time::Duration = std::time::Duration::from_secs(3);

/// The longest a revocation waits for every process's acknowledgement:
/// past the staleness bound and one heartbeat, each process has either
/// acknowledged or stopped using its cache.
pub const REVOCATION_WAIT: std::time::Duration = std::time::Duration::from_secs(7);

impl KeyCache {
    /// A cache trusting a verified key for `ttl` (zero: always ask the
    /// database). It is used only once its listener has answered.
    pub fn new(ttl: std::time::Duration) -> KeyCache {
        KeyCache {
            ttl,
            inner: std::sync::Mutex::new(Entries {
                keys: std::collections::HashMap::new(),
                epoch: 0,
            }),
            trusted_until_ms: std::sync::atomic::AtomicU64::new(0),
            origin: std::time::Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn trusted(&self, now: std::time::Instant) -> bool {
        let now_ms = now.duration_since(self.origin).as_millis() as u64;
        now_ms
            < self
                .trusted_until_ms
                .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The listener answered just now: the cache may be used for
    /// [`CACHE_TRUST`] more.
    pub(crate) fn listener_answered(&self) {
        let until = (std::time::Instant::now() + CACHE_TRUST).duration_since(self.origin);
        self.trusted_until_ms.store(
            until.as_millis() as u64,
            std::sync::atomic::Ordering::Release,
        );
    }

    /// The listener lost its connection: the cache is not used until it
    /// listens again.
    pub(crate) fn listener_lost(&self) {
        self.trusted_until_ms
            .store(0, std::sync::atomic::Ordering::Release);
    }

    /// The caller of a key hash, if verified within the TTL and the cache
    /// is trusted.
    pub fn get(&self, hash: &[u8; 32]) -> Option<Caller> {
        let now = std::time::Instant::now();
        if !self.trusted(now) {
            return None;
        }
        let entries = self.lock();
        entries
            .keys
            .get(hash)
            .filter(|(caller, at)| {
                now.duration_since(*at) < self.ttl && caller.expires_at.is_none_or(|end| now < end)
            })
            .map(|(caller, _)| *caller)
    }

    /// Taken before a key is verified from the database, and handed to
    /// [`KeyCache::put`].
    pub fn ticket(&self) -> Ticket {
        Ticket(self.lock().epoch)
    }

    /// Forgets a key (revoked, or expiring).
    pub fn forget(&self, hash: &[u8; 32]) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.keys.remove(hash);
    }

    /// Forgets every key (after missing notifications).
    pub fn clear(&self) {
        let mut entries = self.lock();
        entries.epoch += 1;
        entries.keys.clear();
    }

    /// Remembers a key verified since `ticket`, unless anything was
    /// forgotten meanwhile (the verification may have raced a revocation).
    pub fn put(&self, hash: [u8; 32], caller: Caller, ticket: Ticket) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.lock();
        if entries.epoch != ticket.0 {
            return;
        }
        if entries.keys.len() >= KEY_CACHE_MAX {
            entries.keys.clear();
        }
        entries
            .keys
            .insert(hash, (caller, std::time::Instant::now()));
    }
}

/// Listens for revocations until `stop`: forgets each revoked key and
/// acknowledges it (and beats every [`LISTENER_HEARTBEAT`]) as process
/// `id` in the database, which is what a revocation waits for. If the
/// connection breaks, the cache is not used (a notification may have been
/// missed) until it listens again, cleared, from a fresh baseline.
pub(crate) async fn listen_for_revocations(
    pool: PgPool,
    cache: std::sync::Arc<KeyCache>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let id = uuid::Uuid::now_v7();
    loop {
        let session = listen_once(&pool, &cache, id);
        tokio::select! {
            ended = session => {
                cache.listener_lost();
                cache.clear();
                if let Err(e) = ended {
                    tracing::warn!(error = %e, "revocation listener lost its connection; verifying every key from the database until it listens again");
                }
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// One listening connection's life; returns when it is lost.
async fn listen_once(pool: &PgPool, cache: &KeyCache, id: uuid::Uuid) -> Result<(), StoreError> {
    use store::revocations;
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    // A lost connection ends this life (it is not silently reconnected:
    // what was announced meanwhile is lost with it).
    listener.eager_reconnect(false);
    listener.listen(revocations::CHANNEL).await?;
    // Every revocation after the baseline is announced to this
    // connection; every one up to it is committed, so a key verified after
    // the clear below is read with it.
    let mut applied = revocations::baseline(&mut listener).await?;
    cache.clear();
    let _ = revocations::forget_gone_processes(&mut listener).await?;
    let mut beat = tokio::time::interval(LISTENER_HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Whatever arrived while the last statement ran is applied before
        // the acknowledgement that covers it.
        while let Some(note) = listener.next_buffered() {
            apply(cache, &mut applied, note.payload());
        }
        revocations::acknowledge(&mut listener, id, applied).await?;
        // One that arrived during the acknowledgement is applied (and
        // acknowledged) before the cache is trusted again.
        if let Some(note) = listener.next_buffered() {
            apply(cache, &mut applied, note.payload());
            continue;
        }
        cache.listener_answered();
        tokio::select! {
            note = listener.try_recv() => match note? {
                Some(note) => apply(cache, &mut applied, note.payload()),
                None => return Ok(()),
            },
            _ = beat.tick() => {}
        }
    }
}

/// Applies one announcement (`hash` or `hash:seq`).
fn apply(cache: &KeyCache, applied: &mut store::revocations::Seq, payload: &str) {
    let (hash, seq) = match payload.split_once(':') {
        Some((hash, seq)) => (hash, seq.parse::<i64>().ok()),
        None => (payload, None),
    };
    match parse_hex_hash(hash) {
        Some(hash) => cache.forget(&hash),
        None => cache.clear(),
    }
    if let Some(seq) = seq {
        *applied = (*applied).max(store::revocations::Seq(seq));
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
    fn caller() -> super::Caller {
        super::Caller {
            merchant_id: uuid::Uuid::nil(),
            key_id: uuid::Uuid::nil(),
            scopes: super::Scopes::ALL,
            limit: None,
            expires_at: None,
        }
    }

    #[test]
    fn a_key_verified_across_a_revocation_is_not_remembered() {
        let cache = super::KeyCache::new(std::time::Duration::from_secs(30));
        cache.listener_answered();
        // A request reads the key from the database...
        let ticket = cache.ticket();
        // ...while its revocation is applied...
        cache.forget(&[1; 32]);
        // ...and then tries to remember what it read.
        cache.put([1; 32], caller(), ticket);
        assert_eq!(cache.get(&[1; 32]), None);
        cache.put([1; 32], caller(), cache.ticket());
        assert_eq!(cache.get(&[1; 32]), Some(caller()));
    }

    #[test]
    fn the_cache_is_not_used_while_its_listener_is_lost_or_silent() {
        let cache = super::KeyCache::new(std::time::Duration::from_secs(30));
        cache.put([1; 32], caller(), cache.ticket());
        assert_eq!(cache.get(&[1; 32]), None, "no listener yet");
        cache.listener_answered();
        assert_eq!(cache.get(&[1; 32]), Some(caller()));
        cache.listener_lost();
        assert_eq!(cache.get(&[1; 32]), None, "listener lost");
        assert!(super::CACHE_TRUST < super::LISTENER_STALE);
        assert!(super::REVOCATION_WAIT > super::LISTENER_STALE + super::LISTENER_HEARTBEAT);
    }

    #[test]
    fn announcements_carry_a_hash_and_a_number() {
        let cache = super::KeyCache::new(std::time::Duration::from_secs(30));
        cache.listener_answered();
        let hash = super::hash("opk_y");
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        cache.put(hash, caller(), cache.ticket());
        let mut applied = crate::store::revocations::Seq(3);
        super::apply(&cache, &mut applied, &format!("{hex}:7"));
        assert_eq!(cache.get(&hash), None);
        assert_eq!(applied, crate::store::revocations::Seq(7));
        // An older build's announcement (no number) still forgets the key.
        cache.put(hash, caller(), cache.ticket());
        super::apply(&cache, &mut applied, &hex);
        assert_eq!(cache.get(&hash), None);
        assert_eq!(applied, crate::store::revocations::Seq(7));
    }

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
        cache.listener_answered();
        let soon = super::Caller {
            merchant_id: uuid::Uuid::nil(),
            key_id: uuid::Uuid::nil(),
            scopes: super::Scopes::ALL,
            limit: None,
            expires_at: Some(std::time::Instant::now() + std::time::Duration::from_millis(50)),
        };
        cache.put([1; 32], soon, cache.ticket());
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
