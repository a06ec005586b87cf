//! What oncepay does with a provider's charge it has no row for (the books
//! reconciliation, `crate::books`): the rule, free of I/O.

use super::order::Order;
use super::payment::{PaymentStatus, Transition};
use super::refund;

/// What to do with an object we have no row for: the rule, in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// Rebuild the attempt.
    Adopt,
    /// An orphan: money no order of ours can own.
    Orphan(&'static str),
    /// Nothing to do: a failed charge moved no money.
    Ignore,
}

/// Whether a charge we have no row for can be adopted by its order: a
/// failed charge always can (it moved no money and conflicts with
/// nothing), unless its order is gone; a pending or succeeded one only by
/// an order that awaits payment with no live attempt, for the same amount
/// and currency — anything else would be a second charge for the order.
pub fn adoption(
    order: Option<&Order>,
    live_attempt: bool,
    charge: PaymentStatus,
    (amount, currency): (i64, &str),
) -> Adoption {
    // A charge declined, or a hold released, moved no money.
    let failed = matches!(charge, PaymentStatus::Failed | PaymentStatus::Voided);
    match order {
        None if failed => Adoption::Ignore,
        None => Adoption::Orphan("its order is gone"),
        Some(o) if o.amount != amount || !o.currency.eq_ignore_ascii_case(currency) => {
            if failed {
                Adoption::Ignore
            } else {
                Adoption::Orphan("its amount or currency is not its order's")
            }
        }
        Some(_) if failed => Adoption::Adopt,
        Some(o) if o.status.is_payable() && !live_attempt => Adoption::Adopt,
        Some(_) => Adoption::Orphan("its order is paid by another attempt, or cancelled"),
    }
}

/// What the provider's status of an object makes of ours, for an object
/// we have a row for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// The same.
    Agree,
    /// Ours is pending (forward), or failed while the provider took the
    /// money (the incident rule of `settle`): apply the provider's state
    /// by the webhook's rules. `contradicted`: the latter.
    Settle {
        /// Ours was failed and the provider's succeeded.
        contradicted: bool,
    },
    /// A final status of ours the provider's does not explain.
    Disagree,
    /// A refund of ours succeeded and the provider's has failed since (a
    /// card refund the issuer returned): a fact, applied by the webhook's
    /// rule (`settle::refund`'s [`Transition::Reversed`]), never a mismatch.
    Reverse,
}

/// [`Agreement`] of our status with the provider's.
pub(crate) fn agreement(ours: PaymentStatus, theirs: PaymentStatus) -> Agreement {
    use PaymentStatus::*;
    match (ours, theirs) {
        (a, b) if a == b => Agreement::Agree,
        (Pending, _) | (RequiresCapture, Succeeded | Voided) => Agreement::Settle {
            contradicted: false,
        },
        (Failed | Voided, Succeeded) => Agreement::Settle { contradicted: true },
        _ => Agreement::Disagree,
    }
}

/// [`Agreement`] of our refund's status with the provider's refund's: a
/// charge's, and the one move a refund can make and a charge cannot
/// (`succeeded` then `failed`, [`refund::transition`]).
pub(crate) fn refund_agreement(ours: PaymentStatus, theirs: PaymentStatus) -> Agreement {
    match refund::transition(ours, theirs) {
        Transition::Reversed => Agreement::Reverse,
        _ => agreement(ours, theirs),
    }
}

/// What is done with a charge no order of ours can own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanPolicy {
    /// Refund it, with a key derived from the charge (`ONCEPAY_ORPHAN_POLICY=refund`).
    Refund,
    /// Record it for a person to decide (`hold`).
    Hold,
}

impl OrphanPolicy {
    /// Parses `refund` or `hold`.
    pub fn parse(text: &str) -> Option<OrphanPolicy> {
        match text {
            "refund" => Some(OrphanPolicy::Refund),
            "hold" => Some(OrphanPolicy::Hold),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::order::OrderStatus;

    fn order(status: OrderStatus) -> Order {
        Order {
            id: uuid::Uuid::now_v7(),
            customer_id: "c".into(),
            items: Vec::new(),
            amount: 1000,
            amount_captured: 0,
            amount_refunded: 0,
            currency: "EUR".into(),
            status,
            metadata: Default::default(),
            stock_reserved_until: None,
            stock_reservation: None,
            stock_shortfall: Vec::new(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn the_agreement_of_statuses() {
        use PaymentStatus::*;
        assert_eq!(agreement(Succeeded, Succeeded), Agreement::Agree);
        assert_eq!(
            agreement(Pending, Succeeded),
            Agreement::Settle {
                contradicted: false
            }
        );
        assert_eq!(
            agreement(Failed, Succeeded),
            Agreement::Settle { contradicted: true }
        );
        assert_eq!(agreement(Succeeded, Failed), Agreement::Disagree);
        assert_eq!(agreement(Failed, Pending), Agreement::Disagree);
    }

    #[test]
    fn a_refund_failed_after_it_succeeded_is_a_reversal_not_a_mismatch() {
        use PaymentStatus::*;
        assert_eq!(refund_agreement(Succeeded, Failed), Agreement::Reverse);
        // Everything else as for a charge.
        assert_eq!(refund_agreement(Succeeded, Succeeded), Agreement::Agree);
        assert_eq!(
            refund_agreement(Pending, Failed),
            Agreement::Settle {
                contradicted: false
            }
        );
        assert_eq!(
            refund_agreement(Failed, Succeeded),
            Agreement::Settle { contradicted: true }
        );
        assert_eq!(refund_agreement(Succeeded, Pending), Agreement::Disagree);
        // A charge never reverses.
        assert_eq!(agreement(Succeeded, Failed), Agreement::Disagree);
    }

    #[test]
    fn the_adoption_rule() {
        use Adoption::*;
        use PaymentStatus::*;
        let waiting = order(OrderStatus::AwaitingPayment);
        let paid = order(OrderStatus::Paid);
        let money = (1000, "EUR");
        assert_eq!(adoption(Some(&waiting), false, Succeeded, money), Adopt);
        assert_eq!(adoption(Some(&waiting), false, Pending, money), Adopt);
        assert_eq!(adoption(Some(&waiting), false, Failed, money), Adopt);
        assert!(matches!(
            adoption(Some(&waiting), true, Succeeded, money),
            Orphan(_)
        ));
        assert!(matches!(
            adoption(Some(&paid), false, Succeeded, money),
            Orphan(_)
        ));
        assert_eq!(adoption(Some(&paid), true, Failed, money), Adopt);
        assert!(matches!(adoption(None, false, Succeeded, money), Orphan(_)));
        assert_eq!(adoption(None, false, Failed, money), Ignore);
        assert!(matches!(
            adoption(Some(&waiting), false, Succeeded, (999, "EUR")),
            Orphan(_)
        ));
        assert_eq!(
            adoption(Some(&waiting), false, Succeeded, (1000, "eur")),
            Adopt
        );
    }
}
