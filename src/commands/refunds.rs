//! `POST /payments/{id}/refunds`, in the same three recorded steps as a
//! payment. Refunds of one payment are serialised by locking its order and
//! payment rows in step 1, so their sum can never exceed the amount.

use chrono::Utc;
use uuid::Uuid;

use super::settle::{self, Cause};
use super::{json_response, AppContext, Command, CommandError, CommandInput};
use crate::domain::money::Amount;
use crate::domain::payment::{PaymentStatus, Refund};
use crate::domain::RuleViolation;
use crate::idempotency::{Claim, Completed, STARTED};
use crate::input::Obj;
use crate::problem::Problem;
use crate::provider::{CallOutcome, ProviderObject, RefundRequest};
use crate::store::refunds::NewRefund;
use crate::store::{self, StoreError};

/// The recovery point after a refund row is created.
pub const REFUND_CREATED: &str = "refund_created";

/// Longest refund reason, in characters.
pub const REASON_MAX: usize = 500;

/// Refund all or part of a succeeded payment.
pub struct CreateRefund {
    payment_id: Uuid,
    amount: Option<Amount>,
    reason: Option<String>,
}

impl Command for CreateRefund {
    const NAME: &'static str = "create_refund";

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let payment_id = input
            .path_id
            .ok_or_else(|| Problem::not_found("payment_not_found", "payment"))?;
        let body = Obj::root(&input.body)?;
        body.only(&["amount", "reason"])?;
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
        Ok(CreateRefund {
            payment_id,
            amount,
            reason,
        })
    }

    async fn execute(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> Result<Completed, CommandError> {
        let (refund_id, request) = match (claim.recovery_point(), claim.resource_id()) {
            (STARTED, _) => {
                let request = self.create_refund(ctx, claim).await?;
                (request.idempotency_key, Some(request))
            }
            (REFUND_CREATED, Some(id)) => (id, pending_request(ctx, id).await?),
            (point, _) => {
                return Err(
                    StoreError::Corrupt(format!("create_refund cannot resume at {point}")).into(),
                )
            }
        };
        let observed = match &request {
            Some(request) => send(ctx, request).await,
            None => None,
        };
        let mut tx = ctx.pool.begin().await.map_err(StoreError::from)?;
        let refund = finish(&mut tx, ctx, refund_id, observed).await?;
        let status = if refund.status.is_final() { 201 } else { 202 };
        let response = json_response(status, &refund, Some(format!("/refunds/{}", refund.id)))?;
        let done = claim.complete(&mut tx, response).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(done)
    }
}

impl CreateRefund {
    /// Step 1: checks the payment and what is left of it, inserts the refund.
    async fn create_refund(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> Result<RefundRequest, CommandError> {
        let not_found = || CommandError::Reject(Problem::not_found("payment_not_found", "payment"));
        let mut tx = ctx.pool.begin().await.map_err(StoreError::from)?;
        let payment = store::payments::get(&mut tx, claim.merchant_id(), self.payment_id)
            .await?
            .ok_or_else(not_found)?;
        store::orders::lock_by_id(&mut tx, payment.order_id).await?;
        let payment = store::payments::lock(&mut tx, payment.id)
            .await?
            .ok_or_else(not_found)?;
        if payment.status != PaymentStatus::Succeeded {
            return Err(CommandError::Reject(Problem::new(
                409,
                "payment_not_refundable",
                format!(
                    "the payment is {}; only a succeeded payment can be refunded",
                    payment.status.as_str()
                ),
            )));
        }
        let left = payment.amount - store::refunds::committed_sum(&mut tx, payment.id).await?;
        let amount = self.amount.map(Amount::minor_units).unwrap_or(left);
        if left <= 0 || amount > left {
            return Err(CommandError::Reject(
                Problem::new(
                    422,
                    "refund_exceeds_payment",
                    format!("amount: {amount} exceeds the {left} left to refund on this payment (pending refunds count)"),
                )
                .with_field("amount"),
            ));
        }
        let refund = store::refunds::insert(
            &mut tx,
            &NewRefund {
                id: Uuid::now_v7(),
                merchant_id: claim.merchant_id(),
                payment_id: payment.id,
                amount,
                reason: self.reason.as_deref(),
                cancels_order: false,
                now: Utc::now(),
                check_after: ctx.reconcile_after,
            },
        )
        .await?;
        claim
            .record_step(&mut tx, REFUND_CREATED, refund.id)
            .await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(refund_request(&refund, payment.provider_charge_id)?)
    }
}

/// What step 2 sends for a refund step 1 created: the refund id as the
/// provider key, against the payment's charge.
pub fn refund_request(
    refund: &Refund,
    charge_id: Option<String>,
) -> Result<RefundRequest, StoreError> {
    let charge_id = charge_id.ok_or_else(|| {
        StoreError::Corrupt(format!(
            "payment {} succeeded without a charge id",
            refund.payment_id
        ))
    })?;
    Ok(RefundRequest {
        idempotency_key: refund.id,
        charge_id,
        amount: refund.amount,
    })
}

/// The request of a refund created earlier (a resumed command, or the
/// reconciler), or `None` if it is already settled.
pub async fn pending_request(
    ctx: &AppContext,
    refund_id: Uuid,
) -> Result<Option<RefundRequest>, StoreError> {
    let mut conn = ctx.pool.acquire().await?;
    let refund = store::refunds::by_id(&mut conn, refund_id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("refund {refund_id} vanished")))?;
    if refund.status.is_final() {
        return Ok(None);
    }
    let charge_id = store::payments::charge_id_of(&mut conn, refund.payment_id).await?;
    refund_request(&refund, charge_id).map(Some)
}

/// Step 2 of any refund (also used by cancelling a paid order): sends it to
/// the provider with the refund id as key, holding no connection. `None`:
/// nothing new was learned (the outcome is unknown).
pub async fn send(ctx: &AppContext, request: &RefundRequest) -> Option<ProviderObject> {
    match ctx.provider.refund(request).await {
        CallOutcome::Known(object) => Some(object),
        CallOutcome::NotFound => None,
        CallOutcome::Unknown(reason) => {
            tracing::warn!(refund_id = %request.idempotency_key, %reason, "refund outcome unknown; leaving it pending");
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
            .ok_or_else(|| StoreError::Corrupt(format!("refund {refund_id} vanished"))),
    }
}
