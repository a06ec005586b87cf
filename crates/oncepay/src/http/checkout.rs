//! The hosted checkout page and the browser's protocol. The checkout token
//! in the URL is the browser's only credential: it answers for its own
//! order and nothing else, and no merchant key ever reaches the browser.
//!
//! - `GET /checkout/{token}`: the page (server-rendered HTML, one script and
//!   one stylesheet of its own, a Content-Security-Policy allowing only its
//!   own origin);
//! - `POST /checkout/{token}/payments`: pays the order with an
//!   `Idempotency-Key` the script made, through the same payment command and
//!   engine as `POST /payments` (the key is scoped to the session, so it can
//!   never meet a merchant's own keys);
//! - `GET /checkout/{token}/status?key=K`: the order's status, the attempt
//!   that key made (if any) and the latest attempt.

use std::net::IpAddr;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::resources::{money_command, run_command};
use super::{idempotency_key, ok_json, on_service_runtime, path_uuid, read_body, AppState};
use crate::commands::checkout::{token_hash, CreateCheckout, TOKEN_PREFIX};
use crate::commands::payments::CreatePayment;
use crate::commands::CommandInput;
use crate::domain::money::Currency;
use crate::domain::order::{Order, OrderStatus};
use crate::domain::payment::Payment;
use crate::idempotency::{store_problem, Fingerprint, IdempotencyKey, RecordId};
use crate::input::{parse_body, Obj};
use crate::problem::{Problem, ProblemCode};
use crate::rate_limit::{Limit, RateLimits};
use crate::store::{self, checkout::Session};

type Reply = Result<HttpResponse, Problem>;

/// Only the page's own origin, for everything; no framing, no plugins.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

const SCRIPT: &str = include_str!("../../assets/checkout.js");
const STYLESHEET: &str = include_str!("../../assets/checkout.css");

/// `POST /orders/{id}/checkout` (merchant key, `Idempotency-Key`).
pub async fn create(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, ProblemCode::OrderNotFound, "order").map(Some);
    money_command::<CreateCheckout>(&state, &req, payload, id, true).await
}

/// The public checkout's own rate limits. Its endpoints take no API key,
/// so the merchant's limit cannot apply: each session (by its token's hash,
/// checked before any database read) and each client address has its own
/// (`ONCEPAY_CHECKOUT_RATE_LIMIT_*`, `ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_*`).
/// A page polls far below them; a runaway tab or a script does not.
pub struct CheckoutLimits {
    session: RateLimits<[u8; 32]>,
    address: RateLimits<IpAddr>,
}

impl CheckoutLimits {
    /// Limits per session and per client address (`None`: unlimited).
    pub fn new(per_session: Option<Limit>, per_address: Option<Limit>) -> CheckoutLimits {
        CheckoutLimits {
            session: RateLimits::new(per_session),
            address: RateLimits::new(per_address),
        }
    }
}

/// A token as the browser sent it, with its hash (computed once: the rate
/// limit and the session lookup both key on it).
struct Token<'a> {
    text: &'a str,
    hash: [u8; 32],
}

impl<'a> Token<'a> {
    fn new(text: &'a str) -> Token<'a> {
        Token {
            text,
            hash: token_hash(text),
        }
    }
}

/// Admits one checkout request, or `429 rate_limited` with `Retry-After`.
fn admit(state: &AppState, req: &HttpRequest, token: &Token<'_>) -> Result<(), Problem> {
    let limits = &state.checkout_limits;
    let by_address = match req.peer_addr() {
        Some(peer) => limits.address.check(peer.ip(), None),
        None => Ok(()),
    };
    let admitted = by_address.and_then(|()| limits.session.check(token.hash, None));
    admitted.map_err(|wait| {
        state.ctx.metrics.rate_limited.inc();
        let seconds = crate::rate_limit::retry_after_secs(wait);
        Problem::new(
            ProblemCode::RateLimited,
            format!("too many requests for this checkout; retry in {seconds} s"),
        )
        .retry_after(seconds)
    })
}

/// Why a token opens nothing.
enum Closed {
    Unknown,
    Expired,
}

/// The session a token opens (live or expired), by its hash.
async fn session_of(
    state: &AppState,
    token: &Token<'_>,
) -> Result<Result<Session, Closed>, Problem> {
    let (token, hash) = (token.text, token.hash);
    let well_formed = token.len() == TOKEN_PREFIX.len() + 64
        && token.starts_with(TOKEN_PREFIX)
        && token[TOKEN_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit());
    if !well_formed {
        return Ok(Err(Closed::Unknown));
    }
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(state, async move {
        store::checkout::by_token_hash(&pool, &hash)
            .await
            .map_err(store_problem)
    })
    .await?;
    Ok(match found {
        None => Err(Closed::Unknown),
        Some(s) if s.expired => Err(Closed::Expired),
        Some(s) => Ok(s),
    })
}

/// A live session, or the problem a JSON call gets.
async fn live_session(state: &AppState, token: &Token<'_>) -> Result<Session, Problem> {
    match session_of(state, token).await? {
        Ok(session) => Ok(session),
        Err(Closed::Unknown) => Err(Problem::not_found(
            ProblemCode::CheckoutNotFound,
            "checkout",
        )),
        Err(Closed::Expired) => Err(Problem::new(
            ProblemCode::CheckoutExpired,
            "this checkout link has expired; ask the shop for a new one",
        )),
    }
}

/// The order behind a session, and its attempts (oldest first) if asked.
async fn order_and_attempts(
    state: &AppState,
    session: &Session,
    with_attempts: bool,
) -> Result<(Order, Vec<Payment>), Problem> {
    let (pool, merchant, order_id) = (
        state.ctx.pool.clone(),
        session.merchant_id,
        session.order_id,
    );
    on_service_runtime(state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        let order = store::orders::get(&mut conn, merchant, order_id)
            .await
            .map_err(store_problem)?
            .ok_or_else(|| Problem::not_found(ProblemCode::CheckoutNotFound, "checkout"))?;
        let attempts = if with_attempts {
            store::payments::list_for_order(&mut conn, merchant, order_id)
                .await
                .map_err(store_problem)?
        } else {
            Vec::new()
        };
        Ok((order, attempts))
    })
    .await
}

fn html(status: actix_web::http::StatusCode, body: String) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    response
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", CSP))
        .insert_header(("Referrer-Policy", "no-referrer"));
    response.body(body)
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn page(title: &str, main: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<link rel=\"stylesheet\" href=\"/checkout/assets/checkout.css\">\n\
         </head>\n<body>\n<main class=\"card\">\n{main}\n</main>\n</body>\n</html>\n",
        escape(title)
    )
}

/// `GET /checkout/{token}`: the page, or a clear error page (`404`/`410`).
pub async fn show(state: web::Data<AppState>, req: HttpRequest, path: web::Path<String>) -> Reply {
    use actix_web::http::StatusCode;
    let token = Token::new(&path);
    admit(&state, &req, &token)?;
    let session = match session_of(&state, &token).await? {
        Ok(session) => session,
        Err(closed) => {
            let (status, title, text) = match closed {
                Closed::Unknown => (
                    StatusCode::NOT_FOUND,
                    "Checkout not found",
                    "This checkout link is not valid. Check the link the shop sent you.",
                ),
                Closed::Expired => (
                    StatusCode::GONE,
                    "Checkout expired",
                    "This checkout link has expired, and nothing can be paid with it. Ask the shop for a new one.",
                ),
            };
            let main = format!(
                "<h1>{title}</h1>\n<p class=\"notice\" id=\"closed\" data-status=\"closed\">{text}</p>"
            );
            return Ok(html(status, page(title, &main)));
        }
    };
    let (order, _) = order_and_attempts(&state, &session, false).await?;
    let currency = Currency::try_from(order.currency.as_str()).map_err(|_| Problem::internal())?;
    let total = currency.format(order.amount);
    let rows: String = order
        .items
        .iter()
        .map(|item| {
            format!(
                "<tr><td>{}</td><td class=\"qty\">{}</td><td class=\"money\">{}</td></tr>\n",
                escape(&item.sku),
                item.quantity,
                escape(&currency.format(item.unit_amount.saturating_mul(item.quantity)))
            )
        })
        .collect();
    // The page starts where the order is: paid shows the receipt, an order
    // that can no longer be paid says so, and neither offers a Pay button.
    let initial = match order.status {
        OrderStatus::AwaitingPayment => "idle",
        OrderStatus::Paid => "succeeded",
        OrderStatus::Refunded | OrderStatus::Cancelled => "closed",
    };
    let main = format!(
        "<header>\n<p class=\"merchant\">Secure checkout</p>\n<h1>Pay <span class=\"amount\">{total}</span></h1>\n\
         <p class=\"order\">Order {order_id}</p>\n</header>\n\
         <table class=\"items\">\n<thead><tr><th>Item</th><th class=\"qty\">Qty</th><th class=\"money\">Amount</th></tr></thead>\n\
         <tbody>\n{rows}</tbody>\n<tfoot><tr><th colspan=\"2\">Total</th><td class=\"money\">{total}</td></tr></tfoot>\n</table>\n\
         <form id=\"checkout\" data-token=\"{token}\" data-order=\"{order_id}\" data-initial=\"{initial}\" novalidate>\n\
         <label for=\"payment_method\">Card token</label>\n\
         <input id=\"payment_method\" name=\"payment_method\" value=\"{example}\" autocomplete=\"off\" autocapitalize=\"off\" spellcheck=\"false\" required>\n\
         <button id=\"pay\" type=\"submit\">Pay {total}</button>\n</form>\n\
         <div id=\"status\" role=\"status\" aria-live=\"polite\" data-status=\"idle\">Ready to pay.</div>\n\
         <section id=\"receipt\" hidden>\n<h2>Payment received</h2>\n<p>Thank you. <span id=\"receipt-amount\">{total}</span> was paid.</p>\n\
         <p class=\"ref\">Payment <span id=\"receipt-id\"></span></p>\n</section>\n\
         <script src=\"/checkout/assets/checkout.js\" defer></script>",
        total = escape(&total),
        order_id = order.id,
        token = escape(&path),
        initial = initial,
        example = escape(state.ctx.providers.current().example_payment_method()),
    );
    Ok(html(
        StatusCode::OK,
        page(&format!("Checkout — {total}"), &main),
    ))
}

#[derive(Deserialize)]
pub struct StatusQuery {
    key: Option<String>,
}

fn attempt_json(p: &Payment) -> Value {
    json!({
        "id": p.id,
        "status": p.status,
        "failure_code": p.failure_code,
        "failure_message": p.failure_message,
    })
}

/// `GET /checkout/{token}/status?key=K`.
pub async fn status(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<StatusQuery>,
) -> Reply {
    let token = Token::new(&path);
    admit(&state, &req, &token)?;
    let session = live_session(&state, &token).await?;
    let (order, attempts) = order_and_attempts(&state, &session, true).await?;
    // A key that no page could have made has made no attempt.
    let key = query
        .key
        .as_deref()
        .and_then(|k| IdempotencyKey::try_from(k).ok());
    let mine = match key {
        Some(key) => {
            let (pool, order_id) = (state.ctx.pool.clone(), order.id);
            let key = RecordId::checkout(session.merchant_id, session.id, &key).key;
            on_service_runtime(&state, async move {
                let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
                store::payments::by_key(&mut conn, order_id, &key)
                    .await
                    .map_err(store_problem)
            })
            .await?
        }
        None => None,
    };
    ok_json(&json!({
        "order_status": order.status.as_str(),
        "attempt": mine.as_ref().map(attempt_json),
        "latest": attempts.last().map(attempt_json),
    }))
}

/// `POST /checkout/{token}/payments` with `Idempotency-Key` and
/// `{"payment_method": …}`, in the current provider's form.
pub async fn pay(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let token = Token::new(&path);
    admit(&state, &req, &token)?;
    let session = live_session(&state, &token).await?;
    let key = idempotency_key(&req)?;
    let bytes = read_body(&state, &req, payload).await?;
    let body = parse_body(&bytes, false)?;
    let obj = Obj::root(&body)?;
    obj.only(&["payment_method"])?;
    let method = obj.string("payment_method")?;
    let input = CommandInput {
        path_id: None,
        body: json!({"order_id": session.order_id, "payment_method": method}),
        actor: None,
    };
    let id = RecordId::checkout(session.merchant_id, session.id, &key);
    let fingerprint = Fingerprint::of("POST", req.path(), &body);
    run_command::<CreatePayment>(&state, id, fingerprint, input).await
}

fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    response.content_type(content_type);
    response.insert_header((header::CACHE_CONTROL, HeaderValue::from_static("no-cache")));
    response.body(body)
}

/// `GET /checkout/assets/checkout.js`.
pub async fn script() -> HttpResponse {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /checkout/assets/checkout.css`.
pub async fn stylesheet() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLESHEET)
}
