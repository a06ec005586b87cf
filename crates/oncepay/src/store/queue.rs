//! The reconciler's two queues, written once for both tables it works on
//! (`payment_attempt`, `refund`): rows `pending` and due for a check
//! (`next_check_at`), and rows `failed` whose decline awaits its one
//! confirming read (`decline_check_at`). A claim pushes the row's next
//! look back (`next_check_after_claim`), which is also its lease, and uses
//! `FOR UPDATE SKIP LOCKED`, so any number of processes share the queues
//! and no two work on one row at once.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// A table the queues run over.
pub struct Table {
    /// Its name.
    pub name: &'static str,
    /// The alias its columns are qualified with.
    pub alias: &'static str,
    /// What a claim returns, qualified with the alias (the row's columns
    /// and its `merchant_id`).
    pub returning: &'static str,
    /// `next_check_after_claim!` for the alias.
    pub next_look: &'static str,
}

/// Which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Pending rows due for a check.
    Due,
    /// Failed rows whose decline awaits its confirming read.
    Declines,
}

impl Queue {
    fn column(self) -> &'static str {
        match self {
            Queue::Due => "next_check_at",
            Queue::Declines => "decline_check_at",
        }
    }

    fn status(self) -> &'static str {
        match self {
            Queue::Due => "pending",
            Queue::Declines => "failed",
        }
    }
}

/// A row type the queues run over: its table, and how a claimed row reads.
pub trait Queued: Sized {
    /// Its table.
    const TABLE: Table;
    /// Reads a row the claim returned.
    fn from_row(row: &PgRow) -> Result<Self, StoreError>;
}

/// Claims up to `limit` pending rows due for a check, pushing their next
/// check back; each with its merchant.
pub(crate) async fn claim_due<T: Queued>(
    pool: &PgPool,
    limit: i64,
) -> Result<Vec<(T, Uuid)>, StoreError> {
    let rows = claim(pool, &T::TABLE, Queue::Due, limit).await?;
    rows.iter()
        .map(|row| Ok((T::from_row(row)?, row.try_get("merchant_id")?)))
        .collect()
}

/// Claims up to `limit` failed rows whose decline is due for its
/// confirming read, pushing the next try back as [`claim_due`] does: a
/// read that proves nothing is tried again later.
pub(crate) async fn claim_declines_due<T: Queued>(
    pool: &PgPool,
    limit: i64,
) -> Result<Vec<T>, StoreError> {
    let rows = claim(pool, &T::TABLE, Queue::Declines, limit).await?;
    rows.iter().map(T::from_row).collect()
}

/// Claims up to `limit` rows of `queue`, pushing each one's next look back.
async fn claim(
    pool: &PgPool,
    table: &Table,
    queue: Queue,
    limit: i64,
) -> Result<Vec<PgRow>, StoreError> {
    let (name, a, column) = (table.name, table.alias, queue.column());
    let sql = format!(
        "UPDATE {name} {a}
            SET {column} = {next}, check_count = {a}.check_count + 1
           FROM (SELECT id FROM {name}
                  WHERE status = '{status}' AND {column} <= now()
                  ORDER BY {column} LIMIT $1 FOR UPDATE SKIP LOCKED) due
          WHERE {a}.id = due.id
         RETURNING {returning}",
        next = table.next_look,
        status = queue.status(),
        returning = table.returning,
    );
    Ok(sqlx::query(&sql).bind(limit).fetch_all(pool).await?)
}

/// Queues a row that just failed for one confirming status read, due when
/// the reconciler would have checked it had it stayed pending.
pub(crate) async fn confirm_decline_later<T: Queued>(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE {} SET decline_check_at = next_check_at WHERE id = $1",
        T::TABLE.name
    );
    sqlx::query(&sql).bind(id).execute(tx).await?;
    Ok(())
}

/// Takes a row off the queue of declines to confirm: the provider's record
/// was read.
pub(crate) async fn decline_confirmed<T: Queued>(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE {} SET decline_check_at = NULL WHERE id = $1",
        T::TABLE.name
    );
    sqlx::query(&sql).bind(id).execute(tx).await?;
    Ok(())
}

/// Makes every row that has backed off in either queue due now, its
/// back-off started over: the provider answers again. Returns how many.
pub(crate) async fn reset_backoff<T: Queued>(pool: &PgPool) -> Result<u64, StoreError> {
    let name = T::TABLE.name;
    let pending = sqlx::query(&format!(
        "UPDATE {name} SET next_check_at = now(), check_count = 0
          WHERE status = 'pending' AND check_count > 0 AND next_check_at > now()"
    ))
    .execute(pool)
    .await?
    .rows_affected();
    let declines = sqlx::query(&format!(
        "UPDATE {name} SET decline_check_at = now()
          WHERE decline_check_at > now() AND check_count > 0"
    ))
    .execute(pool)
    .await?
    .rows_affected();
    Ok(pending + declines)
}
