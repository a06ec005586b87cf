//! SQL of merchants' webhook endpoints: where events are sent, which types,
//! and the key that signs them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// An endpoint as its merchant sees it (never its secret, after creation).
#[derive(Debug, Clone, Serialize)]
pub struct Endpoint {
    /// UUID v7.
    pub id: Uuid,
    /// Where events are POSTed.
    pub url: String,
    /// The event types sent there (`*`: all).
    pub events: Vec<String>,
    /// `enabled`, or `disabled` after the receiver answered `410 Gone`.
    pub status: &'static str,
    /// Why it was disabled, if it was.
    pub disabled_reason: Option<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, url, events, disabled_at, disabled_reason, created_at";

fn from_row(row: &PgRow) -> Result<Endpoint, StoreError> {
    let disabled: Option<DateTime<Utc>> = row.try_get("disabled_at")?;
    Ok(Endpoint {
        id: row.try_get("id")?,
        url: row.try_get("url")?,
        events: row.try_get("events")?,
        status: if disabled.is_some() {
            "disabled"
        } else {
            "enabled"
        },
        disabled_reason: row.try_get("disabled_reason")?,
        created_at: row.try_get("created_at")?,
    })
}

/// Inserts an endpoint.
pub async fn insert(
    tx: &mut PgConnection,
    id: Uuid,
    merchant_id: Uuid,
    url: &str,
    events: &[String],
    secret_key: &[u8],
) -> Result<Endpoint, StoreError> {
    let row = sqlx::query(&format!(
        "INSERT INTO webhook_endpoint (id, merchant_id, url, events, secret_key)
         VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(merchant_id)
    .bind(url)
    .bind(events)
    .bind(secret_key)
    .fetch_one(tx)
    .await?;
    from_row(&row)
}

/// The merchant's endpoints that were not deleted, newest first.
pub async fn list(pool: &PgPool, merchant_id: Uuid) -> Result<Vec<Endpoint>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM webhook_endpoint
          WHERE merchant_id = $1 AND deleted_at IS NULL ORDER BY id DESC"
    ))
    .bind(merchant_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Deletes one of the merchant's endpoints: nothing more is sent there and
/// its pending deliveries are cancelled. False if there is no such live
/// endpoint. The audit row is written in the same transaction.
pub async fn delete(
    pool: &PgPool,
    merchant_id: Uuid,
    id: Uuid,
    actor: &crate::audit::Actor,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "WITH gone AS (
            UPDATE webhook_endpoint SET deleted_at = now()
             WHERE id = $1 AND merchant_id = $2 AND deleted_at IS NULL RETURNING id),
         cancelled AS (
            UPDATE webhook_delivery SET state = 'cancelled', claim_token = NULL
             WHERE endpoint_id IN (SELECT id FROM gone) AND state = 'pending' RETURNING 1)
         SELECT (SELECT count(*) FROM gone) AS gone,
                (SELECT count(*) FROM cancelled) AS cancelled",
    )
    .bind(id)
    .bind(merchant_id)
    .fetch_one(&mut *tx)
    .await?;
    let gone: i64 = row.try_get("gone")?;
    if gone == 0 {
        return Ok(false);
    }
    let cancelled: i64 = row.try_get("cancelled")?;
    super::audit::record(
        &mut tx,
        merchant_id,
        actor,
        crate::audit::Action::WebhookEndpointDeleted,
        &id.to_string(),
        serde_json::json!({"pending_deliveries_cancelled": cancelled}),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Disables an endpoint whose receiver answered `410 Gone` and cancels its
/// pending deliveries.
pub async fn disable(pool: &PgPool, id: Uuid, reason: &str) -> Result<(), StoreError> {
    sqlx::query(
        "WITH off AS (
            UPDATE webhook_endpoint SET disabled_at = now(), disabled_reason = $2
             WHERE id = $1 AND disabled_at IS NULL RETURNING id)
         UPDATE webhook_delivery SET state = 'cancelled', claim_token = NULL
          WHERE endpoint_id IN (SELECT id FROM off) AND state = 'pending'",
    )
    .bind(id)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}
