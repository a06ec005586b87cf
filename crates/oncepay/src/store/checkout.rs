//! SQL of hosted checkout sessions.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// A checkout session with what its page shows.
#[derive(Debug, Clone)]
pub struct Session {
    /// The session's id.
    pub id: Uuid,
    /// The merchant whose order it pays.
    pub merchant_id: Uuid,
    /// The order.
    pub order_id: Uuid,
    /// When the token stops working.
    pub expires_at: DateTime<Utc>,
    /// Whether it has expired (by the database's clock).
    pub expired: bool,
}

/// Inserts a session; only the token's hash is stored.
pub async fn insert(
    tx: &mut PgConnection,
    id: Uuid,
    merchant_id: Uuid,
    order_id: Uuid,
    token_hash: &[u8; 32],
    ttl_ms: i64,
) -> Result<DateTime<Utc>, StoreError> {
    let row = sqlx::query(
        "INSERT INTO checkout_session (id, merchant_id, order_id, token_hash, expires_at)
         VALUES ($1, $2, $3, $4, date_trunc('milliseconds', now()) + $5::bigint * interval '1 millisecond')
         RETURNING expires_at",
    )
    .bind(id)
    .bind(merchant_id)
    .bind(order_id)
    .bind(&token_hash[..])
    .bind(ttl_ms)
    .fetch_one(tx)
    .await?;
    Ok(row.try_get("expires_at")?)
}

/// The session a token's hash belongs to, if any.
pub async fn by_token_hash(
    pool: &PgPool,
    token_hash: &[u8; 32],
) -> Result<Option<Session>, StoreError> {
    let row = sqlx::query(
        "SELECT id, merchant_id, order_id, expires_at, expires_at <= now() AS expired
           FROM checkout_session WHERE token_hash = $1",
    )
    .bind(&token_hash[..])
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Session {
            id: r.try_get("id")?,
            merchant_id: r.try_get("merchant_id")?,
            order_id: r.try_get("order_id")?,
            expires_at: r.try_get("expires_at")?,
            expired: r.try_get("expired")?,
        })
    })
    .transpose()
}
