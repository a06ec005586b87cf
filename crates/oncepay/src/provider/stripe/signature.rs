//! Stripe's webhook signature (`Stripe-Signature: t=…,v1=…[,v1=…]`),
//! checked on the raw body before anything is parsed or stored: an
//! HMAC-SHA256 of `"{t}.{body}"` keyed with the endpoint secret's text
//! (`whsec_…`, as Stripe's libraries use it), hex in each `v1`; any one
//! `v1` may match (Stripe sends two while a secret is being rolled), the
//! comparison is constant time, and `t` must be within five minutes of
//! our clock.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far `t` may be from our clock (Stripe's libraries' default).
pub const TOLERANCE_SECS: i64 = 300;

/// Why a signature was refused. Never says which part of a MAC differed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Stripe-Signature` header, or no `t=` or `v1=` in it.
    #[error("missing or malformed Stripe-Signature header")]
    Malformed,
    /// `t` is more than five minutes from now.
    #[error("the signature's timestamp is more than 5 minutes from now")]
    Stale,
    /// No `v1` matches.
    #[error("no signature matches")]
    Mismatch,
}

fn mac(secret: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The header Stripe would send for `body` at `timestamp` (for tests and
/// the fault harness).
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let t = timestamp.to_string();
    let digest = mac(secret, &t, body).finalize().into_bytes();
    let hex = crate::provider::trace::hex(&digest);
    format!("t={t},v1={hex}")
}

/// Verifies `header` for `body` at `now` (Unix seconds) with any of
/// `secrets` (several while one is being rotated).
pub fn verify(
    secrets: &[&str],
    header: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Malformed)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            Some(("v1", v)) => signatures.extend(crate::provider::trace::unhex(v)),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SignatureError::Malformed)?;
    let t: i64 = timestamp.parse().map_err(|_| SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if now.abs_diff(t) > TOLERANCE_SECS.unsigned_abs() {
        return Err(SignatureError::Stale);
    }
    let matched = secrets.iter().any(|secret| {
        signatures
            .iter()
            .any(|sig| mac(secret, timestamp, body).verify_slice(sig).is_ok())
    });
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret";
    const BODY: &[u8] = br#"{"id":"evt_1","type":"payment_intent.succeeded"}"#;

    #[test]
    fn timestamps_at_the_ends_of_i64_are_stale_not_a_panic() {
        // Found by the stripe_signature fuzz target: `(now - t).abs()`
        // overflowed for a `t` far from now.
        for t in [i64::MIN, i64::MIN + 1, i64::MAX] {
            let header = format!("t={t},v1=00");
            assert_eq!(
                verify(&[SECRET], Some(&header), BODY, 1_700_000_000),
                Err(SignatureError::Stale)
            );
        }
        // A `+` is not a hex digit: `v1=+0` is no signature at all.
        assert_eq!(
            verify(&[SECRET], Some("t=1700000000,v1=+0"), BODY, 1_700_000_000),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn a_signed_body_verifies_and_any_change_fails() {
        let header = sign(SECRET, 1_700_000_000, BODY);
        assert_eq!(
            verify(&[SECRET], Some(&header), BODY, 1_700_000_100),
            Ok(())
        );
        assert_eq!(
            verify(&[SECRET], Some(&header), b"{}", 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&["whsec_other"], Some(&header), BODY, 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
        let later = header.replace("t=1700000000", "t=1700000001");
        assert_eq!(
            verify(&[SECRET], Some(&later), BODY, 1_700_000_100),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn a_known_vector_and_a_rotation_verify() {
        // Computed independently, with OpenSSL:
        // printf '%s' '1700000000.<BODY>' | openssl dgst -sha256 -hmac whsec_test_secret
        let header = sign(SECRET, 1_700_000_000, BODY);
        assert_eq!(
            header,
            "t=1700000000,v1=22d8dc182f5c588077683bd378368e29765bfe5df2560112b4f28fef120f0e31"
        );
        let rolled = format!("{header},v1={}", "00".repeat(32));
        assert_eq!(
            verify(&[SECRET], Some(&rolled), BODY, 1_700_000_000),
            Ok(())
        );
        let old_first = format!("t=1700000000,v1={},{}", "ab".repeat(32), &header[13..]);
        assert_eq!(
            verify(&[SECRET], Some(&old_first), BODY, 1_700_000_000),
            Ok(())
        );
        assert_eq!(
            verify(&["whsec_old", SECRET], Some(&header), BODY, 1_700_000_000),
            Ok(()),
            "the new secret while the old one is still configured"
        );
    }

    #[test]
    fn stale_and_malformed_headers_fail() {
        let header = sign(SECRET, 1_700_000_000, BODY);
        assert_eq!(
            verify(&[SECRET], Some(&header), BODY, 1_700_000_301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify(&[SECRET], Some(&header), BODY, 1_699_999_699),
            Err(SignatureError::Stale)
        );
        for bad in [
            "",
            "t=1700000000",
            "v1=00",
            "t=x,v1=00",
            "t=1700000000,v1=zz",
        ] {
            assert_eq!(
                verify(&[SECRET], Some(bad), BODY, 1_700_000_000),
                Err(SignatureError::Malformed),
                "{bad}"
            );
        }
        assert_eq!(
            verify(&[SECRET], None, BODY, 0),
            Err(SignatureError::Malformed)
        );
    }
}
