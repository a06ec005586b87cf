//! `POST /orders` and `POST /orders/{id}/cancel`.

use chrono::{SubsecRound, Utc};
use uuid::Uuid;

use super::fast_path::InsertOrder;
use super::refunds;
use super::{
    json_response, recovery_points, AppContext, At, Command, CommandError, CommandInput,
    NoRecoveryPoint, Run, Step,
};
use crate::domain::order::{CancelPlan, NewOrder, Order, OrderStatus, RawLineItem};
use crate::domain::payment::PaymentStatus;
use crate::idempotency::{BoxedWrite, ClaimingCompleted, StoredResponse};
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store::{self, Corrupt, StoreError};

/// Create an order. When its key is new, the claim, the order and the
/// stored response are one statement ([`Command::in_one`]); otherwise one
/// step after the claim: the order and the stored response commit
/// together, in one statement, so a crash leaves either both or neither.
///
/// With `reserve_stock`, one step in one transaction: the order, its
/// event, the stored response and, last, the reservation of its tracked
/// SKUs (`inventory::create_reserving`, `inventory::reserve`) commit
/// together, so the key covers the reservation: a replay reserves nothing
/// more. A SKU short of stock is the key's answer, `409
/// insufficient_stock`, and nothing else is written.
///
/// A customer's token always reserves (its orders may not take stock
/// without holding it first), and holds at most
/// `ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS` unpaid reserving orders at once.
pub struct CreateOrder {
    new: NewOrder,
    reserve_stock: bool,
    /// Asked by a customer's token.
    by_customer: bool,
}

impl Command for CreateOrder {
    const KIND: super::CommandKind = super::CommandKind::CreateOrder;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&[
            "customer_id",
            "currency",
            "items",
            "metadata",
            "reserve_stock",
        ])?;
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
        let by_customer = input
            .actor
            .as_ref()
            .is_some_and(|a| a.kind == crate::audit::ActorKind::Customer);
        let reserve_stock = match (body.opt_bool("reserve_stock")?, by_customer) {
            (Some(false), true) => {
                return Err(Problem::rule(crate::domain::RuleViolation::new(
                    "reserve_stock",
                    "must be true (or absent) for a customer's token: a customer's order always reserves the stock it takes",
                )))
            }
            (_, true) => true,
            (asked, false) => asked.unwrap_or(false),
        };
        let new = NewOrder::new(customer_id, &currency, items, metadata).map_err(Problem::rule)?;
        Ok(CreateOrder {
            new,
            reserve_stock,
            by_customer,
        })
    }

    fn in_one(
        &self,
        ctx: &AppContext,
    ) -> Option<(StoredResponse, BoxedWrite<ClaimingCompleted, ()>)> {
        // Reserving reads and locks stock first: a transaction's work.
        if self.reserve_stock {
            return None;
        }
        let (order, response) = self.prepare().ok()?;
        Some((response, Box::new(InsertOrder::claiming(ctx, order))))
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        if self.reserve_stock {
            return self.create_reserving(ctx, run).await;
        }
        let (order, response) = self.prepare()?;
        // One statement inserts the order and completes the record: a crash
        // leaves both or neither, and the create costs one round trip.
        Ok(Step::CompleteInOne {
            response,
            write: Box::new(InsertOrder::completing(ctx, order)),
            otherwise: None,
        })
    }
}

impl CreateOrder {
    /// The order to create (a new id, now).
    fn order(&self) -> Order {
        // The database keeps microseconds: round now so the answer and a
        // later read show the same timestamps.
        Order::awaiting_payment(Uuid::now_v7(), &self.new, Utc::now().trunc_subsecs(6))
    }

    /// The order to create and its `201` answer.
    fn prepare(&self) -> Result<(Order, StoredResponse), CommandError> {
        let order = self.order();
        let response = json_response(201, &order, Some(format!("/orders/{}", order.id)))?;
        Ok((order, response))
    }

    /// The order and its reservation, in one transaction with the answer:
    /// the order, its event and the answer first, the reservation last
    /// (`inventory::reserve`), so a SKU's row is locked only by the
    /// reservation's statement and the commit.
    async fn create_reserving(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let mut order = self.order();
        let mut tx = ctx.pool.begin().await?;
        let limit = self.by_customer.then_some(ctx.stock_customer_open_orders);
        let reservation = crate::inventory::create_reserving(
            &mut tx,
            &ctx.metrics,
            run.merchant_id,
            &mut order,
            ctx.stock_reservation_ttl,
            limit,
        )
        .await?
        .map_err(|reached| {
            CommandError::Reject(
                Problem::new(
                    ProblemCode::ReservationLimitReached,
                    format!(
                        "this customer has {} unpaid orders holding stock, the most a customer's token may hold ({}); pay or cancel one, or wait until its reservation lapses",
                        reached.open, reached.limit
                    ),
                )
                .with_member("limit", serde_json::json!(reached.limit)),
            )
        })?;
        let response = json_response(201, &order, Some(format!("/orders/{}", order.id)))?;
        Ok(Step::CompleteThenLast {
            tx,
            response,
            last: Box::new(Reserve {
                reservation,
                metrics: ctx.metrics.clone(),
            }),
        })
    }
}

/// A reserving order's last write: its reservation; a SKU short of stock
/// is the key's answer, `409 insufficient_stock`.
struct Reserve {
    reservation: crate::inventory::Reservation,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl super::LastWrite for Reserve {
    fn write<'c>(
        self: Box<Self>,
        conn: &'c mut sqlx::PgConnection,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), CommandError>> + Send + 'c>>
    {
        Box::pin(async move {
            crate::inventory::reserve(conn, &self.metrics, &self.reservation)
                .await?
                .map_err(|short| CommandError::Reject(super::inventory::insufficient_stock(&short)))
        })
    }
}

/// Cancel an order: at once if unpaid; if paid, refund what is left and
/// cancel when the refund succeeds (the refund's steps are recorded like a
/// refund command's, so a crash resumes without refunding twice).
pub struct CancelOrder {
    order_id: Uuid,
    /// Asked by a customer's token, which may cancel only an unpaid order:
    /// cancelling a paid one refunds it, and refunds are the merchant's.
    by_customer: bool,
}

fn order_response(
    status: u16,
    order: &Order,
) -> Result<crate::idempotency::persistence::StoredResponse, CommandError> {
    json_response(status, order, None)
}

recovery_points! {
    /// Where a cancel of a paid order can be resumed.
    CancelPoint {
        /// The refund of what is left was created (step 1).
        RefundCreated = "refund_created",
        /// The void of an authorized order's hold was asked for (step 1,
        /// `order_cancelled`): resuming asks its provider again.
        VoidRequested = "void_requested",
    }
}

impl Command for CancelOrder {
    const KIND: super::CommandKind = super::CommandKind::CancelOrder;
    type Point = CancelPoint;
    /// What step 2 must send (`None`: the refund is already final).
    type Memo = Option<refunds::Outstanding>;

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let order_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::OrderNotFound, "order"))?;
        Obj::root(&input.body)?.only(&[])?;
        let by_customer = input
            .actor
            .as_ref()
            .is_some_and(|a| a.kind == crate::audit::ActorKind::Customer);
        Ok(CancelOrder {
            order_id,
            by_customer,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<CancelPoint, Self::Memo>,
    ) -> Result<Step<CancelPoint, Self::Memo>, CommandError> {
        let (refund_id, outstanding) = match at {
            At::Start => return self.cancel_or_start_refund(ctx, run).await,
            At::After {
                point: CancelPoint::VoidRequested,
                resource,
                ..
            } => return self.void_then_cancel(ctx, run, resource).await,
            At::After {
                point: CancelPoint::RefundCreated,
                resource,
                memo,
            } => match memo {
                Some(outstanding) => (resource, outstanding),
                None => (resource, refunds::pending_request(ctx, resource).await?),
            },
        };
        let observed = refunds::step_2(ctx, outstanding.as_ref()).await;
        let mut tx = ctx.pool.begin().await?;
        // Locks in the one order used everywhere: order, payment, refund.
        store::orders::lock(&mut tx, run.merchant_id, self.order_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("order", self.order_id))?;
        let refund = refunds::finish(&mut tx, ctx, refund_id, observed).await?;
        let order = store::orders::lock(&mut tx, run.merchant_id, self.order_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("order", self.order_id))?;
        let response = match refund.status {
            PaymentStatus::Succeeded => order_response(200, &order)?,
            // The provider has not answered yet: accepted, the order turns
            // `cancelled` when the refund settles.
            PaymentStatus::Pending => order_response(202, &order)?,
            PaymentStatus::Failed | PaymentStatus::RequiresCapture | PaymentStatus::Voided => {
                let problem = Problem::new(
                    ProblemCode::OrderNotCancellable,
                    "the provider declined the refund, so the paid order stays paid",
                );
                StoredResponse {
                    status: problem.status,
                    body: problem.body(),
                    location: None,
                }
            }
        };
        Ok(Step::Complete { tx, response })
    }
}

impl CancelOrder {
    /// Steps 2 and 3 of cancelling an authorized order: its provider
    /// releases the hold, and the void cancels the order (`settle`): `200`
    /// once cancelled, `202` while the provider's answer is not known (the
    /// sweeper asks again), `409` if the provider answered that it was
    /// captured first.
    async fn void_then_cancel(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        payment_id: Uuid,
    ) -> Result<Step<CancelPoint, Option<refunds::Outstanding>>, CommandError> {
        let (mut tx, _payment) =
            super::captures::void_and_settle(ctx, payment_id, super::settle::Cause::Command)
                .await?;
        let order = store::orders::lock(&mut tx, run.merchant_id, self.order_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("order", self.order_id))?;
        let response = match order.status {
            OrderStatus::Cancelled => order_response(200, &order)?,
            OrderStatus::Authorized => order_response(202, &order)?,
            other => {
                let problem = Problem::new(
                    ProblemCode::OrderNotCancellable,
                    format!(
                        "the provider answered that the order's payment was captured first; the order is {}",
                        other.as_str()
                    ),
                );
                StoredResponse {
                    status: problem.status,
                    body: problem.body(),
                    location: None,
                }
            }
        };
        Ok(Step::Complete { tx, response })
    }
}

impl CancelOrder {
    /// Step 1: cancels an unpaid order at once (the last step), or creates
    /// the refund of what is left of a paid one.
    async fn cancel_or_start_refund(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<CancelPoint, Option<refunds::Outstanding>>, CommandError> {
        let mut tx = ctx.pool.begin().await?;
        let order = super::lock_order(&mut tx, run.merchant_id, self.order_id).await?;
        match order.status.cancel_plan() {
            CancelPlan::NotCancellable => Err(CommandError::Reject(Problem::new(
                ProblemCode::OrderNotCancellable,
                format!("the order is already {}", order.status.as_str()),
            ))),
            CancelPlan::CancelNow => {
                let live = store::payments::live_attempt(&mut tx, order.id).await?;
                if live.is_some_and(|p| p.status == PaymentStatus::Pending) {
                    return Err(CommandError::Reject(super::payments::payment_in_progress()));
                }
                let order = super::settle::move_order(
                    &mut tx,
                    &ctx.metrics,
                    order.id,
                    crate::domain::order::OrderStatus::Cancelled,
                    super::settle::Cause::Command,
                )
                .await?;
                let response = order_response(200, &order)?;
                Ok(Step::Complete { tx, response })
            }
            // A customer's cancel of a paid order is refused before its
            // key is claimed (`http::auth`, `403 insufficient_scope`,
            // consuming nothing); decided again here under the order's
            // lock, for a payment that succeeded in between. This answer
            // is kept under the key, so it is not a refusal of a right
            // but of this order's state: `order_not_cancellable`.
            CancelPlan::RefundThenCancel if self.by_customer => {
                Err(CommandError::Reject(Problem::new(
                    ProblemCode::OrderNotCancellable,
                    "the order was paid meanwhile: a customer's token cannot cancel a paid order, which would refund it",
                )))
            }
            CancelPlan::VoidThenCancel => {
                let held = store::payments::live_attempt(&mut tx, order.id)
                    .await?
                    .filter(|p| p.status == PaymentStatus::RequiresCapture)
                    .ok_or_else(|| {
                        StoreError::from(Corrupt::Broken(format!(
                            "authorized order {} has no payment in requires_capture",
                            order.id
                        )))
                    })?;
                let held = store::payments::lock(&mut tx, held.id)
                    .await?
                    .ok_or_else(|| Corrupt::vanished("payment", held.id))?;
                // A capture the provider refused is over: the hold can go.
                let capturing = store::captures::of_payment(&mut tx, held.id, None)
                    .await?
                    .iter()
                    .any(|c| c.status != PaymentStatus::Failed);
                crate::domain::payment::void_plan(&held, capturing).map_err(|why| {
                    CommandError::Reject(Problem::new(
                        ProblemCode::OrderNotCancellable,
                        format!("the order's payment cannot be voided now: {why}"),
                    ))
                })?;
                store::payments::request_void(
                    &mut tx,
                    held.id,
                    crate::domain::payment::VoidReason::OrderCancelled,
                    ctx.reconcile_after,
                )
                .await?
                .ok_or_else(|| Corrupt::vanished("hold", held.id))?;
                Ok(Step::Record {
                    tx,
                    point: CancelPoint::VoidRequested,
                    resource: held.id,
                    memo: None,
                })
            }
            CancelPlan::RefundThenCancel => {
                let payment = store::payments::lock_succeeded_for_order(&mut tx, order.id)
                    .await?
                    .ok_or_else(|| {
                        StoreError::from(Corrupt::Broken(format!(
                            "paid order {} has no succeeded payment",
                            order.id
                        )))
                    })?;
                let plan = refunds::Plan {
                    amount: None,
                    reason: Some("order_cancelled"),
                    // Its own namespace, so a refund command and a cancel
                    // that happen to share a client key never meet.
                    key: format!("cancel:{}", run.key),
                    cancels_order: true,
                    destination: refunds::Destination::Original,
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
                let (refund_id, outstanding) =
                    refunds::start(&mut tx, ctx, run, &payment, &plan).await?;
                Ok(Step::Record {
                    tx,
                    point: CancelPoint::RefundCreated,
                    resource: refund_id,
                    memo: outstanding,
                })
            }
        }
    }
}
