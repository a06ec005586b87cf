//! The HTTP surface: routes, and the few helpers every handler shares
//! (authentication, the idempotency key, bounded body reading, turning
//! problems and stored responses into HTTP). Handlers stay thin: parse,
//! call a command or a store read, answer.

mod api_keys;
pub(crate) mod auth;
mod balances;
mod body;
mod checkout;
pub mod checkout_text;
mod events;
mod inbound;
mod inventory;
pub(crate) mod lists;
pub(crate) mod middleware;
mod ops;
mod resources;
pub mod routes;
mod webhook_endpoints;
pub mod wire;

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use uuid::Uuid;

pub use body::BodyLimits;
pub use checkout::CheckoutLimits;
pub(crate) use middleware::observe;
pub use ops::documented_operations;
#[cfg(test)]
pub(crate) use ops::OPENAPI;
pub use routes::ROUTES;

use auth::{authenticate, authenticate_caller};

use crate::commands::{Answer, AppContext};
use crate::idempotency::IdempotencyKey;
use crate::problem::{Problem, ProblemCode};

/// Shared state of every worker.
pub struct AppState {
    /// Commands, engine, pool, provider, metrics.
    pub ctx: std::sync::Arc<AppContext>,
    /// Size, time and slow-client bounds of request bodies.
    pub body_limits: body::BodyLimits,
    /// Recently verified API keys.
    pub keys: std::sync::Arc<crate::api_keys::KeyCache>,
    /// Verifies tokens of merchants' identity providers.
    pub identity: std::sync::Arc<crate::identity::Verifier>,
    /// Per-merchant rate limits of this process.
    pub rate_limits: crate::rate_limit::RateLimits,
    /// The public checkout's rate limits (per session, per address).
    pub checkout_limits: checkout::CheckoutLimits,
    /// Each client address's failed authentications (unknown keys,
    /// tokens of unknown issuers): see `auth::authenticate_caller`.
    pub auth_failures: crate::rate_limit::RateLimits<std::net::IpAddr>,
    /// Whether webhook endpoints may have private addresses
    /// (`ONCEPAY_WEBHOOK_ALLOW_PRIVATE`).
    pub webhook_allow_private: bool,
    /// The process's main runtime, where all database work runs (see
    /// [`on_service_runtime`]).
    pub runtime: tokio::runtime::Handle,
}

/// Runs database work on the process's main runtime. actix-web gives each
/// HTTP worker its own runtime, and a connection belongs to the runtime that
/// opened it; on SIGTERM actix stops idle workers first, so a pooled
/// connection opened by one of them would be dead for requests still
/// draining elsewhere. Opened on the main runtime, every connection lives
/// as long as the process.
async fn on_service_runtime<T, F>(state: &AppState, work: F) -> Result<T, Problem>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, Problem>> + Send + 'static,
{
    // The request's span and its request id go along.
    let work = tracing::Instrument::in_current_span(work);
    let joined = match crate::telemetry::request_id() {
        Some(id) => {
            state
                .runtime
                .spawn(crate::telemetry::with_request_id(id, work))
                .await
        }
        None => state.runtime.spawn(work).await,
    };
    match joined {
        Ok(answer) => answer,
        Err(e) => {
            // A panic is a bug: never a silent 500. Logged inside the
            // request's span, so the line carries its request id.
            let what = if e.is_panic() {
                let payload = e.into_panic();
                payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into())
            } else {
                "the task was cancelled".into()
            };
            tracing::error!(panic = %what, "request handling panicked; answered 500");
            Err(Problem::internal())
        }
    }
}

/// Every route of the API, from the one table ([`routes::ROUTES`]): each
/// path a resource whose other methods get `405` with the `Allow` header
/// RFC 9110 asks for.
pub fn routes(cfg: &mut web::ServiceConfig) {
    for path in routes::paths() {
        let mut resource = resource(path, &routes::allow(path));
        for route in ROUTES.iter().filter(|r| r.path == path) {
            let method = actix_web::http::Method::from_bytes(route.method.as_bytes())
                .expect("the route table's methods are GET, POST and DELETE");
            resource = resource.route((route.handler)(web::method(method)));
        }
        cfg.service(resource);
    }
    cfg.default_service(web::to(not_found));
}

/// A resource whose other methods get `405` with `Allow: {allow}`.
fn resource(path: &str, allow: &str) -> actix_web::Resource {
    let allow = HeaderValue::from_str(allow).expect("methods are header-safe");
    web::resource(path).default_service(web::to(move || {
        let allow = allow.clone();
        async move {
            let mut response = Problem::new(
                ProblemCode::MethodNotAllowed,
                "this endpoint does not take that method",
            )
            .error_response();
            response.headers_mut().insert(header::ALLOW, allow);
            response
        }
    }))
}

async fn not_found() -> Problem {
    Problem::new(ProblemCode::NotFound, "no such endpoint")
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.detail)
    }
}

impl ResponseError for Problem {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.content_type("application/problem+json");
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        if let Some(challenge) = challenge(self.code) {
            response.insert_header((header::WWW_AUTHENTICATE, challenge));
        }
        let mut response = response.body(self.body());
        if let Some(cause) = &self.cause {
            response
                .extensions_mut()
                .insert(middleware::ProblemCause(cause.to_string()));
        }
        response
    }
}

/// The `WWW-Authenticate` challenge of a `401` with this code: RFC 7235
/// section 3.1 asks one of every `401`, so a client (or its HTTP library)
/// learns the scheme without reading the body. A refused token says why
/// in RFC 6750's terms; missing credentials or an unknown key get the bare
/// scheme (RFC 6750 section 3: no error code where none was presented that
/// could be told apart). `None` for a code that is not a bearer
/// credential's (a provider's webhook signature has no challenge to give).
fn challenge(code: &str) -> Option<&'static str> {
    if code == ProblemCode::InvalidToken.as_str() {
        Some(r#"Bearer error="invalid_token""#)
    } else if code == ProblemCode::Unauthorized.as_str() {
        Some(BEARER_CHALLENGE)
    } else {
        None
    }
}

/// The challenge of a `401` without an accepted credential.
const BEARER_CHALLENGE: &str = r#"Bearer realm="oncepay""#;

impl actix_web::Responder for Problem {
    type Body = actix_web::body::BoxBody;

    fn respond_to(self, _req: &HttpRequest) -> HttpResponse {
        self.error_response()
    }
}

/// The answer of a money command: the stored status, body and `Location`,
/// plus `Idempotent-Replayed: true` on a repeat.
fn answer(answer: Answer) -> HttpResponse {
    let status =
        StatusCode::from_u16(answer.response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.content_type(if status.as_u16() >= 400 {
        "application/problem+json"
    } else {
        "application/json"
    });
    if let Some(location) = answer.response.location.as_deref() {
        if let Ok(value) = HeaderValue::from_str(location) {
            response.insert_header((header::LOCATION, value));
        }
    }
    if answer.replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    // A command's own `401` (a key rotated by a key that no longer
    // exists), stored and replayed, carries its challenge like any other.
    if status == StatusCode::UNAUTHORIZED {
        response.insert_header((header::WWW_AUTHENTICATE, BEARER_CHALLENGE));
    }
    response.body(answer.response.body)
}

/// A JSON `200` for reads.
fn ok_json<T: serde::Serialize>(value: &T) -> Result<HttpResponse, Problem> {
    let body = serde_json::to_vec(value).map_err(Problem::internal_from)?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}

/// The `Idempotency-Key` header; never read from the URL.
fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, Problem> {
    let mut values = req.headers().get_all("Idempotency-Key");
    let first = values.next().ok_or_else(|| {
        Problem::new(
            ProblemCode::IdempotencyKeyMissing,
            "this endpoint requires an Idempotency-Key header",
        )
    })?;
    if values.next().is_some() {
        return Err(Problem::new(
            ProblemCode::IdempotencyKeyInvalid,
            "send exactly one Idempotency-Key header",
        ));
    }
    IdempotencyKey::try_from(first.as_bytes())
        .map_err(|e| Problem::new(ProblemCode::IdempotencyKeyInvalid, e.to_string()))
}

/// Reads the body within the process's limits (see [`body`]).
async fn read_body(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<web::Bytes, Problem> {
    body::read(&state.body_limits, req, payload).await
}

/// A path `{id}` as a UUID; anything else is a resource that does not exist.
fn path_uuid(raw: &str, code: ProblemCode, what: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(raw).map_err(|_| Problem::not_found(code, what))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_route_is_documented_and_every_documented_operation_is_routed() {
        let routed: std::collections::BTreeSet<(String, String)> = super::ROUTES
            .iter()
            .map(|r| (r.path.to_string(), r.method.to_string()))
            .collect();
        assert_eq!(routed, super::documented_operations(super::OPENAPI));
    }
}
