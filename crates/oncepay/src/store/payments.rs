//! SQL of payment attempts. The table's constraints are the second and third
//! lines of defence against a double charge (see the migration).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::events::{EventRow, NewEvent};
use super::group_commit::{GroupCommit, Statement};
use super::{column, Corrupt, StoreError};
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

/// The columns a payment's first step writes to its idempotency record,
/// in [`INSERT_CLAIMING`]'s and [`INSERT_CLAIMING_MANY`]'s order.
macro_rules! claimed_record_columns {
    () => {
        "(merchant_id, idempotency_key, fingerprint, command, request, state, recovery_point,
          resource_id, lease_token, lease_expires_at, expires_at)"
    };
}

/// The columns of a new attempt, in [`INSERT`]'s, [`INSERT_CLAIMING`]'s
/// and [`INSERT_CLAIMING_MANY`]'s order.
macro_rules! new_attempt_columns {
    () => {
        "(id, merchant_id, order_id, idempotency_key, amount, currency, status, provider,
          payment_method, next_check_at, created_at, updated_at, request_fingerprint, return_url)"
    };
}

/// A first step's events (`new_events_from_params`, as `n`), each object
/// given its order's amount and currency (the order's row as `o`).
macro_rules! priced_new_events {
    () => {
        concat!(
            "SELECT n.id, n.type, n.object_type, n.object_id, n.order_id,
               n.data || jsonb_build_object('amount', o.amount, 'currency', o.currency) AS data,
               n.cause, n.request_id
          FROM ",
            super::events::new_events_from_params!()
        )
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
    "INSERT INTO payment_attempt ",
    new_attempt_columns!(),
    "
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
        INSERT INTO idempotency_record ",
    claimed_record_columns!(),
    "
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
        INSERT INTO payment_attempt ",
    new_attempt_columns!(),
    "
        SELECT $16, $10, o.id, $11, o.amount, o.currency, 'pending', $20, $21,
               now() + $23::bigint * interval '1 millisecond', $22, $22, $12, $24
          FROM o WHERE EXISTS (SELECT 1 FROM claim)
        RETURNING id),
     new_events AS (
        ",
    priced_new_events!(),
    ", o WHERE EXISTS (SELECT 1 FROM att)),
     ",
    super::events::append_new_events!(),
    "
     SELECT o.* FROM o WHERE EXISTS (SELECT 1 FROM att)"
);

/// [`INSERT_CLAIMING`] for the writes of several requests at once
/// (`store::group_commit`), one row each (`$9`..`$25`: one array per column,
/// then the count of rows; the rows' events are `$1`..`$8`, each naming
/// its row's order). Each part of a row is written only if the part
/// before it of the same row was, so each row is written whole or not at
/// all, as alone. Rows name different orders and keys
/// ([`PaymentWrite::shares_with`]), so no row needs to see another's
/// writes. Returns each order written as locked, with its row's position
/// `n`.
pub const INSERT_CLAIMING_MANY: &str = concat!(
    "WITH i AS (
        SELECT * FROM unnest($9::uuid[], $10::uuid[], $11::text[], $12::bytea[], $13::text[],
                             $14::jsonb[], $15::text[], $16::uuid[], $17::uuid[], $18::bigint[],
                             $19::bigint[], $20::text[], $21::text[], $22::timestamptz[],
                             $23::bigint[], $24::text[])
               WITH ORDINALITY AS i (order_id, merchant_id, idempotency_key, fingerprint,
                                     command, request, recovery_point, attempt_id, lease_token,
                                     lease_ms, ttl_ms, provider, payment_method, created_at,
                                     check_ms, return_url, n)
",
    // The count of rows as a LIMIT: a generic plan guesses it at a tenth of
    // the ten rows it guesses for the arrays, so that every table is read
    // by key (tests/api/plans.rs).
    "         LIMIT $25),
     o AS (
        SELECT i.n, x.* FROM i CROSS JOIN LATERAL (
            SELECT ",
    super::orders::order_columns!(),
    " FROM orders
             WHERE id = i.order_id AND merchant_id = i.merchant_id AND status = 'awaiting_payment'
               AND NOT EXISTS (SELECT 1 FROM payment_attempt p
                                WHERE p.order_id = i.order_id
                                  AND p.status IN ('pending', 'succeeded'))
               FOR UPDATE) x),
     claim AS (
        INSERT INTO idempotency_record ",
    claimed_record_columns!(),
    "
        SELECT i.merchant_id, i.idempotency_key, i.fingerprint, i.command, i.request,
               'executing', i.recovery_point, i.attempt_id, i.lease_token,
               now() + i.lease_ms * interval '1 millisecond',
               now() + i.ttl_ms * interval '1 millisecond'
          FROM i JOIN o USING (n)
         WHERE NOT EXISTS (SELECT 1 FROM idempotency_record r
                            WHERE r.merchant_id = i.merchant_id AND r.idempotency_key = ",
    crate::idempotency::persistence::adopted_key!("i.idempotency_key"),
    // OFFSET 0 keeps this a lookup by key for each row: as an anti-join it
    // was planned as a hash over a scan of the whole table.
    " OFFSET 0)
         ORDER BY i.n
        ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
        RETURNING resource_id),
     att AS (
        INSERT INTO payment_attempt ",
    new_attempt_columns!(),
    "
        SELECT i.attempt_id, i.merchant_id, o.id, i.idempotency_key, o.amount, o.currency,
               'pending', i.provider, i.payment_method,
               now() + i.check_ms * interval '1 millisecond', i.created_at, i.created_at,
               i.fingerprint, i.return_url
          FROM i JOIN o USING (n) JOIN claim c ON c.resource_id = i.attempt_id
        RETURNING order_id),
     new_events AS (
        ",
    priced_new_events!(),
    " JOIN o ON o.id = n.order_id
         WHERE n.order_id IN (SELECT order_id FROM att)),
     ",
    super::events::append_new_events!(),
    "
     SELECT o.* FROM o WHERE o.id IN (SELECT order_id FROM att)"
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
    group: &GroupCommit<PaymentWrite>,
    w: &ClaimingAttempt<'_>,
) -> Result<Option<Order>, StoreError> {
    let row = ClaimRow {
        events: w.events.iter().map(EventRow::of).collect(),
        order_id: w.order_id,
        merchant_id: w.record.id.merchant_id,
        key: w.record.id.key.clone(),
        fingerprint: w.record.fingerprint.to_vec(),
        command: w.record.command.to_string(),
        request: w.record.request.clone(),
        recovery_point: w.recovery_point.to_string(),
        attempt_id: w.attempt_id,
        lease_token: w.lease_token,
        lease_ms: crate::idempotency::persistence::millis(w.record.lease),
        ttl_ms: crate::idempotency::persistence::millis(w.record.ttl),
        provider: w.provider.to_string(),
        payment_method: w.payment_method.to_string(),
        now: w.now,
        check_ms: crate::idempotency::persistence::millis(w.check_after),
        return_url: w.return_url.map(str::to_string),
    };
    match group.fetch_optional(PaymentWrite::Claim(row)).await {
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

/// [`SETTLE_COMPLETING`] for the writes of several requests at once
/// (`store::group_commit`), one row each (`$9`..`$26`: one array per column,
/// then the count of rows; the rows' events are `$1`..`$8`, each naming
/// its row's order). Each row's three rows are locked and checked in the
/// same order and written only if all three are as its command knows
/// them, as alone. Rows name different orders, attempts and records
/// ([`PaymentWrite::shares_with`]). Returns, for each row's position `n`,
/// whether it was written (`ok`).
pub const SETTLE_COMPLETING_MANY: &str = concat!(
    "WITH i AS (
        SELECT * FROM unnest($9::uuid[], $10::text[], $11::timestamptz[], $12::text[],
                             $13::uuid[], $14::text[], $15::text[], $16::text[], $17::text[],
                             $18::timestamptz[], $19::uuid[], $20::text[], $21::uuid[],
                             $22::smallint[], $23::bytea[], $24::text[], $25::boolean[])
               WITH ORDINALITY AS i (order_id, order_status, order_updated_at,
                                     order_status_after, attempt_id, attempt_status, charge_id,
                                     failure_code, failure_message, updated_at, merchant_id,
                                     idempotency_key, lease_token, response_status,
                                     response_body, response_location, confirm_decline, n)
",
    // The count of rows as a LIMIT: a generic plan guesses it at a tenth of
    // the ten rows it guesses for the arrays, so that every table is read
    // by key (tests/api/plans.rs).
    "         LIMIT $26),
     o AS (
        SELECT i.* FROM i CROSS JOIN LATERAL (
            SELECT 1 FROM orders
             WHERE id = i.order_id AND status = i.order_status AND updated_at = i.order_updated_at
               FOR UPDATE) x),
     pl AS (
        SELECT o.* FROM o CROSS JOIN LATERAL (
            SELECT 1 FROM payment_attempt p
             WHERE p.id = o.attempt_id AND p.order_id = o.order_id AND p.status = 'pending'
               AND (p.provider_charge_id IS NULL OR p.provider_charge_id = o.charge_id)
               AND p.failure_code IS NULL AND p.failure_message IS NULL
               FOR UPDATE) x),
     go AS (
        SELECT pl.* FROM pl CROSS JOIN LATERAL (
            SELECT 1 FROM idempotency_record r
             WHERE r.merchant_id = pl.merchant_id AND r.idempotency_key = pl.idempotency_key
               AND r.lease_token = pl.lease_token AND r.state = 'executing'
               FOR UPDATE) x),
     p AS (
        UPDATE payment_attempt
           SET status = go.attempt_status, provider_charge_id = go.charge_id,
               failure_code = go.failure_code, failure_message = go.failure_message,
               updated_at = go.updated_at,
               decline_check_at = CASE WHEN go.confirm_decline THEN payment_attempt.next_check_at END,
               next_action_url = NULL
          FROM go WHERE payment_attempt.id = go.attempt_id
        RETURNING 1),
     ord AS (
        UPDATE orders SET status = go.order_status_after, updated_at = go.updated_at
          FROM go WHERE orders.id = go.order_id AND go.order_status_after <> go.order_status
        RETURNING 1),
     rec AS (
        UPDATE idempotency_record SET ",
    crate::idempotency::persistence::completed!(
        "go.response_status",
        "go.response_body",
        "go.response_location"
    ),
    " FROM go WHERE idempotency_record.merchant_id = go.merchant_id
                  AND idempotency_record.idempotency_key = go.idempotency_key
        RETURNING 1),
     new_events AS (
        SELECT n.* FROM ",
    super::events::new_events_from_params!(),
    " WHERE n.order_id IN (SELECT order_id FROM go)),
     ",
    super::events::append_new_events!(),
    "
     SELECT i.n, i.n IN (SELECT n FROM go) AS ok FROM i"
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
    group: &GroupCommit<PaymentWrite>,
    s: &KnownSettlement<'_>,
    record: &crate::idempotency::persistence::RecordId,
    lease_token: Uuid,
    response: &crate::idempotency::persistence::StoredResponse,
) -> Result<bool, StoreError> {
    let (order, order_after) = s.order;
    let after = s.attempt;
    let row = SettleRow {
        events: s.events.iter().map(EventRow::of).collect(),
        order_id: order.id,
        order_status: order.status.as_str(),
        order_updated_at: order.updated_at,
        order_status_after: order_after.status.as_str(),
        attempt_id: after.id,
        attempt_status: after.status.as_str(),
        charge_id: after.provider_charge_id.clone(),
        failure_code: after.failure_code.clone(),
        failure_message: after.failure_message.clone(),
        updated_at: after.updated_at,
        merchant_id: record.merchant_id,
        key: record.key.clone(),
        lease_token,
        response_status: crate::store::Corrupt::status_column(response.status)?,
        response_body: response.body.clone(),
        response_location: response.location.clone(),
        confirm_decline: s.confirm_decline,
    };
    let ok: Option<bool> = match group.fetch_optional(PaymentWrite::Settle(row)).await? {
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

/// [`FIND_BY_CHARGE_OR_RECORD_REPEAT`] for several provider events at once
/// (`store::group_commit`), one row each (`$1`..`$8`: one array per column,
/// then the count of rows), which name different events
/// ([`PaymentWrite::shares_with`]). Returns each attempt found, with its
/// row's position `n`.
pub const FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY: &str = concat!(
    "WITH i AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[],
                             $6::jsonb[], $7::text[])
               WITH ORDINALITY AS i (provider, charge_id, attempt_id, event_id, event_type,
                                     payload, status, n)
",
    // The count of rows as a LIMIT: a generic plan guesses it at a tenth of
    // the ten rows it guesses for the arrays, so that every table is read
    // by key (tests/api/plans.rs).
    "         LIMIT $8),
     found AS (
        SELECT i.n, f.* FROM i CROSS JOIN LATERAL (
            SELECT ",
    payment_columns_p!(),
    ", ",
    command_executing!(),
    " FROM payment_attempt p
              WHERE p.provider = i.provider AND (p.provider_charge_id = i.charge_id OR p.id = i.attempt_id)
              ORDER BY p.id = i.attempt_id DESC LIMIT 1) f),
     repeat AS (
        INSERT INTO webhook_event (provider, event_id, event_type, payload, outcome)
        SELECT i.provider, i.event_id, i.event_type, i.payload, 'processed'
          FROM i JOIN found USING (n) WHERE found.status = i.status
        ON CONFLICT DO NOTHING RETURNING provider, event_id)
     SELECT found.*,
            EXISTS (SELECT 1 FROM repeat JOIN i USING (provider, event_id)
                     WHERE i.n = found.n) AS repeat_recorded
       FROM found"
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
    group: &GroupCommit<PaymentWrite>,
    event: &ChargeEvent<'_>,
) -> Result<Option<(Found, bool)>, StoreError> {
    let row = RepeatRow {
        provider: event.provider.to_string(),
        charge_id: event.charge_id.to_string(),
        attempt_id: event.attempt_id,
        event_id: event.event_id.to_string(),
        event_type: event.event_type.to_string(),
        payload: event.payload.clone(),
        status: event.status.as_str(),
    };
    let row = group.fetch_optional(PaymentWrite::Repeat(row)).await?;
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

/// A payment's write that goes through the group commit: one row of
/// [`INSERT_CLAIMING`], [`SETTLE_COMPLETING`] or
/// [`FIND_BY_CHARGE_OR_RECORD_REPEAT`], which concurrent requests' writes
/// of the same kind share (see `store::group_commit`).
pub enum PaymentWrite {
    /// A payment's first step ([`insert_claiming`]).
    Claim(ClaimRow),
    /// A command's own settlement ([`settle_completing`]).
    Settle(SettleRow),
    /// A provider event that may repeat what we hold
    /// ([`find_by_charge_or_record_repeat`]).
    Repeat(RepeatRow),
}

/// A row of [`INSERT_CLAIMING`]: what [`ClaimingAttempt`] says, owned.
pub struct ClaimRow {
    events: Vec<EventRow>,
    order_id: Uuid,
    merchant_id: Uuid,
    key: String,
    fingerprint: Vec<u8>,
    command: String,
    request: serde_json::Value,
    recovery_point: String,
    attempt_id: Uuid,
    lease_token: Uuid,
    lease_ms: i64,
    ttl_ms: i64,
    provider: String,
    payment_method: String,
    now: DateTime<Utc>,
    check_ms: i64,
    return_url: Option<String>,
}

/// A row of [`SETTLE_COMPLETING`]: what [`KnownSettlement`] and the
/// command's record say, owned.
pub struct SettleRow {
    events: Vec<EventRow>,
    order_id: Uuid,
    order_status: &'static str,
    order_updated_at: DateTime<Utc>,
    order_status_after: &'static str,
    attempt_id: Uuid,
    attempt_status: &'static str,
    charge_id: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    updated_at: DateTime<Utc>,
    merchant_id: Uuid,
    key: String,
    lease_token: Uuid,
    response_status: i16,
    response_body: Vec<u8>,
    response_location: Option<String>,
    confirm_decline: bool,
}

/// A row of [`FIND_BY_CHARGE_OR_RECORD_REPEAT`]: what [`ChargeEvent`]
/// says, owned.
pub struct RepeatRow {
    provider: String,
    charge_id: String,
    attempt_id: Option<Uuid>,
    event_id: String,
    event_type: String,
    payload: serde_json::Value,
    status: &'static str,
}

/// Whether `key` could be the adopted form of another key
/// (`idempotency::persistence::adopted_key`): a claim looks for that form,
/// which another row of its statement could be inserting unseen.
fn adoptable(key: &str) -> bool {
    key.starts_with("adopted ")
}

impl super::group_commit::Write for PaymentWrite {
    fn shares_with(&self, other: &Self) -> bool {
        match (self, other) {
            (PaymentWrite::Claim(a), PaymentWrite::Claim(b)) => {
                a.order_id != b.order_id
                    && (a.merchant_id, &a.key) != (b.merchant_id, &b.key)
                    && !adoptable(&a.key)
                    && !adoptable(&b.key)
            }
            (PaymentWrite::Settle(a), PaymentWrite::Settle(b)) => {
                a.order_id != b.order_id
                    && a.attempt_id != b.attempt_id
                    && (a.merchant_id, &a.key) != (b.merchant_id, &b.key)
            }
            (PaymentWrite::Repeat(a), PaymentWrite::Repeat(b)) => {
                (&a.provider, &a.event_id) != (&b.provider, &b.event_id)
            }
            _ => false,
        }
    }

    /// A settlement first: a provider's webhook for the same charge in
    /// the same group then finds it settled, the cheap path.
    fn order(&self) -> u8 {
        match self {
            PaymentWrite::Settle(_) => 0,
            PaymentWrite::Claim(_) => 1,
            PaymentWrite::Repeat(_) => 2,
        }
    }

    fn statement(rows: &[&Self]) -> Result<Statement, StoreError> {
        match rows.first() {
            Some(PaymentWrite::Claim(_)) => claims(&of_kind(rows, |w| match w {
                PaymentWrite::Claim(r) => Some(r),
                _ => None,
            })?),
            Some(PaymentWrite::Settle(_)) => settlements(&of_kind(rows, |w| match w {
                PaymentWrite::Settle(r) => Some(r),
                _ => None,
            })?),
            Some(PaymentWrite::Repeat(_)) => repeats(&of_kind(rows, |w| match w {
                PaymentWrite::Repeat(r) => Some(r),
                _ => None,
            })?),
            None => Err(StoreError::Other(sqlx::Error::Protocol(
                "a statement of no rows".into(),
            ))),
        }
    }
}

/// The rows of one kind; an error if one is of another (a bug in the
/// group commit, which only puts writes that share together).
fn of_kind<'r, R>(
    rows: &[&'r PaymentWrite],
    kind: impl Fn(&'r PaymentWrite) -> Option<&'r R>,
) -> Result<Vec<&'r R>, StoreError> {
    rows.iter()
        .map(|w| kind(w))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            StoreError::Other(sqlx::Error::Protocol(
                "writes of different kinds in one statement".into(),
            ))
        })
}

/// The events of all `rows`, as one batch.
fn events_of<'r, R>(rows: &[&'r R], events: impl Fn(&'r R) -> &'r [EventRow]) -> Vec<NewEvent<'r>> {
    rows.iter()
        .flat_map(|r| events(r))
        .map(EventRow::as_new)
        .collect()
}

fn claims(rows: &[&ClaimRow]) -> Result<Statement, StoreError> {
    if let [r] = rows {
        let events: Vec<_> = r.events.iter().map(EventRow::as_new).collect();
        return Statement::of(INSERT_CLAIMING, |q| {
            super::events::bind_events(q, &events)
                .bind(r.order_id)
                .bind(r.merchant_id)
                .bind(r.key.as_str())
                .bind(r.fingerprint.as_slice())
                .bind(r.command.as_str())
                .bind(&r.request)
                .bind(r.recovery_point.as_str())
                .bind(r.attempt_id)
                .bind(r.lease_token)
                .bind(r.lease_ms)
                .bind(r.ttl_ms)
                .bind(r.provider.as_str())
                .bind(r.payment_method.as_str())
                .bind(r.now)
                .bind(r.check_ms)
                .bind(r.return_url.as_deref())
        });
    }
    let events = events_of(rows, |r| &r.events);
    Statement::of(INSERT_CLAIMING_MANY, |q| {
        super::events::bind_events(q, &events)
            .bind(column(rows, |r| r.order_id))
            .bind(column(rows, |r| r.merchant_id))
            .bind(column(rows, |r| r.key.as_str()))
            .bind(column(rows, |r| r.fingerprint.as_slice()))
            .bind(column(rows, |r| r.command.as_str()))
            .bind(column(rows, |r| &r.request))
            .bind(column(rows, |r| r.recovery_point.as_str()))
            .bind(column(rows, |r| r.attempt_id))
            .bind(column(rows, |r| r.lease_token))
            .bind(column(rows, |r| r.lease_ms))
            .bind(column(rows, |r| r.ttl_ms))
            .bind(column(rows, |r| r.provider.as_str()))
            .bind(column(rows, |r| r.payment_method.as_str()))
            .bind(column(rows, |r| r.now))
            .bind(column(rows, |r| r.check_ms))
            .bind(column(rows, |r| r.return_url.as_deref()))
            .bind(rows.len() as i64)
    })
}

fn settlements(rows: &[&SettleRow]) -> Result<Statement, StoreError> {
    if let [r] = rows {
        let events: Vec<_> = r.events.iter().map(EventRow::as_new).collect();
        return Statement::of(SETTLE_COMPLETING, |q| {
            super::events::bind_events(q, &events)
                .bind(r.order_id)
                .bind(r.order_status)
                .bind(r.order_updated_at)
                .bind(r.order_status_after)
                .bind(r.attempt_id)
                .bind(r.attempt_status)
                .bind(r.charge_id.as_deref())
                .bind(r.failure_code.as_deref())
                .bind(r.failure_message.as_deref())
                .bind(r.updated_at)
                .bind(r.merchant_id)
                .bind(r.key.as_str())
                .bind(r.lease_token)
                .bind(r.response_status)
                .bind(r.response_body.as_slice())
                .bind(r.response_location.as_deref())
                .bind(r.confirm_decline)
        });
    }
    let events = events_of(rows, |r| &r.events);
    Statement::of(SETTLE_COMPLETING_MANY, |q| {
        super::events::bind_events(q, &events)
            .bind(column(rows, |r| r.order_id))
            .bind(column(rows, |r| r.order_status))
            .bind(column(rows, |r| r.order_updated_at))
            .bind(column(rows, |r| r.order_status_after))
            .bind(column(rows, |r| r.attempt_id))
            .bind(column(rows, |r| r.attempt_status))
            .bind(column(rows, |r| r.charge_id.as_deref()))
            .bind(column(rows, |r| r.failure_code.as_deref()))
            .bind(column(rows, |r| r.failure_message.as_deref()))
            .bind(column(rows, |r| r.updated_at))
            .bind(column(rows, |r| r.merchant_id))
            .bind(column(rows, |r| r.key.as_str()))
            .bind(column(rows, |r| r.lease_token))
            .bind(column(rows, |r| r.response_status))
            .bind(column(rows, |r| r.response_body.as_slice()))
            .bind(column(rows, |r| r.response_location.as_deref()))
            .bind(column(rows, |r| r.confirm_decline))
            .bind(rows.len() as i64)
    })
}

fn repeats(rows: &[&RepeatRow]) -> Result<Statement, StoreError> {
    if let [r] = rows {
        return Statement::of(FIND_BY_CHARGE_OR_RECORD_REPEAT, |q| {
            q.bind(r.provider.as_str())
                .bind(r.charge_id.as_str())
                .bind(r.attempt_id)
                .bind(r.event_id.as_str())
                .bind(r.event_type.as_str())
                .bind(&r.payload)
                .bind(r.status)
        });
    }
    Statement::of(FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY, |q| {
        q.bind(column(rows, |r| r.provider.as_str()))
            .bind(column(rows, |r| r.charge_id.as_str()))
            .bind(column(rows, |r| r.attempt_id))
            .bind(column(rows, |r| r.event_id.as_str()))
            .bind(column(rows, |r| r.event_type.as_str()))
            .bind(column(rows, |r| &r.payload))
            .bind(column(rows, |r| r.status))
            .bind(rows.len() as i64)
    })
}

#[cfg(test)]
mod tests {
    use crate::domain::order::OrderStatus;

    /// The one-statement payment writes "the order is payable" in SQL; it
    /// must say what `OrderStatus::is_payable` says, for every status.
    #[test]
    fn the_claiming_statement_pays_exactly_the_payable_orders() {
        for status in OrderStatus::ALL {
            for sql in [super::INSERT_CLAIMING, super::INSERT_CLAIMING_MANY] {
                let named = sql.contains(&format!("status = '{}'", status.as_str()));
                assert_eq!(named, status.is_payable(), "{status:?}");
            }
        }
    }
}
