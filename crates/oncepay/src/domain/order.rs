//! Orders: what a valid order is and how its status may move. No I/O here.

use std::collections::BTreeMap;

use super::money::{Amount, Currency, MAX_AMOUNT};
use super::RuleViolation;

/// Limits of an order (contract section 3); the OpenAPI document repeats them.
pub mod limits {
    /// `customer_id` length in characters.
    pub const CUSTOMER_ID_MAX: usize = 64;
    /// Number of line items.
    pub const ITEMS_MAX: usize = 100;
    /// `sku` length in characters.
    pub const SKU_MAX: usize = 64;
    /// `quantity` of one line.
    pub const QUANTITY_MAX: i128 = 10_000;
    /// Number of metadata pairs.
    pub const METADATA_PAIRS_MAX: usize = 20;
    /// Metadata key length in characters.
    pub const METADATA_KEY_MAX: usize = 40;
    /// Metadata value length in characters.
    pub const METADATA_VALUE_MAX: usize = 500;
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LineItem {
    /// The merchant's product code.
    pub sku: String,
    /// How many, `1 ..= 10000`.
    pub quantity: i64,
    /// Price of one, in minor units, `>= 0`.
    pub unit_amount: i64,
}

/// A line item as received, before its rules are checked.
#[derive(Debug, Clone)]
pub struct RawLineItem {
    /// See [`LineItem::sku`].
    pub sku: String,
    /// Any integer the JSON held.
    pub quantity: i128,
    /// Any integer the JSON held.
    pub unit_amount: i128,
}

/// A validated request to create an order; the amount is the checked sum.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// The merchant's customer reference.
    pub customer_id: String,
    /// The order's currency.
    pub currency: Currency,
    /// The lines.
    pub items: Vec<LineItem>,
    /// Free-form string pairs, returned as given.
    pub metadata: BTreeMap<String, String>,
    /// Sum of quantity × unit_amount over the lines.
    pub amount: Amount,
}

pub(crate) fn chars_between(
    field: &str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<(), RuleViolation> {
    no_nul(field, value)?;
    let n = value.chars().count();
    if n < min || n > max {
        return Err(RuleViolation::new(
            field,
            format!("must be {min} to {max} characters long"),
        ));
    }
    Ok(())
}

/// PostgreSQL cannot store U+0000 in text or JSON, so no stored string may
/// hold it: refused here as a rule, never discovered as a database error.
pub(crate) fn no_nul(field: &str, value: &str) -> Result<(), RuleViolation> {
    if value.contains('\0') {
        return Err(RuleViolation::new(
            field,
            "must not contain the NUL character (U+0000)",
        ));
    }
    Ok(())
}

impl NewOrder {
    /// Checks every rule of contract section 3, naming the first field that breaks one.
    pub fn new(
        customer_id: String,
        currency: &str,
        items: Vec<RawLineItem>,
        metadata: Vec<(String, String)>,
    ) -> Result<NewOrder, RuleViolation> {
        use limits::*;
        chars_between("customer_id", &customer_id, 1, CUSTOMER_ID_MAX)?;
        let currency = Currency::try_from(currency)
            .map_err(|e| RuleViolation::new("currency", e.to_string()))?;
        if items.is_empty() || items.len() > ITEMS_MAX {
            return Err(RuleViolation::new(
                "items",
                format!("must hold 1 to {ITEMS_MAX} line items"),
            ));
        }
        let mut total: i128 = 0;
        let mut lines = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            chars_between(&format!("items[{i}].sku"), &item.sku, 1, SKU_MAX)?;
            if !(1..=QUANTITY_MAX).contains(&item.quantity) {
                return Err(RuleViolation::new(
                    format!("items[{i}].quantity"),
                    format!("must be an integer from 1 to {QUANTITY_MAX}"),
                ));
            }
            if !(0..=MAX_AMOUNT as i128).contains(&item.unit_amount) {
                return Err(RuleViolation::new(
                    format!("items[{i}].unit_amount"),
                    format!("must be an integer from 0 to {MAX_AMOUNT} (minor units)"),
                ));
            }
            // Both factors are bounded above, so i128 cannot overflow; the
            // running total is checked against the limit on every line.
            total += item.quantity * item.unit_amount;
            if total > MAX_AMOUNT as i128 {
                return Err(RuleViolation::new(
                    "items",
                    format!("the order's amount exceeds {MAX_AMOUNT} (minor units)"),
                ));
            }
            lines.push(LineItem {
                sku: item.sku,
                quantity: item.quantity as i64,
                unit_amount: item.unit_amount as i64,
            });
        }
        let amount = Amount::try_from(total).map_err(|_| {
            RuleViolation::new(
                "items",
                "the order's amount must be at least 1 (minor unit)",
            )
        })?;
        if metadata.len() > METADATA_PAIRS_MAX {
            return Err(RuleViolation::new(
                "metadata",
                format!("must hold at most {METADATA_PAIRS_MAX} pairs"),
            ));
        }
        let mut map = BTreeMap::new();
        for (key, value) in metadata {
            chars_between("metadata", &key, 1, METADATA_KEY_MAX).map_err(|_| {
                RuleViolation::new(
                    "metadata",
                    format!("keys must be 1 to {METADATA_KEY_MAX} characters long"),
                )
            })?;
            chars_between(&format!("metadata.{key}"), &value, 0, METADATA_VALUE_MAX)?;
            map.insert(key, value);
        }
        Ok(NewOrder {
            customer_id,
            currency,
            items: lines,
            metadata: map,
            amount,
        })
    }
}

/// What a paid order lacks of one SKU: its stock reservation had expired
/// and the stock was gone (`domain::inventory::late_take`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shortfall {
    /// The SKU.
    pub sku: String,
    /// Pieces the order has but the stock could not give.
    pub missing: i64,
}

/// An order as the API shows it (contract section 3).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Order {
    /// UUID v7.
    pub id: uuid::Uuid,
    /// The merchant's customer reference.
    pub customer_id: String,
    /// The lines.
    pub items: Vec<LineItem>,
    /// Checked sum of the lines, in minor units.
    pub amount: i64,
    /// What its payment captured (a partial capture takes less than
    /// `amount`; 0 until paid).
    pub amount_captured: i64,
    /// What its refunds returned (succeeded refunds, less any that failed
    /// afterwards).
    pub amount_refunded: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// Where the order is in its life.
    pub status: OrderStatus,
    /// The merchant's string pairs.
    pub metadata: BTreeMap<String, String>,
    /// Until when its tracked SKUs are reserved (`reserve_stock`); null
    /// when nothing was reserved.
    pub stock_reserved_until: Option<chrono::DateTime<chrono::Utc>>,
    /// Where its reservation stands; null when nothing was reserved.
    pub stock_reservation: Option<StockReservation>,
    /// What a payment after the reservation expired could not take from
    /// the stock (empty unless the order is paid but short).
    pub stock_shortfall: Vec<Shortfall>,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl Order {
    /// A new order awaiting payment, as it will be stored: the response can
    /// be written before the row, and both commit together.
    pub fn awaiting_payment(
        id: uuid::Uuid,
        new: &NewOrder,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Order {
        Order {
            id,
            customer_id: new.customer_id.clone(),
            items: new.items.clone(),
            amount: new.amount.minor_units(),
            amount_captured: 0,
            amount_refunded: 0,
            currency: new.currency.to_string(),
            status: OrderStatus::AwaitingPayment,
            metadata: new.metadata.clone(),
            stock_reserved_until: None,
            stock_reservation: None,
            stock_shortfall: Vec::new(),
            created_at: now,
            updated_at: now,
        }
    }
}

/// Where an order's stock reservation stands (issue 54).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StockReservation {
    /// Its units are held for it: awaiting payment, a payment in flight,
    /// or authorized (until the authorization's deadline).
    Reserved,
    /// Its units are sold to it: paid, or captured.
    Converted,
    /// Its units went back to the stock: cancelled, its authorization
    /// voided or expired, or the reservation lapsed unpaid.
    Released,
    /// Paid after its reservation lapsed, and the stock could not give
    /// every unit (`stock_shortfall` says which).
    Short,
}

impl StockReservation {
    /// Every state.
    pub const ALL: [StockReservation; 4] = [
        StockReservation::Reserved,
        StockReservation::Converted,
        StockReservation::Released,
        StockReservation::Short,
    ];

    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            StockReservation::Reserved => "reserved",
            StockReservation::Converted => "converted",
            StockReservation::Released => "released",
            StockReservation::Short => "short",
        }
    }

    /// The state a stored name names.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Where an order is in its life (contract section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Created; may be paid or cancelled.
    AwaitingPayment,
    /// A manual payment's hold stands (`requires_capture`): a capture
    /// pays it, a void or an expiry makes it await payment again.
    Authorized,
    /// A payment succeeded.
    Paid,
    /// Refunds add up to the whole amount.
    Refunded,
    /// Cancelled before payment, or cancelled and refunded in full.
    Cancelled,
}

/// What cancelling an order takes, decided from its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelPlan {
    /// Nothing was paid: the order is cancelled at once.
    CancelNow,
    /// It was paid: refund what is left, and cancel when the refund succeeds.
    RefundThenCancel,
    /// A hold stands: void it (`order_cancelled`), and cancel when the
    /// void is confirmed.
    VoidThenCancel,
    /// Already cancelled or refunded: nothing to cancel.
    NotCancellable,
}

impl OrderStatus {
    /// The name used in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Authorized => "authorized",
            OrderStatus::Paid => "paid",
            OrderStatus::Refunded => "refunded",
            OrderStatus::Cancelled => "cancelled",
        }
    }

    /// Every status.
    pub const ALL: [OrderStatus; 5] = [
        OrderStatus::AwaitingPayment,
        OrderStatus::Authorized,
        OrderStatus::Paid,
        OrderStatus::Refunded,
        OrderStatus::Cancelled,
    ];

    /// Parses a stored status.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "awaiting_payment" => OrderStatus::AwaitingPayment,
            "authorized" => OrderStatus::Authorized,
            "paid" => OrderStatus::Paid,
            "refunded" => OrderStatus::Refunded,
            "cancelled" => OrderStatus::Cancelled,
            _ => return None,
        })
    }

    /// Only an order awaiting payment takes a new payment attempt.
    pub fn is_payable(self) -> bool {
        self == OrderStatus::AwaitingPayment
    }

    /// The status after one of its payments succeeded. A payment that
    /// succeeds for an order no longer awaiting payment leaves it unchanged
    /// (the one-live-attempt index makes that impossible in practice).
    pub fn after_payment_succeeded(self) -> Self {
        match self {
            OrderStatus::AwaitingPayment | OrderStatus::Authorized => OrderStatus::Paid,
            other => other,
        }
    }

    /// The status after its manual payment was authorized and is held.
    pub fn after_payment_authorized(self) -> Self {
        match self {
            OrderStatus::AwaitingPayment => OrderStatus::Authorized,
            other => other,
        }
    }

    /// The status after its hold was released: cancelled if its cancel
    /// asked for the void, otherwise payable again (the customer can pay
    /// anew).
    pub fn after_void(self, reason: super::payment::VoidReason) -> Self {
        match (self, reason) {
            (OrderStatus::Authorized, super::payment::VoidReason::OrderCancelled) => {
                OrderStatus::Cancelled
            }
            (OrderStatus::Authorized, _) => OrderStatus::AwaitingPayment,
            (other, _) => other,
        }
    }

    /// The status after a refund succeeded, given how much is now refunded.
    pub fn after_refund(self, refunded: i64, amount: i64, cancels_order: bool) -> Self {
        match self {
            OrderStatus::Paid if cancels_order => OrderStatus::Cancelled,
            OrderStatus::Paid if refunded >= amount => OrderStatus::Refunded,
            other => other,
        }
    }

    /// After a refund that had succeeded failed at the provider: the
    /// money is the merchant's again, so a refunded or cancelled order
    /// (whether that refund was the cancel's or one made before it) no
    /// longer has all its money back: it is `paid` again (refundable,
    /// cancellable), and the merchant decides.
    pub fn after_refund_reversed(self) -> Self {
        match self {
            OrderStatus::Refunded | OrderStatus::Cancelled => OrderStatus::Paid,
            other => other,
        }
    }

    /// How a cancel request is carried out.
    pub fn cancel_plan(self) -> CancelPlan {
        match self {
            OrderStatus::AwaitingPayment => CancelPlan::CancelNow,
            OrderStatus::Authorized => CancelPlan::VoidThenCancel,
            OrderStatus::Paid => CancelPlan::RefundThenCancel,
            OrderStatus::Refunded | OrderStatus::Cancelled => CancelPlan::NotCancellable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_failing_later_makes_a_refunded_or_cancelled_order_paid_again() {
        use OrderStatus::*;
        assert_eq!(Refunded.after_refund_reversed(), Paid);
        assert_eq!(Cancelled.after_refund_reversed(), Paid);
        assert_eq!(Paid.after_refund_reversed(), Paid);
        assert_eq!(AwaitingPayment.after_refund_reversed(), AwaitingPayment);
    }

    fn item(sku: &str, quantity: i128, unit_amount: i128) -> RawLineItem {
        RawLineItem {
            sku: sku.into(),
            quantity,
            unit_amount,
        }
    }

    fn order(items: Vec<RawLineItem>) -> Result<NewOrder, RuleViolation> {
        NewOrder::new("c1".into(), "EUR", items, vec![])
    }

    #[test]
    fn the_amount_is_the_sum_of_the_lines() {
        let o = order(vec![item("a", 2, 150), item("b", 1, 700)]).expect("valid");
        assert_eq!(o.amount.minor_units(), 1000);
    }

    #[test]
    fn each_rule_names_its_field() {
        let field = |r: Result<NewOrder, RuleViolation>| r.expect_err("invalid").field;
        assert_eq!(field(order(vec![])), "items");
        assert_eq!(field(order(vec![item("", 1, 1)])), "items[0].sku");
        assert_eq!(
            field(order(vec![item("a", 1, 1), item("b", 0, 1)])),
            "items[1].quantity"
        );
        assert_eq!(
            field(order(vec![item("a", 10_001, 1)])),
            "items[0].quantity"
        );
        assert_eq!(field(order(vec![item("a", 1, -1)])), "items[0].unit_amount");
        assert_eq!(field(order(vec![item("a", 1, 0)])), "items");
        let too_long = "x".repeat(65);
        assert_eq!(
            field(NewOrder::new(
                too_long,
                "EUR",
                vec![item("a", 1, 1)],
                vec![]
            )),
            "customer_id"
        );
        assert_eq!(
            field(NewOrder::new(
                "c".into(),
                "eur",
                vec![item("a", 1, 1)],
                vec![]
            )),
            "currency"
        );
        assert_eq!(
            field(NewOrder::new(
                "c\0".into(),
                "EUR",
                vec![item("a", 1, 1)],
                vec![]
            )),
            "customer_id"
        );
        assert_eq!(field(order(vec![item("a\0", 1, 1)])), "items[0].sku");
        let nul_value = vec![("k".to_string(), "v\0".to_string())];
        assert_eq!(
            field(NewOrder::new(
                "c".into(),
                "EUR",
                vec![item("a", 1, 1)],
                nul_value
            )),
            "metadata.k"
        );
        let pairs = (0..21).map(|i| (format!("k{i}"), "v".into())).collect();
        assert_eq!(
            field(NewOrder::new(
                "c".into(),
                "EUR",
                vec![item("a", 1, 1)],
                pairs
            )),
            "metadata"
        );
    }

    #[test]
    fn the_sum_is_checked_against_the_limit_not_wrapped() {
        let huge = MAX_AMOUNT as i128;
        assert_eq!(
            order(vec![item("a", 10_000, huge)])
                .expect_err("too big")
                .field,
            "items"
        );
        assert_eq!(
            order(vec![item("a", 1, huge), item("b", 1, 1)])
                .expect_err("too big")
                .field,
            "items"
        );
        assert!(order(vec![item("a", 1, huge)]).is_ok());
    }

    #[test]
    fn status_transitions() {
        use OrderStatus::*;
        assert_eq!(AwaitingPayment.after_payment_succeeded(), Paid);
        assert_eq!(Cancelled.after_payment_succeeded(), Cancelled);
        assert_eq!(Paid.after_refund(50, 100, false), Paid);
        assert_eq!(Paid.after_refund(100, 100, false), Refunded);
        assert_eq!(Paid.after_refund(100, 100, true), Cancelled);
        assert_eq!(AwaitingPayment.cancel_plan(), CancelPlan::CancelNow);
        assert_eq!(Paid.cancel_plan(), CancelPlan::RefundThenCancel);
        assert_eq!(Refunded.cancel_plan(), CancelPlan::NotCancellable);
        assert_eq!(Cancelled.cancel_plan(), CancelPlan::NotCancellable);
        assert!(AwaitingPayment.is_payable());
        use crate::domain::payment::VoidReason;
        assert_eq!(AwaitingPayment.after_payment_authorized(), Authorized);
        assert_eq!(Cancelled.after_payment_authorized(), Cancelled);
        assert_eq!(Authorized.after_payment_succeeded(), Paid);
        assert_eq!(
            Authorized.after_void(VoidReason::Requested),
            AwaitingPayment
        );
        assert_eq!(Authorized.after_void(VoidReason::Expired), AwaitingPayment);
        assert_eq!(Authorized.after_void(VoidReason::OrderCancelled), Cancelled);
        assert_eq!(Paid.after_void(VoidReason::Expired), Paid);
        assert_eq!(Authorized.cancel_plan(), CancelPlan::VoidThenCancel);
        for s in [Authorized, Paid, Refunded, Cancelled] {
            assert!(!s.is_payable());
            assert_eq!(OrderStatus::parse(s.as_str()), Some(s));
        }
    }
}
