//! What a merchant is told about, and how delivery to its endpoints is
//! paced: event types, what caused a change, the retry schedule and what a
//! receiver's answer means. No I/O here.

use std::time::Duration;

use super::order::OrderStatus;
use super::payment::PaymentStatus;

/// What kind of object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// An order.
    Order,
    /// A payment attempt.
    Payment,
    /// A refund.
    Refund,
    /// A dispute (chargeback).
    Dispute,
    /// A customer balance's transaction.
    Balance,
    /// A hold on a customer balance.
    BalanceHold,
    /// A tracked SKU's stock.
    Inventory,
}

impl ObjectKind {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Order => "order",
            ObjectKind::Payment => "payment",
            ObjectKind::Refund => "refund",
            ObjectKind::Dispute => "dispute",
            ObjectKind::Balance => "balance",
            ObjectKind::BalanceHold => "balance_hold",
            ObjectKind::Inventory => "inventory",
        }
    }
}

macro_rules! event_types {
    ($($variant:ident = $name:literal, $kind:ident;)+) => {
        /// Every state change a merchant can subscribe to.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum EventType {
            $(#[doc = $name] $variant,)+
        }

        impl EventType {
            /// Every type, in the order the API documents them.
            pub const ALL: &'static [EventType] = &[$(EventType::$variant,)+];

            /// The type's name (`payment.succeeded`).
            pub fn as_str(self) -> &'static str {
                match self { $(EventType::$variant => $name,)+ }
            }

            /// The kind of object its `data.object` is.
            pub fn object(self) -> ObjectKind {
                match self { $(EventType::$variant => ObjectKind::$kind,)+ }
            }
        }
    };
}

event_types! {
    OrderAuthorized = "order.authorized", Order;
    OrderPaid = "order.paid", Order;
    OrderCancelled = "order.cancelled", Order;
    OrderRefunded = "order.refunded", Order;
    OrderStockReserved = "order.stock_reserved", Order;
    OrderStockReleased = "order.stock_released", Order;
    OrderStockShortfall = "order.stock_shortfall", Order;
    PaymentPending = "payment.pending", Payment;
    PaymentRequiresAction = "payment.requires_action", Payment;
    PaymentRequiresCapture = "payment.requires_capture", Payment;
    PaymentCaptureDeadlineApproaching = "payment.capture_deadline_approaching", Payment;
    PaymentSucceeded = "payment.succeeded", Payment;
    PaymentFailed = "payment.failed", Payment;
    PaymentVoided = "payment.voided", Payment;
    RefundSucceeded = "refund.succeeded", Refund;
    RefundFailed = "refund.failed", Refund;
    DisputeCreated = "dispute.created", Dispute;
    DisputeUpdated = "dispute.updated", Dispute;
    DisputeClosed = "dispute.closed", Dispute;
    BalanceCredited = "balance.credited", Balance;
    BalanceDebited = "balance.debited", Balance;
    BalanceHoldCreated = "balance_hold.created", BalanceHold;
    BalanceHoldCaptured = "balance_hold.captured", BalanceHold;
    BalanceHoldReleased = "balance_hold.released", BalanceHold;
    BalanceHoldExpired = "balance_hold.expired", BalanceHold;
    InventoryAdjusted = "inventory.adjusted", Inventory;
}

impl EventType {
    /// Parses a type name.
    pub fn parse(name: &str) -> Option<EventType> {
        Self::ALL.iter().copied().find(|t| t.as_str() == name)
    }

    /// The event an order reaching `status` makes (none for the status an
    /// order is created in).
    pub fn of_order(status: OrderStatus) -> Option<EventType> {
        match status {
            OrderStatus::AwaitingPayment => None,
            OrderStatus::Authorized => Some(EventType::OrderAuthorized),
            OrderStatus::Paid => Some(EventType::OrderPaid),
            OrderStatus::Cancelled => Some(EventType::OrderCancelled),
            OrderStatus::Refunded => Some(EventType::OrderRefunded),
        }
    }

    /// The event a payment attempt reaching `status` makes.
    pub fn of_payment(status: PaymentStatus) -> EventType {
        match status {
            PaymentStatus::Pending => EventType::PaymentPending,
            PaymentStatus::Succeeded => EventType::PaymentSucceeded,
            PaymentStatus::Failed => EventType::PaymentFailed,
            PaymentStatus::RequiresCapture => EventType::PaymentRequiresCapture,
            PaymentStatus::Voided => EventType::PaymentVoided,
        }
    }

    /// The event a dispute's change makes.
    pub fn of_dispute(change: super::dispute::DisputeChange) -> EventType {
        use super::dispute::DisputeChange;
        match change {
            DisputeChange::Created => EventType::DisputeCreated,
            DisputeChange::Updated => EventType::DisputeUpdated,
            DisputeChange::Closed => EventType::DisputeClosed,
        }
    }

    /// The event a refund reaching `status` makes (a refund is created
    /// pending without one: its request's answer says so).
    pub fn of_refund(status: PaymentStatus) -> Option<EventType> {
        match status {
            PaymentStatus::Pending => None,
            PaymentStatus::Succeeded => Some(EventType::RefundSucceeded),
            PaymentStatus::Failed => Some(EventType::RefundFailed),
            // Not refund statuses.
            PaymentStatus::RequiresCapture | PaymentStatus::Voided => None,
        }
    }
}

/// Who made a change, as an event's trail shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventCause {
    /// A merchant's (or a checkout page's) request.
    Request,
    /// A provider's webhook, confirmed by reading the object back.
    Webhook,
    /// The reconciler: a pending object settled, or a command resumed.
    Reconciler,
    /// oncepay returning money the provider took for a failed attempt.
    Incident,
}

impl EventCause {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EventCause::Request => "request",
            EventCause::Webhook => "webhook",
            EventCause::Reconciler => "reconciler",
            EventCause::Incident => "incident",
        }
    }
}

/// The waits between delivery attempts (`ONCEPAY_WEBHOOK_SCHEDULE`): the
/// first attempt is at once, attempt *n + 1* follows a failed attempt *n*
/// after the *n*-th wait, and after the last wait's attempt fails the
/// delivery is given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    waits: Vec<Duration>,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No waits at all: a failed delivery would never be retried.
    #[error("needs at least one duration")]
    Empty,
    /// A zero or unreadable wait.
    #[error("{0:?} is not a positive duration (e.g. 5s, 30m, 2h)")]
    Bad(String),
}

impl RetrySchedule {
    /// The default: 5s, 5m, 30m, 2h, 5h, 10h, 10h, 24h, 24h, about 75.6
    /// hours in all, so a receiver that is down for three days (Stripe's
    /// retention) still gets every event.
    pub fn standard() -> RetrySchedule {
        const MINUTE: u64 = 60;
        const HOUR: u64 = 3600;
        let waits = [
            5,
            5 * MINUTE,
            30 * MINUTE,
            2 * HOUR,
            5 * HOUR,
            10 * HOUR,
            10 * HOUR,
            24 * HOUR,
            24 * HOUR,
        ];
        RetrySchedule {
            waits: waits.iter().map(|s| Duration::from_secs(*s)).collect(),
        }
    }

    /// Parses a comma-separated list of durations with `parse_one`.
    pub fn parse(
        text: &str,
        parse_one: impl Fn(&str) -> Result<Duration, String>,
    ) -> Result<RetrySchedule, ScheduleError> {
        let waits = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match parse_one(s) {
                Ok(d) if !d.is_zero() => Ok(d),
                _ => Err(ScheduleError::Bad(s.to_string())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if waits.is_empty() {
            return Err(ScheduleError::Empty);
        }
        Ok(RetrySchedule { waits })
    }

    /// How long all the waits add up to: the shortest time a delivery is
    /// retried for.
    pub fn total(&self) -> Duration {
        self.waits.iter().sum()
    }

    /// Every attempt there will be: the first, and one after each wait.
    pub fn attempts(&self) -> usize {
        self.waits.len() + 1
    }

    /// After `failed` attempts have failed (1 for the first), the wait
    /// before the next, or `None` to give up. `jitter` in `[0, 1)` spreads
    /// retries of many deliveries that failed together; it only lengthens
    /// a wait (by up to a quarter), so the total never falls short.
    pub fn next_wait(&self, failed: u32, jitter: f64) -> Option<Duration> {
        let index = usize::try_from(failed).ok()?.checked_sub(1)?;
        let wait = *self.waits.get(index)?;
        Some(wait.mul_f64(1.0 + 0.25 * jitter.clamp(0.0, 1.0)))
    }
}

/// What a receiver's answer means for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Any 2xx: received.
    Delivered,
    /// `410 Gone`: the receiver asks never to be called again; the endpoint
    /// is disabled.
    Gone,
    /// Anything else (other statuses, timeouts, refused connections): try
    /// again on the schedule.
    Retry,
}

impl Verdict {
    /// The verdict of an HTTP status; `None` (no answer) is a retry.
    pub fn of(status: Option<u16>) -> Verdict {
        match status {
            Some(200..=299) => Verdict::Delivered,
            Some(410) => Verdict::Gone,
            _ => Verdict::Retry,
        }
    }
}

/// Who observed the provider's state (a metrics label).
#[derive(Debug, Clone, Copy)]
pub enum Cause {
    /// The command's own provider call.
    Command,
    /// A webhook.
    Webhook,
    /// The reconciler's look.
    Reconciler,
}

impl Cause {
    /// The metrics label and the stored `detected_by`.
    pub fn label(self) -> &'static str {
        match self {
            Cause::Command => "command",
            Cause::Webhook => "webhook",
            Cause::Reconciler => "reconciler",
        }
    }
}

/// What a provider's event did, as stored on its `webhook_event` row,
/// answered to the provider and counted (`oncepay_webhooks_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOutcome {
    /// Applied, or it repeated what we hold.
    Processed,
    /// The same event again: answered, nothing done.
    Duplicate,
    /// Stale or backward for what we hold: recorded, nothing done.
    Ignored,
    /// About a charge we have no row for: recorded for a person.
    UnknownCharge,
    /// The provider did not confirm it: recorded, nothing done.
    Unconfirmed,
    /// Its facts contradict our books: recorded, nothing done.
    Mismatch,
    /// It cannot be stored as sent (U+0000): recorded written out.
    Rejected,
}

impl EventOutcome {
    /// Every outcome.
    pub const ALL: [EventOutcome; 7] = [
        EventOutcome::Processed,
        EventOutcome::Duplicate,
        EventOutcome::Ignored,
        EventOutcome::UnknownCharge,
        EventOutcome::Unconfirmed,
        EventOutcome::Mismatch,
        EventOutcome::Rejected,
    ];

    /// Its name, as stored, answered and counted.
    pub fn as_str(self) -> &'static str {
        match self {
            EventOutcome::Processed => "processed",
            EventOutcome::Duplicate => "duplicate",
            EventOutcome::Ignored => "ignored",
            EventOutcome::UnknownCharge => "unknown_charge",
            EventOutcome::Unconfirmed => "unconfirmed",
            EventOutcome::Mismatch => "mismatch",
            EventOutcome::Rejected => "rejected",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(text: &str) -> Result<Duration, String> {
        text.strip_suffix('s')
            .and_then(|n| n.parse().ok())
            .map(Duration::from_secs)
            .ok_or_else(|| "bad".to_string())
    }

    #[test]
    fn every_type_round_trips_and_names_its_object() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(*t));
            assert!(t.as_str().starts_with(t.object().as_str()));
        }
        assert_eq!(EventType::parse("payment.created"), None);
    }

    #[test]
    fn statuses_map_to_their_events() {
        assert_eq!(EventType::of_order(OrderStatus::AwaitingPayment), None);
        assert_eq!(
            EventType::of_order(OrderStatus::Refunded),
            Some(EventType::OrderRefunded)
        );
        assert_eq!(
            EventType::of_payment(PaymentStatus::Pending),
            EventType::PaymentPending
        );
        assert_eq!(EventType::of_refund(PaymentStatus::Pending), None);
        assert_eq!(
            EventType::of_refund(PaymentStatus::Failed),
            Some(EventType::RefundFailed)
        );
    }

    #[test]
    fn the_standard_schedule_lasts_more_than_three_days() {
        let s = RetrySchedule::standard();
        assert!(
            s.total() >= Duration::from_secs(3 * 86_400),
            "{:?}",
            s.total()
        );
        assert_eq!(s.attempts(), 10);
    }

    #[test]
    fn waits_follow_the_schedule_then_give_up() {
        let s = RetrySchedule::parse("1s, 2s,4s", secs).expect("valid");
        assert_eq!(s.next_wait(0, 0.0), None, "nothing failed yet");
        assert_eq!(s.next_wait(1, 0.0), Some(Duration::from_secs(1)));
        assert_eq!(s.next_wait(3, 0.0), Some(Duration::from_secs(4)));
        assert_eq!(s.next_wait(4, 0.0), None, "the last attempt failed");
        let jittered = s.next_wait(2, 0.999).expect("a wait");
        assert!(jittered >= Duration::from_secs(2) && jittered < Duration::from_millis(2500));
        assert_eq!(
            s.next_wait(1, 7.0),
            Some(Duration::from_millis(1250)),
            "clamped"
        );
    }

    #[test]
    fn bad_schedules_are_refused() {
        assert_eq!(RetrySchedule::parse("", secs), Err(ScheduleError::Empty));
        assert_eq!(
            RetrySchedule::parse("1s,soon", secs),
            Err(ScheduleError::Bad("soon".into()))
        );
        assert_eq!(
            RetrySchedule::parse("0s", secs),
            Err(ScheduleError::Bad("0s".into()))
        );
    }

    #[test]
    fn answers_decide_the_delivery() {
        assert_eq!(Verdict::of(Some(200)), Verdict::Delivered);
        assert_eq!(Verdict::of(Some(204)), Verdict::Delivered);
        assert_eq!(Verdict::of(Some(410)), Verdict::Gone);
        for other in [None, Some(301), Some(400), Some(404), Some(429), Some(500)] {
            assert_eq!(Verdict::of(other), Verdict::Retry, "{other:?}");
        }
    }
}
