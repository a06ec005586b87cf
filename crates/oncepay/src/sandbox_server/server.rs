//! The sandbox's HTTP API and webhook delivery.
//!
//! `POST /v1/charges` and `POST /v1/refunds` (header `Idempotency-Key`),
//! `GET /v1/charges/{id}`, `POST /v1/charges/{id}/cancel` (a charge whose
//! customer never authenticated), `GET /v1/charges?idempotency_key=K`, the list
//! `GET /v1/charges?created[gte]=…&created[lt]=…&limit=…&starting_after=…`,
//! the same for refunds, `POST /v1/refunds/{id}/fail` (a refund that
//! fails after it succeeded), disputes (`POST /v1/charges/{id}/disputes`
//! opens one, `POST /v1/disputes/{id}/close` closes it, each sending its
//! `charge.dispute.*` webhook; `GET /v1/disputes/{id}`, and the list
//! `GET /v1/disputes?created[gte]=…&created[lt]=…`), `GET /v1/ledger`,
//! `GET /v1/ledger/totals`, `GET /healthz`. Holds: `POST /v1/charges` with
//! `"capture": false` authorizes only (`authorized`, `capture_before` after
//! `ONCEPAY_SANDBOX_CAPTURE_WINDOW`); `POST /v1/charges/{id}/capture`
//! (`Idempotency-Key`, `{"amount"}`) and `POST /v1/charges/{id}/void` end
//! the hold; past its deadline it expires (`charge.expired`), at once with
//! `POST /v1/charges/{id}/expire` (a test's lever). `POST
//! /v1/charges/{id}/refuse_capture` (`{"code"}`, a decline code, default
//! `card_declined`; a test's lever) has the charge's next capture declined
//! as a card's issuer may decline one: `402` with the code, answered
//! again to a repeat of that capture's key; the charge stays authorized.

use std::net::TcpListener;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde::Deserialize;
use serde_json::{json, Value};

use super::faults::TokenFaults;
use super::state::{Books, Capture, Charge, Dispute, Refund};
use crate::config::SandboxConfig;

/// A running sandbox's shared state.
pub struct Sandbox {
    books: Mutex<Books>,
    config: SandboxConfig,
    http: reqwest::Client,
    /// How browsers reach it (its bank page).
    public_url: String,
}

type Shared = web::Data<Sandbox>;

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

fn error(status: u16, code: &str, detail: &str) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(json!({"code": code, "detail": detail}))
}

/// A body that fails at once: the connection is closed without a complete
/// answer, as when a network drops a response that was already decided.
struct Dropped;

impl MessageBody for Dropped {
    type Error = std::io::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other(
            "sandbox fault: response dropped",
        ))))
    }
}

/// What happens to the answer of a request that did reach the books.
enum Delivery {
    Answer,
    Drop,
    Delay(Duration),
}

impl Sandbox {
    /// A sandbox with empty books.
    pub fn new(config: SandboxConfig, public_url: String) -> Result<Sandbox, reqwest::Error> {
        Ok(Sandbox {
            books: Mutex::new(Books::default()),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            config,
            public_url: public_url.trim_end_matches('/').to_string(),
        })
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic while holding the lock cannot leave the books half
        // written in a way that matters to a sandbox; keep serving.
        self.books
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before any effect: should this request fail with a 500?
    fn fails_first(&self, books: &mut Books, token_errors: u32, n: u32) -> bool {
        let fail = n <= token_errors || fastrand::f64() < self.config.faults.error_rate;
        if fail {
            books.count_fault("error_5xx");
        }
        fail
    }

    /// The start of a call on a held charge (a capture, a void) under
    /// `key`: the charge's key in the books, its token's faults and the
    /// call's count under `key`; or the answer already, when there is no
    /// such charge or the token's fault fails the call before it acts
    /// (`acting`, for the message).
    fn hold_call(
        &self,
        books: &mut Books,
        charge_id: &str,
        key: &str,
        acting: &str,
    ) -> Result<(String, TokenFaults, u32), Box<HttpResponse>> {
        let Some(charge_key) = books.charge_keys.get(charge_id).cloned() else {
            return Err(Box::new(error(404, "charge_not_found", "no such charge")));
        };
        let source = books
            .charges
            .get(&charge_key)
            .map(|c| c.source.clone())
            .unwrap_or_default();
        let faults = TokenFaults::parse(&source).unwrap_or_default();
        let n = books.count_request(key);
        if self.fails_first(books, faults.error, n) {
            return Err(Box::new(error(
                500,
                "sandbox_fault",
                &format!("injected failure before {acting}"),
            )));
        }
        Ok((charge_key, faults, n))
    }

    /// After the effect: is the answer dropped or delayed?
    fn delivery(&self, books: &mut Books, faults: &TokenFaults, n: u32) -> Delivery {
        let rates = &self.config.faults;
        if n <= faults.drop || fastrand::f64() < rates.drop_rate {
            books.count_fault("dropped_response");
            return Delivery::Drop;
        }
        if let (Some(delay), 1) = (faults.delay, n) {
            books.count_fault("delayed_response");
            return Delivery::Delay(delay);
        }
        if rates.delay_rate > 0.0 && fastrand::f64() < rates.delay_rate {
            books.count_fault("delayed_response");
            return Delivery::Delay(rates.delay);
        }
        Delivery::Answer
    }
}

async fn deliver(delivery: Delivery, body: Value) -> HttpResponse {
    match delivery {
        Delivery::Drop => HttpResponse::Ok()
            .content_type("application/json")
            .body(Dropped),
        Delivery::Delay(d) => {
            tokio::time::sleep(d).await;
            HttpResponse::Ok().json(body)
        }
        Delivery::Answer => HttpResponse::Ok().json(body),
    }
}

/// The metadata the books keep: all of it, or with
/// `ONCEPAY_SANDBOX_FORGET_TRACE` only the order id.
fn kept_metadata(sandbox: &Sandbox, metadata: &Value) -> Value {
    if !sandbox.config.faults.forget_trace {
        return metadata.clone();
    }
    let order = crate::provider::trace::ORDER;
    match metadata.get(order) {
        Some(id) => json!({ order: id }),
        None => json!({}),
    }
}

fn key_of(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get("Idempotency-Key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .map(str::to_string)
}

#[derive(Deserialize)]
struct ChargeBody {
    amount: i64,
    currency: String,
    source: String,
    #[serde(default)]
    metadata: Value,
    /// Where the bank page sends the customer back (3-D Secure tokens).
    #[serde(default)]
    return_url: Option<String>,
    /// `false`: authorize only; the charge is `authorized` until captured
    /// (`POST /v1/charges/{id}/capture`), voided or expired.
    #[serde(default = "capture_at_once")]
    capture: bool,
}

fn capture_at_once() -> bool {
    true
}

/// A charge reaching `status`: an approved manual charge is held
/// (`authorized`, until `capture_before`) instead of succeeding, and an
/// automatic one captures its whole amount. True when a hold began (its
/// expiry is to be scheduled).
fn reach(charge: &mut Charge, status: &'static str, window: Duration) -> bool {
    if status == "succeeded" && charge.capture_method == "manual" {
        charge.status = "authorized";
        let window = window.as_secs_f64().ceil() as i64;
        charge.capture_before = Some(now_unix() + window.max(1));
        return true;
    }
    charge.status = status;
    if status == "succeeded" {
        charge.amount_captured = charge.amount;
    }
    false
}

/// A held charge past its deadline expires (once): true if it did now, and
/// its `charge.expired` is to be sent.
fn expire_if_due(charge: &mut Charge) -> bool {
    let due =
        charge.status == "authorized" && charge.capture_before.is_some_and(|at| now_unix() >= at);
    if due {
        charge.status = "expired";
    }
    due
}

/// Expires the hold of `key` at its deadline, with its webhook, unless it
/// was captured or voided before. Not counted as work in flight: a hold
/// may stand for days, and harnesses wait for that count to be zero.
///
/// Takes the deadline instead of reading it: its callers hold the books
/// (a `std` mutex, not reentrant) when a hold begins.
fn schedule_expiry(sandbox: Arc<Sandbox>, key: String, deadline: Option<i64>) {
    let Some(deadline) = deadline else {
        return;
    };
    tokio::spawn(async move {
        let wait = (deadline - now_unix()).max(0) as u64;
        tokio::time::sleep(Duration::from_secs(wait)).await;
        // The deadline is whole seconds: past it for sure.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let event = {
            let mut books = sandbox.books();
            let Some(charge) = books.charges.get_mut(&key) else {
                return;
            };
            if !expire_if_due(charge) {
                return;
            }
            charge_event(charge, "expired")
        };
        let copies = sandbox.config.faults.duplicate_webhooks;
        send_webhooks(sandbox, vec![event], copies);
    });
}
fn charge_event(charge: &Charge, status: &'static str) -> Value {
    let mut object = charge.clone();
    object.status = status;
    if status != "pending" {
        object.next_action = None;
    }
    if status != "failed" {
        object.failure_code = None;
        object.failure_message = None;
    }
    json!({
        "id": new_id("evt"),
        "type": format!("charge.{status}"),
        "created": now_unix(),
        "data": {"object": object},
    })
}

async fn create_charge(
    sandbox: Shared,
    req: HttpRequest,
    body: web::Json<ChargeBody>,
) -> HttpResponse {
    let Some(key) = key_of(&req) else {
        return error(
            400,
            "idempotency_key_missing",
            "Idempotency-Key is required",
        );
    };
    let faults = match TokenFaults::parse(&body.source) {
        Ok(f) => f,
        Err(unknown) => return error(400, "unknown_fault", &unknown.to_string()),
    };
    let window = sandbox.config.capture_window;
    let (charge, delivery, events, later) = {
        let mut books = sandbox.books();
        let n = books.count_request(&key);
        if sandbox.fails_first(&mut books, faults.error, n) {
            return error(500, "sandbox_fault", "injected failure before charging");
        }
        let (charge, events, later) = match books.charges.get(&key) {
            Some(existing) => {
                if existing.amount != body.amount
                    || existing.currency != body.currency
                    || existing.source != body.source
                {
                    return error(
                        409,
                        "idempotency_key_reused",
                        "this key was used for another charge",
                    );
                }
                (existing.clone(), Vec::new(), None)
            }
            None => {
                let reorder = faults.reorder || sandbox.config.faults.reorder_webhooks;
                let metadata = kept_metadata(&sandbox, &body.metadata);
                // A token made from a card number behaves as its test card.
                let base = match books.tokens.get(&faults.base) {
                    Some(test_token) => test_token.to_string(),
                    None => faults.base.clone(),
                };
                let bank = format!("{}/v1/authenticate", sandbox.public_url);
                new_charge(
                    &mut books,
                    &key,
                    &body,
                    metadata,
                    (&base, &bank),
                    (reorder, window),
                )
            }
        };
        let delivery = sandbox.delivery(&mut books, &faults, n);
        (charge, delivery, events, later)
    };
    let copies = if faults.duplicate {
        3
    } else {
        sandbox.config.faults.duplicate_webhooks
    };
    let reorder = faults.reorder || sandbox.config.faults.reorder_webhooks;
    send_webhooks(sandbox.clone().into_inner(), events, copies);
    if charge.status == "authorized" {
        schedule_expiry(
            sandbox.clone().into_inner(),
            key.clone(),
            charge.capture_before,
        );
    }
    if let Some(final_status) = later {
        settle_later(
            sandbox.clone().into_inner(),
            key,
            final_status,
            copies,
            reorder,
        );
    }
    let body = serde_json::to_value(&charge).unwrap_or(Value::Null);
    deliver(delivery, body).await
}

/// What a test token decides: the charge's status now, its failure, and
/// the status it settles to later (async tokens).
struct Outcome {
    status: &'static str,
    failure: Option<(&'static str, &'static str)>,
    later: Option<&'static str>,
    /// 3-D Secure: it waits for the customer at the bank page, and
    /// approving there makes it this.
    on_approval: Option<&'static str>,
}

fn outcome_of(token: &str) -> Outcome {
    let (status, failure, later) = match token {
        "tok_visa" => ("succeeded", None, None),
        "tok_declined" => (
            "failed",
            Some(("card_declined", "The card was declined.")),
            None,
        ),
        "tok_async" => ("pending", None, Some("succeeded")),
        "tok_async_declined" => ("pending", None, Some("failed")),
        "tok_3ds" | "tok_3ds_declined" => ("pending", None, None),
        "tok_insufficient_funds" => (
            "failed",
            Some(("insufficient_funds", "Your card has insufficient funds.")),
            None,
        ),
        _ => (
            "failed",
            Some(("invalid_payment_method", "Unknown test token.")),
            None,
        ),
    };
    let on_approval = match token {
        "tok_3ds" => Some("succeeded"),
        "tok_3ds_declined" => Some("failed"),
        _ => None,
    };
    Outcome {
        status,
        failure,
        later,
        on_approval,
    }
}

/// Makes the first charge for `key` in the books, with the events to send
/// now and the status it settles to later.
fn new_charge(
    books: &mut Books,
    key: &str,
    body: &ChargeBody,
    metadata: Value,
    (token, bank): (&str, &str),
    (reorder, window): (bool, Duration),
) -> (Charge, Vec<Value>, Option<&'static str>) {
    let outcome = outcome_of(token);
    let id = new_id("ch");
    let mut charge = Charge {
        next_action: outcome
            .on_approval
            .map(|_| json!({"type": "redirect", "url": format!("{bank}/{id}")})),
        on_approval: outcome.on_approval,
        return_url: body.return_url.clone(),
        id,
        object: "charge",
        idempotency_key: key.to_string(),
        amount: body.amount,
        currency: body.currency.clone(),
        status: "pending",
        capture_method: if body.capture { "automatic" } else { "manual" },
        amount_captured: 0,
        capture_before: None,
        failure_code: outcome.failure.map(|f| f.0.to_string()),
        failure_message: outcome.failure.map(|f| f.1.to_string()),
        amount_refunded: 0,
        metadata,
        created: now_unix(),
        source: body.source.clone(),
    };
    reach(&mut charge, outcome.status, window);
    let status = charge.status;
    books.charge_keys.insert(charge.id.clone(), key.to_string());
    books.charges.insert(key.to_string(), charge.clone());
    *books.effects.entry(key.to_string()).or_insert(0) += 1;
    let events = match (outcome.later, reorder) {
        // Async: the pending event now, the final one later; reordered,
        // both later with the final one first.
        (Some(_), false) => vec![charge_event(&charge, "pending")],
        (Some(_), true) => Vec::new(),
        (None, false) => vec![charge_event(&charge, status)],
        (None, true) => vec![
            charge_event(&charge, status),
            charge_event(&charge, "pending"),
        ],
    };
    (charge, events, outcome.later)
}

/// Moves an async charge to its final status after the configured delay.
fn settle_later(
    sandbox: Arc<Sandbox>,
    key: String,
    final_status: &'static str,
    copies: u32,
    reorder: bool,
) {
    sandbox.books().work_in_flight += 1;
    tokio::spawn(async move {
        tokio::time::sleep(sandbox.config.async_delay).await;
        let events = {
            let mut books = sandbox.books();
            books.work_in_flight -= 1;
            let Some(charge) = books.charges.get_mut(&key) else {
                return;
            };
            let held = reach(charge, final_status, sandbox.config.capture_window);
            let final_status = charge.status;
            if held {
                schedule_expiry(sandbox.clone(), key.clone(), charge.capture_before);
            }
            if final_status == "failed" {
                charge.failure_code = Some("card_declined".into());
                charge.failure_message = Some("The card was declined.".into());
            }
            let charge = charge.clone();
            if reorder {
                vec![
                    charge_event(&charge, final_status),
                    charge_event(&charge, "pending"),
                ]
            } else {
                vec![charge_event(&charge, final_status)]
            }
        };
        send_webhooks(sandbox, events, copies);
    });
}

/// Delivers events in order, each `copies` times, retrying each delivery
/// with backoff until it is answered 2xx.
fn send_webhooks(sandbox: Arc<Sandbox>, events: Vec<Value>, copies: u32) {
    if !sandbox.config.webhooks_enabled || events.is_empty() {
        return;
    }
    let deliveries = events.len() as u64 * u64::from(copies.max(1));
    sandbox.books().work_in_flight += deliveries;
    tokio::spawn(async move {
        for event in events {
            for _ in 0..copies.max(1) {
                deliver_webhook(&sandbox, &event).await;
                sandbox.books().work_in_flight -= 1;
            }
        }
    });
}

async fn deliver_webhook(sandbox: &Sandbox, event: &Value) {
    let id = event["id"].as_str().unwrap_or_default().to_string();
    let body = serde_json::to_vec(event).unwrap_or_default();
    let mut pause = Duration::from_millis(100);
    for _ in 0..15 {
        let timestamp = now_unix();
        let signature = sandbox.config.webhook_secret.sign(&id, timestamp, &body);
        let sent = sandbox
            .http
            .post(&sandbox.config.webhook_url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                sandbox.books().webhooks_delivered += 1;
                return;
            }
            Ok(r) => tracing::info!(event = %id, status = %r.status(), "webhook refused; retrying"),
            Err(e) => tracing::info!(event = %id, error = %e, "webhook not answered; retrying"),
        }
        tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
    tracing::warn!(event = %id, "webhook not delivered after retries; giving up");
}

#[derive(Deserialize)]
struct Lookup {
    idempotency_key: Option<String>,
    #[serde(rename = "created[gte]")]
    created_gte: Option<i64>,
    #[serde(rename = "created[lt]")]
    created_lt: Option<i64>,
    starting_after: Option<String>,
    limit: Option<usize>,
}

/// A page of the books, oldest first (creation time, then id: ids are
/// UUIDv7, so they sort by time too), Stripe's list shape: objects created
/// in `[created[gte], created[lt])`, after the object `starting_after`.
fn list<T: serde::Serialize>(
    objects: impl Iterator<Item = (i64, String, T)>,
    query: &Lookup,
) -> HttpResponse {
    let limit = query.limit.unwrap_or(10).clamp(1, 100);
    let mut rows: Vec<(i64, String, T)> = objects
        .filter(|(created, _, _)| {
            query.created_gte.is_none_or(|gte| *created >= gte)
                && query.created_lt.is_none_or(|lt| *created < lt)
        })
        .collect();
    rows.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let start = match &query.starting_after {
        Some(after) => match rows.iter().position(|(_, id, _)| id == after) {
            Some(i) => i + 1,
            None => {
                return error(
                    400,
                    "invalid_cursor",
                    "starting_after names no listed object",
                )
            }
        },
        None => 0,
    };
    let page: Vec<&T> = rows.iter().skip(start).take(limit).map(|r| &r.2).collect();
    let has_more = rows.len() > start + page.len();
    HttpResponse::Ok().json(json!({"object": "list", "data": page, "has_more": has_more}))
}

async fn find_charge(sandbox: Shared, query: web::Query<Lookup>) -> HttpResponse {
    let books = sandbox.books();
    if query.idempotency_key.is_none() {
        let all = books.charges.values().map(|c| (c.created, c.id.clone(), c));
        return list(all, &query);
    }
    match query
        .idempotency_key
        .as_ref()
        .and_then(|k| books.charges.get(k))
    {
        Some(c) => HttpResponse::Ok().json(c),
        None => error(
            404,
            "charge_not_found",
            "no charge with this idempotency key",
        ),
    }
}

async fn get_charge(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    let books = sandbox.books();
    match books
        .charge_keys
        .get(path.as_str())
        .and_then(|k| books.charges.get(k))
    {
        Some(c) => HttpResponse::Ok().json(c),
        None => error(404, "charge_not_found", "no such charge"),
    }
}

#[derive(Deserialize)]
struct RefundBody {
    charge: String,
    amount: i64,
    #[serde(default)]
    metadata: Value,
}

async fn create_refund(
    sandbox: Shared,
    req: HttpRequest,
    body: web::Json<RefundBody>,
) -> HttpResponse {
    let Some(key) = key_of(&req) else {
        return error(
            400,
            "idempotency_key_missing",
            "Idempotency-Key is required",
        );
    };
    let no_faults = TokenFaults::default();
    let (refund, delivery, events) = {
        let mut books = sandbox.books();
        let n = books.count_request(&key);
        if sandbox.fails_first(&mut books, 0, n) {
            return error(500, "sandbox_fault", "injected failure before refunding");
        }
        let (refund, events) = match books.refunds.get(&key) {
            Some(existing) => (existing.clone(), Vec::new()),
            None => {
                let Some(charge_key) = books.charge_keys.get(&body.charge).cloned() else {
                    return error(404, "charge_not_found", "no such charge");
                };
                // What the customer's bank took back is not refunded, as at
                // Stripe: the customer has that money already.
                let charged_back: i64 = books
                    .disputes
                    .values()
                    .filter(|d| d.charge_id == body.charge && d.status != "won")
                    .map(|d| d.amount)
                    .sum();
                let Some(charge) = books.charges.get_mut(&charge_key) else {
                    return error(404, "charge_not_found", "no such charge");
                };
                let left = charge.amount_captured - charge.amount_refunded;
                let (status, code) = if !matches!(charge.status, "succeeded" | "captured") {
                    ("failed", Some("charge_not_refundable"))
                } else if charged_back > 0 && body.amount > left - charged_back {
                    ("failed", Some("charge_disputed"))
                } else if body.amount < 1 || body.amount > left {
                    ("failed", Some("amount_exceeds_charge"))
                } else {
                    charge.amount_refunded += body.amount;
                    ("succeeded", None)
                };
                let refund = Refund {
                    id: new_id("re"),
                    object: "refund",
                    idempotency_key: key.clone(),
                    charge: body.charge.clone(),
                    amount: body.amount,
                    status,
                    failure_code: code.map(str::to_string),
                    metadata: kept_metadata(&sandbox, &body.metadata),
                    created: now_unix(),
                };
                books.refund_keys.insert(refund.id.clone(), key.clone());
                books.refunds.insert(key.clone(), refund.clone());
                *books.effects.entry(key.clone()).or_insert(0) += 1;
                let event = json!({
                    "id": new_id("evt"),
                    "type": format!("refund.{status}"),
                    "created": now_unix(),
                    "data": {"object": refund},
                });
                (refund, vec![event])
            }
        };
        let delivery = sandbox.delivery(&mut books, &no_faults, n);
        (refund, delivery, events)
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    deliver(
        delivery,
        serde_json::to_value(&refund).unwrap_or(Value::Null),
    )
    .await
}

async fn find_refund(sandbox: Shared, query: web::Query<Lookup>) -> HttpResponse {
    let books = sandbox.books();
    if query.idempotency_key.is_none() {
        let all = books.refunds.values().map(|r| (r.created, r.id.clone(), r));
        return list(all, &query);
    }
    match query
        .idempotency_key
        .as_ref()
        .and_then(|k| books.refunds.get(k))
    {
        Some(r) => HttpResponse::Ok().json(r),
        None => error(
            404,
            "refund_not_found",
            "no refund with this idempotency key",
        ),
    }
}

async fn get_refund(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    let books = sandbox.books();
    match books
        .refund_keys
        .get(path.as_str())
        .and_then(|k| books.refunds.get(k))
    {
        Some(r) => HttpResponse::Ok().json(r),
        None => error(404, "refund_not_found", "no such refund"),
    }
}

#[derive(Deserialize, Default)]
struct FailLater {
    #[serde(default)]
    failure_code: Option<String>,
}

/// `POST /v1/refunds/{id}/fail`: a refund that succeeded fails afterwards,
/// as card refunds do when the card was closed or expired (Stripe:
/// `failure_reason` `expired_or_canceled_card`, the money back in the
/// merchant's balance). Its amount is the charge's again, and
/// `refund.failed` is sent. `409` unless it had succeeded.
async fn fail_refund(
    sandbox: Shared,
    path: web::Path<String>,
    body: Option<web::Json<FailLater>>,
) -> HttpResponse {
    let code = body
        .and_then(|b| b.into_inner().failure_code)
        .unwrap_or_else(|| "expired_or_canceled_card".into());
    let (refund, events) = {
        let mut books = sandbox.books();
        let Some(key) = books.refund_keys.get(path.as_str()).cloned() else {
            return error(404, "refund_not_found", "no such refund");
        };
        let Some(refund) = books.refunds.get_mut(&key) else {
            return error(404, "refund_not_found", "no such refund");
        };
        if refund.status != "succeeded" {
            return error(
                409,
                "refund_not_succeeded",
                "only a refund that succeeded can fail later",
            );
        }
        refund.status = "failed";
        refund.failure_code = Some(code);
        let refund = refund.clone();
        if let Some(charge_key) = books.charge_keys.get(&refund.charge).cloned() {
            if let Some(charge) = books.charges.get_mut(&charge_key) {
                charge.amount_refunded -= refund.amount;
            }
        }
        let event = json!({
            "id": new_id("evt"),
            "type": "refund.failed",
            "created": now_unix(),
            "data": {"object": refund},
        });
        (refund, vec![event])
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    HttpResponse::Ok().json(refund)
}

#[derive(Deserialize, Default)]
struct OpenDispute {
    #[serde(default)]
    amount: Option<i64>,
    #[serde(default)]
    reason: Option<String>,
}

fn dispute_event(dispute: &Dispute, kind: &str) -> Value {
    json!({
        "id": new_id("evt"),
        "type": format!("charge.dispute.{kind}"),
        "created": now_unix(),
        "data": {"object": dispute},
    })
}

/// `POST /v1/charges/{charge_id}/disputes`: the customer's bank disputes a
/// succeeded charge (body `{"amount"?, "reason"?}`: the whole charge and
/// `fraudulent` unless told). Answers the dispute `201`, status
/// `needs_response`, evidence due in seven days, and sends
/// `charge.dispute.created`. `404` for no such charge, `409` unless it
/// succeeded, `400` for an amount outside `1..=` the charge's.
async fn open_dispute(
    sandbox: Shared,
    path: web::Path<String>,
    body: Option<web::Json<OpenDispute>>,
) -> HttpResponse {
    let body = body.map(web::Json::into_inner).unwrap_or_default();
    let (dispute, events) = {
        let mut books = sandbox.books();
        let Some(charge) = books
            .charge_keys
            .get(path.as_str())
            .and_then(|k| books.charges.get(k))
        else {
            return error(404, "charge_not_found", "no such charge");
        };
        if !matches!(charge.status, "succeeded" | "captured") {
            return error(
                409,
                "charge_not_succeeded",
                "only a succeeded charge can be disputed",
            );
        }
        let amount = body.amount.unwrap_or(charge.amount);
        if amount < 1 || amount > charge.amount {
            return error(
                400,
                "invalid_amount",
                "amount must be from 1 to the charge's amount",
            );
        }
        let now = now_unix();
        let dispute = Dispute {
            id: new_id("dp"),
            object: "dispute",
            charge_id: charge.id.clone(),
            amount,
            currency: charge.currency.clone(),
            status: "needs_response",
            reason: body.reason.unwrap_or_else(|| "fraudulent".into()),
            evidence_due_by: now + 7 * 24 * 3600,
            created: now,
        };
        books.disputes.insert(dispute.id.clone(), dispute.clone());
        let event = dispute_event(&dispute, "created");
        (dispute, vec![event])
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    HttpResponse::Created().json(dispute)
}

#[derive(Deserialize)]
struct CloseDispute {
    outcome: String,
}

/// `POST /v1/disputes/{id}/close` with `{"outcome": "won" | "lost"}`:
/// the bank decides. Answers the dispute `200` and sends
/// `charge.dispute.closed`; `409` if it is closed already (a closed
/// dispute never reopens), `400` for another outcome.
async fn close_dispute(
    sandbox: Shared,
    path: web::Path<String>,
    body: web::Json<CloseDispute>,
) -> HttpResponse {
    let outcome = match body.outcome.as_str() {
        "won" => "won",
        "lost" => "lost",
        _ => return error(400, "invalid_outcome", "outcome must be won or lost"),
    };
    let (dispute, events) = {
        let mut books = sandbox.books();
        let Some(dispute) = books.disputes.get_mut(path.as_str()) else {
            return error(404, "dispute_not_found", "no such dispute");
        };
        if matches!(dispute.status, "won" | "lost") {
            return error(409, "dispute_closed", "the dispute is closed already");
        }
        dispute.status = outcome;
        let dispute = dispute.clone();
        let event = dispute_event(&dispute, "closed");
        (dispute, vec![event])
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    HttpResponse::Ok().json(dispute)
}

/// `GET /v1/disputes?created[gte]=…&created[lt]=…&limit=…&starting_after=…`:
/// the disputes opened in the window, in the charges' list shape (oldest
/// first), as they are now (closed ones too): what oncepay's books pass
/// reads when no webhook came.
async fn list_disputes(sandbox: Shared, query: web::Query<Lookup>) -> HttpResponse {
    let books = sandbox.books();
    let all = books
        .disputes
        .values()
        .map(|d| (d.created, d.id.clone(), d));
    list(all, &query)
}

/// `GET /v1/disputes/{id}`.
async fn get_dispute(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    match sandbox.books().disputes.get(path.as_str()) {
        Some(d) => HttpResponse::Ok().json(d),
        None => error(404, "dispute_not_found", "no such dispute"),
    }
}

/// The sandbox's bank: the page a 3-D Secure charge's `next_action`
/// sends the customer to, with *Approve* and *Decline*.
async fn bank_page(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    let books = sandbox.books();
    let charge = books
        .charge_keys
        .get(path.as_str())
        .and_then(|k| books.charges.get(k));
    let Some(charge) = charge else {
        return error(404, "charge_not_found", "no such charge");
    };
    let id = html_escape(&charge.id);
    let body = if charge.on_approval.is_some() {
        format!(
            r#"<form method="post" action="/v1/authenticate/{id}/approve"><button id="approve" type="submit">Approve</button></form>
<form method="post" action="/v1/authenticate/{id}/decline"><button id="decline" type="submit">Decline</button></form>"#
        )
    } else {
        format!(
            "<p>This payment is no longer waiting for you: it is {}.</p>",
            charge.status
        )
    };
    let amount = format!("{} {}", charge.amount, html_escape(&charge.currency));
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' http: https:"))
        .body(format!(
            r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Sandbox bank: confirm your payment</title>
<style>body{{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;padding:0 1rem;color:#111}}button{{font-size:1rem;padding:.6rem 1.4rem;margin:.4rem 0;border:2px solid #333;border-radius:.4rem;background:#fff;color:#111}}button:focus{{outline:3px solid #1a4fd6;outline-offset:2px}}</style></head>
<body><main><h1>Sandbox bank</h1><p>Confirm the payment of {amount} (minor units) for charge <code>{id}</code>.</p>{body}</main></body></html>"#
        ))
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The customer's choice at the bank page: the charge settles (approved:
/// as its token says; declined: failed `authentication_failed`), its
/// webhook is sent, and the customer goes back where they came from.
async fn bank_decision(sandbox: Shared, path: web::Path<(String, String)>) -> HttpResponse {
    let (id, choice) = path.into_inner();
    if choice != "approve" && choice != "decline" {
        return error(404, "not_found", "approve or decline");
    }
    let (charge, copies) = {
        let mut books = sandbox.books();
        let Some(key) = books.charge_keys.get(&id).cloned() else {
            return error(404, "charge_not_found", "no such charge");
        };
        let Some(charge) = books.charges.get_mut(&key) else {
            return error(404, "charge_not_found", "no such charge");
        };
        if let Some(approved) = charge.on_approval.take() {
            let (status, failure) = match (choice.as_str(), approved) {
                ("approve", "succeeded") => ("succeeded", None),
                ("approve", _) => ("failed", Some(("card_declined", "The card was declined."))),
                _ => (
                    "failed",
                    Some((
                        "authentication_failed",
                        "The customer declined the authentication.",
                    )),
                ),
            };
            if reach(charge, status, sandbox.config.capture_window) {
                schedule_expiry(
                    sandbox.clone().into_inner(),
                    key.clone(),
                    charge.capture_before,
                );
            }
            charge.next_action = None;
            charge.failure_code = failure.map(|f| f.0.to_string());
            charge.failure_message = failure.map(|f| f.1.to_string());
        }
        (charge.clone(), sandbox.config.faults.duplicate_webhooks)
    };
    if charge.next_action.is_none()
        && matches!(charge.status, "succeeded" | "failed" | "authorized")
    {
        let event = charge_event(&charge, charge.status);
        send_webhooks(sandbox.clone().into_inner(), vec![event], copies);
    }
    match &charge.return_url {
        Some(url) => HttpResponse::SeeOther()
            .insert_header(("Location", url.as_str()))
            .finish(),
        None => HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .body(format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sandbox bank</title></head><body><main><p>Done: the payment is {}. You can close this page.</p></main></body></html>",
                charge.status
            )),
    }
}

/// `POST /v1/charges/{id}/cancel`: the merchant gives up on a charge that
/// waits for its customer at the bank (3-D Secure never completed): it
/// fails `canceled` and `charge.failed` is sent, so a late approval can no
/// longer move money. A charge no longer waiting is answered as it is (the
/// customer approved or declined in time), like a read. Idempotent.
async fn cancel_charge(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    let (charge, cancelled, copies) = {
        let mut books = sandbox.books();
        let Some(key) = books.charge_keys.get(path.as_str()).cloned() else {
            return error(404, "charge_not_found", "no such charge");
        };
        let Some(charge) = books.charges.get_mut(&key) else {
            return error(404, "charge_not_found", "no such charge");
        };
        let waiting = charge.next_action.is_some() && charge.on_approval.is_some();
        if waiting {
            charge.on_approval = None;
            charge.status = "failed";
            charge.next_action = None;
            charge.failure_code = Some("canceled".into());
            charge.failure_message = Some(
                "The merchant cancelled the payment: its authentication was abandoned.".into(),
            );
        }
        (
            charge.clone(),
            waiting,
            sandbox.config.faults.duplicate_webhooks,
        )
    };
    if cancelled {
        let event = charge_event(&charge, charge.status);
        send_webhooks(sandbox.clone().into_inner(), vec![event], copies);
    }
    HttpResponse::Ok().json(&charge)
}

#[derive(Deserialize, Default)]
struct CaptureBody {
    #[serde(default)]
    amount: Option<i64>,
}

/// A refusal of a capture or a void: `409` with its code and the charge
/// as it is (the provider's word on the hold).
fn refusal(code: &str, detail: &str, charge: &Charge) -> Value {
    json!({"code": code, "detail": detail, "charge": charge})
}

/// What a capture or a void found, decided under the books' lock.
enum HoldAnswer {
    Charge(Box<Charge>),
    Refused(Value),
    Error(HttpResponse),
}

/// `POST /v1/charges/{id}/capture` (`Idempotency-Key`; body `{"amount"}`,
/// default all of it): captures an authorized charge once, for at most
/// its amount, and releases the rest (`charge.captured`). The same key
/// answers the same capture; a charge captured, voided or expired is
/// refused `409` with the charge. The token's fault suffixes apply to
/// each call, counted per key.
async fn capture_charge(
    sandbox: Shared,
    req: HttpRequest,
    path: web::Path<String>,
    body: Option<web::Json<CaptureBody>>,
) -> HttpResponse {
    let Some(key) = key_of(&req) else {
        return error(
            400,
            "idempotency_key_missing",
            "Idempotency-Key is required",
        );
    };
    let amount = body.and_then(|b| b.into_inner().amount);
    let (answer, delivery, events) = {
        let mut books = sandbox.books();
        let (charge_key, faults, n) = match sandbox.hold_call(&mut books, &path, &key, "capturing")
        {
            Ok(call) => call,
            Err(answer) => return *answer,
        };
        let mut events = Vec::new();
        let refused_before = books.refused_captures.get(&key).cloned();
        let answer = match (books.captures.get(&key).cloned(), refused_before) {
            (_, Some((charge_id, _))) if charge_id != *path => HoldAnswer::Error(error(
                409,
                "idempotency_key_reused",
                "this key captured another charge",
            )),
            // The same capture, declined before: declined again.
            (_, Some((_, code))) => HoldAnswer::Error(capture_declined(&code)),
            (Some(done), None) if done.charge_id != *path => HoldAnswer::Error(error(
                409,
                "idempotency_key_reused",
                "this key captured another charge",
            )),
            (Some(_), None) => match books.charges.get(&charge_key) {
                Some(charge) => HoldAnswer::Charge(Box::new(charge.clone())),
                None => HoldAnswer::Error(error(404, "charge_not_found", "no such charge")),
            },
            (None, None) => {
                // A decline asked for with the lever (`refuse_capture`).
                let lever = books.capture_refusals.get(path.as_str()).cloned();
                let Some(charge) = books.charges.get_mut(&charge_key) else {
                    return error(404, "charge_not_found", "no such charge");
                };
                if expire_if_due(charge) {
                    events.push(charge_event(charge, "expired"));
                }
                let take = amount.unwrap_or(charge.amount);
                match charge.status {
                    "authorized" if take < 1 || take > charge.amount => HoldAnswer::Error(error(
                        400,
                        "invalid_amount",
                        "amount must be from 1 to the authorized amount",
                    )),
                    "authorized" if lever.is_some() => {
                        let code = lever.unwrap_or_default();
                        books.capture_refusals.remove(path.as_str());
                        books
                            .refused_captures
                            .insert(key.clone(), (path.as_str().to_string(), code.clone()));
                        HoldAnswer::Error(capture_declined(&code))
                    }
                    "authorized" => {
                        charge.status = "captured";
                        charge.amount_captured = take;
                        let charge = charge.clone();
                        events.push(charge_event(&charge, "captured"));
                        let capture = Capture {
                            id: new_id("cp"),
                            idempotency_key: key.clone(),
                            charge_id: charge.id.clone(),
                            amount: take,
                            created: now_unix(),
                        };
                        books.captures.insert(key.clone(), capture);
                        *books.effects.entry(key.clone()).or_insert(0) += 1;
                        HoldAnswer::Charge(Box::new(charge))
                    }
                    "captured" => HoldAnswer::Refused(refusal(
                        "charge_already_captured",
                        "the charge was captured already",
                        charge,
                    )),
                    "expired" => HoldAnswer::Refused(refusal(
                        "charge_expired_for_capture",
                        "the authorization expired",
                        charge,
                    )),
                    "voided" => HoldAnswer::Refused(refusal(
                        "charge_voided",
                        "the authorization was voided",
                        charge,
                    )),
                    _ => HoldAnswer::Refused(refusal(
                        "charge_not_capturable",
                        "only an authorized charge can be captured",
                        charge,
                    )),
                }
            }
        };
        let delivery = sandbox.delivery(&mut books, &faults, n);
        (answer, delivery, events)
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    hold_answer(answer, delivery).await
}

/// A declined capture: the sandbox's decline answer (`402`, its code), as
/// for a charge; nothing was captured and the charge stays authorized.
fn capture_declined(code: &str) -> HttpResponse {
    error(
        402,
        code,
        "The card was declined: the capture was not made.",
    )
}

#[derive(Deserialize, Default)]
struct RefuseCaptureBody {
    #[serde(default)]
    code: Option<String>,
}

/// `POST /v1/charges/{id}/refuse_capture` (`{"code"}`, default
/// `card_declined`; one of the documented decline codes): the charge's
/// next capture is declined, `402` with the code, as a card's issuer may
/// decline a capture (a test's lever). The charge stays authorized, and a
/// capture under another key after it is made as usual.
async fn refuse_capture(
    sandbox: Shared,
    path: web::Path<String>,
    body: Option<web::Json<RefuseCaptureBody>>,
) -> HttpResponse {
    let charge_id = path.into_inner();
    let code = body
        .and_then(|b| b.into_inner().code)
        .unwrap_or_else(|| "card_declined".to_string());
    if !crate::provider::sandbox::classify::DECLINE_CODES.contains(&code.as_str()) {
        return error(
            400,
            "invalid_request",
            "code must be a documented decline code",
        );
    }
    let mut books = sandbox.books();
    if !books.charge_keys.contains_key(&charge_id) {
        return error(404, "charge_not_found", "no such charge");
    }
    books
        .capture_refusals
        .insert(charge_id.clone(), code.clone());
    HttpResponse::Ok().json(json!({"charge": charge_id, "refuse_capture": code}))
}

async fn hold_answer(answer: HoldAnswer, delivery: Delivery) -> HttpResponse {
    match answer {
        HoldAnswer::Error(response) => response,
        HoldAnswer::Charge(charge) => {
            deliver(
                delivery,
                serde_json::to_value(&charge).unwrap_or(Value::Null),
            )
            .await
        }
        HoldAnswer::Refused(body) => match delivery {
            Delivery::Drop => HttpResponse::Conflict()
                .content_type("application/json")
                .body(Dropped),
            Delivery::Delay(d) => {
                tokio::time::sleep(d).await;
                HttpResponse::Conflict().json(body)
            }
            Delivery::Answer => HttpResponse::Conflict().json(body),
        },
    }
}

/// `POST /v1/charges/{id}/void`: releases an authorized charge
/// (`charge.voided`). Idempotent: a charge voided or expired is answered
/// as it is; one captured first is refused `409` with the charge. The
/// token's fault suffixes apply, counted per `Idempotency-Key`.
async fn void_charge(sandbox: Shared, req: HttpRequest, path: web::Path<String>) -> HttpResponse {
    let key = key_of(&req).unwrap_or_else(|| format!("void:{path}"));
    let (answer, delivery, events) = {
        let mut books = sandbox.books();
        let (charge_key, faults, n) = match sandbox.hold_call(&mut books, &path, &key, "voiding") {
            Ok(call) => call,
            Err(answer) => return *answer,
        };
        let Some(charge) = books.charges.get_mut(&charge_key) else {
            return error(404, "charge_not_found", "no such charge");
        };
        let mut events = Vec::new();
        if expire_if_due(charge) {
            events.push(charge_event(charge, "expired"));
        }
        let answer = match charge.status {
            "authorized" => {
                charge.status = "voided";
                events.push(charge_event(charge, "voided"));
                HoldAnswer::Charge(Box::new(charge.clone()))
            }
            "voided" | "expired" => HoldAnswer::Charge(Box::new(charge.clone())),
            "captured" => HoldAnswer::Refused(refusal(
                "charge_already_captured",
                "the charge was captured already",
                charge,
            )),
            _ => HoldAnswer::Refused(refusal(
                "charge_not_capturable",
                "only an authorized charge can be voided",
                charge,
            )),
        };
        let delivery = sandbox.delivery(&mut books, &faults, n);
        (answer, delivery, events)
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    hold_answer(answer, delivery).await
}

/// `POST /v1/charges/{id}/expire`: the hold's deadline passes now (as
/// if its window had run out): an authorized charge expires and
/// `charge.expired` is sent; any other is answered as it is.
async fn expire_charge(sandbox: Shared, path: web::Path<String>) -> HttpResponse {
    let (charge, events) = {
        let mut books = sandbox.books();
        let Some(key) = books.charge_keys.get(path.as_str()).cloned() else {
            return error(404, "charge_not_found", "no such charge");
        };
        let Some(charge) = books.charges.get_mut(&key) else {
            return error(404, "charge_not_found", "no such charge");
        };
        if charge.status == "authorized" {
            charge.capture_before = Some(now_unix());
        }
        let events = if expire_if_due(charge) {
            vec![charge_event(charge, "expired")]
        } else {
            Vec::new()
        };
        (charge.clone(), events)
    };
    send_webhooks(
        sandbox.clone().into_inner(),
        events,
        sandbox.config.faults.duplicate_webhooks,
    );
    HttpResponse::Ok().json(&charge)
}

/// `POST /v1/tokens`: a card (Stripe's form fields) becomes a token, as a
/// provider's tokenization does for a checkout page, so the card number
/// never reaches the merchant's service. Any origin may call it (the page
/// is on the merchant's). Stripe's test numbers behave as theirs.
async fn create_token(sandbox: Shared, form: web::Form<Vec<(String, String)>>) -> HttpResponse {
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_string())
    };
    let card_error = |code: &str, param: &str, message: &str| {
        HttpResponse::PaymentRequired()
            .insert_header(("Access-Control-Allow-Origin", "*"))
            .json(json!({"error": {"type": "card_error", "code": code, "param": param, "message": message}}))
    };
    let Some((number, brand)) =
        field("card[number]").and_then(|n| crate::domain::card::read_number(&n))
    else {
        return card_error(
            "incorrect_number",
            "card[number]",
            "Your card number is incorrect.",
        );
    };
    let month = field("card[exp_month]").and_then(|m| m.parse::<u32>().ok());
    let year = field("card[exp_year]")
        .and_then(|y| y.parse::<i32>().ok())
        .map(|y| if y < 100 { 2000 + y } else { y });
    let (Some(month @ 1..=12), Some(year)) = (month, year) else {
        return card_error(
            "invalid_expiry_month",
            "card[exp_month]",
            "Your card's expiration date is incomplete.",
        );
    };
    let today = chrono::Utc::now().date_naive();
    use chrono::Datelike;
    if (year, month) < (today.year(), today.month()) || year > today.year() + 50 {
        return card_error("expired_card", "card[exp_year]", "Your card has expired.");
    }
    let cvc_ok = field("card[cvc]").is_some_and(|c| {
        let len = if brand == "amex" { 4 } else { 3 };
        c.len() == len && c.bytes().all(|b| b.is_ascii_digit())
    });
    if !cvc_ok {
        return card_error(
            "invalid_cvc",
            "card[cvc]",
            "Your card's security code is invalid.",
        );
    }
    let behaves_as = match number.as_str() {
        "4000000000000002" => "tok_declined",
        "4000002760003184" => "tok_3ds",
        "4000000000009995" => "tok_insufficient_funds",
        _ => "tok_visa",
    };
    let id = new_id("tok");
    sandbox.books().tokens.insert(id.clone(), behaves_as);
    let last4 = number
        .get(number.len() - 4..)
        .unwrap_or_default()
        .to_string();
    HttpResponse::Ok()
        .insert_header(("Access-Control-Allow-Origin", "*"))
        .json(json!({
            "id": id,
            "object": "token",
            "type": "card",
            "created": now_unix(),
            "livemode": false,
            "used": false,
            "card": {"brand": brand, "last4": last4, "exp_month": month, "exp_year": year},
        }))
}

async fn ledger(sandbox: Shared) -> HttpResponse {
    HttpResponse::Ok().json(sandbox.books().ledger())
}

async fn ledger_totals(sandbox: Shared) -> HttpResponse {
    HttpResponse::Ok().json(sandbox.books().totals())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Starts the sandbox on `listener`; the returned server runs when awaited.
pub fn start(
    config: SandboxConfig,
    listener: TcpListener,
) -> std::io::Result<actix_web::dev::Server> {
    let public_url = config
        .public_url
        .clone()
        .unwrap_or(format!("http://{}", listener.local_addr()?));
    let sandbox = web::Data::new(Sandbox::new(config, public_url).map_err(std::io::Error::other)?);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(sandbox.clone())
            .app_data(web::JsonConfig::default().error_handler(|err, _| {
                let detail = err.to_string();
                actix_web::error::InternalError::from_response(
                    err,
                    error(400, "invalid_request", &detail),
                )
                .into()
            }))
            .route("/v1/ledger/totals", web::get().to(ledger_totals))
            .route("/v1/charges", web::post().to(create_charge))
            .route("/v1/charges", web::get().to(find_charge))
            .route("/v1/charges/{id}", web::get().to(get_charge))
            .route("/v1/charges/{id}/cancel", web::post().to(cancel_charge))
            .route("/v1/charges/{id}/capture", web::post().to(capture_charge))
            .route("/v1/charges/{id}/void", web::post().to(void_charge))
            .route("/v1/charges/{id}/expire", web::post().to(expire_charge))
            .route(
                "/v1/charges/{id}/refuse_capture",
                web::post().to(refuse_capture),
            )
            .route("/v1/refunds", web::post().to(create_refund))
            .route("/v1/refunds", web::get().to(find_refund))
            .route("/v1/refunds/{id}", web::get().to(get_refund))
            .route("/v1/refunds/{id}/fail", web::post().to(fail_refund))
            .route("/v1/charges/{id}/disputes", web::post().to(open_dispute))
            .route("/v1/disputes/{id}/close", web::post().to(close_dispute))
            .route("/v1/disputes", web::get().to(list_disputes))
            .route("/v1/disputes/{id}", web::get().to(get_dispute))
            .route("/v1/authenticate/{id}", web::get().to(bank_page))
            .route(
                "/v1/authenticate/{id}/{choice}",
                web::post().to(bank_decision),
            )
            .route("/v1/tokens", web::post().to(create_token))
            .route("/v1/ledger", web::get().to(ledger))
            .route("/healthz", web::get().to(healthz))
    })
    .workers(2)
    .listen(listener)?
    .run();
    Ok(server)
}

/// `oncepay sandbox`: binds and serves until stopped.
pub async fn run(config: SandboxConfig) -> std::io::Result<()> {
    let listener = TcpListener::bind(config.bind)?;
    tracing::info!(bind = %config.bind, webhooks = %config.webhook_url, "sandbox provider listening");
    start(config, listener)?.await
}
