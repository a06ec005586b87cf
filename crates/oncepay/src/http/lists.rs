//! `GET /orders`, `GET /payments`, `GET /refunds`, `GET /disputes`: the merchant's rows,
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

use super::{authenticate_caller, ok_json, on_service_runtime, AppState};
use crate::idempotency::store_problem;
use crate::problem::Problem;
use crate::store::pages::{Cursor, Filter, PageRequest};
use crate::store::{self, StoreError};

type Reply = Result<HttpResponse, Problem>;

/// The most rows a page holds.
pub(crate) const MAX_LIMIT: i64 = 100;

/// What one list accepts beyond the common parameters.
pub(crate) struct ListSpec {
    /// The values `status` may take; empty: no `status` parameter.
    pub statuses: &'static [&'static str],
    /// Exact-match parameters, each naming a column and how to read it.
    pub filters: &'static [(&'static str, FilterKind)],
}

/// How an exact-match parameter is read.
pub(crate) enum FilterKind {
    /// An object id.
    Id,
    /// One of these values.
    OneOf(fn() -> Vec<&'static str>),
}

/// Reads the query string into a page request.
pub(crate) fn page_request(
    query: &HashMap<String, String>,
    spec: &ListSpec,
) -> Result<PageRequest, Problem> {
    const COMMON: &[&str] = &[
        "limit",
        "starting_after",
        "ending_before",
        "customer_id",
        "created_gte",
        "created_lte",
    ];
    let known = |k: &str| {
        COMMON.contains(&k)
            || (k == "status" && !spec.statuses.is_empty())
            || spec.filters.iter().any(|(name, _)| *name == k)
    };
    if let Some(unknown) = query.keys().find(|k| !known(k)) {
        return Err(Problem::invalid_field(
            unknown.clone(),
            "is not a parameter of this list",
        ));
    }
    let statuses = spec.statuses;
    let equals = filters(query, spec)?;
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
    let customer_id = customer_id(query)?;
    Ok(PageRequest {
        limit,
        cursor,
        status,
        customer_id,
        created_gte: time("created_gte")?,
        created_lte: time("created_lte")?,
        equals,
    })
}

/// The list's exact-match parameters present in the query, each checked
/// against its kind.
fn filters(
    query: &HashMap<String, String>,
    spec: &ListSpec,
) -> Result<Vec<(&'static str, Filter)>, Problem> {
    let mut equals = Vec::new();
    for (name, kind) in spec.filters {
        let Some(value) = query.get(*name) else {
            continue;
        };
        let filter = match kind {
            FilterKind::Id => Filter::Id(
                Uuid::parse_str(value)
                    .map_err(|_| Problem::invalid_field(*name, "must be an object id (UUID)"))?,
            ),
            FilterKind::OneOf(values) => {
                let values = values();
                if !values.contains(&value.as_str()) {
                    return Err(Problem::invalid_field(
                        *name,
                        &format!("must be one of {}", values.join(", ")),
                    ));
                }
                Filter::Text(value.clone())
            }
        };
        equals.push((*name, filter));
    }
    Ok(equals)
}

/// `customer_id`, counted in characters, not bytes, as customer ids are
/// when orders are made; U+0000 cannot be stored, so no customer id holds
/// one.
fn customer_id(query: &HashMap<String, String>) -> Result<Option<String>, Problem> {
    let customer_id = query.get("customer_id").cloned();
    if customer_id
        .as_ref()
        .is_some_and(|c| c.is_empty() || c.chars().count() > 64 || c.contains('\0'))
    {
        return Err(Problem::invalid_field(
            "customer_id",
            "must be 1 to 64 characters, none of them U+0000",
        ));
    }
    Ok(customer_id)
}

pub(super) async fn list<T, F, Fut>(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
    spec: &ListSpec,
    fetch: F,
) -> Reply
where
    T: Serialize + Send + 'static,
    F: FnOnce(sqlx::PgPool, Uuid, PageRequest) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(Vec<T>, bool), StoreError>> + Send + 'static,
{
    let caller = authenticate_caller(&state, &req).await?;
    let merchant_id = caller.merchant_id;
    let mut page = page_request(&query, spec)?;
    match caller.list_customer(page.customer_id.take()) {
        Ok(customer_id) => page.customer_id = customer_id,
        // A customer asking for another's rows sees none of them.
        Err(()) => return ok_json(&json!({"data": [], "has_more": false})),
    }
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
    const SPEC: ListSpec = ListSpec {
        statuses: &[
            "awaiting_payment",
            "authorized",
            "paid",
            "refunded",
            "cancelled",
        ],
        filters: &[],
    };
    list(
        state,
        req,
        query,
        &SPEC,
        |pool, merchant, page| async move { store::orders::list(&pool, merchant, &page).await },
    )
    .await
}

/// Refunds' statuses; payments have these and a hold's two.
const ATTEMPT_STATUSES: &[&str] = &["pending", "succeeded", "failed"];

/// A payment's statuses.
const PAYMENT_STATUSES: &[&str] = &[
    "pending",
    "requires_capture",
    "succeeded",
    "failed",
    "voided",
];

/// `GET /payments` also filters by order: the paged form of
/// `GET /orders/{id}/payments`.
pub(crate) const PAYMENT_SPEC: ListSpec = ListSpec {
    statuses: PAYMENT_STATUSES,
    filters: &[("order_id", FilterKind::Id)],
};

/// `GET /refunds` also filters by the payment refunded.
pub(crate) const REFUND_SPEC: ListSpec = ListSpec {
    statuses: ATTEMPT_STATUSES,
    filters: &[("payment_id", FilterKind::Id)],
};

/// `GET /payments`.
pub async fn payments(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    list(
        state,
        req,
        query,
        &PAYMENT_SPEC,
        |pool, merchant, page| async move {
            let (mut payments, more) = store::payments::list(&pool, merchant, &page).await?;
            store::disputes::attach(&mut *pool.acquire().await?, &mut payments).await?;
            Ok((payments, more))
        },
    )
    .await
}

/// `GET /refunds`.
pub async fn refunds(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    list(
        state,
        req,
        query,
        &REFUND_SPEC,
        |pool, merchant, page| async move { store::refunds::list(&pool, merchant, &page).await },
    )
    .await
}

/// The statuses of a dispute, as `status` takes them.
const DISPUTE_STATUSES: &[&str] = &["needs_response", "under_review", "won", "lost"];

/// `GET /disputes` filters by status and by the payment disputed.
pub(crate) const DISPUTE_SPEC: ListSpec = ListSpec {
    statuses: DISPUTE_STATUSES,
    filters: &[("payment_id", FilterKind::Id)],
};

/// `GET /disputes`.
pub async fn disputes(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    list(
        state,
        req,
        query,
        &DISPUTE_SPEC,
        |pool, merchant, page| async move { store::disputes::list(&pool, merchant, &page).await },
    )
    .await
}
