//! Applying what the provider reported to our records: one place for the
//! command's last step, the webhook handler and the reconciler, so all three
//! move state the same way (forward only, order updated in the same
//! transaction). Locks are taken order → payment → refund everywhere.

use chrono::{SubsecRound, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::fast_path::SettleKnown;
use super::AppContext;
use crate::domain::order::Order;
use crate::domain::payment::{
    CaptureMethod, Payment, PaymentStatus, Refund, Transition, VoidReason,
};
use crate::domain::settlement::{self, Report, Settlement};
use crate::metrics::Metrics;
use crate::provider::ProviderObject;
use crate::store::{self, StoreError};

pub use crate::domain::event::Cause;

/// Whether a payment or refund that moves to `status` on what `cause`
/// observed must be confirmed later by one status read (the reconciler's).
/// A decline in a charge's or refund's own answer may be an answer replaced
/// on its way (a gateway, a proxy, a provider bug) while the money moved;
/// the provider's webhook would tell, but a webhook can be lost, and the
/// order is payable (or the amount refundable) again at once. What a
/// webhook or the reconciler observed was read from the provider's record
/// already.
pub(crate) fn decline_to_confirm(status: PaymentStatus, cause: Cause) -> bool {
    status == PaymentStatus::Failed && matches!(cause, Cause::Command)
}

fn missing(what: &'static str, id: Uuid) -> StoreError {
    crate::store::Corrupt::vanished(what, id)
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// Moves a locked order to `next`, in the caller's transaction: the one
/// function every status change goes through (settlement by a command, a
/// webhook, the reconciler or a capture; refunds; the cancel of an unpaid
/// order). Its stock follows in the same transaction
/// (`inventory::follow_order`: converted when paid or authorized,
/// released when cancelled), then its event is written with the order as
/// it then is. (The one-statement fast path, `Known`, only takes orders
/// that reserved no stock.)
pub(crate) async fn move_order(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order_id: Uuid,
    next: crate::domain::order::OrderStatus,
    cause: Cause,
) -> Result<Order, StoreError> {
    let order = store::orders::set_status(tx, order_id, next).await?;
    let order = crate::inventory::follow_order(tx, metrics, order, cause).await?;
    crate::events::order_changed(tx, metrics, &order, cause).await?;
    Ok(order)
}

/// Applies a charge's reported state to an attempt (and its order). The
/// caller names the attempt and its order (an attempt never changes order),
/// so both rows are locked, order first, without a lookup.
pub async fn payment(
    tx: &mut PgConnection,
    metrics: &Metrics,
    (attempt_id, order_id): (Uuid, Uuid),
    observed: &ProviderObject,
    cause: Cause,
) -> Result<(Payment, Transition), StoreError> {
    let order = store::orders::lock_by_id(tx, order_id)
        .await?
        .ok_or_else(|| missing("order", order_id))?;
    let current = store::payments::lock(tx, attempt_id)
        .await?
        .ok_or_else(|| missing("payment", attempt_id))?;
    let transition = current.status.transition(observed.status);
    // A hold the provider keeps for an attempt we hold as failed (its
    // customer approved after the payment failed, or a lying decline): no
    // money moved, but the customer's funds are held. The decline's
    // confirming read releases it at the provider
    // (`reconciler::release_stray_hold`).
    if transition == Transition::StrayHold {
        store::queue::confirm_decline_later::<Payment>(tx, attempt_id).await?;
    }
    // A released hold's provider reason (`ProviderObject::failure_code`)
    // says someone cancelled it at the provider, or that oncepay's own
    // give-up on its customer released it (`provider::ABANDONED`); it is
    // kept only for someone else's cancel: the reason of oncepay's own
    // void, give-up or an expiry tells nothing new.
    let released = match (observed.status, observed.failure_code.as_deref()) {
        (PaymentStatus::Voided, Some(crate::provider::ABANDONED)) => {
            settlement::Released::Abandoned
        }
        (PaymentStatus::Voided, Some(_)) => settlement::Released::Cancelled,
        _ => settlement::Released::Lapsed,
    };
    let void_reason = settlement::release_reason(&current, released, Utc::now());
    let keep_failure =
        observed.status != PaymentStatus::Voided || void_reason == VoidReason::CancelledAtProvider;
    let facts = store::payments::ChargeFacts {
        charge_id: non_empty(&observed.id),
        failure_code: observed.failure_code.as_deref().filter(|_| keep_failure),
        failure_message: observed.failure_message.as_deref().filter(|_| keep_failure),
        capture_before: observed
            .capture_before
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0)),
        amount_captured: observed.amount_captured,
        void_reason: Some(void_reason),
    };
    let report = Report {
        status: observed.status,
        charge_id: facts.charge_id,
        requires_action: observed.next_action.is_some(),
    };
    let updated = match settlement::decide(&current, order.status, &report) {
        Settlement::Advance {
            status,
            order: next,
        } => {
            let p = store::payments::set_status(tx, attempt_id, status, &facts).await?;
            // A capture under way ends with its hold: made, or refused
            // because the hold ended first.
            match status {
                PaymentStatus::Succeeded if current.capture_method == CaptureMethod::Manual => {
                    store::captures::settle_of_payment(
                        tx,
                        attempt_id,
                        status,
                        None,
                        facts.amount_captured,
                    )
                    .await?;
                }
                PaymentStatus::Voided => {
                    let code = Some(store::captures::HOLD_ENDED);
                    store::captures::settle_of_payment(
                        tx,
                        attempt_id,
                        PaymentStatus::Failed,
                        code,
                        None,
                    )
                    .await?;
                }
                _ => {}
            }
            if decline_to_confirm(status, cause) {
                store::queue::confirm_decline_later::<Payment>(tx, attempt_id).await?;
            }
            crate::events::payment_changed(tx, metrics, &p, cause).await?;
            match next {
                Some(next) => {
                    move_order(tx, metrics, order_id, next, cause).await?;
                }
                // Ended without paying or authorizing the order: the stock
                // held for this payment goes back to the order's deadline.
                None if matches!(status, PaymentStatus::Failed | PaymentStatus::Voided) => {
                    crate::inventory::payment_ended(tx, metrics, order_id, attempt_id, cause)
                        .await?;
                }
                None => {}
            }
            metrics.payment_transition(status.as_str(), cause.label());
            p
        }
        // Where to send the customer, once, with its event.
        Settlement::RequireAction => {
            let Some(action) = observed.next_action.as_ref() else {
                return Ok((current, transition));
            };
            let no_failure = store::payments::ChargeFacts {
                charge_id: facts.charge_id,
                ..Default::default()
            };
            store::payments::set_status(tx, attempt_id, current.status, &no_failure).await?;
            match store::payments::require_action(tx, attempt_id, action).await? {
                Some(p) => {
                    crate::events::payment_requires_action(tx, metrics, &p, cause).await?;
                    p
                }
                None => current,
            }
        }
        Settlement::LearnChargeId => {
            let no_failure = store::payments::ChargeFacts {
                charge_id: facts.charge_id,
                ..Default::default()
            };
            store::payments::set_status(tx, attempt_id, current.status, &no_failure).await?
        }
        Settlement::Contradicted => {
            contradicted(tx, metrics, current, &facts, order_id, cause).await?
        }
        Settlement::Nothing => current,
    };
    Ok((updated, transition))
}

/// The provider charged an attempt we hold as failed: the attempt stays
/// failed (the order may have been paid by another since), learns the
/// charge id if it had none, and the charge is recorded once as an
/// incident, which refunds it.
async fn contradicted(
    tx: &mut PgConnection,
    metrics: &Metrics,
    current: Payment,
    facts: &store::payments::ChargeFacts<'_>,
    order_id: Uuid,
    cause: Cause,
) -> Result<Payment, StoreError> {
    let attempt_id = current.id;
    let charge_id = facts.charge_id.or(current.provider_charge_id.as_deref());
    let updated = match (&current.provider_charge_id, facts.charge_id) {
        (None, Some(_)) => {
            let keep_failure = store::payments::ChargeFacts {
                charge_id: facts.charge_id,
                ..Default::default()
            };
            store::payments::set_status(tx, attempt_id, current.status, &keep_failure).await?
        }
        _ => current.clone(),
    };
    let recorded = store::incidents::charge_on_failed_attempt(
        tx,
        attempt_id,
        charge_id,
        facts.amount_captured,
        cause.label(),
    )
    .await?;
    if let Some(incident) = recorded {
        metrics
            .incidents
            .with_label_values(&["charge_on_failed_attempt"])
            .inc();
        tracing::error!(
            incident_id = %incident.id,
            payment_id = %attempt_id,
            %order_id,
            charge_id = charge_id.unwrap_or_default(),
            refund_id = %incident.refund_id,
            cause = cause.label(),
            "INCIDENT: the provider charged a payment held as failed; refunding the charge"
        );
    }
    Ok(updated)
}

/// A command's own charge, settled from what the command knows: the
/// attempt it created (pending, no provider facts yet) and its order as it
/// read them. Written in one statement with the command's completion
/// (`store::payments::settle_completing`), which checks under the row locks
/// that both are still as known and writes nothing otherwise; the command
/// then settles through [`payment`]. The rules are [`payment`]'s: the
/// domain's transition, the order's `after_payment_succeeded`, the same
/// events.
pub struct Known {
    order: (Order, Order),
    attempt: Payment,
    status: PaymentStatus,
    events: Vec<crate::events::Pending>,
}

impl Known {
    /// The settlement, if the observation advances the attempt (the one
    /// case the statement handles; anything else goes through [`payment`]).
    pub fn plan(
        attempt: &Payment,
        order: &Order,
        observed: &ProviderObject,
    ) -> Result<Option<Known>, StoreError> {
        let report = Report {
            status: observed.status,
            charge_id: non_empty(&observed.id),
            requires_action: observed.next_action.is_some(),
        };
        // A hold's facts (its deadline, its capture) are written the
        // locking way; so is the stock of an order that reserved some,
        // which `move_order` converts in the settlement's transaction (the
        // statement itself refuses an order with tracked SKUs, which a
        // payment takes from the stock: `SETTLE_COMPLETING`).
        if attempt.capture_method == CaptureMethod::Manual || order.stock_reserved_until.is_some() {
            return Ok(None);
        }
        let Settlement::Advance {
            status,
            order: next,
        } = settlement::decide(attempt, order.status, &report)
        else {
            return Ok(None);
        };
        // The provider's object recorded before the charge (Stripe's
        // PaymentIntent) is kept; an answer naming another goes the
        // locking way.
        let charge_id = match (
            attempt.provider_charge_id.as_deref(),
            non_empty(&observed.id),
        ) {
            (Some(recorded), Some(named)) if recorded != named => return Ok(None),
            (recorded, named) => named.or(recorded),
        };
        if attempt.failure_code.is_some() || attempt.failure_message.is_some() {
            return Ok(None);
        }
        // The database keeps microseconds: the answer and a later read
        // must show the same timestamps.
        let now = Utc::now().trunc_subsecs(6);
        let after = attempt.with_facts(
            status,
            charge_id,
            observed.failure_code.as_deref(),
            observed.failure_message.as_deref(),
            now,
        );
        let mut events = vec![crate::events::of_payment(&after, Cause::Command)?];
        let order_after = match next {
            None => order.clone(),
            Some(next) => {
                let moved = Order {
                    status: next,
                    updated_at: now,
                    // An automatic payment captures its whole amount.
                    amount_captured: match next {
                        crate::domain::order::OrderStatus::Paid => after.amount,
                        _ => order.amount_captured,
                    },
                    ..order.clone()
                };
                events.extend(crate::events::of_order(&moved, Cause::Command)?);
                moved
            }
        };
        Ok(Some(Known {
            order: (order.clone(), order_after),
            attempt: after,
            status,
            events,
        }))
    }

    /// The attempt as it becomes.
    pub fn attempt(&self) -> &Payment {
        &self.attempt
    }

    /// The statement that writes it with the command's completion, for
    /// the driver to run under the claim's fence.
    pub fn into_write(self, ctx: &AppContext) -> SettleKnown {
        let confirm_decline = decline_to_confirm(self.status, Cause::Command);
        SettleKnown::new(ctx, self.order, self.attempt, self.events, confirm_decline)
    }
}

/// Applies a refund's reported state to the refund (and its payment and order).
pub async fn refund(
    tx: &mut PgConnection,
    metrics: &Metrics,
    refund_id: Uuid,
    observed: &ProviderObject,
    cause: Cause,
) -> Result<(Refund, Transition), StoreError> {
    let (payment_id, order_id) = store::refunds::owners_of(tx, refund_id)
        .await?
        .ok_or_else(|| missing("refund", refund_id))?;
    let order = store::orders::lock_by_id(tx, order_id)
        .await?
        .ok_or_else(|| missing("order", order_id))?;
    store::payments::lock(tx, payment_id)
        .await?
        .ok_or_else(|| missing("payment", payment_id))?;
    let current = store::refunds::lock(tx, refund_id)
        .await?
        .ok_or_else(|| missing("refund", refund_id))?;
    let transition = crate::domain::refund::transition(current.status, observed.status);
    let provider_id = non_empty(&observed.id);
    let updated = match transition {
        Transition::Advance(status) => {
            let r = store::refunds::set_status(
                tx,
                refund_id,
                status,
                provider_id,
                observed.failure_code.as_deref(),
            )
            .await?;
            crate::events::refund_changed(tx, metrics, &r, order_id, cause).await?;
            if decline_to_confirm(status, cause) {
                store::queue::confirm_decline_later::<crate::domain::payment::Refund>(
                    tx, refund_id,
                )
                .await?;
            }
            if status == PaymentStatus::Succeeded {
                let payment = store::payments::add_refunded(tx, payment_id, r.amount).await?;
                // An incident refund returns money for an attempt that never
                // paid the order: the order's state is not its business.
                let next = if r.incident {
                    order.status
                } else {
                    order.status.after_refund(
                        payment.refunded_amount,
                        payment.amount_captured,
                        r.cancels_order,
                    )
                };
                if next != order.status {
                    move_order(tx, metrics, order_id, next, cause).await?;
                }
            }
            metrics
                .refund_transitions
                .with_label_values(&[status.as_str(), cause.label()])
                .inc();
            r
        }
        Transition::Unchanged if current.provider_refund_id.is_none() && provider_id.is_some() => {
            store::refunds::set_status(tx, refund_id, current.status, provider_id, None).await?
        }
        Transition::Contradicted => {
            if store::incidents::refund_on_failed_refund(tx, refund_id, provider_id, cause.label())
                .await?
            {
                metrics
                    .incidents
                    .with_label_values(&["refund_on_failed_refund"])
                    .inc();
                tracing::error!(
                    %refund_id,
                    %payment_id,
                    %order_id,
                    cause = cause.label(),
                    "INCIDENT: the provider paid out a refund held as failed"
                );
            }
            current
        }
        Transition::Reversed => {
            let r = store::refunds::set_status(
                tx,
                refund_id,
                PaymentStatus::Failed,
                provider_id,
                observed.failure_code.as_deref(),
            )
            .await?;
            crate::events::refund_changed(tx, metrics, &r, order_id, cause).await?;
            store::payments::add_refunded(tx, payment_id, -r.amount).await?;
            if !r.incident {
                let next = order.status.after_refund_reversed();
                if next != order.status {
                    move_order(tx, metrics, order_id, next, cause).await?;
                }
            }
            if store::incidents::refund_failed_after_success(
                tx,
                refund_id,
                provider_id,
                cause.label(),
            )
            .await?
            {
                metrics
                    .incidents
                    .with_label_values(&["refund_failed_after_success"])
                    .inc();
                tracing::error!(
                    %refund_id,
                    %payment_id,
                    %order_id,
                    failure_code = observed.failure_code.as_deref().unwrap_or_default(),
                    cause = cause.label(),
                    "INCIDENT: a refund the provider paid failed afterwards; its amount is refundable again"
                );
            }
            metrics
                .refund_transitions
                .with_label_values(&["failed", cause.label()])
                .inc();
            r
        }
        // Not a refund's transition.
        Transition::Unchanged | Transition::Ignored | Transition::StrayHold => current,
    };
    Ok((updated, transition))
}
