//! The refund rule, in one place for the refund command, for cancelling a
//! paid order and for the books (a refund we have no row for is adopted
//! only within it; an orphan charge's refund is "the rest"): how much may
//! still be refunded, and what a request for an amount (or for "the rest")
//! becomes.

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

/// Why a refund cannot be made (answered `422 refund_exceeds_payment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RefundRejection {
    /// Refunds not `failed` already cover the whole amount.
    #[error("nothing is left to refund on this payment (pending refunds count)")]
    NothingLeft,
    /// The requested amount is more than what is left.
    #[error("amount: {requested} exceeds the {left} left to refund on this payment (pending refunds count)")]
    Exceeds {
        /// What was asked for.
        requested: i64,
        /// What is left.
        left: i64,
    },
}

/// Plans a refund of a payment of `amount` whose refunds not `failed` sum
/// to `committed`: `requested` (or, if `None`, everything that is left).
pub fn plan(amount: i64, committed: i64, requested: Option<i64>) -> Result<i64, RefundRejection> {
    let left = amount.saturating_sub(committed);
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
        assert_eq!(plan(10_000, 0, None), Ok(10_000));
        assert_eq!(plan(10_000, 3_000, None), Ok(7_000));
        assert_eq!(plan(10_000, 3_000, Some(7_000)), Ok(7_000));
        assert_eq!(plan(10_000, 3_000, Some(1)), Ok(1));
        assert_eq!(
            plan(10_000, 3_000, Some(7_001)),
            Err(RefundRejection::Exceeds {
                requested: 7_001,
                left: 7_000
            })
        );
        assert_eq!(
            plan(10_000, 10_000, None),
            Err(RefundRejection::NothingLeft)
        );
        assert_eq!(
            plan(10_000, 10_000, Some(1)),
            Err(RefundRejection::NothingLeft)
        );
        // A corrupt over-commitment is still "nothing left", never negative.
        assert_eq!(
            plan(10_000, 12_000, None),
            Err(RefundRejection::NothingLeft)
        );
    }

    #[test]
    fn any_sequence_of_plans_stays_within_the_amount() {
        let amount = 1_000;
        let mut committed = 0;
        for requested in [Some(300), None, Some(1), Some(500), None] {
            if let Ok(planned) = plan(amount, committed, requested) {
                committed += planned;
            }
            assert!(committed <= amount);
        }
        assert_eq!(committed, amount);
    }
}
