//! The `Idempotency-Key` header, parsed once into a type that can only hold a
//! valid key.

/// A client's idempotency key: 1–255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a key (answered `400 idempotency_key_invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Idempotency-Key must be 1 to 255 visible ASCII characters, bare or as a quoted string")]
pub struct InvalidKey;

/// Longest key accepted, in characters.
pub(crate) const MAX_KEY_LEN: usize = 255;

impl IdempotencyKey {
    /// The key as stored (without quotes).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn visible_ascii(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_KEY_LEN && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Undoes a Structured Field string (RFC 8941 §3.3.3): `\"` and `\\` are
/// the only escapes; anything else after a backslash is malformed.
fn unquote(inner: &str) -> Option<String> {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return None,
            },
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

impl TryFrom<&[u8]> for IdempotencyKey {
    type Error = InvalidKey;

    /// Accepts the raw header bytes: a bare key (Stripe style) or a quoted
    /// string (the IETF draft's Structured Field form).
    fn try_from(raw: &[u8]) -> Result<Self, Self::Error> {
        let text = std::str::from_utf8(raw).map_err(|_| InvalidKey)?;
        let key = match text.strip_prefix('"') {
            Some(rest) => {
                let inner = rest.strip_suffix('"').ok_or(InvalidKey)?;
                unquote(inner).ok_or(InvalidKey)?
            }
            None => text.to_string(),
        };
        if visible_ascii(&key) {
            Ok(IdempotencyKey(key))
        } else {
            Err(InvalidKey)
        }
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(raw: &str) -> Result<Self, Self::Error> {
        IdempotencyKey::try_from(raw.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Result<String, InvalidKey> {
        IdempotencyKey::try_from(s).map(|k| k.as_str().to_string())
    }

    #[test]
    fn bare_and_quoted_keys_are_the_same_key() {
        assert_eq!(key("abc-123"), Ok("abc-123".into()));
        assert_eq!(key("\"abc-123\""), Ok("abc-123".into()));
        assert_eq!(key("\"a\\\"b\""), Ok("a\"b".into()));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            "",
            "\"\"",
            "has space",
            "tab\there",
            "\"unterminated",
            "\"bad\\escape\"",
            "\"inner\"quote\"",
            "caf\u{e9}",
            "\"with space\"",
        ] {
            assert_eq!(key(bad), Err(InvalidKey), "{bad:?}");
        }
        assert!(key(&"k".repeat(255)).is_ok());
        assert_eq!(key(&"k".repeat(256)), Err(InvalidKey));
        assert_eq!(IdempotencyKey::try_from(&[0xff, 0xfe][..]), Err(InvalidKey));
    }
}
