//! Reconciliation against the provider's books: every charge and refund
//! oncepay sent carries a trace of where it came from (`provider::trace`),
//! so after the database lost rows (a restore from backup, an asynchronous
//! failover, a bug) the provider's lists rebuild them.
//!
//! For every provider object created in the window:
//! - our row exists and agrees → matched (a pending row is settled forward
//!   by the same rules as a webhook, `commands::settle`);
//! - our row disagrees (amount, currency, object, or a status a pending row
//!   does not explain) → a `books_mismatch` incident, logged at error;
//! - we have no row → [`adoption`](crate::domain::adoption::adoption)
//!   decides: rebuild it (the attempt or refund with its own id, its state,
//!   its order's state, its events and the completed idempotency record, so
//!   the client's retry with its key gets the answer it would have had),
//!   or, for a charge no order of ours can own, an `orphan_charge` incident
//!   and, by `ONCEPAY_ORPHAN_POLICY`, a refund (the default) or a hold for
//!   a person;
//! - then our succeeded rows the provider does not list (60 s inside the
//!   window's edges, its consistency allowance) → `missing_at_provider`;
//! - then what only a webhook would have told (`read_back.rs`): our
//!   succeeded refunds of the last 30 days read again (one failed since is
//!   applied as its webhook would have been), the provider's disputes
//!   created in the window, and ours still open read again.
//!
//! One process at a time across the fleet (an advisory lock); a run stores
//! its phase and high-water mark as it goes, so a run cut off by a crash is
//! resumed by the next one, and re-examining an object is harmless.
//!
//! Here: the entry points and a run's settings. `walk.rs` goes through a
//! run's phases and the provider's lists; `charges.rs` and `refunds.rs`
//! examine one object of each kind against our row (a refund failed since
//! it succeeded is applied, not a mismatch); `read_back.rs` reads again
//! what only webhooks carry; `adopt.rs` rebuilds
//! the row we lost (one shape for both kinds), `orphan.rs` deals with a
//! charge no order can own; `outcome.rs` is what examining comes to;
//! `restore_guard.rs` runs reconciliation over a gap in the database's
//! history, and on a schedule.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use crate::commands::AppContext;
use crate::provider::PaymentProvider;
use crate::store::books::{self as sql, Run};
use crate::store::StoreError;

mod adopt;
mod charges;
mod orphan;
mod outcome;
mod read_back;
mod refunds;
mod restore_guard;
mod walk;

pub use crate::commands::gate::Gate;
pub use crate::domain::adoption::OrphanPolicy;
pub use restore_guard::GuardSettings;
pub(crate) use restore_guard::{observe, restore_guard, scheduled_pass};

/// How long after its creation an object must be listed by the provider
/// before its absence is an incident (and how far inside the window's
/// start a row must be): clocks and a provider's list lag a little.
pub(crate) const CONSISTENCY_DELAY: Duration = Duration::from_secs(60);

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `oncepay reconcile`.
    Cli,
    /// The background pass in `serve`.
    Schedule,
    /// The restore guard, over a gap in the database's history.
    Restore,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Cli => "cli",
            Trigger::Schedule => "schedule",
            Trigger::Restore => "restore",
        }
    }
}

/// Why a run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BooksError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider's list could not be read; the run resumes later.
    #[error("reading {provider}'s books: {reason}")]
    Provider {
        /// Which provider.
        provider: String,
        /// What went wrong.
        reason: String,
    },
}

impl From<sqlx::Error> for BooksError {
    fn from(e: sqlx::Error) -> Self {
        BooksError::Store(e.into())
    }
}

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Only report what would be done.
    pub dry_run: bool,
    /// What to do with orphans.
    pub policy: OrphanPolicy,
    /// What started it.
    pub trigger: Trigger,
    /// At most how many of what only webhooks carry are read again from
    /// each provider (`ONCEPAY_BOOKS_READ_BACK_LIMIT`): succeeded refunds,
    /// and disputes still open, each kind the least recently read first.
    pub read_back: usize,
}

/// A provider's creation time (Unix seconds) as ours.
fn at(unix: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(unix, 0).single().unwrap_or_else(Utc::now)
}

/// Reconciles `[from, until)` of every configured provider's books. A run
/// of a provider cut off earlier is finished first. `None` when another
/// process holds the books lock (nothing was done); otherwise this run's
/// report per provider.
pub async fn reconcile(
    ctx: &AppContext,
    window: (DateTime<Utc>, DateTime<Utc>),
    options: Options,
) -> Result<Option<Vec<Run>>, BooksError> {
    let mut lock = ctx.pool.acquire().await?;
    if !options.dry_run {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(sql::BOOKS_LOCK)
            .fetch_one(&mut *lock)
            .await?;
        if !got {
            return Ok(None);
        }
    }
    let mut reports = Vec::new();
    let mut result = Ok(());
    for provider in ctx.providers.with_outside_books() {
        match reconcile_provider(ctx, provider.as_ref(), window, options).await {
            Ok(run) => reports.push(run),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if !options.dry_run {
        // A connection that cannot unlock is closed, which unlocks.
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(sql::BOOKS_LOCK)
            .execute(&mut *lock)
            .await;
        if unlocked.is_err() {
            lock.detach();
        }
    }
    result.map(|()| Some(reports))
}

async fn reconcile_provider(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    window: (DateTime<Utc>, DateTime<Utc>),
    options: Options,
) -> Result<Run, BooksError> {
    let mut conn = ctx.pool.acquire().await?;
    if !options.dry_run {
        if let Some(open) = sql::open_run(&mut conn, provider.name()).await? {
            tracing::warn!(run = %open.id, phase = ?open.phase, position = %open.position, "resuming a books run that was cut off");
            drop(conn);
            walk::finish(ctx, provider, open, options).await?;
            conn = ctx.pool.acquire().await?;
        }
    }
    let run = sql::start_run(
        &mut conn,
        provider.name(),
        options.trigger.as_str(),
        options.dry_run,
        window,
    )
    .await?;
    drop(conn);
    walk::finish(ctx, provider, run, options).await
}
