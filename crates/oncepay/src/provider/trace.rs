//! What oncepay writes into the metadata of every charge and refund it
//! sends to a provider: enough to rebuild its own record of the object if
//! the database loses it (a restore, an asynchronous failover, a bug), down
//! to the idempotency record a client's retry looks for.
//!
//! | metadata key | value |
//! |---|---|
//! | `oncepay_merchant_id` | the merchant |
//! | `oncepay_order_id` | the order |
//! | `oncepay_attempt_id` | the payment attempt (for a refund: the one refunded) |
//! | `oncepay_refund_id` | the refund (refunds only) |
//! | `oncepay_key_sha256` | SHA-256 (hex) of the idempotency key as stored; never the key itself |
//! | `oncepay_fingerprint` | the request's fingerprint (hex SHA-256 of method, path and canonical body) |
//! | `oncepay_reason` | a refund's reason, if it has one |
//! | `oncepay_cancels_order` | `true` on the refund of an order's cancellation |
//!
//! A client's key may carry its own identifiers, so the provider only sees
//! its hash; a rebuilt idempotency record is stored under
//! [`adopted_key`] and takes the client's key when the client presents a
//! key of that hash (`idempotency::persistence`).

use std::collections::HashMap;

use uuid::Uuid;

pub(crate) use crate::domain::origin::{adopted_key, unhex};
pub use crate::domain::origin::{hex, Origin};

/// What a provider object says about where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The merchant.
    pub merchant_id: Uuid,
    /// The order paid (or whose payment is refunded).
    pub order_id: Uuid,
    /// The payment attempt charged (or refunded).
    pub payment_id: Uuid,
    /// The refund, for a refund.
    pub refund_id: Option<Uuid>,
    /// The key's hash and the request's fingerprint.
    pub origin: Origin,
    /// A refund's reason.
    pub reason: Option<String>,
    /// Whether the refund is an order's cancellation.
    pub cancels_order: bool,
}

/// A metadata key (see the module's table).
pub(crate) const MERCHANT: &str = "oncepay_merchant_id";
/// A metadata key (see the module's table).
pub const ORDER: &str = "oncepay_order_id";
/// A metadata key (see the module's table).
pub(crate) const ATTEMPT: &str = "oncepay_attempt_id";
/// A metadata key (see the module's table).
pub(crate) const REFUND: &str = "oncepay_refund_id";
/// A metadata key (see the module's table).
pub const KEY: &str = "oncepay_key_sha256";
/// A metadata key (see the module's table).
pub(crate) const FINGERPRINT: &str = "oncepay_fingerprint";
/// A metadata key (see the module's table).
pub(crate) const REASON: &str = "oncepay_reason";
/// A metadata key (see the module's table).
pub(crate) const CANCELS: &str = "oncepay_cancels_order";

impl Trace {
    /// The metadata pairs, in a fixed order.
    pub fn metadata(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            (MERCHANT, self.merchant_id.to_string()),
            (ORDER, self.order_id.to_string()),
            (ATTEMPT, self.payment_id.to_string()),
        ];
        if let Some(refund) = self.refund_id {
            pairs.push((REFUND, refund.to_string()));
        }
        if let Some(key) = &self.origin.key_sha256 {
            pairs.push((KEY, key.clone()));
        }
        if let Some(fingerprint) = &self.origin.fingerprint {
            pairs.push((FINGERPRINT, fingerprint.clone()));
        }
        if let Some(reason) = &self.reason {
            pairs.push((REASON, reason.clone()));
        }
        if self.cancels_order {
            pairs.push((CANCELS, "true".into()));
        }
        pairs
    }

    /// The metadata as a JSON object (the sandbox's form).
    pub fn metadata_json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = self
            .metadata()
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v)))
            .collect();
        serde_json::Value::Object(map)
    }

    /// Reads a provider object's metadata; `None` unless it names at
    /// least the merchant, the order and the attempt (an object oncepay
    /// did not make, or made before it wrote its trace).
    pub fn read(metadata: &HashMap<String, String>) -> Option<Trace> {
        let id = |key: &str| metadata.get(key).and_then(|v| Uuid::parse_str(v).ok());
        Some(Trace {
            merchant_id: id(MERCHANT)?,
            order_id: id(ORDER)?,
            payment_id: id(ATTEMPT)?,
            refund_id: id(REFUND),
            origin: Origin {
                key_sha256: metadata.get(KEY).cloned(),
                fingerprint: metadata.get(FINGERPRINT).cloned(),
            },
            reason: metadata.get(REASON).cloned(),
            cancels_order: metadata.get(CANCELS).is_some_and(|v| v == "true"),
        })
    }

    /// The trace of a charge for `attempt`.
    pub fn of_payment(attempt: &crate::domain::payment::Payment) -> Trace {
        Trace {
            merchant_id: attempt.merchant_id,
            order_id: attempt.order_id,
            payment_id: attempt.id,
            refund_id: None,
            origin: attempt.origin.clone(),
            reason: None,
            cancels_order: false,
        }
    }

    /// The trace of `refund` of `payment`.
    pub fn of_refund(
        payment: &crate::domain::payment::Payment,
        refund: &crate::domain::payment::Refund,
    ) -> Trace {
        Trace {
            refund_id: Some(refund.id),
            origin: refund.origin.clone(),
            reason: refund.reason.clone(),
            cancels_order: refund.cancels_order,
            ..Trace::of_payment(payment)
        }
    }

    /// [`Trace::read`] of a JSON metadata object (string values only).
    pub fn read_json(metadata: &serde_json::Value) -> Option<Trace> {
        let map = metadata.as_object()?;
        let strings: HashMap<String, String> = map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        Trace::read(&strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_survives_the_metadata_and_never_holds_the_key() {
        let key = "order-42-pay-customer@example.com";
        let trace = Trace {
            merchant_id: Uuid::now_v7(),
            order_id: Uuid::now_v7(),
            payment_id: Uuid::now_v7(),
            refund_id: Some(Uuid::now_v7()),
            origin: Origin::of(Some(key), Some(&[0xab; 32])),
            reason: Some("damaged".into()),
            cancels_order: true,
        };
        let pairs: HashMap<String, String> = trace
            .metadata()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert!(pairs.values().all(|v| !v.contains(key)));
        assert_eq!(Trace::read(&pairs), Some(trace.clone()));
        assert_eq!(Trace::read_json(&trace.metadata_json()), Some(trace));
    }

    #[test]
    fn a_rebuilt_row_keeps_the_hash_it_was_rebuilt_from() {
        let first = Origin::of(Some("k1"), None);
        let hash = first.key_sha256.clone().unwrap();
        assert_eq!(hash.len(), 64);
        let again = Origin::of(Some(&adopted_key(&hash)), None);
        assert_eq!(again.key_sha256, Some(hash));
    }

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xfe, 0xff];
        assert_eq!(unhex(&hex(&bytes)), Some(bytes.to_vec()));
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }
}
