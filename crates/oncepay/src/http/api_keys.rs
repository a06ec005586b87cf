//! `GET /api_keys`, `POST /api_keys`, `DELETE /api_keys/{id}`: a merchant
//! lists, rotates and revokes its own keys. A revocation reaches every
//! `oncepay serve` process at once (PostgreSQL `NOTIFY`).
//!
//! `POST /api_keys` takes no `Idempotency-Key`: its answer carries a new
//! secret, which oncepay never stores (only its hash); a stored answer to
//! replay would store it. A retry may make a second key; list and revoke it.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use std::collections::HashMap;

use super::lists::{FilterKind, ListSpec};
use super::{
    actor_of, authenticate, authenticate_caller, ok_json, on_service_runtime, path_uuid, read_body,
    AppState,
};
use crate::api_keys::Scopes;
use crate::idempotency::store_problem;
use crate::input::{parse_body, Obj};
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// The longest overlap a rotation may give the old key: a week.
pub(crate) const MAX_OVERLAP_SECONDS: i64 = 7 * 86_400;

/// `GET /api_keys`: the merchant's keys, newest first (never the keys themselves).
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    let pool = state.ctx.pool.clone();
    let keys = on_service_runtime(&state, async move {
        store::merchants::list_keys(&pool, merchant)
            .await
            .map_err(store_problem)
    })
    .await?;
    ok_json(&json!({"data": keys}))
}

/// `POST /api_keys` with optional `{"expire_current_in_seconds": N,
/// "scopes": [...]}`: a new key, shown once, with the scopes named (the
/// calling key's by default, never more: `403 insufficient_scope`); with
/// N, the calling key stops working N seconds from now (0 to a week), so
/// clients can move over without downtime.
pub async fn create(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let merchant = caller.merchant_id;
    let bytes = read_body(&state, &req, payload).await?;
    let body = parse_body(&bytes, true)?;
    let obj = Obj::root(&body)?;
    obj.only(&["expire_current_in_seconds", "scopes"])?;
    let scopes = match obj.has("scopes") {
        false => caller.scopes,
        true => {
            let names = obj.strings("scopes")?;
            Scopes::parse(names.iter().map(String::as_str))
                .map_err(|e| Problem::rule(crate::domain::RuleViolation::new("scopes", e)))?
        }
    };
    if let Some(beyond) = scopes.first_outside(caller.scopes) {
        return Err(Problem::new(
            ProblemCode::InsufficientScope,
            format!(
                "scopes: the calling key lacks `{}`, so it cannot give it",
                beyond.as_str()
            ),
        )
        .with_field("scopes"));
    }
    let overlap = obj.opt_integer("expire_current_in_seconds")?;
    let overlap_ms = match overlap {
        None => None,
        Some(n) if (0..=i128::from(MAX_OVERLAP_SECONDS)).contains(&n) => Some(n as i64 * 1000),
        Some(_) => {
            return Err(Problem::rule(crate::domain::RuleViolation::new(
                "expire_current_in_seconds",
                format!("must be from 0 to {MAX_OVERLAP_SECONDS}"),
            )))
        }
    };
    let calling = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|k| crate::api_keys::hash(k.trim()));
    let key = crate::api_keys::generate();
    let hash = crate::api_keys::hash(&key);
    let prefix = key[..crate::api_keys::PREFIX.len() + 6].to_string();
    let pool = state.ctx.pool.clone();
    let actor = actor_of(&caller);
    let info = on_service_runtime(&state, async move {
        let expire = match (overlap_ms, calling.as_ref()) {
            (Some(ms), Some(old)) => Some((old, ms)),
            _ => None,
        };
        let new = store::merchants::NewKey {
            hash: &hash,
            prefix: &prefix,
            scopes,
        };
        store::merchants::add_key_for(&pool, merchant, &new, expire, &actor)
            .await
            .map_err(store_problem)
    })
    .await?;
    if let Some(old) = calling.filter(|_| overlap_ms.is_some()) {
        state.keys.forget(&old);
    }
    let mut body = serde_json::to_value(&info).map_err(Problem::internal_from)?;
    body["key"] = json!(key);
    let bytes = serde_json::to_vec(&body).map_err(Problem::internal_from)?;
    Ok(HttpResponse::Created()
        .content_type("application/json")
        .body(bytes))
}

/// `DELETE /api_keys/{id}`: revokes one of the merchant's keys, in every
/// process at once.
pub async fn revoke(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let merchant = caller.merchant_id;
    let id = path_uuid(&path, ProblemCode::ApiKeyNotFound, "API key")?;
    let pool = state.ctx.pool.clone();
    let actor = actor_of(&caller);
    let revoked = on_service_runtime(&state, async move {
        store::merchants::revoke(&pool, Some(merchant), id, &actor)
            .await
            .map_err(store_problem)
    })
    .await?;
    match revoked {
        Some((info, hash)) => {
            // This process forgets it now; the others on the notification.
            state.keys.forget(&hash);
            ok_json(&info)
        }
        None => Err(Problem::not_found(
            ProblemCode::ApiKeyNotFound,
            "live API key",
        )),
    }
}

fn audit_actions() -> Vec<&'static str> {
    crate::audit::Action::ALL
        .iter()
        .map(|a| a.as_str())
        .collect()
}

/// `GET /audit_events` (admin): the merchant's administrative actions,
/// newest first, a page at a time, by `action`.
pub async fn audit_events(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
) -> Reply {
    const SPEC: ListSpec = ListSpec {
        statuses: &[],
        filters: &[("action", FilterKind::OneOf(audit_actions))],
    };
    super::lists::list(
        state,
        req,
        query,
        &SPEC,
        |pool, merchant, page| async move { store::audit::list(&pool, merchant, &page).await },
    )
    .await
}
