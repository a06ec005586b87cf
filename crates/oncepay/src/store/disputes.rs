//! SQL of disputes. Every read is scoped by merchant; every update is
//! `… WHERE status NOT IN ('won', 'lost')`, so a closed dispute never
//! reopens whatever a caller does, and moves only forward (the domain's
//! [`DisputeStatus::advance`] decides, the statement re-checks finality).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Corrupt, StoreError};
use crate::domain::dispute::{Dispute, DisputeMove, DisputeStatus};
use crate::domain::payment::Payment;
use crate::provider::ProviderDispute;

/// The columns every read of a dispute returns, in `from_row`'s order.
macro_rules! dispute_columns {
    () => {
        "d.id, d.payment_id, d.order_id, d.provider, d.provider_dispute_id, d.amount, d.currency, d.status, d.provider_status, d.reason, d.evidence_due_by, d.created_at, d.updated_at, d.inquiry"
    };
}

fn from_row(row: &PgRow) -> Result<Dispute, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(Dispute {
        id: row.try_get("id")?,
        payment_id: row.try_get("payment_id")?,
        order_id: row.try_get("order_id")?,
        provider: row.try_get("provider")?,
        provider_dispute_id: row.try_get("provider_dispute_id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: DisputeStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("dispute status", &status))?,
        provider_status: row.try_get("provider_status")?,
        reason: row.try_get("reason")?,
        evidence_due_by: row.try_get("evidence_due_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        inquiry: row.try_get("inquiry")?,
    })
}

/// What the money a payment's disputes hold back from refunds: the
/// amounts of those open or lost (a won one holds nothing). An inquiry
/// (before any chargeback) holds nothing either: no money was withdrawn,
/// and refunding is how a merchant closes one. Called with the payment row
/// locked. The same sum is the trigger `refund_within_disputes`
/// (V19__dispute_holds_in_the_database.sql), the second line of defence.
pub(crate) async fn held_sum(tx: &mut PgConnection, payment_id: Uuid) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COALESCE(sum(amount), 0)::bigint AS total FROM dispute
          WHERE payment_id = $1 AND status <> 'won' AND NOT inquiry",
    )
    .bind(payment_id)
    .fetch_one(tx)
    .await?;
    Ok(row.try_get("total")?)
}

/// What applying a provider's dispute did.
#[derive(Debug)]
pub struct Applied {
    /// Its status before (`None`: new).
    pub before: Option<DisputeStatus>,
    /// The row as it is now.
    pub dispute: Dispute,
    /// Whether anything was written.
    pub changed: bool,
}

/// Applies the provider's `truth` about a dispute of `payment` (whose row
/// the caller has locked, so two reports of one dispute are serialised):
/// inserts it when new, else moves it forward and takes its new facts
/// (deadline, provider status) while it is open. A status its adapter
/// does not know (`truth.status` `None`) moves nothing: a new dispute is
/// held as [`DisputeStatus::UNRECOGNISED`], one held keeps its status (and
/// stays a chargeback unless both say inquiry), and only its
/// `provider_status` and other facts are taken.
pub async fn apply(
    tx: &mut PgConnection,
    payment: &Payment,
    truth: &ProviderDispute,
    now: DateTime<Utc>,
) -> Result<Applied, StoreError> {
    let due = truth
        .evidence_due_by
        .and_then(|t| DateTime::<Utc>::from_timestamp(t, 0));
    let held = sqlx::query(concat!(
        "SELECT ",
        dispute_columns!(),
        " FROM dispute d WHERE d.provider = $1 AND d.provider_dispute_id = $2 FOR UPDATE"
    ))
    .bind(&payment.provider)
    .bind(&truth.id)
    .fetch_optional(&mut *tx)
    .await?
    .as_ref()
    .map(from_row)
    .transpose()?;
    let Some(held) = held else {
        let row = sqlx::query(concat!(
            "INSERT INTO dispute AS d (id, merchant_id, payment_id, order_id, provider,
                provider_dispute_id, amount, currency, status, provider_status, reason,
                evidence_due_by, created_at, updated_at, inquiry)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $13, $14)
             RETURNING ",
            dispute_columns!()
        ))
        .bind(Uuid::now_v7())
        .bind(payment.merchant_id)
        .bind(payment.id)
        .bind(payment.order_id)
        .bind(&payment.provider)
        .bind(&truth.id)
        .bind(truth.amount)
        .bind(&payment.currency)
        .bind(truth.status.unwrap_or(DisputeStatus::UNRECOGNISED).as_str())
        .bind(&truth.provider_status)
        .bind(&truth.reason)
        .bind(due)
        .bind(now)
        .bind(truth.inquiry)
        .fetch_one(&mut *tx)
        .await?;
        return Ok(Applied {
            before: None,
            dispute: from_row(&row)?,
            changed: true,
        });
    };
    let (status, inquiry) = match truth.status {
        None => (held.status, held.inquiry && truth.inquiry),
        Some(observed) => match held
            .status
            .advance_phase(held.inquiry, observed, truth.inquiry)
        {
            DisputeMove::Advance(status) => (status, truth.inquiry),
            DisputeMove::Unchanged => (held.status, truth.inquiry),
            DisputeMove::Ignored => {
                return Ok(Applied {
                    before: Some(held.status),
                    dispute: held,
                    changed: false,
                })
            }
        },
    };
    let same = status == held.status
        && held.inquiry == inquiry
        && held.provider_status == truth.provider_status
        && held.evidence_due_by == due
        && held.amount == truth.amount
        && held.reason == truth.reason;
    if same {
        return Ok(Applied {
            before: Some(held.status),
            dispute: held,
            changed: false,
        });
    }
    let row = sqlx::query(concat!(
        "UPDATE dispute AS d SET status = $2, provider_status = $3, amount = $4, reason = $5,
                evidence_due_by = $6, updated_at = $7, inquiry = $8
          WHERE d.id = $1 AND d.status NOT IN ('won', 'lost')
         RETURNING ",
        dispute_columns!()
    ))
    .bind(held.id)
    .bind(status.as_str())
    .bind(&truth.provider_status)
    .bind(truth.amount)
    .bind(&truth.reason)
    .bind(due)
    .bind(now)
    .bind(inquiry)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(match row {
        Some(row) => Applied {
            before: Some(held.status),
            dispute: from_row(&row)?,
            changed: true,
        },
        None => Applied {
            before: Some(held.status),
            dispute: held,
            changed: false,
        },
    })
}

/// Reads one of the merchant's disputes.
pub async fn get(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<Dispute>, StoreError> {
    sqlx::query(concat!(
        "SELECT ",
        dispute_columns!(),
        " FROM dispute d WHERE d.merchant_id = $1 AND d.id = $2"
    ))
    .bind(merchant_id)
    .bind(id)
    .fetch_optional(conn)
    .await?
    .as_ref()
    .map(from_row)
    .transpose()
}

/// The latest dispute of each of these payments (a payment's `dispute`).
pub async fn of_payments(
    conn: &mut PgConnection,
    payment_ids: &[Uuid],
) -> Result<Vec<Dispute>, StoreError> {
    if payment_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(concat!(
        "SELECT DISTINCT ON (d.payment_id) ",
        dispute_columns!(),
        " FROM dispute d WHERE d.payment_id = ANY($1) ORDER BY d.payment_id, d.id DESC"
    ))
    .bind(payment_ids)
    .fetch_all(conn)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Sets each payment's `dispute` to its latest one.
pub async fn attach(conn: &mut PgConnection, payments: &mut [Payment]) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = payments.iter().map(|p| p.id).collect();
    let disputes = of_payments(conn, &ids).await?;
    for payment in payments.iter_mut() {
        payment.dispute = disputes
            .iter()
            .find(|d| d.payment_id == payment.id)
            .cloned()
            .map(Box::new);
    }
    Ok(())
}

/// `GET /disputes`: a page of the merchant's disputes, newest first.
pub async fn list(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    page: &super::pages::PageRequest,
) -> Result<(Vec<Dispute>, bool), StoreError> {
    super::pages::fetch(
        pool,
        concat!("SELECT ", dispute_columns!(), " FROM dispute d"),
        "d",
        "(SELECT o.customer_id FROM orders o WHERE o.id = d.order_id)",
        merchant_id,
        page,
        from_row,
    )
    .await
}

/// The provider's ids of `provider`'s disputes still open here that were
/// not read again since `read_before`, the least recently read first, at
/// most `limit`: what the books pass reads again by id, so that a dispute
/// that moved at the provider without a webhook is applied
/// (`books::read_back`).
pub(crate) async fn open_to_read_back(
    pool: &sqlx::PgPool,
    provider: &str,
    read_before: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT provider_dispute_id FROM dispute
          WHERE provider = $1 AND status NOT IN ('won', 'lost')
            AND (read_back_at IS NULL OR read_back_at < $2)
          ORDER BY read_back_at NULLS FIRST, id
          LIMIT $3",
    )
    .bind(provider)
    .bind(read_before)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(ids)
}

/// Notes that `provider`'s disputes `ids` were read from it at `at`.
pub(crate) async fn read_back(
    pool: &sqlx::PgPool,
    provider: &str,
    ids: &[String],
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE dispute SET read_back_at = $3
          WHERE provider = $1 AND provider_dispute_id = ANY($2)",
    )
    .bind(provider)
    .bind(ids)
    .bind(at)
    .execute(pool)
    .await?;
    Ok(())
}

/// The provider's status of `provider`'s dispute `id` as we hold it, if
/// we hold it (what a dry run compares with).
pub(crate) async fn held_provider_status(
    pool: &sqlx::PgPool,
    provider: &str,
    id: &str,
) -> Result<Option<String>, StoreError> {
    let status: Option<String> = sqlx::query_scalar(
        "SELECT provider_status FROM dispute WHERE provider = $1 AND provider_dispute_id = $2",
    )
    .bind(provider)
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(status)
}

/// Disputes waiting for the merchant's evidence (`needs_response`) whose
/// deadline is within `within` from now (or already past), for the
/// `oncepay_disputes_evidence_due_soon` gauge.
pub async fn evidence_due_within(
    pool: &sqlx::PgPool,
    within: std::time::Duration,
) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT count(*)::bigint AS n FROM dispute
          WHERE status = 'needs_response' AND evidence_due_by IS NOT NULL
            AND evidence_due_by <= now() + make_interval(secs => $1)",
    )
    .bind(within.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok(row.try_get("n")?)
}
