//! The resources of the oncepay API as the client sees them
//! (`openapi.yaml` is the reference).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An order's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineItem {
    /// The merchant's product code.
    pub sku: String,
    /// 1 to 10,000.
    pub quantity: i64,
    /// Minor units (cents), ≥ 0.
    pub unit_amount: i64,
}

/// What `POST /orders` takes.
///
/// ```
/// use oncepay_client::{LineItem, NewOrder};
/// let order = NewOrder::new("cus_1", "EUR", vec![LineItem { sku: "book".into(), quantity: 2, unit_amount: 1250 }]);
/// assert_eq!(order.currency, "EUR");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    /// Your customer's id, 1 to 64 characters.
    pub customer_id: String,
    /// ISO 4217, upper case.
    pub currency: String,
    /// 1 to 100 lines.
    pub items: Vec<LineItem>,
    /// Up to 20 string pairs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl NewOrder {
    /// An order without metadata.
    pub fn new(customer_id: &str, currency: &str, items: Vec<LineItem>) -> Self {
        NewOrder {
            customer_id: customer_id.into(),
            currency: currency.into(),
            items,
            metadata: BTreeMap::new(),
        }
    }
}

/// An order (`GET /orders/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// UUID v7.
    pub id: Uuid,
    /// Your customer's id.
    pub customer_id: String,
    /// The lines.
    pub items: Vec<LineItem>,
    /// The checked sum of the lines, minor units.
    pub amount: i64,
    /// ISO 4217.
    pub currency: String,
    /// `awaiting_payment`, `paid`, `refunded` or `cancelled`.
    pub status: String,
    /// Your key/value pairs.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// Where a payment or refund stands: `pending` means the outcome is not
/// known yet, never that it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not known yet: poll, or resume the intent later.
    Pending,
    /// Final: the money moved.
    Succeeded,
    /// Final: it did not (a decline has a `failure_code`).
    Failed,
}

impl Status {
    /// True for `succeeded` and `failed`.
    pub fn is_final(self) -> bool {
        self != Status::Pending
    }
}

/// One payment attempt (`GET /payments/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// UUID v7.
    pub id: Uuid,
    /// The order it pays.
    pub order_id: Uuid,
    /// The order's amount.
    pub amount: i64,
    /// The order's currency.
    pub currency: String,
    /// See [`Status`].
    pub status: Status,
    /// The provider's name.
    pub provider: String,
    /// The provider's charge id, once known.
    pub provider_charge_id: Option<String>,
    /// Why it failed (`card_declined`, …).
    pub failure_code: Option<String>,
    /// A readable reason.
    pub failure_message: Option<String>,
    /// Sum of its succeeded refunds.
    pub refunded_amount: i64,
    /// While `pending` and waiting for the customer (3-D Secure): where to
    /// send them; the intent stays open until the payment is final.
    #[serde(default)]
    pub next_action: Option<NextAction>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// What a customer must do for a pending payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextAction {
    /// `redirect`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where to send the customer (their bank's page).
    pub url: String,
}

/// One refund (`GET /refunds/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// UUID v7.
    pub id: Uuid,
    /// The payment refunded.
    pub payment_id: Uuid,
    /// Minor units.
    pub amount: i64,
    /// See [`Status`].
    pub status: Status,
    /// Your reason.
    pub reason: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}
