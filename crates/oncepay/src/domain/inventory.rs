//! Stock rules, free of I/O (issue 46): what an order asks of each SKU,
//! which SKUs fall short, what an adjustment may be, and what a payment
//! that arrives after its reservation expired can still take. The
//! counting itself is the ledger's (`domain::ledger`, `stock` codes).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::order::LineItem;
use super::RuleViolation;

/// The largest quantity one adjustment moves, either way (a billion
/// pieces: far above any real count, far below the ledger's own limit).
pub const ADJUSTMENT_MAX: i64 = 1_000_000_000;

/// The longest `reason` kept with an adjustment.
pub const REASON_MAX: usize = 500;

/// A SKU as a path or cursor names it: the order's rule (1 to 64
/// characters, no U+0000), since a reservation matches an order's SKU.
pub fn sku(field: &str, raw: &str) -> Result<String, RuleViolation> {
    super::order::chars_between(field, raw, 1, super::order::limits::SKU_MAX)?;
    Ok(raw.to_string())
}

/// An adjustment's quantity: a non-zero integer of at most
/// [`ADJUSTMENT_MAX`] either way, negative to remove.
pub fn adjustment(quantity: i128) -> Result<i64, RuleViolation> {
    if quantity == 0 {
        return Err(RuleViolation::new(
            "quantity",
            "must not be 0: positive adds stock, negative removes it",
        ));
    }
    if quantity.unsigned_abs() > ADJUSTMENT_MAX as u128 {
        return Err(RuleViolation::new(
            "quantity",
            format!("must be from -{ADJUSTMENT_MAX} to {ADJUSTMENT_MAX}"),
        ));
    }
    Ok(quantity as i64)
}

/// What an order asks of each SKU: the quantities of all its lines with
/// that SKU, summed (two lines of one SKU are checked against the stock
/// together, never each against the same stock). In SKU order, which is
/// the order its stock rows are locked in.
pub fn demand(items: &[LineItem]) -> BTreeMap<String, i64> {
    let mut wanted = BTreeMap::new();
    for item in items {
        *wanted.entry(item.sku.clone()).or_insert(0) += item.quantity;
    }
    wanted
}

/// A SKU an order cannot have: what it asked and what was available.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Short {
    /// The SKU.
    pub sku: String,
    /// The order's quantity of it (all its lines).
    pub requested: i64,
    /// What was available when it asked.
    pub available: i64,
}

/// The tracked SKUs of `wanted` whose `available` stock is less than
/// asked, in SKU order. A SKU absent from `available` is not tracked and
/// reserves nothing.
pub fn shortages(wanted: &BTreeMap<String, i64>, available: &BTreeMap<String, i64>) -> Vec<Short> {
    wanted
        .iter()
        .filter_map(|(sku, requested)| {
            let available = *available.get(sku)?;
            (available < *requested).then(|| Short {
                sku: sku.clone(),
                requested: *requested,
                available,
            })
        })
        .collect()
}

pub use super::order::Shortfall;

/// A payment after the reservation of `requested` expired takes what is
/// `available`, up to what was reserved, never more: (taken, missing).
pub fn late_take(requested: i64, available: i64) -> (i64, i64) {
    let taken = requested.min(available.max(0));
    (taken, requested - taken)
}

/// The deadline of a reservation held for a payment in flight: none in
/// practice (the last day of the year 9999): the reservation ends with
/// the payment, converted when it succeeds, renewed until the order's
/// own deadline (or released, if that has passed) when it fails.
pub fn payment_in_flight_until() -> DateTime<Utc> {
    DateTime::from_timestamp(253_402_214_400, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A tracked SKU's stock as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StockItem {
    /// The SKU.
    pub sku: String,
    /// Pieces the merchant has (reserved ones included).
    pub on_hand: i64,
    /// Pieces live reservations hold (an expired one no longer counts).
    pub reserved: i64,
    /// `on_hand - reserved`: what an order may reserve now.
    pub available: i64,
    /// When its stock last moved.
    pub updated_at: DateTime<Utc>,
}

impl StockItem {
    /// The item of `sku` with the ledger's balance of its account.
    pub fn of(sku: &str, balance: super::ledger::Balance, updated_at: DateTime<Utc>) -> StockItem {
        StockItem {
            sku: sku.to_string(),
            on_hand: balance.posted,
            reserved: balance.held,
            available: balance.available,
            updated_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sku: &str, quantity: i64) -> LineItem {
        LineItem {
            sku: sku.into(),
            quantity,
            unit_amount: 1,
        }
    }

    #[test]
    fn lines_of_one_sku_are_summed_and_skus_come_in_order() {
        let wanted = demand(&[line("b", 2), line("a", 1), line("b", 3)]);
        assert_eq!(
            wanted.into_iter().collect::<Vec<_>>(),
            vec![("a".to_string(), 1), ("b".to_string(), 5)]
        );
    }

    #[test]
    fn only_tracked_skus_can_fall_short() {
        let wanted = demand(&[line("a", 2), line("b", 5), line("untracked", 9)]);
        let available = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 4)]);
        assert_eq!(
            shortages(&wanted, &available),
            vec![Short {
                sku: "b".into(),
                requested: 5,
                available: 4
            }]
        );
    }

    #[test]
    fn an_adjustment_is_non_zero_and_bounded() {
        assert_eq!(adjustment(5), Ok(5));
        assert_eq!(adjustment(-5), Ok(-5));
        assert_eq!(adjustment(0).unwrap_err().field, "quantity");
        assert!(adjustment(i128::from(ADJUSTMENT_MAX) + 1).is_err());
        assert!(adjustment(-i128::from(ADJUSTMENT_MAX) - 1).is_err());
        assert_eq!(adjustment(-i128::from(ADJUSTMENT_MAX)), Ok(-ADJUSTMENT_MAX));
    }

    #[test]
    fn a_late_payment_takes_what_is_there_and_never_more() {
        assert_eq!(late_take(3, 10), (3, 0));
        assert_eq!(late_take(3, 1), (1, 2));
        assert_eq!(late_take(3, 0), (0, 3));
        assert_eq!(late_take(3, -2), (0, 3));
    }

    #[test]
    fn a_sku_follows_the_orders_rule() {
        assert!(sku("sku", "book").is_ok());
        assert!(sku("sku", "").is_err());
        assert!(sku("sku", &"x".repeat(65)).is_err());
        assert!(sku("sku", "a\0b").is_err());
    }
}
