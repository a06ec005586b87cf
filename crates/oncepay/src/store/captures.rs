//! SQL of captures: one row per capture of a held payment, its id the
//! provider's idempotency key (see migrations V22 and V26 for the
//! constraints: one pending or succeeded per payment, within the amount,
//! never for a voided payment). A capture the provider refused stays
//! `failed` beside the next one, which is a new row, so a new key.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Corrupt, StoreError};
use crate::domain::payment::PaymentStatus;

/// A capture as stored.
#[derive(Debug, Clone)]
pub struct Capture {
    /// UUID v7; the provider's idempotency key of the capture.
    pub id: Uuid,
    /// The held payment it captures.
    pub payment_id: Uuid,
    /// Minor units.
    pub amount: i64,
    /// `pending` until the provider's answer is known.
    pub status: PaymentStatus,
    /// The client's key that made it.
    pub idempotency_key: String,
    /// Why it failed: the provider's code for a capture it refused
    /// (Stripe's `card_declined`, `amount_too_small`), or [`HOLD_ENDED`]
    /// when its hold ended first.
    pub failure_code: Option<String>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
}

/// The columns [`from_row`] reads (a literal, so the statements below are
/// whole constants: `oncepay-bench` runs them as its same-SQL floor).
macro_rules! capture_columns {
    () => {
        "id, payment_id, amount, status, idempotency_key, failure_code, created_at"
    };
}

fn from_row(row: &PgRow) -> Result<Capture, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(Capture {
        id: row.try_get("id")?,
        payment_id: row.try_get("payment_id")?,
        amount: row.try_get("amount")?,
        status: PaymentStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("capture status", &status))?,
        idempotency_key: row.try_get("idempotency_key")?,
        failure_code: row.try_get("failure_code")?,
        created_at: row.try_get("created_at")?,
    })
}

/// The failure code of a capture whose hold ended before it (voided,
/// expired, released): the provider refused nothing of the capture itself.
pub const HOLD_ENDED: &str = "authorization_released";

/// A new pending capture.
pub struct NewCapture<'a> {
    /// Its id (the provider key).
    pub id: Uuid,
    /// The payment's merchant.
    pub merchant_id: Uuid,
    /// The held payment.
    pub payment_id: Uuid,
    /// Minor units.
    pub amount: i64,
    /// The client's key.
    pub idempotency_key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: Option<&'a [u8]>,
    /// When the reconciler first reads it if it stays pending.
    pub check_after: Duration,
}

/// Why a capture could not be inserted.
#[derive(Debug, thiserror::Error)]
pub enum InsertCaptureError {
    /// The payment has a capture pending or made already
    /// (`payment_capture_one_per_payment`), or is no longer a hold the
    /// database lets be captured.
    #[error("the payment cannot take another capture")]
    NotCapturable,
    /// Anything else.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Inserts a pending capture (see [`insert`]).
pub const INSERT: &str = concat!(
    "INSERT INTO payment_capture
                (id, merchant_id, payment_id, amount, status, idempotency_key,
                 request_fingerprint, next_check_at, created_at, updated_at)
         VALUES ($1, $2, $3, $4, 'pending', $5, $6,
                 now() + $7::bigint * interval '1 millisecond', now(), now())
         RETURNING ",
    capture_columns!()
);

/// Inserts a pending capture; the constraints decide races.
pub async fn insert(
    tx: &mut PgConnection,
    new: &NewCapture<'_>,
) -> Result<Capture, InsertCaptureError> {
    let result = sqlx::query(INSERT)
        .bind(new.id)
        .bind(new.merchant_id)
        .bind(new.payment_id)
        .bind(new.amount)
        .bind(new.idempotency_key)
        .bind(new.fingerprint)
        .bind(i64::try_from(new.check_after.as_millis()).unwrap_or(i64::MAX))
        .fetch_one(tx)
        .await;
    match result {
        Ok(row) => Ok(from_row(&row)?),
        Err(e) => match super::violated_constraint(&e) {
            Some(
                "payment_capture_one_per_payment"
                | "payment_capture_of_a_hold"
                | "payment_capture_within_amount",
            ) => Err(InsertCaptureError::NotCapturable),
            _ => Err(InsertCaptureError::Store(e.into())),
        },
    }
}

/// Reads a payment's captures (see [`of_payment`]).
pub const OF_PAYMENT: &str = concat!(
    "SELECT ",
    capture_columns!(),
    " FROM payment_capture
      WHERE payment_id = $1 AND (status <> 'failed' OR idempotency_key = $2)
      ORDER BY created_at, id"
);

/// The payment's capture pending or made, if it has one, and the one made
/// with the client's key `key` (whatever its status), oldest first.
pub async fn of_payment(
    conn: &mut PgConnection,
    payment_id: Uuid,
    key: Option<&str>,
) -> Result<Vec<Capture>, StoreError> {
    let rows = sqlx::query(OF_PAYMENT)
        .bind(payment_id)
        .bind(key)
        .fetch_all(conn)
        .await?;
    rows.iter().map(from_row).collect()
}

/// Ends a pending capture the provider refused (see [`fail`]).
pub const FAIL: &str = concat!(
    "UPDATE payment_capture SET status = 'failed', failure_code = $2, updated_at = now()
          WHERE id = $1 AND status = 'pending'
          RETURNING ",
    capture_columns!()
);

/// Ends the pending capture `id` `failed` with the provider's
/// `failure_code`: the provider refused it and still holds the charge
/// uncaptured. Called with the capture's order and payment locked (the
/// one lock order). `None` if it was no longer pending.
pub async fn fail(
    tx: &mut PgConnection,
    id: Uuid,
    failure_code: &str,
) -> Result<Option<Capture>, StoreError> {
    let row = sqlx::query(FAIL)
        .bind(id)
        .bind(failure_code)
        .fetch_optional(tx)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// Reads a capture by id (see [`by_id`]).
pub const BY_ID: &str = concat!(
    "SELECT ",
    capture_columns!(),
    " FROM payment_capture WHERE id = $1"
);

/// A capture by id, unlocked: a capture's row is locked only after its
/// order and payment (the one lock order: order, payment, capture), by the
/// statement that settles it.
pub async fn by_id(conn: &mut PgConnection, id: Uuid) -> Result<Option<Capture>, StoreError> {
    let row = sqlx::query(BY_ID).bind(id).fetch_optional(conn).await?;
    row.as_ref().map(from_row).transpose()
}

/// Settles a payment's pending capture (see [`settle_of_payment`]).
pub const SETTLE_OF_PAYMENT: &str = concat!(
    "UPDATE payment_capture SET status = $2, failure_code = $3, updated_at = now(),
            -- Settled: a refusal's confirming read has nothing left to tell.
            decline_check_at = NULL
      WHERE id = (
            SELECT c.id FROM payment_capture c
             WHERE c.payment_id = $1
               AND (c.status = 'pending'
                    OR ($2 = 'succeeded' AND c.status = 'failed'
                        AND NOT EXISTS (SELECT 1 FROM payment_capture o
                                         WHERE o.payment_id = $1
                                           AND o.status IN ('pending', 'succeeded'))))
             ORDER BY (c.status = 'pending') DESC, (c.amount = $4) DESC, c.created_at DESC
             LIMIT 1)
      RETURNING ",
    capture_columns!()
);

/// Settles the payment's pending capture, if it has one: `succeeded`
/// when the payment was captured, `failed` ([`HOLD_ENDED`]) when its hold
/// ended without (voided, expired). A payment captured at its provider
/// with no capture pending had its capture answered as refused while the
/// provider made it (an answer replaced on its way, a request delivered
/// after the read that confirmed the refusal): the latest refused capture
/// (of the amount captured, if one is) is the one made, and succeeds.
/// Returns it as it now is.
pub async fn settle_of_payment(
    tx: &mut PgConnection,
    payment_id: Uuid,
    status: PaymentStatus,
    failure_code: Option<&str>,
    amount_captured: Option<i64>,
) -> Result<Option<Capture>, StoreError> {
    let row = sqlx::query(SETTLE_OF_PAYMENT)
        .bind(payment_id)
        .bind(status.as_str())
        .bind(failure_code)
        .bind(amount_captured)
        .fetch_optional(tx)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// The reconciler's queue of pending captures (`store::queue`).
impl super::queue::Queued for Capture {
    const TABLE: super::queue::Table = super::queue::Table {
        name: "payment_capture",
        alias: "c",
        returning:
            "c.id, c.payment_id, c.amount, c.status, c.idempotency_key, c.failure_code, c.created_at, c.merchant_id",
        next_look: next_check_after_claim!("c"),
    };

    fn from_row(row: &PgRow) -> Result<Capture, StoreError> {
        from_row(row)
    }
}
