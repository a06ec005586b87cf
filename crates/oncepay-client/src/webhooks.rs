//! Verifying the events oncepay sends to your webhook endpoint, before
//! you believe a byte of them. oncepay signs with the Standard Webhooks
//! scheme: `webhook-id` (the event's id, the same on every retry),
//! `webhook-timestamp` (Unix seconds) and `webhook-signature` (one or more
//! space-separated `v1,<base64 HMAC-SHA256>` of `"{id}.{timestamp}.{body}"`,
//! keyed with the base64-decoded part of the endpoint's `whsec_…` secret;
//! several while a secret is rolled).
//!
//! ```
//! use oncepay_client::webhooks::{Verifier, Headers};
//! # let secret = "whsec_b25jZXBheS1kZXZlbG9wbWVudC13ZWJob29rLXNlY3JldA==";
//! # let body = br#"{"id":"evt_1","type":"payment.succeeded","created_at":"2026-11-24T00:00:00Z","sequence":2,"data":{"object":{}}}"#;
//! # let now = 1_800_000_000;
//! # let signature = Verifier::new(secret).unwrap().sign("evt_1", now, body);
//! let verifier = Verifier::new(secret)?; // the endpoint's secret, shown once at creation
//! let headers = Headers { id: Some("evt_1"), timestamp: Some("1800000000"), signature: Some(&signature) };
//! let event = verifier.verify_at(&headers, body, now)?;
//! assert_eq!(event.event_type, "payment.succeeded");
//! // Deliveries repeat (at least once): act on `event.id` once, and on
//! // `event.sequence` in order per object.
//! # Ok::<(), oncepay_client::webhooks::VerifyError>(())
//! ```

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::Value;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a delivery's timestamp may be from now (replays of old
/// deliveries are refused).
pub const TOLERANCE_SECS: u64 = 300;

/// The three headers of a delivery, as received.
#[derive(Debug, Clone, Copy, Default)]
pub struct Headers<'a> {
    /// `webhook-id`.
    pub id: Option<&'a str>,
    /// `webhook-timestamp`.
    pub timestamp: Option<&'a str>,
    /// `webhook-signature`.
    pub signature: Option<&'a str>,
}

/// An event as oncepay delivers it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Event {
    /// The event's id (also `webhook-id`).
    pub id: String,
    /// `payment.succeeded`, `order.paid`, …
    #[serde(rename = "type")]
    pub event_type: String,
    /// RFC 3339.
    pub created_at: String,
    /// 1, 2, 3… per object: drop an event older than one already applied.
    pub sequence: i64,
    /// `{"object": …}`: the object as `GET` shows it after the change.
    pub data: Value,
}

/// Why a delivery is not to be believed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// The secret is not `whsec_<base64>`.
    #[error("the secret must be whsec_ followed by base64")]
    Secret,
    /// A header is missing.
    #[error("webhook-id, webhook-timestamp and webhook-signature are required")]
    Missing,
    /// The timestamp is unreadable or too far from now.
    #[error("webhook-timestamp is more than {TOLERANCE_SECS} s from now")]
    Stale,
    /// No signature matches (a forgery, or another endpoint's secret).
    #[error("no webhook-signature matches the body")]
    Mismatch,
    /// Signed, but not an event.
    #[error("the body is not an oncepay event: {0}")]
    Body(String),
}

/// Verifies deliveries to one endpoint.
#[derive(Clone)]
pub struct Verifier {
    keys: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verifier({} secret(s), redacted)", self.keys.len())
    }
}

impl Verifier {
    /// From the endpoint's secret (`whsec_…`); several, separated by
    /// commas, while one is rolled.
    pub fn new(secrets: &str) -> Result<Verifier, VerifyError> {
        let keys = secrets
            .split(',')
            .map(|s| {
                s.trim()
                    .strip_prefix("whsec_")
                    .and_then(|k| B64.decode(k).ok())
                    .filter(|k| !k.is_empty())
                    .ok_or(VerifyError::Secret)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Verifier { keys })
    }

    fn mac(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = match HmacSha256::new_from_slice(key) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        for part in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
            mac.update(part);
        }
        mac
    }

    /// The `webhook-signature` oncepay would send (with the first secret):
    /// for tests of your receiver.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = Self::mac(&self.keys[0], id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", B64.encode(tag))
    }

    /// Verifies a delivery received now.
    pub fn verify(&self, headers: &Headers<'_>, body: &[u8]) -> Result<Event, VerifyError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.verify_at(headers, body, now)
    }

    /// Verifies a delivery as of `now` (Unix seconds).
    pub fn verify_at(
        &self,
        headers: &Headers<'_>,
        body: &[u8],
        now: i64,
    ) -> Result<Event, VerifyError> {
        let (Some(id), Some(timestamp), Some(signatures)) =
            (headers.id, headers.timestamp, headers.signature)
        else {
            return Err(VerifyError::Missing);
        };
        let sent: i64 = timestamp.parse().map_err(|_| VerifyError::Stale)?;
        if now.abs_diff(sent) > TOLERANCE_SECS {
            return Err(VerifyError::Stale);
        }
        let matches = signatures
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|s| B64.decode(s).ok())
            .any(|tag| {
                self.keys.iter().any(|key| {
                    Self::mac(key, id, timestamp, body)
                        .verify_slice(&tag)
                        .is_ok()
                })
            });
        if !matches {
            return Err(VerifyError::Mismatch);
        }
        let event: Event =
            serde_json::from_slice(body).map_err(|e| VerifyError::Body(e.to_string()))?;
        if event.id != id {
            return Err(VerifyError::Body(format!(
                "the body's id {} is not webhook-id {id}",
                event.id
            )));
        }
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_b25jZXBheS1kZXZlbG9wbWVudC13ZWJob29rLXNlY3JldA==";
    const NOW: i64 = 1_800_000_000;
    const BODY: &[u8] =
        br#"{"id":"evt_1","type":"order.paid","created_at":"x","sequence":1,"data":{"object":{}}}"#;

    fn headers(signature: &str) -> Headers<'_> {
        Headers {
            id: Some("evt_1"),
            timestamp: Some("1800000000"),
            signature: Some(signature),
        }
    }

    #[test]
    fn a_signed_event_verifies_and_anything_else_does_not() {
        let v = Verifier::new(SECRET).unwrap();
        let sig = v.sign("evt_1", NOW, BODY);
        assert_eq!(
            v.verify_at(&headers(&sig), BODY, NOW).unwrap().event_type,
            "order.paid"
        );
        // Among others, while a secret is rolled.
        let both = format!("v1,AAAA {sig}");
        assert!(v.verify_at(&headers(&both), BODY, NOW).is_ok());
        let tampered = br#"{"id":"evt_1","type":"order.paid","created_at":"x","sequence":9,"data":{"object":{}}}"#;
        assert_eq!(
            v.verify_at(&headers(&sig), tampered, NOW),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            v.verify_at(&headers(&sig), BODY, NOW + 301),
            Err(VerifyError::Stale)
        );
        let other = Verifier::new("whsec_c29tZW9uZS1lbHNl").unwrap();
        assert_eq!(
            other.verify_at(&headers(&sig), BODY, NOW),
            Err(VerifyError::Mismatch)
        );
        let rolled = Verifier::new(&format!("whsec_c29tZW9uZS1lbHNl,{SECRET}")).unwrap();
        assert!(rolled.verify_at(&headers(&sig), BODY, NOW).is_ok());
        assert_eq!(
            v.verify_at(&Headers::default(), BODY, NOW),
            Err(VerifyError::Missing)
        );
        assert_eq!(Verifier::new("secret").unwrap_err(), VerifyError::Secret);
    }
}
