//! Customer balances: `GET /customers/{customer_id}/balance`, its credits,
//! debits, holds and transactions, `GET /balance_transactions/{id}` and
//! `/balance_holds/{id}` with its capture and release. Moves go through
//! the commands of `commands::balances`; reads go straight to the store.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::auth::path_customer;
use super::lists::{page_request, ListSpec};
use super::resources::run_command;
use super::{
    authenticate, authenticate_caller, idempotency_key, ok_json, on_service_runtime, path_uuid,
    read_body, AppState,
};
use crate::commands::balances::{
    customer_id, CaptureBalanceHold, ChargeBalance, CreateBalanceHold, CreditBalance,
    ReleaseBalanceHold,
};
use crate::commands::{Command, CommandInput};
use crate::idempotency::{store_problem, Fingerprint};
use crate::input::parse_body;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// A balance command, in the order of checks of every money command
/// (`resources::money_command`), with the caller as its actor (credits
/// and debits are in the audit trail).
async fn balance_command<C: Command + 'static>(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
    path_id: Result<Option<uuid::Uuid>, Problem>,
    path_text: Option<&str>,
    body_optional: bool,
) -> Reply {
    let caller = authenticate_caller(state, req).await?;
    let path_id = path_id?;
    let path_text = path_text.map(customer_id).transpose()?;
    let key = idempotency_key(req)?;
    let bytes = read_body(state, req, payload).await?;
    let input = CommandInput {
        path_id,
        path_text,
        body: parse_body(&bytes, body_optional)?,
        actor: Some(caller.actor()),
    };
    let id = caller.record_id(&key);
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    run_command::<C>(state, id, fingerprint, input).await
}

/// `POST /customers/{customer_id}/balance/credits`.
pub async fn credit(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let customer = path_customer(&req);
    balance_command::<CreditBalance>(&state, &req, payload, Ok(None), Some(&customer), false).await
}

/// `POST /customers/{customer_id}/balance/debits`.
pub async fn debit(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let customer = path_customer(&req);
    balance_command::<ChargeBalance>(&state, &req, payload, Ok(None), Some(&customer), false).await
}

/// `POST /customers/{customer_id}/balance/holds`.
pub async fn hold(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let customer = path_customer(&req);
    balance_command::<CreateBalanceHold>(&state, &req, payload, Ok(None), Some(&customer), false)
        .await
}

fn hold_id(raw: &str) -> Result<Option<uuid::Uuid>, Problem> {
    path_uuid(raw, ProblemCode::BalanceHoldNotFound, "balance hold").map(Some)
}

/// `POST /balance_holds/{id}/capture`.
pub async fn capture(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    balance_command::<CaptureBalanceHold>(&state, &req, payload, hold_id(&path), None, true).await
}

/// `POST /balance_holds/{id}/release`.
pub async fn release(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    balance_command::<ReleaseBalanceHold>(&state, &req, payload, hold_id(&path), None, true).await
}

/// A `currency` of a query: three upper-case letters. A code no balance
/// can be in (`AAA`) reads as a balance that never moved, as a customer
/// who never had one does: a read never says which codes exist.
fn currency_code(raw: &str) -> Result<String, Problem> {
    if raw.len() == 3 && raw.bytes().all(|b| b.is_ascii_uppercase()) {
        return Ok(raw.to_string());
    }
    Err(Problem::invalid_field(
        "currency",
        "must be an upper-case ISO 4217 currency code, such as USD or EUR",
    ))
}

/// The `currency` a query names: required.
fn currency_of(query: &HashMap<String, String>) -> Result<String, Problem> {
    let raw = query
        .get("currency")
        .ok_or_else(|| Problem::invalid_field("currency", "is required"))?;
    currency_code(raw)
}

/// `GET /customers/{customer_id}/balance?currency=`: zeros for a customer
/// whose balance never moved.
pub async fn get_balance(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    // The very value `authenticate` checked a customer's ownership on.
    let customer = customer_id(&path_customer(&req))?;
    if let Some(unknown) = query.keys().find(|k| k.as_str() != "currency") {
        return Err(Problem::invalid_field(
            unknown.clone(),
            "is not a parameter of this endpoint",
        ));
    }
    let currency = currency_of(&query)?;
    let pool = state.ctx.pool.clone();
    let balance = on_service_runtime(&state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        store::balances::balance(&mut conn, merchant, &customer, &currency)
            .await
            .map_err(store_problem)
    })
    .await?;
    ok_json(&balance)
}

/// `GET /customers/{customer_id}/balance/transactions`: newest first, a
/// page at a time, optionally of one currency.
pub async fn list_transactions(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const SPEC: ListSpec = ListSpec {
        statuses: &[],
        filters: &[],
    };
    let merchant = authenticate(&state, &req).await?;
    // The very value `authenticate` checked a customer's ownership on.
    let customer = customer_id(&path_customer(&req))?;
    if query.contains_key("customer_id") {
        return Err(Problem::invalid_field(
            "customer_id",
            "is the path's; not a parameter of this list",
        ));
    }
    let mut common = query.into_inner();
    let currency = common
        .remove("currency")
        .map(|c| currency_code(&c))
        .transpose()?;
    let mut page = page_request(&common, &SPEC)?;
    page.customer_id = Some(customer);
    let pool = state.ctx.pool.clone();
    let (data, has_more) = on_service_runtime(&state, async move {
        store::balances::list(&pool, merchant, &page, currency)
            .await
            .map_err(store_problem)
    })
    .await?;
    ok_json(&json!({"data": data, "has_more": has_more}))
}

/// `GET /balance_transactions/{id}`.
pub async fn get_transaction(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    let code = ProblemCode::BalanceTransactionNotFound;
    let id = path_uuid(&path, code, "balance transaction")?;
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(&state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        store::balances::transaction(&mut conn, merchant, id)
            .await
            .map_err(store_problem)
    })
    .await?;
    match found {
        Some(t) => ok_json(&t),
        None => Err(Problem::not_found(code, "balance transaction")),
    }
}

/// `GET /balance_holds/{id}`: its status as of now (a hold past its
/// expiry reads `expired` before the sweeper voids it).
pub async fn get_hold(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    let code = ProblemCode::BalanceHoldNotFound;
    let id = path_uuid(&path, code, "balance hold")?;
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(&state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        store::balances::hold(&mut conn, merchant, id)
            .await
            .map_err(store_problem)
    })
    .await?;
    match found {
        Some(h) => ok_json(&h),
        None => Err(Problem::not_found(code, "balance hold")),
    }
}
