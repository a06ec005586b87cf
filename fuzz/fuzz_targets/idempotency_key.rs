//! The `Idempotency-Key` header (`IdempotencyKey::try_from`), the raw
//! header bytes as the service reads them (also the checkout status page's
//! `?key=`, as `&str`).
//!
//! Properties, for any bytes:
//! - no panic, time and memory bounded;
//! - the answer is exactly the documented rule's, decided apart from the
//!   parser: a bare key, or an RFC 8941 quoted string (`"…"`, whose only
//!   escapes are `\"` and `\\`) whose content is the key; a key is 1 to 255
//!   visible ASCII characters;
//! - the `&str` and `&[u8]` readings agree;
//! - a key read is the same key sent quoted, and sent bare (unless it
//!   starts with a quote, which makes it a quoted string).

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::IDEMPOTENCY_KEY_MAX_LEN;
use oncepay::idempotency::IdempotencyKey;

fn read(raw: &[u8]) -> Option<String> {
    IdempotencyKey::try_from(raw)
        .ok()
        .map(|k| k.as_str().to_string())
}

fuzz_target!(|data: &[u8]| {
    let key = read(data);
    assert_eq!(
        key,
        expected(data),
        "header {:?}",
        String::from_utf8_lossy(data)
    );
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(
            IdempotencyKey::try_from(text),
            IdempotencyKey::try_from(data)
        );
    }
    let Some(key) = key else {
        return;
    };
    assert!((1..=IDEMPOTENCY_KEY_MAX_LEN).contains(&key.len()));
    assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{key:?}");
    let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(read(quoted.as_bytes()).as_ref(), Some(&key), "{quoted:?}");
    if !key.starts_with('"') {
        assert_eq!(read(key.as_bytes()).as_ref(), Some(&key));
    }
});

/// The rule, written apart from the parser.
fn expected(raw: &[u8]) -> Option<String> {
    let content = match raw {
        [b'"', inner @ .., b'"'] => unescape(inner)?,
        [b'"', ..] => return None,
        bare => bare.to_vec(),
    };
    let valid = !content.is_empty()
        && content.len() <= IDEMPOTENCY_KEY_MAX_LEN
        && content.iter().all(|b| (0x21..=0x7e).contains(b));
    valid.then(|| String::from_utf8(content).expect("visible ASCII"))
}

/// An sf-string's content: `\"` and `\\` are its only escapes, and a bare
/// `"` cannot appear in it.
fn unescape(inner: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&e @ (b'"' | b'\\')) => out.push(e),
                _ => return None,
            },
            b'"' => return None,
            other => out.push(other),
        }
    }
    Some(out)
}
