//! A run's phases: the provider's charges, then its refunds, page by page
//! from the run's high-water mark, each object examined against our rows;
//! then our succeeded rows the provider does not list; then what only
//! webhooks carry, read back (`read_back.rs`).

use std::collections::HashSet;
use std::time::Instant;

use chrono::{DateTime, Utc};

use super::{at, charges, read_back, refunds, BooksError, Options, Trigger, CONSISTENCY_DELAY};
use crate::commands::AppContext;
use crate::provider::{BookEntry, PaymentProvider, SubjectKind};
use crate::store::books::{self as sql, BooksIncident, Counts, Phase, Run};

/// A window's end in a provider's whole seconds: an object created in the
/// window's last, partial second is in it.
pub(super) fn unix_ceil(t: DateTime<Utc>) -> i64 {
    t.timestamp() + i64::from(t.timestamp_subsec_nanos() > 0)
}

/// Walks a run's phases from where it stands.
pub(super) async fn finish(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    mut run: Run,
    options: Options,
) -> Result<Run, BooksError> {
    let started = Instant::now();
    loop {
        let next = match run.phase {
            Phase::Charges => {
                walk(ctx, provider, &mut run, SubjectKind::Charge, options).await?;
                Phase::Refunds
            }
            Phase::Refunds => {
                walk(ctx, provider, &mut run, SubjectKind::Refund, options).await?;
                Phase::Missing
            }
            Phase::Missing => {
                let counts = missing(ctx, provider, &run, options).await?;
                record(ctx, &counts);
                run.counts += counts;
                let next = match options.trigger {
                    // A restore's gap is urgent (money commands wait for
                    // it); what only webhooks carry waits for the next
                    // scheduled pass.
                    Trigger::Restore => Phase::Done,
                    Trigger::Cli | Trigger::Schedule => Phase::ReadBack,
                };
                let mut conn = ctx.pool.acquire().await?;
                sql::advance(&mut conn, run.id, next, run.window_until, counts).await?;
                next
            }
            Phase::ReadBack => {
                let counts = match options.trigger {
                    Trigger::Restore => Counts::default(),
                    Trigger::Cli | Trigger::Schedule => {
                        read_back::read_back(ctx, provider, &run, options).await?
                    }
                };
                record(ctx, &counts);
                run.counts += counts;
                let mut conn = ctx.pool.acquire().await?;
                sql::advance(&mut conn, run.id, Phase::Done, run.window_until, counts).await?;
                Phase::Done
            }
            Phase::Done => break,
        };
        if matches!(next, Phase::Refunds | Phase::Missing) {
            let mut conn = ctx.pool.acquire().await?;
            sql::advance(&mut conn, run.id, next, run.window_from, Counts::default()).await?;
            run.position = run.window_from;
        }
        run.phase = next;
    }
    let mut conn = ctx.pool.acquire().await?;
    let run = sql::run_by_id(&mut conn, run.id).await?.unwrap_or(run);
    let c = run.counts;
    tracing::info!(
        run = %run.id, provider = %run.provider, trigger = %run.trigger, dry_run = run.dry_run,
        from = %run.window_from, until = %run.window_until,
        matched = c.matched, adopted = c.adopted, refunded = c.refunded, held = c.held,
        mismatched = c.mismatched, missing = c.missing, reversed = c.reversed,
        disputes = c.disputes, seconds = started.elapsed().as_secs_f64(),
        "books reconciled"
    );
    if !run.dry_run {
        ctx.metrics
            .books_last_run
            .set(Utc::now().timestamp() as f64);
    }
    Ok(run)
}

fn record(ctx: &AppContext, c: &Counts) {
    for (outcome, n) in [
        ("matched", c.matched),
        ("adopted", c.adopted),
        ("refunded", c.refunded),
        ("held", c.held),
        ("mismatched", c.mismatched),
        ("missing", c.missing),
        ("reversed", c.reversed),
        ("disputes", c.disputes),
    ] {
        if n > 0 {
            ctx.metrics
                .books_objects
                .with_label_values(&[outcome])
                .inc_by(n as u64);
        }
    }
}

pub(super) fn provider_error(provider: &dyn PaymentProvider, reason: String) -> BooksError {
    BooksError::Provider {
        provider: provider.name().to_string(),
        reason,
    }
}

/// One phase: the provider's `kind` objects from the run's position to the
/// window's end, page by page, storing the high-water mark after each.
async fn walk(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &mut Run,
    kind: SubjectKind,
    options: Options,
) -> Result<(), BooksError> {
    let window = (run.position.timestamp(), unix_ceil(run.window_until));
    let mut after: Option<String> = None;
    loop {
        let page = provider
            .list_books(kind, window, after.as_deref())
            .await
            .map_err(|e| provider_error(provider, e))?;
        let started = Instant::now();
        let mut counts = Counts::default();
        for entry in &page.entries {
            counts += examine(ctx, provider, entry, options).await?;
        }
        // A list oldest first (the sandbox's, localstripe's) resumes from
        // the last creation time handled; another keeps the mark where it
        // is, and a resumed run reads those objects again (harmlessly).
        let ascending = page
            .entries
            .windows(2)
            .all(|w| w[0].created <= w[1].created);
        if let (true, Some(last)) = (ascending, page.entries.last()) {
            run.position = run.position.max(at(last.created));
        }
        record(ctx, &counts);
        run.counts += counts;
        let phase = run.phase;
        let mut conn = ctx.pool.acquire().await?;
        sql::advance(&mut conn, run.id, phase, run.position, counts).await?;
        drop(conn);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
        // Paced: at most half of the time is spent on the books, so the
        // pass never competes with payments. A restore's gap is urgent:
        // money commands wait for it.
        if options.trigger != Trigger::Restore {
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

async fn examine(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    options: Options,
) -> Result<Counts, BooksError> {
    // An object that carries no trace is not oncepay's (or predates it).
    let Some(trace) = &entry.trace else {
        return Ok(Counts::default());
    };
    match entry.kind {
        SubjectKind::Charge => charges::examine(ctx, provider, entry, trace, options).await,
        SubjectKind::Refund => refunds::examine(ctx, provider, entry, trace, options).await,
    }
}

/// Our succeeded charges and refunds in the window (inside its edges by
/// [`CONSISTENCY_DELAY`]) that the provider does not list: each an
/// incident. The provider's ids are listed afresh, so a resumed run needs
/// nothing from the run it resumes.
async fn missing(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &Run,
    options: Options,
) -> Result<Counts, BooksError> {
    let edge = chrono::Duration::from_std(CONSISTENCY_DELAY).unwrap_or_default();
    let inner = (run.window_from + edge, run.window_until - edge);
    if inner.0 >= inner.1 {
        return Ok(Counts::default());
    }
    let window = (
        run.window_from.timestamp(),
        run.window_until.timestamp() + 1,
    );
    let mut counts = Counts::default();
    for (kind, refunds) in [(SubjectKind::Charge, false), (SubjectKind::Refund, true)] {
        let mut listed = HashSet::new();
        let mut after: Option<String> = None;
        loop {
            let page = provider
                .list_books(kind, window, after.as_deref())
                .await
                .map_err(|e| provider_error(provider, e))?;
            listed.extend(page.entries.into_iter().map(|e| e.state.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for held in sql::succeeded_in(&ctx.pool, provider.name(), refunds, inner).await? {
            if listed.contains(&held.provider_object_id) {
                continue;
            }
            counts.missing += 1;
            if options.dry_run {
                continue;
            }
            let detail = format!(
                "our succeeded {} {} is not in the provider's books",
                if refunds { "refund" } else { "payment" },
                held.refund_id.unwrap_or(held.payment_id)
            );
            let mut conn = ctx.pool.acquire().await?;
            let new = sql::record_incident(
                &mut conn,
                &BooksIncident {
                    kind: "missing_at_provider",
                    merchant_id: held.merchant_id,
                    payment_id: Some(held.payment_id),
                    refund_id: held.refund_id,
                    provider: provider.name(),
                    provider_object_id: &held.provider_object_id,
                    amount: held.amount,
                    detail: &detail,
                    resolution: None,
                },
            )
            .await?;
            if new {
                ctx.metrics
                    .incidents
                    .with_label_values(&["missing_at_provider"])
                    .inc();
                tracing::error!(provider = provider.name(), object = %held.provider_object_id, %detail, "INCIDENT: a row of ours is missing from the provider's books");
            }
        }
    }
    Ok(counts)
}
