//! Provider events arriving by webhook, after their signature was verified.
//!
//! An event is a hint; the provider is the truth. An event that would move
//! a payment or refund out of `pending` (or contradict a final state) is
//! first checked against what we know (the charge or refund id, amount and
//! currency) and then confirmed by reading the object from the provider
//! (the same classified, retried read the reconciler uses). Only the
//! provider's answer is applied, through the same forward-only settlement
//! as everything else. An event the provider does not confirm is recorded
//! with its reason (`unconfirmed`, `mismatch`), counted, logged, and changes
//! nothing: the reconciler settles the object from the provider later.
//!
//! Failure events are confirmed too: a forged or misrouted `charge.failed`
//! would make the order payable again while the provider may still take the
//! money, which is as costly as a forged success.
//!
//! When the provider cannot be asked right now (a timeout, an outage, a
//! refused read: an *unknown* answer), the event is not recorded and is
//! answered `503` with `Retry-After`, so the provider delivers it again
//! later: for a payment we hold as failed, that redelivery is the only
//! report of money taken, so it must not be spent on an outage.
//!
//! Events are deduplicated by `(provider, event id)` with the payload kept;
//! the dedup row and the effect commit in one transaction; an event that
//! applies nothing (the usual case: the command settled first) is recorded
//! with its outcome in one statement. Duplicates, stale events and events
//! that change nothing cost no provider read.
//!
//! Dispute events (`charge.dispute.*`) name a dispute, which is read from
//! the provider and applied as it says (`disputes.rs`).

pub(crate) mod disputes;
mod payload;

pub(crate) use payload::{nul_at, without_nul};

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::commands::local_runs::Waited;
use crate::commands::settle::{self, Cause};
use crate::commands::AppContext;
use crate::domain::event::EventOutcome;
use crate::domain::payment::{Payment, PaymentStatus, Refund, Transition};
use crate::idempotency::store_problem;
use crate::problem::{Problem, ProblemCode};
use crate::provider::{CallOutcome, Event, ProviderObject, Subject, SubjectKind};
use crate::store::{self, StoreError};

/// What an event is about, as found in our books.
enum Target {
    Charge(Payment),
    Refund(Refund),
}

/// The attempt an event would move, once no command executes on it, or
/// at `deadline` (`ONCEPAY_WEBHOOK_COMMAND_WAIT`, 250 ms, after the event
/// arrived, whatever it waited for before). A provider
/// often sends a charge's webhook while the command that made the charge
/// is about to settle it with the provider's own answer to its call; once
/// it has, the event changes nothing, and costs neither a confirmation
/// read nor row locks. Bounded: a command whose process died holds its
/// lease until the lease expires, and after the wait the event is
/// confirmed and applied as usual. Holds no connection while it waits:
/// woken when the command ends if it runs in this process
/// ([`LocalRuns`](crate::commands::local_runs::LocalRuns)), else polling.
async fn after_command(
    ctx: &AppContext,
    mut found: store::payments::Found,
    event: &Subject,
    recorded: &store::payments::ChargeEvent<'_>,
    deadline: Instant,
) -> Result<Option<Payment>, StoreError> {
    let mut pause = Duration::from_millis(2);
    loop {
        let would_move = matches!(
            found.attempt.status.transition(event.state.status),
            Transition::Advance(_)
        );
        let now = Instant::now();
        if !found.command_executing || !would_move || now >= deadline {
            return Ok(Some(found.attempt));
        }
        let attempt_id = found.attempt.id;
        let woken = ctx
            .local_runs
            .wait_for_end(attempt_id, deadline - now)
            .await;
        if woken == Waited::NotHere {
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(Duration::from_millis(25));
        }
        // Read again, recording the event at once if the command settled
        // the attempt as the event says (the usual end of the wait).
        match store::payments::find_by_charge_or_record_repeat(&ctx.group_commit, recorded).await? {
            Some((_, true)) => return Ok(None),
            Some((again, false)) => found = again,
            None => return Ok(Some(found.attempt)),
        }
    }
}

impl Target {
    fn status(&self) -> PaymentStatus {
        match self {
            Target::Charge(p) => p.status,
            Target::Refund(r) => r.status,
        }
    }

    /// Whether the event would move what we hold (so it must be confirmed
    /// by the provider before anything is applied).
    fn needs_confirmation(&self, event: &Subject) -> bool {
        let transition = match self {
            Target::Charge(p) => p.status.transition(event.state.status),
            Target::Refund(r) => crate::domain::refund::transition(r.status, event.state.status),
        };
        matches!(
            transition,
            Transition::Advance(_)
                | Transition::Contradicted
                | Transition::Reversed
                | Transition::StrayHold
        )
    }

    /// A fact of the event that contradicts what we hold, if any.
    fn mismatch(&self, event: &Subject) -> Option<String> {
        let (known_id, amount, currency) = match self {
            Target::Charge(p) => (
                p.provider_charge_id.as_deref(),
                p.amount,
                Some(p.currency.as_str()),
            ),
            Target::Refund(r) => (r.provider_refund_id.as_deref(), r.amount, None),
        };
        if let Some(known) = known_id {
            if !event.state.id.is_empty() && event.state.id != known {
                return Some(format!(
                    "the event names {}, ours is {known}",
                    event.state.id
                ));
            }
        }
        if let Some(a) = event.amount.filter(|a| *a != amount) {
            return Some(format!("the event says amount {a}, ours is {amount}"));
        }
        if let (Some(theirs), Some(ours)) = (event.currency.as_deref(), currency) {
            if !theirs.eq_ignore_ascii_case(ours) {
                return Some(format!("the event says currency {theirs}, ours is {ours}"));
            }
        }
        None
    }
}

/// What the event did, as stored and counted.
struct Outcome {
    label: EventOutcome,
    confirmed: bool,
    detail: Option<String>,
}

impl Outcome {
    fn plain(label: EventOutcome) -> Self {
        Outcome {
            label,
            confirmed: false,
            detail: None,
        }
    }
}

/// Applies one verified event; returns its outcome label (`processed`,
/// `duplicate`, `ignored`, `unknown_charge`, `unconfirmed`, `mismatch`,
/// `rejected`).
pub(crate) async fn apply(
    ctx: &AppContext,
    provider: &str,
    header_id: Option<&str>,
    body: &[u8],
) -> Result<EventOutcome, Problem> {
    let payload: Value = serde_json::from_slice(body)
        .map_err(|_| Problem::new(ProblemCode::MalformedJson, "the event is not JSON"))?;
    if let Some(path) = nul_at(&payload, &mut String::new()) {
        return reject_unstorable(ctx, provider, header_id, &payload, &path).await;
    }
    // A signed event of a shape we do not know is still kept and answered
    // 200 (never lost): it is recorded as ignored, for a person to look at.
    let event = ctx.providers.named(provider).parse_event(&payload);
    let event_id = event
        .id
        .clone()
        .or_else(|| header_id.map(str::to_string))
        .ok_or_else(|| Problem::invalid_field("id", "is required"))?;
    let applied = match event.dispute.as_deref() {
        Some(dispute) => disputes::apply(ctx, provider, &event_id, &event, dispute, &payload).await,
        None => apply_parsed(ctx, provider, &event_id, &event, &payload).await,
    };
    match applied {
        Ok(Applied::Done(label)) => Ok(label),
        Ok(Applied::Deferred(reason)) => {
            tracing::warn!(event_id, %reason, "webhook deferred: the provider could not confirm it now");
            Err(Problem::new(
                ProblemCode::ConfirmationUnavailable,
                "the provider could not be asked to confirm this event now; deliver it again later",
            )
            .retry_after(30))
        }
        Err(e) => Err(store_problem(e)),
    }
}

/// A signed event holding U+0000 cannot be stored as it came, and a
/// provider retries an event until it is accepted: it is recorded as
/// `rejected` (its NULs written out), counted, logged, and answered `200`,
/// so it is neither lost nor retried for ever. It moves nothing.
async fn reject_unstorable(
    ctx: &AppContext,
    provider: &str,
    header_id: Option<&str>,
    payload: &Value,
    path: &str,
) -> Result<EventOutcome, Problem> {
    let stored = without_nul(payload);
    let event_id = stored
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| header_id.map(str::to_string))
        .ok_or_else(|| Problem::invalid_field("id", "is required"))?;
    let event_type = stored
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("unrecognised");
    let path = path.replace('\0', "\\u0000");
    let field = if path.is_empty() { "the event" } else { &path };
    let detail = format!("{field} holds U+0000, which cannot be stored; nothing was applied");
    tracing::error!(event_id, %detail, "provider event rejected");
    let done = store::inbound::Done {
        provider,
        event_id: &event_id,
        event_type,
        payload: &stored,
        outcome: EventOutcome::Rejected.as_str(),
        confirmed: false,
        detail: Some(&detail),
    };
    let recorded = store::inbound::record_done(&ctx.pool, &done)
        .await
        .map_err(store_problem)?;
    Ok(if recorded {
        EventOutcome::Rejected
    } else {
        EventOutcome::Duplicate
    })
}

/// What handling an event came to.
enum Applied {
    /// Recorded, with this outcome.
    Done(EventOutcome),
    /// Not recorded: the provider could not be asked; deliver it again.
    Deferred(String),
}

/// The event being handled, as received.
struct Received<'a> {
    provider: &'a str,
    event_id: &'a str,
    envelope: &'a Event,
    payload: &'a Value,
}

async fn apply_parsed(
    ctx: &AppContext,
    provider: &str,
    event_id: &str,
    envelope: &Event,
    payload: &Value,
) -> Result<Applied, StoreError> {
    let received = Received {
        provider,
        event_id,
        envelope,
        payload,
    };
    let object = envelope.subject.as_ref();
    let target = match target_of(ctx, &received).await? {
        Found::Settled => return Ok(Applied::Done(EventOutcome::Processed)),
        Found::Target(target) => target,
    };
    // A duplicate is answered before it costs a provider read; one that
    // needs no read is found by its recording (`ON CONFLICT DO NOTHING`).
    if let (Some(target), Some(event)) = (&target, object) {
        if target.needs_confirmation(event) {
            let mut conn = ctx.pool.acquire().await?;
            if store::inbound::exists(&mut conn, provider, event_id).await? {
                return Ok(Applied::Done(EventOutcome::Duplicate));
            }
        }
    }
    let (outcome, truth) = match (&target, object) {
        (None, Some(_)) => (Outcome::plain(EventOutcome::UnknownCharge), None),
        (Some(target), Some(event)) => match judge(ctx, target, event).await {
            Judged::Apply(outcome, truth) => (outcome, truth),
            Judged::Defer(reason) => return Ok(Applied::Deferred(reason)),
        },
        (None, None) if envelope.refunds_of.is_some() => {
            (refunds_due(ctx, provider, envelope).await?, None)
        }
        _ => (Outcome::plain(EventOutcome::Ignored), None),
    };
    match (target, truth) {
        (Some(target), Some(truth)) => settle_by_event(ctx, &received, target, &truth, &outcome)
            .await
            .map(Applied::Done),
        // Nothing to apply: the event and its outcome in one statement.
        _ => {
            let done = store::inbound::Done {
                provider,
                event_id,
                event_type: &envelope.event_type,
                payload,
                outcome: outcome.label.as_str(),
                confirmed: outcome.confirmed,
                detail: outcome.detail.as_deref(),
            };
            if !store::inbound::record_done(&ctx.pool, &done).await? {
                return Ok(Applied::Done(EventOutcome::Duplicate));
            }
            log_unapplied(envelope, event_id, object, &outcome);
            Ok(Applied::Done(outcome.label))
        }
    }
}

/// A charge's refunds changed and the event does not say which: its
/// pending refunds are made due for the reconciler's read now (each is
/// read by its own id or key, like any refund; the event applies nothing
/// by itself).
async fn refunds_due(
    ctx: &AppContext,
    provider: &str,
    envelope: &Event,
) -> Result<Outcome, StoreError> {
    let charge = envelope.refunds_of.as_deref().unwrap_or_default();
    let mut conn = ctx.pool.acquire().await?;
    let due = store::refunds::due_now_for_charge(&mut conn, provider, charge).await?;
    Ok(Outcome {
        label: EventOutcome::Processed,
        confirmed: false,
        detail: Some(format!(
            "the charge's refunds changed: {due} pending refund(s) due for a read now"
        )),
    })
}

/// What our rows say the event is about. Returned once per event and
/// matched at once: its size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Found {
    /// A charge event that only repeats what the command already settled:
    /// recorded, nothing more to do.
    Settled,
    /// The attempt or refund it is about, if ours.
    Target(Option<Target>),
}

/// Finds the attempt or refund an event is about. A charge event that
/// repeats what we hold is recorded by the same statement that finds it
/// (one round trip, no provider read).
async fn target_of(ctx: &AppContext, received: &Received<'_>) -> Result<Found, StoreError> {
    // One bound for all the waiting an event does for its command.
    let deadline = Instant::now() + ctx.webhook_command_wait;
    let object = received.envelope.subject.as_ref();
    let charge_event =
        object
            .filter(|o| o.kind == SubjectKind::Charge)
            .map(|o| store::payments::ChargeEvent {
                provider: received.provider,
                charge_id: &o.state.id,
                attempt_id: o.our_id,
                event_id: received.event_id,
                event_type: &received.envelope.event_type,
                payload: received.payload,
                status: o.state.status,
            });
    let (mut charge, mut refund) = (None, None);
    match (object, &charge_event) {
        (Some(_), Some(event)) => {
            // A provider often sends the webhook before its answer to the
            // command's call has been settled here. When that command runs
            // in this process, waiting for it first (no statement, bounded
            // as `after_command`) lets the one statement below find the
            // attempt settled and record the event: one statement, where
            // finding it still executing costs a second.
            if let Some(attempt_id) = event.attempt_id {
                ctx.local_runs
                    .wait_for_end(
                        attempt_id,
                        deadline.saturating_duration_since(Instant::now()),
                    )
                    .await;
            }
            match store::payments::find_by_charge_or_record_repeat(&ctx.group_commit, event).await?
            {
                Some((_, true)) => return Ok(Found::Settled),
                Some((found, false)) => charge = Some(found),
                None => {}
            }
        }
        (Some(o), None) => {
            let mut conn = ctx.pool.acquire().await?;
            refund = store::refunds::find_by_provider_id(&mut conn, &o.state.id, o.our_id).await?;
        }
        (None, _) => {}
    }
    // No connection is held while the provider answers, or while the
    // command settles.
    Ok(Found::Target(
        match (charge, refund, object, &charge_event) {
            (Some(found), _, Some(event), Some(recorded)) => {
                match after_command(ctx, found, event, recorded, deadline).await? {
                    Some(attempt) => Some(Target::Charge(attempt)),
                    // Settled by the command as the event says: recorded.
                    None => return Ok(Found::Settled),
                }
            }
            (_, Some(refund), _, _) => Some(Target::Refund(refund)),
            _ => None,
        },
    ))
}

/// Records the event and settles its attempt or refund as the provider's
/// truth says, in one transaction: a duplicate that raced this one finds
/// the recording and changes nothing.
async fn settle_by_event(
    ctx: &AppContext,
    received: &Received<'_>,
    target: Target,
    truth: &ProviderObject,
    outcome: &Outcome,
) -> Result<EventOutcome, StoreError> {
    let Received {
        provider,
        event_id,
        envelope,
        payload,
    } = received;
    let mut tx = ctx.pool.begin().await?;
    if !store::inbound::record(&mut tx, provider, event_id, &envelope.event_type, payload).await? {
        tx.commit().await?;
        return Ok(EventOutcome::Duplicate);
    }
    let label = match target {
        Target::Charge(p) => {
            let (_, t) = settle::payment(
                &mut tx,
                &ctx.metrics,
                (p.id, p.order_id),
                truth,
                Cause::Webhook,
            )
            .await?;
            label(t)
        }
        Target::Refund(r) => {
            let (_, t) = settle::refund(&mut tx, &ctx.metrics, r.id, truth, Cause::Webhook).await?;
            label(t)
        }
    };
    store::inbound::set_outcome(
        &mut tx,
        provider,
        event_id,
        label.as_str(),
        outcome.confirmed,
        outcome.detail.as_deref(),
    )
    .await?;
    tx.commit().await?;
    Ok(label)
}

/// Logs an event that was recorded without changing anything, when a
/// person may need to look at it.
fn log_unapplied(envelope: &Event, event_id: &str, object: Option<&Subject>, outcome: &Outcome) {
    match outcome.label {
        EventOutcome::UnknownCharge => {
            tracing::warn!(event_type = %envelope.event_type, event_id, "webhook for an unknown charge stored")
        }
        EventOutcome::Unconfirmed | EventOutcome::Mismatch => tracing::warn!(
            event_type = %envelope.event_type,
            event_id,
            object_id = object.map(|o| o.state.id.as_str()).unwrap_or_default(),
            outcome = outcome.label.as_str(),
            detail = outcome.detail.as_deref().unwrap_or_default(),
            "webhook not confirmed by the provider; it changed nothing"
        ),
        _ => {}
    }
}

/// What an event about a known object may do.
enum Judged {
    /// Record it with this outcome, applying the provider's object if any.
    Apply(Outcome, Option<ProviderObject>),
    /// The provider could not be asked: record nothing, ask for redelivery.
    Defer(String),
}

/// Decides what an event about a known object may do. Returns the outcome
/// and, when the provider confirmed the event, the provider's own object to
/// apply (never the event's).
async fn judge(ctx: &AppContext, target: &Target, event: &Subject) -> Judged {
    if !target.needs_confirmation(event) {
        // Nothing would move: no read needed, nothing applied.
        let label = match target.status().transition(event.state.status) {
            Transition::Ignored => EventOutcome::Ignored,
            _ => EventOutcome::Processed,
        };
        return Judged::Apply(Outcome::plain(label), None);
    }
    if let Some(detail) = target.mismatch(event) {
        return confirmation(ctx, EventOutcome::Mismatch, detail);
    }
    let read = match target {
        Target::Charge(p) => {
            ctx.providers
                .named(&p.provider)
                .find_charge(p.id, p.provider_charge_id.as_deref())
                .await
        }
        Target::Refund(r) => match crate::commands::refunds::sent(ctx, r).await {
            Ok(sent) => {
                ctx.providers
                    .named(&sent.provider)
                    .find_refund(&sent.request, sent.reference.as_deref())
                    .await
            }
            Err(e) => CallOutcome::Unknown(format!("reading the refund's payment: {e}")),
        },
    };
    match read {
        CallOutcome::Known(truth)
            if truth.status == event.state.status
                && (event.state.id.is_empty() || truth.id == event.state.id) =>
        {
            ctx.metrics
                .webhook_confirmations
                .with_label_values(&["confirmed"])
                .inc();
            let outcome = Outcome {
                label: EventOutcome::Processed,
                confirmed: true,
                detail: None,
            };
            Judged::Apply(outcome, Some(truth))
        }
        CallOutcome::Known(truth) if truth.id != event.state.id && !event.state.id.is_empty() => {
            let detail = format!(
                "the event names {}, the provider's object is {}",
                event.state.id, truth.id
            );
            confirmation(ctx, EventOutcome::Mismatch, detail)
        }
        CallOutcome::Known(truth) => {
            let detail = format!(
                "the event says {}, the provider says {}",
                event.state.status.as_str(),
                truth.status.as_str()
            );
            confirmation(ctx, EventOutcome::Unconfirmed, detail)
        }
        CallOutcome::NotFound => confirmation(
            ctx,
            EventOutcome::Unconfirmed,
            "the provider has no such object".into(),
        ),
        CallOutcome::Unknown(reason) => {
            ctx.metrics
                .webhook_confirmations
                .with_label_values(&["deferred"])
                .inc();
            Judged::Defer(reason)
        }
    }
}

/// An event the provider did not confirm: counted, and nothing to apply.
fn confirmation(ctx: &AppContext, label: EventOutcome, detail: String) -> Judged {
    ctx.metrics
        .webhook_confirmations
        .with_label_values(&[label.as_str()])
        .inc();
    let outcome = Outcome {
        label,
        confirmed: false,
        detail: Some(detail),
    };
    Judged::Apply(outcome, None)
}

fn label(t: Transition) -> EventOutcome {
    match t {
        Transition::Advance(_)
        | Transition::Unchanged
        | Transition::Contradicted
        | Transition::Reversed
        | Transition::StrayHold => EventOutcome::Processed,
        Transition::Ignored => EventOutcome::Ignored,
    }
}
