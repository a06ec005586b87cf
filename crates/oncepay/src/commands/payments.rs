//! `POST /payments`: a command in three recorded steps (four with a
//! provider that creates before it charges).
//!
//! 1. Create the attempt `pending` and record the step, in one transaction.
//! 2. Call the provider with keys derived from the attempt id. A provider
//!    that creates an object first (Stripe's PaymentIntent) has its id
//!    recorded as a step of its own ([`PaymentPoint::ChargeOpened`])
//!    before the call that charges (confirms) it.
//! 3. Record the outcome and store the response, in one transaction.
//!
//! A crash after 1 resumes at 2 with the same attempt id, so the provider
//! sees the same key and charges once; after the opened object is
//! recorded, only that object is ever confirmed. An unknown outcome is
//! stored as a `202 pending` answer and settled later by webhook or
//! reconciler. Every step speaks to the provider the attempt was made with.
//!
//! The common case costs three round trips to the database: a read of the
//! order, then step 1 with the claim of the key as one statement
//! ([`Command::first_step_claiming`]), then step 3 as one statement
//! (`settle::Known`). Each checks under its row locks that what it was
//! computed from has not moved, and writes nothing if it has; the command
//! then takes the locking path, which decides every other case.

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::fast_path::ClaimAttempt;
use super::provider_keys;
use super::settle::{self, Cause};
use super::{
    json_response, recovery_points, AppContext, At, ClaimingStep, Command, CommandError,
    CommandInput, FirstStepClaiming, Run, Step,
};
use crate::domain::order::Order;
use crate::domain::payment::{CaptureMethod, Payment, PaymentStatus};
use crate::idempotency::StoredResponse;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::provider::trace::Trace;
use crate::provider::{CallOutcome, ChargeRequest, Opened, ProviderObject};
use crate::store::payments::{InsertAttemptError, NewAttempt};
use crate::store::{self, Corrupt, StoreError};

recovery_points! {
    /// Where a payment can be resumed.
    PaymentPoint {
        /// The pending attempt exists (step 1): resuming sends (or looks up)
        /// the charge with the attempt id as the provider key.
        AttemptCreated = "attempt_created",
        /// The provider's object is created and its id recorded on the
        /// attempt: resuming confirms that object, never another.
        ChargeOpened = "charge_opened",
    }
}

/// What a payment's steps hand on within one process.
#[derive(Debug)]
pub enum PaymentMemo {
    /// Step 1 ran here: the attempt it created and the order as it was.
    Created {
        /// The new attempt.
        attempt: Payment,
        /// Its order, as step 1 saw it.
        order: Order,
    },
    /// The provider's object was opened and its id recorded on `attempt`.
    Opened {
        /// The attempt, with the id recorded.
        attempt: Payment,
        /// Its order, as step 1 saw it.
        order: Order,
    },
    /// The provider answered (`None`: the outcome is unknown), and the
    /// one-statement settlement found the rows moved: settle under locks
    /// with this answer, without asking the provider again.
    Charged {
        /// The attempt charged.
        attempt: Payment,
        /// What the provider said.
        observed: Option<ProviderObject>,
    },
}

/// Pay an order with a provider token.
pub struct CreatePayment {
    order_id: Uuid,
    payment_method: String,
    /// Where the customer comes back after acting at their bank (3-D
    /// Secure): the checkout page sets its own URL.
    return_url: Option<String>,
    /// `manual`: authorize only, captured or voided later.
    capture_method: CaptureMethod,
}

/// Reads a UUID field: a string that is not a UUID is a shape error.
pub(crate) fn uuid_field(obj: &Obj<'_>, name: &str) -> Result<Uuid, Problem> {
    let text = obj.string(name)?;
    Uuid::parse_str(&text).map_err(|_| Problem::invalid_field(name, "must be a UUID"))
}

impl Command for CreatePayment {
    const KIND: super::CommandKind = super::CommandKind::CreatePayment;
    type Point = PaymentPoint;
    type Memo = PaymentMemo;

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&["order_id", "payment_method", "return_url", "capture_method"])?;
        let order_id = uuid_field(&body, "order_id")?;
        let payment_method = body.string("payment_method")?;
        let return_url = body
            .opt_string("return_url")?
            .map(|u| super::checkout::way_back_url("return_url", &u))
            .transpose()?;
        let capture_method = super::captures::capture_method_field(&body)?;
        Ok(CreatePayment {
            order_id,
            payment_method,
            return_url,
            capture_method,
        })
    }

    /// The payment method must be in the form of the provider new payments
    /// go to (`ONCEPAY_PROVIDER`); each adapter says which.
    fn check(&self, ctx: &AppContext) -> Result<(), Problem> {
        // A card number never reaches oncepay on purpose: the page sends it
        // to the provider's tokenization and oncepay only the token. One
        // sent here is refused without being echoed, logged or stored.
        if crate::domain::card::looks_like_card_number(&self.payment_method) {
            return Err(Problem::rule(crate::domain::RuleViolation::new(
                "payment_method",
                "is a card number, which oncepay never accepts: send the card to the provider's tokenization (the checkout page does) and pay with the token it returns",
            )));
        }
        if self.capture_method == CaptureMethod::Manual
            && !ctx
                .providers
                .for_payment_method(&self.payment_method)
                .captures_later()
        {
            return Err(Problem::rule(crate::domain::RuleViolation::new(
                "capture_method",
                "manual is not supported by the current provider",
            )));
        }
        ctx.providers
            .for_payment_method(&self.payment_method)
            .check_payment_method(&self.payment_method)
            .map_err(|rule| {
                Problem::rule(crate::domain::RuleViolation::new("payment_method", rule))
            })
    }

    async fn first_step_claiming(
        &self,
        ctx: &AppContext,
        _merchant_id: Uuid,
    ) -> FirstStepClaiming<PaymentPoint, PaymentMemo> {
        // A hold is written the locking way (the one-statement claim makes
        // automatic payments).
        if ctx
            .providers
            .for_payment_method(&self.payment_method)
            .restricts_amounts()
            || self.capture_method == CaptureMethod::Manual
        {
            // The amount is checked against the order before any write:
            // the engine's full protocol, whose first step reads it.
            return Ok(None);
        }
        let attempt_id = Uuid::now_v7();
        // The database keeps microseconds: the memo and a later read must
        // show the same timestamps.
        let now = Utc::now().trunc_subsecs(6);
        // The event's object is the attempt as stored, but for the order's
        // amount and currency, which the statement takes from the order's
        // locked row (the order is not read before).
        let draft = Payment {
            return_url: self.return_url.clone(),
            ..Payment::pending(
                attempt_id,
                (self.order_id, 0, ""),
                ctx.providers
                    .for_payment_method(&self.payment_method)
                    .name(),
                &self.payment_method,
                now,
            )
        };
        let event =
            crate::events::of_payment(&draft, Cause::Command)?.without(&["amount", "currency"]);
        let write = ClaimAttempt::new(ctx, draft, event, |attempt, order| PaymentMemo::Created {
            attempt,
            order,
        });
        Ok(Some(ClaimingStep {
            point: PaymentPoint::AttemptCreated,
            resource: attempt_id,
            write: Box::new(write),
        }))
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<PaymentPoint, PaymentMemo>,
    ) -> Result<Step<PaymentPoint, PaymentMemo>, CommandError> {
        // Step 2, outside any transaction: no connection is held while the
        // provider answers. Skipped if a webhook or the reconciler already
        // settled the attempt.
        let (attempt, order, observed) = match at {
            At::Start => return self.create_attempt(ctx, run).await,
            At::After {
                point: PaymentPoint::AttemptCreated,
                memo: Some(PaymentMemo::Created { attempt, order }),
                ..
            } => match open(ctx, &attempt).await {
                // The first send: the attempt's first key. (Were it moved
                // on meanwhile, that key is spent: Stripe only replays it.)
                Opening::Charge => {
                    let observed = charge(ctx, &attempt, 0).await;
                    (attempt, Some(order), observed)
                }
                Opening::Record(reference) => {
                    let mut tx = ctx.pool.begin().await?;
                    let recorded =
                        store::payments::set_reference(&mut tx, attempt.id, &reference).await?;
                    match recorded {
                        Some(attempt) => {
                            return Ok(Step::Record {
                                tx,
                                point: PaymentPoint::ChargeOpened,
                                resource: attempt.id,
                                memo: PaymentMemo::Opened { attempt, order },
                            })
                        }
                        // The attempt moved meanwhile (settled, or another
                        // object recorded): carry on from what it is now.
                        None => {
                            drop(tx);
                            let (now, observed) = as_it_is(ctx, run, attempt.id).await?;
                            (now, None, observed)
                        }
                    }
                }
                Opening::Settled(observed) => (attempt, Some(order), observed),
            },
            At::After {
                memo: Some(PaymentMemo::Opened { attempt, order }),
                ..
            } => {
                let observed = charge(ctx, &attempt, 0).await;
                (attempt, Some(order), observed)
            }
            At::After {
                memo: Some(PaymentMemo::Charged { attempt, observed }),
                ..
            } => (attempt, None, observed),
            // Resumed after a crash: the attempt as it is now (a webhook or
            // the reconciler may have settled it meanwhile).
            At::After { resource, .. } => {
                let (attempt, observed) = as_it_is(ctx, run, resource).await?;
                (attempt, None, observed)
            }
        };

        // Step 3, in one statement when nothing moved since step 1.
        if let (Some(order), Some(object)) = (&order, &observed) {
            if let Some(known) = settle::Known::plan(&attempt, order, object)? {
                let response = payment_response(known.attempt())?;
                return Ok(Step::CompleteInOne {
                    response,
                    write: Box::new(known.into_write(ctx)),
                    otherwise: Some(PaymentMemo::Charged { attempt, observed }),
                });
            }
        }

        // Step 3, under locks.
        let attempt_id = attempt.id;
        let mut tx = ctx.pool.begin().await?;
        let payment = match observed {
            Some(object) => {
                settle::payment(
                    &mut tx,
                    &ctx.metrics,
                    (attempt_id, attempt.order_id),
                    &object,
                    Cause::Command,
                )
                .await?
                .0
            }
            None => store::payments::lock(&mut tx, attempt_id)
                .await?
                .ok_or_else(|| Corrupt::vanished("attempt", attempt_id))?,
        };
        let response = payment_response(&payment)?;
        Ok(Step::Complete { tx, response })
    }
}

/// The attempt as it is now (a webhook or the reconciler may have settled
/// it meanwhile) and, if still pending, what its provider knows of it. The
/// charge may have reached the provider before a crash: it looks first,
/// so a provider whose keys expire cannot charge twice.
async fn as_it_is(
    ctx: &AppContext,
    run: Run<'_>,
    id: Uuid,
) -> Result<(Payment, Option<ProviderObject>), CommandError> {
    let mut conn = ctx.pool.acquire().await?;
    let attempt = store::payments::get(&mut conn, run.merchant_id, id)
        .await?
        .ok_or_else(|| Corrupt::vanished("attempt", id))?;
    drop(conn);
    let observed = if attempt.status.is_known() {
        None
    } else {
        look_up_or_charge(ctx, &attempt).await
    };
    Ok((attempt, observed))
}

/// The answer: `201` once the provider's answer is known (final, or a
/// hold), `202` while pending.
pub(crate) fn payment_response(payment: &Payment) -> Result<StoredResponse, CommandError> {
    let status = if payment.status.is_known() { 201 } else { 202 };
    json_response(status, payment, Some(format!("/payments/{}", payment.id)))
}

impl CreatePayment {
    /// Step 1: checks the order and inserts the pending attempt.
    async fn create_attempt(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<PaymentPoint, PaymentMemo>, CommandError> {
        let mut tx = ctx.pool.begin().await?;
        let order = super::lock_order(&mut tx, run.merchant_id, self.order_id).await?;
        match store::payments::live_attempt(&mut tx, order.id).await? {
            // It waits for its customer (3-D Secure): paying again is the
            // customer coming back to the same payment, not a second one.
            Some(live) if live.next_action.is_some() => {
                let response = payment_response(&live)?;
                return Ok(Step::Complete { tx, response });
            }
            Some(live) if live.status == PaymentStatus::Pending => {
                return Err(CommandError::Reject(payment_in_progress()));
            }
            _ => {}
        }
        super::ensure_payable(&order, "can be paid")?;
        let provider = ctx.providers.for_payment_method(&self.payment_method);
        super::provider_amounts::provider_takes(
            provider.as_ref(),
            order.amount,
            &order.currency,
            super::provider_amounts::Movement::Charge,
        )
        .map_err(CommandError::Reject)?;
        let new = NewAttempt {
            id: Uuid::now_v7(),
            merchant_id: run.merchant_id,
            order_id: order.id,
            idempotency_key: run.key,
            fingerprint: Some(run.fingerprint),
            amount: order.amount,
            currency: &order.currency,
            provider: ctx
                .providers
                .for_payment_method(&self.payment_method)
                .name(),
            payment_method: &self.payment_method,
            now: Utc::now(),
            check_after: ctx.reconcile_after,
            return_url: self.return_url.as_deref(),
            capture_method: self.capture_method,
        };
        let attempt = match store::payments::insert(&mut tx, &new).await {
            Ok(a) => a,
            Err(InsertAttemptError::KeyUsed) => {
                return Err(CommandError::Reject(Problem::new(
                    ProblemCode::IdempotencyKeyReused,
                    "this Idempotency-Key already made a payment attempt for this order",
                )))
            }
            Err(InsertAttemptError::LiveAttemptExists) => {
                return Err(CommandError::Reject(payment_in_progress()))
            }
            Err(InsertAttemptError::Store(e)) => return Err(e.into()),
        };
        crate::events::payment_changed(&mut tx, &ctx.metrics, &attempt, Cause::Command).await?;
        // The order's reservation holds while the payment is in flight.
        crate::inventory::hold_for_payment(&mut tx, &ctx.metrics, &order, attempt.id).await?;
        // Counted before the driver commits: a commit that then fails
        // overcounts one pending, which the next transition corrects.
        ctx.metrics
            .payment_transition(PaymentStatus::Pending.as_str(), Cause::Command.label());
        Ok(Step::Record {
            tx,
            point: PaymentPoint::AttemptCreated,
            resource: attempt.id,
            memo: PaymentMemo::Created { attempt, order },
        })
    }
}

/// `409 payment_in_progress`: the order has a pending attempt, whose
/// outcome must be known before anything else is done with the order.
pub fn payment_in_progress() -> Problem {
    Problem::new(
        ProblemCode::PaymentInProgress,
        "the order has a pending payment; poll it with GET /payments/{id} and act once it settles",
    )
}

/// What the first phase of a charge came to.
enum Opening {
    /// Charge now (a one-phase provider, or the object is recorded).
    Charge,
    /// Record this object's id, then charge it.
    Record(String),
    /// The provider refused (a fact) or could not be heard (`None`).
    Settled(Option<ProviderObject>),
}

/// The request of the attempt's charge, under its first key (a send
/// after a read takes the attempt's generation of keys).
fn charge_request(attempt: &Payment) -> ChargeRequest {
    ChargeRequest {
        idempotency_key: attempt.id,
        key_generation: 0,
        amount: attempt.amount,
        currency: attempt.currency.clone(),
        payment_method: attempt.payment_method.clone(),
        trace: Trace::of_payment(attempt),
        // Stored with the attempt: a charge sent again after a crash (by
        // the reconciler) sends the customer back to the same place.
        return_url: attempt.return_url.clone(),
        capture_method: attempt.capture_method,
    }
}

/// The first phase of a charge, with the attempt's provider: nothing for
/// a provider that charges in one call, or for an attempt whose object is
/// recorded already.
async fn open(ctx: &AppContext, attempt: &Payment) -> Opening {
    if attempt.provider_charge_id.is_some() {
        return Opening::Charge;
    }
    let provider = ctx.providers.named(&attempt.provider);
    match provider.open_charge(&charge_request(attempt)).await {
        Opened::NotNeeded => Opening::Charge,
        Opened::Created(reference) => Opening::Record(reference),
        Opened::Settled(outcome) => Opening::Settled(known(outcome, attempt.id, "charge")),
    }
}

/// What a call proved, if anything: `None` (logged) when it proved nothing.
fn known(outcome: CallOutcome, id: Uuid, what: &str) -> Option<ProviderObject> {
    match outcome {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(payment_id = %id, %reason, "{what} outcome unknown; leaving it pending");
            None
        }
    }
}

/// Charges (or re-charges with the same key; confirms the recorded object)
/// with the attempt's provider under its keys of `key_generation`, and
/// returns what it said, or `None` when the outcome is unknown. A key the
/// provider spent is recorded ([`provider_keys`]).
pub async fn charge(
    ctx: &AppContext,
    attempt: &Payment,
    key_generation: i32,
) -> Option<ProviderObject> {
    let provider = ctx.providers.named(&attempt.provider);
    let request = ChargeRequest {
        key_generation,
        ..charge_request(attempt)
    };
    let sent = provider
        .charge(&request, attempt.provider_charge_id.as_deref())
        .await;
    if sent.key_spent {
        provider_keys::spent::<Payment>(ctx, attempt.id, key_generation).await;
    }
    known(sent.outcome, attempt.id, "charge")
}

/// Learns a pending attempt's outcome after a crash or for the reconciler:
/// asks the attempt's provider first, and charges (opening and recording
/// the provider's object first where it has one) only if the provider
/// holds nothing that can have moved money: under the same key, or under
/// the attempt's next key where its provider spent the last one on an
/// error it replays (Stripe's saved `500`: [`provider_keys`]). `None`:
/// nothing new was learned.
pub(crate) async fn look_up_or_charge(
    ctx: &AppContext,
    attempt: &Payment,
) -> Option<ProviderObject> {
    let provider = ctx.providers.named(&attempt.provider);
    // Before the read: a key recorded spent by then was answered before it.
    let keys = provider_keys::before_read::<Payment>(ctx, attempt.id).await?;
    let found = provider
        .find_charge(attempt.id, attempt.provider_charge_id.as_deref())
        .await;
    match found {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => match open(ctx, attempt).await {
            Opening::Charge => {
                let generation =
                    provider_keys::for_resend::<Payment>(ctx, attempt.id, keys).await?;
                charge(ctx, attempt, generation).await
            }
            Opening::Settled(observed) => observed,
            Opening::Record(reference) => {
                let recorded = record_reference(ctx, attempt.id, &reference).await;
                match recorded {
                    // A new object, never confirmed: no key of the attempt
                    // was spent on it, but one spent before moves on too.
                    Ok(Some(attempt)) => {
                        let generation =
                            provider_keys::for_resend::<Payment>(ctx, attempt.id, keys).await?;
                        charge(ctx, &attempt, generation).await
                    }
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(payment_id = %attempt.id, error = %e, "recording the provider's object failed; it is retried");
                        None
                    }
                }
            }
        },
        CallOutcome::Unknown(reason) => {
            tracing::warn!(payment_id = %attempt.id, %reason, "charge status unknown; leaving it pending");
            None
        }
    }
}

/// Records the provider's object on a pending attempt outside a command
/// (the reconciler's resume); `None` if the attempt moved meanwhile.
async fn record_reference(
    ctx: &AppContext,
    attempt_id: Uuid,
    reference: &str,
) -> Result<Option<Payment>, StoreError> {
    let mut tx = ctx.pool.begin().await?;
    let recorded = store::payments::set_reference(&mut tx, attempt_id, reference).await?;
    tx.commit().await?;
    Ok(recorded)
}
