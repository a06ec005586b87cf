//! Key-set pagination shared by the lists (`GET /orders`, `/payments`,
//! `/refunds`): newest first on the time-ordered UUID v7 ids, never
//! `OFFSET`, so a page boundary stays put while new rows arrive (they sort
//! before every cursor already handed out).

use chrono::{DateTime, Utc};
use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

/// Where a page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cursor {
    /// The newest rows.
    First,
    /// Rows older than this id (the next page).
    After(Uuid),
    /// Rows newer than this id (the previous page).
    Before(Uuid),
    /// Rows between the two (older than the first, newer than the second),
    /// newest first.
    Between(Uuid, Uuid),
}

/// One page's request: how many, from where, and the filters.
#[derive(Debug, Clone)]
pub struct PageRequest {
    /// 1 to 100.
    pub limit: i64,
    /// Where the page starts.
    pub cursor: Cursor,
    /// Only this status.
    pub status: Option<String>,
    /// Only this customer's (orders, and payments and refunds of their orders).
    pub customer_id: Option<String>,
    /// Created at or after.
    pub created_gte: Option<DateTime<Utc>>,
    /// Created at or before.
    pub created_lte: Option<DateTime<Utc>>,
    /// Further exact matches, by column of the listed table (events: `type`,
    /// `object_id`).
    pub equals: Vec<(&'static str, Filter)>,
}

/// A value a column must equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// A text column.
    Text(String),
    /// A UUID column.
    Id(Uuid),
}

/// Appends the page's conditions and order to a query whose rows are those
/// of `alias` for `merchant_id`; `customer` is an SQL expression naming the
/// row's customer (a column or a subquery). Fetches one row more than the
/// limit: its presence says whether there is more.
pub fn finish(
    qb: &mut QueryBuilder<'_, Postgres>,
    alias: &str,
    merchant_id: Uuid,
    customer: &str,
    page: &PageRequest,
) {
    qb.push(format!(" WHERE {alias}.merchant_id = "))
        .push_bind(merchant_id);
    if let Some(status) = &page.status {
        qb.push(format!(" AND {alias}.status = "))
            .push_bind(status.clone());
    }
    if let Some(customer_id) = &page.customer_id {
        qb.push(format!(" AND {customer} = "))
            .push_bind(customer_id.clone());
    }
    if let Some(t) = page.created_gte {
        qb.push(format!(" AND {alias}.created_at >= ")).push_bind(t);
    }
    if let Some(t) = page.created_lte {
        qb.push(format!(" AND {alias}.created_at <= ")).push_bind(t);
    }
    for (column, value) in &page.equals {
        qb.push(format!(" AND {alias}.{column} = "));
        match value {
            Filter::Text(text) => qb.push_bind(text.clone()),
            Filter::Id(id) => qb.push_bind(*id),
        };
    }
    match page.cursor {
        Cursor::First => {
            qb.push(format!(" ORDER BY {alias}.id DESC"));
        }
        Cursor::After(id) => {
            qb.push(format!(" AND {alias}.id < "))
                .push_bind(id)
                .push(format!(" ORDER BY {alias}.id DESC"));
        }
        Cursor::Between(older_than, newer_than) => {
            qb.push(format!(" AND {alias}.id < "))
                .push_bind(older_than)
                .push(format!(" AND {alias}.id > "))
                .push_bind(newer_than)
                .push(format!(" ORDER BY {alias}.id DESC"));
        }
        Cursor::Before(id) => {
            qb.push(format!(" AND {alias}.id > "))
                .push_bind(id)
                .push(format!(" ORDER BY {alias}.id ASC"));
        }
    }
    qb.push(" LIMIT ").push_bind(page.limit + 1);
}

/// One page of a merchant's rows: `select` (`SELECT … FROM table alias`)
/// finished by [`finish`], fetched, read by `from_row` and cut by
/// [`page_of`]. Every list endpoint is this, over its own table.
pub(crate) async fn fetch<T>(
    pool: &sqlx::PgPool,
    select: &str,
    alias: &str,
    customer: &str,
    merchant_id: Uuid,
    page: &PageRequest,
    from_row: fn(&sqlx::postgres::PgRow) -> Result<T, super::StoreError>,
) -> Result<(Vec<T>, bool), super::StoreError> {
    let mut qb = QueryBuilder::new(select);
    finish(&mut qb, alias, merchant_id, customer, page);
    let rows = qb.build().fetch_all(pool).await?;
    let items = rows.iter().map(from_row).collect::<Result<Vec<_>, _>>()?;
    Ok(page_of(items, page))
}

/// Turns the rows fetched (one more than the limit, in cursor order) into
/// the page, newest first, and whether more rows lie beyond it.
pub(crate) fn page_of<T>(mut rows: Vec<T>, page: &PageRequest) -> (Vec<T>, bool) {
    let limit = usize::try_from(page.limit).unwrap_or(0);
    let has_more = rows.len() > limit;
    rows.truncate(limit);
    if matches!(page.cursor, Cursor::Before(_)) {
        rows.reverse();
    }
    (rows, has_more)
}
