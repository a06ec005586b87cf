//! Outbound: the events oncepay sends to merchants. This module is the
//! transactional outbox; every state change a merchant cares about
//! writes one event, in the transaction of the change itself. So an event
//! exists exactly when its change committed: a rollback leaves neither, a
//! replayed request or a repeated observation (which change nothing) write
//! nothing. The delivery workers (`events::deliveries`) send what is here.
//!
//! Called from the few places that change a status: a payment attempt's
//! creation, settlement (`commands::settle`, shared by commands, webhooks
//! and the reconciler) and the cancel of an unpaid order.

pub mod deliveries;
pub mod outbound;

use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::event::{Cause, EventCause, EventType};
use crate::domain::order::Order;
use crate::domain::payment::{Payment, Refund};
use crate::metrics::Metrics;
use crate::store::events::NewEvent;
use crate::store::{self, StoreError};

/// Who made a change, from who observed it and whether a request is being
/// served: a command resumed by the reconciler has no request.
fn cause_of(cause: Cause, request_id: Option<&str>) -> EventCause {
    match cause {
        Cause::Command if request_id.is_some() => EventCause::Request,
        Cause::Command | Cause::Reconciler => EventCause::Reconciler,
        Cause::Webhook => EventCause::Webhook,
    }
}

/// An event made from a change, not yet written: what the change's
/// statement writes with it. Built apart from the write so that a change
/// made in one statement (see `store::payments::insert_claiming`) can carry
/// its events in that same statement.
pub struct Pending {
    id: Uuid,
    event_type: EventType,
    object_id: Uuid,
    order_id: Uuid,
    data: serde_json::Value,
    cause: EventCause,
    request_id: Option<std::sync::Arc<str>>,
    actor: Option<serde_json::Value>,
}

impl Pending {
    /// The event without some of its object's fields, which the statement
    /// that writes it fills in from a row it reads (see
    /// `store::payments::INSERT_CLAIMING`).
    pub fn without(mut self, fields: &[&str]) -> Pending {
        if let Some(object) = self.data.as_object_mut() {
            for field in fields {
                object.remove(*field);
            }
        }
        self
    }

    /// The row to insert.
    pub fn as_new(&self) -> NewEvent<'_> {
        NewEvent {
            id: self.id,
            event_type: self.event_type.as_str(),
            object_type: self.event_type.object().as_str(),
            object_id: self.object_id,
            order_id: self.order_id,
            data: &self.data,
            cause: self.cause.as_str(),
            request_id: self.request_id.as_deref(),
            actor: self.actor.as_ref(),
        }
    }
}

/// Counts events once the statement that wrote them has run. Counted
/// before the caller commits: a commit that then fails overcounts, as the
/// transition counters do.
pub fn count(metrics: &Metrics, events: &[Pending]) {
    for event in events {
        metrics
            .events_written
            .with_label_values(&[event.event_type.as_str()])
            .inc();
    }
}

fn build<T: Serialize>(
    event_type: EventType,
    (object_id, order_id): (Uuid, Uuid),
    object: &T,
    cause: impl FnOnce(Option<&str>) -> EventCause,
) -> Result<Pending, StoreError> {
    let data =
        serde_json::to_value(object).map_err(crate::store::Corrupt::json("an event's object"))?;
    let request_id = crate::telemetry::request_id();
    Ok(Pending {
        id: Uuid::now_v7(),
        event_type,
        object_id,
        order_id,
        data,
        cause: cause(request_id.as_deref()),
        request_id,
        // Who asked for the command this change belongs to (see
        // `audit::acting_as`): a webhook's or the reconciler's own change
        // runs outside any command and names nobody.
        actor: crate::audit::acting().map(|a| a.member()),
    })
}

async fn write(
    tx: &mut PgConnection,
    metrics: &Metrics,
    event: Option<Pending>,
) -> Result<(), StoreError> {
    let Some(event) = event else {
        return Ok(());
    };
    store::events::append(tx, &event.as_new()).await?;
    count(metrics, std::slice::from_ref(&event));
    Ok(())
}

/// The event of an order that reached its status (`order.paid`,
/// `.cancelled`, `.refunded`); `None` for a status no event reports.
pub(crate) fn of_order(order: &Order, cause: Cause) -> Result<Option<Pending>, StoreError> {
    EventType::of_order(order.status)
        .map(|event_type| {
            build(event_type, (order.id, order.id), order, |r| {
                cause_of(cause, r)
            })
        })
        .transpose()
}

/// The event of a payment attempt created pending or reaching a final status.
pub(crate) fn of_payment(payment: &Payment, cause: Cause) -> Result<Pending, StoreError> {
    build(
        EventType::of_payment(payment.status),
        (payment.id, payment.order_id),
        payment,
        |r| cause_of(cause, r),
    )
}

/// An order reached its status (`order.paid`, `.cancelled`, `.refunded`).
pub(crate) async fn order_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: &Order,
    cause: Cause,
) -> Result<(), StoreError> {
    write(tx, metrics, of_order(order, cause)?).await
}

/// An order's stock moved (`order.stock_reserved`, `.stock_released`,
/// `.stock_shortfall`); its object is the order as it now is, and the
/// order's trail shows it. Written in the transaction of the transfers.
pub(crate) async fn order_stock(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: &Order,
    event_type: EventType,
    cause: Cause,
) -> Result<(), StoreError> {
    let event = build(event_type, (order.id, order.id), order, |r| {
        cause_of(cause, r)
    })?;
    write(tx, metrics, Some(event)).await
}

/// A payment attempt was created pending or reached a final status.
pub(crate) async fn payment_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    payment: &Payment,
    cause: Cause,
) -> Result<(), StoreError> {
    write(tx, metrics, Some(of_payment(payment, cause)?)).await
}

/// A pending payment attempt now waits for its customer (`next_action`).
pub(crate) async fn payment_requires_action(
    tx: &mut PgConnection,
    metrics: &Metrics,
    payment: &Payment,
    cause: Cause,
) -> Result<(), StoreError> {
    let event = build(
        EventType::PaymentRequiresAction,
        (payment.id, payment.order_id),
        payment,
        |r| cause_of(cause, r),
    )?;
    write(tx, metrics, Some(event)).await
}

/// A hold's `capture_before` is within `ONCEPAY_CAPTURE_REMINDER`
/// (`payment.capture_deadline_approaching`, once per payment: the sweeper
/// marks the payment as it writes this).
pub(crate) async fn payment_capture_deadline_approaching(
    tx: &mut PgConnection,
    metrics: &Metrics,
    payment: &Payment,
) -> Result<(), StoreError> {
    let event = build(
        EventType::PaymentCaptureDeadlineApproaching,
        (payment.id, payment.order_id),
        payment,
        |r| cause_of(Cause::Reconciler, r),
    )?;
    write(tx, metrics, Some(event)).await
}

/// A refund reached a final status. A refund oncepay made itself, to
/// return a charge it did not expect, is caused by that incident.
pub(crate) async fn refund_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    refund: &Refund,
    order_id: Uuid,
    cause: Cause,
) -> Result<(), StoreError> {
    let incident = refund.incident;
    let event = EventType::of_refund(refund.status)
        .map(|event_type| {
            build(event_type, (refund.id, order_id), refund, |r| {
                if incident {
                    EventCause::Incident
                } else {
                    cause_of(cause, r)
                }
            })
        })
        .transpose()?;
    write(tx, metrics, event).await
}

/// A dispute was opened, changed or closed (`dispute.created`,
/// `.updated`, `.closed`); its `data.object` is the dispute as
/// `GET /disputes/{id}` shows it, and the order's trail shows it.
pub(crate) async fn dispute_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    dispute: &crate::domain::dispute::Dispute,
    change: crate::domain::dispute::DisputeChange,
    cause: Cause,
) -> Result<(), StoreError> {
    let event = build(
        EventType::of_dispute(change),
        (dispute.id, dispute.order_id),
        dispute,
        |r| cause_of(cause, r),
    )?;
    write(tx, metrics, Some(event)).await
}

/// A customer balance changed (`balance.*`, `balance_hold.*`): an event
/// of `merchant_id` about `object_id` (a balance transaction or a hold),
/// whose `data.object` is `object` as its `GET` shows it. Written in the
/// transaction of the transfer, under its holder's row lock.
pub(crate) async fn ledger_changed<T: Serialize>(
    tx: &mut PgConnection,
    metrics: &Metrics,
    merchant_id: Uuid,
    event_type: EventType,
    object_id: Uuid,
    object: &T,
    cause: Cause,
) -> Result<(), StoreError> {
    // No order: the nil id stands in the batch's column, and the
    // statement stores none.
    let event = build(event_type, (object_id, Uuid::nil()), object, |r| {
        cause_of(cause, r)
    })?;
    store::events::append_for_merchant(tx, merchant_id, &event.as_new()).await?;
    count(metrics, std::slice::from_ref(&event));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_without_a_request_was_resumed_by_the_reconciler() {
        assert_eq!(cause_of(Cause::Command, Some("r1")), EventCause::Request);
        assert_eq!(cause_of(Cause::Command, None), EventCause::Reconciler);
        assert_eq!(cause_of(Cause::Webhook, Some("r2")), EventCause::Webhook);
        assert_eq!(cause_of(Cause::Reconciler, None), EventCause::Reconciler);
    }
}
