//! `POST /payments/{id}/refunds`, in the same three recorded steps as a
//! payment. Refunds of one payment are serialised by locking its order and
//! payment rows in step 1, so their sum can never exceed the amount.

use chrono::Utc;
use uuid::Uuid;

use super::provider_keys;
use super::settle::{self, Cause};
use super::{
    json_response, recovery_points, AppContext, At, Command, CommandError, CommandInput, Run, Step,
};
use crate::domain::money::Amount;
use crate::domain::payment::{Payment, PaymentStatus, Refund};
use crate::domain::refund;
use crate::domain::RuleViolation;
use crate::idempotency::StoredResponse;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::provider::trace::Trace;
use crate::provider::{CallOutcome, ProviderObject, RefundRequest};
use crate::store::refunds::{InsertRefundError, NewRefund};
use crate::store::{self, Corrupt, StoreError};

recovery_points! {
    /// Where a refund can be resumed.
    RefundPoint {
        /// The pending refund exists (step 1): resuming sends (or looks up)
        /// it with the refund id as the provider key.
        RefundCreated = "refund_created",
    }
}

/// Longest refund reason, in characters.
pub(crate) const REASON_MAX: usize = 500;

/// Refund all or part of a succeeded payment.
pub struct CreateRefund {
    payment_id: Uuid,
    amount: Option<Amount>,
    reason: Option<String>,
    destination: Destination,
}

/// Where a refund's money goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Back to the payment's method, through its provider.
    Original,
    /// To the order's customer's balance (store credit), through the
    /// `balance` provider whatever provider took the payment.
    Balance,
}

impl Destination {
    /// As stored and sent.
    pub fn as_str(self) -> &'static str {
        match self {
            Destination::Original => "original",
            Destination::Balance => "balance",
        }
    }
}

/// The provider that makes `refund` of `payment`: the payment's, or the
/// balance's for a refund to the customer's balance.
pub(crate) fn refund_provider(payment: &Payment, destination: &str) -> String {
    match destination {
        "balance" => crate::provider::balance::NAME.to_string(),
        _ => payment.provider.clone(),
    }
}

impl Command for CreateRefund {
    const KIND: super::CommandKind = super::CommandKind::CreateRefund;
    type Point = RefundPoint;
    /// What step 2 must send (`None`: the refund is already final).
    type Memo = Option<Outstanding>;

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let payment_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::PaymentNotFound, "payment"))?;
        let body = Obj::root(&input.body)?;
        body.only(&["amount", "reason", "destination"])?;
        let amount = body
            .opt_integer("amount")?
            .map(|a| {
                Amount::try_from(a)
                    .map_err(|e| Problem::rule(RuleViolation::new("amount", e.to_string())))
            })
            .transpose()?;
        let reason = body.opt_string("reason")?;
        if let Some(r) = &reason {
            crate::domain::order::no_nul("reason", r).map_err(Problem::rule)?;
        }
        if reason
            .as_ref()
            .is_some_and(|r| r.chars().count() > REASON_MAX)
        {
            return Err(Problem::rule(RuleViolation::new(
                "reason",
                format!("must be at most {REASON_MAX} characters long"),
            )));
        }
        let destination = match body.opt_string("destination")?.as_deref() {
            None | Some("original") => Destination::Original,
            Some("balance") => Destination::Balance,
            Some(_) => {
                return Err(Problem::rule(RuleViolation::new(
                    "destination",
                    "must be original or balance",
                )))
            }
        };
        Ok(CreateRefund {
            payment_id,
            amount,
            reason,
            destination,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<RefundPoint, Self::Memo>,
    ) -> Result<Step<RefundPoint, Self::Memo>, CommandError> {
        let (refund_id, outstanding) = match at {
            At::Start => return self.create_refund(ctx, run).await,
            At::After {
                point: RefundPoint::RefundCreated,
                resource,
                memo,
            } => match memo {
                Some(outstanding) => (resource, outstanding),
                None => (resource, pending_request(ctx, resource).await?),
            },
        };
        let observed = step_2(ctx, outstanding.as_ref()).await;
        let mut tx = ctx.pool.begin().await?;
        let refund = finish(&mut tx, ctx, refund_id, observed).await?;
        let response = refund_response(&refund)?;
        Ok(Step::Complete { tx, response })
    }
}

/// The answer: `201` once the refund is final, `202` while pending.
pub(crate) fn refund_response(refund: &Refund) -> Result<StoredResponse, CommandError> {
    let status = if refund.status.is_final() { 201 } else { 202 };
    json_response(status, refund, Some(format!("/refunds/{}", refund.id)))
}

impl CreateRefund {
    /// Step 1: checks the payment and what is left of it, inserts the refund.
    async fn create_refund(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<RefundPoint, Option<Outstanding>>, CommandError> {
        let not_found =
            || CommandError::Reject(Problem::not_found(ProblemCode::PaymentNotFound, "payment"));
        let mut tx = ctx.pool.begin().await?;
        let payment = store::payments::get(&mut tx, run.merchant_id, self.payment_id)
            .await?
            .ok_or_else(not_found)?;
        store::orders::lock_by_id(&mut tx, payment.order_id).await?;
        let payment = store::payments::lock(&mut tx, payment.id)
            .await?
            .ok_or_else(not_found)?;
        if payment.status != PaymentStatus::Succeeded {
            return Err(CommandError::Reject(Problem::new(
                ProblemCode::PaymentNotRefundable,
                format!(
                    "the payment is {}; only a succeeded payment can be refunded",
                    payment.status.as_str()
                ),
            )));
        }
        let plan = Plan {
            amount: self.amount.map(Amount::minor_units),
            reason: self.reason.as_deref(),
            key: run.key.to_string(),
            cancels_order: false,
            destination: self.destination,
        };
        let (refund_id, outstanding) = start(&mut tx, ctx, run, &payment, &plan).await?;
        Ok(Step::Record {
            tx,
            point: RefundPoint::RefundCreated,
            resource: refund_id,
            memo: outstanding,
        })
    }
}

/// What a refund command (or a cancel) asks step 1 to refund.
pub struct Plan<'a> {
    /// Minor units; `None` refunds what is left.
    pub amount: Option<i64>,
    /// The merchant's reason.
    pub reason: Option<&'a str>,
    /// The refund's own key on the payment (the second line of defence).
    pub key: String,
    /// Whether settling it cancels the order.
    pub cancels_order: bool,
    /// Where its money goes.
    pub destination: Destination,
}

/// What step 2 of a refund must do.
#[derive(Debug)]
pub struct Outstanding {
    /// The provider the payment was made with, which refunds it.
    pub provider: String,
    /// The request, with the refund id as the provider key.
    pub request: RefundRequest,
    /// The provider's refund id, once known.
    pub reference: Option<String>,
    /// True when the request may have reached the provider already (a
    /// resumed command, a refund found by its key): step 2 then looks it up
    /// before sending it again.
    pub maybe_sent: bool,
}

/// Step 1 of any refund, inside the caller's transaction with the order and
/// the payment rows locked (so refunds of one payment are serialised):
/// finds the refund this key already made, or plans and inserts a new one.
/// Returns the refund id (the caller's step records it) and what step 2
/// must do (`None` if the refund is already final).
pub async fn start(
    tx: &mut sqlx::PgConnection,
    ctx: &AppContext,
    run: Run<'_>,
    payment: &Payment,
    plan: &Plan<'_>,
) -> Result<(Uuid, Option<Outstanding>), CommandError> {
    // A retry after the idempotency record expired: the key already made a
    // refund, so that refund is the answer, never a second one.
    if let Some(existing) = store::refunds::by_key(tx, payment.id, &plan.key).await? {
        if plan.amount.is_some_and(|a| a != existing.amount) {
            return Err(CommandError::Reject(key_made_another_refund()));
        }
        let outstanding = match existing.status {
            PaymentStatus::Pending => Some(Outstanding {
                provider: refund_provider(payment, &existing.destination),
                request: refund_request(&existing, payment)?,
                reference: existing.provider_refund_id.clone(),
                maybe_sent: true,
            }),
            _ => None,
        };
        return Ok((existing.id, outstanding));
    }
    // With the payment row locked: a dispute applied meanwhile waits for
    // this transaction (`store::disputes::apply` locks it too).
    let committed = store::refunds::committed_sum(tx, payment.id).await?;
    let disputed = store::disputes::held_sum(tx, payment.id).await?;
    // Capped by what was captured: a hold captured in part released the rest.
    let amount =
        refund::plan(payment.amount_captured, committed, disputed, plan.amount).map_err(|e| {
            CommandError::Reject(match e {
                refund::RefundRejection::Disputed {
                    requested,
                    left,
                    disputed,
                } => Problem::beyond(
                    ProblemCode::PaymentDisputed,
                    "amount",
                    requested,
                    left,
                    &format!(
                        "refundable: {disputed} of the payment is held by a dispute (open or lost)"
                    ),
                )
                .with_member("disputed", serde_json::json!(disputed)),
                refund::RefundRejection::Exceeds { requested, left } => Problem::beyond(
                    ProblemCode::RefundExceedsPayment,
                    "amount",
                    requested,
                    left,
                    "left to refund on this payment (pending refunds count)",
                ),
                refund::RefundRejection::NothingLeft => {
                    Problem::new(ProblemCode::RefundExceedsPayment, e.to_string())
                        .with_field("amount")
                        .with_member("allowed", serde_json::json!(0))
                }
            })
        })?;
    let provider = refund_provider(payment, plan.destination.as_str());
    super::provider_amounts::provider_takes(
        ctx.providers.named(&provider).as_ref(),
        amount,
        &payment.currency,
        super::provider_amounts::Movement::Refund,
    )
    .map_err(CommandError::Reject)?;
    let new = NewRefund {
        id: Uuid::now_v7(),
        merchant_id: run.merchant_id,
        payment_id: payment.id,
        amount,
        reason: plan.reason,
        idempotency_key: Some(&plan.key),
        fingerprint: Some(run.fingerprint),
        cancels_order: plan.cancels_order,
        destination: plan.destination.as_str(),
        incident: false,
        now: Utc::now(),
        check_after: ctx.reconcile_after,
    };
    let refund = match store::refunds::insert(tx, &new).await {
        Ok(r) => r,
        Err(InsertRefundError::KeyUsed) => {
            return Err(CommandError::Reject(key_made_another_refund()))
        }
        Err(InsertRefundError::Store(e)) => return Err(e.into()),
    };
    let request = refund_request(&refund, payment)?;
    Ok((
        refund.id,
        Some(Outstanding {
            provider,
            request,
            reference: None,
            maybe_sent: false,
        }),
    ))
}

fn key_made_another_refund() -> Problem {
    Problem::new(ProblemCode::IdempotencyKeyReused,
        "this Idempotency-Key already made a refund of this payment with another amount; use a new key for a new refund",
    )
}

/// What step 2 sends for a refund step 1 created: the refund id as the
/// provider key, against the payment's charge.
pub(crate) fn refund_request(
    refund: &Refund,
    payment: &Payment,
) -> Result<RefundRequest, StoreError> {
    let charge_id = payment.provider_charge_id.clone().ok_or_else(|| {
        StoreError::from(Corrupt::Broken(format!(
            "payment {} succeeded without a charge id",
            refund.payment_id
        )))
    })?;
    Ok(RefundRequest {
        idempotency_key: refund.id,
        // The first key; a send after a read takes the row's
        // (`look_up_or_send`).
        key_generation: 0,
        charge_id,
        amount: refund.amount,
        currency: payment.currency.clone(),
        trace: Trace::of_refund(payment, refund),
    })
}

/// The request of a refund created earlier (a resumed command), or `None`
/// if it is already settled.
pub(crate) async fn pending_request(
    ctx: &AppContext,
    refund_id: Uuid,
) -> Result<Option<Outstanding>, StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let refund = store::refunds::by_id(&mut conn, refund_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("refund", refund_id))?;
    drop(conn);
    if refund.status.is_final() {
        return Ok(None);
    }
    Ok(Some(sent(ctx, &refund).await?))
}

/// A refund that may have reached its provider, as step 2 (or a reading
/// of it) needs it: its payment's provider and charge, and its own id at
/// the provider if known.
pub async fn sent(ctx: &AppContext, refund: &Refund) -> Result<Outstanding, StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let payment = store::payments::by_id(&mut conn, refund.payment_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("payment", refund.payment_id))?;
    Ok(Outstanding {
        provider: refund_provider(&payment, &refund.destination),
        request: refund_request(refund, &payment)?,
        reference: refund.provider_refund_id.clone(),
        maybe_sent: true,
    })
}

/// Step 2 of any refund, holding no connection: sends a new refund, or
/// looks up one that may have been sent before and sends it again (same
/// key) only if the provider has no record of it. `None`: nothing new was
/// learned (already final, or the outcome is unknown).
pub(crate) async fn step_2(
    ctx: &AppContext,
    outstanding: Option<&Outstanding>,
) -> Option<ProviderObject> {
    let outstanding = outstanding?;
    if outstanding.maybe_sent {
        look_up_or_send(ctx, outstanding).await
    } else {
        send(ctx, outstanding).await
    }
}

/// Step 2 of any refund (also used by cancelling a paid order): sends it to
/// the payment's provider with the refund id as key, holding no
/// connection. `None`: nothing new was learned (the outcome is unknown).
pub async fn send(ctx: &AppContext, outstanding: &Outstanding) -> Option<ProviderObject> {
    send_request(ctx, &outstanding.provider, &outstanding.request).await
}

/// Sends `request` to `provider` under its keys of
/// `request.key_generation`; a key the provider spent is recorded
/// ([`provider_keys`]).
async fn send_request(
    ctx: &AppContext,
    provider: &str,
    request: &RefundRequest,
) -> Option<ProviderObject> {
    let sent = ctx.providers.named(provider).refund(request).await;
    if sent.key_spent {
        provider_keys::spent::<Refund>(ctx, request.idempotency_key, request.key_generation).await;
    }
    match sent.outcome {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(refund_id = %request.idempotency_key, %reason, "refund outcome unknown; leaving it pending");
            None
        }
    }
}

/// Learns a pending refund's outcome after a crash or for the reconciler:
/// asks the payment's provider first and sends the refund again only if
/// the provider has no record of it: under the same key, or under the
/// refund's next key where its provider spent the last one on an error it
/// replays (Stripe's saved `500`: [`provider_keys`]; the read, made after
/// that key's answer, found no refund carrying our id). `None`: nothing
/// new was learned.
pub(crate) async fn look_up_or_send(
    ctx: &AppContext,
    outstanding: &Outstanding,
) -> Option<ProviderObject> {
    let provider = ctx.providers.named(&outstanding.provider);
    let request = &outstanding.request;
    // Before the read: a key recorded spent by then was answered before it.
    let keys = provider_keys::before_read::<Refund>(ctx, request.idempotency_key).await?;
    match provider
        .find_refund(request, outstanding.reference.as_deref())
        .await
    {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => {
            let key_generation =
                provider_keys::for_resend::<Refund>(ctx, request.idempotency_key, keys).await?;
            let request = RefundRequest {
                key_generation,
                ..request.clone()
            };
            send_request(ctx, &outstanding.provider, &request).await
        }
        CallOutcome::Unknown(reason) => {
            tracing::warn!(refund_id = %request.idempotency_key, %reason, "refund status unknown; leaving it pending");
            None
        }
    }
}

/// Step 3 of any refund: applies what step 2 learned, inside `tx`.
pub async fn finish(
    tx: &mut sqlx::PgConnection,
    ctx: &AppContext,
    refund_id: Uuid,
    observed: Option<ProviderObject>,
) -> Result<Refund, StoreError> {
    match observed {
        Some(object) => Ok(
            settle::refund(tx, &ctx.metrics, refund_id, &object, Cause::Command)
                .await?
                .0,
        ),
        None => store::refunds::lock(tx, refund_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("refund", refund_id)),
    }
}
