//! SQL of merchants and their API keys.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::revocations::{self, Seq};
use super::StoreError;
use crate::audit::{Action, Actor};

/// A key to store: its hash, its first characters, its scopes.
#[derive(Debug, Clone, Copy)]
pub struct NewKey<'a> {
    /// SHA-256 of the key.
    pub hash: &'a [u8; 32],
    /// `opk_` and six more characters, to recognise it.
    pub prefix: &'a str,
    /// What it may do.
    pub scopes: crate::domain::scopes::Scopes,
}

/// Stores a key of `merchant_id` and its audit row, in `tx`.
async fn insert_key(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
    key: &NewKey<'_>,
    actor: &Actor,
) -> Result<ApiKeyInfo, StoreError> {
    let row = sqlx::query(&format!(
        "INSERT INTO api_key (key_hash, merchant_id, key_prefix, scopes) VALUES ($1, $2, $3, $4)
         RETURNING {KEY_COLUMNS}"
    ))
    .bind(&key.hash[..])
    .bind(merchant_id)
    .bind(key.prefix)
    .bind(key.scopes.names())
    .fetch_one(&mut *tx)
    .await?;
    let info = key_from_row(&row)?;
    let change = serde_json::json!({"prefix": info.prefix, "scopes": info.scopes});
    super::audit::record(
        tx,
        merchant_id,
        actor,
        Action::ApiKeyCreated,
        &info.id.to_string(),
        change,
    )
    .await?;
    Ok(info)
}

/// Creates the merchant if it does not exist and stores a new key's hash.
/// Returns the merchant's id.
pub(crate) async fn add_api_key(
    pool: &PgPool,
    merchant_name: &str,
    key: &NewKey<'_>,
    actor: &Actor,
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
    insert_key(&mut tx, merchant_id, key, actor).await?;
    tx.commit().await?;
    Ok(merchant_id)
}

/// Finds the merchant of a live key hash (with its own rate limit),
/// noting when the key was used.
pub(crate) const MERCHANT_FOR_KEY: &str = "UPDATE api_key k SET last_used_at = now()
      FROM merchant m
      WHERE k.key_hash = $1 AND k.revoked_at IS NULL
        AND (k.expires_at IS NULL OR k.expires_at > now()) AND m.id = k.merchant_id
      RETURNING k.merchant_id, k.id AS key_id, k.scopes, m.rate_limit_per_second,
                m.rate_limit_burst, EXTRACT(EPOCH FROM k.expires_at - now())::float8 AS expires_in";

/// Whom a key speaks for, as stored (`api_keys::Caller` is made of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOwner {
    /// The merchant.
    pub merchant_id: Uuid,
    /// The key's id.
    pub key_id: Uuid,
    /// What the key may do.
    pub scopes: crate::domain::scopes::Scopes,
    /// When the key stops working, on this process's monotonic clock.
    pub expires_at: Option<std::time::Instant>,
    /// The merchant's own rate limit (per second, burst), if it has one.
    pub rate_limit: Option<(i32, i32)>,
}

/// Whom a key hash speaks for, if the key exists, is not revoked and has
/// not expired.
pub(crate) async fn merchant_for_key(
    pool: &PgPool,
    key_hash: &[u8; 32],
) -> Result<Option<KeyOwner>, StoreError> {
    // Taken before the database measures the key's remaining life, so
    // that the expiry counted down here is never later than the real one
    // (by the round trip, on a busy machine several milliseconds).
    let asked_at = std::time::Instant::now();
    let row = sqlx::query(MERCHANT_FOR_KEY)
        .bind(&key_hash[..])
        .fetch_optional(pool)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let rate: Option<i32> = row.try_get("rate_limit_per_second")?;
    let burst: Option<i32> = row.try_get("rate_limit_burst")?;
    // The database's clock decides how long the key lives; this process
    // only counts that span down on its own monotonic clock.
    let expires_in: Option<f64> = row.try_get("expires_in")?;
    let scopes: Vec<String> = row.try_get("scopes")?;
    Ok(Some(KeyOwner {
        merchant_id: row.try_get("merchant_id")?,
        key_id: row.try_get("key_id")?,
        // The column's check admits only known names and at least one.
        scopes: crate::domain::scopes::Scopes::parse(scopes.iter().map(String::as_str))
            .map_err(|_| super::Corrupt::unknown("scopes", &scopes.join(",")))?,
        expires_at: expires_in
            .map(|secs| asked_at + std::time::Duration::from_secs_f64(secs.max(0.0))),
        rate_limit: rate.zip(burst),
    }))
}

/// Sets (or, with `None`, clears) a merchant's own rate limit, with its
/// audit row. False if there is no such merchant.
pub async fn set_rate_limit(
    pool: &PgPool,
    name: &str,
    limit: Option<crate::rate_limit::Limit>,
    actor: &Actor,
) -> Result<bool, StoreError> {
    let as_i32 = |n: std::num::NonZeroU32| i32::try_from(n.get()).unwrap_or(i32::MAX);
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "WITH before AS (
             SELECT id, rate_limit_per_second AS per_second, rate_limit_burst AS burst
               FROM merchant WHERE name = $1 FOR UPDATE)
         UPDATE merchant m SET rate_limit_per_second = $2, rate_limit_burst = $3
           FROM before WHERE m.id = before.id
         RETURNING m.id, before.per_second, before.burst",
    )
    .bind(name)
    .bind(limit.map(|l| as_i32(l.per_second)))
    .bind(limit.map(|l| as_i32(l.burst)))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    let merchant_id: Uuid = row.try_get("id")?;
    let before_rate: Option<i32> = row.try_get("per_second")?;
    let before_burst: Option<i32> = row.try_get("burst")?;
    let change = serde_json::json!({
        "before": {"per_second": before_rate, "burst": before_burst},
        "after": {
            "per_second": limit.map(|l| l.per_second.get()),
            "burst": limit.map(|l| l.burst.get()),
        },
    });
    super::audit::record(
        &mut tx,
        merchant_id,
        actor,
        Action::RateLimitChanged,
        &merchant_id.to_string(),
        change,
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Sets (or, with `None`, clears) the name customers see on the checkout
/// page, with its audit row. False if there is no such merchant.
pub async fn set_display_name(
    pool: &PgPool,
    name: &str,
    display_name: Option<&str>,
    actor: &Actor,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(
        "WITH before AS (SELECT id, display_name FROM merchant WHERE name = $1 FOR UPDATE)
         UPDATE merchant m SET display_name = $2
           FROM before WHERE m.id = before.id
         RETURNING m.id, before.display_name",
    )
    .bind(name)
    .bind(display_name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    let merchant_id: Uuid = row.try_get("id")?;
    let before: Option<String> = row.try_get("display_name")?;
    let change = serde_json::json!({"before": before, "after": display_name});
    super::audit::record(
        &mut tx,
        merchant_id,
        actor,
        Action::DisplayNameChanged,
        &merchant_id.to_string(),
        change,
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// An API key as its merchant sees it (never the key itself).
#[derive(Debug, Clone, Serialize)]
pub struct ApiKeyInfo {
    /// Names the key in `DELETE /api_keys/{id}`.
    pub id: Uuid,
    /// The key's first characters (`opk_` + 6), to recognise it.
    pub prefix: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it last authenticated a request (to the minute the cache allows).
    pub last_used_at: Option<DateTime<Utc>>,
    /// When it stops working, if set (rotation).
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// What it may do (`read`, `write`, `admin`).
    pub scopes: Vec<String>,
}

const KEY_COLUMNS: &str =
    "id, key_prefix, created_at, last_used_at, expires_at, revoked_at, scopes";

fn key_from_row(row: &PgRow) -> Result<ApiKeyInfo, StoreError> {
    Ok(ApiKeyInfo {
        id: row.try_get("id")?,
        prefix: row.try_get("key_prefix")?,
        created_at: row.try_get("created_at")?,
        last_used_at: row.try_get("last_used_at")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        scopes: row.try_get("scopes")?,
    })
}

/// A merchant's keys, newest first.
pub(crate) async fn list_keys(
    pool: &PgPool,
    merchant_id: Uuid,
) -> Result<Vec<ApiKeyInfo>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_key WHERE merchant_id = $1 ORDER BY created_at DESC, id"
    ))
    .bind(merchant_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(key_from_row).collect()
}

/// The keys of the merchant called `name` (for `oncepay api-key list`).
pub async fn list_keys_by_name(pool: &PgPool, name: &str) -> Result<Vec<ApiKeyInfo>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {KEY_COLUMNS} FROM api_key
          WHERE merchant_id = (SELECT id FROM merchant WHERE name = $1)
          ORDER BY created_at DESC, id"
    ))
    .bind(name)
    .fetch_all(pool)
    .await?;
    rows.iter().map(key_from_row).collect()
}

/// The hash and scopes of key `key_id` of `merchant_id` (the key a
/// request was made with), if it exists.
pub(crate) async fn calling_key(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
    key_id: Uuid,
) -> Result<Option<([u8; 32], crate::domain::scopes::Scopes)>, StoreError> {
    let row =
        sqlx::query("SELECT key_hash, scopes FROM api_key WHERE id = $1 AND merchant_id = $2")
            .bind(key_id)
            .bind(merchant_id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(row) = row else { return Ok(None) };
    let hash: Vec<u8> = row.try_get("key_hash")?;
    let hash: [u8; 32] = hash.try_into().map_err(|_| super::Corrupt::OutOfRange {
        what: "api key hash",
    })?;
    let scopes: Vec<String> = row.try_get("scopes")?;
    let scopes = crate::domain::scopes::Scopes::parse(scopes.iter().map(String::as_str))
        .map_err(|_| super::Corrupt::unknown("scopes", &scopes.join(",")))?;
    Ok(Some((hash, scopes)))
}

/// Stores a new key for a merchant in `tx`; with `expire`, the key
/// `(hash, ms)` stops working that many milliseconds from now (rotation
/// without downtime), announced like a revocation (its number is
/// returned). With the audit rows.
pub(crate) async fn add_key_for(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
    key: &NewKey<'_>,
    expire: Option<(&[u8; 32], i64)>,
    actor: &Actor,
) -> Result<(ApiKeyInfo, Option<Seq>), StoreError> {
    let info = insert_key(&mut *tx, merchant_id, key, actor).await?;
    let mut announced = None;
    if let Some((old, after_ms)) = expire {
        let row = sqlx::query(
            "UPDATE api_key SET expires_at = LEAST(COALESCE(expires_at, 'infinity'),
                                                   now() + $2::bigint * interval '1 millisecond')
              WHERE key_hash = $1
              RETURNING id, expires_at",
        )
        .bind(&old[..])
        .bind(after_ms)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = row {
            let old_id: Uuid = row.try_get("id")?;
            let expires_at: Option<DateTime<Utc>> = row.try_get("expires_at")?;
            let change = serde_json::json!({"expires_at": expires_at, "replaced_by": info.id});
            super::audit::record(
                &mut *tx,
                merchant_id,
                actor,
                Action::ApiKeyRotated,
                &old_id.to_string(),
                change,
            )
            .await?;
        }
        // Processes that cached the old key learn of its expiry at once.
        announced = Some(revocations::announce(&mut *tx, &old[..]).await?);
    }
    Ok((info, announced))
}

/// Revokes a key (of `merchant_id` if given), announcing it to every
/// process in the same transaction. Returns the key, its hash and the
/// revocation's number (to wait for every process to apply it, see
/// [`revocations::wait_until_applied`]); `None` if no such live key.
pub async fn revoke(
    pool: &PgPool,
    merchant_id: Option<Uuid>,
    id: Uuid,
    actor: &Actor,
) -> Result<Option<(ApiKeyInfo, [u8; 32], Seq)>, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(&format!(
        "UPDATE api_key SET revoked_at = now()
          WHERE id = $1 AND ($2::uuid IS NULL OR merchant_id = $2) AND revoked_at IS NULL
          RETURNING key_hash, merchant_id, {KEY_COLUMNS}"
    ))
    .bind(id)
    .bind(merchant_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let hash: Vec<u8> = row.try_get("key_hash")?;
    let owner: Uuid = row.try_get("merchant_id")?;
    let info = key_from_row(&row)?;
    let change = serde_json::json!({"prefix": info.prefix, "revoked_at": info.revoked_at});
    super::audit::record(
        &mut tx,
        owner,
        actor,
        Action::ApiKeyRevoked,
        &id.to_string(),
        change,
    )
    .await?;
    let seq = revocations::announce(&mut tx, &hash).await?;
    tx.commit().await?;
    let hash: [u8; 32] = hash.try_into().map_err(|_| super::Corrupt::OutOfRange {
        what: "api key hash",
    })?;
    Ok(Some((info, hash, seq)))
}
