//! SQL of orders. Every read is scoped by merchant: another merchant's order
//! is indistinguishable from one that does not exist.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgExecutor, PgPool, Row};
use uuid::Uuid;

use super::{form, Corrupt, StoreError};
use crate::domain::order::{Order, OrderStatus, StockReservation};
use crate::idempotency::persistence::{millis, RecordId};
use crate::idempotency::{ClaimingCompleted, Completing};

/// The columns every read of a order returns, in `from_row`'s order.
/// `amount_captured` and `amount_refunded` are read from the order's
/// succeeded payment (at most one: `payment_attempt_one_live_per_order`),
/// so they are what its payment and refunds say at every read, whichever
/// path moved them.
macro_rules! order_columns {
    () => {
        "id, customer_id, items, amount, currency, status, metadata, stock_reserved_until,
         stock_reservation, stock_shortfall, created_at, updated_at,
         (SELECT p.amount_captured FROM payment_attempt p
           WHERE p.order_id = orders.id AND p.status = 'succeeded') AS amount_captured,
         (SELECT p.refunded_amount FROM payment_attempt p
           WHERE p.order_id = orders.id AND p.status = 'succeeded') AS amount_refunded"
    };
}
pub(crate) use order_columns;

/// Reads an order selected with [`order_columns`].
pub(crate) fn from_row(row: &PgRow) -> Result<Order, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(Order {
        id: row.try_get("id")?,
        customer_id: row.try_get("customer_id")?,
        items: serde_json::from_value(row.try_get("items")?)
            .map_err(Corrupt::json("order items"))?,
        amount: row.try_get("amount")?,
        amount_captured: row
            .try_get::<Option<i64>, _>("amount_captured")?
            .unwrap_or(0),
        amount_refunded: row
            .try_get::<Option<i64>, _>("amount_refunded")?
            .unwrap_or(0),
        currency: row.try_get("currency")?,
        status: OrderStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("order status", &status))?,
        metadata: serde_json::from_value(row.try_get("metadata")?)
            .map_err(Corrupt::json("order metadata"))?,
        stock_reserved_until: row.try_get("stock_reserved_until")?,
        stock_reservation: row
            .try_get::<Option<String>, _>("stock_reservation")?
            .map(|s| {
                StockReservation::parse(&s).ok_or_else(|| Corrupt::unknown("stock reservation", &s))
            })
            .transpose()?,
        stock_shortfall: serde_json::from_value(row.try_get("stock_shortfall")?)
            .map_err(Corrupt::json("order stock shortfall"))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// The columns of a new order, in [`INSERT_COMPLETING`]'s and
/// [`INSERT_CLAIMING`]'s order.
macro_rules! new_order_columns {
    () => {
        "(id, merchant_id, customer_id, items, amount, currency, status, metadata, created_at,
          updated_at)"
    };
}

/// Inserts an order and completes its idempotency record in one statement,
/// which PostgreSQL runs atomically: the order exists exactly when the record
/// holds its response, and only if the lease was still ours. One round trip
/// where a transaction would take four (BEGIN, INSERT, UPDATE, COMMIT). The
/// record names its order, as a claiming create's does ([`INSERT_CLAIMING`]).
pub(crate) const INSERT_COMPLETING: &str = concat!(
    "WITH done AS (
        UPDATE idempotency_record SET resource_id = $1, ",
    crate::idempotency::persistence::completed!("$9", "$10", "$11"),
    " WHERE merchant_id = $2 AND idempotency_key = $12 AND lease_token = $13
           AND state = 'executing'
        RETURNING 1)
     INSERT INTO orders ",
    new_order_columns!(),
    "
     SELECT $1, $2, $3, $4, $5, $6, 'awaiting_payment', $7, $8, $8 WHERE EXISTS (SELECT 1 FROM done)"
);

/// See [`INSERT_COMPLETING`]: the order, with the completion of the record
/// held under `completion`. `false` (and nothing written) if another process
/// took the command over.
pub(crate) async fn insert_completing(
    pool: &PgPool,
    completion: &Completing,
    order: &Order,
) -> Result<bool, StoreError> {
    let record = completion.fence().record();
    let response = completion.response();
    let done = sqlx::query(INSERT_COMPLETING)
        .bind(order.id)
        .bind(record.merchant_id)
        .bind(&order.customer_id)
        .bind(items_of(order)?)
        .bind(order.amount)
        .bind(&order.currency)
        .bind(metadata_of(order)?)
        .bind(order.created_at)
        .bind(Corrupt::status_column(response.status)?)
        .bind(&response.body)
        .bind(&response.location)
        .bind(&record.key)
        .bind(completion.fence().token())
        .execute(pool)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The order's items as their column holds them.
fn items_of(order: &Order) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(&order.items).map_err(Corrupt::json("order items"))
}

/// The order's metadata as its column holds it.
fn metadata_of(order: &Order) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(&order.metadata).map_err(Corrupt::json("order metadata"))
}

row_statement! {
    /// The whole of a create-order in one statement, when its key is new, for
    /// each row ([`ClaimingOrder`]; `$1`..`$16`, the count of rows `$17`):
    /// the idempotency record inserted already completed with the response,
    /// and the order, inserted only if the record was (`ON CONFLICT DO
    /// NOTHING`: a concurrent duplicate waits on the unique index until this
    /// commits, then finds the key taken). One round trip, one synchronous
    /// commit, for any number of rows (natural batching, see
    /// `store::order_batch`). Rows come sorted by key, so two batches lock
    /// keys in the same order and cannot deadlock; keys are unique within a
    /// batch. Returns the ids of the orders inserted: a row whose order is
    /// missing found its key taken.
    INSERT_CLAIMING, INSERT_CLAIMING_MANY, "$17";
    fn claiming_columns(r: &ClaimingOrder) {
        "$1::uuid" id = r.order.id,
        "$2::uuid" merchant_id = r.claim.record().merchant_id,
        "$3::text" customer_id = r.order.customer_id.as_str(),
        "$4::jsonb" items = &r.items,
        "$5::bigint" amount = r.order.amount,
        "$6::text" currency = r.order.currency.as_str(),
        "$7::jsonb" metadata = &r.metadata,
        "$8::timestamptz" created_at = r.order.created_at,
        "$9::smallint" response_status = r.response_status,
        "$10::bytea" response_body = r.claim.response().body.as_slice(),
        "$11::text" response_location = r.claim.response().location.as_deref(),
        "$12::text" idempotency_key = r.claim.record().key.as_str(),
        "$13::bytea" fingerprint = r.claim.intent().fingerprint(),
        "$14::text" command = r.claim.intent().command(),
        "$15::jsonb" request = r.claim.intent().input(),
        "$16::bigint" ttl_ms = millis(r.claim.intent().ttl()),
    }
    ",
     claim AS (
        INSERT INTO idempotency_record
               (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, resource_id, response_status, response_body, response_location,
                expires_at)
        SELECT i.merchant_id, i.idempotency_key, i.fingerprint, i.command, i.request,
               'completed', 'finished', i.id, i.response_status, i.response_body,
               i.response_location, now() + i.ttl_ms * interval '1 millisecond'
          FROM i ORDER BY i.n
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
        RETURNING merchant_id, idempotency_key),
     created AS (
        INSERT INTO orders ",
    new_order_columns!(),
    "
        SELECT i.id, i.merchant_id, i.customer_id, i.items, i.amount, i.currency,
               'awaiting_payment', i.metadata, i.created_at, i.created_at
          FROM i JOIN claim c USING (merchant_id, idempotency_key)
        RETURNING id)
     SELECT id FROM created"
}

/// One create-order of [`INSERT_CLAIMING`]: the order, and the fence of
/// the record it claims.
pub struct ClaimingOrder {
    claim: ClaimingCompleted,
    order: Order,
    items: serde_json::Value,
    metadata: serde_json::Value,
    response_status: i16,
}

impl ClaimingOrder {
    /// `order`, to insert with the record `claim` says.
    pub fn new(claim: ClaimingCompleted, order: Order) -> Result<Self, StoreError> {
        Ok(ClaimingOrder {
            items: items_of(&order)?,
            metadata: metadata_of(&order)?,
            response_status: Corrupt::status_column(claim.response().status)?,
            claim,
            order,
        })
    }

    /// The record it claims.
    pub fn record(&self) -> &RecordId {
        self.claim.record()
    }
}

/// [`insert_claiming`] of one row: whether its order was inserted.
pub(crate) async fn insert_claiming_one(
    db: impl PgExecutor<'_>,
    row: &ClaimingOrder,
) -> Result<bool, StoreError> {
    Ok(insert_claiming(db, &[row]).await?.contains(&true))
}

/// See [`INSERT_CLAIMING`]. For each row, in order: whether its order
/// was inserted (`false`: its key was taken, nothing of it was written).
pub(crate) async fn insert_claiming(
    db: impl PgExecutor<'_>,
    rows: &[&ClaimingOrder],
) -> Result<Vec<bool>, StoreError> {
    let sql = form(rows, (INSERT_CLAIMING, INSERT_CLAIMING_MANY));
    let inserted: Vec<Uuid> = claiming_columns(rows, sqlx::query(sql))
        .fetch_all(db)
        .await?
        .iter()
        .map(|row| row.try_get("id"))
        .collect::<Result<_, _>>()?;
    Ok(rows
        .iter()
        .map(|r| inserted.contains(&r.order.id))
        .collect())
}

/// Inserts an order in the caller's transaction (see `insert`); a
/// constant, so that `oncepay-bench` runs it as its same-SQL floor.
pub const INSERT: &str =
    "INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status,
                         metadata, stock_reserved_until, created_at, updated_at,
                         stock_reservation)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11)";

/// Inserts an order inside the caller's transaction: a create-order that
/// reserves stock writes its order, its reservations and its answer in
/// one transaction (the fast paths above write no stock).
pub(crate) async fn insert(
    tx: &mut PgConnection,
    merchant_id: Uuid,
    order: &Order,
) -> Result<(), StoreError> {
    sqlx::query(INSERT)
        .bind(order.id)
        .bind(merchant_id)
        .bind(&order.customer_id)
        .bind(items_of(order)?)
        .bind(order.amount)
        .bind(&order.currency)
        .bind(order.status.as_str())
        .bind(metadata_of(order)?)
        .bind(order.stock_reserved_until)
        .bind(order.created_at)
        .bind(order.stock_reservation.map(StockReservation::as_str))
        .execute(tx)
        .await?;
    Ok(())
}

/// Where an order's stock stands, as [`set_stock`] writes it.
#[derive(Debug, Clone)]
pub struct StockOfOrder<'a> {
    /// Until when its reservation counts (when no payment is in flight).
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Where its reservation stands.
    pub reservation: Option<StockReservation>,
    /// What its payment could not take from the stock.
    pub shortfall: &'a [crate::domain::inventory::Shortfall],
}

/// Records where an order's stock stands, and returns the order.
pub(crate) async fn set_stock(
    tx: &mut PgConnection,
    id: Uuid,
    stock: &StockOfOrder<'_>,
) -> Result<Order, StoreError> {
    let shortfall =
        serde_json::to_value(stock.shortfall).map_err(Corrupt::json("order stock shortfall"))?;
    let row = sqlx::query(concat!(
        "UPDATE orders SET stock_reserved_until = $2, stock_reservation = $3,
                stock_shortfall = $4, updated_at = now()
          WHERE id = $1 RETURNING ",
        order_columns!()
    ))
    .bind(id)
    .bind(stock.until)
    .bind(stock.reservation.map(StockReservation::as_str))
    .bind(shortfall)
    .fetch_one(tx)
    .await?;
    from_row(&row)
}

/// Reads an order by id alone (an internal read: the caller reached it
/// through a row it already scoped, a stock transfer).
pub(crate) async fn get_by_id(
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<Option<Order>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Row-locks those of the orders `ids` that no other transaction holds,
/// without waiting for the others: for a writer that already holds stock
/// locks, which may not wait for an order's lock (orders are locked
/// before stock everywhere). Returns the ids locked.
pub(crate) async fn try_lock_ids(
    tx: &mut PgConnection,
    ids: &[Uuid],
) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM orders WHERE id = ANY($1) ORDER BY id FOR UPDATE SKIP LOCKED",
    )
    .bind(ids)
    .fetch_all(tx)
    .await?)
}

/// Row-locks the orders `ids`, waiting for those another transaction
/// holds, in id order (so two callers never wait for each other in a
/// cycle). Only for a caller that holds no stock row yet.
pub(crate) async fn lock_ids(tx: &mut PgConnection, ids: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT id FROM orders WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(ids)
        .fetch_all(tx)
        .await?;
    Ok(())
}

/// Reads one of the merchant's orders.
pub async fn get(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<Order>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1 AND merchant_id = $2"
    ))
    .bind(id)
    .bind(merchant_id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Locks one of a merchant's orders.
pub const LOCK: &str = concat!(
    "SELECT ",
    order_columns!(),
    " FROM orders WHERE id = $1 AND merchant_id = $2 FOR UPDATE"
);

/// Reads and row-locks one of the merchant's orders until the transaction
/// ends: payments, refunds and cancels of one order go one at a time.
pub async fn lock(
    tx: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<Order>, StoreError> {
    let row = sqlx::query(LOCK)
        .bind(id)
        .bind(merchant_id)
        .fetch_optional(tx)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// Sets an order's status.
pub const SET_STATUS: &str = concat!(
    "UPDATE orders SET status = $2, updated_at = now() WHERE id = $1 RETURNING ",
    order_columns!()
);

/// Sets an order's status and returns it as it now is.
pub(crate) async fn set_status(
    tx: &mut PgConnection,
    id: Uuid,
    status: OrderStatus,
) -> Result<Order, StoreError> {
    let row = sqlx::query(SET_STATUS)
        .bind(id)
        .bind(status.as_str())
        .fetch_one(tx)
        .await?;
    from_row(&row)
}

/// Locks an order by id.
pub const LOCK_BY_ID: &str = concat!(
    "SELECT ",
    order_columns!(),
    " FROM orders WHERE id = $1 FOR UPDATE"
);

/// Row-locks an order by id alone, for internal settlement (the caller
/// reached it through a payment it already scoped). Locks are always taken
/// order first, then payment, then refund, so settlements never deadlock.
pub(crate) async fn lock_by_id(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<Option<Order>, StoreError> {
    let row = sqlx::query(LOCK_BY_ID).bind(id).fetch_optional(tx).await?;
    row.as_ref().map(from_row).transpose()
}

/// One page of the merchant's rows, newest first, and whether there are more
/// (see `store::pages`).
pub async fn list(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    page: &super::pages::PageRequest,
) -> Result<(Vec<Order>, bool), StoreError> {
    super::pages::fetch(
        pool,
        concat!("SELECT ", order_columns!(), " FROM orders"),
        "orders",
        "orders.customer_id",
        merchant_id,
        page,
        from_row,
    )
    .await
}

/// The customer of one of the merchant's orders (`None`: no such order).
/// An order's customer never changes, so what this reads stays true for
/// the rest of a request: a customer token's ownership check
/// (`http::ownership`) needs no lock.
pub async fn customer_of(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<String>, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT customer_id FROM orders WHERE id = $1 AND merchant_id = $2")
            .bind(id)
            .bind(merchant_id)
            .fetch_optional(pool)
            .await?,
    )
}

/// The status of one of the merchant's orders (`None`: no such order),
/// unlocked: what a customer's cancel is refused for before its key is
/// claimed; the command decides again under the order's lock.
pub async fn status_of(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<crate::domain::order::OrderStatus>, StoreError> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM orders WHERE id = $1 AND merchant_id = $2")
            .bind(id)
            .bind(merchant_id)
            .fetch_optional(pool)
            .await?;
    status
        .map(|status| {
            crate::domain::order::OrderStatus::parse(&status)
                .ok_or_else(|| Corrupt::unknown("order status", &status))
        })
        .transpose()
}
