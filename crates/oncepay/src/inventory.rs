//! Stock's writes that more than one path makes (issues 46 and 54), on
//! the ledger engine (`store::ledger`), as `balances` is for customer
//! balances: the create-order that reserves (`commands::orders`), the
//! adjustment (`commands::inventory`), every change of an order's status
//! ([`follow_order`], which settlement by command, webhook, reconciler,
//! capture and cancel all call), a payment's life while the order awaits
//! it ([`hold_for_payment`], [`payment_ended`]) and the sweeper
//! ([`expire_reservations`]).
//!
//! A reservation is a pending transfer with a deadline; the ledger never
//! moves a deadline, so a reservation whose deadline changes (a payment
//! in flight, an authorization's `capture_before`) is renewed: voided
//! (`renewal`) and the same units reserved again in the same transaction
//! under the SKU's lock, each renewal under a key of its own.
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
use crate::domain::order::{Order, OrderStatus, StockReservation};
use crate::metrics::Metrics;
use crate::store::ledger::{Locked, NewTransfer, Transfer, TransferError, TransferKey};
use crate::store::orders::StockOfOrder;
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
        mark_released(tx, order_id).await?;
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
        key: Some(TransferKey::Service(key)),
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
    customer_limit: Option<i64>,
) -> Result<Result<Reservation, LimitReached>, StoreError> {
    let mut wanted = inventory::demand(&order.items);
    let (tracked, now) =
        store::inventory::tracked(tx, merchant_id, wanted.keys().map(String::as_str)).await?;
    wanted.retain(|sku, _| tracked.contains(sku));
    if let (Some(limit), false) = (customer_limit, wanted.is_empty()) {
        // The customer's orders are counted under a lock of their own, so
        // two of its orders racing each other are counted one after the
        // other; the count reads committed orders only, and this one
        // commits (or not) before the lock is let go.
        store::inventory::lock_customer(tx, merchant_id, &order.customer_id).await?;
        let open =
            store::inventory::open_reserving_orders(tx, merchant_id, &order.customer_id).await?;
        if open >= limit {
            return Ok(Err(LimitReached { open, limit }));
        }
    }
    if let Some(now) = now {
        let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365));
        order.stock_reserved_until = Some((now + ttl).trunc_subsecs(6));
        order.stock_reservation = Some(StockReservation::Reserved);
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
    Ok(Ok(Reservation {
        merchant_id,
        order_id: order.id,
        wanted,
        until: order.stock_reserved_until,
    }))
}

/// A customer's token asked for another reserving order while `open` of
/// its orders (at most `limit`, `ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS`)
/// await payment with stock reserved.
#[derive(Debug, Clone, Copy)]
pub struct LimitReached {
    /// Its unpaid orders holding stock.
    pub open: i64,
    /// How many it may hold.
    pub limit: i64,
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
    // The orders of reservations of these SKUs past their deadline are
    // locked first, waiting for any that is being paid or cancelled right
    // now: then their reservations are all voided below, and what this
    // order is refused for is what `GET /inventory/{sku}` shows. (This
    // transaction holds no stock row and no order another waits for: its
    // own order is new; orders are locked in id order.)
    let skus: Vec<&str> = r.wanted.keys().map(String::as_str).collect();
    let overdue = store::inventory::orders_overdue_on(tx, r.merchant_id, &skus).await?;
    store::orders::lock_ids(tx, &overdue).await?;
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
/// path that changes an order's status (`commands::settle::move_order`),
/// in its transaction, with the order locked and as it now is:
///
/// - **paid** (a payment succeeded, or a hold was captured, whole or in
///   part): its tracked SKUs leave the stock ([`sell`]): a reservation
///   is converted; without one (it lapsed, or the order reserved
///   nothing) the sale takes what is available and records the rest as
///   its `stock_shortfall`;
/// - **authorized**: the reservation is kept until the authorization's
///   deadline ([`hold_for_authorization`]): reserved, not sold;
/// - **cancelled**, or back to **awaiting payment** (its authorization
///   voided or expired): the reservation is released
///   (`order.stock_released`).
///
/// Returns the order as it then is. Repeating it changes nothing.
pub async fn follow_order(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    match order.status {
        OrderStatus::Paid => sell(tx, metrics, order, cause).await,
        OrderStatus::Authorized => hold_for_authorization(tx, metrics, order, cause).await,
        OrderStatus::Cancelled | OrderStatus::AwaitingPayment => {
            release(tx, metrics, order, cause).await
        }
        OrderStatus::Refunded => Ok(order),
    }
}

/// The merchant of an order's stock transfers.
fn merchant_of(skus: &BTreeMap<String, store::inventory::OrderSku>) -> Option<Uuid> {
    skus.values()
        .find_map(|s| s.reservations.first().map(|(r, _)| r.merchant_id))
}

/// The SKUs a paid order takes from the stock, with the merchant and how
/// many of each: those it reserved (a reserving order: what it reserved;
/// a SKU tracked only later is one the order came before), or, for an
/// order that reserved nothing, those of its SKUs tracked now (its lines
/// summed). SKUs it has for good already, or reported short, are not
/// taken again.
async fn to_sell(
    tx: &mut PgConnection,
    order: &Order,
    skus: &BTreeMap<String, store::inventory::OrderSku>,
) -> Result<Option<(Uuid, BTreeMap<String, i64>)>, StoreError> {
    let reported = |sku: &str| order.stock_shortfall.iter().any(|f| f.sku == sku);
    let (merchant, wanted) = match order.stock_reserved_until {
        Some(_) => (
            merchant_of(skus),
            skus.iter()
                .filter(|(_, s)| s.reserved_any())
                .map(|(sku, s)| (sku.clone(), s.reserved()))
                .collect::<BTreeMap<_, _>>(),
        ),
        None => {
            let (merchant, tracked) = store::inventory::tracked_of_order(tx, order.id).await?;
            let demand = inventory::demand(&order.items);
            (
                merchant,
                tracked
                    .into_iter()
                    .filter_map(|sku| demand.get(&sku).map(|q| (sku, *q)))
                    .collect(),
            )
        }
    };
    let wanted: BTreeMap<String, i64> = wanted
        .into_iter()
        .filter(|(sku, _)| !skus.get(sku).is_some_and(|s| s.settled()) && !reported(sku))
        .collect();
    Ok(merchant.filter(|_| !wanted.is_empty()).map(|m| (m, wanted)))
}

/// A paid order's tracked SKUs leave the stock: each open reservation is
/// converted (on hand and reserved both drop); a SKU without one (its
/// reservation lapsed before the payment, or the order reserved nothing)
/// is sold from what is available, never more
/// (`domain::inventory::late_take`), and what is missing is recorded as
/// the order's `stock_shortfall` with `order.stock_shortfall`: the
/// merchant decides (refund or backorder).
async fn sell(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    let skus = store::inventory::of_order(tx, order.id).await?;
    let Some((merchant_id, wanted)) = to_sell(tx, &order, &skus).await? else {
        return Ok(order);
    };
    let (mut stock, mut voids) = lock(
        tx,
        merchant_id,
        wanted.keys().map(String::as_str),
        Some(order.id),
    )
    .await?;
    // Read again under the locks: the voids just made are this order's too.
    let skus = store::inventory::of_order(tx, order.id).await?;
    let mut shortfall = order.stock_shortfall.clone();
    let before = shortfall.len();
    for (sku, quantity) in &wanted {
        let Some(s) = stock.get_mut(sku) else {
            continue;
        };
        if let Some(open) = skus.get(sku).and_then(|state| state.open()) {
            match store::ledger::post_pending(tx, open.id, Code::Conversion.as_str())
                .await
                .map_err(StoreError::from)?
            {
                Some(post) => {
                    s.totals = post.after;
                    continue;
                }
                // It reached its deadline between the lock and the post.
                None => {
                    let void = store::ledger::void(tx, open.id, Code::ReservationExpiry.as_str())
                        .await
                        .map_err(StoreError::from)?;
                    s.totals = void.after;
                    voids.push(void);
                }
            }
        }
        let (taken, missing) = inventory::late_take(*quantity, s.totals.available());
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
                sku: sku.clone(),
                missing,
            });
        }
    }
    announce_released(tx, metrics, &voids, cause).await?;
    let reservation = order.stock_reservation.map(|_| match shortfall.is_empty() {
        true => StockReservation::Converted,
        false => StockReservation::Short,
    });
    let order = store::orders::set_stock(
        tx,
        order.id,
        &StockOfOrder {
            until: order.stock_reserved_until,
            reservation,
            shortfall: &shortfall,
        },
    )
    .await?;
    if shortfall.len() > before {
        crate::events::order_stock(tx, metrics, &order, EventType::OrderStockShortfall, cause)
            .await?;
    }
    Ok(order)
}

/// An authorized order keeps its units reserved, not sold, for as long
/// as its authorization lasts: the reservation is renewed until the
/// payment's `capture_before` (which the order shows as its
/// `stock_reserved_until`). A capture sells them, a void, an expiry or a
/// cancel releases them ([`follow_order`]).
async fn hold_for_authorization(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: Order,
    cause: Cause,
) -> Result<Order, StoreError> {
    if order.stock_reserved_until.is_none() {
        return Ok(order);
    }
    let held = store::payments::live_attempt(tx, order.id)
        .await?
        .filter(|p| p.status == crate::domain::payment::PaymentStatus::RequiresCapture);
    let Some(held) = held else {
        return Ok(order);
    };
    // A provider that names no deadline holds an authorization for up to
    // 7 days (the card networks' usual window).
    let until = held
        .capture_before
        .unwrap_or_else(|| held.updated_at + chrono::Duration::days(7))
        .trunc_subsecs(6);
    let reserved = renew(
        tx,
        metrics,
        &order,
        Renewal {
            until,
            purpose: "authorization",
            payment_id: held.id,
        },
        cause,
    )
    .await?;
    store::orders::set_stock(
        tx,
        order.id,
        &StockOfOrder {
            until: Some(until),
            reservation: match reserved {
                true => Some(StockReservation::Reserved),
                false => order.stock_reservation,
            },
            shortfall: &order.stock_shortfall,
        },
    )
    .await
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
        .filter(|(_, s)| s.open().is_some())
        .map(|(sku, _)| sku.as_str())
        .collect();
    if open.is_empty() {
        return Ok(order);
    }
    let (_, mut voids) = lock(tx, merchant_id, open.iter().copied(), Some(order.id)).await?;
    let skus = store::inventory::of_order(tx, order.id).await?;
    for open in skus.values().filter_map(|s| s.open()) {
        let void = store::ledger::void(tx, open.id, Code::Release.as_str())
            .await
            .map_err(StoreError::from)?;
        voids.push(void);
    }
    announce_released(tx, metrics, &voids, cause).await?;
    store::orders::get_by_id(tx, order.id)
        .await?
        .ok_or_else(|| Corrupt::vanished("order", order.id))
}

/// A renewal of an order's reservation: until when, why, for which
/// payment (its key, `store::inventory::renewal_key`).
struct Renewal {
    until: chrono::DateTime<chrono::Utc>,
    purpose: &'static str,
    payment_id: Uuid,
}

/// Renews the order's reservation of each SKU it reserved and has not
/// yet for good: an open one is voided (`renewal`) and the same units
/// reserved again until `r.until` in the same transaction, under the
/// SKU's lock (so they are never free in between); one that lapsed
/// (voided on its expiry, or past its deadline now) is reserved again
/// only if the stock has all of it now, and is otherwise left to the
/// payment's sale. A deadline already past releases the reservation as
/// expired instead. Returns whether the order holds a reservation now.
async fn renew(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: &Order,
    r: Renewal,
    cause: Cause,
) -> Result<bool, StoreError> {
    let skus = store::inventory::of_order(tx, order.id).await?;
    let Some(merchant_id) = merchant_of(&skus) else {
        return Ok(false);
    };
    let todo: Vec<&str> = skus
        .iter()
        .filter(|(_, s)| s.reserved_any() && !s.settled())
        .map(|(sku, _)| sku.as_str())
        .collect();
    if todo.is_empty() {
        return Ok(false);
    }
    let (mut stock, mut voids) =
        lock(tx, merchant_id, todo.iter().copied(), Some(order.id)).await?;
    let skus = store::inventory::of_order(tx, order.id).await?;
    let mut reserved = false;
    for sku in todo {
        let (Some(s), Some(state)) = (stock.get_mut(sku), skus.get(sku)) else {
            continue;
        };
        let live = r.until > s.locked.now;
        if let Some(open) = state.open() {
            let code = match live {
                true => Code::Renewal,
                false => Code::ReservationExpiry,
            };
            let void = store::ledger::void(tx, open.id, code.as_str())
                .await
                .map_err(StoreError::from)?;
            s.totals = void.after;
            if !live {
                voids.push(void);
                continue;
            }
        } else if !live || s.totals.available() < state.reserved() {
            continue;
        }
        let key = store::inventory::renewal_key(order.id, sku, r.purpose, r.payment_id);
        let sold = s.account.system(Code::Reservation.shape().2);
        let mut hold = transfer(
            &s.account,
            &sold,
            Code::Reservation,
            state.reserved(),
            Some(order.id),
            &key,
        );
        hold.expires_at = Some(r.until);
        let placed = store::ledger::insert(tx, &hold)
            .await
            .map_err(StoreError::from)?;
        s.totals = placed.after;
        reserved = true;
    }
    announce_released(tx, metrics, &voids, cause).await?;
    Ok(reserved)
}

/// A payment of a reserving order begins (its attempt is created, in the
/// same transaction, with the order locked): its reservation stops
/// lapsing while the payment is in flight, also while it waits for its
/// customer (3-D Secure), renewed until
/// [`inventory::payment_in_flight_until`]; it ends with the payment
/// ([`payment_ended`], or the order's move when it succeeds or is
/// authorized). A reservation that lapsed before is taken again if the
/// stock has it all. The order keeps its `stock_reserved_until`, the
/// deadline that applies again if the payment fails.
pub async fn hold_for_payment(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order: &Order,
    payment_id: Uuid,
) -> Result<(), StoreError> {
    if order.stock_reserved_until.is_none() {
        return Ok(());
    }
    let reserved = renew(
        tx,
        metrics,
        order,
        Renewal {
            until: inventory::payment_in_flight_until(),
            purpose: "payment",
            payment_id,
        },
        Cause::Command,
    )
    .await?;
    if reserved && order.stock_reservation != Some(StockReservation::Reserved) {
        store::orders::set_stock(
            tx,
            order.id,
            &StockOfOrder {
                until: order.stock_reserved_until,
                reservation: Some(StockReservation::Reserved),
                shortfall: &order.stock_shortfall,
            },
        )
        .await?;
    }
    Ok(())
}

/// A payment of a reserving order ended without paying or authorizing
/// it (failed, or its hold ended before it was authorized here), in the
/// transaction that records it, with the order locked: the reservation
/// held for that payment goes back to the order's own deadline, or, if
/// that has passed, is released as expired (`order.stock_released`).
pub async fn payment_ended(
    tx: &mut PgConnection,
    metrics: &Metrics,
    order_id: Uuid,
    payment_id: Uuid,
    cause: Cause,
) -> Result<(), StoreError> {
    let order = store::orders::get_by_id(tx, order_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("order", order_id))?;
    let Some(until) = order.stock_reserved_until else {
        return Ok(());
    };
    if order.status != OrderStatus::AwaitingPayment {
        return Ok(());
    }
    let skus = store::inventory::of_order(tx, order_id).await?;
    let held_for_it = skus.iter().any(|(sku, s)| {
        s.open().is_some_and(|open| {
            open.idempotency_key.as_deref()
                == Some(&store::inventory::renewal_key(
                    order_id, sku, "payment", payment_id,
                ))
        })
    });
    if !held_for_it {
        return Ok(());
    }
    let reserved = renew(
        tx,
        metrics,
        &order,
        Renewal {
            until,
            purpose: "after",
            payment_id,
        },
        cause,
    )
    .await?;
    if !reserved {
        mark_released(tx, order_id).await?;
    }
    Ok(())
}

/// An order none of whose reservations is open any more reads
/// `stock_reservation: released`, unless its stock was sold.
async fn mark_released(tx: &mut PgConnection, order_id: Uuid) -> Result<(), StoreError> {
    let skus = store::inventory::of_order(tx, order_id).await?;
    if skus.values().any(|s| s.open().is_some() || s.settled()) {
        return Ok(());
    }
    let order = store::orders::get_by_id(tx, order_id)
        .await?
        .ok_or_else(|| Corrupt::vanished("order", order_id))?;
    if order.stock_reservation != Some(StockReservation::Reserved) {
        return Ok(());
    }
    store::orders::set_stock(
        tx,
        order_id,
        &StockOfOrder {
            until: order.stock_reserved_until,
            reservation: Some(StockReservation::Released),
            shortfall: &order.stock_shortfall,
        },
    )
    .await?;
    Ok(())
}

/// The sweeper's pass over reservations past their deadline: for each
/// order that has one (at most `limit`), the order is locked, then its
/// stock, and what is overdue voided with one `order.stock_released` per
/// order. A reservation stops counting at its deadline without this;
/// this writes its void, so the ledger and the events say so. A
/// reservation held for a payment in flight has no deadline to pass.
/// Returns how many orders it looked at.
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
        let open: Vec<&str> = skus
            .iter()
            .filter(|(_, s)| s.open().is_some())
            .map(|(sku, _)| sku.as_str())
            .collect();
        let (_, voids) = lock(&mut tx, *merchant_id, open, Some(*order_id)).await?;
        announce_released(&mut tx, metrics, &voids, Cause::Reconciler).await?;
        tx.commit().await?;
    }
    Ok(due.len())
}
