//! The Standard Webhooks signing scheme, shared by the sandbox (which signs)
//! and the service (which verifies), so both ends use one implementation.
//!
//! Signed content is `"{webhook-id}.{webhook-timestamp}.{raw body}"`, the MAC
//! is HMAC-SHA256 with the base64-decoded part of the secret after `whsec_`,
//! and `webhook-signature` carries one or more space-separated `v1,<base64>`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The development webhook secret: `whsec_` + base64("oncepay-development-webhook-secret").
/// It is public on purpose, so it is refused on any address but loopback;
/// production sets `ONCEPAY_WEBHOOK_SECRET`.
pub const DEV_WEBHOOK_SECRET: &str = "whsec_b25jZXBheS1kZXZlbG9wbWVudC13ZWJob29rLXNlY3JldA==";

/// How far a webhook's timestamp may be from our clock.
pub(crate) const TIMESTAMP_TOLERANCE_SECS: i64 = 300;

/// The HMAC key of a `whsec_…` secret. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct WebhookSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// Why a secret string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// Secrets are written `whsec_<base64 key>`.
    #[error("expected whsec_ followed by the base64 of the key")]
    Format,
    /// A key shorter than this is too easy to guess.
    #[error("the key must be at least 16 bytes")]
    TooShort,
}

impl WebhookSecret {
    /// Parses `whsec_<base64>`.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text.strip_prefix("whsec_").ok_or(SecretError::Format)?;
        let key = B64.decode(encoded).map_err(|_| SecretError::Format)?;
        if key.len() < 16 {
            return Err(SecretError::TooShort);
        }
        Ok(Self { key })
    }

    /// A new random secret (32 bytes: two v4 UUIDs from the operating
    /// system's secure source, 244 random bits), for a merchant's endpoint.
    pub fn generate() -> Self {
        let mut key = Vec::with_capacity(32);
        for _ in 0..2 {
            key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        Self { key }
    }

    /// The secret of a stored HMAC key.
    pub fn from_key(key: Vec<u8>) -> Self {
        Self { key }
    }

    /// The HMAC key, as stored.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The `whsec_…` form a receiver configures.
    pub fn to_whsec(&self) -> String {
        format!("whsec_{}", B64.encode(&self.key))
    }

    /// The public development secret (`ONCEPAY_WEBHOOK_SECRET`'s default).
    pub fn dev() -> Self {
        match Self::parse(DEV_WEBHOOK_SECRET) {
            Ok(secret) => secret,
            Err(_) => unreachable!("the development secret is a valid constant (tested)"),
        }
    }

    /// True for the public development secret, which anyone with the source
    /// can sign with.
    pub fn is_development(&self) -> bool {
        self.key == Self::dev().key
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = match HmacSha256::new_from_slice(&self.key) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }

    /// The `webhook-signature` header value for a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self
            .mac(id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", B64.encode(tag))
    }

    /// Checks the three headers against the raw body, before anything else
    /// looks at the body. The comparison is constant time.
    pub fn verify(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), SignatureError> {
        let (Some(id), Some(timestamp), Some(signatures)) = (id, timestamp, signatures) else {
            return Err(SignatureError::Missing);
        };
        let sent: i64 = timestamp.parse().map_err(|_| SignatureError::Stale)?;
        // abs_diff: a timestamp near i64::MIN or MAX (unauthenticated input)
        // cannot overflow.
        if now_unix.abs_diff(sent) > TIMESTAMP_TOLERANCE_SECS.unsigned_abs() {
            return Err(SignatureError::Stale);
        }
        let expected = self.mac(id, timestamp, body);
        for candidate in signatures.split(' ') {
            let Some(encoded) = candidate.strip_prefix("v1,") else {
                continue;
            };
            let Ok(tag) = B64.decode(encoded) else {
                continue;
            };
            if expected.clone().verify_slice(&tag).is_ok() {
                return Ok(());
            }
        }
        Err(SignatureError::Mismatch)
    }
}

/// Why a webhook's signature was refused (all answered `401`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    /// One of `webhook-id`, `webhook-timestamp`, `webhook-signature` is absent.
    #[error("the webhook-id, webhook-timestamp and webhook-signature headers are required")]
    Missing,
    /// The timestamp is unreadable or more than five minutes off.
    #[error("webhook-timestamp is more than 5 minutes from the current time")]
    Stale,
    /// No `v1` signature matches.
    #[error("no webhook-signature matches the body")]
    Mismatch,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_signed_message_verifies() {
        let secret = WebhookSecret::dev();
        let sig = secret.sign("evt_1", NOW, b"{\"a\":1}");
        let ok = secret.verify(
            Some("evt_1"),
            Some("1800000000"),
            Some(&sig),
            b"{\"a\":1}",
            NOW,
        );
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn any_of_several_signatures_may_match() {
        let secret = WebhookSecret::dev();
        let good = secret.sign("evt_1", NOW, b"x");
        let header = format!("v1,AAAA v2,zzz {good}");
        assert_eq!(
            secret.verify(Some("evt_1"), Some("1800000000"), Some(&header), b"x", NOW),
            Ok(())
        );
    }

    #[test]
    fn tampering_with_any_part_fails() {
        let secret = WebhookSecret::dev();
        let sig = secret.sign("evt_1", NOW, b"body");
        let ts = "1800000000";
        let check = |id, body: &[u8]| secret.verify(Some(id), Some(ts), Some(&sig), body, NOW);
        assert_eq!(check("evt_2", b"body"), Err(SignatureError::Mismatch));
        assert_eq!(check("evt_1", b"bodY"), Err(SignatureError::Mismatch));
        let other = WebhookSecret::parse("whsec_c29tZW90aGVyc2VjcmV0a2V5MTIz").expect("valid");
        assert_eq!(
            other.verify(Some("evt_1"), Some(ts), Some(&sig), b"body", NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn stale_and_missing_headers_fail() {
        let secret = WebhookSecret::dev();
        let old = NOW - 301;
        let sig = secret.sign("evt_1", old, b"b");
        assert_eq!(
            secret.verify(Some("evt_1"), Some(&old.to_string()), Some(&sig), b"b", NOW),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            secret.verify(None, Some("1"), Some(&sig), b"b", NOW),
            Err(SignatureError::Missing)
        );
        for extreme in [i64::MIN, i64::MAX] {
            let ts = extreme.to_string();
            assert_eq!(
                secret.verify(Some("evt_1"), Some(&ts), Some(&sig), b"b", NOW),
                Err(SignatureError::Stale)
            );
            assert_eq!(
                secret.verify(Some("evt_1"), Some("0"), Some(&sig), b"b", extreme),
                Err(SignatureError::Stale)
            );
        }
    }

    #[test]
    fn secrets_must_be_whsec_base64() {
        assert_eq!(WebhookSecret::parse("abc").err(), Some(SecretError::Format));
        assert_eq!(
            WebhookSecret::parse("whsec_!!").err(),
            Some(SecretError::Format)
        );
        assert_eq!(
            WebhookSecret::parse("whsec_YWJj").err(),
            Some(SecretError::TooShort)
        );
        let dev = WebhookSecret::parse(DEV_WEBHOOK_SECRET).expect("valid");
        assert_eq!(dev.key, WebhookSecret::dev().key);
        assert_eq!(dev.key, b"oncepay-development-webhook-secret");
    }
}
