//! The hosted checkout page and the browser's protocol. The checkout token
//! in the URL is the browser's only credential: it answers for its own
//! order and nothing else, and no merchant key ever reaches the browser.
//!
//! - `GET /checkout/{token}`: the page (server-rendered HTML, one script and
//!   one stylesheet of its own and the provider's card form with its script,
//!   a Content-Security-Policy allowing only its own origin and what the
//!   card form needs);
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

use super::checkout_text::{Lang, Text};
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
use crate::provider::card_form::{escape, CardForm, CspSources};
use crate::rate_limit::{Limit, RateLimits};
use crate::store::{self, checkout::Session};

type Reply = Result<HttpResponse, Problem>;

/// Only the page's own origin, but for what the provider's card form says
/// it needs (where the card goes; a provider's script and frames). No
/// plugins, no framing of the page.
fn csp(card: Option<&dyn CardForm>) -> String {
    let CspSources {
        script,
        frame,
        connect,
    } = card.map(|c| c.csp()).unwrap_or_default();
    let more = |sources: &str| {
        if sources.is_empty() {
            String::new()
        } else {
            format!(" {sources}")
        }
    };
    let frame = if frame.is_empty() {
        String::new()
    } else {
        format!("frame-src {frame}; ")
    };
    format!(
        "default-src 'none'; script-src 'self'{}; style-src 'self'; img-src 'self'; {frame}\
         connect-src 'self'{}; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        more(script),
        more(connect),
    )
}

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

fn html(status: actix_web::http::StatusCode, body: String, csp: &str) -> HttpResponse {
    let mut response = HttpResponse::build(status);
    response
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", csp.to_string()))
        .insert_header(("Referrer-Policy", "no-referrer"));
    response.body(body)
}

fn page(lang: Lang, title: &str, main: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"{}\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<link rel=\"stylesheet\" href=\"/checkout/assets/checkout.css\">\n\
         </head>\n<body>\n<main class=\"card\">\n{main}\n</main>\n</body>\n</html>\n",
        lang.tag(),
        escape(title)
    )
}

/// `GET /checkout/{token}`: the page, or a clear error page (`404`/`410`),
/// in the session's language or the browser's.
pub async fn show(state: web::Data<AppState>, req: HttpRequest, path: web::Path<String>) -> Reply {
    use actix_web::http::StatusCode;
    let token = Token::new(&path);
    admit(&state, &req, &token)?;
    let accept = req
        .headers()
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    let session = match session_of(&state, &token).await? {
        Ok(session) => session,
        Err(closed) => return Ok(closed_page(closed, accept)),
    };
    let lang = Lang::choose(session.locale.as_deref(), accept);
    let t = lang.text();
    let (order, attempts) = order_and_attempts(&state, &session, true).await?;
    let currency = Currency::try_from(order.currency.as_str()).map_err(Problem::internal_from)?;
    let total = money_html(currency, order.amount);
    let rows = item_rows(&order, currency);
    // The page starts where the order is: paid shows the receipt (with its
    // payment), an order that can no longer be paid says so, and neither
    // offers a Pay button.
    let initial = match order.status {
        OrderStatus::AwaitingPayment => "idle",
        OrderStatus::Paid => "succeeded",
        // Held: the card was authorized, not charged; nothing to pay.
        OrderStatus::Authorized => "authorized",
        OrderStatus::Refunded | OrderStatus::Cancelled => "closed",
    };
    let paid_by = attempts
        .iter()
        .rev()
        .find(|p| {
            use crate::domain::payment::PaymentStatus;
            matches!(
                p.status,
                PaymentStatus::Succeeded | PaymentStatus::RequiresCapture
            )
        })
        .map(|p| p.id.to_string())
        .unwrap_or_default();
    let provider = state.ctx.providers.current();
    let card_form = provider.card_form();
    let test_mode = provider.test_mode();
    let banner = if test_mode {
        format!(
            "<p class=\"test-mode\" id=\"test-mode\" role=\"note\">{}</p>\n",
            escape(t.test_mode)
        )
    } else {
        String::new()
    };
    let card = card_fields(provider.name(), card_form, t);
    let token = test_token_field(card_form, test_mode, provider.example_payment_method(), t);
    let success_url = session
        .success_url
        .as_deref()
        .map(|u| {
            u.replace(
                crate::commands::checkout::SESSION_ID_PLACEHOLDER,
                &session.id.to_string(),
            )
        })
        .unwrap_or_default();
    let cancel = cancel_link(session.cancel_url.as_deref(), t);
    let manual = session.capture_method == crate::domain::payment::CaptureMethod::Manual;
    let text = serde_json::to_string(t).map_err(Problem::internal_from)?;
    let main = format!(
        "<header>\n<p class=\"merchant\" id=\"merchant\">{merchant}</p>\n{banner}<h1><span class=\"verb\">{pay}</span> {total}</h1>\n\
         <p class=\"order\">{order_word} <span class=\"ref\">{order_id}</span></p>\n</header>\n\
         <table class=\"items\">\n<thead><tr><th scope=\"col\">{item}</th><th scope=\"col\" class=\"qty\">{qty}</th><th scope=\"col\" class=\"money\">{amount}</th></tr></thead>\n\
         <tbody>\n{rows}</tbody>\n<tfoot><tr><th scope=\"row\" colspan=\"2\">{total_word}</th><td class=\"money\">{total}</td></tr></tfoot>\n</table>\n\
         {authorize_note}<form id=\"checkout\" data-token=\"{token_path}\" data-order=\"{order_id}\" data-initial=\"{initial}\" data-paid-by=\"{paid_by}\" \
         data-capture=\"{capture}\" data-lang=\"{lang}\" data-card=\"{card_kind}\"{card_data} data-success-url=\"{success}\" data-text=\"{text}\" novalidate>\n\
         {fields}{token}<button id=\"pay\" type=\"submit\">{pay} {total}</button>\n{cancel}</form>\n\
         <div id=\"status\" role=\"status\" aria-live=\"polite\" data-status=\"idle\">{ready}</div>\n\
         <p id=\"bank\" hidden><a id=\"continue\" href=\"#\">{continue_at_bank}</a></p>\n\
         <section id=\"receipt\" hidden>\n<h2>{received}</h2>\n<p>{thank_you} <span id=\"receipt-amount\">{total}</span></p>\n\
         <p class=\"ref\">{payment_ref} <span id=\"receipt-id\"></span></p>\n</section>\n\
         {card_script}<script src=\"/checkout/assets/checkout.js\" defer></script>",
        merchant = escape(&session.merchant_name),
        capture = session.capture_method.as_str(),
        authorize_note = if manual {
            format!(
                "<p class=\"notice\" id=\"authorize-note\">{}</p>\n",
                escape(t.authorize_note)
            )
        } else {
            String::new()
        },
        pay = escape(t.pay),
        order_word = escape(t.order),
        order_id = order.id,
        item = escape(t.item),
        qty = escape(t.qty),
        amount = escape(t.amount),
        total_word = escape(t.total),
        token_path = escape(&path),
        lang = lang.tag(),
        card_kind = card.kind,
        card_data = card.data,
        card_script = card.script,
        fields = card.html,
        success = escape(&success_url),
        text = escape(&text),
        ready = escape(t.ready),
        continue_at_bank = escape(t.continue_at_bank),
        received = escape(t.received),
        thank_you = escape(t.thank_you),
        payment_ref = escape(t.payment_ref),
    );
    Ok(html(
        StatusCode::OK,
        page(
            lang,
            &format!("{} — {}", t.title, currency.format(order.amount)),
            &main,
        ),
        &csp(card_form),
    ))
}

/// The page of a token that opens no session (404) or an expired one (410),
/// in the browser's language: the session's own is not known.
fn closed_page(closed: Closed, accept: Option<&str>) -> HttpResponse {
    use actix_web::http::StatusCode;
    let lang = Lang::choose(None, accept);
    let t = lang.text();
    let (status, title, text) = match closed {
        Closed::Unknown => (StatusCode::NOT_FOUND, t.not_found_title, t.not_found),
        Closed::Expired => (StatusCode::GONE, t.expired_title, t.expired_page),
    };
    let main = format!(
        "<h1>{title}</h1>\n<p class=\"notice\" id=\"closed\" data-status=\"closed\">{text}</p>"
    );
    html(status, page(lang, title, &main), &csp(None))
}

/// An amount as the server formats it, with what the script needs to
/// format it again in the customer's locale.
fn money_html(currency: Currency, minor: i64) -> String {
    format!(
        "<span class=\"money\" data-minor=\"{minor}\" data-exponent=\"{}\" data-currency=\"{}\">{}</span>",
        currency.exponent(),
        escape(currency.as_str()),
        escape(&currency.format(minor))
    )
}

/// One table row per line item: SKU, quantity, line total.
fn item_rows(order: &Order, currency: Currency) -> String {
    order
        .items
        .iter()
        .map(|item| {
            format!(
                "<tr><td>{}</td><td class=\"qty\">{}</td><td class=\"money\">{}</td></tr>\n",
                escape(&item.sku),
                item.quantity,
                money_html(currency, item.unit_amount.saturating_mul(item.quantity))
            )
        })
        .collect()
}

/// The provider's card form as the page renders it.
struct CardFields {
    html: String,
    /// `data-card`: the form's kind, or `none`.
    kind: &'static str,
    /// The form's `data-*` attributes, each with its leading space.
    data: String,
    /// Its script's element, loaded before the page's own script, which
    /// finds the form's `window.oncepayCard` set.
    script: String,
}

/// The provider's card form, in the page's words; no fields where the
/// provider has none.
fn card_fields(provider: &str, card_form: Option<&dyn CardForm>, t: &Text) -> CardFields {
    let Some(form) = card_form else {
        return CardFields {
            html: String::new(),
            kind: "none",
            data: String::new(),
            script: String::new(),
        };
    };
    let data = form
        .data()
        .into_iter()
        .map(|(name, value)| {
            debug_assert!(
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "data-{name}"
            );
            format!(" data-{name}=\"{}\"", escape(value))
        })
        .collect();
    CardFields {
        html: form.fields(&t.card_form),
        kind: form.kind(),
        data,
        // By the provider's name, as `card_script` looks it up.
        script: format!(
            "<script src=\"/checkout/assets/card_{}.js\" defer></script>\n",
            escape(provider)
        ),
    }
}

/// The raw payment-method field, only in test mode: behind a disclosure
/// beside a card form, alone where there is none. With live keys it does
/// not exist.
fn test_token_field(
    card_form: Option<&dyn CardForm>,
    test_mode: bool,
    example: &str,
    t: &Text,
) -> String {
    if !test_mode {
        return String::new();
    }
    let input = format!(
        "<label for=\"payment_method\">{}</label>\n<input id=\"payment_method\" name=\"payment_method\" value=\"{}\" \
         autocomplete=\"off\" autocapitalize=\"off\" spellcheck=\"false\" aria-describedby=\"payment_method-error\">\n\
         <p class=\"field-error\" id=\"payment_method-error\" hidden></p>\n",
        escape(t.test_token),
        escape(example)
    );
    match card_form {
        None => input,
        Some(_) => format!(
            "<details id=\"test-token\"><summary>{}</summary>\n{input}</details>\n",
            escape(t.use_test_token)
        ),
    }
}

/// The way back to the shop without paying, where the merchant gave one.
fn cancel_link(url: Option<&str>, t: &Text) -> String {
    match url {
        Some(url) => format!(
            "<p class=\"cancel\"><a id=\"cancel\" href=\"{}\">{}</a></p>\n",
            escape(url),
            escape(t.cancel)
        ),
        None => String::new(),
    }
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
        "next_action": p.next_action,
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
    // A page anyone with its link can open never spends the customer's
    // store credit: paying from a balance is the merchant's call (its API
    // key), not the page's.
    if method == crate::provider::balance::PAYMENT_METHOD {
        return Err(Problem::rule(crate::domain::RuleViolation::new(
            "payment_method",
            "the checkout page does not pay from a customer's balance",
        )));
    }
    // The customer comes back to this page from their bank (3-D Secure).
    let page_url = format!("{}/checkout/{}", state.ctx.checkout.public_url, token.text);
    let input = CommandInput {
        path_id: None,
        path_text: None,
        body: json!({
            "order_id": session.order_id,
            "payment_method": method,
            "return_url": page_url,
            "capture_method": session.capture_method,
        }),
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

/// `GET /checkout/assets/card_{provider}.js`: the script of a configured
/// provider's card form. Any configured provider's, not only the current
/// one's: a page rendered by a process whose `ONCEPAY_PROVIDER` differs (a
/// rolling change) still finds its own where this process knows it.
pub(crate) async fn card_script(
    state: web::Data<AppState>,
    provider: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let providers = &state.ctx.providers;
    let script = providers
        .all()
        .iter()
        .find(|p| p.name() == provider.as_str())
        .and_then(|p| p.card_form().map(|form| form.script()))
        .ok_or_else(|| {
            Problem::new(
                ProblemCode::NotFound,
                "no provider with a card form of that name here",
            )
        })?;
    Ok(asset("text/javascript; charset=utf-8", script))
}

/// `GET /checkout/assets/checkout.css`.
pub(crate) async fn stylesheet() -> HttpResponse {
    asset("text/css; charset=utf-8", STYLESHEET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::card_form::CardWords;

    /// A card form that needs these origins.
    struct Needs(CspSources<'static>);

    impl CardForm for Needs {
        fn kind(&self) -> &'static str {
            "test"
        }
        fn fields(&self, _: &CardWords) -> String {
            String::new()
        }
        fn data(&self) -> Vec<(&'static str, &str)> {
            Vec::new()
        }
        fn script(&self) -> &'static str {
            ""
        }
        fn csp(&self) -> CspSources<'_> {
            self.0
        }
    }

    #[test]
    fn the_policy_adds_only_what_the_card_form_needs() {
        assert_eq!(
            csp(None),
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        );
        let tokenize = Needs(CspSources {
            connect: "http://127.0.0.1:4010",
            ..CspSources::default()
        });
        assert_eq!(
            csp(Some(&tokenize)),
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self' http://127.0.0.1:4010; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        );
        let elements = Needs(CspSources {
            script: "https://js.stripe.com",
            frame: "https://js.stripe.com https://hooks.stripe.com",
            connect: "https://api.stripe.com",
        });
        assert_eq!(
            csp(Some(&elements)),
            "default-src 'none'; script-src 'self' https://js.stripe.com; style-src 'self'; img-src 'self'; \
             frame-src https://js.stripe.com https://hooks.stripe.com; connect-src 'self' https://api.stripe.com; \
             form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        );
    }
}
