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
    /// A manual payment authorized and held: capture or void it
    /// ([`crate::Intent::capture`], [`crate::Intent::void`]). Known, not
    /// final.
    RequiresCapture,
    /// Final: the hold was released without a capture (`void_reason`).
    Voided,
}

impl Status {
    /// True for `succeeded`, `failed` and `voided`.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Voided)
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
    /// `automatic` or `manual` (absent from answers of earlier builds).
    #[serde(default)]
    pub capture_method: Option<String>,
    /// What a capture may take now (the amount while `requires_capture`).
    #[serde(default)]
    pub amount_capturable: i64,
    /// What was captured; refunds are capped by it.
    #[serde(default)]
    pub amount_captured: i64,
    /// RFC 3339: until when the hold can be captured (`requires_capture`).
    #[serde(default)]
    pub capture_before: Option<String>,
    /// Why the hold was released (`requested`, `order_cancelled`,
    /// `expired`, `cancelled_at_provider`, `abandoned`; a string, so a
    /// value added later still reads), once `voided`.
    #[serde(default)]
    pub void_reason: Option<String>,
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
    /// Its payment's currency (absent from a replay of a refund made
    /// before oncepay sent it).
    #[serde(default)]
    pub currency: Option<String>,
    /// See [`Status`].
    pub status: Status,
    /// Your reason.
    pub reason: Option<String>,
    /// `original` or `balance` (absent from answers stored before it).
    #[serde(default)]
    pub destination: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// A balance's three figures: `available = posted - held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BalanceFigures {
    /// What the customer has.
    pub posted: i64,
    /// What live holds hold.
    pub held: i64,
    /// What a debit or hold may take.
    pub available: i64,
}

/// `GET /customers/{customer_id}/balance`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CustomerBalance {
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// What the customer has.
    pub posted: i64,
    /// What live holds hold.
    pub held: i64,
    /// `posted - held`.
    pub available: i64,
}

/// One movement of a customer's balance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BalanceTransaction {
    /// UUID v7.
    pub id: Uuid,
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// `credit`, `debit`, `hold`, `hold_capture`, `hold_release`,
    /// `hold_expiry`, `payment`, `refund`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always positive.
    pub amount: i64,
    /// The balance right after it.
    pub balance: BalanceFigures,
    /// Your description.
    pub description: Option<String>,
    /// The payment it paid.
    pub payment_id: Option<Uuid>,
    /// The refund it credited.
    pub refund_id: Option<Uuid>,
    /// The hold it placed or resolved.
    pub hold_id: Option<Uuid>,
    /// RFC 3339.
    pub created_at: String,
}

/// A hold on a customer's balance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BalanceHold {
    /// UUID v7.
    pub id: Uuid,
    /// The customer.
    pub customer_id: String,
    /// ISO 4217.
    pub currency: String,
    /// What it holds.
    pub amount: i64,
    /// What its capture took.
    pub captured_amount: i64,
    /// `held`, `captured`, `released` or `expired`.
    pub status: String,
    /// RFC 3339.
    pub expires_at: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// One page of a list, newest first: pass the last item's id as
/// [`ListQuery::starting_after`] for the next (older) one while `has_more`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub data: Vec<T>,
    /// Whether more follow (absent from lists that are never paged).
    #[serde(default)]
    pub has_more: bool,
}

/// A list's filters and cursor; `None` leaves a parameter out. Each list
/// takes the parameters `openapi.yaml` gives it (another is `400`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// 1 to 100 (default 10).
    pub limit: Option<u8>,
    /// The page older than this id.
    pub starting_after: Option<Uuid>,
    /// The page newer than this id.
    pub ending_before: Option<Uuid>,
    /// `pending`, `succeeded`, … (orders, payments, refunds).
    pub status: Option<String>,
    /// The order's customer (orders, payments, refunds).
    pub customer_id: Option<String>,
    /// One order's payments (`GET /payments`).
    pub order_id: Option<Uuid>,
    /// One payment's refunds (`GET /refunds`).
    pub payment_id: Option<Uuid>,
    /// One event type (`GET /events`).
    pub event_type: Option<String>,
    /// One object's events (`GET /events`).
    pub object_id: Option<Uuid>,
}

impl ListQuery {
    /// The query string, `?…` or empty.
    pub fn to_query(&self) -> String {
        let id = |v: &Option<Uuid>| v.map(|u| u.to_string());
        let pairs: Vec<(&str, Option<String>)> = vec![
            ("limit", self.limit.map(|l| l.to_string())),
            ("starting_after", id(&self.starting_after)),
            ("ending_before", id(&self.ending_before)),
            ("status", self.status.clone()),
            ("customer_id", self.customer_id.clone()),
            ("order_id", id(&self.order_id)),
            ("payment_id", id(&self.payment_id)),
            ("type", self.event_type.clone()),
            ("object_id", id(&self.object_id)),
        ];
        let set: Vec<(&str, String)> = pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        if set.is_empty() {
            String::new()
        } else {
            format!("?{}", serde_urlencoded::to_string(set).unwrap_or_default())
        }
    }
}

/// What `POST /orders/{id}/checkout` takes (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CheckoutOptions {
    /// Where the customer goes after paying; `{CHECKOUT_SESSION_ID}` in it
    /// becomes the session's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_url: Option<String>,
    /// Where the customer goes on giving up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_url: Option<String>,
    /// `en`, `ru` or `zh` (default: the browser's language).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
}

/// A hosted checkout page for one order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CheckoutSession {
    /// UUID v7.
    pub id: Uuid,
    /// The order it pays.
    pub order_id: Uuid,
    /// The page to send the customer to.
    pub url: String,
    /// RFC 3339; the page stops working then.
    pub expires_at: String,
    /// As given.
    pub success_url: Option<String>,
    /// As given.
    pub cancel_url: Option<String>,
    /// As given.
    pub locale: Option<String>,
}

/// Where oncepay sends your backend its events.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WebhookEndpoint {
    /// UUID v7.
    pub id: Uuid,
    /// Your receiver.
    pub url: String,
    /// The event types it gets.
    pub events: Vec<String>,
    /// `enabled`, or `disabled` after it answered `410 Gone`.
    pub status: String,
    /// Why it was disabled.
    pub disabled_reason: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// The signing secret (`whsec_…`), in the creating answer only: give
    /// it to [`crate::webhooks::Verifier`].
    #[serde(default)]
    pub secret: Option<String>,
}

/// An event as `GET /events` lists it: what your endpoint receives, and
/// what made the change.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EventRecord {
    /// Also `webhook-id` on every delivery.
    pub id: String,
    /// `payment.succeeded`, `order.paid`, …
    #[serde(rename = "type")]
    pub event_type: String,
    /// RFC 3339.
    pub created_at: String,
    /// 1, 2, 3… per object.
    pub sequence: i64,
    /// `{"object": …}`.
    pub data: serde_json::Value,
    /// `order`, `payment` or `refund`.
    pub object_type: String,
    /// `request`, `webhook`, `reconciler` or `incident`.
    pub cause: String,
    /// The request that made the change, if one did.
    pub request_id: Option<String>,
}

/// An API key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiKeyInfo {
    /// UUID.
    pub id: Uuid,
    /// `opk_` and six more characters.
    pub prefix: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub last_used_at: Option<String>,
    /// RFC 3339.
    pub expires_at: Option<String>,
    /// RFC 3339.
    pub revoked_at: Option<String>,
    /// `read`, `write`, `admin`.
    pub scopes: Vec<String>,
}
