//! Disputes (chargebacks), provider-neutral: a customer's bank takes a
//! payment's money back while the provider reviews the merchant's
//! evidence. What our statuses are, how one moves (forward only; a closed
//! dispute never reopens) and which of them hold the money back from
//! refunds. Each adapter maps its provider's statuses onto these; the
//! provider's own word is kept as `provider_status`. No I/O here.

use serde::Serialize;

/// Where a dispute is, in our terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeStatus {
    /// The merchant must answer with evidence (Stripe: `needs_response`,
    /// `warning_needs_response`).
    NeedsResponse,
    /// Evidence is in; the bank decides (Stripe: `under_review`,
    /// `warning_under_review`).
    UnderReview,
    /// Closed for the merchant: the money stays (or comes back).
    Won,
    /// Closed for the customer: the money is gone for good (Stripe: `lost`,
    /// and `prevented`, a dispute resolved before any chargeback by giving
    /// the customer the money back).
    Lost,
}

impl DisputeStatus {
    /// Every status, in the order the API documents them.
    pub const ALL: &'static [DisputeStatus] = &[
        DisputeStatus::NeedsResponse,
        DisputeStatus::UnderReview,
        DisputeStatus::Won,
        DisputeStatus::Lost,
    ];

    /// What a new dispute whose provider status its adapter does not know
    /// (a newer API's) is held as until a known status arrives: open, so
    /// its amount is held back from refunds (a chargeback's money may be
    /// gone already), and under review, claiming no evidence deadline the
    /// provider did not give. A dispute held already keeps its status.
    pub const UNRECOGNISED: DisputeStatus = DisputeStatus::UnderReview;

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DisputeStatus::NeedsResponse => "needs_response",
            DisputeStatus::UnderReview => "under_review",
            DisputeStatus::Won => "won",
            DisputeStatus::Lost => "lost",
        }
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Option<DisputeStatus> {
        Self::ALL.iter().copied().find(|s| s.as_str() == text)
    }

    /// Won or lost: a closed dispute never moves again.
    pub fn is_final(self) -> bool {
        matches!(self, DisputeStatus::Won | DisputeStatus::Lost)
    }

    /// Whether the dispute holds its amount back from refunds: while it is
    /// open (the bank has taken the money) and after it is lost (the money
    /// is gone). A won dispute gives it back.
    pub fn holds_money(self) -> bool {
        !matches!(self, DisputeStatus::Won)
    }

    fn rank(self) -> u8 {
        match self {
            DisputeStatus::NeedsResponse => 0,
            DisputeStatus::UnderReview => 1,
            DisputeStatus::Won | DisputeStatus::Lost => 2,
        }
    }

    /// What the provider's report of `observed` does to a dispute we hold
    /// as `self`: forward only, and never out of a final status (the same
    /// rule the store's `UPDATE … WHERE status NOT IN ('won', 'lost')`
    /// enforces).
    pub fn advance(self, observed: DisputeStatus) -> DisputeMove {
        if self.is_final() {
            return if observed == self {
                DisputeMove::Unchanged
            } else {
                DisputeMove::Ignored
            };
        }
        match observed.rank().cmp(&self.rank()) {
            std::cmp::Ordering::Greater => DisputeMove::Advance(observed),
            std::cmp::Ordering::Equal => DisputeMove::Unchanged,
            std::cmp::Ordering::Less => DisputeMove::Ignored,
        }
    }
}

impl DisputeStatus {
    /// [`DisputeStatus::advance`] across an inquiry's escalation: an
    /// inquiry (`held_inquiry`, Stripe's `warning_*`) that becomes a
    /// chargeback starts a new phase at `needs_response`, which is not a
    /// step back from the inquiry's `under_review`.
    pub fn advance_phase(
        self,
        held_inquiry: bool,
        observed: DisputeStatus,
        observed_inquiry: bool,
    ) -> DisputeMove {
        if held_inquiry && !observed_inquiry && !self.is_final() && observed != self {
            return DisputeMove::Advance(observed);
        }
        self.advance(observed)
    }
}

/// What a provider's report does to a dispute we hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisputeMove {
    /// It moves to this status.
    Advance(DisputeStatus),
    /// Same status (its other facts, as the deadline, may still be new).
    Unchanged,
    /// Behind what we hold, or a closed dispute said to be elsewhere: kept
    /// as it is.
    Ignored,
}

/// The outbound event a dispute's change makes: `created` for a new one,
/// `closed` when it reaches won or lost, `updated` for any other change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisputeChange {
    /// First seen.
    Created,
    /// Moved or its facts changed, still open.
    Updated,
    /// Reached won or lost.
    Closed,
}

impl DisputeChange {
    /// The change from `before` (none: new) to `after`.
    pub fn of(before: Option<DisputeStatus>, after: DisputeStatus) -> DisputeChange {
        match before {
            None => DisputeChange::Created,
            Some(b) if !b.is_final() && after.is_final() => DisputeChange::Closed,
            Some(_) => DisputeChange::Updated,
        }
    }
}

/// A dispute, as `GET /disputes/{id}`, a payment's `dispute` and the
/// `dispute.*` events show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dispute {
    /// Ours (UUID v7).
    pub id: uuid::Uuid,
    /// The payment disputed.
    pub payment_id: uuid::Uuid,
    /// Minor units disputed.
    pub amount: i64,
    /// The payment's currency.
    pub currency: String,
    /// In our terms.
    pub status: DisputeStatus,
    /// The bank's reason (`fraudulent`, `product_not_received`, …), as the
    /// provider says it.
    pub reason: String,
    /// When the merchant's evidence is due, if the provider says.
    pub evidence_due_by: Option<chrono::DateTime<chrono::Utc>>,
    /// The provider's own status (`warning_needs_response`, …).
    pub provider_status: String,
    /// When oncepay first learned of it.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The order of the payment (its event trail shows the dispute).
    #[serde(skip)]
    pub order_id: uuid::Uuid,
    /// The provider of the payment.
    #[serde(skip)]
    pub provider: String,
    /// The provider's id (`dp_…`).
    #[serde(skip)]
    pub provider_dispute_id: String,
    /// An inquiry (no money withdrawn; see `ProviderDispute::inquiry`):
    /// holds nothing back from refunds.
    #[serde(skip)]
    pub inquiry: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use DisputeStatus::*;

    #[test]
    fn an_inquiry_that_escalates_starts_over_and_nothing_else_moves_back() {
        // warning_under_review -> needs_response: the chargeback begins.
        assert_eq!(
            UnderReview.advance_phase(true, NeedsResponse, false),
            DisputeMove::Advance(NeedsResponse)
        );
        // Within one phase, still forward only.
        assert_eq!(
            UnderReview.advance_phase(false, NeedsResponse, false),
            DisputeMove::Ignored
        );
        assert_eq!(
            UnderReview.advance_phase(true, NeedsResponse, true),
            DisputeMove::Ignored
        );
        // A closed dispute never reopens.
        assert_eq!(
            Won.advance_phase(true, NeedsResponse, false),
            DisputeMove::Ignored
        );
    }

    #[test]
    fn names_round_trip() {
        for s in DisputeStatus::ALL {
            assert_eq!(DisputeStatus::parse(s.as_str()), Some(*s));
        }
        assert_eq!(DisputeStatus::parse("warning_closed"), None);
    }

    #[test]
    fn disputes_move_forward_and_a_closed_one_never_reopens() {
        assert_eq!(
            NeedsResponse.advance(UnderReview),
            DisputeMove::Advance(UnderReview)
        );
        assert_eq!(NeedsResponse.advance(Won), DisputeMove::Advance(Won));
        assert_eq!(UnderReview.advance(Lost), DisputeMove::Advance(Lost));
        assert_eq!(UnderReview.advance(NeedsResponse), DisputeMove::Ignored);
        assert_eq!(NeedsResponse.advance(NeedsResponse), DisputeMove::Unchanged);
        for closed in [Won, Lost] {
            assert_eq!(closed.advance(closed), DisputeMove::Unchanged);
            for other in DisputeStatus::ALL.iter().filter(|s| **s != closed) {
                assert_eq!(closed.advance(*other), DisputeMove::Ignored);
            }
        }
    }

    #[test]
    fn open_and_lost_disputes_hold_the_money_a_won_one_does_not() {
        assert!(
            DisputeStatus::UNRECOGNISED.holds_money() && !DisputeStatus::UNRECOGNISED.is_final(),
            "a status no adapter knows is held open"
        );
        assert!(NeedsResponse.holds_money());
        assert!(UnderReview.holds_money());
        assert!(Lost.holds_money());
        assert!(!Won.holds_money());
    }

    #[test]
    fn changes_name_their_event() {
        assert_eq!(
            DisputeChange::of(None, NeedsResponse),
            DisputeChange::Created
        );
        assert_eq!(DisputeChange::of(None, Won), DisputeChange::Created);
        assert_eq!(
            DisputeChange::of(Some(NeedsResponse), UnderReview),
            DisputeChange::Updated
        );
        assert_eq!(
            DisputeChange::of(Some(UnderReview), Lost),
            DisputeChange::Closed
        );
    }
}
