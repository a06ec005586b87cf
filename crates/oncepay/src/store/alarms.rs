//! SQL of the pending alarm: payments and refunds whose outcome has been
//! unknown for too long (still pending, or a decline not yet confirmed by
//! the provider's record).

use std::time::Duration;

use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// A payment or refund that just passed the alarm threshold.
#[derive(Debug, Clone)]
pub struct Alarm {
    /// `payment` or `refund`.
    pub kind: &'static str,
    /// Its id.
    pub id: Uuid,
    /// How long it has been pending.
    pub pending_seconds: f64,
}

/// Marks (once) and returns the payments and refunds created longer than
/// `after` ago whose outcome is still unknown. The mark makes each alarm fire once, in whichever process
/// gets there first.
pub(crate) async fn raise(pool: &PgPool, after: Duration) -> Result<Vec<Alarm>, StoreError> {
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let rows = sqlx::query(
        "WITH p AS (
            UPDATE payment_attempt SET alarmed_at = now()
             WHERE (status = 'pending' OR decline_check_at IS NOT NULL) AND alarmed_at IS NULL
               AND created_at < now() - $1::bigint * interval '1 millisecond'
            RETURNING 'payment' AS kind, id, extract(epoch FROM now() - created_at)::float8 AS age),
         r AS (
            UPDATE refund SET alarmed_at = now()
             WHERE (status = 'pending' OR decline_check_at IS NOT NULL) AND alarmed_at IS NULL
               AND created_at < now() - $1::bigint * interval '1 millisecond'
            RETURNING 'refund' AS kind, id, extract(epoch FROM now() - created_at)::float8 AS age)
         SELECT * FROM p UNION ALL SELECT * FROM r",
    )
    .bind(after_ms)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let kind: String = row.try_get("kind")?;
            Ok(Alarm {
                kind: if kind == "refund" {
                    "refund"
                } else {
                    "payment"
                },
                id: row.try_get("id")?,
                pending_seconds: row.try_get("age")?,
            })
        })
        .collect()
}

/// The age in seconds of the oldest pending payment and refund (0 if none).
pub(crate) async fn oldest_pending(pool: &PgPool) -> Result<[(&'static str, f64); 2], StoreError> {
    let row = sqlx::query(
        "SELECT COALESCE((SELECT extract(epoch FROM now() - min(created_at))::float8
                            FROM payment_attempt WHERE status = 'pending'), 0) AS payment,
                COALESCE((SELECT extract(epoch FROM now() - min(created_at))::float8
                            FROM refund WHERE status = 'pending'), 0) AS refund",
    )
    .fetch_one(pool)
    .await?;
    Ok([
        ("payment", row.try_get("payment")?),
        ("refund", row.try_get("refund")?),
    ])
}
