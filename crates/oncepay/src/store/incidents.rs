//! SQL of incidents: money the provider moved that our books did not
//! expect. Each statement records an incident at most once (a partial
//! unique index backs the `NOT EXISTS`, which the caller's row lock on the
//! attempt or refund already serialises).

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::StoreError;

/// What was recorded for a charge on a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeIncident {
    /// The incident's id.
    pub id: Uuid,
    /// The pending refund that returns the money.
    pub refund_id: Uuid,
}

/// Records a charge the provider took for a failed attempt, with the
/// pending refund that returns it (due for the reconciler at once), in one
/// statement. `None` if this attempt's incident was recorded before.
/// `taken` is what the provider says it captured, where it says (a hold
/// captured in part); the refund returns that much, never more than the
/// attempt's amount.
pub async fn charge_on_failed_attempt(
    tx: &mut PgConnection,
    payment_id: Uuid,
    charge_id: Option<&str>,
    taken: Option<i64>,
    detected_by: &str,
) -> Result<Option<ChargeIncident>, StoreError> {
    let row = sqlx::query(
        "WITH refund_row AS (
            INSERT INTO refund (id, merchant_id, payment_id, amount, status, reason, incident,
                                next_check_at, created_at, updated_at)
            SELECT $1, p.merchant_id, p.id,
                   LEAST(COALESCE($6, p.amount), p.amount) - p.refunded_amount, 'pending',
                   'incident: the provider charged a payment held as failed', true,
                   now(), now(), now()
              FROM payment_attempt p
             WHERE p.id = $3 AND LEAST(COALESCE($6, p.amount), p.amount) > p.refunded_amount
               AND NOT EXISTS (SELECT 1 FROM incident
                                WHERE kind = 'charge_on_failed_attempt' AND payment_id = $3)
            RETURNING id, merchant_id, amount)
         INSERT INTO incident (id, kind, merchant_id, payment_id, refund_id, provider_object_id,
                               amount, detected_by)
         SELECT $2, 'charge_on_failed_attempt', merchant_id, $3, id, $4, amount, $5
           FROM refund_row
         RETURNING id, refund_id",
    )
    .bind(Uuid::now_v7())
    .bind(Uuid::now_v7())
    .bind(payment_id)
    .bind(charge_id)
    .bind(detected_by)
    .bind(taken)
    .fetch_optional(tx)
    .await?;
    row.map(|r| {
        Ok(ChargeIncident {
            id: r.try_get("id")?,
            refund_id: r.try_get("refund_id")?,
        })
    })
    .transpose()
}

/// Records a refund the provider paid and then failed (its amount is
/// refundable again), once per refund; `true` if this call recorded it.
pub async fn refund_failed_after_success(
    tx: &mut PgConnection,
    refund_id: Uuid,
    provider_refund_id: Option<&str>,
    detected_by: &str,
) -> Result<bool, StoreError> {
    refund_incident(
        tx,
        "refund_failed_after_success",
        refund_id,
        provider_refund_id,
        detected_by,
    )
    .await
}

/// Records a refund incident of `kind` once per refund; `true` if this
/// call recorded it.
async fn refund_incident(
    tx: &mut PgConnection,
    kind: &str,
    refund_id: Uuid,
    provider_refund_id: Option<&str>,
    detected_by: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO incident (id, kind, merchant_id, payment_id, refund_id, provider_object_id,
                               amount, detected_by)
         SELECT $1, $5, r.merchant_id, r.payment_id, r.id, $3, r.amount, $4
           FROM refund r
          WHERE r.id = $2
            AND NOT EXISTS (SELECT 1 FROM incident WHERE kind = $5 AND refund_id = $2)",
    )
    .bind(Uuid::now_v7())
    .bind(refund_id)
    .bind(provider_refund_id)
    .bind(detected_by)
    .bind(kind)
    .execute(tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A refund the provider paid out that we hold as failed, recorded once;
/// `true` if this call recorded it.
pub async fn refund_on_failed_refund(
    tx: &mut PgConnection,
    refund_id: Uuid,
    provider_refund_id: Option<&str>,
    detected_by: &str,
) -> Result<bool, StoreError> {
    refund_incident(
        tx,
        "refund_on_failed_refund",
        refund_id,
        provider_refund_id,
        detected_by,
    )
    .await
}

/// Records, once per merchant and key, that a key the service derives was
/// found on a transfer other than the one it names (`what` differs):
/// the transfer is not reused, and a person looks. `true` if this call
/// recorded it. Written on its own connection, outside the transaction
/// that is refused.
pub async fn ledger_key_conflict(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    key: &str,
    detail: &str,
    detected_by: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO incident (id, kind, merchant_id, provider, provider_object_id, amount,
                               detected_by, detail)
         VALUES ($1, 'ledger_key_conflict', $2, 'ledger', $3, 0, $4, $5)
         ON CONFLICT DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(merchant_id)
    .bind(key)
    .bind(detected_by)
    .bind(detail)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}
