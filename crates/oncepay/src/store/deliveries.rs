//! SQL of deliveries: claiming due ones (any number of processes share the
//! work with `SKIP LOCKED`; a claim is a lease), recording what each
//! attempt got, redelivering on request.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::events::Event;
use super::StoreError;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A delivery claimed for one attempt, with what it takes to send it.
pub struct Claimed {
    /// The delivery.
    pub id: Uuid,
    /// The claim's fencing token: only this claim records the result.
    pub token: Uuid,
    /// Attempts made before this one.
    pub attempts: i32,
    /// The event to send.
    pub event: Event,
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// Its URL.
    pub url: String,
    /// Its HMAC key.
    pub secret_key: Vec<u8>,
}

/// Claims up to `$1` due deliveries for `$2` ms: a claim moves the due time
/// past the lease, so a delivery whose process died is due again when the
/// lease ends. Deliveries of one object to one endpoint go in sequence
/// order: one waits while an earlier one of its object is still pending.
pub(crate) const CLAIM: &str = "WITH due AS (
        SELECT d.id FROM webhook_delivery d
         WHERE d.state = 'pending' AND d.next_attempt_at <= now()
           AND NOT EXISTS (
               SELECT 1 FROM webhook_delivery p
                WHERE p.endpoint_id = d.endpoint_id AND p.object_id = d.object_id
                  AND p.state = 'pending' AND p.sequence < d.sequence)
         ORDER BY d.next_attempt_at
         LIMIT $1
         FOR UPDATE OF d SKIP LOCKED)
     UPDATE webhook_delivery d
        SET next_attempt_at = now() + $2::bigint * interval '1 millisecond',
            claim_token = gen_random_uuid()
       FROM due, event e, webhook_endpoint w
      WHERE d.id = due.id AND e.id = d.event_id AND w.id = d.endpoint_id
     RETURNING d.id AS delivery_id, d.claim_token, d.attempts, w.id AS endpoint_id, w.url,
               w.secret_key, e.id, e.type, e.created_at, e.sequence, e.data, e.object_type,
               e.cause, e.request_id, e.actor";

fn claimed_from_row(row: &PgRow) -> Result<Claimed, StoreError> {
    Ok(Claimed {
        id: row.try_get("delivery_id")?,
        token: row.try_get("claim_token")?,
        attempts: row.try_get("attempts")?,
        event: super::events::from_row(row)?,
        endpoint_id: row.try_get("endpoint_id")?,
        url: row.try_get("url")?,
        secret_key: row.try_get("secret_key")?,
    })
}

/// See [`CLAIM`].
pub async fn claim(pool: &PgPool, limit: i64, lease: Duration) -> Result<Vec<Claimed>, StoreError> {
    let rows = sqlx::query(CLAIM)
        .bind(limit)
        .bind(millis(lease))
        .fetch_all(pool)
        .await?;
    rows.iter().map(claimed_from_row).collect()
}

/// What one attempt got.
pub struct AttemptResult<'a> {
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// How long it took.
    pub latency: Duration,
    /// Why there was no usable answer, if there was none.
    pub error: Option<&'a str>,
}

/// What becomes of the delivery after an attempt.
#[derive(Debug, Clone, Copy)]
pub enum Next {
    /// The receiver answered 2xx: no more attempts.
    Delivered,
    /// Try again after this long.
    RetryAfter(Duration),
    /// No more attempts (schedule exhausted, or the endpoint is gone).
    GiveUp,
}

/// Records an attempt (always: it happened) and, if the claim is still
/// ours, moves the delivery on; one statement. False if the claim was lost
/// (a slower attempt of a process whose lease ran out).
pub async fn record(
    pool: &PgPool,
    claimed: &Claimed,
    result: &AttemptResult<'_>,
    next: Next,
) -> Result<bool, StoreError> {
    let (state, wait_ms) = match next {
        Next::Delivered => ("delivered", 0),
        Next::RetryAfter(wait) => ("pending", millis(wait)),
        Next::GiveUp => ("failed", 0),
    };
    let row = sqlx::query(
        "WITH moved AS (
            UPDATE webhook_delivery
               SET state = $3, attempts = attempts + 1, claim_token = NULL,
                   next_attempt_at = now() + $4::bigint * interval '1 millisecond',
                   delivered_at = CASE WHEN $3 = 'delivered' THEN now() END
             WHERE id = $1 AND claim_token = $2 AND state = 'pending'
            RETURNING 1),
         attempt AS (
            INSERT INTO webhook_attempt (delivery_id, event_id, endpoint_id, response_status,
                                         latency_ms, error)
            VALUES ($1, $5, $6, $7, $8, $9))
         SELECT (SELECT count(*) FROM moved) AS moved",
    )
    .bind(claimed.id)
    .bind(claimed.token)
    .bind(state)
    .bind(wait_ms)
    .bind(claimed.event.id)
    .bind(claimed.endpoint_id)
    .bind(result.status.map(i32::from))
    .bind(i32::try_from(result.latency.as_millis()).unwrap_or(i32::MAX))
    .bind(result.error)
    .fetch_one(pool)
    .await?;
    let moved: i64 = row.try_get("moved")?;
    Ok(moved > 0)
}

/// Sends one of the merchant's events again to every live endpoint
/// subscribed to its type, on a fresh schedule (a delivered or given-up
/// delivery becomes pending again). Returns how many deliveries that makes,
/// or `None` if the merchant has no such event.
pub async fn redeliver(
    pool: &PgPool,
    merchant_id: Uuid,
    event_id: Uuid,
    actor: &crate::audit::Actor,
) -> Result<Option<i64>, StoreError> {
    let mut tx = pool.begin().await?;
    let row = sqlx::query(concat!(
        "WITH ev AS (
            SELECT id, merchant_id, type, object_id, sequence FROM event
             WHERE id = $1 AND merchant_id = $2),
         queued AS (
            INSERT INTO webhook_delivery (event_id, endpoint_id, object_id, sequence)
            SELECT ev.id, w.id, ev.object_id, ev.sequence
              ",
        super::events::subscribers_of_ev!(),
        "
            ON CONFLICT (event_id, endpoint_id) DO UPDATE
               SET state = 'pending', attempts = 0, next_attempt_at = now(),
                   claim_token = NULL, delivered_at = NULL
            RETURNING 1)
         SELECT (SELECT count(*) FROM ev) AS found, (SELECT count(*) FROM queued) AS queued",
    ))
    .bind(event_id)
    .bind(merchant_id)
    .fetch_one(&mut *tx)
    .await?;
    let found: i64 = row.try_get("found")?;
    let queued: i64 = row.try_get("queued")?;
    if found == 0 {
        return Ok(None);
    }
    super::audit::record(
        &mut tx,
        merchant_id,
        actor,
        crate::audit::Action::EventRedelivered,
        &event_id.to_string(),
        serde_json::json!({"deliveries_queued": queued}),
    )
    .await?;
    tx.commit().await?;
    Ok(Some(queued))
}

/// One delivery attempt, as `GET /events/{id}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// The endpoint it went to.
    pub endpoint_id: Uuid,
    /// When it was sent, by the database's clock.
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status, if it answered.
    pub response_status: Option<i32>,
    /// How long it took.
    pub latency_ms: i32,
    /// Why there was no usable answer (timeout, refused address...).
    pub error: Option<String>,
}

/// Where an event's delivery to one endpoint stands.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// The endpoint.
    pub endpoint_id: Uuid,
    /// `pending`, `delivered`, `failed` (given up) or `cancelled`.
    pub state: String,
    /// Attempts made.
    pub attempts: i32,
    /// When the next attempt is due, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was received.
    pub delivered_at: Option<DateTime<Utc>>,
}

/// An event's deliveries and every attempt, oldest first.
pub(crate) async fn of_event(
    pool: &PgPool,
    event_id: Uuid,
) -> Result<(Vec<Delivery>, Vec<Attempt>), StoreError> {
    let rows = sqlx::query(
        "SELECT endpoint_id, state, attempts, next_attempt_at, delivered_at
           FROM webhook_delivery WHERE event_id = $1 ORDER BY created_at, endpoint_id",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?;
    let deliveries = rows
        .iter()
        .map(|r| {
            let state: String = r.try_get("state")?;
            let next: DateTime<Utc> = r.try_get("next_attempt_at")?;
            Ok(Delivery {
                endpoint_id: r.try_get("endpoint_id")?,
                next_attempt_at: (state == "pending").then_some(next),
                state,
                attempts: r.try_get("attempts")?,
                delivered_at: r.try_get("delivered_at")?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let rows = sqlx::query(
        "SELECT endpoint_id, attempted_at, response_status, latency_ms, error
           FROM webhook_attempt WHERE event_id = $1 ORDER BY id",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?;
    let attempts = rows
        .iter()
        .map(|r| {
            Ok(Attempt {
                endpoint_id: r.try_get("endpoint_id")?,
                attempted_at: r.try_get("attempted_at")?,
                response_status: r.try_get("response_status")?,
                latency_ms: r.try_get("latency_ms")?,
                error: r.try_get("error")?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok((deliveries, attempts))
}

/// Seconds since the oldest pending delivery's event was written (0 if none).
pub(crate) async fn oldest_pending_age(pool: &PgPool) -> Result<f64, StoreError> {
    let row = sqlx::query(
        "SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(e.created_at))::float8, 0) AS age
           FROM webhook_delivery d JOIN event e ON e.id = d.event_id
          WHERE d.state = 'pending'",
    )
    .fetch_one(pool)
    .await?;
    Ok(row.try_get("age")?)
}
