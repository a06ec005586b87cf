//! A refund in the provider's books: checked against our refund, settled
//! forward, or, when we have no refund but have its payment, adopted by the
//! payment if the refund rule allows it.

use sqlx::PgConnection;

use super::adopt::{adopt, Adopting, Decision, Found, Owner, Record};
use super::outcome::{compare_status, mismatch, one, Ours};
use super::{at, BooksError, Options};
use crate::commands::refunds::{refund_response, CreateRefund};
use crate::commands::settle::{self, Cause};
use crate::commands::{AppContext, Command as _};
use crate::domain::payment::{Payment, PaymentStatus, Refund};
use crate::domain::refund;
use crate::provider::trace::Trace;
use crate::provider::{BookEntry, PaymentProvider};
use crate::store;
use crate::store::books::Counts;
use crate::store::refunds::{InsertRefundError, NewRefund};

/// Examines the refund `entry` against the refund its trace names.
pub(super) async fn examine(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
) -> Result<Counts, BooksError> {
    let Some(refund_id) = trace.refund_id else {
        return Ok(Counts::default());
    };
    let mut conn = ctx.pool.acquire().await?;
    let ours = store::refunds::by_id(&mut conn, refund_id).await?;
    let payment = store::payments::by_id(&mut conn, trace.payment_id).await?;
    drop(conn);
    let ids = (trace.merchant_id, Some(trace.payment_id), Some(refund_id));
    let (Some(ours), Some(payment)) = (ours, payment.clone()) else {
        return match payment {
            Some(payment) => {
                let mut tx = ctx.pool.begin().await?;
                let decided = decide(&mut tx, &payment, entry, trace).await?;
                adopt(ctx, provider, entry, trace, options, (tx, decided)).await
            }
            // The refund of a charge we have no row for: an orphan's (ours,
            // or one the merchant made before the rows were lost); the
            // orphan's incident accounts for the charge.
            None => Ok(one(|c| c.matched += 1)),
        };
    };
    if ours.amount != entry.amount
        || ours.payment_id != payment.id
        || ours
            .provider_refund_id
            .as_deref()
            .is_some_and(|id| id != entry.state.id)
    {
        let detail = format!(
            "refund {} holds {} ({:?}); the provider's {} is {}",
            ours.id, ours.amount, ours.provider_refund_id, entry.state.id, entry.amount
        );
        return mismatch(ctx, provider, entry, ids, &detail, options).await;
    }
    let ours = Ours::Refund {
        id: ours.id,
        status: ours.status,
    };
    compare_status(ctx, provider, entry, ours, ids, options).await
}

/// Whether a refund of `payment` we have no row for is adopted by the
/// payment, locked: only a succeeded payment is refunded, and never beyond
/// what is left of it ([`refund::plan`]).
async fn decide(
    tx: &mut PgConnection,
    payment: &Payment,
    entry: &BookEntry,
    trace: &Trace,
) -> Adopting<Decision<Payment>> {
    let refund_id = trace.refund_id.unwrap_or_default();
    let ids = (payment.merchant_id, Some(payment.id), Some(refund_id));
    store::orders::lock_by_id(tx, payment.order_id).await?;
    let payment = store::payments::lock(tx, payment.id)
        .await?
        .ok_or_else(|| store::Corrupt::vanished("payment", payment.id))?;
    let committed = store::refunds::committed_sum(tx, payment.id).await?;
    // A failed refund moved no money: what is left does not bound it.
    let moves_money = entry.state.status != PaymentStatus::Failed;
    let fits = refund::plan(payment.amount_captured, committed, 0, Some(entry.amount)).is_ok();
    if payment.status == PaymentStatus::Succeeded && (fits || !moves_money) {
        return Ok(Decision::Adopt(payment));
    }
    let detail = format!(
        "a refund of {} for payment {} ({}, {} of {} committed) that we have no row for",
        entry.amount,
        payment.id,
        payment.status.as_str(),
        committed,
        payment.amount
    );
    Ok(Decision::Mismatch(ids, detail))
}

/// A payment adopts a refund: the refund is rebuilt under it.
impl Owner for Payment {
    type Row = Refund;

    async fn rebuild(&self, tx: &mut PgConnection, f: &Found<'_>) -> Adopting<Option<Refund>> {
        let new = NewRefund {
            id: f.trace.refund_id.unwrap_or_default(),
            merchant_id: self.merchant_id,
            payment_id: self.id,
            amount: f.entry.amount,
            reason: f.trace.reason.as_deref(),
            idempotency_key: f.key.as_deref(),
            fingerprint: f.fingerprint.as_deref(),
            cancels_order: f.trace.cancels_order,
            destination: "original",
            incident: false,
            now: at(f.entry.created),
            check_after: f.ctx.reconcile_after,
        };
        let refund = match store::refunds::insert(tx, &new).await {
            Ok(r) => r,
            Err(InsertRefundError::KeyUsed) => return Ok(None),
            Err(InsertRefundError::Store(e)) => return Err(e.into()),
        };
        let (metrics, cause) = (&f.ctx.metrics, Cause::Reconciler);
        crate::events::refund_changed(tx, metrics, &refund, self.order_id, cause).await?;
        let (refund, _) = settle::refund(tx, metrics, refund.id, &f.entry.state, cause).await?;
        Ok(Some(refund))
    }

    fn record(&self, refund: &Refund, trace: &Trace) -> Option<Record> {
        // A cancellation's answer is its order, which `POST
        // /orders/{id}/cancel` gives again on its own; a refund's record is
        // rebuilt.
        if trace.cancels_order {
            return None;
        }
        Some((
            self.merchant_id,
            CreateRefund::NAME,
            refund_response(refund),
        ))
    }

    fn adopted(&self, refund: &Refund, f: &Found<'_>) {
        tracing::warn!(
            refund_id = %refund.id, payment_id = %self.id, provider = f.provider.name(),
            refund = %f.entry.state.id, status = refund.status.as_str(),
            "adopted a refund from the provider's books: its rows were lost"
        );
    }
}
