//! SQL of inbound webhook events (deduplication and the kept payload).

use serde_json::Value;
use sqlx::PgConnection;

use super::StoreError;

/// Records an event unless already recorded.
pub const RECORD: &str =
    "INSERT INTO webhook_event (provider, event_id, event_type, payload, outcome)
         VALUES ($1, $2, $3, $4, 'received') ON CONFLICT DO NOTHING";

/// Records an event; returns `false` if `(provider, event id)` was already
/// recorded (a duplicate delivery). Runs in the transaction that applies the
/// event's effect, so the two commit together.
pub async fn record(
    tx: &mut PgConnection,
    provider: &str,
    event_id: &str,
    event_type: &str,
    payload: &Value,
) -> Result<bool, StoreError> {
    let done = sqlx::query(RECORD)
        .bind(provider)
        .bind(event_id)
        .bind(event_type)
        .bind(payload)
        .execute(tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Records an event with its outcome, unless already recorded.
pub(crate) const RECORD_DONE: &str =
    "INSERT INTO webhook_event (provider, event_id, event_type, payload, outcome, confirmed_at,
                                detail)
         VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN now() END, $7) ON CONFLICT DO NOTHING";

/// An event and what it did, recorded at once: for an event that changes
/// nothing, one statement instead of a transaction of four round trips.
pub struct Done<'a> {
    /// The provider's name.
    pub provider: &'a str,
    /// The provider's event id.
    pub event_id: &'a str,
    /// `charge.succeeded`, ...
    pub event_type: &'a str,
    /// The event as received.
    pub payload: &'a Value,
    /// What it did (see [`set_outcome`]).
    pub outcome: &'a str,
    /// Whether a provider read confirmed it.
    pub confirmed: bool,
    /// Why it was not applied.
    pub detail: Option<&'a str>,
}

/// Records an event that applies nothing, with its outcome; `false` if
/// `(provider, event id)` was already recorded (a duplicate delivery).
pub(crate) async fn record_done(pool: &sqlx::PgPool, done: &Done<'_>) -> Result<bool, StoreError> {
    let result = sqlx::query(RECORD_DONE)
        .bind(done.provider)
        .bind(done.event_id)
        .bind(done.event_type)
        .bind(done.payload)
        .bind(done.outcome)
        .bind(done.confirmed)
        .bind(done.detail)
        .execute(pool)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Notes what an event did.
pub const SET_OUTCOME: &str = "UPDATE webhook_event
        SET outcome = $3, confirmed_at = CASE WHEN $4 THEN now() END, detail = $5
      WHERE provider = $1 AND event_id = $2";

/// Notes what the event did (processed, ignored, unknown_charge,
/// unconfirmed, mismatch), whether a provider read confirmed it, and why
/// it was not applied.
pub(crate) async fn set_outcome(
    tx: &mut PgConnection,
    provider: &str,
    event_id: &str,
    outcome: &str,
    confirmed: bool,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    sqlx::query(SET_OUTCOME)
        .bind(provider)
        .bind(event_id)
        .bind(outcome)
        .bind(confirmed)
        .bind(detail)
        .execute(tx)
        .await?;
    Ok(())
}

/// Whether an event was recorded (see [`exists`]).
pub const EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM webhook_event WHERE provider = $1 AND event_id = $2)";

/// Whether `(provider, event id)` was recorded already: a duplicate costs
/// no provider read.
pub async fn exists(
    conn: &mut PgConnection,
    provider: &str,
    event_id: &str,
) -> Result<bool, StoreError> {
    let found: bool = sqlx::query_scalar(EXISTS)
        .bind(provider)
        .bind(event_id)
        .fetch_one(conn)
        .await?;
    Ok(found)
}
