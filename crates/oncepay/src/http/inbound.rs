//! `POST /webhooks/{provider}`: the provider's adapter checks the signature
//! on the raw bytes before anything is parsed or stored.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{read_body, AppState};
use crate::problem::{Problem, ProblemCode};

pub(crate) async fn receive(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let provider = path.into_inner();
    if !state.ctx.providers.has(&provider) {
        return Err(Problem::new(
            ProblemCode::UnsupportedProvider,
            "no such webhook provider",
        ));
    }
    let adapter = state.ctx.providers.named(&provider);
    let body = read_body(&state, &req, payload).await?;
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let verified = adapter.verify_webhook(&header, &body, chrono::Utc::now().timestamp());
    let delivery_id = match verified {
        Ok(id) => id,
        Err(reason) => {
            state
                .ctx
                .metrics
                .webhooks
                .with_label_values(&["bad_signature"])
                .inc();
            return Err(Problem::new(ProblemCode::WebhookSignatureInvalid, reason));
        }
    };
    let (ctx, event_id) = (state.ctx.clone(), delivery_id);
    let outcome = super::on_service_runtime(&state, async move {
        crate::inbound::apply(&ctx, &provider, event_id.as_deref(), &body).await
    })
    .await?;
    state
        .ctx
        .metrics
        .webhooks
        .with_label_values(&[outcome.as_str()])
        .inc();
    Ok(HttpResponse::Ok().json(serde_json::json!({"received": true, "outcome": outcome.as_str()})))
}
