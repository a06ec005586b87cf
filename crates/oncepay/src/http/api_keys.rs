//! `GET /api_keys`, `POST /api_keys`, `DELETE /api_keys/{id}`: a merchant
//! lists, rotates and revokes its own keys. A revocation (and a rotation
//! that expires the calling key) answers once every `oncepay serve`
//! process has forgotten the key (`api_keys::KeyCache`).
//!
//! `POST /api_keys` requires an `Idempotency-Key` like every `POST` that
//! creates something: a retry after a lost answer replays the same key
//! (`commands::api_keys`), never a second live key the client never saw.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use std::collections::HashMap;

use super::lists::{FilterKind, ListSpec};
use super::resources::run_command;
use super::{
    authenticate, authenticate_caller, idempotency_key, ok_json, on_service_runtime, path_uuid,
    read_body, AppState,
};
use crate::commands::api_keys::CreateApiKey;
use crate::commands::{Command, CommandInput};
use crate::idempotency::{store_problem, Fingerprint, RecordId};
use crate::input::parse_body;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

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
/// "scopes": [...]}`: a new key, shown once (and replayed to a retry with
/// the same Idempotency-Key), with the scopes named (the calling key's by
/// default, never more: `403 insufficient_scope`); with N, the calling key
/// stops working N seconds from now (0 to a week), so clients can move
/// over without downtime.
pub async fn create(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let key = idempotency_key(&req)?;
    let bytes = read_body(&state, &req, payload).await?;
    let input = CommandInput {
        path_id: None,
        path_text: None,
        body: parse_body(&bytes, true)?,
        actor: Some(caller.actor()),
    };
    // Refused before the key is claimed, like every refusal of input.
    let command = CreateApiKey::parse(&input)?;
    command.scopes_within(caller.scopes)?;
    let id = RecordId::merchant(caller.merchant_id, &key);
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    let answer = run_command::<CreateApiKey>(&state, id, fingerprint, input).await?;
    if command.expires_current() && answer.status().is_success() {
        // Processes that cached the calling key learn of its expiry before
        // this answers, as of a revocation.
        let pool = state.ctx.pool.clone();
        on_service_runtime(&state, async move {
            let seq = store::revocations::last(&pool)
                .await
                .map_err(store_problem)?;
            crate::api_keys::wait_until_forgotten(&pool, seq)
                .await
                .map_err(store_problem)
        })
        .await?;
    }
    Ok(answer)
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
    let actor = caller.actor();
    let revoked = on_service_runtime(&state, async move {
        crate::api_keys::revoke(&pool, Some(merchant), id, &actor)
            .await
            .map_err(store_problem)
    })
    .await?;
    match revoked {
        // Every process (this one included) has forgotten it by now.
        Some((info, _)) => ok_json(&info),
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
