//! `POST /payments`: a command in three recorded steps.
//!
//! 1. Create the attempt `pending` and record the step, in one transaction.
//! 2. Call the provider with the attempt id as its idempotency key.
//! 3. Record the outcome and store the response, in one transaction.
//!
//! A crash after 1 resumes at 2 with the same attempt id, so the provider
//! sees the same key and charges once. An unknown outcome is stored as a
//! `202 pending` answer and settled later by webhook or reconciler.
//!
//! The common case costs three round trips to the database: a read of the
//! order, then step 1 with the claim of the key as one statement
//! ([`Command::first_step_claiming`]), then step 3 as one statement
//! (`settle::Known`). Each checks under its row locks that what it was
//! computed from has not moved, and writes nothing if it has; the command
//! then takes the locking path, which decides every other case.

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::settle::{self, Cause};
use super::{
    json_response, recovery_points, AppContext, At, ClaimingStep, Command, CommandError,
    CommandInput, FirstStepClaiming, Run, Step,
};
use crate::domain::order::Order;
use crate::domain::payment::{Payment, PaymentStatus};
use crate::idempotency::{ClaimingWrite, StoredResponse};
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::provider::{CallOutcome, ChargeRequest, ProviderObject};
use crate::store::payments::{ClaimingAttempt, InsertAttemptError, NewAttempt};
use crate::store::{self, StoreError};

recovery_points! {
    /// Where a payment can be resumed.
    PaymentPoint {
        /// The pending attempt exists (step 1): resuming sends (or looks up)
        /// the charge with the attempt id as the provider key.
        AttemptCreated = "attempt_created",
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
}

/// Reads a UUID field: a string that is not a UUID is a shape error.
pub fn uuid_field(obj: &Obj<'_>, name: &str) -> Result<Uuid, Problem> {
    let text = obj.string(name)?;
    Uuid::parse_str(&text).map_err(|_| Problem::invalid_field(name, "must be a UUID"))
}

impl Command for CreatePayment {
    const NAME: &'static str = "create_payment";
    type Point = PaymentPoint;
    type Memo = PaymentMemo;

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&["order_id", "payment_method"])?;
        let order_id = uuid_field(&body, "order_id")?;
        let payment_method = body.string("payment_method")?;
        let valid = payment_method.starts_with("tok_")
            && payment_method.len() <= 255
            && payment_method.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if !valid {
            return Err(Problem::rule(crate::domain::RuleViolation::new(
                "payment_method",
                "must be a provider token: tok_ followed by up to 251 visible ASCII characters",
            )));
        }
        Ok(CreatePayment {
            order_id,
            payment_method,
        })
    }

    async fn first_step_claiming(
        &self,
        ctx: &AppContext,
        _merchant_id: Uuid,
    ) -> FirstStepClaiming<PaymentPoint, PaymentMemo> {
        let attempt_id = Uuid::now_v7();
        // The database keeps microseconds: the memo and a later read must
        // show the same timestamps.
        let now = Utc::now().trunc_subsecs(6);
        let provider = ctx.provider.name();
        // The event's object is the attempt as stored, but for the order's
        // amount and currency, which the statement takes from the order's
        // locked row (the order is not read before).
        let draft = Payment::pending(
            attempt_id,
            (self.order_id, 0, ""),
            provider,
            &self.payment_method,
            now,
        );
        let event =
            crate::outbox::of_payment(&draft, Cause::Command)?.without(&["amount", "currency"]);
        let (pool, metrics) = (ctx.pool.clone(), ctx.metrics.clone());
        let (order_id, check_after) = (self.order_id, ctx.reconcile_after);
        let payment_method = self.payment_method.clone();
        let provider = provider.to_string();
        let write: ClaimingWrite<PaymentMemo> =
            Box::new(move |record, lease_token, recovery_point| {
                Box::pin(async move {
                    let events = [event.as_new()];
                    let claiming = ClaimingAttempt {
                        record,
                        lease_token,
                        recovery_point,
                        order_id,
                        attempt_id,
                        provider: &provider,
                        payment_method: &payment_method,
                        now,
                        check_after,
                        events: &events,
                    };
                    let Some(order) = store::payments::insert_claiming(&pool, &claiming).await?
                    else {
                        return Ok(None);
                    };
                    count_pending(&metrics);
                    crate::outbox::count(&metrics, std::slice::from_ref(&event));
                    let attempt = Payment::pending(
                        attempt_id,
                        (order.id, order.amount, &order.currency),
                        &provider,
                        &payment_method,
                        now,
                    );
                    Ok(Some(PaymentMemo::Created { attempt, order }))
                })
            });
        Ok(Some(ClaimingStep {
            point: PaymentPoint::AttemptCreated,
            resource: attempt_id,
            write,
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
            } => {
                let observed = charge(ctx, &attempt).await;
                (attempt, Some(order), observed)
            }
            At::After {
                point: PaymentPoint::AttemptCreated,
                memo: Some(PaymentMemo::Charged { attempt, observed }),
                ..
            } => (attempt, None, observed),
            // Resumed after a crash: the attempt as it is now (a webhook or
            // the reconciler may have settled it meanwhile).
            At::After {
                point: PaymentPoint::AttemptCreated,
                resource,
                memo: None,
            } => {
                let mut conn = ctx.pool.acquire().await?;
                let attempt = store::payments::get(&mut conn, run.merchant_id, resource)
                    .await?
                    .ok_or_else(|| StoreError::Corrupt(format!("attempt {resource} vanished")))?;
                drop(conn);
                // The charge may have reached the provider before the
                // crash: look first, so a provider whose keys expire
                // cannot charge twice.
                let observed = if attempt.status.is_final() {
                    None
                } else {
                    look_up_or_charge(ctx, &attempt).await
                };
                (attempt, None, observed)
            }
        };

        // Step 3, in one statement when nothing moved since step 1.
        if let (Some(order), Some(object)) = (&order, &observed) {
            if let Some(known) = settle::Known::plan(&attempt, order, object)? {
                let response = payment_response(known.attempt())?;
                return Ok(Step::CompleteInOne {
                    response,
                    write: known.into_write(ctx.metrics.clone()),
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
                .ok_or_else(|| StoreError::Corrupt(format!("attempt {attempt_id} vanished")))?,
        };
        let response = payment_response(&payment)?;
        Ok(Step::Complete { tx, response })
    }
}

/// The answer: `201` once the payment is final, `202` while pending.
fn payment_response(payment: &Payment) -> Result<StoredResponse, CommandError> {
    let status = if payment.status.is_final() { 201 } else { 202 };
    json_response(status, payment, Some(format!("/payments/{}", payment.id)))
}

/// Counts a new pending attempt. Counted before the driver commits: a
/// commit that then fails overcounts one pending, which the next
/// transition corrects.
fn count_pending(metrics: &crate::metrics::Metrics) {
    metrics
        .payment_transitions
        .with_label_values(&["pending", "command"])
        .inc();
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
        if store::payments::live_attempt_status(&mut tx, order.id).await?
            == Some(PaymentStatus::Pending)
        {
            return Err(CommandError::Reject(payment_in_progress()));
        }
        super::ensure_payable(&order, "can be paid")?;
        let new = NewAttempt {
            id: Uuid::now_v7(),
            merchant_id: run.merchant_id,
            order_id: order.id,
            idempotency_key: run.key,
            amount: order.amount,
            currency: &order.currency,
            provider: ctx.provider.name(),
            payment_method: &self.payment_method,
            now: Utc::now(),
            check_after: ctx.reconcile_after,
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
        crate::outbox::payment_changed(&mut tx, &ctx.metrics, &attempt, Cause::Command).await?;
        count_pending(&ctx.metrics);
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

/// Charges (or re-charges with the same key) and returns what the provider
/// said, or `None` when the outcome is unknown.
pub async fn charge(
    ctx: &AppContext,
    attempt: &Payment,
) -> Option<crate::provider::ProviderObject> {
    let request = ChargeRequest {
        idempotency_key: attempt.id,
        amount: attempt.amount,
        currency: attempt.currency.clone(),
        payment_method: attempt.payment_method.clone(),
        order_id: attempt.order_id,
    };
    match ctx.provider.charge(&request).await {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(payment_id = %attempt.id, %reason, "charge outcome unknown; leaving it pending");
            None
        }
    }
}

/// Learns a pending attempt's outcome after a crash or for the reconciler:
/// asks the provider first and charges again (same key) only if the
/// provider has no record of the charge. `None`: nothing new was learned.
pub async fn look_up_or_charge(
    ctx: &AppContext,
    attempt: &Payment,
) -> Option<crate::provider::ProviderObject> {
    match ctx.provider.find_charge(attempt.id).await {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => charge(ctx, attempt).await,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(payment_id = %attempt.id, %reason, "charge status unknown; leaving it pending");
            None
        }
    }
}
