//! Dispute events (`charge.dispute.created|updated|closed|funds_withdrawn|
//! funds_reinstated`): hints like every provider event. The event names a
//! dispute; oncepay reads that dispute from the provider and applies what
//! the provider says, never what the event says: forward only, a closed
//! dispute never reopens (`store::disputes::apply`). The payment it is
//! about is the one the provider's dispute names (its charge), locked with
//! its order as a refund locks them, so a refund and a dispute of one
//! payment are serialised and the refund rule sees every dispute applied
//! before it. The dispute's change writes its `dispute.*` event to the
//! outbox in the same transaction.
//!
//! The books pass applies a dispute it read without an event (the
//! provider's list of disputes, ours still open read again by id) with the
//! same rule ([`apply_read`]): the same events, metric and log.

use chrono::Utc;
use serde_json::Value;
use sqlx::PgConnection;

use super::Applied;
use crate::commands::settle::Cause;
use crate::commands::AppContext;
use crate::domain::dispute::DisputeChange;
use crate::domain::event::EventOutcome;
use crate::domain::payment::Payment;
use crate::provider::{DisputeRead, Event, ProviderDispute};
use crate::store::{self, StoreError};

/// Applies a verified dispute event naming the provider's dispute `id`.
pub(super) async fn apply(
    ctx: &AppContext,
    provider: &str,
    event_id: &str,
    envelope: &Event,
    id: &str,
    payload: &Value,
) -> Result<Applied, StoreError> {
    // A duplicate is answered before it costs a provider read.
    {
        let mut conn = ctx.pool.acquire().await?;
        if store::inbound::exists(&mut conn, provider, event_id).await? {
            return Ok(Applied::Done(EventOutcome::Duplicate));
        }
    }
    let unapplied = |label: EventOutcome, detail: String| async move {
        ctx.metrics
            .webhook_confirmations
            .with_label_values(&[label.as_str()])
            .inc();
        tracing::warn!(event_type = %envelope.event_type, event_id, dispute = id, %detail, "dispute event not applied");
        let done = store::inbound::Done {
            provider,
            event_id,
            event_type: &envelope.event_type,
            payload,
            outcome: label.as_str(),
            confirmed: false,
            detail: Some(&detail),
        };
        Ok::<_, StoreError>(if store::inbound::record_done(&ctx.pool, &done).await? {
            Applied::Done(label)
        } else {
            Applied::Done(EventOutcome::Duplicate)
        })
    };
    let truth = match ctx.providers.named(provider).find_dispute(id).await {
        DisputeRead::Known(truth) => truth,
        DisputeRead::NotFound => {
            return unapplied(
                EventOutcome::Unconfirmed,
                "the provider has no such dispute".into(),
            )
            .await
        }
        DisputeRead::Unknown(reason) => {
            ctx.metrics
                .webhook_confirmations
                .with_label_values(&["deferred"])
                .inc();
            return Ok(Applied::Deferred(reason));
        }
    };
    if truth.id != id {
        let detail = format!(
            "the event names {id}, the provider's dispute is {}",
            truth.id
        );
        return unapplied(EventOutcome::Mismatch, detail).await;
    }
    // A status its adapter does not know (a newer API's, as Stripe's
    // `prevented` was) is no reason to refuse the event: refused, it would
    // be sent again until the provider gave up, and the dispute never
    // stored.
    unrecognised(ctx, provider, &truth, Some(event_id));
    let payment = {
        let mut conn = ctx.pool.acquire().await?;
        store::payments::by_charge(&mut conn, provider, &truth.charge).await?
    };
    let Some(payment) = payment else {
        // Not a charge of ours: kept, for a person to look at.
        let done = store::inbound::Done {
            provider,
            event_id,
            event_type: &envelope.event_type,
            payload,
            outcome: EventOutcome::UnknownCharge.as_str(),
            confirmed: true,
            detail: Some("the provider's dispute is about a charge oncepay does not hold"),
        };
        if !store::inbound::record_done(&ctx.pool, &done).await? {
            return Ok(Applied::Done(EventOutcome::Duplicate));
        }
        tracing::warn!(event_id, dispute = id, charge = %truth.charge, "dispute of an unknown charge stored");
        return Ok(Applied::Done(EventOutcome::UnknownCharge));
    };
    ctx.metrics
        .webhook_confirmations
        .with_label_values(&["confirmed"])
        .inc();
    let mut tx = ctx.pool.begin().await?;
    if !store::inbound::record(&mut tx, provider, event_id, &envelope.event_type, payload).await? {
        tx.commit().await?;
        return Ok(Applied::Done(EventOutcome::Duplicate));
    }
    let applied = apply_locked(&mut tx, ctx, &payment, &truth, Cause::Webhook).await?;
    let label = if applied.changed || truth.status.is_none() || applied.before == truth.status {
        EventOutcome::Processed
    } else {
        EventOutcome::Ignored
    };
    store::inbound::set_outcome(&mut tx, provider, event_id, label.as_str(), true, None).await?;
    tx.commit().await?;
    committed(ctx, provider, &applied, Cause::Webhook);
    Ok(Applied::Done(label))
}

/// What applying a dispute read from its provider without an event came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadBack {
    /// Stored, or moved: its events were written.
    Changed,
    /// As we hold it already (or a move a closed dispute does not take).
    Unchanged,
    /// About a charge oncepay does not hold (a payment of the provider's
    /// account made elsewhere): nothing is stored.
    NotOurs,
}

/// Applies `truth`, a dispute read from `provider` by the books pass (no
/// event came: an endpoint down, no secret set, the provider's retries
/// over), exactly as its event would have applied it (the same rule,
/// events, metric and log; the events' cause is the reconciler).
pub(crate) async fn apply_read(
    ctx: &AppContext,
    provider: &str,
    truth: &ProviderDispute,
) -> Result<ReadBack, StoreError> {
    unrecognised(ctx, provider, truth, None);
    let payment = {
        let mut conn = ctx.pool.acquire().await?;
        store::payments::by_charge(&mut conn, provider, &truth.charge).await?
    };
    let Some(payment) = payment else {
        return Ok(ReadBack::NotOurs);
    };
    let mut tx = ctx.pool.begin().await?;
    let applied = apply_locked(&mut tx, ctx, &payment, truth, Cause::Reconciler).await?;
    tx.commit().await?;
    committed(ctx, provider, &applied, Cause::Reconciler);
    Ok(if applied.changed {
        ReadBack::Changed
    } else {
        ReadBack::Unchanged
    })
}

/// A status its adapter does not know is stored with its provider status,
/// held open, and counted, for an operator to map it
/// (`OncepayDisputeStatusUnrecognised`): counted at each read.
fn unrecognised(ctx: &AppContext, provider: &str, truth: &ProviderDispute, event_id: Option<&str>) {
    if truth.status.is_some() {
        return;
    }
    ctx.metrics
        .dispute_statuses_unrecognised
        .with_label_values(&[provider])
        .inc();
    tracing::warn!(event_id = event_id.unwrap_or("none"), dispute = %truth.id, provider_status = %truth.provider_status, "a dispute status oncepay does not know: stored with its provider status, held open");
}

/// The one rule of a dispute's report, whoever read it (the webhook, the
/// books pass): under the payment's order's and the payment's locks, taken
/// as a refund takes them, the provider's dispute is applied forward only,
/// and its `dispute.*` events are written with `cause`.
async fn apply_locked(
    tx: &mut PgConnection,
    ctx: &AppContext,
    payment: &Payment,
    truth: &ProviderDispute,
    cause: Cause,
) -> Result<store::disputes::Applied, StoreError> {
    store::orders::lock_by_id(tx, payment.order_id).await?;
    let payment = store::payments::lock(tx, payment.id)
        .await?
        .ok_or_else(|| store::Corrupt::vanished("payment", payment.id))?;
    let applied = store::disputes::apply(tx, &payment, truth, Utc::now()).await?;
    let dispute = &applied.dispute;
    if applied.changed {
        let change = DisputeChange::of(applied.before, dispute.status);
        crate::events::dispute_changed(tx, &ctx.metrics, dispute, change, cause).await?;
        // First seen closed (its opening never reached us): the merchant
        // is told it opened and how it closed.
        if change == DisputeChange::Created && dispute.status.is_final() {
            let closed = DisputeChange::Closed;
            crate::events::dispute_changed(tx, &ctx.metrics, dispute, closed, cause).await?;
        }
    }
    Ok(applied)
}

/// Once the dispute's transaction committed: each status it reaches is
/// counted once (`oncepay_disputes_total`) and logged.
fn committed(ctx: &AppContext, provider: &str, applied: &store::disputes::Applied, cause: Cause) {
    let dispute = &applied.dispute;
    if applied.changed && applied.before != Some(dispute.status) {
        ctx.metrics
            .disputes
            .with_label_values(&[provider, dispute.status.as_str()])
            .inc();
        tracing::info!(dispute_id = %dispute.id, payment_id = %dispute.payment_id, status = dispute.status.as_str(), cause = cause.label(), "dispute applied");
    }
}
