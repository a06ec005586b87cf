//! Clients that behave as the seeds recommend: one key per intent, the same
//! key on every retry, retries on timeouts, `5xx`, `409 in_flight` and
//! dropped connections, with exponential backoff and full jitter.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Mutex;

/// Why requests were retried, counted.
#[derive(Default)]
pub struct Retries {
    /// Reason → count.
    pub by_reason: BTreeMap<&'static str, u64>,
}

/// What one intent saw.
#[derive(Debug, Default, Clone)]
pub struct Intent {
    /// The order's id from the create answer.
    pub order_id: Option<String>,
    /// The amount the create answer showed.
    pub amount: Option<i64>,
    /// Every 2xx body received for the payment key (repeats included).
    pub payment_answers: Vec<Value>,
    /// Statuses seen for the payment, in order (answers, then polling).
    pub payment_statuses: Vec<String>,
    /// Every 2xx body received for the refund key.
    pub refund_answers: Vec<Value>,
    /// Every answer to a cancel, in order (status, body).
    pub cancel_answers: Vec<(u16, Value)>,
    /// The money commands this intent sent (path, key, body), to send again
    /// after their keys expired.
    pub sent: Vec<(String, String, Value)>,
    /// A request that never got a final answer, and why.
    pub gave_up: Option<String>,
    /// What its customer did at the bank (3-D Secure), if it went there.
    pub bank: Option<&'static str>,
    /// Its customer pressed approve at the bank and the bank's page took
    /// it (answered `2xx` or sent them back with a redirect): the
    /// provider's word on whether the approval came in time is its books'
    /// (the sandbox answers a late press as it answers any), or the
    /// refusal of the press itself (Stripe's `_authenticate` refuses an
    /// intent no longer waiting for its customer).
    pub approved: bool,
    /// A manual payment (authorize now, capture later): what was done with
    /// its authorization (one of [`HOLD_PLANS`]).
    pub hold: Option<&'static str>,
    /// Every final answer to a capture or a void of its payment: (what it
    /// asked, its key, status, body).
    pub hold_answers: Vec<(&'static str, String, u16, Value)>,
    /// Every final answer to a balance command (credit, debit, hold, hold
    /// capture or release): (key, status, body).
    pub balance_answers: Vec<(String, u16, Value)>,
    /// What the intent did with balances, for the table.
    pub balance_moves: Vec<&'static str>,
    /// The object each key's first `2xx` named (its effect): a key sent
    /// again after its record expired may only name it again.
    pub originals: HashMap<String, String>,
    /// An order reserving stock: what its customer does (one of
    /// [`STOCK_PLANS`]).
    pub stock: Option<&'static str>,
    /// The `409 insufficient_stock` its order creation got.
    pub stock_refused: Option<Value>,
    /// Every final answer to a stock adjustment: (key, status, body).
    pub adjustments: Vec<(String, u16, Value)>,
}

/// What the customer of an order reserving stock does.
pub const STOCK_PLANS: [&str; 6] = [
    "never pays (the reservation expires)",
    "pays after its reservation expired",
    "pays at once (as its intent says)",
    "pays at once (as its intent says)",
    "pays at once (as its intent says)",
    "pays at once (as its intent says)",
];

/// An order that takes a tracked SKU without reserving it.
pub const UNRESERVED_STOCK: &str = "takes a tracked SKU without reserving it";

/// The tracked SKUs: `stock-0` to `stock-5`.
pub const STOCK_SKUS: usize = 6;

/// How long an order's stock stays reserved in the soak
/// (ONCEPAY_STOCK_RESERVATION_TTL): short, so that reservations expire,
/// and payments come after them.
pub const STOCK_TTL: Duration = Duration::from_secs(3);

/// How much of each SKU is counted in at the start.
pub const STOCK_AT_START: i64 = 12;

/// The lines of order `i` when it reserves stock: two tracked SKUs (the
/// same one twice for one order in six, whose quantities are summed) in
/// either order, and an untracked item.
fn stock_items(i: usize) -> Value {
    let (a, b) = (i % STOCK_SKUS, (i / STOCK_SKUS) % STOCK_SKUS);
    let mut items = vec![
        json!({"sku": format!("stock-{a}"), "quantity": 1 + (i / 4) % 2, "unit_amount": 1200}),
        json!({"sku": "item", "quantity": 1, "unit_amount": 900}),
        json!({"sku": format!("stock-{b}"), "quantity": 1, "unit_amount": 700}),
    ];
    if (i / 2).is_multiple_of(2) {
        items.reverse();
    }
    Value::Array(items)
}

impl Intent {
    /// Takes in what one of two requests sent at once recorded (each
    /// records into its own `Intent` while both run).
    fn absorb(&mut self, side: Intent) {
        self.sent.extend(side.sent);
        self.hold_answers.extend(side.hold_answers);
        self.balance_answers.extend(side.balance_answers);
        self.balance_moves.extend(side.balance_moves);
        self.originals.extend(side.originals);
        if side.gave_up.is_some() {
            self.gave_up = side.gave_up;
        }
    }
}

/// What a manual payment's intent does once its payment is authorized.
pub const HOLD_PLANS: [&str; 7] = [
    "captured whole",
    "captured in part (the rest released)",
    "voided",
    "voided by cancelling its order",
    "left to expire (capture_before)",
    "a capture raced a void (two keys)",
    "two captures raced (two keys, two amounts)",
];

/// How many customers share the balances the balance intents contend on.
const WALLETS: usize = 16;

/// What a customer does at the bank (3-D Secure), as the fault table
/// counts it.
pub const BANK: [&str; 4] = [
    "approved at once",
    "declined",
    "abandoned (expires, ONCEPAY_ACTION_TIMEOUT)",
    "approved around its deadline, 3.5-6.5 s (cancelled at the provider first: moves nothing; else paid, or a hold released as abandoned)",
];

/// What the clients share.
pub struct Clients {
    /// The serve processes' base URLs.
    pub bases: Vec<String>,
    /// The merchant's key.
    pub api_key: String,
    /// How long one request is retried before giving up.
    pub patience: Duration,
    /// Shared retry counts.
    pub retries: Mutex<Retries>,
    /// The payment methods the intents use: one the provider declines,
    /// one it settles later, one it charges at once.
    pub methods: PaymentMethods,
    http: reqwest::Client,
    /// The customer's browser at the bank: it does not follow the bank's
    /// redirect back to the shop (nothing listens there).
    browser: reqwest::Client,
}

/// The payment methods of one provider.
#[derive(Debug, Clone, Copy)]
pub struct PaymentMethods {
    /// Declined by the provider.
    pub declined: &'static str,
    /// Settled asynchronously (where the provider can).
    pub later: &'static str,
    /// Charged at once.
    pub charged: &'static str,
    /// A card that waits for its customer at the bank (3-D Secure), if
    /// the provider has one the harness can drive.
    pub authenticated: Option<&'static str>,
    /// Where the bank sends the customer back (`return_url` of a payment
    /// with `authenticated`), where the provider redirects only with one
    /// (Stripe: without it the action is Stripe.js's, not a redirect).
    pub return_url: Option<&'static str>,
}

impl PaymentMethods {
    /// The sandbox's test tokens.
    pub const SANDBOX: PaymentMethods = PaymentMethods {
        declined: "tok_declined",
        later: "tok_async",
        charged: "tok_visa",
        authenticated: Some("tok_3ds"),
        return_url: None,
    };
    /// localstripe's test cards (it has no asynchronous card). Its 3-D
    /// Secure card is a PaymentMethod made at start
    /// (`crate::stripe::Stack::card`), set in `authenticated` then.
    pub const STRIPE: PaymentMethods = PaymentMethods {
        declined: "pm_card_chargeCustomerFail",
        later: "pm_card_visa",
        charged: "pm_card_visa",
        authenticated: None,
        return_url: Some("http://127.0.0.1:9/chaos/returned"),
    };
}

impl Clients {
    /// Clients of `bases`.
    pub fn new(
        bases: Vec<String>,
        api_key: String,
        timeout: Duration,
        patience: Duration,
        methods: PaymentMethods,
    ) -> Clients {
        Clients {
            bases,
            api_key,
            patience,
            retries: Mutex::new(Retries::default()),
            methods,
            // A connection per request, so that the lossy proxy's share of
            // connections is a share of requests.
            http: reqwest::Client::builder()
                .timeout(timeout)
                .pool_max_idle_per_host(0)
                .build()
                .unwrap_or_default(),
            browser: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
        }
    }

    async fn retried(&self, reason: &'static str) {
        *self
            .retries
            .lock()
            .await
            .by_reason
            .entry(reason)
            .or_insert(0) += 1;
    }

    /// POSTs until a final answer (2xx or a 4xx other than in-flight),
    /// retrying with the same key. Each try goes to a random process.
    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Result<(u16, Value), String> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            let base = &self.bases[fastrand::usize(0..self.bases.len())];
            let sent = self
                .http
                .post(format!("{base}{path}"))
                .bearer_auth(&self.api_key)
                .header("Idempotency-Key", key)
                .json(body)
                .send()
                .await;
            let reason = match sent {
                Err(e) if e.is_timeout() => "timeout",
                Err(_) => "connection",
                Ok(r) => {
                    let status = r.status().as_u16();
                    match r.bytes().await {
                        Err(_) => "connection",
                        Ok(bytes) => {
                            let value: Value =
                                serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            if status >= 500 {
                                "5xx"
                            } else if status == 409 && value["code"] == "idempotency_key_in_flight"
                            {
                                "409_in_flight"
                            } else {
                                return Ok((status, value));
                            }
                        }
                    }
                }
            };
            self.retried(reason).await;
            if started.elapsed() > self.patience {
                return Err(format!(
                    "{path}: no final answer after {:?} (last: {reason})",
                    self.patience
                ));
            }
            let ceiling = Duration::from_millis(50)
                .saturating_mul(1 << attempt.min(6))
                .min(Duration::from_secs(2));
            tokio::time::sleep(ceiling.mul_f64(fastrand::f64())).await;
            attempt += 1;
        }
    }

    /// One GET (no retry); `None` unless it answered `2xx` with JSON.
    pub async fn get(&self, path: &str) -> Option<Value> {
        let base = &self.bases[fastrand::usize(0..self.bases.len())];
        let r = self
            .http
            .get(format!("{base}{path}"))
            .bearer_auth(&self.api_key)
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.json().await.ok()
    }

    /// One intent: create an order, pay it, follow a pending payment, and
    /// refund half of some succeeded ones.
    pub async fn run_intent(self: Arc<Self>, run: &str, i: usize) -> Intent {
        let mut intent = Intent::default();
        let token = match (i % 10, self.methods.authenticated) {
            (7, _) => self.methods.declined,
            (8, _) => self.methods.later,
            (9, Some(authenticated)) => authenticated,
            _ => self.methods.charged,
        };
        let mut order = json!({
            "customer_id": format!("chaos-{i}"),
            "currency": "EUR",
            "items": [{"sku": "item", "quantity": 1 + (i % 3), "unit_amount": 1000 + (i % 7) * 100}],
        });
        // Half the orders reserve stock (ReserveInventory): two tracked
        // SKUs (sometimes the same one on two lines) in either order, and
        // an untracked item.
        let reserving = i % 2 == 1;
        let stock_plan = (i / 2) % STOCK_PLANS.len();
        if reserving {
            order["reserve_stock"] = json!(true);
            order["items"] = stock_items(i);
            intent.stock = Some(STOCK_PLANS[stock_plan]);
            self.adjust_stock(run, i, &mut intent).await;
        } else if i % 6 == 4 {
            // A third of the others take a tracked SKU without reserving
            // it (issue 54): paid, it leaves the stock all the same, or
            // the order is paid short.
            order["items"]
                .as_array_mut()
                .expect("items")
                .push(json!({"sku": format!("stock-{}", (i / 6) % STOCK_SKUS), "quantity": 1, "unit_amount": 500}));
            intent.stock = Some(UNRESERVED_STOCK);
        }
        match self
            .post("/orders", &format!("order-{run}-{i}"), &order)
            .await
        {
            Ok((201, body)) => {
                intent.order_id = body["id"].as_str().map(str::to_string);
                intent.amount = body["amount"].as_i64();
            }
            Ok((409, body)) if reserving && body["code"] == "insufficient_stock" => {
                intent.stock_refused = Some(body);
                return intent;
            }
            Ok((status, body)) => {
                intent.gave_up = Some(format!("create order answered {status}: {body}"));
                return intent;
            }
            Err(e) => {
                intent.gave_up = Some(e);
                return intent;
            }
        }
        let Some(order_id) = intent.order_id.clone() else {
            return intent;
        };
        match (reserving, stock_plan) {
            // Its customer never pays: the reservation expires.
            (true, 0) => return intent,
            // Its customer pays after the reservation expired: the
            // payment takes the stock if still there, else the order is
            // paid short.
            (true, 1) => tokio::time::sleep(STOCK_TTL + Duration::from_millis(500)).await,
            _ => {}
        }
        // A third of the intents authorize only (a manual payment), a third
        // move balances (and half of those pay the order from the
        // customer's balance).
        let manual = i % 3 == 1;
        let balance = i.is_multiple_of(3);
        if balance {
            self.balance_moves(run, i, &mut intent).await;
        }
        let pays_from_balance = balance && (i / 12).is_multiple_of(2);
        let mut pay = json!({"order_id": order_id, "payment_method": token});
        if pays_from_balance {
            pay["payment_method"] = json!("balance");
        }
        if manual {
            pay["capture_method"] = json!("manual");
        }
        // A customer sent to the bank comes back to the shop.
        if let (Some(card), Some(back)) = (self.methods.authenticated, self.methods.return_url) {
            if pay["payment_method"] == card {
                pay["return_url"] = json!(back);
            }
        }
        let pay_key = format!("pay-{run}-{i}");
        intent
            .sent
            .push(("/payments".into(), pay_key.clone(), pay.clone()));
        // Repeat the payment a second time sometimes, as a double click would.
        for _ in 0..(1 + usize::from(i.is_multiple_of(5))) {
            match self.post("/payments", &pay_key, &pay).await {
                Ok((201 | 202, body)) => {
                    intent
                        .payment_statuses
                        .push(body["status"].as_str().unwrap_or("?").to_string());
                    intent.payment_answers.push(body);
                }
                Ok((status, body)) => {
                    intent.gave_up = Some(format!("payment answered {status}: {body}"));
                    return intent;
                }
                Err(e) => {
                    intent.gave_up = Some(e);
                    return intent;
                }
            }
        }
        let Some(payment_id) = intent.payment_answers[0]["id"].as_str().map(str::to_string) else {
            return intent;
        };
        intent.originals.insert(pay_key.clone(), payment_id.clone());
        if let Some(url) = intent.payment_answers[0]["next_action"]["url"].as_str() {
            let (done, approved) = self.at_the_bank(url, i).await;
            intent.bank = Some(done);
            intent.approved = approved;
        }
        // Poll a pending payment for a while, as a checkout page would.
        let deadline = Instant::now() + Duration::from_secs(20);
        while intent.payment_statuses.last().map(String::as_str) == Some("pending")
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if let Some(p) = self.get(&format!("/payments/{payment_id}")).await {
                intent
                    .payment_statuses
                    .push(p["status"].as_str().unwrap_or("?").to_string());
            }
        }
        if manual && intent.payment_statuses.last().map(String::as_str) == Some("requires_capture")
        {
            self.resolve_hold(run, i, &mut intent, &payment_id, &order_id)
                .await;
        }
        if intent.payment_statuses.last().map(String::as_str) != Some("succeeded") {
            return intent;
        }
        let refunds = format!("/payments/{payment_id}/refunds");
        if i.is_multiple_of(4) {
            let mut half = json!({"amount": intent.amount.unwrap_or(2) / 2});
            // A card payment of a balance intent refunds to store credit.
            if balance && !pays_from_balance {
                half["destination"] = json!("balance");
            }
            let key = format!("refund-{run}-{i}");
            intent
                .sent
                .push((refunds.clone(), key.clone(), half.clone()));
            match self.post(&refunds, &key, &half).await {
                Ok((201 | 202, body)) => {
                    intent.originals.insert(key.clone(), text(&body["id"]));
                    intent.refund_answers.push(body)
                }
                Ok((status, body)) => {
                    intent.gave_up = Some(format!("refund answered {status}: {body}"))
                }
                Err(e) => intent.gave_up = Some(e),
            }
        } else if i % 8 == 2 {
            self.race_refund_and_cancel(run, i, &mut intent, &refunds, &order_id)
                .await;
        }
        intent
    }

    /// Counts stock in or out as the warehouse would, now and then, while
    /// orders reserve it: eight pieces in for one reserving order in ten,
    /// two out for another (refused `409 insufficient_stock` when they
    /// are not available).
    async fn adjust_stock(&self, run: &str, i: usize, intent: &mut Intent) {
        let quantity = match (i / 2) % 10 {
            0 => 8,
            5 => -2,
            _ => return,
        };
        let path = format!("/inventory/stock-{}/adjustments", i % STOCK_SKUS);
        let key = format!("adjust-{run}-{i}");
        let body = json!({"quantity": quantity, "reason": "chaos"});
        intent.sent.push((path.clone(), key.clone(), body.clone()));
        match self.post(&path, &key, &body).await {
            Ok((status, answer)) => intent.adjustments.push((key, status, answer)),
            Err(e) => intent.gave_up = Some(e),
        }
    }

    /// Sends one capture, void or cancel of a manual payment's intent
    /// (`what`), recording its answer; `None` when it got no final answer.
    async fn hold_step(
        &self,
        intent: &mut Intent,
        what: &'static str,
        (path, key): (String, String),
        body: Value,
    ) -> Option<(u16, Value)> {
        intent.sent.push((path.clone(), key.clone(), body.clone()));
        match self.post(&path, &key, &body).await {
            Ok((status, answer)) => {
                if (200..300).contains(&status) {
                    intent.originals.insert(key.clone(), text(&answer["id"]));
                }
                intent
                    .hold_answers
                    .push((what, key, status, answer.clone()));
                Some((status, answer))
            }
            Err(e) => {
                intent.gave_up = Some(e);
                None
            }
        }
    }

    /// A manual payment, once authorized: captured whole or in part,
    /// voided, voided by cancelling its order, left to expire, or raced (a
    /// capture against a void, or two captures, each with its own key, as
    /// two clerks would). Whatever the provider and the faults do, one
    /// outcome: the invariants count it.
    async fn resolve_hold(
        &self,
        run: &str,
        i: usize,
        intent: &mut Intent,
        payment_id: &str,
        order_id: &str,
    ) {
        let plan = (i / 3) % HOLD_PLANS.len();
        intent.hold = Some(HOLD_PLANS[plan]);
        let amount = intent.amount.unwrap_or(2);
        let capture = (
            format!("/payments/{payment_id}/capture"),
            format!("capture-{run}-{i}"),
        );
        let void = (
            format!("/payments/{payment_id}/void"),
            format!("void-{run}-{i}"),
        );
        let part = json!({"amount": (amount / 2).max(1)});
        match plan {
            0 => {
                self.hold_step(intent, "capture", capture, json!({})).await;
            }
            1 => {
                self.hold_step(intent, "capture", capture, part).await;
            }
            2 => {
                self.hold_step(intent, "void", void, json!({})).await;
            }
            3 => {
                let path = format!("/orders/{order_id}/cancel");
                let key = format!("cancel-{run}-{i}");
                intent.sent.push((path.clone(), key.clone(), json!({})));
                match self.post(&path, &key, &json!({})).await {
                    Ok(answer) => intent.cancel_answers.push(answer),
                    Err(e) => intent.gave_up = Some(e),
                }
            }
            4 => {}
            _ => {
                let second = if plan == 5 {
                    ("void", void, json!({}))
                } else {
                    (
                        "capture",
                        (capture.0.clone(), format!("capture-again-{run}-{i}")),
                        part,
                    )
                };
                // Two intents at once: each records into its own copy.
                let (mut a, mut b) = (Intent::default(), Intent::default());
                tokio::join!(
                    self.hold_step(&mut a, "capture", capture, json!({})),
                    self.hold_step(&mut b, second.0, second.1, second.2)
                );
                intent.absorb(a);
                intent.absorb(b);
            }
        }
        self.after_a_refusal(run, i, intent, payment_id, plan).await;
        // What the payment is now: a capture's answer says, unless its
        // provider's answer was lost (`202`, still requires_capture), then
        // it settles as a charge does: follow it a while.
        let answered = intent
            .hold_answers
            .iter()
            .filter(|(_, _, status, _)| *status == 200)
            .filter_map(|(_, _, _, body)| body["status"].as_str())
            .find(|s| *s != "requires_capture")
            .map(str::to_string);
        if let Some(status) = answered {
            intent.payment_statuses.push(status);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while plan != 4
            && intent.payment_statuses.last().map(String::as_str) == Some("requires_capture")
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if let Some(p) = self.get(&format!("/payments/{payment_id}")).await {
                intent
                    .payment_statuses
                    .push(p["status"].as_str().unwrap_or("?").to_string());
            }
        }
    }

    /// A capture the provider refused (`402 capture_refused`: the card's
    /// issuer declined it, or Stripe would not take its amount) left the
    /// hold standing, its key spent on that answer: as a merchant would,
    /// the intent captures again under a new key, a little later, up to
    /// three times (its part again where it captured a part), then voids
    /// the hold; one intent in four voids it at once. Nothing to do when
    /// a capture or void of it was taken (`200`, `202`) or its last answer
    /// was another refusal (`409`: voided, expired).
    async fn after_a_refusal(
        &self,
        run: &str,
        i: usize,
        intent: &mut Intent,
        payment_id: &str,
        plan: usize,
    ) {
        let refused = |intent: &Intent| {
            let taken = intent
                .hold_answers
                .iter()
                .any(|(_, _, status, _)| matches!(*status, 200 | 202));
            let last_refused = intent
                .hold_answers
                .last()
                .is_some_and(|(what, _, status, body)| {
                    *what == "capture" && *status == 402 && body["code"] == "capture_refused"
                });
            !taken && last_refused
        };
        let capture = format!("/payments/{payment_id}/capture");
        let body = match plan {
            1 => json!({"amount": (intent.amount.unwrap_or(2) / 2).max(1)}),
            _ => json!({}),
        };
        let voids_at_once = (i / 21) % 4 == 3;
        for n in 1..=3 {
            if !refused(&*intent) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(200..800))).await;
            if voids_at_once {
                break;
            }
            let key = format!("recapture-{n}-{run}-{i}");
            self.hold_step(intent, "capture", (capture.clone(), key), body.clone())
                .await;
        }
        if refused(&*intent) {
            let void = (
                format!("/payments/{payment_id}/void"),
                format!("void-refused-{run}-{i}"),
            );
            self.hold_step(intent, "void", void, json!({})).await;
        }
    }

    /// One balance command (`what`), recorded with its answer; `None` when
    /// it got no final answer.
    async fn balance_step(
        &self,
        intent: &mut Intent,
        what: &'static str,
        (path, key): (String, String),
        body: Value,
    ) -> Option<(u16, Value)> {
        intent.sent.push((path.clone(), key.clone(), body.clone()));
        intent.balance_moves.push(what);
        match self.post(&path, &key, &body).await {
            Ok((status, answer)) => {
                if (200..300).contains(&status) {
                    intent.originals.insert(key.clone(), text(&answer["id"]));
                }
                intent.balance_answers.push((key, status, answer.clone()));
                Some((status, answer))
            }
            Err(e) => {
                intent.gave_up = Some(e);
                None
            }
        }
    }

    /// A balance intent: its customer gets store credit (half, all or
    /// twice what its order will cost, so some balance payments are
    /// refused for funds), then it contends on a wallet shared with other
    /// intents: a credit, a debit and a hold at once (either may be refused
    /// for funds), and the hold captured in part, released, left to
    /// expire, captured as it expires, or captured and released at once.
    /// A debit refused for funds is sent again with its key after a later
    /// credit: the same `422` must come back.
    async fn balance_moves(&self, run: &str, i: usize, intent: &mut Intent) {
        let customer = format!("chaos-{i}");
        let amount = intent.amount.unwrap_or(1000);
        let credit = match (i / 6) % 3 {
            0 => amount / 2,
            1 => amount,
            _ => amount * 2,
        };
        let path = |who: &str, what: &str| format!("/customers/{who}/balance/{what}");
        self.balance_step(
            intent,
            "store credit",
            (path(&customer, "credits"), format!("credit-{run}-{i}")),
            json!({"amount": credit.max(1), "currency": "EUR", "description": "store credit"}),
        )
        .await;
        let wallet = format!("wallet-{}", i % WALLETS);
        self.balance_step(
            intent,
            "wallet credit",
            (path(&wallet, "credits"), format!("wcredit-{run}-{i}")),
            json!({"amount": 400, "currency": "EUR"}),
        )
        .await;
        let expires_in = 2 + (i % 3) as i64;
        let (mut a, mut b) = (Intent::default(), Intent::default());
        let debit_key = format!("wdebit-{run}-{i}");
        let debit_body = json!({"amount": 300, "currency": "EUR"});
        let (debit, hold) = tokio::join!(
            self.balance_step(
                &mut a,
                "wallet debit",
                (path(&wallet, "debits"), debit_key.clone()),
                debit_body.clone()
            ),
            self.balance_step(
                &mut b,
                "wallet hold",
                (path(&wallet, "holds"), format!("whold-{run}-{i}")),
                json!({"amount": 500, "currency": "EUR", "expires_in": expires_in})
            )
        );
        intent.absorb(a);
        intent.absorb(b);
        if let Some((201, hold)) = hold {
            let id = text(&hold["id"]);
            let capture = (
                format!("/balance_holds/{id}/capture"),
                format!("whcapture-{run}-{i}"),
            );
            let release = (
                format!("/balance_holds/{id}/release"),
                format!("whrelease-{run}-{i}"),
            );
            match (i / 3) % 5 {
                0 => {
                    self.balance_step(intent, "hold captured", capture, json!({"amount": 250}))
                        .await;
                }
                1 => {
                    self.balance_step(intent, "hold released", release, json!({}))
                        .await;
                }
                2 => {}
                3 => {
                    // At its deadline: captured just before, or refused
                    // just after (`409 hold_not_active`), never both.
                    let due = Duration::from_secs(expires_in as u64);
                    tokio::time::sleep(
                        due.saturating_sub(Duration::from_millis(fastrand::u64(0..200))),
                    )
                    .await;
                    self.balance_step(intent, "hold captured at its expiry", capture, json!({}))
                        .await;
                }
                _ => {
                    let (mut a, mut b) = (Intent::default(), Intent::default());
                    tokio::join!(
                        self.balance_step(&mut a, "hold captured (raced)", capture, json!({})),
                        self.balance_step(&mut b, "hold released (raced)", release, json!({}))
                    );
                    intent.absorb(a);
                    intent.absorb(b);
                }
            }
        }
        if let Some((422, _)) = debit {
            self.balance_step(
                intent,
                "wallet credit",
                (path(&wallet, "credits"), format!("wcredit-again-{run}-{i}")),
                json!({"amount": 1000, "currency": "EUR"}),
            )
            .await;
            // The refusal is the key's answer, whatever came since.
            self.balance_step(
                intent,
                "refused debit sent again",
                (path(&wallet, "debits"), debit_key),
                debit_body,
            )
            .await;
        }
    }

    /// The customer at their bank (3-D Secure), in turn: approves at once,
    /// declines, never comes (the payment expires, ONCEPAY_ACTION_TIMEOUT,
    /// 4 s), or approves around its deadline, 3.5 to 6.5 s later: after
    /// the charge was cancelled at the provider, the approval moves
    /// nothing; before, the payment succeeds, or a hold stands (or is
    /// released by oncepay's give-up, `void_reason: abandoned`). Returns
    /// what they did, and whether an approval was taken by the bank's
    /// page (see [`Intent::approved`]).
    async fn at_the_bank(&self, url: &str, i: usize) -> (&'static str, bool) {
        let (done, choice) = match (i / 10) % 4 {
            0 => (BANK[0], Some(("approve", Duration::ZERO))),
            1 => (BANK[1], Some(("decline", Duration::ZERO))),
            2 => (BANK[2], None),
            _ => (
                BANK[3],
                Some(("approve", Duration::from_millis(fastrand::u64(3500..6500)))),
            ),
        };
        let Some((button, after)) = choice else {
            return (done, false);
        };
        tokio::time::sleep(after).await;
        for _ in 0..5 {
            let answer = self.browser.post(format!("{url}/{button}")).send().await;
            match answer {
                Ok(r) if r.status().is_success() || r.status().is_redirection() => {
                    return (done, button == "approve");
                }
                // The bank refused the press (Stripe: the intent no longer
                // waits for its customer): nothing was approved.
                Ok(r) if r.status().is_client_error() => return (done, false),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (done, false)
    }

    /// A partial refund and a cancel of the same paid order sent at once.
    /// Whichever way they interleave, the order must end cancelled with all
    /// its money returned, or paid with the partial refund alone.
    async fn race_refund_and_cancel(
        &self,
        run: &str,
        i: usize,
        intent: &mut Intent,
        refunds: &str,
        order_id: &str,
    ) {
        let third = json!({"amount": (intent.amount.unwrap_or(3) / 3).max(1)});
        let (refund_key, cancel_key) = (format!("refund-{run}-{i}"), format!("cancel-{run}-{i}"));
        let cancel_path = format!("/orders/{order_id}/cancel");
        intent
            .sent
            .push((refunds.to_string(), refund_key.clone(), third.clone()));
        intent
            .sent
            .push((cancel_path.clone(), cancel_key.clone(), json!({})));
        let empty = json!({});
        let (refund, cancel) = tokio::join!(
            self.post(refunds, &refund_key, &third),
            self.post(&cancel_path, &cancel_key, &empty)
        );
        match refund {
            Ok((201 | 202, body)) => {
                intent
                    .originals
                    .insert(refund_key.clone(), text(&body["id"]));
                intent.refund_answers.push(body)
            }
            // The cancel planned the whole rest first.
            Ok((422, body)) if body["code"] == "refund_exceeds_payment" => {}
            Ok((status, body)) => {
                intent.gave_up = Some(format!("raced refund answered {status}: {body}"))
            }
            Err(e) => intent.gave_up = Some(e),
        }
        let mut cancel = cancel;
        for attempt in 0..2 {
            match cancel {
                Ok((status, body)) => {
                    let retry = status == 409 && body["code"] == "refund_in_progress";
                    intent.cancel_answers.push((status, body));
                    if !retry || attempt == 1 {
                        break;
                    }
                }
                Err(e) => {
                    intent.gave_up = Some(e);
                    return;
                }
            }
            // Refused while the refund was pending: wait for it to settle,
            // then cancel as a new intent with a new key.
            if let Some(id) = intent.refund_answers.first().and_then(|r| r["id"].as_str()) {
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    let settled = self
                        .get(&format!("/refunds/{id}"))
                        .await
                        .is_some_and(|r| r["status"] != "pending");
                    if settled {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            let again = format!("cancel-again-{run}-{i}");
            intent
                .sent
                .push((cancel_path.clone(), again.clone(), json!({})));
            cancel = self.post(&cancel_path, &again, &empty).await;
        }
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}
