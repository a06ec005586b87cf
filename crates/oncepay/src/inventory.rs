//! Stock's writes that more than one path makes (issue 46), on the ledger
//! engine (`store::ledger`), as `balances` is for customer balances: the
//! create-order that reserves (`commands::orders`), the adjustment
//! (`commands::inventory`), every change of an order's status
//! ([`follow_order`], which settlement by command, webhook, reconciler,
//! capture and cancel all call) and the sweeper ([`expire_reservations`]).
//!
//! Locks: an order's row before any stock row (as settlement locks order,
//! then payment, then stock), stock rows in SKU order in one statement
//! (`store::ledger::lock_holders`). A writer holding stock rows never
//! waits for an order's lock: the orders of reservations it finds
//! expired are taken with `SKIP LOCKED` ([`lock`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::SubsecRound;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::event::{Cause, EventType};
use crate::domain::inventory::{self, Short, Shortfall};
use crate::domain::ledger::stock::Code;
use crate::domain::ledger::{AccountRef, Totals};
use crate::domain::order::{Order, OrderStatus};
use crate::metrics::Metrics;
use crate::store::ledger::{Locked, NewTransfer, Transfer, TransferError};
use crate::store::{self, Corrupt, StoreError};

/// A tracked SKU's stock, locked: its account, the lock, and its totals
/// once the reservations past their deadline that could be voided are.
#[derive(Debug, Clone)]
pub struct Stock {
    /// The stock account.
    pub account: AccountRef,
    /// The row lock (its clock is the database's).
    pub locked: Locked,
    /// Its totals now.
    pub totals: Totals,
}

/// Locks the stock of those `skus` of the merchant that are tracked, in
/// SKU order, and voids their reservations past the deadline (each a
/// `reservation_expiry`), so that their totals are what is live. The
/// reservation of an order locked by another transaction (being paid or
/// cancelled right now: it resolves its own) is left to it and still
/// counts; `own` is the order the caller holds locked. Returns the stock
/// by SKU and the voids, to announce with [`announce_released`] once the
/// caller has added its own.
pub async fn lock(
    tx: &mut PgConnection,
    merchant_id: Uuid,
    skus: impl IntoIterator<Item = &str>,
    own: Option<Uuid>,
) -> Result<(BTreeMap<String, Stock>, Vec<Transfer>), StoreError> {
    let accounts: BTreeMap<Uuid, AccountRef> = skus
        .into_iter()
        .map(|sku| {
            let a = store::inventory::account(merchant_id, sku);
            (a.id(), a)
        })
        .collect();
    let refs: Vec<AccountRef> = accounts.values().cloned().collect();
    let locked = store::ledger::lock_holders(tx, &refs).await?;
    let mut stock: BTreeMap<String, Stock> = locked
        .into_iter()
        .filter_map(|(id, locked)| {
            let account = accounts.get(&id)?.clone();
            Some((
                account.unit.clone(),
                Stock {
                    account,
                    totals: locked.totals,
                    locked,
                },
            ))
        })
        .collect();
    let due: Vec<Uuid> = stock
        .values()
        .filter(|s| s.locked.overdue > 0)
        .map(|s| s.locked.account_id)
        .collect();
    let mut voids = Vec::new();
    if due.is_empty() {
        return Ok((stock, voids));
    }
    let overdue = store::ledger::overdue_of(tx, &due).await?;
    let others: Vec<Uuid> = overdue
        .iter()
        .filter_map(|(_, _, order)| *order)
        .filter(|order| Some(*order) != own)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let free: BTreeSet<Uuid> = match others.is_empty() {
        true => BTreeSet::new(),
        false => store::orders::try_lock_ids(tx, &others)
            .await?
            .into_iter()
            .collect(),
    };
    for (pending_id, _, order) in overdue {
        let voidable = order.is_none_or(|o| Some(o) == own || free.contains(&o));
        if !voidable {
            continue;
        }
        let void = store::ledger::void(tx, pending_id, Code::ReservationExpiry.as_str())
            .await
            .map_err(StoreError::from)?;
        if let Some(s) = stock.get_mut(&void.unit) {
            s.totals = void.after;
        }
        voids.push(void);
    }
    Ok((stock, voids))
}

/// Writes `order.stock_released` once for each order of `voids` (its
/// reservation released or expired), with the order as it now is. The
/// caller holds each order's lock ([`lock`] took the others').
pub async fn announce_released(
    tx: &mut PgConnection,
    metrics: &Metrics,
    voids: &[Transfer],
    cause: Cause,
) -> Result<(), StoreError> {
    let orders: BTreeSet<Uuid> = voids.iter().filter_map(|v| v.order_id).collect();
    for order_id in orders {
        let order = store::orders::get_by_id(tx, order_id)
            .await?
            .ok_or_else(|| Corrupt::vanished("order", order_id))?;
        crate::events::order_stock(tx, metrics, &order, EventType::OrderStockReleased, cause)
            .await?;
    }
    Ok(())
}

/// The transfer of `code` on `stock` for `order_id` (an adjustment has
/// none), under `key`.
fn transfer<'a>(
    stock: &'a AccountRef,
    other: &'a AccountRef,
    code: Code,
    amount: i64,
    order_id: Option<Uuid>,
    key: &'a str,
) -> NewTransfer<'a> {
    let (phase, holder_is_debit, _) = code.shape();
    NewTransfer {
        id: Uuid::now_v7(),
        holder: stock,
        other,
        holder_is_debit,
        amount,
        phase,
        pending_id: None,
        expires_at: None,
        code: code.as_str(),
        description: None,
        payment_id: None,
        refund_id: None,
        order_id,
        idempotency_key: Some(key),
    }
}

/// Creates `order` (awaiting payment) with its stock reserved, in the
/// caller's transaction: the quantities of each tracked SKU (lines of one
/// SKU summed) are reserved until now + `ttl`, all or none. Untracked
/// SKUs reserve nothing; when none is tracked the order reserves nothing
/// (`stock_reserved_until` stays null). `Err(shortages)` when any
/// tracked SKU lacks stock: nothing is written then (the caller's
/// transaction is dropped).
pub async fn create_reserving(
    tx: &mut PgConnection,
    metrics: &Metrics,
    merchant_id: Uuid,
    order: &mut Order,
    ttl: Duration,
) -> Result<Result<(), Vec<Short>>, StoreError> {
    let wanted = inventory::demand(&order.items);
    let (stock, voids) = lock(tx, merchant_id, wanted.keys().map(String::as_str), None).await?;
    let available: BTreeMap<String, i64> = stock
        .iter()
        .map(|(sku, s)| (sku.clone(), s.totals.available()))
        .collect();
    let short = inventory::shortages(&wanted, &available);
    if !short.is_empty() {
        return Ok(Err(short));
    }
    if let Some(first) = stock.values().next() {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365));
        order.stock_reserved_until = Some((first.locked.now + ttl).trunc_subsecs(6));
    }
    store::orders::insert(tx, merchant_id, order).await?;
    for (sku, s) in &stock {
        let quantity = wanted[sku];
        // Its system account was made with the SKU's first adjustment.
        let sold = s.account.system(Code::Reservation.shape().2);
        let key = store::inventory::reservation_key(order.id, sku);
        let mut new = transfer(
            &s.account,
            &sold,
            Code::Reservation,
            quantity,
            Some(order.id),
            &key,
        );
        new.expires_at = order.stock_reserved_until;
        match store::ledger::insert(tx, &new).await {
            Ok(_) => {}
            // Under the row lock this cannot happen; the database says so
            // anyway, and the answer is the same.
            Err(TransferError::Insufficient) => {
                return Ok(Err(vec![Short {
                    sku: sku.clone(),
                    requested: quantity,
                    available: s.totals.available(),
                }]))
            }
            Err(e) => return Err(e.into()),
        }
    }
    announce_released(tx, metrics, &voids, Cause::Command).await?;
    if order.stock_reserved_until.is_some() {
        crate::events::order_stock(
            tx,
            metrics,
            order,
            EventType::OrderStockReserved,
            Cause::Command,
        )
        .await?;
    }
    Ok(Ok(()))
}

/// The one place an order's stock follows its status, called by every
/// path that changes an order's status, in its transaction, with the
/// order locked and as it now is: paid or authorized, its reservation is
/// converted (on hand and reserved both drop), or, expired, the stock is
/// taken again if available and what is not is recorded as its
/// `stock_shortfall` (with `order.stock_shortfall`), never oversold;
/// cancelled, its reservation is released (`order.stock_released`).
/// Other statuses, and orders that reserved nothing, change nothing.
/// Returns the order as it then is. Repeating it changes nothing.
pub async fn follow_order(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    if order.stock_reserved_until.is_none() {
        return Ok(order);
    }
    match order.status {
        OrderStatus::Paid | OrderStatus::Authorized => convert(tx, metrics, order, cause).await,
        OrderStatus::Cancelled => release(tx, metrics, order, cause).await,
        OrderStatus::AwaitingPayment | OrderStatus::Refunded => Ok(order),
    }
}

/// The merchant of an order's stock transfers.
fn merchant_of(skus: &BTreeMap<String, store::inventory::OrderSku>) -> Option<Uuid> {
    skus.values()
        .find_map(|s| s.reservation.as_ref().map(|r| r.merchant_id))
}

async fn convert(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    let skus = store::inventory::of_order(tx, order.id).await?;
    let Some(merchant_id) = merchant_of(&skus) else {
        return Ok(order);
    };
    // A SKU already reported short was decided when the order was first
    // paid: a later move back to paid (a refund reversed) takes nothing
    // again.
    let reported = |sku: &str| order.stock_shortfall.iter().any(|f| f.sku == sku);
    let todo: Vec<&str> = skus
        .iter()
        .filter(|(sku, s)| s.reservation.is_some() && !s.settled() && !reported(sku))
        .map(|(sku, _)| sku.as_str())
        .collect();
    if todo.is_empty() {
        return Ok(order);
    }
    let (mut stock, mut voids) =
        lock(tx, merchant_id, todo.iter().copied(), Some(order.id)).await?;
    // Read again under the locks: the voids just made are this order's too.
    let skus = store::inventory::of_order(tx, order.id).await?;
    let mut shortfall = order.stock_shortfall.clone();
    let before = shortfall.len();
    for sku in todo {
        let (Some(s), Some(state)) = (stock.get_mut(sku), skus.get(sku)) else {
            continue;
        };
        let reserved = state.reserved();
        if state.open() {
            let pending_id = state.reservation.as_ref().map(|r| r.id).unwrap_or_default();
            match store::ledger::post_pending(tx, pending_id, Code::Conversion.as_str())
                .await
                .map_err(StoreError::from)?
            {
                Some(post) => {
                    s.totals = post.after;
                    continue;
                }
                // It reached its deadline between the lock and the post.
                None => {
                    let void =
                        store::ledger::void(tx, pending_id, Code::ReservationExpiry.as_str())
                            .await
                            .map_err(StoreError::from)?;
                    s.totals = void.after;
                    voids.push(void);
                }
            }
        }
        // Expired (or released) before the payment: take what is there.
        let (taken, missing) = inventory::late_take(reserved, s.totals.available());
        if taken > 0 {
            let sold = s.account.system(Code::Sale.shape().2);
            let key = store::inventory::sale_key(order.id, sku);
            let sale = store::ledger::insert(
                tx,
                &transfer(&s.account, &sold, Code::Sale, taken, Some(order.id), &key),
            )
            .await
            .map_err(StoreError::from)?;
            s.totals = sale.after;
        }
        if missing > 0 {
            shortfall.push(Shortfall {
                sku: sku.to_string(),
                missing,
            });
        }
    }
    announce_released(tx, metrics, &voids, cause).await?;
    if shortfall.len() == before {
        return Ok(order);
    }
    let order = store::orders::set_stock_shortfall(tx, order.id, &shortfall).await?;
    crate::events::order_stock(tx, metrics, &order, EventType::OrderStockShortfall, cause).await?;
    Ok(order)
}

async fn release(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    let skus = store::inventory::of_order(tx, order.id).await?;
    let Some(merchant_id) = merchant_of(&skus) else {
        return Ok(order);
    };
    let open: Vec<&str> = skus
        .iter()
        .filter(|(_, s)| s.open())
        .map(|(sku, _)| sku.as_str())
        .collect();
    if open.is_empty() {
        return Ok(order);
    }
    let (_, mut voids) = lock(tx, merchant_id, open.iter().copied(), Some(order.id)).await?;
    let skus = store::inventory::of_order(tx, order.id).await?;
    for state in skus.values().filter(|s| s.open()) {
        let pending_id = state.reservation.as_ref().map(|r| r.id).unwrap_or_default();
        let void = store::ledger::void(tx, pending_id, Code::Release.as_str())
            .await
            .map_err(StoreError::from)?;
        voids.push(void);
    }
    announce_released(tx, metrics, &voids, cause).await?;
    Ok(order)
}

/// The sweeper's pass over reservations past their deadline: for each
/// order that has one (at most `limit`), the order is locked, then its
/// stock, and what is overdue voided with one `order.stock_released` per
/// order. A reservation stops counting at its deadline without this;
/// this writes its void, so the ledger and the events say so. Returns
/// how many orders it looked at.
pub async fn expire_reservations(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    limit: i64,
) -> Result<usize, StoreError> {
    let due = store::inventory::overdue_orders(pool, limit).await?;
    for (merchant_id, order_id) in &due {
        let mut tx = pool.begin().await?;
        if store::orders::lock_by_id(&mut tx, *order_id)
            .await?
            .is_none()
        {
            continue;
        }
        let skus = store::inventory::of_order(&mut tx, *order_id).await?;
        let open = skus
            .iter()
            .filter(|(_, s)| s.open())
            .map(|(sku, _)| sku.as_str());
        let (_, voids) = lock(&mut tx, *merchant_id, open, Some(*order_id)).await?;
        announce_released(&mut tx, metrics, &voids, Cause::Reconciler).await?;
        tx.commit().await?;
    }
    Ok(due.len())
}
