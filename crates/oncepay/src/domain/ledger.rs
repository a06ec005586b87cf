//! The rules of the double-entry ledger, free of I/O: accounts, the
//! phases of a transfer (TigerBeetle's single, pending, post, void), what
//! a transfer does to a holder's totals, and when a hold may be resolved.
//!
//! The ledger is generic over its unit: a `Ledger` names what is counted
//! (money in customer balances now; stock units later), and an account's
//! `unit` is what one of its integers means (a currency's minor unit, a
//! SKU's piece). Nothing here knows about customers or currencies; the
//! balance's words are in [`balance`].
//!
//! Two kinds of account: a *holder*'s (a customer's balance, a SKU's
//! stock), whose totals are kept on its row and may never go below zero
//! nor hold more than they have; and the merchant's *system* accounts
//! (`credit_issued`, `balance_spent`, ...), the other side of every
//! holder's transfer, whose balances are derived from transfers so that
//! no row of theirs is a lock every transfer of the merchant waits for.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// What a ledger counts. Each has its own accounts and codes; a transfer
/// never crosses ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ledger {
    /// Customer balances (store credit, wallets), in a currency's minor units.
    Balance,
    /// Stock of the SKUs a merchant tracks, in pieces: the unit is the SKU.
    Stock,
}

impl Ledger {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Ledger::Balance => "balance",
            Ledger::Stock => "stock",
        }
    }

    /// The ledger a stored name names.
    pub fn parse(name: &str) -> Option<Ledger> {
        match name {
            "balance" => Some(Ledger::Balance),
            "stock" => Some(Ledger::Stock),
            _ => None,
        }
    }
}

/// Whose an account is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccountKind {
    /// A holder's: totals on its row, never negative, never holding more
    /// than posted.
    Holder,
    /// The merchant's side: derived from transfers, never updated.
    System,
}

impl AccountKind {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Holder => "holder",
            AccountKind::System => "system",
        }
    }
}

/// An account by what it is: its id is derived from this (a UUID v8 of
/// a SHA-256 of its parts), so
/// a transfer names its accounts without reading them first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccountRef {
    /// The merchant it belongs to.
    pub merchant_id: Uuid,
    /// Its ledger.
    pub ledger: Ledger,
    /// What its integers count (`EUR`, a SKU).
    pub unit: String,
    /// Holder or system.
    pub kind: AccountKind,
    /// The holder's id (a customer id), or the system account's name.
    pub owner: String,
}

/// The namespace of account ids (a random UUID, fixed forever: stored
/// ids are derived from it).
const ACCOUNT_NAMESPACE: Uuid = Uuid::from_u128(0x5b0c_2f0e_8d4a_4c71_9a43_6e1f_0d2b_77a1);

impl AccountRef {
    /// A holder's account.
    pub fn holder(merchant_id: Uuid, ledger: Ledger, unit: &str, owner: &str) -> AccountRef {
        AccountRef {
            merchant_id,
            ledger,
            unit: unit.to_string(),
            kind: AccountKind::Holder,
            owner: owner.to_string(),
        }
    }

    /// The merchant's system account `name` of the same ledger and unit.
    pub fn system(&self, name: &str) -> AccountRef {
        AccountRef {
            kind: AccountKind::System,
            owner: name.to_string(),
            ..self.clone()
        }
    }

    /// Its id: the same for the same account in every process, so
    /// creating it twice finds the one row.
    pub fn id(&self) -> Uuid {
        // Each part is length-prefixed, so no two accounts share a name.
        let mut name = Vec::with_capacity(96);
        for part in [
            self.merchant_id.to_string().as_str(),
            self.ledger.as_str(),
            self.unit.as_str(),
            self.kind.as_str(),
            self.owner.as_str(),
        ] {
            name.extend_from_slice(&(part.len() as u32).to_be_bytes());
            name.extend_from_slice(part.as_bytes());
        }
        use sha2::Digest;
        let digest = sha2::Sha256::new()
            .chain_update(ACCOUNT_NAMESPACE.as_bytes())
            .chain_update(&name)
            .finalize();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_custom_bytes(bytes).into_uuid()
    }
}

/// A transfer's phase (TigerBeetle's flags, as one value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Posted at once.
    Single,
    /// A hold: counted in the debit account's `held` until posted or
    /// voided, and voided once it expires.
    Pending,
    /// Posts a pending, for at most its amount; the rest returns.
    Post,
    /// Returns a pending whole (released, or expired).
    Void,
}

impl Phase {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Single => "single",
            Phase::Pending => "pending",
            Phase::Post => "post",
            Phase::Void => "void",
        }
    }

    /// The phase a stored name names.
    pub fn parse(name: &str) -> Option<Phase> {
        [Phase::Single, Phase::Pending, Phase::Post, Phase::Void]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// A holder's totals: what it has (`posted`) and what pending transfers
/// from it hold (`held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Totals {
    /// What the holder has.
    pub posted: i64,
    /// What its unresolved holds hold.
    pub held: i64,
}

/// A holder's balance as the API shows it: `available = posted - held`,
/// where `held` counts only holds that have not expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Balance {
    /// What the holder has.
    pub posted: i64,
    /// What live holds hold.
    pub held: i64,
    /// What it may spend or hold now.
    pub available: i64,
}

impl Totals {
    /// What the holder may spend or hold now.
    pub fn available(self) -> i64 {
        self.posted - self.held
    }

    /// The balance shown, when `overdue` of `held` belongs to holds past
    /// their expiry that no sweep has voided yet: they no longer count.
    pub fn balance(self, overdue: i64) -> Balance {
        let held = (self.held - overdue).max(0);
        Balance {
            posted: self.posted,
            held,
            available: self.posted - held,
        }
    }

    /// The totals after a transfer `from` this holder of `amount` in
    /// `phase` (for post and void, `pending` is the amount of the pending
    /// resolved), or the refusal. The database's CHECK makes the same
    /// refusal; this answers it with what was available.
    pub fn after_debit(self, phase: Phase, amount: i64, pending: i64) -> Result<Totals, Refusal> {
        let next = match phase {
            Phase::Single => Totals {
                posted: self.posted - amount,
                ..self
            },
            Phase::Pending => Totals {
                held: self.held + amount,
                ..self
            },
            Phase::Post => {
                if amount > pending {
                    return Err(Refusal::ExceedsPending { pending });
                }
                Totals {
                    posted: self.posted - amount,
                    held: self.held - pending,
                }
            }
            Phase::Void => Totals {
                held: self.held - pending,
                ..self
            },
        };
        if next.posted < 0 || next.held < 0 || next.held > next.posted {
            return Err(Refusal::Insufficient {
                available: self.available(),
            });
        }
        Ok(next)
    }

    /// The totals after a transfer `to` this holder (only single and post
    /// transfers change them: money arriving on a hold is not the
    /// holder's until posted).
    pub fn after_credit(self, phase: Phase, amount: i64) -> Totals {
        match phase {
            Phase::Single | Phase::Post => Totals {
                posted: self.posted + amount,
                ..self
            },
            Phase::Pending | Phase::Void => self,
        }
    }
}

/// Why a transfer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The holder would go below zero or hold more than it has.
    #[error("insufficient funds: {available} available")]
    Insufficient {
        /// What was available.
        available: i64,
    },
    /// A post above its pending.
    #[error("exceeds the pending amount {pending}")]
    ExceedsPending {
        /// The pending's amount.
        pending: i64,
    },
}

/// Where a hold (a pending transfer) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldStatus {
    /// Counted against what is available.
    Held,
    /// Posted (for at most its amount; the rest returned).
    Captured,
    /// Returned whole on request.
    Released,
    /// Returned whole because it was not resolved in time.
    Expired,
}

impl HoldStatus {
    /// As shown.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldStatus::Held => "held",
            HoldStatus::Captured => "captured",
            HoldStatus::Released => "released",
            HoldStatus::Expired => "expired",
        }
    }

    /// A hold's status from its resolution (the phase and whether it was
    /// an expiry), or, unresolved, from the clock: past `expires_at` it is
    /// expired at once, before any sweep writes its void.
    pub fn of(
        resolution: Option<(Phase, bool)>,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> HoldStatus {
        match resolution {
            Some((Phase::Post, _)) => HoldStatus::Captured,
            Some((_, true)) => HoldStatus::Expired,
            Some(_) => HoldStatus::Released,
            None if expires_at <= now => HoldStatus::Expired,
            None => HoldStatus::Held,
        }
    }
}

/// What may be done to a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Post `amount` of it (all when not given).
    Capture(Option<i64>),
    /// Return it.
    Release,
}

/// Why a hold cannot be resolved as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HoldRefusal {
    /// It is no longer held (captured, released or expired).
    #[error("the hold is {}", .0.as_str())]
    NotActive(HoldStatus),
    /// A capture above the hold.
    #[error("amount: {requested} asked, at most {held} held")]
    ExceedsHold {
        /// What was asked for.
        requested: i64,
        /// What the hold holds.
        held: i64,
    },
}

/// The transfer that resolves a hold of `amount` in `status`, as
/// (phase, amount), or the refusal.
pub fn resolve(status: HoldStatus, amount: i64, how: Resolve) -> Result<(Phase, i64), HoldRefusal> {
    if status != HoldStatus::Held {
        return Err(HoldRefusal::NotActive(status));
    }
    match how {
        Resolve::Capture(None) => Ok((Phase::Post, amount)),
        Resolve::Capture(Some(n)) if n > amount => Err(HoldRefusal::ExceedsHold {
            requested: n,
            held: amount,
        }),
        Resolve::Capture(Some(n)) => Ok((Phase::Post, n)),
        Resolve::Release => Ok((Phase::Void, amount)),
    }
}

/// The balance ledger's words: its transfer codes and the merchant's
/// system accounts on the other side of each.
pub mod balance {
    use super::Phase;

    /// A balance transaction's `type`, stored as the transfer's code.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Code {
        /// Store credit given.
        Credit,
        /// Balance taken.
        Debit,
        /// A hold placed.
        Hold,
        /// A hold captured.
        HoldCapture,
        /// A hold released.
        HoldRelease,
        /// A hold that expired.
        HoldExpiry,
        /// An order paid from the balance.
        Payment,
        /// A refund credited to the balance.
        Refund,
    }

    impl Code {
        /// Every code.
        pub const ALL: [Code; 8] = [
            Code::Credit,
            Code::Debit,
            Code::Hold,
            Code::HoldCapture,
            Code::HoldRelease,
            Code::HoldExpiry,
            Code::Payment,
            Code::Refund,
        ];

        /// As stored and shown.
        pub fn as_str(self) -> &'static str {
            match self {
                Code::Credit => "credit",
                Code::Debit => "debit",
                Code::Hold => "hold",
                Code::HoldCapture => "hold_capture",
                Code::HoldRelease => "hold_release",
                Code::HoldExpiry => "hold_expiry",
                Code::Payment => "payment",
                Code::Refund => "refund",
            }
        }

        /// The code a stored name names.
        pub fn parse(name: &str) -> Option<Code> {
            Code::ALL.into_iter().find(|c| c.as_str() == name)
        }

        /// Its phase, whether the customer is the debit side (money
        /// leaves the balance), and the merchant's system account on the
        /// other side.
        pub fn shape(self) -> (Phase, bool, &'static str) {
            match self {
                Code::Credit => (Phase::Single, false, "credit_issued"),
                Code::Debit => (Phase::Single, true, "balance_spent"),
                Code::Hold => (Phase::Pending, true, "balance_spent"),
                Code::HoldCapture => (Phase::Post, true, "balance_spent"),
                Code::HoldRelease | Code::HoldExpiry => (Phase::Void, true, "balance_spent"),
                Code::Payment => (Phase::Single, true, "payments"),
                Code::Refund => (Phase::Single, false, "refunds"),
            }
        }
    }
}

/// The stock ledger's words (issue 46): a SKU's stock is the holder
/// account of unit `<sku>` and owner [`stock::HOLDER`]; its `posted` is
/// what is on hand, its `held` what live reservations hold.
pub mod stock {
    use super::Phase;

    /// The owner of a SKU's stock account (one stock per merchant and SKU;
    /// a location would be another owner).
    pub const HOLDER: &str = "on_hand";

    /// A stock transfer's code.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Code {
        /// Stock added (received, counted up).
        AdjustmentIn,
        /// Stock removed (damaged, counted down).
        AdjustmentOut,
        /// Stock reserved for an order, until its deadline.
        Reservation,
        /// A reservation converted: the order was paid (or captured).
        Conversion,
        /// A reservation released: its order was cancelled, or its
        /// authorization voided or expired.
        Release,
        /// A reservation that expired unpaid.
        ReservationExpiry,
        /// Stock taken for a paid order without a reservation: its
        /// reservation lapsed, or it reserved nothing.
        Sale,
        /// A reservation voided because another of the same units took its
        /// place with a new deadline (a payment in flight, an
        /// authorization's deadline, back to the order's own).
        Renewal,
    }

    impl Code {
        /// Every code.
        pub const ALL: [Code; 8] = [
            Code::AdjustmentIn,
            Code::AdjustmentOut,
            Code::Reservation,
            Code::Conversion,
            Code::Release,
            Code::ReservationExpiry,
            Code::Sale,
            Code::Renewal,
        ];

        /// As stored.
        pub fn as_str(self) -> &'static str {
            match self {
                Code::AdjustmentIn => "adjustment_in",
                Code::AdjustmentOut => "adjustment_out",
                Code::Reservation => "reservation",
                Code::Conversion => "conversion",
                Code::Release => "release",
                Code::ReservationExpiry => "reservation_expiry",
                Code::Sale => "sale",
                Code::Renewal => "renewal",
            }
        }

        /// The code a stored name names.
        pub fn parse(name: &str) -> Option<Code> {
            Code::ALL.into_iter().find(|c| c.as_str() == name)
        }

        /// Its phase, whether the stock is the debit side (units leave
        /// it), and the merchant's system account on the other side:
        /// `adjustments` for what is counted in or out, `sold` for what
        /// orders take.
        pub fn shape(self) -> (Phase, bool, &'static str) {
            match self {
                Code::AdjustmentIn => (Phase::Single, false, "adjustments"),
                Code::AdjustmentOut => (Phase::Single, true, "adjustments"),
                Code::Reservation => (Phase::Pending, true, "sold"),
                Code::Conversion => (Phase::Post, true, "sold"),
                Code::Release | Code::ReservationExpiry | Code::Renewal => {
                    (Phase::Void, true, "sold")
                }
                Code::Sale => (Phase::Single, true, "sold"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(posted: i64, held: i64) -> Totals {
        Totals { posted, held }
    }

    #[test]
    fn account_ids_are_stable_and_distinct() {
        let m = Uuid::from_u128(1);
        let a = AccountRef::holder(m, Ledger::Balance, "EUR", "cus_1");
        assert_eq!(a.id(), a.clone().id());
        assert_ne!(a.id(), a.system("cus_1").id(), "kind is part of the id");
        assert_ne!(
            a.id(),
            AccountRef::holder(m, Ledger::Balance, "USD", "cus_1").id()
        );
        // Length prefixes: moving a character between parts changes the id.
        assert_ne!(
            AccountRef::holder(m, Ledger::Balance, "EU", "Rcus").id(),
            AccountRef::holder(m, Ledger::Balance, "EUR", "cus").id()
        );
    }

    #[test]
    fn a_debit_never_takes_a_holder_below_zero_or_below_its_holds() {
        let t = totals(100, 30);
        assert_eq!(t.available(), 70);
        assert_eq!(t.after_debit(Phase::Single, 70, 0), Ok(totals(30, 30)));
        assert_eq!(
            t.after_debit(Phase::Single, 71, 0),
            Err(Refusal::Insufficient { available: 70 })
        );
        assert_eq!(t.after_debit(Phase::Pending, 70, 0), Ok(totals(100, 100)));
        assert_eq!(
            t.after_debit(Phase::Pending, 71, 0),
            Err(Refusal::Insufficient { available: 70 })
        );
    }

    #[test]
    fn a_post_takes_at_most_its_pending_and_returns_the_rest() {
        let t = totals(100, 30);
        assert_eq!(t.after_debit(Phase::Post, 20, 30), Ok(totals(80, 0)));
        assert_eq!(t.after_debit(Phase::Post, 30, 30), Ok(totals(70, 0)));
        assert_eq!(
            t.after_debit(Phase::Post, 31, 30),
            Err(Refusal::ExceedsPending { pending: 30 })
        );
        assert_eq!(t.after_debit(Phase::Void, 30, 30), Ok(totals(100, 0)));
    }

    #[test]
    fn credits_count_only_when_posted() {
        let t = totals(5, 0);
        assert_eq!(t.after_credit(Phase::Single, 10), totals(15, 0));
        assert_eq!(t.after_credit(Phase::Post, 10), totals(15, 0));
        assert_eq!(t.after_credit(Phase::Pending, 10), t);
    }

    #[test]
    fn an_overdue_hold_stops_counting_before_any_sweep() {
        let t = totals(100, 60);
        assert_eq!(
            t.balance(0),
            Balance {
                posted: 100,
                held: 60,
                available: 40
            }
        );
        assert_eq!(
            t.balance(60),
            Balance {
                posted: 100,
                held: 0,
                available: 100
            }
        );
    }

    #[test]
    fn a_hold_reads_expired_at_its_deadline_and_resolves_once() {
        let now = Utc::now();
        let later = now + chrono::Duration::seconds(1);
        assert_eq!(HoldStatus::of(None, later, now), HoldStatus::Held);
        assert_eq!(HoldStatus::of(None, now, now), HoldStatus::Expired);
        assert_eq!(
            HoldStatus::of(Some((Phase::Post, false)), now, later),
            HoldStatus::Captured
        );
        assert_eq!(
            HoldStatus::of(Some((Phase::Void, false)), later, now),
            HoldStatus::Released
        );
        assert_eq!(
            HoldStatus::of(Some((Phase::Void, true)), now, later),
            HoldStatus::Expired
        );

        assert_eq!(
            resolve(HoldStatus::Held, 50, Resolve::Capture(None)),
            Ok((Phase::Post, 50))
        );
        assert_eq!(
            resolve(HoldStatus::Held, 50, Resolve::Capture(Some(20))),
            Ok((Phase::Post, 20))
        );
        assert_eq!(
            resolve(HoldStatus::Held, 50, Resolve::Capture(Some(51))),
            Err(HoldRefusal::ExceedsHold {
                requested: 51,
                held: 50
            })
        );
        assert_eq!(
            resolve(HoldStatus::Held, 50, Resolve::Release),
            Ok((Phase::Void, 50))
        );
        for done in [
            HoldStatus::Captured,
            HoldStatus::Released,
            HoldStatus::Expired,
        ] {
            assert_eq!(
                resolve(done, 50, Resolve::Release),
                Err(HoldRefusal::NotActive(done))
            );
            assert_eq!(
                resolve(done, 50, Resolve::Capture(None)),
                Err(HoldRefusal::NotActive(done))
            );
        }
    }

    #[test]
    fn names_round_trip() {
        for code in balance::Code::ALL {
            assert_eq!(balance::Code::parse(code.as_str()), Some(code));
        }
        for phase in [Phase::Single, Phase::Pending, Phase::Post, Phase::Void] {
            assert_eq!(Phase::parse(phase.as_str()), Some(phase));
        }
        for code in stock::Code::ALL {
            assert_eq!(stock::Code::parse(code.as_str()), Some(code));
        }
        assert_eq!(Ledger::parse("balance"), Some(Ledger::Balance));
        assert_eq!(Ledger::parse("stock"), Some(Ledger::Stock));
        assert_eq!(Ledger::parse("gold"), None);
    }
}
