//! Property tests of the pure parts: what must hold for every input, not
//! just the examples the unit tests pick.

use oncepay::domain::payment::{PaymentStatus, Transition};
use oncepay::idempotency::fingerprint::canonical_json;
use oncepay::idempotency::{Fingerprint, IdempotencyKey};
use oncepay::standard_webhooks::{SignatureError, WebhookSecret};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Arbitrary JSON, a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        (-1e9f64..1e9).prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn ws(spaces: &mut impl Iterator<Item = usize>) -> String {
    " \n\t "
        .chars()
        .take(spaces.next().unwrap_or(0) % 4)
        .collect()
}

/// Writes `v` with its object keys in reverse order and random white space.
fn scrambled(v: &Value, spaces: &mut impl Iterator<Item = usize>) -> String {
    match v {
        Value::Object(map) => {
            let mut parts = Vec::new();
            for (k, v) in map.iter().rev() {
                let (a, b) = (ws(spaces), ws(spaces));
                parts.push(format!(
                    "{a}{}:{b}{}",
                    Value::String(k.clone()),
                    scrambled(v, spaces)
                ));
            }
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => {
            let mut parts = Vec::new();
            for v in items {
                let a = ws(spaces);
                parts.push(format!("{a}{}", scrambled(v, spaces)));
            }
            format!("[{}]", parts.join(","))
        }
        scalar => format!("{}{}", scalar, ws(spaces)),
    }
}

/// How many leaves (scalars) `v` holds.
fn leaves(v: &Value) -> usize {
    match v {
        Value::Object(map) => map.values().map(leaves).sum(),
        Value::Array(items) => items.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// A value that differs from `v`: its `which`-th leaf (modulo the number of
/// leaves) changed, or, when it holds no leaf at all (nested empty
/// containers), an element added to it. Never `None`, so the property that
/// uses it can never hold by having nothing to check.
fn changed(v: &Value, which: usize) -> Value {
    match leaves(v) {
        0 => match v {
            Value::Array(items) => {
                let mut out = items.clone();
                out.push(Value::Null);
                Value::Array(out)
            }
            Value::Object(map) => {
                let mut out = map.clone();
                out.insert("added".into(), Value::Null);
                Value::Object(out)
            }
            leaf => leaf.clone(), // unreachable: a leaf counts as one
        },
        count => {
            let mut n = which % count;
            mutate(v, &mut n).unwrap_or_else(|| v.clone())
        }
    }
}

/// Changes one leaf of `v` (the `n`-th), if it has one.
fn mutate(v: &Value, n: &mut usize) -> Option<Value> {
    match v {
        Value::Object(map) => {
            let mut out = Map::new();
            let mut changed = false;
            for (k, child) in map {
                if !changed {
                    if let Some(c) = mutate(child, n) {
                        out.insert(k.clone(), c);
                        changed = true;
                        continue;
                    }
                }
                out.insert(k.clone(), child.clone());
            }
            changed.then_some(Value::Object(out))
        }
        Value::Array(items) => {
            let mut out = items.clone();
            for (i, child) in items.iter().enumerate() {
                if let Some(c) = mutate(child, n) {
                    out[i] = c;
                    return Some(Value::Array(out));
                }
            }
            None
        }
        leaf => {
            if *n > 0 {
                *n -= 1;
                return None;
            }
            Some(match leaf {
                Value::String(s) => Value::String(format!("{s}!")),
                Value::Bool(b) => Value::Bool(!b),
                Value::Null => Value::Bool(false),
                _ => Value::String("changed".into()),
            })
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn key_order_and_white_space_never_change_the_fingerprint(v in json(), spaces in prop::collection::vec(0usize..8, 64)) {
        let text = scrambled(&v, &mut spaces.into_iter().cycle());
        let reparsed: Value = serde_json::from_str(&text).expect("scrambled JSON parses");
        prop_assert_eq!(Fingerprint::of("POST", "/orders", &v), Fingerprint::of("POST", "/orders", &reparsed));
        prop_assert_eq!(canonical_json(&v), canonical_json(&reparsed));
    }

    #[test]
    fn any_value_change_changes_the_fingerprint(v in json(), which in 0usize..64) {
        let other = changed(&v, which);
        // The generator made a real change: otherwise the check is empty.
        prop_assert_ne!(&other, &v);
        prop_assert_ne!(Fingerprint::of("POST", "/p", &v), Fingerprint::of("POST", "/p", &other));
    }

    #[test]
    fn canonical_json_is_valid_json_of_the_same_value(v in json()) {
        let back: Value = serde_json::from_str(&canonical_json(&v)).expect("canonical JSON parses");
        prop_assert_eq!(back, v);
    }

    #[test]
    fn visible_ascii_keys_parse_bare_and_quoted_to_themselves(key in "[!-~]{1,255}") {
        let parsed = |text: &str| IdempotencyKey::try_from(text).map(|k| k.as_str().to_string()).ok();
        // A bare key that starts with a quote is read as a quoted string.
        if !key.starts_with('"') {
            prop_assert_eq!(parsed(&key), Some(key.clone()));
        }
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        prop_assert_eq!(parsed(&quoted), Some(key));
    }

    #[test]
    fn keys_with_anything_but_visible_ascii_are_refused(prefix in "[!-~]{0,10}", bad in "[^!-~]", suffix in "[!-~]{0,10}") {
        let key = format!("{prefix}{bad}{suffix}");
        prop_assert!(IdempotencyKey::try_from(key.as_str()).is_err());
    }

    #[test]
    fn signed_webhooks_verify_and_any_altered_byte_fails(
        body in prop::collection::vec(any::<u8>(), 0..300),
        id in "evt_[a-z0-9]{1,20}",
        skew in -300i64..=300,
        flip in any::<prop::sample::Index>(),
    ) {
        let secret = WebhookSecret::dev();
        let now = 1_800_000_000i64;
        let sent = now - skew;
        let signature = secret.sign(&id, sent, &body);
        prop_assert_eq!(secret.verify(Some(&id), Some(&sent.to_string()), Some(&signature), &body, now), Ok(()));
        if !body.is_empty() {
            let mut altered = body.clone();
            let i = flip.index(altered.len());
            altered[i] ^= 0x01;
            prop_assert_eq!(secret.verify(Some(&id), Some(&sent.to_string()), Some(&signature), &altered, now), Err(SignatureError::Mismatch));
        }
        let stale = now - 301 - skew.abs();
        let old = secret.sign(&id, stale, &body);
        prop_assert_eq!(secret.verify(Some(&id), Some(&stale.to_string()), Some(&old), &body, now), Err(SignatureError::Stale));
    }

    #[test]
    fn payment_states_only_move_forward(observations in prop::collection::vec(0u8..3, 0..20)) {
        let all = [PaymentStatus::Pending, PaymentStatus::Succeeded, PaymentStatus::Failed];
        let mut status = PaymentStatus::Pending;
        let mut changes = 0;
        for o in observations {
            let before = status;
            if let Transition::Advance(next) = status.transition(all[o as usize]) {
                status = next;
                changes += 1;
            }
            // Once final, nothing moves it.
            if before.is_final() {
                prop_assert_eq!(status, before);
            }
        }
        prop_assert!(changes <= 1);
    }
}

proptest! {
    /// Every currency oncepay accepts, any amount it accepts: Stripe's unit
    /// either holds it exactly (and gives it back) or refuses it, never a
    /// rounded amount.
    #[test]
    fn stripe_units_round_trip_exactly_or_refuse(
        index in 0usize..200,
        amount in 1i64..=1_000_000_000_000,
        small in 1i64..=100_000,
    ) {
        use oncepay::domain::money::Currency;
        use oncepay::provider::stripe::units::{from_stripe, refund_to_stripe, to_stripe};
        let all: Vec<Currency> = Currency::all().collect();
        let currency = all[index % all.len()];
        for amount in [amount, small] {
            if let Ok(at_stripe) = to_stripe(amount, &currency) {
                prop_assert!((1..=99_999_999).contains(&at_stripe));
                prop_assert_eq!(from_stripe(at_stripe, &currency), Some(amount));
            }
            if let Ok(at_stripe) = refund_to_stripe(amount, &currency) {
                prop_assert_eq!(from_stripe(at_stripe, &currency), Some(amount));
            }
        }
    }
}
