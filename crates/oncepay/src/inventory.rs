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

/// An order's reservation, written by [`create_reserving`] and placed by
/// [`reserve`], the transaction's last write.
#[derive(Debug, Clone)]
pub struct Reservation {
    merchant_id: Uuid,
    order_id: Uuid,
    /// The quantity of each tracked SKU (lines of one SKU summed), in SKU
    /// order.
    wanted: BTreeMap<String, i64>,
    until: Option<chrono::DateTime<chrono::Utc>>,
}

/// Creates `order` (awaiting payment), its reservation to follow, in the
/// caller's transaction: the quantities of each tracked SKU (lines of one
/// SKU summed), reserved until now + `ttl` by the database's clock, all
/// or none, by [`reserve`]. Untracked SKUs reserve nothing; when none is
/// tracked the order reserves nothing (`stock_reserved_until` stays
/// null). No stock row is locked here: which SKUs are tracked is read
/// without a lock (a SKU tracked from a moment later, by an adjustment
/// racing this order, is one the order came before), so the
/// transaction's writes (the order, its event, its stored answer) come
/// before the only contended lock, which [`reserve`] takes last.
pub async fn create_reserving(
    tx: &mut PgConnection,
    metrics: &Metrics,
    merchant_id: Uuid,
    order: &mut Order,
    ttl: Duration,
) -> Result<Reservation, StoreError> {
    let mut wanted = inventory::demand(&order.items);
    let (tracked, now) =
        store::inventory::tracked(tx, merchant_id, wanted.keys().map(String::as_str)).await?;
    wanted.retain(|sku, _| tracked.contains(sku));
    if let Some(now) = now {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365));
        order.stock_reserved_until = Some((now + ttl).trunc_subsecs(6));
    }
    store::orders::insert(tx, merchant_id, order).await?;
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
    Ok(Reservation {
        merchant_id,
        order_id: order.id,
        wanted,
        until: order.stock_reserved_until,
    })
}

/// The transfer reserving `quantity` of `stock` for `order_id`.
fn reservation<'a>(
    stock: &'a AccountRef,
    sold: &'a AccountRef,
    r: &Reservation,
    quantity: i64,
    key: &'a str,
) -> NewTransfer<'a> {
    let mut new = transfer(
        stock,
        sold,
        Code::Reservation,
        quantity,
        Some(r.order_id),
        key,
    );
    new.expires_at = r.until;
    new
}

/// Places `r`, the last write of its transaction (the order, locked as
/// its creator, is in it): in one statement when every SKU has the
/// quantity on its row ([`store::ledger::hold_all`]: as cheap for the row
/// as one transfer), so on a SKU many orders race for each holds the
/// row's lock for that statement's write and the commit only; otherwise
/// (a row short when read, or refused by its own check once locked) one
/// step at a time, the stock locked and its reservations past their
/// deadline voided first ([`lock`]), which may free enough.
/// `Err(shortages)` when any SKU lacks stock: the caller drops the
/// transaction, and nothing of the order is written.
pub async fn reserve(
    tx: &mut PgConnection,
    metrics: &Metrics,
    r: &Reservation,
) -> Result<Result<(), Vec<Short>>, StoreError> {
    if r.wanted.is_empty() {
        return Ok(Ok(()));
    }
    let accounts: Vec<(AccountRef, AccountRef, String)> = r
        .wanted
        .keys()
        .map(|sku| {
            let stock = store::inventory::account(r.merchant_id, sku);
            // Its system account was made with the SKU's first adjustment.
            let sold = stock.system(Code::Reservation.shape().2);
            (
                stock,
                sold,
                store::inventory::reservation_key(r.order_id, sku),
            )
        })
        .collect();
    let holds: Vec<NewTransfer<'_>> = accounts
        .iter()
        .map(|(stock, sold, key)| reservation(stock, sold, r, r.wanted[&stock.unit], key))
        .collect();
    if store::ledger::hold_all(tx, &holds).await? {
        return Ok(Ok(()));
    }
    let (stock, voids) = lock(
        tx,
        r.merchant_id,
        r.wanted.keys().map(String::as_str),
        Some(r.order_id),
    )
    .await?;
    let available: BTreeMap<String, i64> = stock
        .iter()
        .map(|(sku, s)| (sku.clone(), s.totals.available()))
        .collect();
    let short = inventory::shortages(&r.wanted, &available);
    if !short.is_empty() {
        return Ok(Err(short));
    }
    for new in &holds {
        match store::ledger::insert(tx, new).await {
            Ok(_) => {}
            // Under the row lock this cannot happen; the database says so
            // anyway, and the answer is the same.
            Err(TransferError::Insufficient) => {
                return Ok(Err(vec![Short {
                    sku: new.holder.unit.clone(),
                    requested: new.amount,
                    available: available.get(&new.holder.unit).copied().unwrap_or(0),
                }]))
            }
            Err(e) => return Err(e.into()),
        }
    }
    announce_released(tx, metrics, &voids, Cause::Command).await?;
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
