//! The fast path's statements: each a command's write made in one
//! statement with the write of its idempotency record ([`FastWrite`]), one
//! round trip and one commit, which the engine runs under the fence it
//! alone makes. The SQL is the store's (`store::payments`,
//! `store::orders`); each statement here says what it hands the store,
//! and what its command learns and counts once it is written.
//!
//! - [`ClaimAttempt`]: a payment's first step, with the claim of its key;
//! - [`SettleKnown`]: a payment's own charge settled, with its completion;
//! - [`InsertOrder`]: a create-order's order, with the claim of its key
//!   (batched with other new orders), or with the completion of a record
//!   the full protocol claimed.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use super::AppContext;
use crate::domain::event::Cause;
use crate::domain::order::Order;
use crate::domain::origin::Origin;
use crate::domain::payment::{Payment, PaymentStatus};
use crate::events::Pending;
use crate::idempotency::{Claiming, ClaimingCompleted, Completing, FastWrite, Written};
use crate::metrics::Metrics;
use crate::store;
use crate::store::events::EventRow;
use crate::store::group_commit::GroupCommit;
use crate::store::order_batch::OrderBatcher;
use crate::store::payments::{ClaimingAttempt, KnownSettlement, PaymentWrite};

/// The events' rows as the store writes them.
fn rows_of(events: &[Pending]) -> Vec<EventRow> {
    events.iter().map(|e| EventRow::of(&e.as_new())).collect()
}

/// A payment's first step with the claim of its key
/// (`store::payments::INSERT_CLAIMING`): the pending attempt and its event,
/// if the order awaits payment with no live attempt. Hands on `memo` of
/// the attempt and its order as locked.
pub struct ClaimAttempt<M> {
    group: Arc<GroupCommit<PaymentWrite>>,
    metrics: Arc<Metrics>,
    /// The attempt as the command knows it before its order is read: its
    /// order's amount and currency are the statement's to take.
    draft: Payment,
    /// Its event, without the amount and currency (the statement adds
    /// them from the order's row).
    event: Pending,
    check_after: Duration,
    memo: fn(Payment, Order) -> M,
}

impl<M> ClaimAttempt<M> {
    /// The step that creates `draft` (with its `payment_method`,
    /// `provider` and `return_url`) and its `event`, for the reconciler
    /// to look at after `ctx.reconcile_after`.
    pub fn new(
        ctx: &AppContext,
        draft: Payment,
        event: Pending,
        memo: fn(Payment, Order) -> M,
    ) -> Self {
        ClaimAttempt {
            group: ctx.group_commit.clone(),
            metrics: ctx.metrics.clone(),
            draft,
            event,
            check_after: ctx.reconcile_after,
            memo,
        }
    }
}

impl<M: Send + 'static> FastWrite for ClaimAttempt<M> {
    type Fence = Claiming;
    type Output = M;

    fn write(self: Box<Self>, fence: Claiming) -> Written<M> {
        Box::pin(async move {
            let ClaimAttempt {
                group,
                metrics,
                draft,
                event,
                check_after,
                memo,
            } = *self;
            let merchant_id = fence.fence().record().merchant_id;
            let origin = Origin::of(
                Some(&fence.fence().record().key),
                Some(fence.intent().fingerprint()),
            );
            let claiming = ClaimingAttempt {
                claim: fence,
                order_id: draft.order_id,
                attempt_id: draft.id,
                provider: draft.provider.clone(),
                payment_method: draft.payment_method.clone(),
                now: draft.created_at,
                check_after,
                events: rows_of(std::slice::from_ref(&event)),
                return_url: draft.return_url.clone(),
            };
            let Some(order) = store::payments::insert_claiming(&group, claiming).await? else {
                return Ok(None);
            };
            metrics.payment_transition(PaymentStatus::Pending.as_str(), Cause::Command.label());
            crate::events::count(&metrics, std::slice::from_ref(&event));
            let attempt = Payment {
                amount: order.amount,
                currency: order.currency.clone(),
                merchant_id,
                origin,
                ..draft
            };
            Ok(Some(memo(attempt, order)))
        })
    }
}

/// A payment's own charge settled from what its command knows, with the
/// command's completion (`store::payments::SETTLE_COMPLETING`), if the
/// order, the attempt and the record are still as known.
pub struct SettleKnown {
    group: Arc<GroupCommit<PaymentWrite>>,
    metrics: Arc<Metrics>,
    order: (Order, Order),
    attempt: Payment,
    events: Vec<Pending>,
    confirm_decline: bool,
}

impl SettleKnown {
    /// The settlement of `attempt` (as it becomes) and of its order (as
    /// read, and as it becomes), with the changes' `events`;
    /// `confirm_decline`: a decline is to be confirmed by a status read.
    pub fn new(
        ctx: &AppContext,
        order: (Order, Order),
        attempt: Payment,
        events: Vec<Pending>,
        confirm_decline: bool,
    ) -> Self {
        SettleKnown {
            group: ctx.group_commit.clone(),
            metrics: ctx.metrics.clone(),
            order,
            attempt,
            events,
            confirm_decline,
        }
    }
}

impl FastWrite for SettleKnown {
    type Fence = Completing;
    type Output = ();

    fn write(self: Box<Self>, fence: Completing) -> Written<()> {
        Box::pin(async move {
            let SettleKnown {
                group,
                metrics,
                order,
                attempt,
                events,
                confirm_decline,
            } = *self;
            let status = attempt.status;
            let settlement = KnownSettlement {
                completion: fence,
                order,
                attempt,
                events: rows_of(&events),
                confirm_decline,
            };
            if !store::payments::settle_completing(&group, settlement).await? {
                return Ok(None);
            }
            metrics.payment_transition(status.as_str(), Cause::Command.label());
            crate::events::count(&metrics, &events);
            Ok(Some(()))
        })
    }
}

/// A create-order's order written with its idempotency record: with the
/// claim of its key ([`InsertOrder::claiming`]), or with the completion of
/// a record the engine's full protocol claimed
/// ([`InsertOrder::completing`]). `Via` is what the statement goes
/// through.
pub struct InsertOrder<Via> {
    via: Via,
    order: Order,
}

impl InsertOrder<Arc<OrderBatcher>> {
    /// The whole create-order with the claim of its key
    /// (`store::orders::INSERT_CLAIMING`), in a batch with the new orders
    /// that arrive with it: the record completed with the response, and
    /// the order.
    pub fn claiming(ctx: &AppContext, order: Order) -> Self {
        InsertOrder {
            via: ctx.order_batcher.clone(),
            order,
        }
    }
}

impl InsertOrder<PgPool> {
    /// The order with the completion of the record
    /// (`store::orders::INSERT_COMPLETING`): a crash leaves both or
    /// neither.
    pub fn completing(ctx: &AppContext, order: Order) -> Self {
        InsertOrder {
            via: ctx.pool.clone(),
            order,
        }
    }
}

impl FastWrite for InsertOrder<Arc<OrderBatcher>> {
    type Fence = ClaimingCompleted;
    type Output = ();

    fn write(self: Box<Self>, fence: ClaimingCompleted) -> Written<()> {
        Box::pin(async move {
            let row = store::orders::ClaimingOrder::new(fence, self.order)?;
            Ok(self.via.insert_claiming(row).await?.then_some(()))
        })
    }
}

impl FastWrite for InsertOrder<PgPool> {
    type Fence = Completing;
    type Output = ();

    fn write(self: Box<Self>, fence: Completing) -> Written<()> {
        Box::pin(async move {
            let written = store::orders::insert_completing(&self.via, &fence, &self.order).await?;
            Ok(written.then_some(()))
        })
    }
}
