//! Provider event bodies, as `POST /webhooks/{provider}` reads them once
//! their signature is verified (`inbound::apply` up to its first
//! database access): serde_json, the search for U+0000 (an event holding
//! one is stored with it written out, `rejected`), then each adapter's
//! `parse_event` (sandbox, Stripe); and Stripe's reading of an object
//! (`stripe::classify::known`), which its events go through.
//!
//! Properties, for any bytes:
//! - no panic, time and memory bounded;
//! - an event holding NUL is stored without any; one holding none is
//!   stored as it came;
//! - each adapter reads the same event the same way; an event without the
//!   `{id, type, data: {object}}` envelope is `unrecognised` with its `id`;
//!   one with it keeps its id and type;
//! - a subject is of the kind its type says (sandbox: `charge.*` a charge,
//!   `refund.*` a refund; Stripe: `payment_intent.*` a charge, `refund.*`
//!   and `charge.refunded` a refund), names a provider object (Stripe:
//!   never an empty id), and our id, if any, is the UUID the object
//!   carries where the adapter documents it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::{event_nul_at, event_without_nul, sandbox_event, stripe_event};
use oncepay::provider::{Envelope, Event, SubjectKind};
use serde_json::Value;
use uuid::Uuid;

fuzz_target!(|data: &[u8]| {
    // Stripe's answers and event objects: any bytes, no panic.
    let _ = oncepay::provider::stripe::classify::known(data);

    let Ok(payload) = serde_json::from_slice::<Value>(data) else {
        return; // answered 400 malformed_json
    };
    match event_nul_at(&payload) {
        Some(_) => {
            let stored = event_without_nul(&payload);
            assert_eq!(event_nul_at(&stored), None, "stored with a NUL: {stored:?}");
        }
        None => assert_eq!(event_without_nul(&payload), payload),
    }
    // Only NUL-free events reach the adapters; each must stand any JSON.
    check(&payload, sandbox_event, "sandbox");
    check(&payload, stripe_event, "stripe");
});

fn check(payload: &Value, parse: fn(&Value) -> Event, provider: &str) {
    let event = parse(payload);
    assert_eq!(
        event,
        parse(payload),
        "{provider}: the same event read twice differs"
    );
    let Some(envelope) = Envelope::read(payload) else {
        assert_eq!(event, Event::unrecognised(payload), "{provider}");
        return;
    };
    assert_eq!(event.id, envelope.id, "{provider}");
    assert_eq!(event.event_type, envelope.event_type, "{provider}");
    let Some(subject) = &event.subject else {
        return;
    };
    let event_type = envelope.event_type.as_str();
    let object = &envelope.data.object;
    match provider {
        "sandbox" => {
            let kind = match event_type.split('.').next() {
                Some("charge") => SubjectKind::Charge,
                Some("refund") => SubjectKind::Refund,
                _ => panic!("sandbox: a subject for {event_type:?}"),
            };
            assert_eq!(subject.kind, kind);
            assert_eq!(
                object.get("id").and_then(Value::as_str),
                Some(subject.state.id.as_str())
            );
            if let Some(ours) = subject.our_id {
                let carried = object
                    .get("idempotency_key")
                    .and_then(Value::as_str)
                    .and_then(|s| Uuid::parse_str(s).ok());
                assert_eq!(
                    carried,
                    Some(ours),
                    "sandbox: our id is not the object's key"
                );
            }
        }
        _ => {
            let (kind, key) = match event_type.split('.').next() {
                Some("payment_intent") => (SubjectKind::Charge, "oncepay_attempt_id"),
                Some("refund") => (SubjectKind::Refund, "oncepay_refund_id"),
                Some("charge") if event_type == "charge.refunded" => {
                    (SubjectKind::Refund, "oncepay_refund_id")
                }
                _ => panic!("stripe: a subject for {event_type:?}"),
            };
            assert_eq!(subject.kind, kind);
            assert!(!subject.state.id.is_empty(), "stripe: a subject without id");
            if let Some(ours) = subject.our_id {
                let carried = |o: &Value| {
                    o.pointer(&format!("/metadata/{key}"))
                        .and_then(Value::as_str)
                        .and_then(|s| Uuid::parse_str(s).ok())
                        == Some(ours)
                };
                let found = if event_type == "charge.refunded" {
                    object
                        .pointer("/refunds/data")
                        .and_then(Value::as_array)
                        .is_some_and(|refunds| refunds.iter().any(carried))
                } else {
                    carried(object)
                };
                assert!(found, "stripe: our id {ours} is not in the object");
            }
        }
    }
}
