//! `POST /webhook_endpoints`, `GET /webhook_endpoints`,
//! `DELETE /webhook_endpoints/{id}`: where a merchant's events are sent.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::resources::run_command;
use super::{
    authenticate, authenticate_caller, idempotency_key, ok_json, on_service_runtime, path_uuid,
    read_body, AppState,
};
use crate::commands::webhook_endpoints::CreateWebhookEndpoint;
use crate::commands::{Command, CommandInput};
use crate::domain::RuleViolation;
use crate::idempotency::{store_problem, Fingerprint, RecordId};
use crate::input::parse_body;
use crate::problem::{Problem, ProblemCode};
use crate::store;

type Reply = Result<HttpResponse, Problem>;

/// Creates an endpoint. The URL's addresses are checked (server-side
/// request forgery) before the key is claimed, so a refused URL leaves the
/// key free, like every other refusal of input.
pub async fn create(state: web::Data<AppState>, req: HttpRequest, payload: web::Payload) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let merchant_id = caller.merchant_id;
    let key = idempotency_key(&req)?;
    let bytes = read_body(&state, &req, payload).await?;
    let input = CommandInput {
        path_id: None,
        path_text: None,
        body: parse_body(&bytes, false)?,
        actor: Some(caller.actor()),
    };
    let command = CreateWebhookEndpoint::parse(&input)?;
    crate::events::outbound::check_url(&command.url, state.webhook_allow_private)
        .await
        .map_err(|e| Problem::rule(RuleViolation::new("url", e.to_string())))?;
    let id = RecordId::merchant(merchant_id, &key);
    let fingerprint = Fingerprint::of("POST", req.path(), &input.body);
    run_command::<CreateWebhookEndpoint>(&state, id, fingerprint, input).await
}

/// `GET /webhook_endpoints`: the merchant's endpoints, newest first.
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Reply {
    let merchant = authenticate(&state, &req).await?;
    let pool = state.ctx.pool.clone();
    let endpoints = on_service_runtime(&state, async move {
        store::webhook_endpoints::list(&pool, merchant)
            .await
            .map_err(store_problem)
    })
    .await?;
    ok_json(&json!({"data": endpoints}))
}

/// `DELETE /webhook_endpoints/{id}`: nothing more is sent there; pending
/// deliveries to it are cancelled. `204`; `404` if there is no such live
/// endpoint (a second delete included).
pub async fn delete(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Reply {
    let caller = authenticate_caller(&state, &req).await?;
    let merchant = caller.merchant_id;
    let code = ProblemCode::WebhookEndpointNotFound;
    let id = path_uuid(&path, code, "webhook endpoint")?;
    let pool = state.ctx.pool.clone();
    let actor = caller.actor();
    let deleted = on_service_runtime(&state, async move {
        store::webhook_endpoints::delete(&pool, merchant, id, &actor)
            .await
            .map_err(store_problem)
    })
    .await?;
    if deleted {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(Problem::not_found(code, "webhook endpoint"))
    }
}
