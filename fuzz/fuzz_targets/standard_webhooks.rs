//! The Standard Webhooks headers (`standard_webhooks::WebhookSecret::verify`), as
//! the sandbox adapter checks its inbound events (`webhook-id`,
//! `webhook-timestamp`, `webhook-signature`), and the `whsec_` secret
//! parser.
//!
//! Input: up to three header lines then the body: `id \n timestamp \n
//! signature \n body`; a header whose line is missing is absent. The clock
//! is fixed at `NOW`; the secret is the public development one.
//!
//! Properties, for any headers and body:
//! - no panic (overflow checks on), time and memory bounded;
//! - the verdict is the documented one, decided apart from the code under
//!   test (the MAC from the `hmac` crate, the clock in 128-bit arithmetic):
//!   `Missing` if a header is absent, else `Stale` if the timestamp is not
//!   an integer or is more than 300 s from now, else `Ok` iff one of the
//!   space-separated `v1,<base64>` is HMAC-SHA256("{id}.{timestamp}.{body}"),
//!   else `Mismatch`;
//! - what `sign` makes verifies at its own time;
//! - any text `WebhookSecret::parse` accepts is `whsec_` and the base64 of
//!   a key of at least 16 bytes, and its `to_whsec` reads back to that key.

#![no_main]

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::STANDARD_WEBHOOKS_TOLERANCE_SECS;
use oncepay::standard_webhooks::{SignatureError, WebhookSecret};
use sha2::Sha256;

/// The clock (the seeds' timestamps are near it).
const NOW: i64 = 1_800_000_000;

fuzz_target!(|data: &[u8]| {
    let mut lines = data.splitn(4, |&b| b == b'\n');
    let mut header = || {
        lines
            .next()
            .map(|l| String::from_utf8_lossy(l).into_owned())
    };
    let (id, timestamp, signatures) = (header(), header(), header());
    let body = lines.next().unwrap_or_default();

    let secret = WebhookSecret::dev();
    let verdict = secret.verify(
        id.as_deref(),
        timestamp.as_deref(),
        signatures.as_deref(),
        body,
        NOW,
    );
    assert_eq!(
        verdict,
        expected(
            secret.key(),
            id.as_deref(),
            timestamp.as_deref(),
            signatures.as_deref(),
            body
        ),
        "id {id:?}, timestamp {timestamp:?}, signatures {signatures:?}"
    );

    // Signing round trip, at the message's time if it has a sane one.
    let id = id.unwrap_or_default();
    let t = timestamp
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|t| (0..=4_102_444_800).contains(t))
        .unwrap_or(NOW);
    let signed = secret.sign(&id, t, body);
    let ts = t.to_string();
    assert_eq!(
        secret.verify(
            Some(id.as_str()),
            Some(ts.as_str()),
            Some(signed.as_str()),
            body,
            t
        ),
        Ok(())
    );

    // The secret parser, on the signature line (any text).
    if let Some(text) = signatures {
        if let Ok(parsed) = WebhookSecret::parse(&text) {
            let encoded = text.strip_prefix("whsec_").expect("whsec_ prefix");
            assert_eq!(B64.decode(encoded).ok().as_deref(), Some(parsed.key()));
            assert!(parsed.key().len() >= 16);
            let again = WebhookSecret::parse(&parsed.to_whsec()).expect("reads back");
            assert_eq!(again.key(), parsed.key());
        }
    }
});

fn expected(
    key: &[u8],
    id: Option<&str>,
    timestamp: Option<&str>,
    signatures: Option<&str>,
    body: &[u8],
) -> Result<(), SignatureError> {
    let (Some(id), Some(timestamp), Some(signatures)) = (id, timestamp, signatures) else {
        return Err(SignatureError::Missing);
    };
    let sent: i64 = timestamp.parse().map_err(|_| SignatureError::Stale)?;
    if (i128::from(NOW) - i128::from(sent)).abs() > i128::from(STANDARD_WEBHOOKS_TOLERANCE_SECS) {
        return Err(SignatureError::Stale);
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let matched = signatures
        .split(' ')
        .filter_map(|candidate| candidate.strip_prefix("v1,"))
        .filter_map(|encoded| B64.decode(encoded).ok())
        .any(|sig| sig.as_slice() == tag.as_slice());
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}
