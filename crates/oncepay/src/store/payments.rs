//! SQL of payment attempts. The table's constraints are the second and third
//! lines of defence against a double charge (see the migration).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::group_commit::{GroupCommit, Statement};
use super::{Corrupt, StoreError};
use crate::domain::order::Order;
use crate::domain::origin::Origin;
use crate::domain::payment::{NextAction, Payment, PaymentStatus};

/// The columns every read of a payment attempt returns, in `from_row`'s order.
macro_rules! payment_columns {
    () => {
        "id, order_id, amount, currency, status, provider, provider_charge_id, failure_code, failure_message, refunded_amount, created_at, updated_at, payment_method, merchant_id, idempotency_key, request_fingerprint, next_action_url, action_required_at, return_url"
    };
}

/// The same columns qualified with the alias `p`, for joins and updates.
macro_rules! payment_columns_p {
    () => {
        "p.id, p.order_id, p.amount, p.currency, p.status, p.provider, p.provider_charge_id, p.failure_code, p.failure_message, p.refunded_amount, p.created_at, p.updated_at, p.payment_method, p.merchant_id, p.idempotency_key, p.request_fingerprint, p.next_action_url, p.action_required_at, p.return_url"
    };
}

fn from_row(row: &PgRow) -> Result<Payment, StoreError> {
    let status: String = row.try_get("status")?;
    Ok(Payment {
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        status: PaymentStatus::parse(&status)
            .ok_or_else(|| Corrupt::unknown("payment status", &status))?,
        provider: row.try_get("provider")?,
        provider_charge_id: row.try_get("provider_charge_id")?,
        failure_code: row.try_get("failure_code")?,
        failure_message: row.try_get("failure_message")?,
        refunded_amount: row.try_get("refunded_amount")?,
        next_action: row
            .try_get::<Option<&str>, _>("next_action_url")?
            .map(NextAction::redirect),
        action_required_at: row.try_get("action_required_at")?,
        return_url: row.try_get("return_url")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        payment_method: row.try_get("payment_method")?,
        merchant_id: row.try_get("merchant_id")?,
        origin: Origin::of(
            Some(row.try_get::<&str, _>("idempotency_key")?),
            row.try_get::<Option<&[u8]>, _>("request_fingerprint")?,
        ),
    })
}

/// A new pending attempt.
pub struct NewAttempt<'a> {
    /// UUID v7, also the provider idempotency key.
    pub id: Uuid,
    /// The merchant whose order it pays; every lookup is scoped by it.
    pub merchant_id: Uuid,
    /// The order paid.
    pub order_id: Uuid,
    /// The client's idempotency key (second line of defence).
    pub idempotency_key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: Option<&'a [u8]>,
    /// Amount in minor units.
    pub amount: i64,
    /// Currency code.
    pub currency: &'a str,
    /// Provider name.
    pub provider: &'a str,
    /// Provider token.
    pub payment_method: &'a str,
    /// Creation time.
    pub now: DateTime<Utc>,
    /// When the reconciler should first look at it if it stays pending.
    pub check_after: Duration,
    /// Where the customer's bank sends them back (3-D Secure).
    pub return_url: Option<&'a str>,
}

/// Why an attempt could not be inserted.
#[derive(Debug, thiserror::Error)]
pub enum InsertAttemptError {
    /// `UNIQUE (order_id, idempotency_key)`: this key already made an attempt.
    #[error("this idempotency key already made an attempt for the order")]
    KeyUsed,
    /// The one-live-attempt index: a pending or succeeded attempt exists.
    #[error("the order already has a pending or succeeded attempt")]
    LiveAttemptExists,
    /// Anything else.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Inserts a pending attempt.
pub const INSERT: &str = concat!(
    "INSERT INTO payment_attempt
            (id, merchant_id, order_id, idempotency_key, amount, currency, status, provider,
             payment_method, next_check_at, created_at, updated_at, request_fingerprint,
             return_url)
         VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8,
                 now() + $10::bigint * interval '1 millisecond', $9, $9, $11, $12)
         RETURNING ",
    payment_columns!()
);

/// Inserts a pending attempt; the constraints decide races.
pub async fn insert(
    tx: &mut PgConnection,
    new: &NewAttempt<'_>,
) -> Result<Payment, InsertAttemptError> {
    let result = sqlx::query(INSERT)
        .bind(new.id)
        .bind(new.merchant_id)
        .bind(new.order_id)
        .bind(new.idempotency_key)
        .bind(new.amount)
        .bind(new.currency)
        .bind(new.provider)
        .bind(new.payment_method)
        .bind(new.now)
        .bind(i64::try_from(new.check_after.as_millis()).unwrap_or(i64::MAX))
        .bind(new.fingerprint)
        .bind(new.return_url)
        .fetch_one(tx)
        .await;
    match result {
        Ok(row) => Ok(from_row(&row)?),
        Err(e) => Err(match super::violated_constraint(&e) {
            Some("payment_attempt_order_key_uniq") => InsertAttemptError::KeyUsed,
            Some("payment_attempt_one_live_per_order") => InsertAttemptError::LiveAttemptExists,
            _ => InsertAttemptError::Store(e.into()),
        }),
    }
}

/// A payment's first step and the claim of its key in one statement (one
/// round trip, one synchronous commit), when the key is new: the order,
/// locked, if it awaits payment with no live attempt; the idempotency
/// record, claimed under our lease and already at the step's recovery
/// point; the pending attempt, with the order's amount and currency; its
/// event, whose object gets the same amount and currency from the order's
/// row. Each part is written only if the one before was, so the statement
/// writes all or nothing: nothing when the key has a record (`ON CONFLICT
/// DO NOTHING`) or the order is not payable, and an error, mapped to
/// nothing, when the attempt's constraints refuse it (a live attempt that
/// committed meanwhile, the key used). Returns the order as locked.
pub const INSERT_CLAIMING: &str = concat!(
    "WITH o AS (
        SELECT ",
    super::orders::order_columns!(),
    " FROM orders
         WHERE id = $9 AND merchant_id = $10 AND status = 'awaiting_payment'
           AND NOT EXISTS (SELECT 1 FROM payment_attempt p
                            WHERE p.order_id = $9 AND p.status IN ('pending', 'succeeded'))
           FOR UPDATE),
     claim AS (
        INSERT INTO idempotency_record
               (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, resource_id, lease_token, lease_expires_at, expires_at)
        SELECT $10, $11, $12, $13, $14, 'executing', $15, $16, $17,
               now() + $18::bigint * interval '1 millisecond',
               now() + $19::bigint * interval '1 millisecond'
          FROM o
         WHERE NOT EXISTS (SELECT 1 FROM idempotency_record
                            WHERE merchant_id = $10 AND idempotency_key = ",
    crate::idempotency::persistence::adopted_key!("$11"),
    ")
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
        RETURNING 1),
     att AS (
        INSERT INTO payment_attempt
               (id, merchant_id, order_id, idempotency_key, amount, currency, status, provider,
                payment_method, next_check_at, created_at, updated_at, request_fingerprint,
                return_url)
        SELECT $16, $10, o.id, $11, o.amount, o.currency, 'pending', $20, $21,
               now() + $23::bigint * interval '1 millisecond', $22, $22, $12, $24
          FROM o WHERE EXISTS (SELECT 1 FROM claim)
        RETURNING id),
     new_events AS (
        SELECT n.id, n.type, n.object_type, n.object_id, n.order_id,
               n.data || jsonb_build_object('amount', o.amount, 'currency', o.currency) AS data,
               n.cause, n.request_id
          FROM ",
    super::events::new_events_from_params!(),
    ", o WHERE EXISTS (SELECT 1 FROM att)),
     ",
    super::events::append_new_events!(),
    "
     SELECT o.* FROM o WHERE EXISTS (SELECT 1 FROM att)"
);

/// What [`insert_claiming`] writes.
pub struct ClaimingAttempt<'a> {
    /// The idempotency record to claim.
    pub record: &'a crate::idempotency::persistence::NewRecord<'a>,
    /// Our lease's fencing token.
    pub lease_token: Uuid,
    /// The recovery point the record starts at: the step is done.
    pub recovery_point: &'a str,
    /// The order to pay.
    pub order_id: Uuid,
    /// The new attempt's id (also its provider key).
    pub attempt_id: Uuid,
    /// Provider name.
    pub provider: &'a str,
    /// Provider token.
    pub payment_method: &'a str,
    /// Creation time, in the database's microseconds.
    pub now: DateTime<Utc>,
    /// When the reconciler should first look at it if it stays pending.
    pub check_after: Duration,
    /// The attempt's events, their objects without the order's amount and
    /// currency (the statement adds them).
    pub events: &'a [super::events::NewEvent<'a>],
    /// Where the customer's bank sends them back (3-D Secure).
    pub return_url: Option<&'a str>,
}

/// See [`INSERT_CLAIMING`]. `None`: nothing was written, and the caller
/// goes through the engine's full protocol, which decides.
pub(crate) async fn insert_claiming(
    group: &GroupCommit,
    w: &ClaimingAttempt<'_>,
) -> Result<Option<Order>, StoreError> {
    let statement = Statement::of(INSERT_CLAIMING, |q| {
        super::events::bind_events(q, w.events)
            .bind(w.order_id)
            .bind(w.record.id.merchant_id)
            .bind(&w.record.id.key)
            .bind(w.record.fingerprint)
            .bind(w.record.command)
            .bind(w.record.request)
            .bind(w.recovery_point)
            .bind(w.attempt_id)
            .bind(w.lease_token)
            .bind(crate::idempotency::persistence::millis(w.record.lease))
            .bind(crate::idempotency::persistence::millis(w.record.ttl))
            .bind(w.provider)
            .bind(w.payment_method)
            .bind(w.now)
            .bind(crate::idempotency::persistence::millis(w.check_after))
            .bind(w.return_url)
    })?;
    match group.fetch_optional(statement).await {
        Ok(row) => row.as_ref().map(super::orders::from_row).transpose(),
        Err(e) => match super::violated_constraint(&e) {
            Some("payment_attempt_order_key_uniq" | "payment_attempt_one_live_per_order") => {
                Ok(None)
            }
            _ => Err(e.into()),
        },
    }
}

/// A command's own charge settled, and the command completed, in one
/// statement (one round trip, one synchronous commit): the order, the
/// attempt and the idempotency record are locked first (in that order, as
/// everywhere) and checked to be as the command knows them — the order
/// with the status and `updated_at` it read, the attempt still pending
/// with no provider facts, the record under our lease — and only if all
/// three are, the attempt takes its new status and facts, the order its
/// new status (when it moves), the record the response, and the events
/// are written. Otherwise nothing is written (a webhook or the reconciler
/// settled the attempt first, or the lease was lost), and the caller
/// settles the usual way, under locks.
pub const SETTLE_COMPLETING: &str = concat!(
    "WITH o AS (
        SELECT id FROM orders WHERE id = $9 AND status = $10 AND updated_at = $11 FOR UPDATE),
     pl AS (
        SELECT id FROM payment_attempt
         WHERE id = $13 AND order_id = $9 AND status = 'pending'
           AND (provider_charge_id IS NULL OR provider_charge_id = $15)
           AND failure_code IS NULL AND failure_message IS NULL
           FOR UPDATE),
     r AS (
        SELECT 1 FROM idempotency_record
         WHERE merchant_id = $19 AND idempotency_key = $20 AND lease_token = $21
           AND state = 'executing'
           FOR UPDATE),
     go AS (
        SELECT (SELECT count(*) FROM o) = 1 AND (SELECT count(*) FROM pl) = 1
               AND (SELECT count(*) FROM r) = 1 AS ok),
     p AS (
        UPDATE payment_attempt
           SET status = $14, provider_charge_id = $15, failure_code = $16,
               failure_message = $17, updated_at = $18,
               decline_check_at = CASE WHEN $25 THEN next_check_at END,
               next_action_url = NULL
         WHERE id = $13 AND (SELECT ok FROM go)
        RETURNING 1),
     ord AS (
        UPDATE orders SET status = $12, updated_at = $18
         WHERE id = $9 AND $12 <> $10 AND (SELECT ok FROM go)
        RETURNING 1),
     rec AS (
        UPDATE idempotency_record SET ",
    crate::idempotency::persistence::completed!("$22", "$23", "$24"),
    " WHERE merchant_id = $19 AND idempotency_key = $20 AND (SELECT ok FROM go)
        RETURNING 1),
     new_events AS (
        SELECT n.* FROM ",
    super::events::new_events_from_params!(),
    " WHERE (SELECT ok FROM go)),
     ",
    super::events::append_new_events!(),
    "
     SELECT ok FROM go"
);

/// What [`settle_completing`] checks and writes: the rows as the command
/// knows them and as they become.
pub struct KnownSettlement<'a> {
    /// The order as read, and as it becomes.
    pub order: (&'a Order, &'a Order),
    /// The attempt as it becomes (it was pending, with no provider facts).
    pub attempt: &'a Payment,
    /// The changes' events.
    pub events: &'a [super::events::NewEvent<'a>],
    /// Whether the attempt's decline is to be confirmed by a status read
    /// (see [`confirm_decline_later`]).
    pub confirm_decline: bool,
}

/// See [`SETTLE_COMPLETING`]. `false`: nothing was written.
pub(crate) async fn settle_completing(
    group: &GroupCommit,
    s: &KnownSettlement<'_>,
    record: &crate::idempotency::persistence::RecordId,
    lease_token: Uuid,
    response: &crate::idempotency::persistence::StoredResponse,
) -> Result<bool, StoreError> {
    let (order, order_after) = s.order;
    let after = s.attempt;
    let status = crate::store::Corrupt::status_column(response.status)?;
    let statement = Statement::of(SETTLE_COMPLETING, |q| {
        super::events::bind_events(q, s.events)
            .bind(order.id)
            .bind(order.status.as_str())
            .bind(order.updated_at)
            .bind(order_after.status.as_str())
            .bind(after.id)
            .bind(after.status.as_str())
            .bind(&after.provider_charge_id)
            .bind(&after.failure_code)
            .bind(&after.failure_message)
            .bind(after.updated_at)
            .bind(record.merchant_id)
            .bind(&record.key)
            .bind(lease_token)
            .bind(status)
            .bind(&response.body)
            .bind(&response.location)
            .bind(s.confirm_decline)
    })?;
    let ok: Option<bool> = match group.fetch_optional(statement).await? {
        Some(row) => row.try_get("ok")?,
        None => None,
    };
    Ok(ok == Some(true))
}

/// The order's pending or succeeded attempt, if it has one (there is at
/// most one: `payment_attempt_one_live_per_order`).
pub async fn live_attempt(
    tx: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt WHERE order_id = $1 AND status IN ('pending', 'succeeded')"
    ))
    .bind(order_id)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Reads one of a merchant's attempts.
pub const GET: &str = concat!(
    "SELECT ",
    payment_columns!(),
    " FROM payment_attempt WHERE id = $1 AND merchant_id = $2"
);

/// Reads one of the merchant's attempts.
pub async fn get(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(GET)
        .bind(id)
        .bind(merchant_id)
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// Locks an attempt.
pub const LOCK: &str = concat!(
    "SELECT ",
    payment_columns!(),
    " FROM payment_attempt WHERE id = $1 FOR UPDATE"
);

/// Reads and row-locks an attempt (any merchant: callers already scoped it).
pub async fn lock(tx: &mut PgConnection, id: Uuid) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(LOCK).bind(id).fetch_optional(tx).await?;
    row.as_ref().map(from_row).transpose()
}

/// Whether a command is still executing on the attempt `p`: its
/// idempotency record, at the attempt's recovery point, under a live lease.
/// The record is found by its primary key alone and the rest is tested on
/// the row: a lease condition in the `WHERE` would let the planner scan the
/// lease index instead (see migration V14).
macro_rules! command_executing {
    () => {
        "COALESCE((SELECT r.state = 'executing' AND r.lease_expires_at > now()
                          AND r.resource_id = p.id
                     FROM idempotency_record r
                    WHERE r.merchant_id = p.merchant_id
                      AND r.idempotency_key = p.idempotency_key), false) AS command_executing"
    };
}

/// Finds the attempt a provider event is about (by the provider's charge
/// id, or our attempt id where the event carries it), and in the same
/// statement records the event as
/// `processed` when it only repeats what we hold (its status is the
/// attempt's: the command, or an earlier delivery, already settled it).
/// Such an event, the common case (a provider's webhook for a charge its
/// own answer settled), then costs one round trip and no provider read.
pub const FIND_BY_CHARGE_OR_RECORD_REPEAT: &str = concat!(
    "WITH p AS (SELECT ",
    payment_columns_p!(),
    ", ",
    command_executing!(),
    " FROM payment_attempt p
          WHERE p.provider = $1 AND (p.provider_charge_id = $2 OR p.id = $3)
          ORDER BY p.id = $3 DESC LIMIT 1),
     repeat AS (INSERT INTO webhook_event (provider, event_id, event_type, payload, outcome)
                SELECT $1, $4, $5, $6, 'processed' FROM p WHERE p.status = $7
                ON CONFLICT DO NOTHING RETURNING 1)
     SELECT p.*, EXISTS (SELECT 1 FROM repeat) AS repeat_recorded FROM p"
);

/// A provider event about a charge, as [`find_by_charge_or_record_repeat`]
/// records it when it repeats what we hold.
pub struct ChargeEvent<'a> {
    /// The provider's name.
    pub provider: &'a str,
    /// The provider's charge id.
    pub charge_id: &'a str,
    /// Our attempt id, where the event carries it.
    pub attempt_id: Option<Uuid>,
    /// The provider's event id.
    pub event_id: &'a str,
    /// Its type.
    pub event_type: &'a str,
    /// The event as received.
    pub payload: &'a serde_json::Value,
    /// The status it reports.
    pub status: crate::domain::payment::PaymentStatus,
}

/// The attempt a charge event is about, and whether the event was recorded
/// already as a repeat of what the attempt holds (then nothing is left to
/// do); see [`FIND_BY_CHARGE_OR_RECORD_REPEAT`].
pub(crate) async fn find_by_charge_or_record_repeat(
    group: &GroupCommit,
    event: &ChargeEvent<'_>,
) -> Result<Option<(Found, bool)>, StoreError> {
    let statement = Statement::of(FIND_BY_CHARGE_OR_RECORD_REPEAT, |q| {
        q.bind(event.provider)
            .bind(event.charge_id)
            .bind(event.attempt_id)
            .bind(event.event_id)
            .bind(event.event_type)
            .bind(event.payload)
            .bind(event.status.as_str())
    })?;
    let row = group.fetch_optional(statement).await?;
    row.as_ref()
        .map(|row| Ok((found_from_row(row)?, row.try_get("repeat_recorded")?)))
        .transpose()
}

/// An attempt as a provider event finds it.
#[derive(Debug)]
pub struct Found {
    /// The attempt.
    pub attempt: Payment,
    /// True while the command that made it is still executing (it will
    /// settle the attempt itself, with the provider's answer to its call).
    pub command_executing: bool,
}

fn found_from_row(row: &PgRow) -> Result<Found, StoreError> {
    Ok(Found {
        attempt: from_row(row)?,
        command_executing: row.try_get("command_executing")?,
    })
}

/// The order's attempt made with idempotency key `key`, if any.
pub(crate) async fn by_key(
    conn: &mut PgConnection,
    order_id: Uuid,
    key: &str,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt WHERE order_id = $1 AND idempotency_key = $2"
    ))
    .bind(order_id)
    .bind(key)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// All attempts of one of the merchant's orders, oldest first.
pub(crate) async fn list_for_order(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    order_id: Uuid,
) -> Result<Vec<Payment>, StoreError> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt
          WHERE order_id = $1 AND merchant_id = $2 ORDER BY created_at, id"
    ))
    .bind(order_id)
    .bind(merchant_id)
    .fetch_all(conn)
    .await?;
    rows.iter().map(from_row).collect()
}

/// What the provider said about a charge.
pub struct ChargeFacts<'a> {
    /// The provider's charge id, if it gave one.
    pub charge_id: Option<&'a str>,
    /// Failure code, for a failed charge.
    pub failure_code: Option<&'a str>,
    /// Failure message, for a failed charge.
    pub failure_message: Option<&'a str>,
}

/// Writes an attempt's status and provider facts.
pub(crate) const SET_STATUS: &str = concat!(
    "UPDATE payment_attempt
            SET status = $2, provider_charge_id = COALESCE(provider_charge_id, $3),
                failure_code = COALESCE($4, failure_code),
                failure_message = COALESCE($5, failure_message), updated_at = now(),
                next_action_url = CASE WHEN $2 = 'pending' THEN next_action_url END
          WHERE id = $1 RETURNING ",
    payment_columns!()
);

/// Writes a status the domain decided, with the provider's facts. The
/// charge id is kept once known.
pub(crate) async fn set_status(
    tx: &mut PgConnection,
    id: Uuid,
    status: PaymentStatus,
    facts: &ChargeFacts<'_>,
) -> Result<Payment, StoreError> {
    let row = sqlx::query(SET_STATUS)
        .bind(id)
        .bind(status.as_str())
        .bind(facts.charge_id)
        .bind(facts.failure_code)
        .bind(facts.failure_message)
        .fetch_one(tx)
        .await?;
    from_row(&row)
}

/// A pending attempt now waits for its customer at `url` (from now on,
/// for the reconciler's timeout). `None` if it is no longer pending.
pub(crate) async fn require_action(
    tx: &mut PgConnection,
    id: Uuid,
    url: &str,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "UPDATE payment_attempt
            SET next_action_url = $2, action_required_at = coalesce(action_required_at, now()),
                updated_at = now()
          WHERE id = $1 AND status = 'pending'
          RETURNING ",
        payment_columns!()
    ))
    .bind(id)
    .bind(url)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Records the provider's object opened for a pending attempt (Stripe's
/// PaymentIntent), before it is confirmed. `None` if the attempt is no
/// longer pending or holds another object: the caller reads it again.
pub(crate) async fn set_reference(
    tx: &mut PgConnection,
    id: Uuid,
    reference: &str,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "UPDATE payment_attempt SET provider_charge_id = $2, updated_at = now()
          WHERE id = $1 AND status = 'pending'
            AND (provider_charge_id IS NULL OR provider_charge_id = $2)
          RETURNING ",
        payment_columns!()
    ))
    .bind(id)
    .bind(reference)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Adds a succeeded refund's amount to the attempt.
pub(crate) async fn add_refunded(
    tx: &mut PgConnection,
    id: Uuid,
    amount: i64,
) -> Result<Payment, StoreError> {
    let row = sqlx::query(concat!(
        "UPDATE payment_attempt SET refunded_amount = refunded_amount + $2, updated_at = now()
          WHERE id = $1 RETURNING ",
        payment_columns!()
    ))
    .bind(id)
    .bind(amount)
    .fetch_one(tx)
    .await?;
    from_row(&row)
}

/// The reconciler's queues run over this table (`store::queue`).
impl super::queue::Queued for Payment {
    const TABLE: super::queue::Table = super::queue::Table {
        name: "payment_attempt",
        alias: "p",
        returning: concat!(payment_columns_p!(), ", p.merchant_id"),
        next_look: next_check_after_claim!("p"),
    };

    fn from_row(row: &PgRow) -> Result<Payment, StoreError> {
        from_row(row)
    }
}

/// The order's succeeded attempt, row-locked.
pub(crate) async fn lock_succeeded_for_order(
    tx: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt
          WHERE order_id = $1 AND status = 'succeeded' FOR UPDATE"
    ))
    .bind(order_id)
    .fetch_optional(tx)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// An attempt by id alone (no merchant scope, no lock): for work that
/// starts from a row that names it.
pub async fn by_id(conn: &mut PgConnection, id: Uuid) -> Result<Option<Payment>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// One page of the merchant's rows, newest first, and whether there are more
/// (see `store::pages`).
pub async fn list(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    page: &super::pages::PageRequest,
) -> Result<(Vec<Payment>, bool), StoreError> {
    super::pages::fetch(
        pool,
        concat!("SELECT ", payment_columns_p!(), " FROM payment_attempt p"),
        "p",
        "(SELECT customer_id FROM orders WHERE orders.id = p.order_id)",
        merchant_id,
        page,
        from_row,
    )
    .await
}

#[cfg(test)]
mod tests {
    use crate::domain::order::OrderStatus;

    /// The one-statement payment writes "the order is payable" in SQL; it
    /// must say what `OrderStatus::is_payable` says, for every status.
    #[test]
    fn the_claiming_statement_pays_exactly_the_payable_orders() {
        for status in OrderStatus::ALL {
            let named = super::INSERT_CLAIMING.contains(&format!("status = '{}'", status.as_str()));
            assert_eq!(named, status.is_payable(), "{status:?}");
        }
    }
}
