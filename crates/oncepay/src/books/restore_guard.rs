//! Reconciliation run by `serve` itself: the restore guard, over a gap in
//! the database's history, and the scheduled pass.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{reconcile, BooksError, Options, OrphanPolicy, Trigger};
use crate::commands::AppContext;
use crate::store::books as sql;

/// How the restore guard looks at the database.
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    /// How far before the last sight a gap starts: commands in flight then
    /// may have reached the provider without their rows surviving.
    pub margin: Duration,
    /// What to do with orphans found in the gap.
    pub policy: OrphanPolicy,
}

/// Stores that this process saw the database on its current timeline and
/// sets the gate: closed (returning the gap's start) while a gap is open.
pub(crate) async fn observe(
    ctx: &AppContext,
    settings: GuardSettings,
) -> Result<Option<DateTime<Utc>>, BooksError> {
    let now = sql::current_lineage(&ctx.pool).await?;
    let lineage = sql::observe_lineage(&ctx.pool, now, settings.margin).await?;
    let timeline = lineage.timeline;
    let Some(gap_from) = lineage.gap_from else {
        ctx.books_gate.set_closed(false);
        return Ok(None);
    };
    if !ctx.books_gate.is_closed() {
        tracing::error!(%gap_from, timeline, "the database went back in time (a restore or a failover): money commands wait until the providers' books are reconciled from the gap's start");
    }
    ctx.books_gate.set_closed(true);
    Ok(Some(gap_from))
}

/// One look of the restore guard (at start and every few seconds): stores
/// that this process saw the database on its current timeline; if the
/// timeline moved since the last sight (a restore, or a failover), the gap
/// from that sight is reconciled with the providers' books before the gate
/// opens. Every process closes its gate while a gap is open; the one that
/// holds the books lock reconciles it.
pub(crate) async fn restore_guard(
    ctx: &AppContext,
    settings: GuardSettings,
) -> Result<(), BooksError> {
    let Some(gap_from) = observe(ctx, settings).await? else {
        return Ok(());
    };
    let options = Options {
        dry_run: false,
        policy: settings.policy,
        trigger: Trigger::Restore,
        // A gap is urgent: the next scheduled pass reads back.
        read_back: 0,
    };
    let until = Utc::now() + chrono::Duration::seconds(2);
    match reconcile(ctx, (gap_from, until), options).await? {
        Some(_) => {
            sql::close_gap(&ctx.pool, gap_from).await?;
            ctx.books_gate.set_closed(false);
            tracing::warn!(%gap_from, "the gap is reconciled; money commands run again");
        }
        None => tracing::info!("another process is reconciling; waiting"),
    }
    Ok(())
}

/// The background pass in `serve` (`ONCEPAY_BOOKS_INTERVAL`): the last
/// `window` of every provider's books, then what only webhooks carry, up
/// to `read_back` of each kind; does nothing while another process
/// reconciles.
pub(crate) async fn scheduled_pass(
    ctx: &AppContext,
    window: Duration,
    policy: OrphanPolicy,
    read_back: usize,
) -> Result<(), BooksError> {
    let until = Utc::now();
    let from = until - chrono::Duration::from_std(window).unwrap_or_default();
    let options = Options {
        dry_run: false,
        policy,
        trigger: Trigger::Schedule,
        read_back,
    };
    if reconcile(ctx, (from, until), options).await?.is_none() {
        tracing::debug!("another process is reconciling the books");
    }
    Ok(())
}
