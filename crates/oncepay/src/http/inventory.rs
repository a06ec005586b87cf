//! Stock of tracked SKUs: `POST /inventory/{sku}/adjustments` (through
//! `commands::inventory`), `GET /inventory/{sku}` and `GET /inventory`
//! (straight to the store). A merchant's own only: another merchant's
//! SKU is untracked here, `404`. Customers' tokens are refused on all
//! three (the route table): stock levels and counts are the merchant's.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::lists::MAX_LIMIT;
use super::resources::run_command;
use super::{
    authenticate, authenticate_caller, idempotency_key, ok_json, on_service_runtime, read_body,
    AppState,
};
use crate::commands::inventory::{sku, AdjustInventory};
use crate::commands::CommandInput;
use crate::idempotency::{store_problem, Fingerprint};
use crate::input::parse_body;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// `POST /inventory/{sku}/adjustments`, in the order of checks of every
/// money command, with the caller as its actor (adjustments are in the
/// audit trail).
pub async fn adjust(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let sku = sku(&path)?;
    let key = idempotency_key(&req)?;
    let bytes = read_body(&state, &req, payload).await?;
    let input = CommandInput {
        path_id: None,
        path_text: Some(sku),
        body: parse_body(&bytes, false)?,
        actor: Some(caller.actor()),
    };
    let id = caller.record_id(&key);
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    run_command::<AdjustInventory>(&state, id, fingerprint, input).await
}

/// `GET /inventory/{sku}`: `404` when the SKU is not tracked.
pub async fn get_item(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    let sku = sku(&path)?;
    let pool = state.ctx.pool.clone();
    let found = on_service_runtime(&state, async move {
        let mut conn = pool.acquire().await.map_err(|e| store_problem(e.into()))?;
        store::inventory::item(&mut conn, merchant, &sku)
            .await
            .map_err(store_problem)
    })
    .await?;
    match found {
        Some(item) => ok_json(&item),
        None => Err(Problem::new(
            ProblemCode::InventoryItemNotFound,
            "this SKU is not tracked: its first adjustment starts tracking it",
        )),
    }
}

/// `GET /inventory?limit=&starting_after=`: the tracked SKUs in SKU order
/// (bytewise), a page at a time; `starting_after` is a SKU.
pub async fn list(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    if let Some(unknown) = query
        .keys()
        .find(|k| !["limit", "starting_after"].contains(&k.as_str()))
    {
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
                    &format!("must be an integer from 1 to {MAX_LIMIT}"),
                ))
            }
        },
    };
    let after = query
        .get("starting_after")
        .map(|s| {
            crate::domain::inventory::sku("starting_after", s)
                .map_err(|v| Problem::invalid_field("starting_after", &v.message))
        })
        .transpose()?;
    let pool = state.ctx.pool.clone();
    let (data, has_more) = on_service_runtime(&state, async move {
        store::inventory::list(&pool, merchant, after.as_deref(), limit)
            .await
            .map_err(store_problem)
    })
    .await?;
    ok_json(&json!({"data": data, "has_more": has_more}))
}
