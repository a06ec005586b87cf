//! `POST /payments`: a command in three recorded steps.
//!
//! 1. Create the attempt `pending` and record the step, in one transaction.
//! 2. Call the provider with the attempt id as its idempotency key.
//! 3. Record the outcome and store the response, in one transaction.
//!
//! A crash after 1 resumes at 2 with the same attempt id, so the provider
//! sees the same key and charges once. An unknown outcome is stored as a
//! `202 pending` answer and settled later by webhook or reconciler.

use chrono::Utc;
use uuid::Uuid;

use super::settle::{self, Cause};
use super::{
    json_response, recovery_points, AppContext, At, Command, CommandError, CommandInput, Run, Step,
};
use crate::domain::payment::{Payment, PaymentStatus};
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::provider::{CallOutcome, ChargeRequest};
use crate::store::payments::{InsertAttemptError, NewAttempt};
use crate::store::{self, StoreError};

recovery_points! {
    /// Where a payment can be resumed.
    PaymentPoint {
        /// The pending attempt exists (step 1): resuming sends (or looks up)
        /// the charge with the attempt id as the provider key.
        AttemptCreated = "attempt_created",
    }
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
    /// The attempt step 1 inserted.
    type Memo = Payment;

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

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<PaymentPoint, Payment>,
    ) -> Result<Step<PaymentPoint, Payment>, CommandError> {
        let (attempt, resumed) = match at {
            At::Start => return self.create_attempt(ctx, run).await,
            At::After {
                point: PaymentPoint::AttemptCreated,
                memo: Some(attempt),
                ..
            } => (attempt, false),
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
                (attempt, true)
            }
        };
        let attempt_id = attempt.id;

        // Step 2, outside any transaction: no connection is held while the
        // provider answers. Skipped if a webhook or the reconciler already
        // settled the attempt.
        let observed = if attempt.status.is_final() {
            None
        } else if resumed {
            // The charge may have reached the provider before the crash:
            // look first, so a provider whose keys expire cannot charge twice.
            look_up_or_charge(ctx, &attempt).await
        } else {
            charge(ctx, &attempt).await
        };

        // Step 3.
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
        let status = if payment.status.is_final() { 201 } else { 202 };
        let response = json_response(status, &payment, Some(format!("/payments/{}", payment.id)))?;
        Ok(Step::Complete { tx, response })
    }
}

impl CreatePayment {
    /// Step 1: checks the order and inserts the pending attempt.
    async fn create_attempt(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<PaymentPoint, Payment>, CommandError> {
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
        // Counted before the driver commits: a commit that then fails
        // overcounts one pending, which the next transition corrects.
        ctx.metrics
            .payment_transitions
            .with_label_values(&["pending", "command"])
            .inc();
        Ok(Step::Record {
            tx,
            point: PaymentPoint::AttemptCreated,
            resource: attempt.id,
            memo: attempt,
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
