//! Who a request speaks for, and whether it may: `Authorization: Bearer`
//! with an API key (`opk_…`) or a token of the merchant's own identity
//! provider (a JWT, see `crate::identity`), checked against the route
//! table's [`Access`] before anything else is read or written, so a
//! refused request is effect-free. A customer's token is also held to what
//! it owns: the path's object here, the body's in [`owns_body`], a list's
//! filter in [`Caller::list_customer`].

use actix_web::http::header;
use actix_web::HttpRequest;
use serde_json::Value;
use uuid::Uuid;

use super::routes::{self, Access, Customers, Ownership};
use super::{on_service_runtime, AppState};
use crate::api_keys::Scopes;
use crate::domain::principal::Role;
use crate::idempotency::{store_problem, IdempotencyKey, RecordId};
use crate::problem::{Problem, ProblemCode};
use crate::store;

/// Who an authenticated request speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Principal {
    /// An API key.
    Key {
        /// The key's id.
        key_id: Uuid,
    },
    /// A token of the merchant's identity provider.
    Token {
        /// The role it acts in.
        role: Role,
        /// Its `sub` (a customer's: the customer id).
        sub: String,
        /// Its issuer.
        issuer: String,
    },
}

/// An authenticated, admitted caller.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The merchant it acts for.
    pub merchant_id: Uuid,
    /// What it may do (a token: its role's).
    pub scopes: Scopes,
    /// Who it is.
    pub principal: Principal,
    limit: Option<crate::rate_limit::Limit>,
}

impl Caller {
    /// The customer id a customer's token acts as; `None` for keys and
    /// sellers, which act for the whole merchant.
    pub fn customer(&self) -> Option<&str> {
        match &self.principal {
            Principal::Token {
                role: Role::Customer,
                sub,
                ..
            } => Some(sub),
            _ => None,
        }
    }

    /// The record a command of this caller with `key` is kept under: a
    /// key's in the merchant's own keyspace, a token's in its principal's
    /// (kind, issuer and `sub`), so two customers' keys never meet, and a
    /// customer's key never replays an answer made for a merchant key.
    pub fn record_id(&self, key: &IdempotencyKey) -> RecordId {
        match &self.principal {
            Principal::Key { .. } => RecordId::merchant(self.merchant_id, key),
            Principal::Token { role, sub, issuer } => {
                RecordId::principal(self.merchant_id, role.as_str(), issuer, sub, key)
            }
        }
    }

    /// The audit trail's and the events' actor for this request.
    pub fn actor(&self) -> crate::audit::Actor {
        let request_id = crate::telemetry::request_id().map(|id| id.to_string());
        match &self.principal {
            Principal::Key { key_id } => crate::audit::Actor::key(*key_id, request_id),
            Principal::Token { role, sub, issuer } => {
                let kind = match role {
                    Role::Customer => crate::audit::ActorKind::Customer,
                    Role::Seller => crate::audit::ActorKind::Seller,
                };
                crate::audit::Actor::token(kind, sub, issuer, request_id)
            }
        }
    }

    /// A list's `customer_id` filter for this caller: a customer's is
    /// forced to its own id; `Err(())` when it asked for another's, which
    /// answers an empty list (no enumeration, no error that tells).
    pub fn list_customer(&self, asked: Option<String>) -> Result<Option<String>, ()> {
        match (self.customer(), asked) {
            (None, asked) => Ok(asked),
            (Some(own), Some(asked)) if asked != own => Err(()),
            (Some(own), _) => Ok(Some(own.to_string())),
        }
    }
}

/// The merchant behind the request; see [`authenticate_caller`]. Only for
/// routes whose customers' ownership (if any) is the path's, which
/// [`authenticate_caller`] checks: a handler of a route that checks a
/// body or a list must hold the [`Caller`] itself.
pub(crate) async fn authenticate(state: &AppState, req: &HttpRequest) -> Result<Uuid, Problem> {
    let caller = authenticate_caller(state, req).await?;
    let pattern = req.match_pattern().unwrap_or_default();
    if caller.customer().is_some() {
        if let Access::Needs(_, Customers::Owning(how)) =
            routes::access(&pattern, req.method().as_str())
        {
            // Path ownership was checked with the caller (`owns_path`).
            let by_path = matches!(
                how,
                Ownership::OrderInPath | Ownership::PaymentInPath | Ownership::CustomerInPath
            );
            if !by_path {
                // Fail closed: a handler that would drop a customer's
                // ownership check is a bug, never a read of others' data.
                return Err(Problem::internal_from(format_args!(
                    "{pattern} checks {how:?} but its handler reads only the merchant"
                )));
            }
        }
    }
    Ok(caller.merchant_id)
}

/// The credentials of `Authorization: Bearer <key or token>`. The scheme
/// is case-insensitive (RFC 7235 section 2.1): clients and proxies that
/// send `bearer` are not refused.
fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, credentials) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    Some(credentials.trim()).filter(|k| !k.is_empty())
}

/// The caller behind `Authorization: Bearer <key or token>` (`401`
/// otherwise: `invalid_token` for a token; `429` first for an address
/// whose credentials keep authenticating nobody), allowed by the route table to
/// call this route (`403 insufficient_scope` otherwise), admitted by its
/// rate limit (`429` otherwise), and owning the path's object if it is a
/// customer (`404` otherwise), before anything else is read or written.
pub(crate) async fn authenticate_caller(
    state: &AppState,
    req: &HttpRequest,
) -> Result<Caller, Problem> {
    let unauthorized = || {
        Problem::new(
            ProblemCode::Unauthorized,
            "send a valid API key as Authorization: Bearer <key>",
        )
    };
    let bearer = bearer(req).ok_or_else(unauthorized)?;
    let address = req.peer_addr().map(|peer| peer.ip());
    unfailing_address(state, address)?;
    let caller = if crate::identity::token::is_token(bearer) {
        token_caller(state, bearer, address).await?
    } else {
        match key_caller(state, bearer).await? {
            Some(caller) => caller,
            None => {
                failed(state, address);
                return Err(unauthorized());
            }
        }
    };
    let pattern = req.match_pattern().unwrap_or_default();
    let method = req.method().as_str();
    let Access::Needs(scope, customers) = routes::access(&pattern, method) else {
        return admit(state, caller);
    };
    let refused = |whose: &str| {
        Problem::new(
            ProblemCode::InsufficientScope,
            format!(
                "{whose} lacks the `{}` scope, which {method} {pattern} needs",
                scope.as_str()
            ),
        )
    };
    let mut owning = None;
    match (&caller.principal, caller.customer()) {
        (Principal::Key { .. }, _) if !caller.scopes.has(scope) => {
            return Err(refused("this API key"))
        }
        (Principal::Token { .. }, None) if !caller.scopes.has(scope) => {
            return Err(refused("a seller's token"))
        }
        (_, Some(_)) => match customers {
            Customers::Refused => {
                return Err(Problem::new(
                    ProblemCode::InsufficientScope,
                    format!("a customer's token cannot call {method} {pattern}"),
                ))
            }
            Customers::Owning(how) => owning = Some(how),
        },
        _ => {}
    }
    // Admitted before the ownership query: a `404` costs that query, so
    // probing ids must be throttled like any other request.
    let caller = admit(state, caller)?;
    if let (Some(how), Some(customer)) = (owning, caller.customer()) {
        owns_path(state, req, caller.merchant_id, customer, how).await?;
    }
    Ok(caller)
}

/// `429` for an address whose credentials keep authenticating nobody
/// (`ONCEPAY_AUTH_FAILURE_RATE_LIMIT_*`), before its next ones are looked
/// up: an unknown key costs a database query, as does a token naming an
/// issuer not seen lately, and neither has a merchant whose limit could
/// count it. Every request of such an address waits, good credentials
/// too: which of its credentials are good is what it must not be able to
/// probe at speed.
fn unfailing_address(state: &AppState, address: Option<std::net::IpAddr>) -> Result<(), Problem> {
    let Some(wait) = address.and_then(|ip| state.auth_failures.waiting(&ip, None)) else {
        return Ok(());
    };
    state.ctx.metrics.rate_limited.inc();
    let seconds = crate::rate_limit::retry_after_secs(wait);
    Err(Problem::new(
        ProblemCode::RateLimited,
        format!("too many failed authentications from this address; retry in {seconds} s"),
    )
    .retry_after(seconds))
}

/// Counts a credential that authenticated nobody against its address.
fn failed(state: &AppState, address: Option<std::net::IpAddr>) {
    if let Some(ip) = address {
        // Over the limit or not, the next request is what
        // `unfailing_address` refuses.
        let _ = state.auth_failures.check(ip, None);
    }
}

/// The rate limit, after the checks that read nothing (a request refused
/// for its scope is not counted) and before any that queries the database.
fn admit(state: &AppState, caller: Caller) -> Result<Caller, Problem> {
    if let Err(wait) = state.rate_limits.check(caller.merchant_id, caller.limit) {
        state.ctx.metrics.rate_limited.inc();
        let seconds = crate::rate_limit::retry_after_secs(wait);
        return Err(Problem::new(
            ProblemCode::RateLimited,
            format!("too many requests for this merchant; retry in {seconds} s"),
        )
        .retry_after(seconds));
    }
    Ok(caller)
}

async fn key_caller(state: &AppState, key: &str) -> Result<Option<Caller>, Problem> {
    let hash = crate::api_keys::hash(key);
    let found = match state.keys.get(&hash) {
        Some(caller) => caller,
        None => {
            let ticket = state.keys.ticket();
            let pool = state.ctx.pool.clone();
            let found = on_service_runtime(state, async move {
                store::merchants::merchant_for_key(&pool, &hash)
                    .await
                    .map_err(store_problem)
            })
            .await?;
            let Some(found) = found else {
                return Ok(None);
            };
            let caller = crate::api_keys::Caller::from(found);
            state.keys.put(hash, caller, ticket);
            caller
        }
    };
    Ok(Some(Caller {
        merchant_id: found.merchant_id,
        scopes: found.scopes,
        principal: Principal::Key {
            key_id: found.key_id,
        },
        limit: found.limit,
    }))
}

/// `401 invalid_token`: RFC 6750's error, with `WWW-Authenticate`
/// (added where problems become responses, `http::mod`).
fn invalid_token(why: impl std::fmt::Display) -> Problem {
    Problem::new(ProblemCode::InvalidToken, why.to_string())
}

async fn token_caller(
    state: &AppState,
    token: &str,
    address: Option<std::net::IpAddr>,
) -> Result<Caller, Problem> {
    use crate::identity::token::Refusal;
    use crate::identity::Rejected;
    let verifier = state.identity.clone();
    let token = token.to_string();
    let verified =
        on_service_runtime(state, async move { Ok(verifier.verify(&token).await) }).await?;
    let verified = match verified {
        Ok(verified) => verified,
        // Not the token's fault: the identity provider could not be
        // reached and no key of it is held yet. A client that signed
        // its user out on a `401` here would be wrong.
        Err(Rejected::Invalid(Refusal::KeysUnavailable)) => {
            return Err(Problem::unavailable("the identity provider's key set"))
        }
        Err(Rejected::Invalid(why)) => {
            // No merchant to count it against, as for an unknown key.
            if why == Refusal::UnknownIssuer {
                failed(state, address);
            }
            return Err(invalid_token(why));
        }
        Err(Rejected::Store(e)) => return Err(store_problem(e)),
    };
    let Some(role) = verified.role else {
        // Authenticated, with no right here: a `403`, not a `401`.
        return Err(Problem::new(
            ProblemCode::InsufficientScope,
            "the token's roles claim grants neither customer nor seller",
        ));
    };
    Ok(Caller {
        merchant_id: verified.merchant_id,
        scopes: role.scopes(),
        principal: Principal::Token {
            role,
            sub: verified.sub,
            issuer: verified.issuer,
        },
        // The merchant's own limit, as its keys carry: a token counts
        // against its merchant's limit, never the process default instead.
        limit: verified.limit,
    })
}

/// The path's `{customer_id}` as the balance handlers read it: the one
/// value both the ownership check and the handler use. Percent-decoded
/// whole, as `web::Path` decodes; `match_info().get` keeps `%2B`, `%2F`
/// and `%25` encoded, and an ownership check on that spelling let the
/// `sub` `alice%2Bshop` read the balance of `alice+shop` while
/// `team/alice` could not read its own (issue 54). Empty if the route has
/// no such segment, which no customer id is.
pub(crate) fn path_customer(req: &HttpRequest) -> String {
    #[derive(serde::Deserialize)]
    struct InPath {
        customer_id: String,
    }
    req.match_info()
        .load::<InPath>()
        .map(|p| p.customer_id)
        .unwrap_or_default()
}

/// The path's `{id}` as a UUID, decoded as the handlers' `web::Path`
/// decodes it (see [`path_customer`]): ownership is decided on the id the
/// handler then reads.
fn path_id(req: &HttpRequest) -> Option<Uuid> {
    #[derive(serde::Deserialize)]
    struct InPath {
        id: String,
    }
    let InPath { id } = req.match_info().load::<InPath>().ok()?;
    Uuid::parse_str(&id).ok()
}

/// A customer owns the path's object, or the request answers the `404`
/// another merchant's object would.
async fn owns_path(
    state: &AppState,
    req: &HttpRequest,
    merchant_id: Uuid,
    customer: &str,
    how: Ownership,
) -> Result<(), Problem> {
    let (code, what) = match how {
        // The path names the customer, as a new order's body does.
        Ownership::CustomerInPath => {
            return if path_customer(req) == customer {
                Ok(())
            } else {
                Err(Problem::new(
                    ProblemCode::NotOwner,
                    "a customer's token reads only its own balance: customer_id must be the token's sub",
                )
                .with_field("customer_id"))
            };
        }
        Ownership::OrderInPath => (ProblemCode::OrderNotFound, "order"),
        Ownership::PaymentInPath => (ProblemCode::PaymentNotFound, "payment"),
        // Checked where the body or the query is read.
        Ownership::CustomerInBody | Ownership::OrderInBody | Ownership::OwnList => return Ok(()),
    };
    let id = path_id(req).ok_or_else(|| Problem::not_found(code, what))?;
    let pool = state.ctx.pool.clone();
    let owner = on_service_runtime(state, async move {
        match how {
            Ownership::PaymentInPath => store::payments::customer_of(&pool, merchant_id, id).await,
            _ => store::orders::customer_of(&pool, merchant_id, id).await,
        }
        .map_err(store_problem)
    })
    .await?;
    if owner.as_deref() == Some(customer) {
        Ok(())
    } else {
        Err(Problem::not_found(code, what))
    }
}

/// A customer owns what a command's body names (`routes::Ownership`):
/// the `customer_id` of a new order is its own (`403 not_owner`), the
/// order of a new payment is its own (`404 order_not_found`); and it sets
/// none of the merchant's fields (`403 insufficient_scope`,
/// `routes::MERCHANT_FIELDS`). A field
/// missing or of the wrong shape is left to the command's parser, whose
/// `400` says so. Checked before the key is claimed: a refused request
/// consumes nothing.
pub(crate) async fn owns_body(
    state: &AppState,
    req: &HttpRequest,
    caller: &Caller,
    body: &Value,
) -> Result<(), Problem> {
    let Some(customer) = caller.customer() else {
        return Ok(());
    };
    let pattern = req.match_pattern().unwrap_or_default();
    let Access::Needs(_, Customers::Owning(how)) = routes::access(&pattern, req.method().as_str())
    else {
        // `authenticate_caller` refused it already; never reached.
        return Err(Problem::new(
            ProblemCode::InsufficientScope,
            "a customer's token cannot call this",
        ));
    };
    match how {
        Ownership::CustomerInBody => match body.get("customer_id").and_then(Value::as_str) {
            Some(other) if other != customer => return Err(Problem::new(
                ProblemCode::NotOwner,
                "a customer's token orders only for itself: customer_id must be the token's sub",
            )
            .with_field("customer_id")),
            _ => {}
        },
        Ownership::OrderInBody => {
            if let Some(order_id) = body
                .get("order_id")
                .and_then(Value::as_str)
                .and_then(|raw| Uuid::parse_str(raw).ok())
            {
                let pool = state.ctx.pool.clone();
                let merchant_id = caller.merchant_id;
                let owner = on_service_runtime(state, async move {
                    store::orders::customer_of(&pool, merchant_id, order_id)
                        .await
                        .map_err(store_problem)
                })
                .await?;
                if owner.as_deref() != Some(customer) {
                    return Err(Problem::not_found(ProblemCode::OrderNotFound, "order"));
                }
            }
        }
        Ownership::OrderInPath if pattern == CANCEL_ORDER && req.method().as_str() == "POST" => {
            customer_may_cancel(state, req, caller).await?;
        }
        Ownership::OrderInPath
        | Ownership::PaymentInPath
        | Ownership::OwnList
        | Ownership::CustomerInPath => {}
    }
    merchant_fields(&pattern, req.method().as_str(), body)
}

/// The route of a cancel, which a customer may call for an unpaid order
/// only.
const CANCEL_ORDER: &str = "/orders/{id}/cancel";

/// A customer's cancel of a paid order would refund it, and refunds are
/// the merchant's: `403 insufficient_scope` before the key is claimed, as
/// every other refusal of a right, consuming nothing. The command decides
/// again under the order's lock (a payment may succeed in between), where
/// the refusal is `order_not_cancellable` and kept under the key.
async fn customer_may_cancel(
    state: &AppState,
    req: &HttpRequest,
    caller: &Caller,
) -> Result<(), Problem> {
    let Some(order_id) = path_id(req) else {
        return Ok(());
    };
    let pool = state.ctx.pool.clone();
    let merchant_id = caller.merchant_id;
    let status = on_service_runtime(state, async move {
        store::orders::status_of(&pool, merchant_id, order_id)
            .await
            .map_err(store_problem)
    })
    .await?;
    match status.map(|s| s.cancel_plan()) {
        Some(crate::domain::order::CancelPlan::RefundThenCancel) => Err(Problem::new(
            ProblemCode::InsufficientScope,
            "a customer's token cannot cancel a paid order: that would refund it, and refunds are the merchant's",
        )),
        _ => Ok(()),
    }
}

/// `403 insufficient_scope` naming the first of the route's merchant's
/// fields (`routes::MERCHANT_FIELDS`) a customer's body sets; `null` sets
/// nothing.
fn merchant_fields(pattern: &str, method: &str, body: &Value) -> Result<(), Problem> {
    let set = routes::merchant_fields(pattern, method)
        .iter()
        .find(|field| body.get(**field).is_some_and(|v| !v.is_null()));
    match set {
        Some(field) => Err(Problem::new(
            ProblemCode::InsufficientScope,
            format!("`{field}` is the merchant's to choose: a customer's token cannot set it"),
        )
        .with_field(*field)),
        None => Ok(()),
    }
}
