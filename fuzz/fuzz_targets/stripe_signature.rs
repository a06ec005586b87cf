//! The `Stripe-Signature` header (`provider::stripe::signature::verify`),
//! checked on the raw body before anything reads it.
//!
//! Input: the header, a newline, then the body (no newline: all header,
//! empty body). The clock is fixed at `NOW`; two secrets are configured (a
//! rotation).
//!
//! Properties, for any header and body:
//! - no panic (overflow checks on: build with `-a`), time and memory
//!   bounded;
//! - the verdict is the documented one, decided apart from the code under
//!   test (the MAC from the `hmac` crate, the clock in 128-bit arithmetic):
//!   `Malformed` without a `t=` that is an integer or without a `v1=` that
//!   is hex, else `Stale` if `t` is more than 300 s from now, else `Ok` iff
//!   some `v1` is HMAC-SHA256("{t}.{body}") under one of the secrets, else
//!   `Mismatch`;
//! - what `sign` makes verifies, with either secret, at its own time.

#![no_main]

use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use oncepay::provider::stripe::signature::{sign, verify, SignatureError, TOLERANCE_SECS};
use sha2::Sha256;

/// The clock (the seeds' `t` is near it).
const NOW: i64 = 1_700_000_000;
/// The endpoint secrets, as Stripe's libraries use them (the text is the key).
const SECRETS: [&str; 2] = ["whsec_test_secret", "whsec_rolled_secret"];

fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    // Header values reach the adapter as text.
    let header = String::from_utf8_lossy(header);

    let verdict = verify(&SECRETS, Some(&*header), body, NOW);
    assert_eq!(
        verdict,
        expected(&header, body),
        "header {header:?}, body {:?}",
        String::from_utf8_lossy(body)
    );
    assert_eq!(
        verify(&SECRETS, None, body, NOW),
        Err(SignatureError::Malformed)
    );

    // Signing round trip, at the header's time if it has a sane one.
    let t = timestamp(&header)
        .and_then(|t| t.parse::<i64>().ok())
        .filter(|t| (0..=4_102_444_800).contains(t))
        .unwrap_or(NOW);
    for secret in SECRETS {
        let signed = sign(secret, t, body);
        assert_eq!(
            verify(&SECRETS, Some(signed.as_str()), body, t),
            Ok(()),
            "{signed}"
        );
        assert_eq!(
            verify(&["whsec_someone_else"], Some(signed.as_str()), body, t),
            Err(SignatureError::Mismatch)
        );
    }
});

/// The last `t=` of the header.
fn timestamp(header: &str) -> Option<&str> {
    header
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("t="))
        .last()
}

fn expected(header: &str, body: &[u8]) -> Result<(), SignatureError> {
    let signatures: Vec<Vec<u8>> = header
        .split(',')
        .filter_map(|part| part.trim().strip_prefix("v1="))
        .filter_map(hex)
        .collect();
    let t_text = timestamp(header).ok_or(SignatureError::Malformed)?;
    let t: i64 = t_text.parse().map_err(|_| SignatureError::Malformed)?;
    if signatures.is_empty() {
        return Err(SignatureError::Malformed);
    }
    if (i128::from(NOW) - i128::from(t)).abs() > i128::from(TOLERANCE_SECS) {
        return Err(SignatureError::Stale);
    }
    let matched = SECRETS.iter().any(|secret| {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
        mac.update(t_text.as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        signatures
            .iter()
            .any(|sig| sig.as_slice() == tag.as_slice())
    });
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// Hex digits (either case), two a byte; nothing else.
fn hex(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 || !bytes.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}
