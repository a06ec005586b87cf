//! SQL of orders. Every read is scoped by merchant: another merchant's order
//! is indistinguishable from one that does not exist.

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgExecutor, PgPool, Row};
use uuid::Uuid;

use super::{column, Corrupt, StoreError};
use crate::domain::order::{Order, OrderStatus};
use crate::idempotency::persistence::{RecordId, StoredResponse};

/// The columns every read of a order returns, in `from_row`'s order.
macro_rules! order_columns {
    () => {
        "id, customer_id, items, amount, currency, status, metadata, created_at, updated_at"
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
        currency: row.try_get("currency")?,
        status: OrderStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("order status", &status))?,
        metadata: serde_json::from_value(row.try_get("metadata")?)
            .map_err(Corrupt::json("order metadata"))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Inserts an order and completes its idempotency record in one statement,
/// which PostgreSQL runs atomically: the order exists exactly when the record
/// holds its response, and only if the lease was still ours. One round trip
/// where a transaction would take four (BEGIN, INSERT, UPDATE, COMMIT). The
/// record names its order, as a batched create's does ([`INSERT_CLAIMING`]).
pub(crate) const INSERT_COMPLETING: &str = concat!(
    "WITH done AS (
        UPDATE idempotency_record SET resource_id = $1, ",
    crate::idempotency::persistence::completed!("$9", "$10", "$11"),
    " WHERE merchant_id = $2 AND idempotency_key = $12 AND lease_token = $13
           AND state = 'executing'
        RETURNING 1)
     INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status,
                         metadata, created_at, updated_at)
     SELECT $1, $2, $3, $4, $5, $6, 'awaiting_payment', $7, $8, $8 WHERE EXISTS (SELECT 1 FROM done)"
);

/// Binds `$1`..`$11` of the two order inserts: the order's columns, then
/// the stored response's status, body and location.
fn bind_order<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    merchant_id: Uuid,
    order: &'q Order,
    response: &'q StoredResponse,
) -> Result<sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>, StoreError> {
    let items = serde_json::to_value(&order.items).map_err(Corrupt::json("order items"))?;
    let metadata =
        serde_json::to_value(&order.metadata).map_err(Corrupt::json("order metadata"))?;
    let status = crate::store::Corrupt::status_column(response.status)?;
    Ok(query
        .bind(order.id)
        .bind(merchant_id)
        .bind(&order.customer_id)
        .bind(items)
        .bind(order.amount)
        .bind(&order.currency)
        .bind(metadata)
        .bind(order.created_at)
        .bind(status)
        .bind(&response.body)
        .bind(&response.location))
}

/// See [`INSERT_COMPLETING`]. `false` (and nothing written) if another
/// process took the command over.
pub(crate) async fn insert_completing(
    pool: &PgPool,
    record: &RecordId,
    lease_token: Uuid,
    order: &Order,
    response: &StoredResponse,
) -> Result<bool, StoreError> {
    let done = bind_order(
        sqlx::query(INSERT_COMPLETING),
        record.merchant_id,
        order,
        response,
    )?
    .bind(&record.key)
    .bind(lease_token)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The whole of a create-order in one statement, when its key is new: the
/// idempotency record inserted already completed with the response, and
/// the order, inserted only if the record was (`ON CONFLICT DO NOTHING`:
/// a concurrent duplicate waits on the unique index until this commits,
/// then finds the key taken). One round trip, one synchronous commit.
pub const INSERT_CLAIMING: &str = "WITH claim AS (
        INSERT INTO idempotency_record
               (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, resource_id, response_status, response_body, response_location,
                expires_at)
        VALUES ($2, $12, $13, $14, $15, 'completed', 'finished', $1, $9, $10, $11,
                now() + $16::bigint * interval '1 millisecond')
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
        RETURNING 1)
     INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status,
                         metadata, created_at, updated_at)
     SELECT $1, $2, $3, $4, $5, $6, 'awaiting_payment', $7, $8, $8 WHERE EXISTS (SELECT 1 FROM claim)";

/// [`insert_claiming`] of one request of a batch (see [`ClaimingOrder`]).
pub(crate) async fn insert_claiming_one(
    db: impl PgExecutor<'_>,
    row: &ClaimingOrder,
) -> Result<bool, StoreError> {
    let record = crate::idempotency::persistence::NewRecord {
        id: &row.id,
        fingerprint: &row.fingerprint,
        command: &row.command,
        request: &row.request,
        // Completed at once: no lease.
        lease: std::time::Duration::ZERO,
        ttl: row.ttl,
    };
    insert_claiming(db, &record, &row.order, &row.response).await
}

/// See [`INSERT_CLAIMING`]. `false`: the key already has a record (live,
/// expired, or another request's), nothing was written, and the caller
/// goes through the engine's full protocol.
pub(crate) async fn insert_claiming(
    db: impl PgExecutor<'_>,
    record: &crate::idempotency::persistence::NewRecord<'_>,
    order: &Order,
    response: &StoredResponse,
) -> Result<bool, StoreError> {
    let done = bind_order(
        sqlx::query(INSERT_CLAIMING),
        record.id.merchant_id,
        order,
        response,
    )?
    .bind(&record.id.key)
    .bind(record.fingerprint)
    .bind(record.command)
    .bind(record.request)
    .bind(crate::idempotency::persistence::millis(record.ttl))
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// [`INSERT_CLAIMING`] for many requests at once (natural batching, see
/// `store::order_batch`): each row claims its key and, where the claim
/// took, inserts its order; all of it one statement and one commit. Rows
/// come sorted by key, so two batches lock keys in the same order and
/// cannot deadlock; keys are unique within a batch. Returns the ids of the
/// orders inserted: a request whose order is missing found its key taken.
pub(crate) const INSERT_CLAIMING_MANY: &str = "WITH input AS (
        SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::jsonb[], $5::bigint[],
                             $6::text[], $7::jsonb[], $8::timestamptz[], $9::smallint[],
                             $10::bytea[], $11::text[], $12::text[], $13::bytea[], $14::text[],
                             $15::jsonb[], $16::bigint[])
               WITH ORDINALITY AS i (id, merchant_id, customer_id, items, amount, currency,
                                     metadata, created_at, response_status, response_body,
                                     response_location, idempotency_key, fingerprint, command,
                                     request, ttl_ms, n)),
     claim AS (
        INSERT INTO idempotency_record
               (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, resource_id, response_status, response_body, response_location,
                expires_at)
        SELECT merchant_id, idempotency_key, fingerprint, command, request, 'completed',
               'finished', id, response_status, response_body, response_location,
               now() + ttl_ms * interval '1 millisecond'
          FROM input ORDER BY n
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
        RETURNING merchant_id, idempotency_key),
     created AS (
        INSERT INTO orders (id, merchant_id, customer_id, items, amount, currency, status,
                            metadata, created_at, updated_at)
        SELECT i.id, i.merchant_id, i.customer_id, i.items, i.amount, i.currency,
               'awaiting_payment', i.metadata, i.created_at, i.created_at
          FROM input i JOIN claim c USING (merchant_id, idempotency_key)
        RETURNING id)
     SELECT id FROM created";

/// One request of a batch: what [`insert_claiming`] takes, owned.
pub struct ClaimingOrder {
    /// The key and its scope.
    pub id: RecordId,
    /// SHA-256 of the request.
    pub fingerprint: Vec<u8>,
    /// Command name, for resumption.
    pub command: String,
    /// Command input, for resumption.
    pub request: serde_json::Value,
    /// The record's lifetime.
    pub ttl: std::time::Duration,
    /// The order to insert.
    pub order: Order,
    /// Its answer, stored with the record.
    pub response: StoredResponse,
}

/// See [`INSERT_CLAIMING_MANY`]. For each row, in order: whether its order
/// was inserted (`false`: its key was taken, nothing of it was written).
pub(crate) async fn insert_claiming_many(
    db: impl PgExecutor<'_>,
    rows: &[ClaimingOrder],
) -> Result<Vec<bool>, StoreError> {
    let ids = column(rows, |r| r.order.id);
    let merchants = column(rows, |r| r.id.merchant_id);
    let customers = column(rows, |r| r.order.customer_id.as_str());
    let amounts = column(rows, |r| r.order.amount);
    let currencies = column(rows, |r| r.order.currency.as_str());
    let created = column(rows, |r| r.order.created_at);
    let bodies = column(rows, |r| r.response.body.as_slice());
    let locations = column(rows, |r| r.response.location.as_deref());
    let keys = column(rows, |r| r.id.key.as_str());
    let fingerprints = column(rows, |r| r.fingerprint.as_slice());
    let commands = column(rows, |r| r.command.as_str());
    let requests = column(rows, |r| &r.request);
    let ttls = column(rows, |r| crate::idempotency::persistence::millis(r.ttl));
    let items = column(rows, |r| serde_json::to_value(&r.order.items))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(Corrupt::json("order items"))?;
    let metadata = column(rows, |r| serde_json::to_value(&r.order.metadata))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(Corrupt::json("order metadata"))?;
    let statuses = column(rows, |r| Corrupt::status_column(r.response.status))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let inserted: Vec<Uuid> = sqlx::query_scalar(INSERT_CLAIMING_MANY)
        .bind(&ids)
        .bind(&merchants)
        .bind(&customers)
        .bind(&items)
        .bind(&amounts)
        .bind(&currencies)
        .bind(&metadata)
        .bind(&created)
        .bind(&statuses)
        .bind(&bodies)
        .bind(&locations)
        .bind(&keys)
        .bind(&fingerprints)
        .bind(&commands)
        .bind(&requests)
        .bind(&ttls)
        .fetch_all(db)
        .await?;
    Ok(ids.iter().map(|id| inserted.contains(id)).collect())
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
pub(crate) const SET_STATUS: &str = concat!(
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
pub(crate) const LOCK_BY_ID: &str = concat!(
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
        "SELECT o.id, o.customer_id, o.items, o.amount, o.currency, o.status, o.metadata,
                o.created_at, o.updated_at FROM orders o",
        "o",
        "o.customer_id",
        merchant_id,
        page,
        from_row,
    )
    .await
}
