//! Operational endpoints: liveness, readiness, metrics, the OpenAPI document.

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::problem::Problem;

/// The repository's `openapi.yaml`, compiled in so the served document is
/// always the one this binary implements.
pub(crate) const OPENAPI: &str = include_str!("../../../../openapi.yaml");

/// The operations an OpenAPI document in this repository's layout (paths
/// at two spaces, methods at four) documents, as (path, METHOD): what the
/// route table's test and the generated client's test hold against.
pub fn documented_operations(document: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    let (mut in_paths, mut path) = (false, String::new());
    for line in document.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            in_paths = line == "paths:";
            continue;
        }
        if !in_paths {
            continue;
        }
        if let Some(p) = line.strip_prefix("  /") {
            path = format!("/{}", p.trim_end_matches(':'));
        } else if let Some(m) = line.strip_prefix("    ") {
            let method = m.trim_end_matches(':');
            if ["get", "post", "put", "patch", "delete"].contains(&method) {
                out.insert((path.clone(), method.to_uppercase()));
            }
        }
    }
    out
}

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
        // What the evidence-due alert reads; a failed read keeps the last.
        let within = std::time::Duration::from_secs(72 * 3600);
        if let Ok(n) = crate::store::disputes::evidence_due_within(&ctx.pool, within).await {
            ctx.metrics.disputes_evidence_due_soon.set(n);
        }
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
