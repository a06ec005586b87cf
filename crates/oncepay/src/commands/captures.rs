//! `POST /payments/{id}/capture` and `POST /payments/{id}/void`: the two
//! ends of a hold (a manual payment in `requires_capture`), each a money
//! command in recorded steps like a refund.
//!
//! A capture:
//! 1. with the order and the payment locked, checks the hold
//!    ([`capture_plan`]) and inserts the capture's own row, whose id is the
//!    provider's idempotency key (one per payment: a unique index), and
//!    records the step;
//! 2. sends the capture with that key, holding no connection (a resumed
//!    one reads the provider first and sends again, same key, only if the
//!    provider still holds the charge uncaptured);
//! 3. applies the provider's answer through `settle::payment`, like any
//!    charge: `succeeded` with its `amount_captured`, or `voided` when the
//!    provider refused because the hold had ended (the provider decides,
//!    never our clock alone). An unknown answer is `202` with the payment
//!    still `requires_capture`; the reconciler settles the capture.
//!
//! A void marks the hold (`void_reason`, so no capture can start), asks its
//! provider to release it, and applies the answer the same way; one that is
//! not answered is retried by the sweeper (a void is idempotent).

use chrono::Utc;
use uuid::Uuid;

use super::settle::{self, Cause};
use super::{
    json_response, recovery_points, AppContext, At, Command, CommandError, CommandInput, Run, Step,
};
use crate::domain::money::Amount;
use crate::domain::payment::VoidReason;
use crate::domain::payment::{
    capture_plan, void_plan, CaptureMethod, CaptureRefusal, Payment, PaymentStatus,
};
use crate::domain::RuleViolation;
use crate::idempotency::StoredResponse;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::provider::{CallOutcome, CaptureRequest, ProviderObject};
use crate::store::captures::{Capture, InsertCaptureError, NewCapture};
use crate::store::{self, Corrupt, StoreError};

recovery_points! {
    /// Where a capture can be resumed.
    CapturePoint {
        /// The pending capture row exists (step 1): resuming reads the
        /// provider, then sends the capture again with the row's id as key
        /// only if the charge is still held uncaptured.
        CaptureCreated = "capture_created",
    }
}

recovery_points! {
    /// Where a void can be resumed.
    VoidPoint {
        /// The void was asked for on the hold (step 1): resuming asks the
        /// provider to release it again (idempotent).
        VoidRequested = "void_requested",
    }
}

/// Reads `capture_method` (`automatic` when absent).
pub(crate) fn capture_method_field(obj: &Obj<'_>) -> Result<CaptureMethod, Problem> {
    match obj.opt_string("capture_method")? {
        None => Ok(CaptureMethod::Automatic),
        Some(text) => CaptureMethod::parse(&text)
            .ok_or_else(|| Problem::invalid_field("capture_method", "must be automatic or manual")),
    }
}

/// What step 2 of a capture sends.
#[derive(Debug, Clone)]
pub struct Outstanding {
    /// The provider the payment was made with.
    pub provider: String,
    /// The request, with the capture's id as key.
    pub request: CaptureRequest,
    /// The order the payment pays (settling locks it first).
    pub order_id: Uuid,
    /// True when the capture may have reached the provider already (a
    /// resumed command, the reconciler): step 2 reads before it sends.
    pub maybe_sent: bool,
}

/// Capture all or part of a hold.
pub struct CapturePayment {
    payment_id: Uuid,
    amount: Option<i64>,
}

impl Command for CapturePayment {
    const KIND: super::CommandKind = super::CommandKind::CapturePayment;
    type Point = CapturePoint;
    /// What step 2 must send (`None`: the capture is already settled).
    type Memo = Option<Outstanding>;

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let payment_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::PaymentNotFound, "payment"))?;
        let body = Obj::root(&input.body)?;
        body.only(&["amount"])?;
        let amount = body
            .opt_integer("amount")?
            .map(|a| {
                Amount::try_from(a)
                    .map(Amount::minor_units)
                    .map_err(|e| Problem::rule(RuleViolation::new("amount", e.to_string())))
            })
            .transpose()?;
        Ok(CapturePayment { payment_id, amount })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<CapturePoint, Self::Memo>,
    ) -> Result<Step<CapturePoint, Self::Memo>, CommandError> {
        let (capture_id, outstanding) = match at {
            At::Start => return self.create_capture(ctx, run).await,
            At::After {
                point: CapturePoint::CaptureCreated,
                resource,
                memo,
            } => match memo {
                Some(outstanding) => (resource, outstanding),
                None => (resource, pending_capture(ctx, resource).await?),
            },
        };
        let observed = match &outstanding {
            Some(o) => send_or_find(ctx, o).await,
            None => None,
        };
        let mut tx = ctx.pool.begin().await?;
        let payment = finish(&mut tx, ctx, capture_id, observed, Cause::Command).await?;
        let response = capture_response(&payment)?;
        Ok(Step::Complete { tx, response })
    }
}

/// The answer to a capture: `200` with the payment once captured, `202`
/// while the provider's answer is not known (the payment still
/// `requires_capture`), `409 authorization_expired` when the provider
/// refused because the hold had ended.
fn capture_response(payment: &Payment) -> Result<StoredResponse, CommandError> {
    match payment.status {
        PaymentStatus::Succeeded => json_response(200, payment, None),
        PaymentStatus::RequiresCapture | PaymentStatus::Pending => json_response(202, payment, None),
        PaymentStatus::Voided => Ok(problem_response(&Problem::new(
            ProblemCode::AuthorizationExpired,
            "the provider refused the capture: the payment's authorization ended first (expired or released), and the payment is voided",
        ))),
        PaymentStatus::Failed => Ok(problem_response(&not_capturable(payment))),
    }
}

fn problem_response(problem: &Problem) -> StoredResponse {
    StoredResponse {
        status: problem.status,
        body: problem.body(),
        location: None,
    }
}

fn not_capturable(payment: &Payment) -> Problem {
    Problem::new(
        ProblemCode::PaymentNotCapturable,
        format!(
            "the payment is {}; only a payment in requires_capture can be captured",
            payment.status.as_str()
        ),
    )
    .with_member("payment_status", serde_json::json!(payment.status.as_str()))
}

impl CapturePayment {
    /// Step 1: checks the hold and inserts the capture.
    async fn create_capture(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<CapturePoint, Option<Outstanding>>, CommandError> {
        let (mut tx, payment) = lock_payment(ctx, run, self.payment_id).await?;
        let existing = store::captures::of_payment(&mut tx, payment.id).await?;
        // A retry after the idempotency record expired: the key already
        // made this payment's capture, so that capture is the answer.
        if let Some(own) = existing.as_ref().filter(|c| c.idempotency_key == run.key) {
            let outstanding = (own.status == PaymentStatus::Pending)
                .then(|| outstanding(&payment, own, true))
                .transpose()?;
            return Ok(Step::Record {
                tx,
                point: CapturePoint::CaptureCreated,
                resource: own.id,
                memo: outstanding,
            });
        }
        let amount = capture_plan(&payment, existing.is_some(), self.amount, Utc::now()).map_err(
            |refusal| {
                CommandError::Reject(match refusal {
                    CaptureRefusal::NotCapturable(why) => Problem::new(
                        ProblemCode::PaymentNotCapturable,
                        why,
                    )
                    .with_member("payment_status", serde_json::json!(payment.status.as_str())),
                    CaptureRefusal::ExceedsCapturable {
                        requested,
                        capturable,
                    } => Problem::beyond(
                        ProblemCode::AmountExceedsCapturable,
                        "amount",
                        requested,
                        capturable,
                        "capturable",
                    )
                    .with_member("amount_capturable", serde_json::json!(capturable)),
                    CaptureRefusal::Expired(_) => {
                        Problem::new(ProblemCode::AuthorizationExpired, refusal.to_string())
                    }
                })
            },
        )?;
        let new = NewCapture {
            id: Uuid::now_v7(),
            merchant_id: run.merchant_id,
            payment_id: payment.id,
            amount,
            idempotency_key: run.key,
            fingerprint: Some(run.fingerprint),
            check_after: ctx.reconcile_after,
        };
        let capture = match store::captures::insert(&mut tx, &new).await {
            Ok(c) => c,
            Err(InsertCaptureError::NotCapturable) => {
                return Err(CommandError::Reject(
                    Problem::new(
                        ProblemCode::PaymentNotCapturable,
                        "the payment is requires_capture with a capture already made for it; a payment is captured once",
                    )
                    .with_member("payment_status", serde_json::json!(payment.status.as_str())),
                ))
            }
            Err(InsertCaptureError::Store(e)) => return Err(e.into()),
        };
        let outstanding = outstanding(&payment, &capture, false)?;
        Ok(Step::Record {
            tx,
            point: CapturePoint::CaptureCreated,
            resource: capture.id,
            memo: Some(outstanding),
        })
    }
}

/// The merchant's payment, with its order and itself row-locked (in that
/// order), in a new transaction; `404` if it is not the merchant's.
async fn lock_payment(
    ctx: &AppContext,
    run: Run<'_>,
    payment_id: Uuid,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, Payment), CommandError> {
    let not_found =
        || CommandError::Reject(Problem::not_found(ProblemCode::PaymentNotFound, "payment"));
    let mut tx = ctx.pool.begin().await?;
    let payment = store::payments::get(&mut tx, run.merchant_id, payment_id)
        .await?
        .ok_or_else(not_found)?;
    store::orders::lock_by_id(&mut tx, payment.order_id).await?;
    let payment = store::payments::lock(&mut tx, payment.id)
        .await?
        .ok_or_else(not_found)?;
    Ok((tx, payment))
}

/// What step 2 sends for `capture` of `payment`.
fn outstanding(
    payment: &Payment,
    capture: &Capture,
    maybe_sent: bool,
) -> Result<Outstanding, StoreError> {
    let charge_id = payment.provider_charge_id.clone().ok_or_else(|| {
        StoreError::from(Corrupt::Broken(format!(
            "payment {} was authorized without a charge id",
            payment.id
        )))
    })?;
    Ok(Outstanding {
        provider: payment.provider.clone(),
        request: CaptureRequest {
            idempotency_key: capture.id,
            payment_id: payment.id,
            charge_id,
            amount: capture.amount,
            currency: payment.currency.clone(),
        },
        order_id: payment.order_id,
        maybe_sent,
    })
}

/// The request of a capture made earlier (a resumed command, the
/// reconciler), or `None` if it is already settled.
pub(crate) async fn pending_capture(
    ctx: &AppContext,
    capture_id: Uuid,
) -> Result<Option<Outstanding>, StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let capture = store::captures::by_id(&mut conn, capture_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("capture", capture_id))?;
    let payment = store::payments::by_id(&mut conn, capture.payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", capture.payment_id))?;
    drop(conn);
    if capture.status != PaymentStatus::Pending {
        return Ok(None);
    }
    Ok(Some(outstanding(&payment, &capture, true)?))
}

/// Step 2, holding no connection: sends the capture, or, if it may have
/// been sent, reads the provider first and sends it again (same key) only
/// while the charge is still held uncaptured. `None`: nothing learned.
pub(crate) async fn send_or_find(
    ctx: &AppContext,
    outstanding: &Outstanding,
) -> Option<ProviderObject> {
    let provider = ctx.providers.named(&outstanding.provider);
    let request = &outstanding.request;
    let outcome = if outstanding.maybe_sent {
        match provider.find_capture(request).await {
            CallOutcome::NotFound => provider.capture(request).await,
            other => other,
        }
    } else {
        provider.capture(request).await
    };
    match outcome {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(capture_id = %request.idempotency_key, %reason, "capture outcome unknown; leaving it pending");
            None
        }
    }
}

/// Step 3: applies what step 2 learned to the payment (and its capture and
/// order) inside `tx`; returns the payment as it now is.
pub(crate) async fn finish(
    tx: &mut sqlx::PgConnection,
    ctx: &AppContext,
    capture_id: Uuid,
    observed: Option<ProviderObject>,
    cause: Cause,
) -> Result<Payment, StoreError> {
    // Not locked here: settling locks order, payment, then the capture.
    let capture = store::captures::by_id(tx, capture_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("capture", capture_id))?;
    let payment = store::payments::by_id(tx, capture.payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", capture.payment_id))?;
    match observed {
        Some(object) => Ok(settle::payment(
            tx,
            &ctx.metrics,
            (payment.id, payment.order_id),
            &object,
            cause,
        )
        .await?
        .0),
        None => Ok(payment),
    }
}

/// Release a hold.
pub struct VoidPayment {
    payment_id: Uuid,
}

impl Command for VoidPayment {
    const KIND: super::CommandKind = super::CommandKind::VoidPayment;
    type Point = VoidPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let payment_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::PaymentNotFound, "payment"))?;
        Obj::root(&input.body)?.only(&[])?;
        Ok(VoidPayment { payment_id })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<VoidPoint, ()>,
    ) -> Result<Step<VoidPoint, ()>, CommandError> {
        if let At::Start = at {
            let (mut tx, payment) = lock_payment(ctx, run, self.payment_id).await?;
            let capture = store::captures::of_payment(&mut tx, payment.id).await?;
            let capturing = capture.is_some_and(|c| c.status != PaymentStatus::Failed);
            void_plan(&payment, capturing).map_err(|why| {
                CommandError::Reject(
                    Problem::new(ProblemCode::PaymentNotVoidable, why)
                        .with_member("payment_status", serde_json::json!(payment.status.as_str())),
                )
            })?;
            let requested = store::payments::request_void(
                &mut tx,
                payment.id,
                VoidReason::Requested,
                ctx.reconcile_after,
            )
            .await?;
            if requested.is_none() {
                return Err(CommandError::Reject(Problem::new(
                    ProblemCode::PaymentNotVoidable,
                    "a void of the payment is already in progress",
                )));
            }
            return Ok(Step::Record {
                tx,
                point: VoidPoint::VoidRequested,
                resource: payment.id,
                memo: (),
            });
        }
        let (tx, payment) = void_and_settle(ctx, self.payment_id, Cause::Command).await?;
        let response = match payment.status {
            PaymentStatus::Voided => json_response(200, &payment, None)?,
            PaymentStatus::RequiresCapture => json_response(202, &payment, None)?,
            _ => problem_response(
                &Problem::new(
                    ProblemCode::PaymentNotVoidable,
                    format!(
                        "the provider answered that the payment is {}; it was not voided",
                        payment.status.as_str()
                    ),
                )
                .with_member("payment_status", serde_json::json!(payment.status.as_str())),
            ),
        };
        Ok(Step::Complete { tx, response })
    }
}

/// Asks the provider to release the hold of `payment_id` (if it is still
/// one) and applies its answer in the transaction returned, which holds
/// the payment as it then is: the last step of a void, of a cancel of an
/// authorized order, and the sweeper's expiry.
pub(crate) async fn void_and_settle(
    ctx: &AppContext,
    payment_id: Uuid,
    cause: Cause,
) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, Payment), StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let payment = store::payments::by_id(&mut conn, payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", payment_id))?;
    drop(conn);
    let observed = match (&payment.status, payment.provider_charge_id.as_deref()) {
        (PaymentStatus::RequiresCapture, Some(charge)) => {
            let provider = ctx.providers.named(&payment.provider);
            match provider.void(payment.id, charge).await {
                CallOutcome::Known(object) => Some(object),
                CallOutcome::NotFound => None,
                CallOutcome::Unknown(reason) => {
                    tracing::warn!(%payment_id, %reason, "void outcome unknown; the sweeper asks again");
                    None
                }
            }
        }
        _ => None,
    };
    let mut tx = ctx.pool.begin().await?;
    let payment = match observed {
        Some(object) => {
            settle::payment(
                &mut tx,
                &ctx.metrics,
                (payment.id, payment.order_id),
                &object,
                cause,
            )
            .await?
            .0
        }
        None => {
            store::orders::lock_by_id(&mut tx, payment.order_id).await?;
            store::payments::lock(&mut tx, payment_id)
                .await?
                .ok_or_else(|| Corrupt::vanished("payment", payment_id))?
        }
    };
    Ok((tx, payment))
}
