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
    /// Where the page sends the customer after paying.
    pub success_url: Option<String>,
    /// Where the page sends a customer who gives up.
    pub cancel_url: Option<String>,
    /// The page's language, if the merchant chose one.
    pub locale: Option<String>,
    /// The merchant as customers see it (its display name, else its name).
    pub merchant_name: String,
    /// `manual`: the page authorizes only.
    pub capture_method: crate::domain::payment::CaptureMethod,
}

/// Inserts a session; only the token's hash is stored.
pub async fn insert(
    tx: &mut PgConnection,
    (id, merchant_id, order_id): (Uuid, Uuid, Uuid),
    token_hash: &[u8; 32],
    ttl_ms: i64,
    (way_back, capture_method): (
        &crate::domain::checkout::WayBack,
        crate::domain::payment::CaptureMethod,
    ),
) -> Result<DateTime<Utc>, StoreError> {
    let row = sqlx::query(
        "INSERT INTO checkout_session (id, merchant_id, order_id, token_hash, expires_at,
                                       success_url, cancel_url, locale, capture_method)
         VALUES ($1, $2, $3, $4, date_trunc('milliseconds', now()) + $5::bigint * interval '1 millisecond',
                 $6, $7, $8, $9)
         RETURNING expires_at",
    )
    .bind(id)
    .bind(merchant_id)
    .bind(order_id)
    .bind(&token_hash[..])
    .bind(ttl_ms)
    .bind(&way_back.success_url)
    .bind(&way_back.cancel_url)
    .bind(way_back.locale)
    .bind(capture_method.as_str())
    .fetch_one(tx)
    .await?;
    Ok(row.try_get("expires_at")?)
}

/// The session a token's hash belongs to, if any.
pub(crate) async fn by_token_hash(
    pool: &PgPool,
    token_hash: &[u8; 32],
) -> Result<Option<Session>, StoreError> {
    let row = sqlx::query(
        "SELECT s.id, s.merchant_id, s.order_id, s.expires_at, s.expires_at <= now() AS expired,
                s.success_url, s.cancel_url, s.locale, coalesce(m.display_name, m.name) AS shown_as,
                s.capture_method
           FROM checkout_session s JOIN merchant m ON m.id = s.merchant_id
          WHERE s.token_hash = $1",
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
            success_url: r.try_get("success_url")?,
            cancel_url: r.try_get("cancel_url")?,
            locale: r.try_get("locale")?,
            merchant_name: r.try_get("shown_as")?,
            capture_method: {
                let m: String = r.try_get("capture_method")?;
                crate::domain::payment::CaptureMethod::parse(&m)
                    .ok_or_else(|| super::Corrupt::unknown("capture method", &m))?
            },
        })
    })
    .transpose()
}
