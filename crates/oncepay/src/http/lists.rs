//! `GET /orders`, `GET /payments`, `GET /refunds`: the merchant's rows,
//! newest first, a page at a time (`{"data": […], "has_more": …}`), with
//! cursors (`starting_after` / `ending_before` take an object id) and
//! filters. A bad parameter is a `400` naming it. Both cursors at once
//! select the rows between them.

use std::collections::HashMap;
use std::future::Future;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::{authenticate, ok_json, on_service_runtime, AppState};
use crate::idempotency::store_problem;
use crate::problem::Problem;
use crate::store::pages::{Cursor, PageRequest};
use crate::store::{self, StoreError};

type Reply = Result<HttpResponse, Problem>;

/// The most rows a page holds.
pub const MAX_LIMIT: i64 = 100;

/// Reads the query string into a page request; `statuses` are the values
/// `status` may take for this resource.
fn page_request(
    query: &HashMap<String, String>,
    statuses: &[&str],
) -> Result<PageRequest, Problem> {
    const KNOWN: &[&str] = &[
        "limit",
        "starting_after",
        "ending_before",
        "status",
        "customer_id",
        "created_gte",
        "created_lte",
    ];
    if let Some(unknown) = query.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(Problem::invalid_field(
            unknown.clone(),
            "is not a parameter of this list",
        ));
    }
    let limit = match query.get("limit") {
        None => 10,
        Some(v) => match v.parse::<i64>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(Problem::invalid_field(
                    "limit",
                    "must be an integer from 1 to 100",
                ))
            }
        },
    };
    let id = |name: &str| -> Result<Option<Uuid>, Problem> {
        query
            .get(name)
            .map(|v| {
                Uuid::parse_str(v)
                    .map_err(|_| Problem::invalid_field(name, "must be an object id (UUID)"))
            })
            .transpose()
    };
    let cursor = match (id("starting_after")?, id("ending_before")?) {
        (Some(after), Some(before)) => Cursor::Between(after, before),
        (Some(after), None) => Cursor::After(after),
        (None, Some(before)) => Cursor::Before(before),
        (None, None) => Cursor::First,
    };
    let status = match query.get("status") {
        Some(s) if !statuses.contains(&s.as_str()) => {
            return Err(Problem::invalid_field(
                "status",
                &format!("must be one of {}", statuses.join(", ")),
            ))
        }
        other => other.cloned(),
    };
    let time = |name: &str| -> Result<Option<DateTime<Utc>>, Problem> {
        query
            .get(name)
            .map(|v| {
                DateTime::parse_from_rfc3339(v)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|_| Problem::invalid_field(name, "must be an RFC 3339 time"))
            })
            .transpose()
    };
    let customer_id = query.get("customer_id").cloned();
    if customer_id
        .as_ref()
        .is_some_and(|c| c.is_empty() || c.len() > 64)
    {
        return Err(Problem::invalid_field(
            "customer_id",
            "must be 1 to 64 characters",
        ));
    }
    Ok(PageRequest {
        limit,
        cursor,
        status,
        customer_id,
        created_gte: time("created_gte")?,
        created_lte: time("created_lte")?,
    })
}

async fn list<T, F, Fut>(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
    statuses: &'static [&'static str],
    fetch: F,
) -> Reply
where
    T: Serialize + Send + 'static,
    F: FnOnce(sqlx::PgPool, Uuid, PageRequest) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(Vec<T>, bool), StoreError>> + Send + 'static,
{
    let merchant_id = authenticate(&state, &req).await?;
    let page = page_request(&query, statuses)?;
    let pool = state.ctx.pool.clone();
    let (data, has_more) = on_service_runtime(&state, async move {
        fetch(pool, merchant_id, page).await.map_err(store_problem)
    })
    .await?;
    ok_json(&json!({"data": data, "has_more": has_more}))
}

/// `GET /orders`.
pub async fn orders(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const STATUSES: &[&str] = &["awaiting_payment", "paid", "refunded", "cancelled"];
    list(
        state,
        req,
        query,
        STATUSES,
        |pool, merchant, page| async move { store::orders::list(&pool, merchant, &page).await },
    )
    .await
}

/// `GET /payments`.
pub async fn payments(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const STATUSES: &[&str] = &["pending", "succeeded", "failed"];
    list(
        state,
        req,
        query,
        STATUSES,
        |pool, merchant, page| async move { store::payments::list(&pool, merchant, &page).await },
    )
    .await
}

/// `GET /refunds`.
pub async fn refunds(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const STATUSES: &[&str] = &["pending", "succeeded", "failed"];
    list(
        state,
        req,
        query,
        STATUSES,
        |pool, merchant, page| async move { store::refunds::list(&pool, merchant, &page).await },
    )
    .await
}
