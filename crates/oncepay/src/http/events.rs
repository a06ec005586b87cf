//! `GET /events`, `GET /events/{id}`, `POST /events/{id}/redeliver`, and
//! the trails `GET /orders/{id}/events`, `/payments/{id}/events`,
//! `/refunds/{id}/events`: what the outbox holds, as the merchant's
//! receivers got it, with who made each change.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::lists::{list, FilterKind, ListSpec};
use super::{authenticate, ok_json, on_service_runtime, path_uuid, AppState};
use crate::domain::event::EventType;
use crate::idempotency::store_problem;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

fn event_types() -> Vec<&'static str> {
    EventType::ALL.iter().map(|t| t.as_str()).collect()
}

/// `GET /events`: newest first, a page at a time, by `type` and `object_id`.
pub async fn list_events(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const SPEC: ListSpec = ListSpec {
        statuses: &[],
        filters: &[
            ("type", FilterKind::OneOf(event_types)),
            ("object_id", FilterKind::Id),
        ],
    };
    list(
        state,
        req,
        query,
        &SPEC,
        |pool, merchant, page| async move { store::events::list(&pool, merchant, &page).await },
    )
    .await
}

/// The caller's merchant and the path's event id (`404` if not a UUID).
async fn event_of_path(
    state: &AppState,
    req: &HttpRequest,
    path: &str,
) -> Result<(uuid::Uuid, uuid::Uuid), Problem> {
    let merchant = authenticate(state, req).await?;
    Ok((
        merchant,
        path_uuid(path, ProblemCode::EventNotFound, "event")?,
    ))
}

fn event_not_found() -> Problem {
    Problem::not_found(ProblemCode::EventNotFound, "event")
}

/// `GET /events/{id}`: the event, where its delivery to each endpoint
/// stands, and every attempt.
pub async fn get_event(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let (merchant, id) = event_of_path(&state, &req, &path).await?;
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(&state, async move {
        let Some(event) = store::events::get(&pool, merchant, id)
            .await
            .map_err(store_problem)?
        else {
            return Ok(None);
        };
        let (deliveries, attempts) = store::deliveries::of_event(&pool, id)
            .await
            .map_err(store_problem)?;
        Ok(Some((event, deliveries, attempts)))
    })
    .await?;
    let (event, deliveries, attempts) = found.ok_or_else(event_not_found)?;
    let mut body = json!(event);
    body["deliveries"] = json!(deliveries);
    body["attempts"] = json!(attempts);
    ok_json(&body)
}

/// `POST /events/{id}/redeliver`: sends the event again to every endpoint
/// now subscribed to its type, with the same id (receivers that saw it
/// drop it), on a fresh schedule. `202` with how many deliveries that
/// queued. Repeating it queues the same deliveries again: it needs no
/// `Idempotency-Key`, since its only effect is a delivery receivers
/// deduplicate.
pub async fn redeliver(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let caller = super::authenticate_caller(&state, &req).await?;
    let merchant = caller.merchant_id;
    let id = path_uuid(&path, ProblemCode::EventNotFound, "event")?;
    let pool = state.ctx.pool.clone();
    let actor = caller.actor();
    let queued = on_service_runtime(&state, async move {
        store::deliveries::redeliver(&pool, merchant, id, &actor)
            .await
            .map_err(store_problem)
    })
    .await?
    .ok_or_else(event_not_found)?;
    let body = serde_json::to_vec(&json!({"id": id, "deliveries": queued}))
        .map_err(Problem::internal_from)?;
    Ok(HttpResponse::Accepted()
        .content_type("application/json")
        .body(body))
}

/// A trail: every event of an object, answered `{"data": […]}`; an object
/// with no event yet (an order awaiting payment) answers an empty list once
/// it is known to exist.
async fn trail(state: &AppState, req: &HttpRequest, raw_id: &str, kind: Trail) -> Reply {
    let merchant = authenticate(state, req).await?;
    let (code, what) = kind.not_found();
    let id = path_uuid(raw_id, code, what)?;
    let pool = state.ctx.pool.clone();
    let events = on_service_runtime(state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        let exists = match kind {
            Trail::Order => store::orders::get(&mut conn, merchant, id)
                .await
                .map(|o| o.is_some()),
            Trail::Payment => store::payments::get(&mut conn, merchant, id)
                .await
                .map(|p| p.is_some()),
            Trail::Refund => store::refunds::get(&mut conn, merchant, id)
                .await
                .map(|r| r.is_some()),
        }
        .map_err(store_problem)?;
        drop(conn);
        if !exists {
            return Ok(None);
        }
        let of = match kind {
            Trail::Order => store::events::TrailOf::Order,
            Trail::Payment | Trail::Refund => store::events::TrailOf::Object,
        };
        let events = store::events::trail(&pool, merchant, of, id).await;
        events.map(Some).map_err(store_problem)
    })
    .await?
    .ok_or_else(|| Problem::not_found(code, what))?;
    ok_json(&json!({"data": events}))
}

/// Whose trail.
#[derive(Clone, Copy)]
pub(super) enum Trail {
    /// An order's, with its payments' and refunds'.
    Order,
    /// A payment attempt's.
    Payment,
    /// A refund's.
    Refund,
}

impl Trail {
    fn not_found(self) -> (ProblemCode, &'static str) {
        match self {
            Trail::Order => (ProblemCode::OrderNotFound, "order"),
            Trail::Payment => (ProblemCode::PaymentNotFound, "payment"),
            Trail::Refund => (ProblemCode::RefundNotFound, "refund"),
        }
    }
}

/// `GET /orders/{id}/events`: the order's history, its payments' and
/// refunds' included, oldest first.
pub(super) async fn order_trail(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    trail(&state, &req, &path, Trail::Order).await
}

/// `GET /payments/{id}/events`: every transition, in sequence.
pub(super) async fn payment_trail(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    trail(&state, &req, &path, Trail::Payment).await
}

/// `GET /refunds/{id}/events`: every transition, in sequence.
pub(super) async fn refund_trail(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    trail(&state, &req, &path, Trail::Refund).await
}
