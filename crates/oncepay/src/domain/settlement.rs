//! The settlement rule, once: what a provider's report of a charge does to
//! our attempt and its order. Every path applies this one decision — the
//! command's one-statement fast path (`commands::settle::Known`), its
//! locking path, provider webhooks and the reconciler
//! (`commands::settle::payment`) — and writes only what it says.

use super::order::OrderStatus;
use super::payment::{Payment, PaymentStatus, Transition, VoidReason};

/// What a provider says of a charge, as far as the rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report<'a> {
    /// The charge's status.
    pub status: PaymentStatus,
    /// The provider's id of it, if the report names one.
    pub charge_id: Option<&'a str>,
    /// Whether the customer must act (3-D Secure) for it to go on.
    pub requires_action: bool,
}

/// What to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The attempt moves forward to `status`; the order moves to `order`
    /// when that changes it (a succeeded payment pays an order awaiting it).
    Advance {
        /// The attempt's new status.
        status: PaymentStatus,
        /// The order's new status, if it changes.
        order: Option<OrderStatus>,
    },
    /// Still pending, and now waiting for its customer: where to send
    /// them is recorded once, with its event.
    RequireAction,
    /// Same state; the provider's id of the charge is learnt now.
    LearnChargeId,
    /// The provider charged an attempt we hold as failed: an incident, and
    /// the money goes back.
    Contradicted,
    /// Nothing to write: a repeat, or a stale or backward report.
    Nothing,
}

/// Why a hold the provider reports released ended, as far as the order
/// cares: the void asked for, or else it expired (only a cancel of the
/// order moves the order elsewhere than back to awaiting payment).
pub fn void_reason(attempt: &Payment) -> VoidReason {
    attempt.void_requested.unwrap_or(VoidReason::Expired)
}

/// What a provider's report of a released hold says of who released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Nobody says: it lapsed, or it was oncepay's own void.
    Lapsed,
    /// Someone cancelled it at the provider: its adapter reports a reason
    /// that is not an expiry (a cancel in Stripe's Dashboard).
    Cancelled,
    /// oncepay's give-up on a customer who had not acted
    /// (`PaymentProvider::abandon`) found the payment approved and
    /// released its authorization (`crate::provider::ABANDONED`).
    Abandoned,
}

/// Why a hold the provider reports released ended, as it is stored and
/// shown: the void oncepay asked for (the merchant's, its order's cancel);
/// else, released by oncepay's give-up on an attempt that waited for its
/// customer, [`VoidReason::Abandoned`] (its customer approved, so never
/// `authentication_expired`), also when the approval's own event made the
/// attempt `requires_capture` before the cancel's answer was applied;
/// else, when the provider says someone cancelled it while it could still
/// be captured, [`VoidReason::CancelledAtProvider`]; else it expired.
/// Past the deadline every release is an expiry: the sweeper's own void
/// of an overdue hold comes back from the provider as a cancel, and a
/// webhook of it may be read first. oncepay gives up only on attempts that
/// waited for their customer (`action_required_at`): on any other, a
/// cancel reading `abandoned` was someone else's.
pub fn release_reason(
    attempt: &Payment,
    released: Released,
    now: chrono::DateTime<chrono::Utc>,
) -> VoidReason {
    let cancelled = matches!(released, Released::Cancelled | Released::Abandoned);
    match attempt.void_requested {
        Some(asked) => asked,
        None if released == Released::Abandoned && attempt.action_required_at.is_some() => {
            VoidReason::Abandoned
        }
        None if cancelled
            && attempt
                .capture_before
                .is_some_and(|deadline| now < deadline) =>
        {
            VoidReason::CancelledAtProvider
        }
        None => VoidReason::Expired,
    }
}

/// The one settlement rule.
pub fn decide(attempt: &Payment, order: OrderStatus, report: &Report<'_>) -> Settlement {
    match attempt.status.transition(report.status) {
        Transition::Advance(status) => Settlement::Advance {
            status,
            order: match status {
                PaymentStatus::Succeeded => Some(order.after_payment_succeeded()),
                PaymentStatus::RequiresCapture => Some(order.after_payment_authorized()),
                PaymentStatus::Voided => Some(order.after_void(void_reason(attempt))),
                _ => None,
            }
            .filter(|next| *next != order),
        },
        Transition::Unchanged
            if attempt.status == PaymentStatus::Pending
                && attempt.next_action.is_none()
                && report.requires_action =>
        {
            Settlement::RequireAction
        }
        Transition::Unchanged
            if attempt.provider_charge_id.is_none() && report.charge_id.is_some() =>
        {
            Settlement::LearnChargeId
        }
        Transition::Contradicted => Settlement::Contradicted,
        // Only refunds are reversed (`refund::transition`).
        // A stray hold is released by the decline's confirming read, which
        // the caller queues (`commands::settle::payment`); the attempt
        // stays failed.
        Transition::Unchanged
        | Transition::Ignored
        | Transition::Reversed
        | Transition::StrayHold => Settlement::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PaymentStatus::*;

    fn attempt(status: PaymentStatus) -> Payment {
        Payment::pending(
            uuid::Uuid::nil(),
            (uuid::Uuid::nil(), 100, "EUR"),
            "sandbox",
            "tok_visa",
            chrono::Utc::now(),
        )
        .with_facts(status, None, None, None, chrono::Utc::now())
    }

    fn report(status: PaymentStatus) -> Report<'static> {
        Report {
            status,
            charge_id: Some("ch_1"),
            requires_action: false,
        }
    }

    #[test]
    fn the_rule_for_each_case() {
        let waiting = OrderStatus::AwaitingPayment;
        assert_eq!(
            decide(&attempt(Pending), waiting, &report(Succeeded)),
            Settlement::Advance {
                status: Succeeded,
                order: Some(OrderStatus::Paid)
            }
        );
        assert_eq!(
            decide(
                &attempt(Pending),
                OrderStatus::Cancelled,
                &report(Succeeded)
            ),
            Settlement::Advance {
                status: Succeeded,
                order: None
            },
            "an order no longer awaiting payment stays as it is"
        );
        assert_eq!(
            decide(&attempt(Pending), waiting, &report(Failed)),
            Settlement::Advance {
                status: Failed,
                order: None
            }
        );
        let action = Report {
            requires_action: true,
            ..report(Pending)
        };
        assert_eq!(
            decide(&attempt(Pending), waiting, &action),
            Settlement::RequireAction
        );
        assert_eq!(
            decide(&attempt(Pending), waiting, &report(Pending)),
            Settlement::LearnChargeId
        );
        assert_eq!(
            decide(&attempt(Failed), waiting, &report(Succeeded)),
            Settlement::Contradicted
        );
        assert_eq!(
            decide(&attempt(Succeeded), OrderStatus::Paid, &report(Failed)),
            Settlement::Nothing
        );
        let held = OrderStatus::Authorized;
        assert_eq!(
            decide(&attempt(Pending), waiting, &report(RequiresCapture)),
            Settlement::Advance {
                status: RequiresCapture,
                order: Some(held)
            }
        );
        assert_eq!(
            decide(&attempt(RequiresCapture), held, &report(Succeeded)),
            Settlement::Advance {
                status: Succeeded,
                order: Some(OrderStatus::Paid)
            }
        );
        assert_eq!(
            decide(&attempt(RequiresCapture), held, &report(Voided)),
            Settlement::Advance {
                status: Voided,
                order: Some(waiting)
            },
            "an expired hold makes the order payable again"
        );
        let cancelling = Payment {
            void_requested: Some(VoidReason::OrderCancelled),
            ..attempt(RequiresCapture)
        };
        assert_eq!(
            decide(&cancelling, held, &report(Voided)),
            Settlement::Advance {
                status: Voided,
                order: Some(OrderStatus::Cancelled)
            }
        );
        assert_eq!(
            decide(&attempt(Voided), waiting, &report(Succeeded)),
            Settlement::Contradicted
        );
        let known =
            attempt(Succeeded).with_facts(Succeeded, Some("ch_1"), None, None, chrono::Utc::now());
        assert_eq!(
            decide(&known, OrderStatus::Paid, &report(Succeeded)),
            Settlement::Nothing
        );
    }

    #[test]
    fn a_release_says_who_ended_the_hold() {
        let now = chrono::Utc::now();
        let hold = Payment {
            capture_before: Some(now + chrono::Duration::days(3)),
            ..attempt(RequiresCapture)
        };
        assert_eq!(
            release_reason(&hold, Released::Lapsed, now),
            VoidReason::Expired
        );
        assert_eq!(
            release_reason(&hold, Released::Cancelled, now),
            VoidReason::CancelledAtProvider,
            "cancelled at the provider while it could still be captured"
        );
        assert_eq!(
            release_reason(&hold, Released::Abandoned, now),
            VoidReason::CancelledAtProvider,
            "oncepay never gives up on a payment that asked its customer nothing"
        );
        let overdue = Payment {
            capture_before: Some(now - chrono::Duration::seconds(1)),
            ..hold.clone()
        };
        assert_eq!(
            release_reason(&overdue, Released::Cancelled, now),
            VoidReason::Expired,
            "past the deadline every release is an expiry (the sweeper's void too)"
        );
        for asked in [VoidReason::Requested, VoidReason::OrderCancelled] {
            let asking = Payment {
                void_requested: Some(asked),
                ..hold.clone()
            };
            assert_eq!(release_reason(&asking, Released::Cancelled, now), asked);
        }
        // Given up on while it waited for its customer, who had approved
        // (review N6): released by oncepay, never an expired
        // authentication.
        let waiting = Payment {
            action_required_at: Some(now - chrono::Duration::hours(1)),
            ..attempt(Pending)
        };
        assert_eq!(
            release_reason(&waiting, Released::Abandoned, now),
            VoidReason::Abandoned
        );
        assert_eq!(
            release_reason(&waiting, Released::Lapsed, now),
            VoidReason::Expired
        );
        // The approval's event applied first: held, then released by the
        // give-up's cancel.
        let approved = Payment {
            action_required_at: waiting.action_required_at,
            ..hold.clone()
        };
        assert_eq!(
            release_reason(&approved, Released::Abandoned, now),
            VoidReason::Abandoned
        );
    }
}
