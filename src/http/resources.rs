//! Handlers of orders, payments and refunds: money commands go through
//! [`money_command`], reads go straight to the store.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{answer, authenticate, idempotency_key, ok_json, path_uuid, read_body, AppState};
use crate::commands::orders::{CancelOrder, CreateOrder};
use crate::commands::payments::CreatePayment;
use crate::commands::refunds::CreateRefund;
use crate::commands::{self, Command, CommandInput};
use crate::idempotency::{store_problem, Fingerprint, RecordId};
use crate::input::parse_body;
use crate::problem::Problem;
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// Every money command, in one order of checks: `401` auth, `400` key,
/// `413` size, `400` JSON and shape, `422` rules (none of which touch the
/// key), then the idempotency engine.
async fn money_command<C: Command>(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
    path_id: Result<Option<uuid::Uuid>, Problem>,
    body_optional: bool,
) -> Reply {
    let merchant_id = authenticate(state, req).await?;
    let path_id = path_id?;
    let key = idempotency_key(req)?;
    let bytes = read_body(req, payload, state.max_body_bytes).await?;
    let input = CommandInput {
        path_id,
        body: parse_body(&bytes, body_optional)?,
    };
    let command = C::parse(&input)?;
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    let id = RecordId {
        merchant_id,
        key: key.as_str().to_string(),
    };
    let reply = commands::run(&state.ctx, id, fingerprint, &input, &command).await?;
    Ok(answer(reply))
}

pub async fn create_order(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Reply {
    money_command::<CreateOrder>(&state, &req, payload, Ok(None), false).await
}

pub async fn cancel_order(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, "order_not_found", "order").map(Some);
    money_command::<CancelOrder>(&state, &req, payload, id, true).await
}

pub async fn create_payment(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Reply {
    money_command::<CreatePayment>(&state, &req, payload, Ok(None), false).await
}

pub async fn create_refund(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, "payment_not_found", "payment").map(Some);
    money_command::<CreateRefund>(&state, &req, payload, id, true).await
}

/// Runs a scoped read with a pooled connection.
async fn read<T, F>(
    state: &AppState,
    req: &HttpRequest,
    raw_id: &str,
    code: &'static str,
    what: &str,
    f: F,
) -> Reply
where
    T: serde::Serialize,
    F: for<'c> FnOnce(
        &'c mut sqlx::PgConnection,
        uuid::Uuid,
        uuid::Uuid,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Option<T>, store::StoreError>> + 'c>,
    >,
{
    let merchant_id = authenticate(state, req).await?;
    let id = path_uuid(raw_id, code, what)?;
    let mut conn = state
        .ctx
        .pool
        .acquire()
        .await
        .map_err(|e| store_problem(e.into()))?;
    match f(&mut conn, merchant_id, id).await.map_err(store_problem)? {
        Some(value) => ok_json(&value),
        None => Err(Problem::not_found(code, what)),
    }
}

pub async fn get_order(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        "order_not_found",
        "order",
        |c, m, id| Box::pin(store::orders::get(c, m, id)),
    )
    .await
}

pub async fn get_payment(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        "payment_not_found",
        "payment",
        |c, m, id| Box::pin(store::payments::get(c, m, id)),
    )
    .await
}

pub async fn get_refund(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        "refund_not_found",
        "refund",
        |c, m, id| Box::pin(store::refunds::get(c, m, id)),
    )
    .await
}

/// `GET /orders/{id}/payments`: `{"data": [Payment, ...]}`, oldest first.
pub async fn list_payments(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        "order_not_found",
        "order",
        |c, m, id| {
            Box::pin(async move {
                if store::orders::get(c, m, id).await?.is_none() {
                    return Ok(None);
                }
                let data = store::payments::list_for_order(c, m, id).await?;
                Ok(Some(serde_json::json!({ "data": data })))
            })
        },
    )
    .await
}
