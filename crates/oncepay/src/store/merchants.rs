//! SQL of merchants and their API keys.

use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// Creates the merchant if it does not exist and stores a new key's hash.
/// Returns the merchant's id.
pub async fn add_api_key(
    pool: &PgPool,
    merchant_name: &str,
    key_hash: &[u8; 32],
    key_prefix: &str,
) -> Result<Uuid, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "INSERT INTO merchant (id, name) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(merchant_name)
    .fetch_one(&mut *tx)
    .await?;
    let merchant_id: Uuid = row.try_get("id")?;
    sqlx::query("INSERT INTO api_key (key_hash, merchant_id, key_prefix) VALUES ($1, $2, $3)")
        .bind(&key_hash[..])
        .bind(merchant_id)
        .bind(key_prefix)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(merchant_id)
}

/// Finds the merchant of a key hash.
pub const MERCHANT_FOR_KEY: &str =
    "SELECT merchant_id FROM api_key WHERE key_hash = $1 AND revoked_at IS NULL";

/// The merchant owning a key hash, if the key exists and is not revoked.
pub async fn merchant_for_key(
    pool: &PgPool,
    key_hash: &[u8; 32],
) -> Result<Option<Uuid>, StoreError> {
    let row = sqlx::query(MERCHANT_FOR_KEY)
        .bind(&key_hash[..])
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| r.try_get("merchant_id")).transpose()?)
}
