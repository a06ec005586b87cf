//! Identity from a merchant's own sign-in (issue 47): a bearer token its
//! identity provider issued (a JWT) instead of an API key. The token's
//! `iss` selects the merchant (`store::identity`); a key of the issuer's
//! JWKS chosen by the token's `kid` ([`jwks`]) verifies it ([`token`]).
//! What a verified token may then do is the route table's
//! (`http::routes`): a customer acts on what it owns, a seller as a key
//! with the `read` and `write` scopes.

pub mod jwks;
pub mod token;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::principal::Role;
use crate::store::{self, StoreError};
use token::Refusal;

/// Who a verified token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The merchant whose identity provider issued it.
    pub merchant_id: Uuid,
    /// The role its roles claim grants (`None`: no role oncepay knows,
    /// which may call nothing).
    pub role: Option<Role>,
    /// Its `sub`.
    pub sub: String,
    /// Its `iss`.
    pub issuer: String,
    /// The merchant's own rate limit, if it has one (as its keys carry).
    pub limit: Option<crate::rate_limit::Limit>,
}

/// Why a token was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    /// `401 invalid_token`, saying why.
    #[error(transparent)]
    Invalid(#[from] Refusal),
    /// The database could not be asked.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Verifies tokens: the merchants' identity providers from the database,
/// their keys from this process's [`jwks::Jwks`].
pub struct Verifier {
    pool: PgPool,
    keys: jwks::Jwks,
    unknown: UnknownIssuers,
}

/// Issuers no merchant trusts, as last asked: a flood of tokens naming one
/// costs one database query per `ttl` (`ONCEPAY_AUTH_CACHE_TTL`), not one
/// each. Bounded: kept by a SHA-256 of the issuer (an issuer may be 2048
/// characters), at most [`MAX_UNKNOWN_ISSUERS`], starting over past that
/// (a flood of distinct issuers is what the per-address limit on failed
/// authentications is for, `http::auth`). An issuer a merchant comes to
/// trust is accepted at most `ttl` after a token of it was last refused.
struct UnknownIssuers {
    ttl: Duration,
    seen: Mutex<HashMap<[u8; 32], Instant>>,
}

/// Unknown issuers remembered at most (about 50 bytes each).
const MAX_UNKNOWN_ISSUERS: usize = 10_000;

impl UnknownIssuers {
    fn digest(issuer: &str) -> [u8; 32] {
        use sha2::Digest as _;
        sha2::Sha256::digest(issuer.as_bytes()).into()
    }

    /// Whether `issuer` was found unknown within the last `ttl`.
    fn holds(&self, issuer: &str) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(&Self::digest(issuer))
            .is_some_and(|at| at.elapsed() < self.ttl)
    }

    /// `issuer` was just found unknown.
    fn remember(&self, issuer: &str) {
        if self.ttl.is_zero() {
            return;
        }
        let key = Self::digest(issuer);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= MAX_UNKNOWN_ISSUERS && !seen.contains_key(&key) {
            seen.clear();
        }
        seen.insert(key, Instant::now());
    }
}

/// Bounds of the key sets' freshness (`ONCEPAY_JWKS_MIN_REFRESH`,
/// `ONCEPAY_JWKS_MAX_AGE`, `ONCEPAY_JWKS_STALE_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwksBounds {
    /// The least time a set is fresh, and the least time between two
    /// fetches of one set.
    pub min_refresh: Duration,
    /// The most time a set is fresh.
    pub max_age: Duration,
    /// The most time a set's keys are still used past its freshness while
    /// no fetch succeeds; then they are dropped.
    pub stale_max: Duration,
}

impl Verifier {
    /// A verifier on `pool`; key sets fetched through the guarded client
    /// (`allow_private` as for webhook endpoints); an issuer no merchant
    /// trusts is remembered as such for `unknown_issuer_ttl` (zero: asked
    /// every time).
    pub fn new(
        pool: PgPool,
        allow_private: bool,
        bounds: JwksBounds,
        unknown_issuer_ttl: Duration,
    ) -> Result<Verifier, reqwest::Error> {
        Ok(Verifier {
            pool,
            keys: jwks::Jwks::new(allow_private, bounds)?,
            unknown: UnknownIssuers {
                ttl: unknown_issuer_ttl,
                seen: Mutex::new(HashMap::new()),
            },
        })
    }

    /// Verifies `bearer` (a JWS): its header, its issuer (a merchant's),
    /// its signature by the issuer's key of its `kid`, its claims.
    pub async fn verify(&self, bearer: &str) -> Result<Verified, Rejected> {
        let peeked = token::peek(bearer)?;
        if self.unknown.holds(&peeked.issuer) {
            return Err(Refusal::UnknownIssuer.into());
        }
        let Some(identity) = store::identity::by_issuer(&self.pool, &peeked.issuer).await? else {
            self.unknown.remember(&peeked.issuer);
            return Err(Refusal::UnknownIssuer.into());
        };
        // Before any key is looked up: neither a token of another kind nor
        // one of an algorithm the provider does not sign with can make
        // oncepay fetch its JWKS.
        token::type_accepted(peeked.typ.as_deref(), identity.token_type.as_deref())?;
        if !identity.algorithms.contains(peeked.alg) {
            return Err(Refusal::AlgorithmNotTrusted.into());
        }
        let key = match self
            .keys
            .key(&identity.issuer, &identity.jwks_url, &peeked.kid)
            .await
        {
            jwks::Lookup::Found(key) => key,
            jwks::Lookup::Unknown => return Err(Refusal::UnknownKid.into()),
            jwks::Lookup::Unavailable => return Err(Refusal::KeysUnavailable.into()),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let expected = token::Expected {
            issuer: &identity.issuer,
            audience: &identity.audience,
            roles_claim: &identity.roles_claim,
            algorithms: identity.algorithms,
        };
        let claims = token::verify(bearer, &peeked, &key, expected, now)?;
        Ok(Verified {
            merchant_id: identity.merchant_id,
            role: claims.role,
            sub: claims.sub,
            issuer: identity.issuer,
            limit: identity.rate_limit,
        })
    }
}
