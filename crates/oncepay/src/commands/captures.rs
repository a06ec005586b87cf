//! `POST /payments/{id}/capture` and `POST /payments/{id}/void`: the two
//! ends of a hold (a manual payment in `requires_capture`), each a money
//! command in recorded steps like a refund.
//!
//! A capture:
//! 1. with the order and the payment locked, checks the hold
//!    ([`capture_plan`]) and that its provider can take the amount (its
//!    units, its minimum: `422 amount_not_supported_by_provider` before
//!    any row or call, the hold untouched), and inserts the capture's own
//!    row, whose id is the provider's idempotency key (one pending or
//!    succeeded per payment: a unique index), and records the step;
//! 2. sends the capture with that key, holding no connection (a resumed
//!    one reads the provider first and sends again, same key, only if the
//!    provider still holds the charge uncaptured);
//! 3. applies the provider's answer through `settle::payment`, like any
//!    charge: `succeeded` with its `amount_captured`, or `voided` when the
//!    provider refused because the hold had ended (the provider decides,
//!    never our clock alone). A provider that refuses the capture itself
//!    (a decline, an amount it will not take) and, read back, still holds
//!    the charge uncaptured ends the capture `failed` with its code: the
//!    payment stays `requires_capture`, to be captured again (a new
//!    capture, so a new key) or voided; `402 capture_refused`. An unknown
//!    answer is `202` with the payment still `requires_capture`; the
//!    reconciler settles the capture.
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
use crate::store::captures::{Capture, InsertCaptureError, NewCapture, HOLD_ENDED};
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
        let learned = match &outstanding {
            Some(o) => send_or_find(ctx, o).await,
            None => None,
        };
        let mut tx = ctx.pool.begin().await?;
        let (payment, capture) = finish(&mut tx, ctx, capture_id, learned, Cause::Command).await?;
        let response = capture_response(&payment, &capture)?;
        Ok(Step::Complete { tx, response })
    }
}

/// The answer to a capture: `402 capture_refused` when the provider
/// refused this capture (whatever became of the payment since: the answer
/// to a key is what its capture did), `200` with the payment once
/// captured, `202` while the provider's answer is not known (the payment
/// still `requires_capture`), `409 authorization_expired` when the
/// provider refused because the hold had ended.
fn capture_response(payment: &Payment, capture: &Capture) -> Result<StoredResponse, CommandError> {
    let refused = capture.status == PaymentStatus::Failed
        && capture.failure_code.as_deref() != Some(HOLD_ENDED);
    if refused {
        return Ok(problem_response(&capture_refused(payment, capture)));
    }
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

/// `402 capture_refused`: the provider refused the capture (its code in
/// `failure_code`); nothing was captured.
fn capture_refused(payment: &Payment, capture: &Capture) -> Problem {
    let code = capture.failure_code.as_deref().unwrap_or_default();
    Problem::new(
        ProblemCode::CaptureRefused,
        format!(
            "the provider refused to capture {} of the payment ({code}); nothing was captured. While the payment is requires_capture it can be captured again (another Idempotency-Key) or voided; it is {}",
            capture.amount,
            payment.status.as_str()
        ),
    )
    .with_member("failure_code", serde_json::json!(code))
    .with_member("payment_status", serde_json::json!(payment.status.as_str()))
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
        let captures = store::captures::of_payment(&mut tx, payment.id, Some(run.key)).await?;
        // A retry after the idempotency record expired: the key already
        // made one of this payment's captures, so that capture is the
        // answer (a refused one too: it is never sent again).
        if let Some(own) = captures.iter().find(|c| c.idempotency_key == run.key) {
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
        // A capture the provider refused leaves the hold to capture again.
        let started = captures.iter().any(|c| c.status != PaymentStatus::Failed);
        let amount =
            capture_plan(&payment, started, self.amount, Utc::now()).map_err(|refusal| {
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
            })?;
        // An amount its provider cannot take (its units, its minimum) is
        // refused here: sent, it could only be refused, and the hold must
        // not pay for our request.
        super::provider_amounts::provider_takes(
            ctx.providers.named(&payment.provider).as_ref(),
            amount,
            &payment.currency,
            super::provider_amounts::Movement::Capture,
        )
        .map_err(CommandError::Reject)?;
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
                        "the payment is requires_capture with a capture already under way or made for it; a payment is captured once",
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

/// What step 2 learned of a capture.
#[derive(Debug, Clone)]
pub(crate) enum Learned {
    /// The charge as its provider holds it now: captured, released, or
    /// still held (a repeat that proves nothing yet).
    Charge(ProviderObject),
    /// The provider refused this capture (its code in `failure_code`) and,
    /// read back, still holds the charge uncaptured: the capture fails,
    /// the hold stands.
    Refused(ProviderObject),
}

/// Step 2, holding no connection: sends the capture, or, if it may have
/// been sent, reads the provider first and sends it again (same key) only
/// while the charge is still held uncaptured. A refusal of the capture
/// itself is read back once: a hold that ended meanwhile (or a refusal
/// answered for a capture that was made, by a gateway on the way) is the
/// charge as the provider holds it. `None`: nothing learned.
pub(crate) async fn send_or_find(ctx: &AppContext, outstanding: &Outstanding) -> Option<Learned> {
    let provider = ctx.providers.named(&outstanding.provider);
    let request = &outstanding.request;
    if outstanding.maybe_sent {
        match provider.find_capture(request).await {
            CallOutcome::NotFound => {}
            other => return learned(request, other),
        }
    }
    match provider.capture(request).await {
        CallOutcome::Known(refusal) if refusal.status == PaymentStatus::Failed => {
            match provider.find_capture(request).await {
                CallOutcome::Known(charge) => Some(Learned::Charge(charge)),
                CallOutcome::NotFound => Some(Learned::Refused(refusal)),
                // The refusal is the provider's word on this key (it
                // captured nothing under it, and answers a repeat the
                // same): it stands; a hold that ended is the sweeper's or
                // its webhook's to settle.
                CallOutcome::Unknown(reason) => {
                    tracing::warn!(capture_id = %request.idempotency_key, %reason, "a refused capture's charge could not be read back; the refusal stands");
                    Some(Learned::Refused(refusal))
                }
            }
        }
        other => learned(request, other),
    }
}

/// What a capture's or a read's `outcome` teaches: the charge, or nothing.
fn learned(request: &CaptureRequest, outcome: CallOutcome) -> Option<Learned> {
    match outcome {
        CallOutcome::Known(object) => Some(Learned::Charge(object)),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(capture_id = %request.idempotency_key, %reason, "capture outcome unknown; leaving it pending");
            None
        }
    }
}

/// Step 3: applies what step 2 learned to the payment (and its capture and
/// order) inside `tx`; returns the payment and the capture as they now
/// are.
pub(crate) async fn finish(
    tx: &mut sqlx::PgConnection,
    ctx: &AppContext,
    capture_id: Uuid,
    learned: Option<Learned>,
    cause: Cause,
) -> Result<(Payment, Capture), StoreError> {
    // Not locked here: settling locks order, payment, then the capture.
    let capture = store::captures::by_id(tx, capture_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("capture", capture_id))?;
    let payment = store::payments::by_id(tx, capture.payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", capture.payment_id))?;
    let ids = (payment.id, payment.order_id);
    match learned {
        Some(Learned::Charge(object)) => {
            let (payment, _) = settle::payment(tx, &ctx.metrics, ids, &object, cause).await?;
            let capture = store::captures::by_id(tx, capture_id)
                .await?
                .ok_or_else(|| Corrupt::vanished("capture", capture_id))?;
            Ok((payment, capture))
        }
        Some(Learned::Refused(refusal)) => refused(tx, ids, capture_id, &refusal).await,
        None => Ok((payment, capture)),
    }
}

/// The provider refused capture `capture_id` of the payment `ids` and
/// still holds its charge uncaptured: the capture ends `failed` with the
/// provider's code, under the order's and the payment's locks (the one
/// lock order), and the hold stands, to be captured again (a new capture,
/// so a new key at the provider) or voided. A capture settled meanwhile
/// (its hold ended) stays as it is.
async fn refused(
    tx: &mut sqlx::PgConnection,
    (payment_id, order_id): (Uuid, Uuid),
    capture_id: Uuid,
    refusal: &ProviderObject,
) -> Result<(Payment, Capture), StoreError> {
    store::orders::lock_by_id(tx, order_id).await?;
    let payment = store::payments::lock(tx, payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", payment_id))?;
    let code = refusal.failure_code.as_deref().unwrap_or("capture_refused");
    let capture = match store::captures::fail(tx, capture_id, code).await? {
        Some(capture) => {
            tracing::warn!(%capture_id, %payment_id, code, "the provider refused the capture; the hold stands");
            // A refusal in the capture's own answer may be an answer
            // replaced on its way, or a request the provider gets after
            // the read that confirmed it: one more read, later, tells
            // (`confirm_refusal`), as for a charge's decline.
            store::queue::confirm_decline_later::<Capture>(tx, capture_id).await?;
            capture
        }
        None => store::captures::by_id(tx, capture_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("capture", capture_id))?,
    };
    Ok((payment, capture))
}

/// The reconciler's confirming read of a capture the provider refused
/// (queued by [`refused`], after the delay a pending capture would have
/// waited): the charge read at its provider; captured after all (the
/// refusal was an answer replaced on its way, or the request arrived
/// late), or its hold ended, it is settled as any charge
/// (`settle::payment`, which makes the refused capture the one made);
/// still held uncaptured, the refusal stands. True if the provider's
/// record was read.
pub(crate) async fn confirm_refusal(
    ctx: &AppContext,
    capture_id: Uuid,
) -> Result<bool, StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let capture = store::captures::by_id(&mut conn, capture_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("capture", capture_id))?;
    let payment = store::payments::by_id(&mut conn, capture.payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", capture.payment_id))?;
    drop(conn);
    let request = outstanding(&payment, &capture, true)?.request;
    let read = ctx
        .providers
        .named(&payment.provider)
        .find_capture(&request)
        .await;
    let mut tx = ctx.pool.begin().await?;
    let confirmed = match read {
        CallOutcome::Known(charge) => {
            let ids = (payment.id, payment.order_id);
            settle::payment(&mut tx, &ctx.metrics, ids, &charge, Cause::Reconciler).await?;
            true
        }
        CallOutcome::NotFound => true,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(%capture_id, %reason, "a refused capture's confirming read proved nothing; it is retried");
            false
        }
    };
    if confirmed {
        store::queue::decline_confirmed::<Capture>(&mut tx, capture_id).await?;
    }
    tx.commit().await?;
    Ok(confirmed)
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
            // A capture the provider refused is over: the hold can go.
            let capturing = store::captures::of_payment(&mut tx, payment.id, None)
                .await?
                .iter()
                .any(|c| c.status != PaymentStatus::Failed);
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
