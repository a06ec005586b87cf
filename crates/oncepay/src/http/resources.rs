//! Handlers of orders, payments, refunds and disputes: money commands go through
//! [`money_command`], reads go straight to the store.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{
    answer, auth, authenticate, authenticate_caller, idempotency_key, ok_json, on_service_runtime,
    path_uuid, read_body, AppState,
};
use crate::commands::captures::{CapturePayment, VoidPayment};
use crate::commands::orders::{CancelOrder, CreateOrder};
use crate::commands::payments::CreatePayment;
use crate::commands::refunds::CreateRefund;
use crate::commands::{self, Command, CommandInput};
use crate::idempotency::{store_problem, Fingerprint, RecordId};
use crate::input::parse_body;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// Every money command, in one order of checks: `401` auth, `400` key,
/// `413` size, `400` JSON and shape, `422` rules (none of which touch the
/// key), then the idempotency engine.
pub(super) async fn money_command<C: Command + 'static>(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
    path_id: Result<Option<uuid::Uuid>, Problem>,
    body_optional: bool,
) -> Reply {
    let caller = authenticate_caller(state, req).await?;
    let path_id = path_id?;
    let key = idempotency_key(req)?;
    let bytes = read_body(state, req, payload).await?;
    let input = CommandInput {
        path_id,
        path_text: None,
        body: parse_body(&bytes, body_optional)?,
        // Stored with the record: the events of the command's changes
        // name who asked, even when the reconciler finishes it.
        actor: Some(caller.actor()),
    };
    auth::owns_body(state, req, &caller, &input.body).await?;
    let id = caller.record_id(&key);
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    run_command::<C>(state, id, fingerprint, input).await
}

/// Parses a command's input and runs it through the engine under `id`
/// (merchant and key), answering repeats from memory when it can.
pub(super) async fn run_command<C: Command + 'static>(
    state: &AppState,
    id: RecordId,
    fingerprint: Fingerprint,
    input: CommandInput,
) -> Reply {
    let command = C::parse(&input)?;
    if let Some(response) = state.ctx.engine.replay_from_memory(&id, &fingerprint)? {
        return Ok(answer(commands::Answer {
            response,
            replayed: true,
        }));
    }
    let ctx = state.ctx.clone();
    let reply = on_service_runtime(state, async move {
        commands::run(&ctx, id, fingerprint, &input, &command).await
    })
    .await?;
    Ok(answer(reply))
}

pub async fn create_order(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Reply {
    money_command::<CreateOrder>(&state, &req, payload, Ok(None), false).await
}

pub(crate) async fn cancel_order(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, ProblemCode::OrderNotFound, "order").map(Some);
    money_command::<CancelOrder>(&state, &req, payload, id, true).await
}

pub async fn create_payment(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Reply {
    money_command::<CreatePayment>(&state, &req, payload, Ok(None), false).await
}

pub(crate) async fn create_refund(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, ProblemCode::PaymentNotFound, "payment").map(Some);
    money_command::<CreateRefund>(&state, &req, payload, id, true).await
}

pub(crate) async fn capture_payment(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, ProblemCode::PaymentNotFound, "payment").map(Some);
    money_command::<CapturePayment>(&state, &req, payload, id, true).await
}

pub(crate) async fn void_payment(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let id = path_uuid(&path, ProblemCode::PaymentNotFound, "payment").map(Some);
    money_command::<VoidPayment>(&state, &req, payload, id, true).await
}

/// Runs a scoped read on the service runtime.
async fn read<T, F, Fut>(
    state: &AppState,
    req: &HttpRequest,
    raw_id: &str,
    code: ProblemCode,
    what: &'static str,
    query: F,
) -> Reply
where
    T: serde::Serialize + Send + 'static,
    F: FnOnce(sqlx::PgPool, uuid::Uuid, uuid::Uuid) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<T>, store::StoreError>> + Send + 'static,
{
    let merchant_id = authenticate(state, req).await?;
    let id = path_uuid(raw_id, code, what)?;
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(state, async move {
        query(pool, merchant_id, id).await.map_err(store_problem)
    })
    .await?;
    match found {
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
        ProblemCode::OrderNotFound,
        "order",
        |pool, m, id| async move { store::orders::get(&mut *pool.acquire().await?, m, id).await },
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
        ProblemCode::PaymentNotFound,
        "payment",
        |pool, m, id| async move {
            let mut conn = pool.acquire().await?;
            let mut found = store::payments::get(&mut conn, m, id).await?;
            if let Some(payment) = found.as_mut() {
                store::disputes::attach(&mut conn, std::slice::from_mut(payment)).await?;
            }
            Ok(found)
        },
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
        ProblemCode::RefundNotFound,
        "refund",
        |pool, m, id| async move { store::refunds::get(&mut *pool.acquire().await?, m, id).await },
    )
    .await
}

/// `GET /orders/{id}/payments`: a JSON array of the order's attempts, oldest first.
pub async fn list_payments(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        ProblemCode::OrderNotFound,
        "order",
        |pool, m, id| async move {
            let mut conn = pool.acquire().await?;
            if store::orders::get(&mut conn, m, id).await?.is_none() {
                return Ok(None);
            }
            let mut payments = store::payments::list_for_order(&mut conn, m, id).await?;
            store::disputes::attach(&mut conn, &mut payments).await?;
            Ok(Some(payments))
        },
    )
    .await
}

pub async fn get_dispute(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    read(
        &state,
        &req,
        &path,
        ProblemCode::DisputeNotFound,
        "dispute",
        |pool, m, id| async move { store::disputes::get(&mut *pool.acquire().await?, m, id).await },
    )
    .await
}
