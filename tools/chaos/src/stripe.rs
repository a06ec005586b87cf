//! `--provider stripe`: oncepay's new payments go to localstripe (a fake
//! Stripe) behind the testkit's Stripe layer (Stripe's idempotency keys,
//! declines and faults). What the soak needs of it: the stack, the layer's
//! fault spells, and localstripe's books in the sandbox ledger's shape, so
//! that the invariants count Stripe's charges and refunds the same way.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use oncepay_testkit::localstripe::LocalStripe;
use oncepay_testkit::stripe_layer::{Call, HoldBooks, StripeFault, StripeLayer};
use serde_json::{json, Value};

/// The secret key oncepay uses (localstripe takes any `sk_…`), and the one
/// the books are read with.
pub const SECRET_KEY: &str = "sk_test_oncepay";
/// The webhook signing secret localstripe signs with and oncepay checks.
pub const WEBHOOK_SECRET: &str = "whsec_oncepay_chaos";

/// Every kind of call, for a credential outage.
const EVERY_CALL: [Call; 6] = [
    Call::CreateIntent,
    Call::Confirm,
    Call::Cancel,
    Call::Refund,
    Call::Read,
    Call::Other,
];

/// Every kind of call, as counted: a credential outage's, and captures.
const COUNTED: [Call; 7] = [
    Call::CreateIntent,
    Call::Confirm,
    Call::Cancel,
    Call::Capture,
    Call::Refund,
    Call::Read,
    Call::Other,
];

/// The card localstripe sends to its customer's bank (3-D Secure).
pub const THREE_D_SECURE_CARD: &str = "4000002760003184";

/// localstripe and the layer in front of it, stopped when dropped.
pub struct Stack {
    localstripe: LocalStripe,
    /// The layer oncepay talks to (`ONCEPAY_STRIPE_API_BASE`).
    pub layer: StripeLayer,
    http: reqwest::Client,
}

impl Stack {
    /// Starts localstripe on loopback and the layer on the current runtime.
    pub async fn start() -> Result<Stack, String> {
        let localstripe = LocalStripe::start().await?;
        let layer =
            StripeLayer::start(localstripe.url()).map_err(|e| format!("Stripe layer: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Stack {
            localstripe,
            layer,
            http,
        })
    }

    /// The environment of an `oncepay serve` that sends new payments here.
    pub fn serve_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ONCEPAY_PROVIDER", "stripe".into()),
            ("ONCEPAY_STRIPE_SECRET_KEY", SECRET_KEY.into()),
            ("ONCEPAY_STRIPE_API_BASE", self.layer.url().to_string()),
            ("ONCEPAY_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
        ]
    }

    /// Has localstripe post its signed events to `url` (once each, about a
    /// second after the event, never retried).
    pub async fn register_webhook(&self, url: &str) -> Result<(), String> {
        let answer = self
            .http
            .post(format!("{}/_config/webhooks/chaos", self.localstripe.url()))
            .form(&[("url", url), ("secret", WEBHOOK_SECRET)])
            .send()
            .await
            .map_err(|e| format!("registering the Stripe webhook: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!(
                "registering the Stripe webhook: localstripe answered {}",
                answer.status()
            ));
        }
        Ok(())
    }

    /// One `GET` of localstripe itself (never through the layer).
    async fn get(&self, path_and_query: &str) -> Result<Value, String> {
        let answer = self
            .http
            .get(format!("{}{path_and_query}", self.localstripe.url()))
            .bearer_auth(SECRET_KEY)
            .send()
            .await
            .map_err(|e| format!("reading localstripe {path_and_query}: {e}"))?;
        let status = answer.status();
        let body = answer
            .text()
            .await
            .map_err(|e| format!("reading localstripe {path_and_query}: {e}"))?;
        if !status.is_success() {
            return Err(format!("localstripe {path_and_query}: {status} {body}"));
        }
        serde_json::from_str(&body)
            .map_err(|e| format!("localstripe {path_and_query} is not JSON: {e}"))
    }

    /// Every object of a list, page by page. localstripe lists oldest
    /// first (refunds newest first) and restarts from the first item on an
    /// unknown `starting_after`: following `has_more` with the last id of
    /// each page visits each item once.
    async fn list_all(&self, path: &str) -> Result<Vec<Value>, String> {
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut query = format!("{path}?limit=100");
            if let Some(last) = &after {
                query.push_str(&format!("&starting_after={last}"));
            }
            let page = self.get(&query).await?;
            let data = page["data"]
                .as_array()
                .ok_or_else(|| format!("localstripe {query}: no data in {page}"))?;
            all.extend(data.iter().cloned());
            let last = data.last().and_then(|o| o["id"].as_str());
            match (page["has_more"].as_bool(), last) {
                (Some(true), Some(last)) => after = Some(last.to_string()),
                _ => return Ok(all),
            }
        }
    }

    /// Whether localstripe made an event in the last `window` (its webhook
    /// goes out a second after the event): while it did, a delivery may
    /// still be on its way.
    pub async fn events_recently(&self, window: Duration) -> Result<bool, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| e.to_string())?;
        let since = now.saturating_sub(window).as_secs();
        let page = self
            .get(&format!("/v1/events?limit=1&created[gte]={since}"))
            .await?;
        let data = page["data"].as_array().map_or(0, Vec::len);
        Ok(data > 0 || page["total_count"].as_u64().unwrap_or(0) > 0)
    }

    /// localstripe's books in the sandbox ledger's shape
    /// (`tools/chaos/src/invariants.rs` reads them), built from its
    /// PaymentIntents and Refunds:
    ///
    /// - a charge per attempt (`metadata.oncepay_attempt_id`): `succeeded`;
    ///   `failed` when declined or canceled; `unconfirmed` when never
    ///   confirmed (it moved no money); `pending` otherwise; its
    ///   `amount_refunded` is the sum of the succeeded refunds of that
    ///   PaymentIntent. Where several PaymentIntents carry one attempt, the
    ///   succeeded one is the attempt's charge, and two succeeded ones are a
    ///   key with more than one effect (a double charge);
    /// - a refund per `metadata.oncepay_refund_id`; two succeeded refunds
    ///   with one id are a key with more than one effect too.
    pub async fn books(&self) -> Result<Value, String> {
        let intents = self.list_all("/v1/payment_intents").await?;
        let mut refunds = self.list_all("/v1/refunds").await?;
        // localstripe never fails a refund later; the layer does, and
        // answers every read of it as failed, as Stripe would.
        let failed = self.layer.failed_refunds();
        for r in &mut refunds {
            if failed.contains_key(text(&r["id"])) {
                r["status"] = json!("failed");
            }
        }
        let events = self.get("/v1/events?limit=1").await?["total_count"]
            .as_u64()
            .ok_or("localstripe's event list has no total_count")?;
        Ok(ledger(&intents, &refunds, events, &self.layer.holds()))
    }

    /// A PaymentMethod of the card `number` made at localstripe (never
    /// through the layer), to pay with as a customer would after
    /// Stripe.js tokenized the card; localstripe lets one be used for any
    /// number of PaymentIntents.
    pub async fn card(&self, number: &str) -> Result<String, String> {
        let answer = self
            .http
            .post(format!("{}/v1/payment_methods", self.localstripe.url()))
            .bearer_auth(SECRET_KEY)
            .form(&[
                ("type", "card"),
                ("card[number]", number),
                ("card[exp_month]", "12"),
                ("card[exp_year]", "2034"),
                ("card[cvc]", "123"),
            ])
            .send()
            .await
            .map_err(|e| format!("making a PaymentMethod at localstripe: {e}"))?;
        let status = answer.status();
        let pm: Value = answer
            .json()
            .await
            .map_err(|e| format!("making a PaymentMethod at localstripe: {e}"))?;
        match pm["id"].as_str() {
            Some(id) if status.is_success() => Ok(id.to_string()),
            _ => Err(format!(
                "making a PaymentMethod at localstripe: {status} {pm}"
            )),
        }
    }

    /// Every dispute Stripe holds (the layer's), as Stripe shows it now.
    pub fn disputes(&self) -> Vec<Value> {
        self.layer.disputes()
    }

    /// The refunds Stripe shows failed after they succeeded (the layer's),
    /// by Stripe's refund id.
    pub fn reversed_refunds(&self) -> Vec<String> {
        self.layer.failed_refunds().into_keys().collect()
    }

    /// The id of PaymentIntent `intent`'s latest charge (what a dispute
    /// names), read from localstripe itself.
    pub async fn latest_charge(&self, intent: &str) -> Result<String, String> {
        let pi = self.get(&format!("/v1/payment_intents/{intent}")).await?;
        match &pi["latest_charge"] {
            Value::String(id) => Ok(id.clone()),
            Value::Object(charge) => Ok(charge
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()),
            _ => Err(format!("PaymentIntent {intent} has no charge: {pi}")),
        }
    }

    /// Refund `id` as Stripe shows it (through the layer, which knows
    /// refunds that failed later), read again while a spell refuses reads.
    pub async fn refund(&self, id: &str) -> Result<Value, String> {
        let url = format!("{}/v1/refunds/{id}", self.layer.url());
        for _ in 0..100 {
            let read = self.http.get(&url).bearer_auth(SECRET_KEY).send().await;
            if let Ok(answer) = read {
                if answer.status().is_success() {
                    return answer.json().await.map_err(|e| e.to_string());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("refund {id}: no read through the layer in 20 s"))
    }

    /// Casts one random spell of the layer's faults (never a stall: it
    /// holds calls until released) and returns its name, as counted and
    /// printed. Besides the faults of a provider that fails, Stripe as it
    /// answers (issue 55): captures refused (`402 card_error
    /// card_declined`, `400 amount_too_small`), and confirms and refunds
    /// answered a `500` Stripe saves under the key before any effect and
    /// replays to every repeat of it (only a new key gets through).
    pub fn spell(&self) -> &'static str {
        let ms = |lo, hi| Duration::from_millis(fastrand::u64(lo..hi));
        let retry = |should_retry| StripeFault::ServerError { should_retry };
        let saved = |should_retry| StripeFault::ErrorSaved { should_retry };
        let (name, calls, fault, lasting): (&'static str, &[Call], StripeFault, Duration) =
            match fastrand::u8(0..16) {
                12 => (
                    "captures refused 402 card_declined (saved under the key)",
                    &[Call::Capture],
                    StripeFault::Refuse {
                        status: 402,
                        kind: "card_error",
                        code: "card_declined",
                    },
                    ms(500, 2000),
                ),
                13 => (
                    "captures refused 400 amount_too_small (saved under the key)",
                    &[Call::Capture],
                    StripeFault::Refuse {
                        status: 400,
                        kind: "invalid_request_error",
                        code: "amount_too_small",
                    },
                    ms(500, 2000),
                ),
                14 => (
                    "confirms and refunds 500 saved before any effect, replayed (Stripe-Should-Retry: false)",
                    &[Call::Confirm, Call::Refund],
                    saved(Some(false)),
                    ms(300, 1500),
                ),
                15 => (
                    "confirms and refunds 500 saved before any effect, replayed (no Stripe-Should-Retry)",
                    &[Call::Confirm, Call::Refund],
                    saved(None),
                    ms(300, 1500),
                ),
                0 => (
                    "confirms refused 429 lock_timeout",
                    &[Call::Confirm],
                    StripeFault::LockTimeout,
                    ms(300, 1500),
                ),
                1 => (
                    "reads rate limited (429 rate_limit)",
                    &[Call::Read],
                    StripeFault::RateLimited,
                    ms(300, 1500),
                ),
                2 => (
                    "PaymentIntent creates rate limited (429 rate_limit)",
                    &[Call::CreateIntent],
                    StripeFault::RateLimited,
                    ms(300, 1500),
                ),
                3 => (
                    "confirms and refunds 500, Stripe-Should-Retry: true",
                    &[Call::Confirm, Call::Refund],
                    retry(Some(true)),
                    ms(300, 1500),
                ),
                4 => (
                    "confirms and refunds 500, Stripe-Should-Retry: false",
                    &[Call::Confirm, Call::Refund],
                    retry(Some(false)),
                    ms(300, 1500),
                ),
                5 => (
                    "every call 401 (credential outage)",
                    &EVERY_CALL,
                    StripeFault::Unauthorized,
                    ms(500, 2000),
                ),
                6 => (
                    "confirm made, answer dropped",
                    &[Call::Confirm],
                    StripeFault::DropAfterEffect,
                    ms(200, 800),
                ),
                7 => (
                    "PaymentIntent created, answer dropped",
                    &[Call::CreateIntent],
                    StripeFault::DropAfterEffect,
                    ms(200, 800),
                ),
                8 => (
                    "refund made, answer dropped",
                    &[Call::Refund],
                    StripeFault::DropAfterEffect,
                    ms(300, 1500),
                ),
                9 => (
                    "confirm made, 500 saved under its key",
                    &[Call::Confirm],
                    StripeFault::ErrorAfterEffect,
                    ms(200, 800),
                ),
                10 => (
                    "confirms 409 idempotency_key_in_use",
                    &[Call::Confirm],
                    StripeFault::KeyInUse,
                    ms(300, 1000),
                ),
                _ => (
                    "refunds 500, no Stripe-Should-Retry",
                    &[Call::Refund],
                    retry(None),
                    ms(300, 1500),
                ),
            };
        self.layer.spell(calls, fault, lasting);
        name
    }

    /// How many calls met a layer fault, in all.
    pub fn faulted(&self) -> u64 {
        COUNTED.iter().map(|c| self.layer.faulted(*c)).sum()
    }

    /// How many calls reached localstripe through the layer, and how many
    /// repeats the layer answered from a saved answer.
    pub fn traffic(&self) -> (u64, u64) {
        let forwarded = COUNTED.iter().map(|c| self.layer.forwarded(*c)).sum();
        (forwarded, self.layer.replayed())
    }

    /// Captures Stripe refused: a spell's refusal, or a capture of an
    /// intent no longer `requires_capture` (captured, cancelled, expired).
    pub fn captures_refused(&self) -> u64 {
        self.layer.refused(Call::Capture)
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// A PaymentIntent's status in the ledger's words (the sandbox's: a
/// manual one is `authorized`, then `captured`, `voided` or `expired`).
fn charge_status(intent: &Value, holds: &HoldBooks) -> &'static str {
    let manual = intent["capture_method"] == "manual";
    match text(&intent["status"]) {
        "succeeded" if manual => "captured",
        "succeeded" => "succeeded",
        "requires_capture" => "authorized",
        "canceled" if manual && holds.expired.contains(text(&intent["id"])) => "expired",
        "canceled" if manual => "voided",
        "canceled" => "failed",
        "requires_payment_method" if !intent["last_payment_error"].is_null() => "failed",
        // Created and never confirmed: no money moved.
        "requires_confirmation" | "requires_payment_method" => "unconfirmed",
        _ => "pending",
    }
}

/// Which of two PaymentIntents of one attempt is "the" charge: one that
/// moved money first, then one that settled.
fn rank(status: &str) -> u8 {
    match status {
        "succeeded" | "captured" => 3,
        "failed" | "authorized" | "voided" | "expired" => 2,
        "pending" => 1,
        _ => 0,
    }
}

/// The ledger of `intents` and `refunds` (see [`Stack::books`]), with the
/// captures the layer saw localstripe make.
pub fn ledger(intents: &[Value], refunds: &[Value], events: u64, holds: &HoldBooks) -> Value {
    let mut refunded: HashMap<&str, i64> = HashMap::new();
    let mut refunds_by_key: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    let mut refunds_of_others = 0u64;
    for r in refunds {
        if text(&r["status"]) == "succeeded" {
            *refunded.entry(text(&r["payment_intent"])).or_insert(0) +=
                r["amount"].as_i64().unwrap_or(0);
        }
        match r["metadata"]["oncepay_refund_id"].as_str() {
            Some(key) => refunds_by_key.entry(key).or_default().push(r),
            None => refunds_of_others += 1,
        }
    }
    let mut intents_by_key: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    let mut intents_of_others = 0u64;
    for pi in intents {
        match pi["metadata"]["oncepay_attempt_id"].as_str() {
            Some(key) => intents_by_key.entry(key).or_default().push(pi),
            None => intents_of_others += 1,
        }
    }
    let mut more_than_one_effect = 0u64;
    let mut more_than_one_intent = 0u64;
    let mut charges = Vec::new();
    for (key, pis) in &intents_by_key {
        let succeeded = pis
            .iter()
            .filter(|pi| matches!(charge_status(pi, holds), "succeeded" | "captured"))
            .count();
        more_than_one_effect += u64::from(succeeded > 1);
        more_than_one_intent += u64::from(pis.len() > 1);
        let Some(pi) = pis.iter().max_by_key(|pi| rank(charge_status(pi, holds))) else {
            continue;
        };
        let status = charge_status(pi, holds);
        let id = text(&pi["id"]);
        let amount_captured = match status {
            "captured" => holds
                .captured
                .get(id)
                .copied()
                .or_else(|| pi["amount"].as_i64()),
            "succeeded" => pi["amount"].as_i64(),
            _ => Some(0),
        };
        charges.push(json!({
            "idempotency_key": key,
            "id": id,
            "status": status,
            "amount": pi["amount"].as_i64(),
            "capture_method": pi["capture_method"],
            "amount_captured": amount_captured,
            "capture_before": holds.deadlines.get(id),
            "amount_refunded": refunded.get(id).copied().unwrap_or(0),
            "order_id": pi["metadata"]["oncepay_order_id"],
            "requests": Value::Null,
            "charges": succeeded,
            "payment_intents": pis.len(),
        }));
    }
    let mut entries = Vec::new();
    for (key, rs) in &refunds_by_key {
        let succeeded = rs
            .iter()
            .filter(|r| text(&r["status"]) == "succeeded")
            .count();
        more_than_one_effect += u64::from(succeeded > 1);
        let Some(r) = rs
            .iter()
            .find(|r| text(&r["status"]) == "succeeded")
            .or(rs.first())
        else {
            continue;
        };
        entries.push(json!({
            "idempotency_key": key,
            "id": r["id"],
            "charge": r["payment_intent"],
            "status": r["status"],
            "amount": r["amount"],
            "requests": Value::Null,
            "refunds": succeeded,
        }));
    }
    // One entry per capture localstripe made, as the sandbox lists them,
    // with the key it was sent under where the layer saw one.
    let mut keys_by_intent: HashMap<&str, Vec<&str>> = HashMap::new();
    for (key, pi) in &holds.capture_keys {
        keys_by_intent
            .entry(pi.as_str())
            .or_default()
            .push(key.as_str());
    }
    for keys in keys_by_intent.values_mut() {
        keys.sort_unstable();
    }
    let captures: Vec<Value> = holds
        .captures
        .iter()
        .flat_map(|(pi, n)| {
            let keys = keys_by_intent.get(pi.as_str()).cloned().unwrap_or_default();
            (0..*n).map(move |k| {
                json!({
                    "id": format!("{pi}/capture/{k}"),
                    "charge_id": pi,
                    "amount": holds.captured.get(pi),
                    "idempotency_key": keys.get(k as usize),
                })
            })
        })
        .collect();
    json!({
        "provider": "stripe",
        "charges": charges,
        "refunds": entries,
        "captures": captures,
        "totals": {
            "keys_with_more_than_one_effect": more_than_one_effect,
            "attempts_with_more_than_one_payment_intent": more_than_one_intent,
            "payment_intents_without_attempt": intents_of_others,
            "refunds_without_refund_id": refunds_of_others,
            "faults": {},
            "webhooks_delivered": events,
            "work_in_flight": 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pi(id: &str, attempt: &str, status: &str, declined: bool) -> Value {
        json!({
            "id": id,
            "object": "payment_intent",
            "amount": 1000,
            "status": status,
            "last_payment_error": if declined { json!({"code": "card_declined"}) } else { Value::Null },
            "metadata": {"oncepay_attempt_id": attempt, "oncepay_order_id": "o1"},
        })
    }

    fn refund(id: &str, pi: &str, key: &str, amount: i64) -> Value {
        json!({
            "id": id, "object": "refund", "amount": amount, "status": "succeeded",
            "payment_intent": pi, "metadata": {"oncepay_refund_id": key},
        })
    }

    #[test]
    fn books_map_intents_and_refunds_to_the_ledger_shape() {
        let intents = [
            pi("pi_1", "a1", "succeeded", false),
            pi("pi_2", "a2", "requires_payment_method", true),
            pi("pi_3", "a3", "requires_confirmation", false),
            pi("pi_4", "a4", "requires_confirmation", false),
            pi("pi_5", "a4", "succeeded", false),
        ];
        let refunds = [
            refund("re_1", "pi_1", "r1", 300),
            refund("re_2", "pi_1", "r2", 200),
        ];
        let l = ledger(&intents, &refunds, 7, &HoldBooks::default());
        let charge = |k: &str| {
            l["charges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["idempotency_key"] == k)
                .cloned()
                .unwrap()
        };
        assert_eq!(charge("a1")["status"], "succeeded");
        assert_eq!(charge("a1")["amount_refunded"], 500);
        assert_eq!(charge("a1")["charges"], 1);
        assert_eq!(charge("a2")["status"], "failed");
        assert_eq!(charge("a2")["charges"], 0);
        assert_eq!(charge("a3")["status"], "unconfirmed");
        assert_eq!(charge("a4")["id"], "pi_5");
        assert_eq!(l["refunds"].as_array().unwrap().len(), 2);
        assert_eq!(l["totals"]["keys_with_more_than_one_effect"], 0);
        assert_eq!(l["totals"]["webhooks_delivered"], 7);
    }

    #[test]
    fn two_succeeded_intents_of_one_attempt_are_a_double_charge() {
        let intents = [
            pi("pi_1", "a1", "succeeded", false),
            pi("pi_2", "a1", "succeeded", false),
        ];
        let refunds = [
            refund("re_1", "pi_1", "r1", 300),
            refund("re_2", "pi_1", "r1", 300),
        ];
        let l = ledger(&intents, &refunds, 0, &HoldBooks::default());
        assert_eq!(l["totals"]["keys_with_more_than_one_effect"], 2);
        assert_eq!(l["refunds"][0]["refunds"], 2);
    }

    #[test]
    fn holds_map_to_the_sandbox_words_with_their_captures() {
        let manual = |id: &str, attempt: &str, status: &str| {
            let mut p = pi(id, attempt, status, false);
            p["capture_method"] = json!("manual");
            p
        };
        let intents = [
            manual("pi_1", "a1", "requires_capture"),
            manual("pi_2", "a2", "succeeded"),
            manual("pi_3", "a3", "canceled"),
            manual("pi_4", "a4", "canceled"),
            manual("pi_5", "a5", "succeeded"),
        ];
        let mut holds = HoldBooks::default();
        holds.captured.insert("pi_2".into(), 400);
        holds.captures.insert("pi_2".into(), 1);
        holds.captures.insert("pi_5".into(), 2);
        holds
            .capture_keys
            .insert("oncepay_c2_capture".into(), "pi_2".into());
        holds.expired.insert("pi_4".into());
        let l = ledger(&intents, &[], 0, &holds);
        let charge = |k: &str| {
            l["charges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["idempotency_key"] == k)
                .cloned()
                .unwrap()
        };
        assert_eq!(charge("a1")["status"], "authorized");
        assert_eq!(charge("a1")["amount_captured"], 0);
        assert_eq!(charge("a2")["status"], "captured");
        assert_eq!(charge("a2")["amount_captured"], 400);
        assert_eq!(charge("a3")["status"], "voided");
        assert_eq!(charge("a4")["status"], "expired");
        // Captured whole where the capture named no amount.
        assert_eq!(charge("a5")["amount_captured"], 1000);
        let captures = l["captures"].as_array().unwrap();
        assert_eq!(captures.len(), 3);
        assert_eq!(
            captures.iter().filter(|c| c["charge_id"] == "pi_5").count(),
            2
        );
        // The key each capture was sent under, where the layer saw one.
        let of = |pi: &str| {
            captures
                .iter()
                .find(|c| c["charge_id"] == pi)
                .map(|c| c["idempotency_key"].clone())
        };
        assert_eq!(of("pi_2"), Some(json!("oncepay_c2_capture")));
        assert_eq!(of("pi_5"), Some(Value::Null));
    }
}
