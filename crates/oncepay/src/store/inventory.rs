//! Stock as the API shows it, on the ledger engine (`store::ledger`): a
//! SKU's stock account, its item view, the merchant's list of tracked
//! SKUs, the stock transfers of an order, and the orders whose
//! reservations are past their deadline (for the sweeper).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::ledger::{self, Transfer};
use super::StoreError;
use crate::domain::inventory::StockItem;
use crate::domain::ledger::stock::{Code, HOLDER};
use crate::domain::ledger::{AccountRef, Ledger, Phase, Totals};

/// The stock account of the merchant's `sku`.
pub fn account(merchant_id: Uuid, sku: &str) -> AccountRef {
    AccountRef::holder(merchant_id, Ledger::Stock, sku, HOLDER)
}

/// The columns [`item_of_row`] reads, of the account alias `a`; reserved
/// stock past its deadline no longer counts, swept or not.
const ITEM_COLUMNS: &str = "a.unit, a.posted, a.held, a.updated_at,
    COALESCE((SELECT sum(o.amount) FROM ledger_open_pending o
               WHERE o.account_id = a.id AND o.expires_at <= statement_timestamp()), 0)::bigint
        AS overdue";

fn item_of_row(row: &sqlx::postgres::PgRow) -> Result<StockItem, StoreError> {
    let totals = Totals {
        posted: row.try_get("posted")?,
        held: row.try_get("held")?,
    };
    let sku: String = row.try_get("unit")?;
    let updated_at: DateTime<Utc> = row.try_get("updated_at")?;
    Ok(StockItem::of(
        &sku,
        totals.balance(row.try_get("overdue")?),
        updated_at,
    ))
}

/// The merchant's `sku`, if tracked (it has had an adjustment).
pub async fn item(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    sku: &str,
) -> Result<Option<StockItem>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {ITEM_COLUMNS} FROM ledger_account a WHERE a.id = $1"
    ))
    .bind(account(merchant_id, sku).id())
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(item_of_row).transpose()
}

/// Which of the merchant's `skus` are tracked, and the database's clock
/// (see [`tracked`]).
pub const TRACKED: &str = "SELECT a.unit, statement_timestamp() AS now FROM ledger_account a
      WHERE a.id = ANY($1) ORDER BY a.unit COLLATE \"C\"";

/// Which of the merchant's `skus` are tracked (in SKU order), read
/// without a lock, and the database's clock. A SKU is tracked from its
/// first adjustment on and never stops being tracked.
pub async fn tracked(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    skus: impl IntoIterator<Item = &str>,
) -> Result<(Vec<String>, Option<DateTime<Utc>>), StoreError> {
    let ids: Vec<Uuid> = skus
        .into_iter()
        .map(|sku| account(merchant_id, sku).id())
        .collect();
    let rows = sqlx::query(TRACKED).bind(&ids).fetch_all(conn).await?;
    let now = rows.first().map(|r| r.try_get("now")).transpose()?;
    let skus = rows
        .iter()
        .map(|r| r.try_get("unit"))
        .collect::<Result<Vec<String>, _>>()?;
    Ok((skus, now))
}

/// One page of the merchant's tracked SKUs in SKU order (bytewise), after
/// `starting_after` if given, and whether there are more.
pub async fn list(
    pool: &PgPool,
    merchant_id: Uuid,
    starting_after: Option<&str>,
    limit: i64,
) -> Result<(Vec<StockItem>, bool), StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {ITEM_COLUMNS} FROM ledger_account a
          WHERE a.merchant_id = $1 AND a.ledger = 'stock' AND a.kind = 'holder'
            AND ($2::text IS NULL OR a.unit COLLATE \"C\" > $2::text COLLATE \"C\")
          ORDER BY a.unit COLLATE \"C\" LIMIT $3"
    ))
    .bind(merchant_id)
    .bind(starting_after)
    .bind(limit + 1)
    .fetch_all(pool)
    .await?;
    let mut items = rows
        .iter()
        .map(item_of_row)
        .collect::<Result<Vec<_>, _>>()?;
    let more = items.len() as i64 > limit;
    items.truncate(usize::try_from(limit).unwrap_or(0));
    Ok((items, more))
}

/// An order's stock of one SKU, as its transfers say.
#[derive(Debug, Clone, Default)]
pub struct OrderSku {
    /// Its reservations (pending transfers), oldest first, each with what
    /// resolved it: a conversion (post), or a void (released, expired, or
    /// renewed: voided as another reservation of the same units took its
    /// place with a new deadline).
    pub reservations: Vec<(Transfer, Option<Transfer>)>,
    /// Stock taken without a reservation: after it lapsed, or for an
    /// order that reserved nothing (a sale).
    pub sale: Option<Transfer>,
}

impl OrderSku {
    /// What was reserved (every renewal reserves the same units).
    pub fn reserved(&self) -> i64 {
        self.reservations.first().map_or(0, |(r, _)| r.amount)
    }

    /// Whether the order ever reserved this SKU.
    pub fn reserved_any(&self) -> bool {
        !self.reservations.is_empty()
    }

    /// The reservation still open (not converted, released, expired or
    /// renewed; it may be past its deadline, unswept), if any.
    pub fn open(&self) -> Option<&Transfer> {
        self.reservations
            .iter()
            .find(|(_, resolution)| resolution.is_none())
            .map(|(r, _)| r)
    }

    /// Whether the order has its stock of this SKU for good: converted,
    /// or taken by a sale.
    pub fn settled(&self) -> bool {
        self.sale.is_some()
            || self
                .reservations
                .iter()
                .any(|(_, r)| r.as_ref().is_some_and(|r| r.phase == Phase::Post))
    }
}

/// The stock transfers of an order, by SKU (in SKU order).
pub async fn of_order(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<BTreeMap<String, OrderSku>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {} FROM ledger_transfer t WHERE t.order_id = $1 AND t.ledger = 'stock'
          ORDER BY t.created_at, t.id",
        ledger::TRANSFER_COLUMNS
    ))
    .bind(order_id)
    .fetch_all(conn)
    .await?;
    let transfers = rows
        .iter()
        .map(ledger::from_row)
        .collect::<Result<Vec<_>, _>>()?;
    let mut skus: BTreeMap<String, OrderSku> = BTreeMap::new();
    // Reservations first: a resolution made in the same transaction as
    // the reservation it resolves may sort before it.
    let (pending, others): (Vec<_>, Vec<_>) = transfers
        .into_iter()
        .partition(|t| t.phase == Phase::Pending);
    for t in pending {
        skus.entry(t.unit.clone())
            .or_default()
            .reservations
            .push((t, None));
    }
    for t in others {
        let entry = skus.entry(t.unit.clone()).or_default();
        match t.phase {
            Phase::Post | Phase::Void => {
                if let Some((_, resolution)) = entry
                    .reservations
                    .iter_mut()
                    .find(|(r, _)| Some(r.id) == t.pending_id)
                {
                    *resolution = Some(t);
                }
            }
            Phase::Single if t.code == Code::Sale.as_str() => entry.sale = Some(t),
            Phase::Single | Phase::Pending => {}
        }
    }
    Ok(skus)
}

/// Which of an order's SKUs its merchant tracks now, in SKU order, with
/// the merchant (`None`: none is tracked).
pub async fn tracked_of_order(
    conn: &mut PgConnection,
    order_id: Uuid,
) -> Result<(Option<Uuid>, Vec<String>), StoreError> {
    let rows = sqlx::query(
        "SELECT o.merchant_id, a.unit FROM orders o
           JOIN ledger_account a
             ON a.merchant_id = o.merchant_id AND a.ledger = 'stock' AND a.kind = 'holder'
            AND a.owner = $2
            AND a.unit IN (SELECT e->>'sku' FROM jsonb_array_elements(o.items) e)
          WHERE o.id = $1
          ORDER BY a.unit COLLATE \"C\"",
    )
    .bind(order_id)
    .bind(HOLDER)
    .fetch_all(conn)
    .await?;
    let merchant = rows.first().map(|r| r.try_get("merchant_id")).transpose()?;
    let skus = rows
        .iter()
        .map(|r| r.try_get("unit"))
        .collect::<Result<Vec<String>, _>>()?;
    Ok((merchant, skus))
}

/// Takes the lock on a customer's reserving orders until the transaction
/// ends (an advisory lock on its merchant and id), so that its orders are
/// counted one at a time.
pub async fn lock_customer(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    customer_id: &str,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text || ':' || $2, 54))")
        .bind(merchant_id)
        .bind(customer_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// How many of a customer's orders await payment with their stock
/// reserved, of the reservations still counting (before their deadline,
/// or held for a payment in flight), by the database's clock.
pub async fn open_reserving_orders(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    customer_id: &str,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM orders o
          WHERE o.merchant_id = $1 AND o.customer_id = $2
            AND o.status = 'awaiting_payment' AND o.stock_reservation = 'reserved'
            AND EXISTS (SELECT 1 FROM ledger_transfer t
                          JOIN ledger_open_pending p ON p.pending_id = t.id
                         WHERE t.order_id = o.id AND p.expires_at > statement_timestamp())",
    )
    .bind(merchant_id)
    .bind(customer_id)
    .fetch_one(conn)
    .await?)
}

/// The orders with a reservation of the merchant's `skus` past its
/// deadline and not yet voided, in id order.
pub async fn orders_overdue_on(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    skus: &[&str],
) -> Result<Vec<Uuid>, StoreError> {
    let ids: Vec<Uuid> = skus
        .iter()
        .map(|sku| account(merchant_id, sku).id())
        .collect();
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT t.order_id FROM ledger_open_pending o
           JOIN ledger_transfer t ON t.id = o.pending_id
          WHERE o.account_id = ANY($1) AND o.expires_at <= statement_timestamp()
            AND t.order_id IS NOT NULL
          ORDER BY t.order_id",
    )
    .bind(&ids)
    .fetch_all(conn)
    .await?)
}

/// Orders with a reservation past its deadline and not yet voided, oldest
/// deadline first, at most `limit`: (merchant, order) of each.
pub async fn overdue_orders(pool: &PgPool, limit: i64) -> Result<Vec<(Uuid, Uuid)>, StoreError> {
    let rows = sqlx::query(
        "SELECT t.merchant_id, t.order_id, min(o.expires_at) AS due
           FROM ledger_open_pending o JOIN ledger_transfer t ON t.id = o.pending_id
          WHERE o.expires_at <= statement_timestamp() AND t.ledger = 'stock'
            AND t.order_id IS NOT NULL
          GROUP BY t.merchant_id, t.order_id ORDER BY due LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("merchant_id")?, r.try_get("order_id")?)))
        .collect()
}

/// The key of an order's one reservation of a SKU.
pub fn reservation_key(order_id: Uuid, sku: &str) -> String {
    format!("reservation:{order_id}:{sku}")
}

/// The key of the reservation that renews an order's reservation of a
/// SKU for payment `payment_id`, for `purpose`: held while the payment is
/// in flight (`payment`), until its authorization's deadline
/// (`authorization`), or back to the order's own deadline once it failed
/// (`after`). Each is made at most once, so a renewal repeated finds its
/// key taken instead of reserving twice.
pub fn renewal_key(order_id: Uuid, sku: &str, purpose: &str, payment_id: Uuid) -> String {
    format!("reservation:{order_id}:{sku}:{purpose}:{payment_id}")
}

/// The key of the one sale an order may make of a SKU without a
/// reservation (it lapsed, or the order reserved nothing).
pub fn sale_key(order_id: Uuid, sku: &str) -> String {
    format!("sale:{order_id}:{sku}")
}
