//! Operational endpoints: liveness, readiness, metrics, the OpenAPI document.

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::problem::Problem;

/// The repository's `openapi.yaml`, compiled in so the served document is
/// always the one this binary implements.
pub(crate) const OPENAPI: &str = include_str!("../../../../openapi.yaml");

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let pool = state.ctx.pool.clone();
    // Ready means writable: behind a failover manager the address may
    // briefly lead to a node that is (still, or newly) a standby.
    let writable = super::on_service_runtime(&state, async move {
        crate::store::is_writable(&pool)
            .await
            .map_err(|_| Problem::unavailable("the database"))
    })
    .await?;
    if !writable {
        return Err(Problem::unavailable(
            "a writable database (connected to a standby)",
        ));
    }
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ready"})))
}

pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let ctx = state.ctx.clone();
    let _ = super::on_service_runtime(&state, async move {
        let pools = [("main", &ctx.pool), ("claims", ctx.engine.claims_pool())];
        ctx.metrics.probe_pools(&pools).await;
        Ok::<(), crate::problem::Problem>(())
    })
    .await;
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.ctx.metrics.render())
}

/// `text/yaml`, not RFC 9512's `application/yaml`: client generators
/// (openapi-python-client) read a `text/` type as text and warn on the
/// other, and a browser shows it instead of downloading it.
pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/yaml; charset=utf-8")
        .body(OPENAPI)
}
