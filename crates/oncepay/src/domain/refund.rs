//! The refund rule, in one place for the refund command, for cancelling a
//! paid order and for the books (a refund we have no row for is adopted
//! only within it; an orphan charge's refund is "the rest"): how much may
//! still be refunded, and what a request for an amount (or for "the rest")
//! becomes. A dispute's amount, while the dispute is open or after it is
//! lost, is not refundable ([`refundable`]): the customer's bank already
//! took it back, and refunding it too would pay the customer twice.

use crate::domain::payment::{PaymentStatus, Transition};

/// What a provider's report of a refund does to the refund we hold: the
/// payments' one-way rule, but for one move a refund can make and a charge
/// cannot: `succeeded` then `failed` (Stripe refunds do, when the card
/// was closed or expired; the money returns to the merchant's balance).
/// Payment attempts keep [`PaymentStatus::transition`].
pub fn transition(held: PaymentStatus, observed: PaymentStatus) -> Transition {
    match (held, observed) {
        (PaymentStatus::Succeeded, PaymentStatus::Failed) => Transition::Reversed,
        _ => held.transition(observed),
    }
}

/// Why a refund cannot be made: `NothingLeft` and `Exceeds` are answered
/// `422 refund_exceeds_payment`, `Disputed` `409 payment_disputed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RefundRejection {
    /// Refunds not `failed` already cover the whole amount.
    #[error("amount: nothing is left to refund on this payment (pending refunds count)")]
    NothingLeft,
    /// The requested amount is more than what is left.
    #[error("amount: {requested} asked, at most {left} left to refund on this payment (pending refunds count)")]
    Exceeds {
        /// What was asked for.
        requested: i64,
        /// What is left.
        left: i64,
    },
    /// The requested amount (or the rest) reaches into money a dispute
    /// holds (open or lost): the bank took it back already.
    #[error("amount: {requested} asked, at most {left} refundable: {disputed} of the payment is held by a dispute (open or lost)")]
    Disputed {
        /// What was asked for (the rest, if no amount was given).
        requested: i64,
        /// What may be refunded.
        left: i64,
        /// What open and lost disputes hold.
        disputed: i64,
    },
}

/// What may still be refunded of a payment of `amount`: its amount, less
/// its refunds not `failed` (`committed`), less what its disputes hold
/// (`disputed`: the amounts of its disputes open or lost; a won dispute
/// holds nothing). Never negative. The one rule of the refund command, a
/// cancellation and the `409 payment_disputed` check.
pub fn refundable(amount: i64, committed: i64, disputed: i64) -> i64 {
    amount
        .saturating_sub(committed)
        .saturating_sub(disputed)
        .max(0)
}

/// Plans a refund of a payment of `amount` whose refunds not `failed` sum
/// to `committed` and whose open or lost disputes hold `disputed`:
/// `requested` (or, if `None`, everything that is left). A request that
/// fits what the refunds leave but not what the disputes leave is
/// [`RefundRejection::Disputed`].
pub fn plan(
    amount: i64,
    committed: i64,
    disputed: i64,
    requested: Option<i64>,
) -> Result<i64, RefundRejection> {
    let undisputed = refundable(amount, committed, 0);
    let left = refundable(amount, committed, disputed);
    let asked = requested.unwrap_or(undisputed);
    if disputed > 0 && asked > left && (requested.is_some() || undisputed > 0) {
        return Err(RefundRejection::Disputed {
            requested: asked,
            left,
            disputed,
        });
    }
    if left <= 0 {
        return Err(RefundRejection::NothingLeft);
    }
    match requested {
        None => Ok(left),
        Some(requested) if requested > left => Err(RefundRejection::Exceeds { requested, left }),
        Some(requested) => Ok(requested),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_may_fail_after_it_succeeded_and_nothing_else_moves_back() {
        use PaymentStatus::*;
        assert_eq!(transition(Succeeded, Failed), Transition::Reversed);
        assert_eq!(
            transition(Pending, Succeeded),
            Transition::Advance(Succeeded)
        );
        assert_eq!(transition(Failed, Succeeded), Transition::Contradicted);
        assert_eq!(transition(Succeeded, Pending), Transition::Ignored);
        assert_eq!(transition(Failed, Pending), Transition::Ignored);
        // A charge never does.
        assert_eq!(Succeeded.transition(Failed), Transition::Ignored);
    }

    #[test]
    fn the_rest_by_default_and_never_more_than_is_left() {
        assert_eq!(plan(10_000, 0, 0, None), Ok(10_000));
        assert_eq!(plan(10_000, 3_000, 0, None), Ok(7_000));
        assert_eq!(plan(10_000, 3_000, 0, Some(7_000)), Ok(7_000));
        assert_eq!(plan(10_000, 3_000, 0, Some(1)), Ok(1));
        assert_eq!(
            plan(10_000, 3_000, 0, Some(7_001)),
            Err(RefundRejection::Exceeds {
                requested: 7_001,
                left: 7_000
            })
        );
        assert_eq!(
            plan(10_000, 10_000, 0, None),
            Err(RefundRejection::NothingLeft)
        );
        assert_eq!(
            plan(10_000, 10_000, 0, Some(1)),
            Err(RefundRejection::NothingLeft)
        );
        // A corrupt over-commitment is still "nothing left", never negative.
        assert_eq!(
            plan(10_000, 12_000, 0, None),
            Err(RefundRejection::NothingLeft)
        );
    }

    #[test]
    fn any_sequence_of_plans_stays_within_the_amount() {
        let amount = 1_000;
        let mut committed = 0;
        for requested in [Some(300), None, Some(1), Some(500), None] {
            if let Ok(planned) = plan(amount, committed, 0, requested) {
                committed += planned;
            }
            assert!(committed <= amount);
        }
        assert_eq!(committed, amount);
    }

    #[test]
    fn a_dispute_open_or_lost_holds_its_amount_back() {
        assert_eq!(refundable(10_000, 0, 0), 10_000);
        assert_eq!(refundable(10_000, 3_000, 2_000), 5_000);
        assert_eq!(refundable(10_000, 3_000, 10_000), 0);
        // The whole charge disputed: nothing, whatever is asked.
        for requested in [None, Some(1), Some(10_000)] {
            assert!(matches!(
                plan(10_000, 0, 10_000, requested),
                Err(RefundRejection::Disputed {
                    left: 0,
                    disputed: 10_000,
                    ..
                })
            ));
        }
        // Part disputed: what the dispute leaves may be refunded, the rest is 409.
        assert_eq!(plan(10_000, 0, 4_000, Some(6_000)), Ok(6_000));
        assert_eq!(
            plan(10_000, 0, 4_000, Some(6_001)),
            Err(RefundRejection::Disputed {
                requested: 6_001,
                left: 6_000,
                disputed: 4_000
            })
        );
        assert_eq!(
            plan(10_000, 0, 4_000, None),
            Err(RefundRejection::Disputed {
                requested: 10_000,
                left: 6_000,
                disputed: 4_000
            })
        );
        // Nothing left before the dispute: as without one.
        assert_eq!(
            plan(10_000, 10_000, 0, None),
            Err(RefundRejection::NothingLeft)
        );
        // A won dispute holds nothing (its caller passes 0).
        assert_eq!(plan(10_000, 0, 0, None), Ok(10_000));
    }
}
