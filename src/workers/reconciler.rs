//! Settles what was left open (contract section 6):
//! - commands whose lease expired (their process died) are resumed from
//!   their last recorded step, or freed if they recorded none;
//! - payments and refunds still `pending` past a threshold are looked up at
//!   the provider (a safe read) and settled; one the provider never received
//!   is sent again with the same provider key, which charges at most once.
//!
//! Rows are claimed with `FOR UPDATE SKIP LOCKED` and a lease (the next
//! check time), so several processes share the work without overlap, and no
//! connection is held while the provider answers.

use crate::commands::settle::{self, Cause};
use crate::commands::{self, payments, refunds, AppContext};
use crate::idempotency::Claim;
use crate::provider::CallOutcome;
use crate::store::{self, StoreError};

/// Rows claimed per kind and pass.
const BATCH: i64 = 50;

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
}

/// One pass over all three kinds of work.
pub async fn pass(ctx: &AppContext) -> Result<Pass, StoreError> {
    let mut done = Pass::default();
    let lease = ctx.engine.config().lease;
    for (id, record) in store::idempotency::take_over_expired(&ctx.pool, BATCH, lease).await? {
        let claim = Claim::resumed(id.clone(), record.clone());
        if claim.is_effect_free() {
            ctx.engine.release(&claim).await;
            done.freed += 1;
            count(ctx, "command", "freed");
            continue;
        }
        match commands::resume(ctx, id, record).await {
            Ok(()) => {
                done.resumed += 1;
                ctx.metrics.idempotency("resumed");
                count(ctx, "command", "resumed");
            }
            Err(problem) => {
                tracing::warn!(
                    code = problem.code,
                    "resuming a command failed; it will be retried"
                );
                count(ctx, "command", "error");
            }
        }
    }
    for (payment, _merchant) in store::payments::claim_due(&ctx.pool, BATCH).await? {
        let observed = match ctx.provider.find_charge(payment.id).await {
            CallOutcome::Known(object) => Some(object),
            CallOutcome::NotFound => payments::charge(ctx, &payment).await,
            CallOutcome::Unknown(_) => None,
        };
        let mut settled = false;
        if let Some(object) = observed {
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
            settled = p.status.is_final();
        }
        done.payments_settled += u32::from(settled);
        count(
            ctx,
            "payment",
            if settled { "settled" } else { "still_pending" },
        );
    }
    for (refund, _merchant) in store::refunds::claim_due(&ctx.pool, BATCH).await? {
        let observed = match ctx.provider.find_refund(refund.id).await {
            CallOutcome::Known(object) => Some(object),
            CallOutcome::NotFound => match refunds::pending_request(ctx, refund.id).await? {
                Some(request) => refunds::send(ctx, &request).await,
                None => None,
            },
            CallOutcome::Unknown(_) => None,
        };
        let mut settled = false;
        if let Some(object) = observed {
            let mut tx = ctx.pool.begin().await?;
            let (r, _) =
                settle::refund(&mut tx, &ctx.metrics, refund.id, &object, Cause::Reconciler)
                    .await?;
            tx.commit().await?;
            settled = r.status.is_final();
        }
        done.refunds_settled += u32::from(settled);
        count(
            ctx,
            "refund",
            if settled { "settled" } else { "still_pending" },
        );
    }
    Ok(done)
}

fn count(ctx: &AppContext, kind: &str, outcome: &str) {
    ctx.metrics
        .reconciler
        .with_label_values(&[kind, outcome])
        .inc();
}
