//! SQL of the audit trail (`audit_event`, append-only by trigger).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::pages::PageRequest;
use super::StoreError;
use crate::audit::{Action, Actor};

/// One recorded action, as `GET /audit_events` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent {
    /// UUID v7.
    pub id: Uuid,
    /// `api_key`, `cli`, `customer` or `seller`.
    pub actor_type: String,
    /// The key's id, the OS user, or a token's `sub`.
    pub actor: String,
    /// A token's issuer; absent for a key or the CLI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_issuer: Option<String>,
    /// What was done (`api_key.revoked`, …).
    pub action: String,
    /// On what kind of object.
    pub target_type: String,
    /// On which one.
    pub target_id: String,
    /// The request, for an action by API.
    pub request_id: Option<String>,
    /// What changed (never a secret).
    pub change: Value,
    /// When it changed, by the database's clock.
    pub created_at: DateTime<Utc>,
}

/// Writes one audit row (see [`record`]).
pub const INSERT: &str = "INSERT INTO audit_event
                (id, merchant_id, actor_type, actor, action, target_type, target_id, request_id,
                 change, actor_issuer)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// Records `action` by `actor` on `target_id`, inside the caller's
/// transaction (the one that makes the change).
pub async fn record(
    tx: &mut PgConnection,
    merchant_id: Uuid,
    actor: &Actor,
    action: Action,
    target_id: &str,
    change: Value,
) -> Result<(), StoreError> {
    sqlx::query(INSERT)
        .bind(Uuid::now_v7())
        .bind(merchant_id)
        .bind(actor.kind.as_str())
        .bind(&actor.id)
        .bind(action.as_str())
        .bind(action.target_type())
        .bind(target_id)
        .bind(&actor.request_id)
        .bind(change)
        .bind(&actor.issuer)
        .execute(tx)
        .await?;
    Ok(())
}

fn from_row(row: &PgRow) -> Result<AuditEvent, StoreError> {
    Ok(AuditEvent {
        id: row.try_get("id")?,
        actor_type: row.try_get("actor_type")?,
        actor: row.try_get("actor")?,
        actor_issuer: row.try_get("actor_issuer")?,
        action: row.try_get("action")?,
        target_type: row.try_get("target_type")?,
        target_id: row.try_get("target_id")?,
        request_id: row.try_get("request_id")?,
        change: row.try_get("change")?,
        created_at: row.try_get("created_at")?,
    })
}

/// One page of the merchant's audit trail, newest first, and whether there
/// are more (see `store::pages`).
pub async fn list(
    pool: &PgPool,
    merchant_id: Uuid,
    page: &PageRequest,
) -> Result<(Vec<AuditEvent>, bool), StoreError> {
    super::pages::fetch(
        pool,
        "SELECT a.id, a.actor_type, a.actor, a.action, a.target_type, a.target_id, a.request_id,
                a.change, a.created_at, a.actor_issuer FROM audit_event a",
        "a",
        // No customer owns an audit event: a customer filter matches none.
        "NULL::text",
        merchant_id,
        page,
        from_row,
    )
    .await
}
