//! The sandbox's books: charges and refunds by idempotency key, with a count
//! of requests per key so the ledger shows retries next to effects.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

/// One charge.
#[derive(Debug, Clone, Serialize)]
pub struct Charge {
    /// `ch_…`.
    pub id: String,
    /// Always `charge`.
    pub object: &'static str,
    /// The key it was made with (the merchant's attempt id).
    pub idempotency_key: String,
    /// Minor units.
    pub amount: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// pending, succeeded or failed; a charge made with `capture: false`
    /// is authorized, then captured, voided or expired.
    pub status: &'static str,
    /// `automatic` or `manual` (`capture: false`).
    pub capture_method: &'static str,
    /// What its capture took (an automatic charge: all of it once
    /// succeeded).
    pub amount_captured: i64,
    /// An authorized charge's deadline, Unix seconds: past it the hold
    /// expires (`ONCEPAY_SANDBOX_CAPTURE_WINDOW` after the authorization).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_before: Option<i64>,
    /// Why it failed.
    pub failure_code: Option<String>,
    /// A readable reason.
    pub failure_message: Option<String>,
    /// Sum of its succeeded refunds.
    pub amount_refunded: i64,
    /// What the merchant attached.
    pub metadata: Value,
    /// Unix seconds.
    pub created: i64,
    /// Token the charge was made with, suffixes included; not shown.
    #[serde(skip)]
    pub source: String,
    /// While it waits for its customer (`tok_3ds`):
    /// `{"type": "redirect", "url": …}` to the sandbox's bank page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_action: Option<Value>,
    /// What approving at the bank page makes of it (`tok_3ds`: succeeded;
    /// `tok_3ds_declined`: failed); `None` once decided.
    #[serde(skip)]
    pub on_approval: Option<&'static str>,
    /// Where the bank page sends the customer back.
    #[serde(skip)]
    pub return_url: Option<String>,
}

/// One capture of an authorized charge.
#[derive(Debug, Clone, Serialize)]
pub struct Capture {
    /// `cp_…`.
    pub id: String,
    /// The key it was made with (the merchant's capture id).
    pub idempotency_key: String,
    /// The captured charge.
    pub charge_id: String,
    /// Minor units.
    pub amount: i64,
    /// Unix seconds.
    pub created: i64,
}

/// One refund.
#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    /// `re_…`.
    pub id: String,
    /// Always `refund`.
    pub object: &'static str,
    /// The key it was made with (the merchant's refund id).
    pub idempotency_key: String,
    /// The refunded charge.
    pub charge: String,
    /// Minor units.
    pub amount: i64,
    /// succeeded or failed.
    pub status: &'static str,
    /// Why it failed.
    pub failure_code: Option<String>,
    /// What the merchant attached.
    pub metadata: Value,
    /// Unix seconds.
    pub created: i64,
}

/// One dispute (chargeback) of a charge, opened by
/// `POST /v1/charges/{charge_id}/disputes` and closed by
/// `POST /v1/disputes/{id}/close`.
#[derive(Debug, Clone, Serialize)]
pub struct Dispute {
    /// `dp_…`.
    pub id: String,
    /// Always `dispute`.
    pub object: &'static str,
    /// The disputed charge's id.
    pub charge_id: String,
    /// Minor units.
    pub amount: i64,
    /// The charge's currency.
    pub currency: String,
    /// `needs_response`, then `won` or `lost`.
    pub status: &'static str,
    /// The bank's reason (`fraudulent` unless told).
    pub reason: String,
    /// When evidence is due, Unix seconds (seven days after opening).
    pub evidence_due_by: i64,
    /// Unix seconds.
    pub created: i64,
}

/// Everything the sandbox knows. The maps that grow with every charge are
/// B-trees: a hash map that doubles rehashes all it holds at once, under
/// the books' lock, and the four that grow together double at the same
/// charge. Every charge and webhook waited meanwhile: the bench saw
/// 30–40 ms stalls of the sandbox's `/healthz` in the seconds pay's p99
/// jumped, the provider's stall and not the service's.
#[derive(Default)]
pub struct Books {
    /// Charges by idempotency key.
    pub charges: BTreeMap<String, Charge>,
    /// Charge key by charge id.
    pub charge_keys: BTreeMap<String, String>,
    /// Refunds by idempotency key.
    pub refunds: BTreeMap<String, Refund>,
    /// Refund key by refund id.
    pub refund_keys: BTreeMap<String, String>,
    /// POST requests seen per key (charges and refunds), retries included.
    pub requests: BTreeMap<String, u32>,
    /// Effects made per key: must never exceed one.
    pub effects: BTreeMap<String, u32>,
    /// Webhook deliveries answered 2xx.
    pub webhooks_delivered: u64,
    /// Webhook deliveries not finished yet (being sent or retried) plus
    /// async charges not settled yet: zero when the sandbox has nothing
    /// more to say, which is how a harness knows it may count.
    pub work_in_flight: u64,
    /// Faults injected, by kind.
    pub faults: HashMap<&'static str, u64>,
    /// Disputes by id.
    pub disputes: BTreeMap<String, Dispute>,
    /// Captures by idempotency key.
    pub captures: BTreeMap<String, Capture>,
    /// Charges whose next capture is declined, with the decline code
    /// (`POST /v1/charges/{id}/refuse_capture`), by charge id.
    pub capture_refusals: HashMap<String, String>,
    /// Captures declined, by idempotency key: the charge id and the code,
    /// answered again to a repeat of the key.
    pub refused_captures: HashMap<String, (String, String)>,
    /// Tokens made by `POST /v1/tokens`, and the test token each behaves as.
    pub tokens: HashMap<String, &'static str>,
}

impl Books {
    /// Counts a request for `key` and returns its 1-based number.
    pub fn count_request(&mut self, key: &str) -> u32 {
        let n = self.requests.entry(key.to_string()).or_insert(0);
        *n += 1;
        *n
    }

    /// Counts an injected fault.
    pub fn count_fault(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_insert(0) += 1;
    }

    /// The ledger: per-key requests and effects (in key order, the maps'
    /// own), and totals.
    pub fn ledger(&self) -> Value {
        let charges: Vec<Value> = self
            .charges
            .values()
            .map(|c| {
                serde_json::json!({
                    "idempotency_key": c.idempotency_key,
                    "id": c.id,
                    "status": c.status,
                    "capture_method": c.capture_method,
                    "amount_captured": c.amount_captured,
                    "capture_before": c.capture_before,
                    "amount": c.amount,
                    "amount_refunded": c.amount_refunded,
                    "order_id": c.metadata.get(crate::provider::trace::ORDER),
                    "requests": self.requests.get(&c.idempotency_key).copied().unwrap_or(0),
                    "charges": self.effects.get(&c.idempotency_key).copied().unwrap_or(0),
                })
            })
            .collect();
        let refunds: Vec<Value> = self
            .refunds
            .values()
            .map(|r| {
                serde_json::json!({
                    "idempotency_key": r.idempotency_key,
                    "id": r.id,
                    "charge": r.charge,
                    "status": r.status,
                    "amount": r.amount,
                    "requests": self.requests.get(&r.idempotency_key).copied().unwrap_or(0),
                    "refunds": self.effects.get(&r.idempotency_key).copied().unwrap_or(0),
                })
            })
            .collect();
        let captures: Vec<Value> = self
            .captures
            .values()
            .map(|c| {
                serde_json::json!({
                    "id": c.id,
                    "charge_id": c.charge_id,
                    "amount": c.amount,
                    "idempotency_key": c.idempotency_key,
                    "requests": self.requests.get(&c.idempotency_key).copied().unwrap_or(0),
                })
            })
            .collect();
        serde_json::json!({
            "charges": charges,
            "refunds": refunds,
            "captures": captures,
            "totals": self.totals(),
        })
    }

    /// The ledger's totals alone: what a harness polls while load runs
    /// (the whole ledger grows with every charge, and building it holds
    /// the books).
    pub fn totals(&self) -> Value {
        let effects_over_one = self.effects.values().filter(|n| **n > 1).count();
        serde_json::json!({
            "charges": self.charges.len(),
            "charges_succeeded": self.charges.values().filter(|c| c.status == "succeeded").count(),
            "charges_authorized": self.charges.values().filter(|c| c.capture_method == "manual").count(),
            "captures": self.captures.len(),
            "captured_amount": self.captures.values().map(|c| c.amount).sum::<i64>(),
            "refunds": self.refunds.len(),
            "refunded_amount": self.refunds.values().filter(|r| r.status == "succeeded").map(|r| r.amount).sum::<i64>(),
            "requests": self.requests.values().map(|n| *n as u64).sum::<u64>(),
            "keys_with_more_than_one_effect": effects_over_one,
            "webhooks_delivered": self.webhooks_delivered,
            "work_in_flight": self.work_in_flight,
            "faults": self.faults,
        })
    }
}
