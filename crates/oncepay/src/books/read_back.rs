//! What only a webhook would have told, read back from the provider by
//! the books pass, so that a webhook never sent or never taken (no secret
//! set, an endpoint down, the provider's retries over) loses nothing:
//!
//! - **A refund that fails after it succeeded** (a card refund the issuer
//!   returned: the card was closed or expired). Nothing but its webhook
//!   says so, and a provider's list of refunds cannot be filtered by a
//!   change of status (Stripe's is filtered by creation only), so our
//!   succeeded refunds of the last [`REVERSAL_WATCH`] are read again one
//!   by one (`find_refund`), the least recently read first (but those the
//!   run's walk just compared with the provider's list: created in its
//!   window, where a failure is applied the same way). One failed
//!   since is applied by `settle::refund`, as its webhook would have been
//!   (`Transition::Reversed`: failed, its amount refundable again, the
//!   order paid again, a `refund_failed_after_success` incident,
//!   `refund.failed`).
//! - **Disputes**: the provider's disputes created in the run's window
//!   (`list_disputes`), then ours still open read again by id
//!   (`find_dispute`: one that moved since), each applied by the function
//!   the webhook applies one with (`inbound::disputes::apply_read`): the
//!   same events, metric and evidence alert.
//!
//! Each kind reads at most `Options::read_back` objects of a provider per
//! pass (`ONCEPAY_BOOKS_READ_BACK_LIMIT`), in batches paced as the walk's
//! pages are (a batch, then as long a pause, so the pass never competes
//! with payments). A run cut off here resumes without reading again what
//! it read (reads since the run's start count). A provider that stops
//! answering ends the phase early; the rest waits for the next pass, first
//! in line.

use std::time::{Duration, Instant};

use chrono::Utc;
use uuid::Uuid;

use super::walk::{provider_error, unix_ceil};
use super::{BooksError, Options};
use crate::commands::settle::{self, Cause};
use crate::commands::AppContext;
use crate::domain::adoption::{refund_agreement, Agreement};
use crate::domain::payment::{Refund, Transition};
use crate::inbound::disputes::{apply_read, ReadBack};
use crate::provider::{CallOutcome, DisputeRead, PaymentProvider, ProviderDispute};
use crate::store;
use crate::store::books::{Counts, Run};

/// How long after it succeeded a refund is read again for a failure. A
/// card refund fails when the issuer returns it, days after it succeeded;
/// Stripe bounds neither when nor how often, so oncepay watches a month
/// (docs/providers/stripe.md, "What the books read back").
pub(crate) const REVERSAL_WATCH: Duration = Duration::from_secs(30 * 86_400);

/// Objects read per batch, between the pauses.
const BATCH: usize = 50;

/// Unknown answers in a row after which the provider is taken for down.
const UNKNOWN_IN_A_ROW: u32 = 3;

/// Reads back `provider`'s disputes, then its refunds (disputes first: an
/// evidence deadline runs).
pub(super) async fn read_back(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &Run,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut counts = disputes(ctx, provider, run, options).await?;
    counts += refunds(ctx, provider, run, options).await?;
    Ok(counts)
}

/// The walk's pace: as long a pause as the batch took.
async fn pace(started: Instant) {
    tokio::time::sleep(started.elapsed()).await;
}

/// The provider's disputes created in the run's window, then ours still
/// open that the listing did not cover, read by id.
async fn disputes(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &Run,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut counts = Counts::default();
    let window = (run.window_from.timestamp(), unix_ceil(run.window_until));
    let mut listed: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let started = Instant::now();
        let page = provider
            .list_disputes(window, after.as_deref())
            .await
            .map_err(|e| provider_error(provider, e))?;
        for truth in &page.disputes {
            if apply(ctx, provider, truth, options).await? {
                counts.disputes += 1;
            }
            listed.push(truth.id.clone());
        }
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        pace(started).await;
    }
    if !options.dry_run {
        store::disputes::read_back(&ctx.pool, provider.name(), &listed, Utc::now()).await?;
    }
    // A dispute opened before the window moves on at the provider (a
    // chargeback after an inquiry, evidence reviewed, won or lost): read
    // again by id while we hold it open.
    let limit = i64::try_from(options.read_back).unwrap_or(i64::MAX);
    let open: Vec<String> =
        store::disputes::open_to_read_back(&ctx.pool, provider.name(), run.started_at, limit)
            .await?
            .into_iter()
            .filter(|id| !listed.contains(id))
            .collect();
    let mut unknown = 0;
    for batch in open.chunks(BATCH) {
        let started = Instant::now();
        let mut read: Vec<String> = Vec::with_capacity(batch.len());
        for id in batch {
            match provider.find_dispute(id).await {
                DisputeRead::Known(truth) if truth.id == *id => {
                    unknown = 0;
                    if apply(ctx, provider, &truth, options).await? {
                        counts.disputes += 1;
                    }
                }
                DisputeRead::Known(truth) => {
                    unknown = 0;
                    tracing::error!(provider = provider.name(), dispute = %id, answered = %truth.id, "reading a dispute back answered another one; nothing applied");
                }
                DisputeRead::NotFound => {
                    unknown = 0;
                    tracing::warn!(provider = provider.name(), dispute = %id, "a dispute held open here is not at the provider; nothing applied");
                }
                DisputeRead::Unknown(reason) => {
                    unknown += 1;
                    tracing::warn!(provider = provider.name(), dispute = %id, %reason, "a dispute could not be read back; read again next pass");
                }
            }
            read.push(id.clone());
            if unknown >= UNKNOWN_IN_A_ROW {
                break;
            }
        }
        if !options.dry_run {
            store::disputes::read_back(&ctx.pool, provider.name(), &read, Utc::now()).await?;
        }
        if unknown >= UNKNOWN_IN_A_ROW {
            tracing::warn!(
                provider = provider.name(),
                "reading disputes back stopped: the provider does not answer; the rest waits for the next pass"
            );
            break;
        }
        pace(started).await;
    }
    Ok(counts)
}

/// Applies a dispute read from the provider as its webhook would have;
/// whether that changed what we hold (in a dry run: whether it would, by
/// its provider status).
async fn apply(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    truth: &ProviderDispute,
    options: Options,
) -> Result<bool, BooksError> {
    if options.dry_run {
        let mut conn = ctx.pool.acquire().await?;
        let ours = store::payments::by_charge(&mut conn, provider.name(), &truth.charge)
            .await?
            .is_some();
        drop(conn);
        let held =
            store::disputes::held_provider_status(&ctx.pool, provider.name(), &truth.id).await?;
        return Ok(ours && held.as_deref() != Some(truth.provider_status.as_str()));
    }
    Ok(match apply_read(ctx, provider.name(), truth).await? {
        ReadBack::Changed => true,
        ReadBack::Unchanged => false,
        // The provider's account serves more than oncepay: not ours to keep.
        ReadBack::NotOurs => {
            tracing::debug!(provider = provider.name(), dispute = %truth.id, charge = %truth.charge, "a dispute of a charge oncepay does not hold");
            false
        }
    })
}

/// What reading one refund back came to.
enum Reread {
    /// It failed after it succeeded: applied (in a dry run: would be).
    Reversed,
    /// Nothing to apply.
    Unchanged,
    /// The provider could not be asked, or its answer proves nothing.
    Unknown,
}

/// Our succeeded refunds of the last [`REVERSAL_WATCH`], read again.
async fn refunds(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &Run,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut counts = Counts::default();
    let since = Utc::now() - chrono::Duration::from_std(REVERSAL_WATCH).unwrap_or_default();
    let limit = i64::try_from(options.read_back).unwrap_or(i64::MAX);
    // Those created in the run's window were compared with the provider's
    // list by its walk a moment ago (and reversed there if they failed).
    let walked = (run.window_from, run.window_until);
    let due = store::refunds::to_read_back(
        &ctx.pool,
        provider.name(),
        (since, run.started_at),
        walked,
        limit,
    )
    .await?;
    if !due.is_empty() && due.len() >= options.read_back {
        tracing::warn!(
            provider = provider.name(),
            limit = options.read_back,
            "more succeeded refunds than ONCEPAY_BOOKS_READ_BACK_LIMIT are due to be read back: the least recently read wait for the next pass (raise the limit to read each every pass)"
        );
    }
    let mut unknown = 0;
    for batch in due.chunks(BATCH) {
        let started = Instant::now();
        let mut read: Vec<Uuid> = Vec::with_capacity(batch.len());
        for refund in batch {
            match reread(ctx, provider, refund, options).await? {
                Reread::Reversed => {
                    unknown = 0;
                    counts.reversed += 1;
                }
                Reread::Unchanged => unknown = 0,
                Reread::Unknown => unknown += 1,
            }
            read.push(refund.id);
            if unknown >= UNKNOWN_IN_A_ROW {
                break;
            }
        }
        if !options.dry_run {
            store::refunds::read_back(&ctx.pool, &read, Utc::now()).await?;
        }
        if unknown >= UNKNOWN_IN_A_ROW {
            tracing::warn!(
                provider = provider.name(),
                "reading refunds back stopped: the provider does not answer; the rest waits for the next pass"
            );
            break;
        }
        pace(started).await;
    }
    Ok(counts)
}

/// Reads one succeeded refund again; a failure since is applied as its
/// webhook would have applied it.
async fn reread(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    refund: &Refund,
    options: Options,
) -> Result<Reread, BooksError> {
    let sent = crate::commands::refunds::sent(ctx, refund).await?;
    let observed = match provider
        .find_refund(&sent.request, sent.reference.as_deref())
        .await
    {
        CallOutcome::Known(observed) => observed,
        // A succeeded refund the provider lacks is the walk's
        // `missing_at_provider` incident while in its window.
        CallOutcome::NotFound => {
            tracing::warn!(refund_id = %refund.id, provider = provider.name(), "a succeeded refund read back: the provider has no record of it");
            return Ok(Reread::Unchanged);
        }
        CallOutcome::Unknown(reason) => {
            tracing::warn!(refund_id = %refund.id, provider = provider.name(), %reason, "a succeeded refund could not be read back; read again next pass");
            return Ok(Reread::Unknown);
        }
    };
    if let Some(ours) = refund.provider_refund_id.as_deref() {
        if !observed.id.is_empty() && observed.id != ours {
            tracing::error!(refund_id = %refund.id, ours, answered = %observed.id, "reading a refund back answered another one; nothing applied");
            return Ok(Reread::Unchanged);
        }
    }
    if refund_agreement(refund.status, observed.status) != Agreement::Reverse {
        return Ok(Reread::Unchanged);
    }
    if options.dry_run {
        return Ok(Reread::Reversed);
    }
    let mut tx = ctx.pool.begin().await?;
    let (_, transition) = settle::refund(
        &mut tx,
        &ctx.metrics,
        refund.id,
        &observed,
        Cause::Reconciler,
    )
    .await?;
    tx.commit().await?;
    // Its webhook may have applied it meanwhile: applied once either way.
    Ok(if transition == Transition::Reversed {
        Reread::Reversed
    } else {
        Reread::Unchanged
    })
}
