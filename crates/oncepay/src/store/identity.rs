//! SQL of merchants' identity providers (`merchant_identity`): set and
//! removed by the CLI with their audit rows, read by issuer on every
//! request that carries a token.

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::{Corrupt, StoreError};
use crate::audit::{Action, Actor};
use crate::identity::token::Algorithms;

/// A merchant's identity provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// The merchant whose customers and sellers it signs in.
    pub merchant_id: Uuid,
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// Where its public keys are published.
    pub jwks_url: String,
    /// What its tokens' `aud` must contain.
    pub audience: String,
    /// The claim that holds a token's roles.
    pub roles_claim: String,
    /// The one `typ` its tokens must carry; `None`: a sign-in's (no
    /// `typ`, `JWT` or `at+jwt`).
    pub token_type: Option<String>,
    /// The algorithms it signs with.
    pub algorithms: Algorithms,
    /// The merchant's own rate limit, read with the identity provider (by
    /// [`by_issuer`] only) so a token counts against the merchant's limit
    /// as its keys do.
    #[serde(skip)]
    pub rate_limit: Option<crate::rate_limit::Limit>,
}

fn from_row(row: &PgRow) -> Result<Identity, StoreError> {
    Ok(Identity {
        merchant_id: row.try_get("merchant_id")?,
        issuer: row.try_get("issuer")?,
        jwks_url: row.try_get("jwks_url")?,
        audience: row.try_get("audience")?,
        roles_claim: row.try_get("roles_claim")?,
        token_type: row.try_get("token_type")?,
        algorithms: algorithms(row)?,
        rate_limit: None,
    })
}

/// `merchant_identity.algorithms` (its CHECK admits only the four names).
fn algorithms(row: &PgRow) -> Result<Algorithms, StoreError> {
    let names: Vec<String> = row.try_get("algorithms")?;
    Algorithms::parse(names.iter().map(String::as_str)).map_err(|_| {
        StoreError::from(Corrupt::Unknown {
            what: "merchant_identity.algorithms",
            value: names.join(","),
        })
    })
}

/// The identity provider whose tokens carry `iss = issuer`, if a merchant
/// trusts one, with that merchant's own rate limit.
pub async fn by_issuer(pool: &PgPool, issuer: &str) -> Result<Option<Identity>, StoreError> {
    let row = sqlx::query(
        "SELECT i.merchant_id, i.issuer, i.jwks_url, i.audience, i.roles_claim,
                i.token_type, i.algorithms, m.rate_limit_per_second, m.rate_limit_burst
           FROM merchant_identity i JOIN merchant m ON m.id = i.merchant_id
          WHERE i.issuer = $1",
    )
    .bind(issuer)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let rate: Option<i32> = row.try_get("rate_limit_per_second")?;
    let burst: Option<i32> = row.try_get("rate_limit_burst")?;
    Ok(Some(Identity {
        rate_limit: rate
            .zip(burst)
            .and_then(|(rate, burst)| crate::rate_limit::Limit::new(rate.into(), burst.into())),
        ..from_row(&row)?
    }))
}

/// The identity provider of the merchant named `name`: `None` if there is
/// no such merchant, `Some(None)` if it has none.
pub async fn of_merchant(
    pool: &PgPool,
    name: &str,
) -> Result<Option<Option<Identity>>, StoreError> {
    let row = sqlx::query(
        "SELECT m.id, i.merchant_id, i.issuer, i.jwks_url, i.audience, i.roles_claim,
                i.token_type, i.algorithms
           FROM merchant m LEFT JOIN merchant_identity i ON i.merchant_id = m.id
          WHERE m.name = $1",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let set: Option<Uuid> = row.try_get("merchant_id")?;
    Ok(Some(match set {
        Some(_) => Some(from_row(&row)?),
        None => None,
    }))
}

/// What setting an identity provider came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    /// Set (or replaced), with its audit row.
    Set,
    /// There is no merchant of that name.
    NoMerchant,
    /// Another merchant already trusts this issuer.
    IssuerTaken,
}

/// What an identity provider is set to: the issuer, JWKS URL, audience,
/// roles claim, token type and algorithms.
#[derive(Debug, Clone, Copy)]
pub struct NewIdentity<'a> {
    /// `iss`.
    pub issuer: &'a str,
    /// The JWKS URL (checked by the caller).
    pub jwks_url: &'a str,
    /// `aud`.
    pub audience: &'a str,
    /// The roles claim.
    pub roles_claim: &'a str,
    /// The one `typ` its tokens must carry (`None`: a sign-in's).
    pub token_type: Option<&'a str>,
    /// The algorithms it signs with.
    pub algorithms: Algorithms,
}

/// Sets the identity provider of the merchant named `name` (replacing the
/// one it had), with its audit row.
pub async fn set(
    pool: &PgPool,
    name: &str,
    new: NewIdentity<'_>,
    actor: &Actor,
) -> Result<SetOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(merchant_id) = lock_merchant(&mut tx, name).await? else {
        return Ok(SetOutcome::NoMerchant);
    };
    let before = current(&mut tx, merchant_id).await?;
    // The unique index decides between two merchants claiming one issuer
    // at once; this answers the common case with a clear message.
    let taken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM merchant_identity WHERE issuer = $1 AND merchant_id <> $2)",
    )
    .bind(new.issuer)
    .bind(merchant_id)
    .fetch_one(&mut *tx)
    .await?;
    if taken {
        return Ok(SetOutcome::IssuerTaken);
    }
    let algorithms: Vec<String> = new
        .algorithms
        .names()
        .into_iter()
        .map(str::to_string)
        .collect();
    let written = sqlx::query(
        "INSERT INTO merchant_identity
                (merchant_id, issuer, jwks_url, audience, roles_claim, token_type, algorithms)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (merchant_id) DO UPDATE SET issuer = EXCLUDED.issuer,
             jwks_url = EXCLUDED.jwks_url, audience = EXCLUDED.audience,
             roles_claim = EXCLUDED.roles_claim, token_type = EXCLUDED.token_type,
             algorithms = EXCLUDED.algorithms, updated_at = now()",
    )
    .bind(merchant_id)
    .bind(new.issuer)
    .bind(new.jwks_url)
    .bind(new.audience)
    .bind(new.roles_claim)
    .bind(new.token_type)
    .bind(algorithms.clone())
    .execute(&mut *tx)
    .await;
    match written {
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
            return Ok(SetOutcome::IssuerTaken)
        }
        other => {
            other?;
        }
    }
    let after = serde_json::json!({
        "issuer": new.issuer,
        "jwks_url": new.jwks_url,
        "audience": new.audience,
        "roles_claim": new.roles_claim,
        "token_type": new.token_type,
        "algorithms": algorithms,
    });
    let change = serde_json::json!({"before": before, "after": after});
    record(&mut tx, merchant_id, actor, change).await?;
    tx.commit().await?;
    Ok(SetOutcome::Set)
}

/// Removes the identity provider of the merchant named `name`, with its
/// audit row: its tokens stop working at once. `None` if there is no such
/// merchant, `Some(false)` if it had none.
pub async fn remove(pool: &PgPool, name: &str, actor: &Actor) -> Result<Option<bool>, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(merchant_id) = lock_merchant(&mut tx, name).await? else {
        return Ok(None);
    };
    let before = current(&mut tx, merchant_id).await?;
    if before.is_null() {
        return Ok(Some(false));
    }
    sqlx::query("DELETE FROM merchant_identity WHERE merchant_id = $1")
        .bind(merchant_id)
        .execute(&mut *tx)
        .await?;
    let change = serde_json::json!({"before": before, "after": null});
    record(&mut tx, merchant_id, actor, change).await?;
    tx.commit().await?;
    Ok(Some(true))
}

async fn lock_merchant(
    tx: &mut sqlx::PgConnection,
    name: &str,
) -> Result<Option<Uuid>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT id FROM merchant WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_optional(tx)
            .await?,
    )
}

/// The identity provider as the audit row's `before` shows it (`null`: none).
async fn current(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
) -> Result<serde_json::Value, StoreError> {
    let row = sqlx::query(
        "SELECT merchant_id, issuer, jwks_url, audience, roles_claim, token_type, algorithms
           FROM merchant_identity WHERE merchant_id = $1",
    )
    .bind(merchant_id)
    .fetch_optional(tx)
    .await?;
    Ok(match row {
        Some(row) => {
            let identity = from_row(&row)?;
            serde_json::json!({
                "issuer": identity.issuer,
                "jwks_url": identity.jwks_url,
                "audience": identity.audience,
                "roles_claim": identity.roles_claim,
                "token_type": identity.token_type,
                "algorithms": identity.algorithms.names(),
            })
        }
        None => serde_json::Value::Null,
    })
}

async fn record(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
    actor: &Actor,
    change: serde_json::Value,
) -> Result<(), StoreError> {
    super::audit::record(
        tx,
        merchant_id,
        actor,
        Action::IdentityChanged,
        &merchant_id.to_string(),
        change,
    )
    .await
}
