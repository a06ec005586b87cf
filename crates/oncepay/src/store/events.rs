//! SQL of the outbox: events written in the transaction of the change they
//! report, with one delivery per subscribed endpoint, and the reads of the
//! event list and of an object's or order's trail.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::StoreError;

/// An event about to be written.
pub struct NewEvent<'a> {
    /// UUID v7: the event's id and the `webhook-id` of every delivery.
    pub id: Uuid,
    /// `payment.succeeded`, ...
    pub event_type: &'a str,
    /// `order`, `payment` or `refund`.
    pub object_type: &'a str,
    /// The object that changed.
    pub object_id: Uuid,
    /// The order it belongs to (its own id for an order); the merchant is
    /// the order's.
    pub order_id: Uuid,
    /// The object after the change, as the API shows it.
    pub data: &'a Value,
    /// `request`, `webhook`, `reconciler` or `incident`.
    pub cause: &'a str,
    /// The request that made the change, if one did.
    pub request_id: Option<&'a str>,
    /// Who asked for the change (`audit::Actor::member`), if anyone
    /// authenticated did.
    pub actor: Option<&'a Value>,
}

/// See [`APPEND`]; returns the event's sequence number.
pub async fn append(tx: &mut PgConnection, event: &NewEvent<'_>) -> Result<i32, StoreError> {
    let row = bind_events(sqlx::query(APPEND), std::slice::from_ref(event))
        .fetch_optional(tx)
        .await?
        .ok_or_else(|| {
            super::Corrupt::Broken(format!(
                "event for {} {}: order {} not found",
                event.object_type, event.object_id, event.order_id
            ))
        })?;
    Ok(row.try_get("sequence")?)
}

/// The events of a change, as the tail of a statement's `WITH` list (a
/// change made in one statement, `store::payments::INSERT_CLAIMING`, or
/// one event, [`APPEND`]): the statement defines a CTE `new_events` over
/// [`new_events_from_params`] (no rows when its change did not happen), and
/// this writes each row with its object's next sequence number and a
/// pending delivery for every live endpoint of the merchant subscribed to
/// its type. The statement holds every object's row lock, and a batch
/// names each object once, so `max + 1` cannot race;
/// `event_object_sequence_uniq` guards it anyway. Each event's merchant
/// is read from its order by key, row by row: as a join, planned while
/// `orders` was small, it was a hash over a scan of the whole table
/// (tests/api/plans.rs).
macro_rules! append_new_events {
    () => {
        concat!(
            "ev AS (
        INSERT INTO event (id, merchant_id, type, object_type, object_id, order_id, sequence,
                           data, cause, request_id, actor)
        SELECT n.id, (SELECT o.merchant_id FROM orders o WHERE o.id = n.order_id), n.type,
               n.object_type, n.object_id, n.order_id,
               COALESCE((SELECT max(e.sequence) FROM event e WHERE e.object_id = n.object_id), 0) + 1,
               n.data, n.cause, n.request_id, n.actor
          FROM new_events n
        RETURNING id, merchant_id, type, object_id, sequence),
     fan AS (
        INSERT INTO webhook_delivery (event_id, endpoint_id, object_id, sequence)
        SELECT ev.id, w.id, ev.object_id, ev.sequence
          ",
            $crate::store::events::subscribers_of_ev!(),
            "
        RETURNING 1)"
        )
    };
}
pub(crate) use append_new_events;

/// The live endpoints of the merchant of the event in the CTE `ev` that
/// subscribe to its type, as `w`: the one fan-out rule, shared by writing
/// an event and redelivering it.
macro_rules! subscribers_of_ev {
    () => {
        "FROM ev JOIN webhook_endpoint w
            ON w.merchant_id = ev.merchant_id AND w.deleted_at IS NULL
           AND w.disabled_at IS NULL AND (ev.type = ANY (w.events) OR '*' = ANY (w.events))"
    };
}
pub(crate) use subscribers_of_ev;

/// A batch of events as rows, from the first nine parameters of the
/// statement, bound by [`bind_events`].
macro_rules! new_events_from_params {
    () => {
        "unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::uuid[], $6::jsonb[],
                $7::text[], $8::text[], $9::jsonb[])
             AS n(id, type, object_type, object_id, order_id, data, cause, request_id, actor)"
    };
}
pub(crate) use new_events_from_params;

/// A [`NewEvent`] that owns its values, for a write that outlives its
/// caller's borrows (`store::group_commit`).
#[derive(Debug, Clone)]
pub struct EventRow {
    id: Uuid,
    event_type: String,
    object_type: String,
    object_id: Uuid,
    order_id: Uuid,
    data: Value,
    cause: String,
    request_id: Option<String>,
    actor: Option<Value>,
}

impl EventRow {
    /// `event`, owned.
    pub fn of(event: &NewEvent<'_>) -> Self {
        EventRow {
            id: event.id,
            event_type: event.event_type.to_string(),
            object_type: event.object_type.to_string(),
            object_id: event.object_id,
            order_id: event.order_id,
            data: event.data.clone(),
            cause: event.cause.to_string(),
            request_id: event.request_id.map(str::to_string),
            actor: event.actor.cloned(),
        }
    }

    /// The row to insert.
    pub fn as_new(&self) -> NewEvent<'_> {
        NewEvent {
            id: self.id,
            event_type: &self.event_type,
            object_type: &self.object_type,
            object_id: self.object_id,
            order_id: self.order_id,
            data: &self.data,
            cause: &self.cause,
            request_id: self.request_id.as_deref(),
            actor: self.actor.as_ref(),
        }
    }
}

/// Binds a batch of events as `$1`..`$9` (see [`new_events_from_params`]).
pub(crate) fn bind_events<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    events: &[NewEvent<'_>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let texts = |field: for<'a> fn(&'a NewEvent<'a>) -> &'a str| -> Vec<String> {
        events.iter().map(|e| field(e).to_string()).collect()
    };
    let ids =
        |field: fn(&NewEvent<'_>) -> Uuid| -> Vec<Uuid> { events.iter().map(field).collect() };
    query
        .bind(ids(|e| e.id))
        .bind(texts(|e| e.event_type))
        .bind(texts(|e| e.object_type))
        .bind(ids(|e| e.object_id))
        .bind(ids(|e| e.order_id))
        .bind(events.iter().map(|e| e.data.clone()).collect::<Vec<_>>())
        .bind(texts(|e| e.cause))
        .bind(
            events
                .iter()
                .map(|e| e.request_id.map(str::to_string))
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.actor.cloned()).collect::<Vec<_>>())
}

/// Writes one event and its deliveries in one statement: a batch of one
/// (see [`append_new_events`]).
pub const APPEND: &str = concat!(
    "WITH new_events AS (SELECT * FROM ",
    new_events_from_params!(),
    "),
     ",
    append_new_events!(),
    "
     SELECT ev.sequence FROM ev"
);

/// Writes one event of an object that belongs to no order (a balance's
/// transaction or hold), for `merchant_id`, with its deliveries, in one
/// statement. The object's own row lock (its holder's account) makes
/// `max + 1` race-free, as for the events of orders.
pub async fn append_for_merchant(
    tx: &mut PgConnection,
    merchant_id: Uuid,
    event: &NewEvent<'_>,
) -> Result<i32, StoreError> {
    let row = bind_events(
        sqlx::query(APPEND_FOR_MERCHANT),
        std::slice::from_ref(event),
    )
    .bind(merchant_id)
    .fetch_one(tx)
    .await?;
    Ok(row.try_get("sequence")?)
}

/// See [`append_for_merchant`]: [`APPEND`] with the merchant given (`$10`,
/// after the events' nine) and no order.
pub const APPEND_FOR_MERCHANT: &str = concat!(
    "WITH new_events AS (SELECT * FROM ",
    new_events_from_params!(),
    "),
     ev AS (
        INSERT INTO event (id, merchant_id, type, object_type, object_id, order_id, sequence,
                           data, cause, request_id, actor)
        SELECT n.id, $10, n.type, n.object_type, n.object_id, NULL,
               COALESCE((SELECT max(e.sequence) FROM event e WHERE e.object_id = n.object_id), 0) + 1,
               n.data, n.cause, n.request_id, n.actor
          FROM new_events n
        RETURNING id, merchant_id, type, object_id, sequence),
     fan AS (
        INSERT INTO webhook_delivery (event_id, endpoint_id, object_id, sequence)
        SELECT ev.id, w.id, ev.object_id, ev.sequence
          ",
    subscribers_of_ev!(),
    "
        RETURNING 1)
     SELECT ev.sequence FROM ev"
);

/// An event as the API shows it: what receivers get (`id`, `type`,
/// `created_at`, `sequence`, `data.object`) and, for the trail, what made
/// the change.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// UUID v7; the `webhook-id` of its deliveries.
    pub id: Uuid,
    /// `payment.succeeded`, ...
    #[serde(rename = "type")]
    pub event_type: String,
    /// When the change committed (to the transaction's clock).
    pub created_at: DateTime<Utc>,
    /// 1, 2, 3... per object.
    pub sequence: i32,
    /// `{"object": …}`: the object after the change.
    pub data: EventData,
    /// `order`, `payment` or `refund`.
    pub object_type: String,
    /// Who made the change.
    pub cause: String,
    /// The request that made it, if one did.
    pub request_id: Option<String>,
    /// Who asked for the change, if anyone authenticated did: `{"type":
    /// "api_key", "id"}` or `{"type": "customer" | "seller", "sub",
    /// "issuer"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<Value>,
}

/// An event's `data`.
#[derive(Debug, Clone, Serialize)]
pub struct EventData {
    /// The object after the change.
    pub object: Value,
}

/// What a receiver is sent: exactly these fields, the same bytes on every
/// attempt.
#[derive(Debug, Serialize)]
pub struct Delivered<'a> {
    /// The event id.
    pub id: Uuid,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: &'a str,
    /// When it happened.
    pub created_at: DateTime<Utc>,
    /// Its sequence within its object.
    pub sequence: i32,
    /// `{"object": …}`.
    pub data: &'a EventData,
    /// Who asked for the change, if anyone authenticated did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<&'a Value>,
}

impl Event {
    /// The body a receiver gets.
    pub fn delivered(&self) -> Delivered<'_> {
        Delivered {
            id: self.id,
            event_type: &self.event_type,
            created_at: self.created_at,
            sequence: self.sequence,
            data: &self.data,
            actor: self.actor.as_ref(),
        }
    }
}

const EVENT_COLUMNS: &str =
    "e.id, e.type, e.created_at, e.sequence, e.data, e.object_type, e.cause, e.request_id, e.actor";

/// Reads an event row selected with [`EVENT_COLUMNS`].
pub(crate) fn from_row(row: &PgRow) -> Result<Event, StoreError> {
    Ok(Event {
        id: row.try_get("id")?,
        event_type: row.try_get("type")?,
        created_at: row.try_get("created_at")?,
        sequence: row.try_get("sequence")?,
        data: EventData {
            object: row.try_get("data")?,
        },
        object_type: row.try_get("object_type")?,
        cause: row.try_get("cause")?,
        request_id: row.try_get("request_id")?,
        actor: row.try_get("actor")?,
    })
}

/// One of the merchant's events.
pub async fn get(pool: &PgPool, merchant_id: Uuid, id: Uuid) -> Result<Option<Event>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {EVENT_COLUMNS} FROM event e WHERE e.id = $1 AND e.merchant_id = $2"
    ))
    .bind(id)
    .bind(merchant_id)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// One page of the merchant's events, newest first (see `store::pages`),
/// optionally of one type and one object.
pub async fn list(
    pool: &PgPool,
    merchant_id: Uuid,
    page: &super::pages::PageRequest,
) -> Result<(Vec<Event>, bool), StoreError> {
    super::pages::fetch(
        pool,
        &format!("SELECT {EVENT_COLUMNS} FROM event e"),
        "e",
        "(SELECT o.customer_id FROM orders o WHERE o.id = e.order_id)",
        merchant_id,
        page,
        from_row,
    )
    .await
}

/// Whose events a trail gathers.
#[derive(Debug, Clone, Copy)]
pub enum TrailOf {
    /// One object's (a payment's or a refund's), in sequence order.
    Object,
    /// An order's and its payments' and refunds', oldest first.
    Order,
}

/// The trail of one of the merchant's objects or orders.
pub async fn trail(
    pool: &PgPool,
    merchant_id: Uuid,
    of: TrailOf,
    id: Uuid,
) -> Result<Vec<Event>, StoreError> {
    let (column, order) = match of {
        TrailOf::Object => ("object_id", "sequence"),
        TrailOf::Order => ("order_id", "id"),
    };
    let rows = sqlx::query(&format!(
        "SELECT {EVENT_COLUMNS} FROM event e WHERE e.{column} = $1 AND e.merchant_id = $2
          ORDER BY e.{order}"
    ))
    .bind(id)
    .bind(merchant_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Arbitrary constant naming the retention sweep among advisory locks:
/// one process at a time deletes old events.
const RETENTION_LOCK: i64 = 0x6f6e_6365_7061_7902;

/// What one retention batch deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// Whether this process held the retention lock (another one works
    /// otherwise, and this batch did nothing).
    pub held: bool,
    /// Events deleted.
    pub events: u64,
    /// Their deliveries.
    pub deliveries: u64,
    /// Their deliveries' attempts.
    pub attempts: u64,
}

/// Looks at the next `batch` events after `after` and older than `before`
/// (a UUID v7 of that time: event ids are time-ordered, so the primary key
/// walks them), and deletes those it may, with their deliveries and
/// attempts, in one statement, unless another process holds the retention
/// lock. Never an event with a delivery still pending, and never the newest
/// event of its object: the next event of an object takes the newest
/// sequence plus one, and receivers drop an event whose sequence is not
/// above what they applied, so the newest must stay. Returns what it
/// deleted and the last id it looked at (`None`: nothing left to look at),
/// so that the next batch goes on from there instead of walking the kept
/// events again.
pub(crate) async fn delete_old(
    pool: &PgPool,
    after: Uuid,
    before: Uuid,
    batch: i64,
) -> Result<(Deleted, Option<Uuid>), StoreError> {
    let row = sqlx::query(
        "WITH lock AS (SELECT pg_try_advisory_xact_lock($4) AS held),
         seen AS (
            SELECT e.id FROM event e
             WHERE (SELECT held FROM lock) AND e.id > $1 AND e.id < $2
             ORDER BY e.id
             LIMIT $3),
         old AS (
            SELECT e.id FROM event e JOIN seen USING (id)
             WHERE EXISTS (SELECT 1 FROM event n
                            WHERE n.object_id = e.object_id AND n.sequence > e.sequence)
               AND NOT EXISTS (SELECT 1 FROM webhook_delivery d
                                WHERE d.event_id = e.id AND d.state = 'pending')
             FOR UPDATE OF e SKIP LOCKED),
         attempts AS (DELETE FROM webhook_attempt a USING old WHERE a.event_id = old.id RETURNING 1),
         deliveries AS (DELETE FROM webhook_delivery d USING old WHERE d.event_id = old.id RETURNING 1),
         events AS (DELETE FROM event e USING old WHERE e.id = old.id RETURNING 1)
         SELECT (SELECT held FROM lock) AS held,
                (SELECT id FROM seen ORDER BY id DESC LIMIT 1) AS last,
                (SELECT count(*) FROM events) AS events,
                (SELECT count(*) FROM deliveries) AS deliveries,
                (SELECT count(*) FROM attempts) AS attempts",
    )
    .bind(after)
    .bind(before)
    .bind(batch)
    .bind(RETENTION_LOCK)
    .fetch_one(pool)
    .await?;
    let count = |name: &str| -> Result<u64, StoreError> {
        Ok(u64::try_from(row.try_get::<i64, _>(name)?).unwrap_or(0))
    };
    let deleted = Deleted {
        held: row.try_get("held")?,
        events: count("events")?,
        deliveries: count("deliveries")?,
        attempts: count("attempts")?,
    };
    Ok((deleted, row.try_get("last")?))
}
