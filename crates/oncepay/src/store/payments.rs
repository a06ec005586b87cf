//! SQL of payment attempts. The table's constraints are the second and third
//! lines of defence against a double charge (see the migration).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::events::{bind_events, EventRow, NewEvent};
use super::group_commit::{GroupCommit, Statement};
use super::{form, Corrupt, PgQuery, StoreError};
use crate::domain::order::Order;
use crate::domain::origin::Origin;
use crate::domain::payment::{CaptureMethod, NextAction, Payment, PaymentStatus, VoidReason};
use crate::idempotency::persistence::millis;
use crate::idempotency::{Claiming, Completing};

/// The columns every read of a payment attempt returns, in `from_row`'s order.
macro_rules! payment_columns {
    () => {
        "id, order_id, amount, currency, status, provider, provider_charge_id, failure_code, failure_message, refunded_amount, created_at, updated_at, payment_method, merchant_id, idempotency_key, request_fingerprint, next_action_url, next_action_client_secret, action_required_at, return_url, capture_method, amount_captured, capture_before, void_reason"
    };
}

/// The same columns qualified with the alias `p`, for joins and updates.
macro_rules! payment_columns_p {
    () => {
        "p.id, p.order_id, p.amount, p.currency, p.status, p.provider, p.provider_charge_id, p.failure_code, p.failure_message, p.refunded_amount, p.created_at, p.updated_at, p.payment_method, p.merchant_id, p.idempotency_key, p.request_fingerprint, p.next_action_url, p.next_action_client_secret, p.action_required_at, p.return_url, p.capture_method, p.amount_captured, p.capture_before, p.void_reason"
    };
}

/// The columns of a new attempt, in [`INSERT`]'s and
/// [`INSERT_CLAIMING`]'s order.
macro_rules! new_attempt_columns {
    () => {
        "(id, merchant_id, order_id, idempotency_key, amount, currency, status, provider,
          payment_method, next_check_at, created_at, updated_at, request_fingerprint, return_url,
          capture_method)"
    };
}

/// A first step's events (`new_events_from_params`, as `n`), each object
/// given its order's amount and currency (the order's row as `o`).
macro_rules! priced_new_events {
    () => {
        concat!(
            "SELECT n.id, n.type, n.object_type, n.object_id, n.order_id,
               n.data || jsonb_build_object('amount', o.amount, 'currency', o.currency) AS data,
               n.cause, n.request_id, n.actor
          FROM ",
            super::events::new_events_from_params!()
        )
    };
}

fn from_row(row: &PgRow) -> Result<Payment, StoreError> {
    let status: String = row.try_get("status")?;
    let status =
        PaymentStatus::parse(&status).ok_or_else(|| Corrupt::unknown("payment status", &status))?;
    let method: String = row.try_get("capture_method")?;
    let capture_method =
        CaptureMethod::parse(&method).ok_or_else(|| Corrupt::unknown("capture method", &method))?;
    let void_reason = row
        .try_get::<Option<String>, _>("void_reason")?
        .map(|r| VoidReason::parse(&r).ok_or_else(|| Corrupt::unknown("void reason", &r)))
        .transpose()?;
    let held = status == PaymentStatus::RequiresCapture;
    let amount: i64 = row.try_get("amount")?;
    Ok(Payment {
        capture_method,
        amount_capturable: if held { amount } else { 0 },
        amount_captured: row.try_get("amount_captured")?,
        capture_before: row
            .try_get::<Option<DateTime<Utc>>, _>("capture_before")?
            .filter(|_| held),
        void_reason: void_reason.filter(|_| status == PaymentStatus::Voided),
        void_requested: void_reason.filter(|_| held),
        id: row.try_get("id")?,
        order_id: row.try_get("order_id")?,
        amount,
        currency: row.try_get("currency")?,
        status,
        provider: row.try_get("provider")?,
        provider_charge_id: row.try_get("provider_charge_id")?,
        failure_code: row.try_get("failure_code")?,
        failure_message: row.try_get("failure_message")?,
        refunded_amount: row.try_get("refunded_amount")?,
        next_action: match (
            row.try_get::<Option<String>, _>("next_action_url")?,
            row.try_get::<Option<String>, _>("next_action_client_secret")?,
        ) {
            (Some(url), _) => Some(NextAction::Redirect { url }),
            (None, Some(client_secret)) => Some(NextAction::UseStripeSdk { client_secret }),
            (None, None) => None,
        },
        dispute: None,
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
    /// Captured at once, or held.
    pub capture_method: CaptureMethod,
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
                 now() + $10::bigint * interval '1 millisecond', $9, $9, $11, $12, $13)
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
        .bind(new.capture_method.as_str())
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

/// The order's live attempts as the rows of `payment_attempt p`, for the
/// order in the SQL expression `$order`: the one definition of "a live
/// attempt" (pending or succeeded). An order has at most one
/// (`payment_attempt_one_live_per_order`, whose predicate this is, so
/// that it is read through that index) and is paid only while it has none.
macro_rules! live_attempts_of {
    ($order:literal) => {
        concat!(
            "payment_attempt p WHERE p.order_id = ",
            $order,
            " AND p.status IN ('pending', 'requires_capture', 'succeeded')"
        )
    };
}

/// The order's live attempt (see [`live_attempts_of`]).
pub const LIVE_ATTEMPT: &str = concat!(
    "SELECT ",
    payment_columns_p!(),
    " FROM ",
    live_attempts_of!("$1")
);

row_statement! {
    /// A payment's first step and the claim of its key in one statement (one
    /// round trip, one synchronous commit), when the key is new, for each row
    /// ([`ClaimingAttempt`]; `$10`..`$25`, the count of rows `$26`, the rows'
    /// events `$1`..`$9`, each naming its row's order): the order, locked, if
    /// it awaits payment with no live attempt; the idempotency record,
    /// claimed under our lease and already at the step's recovery point; the
    /// pending attempt, with the order's amount and currency; its event, whose
    /// object gets the same amount and currency from the order's row. Each
    /// part of a row is written only if the part before it was, so each row
    /// is written whole or not at all: not when the key has a record (`ON
    /// CONFLICT DO NOTHING`) or the order is not payable, and an error, mapped
    /// to nothing, when the attempt's constraints refuse it (a live attempt
    /// that committed meanwhile, the key used). Rows name different orders and
    /// keys ([`PaymentWrite::shares_with`]), so no row needs to see another's
    /// writes. Returns each order written as locked, with its row's `n`.
    INSERT_CLAIMING, INSERT_CLAIMING_MANY, "$26";
    fn claiming_columns(r: &ClaimingAttempt) {
        "$10::uuid" order_id = r.order_id,
        "$11::uuid" merchant_id = r.claim.fence().record().merchant_id,
        "$12::text" idempotency_key = r.claim.fence().record().key.as_str(),
        "$13::bytea" fingerprint = r.claim.intent().fingerprint(),
        "$14::text" command = r.claim.intent().command(),
        "$15::jsonb" request = r.claim.intent().input(),
        "$16::text" recovery_point = r.claim.point(),
        "$17::uuid" attempt_id = r.attempt_id,
        "$18::uuid" lease_token = r.claim.fence().token(),
        "$19::bigint" lease_ms = millis(r.claim.lease()),
        "$20::bigint" ttl_ms = millis(r.claim.intent().ttl()),
        "$21::text" provider = r.provider.as_str(),
        "$22::text" payment_method = r.payment_method.as_str(),
        "$23::timestamptz" created_at = r.now,
        "$24::bigint" check_ms = millis(r.check_after),
        "$25::text" return_url = r.return_url.as_deref(),
    }
    ",
     o AS (
        SELECT i.n, x.* FROM i CROSS JOIN LATERAL (
            SELECT ",
    super::orders::order_columns!(),
    " FROM orders
             WHERE id = i.order_id AND merchant_id = i.merchant_id AND status = 'awaiting_payment'
               -- A reserving order's payment holds its stock while in
               -- flight (`inventory::hold_for_payment`): the locking way.
               AND stock_reserved_until IS NULL
               AND NOT EXISTS (SELECT 1 FROM ",
    live_attempts_of!("i.order_id"),
    ")
               FOR UPDATE) x),
     claim AS (
        INSERT INTO idempotency_record
               (merchant_id, idempotency_key, fingerprint, command, request, state,
                recovery_point, resource_id, lease_token, lease_expires_at, expires_at)
        SELECT i.merchant_id, i.idempotency_key, i.fingerprint, i.command, i.request,
               'executing', i.recovery_point, i.attempt_id, i.lease_token,
               now() + i.lease_ms * interval '1 millisecond',
               now() + i.ttl_ms * interval '1 millisecond'
          FROM i JOIN o USING (n)
         WHERE NOT EXISTS (SELECT 1 FROM idempotency_record r
                            WHERE r.merchant_id = i.merchant_id AND r.idempotency_key = ",
    crate::idempotency::persistence::adopted_key!("i.idempotency_key"),
    // OFFSET 0 keeps this a lookup by key for each row: as an
    // anti-join it was planned as a hash over a scan of the whole
    // table.
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
               i.fingerprint, i.return_url, 'automatic'
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
}

/// A payment's first step, written with the claim of its key: the
/// attempt, its event, and the fence of the record it claims.
pub struct ClaimingAttempt {
    /// The record to claim, under the engine's new lease.
    pub claim: Claiming,
    /// The order to pay.
    pub order_id: Uuid,
    /// The new attempt's id (also its provider key, and the record's
    /// resource).
    pub attempt_id: Uuid,
    /// Provider name.
    pub provider: String,
    /// Provider token.
    pub payment_method: String,
    /// Creation time, in the database's microseconds.
    pub now: DateTime<Utc>,
    /// When the reconciler should first look at it if it stays pending.
    pub check_after: Duration,
    /// The attempt's events, their objects without the order's amount and
    /// currency (the statement adds them).
    pub events: Vec<EventRow>,
    /// Where the customer's bank sends them back (3-D Secure).
    pub return_url: Option<String>,
}

/// See [`INSERT_CLAIMING`]: the order as locked. `None`: nothing was
/// written, and the caller goes through the engine's full protocol, which
/// decides.
pub(crate) async fn insert_claiming(
    group: &GroupCommit<PaymentWrite>,
    attempt: ClaimingAttempt,
) -> Result<Option<Order>, StoreError> {
    match group.fetch_optional(PaymentWrite::Claim(attempt)).await {
        Ok(row) => row.as_ref().map(super::orders::from_row).transpose(),
        Err(e) => match super::violated_constraint(&e) {
            Some("payment_attempt_order_key_uniq" | "payment_attempt_one_live_per_order") => {
                Ok(None)
            }
            _ => Err(e.into()),
        },
    }
}

row_statement! {
    /// A command's own charge settled, and the command completed, in one
    /// statement (one round trip, one synchronous commit), for each row
    /// ([`KnownSettlement`]; `$10`..`$26`, the count of rows `$27`, the rows'
    /// events `$1`..`$9`, each naming its row's order): the order, the
    /// attempt and the idempotency record are locked first (in that order, as
    /// everywhere) and checked to be as the command knows them — the order
    /// with the status and `updated_at` it read, the attempt still pending
    /// with no provider facts, the record under our lease — and only if all
    /// three are, the attempt takes its new status and facts, the order its
    /// new status (when it moves), the record the response, and the events
    /// are written. Otherwise nothing of the row is written (a webhook or the
    /// reconciler settled the attempt first, or the lease was lost), and the
    /// caller settles the usual way, under locks. Rows name different orders,
    /// attempts and records ([`PaymentWrite::shares_with`]). Returns, for each
    /// row's `n`, whether it was written (`ok`).
    SETTLE_COMPLETING, SETTLE_COMPLETING_MANY, "$27";
    fn settlement_columns(r: &SettleRow) {
        "$10::uuid" order_id = r.settlement.order.0.id,
        "$11::text" order_status = r.settlement.order.0.status.as_str(),
        "$12::timestamptz" order_updated_at = r.settlement.order.0.updated_at,
        "$13::text" order_status_after = r.settlement.order.1.status.as_str(),
        "$14::uuid" attempt_id = r.settlement.attempt.id,
        "$15::text" attempt_status = r.settlement.attempt.status.as_str(),
        "$16::text" charge_id = r.settlement.attempt.provider_charge_id.as_deref(),
        "$17::text" failure_code = r.settlement.attempt.failure_code.as_deref(),
        "$18::text" failure_message = r.settlement.attempt.failure_message.as_deref(),
        "$19::timestamptz" updated_at = r.settlement.attempt.updated_at,
        "$20::uuid" merchant_id = r.settlement.completion.fence().record().merchant_id,
        "$21::text" idempotency_key = r.settlement.completion.fence().record().key.as_str(),
        "$22::uuid" lease_token = r.settlement.completion.fence().token(),
        "$23::smallint" response_status = r.response_status,
        "$24::bytea" response_body = r.settlement.completion.response().body.as_slice(),
        "$25::text" response_location = r.settlement.completion.response().location.as_deref(),
        "$26::boolean" confirm_decline = r.settlement.confirm_decline,
    }
    ",
     o AS (
        SELECT i.* FROM i CROSS JOIN LATERAL (
            SELECT 1 FROM orders
             WHERE id = i.order_id AND status = i.order_status AND updated_at = i.order_updated_at
               -- An order paid takes its tracked SKUs out of the stock
               -- (`inventory::follow_order`): the locking way.
               AND (i.order_status_after <> 'paid' OR NOT EXISTS (
                    SELECT 1 FROM ledger_account a
                     WHERE a.merchant_id = orders.merchant_id AND a.ledger = 'stock'
                       AND a.kind = 'holder' AND a.owner = 'on_hand'
                       AND a.unit IN (SELECT e->>'sku' FROM jsonb_array_elements(orders.items) e)))
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
               next_action_url = NULL, next_action_client_secret = NULL
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
}

/// What [`settle_completing`] checks and writes: the rows as the command
/// knows them and as they become, and the fence of the record it
/// completes.
pub struct KnownSettlement {
    /// The record to complete under our lease, and its response.
    pub completion: Completing,
    /// The order as read, and as it becomes.
    pub order: (Order, Order),
    /// The attempt as it becomes (it was pending, with no provider facts).
    pub attempt: Payment,
    /// The changes' events.
    pub events: Vec<EventRow>,
    /// Whether the attempt's decline is to be confirmed by a status read
    /// (see `store::queue::confirm_decline_later`).
    pub confirm_decline: bool,
}

/// A row of [`SETTLE_COMPLETING`]: the settlement, and its response's
/// status as its column holds it.
pub struct SettleRow {
    settlement: KnownSettlement,
    response_status: i16,
}

/// See [`SETTLE_COMPLETING`]. `false`: nothing was written.
pub(crate) async fn settle_completing(
    group: &GroupCommit<PaymentWrite>,
    settlement: KnownSettlement,
) -> Result<bool, StoreError> {
    let response_status = Corrupt::status_column(settlement.completion.response().status)?;
    let row = SettleRow {
        settlement,
        response_status,
    };
    let ok: Option<bool> = match group
        .fetch_optional(PaymentWrite::Settle(Box::new(row)))
        .await?
    {
        Some(row) => row.try_get("ok")?,
        None => None,
    };
    Ok(ok == Some(true))
}

/// The attempt `query` reads, if any.
async fn optional(
    conn: &mut PgConnection,
    query: PgQuery<'_>,
) -> Result<Option<Payment>, StoreError> {
    let row = query.fetch_optional(conn).await?;
    row.as_ref().map(from_row).transpose()
}

/// The attempt `query` reads, which must exist.
async fn one(conn: &mut PgConnection, query: PgQuery<'_>) -> Result<Payment, StoreError> {
    from_row(&query.fetch_one(conn).await?)
}

/// The order's pending or succeeded attempt, if it has one; see
/// [`LIVE_ATTEMPT`].
pub async fn live_attempt(
    tx: &mut PgConnection,
    order_id: Uuid,
) -> Result<Option<Payment>, StoreError> {
    optional(tx, sqlx::query(LIVE_ATTEMPT).bind(order_id)).await
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
    optional(conn, sqlx::query(GET).bind(id).bind(merchant_id)).await
}

/// Locks an attempt.
pub const LOCK: &str = concat!(
    "SELECT ",
    payment_columns!(),
    " FROM payment_attempt WHERE id = $1 FOR UPDATE"
);

/// Reads and row-locks an attempt (any merchant: callers already scoped it).
pub async fn lock(tx: &mut PgConnection, id: Uuid) -> Result<Option<Payment>, StoreError> {
    optional(tx, sqlx::query(LOCK).bind(id)).await
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

row_statement! {
    /// For each provider event ([`ChargeEvent`]; `$1`..`$7`, the count of
    /// rows `$8`), finds the attempt it is about (by the provider's charge
    /// id, or our attempt id where the event carries it), and in the same
    /// statement records the event as `processed` when it only repeats what
    /// we hold (its status is the attempt's: the command, or an earlier
    /// delivery, already settled it). Such an event, the common case (a
    /// provider's webhook for a charge its own answer settled), then costs one
    /// round trip and no provider read. Rows name different events
    /// ([`PaymentWrite::shares_with`]). Returns each attempt found, with its
    /// row's `n`.
    FIND_BY_CHARGE_OR_RECORD_REPEAT, FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY, "$8";
    fn repeat_columns(r: &RepeatRow) {
        "$1::text" provider = r.provider.as_str(),
        "$2::text" charge_id = r.charge_id.as_str(),
        "$3::uuid" attempt_id = r.attempt_id,
        "$4::text" event_id = r.event_id.as_str(),
        "$5::text" event_type = r.event_type.as_str(),
        "$6::jsonb" payload = &r.payload,
        "$7::text" status = r.status.as_str(),
    }
    ",
     found AS (
        SELECT i.n, f.* FROM i CROSS JOIN LATERAL (
            SELECT ",
    payment_columns_p!(),
    ", ",
    command_executing!(),
    // Two lookups by key, not one `OR`: planned on a new deployment's
    // empty table (as wide as a payment's row is since V19), the `OR`
    // was a scan of the whole table.
    " FROM (SELECT * FROM payment_attempt
                     WHERE id = i.attempt_id AND provider = i.provider
                    UNION ALL
                    SELECT * FROM payment_attempt
                     WHERE provider = i.provider AND provider_charge_id = i.charge_id) p
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
}

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
    pub status: PaymentStatus,
}

/// A row of [`FIND_BY_CHARGE_OR_RECORD_REPEAT`]: a [`ChargeEvent`], owned.
pub struct RepeatRow {
    provider: String,
    charge_id: String,
    attempt_id: Option<Uuid>,
    event_id: String,
    event_type: String,
    payload: serde_json::Value,
    status: PaymentStatus,
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
        status: event.status,
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
    let query = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt WHERE order_id = $1 AND idempotency_key = $2"
    ));
    optional(conn, query.bind(order_id).bind(key)).await
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
#[derive(Default)]
pub struct ChargeFacts<'a> {
    /// The provider's charge id, if it gave one.
    pub charge_id: Option<&'a str>,
    /// Failure code, for a failed charge.
    pub failure_code: Option<&'a str>,
    /// Failure message, for a failed charge.
    pub failure_message: Option<&'a str>,
    /// A hold's deadline, for an authorized charge.
    pub capture_before: Option<DateTime<Utc>>,
    /// What was captured, for a manual charge that succeeded (`None`: all).
    pub amount_captured: Option<i64>,
    /// Why a hold ended, for a voided one (kept if a void was asked for).
    pub void_reason: Option<VoidReason>,
}

/// Writes an attempt's status and provider facts. A hold's deadline is
/// kept once known; a manual capture's amount is written as it succeeds
/// (an automatic one's by the table's trigger); the reason a void was
/// asked for is kept.
pub const SET_STATUS: &str = concat!(
    "UPDATE payment_attempt
            SET status = $2, provider_charge_id = COALESCE(provider_charge_id, $3),
                failure_code = COALESCE($4, failure_code),
                failure_message = COALESCE($5, failure_message), updated_at = now(),
                next_action_url = CASE WHEN $2 = 'pending' THEN next_action_url END,
                next_action_client_secret = CASE WHEN $2 = 'pending' THEN next_action_client_secret END,
                capture_before = COALESCE(capture_before, $6),
                amount_captured = CASE WHEN $2 = 'succeeded' AND status <> 'succeeded'
                                       THEN COALESCE($7, amount) ELSE amount_captured END,
                void_reason = CASE WHEN $2 = 'voided' THEN COALESCE(void_reason, $8, 'expired')
                                   ELSE void_reason END
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
    let query = sqlx::query(SET_STATUS)
        .bind(id)
        .bind(status.as_str())
        .bind(facts.charge_id)
        .bind(facts.failure_code)
        .bind(facts.failure_message)
        .bind(facts.capture_before)
        .bind(facts.amount_captured)
        .bind(facts.void_reason.map(VoidReason::as_str));
    one(tx, query).await
}

/// Asks for the void of a hold (`reason`), which stays `requires_capture`
/// until its provider confirms: from now no capture may start. `None` if
/// it is no longer a hold, or a void was asked for already.
pub(crate) async fn request_void(
    tx: &mut PgConnection,
    id: Uuid,
    reason: VoidReason,
    check_after: Duration,
) -> Result<Option<Payment>, StoreError> {
    let query = sqlx::query(concat!(
        "UPDATE payment_attempt
            SET void_reason = $2, updated_at = now(),
                next_check_at = now() + $3::bigint * interval '1 millisecond', check_count = 0
          WHERE id = $1 AND status = 'requires_capture' AND void_reason IS NULL
          RETURNING ",
        payment_columns!()
    ));
    let ms = i64::try_from(check_after.as_millis()).unwrap_or(i64::MAX);
    optional(tx, query.bind(id).bind(reason.as_str()).bind(ms)).await
}

/// Claims up to `limit` holds due for a void (one asked for, or past
/// their deadline) with no capture under way or made, pushing their next
/// look back (a lease, so processes share them): the sweeper's work.
pub(crate) async fn claim_holds_to_void(
    pool: &sqlx::PgPool,
    limit: i64,
) -> Result<Vec<Payment>, StoreError> {
    let rows = sqlx::query(concat!(
        "UPDATE payment_attempt p
            SET next_check_at = ",
        next_check_after_claim!("p"),
        ", check_count = p.check_count + 1
           FROM (SELECT h.id FROM payment_attempt h
                  WHERE h.status = 'requires_capture'
                    AND (h.void_reason IS NOT NULL OR h.capture_before <= now())
                    AND h.next_check_at <= now()
                    AND NOT EXISTS (SELECT 1 FROM payment_capture c
                                     WHERE c.payment_id = h.id AND c.status <> 'failed')
                  ORDER BY h.capture_before LIMIT $1 FOR UPDATE SKIP LOCKED) due
          WHERE p.id = due.id
         RETURNING ",
        payment_columns_p!()
    ))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Marks, once each, up to `limit` holds whose deadline is within
/// `ahead`: the reminder is written for these (in `tx`).
pub(crate) async fn holds_to_remind(
    tx: &mut PgConnection,
    ahead: Duration,
    limit: i64,
) -> Result<Vec<Payment>, StoreError> {
    let ms = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
    let rows = sqlx::query(concat!(
        "UPDATE payment_attempt p SET capture_reminded_at = now()
           FROM (SELECT h.id FROM payment_attempt h
                  WHERE h.status = 'requires_capture' AND h.capture_reminded_at IS NULL
                    AND h.void_reason IS NULL
                    AND h.capture_before <= now() + $1::bigint * interval '1 millisecond'
                  ORDER BY h.capture_before LIMIT $2 FOR UPDATE SKIP LOCKED) due
          WHERE p.id = due.id
         RETURNING ",
        payment_columns_p!()
    ))
    .bind(ms)
    .bind(limit)
    .fetch_all(tx)
    .await?;
    rows.iter().map(from_row).collect()
}

/// A pending attempt now waits for its customer, as `action` says (from
/// the first time, for the reconciler's timeout, whatever the action).
/// `None` if it is no longer pending.
pub(crate) async fn require_action(
    tx: &mut PgConnection,
    id: Uuid,
    action: &NextAction,
) -> Result<Option<Payment>, StoreError> {
    let (url, client_secret) = match action {
        NextAction::Redirect { url } => (Some(url.as_str()), None),
        NextAction::UseStripeSdk { client_secret } => (None, Some(client_secret.as_str())),
    };
    let query = sqlx::query(concat!(
        "UPDATE payment_attempt
            SET next_action_url = $2, next_action_client_secret = $3,
                action_required_at = coalesce(action_required_at, now()),
                updated_at = now()
          WHERE id = $1 AND status = 'pending'
          RETURNING ",
        payment_columns!()
    ));
    optional(tx, query.bind(id).bind(url).bind(client_secret)).await
}

/// Records the provider's object opened for a pending attempt (Stripe's
/// PaymentIntent), before it is confirmed. `None` if the attempt is no
/// longer pending or holds another object: the caller reads it again.
pub(crate) async fn set_reference(
    tx: &mut PgConnection,
    id: Uuid,
    reference: &str,
) -> Result<Option<Payment>, StoreError> {
    let query = sqlx::query(concat!(
        "UPDATE payment_attempt SET provider_charge_id = $2, updated_at = now()
          WHERE id = $1 AND status = 'pending'
            AND (provider_charge_id IS NULL OR provider_charge_id = $2)
          RETURNING ",
        payment_columns!()
    ));
    optional(tx, query.bind(id).bind(reference)).await
}

/// Adds a succeeded refund's amount to the attempt.
pub(crate) async fn add_refunded(
    tx: &mut PgConnection,
    id: Uuid,
    amount: i64,
) -> Result<Payment, StoreError> {
    let query = sqlx::query(concat!(
        "UPDATE payment_attempt SET refunded_amount = refunded_amount + $2, updated_at = now()
          WHERE id = $1 RETURNING ",
        payment_columns!()
    ));
    one(tx, query.bind(id).bind(amount)).await
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
    let query = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt
          WHERE order_id = $1 AND status = 'succeeded' FOR UPDATE"
    ));
    optional(tx, query.bind(order_id)).await
}

/// Reads an attempt by id alone (see [`by_id`]).
pub const BY_ID: &str = concat!(
    "SELECT ",
    payment_columns!(),
    " FROM payment_attempt WHERE id = $1"
);

/// An attempt by id alone (no merchant scope, no lock): for work that
/// starts from a row that names it.
pub async fn by_id(conn: &mut PgConnection, id: Uuid) -> Result<Option<Payment>, StoreError> {
    optional(conn, sqlx::query(BY_ID).bind(id)).await
}

/// The attempt `provider` charged as `charge_id` (no merchant scope, no
/// lock): what a provider's dispute is about.
pub async fn by_charge(
    conn: &mut PgConnection,
    provider: &str,
    charge_id: &str,
) -> Result<Option<Payment>, StoreError> {
    let query = sqlx::query(concat!(
        "SELECT ",
        payment_columns!(),
        " FROM payment_attempt WHERE provider = $1 AND provider_charge_id = $2"
    ));
    optional(conn, query.bind(provider).bind(charge_id)).await
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

/// A payment's write that goes through the group commit: a row of
/// [`INSERT_CLAIMING`], [`SETTLE_COMPLETING`] or
/// [`FIND_BY_CHARGE_OR_RECORD_REPEAT`], which concurrent requests' writes
/// of the same kind share (see `store::group_commit`).
pub enum PaymentWrite {
    /// A payment's first step ([`insert_claiming`]).
    Claim(ClaimingAttempt),
    /// A command's own settlement ([`settle_completing`]): boxed, as it
    /// carries its rows whole.
    Settle(Box<SettleRow>),
    /// A provider event that may repeat what we hold
    /// ([`find_by_charge_or_record_repeat`]).
    Repeat(RepeatRow),
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
                let (ka, kb) = (a.claim.fence().record(), b.claim.fence().record());
                a.order_id != b.order_id && ka != kb && !adoptable(&ka.key) && !adoptable(&kb.key)
            }
            (PaymentWrite::Settle(a), PaymentWrite::Settle(b)) => {
                let (a, b) = (&a.settlement, &b.settlement);
                a.order.0.id != b.order.0.id
                    && a.attempt.id != b.attempt.id
                    && a.completion.fence().record() != b.completion.fence().record()
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
                PaymentWrite::Settle(r) => Some(&**r),
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

/// The statement of [`INSERT_CLAIMING`] for `rows`.
fn claims(rows: &[&ClaimingAttempt]) -> Result<Statement, StoreError> {
    let events = events_of(rows, |r| &r.events);
    let sql = form(rows, (INSERT_CLAIMING, INSERT_CLAIMING_MANY));
    Statement::of(sql, |q| claiming_columns(rows, bind_events(q, &events)))
}

/// The statement of [`SETTLE_COMPLETING`] for `rows`.
fn settlements(rows: &[&SettleRow]) -> Result<Statement, StoreError> {
    let events = events_of(rows, |r| &r.settlement.events);
    let sql = form(rows, (SETTLE_COMPLETING, SETTLE_COMPLETING_MANY));
    Statement::of(sql, |q| settlement_columns(rows, bind_events(q, &events)))
}

/// The statement of [`FIND_BY_CHARGE_OR_RECORD_REPEAT`] for `rows`.
fn repeats(rows: &[&RepeatRow]) -> Result<Statement, StoreError> {
    let forms = (
        FIND_BY_CHARGE_OR_RECORD_REPEAT,
        FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY,
    );
    Statement::of(form(rows, forms), |q| repeat_columns(rows, q))
}

/// The customer of the order of one of the merchant's payment attempts
/// (`None`: no such payment); see `orders::customer_of`.
pub async fn customer_of(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    id: Uuid,
) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT o.customer_id FROM payment_attempt p JOIN orders o ON o.id = p.order_id
          WHERE p.id = $1 AND p.merchant_id = $2",
    )
    .bind(id)
    .bind(merchant_id)
    .fetch_optional(pool)
    .await?)
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

    /// Both forms of a statement are its one body over their rows `i`,
    /// which only the form of many reads from arrays.
    #[test]
    fn each_statement_is_one_body_over_one_row_or_many() {
        let split = |sql: &'static str| {
            assert!(sql.starts_with("WITH i AS "), "{sql}");
            sql.split_at(sql.find("),\n").expect("the rows end the first CTE"))
        };
        for (one, many) in [
            (super::INSERT_CLAIMING, super::INSERT_CLAIMING_MANY),
            (super::SETTLE_COMPLETING, super::SETTLE_COMPLETING_MANY),
            (
                super::FIND_BY_CHARGE_OR_RECORD_REPEAT,
                super::FIND_BY_CHARGE_OR_RECORD_REPEAT_MANY,
            ),
            (
                crate::store::orders::INSERT_CLAIMING,
                crate::store::orders::INSERT_CLAIMING_MANY,
            ),
        ] {
            let ((one_rows, one_body), (many_rows, many_body)) = (split(one), split(many));
            assert_eq!(one_body, many_body);
            assert!(!one_rows.contains("unnest") && !one_rows.contains('['));
            assert!(many_rows.contains("unnest") && many_rows.contains("LIMIT"));
        }
    }

    /// The claim refuses an order with a live attempt by the same rule the
    /// command's locking path reads the live attempt with.
    #[test]
    fn the_claim_and_the_live_attempt_read_share_one_rule() {
        let rule = live_attempts_of!("i.order_id");
        assert!(super::INSERT_CLAIMING.contains(rule));
        assert!(super::INSERT_CLAIMING_MANY.contains(rule));
        assert!(super::LIVE_ATTEMPT.ends_with(live_attempts_of!("$1")));
    }
}
