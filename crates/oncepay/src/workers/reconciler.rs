//! Settles what was left open (contract section 6):
//! - commands whose lease expired (their process died) are resumed from
//!   their last recorded step, or freed if they recorded none;
//! - payments and refunds still `pending` past a threshold are looked up at
//!   the provider (a safe read) and settled; one the provider never received
//!   is sent again with the same provider key, which charges at most once.
//!   A read that proves nothing (see `provider::classify`) settles nothing;
//! - a decline that came in a charge's or refund's own answer is confirmed
//!   by one status read after the same delay (`settle::decline_to_confirm`
//!   says why): a charge the provider took anyway becomes an incident,
//!   refunded; a refund it paid anyway, an incident for a person;
//! - payments and refunds pending (or with a decline unconfirmed) past the
//!   alarm threshold are logged at error level and counted, once each, and
//!   the age of the oldest pending is kept in a gauge, so an unknown outcome
//!   never ends in silence. That look reads every row pending since the
//!   last vacuum, so it is made a thirtieth of the threshold apart, not at
//!   every pass ([`commands::PendingAlarm`]).
//!
//! Rows are claimed with `FOR UPDATE SKIP LOCKED` and a lease (the next
//! check time), so several processes share the work without overlap, and no
//! connection is held while the provider answers. One row that fails is
//! logged, counted and retried at its next check; it never stops the pass.

use crate::commands::settle::{self, Cause};
use crate::commands::{self, payments, refunds, AppContext};
use crate::domain::payment::{Payment, PaymentStatus, Refund};
use crate::idempotency::Claim;
use crate::provider::{CallOutcome, ProviderObject};
use crate::store::{self, StoreError};
use uuid::Uuid;

/// Rows claimed per kind and pass.
const BATCH: i64 = 50;

/// The least time between two resets of every backed-off row after the
/// provider answers again (per process): a provider that flaps does not
/// turn every row's back-off into a check at every pass.
const RECHECK_SPACING: std::time::Duration = std::time::Duration::from_secs(10);

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Commands resumed after their lease expired.
    pub resumed: u32,
    /// Effect-free commands whose key was freed.
    pub freed: u32,
    /// Payments moved to a final state.
    pub payments_settled: u32,
    /// Refunds moved to a final state.
    pub refunds_settled: u32,
    /// Captures whose outcome is now known.
    pub captures_settled: u32,
    /// Declines (of payments and refunds) whose confirming read is done (an
    /// incident if it found the money moved).
    pub declines_confirmed: u32,
    /// Rows that failed and wait for their next check.
    pub errors: u32,
    /// Payments and refunds newly past the alarm threshold (0 when this
    /// pass did not look: see [`commands::PendingAlarm`]).
    pub alarms: u32,
    /// Rows whose back-off was reset because the provider answers again.
    pub rechecked: u64,
}

/// The end of an outage, noticed at once. While the provider was not
/// answering, each pending row's next check backed off (up to five
/// minutes); once the provider answers again (any call of this process,
/// or, while it is down, one cheap probe per pass here), every backed-off
/// row is due now, so payments settle within a pass of the recovery
/// instead of minutes later. The reset is in the database, so every
/// process's reconciler shares the work (SKIP LOCKED, as always).
async fn recheck_after_recovery(ctx: &AppContext) -> Result<u64, StoreError> {
    let mut recovered = false;
    for provider in ctx.providers.all() {
        let health = provider.health();
        if health.is_degraded() {
            let _ = provider.probe().await;
        }
        recovered |= health.take_recovered(RECHECK_SPACING);
    }
    if !recovered {
        return Ok(0);
    }
    let rows = store::queue::reset_backoff::<Payment>(&ctx.pool).await?
        + store::queue::reset_backoff::<Refund>(&ctx.pool).await?;
    tracing::info!(
        rows,
        "the provider answers again; backed-off pending rows are checked now"
    );
    ctx.metrics
        .reconciler
        .with_label_values(&["recovery", "rechecked"])
        .inc_by(rows);
    Ok(rows)
}

/// One pass over all kinds of work.
pub async fn pass(ctx: &AppContext) -> Result<Pass, StoreError> {
    let mut done = Pass {
        rechecked: recheck_after_recovery(ctx).await?,
        ..Pass::default()
    };
    let lease = ctx.engine.config().lease;
    let ttl = ctx.engine.config().ttl;
    // Every lease of the batch starts with the statement: a command
    // resumed late in the batch has that much less of its lease left.
    let leased_at = tokio::time::Instant::now();
    for (id, record) in
        crate::idempotency::persistence::take_over_expired(&ctx.pool, BATCH, lease, ttl).await?
    {
        let claim = Claim::resumed(id.clone(), record.clone(), leased_at);
        if claim.is_effect_free() {
            ctx.engine.release(&claim).await;
            done.freed += 1;
            count(ctx, "command", "freed");
            continue;
        }
        match commands::resume(ctx, id, record, leased_at).await {
            Ok(()) => {
                done.resumed += 1;
                ctx.metrics.idempotency("resumed");
                count(ctx, "command", "resumed");
            }
            Err(problem) => {
                tracing::warn!(
                    code = problem.code,
                    cause = problem.cause.as_deref().map_or("", |c| c.as_str()),
                    "resuming a command failed; it will be retried"
                );
                done.errors += 1;
                count(ctx, "command", "error");
            }
        }
    }
    for (payment, _merchant) in store::queue::claim_due::<Payment>(&ctx.pool, BATCH).await? {
        match settle_payment(ctx, &payment).await {
            Ok(settled) => {
                done.payments_settled += u32::from(settled);
                count(
                    ctx,
                    "payment",
                    if settled { "settled" } else { "still_pending" },
                );
            }
            Err(e) => {
                tracing::warn!(payment_id = %payment.id, error = %e, "settling a payment failed; it is retried at its next check");
                done.errors += 1;
                count(ctx, "payment", "error");
            }
        }
    }
    for payment in store::queue::claim_declines_due::<Payment>(&ctx.pool, BATCH).await? {
        let confirmed = confirm_payment_decline(ctx, &payment).await;
        declines(ctx, &mut done, payment.id, confirmed);
    }
    for refund in store::queue::claim_declines_due::<Refund>(&ctx.pool, BATCH).await? {
        let confirmed = confirm_refund_decline(ctx, &refund).await;
        declines(ctx, &mut done, refund.id, confirmed);
    }
    for capture in
        store::queue::claim_declines_due::<store::captures::Capture>(&ctx.pool, BATCH).await?
    {
        let confirmed = commands::captures::confirm_refusal(ctx, capture.id).await;
        declines(ctx, &mut done, capture.id, confirmed);
    }
    for (refund, _merchant) in store::queue::claim_due::<Refund>(&ctx.pool, BATCH).await? {
        match settle_refund(ctx, &refund).await {
            Ok(settled) => {
                done.refunds_settled += u32::from(settled);
                count(
                    ctx,
                    "refund",
                    if settled { "settled" } else { "still_pending" },
                );
            }
            Err(e) => {
                tracing::warn!(refund_id = %refund.id, error = %e, "settling a refund failed; it is retried at its next check");
                done.errors += 1;
                count(ctx, "refund", "error");
            }
        }
    }
    for (capture, _merchant) in
        store::queue::claim_due::<store::captures::Capture>(&ctx.pool, BATCH).await?
    {
        match settle_capture(ctx, capture.id).await {
            Ok(settled) => {
                done.captures_settled += u32::from(settled);
                count(
                    ctx,
                    "capture",
                    if settled { "settled" } else { "still_pending" },
                );
            }
            Err(e) => {
                tracing::warn!(capture_id = %capture.id, error = %e, "settling a capture failed; it is retried at its next check");
                done.errors += 1;
                count(ctx, "capture", "error");
            }
        }
    }
    if ctx.pending_alarm.due() {
        done.alarms = raise_alarms(ctx).await?;
        ctx.pending_alarm.looked_now();
    }
    ctx.metrics
        .reconciler_last_pass
        .set(chrono::Utc::now().timestamp() as f64);
    Ok(done)
}

/// Looks a pending payment up (or charges it again, same key, if the
/// provider never saw it) and applies what was learned. True if now final.
async fn settle_payment(ctx: &AppContext, payment: &Payment) -> Result<bool, StoreError> {
    let Some(object) = payments::look_up_or_charge(ctx, payment).await else {
        return Ok(false);
    };
    let Some(object) = expire_action(ctx, payment, object).await else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    let (p, _) = settle::payment(
        &mut tx,
        &ctx.metrics,
        (payment.id, payment.order_id),
        &object,
        Cause::Reconciler,
    )
    .await?;
    tx.commit().await?;
    Ok(p.status.is_final())
}

/// A payment the provider still holds as waiting for its customer, for
/// longer than `ONCEPAY_ACTION_TIMEOUT` (whatever the action: a redirect
/// or Stripe.js's), is given up: its provider object is cancelled first
/// (Stripe: `cancellation_reason=abandoned`), so a late approval cannot
/// take money for a failed attempt; only a cancelled charge fails, as
/// `authentication_expired`. If the provider answers that the customer
/// approved in time, that stands: a charge that succeeded, a hold to
/// capture or void. A hold approved just before the cancel reached it
/// (Stripe cancels a hold as readily) comes back released: it reads
/// `voided`, `void_reason: abandoned` (review N6), never
/// `authentication_expired`. `None`: the provider could not say now
/// (tried again at the next pass; nothing is applied).
async fn expire_action(
    ctx: &AppContext,
    payment: &Payment,
    observed: ProviderObject,
) -> Option<ProviderObject> {
    let waited = payment
        .action_required_at
        .map(|since| chrono::Utc::now() - since)
        .and_then(|d| d.to_std().ok());
    let expired = observed.status == PaymentStatus::Pending
        && waited.is_some_and(|w| w >= ctx.action_timeout);
    if !expired {
        return Some(observed);
    }
    let provider = ctx.providers.named(&payment.provider);
    let reference = payment
        .provider_charge_id
        .as_deref()
        .or(Some(observed.id.as_str()).filter(|id| !id.is_empty()));
    let failed = |from: ProviderObject| ProviderObject {
        status: PaymentStatus::Failed,
        failure_code: Some("authentication_expired".into()),
        failure_message: Some("The customer did not complete the authentication in time.".into()),
        next_action: None,
        ..from
    };
    match provider.abandon(payment.id, reference).await {
        // No object at the provider: nothing can be approved later.
        CallOutcome::NotFound => Some(failed(observed)),
        CallOutcome::Known(cancelled) if cancelled.status == PaymentStatus::Failed => {
            tracing::warn!(payment_id = %payment.id, "the customer never completed the payment's authentication; cancelled at the provider and failed");
            Some(failed(cancelled))
        }
        CallOutcome::Known(approved)
            if matches!(
                approved.status,
                PaymentStatus::Succeeded | PaymentStatus::RequiresCapture
            ) =>
        {
            tracing::info!(payment_id = %payment.id, status = approved.status.as_str(), "the customer approved just before the payment was given up");
            Some(approved)
        }
        CallOutcome::Known(released) if released.status == PaymentStatus::Voided => {
            tracing::warn!(payment_id = %payment.id, "the customer approved just before the payment was given up, and the cancel released the authorization");
            Some(released)
        }
        CallOutcome::Known(_) => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(payment_id = %payment.id, %reason, "could not cancel an abandoned payment at its provider; tried again at the next pass");
            None
        }
    }
}

/// What a decline's confirming read proved: `None`, nothing yet (a read
/// that proves nothing, or a record still pending there: tried again at
/// the next check); `Some(None)`, the provider never received the call, so
/// no money moved; `Some(Some(object))`, its final record.
fn confirming_read(read: CallOutcome, id: Uuid) -> Option<Option<ProviderObject>> {
    match read {
        CallOutcome::Known(object) if object.status.is_final() => Some(Some(object)),
        CallOutcome::Known(_) => None,
        CallOutcome::NotFound => Some(None),
        CallOutcome::Unknown(reason) => {
            tracing::warn!(%id, %reason, "a decline's confirming read proved nothing; it is retried");
            None
        }
    }
}

/// Reads a declined attempt's charge at the provider once; a charge it
/// took anyway is settled as an incident (`settle::payment` finds the
/// contradiction and refunds it). True if the provider's final record was
/// read. Never charges: the order is payable again, and a new intent may
/// have paid it.
async fn confirm_payment_decline(ctx: &AppContext, payment: &Payment) -> Result<bool, StoreError> {
    let read = ctx
        .providers
        .named(&payment.provider)
        .find_charge(payment.id, payment.provider_charge_id.as_deref())
        .await;
    // A charge that waits for its customer at the bank (3-D Secure) moved
    // no money; past ONCEPAY_ACTION_TIMEOUT the decline stands (an
    // approval after that is a webhook, and an incident refunded).
    let waited = (chrono::Utc::now() - payment.created_at)
        .to_std()
        .unwrap_or_default();
    let read = match read {
        CallOutcome::Known(object)
            if object.next_action.is_some() && waited >= ctx.action_timeout =>
        {
            CallOutcome::NotFound
        }
        other => other,
    };
    let read = release_stray_hold(ctx, payment, read).await;
    let Some(observed) = confirming_read(read, payment.id) else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    if let Some(object) = &observed {
        let owners = (payment.id, payment.order_id);
        settle::payment(&mut tx, &ctx.metrics, owners, object, Cause::Reconciler).await?;
    }
    store::queue::decline_confirmed::<Payment>(&mut tx, payment.id).await?;
    tx.commit().await?;
    Ok(true)
}

/// A declined attempt whose charge the provider holds authorized (a
/// manual payment behind a lying decline): no money moved, but the
/// customer's funds are held, for days, for a payment that failed. The
/// hold is released at the provider (a void is idempotent), and the
/// provider's answer stands for the read; an unknown answer leaves the
/// decline to be confirmed again later. Any other read is returned as is.
async fn release_stray_hold(ctx: &AppContext, payment: &Payment, read: CallOutcome) -> CallOutcome {
    let held = matches!(&read, CallOutcome::Known(o) if o.status == PaymentStatus::RequiresCapture);
    if !held || payment.status != PaymentStatus::Failed {
        return read;
    }
    let charge = match &read {
        CallOutcome::Known(o) if !o.id.is_empty() => o.id.clone(),
        _ => payment.provider_charge_id.clone().unwrap_or_default(),
    };
    let provider = ctx.providers.named(&payment.provider);
    let released = provider.void(payment.id, &charge).await;
    match &released {
        CallOutcome::Known(o) if o.status.is_final() => {
            tracing::warn!(
                payment_id = %payment.id,
                charge_id = %charge,
                status = o.status.as_str(),
                "released an authorization the provider held for a failed payment"
            );
        }
        other => {
            tracing::warn!(payment_id = %payment.id, outcome = ?other, "a failed payment's stray authorization is not released yet; asked again later");
        }
    }
    released
}

/// The same for a declined refund: one paid anyway is recorded as an
/// incident for a person (`settle::refund`). Never sends the refund again.
async fn confirm_refund_decline(ctx: &AppContext, refund: &Refund) -> Result<bool, StoreError> {
    let sent = refunds::sent(ctx, refund).await?;
    let read = ctx
        .providers
        .named(&sent.provider)
        .find_refund(&sent.request, sent.reference.as_deref())
        .await;
    let Some(observed) = confirming_read(read, refund.id) else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    if let Some(object) = &observed {
        settle::refund(&mut tx, &ctx.metrics, refund.id, object, Cause::Reconciler).await?;
    }
    store::queue::decline_confirmed::<Refund>(&mut tx, refund.id).await?;
    tx.commit().await?;
    Ok(true)
}

/// Counts one decline's confirmation; a failure is logged and retried at
/// its next check.
fn declines(ctx: &AppContext, done: &mut Pass, id: Uuid, confirmed: Result<bool, StoreError>) {
    match confirmed {
        Ok(confirmed) => {
            done.declines_confirmed += u32::from(confirmed);
            let outcome = if confirmed {
                "confirmed"
            } else {
                "unconfirmed"
            };
            count(ctx, "decline", outcome);
        }
        Err(e) => {
            tracing::warn!(%id, error = %e, "confirming a decline failed; it is retried at its next check");
            done.errors += 1;
            count(ctx, "decline", "error");
        }
    }
}

/// The same for a pending refund.
async fn settle_refund(ctx: &AppContext, refund: &Refund) -> Result<bool, StoreError> {
    let outstanding = refunds::pending_request(ctx, refund.id).await?;
    let Some(object) = refunds::step_2(ctx, outstanding.as_ref()).await else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    let (r, _) =
        settle::refund(&mut tx, &ctx.metrics, refund.id, &object, Cause::Reconciler).await?;
    tx.commit().await?;
    Ok(r.status.is_final())
}

/// A capture whose answer was lost, resumed like a charge: the provider
/// is read first, and the capture sent again with its own key only while
/// the charge is still held uncaptured; past `capture_before` the
/// provider's answer (refused, expired) settles it, and a capture the
/// provider refuses while the hold stands ends `failed`. True if the
/// capture is now settled.
async fn settle_capture(ctx: &AppContext, capture_id: Uuid) -> Result<bool, StoreError> {
    let Some(outstanding) = commands::captures::pending_capture(ctx, capture_id).await? else {
        return Ok(true);
    };
    let Some(learned) = commands::captures::send_or_find(ctx, &outstanding).await else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    let (_, capture) =
        commands::captures::finish(&mut tx, ctx, capture_id, Some(learned), Cause::Reconciler)
            .await?;
    tx.commit().await?;
    Ok(capture.status != PaymentStatus::Pending)
}

/// Logs and counts, once each, payments and refunds pending for longer than
/// the alarm threshold, and updates the oldest-pending gauge.
async fn raise_alarms(ctx: &AppContext) -> Result<u32, StoreError> {
    let alarmed = store::alarms::raise(&ctx.pool, ctx.pending_alarm.after()).await?;
    for row in &alarmed {
        tracing::error!(
            kind = row.kind,
            id = %row.id,
            pending_seconds = row.pending_seconds,
            "ALARM: outcome still unknown past ONCEPAY_PENDING_ALARM; the reconciler keeps asking the provider"
        );
        ctx.metrics
            .pending_alarms
            .with_label_values(&[row.kind])
            .inc();
    }
    for (kind, seconds) in store::alarms::oldest_pending(&ctx.pool).await? {
        ctx.metrics
            .oldest_pending
            .with_label_values(&[kind])
            .set(seconds);
    }
    Ok(u32::try_from(alarmed.len()).unwrap_or(u32::MAX))
}

fn count(ctx: &AppContext, kind: &str, outcome: &str) {
    ctx.metrics
        .reconciler
        .with_label_values(&[kind, outcome])
        .inc();
}
