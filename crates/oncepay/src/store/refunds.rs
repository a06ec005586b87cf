//! SQL of refunds.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Corrupt, StoreError};
use crate::domain::origin::Origin;
use crate::domain::payment::{PaymentStatus, Refund};

/// The columns every read of a refund returns, in `from_row`'s order.
macro_rules! refund_columns {
    () => {
        "id, payment_id, amount, status, failure_code, reason, destination, created_at, updated_at, provider_refund_id, cancels_order, incident, idempotency_key, request_fingerprint, (SELECT pa.currency FROM payment_attempt pa WHERE pa.id = refund.payment_id) AS currency"
    };
}

/// The same columns qualified with the alias `r`, for joins and updates.
macro_rules! refund_columns_r {
    () => {
        "r.id, r.payment_id, r.amount, r.status, r.failure_code, r.reason, r.destination, r.created_at, r.updated_at, r.provider_refund_id, r.cancels_order, r.incident, r.idempotency_key, r.request_fingerprint, (SELECT pa.currency FROM payment_attempt pa WHERE pa.id = r.payment_id) AS currency"
    };
}

fn from_row(row: &PgRow) -> Result<Refund, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(Refund {
        id: row.try_get("id")?,
        payment_id: row.try_get("payment_id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: PaymentStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("refund status", &status))?,
        failure_code: row.try_get("failure_code")?,
        reason: row.try_get("reason")?,
        destination: row.try_get("destination")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        provider_refund_id: row.try_get("provider_refund_id")?,
        cancels_order: row.try_get("cancels_order")?,
        incident: row.try_get("incident")?,
        origin: Origin::of(
            row.try_get::<Option<&str>, _>("idempotency_key")?,
            row.try_get::<Option<&[u8]>, _>("request_fingerprint")?,
        ),
    })
}

/// A new pending refund.
pub struct NewRefund<'a> {
    /// UUID v7, also the provider idempotency key.
    pub id: Uuid,
    /// The merchant whose payment it refunds; every lookup is scoped by it.
    pub merchant_id: Uuid,
    /// The payment refunded.
    pub payment_id: Uuid,
    /// Amount in minor units.
    pub amount: i64,
    /// The merchant's reason.
    pub reason: Option<&'a str>,
    /// The key of the command that made it (the second line of defence);
    /// `None` for a refund oncepay made on its own.
    pub idempotency_key: Option<&'a str>,
    /// The request's fingerprint (`None` with no key).
    pub fingerprint: Option<&'a [u8]>,
    /// Whether settling it cancels the order.
    pub cancels_order: bool,
    /// `original` or `balance`.
    pub destination: &'a str,
    /// Whether it returns money taken for a failed attempt (an incident).
    pub incident: bool,
    /// Creation time.
    pub now: DateTime<Utc>,
    /// When the reconciler should first look at it if it stays pending.
    pub check_after: Duration,
}

/// Why a refund could not be inserted.
#[derive(Debug, thiserror::Error)]
pub enum InsertRefundError {
    /// `UNIQUE (payment_id, idempotency_key)`: this key already made a refund.
    #[error("this idempotency key already made a refund of the payment")]
    KeyUsed,
    /// Anything else.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Inserts a pending refund; the key constraint decides races. The first
/// check is due `check_after` from now by the database's clock, the one
/// `claim_due` compares it with.
pub async fn insert(
    tx: &mut PgConnection,
    new: &NewRefund<'_>,
) -> Result<Refund, InsertRefundError> {
    let result = sqlx::query(concat!(
        "INSERT INTO refund (id, merchant_id, payment_id, amount, status, reason, cancels_order,
                             incident, idempotency_key, next_check_at, created_at, updated_at,
                             request_fingerprint, destination)
         VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8,
                 now() + $10::bigint * interval '1 millisecond', $9, $9, $11, $12)
         RETURNING ",
        refund_columns!()
    ))
    .bind(new.id)
    .bind(new.merchant_id)
    .bind(new.payment_id)
    .bind(new.amount)
    .bind(new.reason)
    .bind(new.cancels_order)
    .bind(new.incident)
    .bind(new.idempotency_key)
    .bind(new.now)
    .bind(i64::try_from(new.check_after.as_millis()).unwrap_or(i64::MAX))
    .bind(new.fingerprint)
    .bind(new.destination)
    .fetch_one(tx)
    .await;
    match result {
        Ok(row) => Ok(from_row(&row)?),
        Err(e) if super::violated_constraint(&e) == Some("refund_payment_key_uniq") => {
            Err(InsertRefundError::KeyUsed)
        }
        Err(e) => Err(InsertRefundError::Store(e.into())),
    }
}

/// The refund a key made of a payment, if any: how a retry after the
/// idempotency record expired finds it instead of refunding again.
pub(crate) async fn by_key(
    tx: &mut PgConnection,
    payment_id: Uuid,
    key: &str,
) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refund WHERE payment_id = $1 AND idempotency_key = $2"
    ))
    .bind(payment_id)
    .bind(key)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Whether any refund of the payment is still pending.
pub(crate) async fn any_pending(
    tx: &mut PgConnection,
    payment_id: Uuid,
) -> Result<bool, StoreError> {
    let row = sqlx::query(
        "SELECT EXISTS (SELECT 1 FROM refund WHERE payment_id = $1 AND status = 'pending')",
    )
    .bind(payment_id)
    .fetch_one(tx)
    .await?;
    Ok(row.try_get(0)?)
}

/// Sum of the payment's refunds that are not failed. Called with the payment
/// row locked, so concurrent refunds of one payment are serialised.
pub(crate) async fn committed_sum(
    tx: &mut PgConnection,
    payment_id: Uuid,
) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COALESCE(sum(amount), 0)::bigint AS total FROM refund
          WHERE payment_id = $1 AND status <> 'failed'",
    )
    .bind(payment_id)
    .fetch_one(tx)
    .await?;
    Ok(row.try_get("total")?)
}

/// Reads one of the merchant's refunds.
pub async fn get(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refund WHERE id = $1 AND merchant_id = $2"
    ))
    .bind(id)
    .bind(merchant_id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Reads and row-locks a refund.
pub async fn lock(tx: &mut PgConnection, id: Uuid) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refund WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Finds a refund by the provider's id or our id (the provider key). No
/// lock: settlement locks order, payment, refund in that order.
pub(crate) async fn find_by_provider_id(
    tx: &mut PgConnection,
    provider_refund_id: &str,
    refund_id: Option<Uuid>,
) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refund WHERE provider_refund_id = $1 OR id = $2 ORDER BY id = $2 DESC LIMIT 1"
    ))
    .bind(provider_refund_id)
    .bind(refund_id)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Writes a status the domain decided.
pub(crate) async fn set_status(
    tx: &mut PgConnection,
    id: Uuid,
    status: PaymentStatus,
    provider_refund_id: Option<&str>,
    failure_code: Option<&str>,
) -> Result<Refund, StoreError> {
    let row = sqlx::query(concat!(
        "UPDATE refund SET status = $2, provider_refund_id = COALESCE(provider_refund_id, $3),
                failure_code = COALESCE($4, failure_code), updated_at = now()
          WHERE id = $1 RETURNING ",
        refund_columns!()
    ))
    .bind(id)
    .bind(status.as_str())
    .bind(provider_refund_id)
    .bind(failure_code)
    .fetch_one(tx)
    .await?;
    from_row(&row)
}

/// The reconciler's queues run over this table (`store::queue`).
impl super::queue::Queued for Refund {
    const TABLE: super::queue::Table = super::queue::Table {
        name: "refund",
        alias: "r",
        returning: concat!(refund_columns_r!(), ", r.merchant_id"),
        next_look: next_check_after_claim!("r"),
    };

    fn from_row(row: &PgRow) -> Result<Refund, StoreError> {
        from_row(row)
    }
}

/// Makes the pending refunds of the charge `charge_id` at `provider` due
/// for the reconciler now; how many.
pub(crate) async fn due_now_for_charge(
    conn: &mut PgConnection,
    provider: &str,
    charge_id: &str,
) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "UPDATE refund r SET next_check_at = now()
           FROM payment_attempt p
          WHERE p.id = r.payment_id AND p.provider = $1 AND p.provider_charge_id = $2
            AND r.status = 'pending'",
    )
    .bind(provider)
    .bind(charge_id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The payment and order a refund belongs to (no lock: used to lock those first).
pub(crate) async fn owners_of(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<(Uuid, Uuid)>, StoreError> {
    let row = sqlx::query(
        "SELECT r.payment_id, p.order_id FROM refund r
           JOIN payment_attempt p ON p.id = r.payment_id WHERE r.id = $1",
    )
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.map(|r| Ok((r.try_get("payment_id")?, r.try_get("order_id")?)))
        .transpose()
}

/// Reads a refund by id alone (internal: the caller already scoped it).
pub async fn by_id(conn: &mut PgConnection, id: Uuid) -> Result<Option<Refund>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refund WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// `provider`'s succeeded refunds, paid back to their payment's method,
/// that last changed at or after `since` (their success, in practice) and
/// were not read again since `read_before`, the least recently read first,
/// at most `limit`: what the books pass reads again for a failure after
/// success (`books::read_back`). Those created in `[from, until)` are
/// left out: the run's walk of that window compared them with the
/// provider's list a moment ago. `refund_reversal_watch_idx` (V28) keeps
/// the look to the recent ones.
pub(crate) async fn to_read_back(
    pool: &sqlx::PgPool,
    provider: &str,
    (since, read_before): (DateTime<Utc>, DateTime<Utc>),
    (from, until): (DateTime<Utc>, DateTime<Utc>),
    limit: i64,
) -> Result<Vec<Refund>, StoreError> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        refund_columns_r!(),
        " FROM refund r JOIN payment_attempt p ON p.id = r.payment_id
          WHERE r.status = 'succeeded' AND r.updated_at >= $2 AND r.destination = 'original'
            AND p.provider = $1
            AND (r.reversal_checked_at IS NULL OR r.reversal_checked_at < $3)
            AND NOT (r.created_at >= $5 AND r.created_at < $6)
          ORDER BY r.reversal_checked_at NULLS FIRST, r.id
          LIMIT $4"
    ))
    .bind(provider)
    .bind(since)
    .bind(read_before)
    .bind(limit)
    .bind(from)
    .bind(until)
    .fetch_all(pool)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Notes that the refunds `ids` were read again from their provider at
/// `at` (it changes nothing else: their `updated_at` stays their success).
pub(crate) async fn read_back(
    pool: &sqlx::PgPool,
    ids: &[Uuid],
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE refund SET reversal_checked_at = $2 WHERE id = ANY($1)")
        .bind(ids)
        .bind(at)
        .execute(pool)
        .await?;
    Ok(())
}

/// One page of the merchant's rows, newest first, and whether there are more
/// (see `store::pages`).
pub async fn list(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    page: &super::pages::PageRequest,
) -> Result<(Vec<Refund>, bool), StoreError> {
    super::pages::fetch(
        pool,
        concat!("SELECT ", refund_columns_r!(), " FROM refund r"),
        "r",
        "(SELECT o.customer_id FROM payment_attempt pa JOIN orders o ON o.id = pa.order_id WHERE pa.id = r.payment_id)",
        merchant_id,
        page,
        from_row,
    )
    .await
}
