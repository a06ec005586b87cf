//! The public keys of merchants' identity providers (their JWKS), fetched
//! through the guarded outbound client and kept in this process's memory,
//! per issuer and URL.
//!
//! A key set is fresh for its answer's `Cache-Control: max-age`, held
//! between `ONCEPAY_JWKS_MIN_REFRESH` and `ONCEPAY_JWKS_MAX_AGE` (no
//! `max-age`: the lower bound). Fetches are rationed: at most one per
//! `ONCEPAY_JWKS_MIN_REFRESH` per set, whatever asks for it (a stale set,
//! or a token whose `kid` the set does not hold), so forged `kid`s cannot
//! make oncepay hammer the identity provider; concurrent requests wait for
//! the one fetch. A set replaced by a fetch replaces every key (a key the
//! provider removed stops working), and a fetch that fails keeps the keys
//! already held (an identity provider that is down does not sign everyone
//! out), for at most `ONCEPAY_JWKS_STALE_MAX` past the set's freshness: a
//! key the provider removed (perhaps because it leaked) must not stay
//! valid for as long as its JWKS cannot be reached, which whoever holds
//! the key may arrange. Then the keys are dropped, and tokens answer `503`
//! as when no key was ever held. Nothing else depends on this cache: it
//! holds only public keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Url;
use serde_json::Value;

use crate::events::outbound;

/// The largest JWKS document read.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;
/// The most keys kept of one set.
const MAX_KEYS: usize = 100;
/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// One public key of a set, as published (RFC 7517), with what it takes
/// to verify with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// `kty`: `RSA`, `EC` or `OKP`.
    pub kty: String,
    /// `alg`, if the key names the one algorithm it is for.
    pub alg: Option<String>,
    /// `crv`, for `EC` and `OKP`.
    pub crv: Option<String>,
    /// `n` and `e` (RSA), `x` and `y` (EC), `x` (OKP), base64url.
    pub components: Vec<String>,
}

impl PublicKey {
    /// Reads one key of a set; `None` for a key oncepay cannot verify
    /// with (a private or symmetric key, one for encryption only, an
    /// unknown type), which is left out rather than failing the set.
    fn read(key: &Value) -> Option<(String, PublicKey)> {
        let text = |name: &str| key.get(name).and_then(Value::as_str).map(str::to_string);
        let kid = text("kid")?;
        if text("use").is_some_and(|u| u != "sig") {
            return None;
        }
        if let Some(ops) = key.get("key_ops") {
            let verifies = ops
                .as_array()
                .is_some_and(|ops| ops.iter().any(|o| o == "verify"));
            if !verifies {
                return None;
            }
        }
        // A published private key is a provider's mistake, never a key to
        // verify with.
        if key.get("d").is_some() {
            return None;
        }
        let kty = text("kty")?;
        let components = match kty.as_str() {
            "RSA" => vec![text("n")?, text("e")?],
            "EC" => vec![text("x")?, text("y")?],
            "OKP" => vec![text("x")?],
            _ => return None,
        };
        Some((
            kid,
            PublicKey {
                kty,
                alg: text("alg"),
                crv: text("crv"),
                components,
            },
        ))
    }
}

/// The keys of a JWKS document by `kid`; an error if it is not one.
pub fn parse_set(document: &[u8]) -> Result<HashMap<String, PublicKey>, String> {
    let value: Value = serde_json::from_slice(document).map_err(|e| format!("not JSON: {e}"))?;
    let keys = value
        .get("keys")
        .and_then(Value::as_array)
        .ok_or("no \"keys\" array")?;
    Ok(keys
        .iter()
        .filter_map(PublicKey::read)
        .take(MAX_KEYS)
        .collect())
}

/// How long an answer's `Cache-Control` says its keys are fresh, within
/// `[min, max]`; the lower bound without a `max-age`, or with `no-cache` or
/// `no-store`.
pub fn freshness(cache_control: Option<&str>, min: Duration, max: Duration) -> Duration {
    let Some(header) = cache_control else {
        return min;
    };
    let mut max_age = None;
    for directive in header.split(',').map(|d| d.trim().to_ascii_lowercase()) {
        if directive == "no-cache" || directive == "no-store" {
            return min;
        }
        if let Some(seconds) = directive.strip_prefix("max-age=") {
            max_age = seconds.trim_matches('"').parse::<u64>().ok();
        }
    }
    max_age
        .map(Duration::from_secs)
        .unwrap_or(min)
        .clamp(min, max.max(min))
}

/// Why a JWKS URL is refused.
pub fn check_url(raw: &str) -> Result<Url, String> {
    let url = outbound::parse_url(raw).map_err(|e| e.to_string())?;
    match url.scheme() {
        "https" => Ok(url),
        // A test's or a developer's provider on this machine: the keys
        // cannot be swapped by anyone between the two ends.
        "http" if outbound::literal_address(&url).is_some_and(|ip| ip.is_loopback()) => Ok(url),
        _ => Err(
            "must be an https:// URL (http:// only to a loopback address such as 127.0.0.1)".into(),
        ),
    }
}

/// What looking a key up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The key.
    Found(PublicKey),
    /// The set (as last fetched) holds no key of this `kid`.
    Unknown,
    /// No set could be fetched yet.
    Unavailable,
}

/// Every set this process holds.
pub struct Jwks {
    http: reqwest::Client,
    allow_private: bool,
    min_refresh: Duration,
    max_age: Duration,
    stale_max: Duration,
    sets: Mutex<HashMap<(String, String), Arc<Set>>>,
}

struct Set {
    held: Mutex<Held>,
    /// Held while fetching: a request that needs a fetch waits for the one
    /// under way, then finds its result.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Held {
    keys: Arc<HashMap<String, PublicKey>>,
    fresh_until: Option<Instant>,
    last_attempt: Option<Instant>,
    fetched: bool,
}

impl Held {
    fn may_fetch(&self, now: Instant, min_refresh: Duration) -> bool {
        self.last_attempt
            .is_none_or(|at| now.duration_since(at) >= min_refresh)
    }

    fn fresh(&self, now: Instant) -> bool {
        self.fresh_until.is_some_and(|until| now < until)
    }

    /// Drops the keys once they have been stale for `stale_max`.
    fn expire(&mut self, now: Instant, stale_max: Duration) {
        let dead = self
            .fresh_until
            .and_then(|until| until.checked_add(stale_max))
            .is_some_and(|dead| now >= dead);
        if dead {
            if self.fetched {
                tracing::warn!("an identity provider's JWKS could not be fetched for ONCEPAY_JWKS_STALE_MAX past its freshness; dropping its keys");
            }
            self.keys = Arc::default();
            self.fresh_until = None;
            self.fetched = false;
        }
    }

    fn lookup(&self, kid: &str) -> Lookup {
        match self.keys.get(kid) {
            Some(key) => Lookup::Found(key.clone()),
            None if self.fetched => Lookup::Unknown,
            None => Lookup::Unavailable,
        }
    }
}

/// Sets held at most; past that the process starts over (only configured
/// issuers have sets, so this is a bound, not a working size).
const MAX_SETS: usize = 10_000;

impl Jwks {
    /// Sets fetched through the guarded client (`allow_private`: as
    /// webhook endpoints, `ONCEPAY_WEBHOOK_ALLOW_PRIVATE`), fresh within
    /// `[min_refresh, max_age]`, used at most `stale_max` past it.
    pub fn new(allow_private: bool, bounds: super::JwksBounds) -> Result<Jwks, reqwest::Error> {
        let super::JwksBounds {
            min_refresh,
            max_age,
            stale_max,
        } = bounds;
        Ok(Jwks {
            http: outbound::guarded_client(
                FETCH_TIMEOUT,
                allow_private,
                concat!("oncepay-jwks/", env!("CARGO_PKG_VERSION")),
            )?,
            allow_private,
            min_refresh,
            max_age,
            stale_max,
            sets: Mutex::new(HashMap::new()),
        })
    }

    fn set(&self, issuer: &str, url: &str) -> Arc<Set> {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        if sets.len() >= MAX_SETS {
            sets.clear();
        }
        sets.entry((issuer.to_string(), url.to_string()))
            .or_insert_with(|| {
                Arc::new(Set {
                    held: Mutex::new(Held::default()),
                    fetching: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    /// The key `kid` of `issuer`'s set at `url`, fetching the set if it
    /// is stale or lacks the key and a fetch is allowed now.
    pub async fn key(&self, issuer: &str, url: &str, kid: &str) -> Lookup {
        let set = self.set(issuer, url);
        let lock = |set: &Set| {
            set.held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .lookup_state(Instant::now(), self.min_refresh, self.stale_max, kid)
        };
        // A key held, and no fetch due: answered at once, even while a
        // fetch runs. Anything else waits for a fetch under way (a request
        // that arrives during the first fetch must not answer "no keys"
        // before it ends), then fetches itself if the ration allows.
        if let (found @ Lookup::Found(_), false) = lock(&set) {
            return found;
        }
        let _fetching = set.fetching.lock().await;
        // Another request may have fetched while this one waited: its
        // answer is this one's (and the ration holds).
        let now = Instant::now();
        {
            let mut held = set.held.lock().unwrap_or_else(|p| p.into_inner());
            held.expire(now, self.stale_max);
            if !held.may_fetch(now, self.min_refresh) {
                return held.lookup(kid);
            }
        }
        set.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_attempt = Some(now);
        let fetched = self.fetch(url).await;
        let mut held = set.held.lock().unwrap_or_else(|p| p.into_inner());
        match fetched {
            Ok((keys, fresh_for)) => {
                held.keys = Arc::new(keys);
                held.fresh_until = Some(now + fresh_for);
                held.fetched = true;
            }
            Err(e) => {
                tracing::warn!(issuer, error = %e, "could not fetch the identity provider's JWKS; keeping the keys already held");
                held.expire(Instant::now(), self.stale_max);
            }
        }
        held.lookup(kid)
    }

    async fn fetch(&self, raw: &str) -> Result<(HashMap<String, PublicKey>, Duration), String> {
        let url = check_url(raw)?;
        outbound::refuse_private_literal(&url, self.allow_private || url.scheme() == "http")
            .map_err(|e| e.to_string())?;
        let mut response = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| outbound::error_chain(&e))?;
        if response.status() != reqwest::StatusCode::OK {
            return Err(format!("answered {}", response.status().as_u16()));
        }
        let cache_control = response
            .headers()
            .get(reqwest::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("a JWKS larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let keys = parse_set(&body)?;
        Ok((
            keys,
            freshness(cache_control.as_deref(), self.min_refresh, self.max_age),
        ))
    }
}

impl Held {
    /// What the set holds for `kid` now (nothing once stale for
    /// `stale_max`), and whether a fetch should be tried first: the key is
    /// missing or stale, and the ration allows.
    fn lookup_state(
        &mut self,
        now: Instant,
        min_refresh: Duration,
        stale_max: Duration,
        kid: &str,
    ) -> (Lookup, bool) {
        self.expire(now, stale_max);
        let found = self.lookup(kid);
        let wanted = match &found {
            Lookup::Found(_) => !self.fresh(now),
            Lookup::Unknown | Lookup::Unavailable => true,
        };
        let fetch = wanted && self.may_fetch(now, min_refresh);
        (found, fetch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_set_keeps_only_public_signature_keys_with_a_kid() {
        let doc = json!({"keys": [
            {"kid": "r", "kty": "RSA", "n": "AQAB", "e": "AQAB", "alg": "RS256"},
            {"kid": "e", "kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},
            {"kid": "o", "kty": "OKP", "crv": "Ed25519", "x": "AA"},
            {"kid": "h", "kty": "oct", "k": "c2VjcmV0"},
            {"kid": "enc", "kty": "RSA", "n": "AQAB", "e": "AQAB", "use": "enc"},
            {"kid": "priv", "kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "d": "AA"},
            {"kid": "ops", "kty": "OKP", "crv": "Ed25519", "x": "AA", "key_ops": ["sign"]},
            {"kty": "RSA", "n": "AQAB", "e": "AQAB"},
            {"kid": "broken", "kty": "RSA", "n": "AQAB"}
        ]});
        let keys = parse_set(doc.to_string().as_bytes()).expect("a set");
        let mut kids: Vec<&str> = keys.keys().map(String::as_str).collect();
        kids.sort();
        assert_eq!(kids, ["e", "o", "r"]);
        assert_eq!(keys["r"].alg.as_deref(), Some("RS256"));
        assert!(parse_set(b"{}").is_err());
        assert!(parse_set(b"<html>").is_err());
    }

    #[test]
    fn freshness_follows_cache_control_within_bounds() {
        let (min, max) = (Duration::from_secs(30), Duration::from_secs(3600));
        assert_eq!(freshness(None, min, max), min);
        assert_eq!(
            freshness(Some("max-age=600"), min, max),
            Duration::from_secs(600)
        );
        assert_eq!(freshness(Some("public, max-age=5"), min, max), min);
        assert_eq!(freshness(Some("max-age=86400"), min, max), max);
        assert_eq!(freshness(Some("no-store"), min, max), min);
        assert_eq!(freshness(Some("max-age=600, no-cache"), min, max), min);
        assert_eq!(freshness(Some("max-age=junk"), min, max), min);
    }

    #[test]
    fn jwks_urls_are_https_or_loopback_http() {
        assert!(check_url("https://idp.example/.well-known/jwks.json").is_ok());
        assert!(check_url("http://127.0.0.1:8080/jwks").is_ok());
        assert!(check_url("http://[::1]:8080/jwks").is_ok());
        for bad in [
            "http://idp.example/jwks",
            "http://localhost/jwks",
            "http://10.0.0.1/jwks",
            "ftp://idp.example/jwks",
            "https://user:pw@idp.example/jwks",
            "jwks.json",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn keys_stale_for_stale_max_are_dropped() {
        let (min, stale_max) = (Duration::from_secs(30), Duration::from_secs(600));
        let now = Instant::now();
        let key = PublicKey {
            kty: "OKP".into(),
            alg: None,
            crv: Some("Ed25519".into()),
            components: vec!["AA".into()],
        };
        let mut held = Held {
            keys: Arc::new(HashMap::from([("k".to_string(), key.clone())])),
            fresh_until: Some(now + min),
            last_attempt: Some(now),
            fetched: true,
        };
        let stale = now + min + stale_max - Duration::from_secs(1);
        assert_eq!(
            held.lookup_state(stale, min, stale_max, "k"),
            (Lookup::Found(key), true),
            "stale, still used"
        );
        let dead = now + min + stale_max;
        assert_eq!(
            held.lookup_state(dead, min, stale_max, "k"),
            (Lookup::Unavailable, true),
            "dropped"
        );
        assert!(held.keys.is_empty());
    }

    #[test]
    fn fetches_are_rationed_per_set() {
        let min = Duration::from_secs(30);
        let now = Instant::now();
        let mut held = Held::default();
        assert_eq!(
            held.lookup_state(now, min, DAY, "k"),
            (Lookup::Unavailable, true)
        );
        held.last_attempt = Some(now);
        held.fetched = true;
        held.fresh_until = Some(now + min);
        let key = PublicKey {
            kty: "OKP".into(),
            alg: None,
            crv: Some("Ed25519".into()),
            components: vec!["AA".into()],
        };
        held.keys = Arc::new(HashMap::from([("k".to_string(), key.clone())]));
        // Fresh: no fetch. Unknown kid within the ration: no fetch.
        assert_eq!(
            held.lookup_state(now, min, DAY, "k"),
            (Lookup::Found(key.clone()), false)
        );
        assert_eq!(
            held.lookup_state(now, min, DAY, "forged"),
            (Lookup::Unknown, false)
        );
        // Past the ration: an unknown kid fetches, a stale key refreshes.
        let later = now + min;
        assert_eq!(
            held.lookup_state(later, min, DAY, "forged"),
            (Lookup::Unknown, true)
        );
        assert_eq!(
            held.lookup_state(later, min, DAY, "k"),
            (Lookup::Found(key), true)
        );
    }
}
