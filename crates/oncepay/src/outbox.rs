//! The transactional outbox: every state change a merchant cares about
//! writes one event, in the transaction of the change itself. So an event
//! exists exactly when its change committed: a rollback leaves neither, a
//! replayed request or a repeated observation (which change nothing) write
//! nothing. The delivery workers (`workers::deliveries`) send what is here.
//!
//! Called from the few places that change a status: a payment attempt's
//! creation, settlement (`commands::settle`, shared by commands, webhooks
//! and the reconciler) and the cancel of an unpaid order.

use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::commands::settle::Cause;
use crate::domain::event::{EventCause, EventType};
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

async fn write<T: Serialize>(
    tx: &mut PgConnection,
    metrics: &Metrics,
    event_type: EventType,
    (object_id, order_id): (Uuid, Uuid),
    object: &T,
    cause: impl FnOnce(Option<&str>) -> EventCause,
) -> Result<(), StoreError> {
    let data = serde_json::to_value(object)
        .map_err(|e| StoreError::Corrupt(format!("serialising an event's object: {e}")))?;
    let request_id = crate::telemetry::request_id();
    let request_id = request_id.as_deref();
    store::events::append(
        tx,
        &NewEvent {
            id: Uuid::now_v7(),
            event_type: event_type.as_str(),
            object_type: event_type.object().as_str(),
            object_id,
            order_id,
            data,
            cause: cause(request_id).as_str(),
            request_id,
        },
    )
    .await?;
    // Counted before the caller commits: a commit that then fails
    // overcounts by one, as the transition counters do.
    metrics
        .events_written
        .with_label_values(&[event_type.as_str()])
        .inc();
    Ok(())
}

/// An order reached its status (`order.paid`, `.cancelled`, `.refunded`).
pub async fn order_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: &Order,
    cause: Cause,
) -> Result<(), StoreError> {
    let Some(event_type) = EventType::of_order(order.status) else {
        return Ok(());
    };
    write(tx, metrics, event_type, (order.id, order.id), order, |r| {
        cause_of(cause, r)
    })
    .await
}

/// A payment attempt was created pending or reached a final status.
pub async fn payment_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    payment: &Payment,
    cause: Cause,
) -> Result<(), StoreError> {
    let event_type = EventType::of_payment(payment.status);
    write(
        tx,
        metrics,
        event_type,
        (payment.id, payment.order_id),
        payment,
        |r| cause_of(cause, r),
    )
    .await
}

/// A refund reached a final status. A refund oncepay made itself, to
/// return a charge it did not expect, is caused by that incident.
pub async fn refund_changed(
    tx: &mut PgConnection,
    metrics: &Metrics,
    refund: &Refund,
    order_id: Uuid,
    cause: Cause,
) -> Result<(), StoreError> {
    let Some(event_type) = EventType::of_refund(refund.status) else {
        return Ok(());
    };
    let incident = refund.incident;
    write(
        tx,
        metrics,
        event_type,
        (refund.id, order_id),
        refund,
        |r| {
            if incident {
                EventCause::Incident
            } else {
                cause_of(cause, r)
            }
        },
    )
    .await
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
