//! What one of the sandbox's answers proves: the one place that turns its
//! HTTP status and body into a fact about money, a pure table with its own
//! tests (under the rules of `provider::classify`).
//!
//! | answer | status read (`GET`) | charge or refund (`POST`) |
//! |---|---|---|
//! | `2xx` with a readable object | the object | the object (its `status` may be `failed`: a decline) |
//! | `2xx` with an unreadable body | unknown | unknown |
//! | `404` | no such object | unknown |
//! | `402` with a decline code (`card_declined`, `invalid_payment_method`, …) | unknown | declined |
//! | `408`, `429`, `5xx` | unknown, retried now | unknown, retried now (same key) |
//! | anything else: `3xx`, `401`, `403`, `407`, `409`, other `4xx` | unknown | unknown |
//!
//! "Unknown" never settles anything: the payment or refund stays `pending`
//! and the reconciler asks again later. A refused read (a rotated
//! credential, a WAF) is not a decline, and a `409` on a charge (the
//! provider's key in use by a concurrent request) is not a failure: treating
//! either as final would make the order payable again while the provider may
//! still take the money, which is how a double charge is born.

use serde::Deserialize;

use crate::domain::payment::PaymentStatus;
use crate::provider::classify::{CallKind, Verdict};
use crate::provider::{CallOutcome, ProviderObject};

/// The decline codes of the sandbox's documented decline answer (`402`).
/// Any other code on a `402` proves nothing.
pub(crate) const DECLINE_CODES: &[&str] = &[
    "card_declined",
    "invalid_payment_method",
    "insufficient_funds",
    "expired_card",
    "incorrect_cvc",
];

/// A charge or refund as the sandbox writes it.
#[derive(Debug, Deserialize)]
pub struct Object {
    /// `ch_…`, `re_…`.
    pub id: String,
    /// `pending`, `succeeded`, `failed`.
    pub status: String,
    #[serde(default)]
    failure_code: Option<String>,
    #[serde(default)]
    failure_message: Option<String>,
    /// While the charge waits for its customer (`tok_3ds`).
    #[serde(default)]
    next_action: Option<Redirect>,
    /// An authorized charge's deadline, Unix seconds.
    #[serde(default)]
    capture_before: Option<i64>,
    /// A captured charge's capture.
    #[serde(default)]
    amount_captured: Option<i64>,
}

/// A sandbox status in ours: a held charge is `authorized`, then
/// `captured`, `voided` or `expired`; the others are ours already.
fn status_of(sandbox: &str) -> Option<PaymentStatus> {
    Some(match sandbox {
        "authorized" => PaymentStatus::RequiresCapture,
        "captured" => PaymentStatus::Succeeded,
        "voided" | "expired" => PaymentStatus::Voided,
        other => {
            return PaymentStatus::parse(other)
                .filter(|s| !matches!(s, PaymentStatus::RequiresCapture | PaymentStatus::Voided))
        }
    })
}

/// A charge's `next_action`: `{"type": "redirect", "url": …}`.
#[derive(Debug, Deserialize)]
struct Redirect {
    url: String,
}

impl Object {
    /// In our terms; `None` for a status the sandbox does not document.
    pub fn to_provider_object(&self) -> Option<ProviderObject> {
        Some(ProviderObject {
            id: self.id.clone(),
            status: status_of(&self.status)?,
            failure_code: self.failure_code.clone(),
            failure_message: self.failure_message.clone(),
            next_action: self
                .next_action
                .as_ref()
                .map(|r| crate::domain::payment::NextAction::redirect(&r.url)),
            capture_before: self.capture_before,
            amount_captured: self.amount_captured.filter(|_| self.status == "captured"),
        })
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<String>,
    #[serde(default, alias = "message")]
    detail: Option<String>,
}

/// A dispute as the sandbox writes it (`GET /v1/disputes/{id}`).
#[derive(Debug, Deserialize)]
struct SandboxDispute {
    id: String,
    charge_id: String,
    amount: i64,
    status: String,
    reason: String,
    #[serde(default)]
    evidence_due_by: Option<i64>,
}

/// A sandbox dispute in our terms: its statuses are ours
/// (`needs_response`, `under_review`, `won`, `lost`); `None` for an
/// unreadable body or another status.
pub(crate) fn dispute(body: &[u8]) -> Option<crate::provider::ProviderDispute> {
    let d: SandboxDispute = serde_json::from_slice(body).ok()?;
    let status = crate::domain::dispute::DisputeStatus::parse(&d.status)?;
    if d.id.is_empty() || d.amount < 1 {
        return None;
    }
    Some(crate::provider::ProviderDispute {
        id: d.id,
        charge: d.charge_id,
        amount: d.amount,
        status: Some(status),
        provider_status: d.status,
        // The sandbox's disputes are all chargebacks.
        inquiry: false,
        reason: d.reason,
        evidence_due_by: d.evidence_due_by,
    })
}

/// Classifies one answer; see the module docs for the table.
pub(crate) fn classify(kind: CallKind, status: u16, body: &[u8]) -> Verdict {
    match status {
        200..=299 => Verdict::Done(match serde_json::from_slice::<Object>(body) {
            Ok(object) if object.id.is_empty() => {
                CallOutcome::Unknown("provider object without an id".into())
            }
            Ok(object) => match object.to_provider_object() {
                Some(known) => CallOutcome::Known(known),
                None => CallOutcome::Unknown(format!("unknown status {}", object.status)),
            },
            Err(e) => CallOutcome::Unknown(format!("unreadable provider answer ({status}): {e}")),
        }),
        404 if kind == CallKind::Read => Verdict::Done(CallOutcome::NotFound),
        402 if kind == CallKind::Write => match decline(body) {
            Some(object) => Verdict::Done(CallOutcome::Known(object)),
            None => Verdict::Done(CallOutcome::Unknown(
                "provider answered 402 without a documented decline code".into(),
            )),
        },
        408 | 429 | 500..=599 => Verdict::Retry(format!("provider answered {status}")),
        _ => Verdict::Done(CallOutcome::Unknown(format!(
            "provider answered {status}, which proves nothing about the outcome"
        ))),
    }
}

/// The codes of the sandbox's refusals of a capture or a void (`409`),
/// whose body carries the charge as it is: the provider's word on a
/// hold that expired, was released or was captured first.
pub(crate) const HOLD_REFUSALS: &[&str] = &[
    "charge_expired_for_capture",
    "charge_voided",
    "charge_already_captured",
    "charge_not_capturable",
];

#[derive(Deserialize)]
struct Refusal {
    code: String,
    charge: Object,
}

/// Classifies the answer to a capture: a documented decline of the
/// capture (`402` with a decline code, as a card's issuer may refuse a
/// capture: `POST /v1/charges/{id}/refuse_capture` asks the sandbox for
/// one) is the capture refused, `failed` with its code, a fact about this
/// capture and never about the hold: the caller reads the charge back
/// before the capture ends (a gateway's lying decline of a capture that
/// was made reads captured). Anything else as [`classify_hold`].
pub(crate) fn classify_capture(status: u16, body: &[u8]) -> Verdict {
    if status == 402 {
        return Verdict::Done(match decline(body) {
            Some(refused) => CallOutcome::Known(refused),
            None => CallOutcome::Unknown(
                "provider answered 402 to a capture without a documented decline code".into(),
            ),
        });
    }
    classify_hold(status, body)
}

/// Classifies the answer to a capture or a void: a documented refusal
/// (`409` carrying the charge) is the charge's state, a fact; anything
/// else as any write.
pub(crate) fn classify_hold(status: u16, body: &[u8]) -> Verdict {
    // A void is never declined: the sandbox documents no `402` for one,
    // and one proves nothing about the hold, never taken as a void. (A
    // capture's is [`classify_capture`]'s.)
    if status == 402 {
        return Verdict::Done(CallOutcome::Unknown(
            "provider answered 402 to a void, which it never documents".into(),
        ));
    }
    if status == 409 {
        let refusal = serde_json::from_slice::<Refusal>(body)
            .ok()
            .filter(|r| HOLD_REFUSALS.contains(&r.code.as_str()) && !r.charge.id.is_empty());
        if let Some(known) = refusal.and_then(|r| r.charge.to_provider_object()) {
            return Verdict::Done(CallOutcome::Known(known));
        }
    }
    classify(CallKind::Write, status, body)
}

/// A `402` body naming a documented decline code, as a failed object.
fn decline(body: &[u8]) -> Option<ProviderObject> {
    let error: ErrorBody = serde_json::from_slice(body).ok()?;
    let code = error.code.filter(|c| DECLINE_CODES.contains(&c.as_str()))?;
    Some(ProviderObject {
        id: String::new(),
        status: PaymentStatus::Failed,
        failure_message: Some(error.detail.unwrap_or_else(|| "declined".into())),
        failure_code: Some(code),
        next_action: None,
        capture_before: None,
        amount_captured: None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sandbox_dispute_is_read_in_our_terms() {
        use crate::domain::dispute::DisputeStatus;
        let body = br#"{"id":"dp_1","object":"dispute","charge_id":"ch_1","amount":500,"currency":"EUR","status":"needs_response","reason":"fraudulent","evidence_due_by":1700000000,"created":1690000000}"#;
        let d = dispute(body).expect("a dispute");
        assert_eq!(d.charge, "ch_1");
        assert_eq!(d.amount, 500);
        assert_eq!(d.status, Some(DisputeStatus::NeedsResponse));
        assert_eq!(d.provider_status, "needs_response");
        assert_eq!(d.evidence_due_by, Some(1_700_000_000));
        let lost = br#"{"id":"dp_1","charge_id":"ch_1","amount":500,"status":"lost","reason":"fraudulent"}"#;
        assert_eq!(
            dispute(lost).and_then(|d| d.status),
            Some(DisputeStatus::Lost)
        );
        let unknown =
            br#"{"id":"dp_1","charge_id":"ch_1","amount":500,"status":"open","reason":"x"}"#;
        assert_eq!(dispute(unknown), None);
        let event = crate::provider::sandbox::parse_event(&serde_json::json!({
            "id": "evt_1", "type": "charge.dispute.closed",
            "data": {"object": {"id": "dp_1", "status": "won"}}
        }));
        assert_eq!(event.dispute.as_deref(), Some("dp_1"));
        assert_eq!(event.subject, None);
    }

    use super::*;

    const CHARGE: &[u8] = br#"{"id":"ch_1","status":"succeeded"}"#;
    const DECLINED: &[u8] = br#"{"id":"ch_2","status":"failed","failure_code":"card_declined"}"#;

    fn outcome(kind: CallKind, status: u16, body: &[u8]) -> &'static str {
        match classify(kind, status, body) {
            Verdict::Retry(_) => "retry",
            Verdict::Bug(_) => "bug",
            Verdict::Done(CallOutcome::NotFound) => "not_found",
            Verdict::Done(CallOutcome::Unknown(_)) => "unknown",
            Verdict::Done(CallOutcome::Known(o)) => o.status.as_str(),
        }
    }

    #[test]
    fn the_table_for_reads_and_writes() {
        use CallKind::{Read, Write};
        let forbidden = br#"{"code":"forbidden"}"#.as_slice();
        let in_use = br#"{"code":"idempotency_key_in_use"}"#.as_slice();
        let card = br#"{"code":"card_declined","detail":"no"}"#.as_slice();
        let rate = br#"{"code":"rate_limited"}"#.as_slice();
        let cases: &[(CallKind, u16, &[u8], &str)] = &[
            (Read, 200, CHARGE, "succeeded"),
            (Write, 200, CHARGE, "succeeded"),
            (Write, 201, DECLINED, "failed"),
            (Read, 200, b"<html>", "unknown"),
            (Read, 200, b"{}", "unknown"),
            (Read, 200, br#"{"id":"","status":"succeeded"}"#, "unknown"),
            (Read, 200, br#"{"id":"ch","status":"weird"}"#, "unknown"),
            (Read, 404, b"", "not_found"),
            (Write, 404, b"", "unknown"),
            (Write, 402, card, "failed"),
            (
                Write,
                402,
                br#"{"code":"invalid_payment_method"}"#,
                "failed",
            ),
            (Write, 402, rate, "unknown"),
            (Write, 402, b"garbage", "unknown"),
            (Read, 402, card, "unknown"),
            (Read, 301, b"", "unknown"),
            (Read, 302, b"", "unknown"),
            (Read, 304, b"", "unknown"),
            (Read, 400, b"", "unknown"),
            (Write, 400, b"", "unknown"),
            (Read, 401, b"", "unknown"),
            (Read, 403, forbidden, "unknown"),
            (Write, 403, forbidden, "unknown"),
            (Read, 407, b"", "unknown"),
            (Write, 409, in_use, "unknown"),
            (Read, 409, in_use, "unknown"),
            (Write, 422, b"", "unknown"),
            (Read, 408, b"", "retry"),
            (Write, 408, b"", "retry"),
            (Write, 429, rate, "retry"),
            (Read, 500, b"", "retry"),
            (Write, 502, b"", "retry"),
            (Write, 503, b"", "retry"),
            (Read, 599, b"", "retry"),
        ];
        for (kind, status, body, expected) in cases {
            assert_eq!(
                outcome(*kind, *status, body),
                *expected,
                "{kind:?} {status} {}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_refused_capture_is_the_charge_it_carries() {
        let expired =
            br#"{"code":"charge_expired_for_capture","charge":{"id":"ch_1","status":"expired"}}"#;
        assert_eq!(
            match classify_hold(409, expired) {
                Verdict::Done(CallOutcome::Known(o)) => Some(o.status),
                _ => None,
            },
            Some(PaymentStatus::Voided)
        );
        let other =
            br#"{"code":"idempotency_key_in_use","charge":{"id":"ch_1","status":"expired"}}"#;
        assert!(matches!(
            classify_hold(409, other),
            Verdict::Done(CallOutcome::Unknown(_))
        ));
        assert!(matches!(classify_hold(500, b""), Verdict::Retry(_)));
    }

    #[test]
    fn a_held_charge_reads_in_our_terms() {
        let read = |body: &[u8]| match classify(CallKind::Read, 200, body) {
            Verdict::Done(CallOutcome::Known(o)) => Some(o),
            _ => None,
        };
        let held = read(br#"{"id":"ch_1","status":"authorized","capture_before":1700000000}"#)
            .expect("known");
        assert_eq!(held.status, PaymentStatus::RequiresCapture);
        assert_eq!(held.capture_before, Some(1_700_000_000));
        let captured =
            read(br#"{"id":"ch_1","status":"captured","amount_captured":400}"#).expect("known");
        assert_eq!(captured.status, PaymentStatus::Succeeded);
        assert_eq!(captured.amount_captured, Some(400));
        for released in ["voided", "expired"] {
            let body = format!(r#"{{"id":"ch_1","status":"{released}"}}"#);
            assert_eq!(
                read(body.as_bytes()).map(|o| o.status),
                Some(PaymentStatus::Voided)
            );
        }
        // Our own names are not the sandbox's.
        assert_eq!(read(br#"{"id":"ch_1","status":"requires_capture"}"#), None);
    }

    #[test]
    fn no_non_2xx_read_ever_settles_a_payment() {
        for status in 100..600u16 {
            if (200..300).contains(&status) {
                continue;
            }
            let verdict = classify(CallKind::Read, status, DECLINED);
            assert!(
                !matches!(verdict, Verdict::Done(CallOutcome::Known(_))),
                "a {status} on a status read must not settle anything"
            );
        }
    }

    #[test]
    fn only_a_documented_402_declines_a_write() {
        for status in 100..600u16 {
            if (200..300).contains(&status) {
                continue;
            }
            let body = br#"{"code":"card_declined"}"#;
            let declined = matches!(
                classify(CallKind::Write, status, body),
                Verdict::Done(CallOutcome::Known(_))
            );
            assert_eq!(declined, status == 402, "status {status}");
        }
    }

    #[test]
    fn a_decline_answering_a_void_proves_nothing_and_one_answering_a_capture_refuses_it() {
        let declined = br#"{"code":"card_declined","detail":"declined"}"#;
        assert!(matches!(
            classify_hold(402, declined),
            Verdict::Done(CallOutcome::Unknown(_))
        ));
        // The capture refused, with its code (read back by the caller
        // before it is final); an undocumented code proves nothing.
        assert!(matches!(
            classify_capture(402, declined),
            Verdict::Done(CallOutcome::Known(ref o))
                if o.status == PaymentStatus::Failed
                    && o.failure_code.as_deref() == Some("card_declined")
        ));
        assert!(matches!(
            classify_capture(402, br#"{"code":"rate_limited"}"#),
            Verdict::Done(CallOutcome::Unknown(_))
        ));
        // A capture's other answers are a hold's.
        assert!(matches!(classify_capture(500, b""), Verdict::Retry(_)));
        // A charge's decline is still a decline.
        assert!(matches!(
            classify(CallKind::Write, 402, declined),
            Verdict::Done(CallOutcome::Known(ref o)) if o.status == PaymentStatus::Failed
        ));
    }
}
