//! Stripe's own semantics in front of localstripe, and the Stripe-shaped
//! faults no fake provider makes by itself. localstripe ignores
//! `Idempotency-Key` and answers a decline as an `invalid_request_error`;
//! an adapter tested against it alone would never meet what real Stripe
//! does with a retried request. This layer, on loopback between the
//! adapter and localstripe, does what Stripe documents:
//!
//! - **Idempotency** (per key, across paths, as Stripe scopes keys to the
//!   account): the first `POST` with a key is forwarded and its answer
//!   saved; a repeat with the same method, path and body gets the saved
//!   answer with `Idempotent-Replayed: true` and is not forwarded; the same
//!   key with other parameters is `400 idempotency_error`; a repeat while
//!   the first is still in flight is `409 idempotency_key_in_use`. A
//!   request refused before it reached the provider (`429`, an injected
//!   `500`, a `401`) saves nothing, so the key stays free, as at Stripe.
//! - **Declines** Stripe-shaped: localstripe's `402` with `code:
//!   card_declined` and `type: invalid_request_error` becomes `type:
//!   card_error` with a `decline_code` (`generic_decline`), as Stripe sends.
//! - **Faults** per kind of call ([`Call`]): `429 lock_timeout` and `429
//!   rate_limit`, `500` with `Stripe-Should-Retry: true|false`, `401`
//!   (a rotated key), `400 idempotency_error`, an answer dropped after the
//!   effect, a `500` saved under the key after the effect, and a stall
//!   that holds a request in flight until released.
//!
//! - **3-D Secure by redirect**: localstripe refuses `return_url` at
//!   confirm and only knows Stripe.js's `use_stripe_sdk` action. The layer
//!   takes the `return_url` off the confirm (remembering it per
//!   PaymentIntent) and answers such an intent as Stripe does when a
//!   `return_url` was given: `next_action.redirect_to_url`, here to a bank
//!   page the layer serves (`/_bank/{id}`, buttons `approve` and
//!   `decline`) that calls localstripe's `_authenticate` and sends the
//!   customer back to the `return_url` with Stripe's query parameters.
//!
//! - **Refunds Stripe refuses**: localstripe refunds a charge past its
//!   amount; Stripe refuses, `400 invalid_request_error` with
//!   `charge_already_refunded` (nothing left, e.g. after a refund from
//!   the Dashboard), `amount_too_large` (more than is left) or
//!   `charge_disputed` (more than what a dispute the layer holds, not an
//!   inquiry and not won, left), saved under the key and replayed like
//!   any answer.
//!
//! - **Refunds that fail after they succeeded** ([`StripeLayer::fail_refund`]):
//!   every read shows the refund `failed` with its `failure_reason`, as
//!   Stripe does for a card closed or expired after the refund.
//! - **PaymentIntent cancel** as Stripe takes it: `cancellation_reason`
//!   (which localstripe refuses) is accepted, and an intent that cannot be
//!   cancelled (it succeeded) is `400 payment_intent_unexpected_state`
//!   with the intent, not localstripe's bare `400`.
//! - **Lists filtered by `created`** (`created[gte]`, `[gt]`, `[lt]`,
//!   `[lte]`), which localstripe refuses: answered from localstripe's whole
//!   list, filtered and paged as Stripe pages.
//!
//! - **Disputes**, which localstripe does not have: the layer holds them
//!   ([`StripeLayer::open_dispute`], [`StripeLayer::close_dispute`]) and
//!   answers `GET /v1/disputes/{id}` with Stripe's Dispute object (`404
//!   resource_missing` for another id). The `charge.dispute.*` event is
//!   the test's to send, as for a refund that fails later.
//!
//! - **Holds** (`capture_method=manual`), which localstripe captures and
//!   cancels but never expires nor dates: a PaymentIntent first seen in
//!   `requires_capture` gets its deadline (the window,
//!   [`StripeLayer::set_capture_window`], 7 days as Stripe documents for
//!   online card payments), shown where Stripe shows it, its charge's
//!   `payment_method_details.card.capture_before` (with
//!   `expand[]=latest_charge`, which the layer answers on `POST`s too).
//!   Past it, the next call naming the intent finds it cancelled with
//!   `cancellation_reason: automatic`, as Stripe cancels an expired
//!   authorization. A capture Stripe would refuse (captured already,
//!   cancelled) is `400 payment_intent_unexpected_state` carrying the
//!   intent, as a refused cancel is. The `payment_intent.*` event is the
//!   test's to send.
//!
//! What passes through is counted per kind, so a test can prove how many
//! calls reached the provider.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use actix_web::http::{Method, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Value};

/// Which call a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `POST /v1/payment_intents`.
    CreateIntent,
    /// `POST /v1/payment_intents/{id}/confirm`.
    Confirm,
    /// `POST /v1/payment_intents/{id}/cancel`.
    Cancel,
    /// `POST /v1/payment_intents/{id}/capture`.
    Capture,
    /// `POST /v1/refunds`.
    Refund,
    /// Any `GET` (retrieve, list).
    Read,
    /// Anything else.
    Other,
}

impl Call {
    fn of(method: &Method, path: &str) -> Call {
        let intents = path.starts_with("/v1/payment_intents");
        match *method {
            Method::GET => Call::Read,
            Method::POST if intents && path.ends_with("/confirm") => Call::Confirm,
            Method::POST if intents && path.ends_with("/cancel") => Call::Cancel,
            Method::POST if intents && path.ends_with("/capture") => Call::Capture,
            Method::POST if path == "/v1/payment_intents" => Call::CreateIntent,
            Method::POST if path == "/v1/refunds" => Call::Refund,
            _ => Call::Other,
        }
    }
}

/// What the layer does with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StripeFault {
    /// `429` `lock_timeout` before the provider sees it.
    LockTimeout,
    /// `429` `rate_limit` before the provider sees it.
    RateLimited,
    /// `500` with `Stripe-Should-Retry` (`None`: no header), before the
    /// provider sees it.
    ServerError {
        /// The header's value, if sent.
        should_retry: Option<bool>,
    },
    /// `401` `authentication_error`: a rotated or revoked key.
    Unauthorized,
    /// Forward (the provider acts, the answer is saved under the key), then
    /// close the connection without answering.
    DropAfterEffect,
    /// Hold the call before forwarding until [`StripeLayer::release`].
    Stall,
    /// Forward (the provider acts), then answer `500 api_error` and save
    /// that answer under the key, as Stripe does when it fails after it
    /// began executing: every repeat of the key gets the same `500`.
    ErrorAfterEffect,
    /// `400 idempotency_error` before the provider sees it: what Stripe
    /// answers a key reused with other parameters (a bug of the caller's).
    IdempotencyError,
    /// `409 idempotency_key_in_use` before the provider sees it.
    KeyInUse,
}

struct Saved {
    fingerprint: (String, String, Bytes),
    /// `None` while the first request is in flight.
    answer: Option<(u16, Bytes)>,
}

#[derive(Default)]
struct State {
    /// The fault and how many more calls it applies to (`None`: all).
    faults: HashMap<Call, (StripeFault, Option<u32>)>,
    keys: HashMap<String, Saved>,
    forwarded: HashMap<Call, u64>,
    /// Calls that met a fault, by kind.
    faulted: HashMap<Call, u64>,
    replayed: u64,
    stalled: u64,
    /// Calls Stripe's own rules refused (a refund past what is left).
    refused: HashMap<Call, u64>,
    /// Lists answered with a `created` filter.
    filtered: u64,
    /// Refunds that failed after they succeeded, with Stripe's
    /// `failure_reason`.
    failed_refunds: HashMap<String, String>,
    /// The `return_url` given at each PaymentIntent's confirm.
    return_urls: HashMap<String, String>,
    /// Disputes by id, as Stripe's API shows them.
    disputes: HashMap<String, Value>,
    /// Each hold's deadline (Unix seconds), by PaymentIntent.
    holds: HashMap<String, i64>,
    /// Holds cancelled at their deadline.
    expired: std::collections::HashSet<String>,
    /// How long a hold lasts (`None`: Stripe's 7 days).
    capture_window: Option<Duration>,
    /// What each held intent's capture took (localstripe's charge does
    /// not say: it refunds the rest instead).
    captured: HashMap<String, i64>,
    /// Captures localstripe made (answered `2xx`), by PaymentIntent: a
    /// second one of an intent would be a double capture.
    captures_made: HashMap<String, u32>,
}

/// What the layer knows of holds (see [`StripeLayer::holds`]).
#[derive(Debug, Clone, Default)]
pub struct HoldBooks {
    /// Captures made, by PaymentIntent.
    pub captures: HashMap<String, u32>,
    /// The amount a capture took, by PaymentIntent (where it named one).
    pub captured: HashMap<String, i64>,
    /// PaymentIntents cancelled at their deadline (`automatic`).
    pub expired: std::collections::HashSet<String>,
    /// Each hold's deadline (Unix seconds), by PaymentIntent.
    pub deadlines: HashMap<String, i64>,
}

struct Shared {
    state: Mutex<State>,
    upstream: String,
    http: reqwest::Client,
    release: tokio::sync::Notify,
    /// The layer's own base URL (its bank page's origin).
    url: std::sync::OnceLock<String>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running layer.
#[derive(Clone)]
pub struct StripeLayer {
    shared: Arc<Shared>,
    url: String,
}

fn stripe_error(status: u16, kind: &str, code: Option<&str>, message: &str) -> HttpResponse {
    let mut error = json!({"type": kind, "message": message});
    if let Some(code) = code {
        error["code"] = json!(code);
    }
    HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
        .content_type("application/json")
        .body(json!({ "error": error }).to_string())
}

/// localstripe's decline, as Stripe sends it.
fn stripe_shaped(status: u16, body: Bytes) -> Bytes {
    if status != 402 {
        return body;
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let error = &mut value["error"];
    if error["code"] == "card_declined" {
        error["type"] = json!("card_error");
        if error.get("decline_code").is_none() {
            error["decline_code"] = json!("generic_decline");
        }
    }
    Bytes::from(value.to_string())
}

fn relay(status: u16, body: Bytes, replayed: bool) -> HttpResponse {
    let mut response =
        HttpResponse::build(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY));
    response.content_type("application/json");
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.body(body)
}

async fn forward(shared: &Shared, req: &HttpRequest, body: Bytes) -> Result<(u16, Bytes), String> {
    let headers = ["content-type", "authorization", "stripe-version"];
    let (status, bytes) =
        crate::loopback_http::forward(&shared.http, &shared.upstream, req, body, &headers).await?;
    Ok((status, stripe_shaped(status, bytes)))
}

/// The confirm's body without `return_url` (remembered for `intent`).
fn without_return_url(shared: &Shared, intent: &str, body: &Bytes) -> Bytes {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).unwrap_or_default();
    let (returns, rest): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(k, _)| k == "return_url");
    let Some((_, url)) = returns.into_iter().next() else {
        return body.clone();
    };
    shared.state().return_urls.insert(intent.to_string(), url);
    Bytes::from(serde_urlencoded::to_string(rest).unwrap_or_default())
}

/// Every PaymentIntent in `body` waiting for Stripe.js's action, whose
/// confirm gave a `return_url`, as Stripe answers it: a redirect.
fn with_redirects(shared: &Shared, body: Bytes) -> Bytes {
    /// Walks every value (not stopping at the first change).
    fn every<'v>(
        values: impl Iterator<Item = &'v mut Value>,
        return_urls: &HashMap<String, String>,
        base: &str,
    ) -> bool {
        let mut changed = false;
        for v in values {
            changed |= walk(v, return_urls, base);
        }
        changed
    }
    fn walk(value: &mut Value, return_urls: &HashMap<String, String>, base: &str) -> bool {
        match value {
            Value::Array(items) => every(items.iter_mut(), return_urls, base),
            Value::Object(map) => {
                let id = map.get("id").and_then(Value::as_str).unwrap_or_default();
                let sdk = map.get("object").and_then(Value::as_str) == Some("payment_intent")
                    && map
                        .get("next_action")
                        .and_then(|n| n.get("type"))
                        .and_then(Value::as_str)
                        == Some("use_stripe_sdk");
                if let (true, Some(return_url)) = (sdk, return_urls.get(id)) {
                    let url = format!("{base}/_bank/{id}");
                    map.insert(
                        "next_action".into(),
                        json!({"type": "redirect_to_url",
                               "redirect_to_url": {"url": url, "return_url": return_url}}),
                    );
                    return true;
                }
                every(map.values_mut(), return_urls, base)
            }
            _ => false,
        }
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let return_urls = shared.state().return_urls.clone();
    let base = shared.url.get().cloned().unwrap_or_default();
    if walk(&mut value, &return_urls, &base) {
        Bytes::from(value.to_string())
    } else {
        body
    }
}

/// The bank's page for a PaymentIntent: `GET /_bank/{id}` shows it,
/// `POST /_bank/{id}/approve|decline` tells localstripe (`_authenticate`,
/// with the intent's client secret) and returns the customer.
async fn bank(shared: &Shared, req: &HttpRequest) -> HttpResponse {
    let rest = req.path().trim_start_matches("/_bank/");
    let (intent, button) = rest.split_once('/').unwrap_or((rest, ""));
    if req.method() == Method::GET {
        return HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .body(format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Test bank: 3-D Secure</title></head>\
                 <body><main><h1>Confirm the payment</h1><p>PaymentIntent {intent}</p>\
                 <form method=\"post\" action=\"/_bank/{intent}/approve\"><button id=\"approve\" type=\"submit\">Approve</button></form>\
                 <form method=\"post\" action=\"/_bank/{intent}/decline\"><button id=\"decline\" type=\"submit\">Decline</button></form>\
                 </main></body></html>"
            ));
    }
    let success = match button {
        "approve" => true,
        "decline" => false,
        _ => return HttpResponse::NotFound().finish(),
    };
    let upstream = &shared.upstream;
    let key = "sk_test_bank";
    let read = async {
        let intent: Value = shared
            .http
            .get(format!("{upstream}/v1/payment_intents/{intent}"))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        let secret = intent["client_secret"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        shared
            .http
            .post(format!(
                "{upstream}/v1/payment_intents/{intent_id}/_authenticate",
                intent_id = intent["id"].as_str().unwrap_or_default()
            ))
            .bearer_auth(key)
            .form(&[
                ("client_secret", secret.as_str()),
                ("success", if success { "true" } else { "false" }),
            ])
            .send()
            .await
    };
    let status = match read.await {
        Ok(answer) => answer.status().as_u16(),
        Err(e) => return HttpResponse::BadGateway().body(e.to_string()),
    };
    if status >= 300 {
        return HttpResponse::build(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        )
        .body("localstripe refused the authentication");
    }
    let return_url = shared.state().return_urls.get(intent).cloned();
    match return_url {
        Some(url) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            let outcome = if success { "succeeded" } else { "failed" };
            HttpResponse::SeeOther()
                .insert_header((
                    "Location",
                    format!("{url}{sep}payment_intent={intent}&redirect_status={outcome}"),
                ))
                .finish()
        }
        None => HttpResponse::Ok().body("Done: you can close this page."),
    }
}

async fn handle(shared: web::Data<Shared>, req: HttpRequest, body: Bytes) -> HttpResponse {
    if req.path().starts_with("/_bank/") {
        return bank(&shared, &req).await;
    }
    let call = Call::of(req.method(), req.path());
    if call == Call::Read {
        if let Some(id) = req.path().strip_prefix("/v1/disputes/") {
            return match shared.state().disputes.get(id) {
                Some(dispute) => HttpResponse::Ok().json(dispute),
                None => stripe_error(
                    404,
                    "invalid_request_error",
                    Some("resource_missing"),
                    &format!("No such dispute: '{id}'"),
                ),
            };
        }
    }
    if call == Call::Read && req.query_string().contains("created") {
        return created_filtered(&shared, &req).await;
    }
    let fault = {
        let mut state = shared.state();
        let fault = state
            .faults
            .get_mut(&call)
            .and_then(|(fault, left)| match left {
                Some(0) => None,
                Some(n) => {
                    *n -= 1;
                    Some(fault.clone())
                }
                None => Some(fault.clone()),
            });
        if fault.is_some() {
            *state.faulted.entry(call).or_insert(0) += 1;
        }
        fault
    };
    match fault {
        Some(StripeFault::LockTimeout) => {
            return stripe_error(
                429,
                "invalid_request_error",
                Some("lock_timeout"),
                "This object cannot be accessed right now because another API request or Stripe process is currently accessing it.",
            )
        }
        Some(StripeFault::RateLimited) => {
            return stripe_error(
                429,
                "invalid_request_error",
                Some("rate_limit"),
                "Too many requests hit the API too quickly.",
            )
        }
        Some(StripeFault::ServerError { should_retry }) => {
            let mut response = stripe_error(500, "api_error", None, "An unknown error occurred");
            if let Some(retry) = should_retry {
                response.headers_mut().insert(
                    actix_web::http::header::HeaderName::from_static("stripe-should-retry"),
                    actix_web::http::header::HeaderValue::from_static(if retry {
                        "true"
                    } else {
                        "false"
                    }),
                );
            }
            return response;
        }
        Some(StripeFault::IdempotencyError) => {
            return stripe_error(
                400,
                "idempotency_error",
                None,
                "Keys for idempotent requests can only be used with the same parameters they were first used with.",
            )
        }
        Some(StripeFault::KeyInUse) => {
            return stripe_error(
                409,
                "invalid_request_error",
                Some("idempotency_key_in_use"),
                "There is currently another in-progress request using this Idempotent Key.",
            )
        }
        Some(StripeFault::Unauthorized) => {
            return stripe_error(
                401,
                "invalid_request_error",
                None,
                "Invalid API Key provided: sk_test_****",
            )
        }
        _ => {}
    }
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|_| req.method() == Method::POST)
        .map(str::to_string);
    let fingerprint = (
        req.method().to_string(),
        req.path().to_string(),
        body.clone(),
    );
    if let Some(key) = &key {
        let mut state = shared.state();
        match state.keys.get(key) {
            Some(saved) if saved.fingerprint != fingerprint => {
                return stripe_error(
                    400,
                    "idempotency_error",
                    None,
                    "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                )
            }
            Some(Saved { answer: None, .. }) => {
                return stripe_error(
                    409,
                    "invalid_request_error",
                    Some("idempotency_key_in_use"),
                    "There is currently another in-progress request using this Idempotent Key.",
                )
            }
            Some(Saved {
                answer: Some((status, bytes)),
                ..
            }) => {
                let (status, bytes) = (*status, bytes.clone());
                state.replayed += 1;
                return relay(status, bytes, true);
            }
            None => {
                state.keys.insert(
                    key.clone(),
                    Saved {
                        fingerprint,
                        answer: None,
                    },
                );
            }
        }
    }
    if call == Call::Refund {
        if let Some((status, bytes)) = refund_refusal(&shared, &req, &body).await {
            // Stripe refused the refund while executing it: the refusal is
            // saved under the key and replayed, as Stripe does.
            let mut state = shared.state();
            *state.refused.entry(call).or_insert(0) += 1;
            if let Some(saved) = key.as_ref().and_then(|k| state.keys.get_mut(k)) {
                saved.answer = Some((status, bytes.clone()));
            }
            return relay(status, bytes, false);
        }
    }
    if call == Call::Capture {
        expire_hold(&shared, &req).await;
        let intent = intent_of(&req).unwrap_or_default();
        let pi = upstream_json(&shared, &req, &format!("/v1/payment_intents/{intent}")).await;
        // localstripe captures a cancelled intent's charge; Stripe
        // captures only an intent in `requires_capture`.
        if pi.is_some_and(|pi| pi["status"] != "requires_capture") {
            let (status, bytes) = capture_refused(&shared, &req).await;
            let bytes = with_holds(&shared, &req, bytes, false).await;
            let mut state = shared.state();
            *state.refused.entry(call).or_insert(0) += 1;
            if let Some(saved) = key.as_ref().and_then(|k| state.keys.get_mut(k)) {
                saved.answer = Some((status, bytes.clone()));
            }
            return relay(status, bytes, false);
        }
    }
    if fault == Some(StripeFault::Stall) {
        // Registered before it is counted, so a release that follows the
        // count is never missed.
        let released = shared.release.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        shared.state().stalled += 1;
        released.await;
        shared.state().stalled -= 1;
    }
    expire_hold(&shared, &req).await;
    let wants_charge = req.query_string().contains("latest_charge")
        || String::from_utf8_lossy(&body).contains("latest_charge");
    *shared.state().forwarded.entry(call).or_insert(0) += 1;
    let body = match call {
        // localstripe refuses `cancellation_reason`, which Stripe takes.
        Call::Cancel => without_param(&without_param(&body, "cancellation_reason"), "expand[]"),
        Call::Capture => {
            if let Some(intent) = intent_of(&req) {
                let form: HashMap<String, String> =
                    serde_urlencoded::from_bytes(&body).unwrap_or_default();
                if let Some(amount) = form.get("amount_to_capture").and_then(|a| a.parse().ok()) {
                    shared.state().captured.entry(intent).or_insert(amount);
                }
            }
            without_param(&body, "expand[]")
        }
        Call::Confirm => {
            let intent = req.path().trim_start_matches("/v1/payment_intents/");
            let intent = intent.trim_end_matches("/confirm");
            without_param(&without_return_url(&shared, intent, &body), "expand[]")
        }
        _ => body,
    };
    let forwarded = forward(&shared, &req, body).await.map(|(status, bytes)| {
        let bytes = with_redirects(&shared, bytes);
        (status, with_failed_refunds(&shared, bytes))
    });
    let forwarded = match (call, forwarded) {
        (Call::Cancel, Ok((400, _))) => Ok(cancel_refused(&shared, &req).await),
        (Call::Capture, Ok((400, _))) => Ok(capture_refused(&shared, &req).await),
        (_, other) => other,
    };
    let forwarded = match forwarded {
        Ok((status, bytes)) => Ok((status, with_holds(&shared, &req, bytes, wants_charge).await)),
        other => other,
    };
    let mut state = shared.state();
    match forwarded {
        Ok((status, bytes)) => {
            if call == Call::Capture && (200..300).contains(&status) {
                if let Some(intent) = intent_of(&req) {
                    *state.captures_made.entry(intent).or_insert(0) += 1;
                }
            }
            let (status, bytes) = if fault == Some(StripeFault::ErrorAfterEffect) {
                let error =
                    json!({"error": {"type": "api_error", "message": "An unknown error occurred"}});
                (500, Bytes::from(error.to_string()))
            } else {
                (status, bytes)
            };
            if let Some(key) = &key {
                if let Some(saved) = state.keys.get_mut(key) {
                    saved.answer = Some((status, bytes.clone()));
                }
            }
            drop(state);
            if fault == Some(StripeFault::DropAfterEffect) {
                return dropped();
            }
            relay(status, bytes, false)
        }
        Err(_) => {
            // The provider never answered: as at Stripe, nothing is saved.
            if let Some(key) = &key {
                state.keys.remove(key);
            }
            dropped()
        }
    }
}

/// A list filtered by `created[gte]`, `created[gt]`, `created[lt]`,
/// `created[lte]` (Stripe's list parameters: "A filter on the list, based
/// on the object `created` field"), which localstripe refuses for
/// PaymentIntents and Refunds. Answered as Stripe does: the objects
/// matching, newest first, `limit` of them from after `starting_after`,
/// and `has_more` when more match. The layer walks localstripe's whole
/// list to find them; tests' lists are small.
async fn created_filtered(shared: &Shared, req: &HttpRequest) -> HttpResponse {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(req.query_string()).unwrap_or_default();
    let bound = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse::<i64>().ok())
    };
    let (gte, gt, lt, lte) = (
        bound("created[gte]"),
        bound("created[gt]"),
        bound("created[lt]"),
        bound("created[lte]"),
    );
    let limit = bound("limit").unwrap_or(10).clamp(1, 100) as usize;
    let after = pairs
        .iter()
        .find(|(k, _)| k == "starting_after")
        .map(|(_, v)| v.clone());
    let rest: Vec<(String, String)> = pairs
        .into_iter()
        .filter(|(k, _)| !k.starts_with("created") && k != "starting_after" && k != "limit")
        .collect();
    shared.state().filtered += 1;
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = rest.clone();
        query.push(("limit".into(), "100".into()));
        if let Some(c) = &cursor {
            query.push(("starting_after".into(), c.clone()));
        }
        let path = format!(
            "{}?{}",
            req.path(),
            serde_urlencoded::to_string(&query).unwrap_or_default()
        );
        let Some(page) = upstream_json(shared, req, &path).await else {
            return stripe_error(
                502,
                "api_error",
                None,
                "localstripe did not answer the list",
            );
        };
        let data = page["data"].as_array().cloned().unwrap_or_default();
        cursor = data
            .last()
            .and_then(|o| o["id"].as_str())
            .map(str::to_string);
        all.extend(data);
        if page["has_more"] != true || cursor.is_none() {
            break;
        }
    }
    let matching: Vec<Value> = all
        .into_iter()
        .filter(|o| {
            let c = o["created"].as_i64().unwrap_or(0);
            gte.is_none_or(|b| c >= b)
                && gt.is_none_or(|b| c > b)
                && lt.is_none_or(|b| c < b)
                && lte.is_none_or(|b| c <= b)
        })
        .collect();
    let start = match &after {
        Some(id) => match matching.iter().position(|o| o["id"] == id.as_str()) {
            Some(i) => i + 1,
            None => matching.len(),
        },
        None => 0,
    };
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit)
        .map(|o| {
            let bytes = with_failed_refunds(shared, Bytes::from(o.to_string()));
            serde_json::from_slice(&bytes).unwrap_or_else(|_| o.clone())
        })
        .collect();
    let has_more = matching.len() > start + page.len();
    HttpResponse::Ok().content_type("application/json").body(
        json!({"object": "list", "url": req.path(), "data": page, "has_more": has_more})
            .to_string(),
    )
}

/// Every Refund in `body` (one, or a list's) that the test made fail
/// after it succeeded, as Stripe shows one: `status: failed` and its
/// `failure_reason` (Refunds API: "`failed`... `failure_reason`:
/// `expired_or_canceled_card`, `lost_or_stolen_card`, `unknown`").
fn with_failed_refunds(shared: &Shared, body: Bytes) -> Bytes {
    let failed = shared.state().failed_refunds.clone();
    if failed.is_empty() {
        return body;
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    fn mark(value: &mut Value, failed: &HashMap<String, String>) -> bool {
        match value {
            Value::Array(items) => {
                let mut changed = false;
                for item in items {
                    changed |= mark(item, failed);
                }
                changed
            }
            Value::Object(map) => {
                let mut changed = false;
                if map.get("object") == Some(&json!("refund")) {
                    if let Some(reason) = map
                        .get("id")
                        .and_then(Value::as_str)
                        .and_then(|id| failed.get(id))
                    {
                        map.insert("status".into(), json!("failed"));
                        map.insert("failure_reason".into(), json!(reason));
                        changed = true;
                    }
                }
                for v in map.values_mut() {
                    changed |= mark(v, failed);
                }
                changed
            }
            _ => false,
        }
    }
    if mark(&mut value, &failed) {
        Bytes::from(value.to_string())
    } else {
        body
    }
}

/// A form body without `name`.
fn without_param(body: &Bytes, name: &str) -> Bytes {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body).unwrap_or_default();
    let kept: Vec<_> = pairs.into_iter().filter(|(k, _)| k != name).collect();
    Bytes::from(serde_urlencoded::to_string(kept).unwrap_or_default())
}

/// Stripe's answer to cancelling a PaymentIntent that cannot be cancelled
/// (it succeeded, or is processing): `400 invalid_request_error`, code
/// `payment_intent_unexpected_state`, with the PaymentIntent as it is
/// (Stripe's error object carries `payment_intent`). localstripe answers a
/// bare `400 Bad request`.
async fn cancel_refused(shared: &Shared, req: &HttpRequest) -> (u16, Bytes) {
    let intent = req
        .path()
        .trim_start_matches("/v1/payment_intents/")
        .trim_end_matches("/cancel")
        .to_string();
    let pi = upstream_json(shared, req, &format!("/v1/payment_intents/{intent}"))
        .await
        .unwrap_or(Value::Null);
    let status = pi["status"].as_str().unwrap_or("unknown").to_string();
    let error = json!({"error": {
        "type": "invalid_request_error",
        "code": "payment_intent_unexpected_state",
        "message": format!("You cannot cancel this PaymentIntent because it has a status of {status}. Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing."),
        "payment_intent": pi,
    }});
    (400, Bytes::from(error.to_string()))
}

/// Stripe's answer to capturing a PaymentIntent that cannot be (captured
/// already, cancelled): `400 payment_intent_unexpected_state` with the
/// intent, as [`cancel_refused`].
async fn capture_refused(shared: &Shared, req: &HttpRequest) -> (u16, Bytes) {
    let intent = req
        .path()
        .trim_start_matches("/v1/payment_intents/")
        .trim_end_matches("/capture")
        .to_string();
    let pi = upstream_json(shared, req, &format!("/v1/payment_intents/{intent}"))
        .await
        .unwrap_or(Value::Null);
    let status = pi["status"].as_str().unwrap_or("unknown").to_string();
    let error = json!({"error": {
        "type": "invalid_request_error",
        "code": "payment_intent_unexpected_state",
        "message": format!("This PaymentIntent could not be captured because it has a status of {status}. Only a PaymentIntent with one of the following statuses may be captured: requires_capture."),
        "payment_intent": pi,
    }});
    (400, Bytes::from(error.to_string()))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The PaymentIntent a request's path names, if any.
fn intent_of(req: &HttpRequest) -> Option<String> {
    let rest = req.path().strip_prefix("/v1/payment_intents/")?;
    let id = rest.split('/').next()?;
    id.starts_with("pi_").then(|| id.to_string())
}

/// A hold of the intent the request names, past its deadline, is
/// cancelled first (once), as Stripe cancels an expired authorization.
async fn expire_hold(shared: &Shared, req: &HttpRequest) {
    let Some(intent) = intent_of(req) else {
        return;
    };
    let due = {
        let state = shared.state();
        !state.expired.contains(&intent)
            && state.holds.get(&intent).is_some_and(|at| now_unix() >= *at)
    };
    if !due {
        return;
    }
    let mut cancel = shared.http.post(format!(
        "{}/v1/payment_intents/{intent}/cancel",
        shared.upstream
    ));
    if let Some(auth) = req.headers().get("authorization") {
        cancel = cancel.header("authorization", auth.as_bytes());
    }
    if cancel.send().await.is_ok_and(|a| a.status().is_success()) {
        shared.state().expired.insert(intent);
    }
}

/// Every PaymentIntent in `body` (the answer, or a refusal's
/// `error.payment_intent`) as Stripe shows a hold: its deadline learnt the
/// first time it is seen held, shown on its charge (expanded from its id
/// where the request asked, `expand[]=latest_charge`); an expired one
/// cancelled `automatic`.
async fn with_holds(shared: &Shared, req: &HttpRequest, body: Bytes, wants_charge: bool) -> Bytes {
    let Ok(mut value) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let pointer = if value.get("object") == Some(&json!("payment_intent")) {
        ""
    } else if value.pointer("/error/payment_intent/object") == Some(&json!("payment_intent")) {
        "/error/payment_intent"
    } else {
        return body;
    };
    let Some(intent) = value.pointer_mut(pointer) else {
        return body;
    };
    let id = intent["id"].as_str().unwrap_or_default().to_string();
    let window = shared
        .state()
        .capture_window
        .unwrap_or(Duration::from_secs(7 * 86_400));
    let deadline = if intent["status"] == "requires_capture" {
        let window = window.as_secs_f64().ceil() as i64;
        Some(
            *shared
                .state()
                .holds
                .entry(id.clone())
                .or_insert(now_unix() + window.max(1)),
        )
    } else {
        None
    };
    if shared.state().expired.contains(&id) && intent["status"] == "canceled" {
        intent["cancellation_reason"] = json!("automatic");
    }
    // What a captured hold took, where Stripe shows it.
    let captured = shared.state().captured.get(&id).copied();
    if intent["status"] == "succeeded" && intent["capture_method"] == "manual" {
        let amount = captured.or_else(|| intent["amount"].as_i64());
        intent["amount_received"] = json!(amount);
        if let Some(charge) = intent["latest_charge"].as_object_mut() {
            charge.insert("amount_captured".into(), json!(amount));
        }
    }
    if wants_charge {
        if let Some(charge_id) = intent["latest_charge"].as_str().map(str::to_string) {
            if let Some(charge) =
                upstream_json(shared, req, &format!("/v1/charges/{charge_id}")).await
            {
                intent["latest_charge"] = charge;
            }
        }
        if let (Some(deadline), Some(charge)) = (deadline, intent["latest_charge"].as_object_mut())
        {
            let details = charge
                .entry("payment_method_details")
                .or_insert_with(|| json!({"type": "card", "card": {}}));
            if !details["card"].is_object() {
                details["card"] = json!({});
            }
            details["card"]["capture_before"] = json!(deadline);
        }
    }
    Bytes::from(value.to_string())
}

/// The JSON localstripe answers a `GET` of `path` with (`None`: `404`).
async fn upstream_json(shared: &Shared, req: &HttpRequest, path: &str) -> Option<Value> {
    let mut get = shared.http.get(format!("{}{path}", shared.upstream));
    if let Some(auth) = req.headers().get("authorization") {
        get = get.header("authorization", auth.as_bytes());
    }
    let answer = get.send().await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    answer.json().await.ok()
}

/// Stripe's refusals of a refund, which localstripe does not make (it
/// refunds a charge past its amount): Stripe's API reference, "Create a
/// refund" and the error codes `charge_already_refunded` ("The charge
/// you're attempting to refund has already been refunded") and
/// `amount_too_large` ("The specified amount is greater than the maximum
/// amount allowed"), and `resource_missing` for an unknown PaymentIntent;
/// each a `400 invalid_request_error`. `None`: Stripe would make it.
async fn refund_refusal(shared: &Shared, req: &HttpRequest, body: &Bytes) -> Option<(u16, Bytes)> {
    let form: HashMap<String, String> = serde_urlencoded::from_bytes(body).ok()?;
    let intent = form.get("payment_intent")?;
    let refusal = |code: &str, message: String, param: Option<&str>| {
        let mut error = json!({"type": "invalid_request_error", "code": code, "message": message});
        if let Some(param) = param {
            error["param"] = json!(param);
        }
        Some((400, Bytes::from(json!({ "error": error }).to_string())))
    };
    let Some(pi) = upstream_json(shared, req, &format!("/v1/payment_intents/{intent}")).await
    else {
        return refusal(
            "resource_missing",
            format!("No such payment_intent: '{intent}'"),
            Some("payment_intent"),
        );
    };
    let charge_id = match &pi["latest_charge"] {
        Value::String(id) => id.clone(),
        Value::Object(charge) => charge.get("id")?.as_str()?.to_string(),
        _ => return None,
    };
    // What was charged back is not refunded (error code `charge_disputed`:
    // "The charge you're attempting to refund has been charged back"),
    // unless the dispute is an inquiry that says it still can be, or was
    // won.
    let charged_back: i64 = shared
        .state()
        .disputes
        .values()
        .filter(|d| {
            d["payment_intent"] == intent.as_str()
                && d["is_charge_refundable"] != true
                && d["status"] != "won"
        })
        .filter_map(|d| d["amount"].as_i64())
        .sum();
    let charge = upstream_json(shared, req, &format!("/v1/charges/{charge_id}")).await?;
    let amount = charge["amount"].as_i64()?;
    // What its refunds hold, but those that failed after succeeding: their
    // money is back in the balance and refundable again, as at Stripe.
    let failed = shared.state().failed_refunds.clone();
    let refunds = upstream_json(
        shared,
        req,
        &format!("/v1/refunds?payment_intent={intent}&limit=100"),
    )
    .await?;
    let refunded: i64 = refunds["data"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|r| !r["id"].as_str().is_some_and(|id| failed.contains_key(id)))
                .filter_map(|r| r["amount"].as_i64())
                .sum()
        })
        .unwrap_or(0);
    let left = amount - refunded;
    let asked = match form.get("amount") {
        Some(a) => a.parse::<i64>().ok()?,
        None => left,
    };
    if charged_back > 0 && asked > left - charged_back {
        refusal(
            "charge_disputed",
            format!("Charge {charge_id} has been charged back; cannot issue a refund."),
            None,
        )
    } else if left <= 0 {
        refusal(
            "charge_already_refunded",
            format!("Charge {charge_id} has already been refunded."),
            None,
        )
    } else if asked > left {
        refusal(
            "amount_too_large",
            format!("Refund amount ({asked}) is greater than unrefunded amount on charge ({left})"),
            Some("amount"),
        )
    } else {
        None
    }
}

/// A response whose body fails at once: the connection closes unanswered.
fn dropped() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(crate::fault_proxy::Dropped)
}

impl StripeLayer {
    /// Starts the layer on a free loopback port in front of `upstream`
    /// (localstripe's URL), passing everything until told otherwise.
    pub fn start(upstream: &str) -> std::io::Result<StripeLayer> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(std::io::Error::other)?,
            release: tokio::sync::Notify::new(),
            url: std::sync::OnceLock::new(),
        });
        let url = format!(
            "http://{}",
            crate::loopback_http::serve(shared.clone(), handle)?
        );
        let _ = shared.url.set(url.clone());
        Ok(StripeLayer { shared, url })
    }

    /// How long a hold lasts before Stripe cancels it (`automatic`); 7
    /// days unless told.
    pub fn set_capture_window(&self, window: Duration) {
        self.shared.state().capture_window = Some(window);
    }

    /// The hold of `intent` reaches its deadline now: the next call naming
    /// it finds it cancelled (`automatic`), as Stripe expires it.
    pub fn expire_hold(&self, intent: &str) {
        self.shared
            .state()
            .holds
            .insert(intent.to_string(), now_unix() - 1);
    }

    /// The layer's base URL, to use as `ONCEPAY_STRIPE_API_BASE`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Applies `fault` to every later `call`.
    pub fn set(&self, call: Call, fault: StripeFault) {
        self.shared.state().faults.insert(call, (fault, None));
    }

    /// Applies `fault` to the next `times` calls of this kind only.
    pub fn set_times(&self, call: Call, fault: StripeFault, times: u32) {
        self.shared
            .state()
            .faults
            .insert(call, (fault, Some(times)));
    }

    /// Passes every later `call` again (stalled calls stay held until
    /// [`StripeLayer::release`]).
    pub fn clear(&self, call: Call) {
        self.shared.state().faults.remove(&call);
    }

    /// Applies `fault` to every `calls` for `duration`, then passes them
    /// again (unless another fault was set on one meanwhile), as
    /// [`crate::fault_proxy::FaultProxy::spell`] does. The timer runs on
    /// the current tokio runtime. Not for [`StripeFault::Stall`]: what a
    /// spell of it held stays held until released.
    pub fn spell(&self, calls: &[Call], fault: StripeFault, duration: Duration) {
        for call in calls {
            self.set(*call, fault.clone());
        }
        let (layer, calls) = (self.clone(), calls.to_vec());
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            let mut state = layer.shared.state();
            for call in calls {
                if state.faults.get(&call) == Some(&(fault.clone(), None)) {
                    state.faults.remove(&call);
                }
            }
        });
    }

    /// Passes every call again, and lets every stalled call go on.
    pub fn heal(&self) {
        self.shared.state().faults.clear();
        self.release();
    }

    /// Lets every stalled call go on.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    /// Calls of this kind that reached the provider.
    pub fn forwarded(&self, call: Call) -> u64 {
        self.shared
            .state()
            .forwarded
            .get(&call)
            .copied()
            .unwrap_or(0)
    }

    /// Calls of this kind that met a fault (any kind, from `set`,
    /// `set_times` or `spell`).
    pub fn faulted(&self, call: Call) -> u64 {
        self.shared.state().faulted.get(&call).copied().unwrap_or(0)
    }

    /// Makes refund `id` fail after it succeeded, as Stripe's card refunds
    /// do when the card was closed or expired: every later read shows it
    /// `failed` with `failure_reason` (the event is the test's to send).
    pub fn fail_refund(&self, id: &str, reason: &str) {
        self.shared
            .state()
            .failed_refunds
            .insert(id.to_string(), reason.to_string());
    }

    /// The refunds made to fail after they succeeded, with their
    /// `failure_reason`.
    pub fn failed_refunds(&self) -> HashMap<String, String> {
        self.shared.state().failed_refunds.clone()
    }

    /// The holds as Stripe's books would show them: by PaymentIntent, the
    /// captures made (answered `2xx` by localstripe, the effect made even
    /// where the layer then lost or replaced the answer), the amount each
    /// capture took, the intents cancelled at their deadline, and each
    /// hold's deadline.
    pub fn holds(&self) -> HoldBooks {
        let state = self.shared.state();
        HoldBooks {
            captures: state.captures_made.clone(),
            captured: state.captured.clone(),
            expired: state.expired.clone(),
            deadlines: state.holds.clone(),
        }
    }

    /// Opens a dispute of PaymentIntent `payment_intent` (its charge
    /// `charge`) for `amount` in Stripe's units of `currency`, in Stripe's
    /// `status` (`needs_response`, `warning_needs_response`, …), evidence
    /// due in seven days; returns it as `GET /v1/disputes/{id}` shows it.
    pub fn open_dispute(
        &self,
        (payment_intent, charge): (&str, &str),
        (amount, currency): (i64, &str),
        reason: &str,
        status: &str,
    ) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let id = format!("dp_{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let dispute = json!({
            "id": id,
            "object": "dispute",
            "amount": amount,
            "balance_transactions": [],
            "charge": charge,
            "currency": currency.to_ascii_lowercase(),
            "created": now,
            "evidence": {},
            "evidence_details": {
                "due_by": now + 7 * 24 * 3600,
                "has_evidence": false,
                "past_due": false,
                "submission_count": 0
            },
            // An inquiry (`warning_*`) can still be refunded; a chargeback
            // cannot (Stripe's Dispute object, `is_charge_refundable`).
            "is_charge_refundable": status.starts_with("warning_"),
            "livemode": false,
            "metadata": {},
            "payment_intent": payment_intent,
            "reason": reason,
            "status": status,
        });
        self.shared.state().disputes.insert(id, dispute.clone());
        dispute
    }

    /// Moves dispute `id` to Stripe's `status` (`under_review`, `won`,
    /// `lost`, `warning_closed`, …); returns it, `None` for no such
    /// dispute.
    pub fn set_dispute_status(&self, id: &str, status: &str) -> Option<Value> {
        let mut state = self.shared.state();
        let dispute = state.disputes.get_mut(id)?;
        dispute["status"] = json!(status);
        Some(dispute.clone())
    }

    /// Closes dispute `id` as `won` or `lost`.
    pub fn close_dispute(&self, id: &str, outcome: &str) -> Option<Value> {
        self.set_dispute_status(id, outcome)
    }

    /// How many lists were asked with a `created` filter.
    pub fn filtered_lists(&self) -> u64 {
        self.shared.state().filtered
    }

    /// Calls of this kind that Stripe's own rules refused.
    pub fn refused(&self, call: Call) -> u64 {
        self.shared.state().refused.get(&call).copied().unwrap_or(0)
    }

    /// How many repeats got a saved answer.
    pub fn replayed(&self) -> u64 {
        self.shared.state().replayed
    }

    /// Calls held by [`StripeFault::Stall`] right now.
    pub fn stalled(&self) -> u64 {
        self.shared.state().stalled
    }
}
