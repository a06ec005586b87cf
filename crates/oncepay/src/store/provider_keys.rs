//! SQL of the generations of provider idempotency keys a pending payment
//! attempt (its charge's confirm) or refund is sent under (migration V27).
//!
//! Generation 0 is the key a row always had. A provider that keeps an
//! error under a key and replays it (Stripe saves a `500`) spends that
//! key: the row records it ([`spend`]). Once a read of the provider, made
//! after the record, proves the send made nothing, the row moves to the
//! next generation ([`next`]), and only then is the new key used: a crash
//! never sends under a key the row does not record, and each key is
//! derived from the row's id and its generation, so every key a row used
//! is known. The move is one conditional statement under the row's lock:
//! of two processes that find the same spent key, one moves on and sends,
//! the other sends nothing; so at most one key of a row is in flight.

use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::queue::Queued;
use super::StoreError;

/// Where a pending row's keys stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    /// The generation its next send uses.
    pub generation: i32,
    /// Whether its provider spent that generation's key (see the module).
    pub spent: bool,
}

/// Where the keys of the pending row `id` of `T`'s table stand; `None`
/// when it is no longer pending (nothing is to be sent).
pub(crate) async fn state<T: Queued>(
    pool: &PgPool,
    id: Uuid,
) -> Result<Option<KeyState>, StoreError> {
    let sql = format!(
        "SELECT provider_key_generation, provider_key_spent FROM {}
          WHERE id = $1 AND status = 'pending'",
        T::TABLE.name
    );
    let Some(row) = sqlx::query(&sql).bind(id).fetch_optional(pool).await? else {
        return Ok(None);
    };
    Ok(Some(KeyState {
        generation: row.try_get("provider_key_generation")?,
        spent: row.try_get("provider_key_spent")?,
    }))
}

/// Records that the provider spent the key of `generation` of the pending
/// row `id`, if that is still the row's generation.
pub(crate) async fn spend<T: Queued>(
    pool: &PgPool,
    id: Uuid,
    generation: i32,
) -> Result<(), StoreError> {
    let sql = format!(
        "UPDATE {} SET provider_key_spent = true
          WHERE id = $1 AND status = 'pending' AND provider_key_generation = $2",
        T::TABLE.name
    );
    sqlx::query(&sql)
        .bind(id)
        .bind(generation)
        .execute(pool)
        .await?;
    Ok(())
}

/// Moves the pending row `id` on from its spent key of `generation` to the
/// next generation, committed before the new key is used: `Some(next)`.
/// `None` when the row moved meanwhile (another process moved on first and
/// sends under the new key itself, or the row settled): nothing is sent.
pub(crate) async fn next<T: Queued>(
    pool: &PgPool,
    id: Uuid,
    generation: i32,
) -> Result<Option<i32>, StoreError> {
    let sql = format!(
        "UPDATE {} SET provider_key_generation = provider_key_generation + 1,
                provider_key_spent = false
          WHERE id = $1 AND status = 'pending' AND provider_key_generation = $2
            AND provider_key_spent
         RETURNING provider_key_generation",
        T::TABLE.name
    );
    let row = sqlx::query(&sql)
        .bind(id)
        .bind(generation)
        .fetch_optional(pool)
        .await?;
    match row {
        Some(row) => Ok(Some(row.try_get("provider_key_generation")?)),
        None => Ok(None),
    }
}
