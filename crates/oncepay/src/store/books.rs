//! SQL of the books reconciliation (`crate::books`): its runs and their
//! high-water marks, the incidents it records, the rows it checks against
//! the provider's lists, and the database's lineage (the restore guard).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// Arbitrary constant naming the books reconciliation among advisory
/// locks: one process at a time across the fleet.
pub const BOOKS_LOCK: i64 = 0x6f6e_6365_626f_6f6b;

/// The counts of a run: its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Objects whose row agrees (or was settled forward from pending).
    pub matched: i64,
    /// Objects with no row, rebuilt from their metadata.
    pub adopted: i64,
    /// Orphan charges refunded.
    pub refunded: i64,
    /// Orphan charges held for a person.
    pub held: i64,
    /// Objects whose row disagrees.
    pub mismatched: i64,
    /// Our succeeded rows the provider does not have.
    pub missing: i64,
    /// Our succeeded refunds the provider failed since, applied (the
    /// refund failed, its amount refundable again).
    pub reversed: i64,
    /// Disputes read from the provider (listed, or ours still open read
    /// again) that changed what we hold: stored, or moved.
    pub disputes: i64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.matched += o.matched;
        self.adopted += o.adopted;
        self.refunded += o.refunded;
        self.held += o.held;
        self.mismatched += o.mismatched;
        self.missing += o.missing;
        self.reversed += o.reversed;
        self.disputes += o.disputes;
    }
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Walking the provider's charges.
    Charges,
    /// Walking its refunds.
    Refunds,
    /// Looking for our rows it does not have.
    Missing,
    /// Reading back what only webhooks carry (`books::read_back`).
    ReadBack,
    /// Finished: its counts are final.
    Done,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Charges => "charges",
            Phase::Refunds => "refunds",
            Phase::Missing => "missing",
            Phase::ReadBack => "read_back",
            Phase::Done => "done",
        }
    }

    fn parse(text: &str) -> Phase {
        match text {
            "charges" => Phase::Charges,
            "refunds" => Phase::Refunds,
            "missing" => Phase::Missing,
            "read_back" => Phase::ReadBack,
            _ => Phase::Done,
        }
    }
}

/// One run over a window of one provider's books.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The run's id.
    pub id: Uuid,
    /// The provider.
    pub provider: String,
    /// `cli`, `schedule` or `restore`.
    pub trigger: String,
    /// Whether it only reported.
    pub dry_run: bool,
    /// The window's start.
    pub window_from: DateTime<Utc>,
    /// The window's end (exclusive).
    pub window_until: DateTime<Utc>,
    /// The phase reached.
    #[serde(skip)]
    pub phase: Phase,
    /// The high-water mark in the phase.
    pub position: DateTime<Utc>,
    /// The report.
    #[serde(flatten)]
    pub counts: Counts,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When it finished; `null` while under way (or cut off).
    pub finished_at: Option<DateTime<Utc>>,
}

const RUN_COLUMNS: &str = "id, provider, trigger, dry_run, window_from, window_until, phase, \
     position, matched, adopted, refunded, held, mismatched, missing, reversed, disputes, \
     started_at, finished_at";

fn run_from_row(row: &PgRow) -> Result<Run, StoreError> {
    Ok(Run {
        id: row.try_get("id")?,
        provider: row.try_get("provider")?,
        trigger: row.try_get("trigger")?,
        dry_run: row.try_get("dry_run")?,
        window_from: row.try_get("window_from")?,
        window_until: row.try_get("window_until")?,
        phase: Phase::parse(row.try_get("phase")?),
        position: row.try_get("position")?,
        counts: Counts {
            matched: row.try_get("matched")?,
            adopted: row.try_get("adopted")?,
            refunded: row.try_get("refunded")?,
            held: row.try_get("held")?,
            mismatched: row.try_get("mismatched")?,
            missing: row.try_get("missing")?,
            reversed: row.try_get("reversed")?,
            disputes: row.try_get("disputes")?,
        },
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

/// The unfinished run of `provider` (cut off by a crash), to resume.
pub(crate) async fn open_run(
    conn: &mut PgConnection,
    provider: &str,
) -> Result<Option<Run>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {RUN_COLUMNS} FROM books_run
          WHERE provider = $1 AND finished_at IS NULL AND NOT dry_run"
    ))
    .bind(provider)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(run_from_row).transpose()
}

/// Starts a run over `[from, until)`.
pub(crate) async fn start_run(
    conn: &mut PgConnection,
    provider: &str,
    trigger: &str,
    dry_run: bool,
    (from, until): (DateTime<Utc>, DateTime<Utc>),
) -> Result<Run, StoreError> {
    let row = sqlx::query(&format!(
        "INSERT INTO books_run (id, provider, trigger, dry_run, window_from, window_until, position)
         VALUES ($1, $2, $3, $4, $5, $6, $5)
         RETURNING {RUN_COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(provider)
    .bind(trigger)
    .bind(dry_run)
    .bind(from)
    .bind(until)
    .fetch_one(conn)
    .await?;
    run_from_row(&row)
}

/// Stores a run's progress: the phase and high-water mark reached, and the
/// counts so far (added to what is stored).
pub(crate) async fn advance(
    conn: &mut PgConnection,
    run: Uuid,
    phase: Phase,
    position: DateTime<Utc>,
    add: Counts,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE books_run
            SET phase = $2, position = $3, matched = matched + $4, adopted = adopted + $5,
                refunded = refunded + $6, held = held + $7, mismatched = mismatched + $8,
                missing = missing + $9, reversed = reversed + $10,
                disputes = disputes + $11, updated_at = now(),
                finished_at = CASE WHEN $2 = 'done' THEN now() END
          WHERE id = $1",
    )
    .bind(run)
    .bind(phase.as_str())
    .bind(position)
    .bind(add.matched)
    .bind(add.adopted)
    .bind(add.refunded)
    .bind(add.held)
    .bind(add.mismatched)
    .bind(add.missing)
    .bind(add.reversed)
    .bind(add.disputes)
    .execute(conn)
    .await?;
    Ok(())
}

/// A run by id.
pub(crate) async fn run_by_id(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<Run>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {RUN_COLUMNS} FROM books_run WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(run_from_row).transpose()
}

/// An incident the books reconciliation found.
pub struct BooksIncident<'a> {
    /// `orphan_charge`, `books_mismatch` or `missing_at_provider`.
    pub kind: &'static str,
    /// The merchant (the trace's, or the row's).
    pub merchant_id: Uuid,
    /// The attempt, if we have its row.
    pub payment_id: Option<Uuid>,
    /// The refund, if it is about one we have.
    pub refund_id: Option<Uuid>,
    /// The provider.
    pub provider: &'a str,
    /// The provider's object.
    pub provider_object_id: &'a str,
    /// Minor units.
    pub amount: i64,
    /// What disagrees, for a person.
    pub detail: &'a str,
    /// What was done (`held`, `refund_pending`, …), if anything.
    pub resolution: Option<&'a str>,
}

/// Records an incident once per (kind, provider object); returns whether
/// it is new. A merchant that no longer exists cannot own an incident row:
/// nothing is written (the caller logs it).
pub(crate) async fn record_incident(
    conn: &mut PgConnection,
    i: &BooksIncident<'_>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO incident (id, kind, merchant_id, payment_id, refund_id, provider,
                               provider_object_id, amount, detected_by, detail, resolution)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'books', $9, $10
          WHERE EXISTS (SELECT 1 FROM merchant WHERE id = $3)
         ON CONFLICT (kind, provider, provider_object_id)
            WHERE kind IN ('orphan_charge', 'books_mismatch', 'missing_at_provider')
         DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(i.kind)
    .bind(i.merchant_id)
    .bind(i.payment_id)
    .bind(i.refund_id)
    .bind(i.provider)
    .bind(i.provider_object_id)
    .bind(i.amount)
    .bind(i.detail)
    .bind(i.resolution)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The resolution recorded for an orphan charge, if it was seen before.
pub(crate) async fn orphan_resolution(
    conn: &mut PgConnection,
    provider: &str,
    object_id: &str,
) -> Result<Option<Option<String>>, StoreError> {
    let row = sqlx::query(
        "SELECT resolution FROM incident
          WHERE kind = 'orphan_charge' AND provider = $1 AND provider_object_id = $2",
    )
    .bind(provider)
    .bind(object_id)
    .fetch_optional(conn)
    .await?;
    row.map(|r| r.try_get("resolution"))
        .transpose()
        .map_err(Into::into)
}

/// Sets an orphan charge's resolution.
pub(crate) async fn resolve_orphan(
    conn: &mut PgConnection,
    provider: &str,
    object_id: &str,
    resolution: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE incident SET resolution = $3
          WHERE kind = 'orphan_charge' AND provider = $1 AND provider_object_id = $2",
    )
    .bind(provider)
    .bind(object_id)
    .bind(resolution)
    .execute(conn)
    .await?;
    Ok(())
}

/// A succeeded row of ours, as checked against the provider's list.
#[derive(Debug, Clone)]
pub struct Held {
    /// The merchant.
    pub merchant_id: Uuid,
    /// The attempt (for a refund, the one refunded).
    pub payment_id: Uuid,
    /// The refund, for a refund.
    pub refund_id: Option<Uuid>,
    /// The provider's id of it.
    pub provider_object_id: String,
    /// Minor units.
    pub amount: i64,
}

/// Our succeeded charges (`refunds`: refunds) with `provider`, created in
/// `[from, until)`, that carry a provider id.
pub(crate) async fn succeeded_in(
    pool: &PgPool,
    provider: &str,
    refunds: bool,
    (from, until): (DateTime<Utc>, DateTime<Utc>),
) -> Result<Vec<Held>, StoreError> {
    let sql = if refunds {
        "SELECT r.merchant_id, r.payment_id, r.id AS refund_id,
                r.provider_refund_id AS object_id, r.amount
           FROM refund r JOIN payment_attempt p ON p.id = r.payment_id
          WHERE p.provider = $1 AND r.status = 'succeeded' AND r.provider_refund_id IS NOT NULL
            AND r.created_at >= $2 AND r.created_at < $3"
    } else {
        "SELECT merchant_id, id AS payment_id, NULL::uuid AS refund_id,
                provider_charge_id AS object_id, amount
           FROM payment_attempt
          WHERE provider = $1 AND status = 'succeeded' AND provider_charge_id IS NOT NULL
            AND created_at >= $2 AND created_at < $3"
    };
    let rows = sqlx::query(sql)
        .bind(provider)
        .bind(from)
        .bind(until)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Held {
                merchant_id: r.try_get("merchant_id")?,
                payment_id: r.try_get("payment_id")?,
                refund_id: r.try_get("refund_id")?,
                provider_object_id: r.try_get("object_id")?,
                amount: r.try_get("amount")?,
            })
        })
        .collect()
}

/// The database's lineage as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lineage {
    /// The timeline the last process saw.
    pub timeline: i64,
    /// When a process last wrote it.
    pub seen_at: DateTime<Utc>,
    /// The start of a gap being reconciled, if one is.
    pub gap_from: Option<DateTime<Utc>>,
}

/// Where the database's history stands: the PostgreSQL timeline it
/// writes on (a restore to a point in time, like a failover, starts a new
/// one) and the cluster's system identifier (another cluster, e.g. a
/// logical dump restored elsewhere); `None` where PostgreSQL does not let
/// this role read it.
pub(crate) async fn current_lineage(pool: &PgPool) -> Result<(i64, Option<i64>), StoreError> {
    let name: String = sqlx::query_scalar("SELECT pg_walfile_name(pg_current_wal_lsn())")
        .fetch_one(pool)
        .await?;
    let timeline = name
        .get(..8)
        .and_then(|t| i64::from_str_radix(t, 16).ok())
        .ok_or_else(|| super::Corrupt::unknown("WAL file name", &name))?;
    let system: Option<i64> =
        sqlx::query_scalar("SELECT system_identifier::bigint FROM pg_control_system()")
            .fetch_one(pool)
            .await
            .ok();
    Ok((timeline, system))
}

/// Compares the stored lineage with the database's now, in one statement
/// (row-locked, so processes starting together agree): the first sight
/// stores it; a moved timeline or another system opens a gap from the last
/// sight minus `margin` (or keeps the gap already open); otherwise the
/// sight is refreshed. Returns the lineage as it now stands.
pub(crate) async fn observe_lineage(
    pool: &PgPool,
    (timeline, system): (i64, Option<i64>),
    margin: std::time::Duration,
) -> Result<Lineage, StoreError> {
    let row = sqlx::query(
        "INSERT INTO database_lineage AS l (timeline, system_id, seen_at) VALUES ($1, $3, now())
         ON CONFLICT (singleton) DO UPDATE SET
            timeline = EXCLUDED.timeline,
            system_id = coalesce(EXCLUDED.system_id, l.system_id),
            seen_at = now(),
            gap_from = CASE
                WHEN l.timeline <> EXCLUDED.timeline
                  OR l.system_id <> EXCLUDED.system_id
                    THEN least(coalesce(l.gap_from, 'infinity'),
                               l.seen_at - $2::bigint * interval '1 millisecond')
                ELSE l.gap_from END
         RETURNING timeline, seen_at, gap_from",
    )
    .bind(timeline)
    .bind(crate::idempotency::persistence::millis(margin))
    .bind(system)
    .fetch_one(pool)
    .await?;
    Ok(Lineage {
        timeline: row.try_get("timeline")?,
        seen_at: row.try_get("seen_at")?,
        gap_from: row.try_get("gap_from")?,
    })
}

/// Closes the gap that started at `from`, once it was reconciled (a gap
/// opened again meanwhile, further back, stays open).
pub(crate) async fn close_gap(pool: &PgPool, from: DateTime<Utc>) -> Result<(), StoreError> {
    sqlx::query("UPDATE database_lineage SET gap_from = NULL WHERE gap_from >= $1")
        .bind(from)
        .execute(pool)
        .await?;
    Ok(())
}
