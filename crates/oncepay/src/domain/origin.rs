//! Where a row came from, as far as a provider may be told: the hash of
//! the idempotency key it was made under (never the key) and its request's
//! fingerprint. The provider adapters write it into every object's metadata
//! (`provider::trace`), and a row rebuilt from a provider's books takes it
//! back.

use sha2::{Digest, Sha256};

/// The prefix of a stored key rebuilt from a hash. A client's key is
/// visible ASCII only, so it can never hold the space.
pub(crate) const ADOPTED_PREFIX: &str = "adopted ";

/// Where a command's row came from: the hash of its key and its request's
/// fingerprint (absent for rows no client key made, and for rows older
/// than the metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// Hex SHA-256 of the stored idempotency key.
    pub key_sha256: Option<String>,
    /// Hex of the request fingerprint.
    pub fingerprint: Option<String>,
}

impl Origin {
    /// The origin of a row stored with `key` and `fingerprint`. A row that
    /// was itself rebuilt keeps the hash it was rebuilt from.
    pub fn of(key: Option<&str>, fingerprint: Option<&[u8]>) -> Origin {
        let key_sha256 = key.map(|k| match k.strip_prefix(ADOPTED_PREFIX) {
            Some(hash) => hash.to_string(),
            None => hex(&Sha256::digest(k.as_bytes())),
        });
        Origin {
            key_sha256,
            fingerprint: fingerprint.map(hex),
        }
    }
}

/// The stored key of an idempotency record rebuilt from a key's hash.
pub(crate) fn adopted_key(key_sha256: &str) -> String {
    format!("{ADOPTED_PREFIX}{key_sha256}")
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from lower-case hex; `None` if it is not hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    // from_str_radix alone would take a leading `+` as part of a digit pair.
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
