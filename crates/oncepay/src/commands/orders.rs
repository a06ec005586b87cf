//! `POST /orders` and `POST /orders/{id}/cancel`.

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::refunds::{self, REFUND_CREATED};
use super::{json_response, AppContext, Command, CommandError, CommandInput};
use crate::domain::order::{CancelPlan, NewOrder, Order, RawLineItem};
use crate::domain::payment::PaymentStatus;
use crate::idempotency::{Claim, Completed, STARTED};
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store::{self, StoreError};

/// Create an order. One step: the order and the stored response commit
/// together, in one statement, so a crash leaves either both or neither.
pub struct CreateOrder(NewOrder);

impl Command for CreateOrder {
    const NAME: &'static str = "create_order";

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&["customer_id", "currency", "items", "metadata"])?;
        let customer_id = body.string("customer_id")?;
        let currency = body.string("currency")?;
        let items = body.objects("items", |item| {
            item.only(&["sku", "quantity", "unit_amount"])?;
            Ok(RawLineItem {
                sku: item.string("sku")?,
                quantity: item.integer("quantity")?,
                unit_amount: item.integer("unit_amount")?,
            })
        })?;
        let metadata = body.string_map("metadata")?;
        NewOrder::new(customer_id, &currency, items, metadata)
            .map(CreateOrder)
            .map_err(Problem::rule)
    }

    async fn execute(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> Result<Completed, CommandError> {
        // The database keeps microseconds: round now so the answer and a
        // later read show the same timestamps.
        let order = Order::awaiting_payment(Uuid::now_v7(), &self.0, Utc::now().trunc_subsecs(6));
        let response = json_response(201, &order, Some(format!("/orders/{}", order.id)))?;
        let (record, token) = claim.fence();
        store::orders::insert_completing(&ctx.pool, record, token, &order, &response).await?;
        Ok(Completed(response))
    }
}

/// Cancel an order: at once if unpaid; if paid, refund what is left and
/// cancel when the refund succeeds (the refund's steps are recorded like a
/// refund command's, so a crash resumes without refunding twice).
pub struct CancelOrder {
    order_id: Uuid,
}

fn order_response(
    status: u16,
    order: &Order,
) -> Result<crate::store::idempotency::StoredResponse, CommandError> {
    json_response(status, order, None)
}

impl Command for CancelOrder {
    const NAME: &'static str = "cancel_order";

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let order_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::OrderNotFound, "order"))?;
        Obj::root(&input.body)?.only(&[])?;
        Ok(CancelOrder { order_id })
    }

    async fn execute(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> Result<Completed, CommandError> {
        let (refund_id, request) = match (claim.recovery_point(), claim.resource_id()) {
            (STARTED, _) => match self.cancel_or_start_refund(ctx, claim).await? {
                Ok(done) => return Ok(done),
                Err(started) => started,
            },
            (REFUND_CREATED, Some(id)) => (id, refunds::pending_request(ctx, id).await?),
            (point, _) => {
                return Err(
                    StoreError::Corrupt(format!("cancel_order cannot resume at {point}")).into(),
                )
            }
        };
        let observed = refunds::step_2(ctx, request.as_ref()).await;
        let mut tx = ctx.pool.begin().await?;
        // Locks in the one order used everywhere: order, payment, refund.
        store::orders::lock(&mut tx, claim.merchant_id(), self.order_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", self.order_id)))?;
        let refund = refunds::finish(&mut tx, ctx, refund_id, observed).await?;
        let order = store::orders::lock(&mut tx, claim.merchant_id(), self.order_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("order {} vanished", self.order_id)))?;
        let response = match refund.status {
            PaymentStatus::Succeeded => order_response(200, &order)?,
            // The provider has not answered yet: accepted, the order turns
            // `cancelled` when the refund settles.
            PaymentStatus::Pending => order_response(202, &order)?,
            PaymentStatus::Failed => {
                let problem = Problem::new(
                    ProblemCode::OrderNotCancellable,
                    "the provider declined the refund, so the paid order stays paid",
                );
                crate::store::idempotency::StoredResponse {
                    status: problem.status,
                    body: problem.body(),
                    location: None,
                }
            }
        };
        let done = claim.complete(&mut tx, response).await?;
        tx.commit().await?;
        Ok(done)
    }
}

impl CancelOrder {
    /// Step 1. Returns the completed answer for an unpaid order, or the id
    /// of the refund created for a paid one.
    async fn cancel_or_start_refund(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> Result<Result<Completed, (Uuid, Option<refunds::Outstanding>)>, CommandError> {
        let mut tx = ctx.pool.begin().await?;
        let order = store::orders::lock(&mut tx, claim.merchant_id(), self.order_id)
            .await?
            .ok_or_else(|| {
                CommandError::Reject(Problem::not_found(ProblemCode::OrderNotFound, "order"))
            })?;
        match order.status.cancel_plan() {
            CancelPlan::NotCancellable => Err(CommandError::Reject(Problem::new(
                ProblemCode::OrderNotCancellable,
                format!("the order is already {}", order.status.as_str()),
            ))),
            CancelPlan::CancelNow => {
                if store::payments::live_attempt_status(&mut tx, order.id).await?
                    == Some(PaymentStatus::Pending)
                {
                    return Err(CommandError::Reject(Problem::new(
                        ProblemCode::PaymentInProgress,
                        "the order has a pending payment; cancel it once the payment settles",
                    )));
                }
                let order = store::orders::set_status(
                    &mut tx,
                    order.id,
                    crate::domain::order::OrderStatus::Cancelled,
                )
                .await?;
                let done = claim
                    .complete(&mut tx, order_response(200, &order)?)
                    .await?;
                tx.commit().await?;
                Ok(Ok(done))
            }
            CancelPlan::RefundThenCancel => {
                let payment = store::payments::lock_succeeded_for_order(&mut tx, order.id)
                    .await?
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "paid order {} has no succeeded payment",
                            order.id
                        ))
                    })?;
                let plan = refunds::Plan {
                    amount: None,
                    reason: Some("order_cancelled"),
                    // Its own namespace, so a refund command and a cancel
                    // that happen to share a client key never meet.
                    key: format!("cancel:{}", claim.key()),
                    cancels_order: true,
                };
                // All or nothing: while another refund of the payment is
                // pending its outcome decides how much is left, so cancelling
                // now could leave a cancelled order with money captured.
                let own = store::refunds::by_key(&mut tx, payment.id, &plan.key).await?;
                if own.is_none() && store::refunds::any_pending(&mut tx, payment.id).await? {
                    return Err(CommandError::Reject(Problem::new(
                        ProblemCode::RefundInProgress,
                        "a refund of this order's payment is still pending; cancel once it settles",
                    )));
                }
                let started = refunds::start(&mut tx, ctx, claim, &payment, &plan).await?;
                tx.commit().await?;
                Ok(Err(started))
            }
        }
    }
}
