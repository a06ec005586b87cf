//! SQL of key revocations reaching every process's key cache.
//!
//! A revocation (or a rotation that expires a key) increments one counter
//! (`api_key_revocation.seq`) in its own transaction and announces
//! `hash:seq` on [`CHANNEL`]. Each process's listener forgets the key and
//! records the highest `seq` it has applied in `key_cache_process`. The
//! revoking request answers only when every process whose listener
//! answered within the staleness bound has applied its `seq`
//! ([`wait_until_applied`]); a process that has not answered within that
//! bound verifies every key from the database (`api_keys::KeyCache`), so
//! nothing it caches can outlive a revocation.

use std::time::Duration;

use sqlx::{PgConnection, PgExecutor, PgPool};
use uuid::Uuid;

use super::StoreError;

/// The channel on which revocations are announced to every process.
pub(crate) const CHANNEL: &str = "oncepay_api_keys";

/// A revocation's place in the order every process applies them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seq(pub i64);

/// Takes the next revocation number and announces `hash` with it, in
/// `tx` (the announcement goes out when `tx` commits). The counter's row
/// lock, held to the commit, makes commit order the order of numbers.
pub(crate) async fn announce(tx: &mut PgConnection, hash: &[u8]) -> Result<Seq, StoreError> {
    let seq: i64 = sqlx::query_scalar(
        "WITH next AS (UPDATE api_key_revocation SET seq = seq + 1 RETURNING seq)
         SELECT seq FROM next, pg_notify($1, encode($2, 'hex') || ':' || seq) AS sent",
    )
    .bind(CHANNEL)
    .bind(hash)
    .fetch_one(&mut *tx)
    .await?;
    Ok(Seq(seq))
}

/// The number of the last committed revocation, once none is in flight
/// (`FOR SHARE` waits for a revoking transaction to end). Read after
/// `LISTEN`: every revocation numbered above it is announced to this
/// connection.
pub(crate) async fn baseline(conn: impl PgExecutor<'_>) -> Result<Seq, StoreError> {
    let seq: i64 = sqlx::query_scalar("SELECT seq FROM api_key_revocation FOR SHARE")
        .fetch_one(conn)
        .await?;
    Ok(Seq(seq))
}

/// The number of the last committed revocation.
pub(crate) async fn last(pool: &PgPool) -> Result<Seq, StoreError> {
    let seq: i64 = sqlx::query_scalar("SELECT seq FROM api_key_revocation")
        .fetch_one(pool)
        .await?;
    Ok(Seq(seq))
}

/// Records that process `id`'s cache has applied every revocation up to
/// `applied`, and that its listener answered now.
pub(crate) async fn acknowledge(
    conn: impl PgExecutor<'_>,
    id: Uuid,
    applied: Seq,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO key_cache_process (id, applied, seen_at) VALUES ($1, $2, now())
         ON CONFLICT (id) DO UPDATE
            SET applied = GREATEST(key_cache_process.applied, EXCLUDED.applied),
                seen_at = now()",
    )
    .bind(id)
    .bind(applied.0)
    .execute(conn)
    .await?;
    Ok(())
}

/// Forgets processes not seen for an hour (stopped or killed).
pub(crate) async fn forget_gone_processes(conn: impl PgExecutor<'_>) -> Result<u64, StoreError> {
    let gone =
        sqlx::query("DELETE FROM key_cache_process WHERE seen_at < now() - interval '1 hour'")
            .execute(conn)
            .await?;
    Ok(gone.rows_affected())
}

/// Waits until every process seen within `stale` has applied `seq`, up to
/// `limit` (past `stale` and one heartbeat, every process has either
/// applied it or stopped using its cache, so a `limit` above that is never
/// reached). Returns how many processes were still behind when it gave up
/// (0 when all applied).
pub async fn wait_until_applied(
    pool: &PgPool,
    seq: Seq,
    stale: Duration,
    limit: Duration,
) -> Result<i64, StoreError> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let behind: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM key_cache_process
              WHERE applied < $1 AND seen_at > now() - $2::bigint * interval '1 millisecond'",
        )
        .bind(seq.0)
        .bind(i64::try_from(stale.as_millis()).unwrap_or(i64::MAX))
        .fetch_one(pool)
        .await?;
        if behind == 0 || started.elapsed() >= limit {
            return Ok(behind);
        }
        // Polled, not listened for: revocations are rare, and an
        // acknowledgement usually lands within a millisecond or two.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}
