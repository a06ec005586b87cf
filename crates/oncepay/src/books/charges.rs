//! A charge in the provider's books: checked against our attempt, settled
//! forward, or, when we have no attempt, adopted by its order (or an
//! orphan).

use sqlx::PgConnection;

use super::adopt::{adopt, Adopting, Decision, Found, Owner, Record};
use super::outcome::{compare_status, mismatch, Ours};
use super::{at, BooksError, Options};
use crate::commands::payments::{payment_response, CreatePayment};
use crate::commands::settle::{self, Cause};
use crate::commands::{AppContext, Command as _};
use crate::domain::adoption::{adoption, Adoption};
use crate::domain::order::Order;
use crate::domain::payment::{CaptureMethod, Payment, PaymentStatus};
use crate::provider::trace::Trace;
use crate::provider::{BookEntry, PaymentProvider};
use crate::store;
use crate::store::books::Counts;
use crate::store::payments::{InsertAttemptError, NewAttempt};

/// Examines the charge `entry` against the attempt its trace names.
pub(super) async fn examine(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut conn = ctx.pool.acquire().await?;
    let ours = store::payments::by_id(&mut conn, trace.payment_id).await?;
    drop(conn);
    let Some(ours) = ours else {
        let mut tx = ctx.pool.begin().await?;
        let decided = decide(&mut tx, entry, trace).await?;
        return adopt(ctx, provider, entry, trace, options, (tx, decided)).await;
    };
    let ids = (ours.merchant_id, Some(ours.id), None);
    let recorded_other = ours
        .provider_charge_id
        .as_deref()
        .is_some_and(|id| id != entry.state.id);
    if ours.amount != entry.amount
        || !ours.currency.eq_ignore_ascii_case(&entry.currency)
        || recorded_other
        || ours.provider != provider.name()
    {
        let detail = format!(
            "attempt {} holds {} {} ({:?}); the provider's {} is {} {}",
            ours.id,
            ours.amount,
            ours.currency,
            ours.provider_charge_id,
            entry.state.id,
            entry.amount,
            entry.currency
        );
        return mismatch(ctx, provider, entry, ids, &detail, options).await;
    }
    let ours = Ours::Attempt {
        id: ours.id,
        order_id: ours.order_id,
        status: ours.status,
    };
    compare_status(ctx, provider, entry, ours, ids, options).await
}

/// Whether the charge `entry`, whose attempt we lost, is adopted by its
/// order ([`adoption`]), with the order locked.
async fn decide(
    tx: &mut PgConnection,
    entry: &BookEntry,
    trace: &Trace,
) -> Adopting<Decision<Order>> {
    let order = store::orders::lock(tx, trace.merchant_id, trace.order_id).await?;
    let live = match &order {
        Some(o) => store::payments::live_attempt(tx, o.id).await?.is_some(),
        None => false,
    };
    let decided = adoption(
        order.as_ref(),
        live,
        entry.state.status,
        (entry.amount, &entry.currency),
    );
    Ok(match (decided, order) {
        (Adoption::Ignore, _) | (Adoption::Adopt, None) => Decision::Ignore,
        (Adoption::Orphan(why), _) => Decision::Orphan(why),
        (Adoption::Adopt, Some(order)) => Decision::Adopt(order),
    })
}

/// An order adopts a charge: the attempt is rebuilt under it.
impl Owner for Order {
    type Row = Payment;

    async fn rebuild(&self, tx: &mut PgConnection, f: &Found<'_>) -> Adopting<Option<Payment>> {
        let stored_key = f
            .key
            .clone()
            .unwrap_or_else(|| format!("adopted attempt {}", f.trace.payment_id));
        let new = NewAttempt {
            id: f.trace.payment_id,
            merchant_id: f.trace.merchant_id,
            order_id: self.id,
            idempotency_key: &stored_key,
            fingerprint: f.fingerprint.as_deref(),
            amount: f.entry.amount,
            currency: &self.currency,
            provider: f.provider.name(),
            // Never charged again: the provider's object is recorded.
            payment_method: "adopted",
            now: at(f.entry.created),
            check_after: f.ctx.reconcile_after,
            return_url: None,
            // An authorization (or a hold captured or released) was made
            // manual: it is adopted as the hold it is, never captured here.
            capture_method: if f.entry.state.amount_captured.is_some()
                || matches!(
                    f.entry.state.status,
                    PaymentStatus::RequiresCapture | PaymentStatus::Voided
                ) {
                CaptureMethod::Manual
            } else {
                CaptureMethod::Automatic
            },
        };
        let attempt = match store::payments::insert(tx, &new).await {
            Ok(a) => a,
            // A client's new attempt got there first: the next pass sees an
            // order with a live attempt, and an orphan.
            Err(InsertAttemptError::KeyUsed | InsertAttemptError::LiveAttemptExists) => {
                return Ok(None)
            }
            Err(InsertAttemptError::Store(e)) => return Err(e.into()),
        };
        let cause = Cause::Reconciler;
        crate::events::payment_changed(tx, &f.ctx.metrics, &attempt, cause).await?;
        let owners = (attempt.id, self.id);
        let (payment, _) =
            settle::payment(tx, &f.ctx.metrics, owners, &f.entry.state, cause).await?;
        Ok(Some(payment))
    }

    fn adopted(&self, payment: &Payment, f: &Found<'_>) {
        tracing::warn!(
            payment_id = %payment.id, order_id = %self.id, provider = f.provider.name(),
            charge = %f.entry.state.id, status = payment.status.as_str(),
            "adopted a charge from the provider's books: its rows were lost"
        );
    }

    fn record(&self, payment: &Payment, trace: &Trace) -> Option<Record> {
        Some((
            trace.merchant_id,
            CreatePayment::NAME,
            payment_response(payment),
        ))
    }
}
