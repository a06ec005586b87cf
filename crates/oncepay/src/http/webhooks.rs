//! `POST /webhooks/{provider}`: the signature is checked on the raw bytes
//! before anything is parsed or stored.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{read_body, AppState};
use crate::problem::{Problem, ProblemCode};

pub async fn receive(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let provider = path.into_inner();
    if provider != state.ctx.provider.name() {
        return Err(Problem::new(
            ProblemCode::UnsupportedProvider,
            "no such webhook provider",
        ));
    }
    let body = read_body(&state, &req, payload).await?;
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let verified = state.webhook_secret.verify(
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        &body,
        chrono::Utc::now().timestamp(),
    );
    if let Err(e) = verified {
        state
            .ctx
            .metrics
            .webhooks
            .with_label_values(&["bad_signature"])
            .inc();
        return Err(Problem::new(
            ProblemCode::WebhookSignatureInvalid,
            e.to_string(),
        ));
    }
    let (ctx, event_id) = (state.ctx.clone(), header("webhook-id").map(str::to_string));
    let outcome = super::on_service_runtime(&state, async move {
        crate::provider_events::apply(&ctx, &provider, event_id.as_deref(), &body).await
    })
    .await?;
    state
        .ctx
        .metrics
        .webhooks
        .with_label_values(&[outcome])
        .inc();
    Ok(HttpResponse::Ok().json(serde_json::json!({"received": true, "outcome": outcome})))
}
