//! The idempotency engine's persistence: the SQL of the `idempotency_record`
//! table, owned by the engine (as zero2prod's `idempotency/persistence.rs`).
//! The protocol built on it is the parent module; here are only the
//! statements, each one atomic on its own so that the database, not process
//! memory, decides who executes. The commands' one-statement fast paths
//! (`store::orders`, `store::payments`) build on its fragments.

use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::store::StoreError;

/// The stored key of a record rebuilt from the provider's books for the
/// key in the SQL expression `$key` (`provider::trace::adopted_key`).
macro_rules! adopted_key {
    ($key:literal) => {
        concat!(
            "'adopted ' || encode(sha256(convert_to(",
            $key,
            ", 'UTF8')), 'hex')"
        )
    };
}
pub(crate) use adopted_key;

/// What completing a record writes, with the response's status, body and
/// location in the SQL expressions given: the one definition of a
/// completed record, used by [`COMPLETE`] and by the commands'
/// one-statement paths (`store::orders`, `store::payments`).
macro_rules! completed {
    ($status:literal, $body:literal, $location:literal) => {
        concat!(
            "state = 'completed', recovery_point = 'finished', lease_token = NULL, ",
            "lease_expires_at = NULL, response_status = ",
            $status,
            ", response_body = ",
            $body,
            ", response_location = ",
            $location,
            ", updated_at = now()"
        )
    };
}
pub(crate) use completed;

/// The recovery point of a record that has not recorded any effect: such a
/// record can be deleted (freeing its key) without losing anything.
pub(crate) const STARTED: &str = "started";

/// A stored HTTP response, replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// The exact body bytes sent the first time.
    pub body: Vec<u8>,
    /// The `Location` header, if the first response had one.
    pub location: Option<String>,
}

/// The identity of a record: its merchant scope and key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordId {
    /// The merchant the key belongs to.
    pub merchant_id: Uuid,
    /// The key as stored: see [`RecordId::merchant`] and [`RecordId::checkout`].
    pub key: String,
}

impl RecordId {
    /// A key the merchant sent with its API key: stored as sent.
    pub fn merchant(merchant_id: Uuid, key: &crate::idempotency::IdempotencyKey) -> RecordId {
        RecordId {
            merchant_id,
            key: key.as_str().to_string(),
        }
    }

    /// A key a token's principal sent: `<kind> <hash> <key>`, where the
    /// hash is SHA-256 of the issuer and the `sub` (each length-prefixed,
    /// so no two pairs give one hash input). A client's key holds no
    /// space, so it can never meet a merchant key's record, a checkout
    /// page's or another principal's.
    pub fn principal(
        merchant_id: Uuid,
        kind: &str,
        issuer: &str,
        sub: &str,
        key: &crate::idempotency::IdempotencyKey,
    ) -> RecordId {
        use sha2::Digest as _;
        let who = sha2::Sha256::new()
            .chain_update(format!("{}:{issuer}", issuer.len()))
            .chain_update(format!("{}:{sub}", sub.len()))
            .finalize();
        let who: String = who.iter().map(|b| format!("{b:02x}")).collect();
        RecordId {
            merchant_id,
            key: format!("{kind} {who} {}", key.as_str()),
        }
    }

    /// A key a checkout page made, in the keyspace of its session:
    /// `checkout <session id> <key>`. A key a client sends can never hold
    /// a space (it is visible ASCII only), so no merchant key, however it
    /// is written, can meet a page's key, and two sessions' keys cannot
    /// meet each other.
    pub fn checkout(
        merchant_id: Uuid,
        session_id: Uuid,
        key: &crate::idempotency::IdempotencyKey,
    ) -> RecordId {
        RecordId {
            merchant_id,
            key: format!("checkout {session_id} {}", key.as_str()),
        }
    }
}

/// What the database holds for a command being executed by us.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Fencing token: every later write must present it.
    pub token: Uuid,
    /// The last step the command recorded.
    pub recovery_point: String,
    /// The resource the command created in an earlier step, if any.
    pub resource_id: Option<Uuid>,
    /// Which command the record is for.
    pub command: String,
    /// The command's input, as stored when it was first claimed.
    pub request: Value,
    /// The request's fingerprint: written on the rows the command makes
    /// and sent to the provider (`provider::trace`).
    pub fingerprint: Vec<u8>,
}

/// What a live record means for a request that presents its key.
#[derive(Debug)]
pub enum ClaimOutcome {
    /// A record was executing under an expired lease: we took the lease over.
    TookOver(Lease),
    /// The record is completed: this is the response to replay, and how
    /// long the record lives on.
    Completed(StoredResponse, Duration),
    /// Another request holds a live lease on the record.
    Executing,
    /// The record was made by a request with another fingerprint.
    Mismatch,
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Everything needed to insert a new record.
pub struct NewRecord<'a> {
    /// Scope and key.
    pub id: &'a RecordId,
    /// SHA-256 of the request.
    pub fingerprint: &'a [u8],
    /// Command name, for resumption.
    pub command: &'a str,
    /// Command input, for resumption.
    pub request: &'a Value,
    /// Lease length.
    pub lease: Duration,
    /// Record lifetime.
    pub ttl: Duration,
}

/// Claims a key (see `insert_or_reclaim`).
pub const INSERT_OR_RECLAIM: &str = concat!(
    "INSERT INTO idempotency_record
            (merchant_id, idempotency_key, fingerprint, command, request, state, recovery_point,
             lease_token, lease_expires_at, expires_at)
         SELECT $1, $2, $3, $4, $5, 'executing', 'started', $6,
                 now() + $7::bigint * interval '1 millisecond',
                 now() + $8::bigint * interval '1 millisecond'
          WHERE NOT EXISTS (SELECT 1 FROM idempotency_record
                             WHERE merchant_id = $1 AND idempotency_key = ",
    adopted_key!("$2"),
    ")
         ON CONFLICT (merchant_id, idempotency_key) DO UPDATE SET
            fingerprint = EXCLUDED.fingerprint, command = EXCLUDED.command,
            request = EXCLUDED.request, state = 'executing', recovery_point = 'started',
            resource_id = NULL, lease_token = EXCLUDED.lease_token,
            lease_expires_at = EXCLUDED.lease_expires_at, response_status = NULL,
            response_body = NULL, response_location = NULL, created_at = now(),
            updated_at = now(), expires_at = EXCLUDED.expires_at
         WHERE idempotency_record.expires_at <= now()
           AND (idempotency_record.state = 'completed'
                OR (idempotency_record.recovery_point = 'started'
                    AND idempotency_record.lease_expires_at < now()))
         RETURNING lease_token"
);

/// Tries to claim a key: inserts a fresh record, or reuses an expired one
/// that is completed or never recorded an effect, and returns our lease.
/// Returns `None` when a live record exists; the caller then reads it with
/// [`load_live`].
pub(crate) async fn insert_or_reclaim(
    pool: &PgPool,
    new: &NewRecord<'_>,
) -> Result<Option<Lease>, StoreError> {
    let token = Uuid::new_v4();
    let row = sqlx::query(INSERT_OR_RECLAIM)
        .bind(new.id.merchant_id)
        .bind(&new.id.key)
        .bind(new.fingerprint)
        .bind(new.command)
        .bind(new.request)
        .bind(token)
        .bind(millis(new.lease))
        .bind(millis(new.ttl))
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|_| Lease {
        token,
        recovery_point: STARTED.into(),
        resource_id: None,
        command: new.command.into(),
        request: new.request.clone(),
        fingerprint: new.fingerprint.to_vec(),
    }))
}

/// Reads a live record (see `load_live`).
///
/// A record rebuilt from the provider's books is stored under the hash of
/// its key ([`adopted_key!`]): when none is stored under the key itself,
/// the rebuilt one takes the key, in the same statement, and is read.
pub const LOAD_LIVE: &str = concat!(
    "WITH adopted AS (
        UPDATE idempotency_record SET idempotency_key = $2, updated_at = now()
         WHERE merchant_id = $1 AND idempotency_key = ",
    adopted_key!("$2"),
    "
           AND NOT EXISTS (SELECT 1 FROM idempotency_record
                            WHERE merchant_id = $1 AND idempotency_key = $2)
        RETURNING fingerprint, state, response_status, response_body, response_location,
                  lease_expires_at, expires_at)
     SELECT fingerprint, state, response_status, response_body, response_location,
            lease_expires_at < now() AS lease_expired,
            (extract(epoch FROM expires_at - now()) * 1000)::bigint AS ttl_left_ms
       FROM idempotency_record WHERE merchant_id = $1 AND idempotency_key = $2
     UNION ALL
     SELECT fingerprint, state, response_status, response_body, response_location,
            lease_expires_at < now() AS lease_expired,
            (extract(epoch FROM expires_at - now()) * 1000)::bigint AS ttl_left_ms
       FROM adopted"
);

/// Reads a live record and, if its lease has expired and the fingerprint
/// matches, takes the lease over. Returns `None` if the record vanished
/// meanwhile (the caller claims again).
pub(crate) async fn load_live(
    pool: &PgPool,
    id: &RecordId,
    fingerprint: &[u8],
    lease: Duration,
    ttl: Duration,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let Some(row) = sqlx::query(LOAD_LIVE)
        .bind(id.merchant_id)
        .bind(&id.key)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let stored: Vec<u8> = row.try_get("fingerprint")?;
    if stored != fingerprint {
        return Ok(Some(ClaimOutcome::Mismatch));
    }
    let state: String = row.try_get("state")?;
    if state == "completed" {
        let left: i64 = row.try_get("ttl_left_ms")?;
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
        return Ok(Some(ClaimOutcome::Completed(
            response_from_row(&row)?,
            left,
        )));
    }
    let expired: Option<bool> = row.try_get("lease_expired")?;
    if expired != Some(true) {
        return Ok(Some(ClaimOutcome::Executing));
    }
    Ok(Some(match take_over(pool, id, lease, ttl).await? {
        Some(lease) => ClaimOutcome::TookOver(lease),
        None => ClaimOutcome::Executing,
    }))
}

fn response_from_row(row: &PgRow) -> Result<StoredResponse, StoreError> {
    let status: Option<i16> = row.try_get("response_status")?;
    let status = status.and_then(|s| u16::try_from(s).ok()).ok_or_else(|| {
        crate::store::Corrupt::Broken("a completed record without a status".into())
    })?;
    Ok(StoredResponse {
        status,
        body: row
            .try_get::<Option<Vec<u8>>, _>("response_body")?
            .unwrap_or_default(),
        location: row.try_get("response_location")?,
    })
}

fn lease_from_row(row: &PgRow) -> Result<Lease, StoreError> {
    Ok(Lease {
        token: row.try_get("lease_token")?,
        recovery_point: row.try_get("recovery_point")?,
        resource_id: row.try_get("resource_id")?,
        command: row.try_get("command")?,
        request: row.try_get("request")?,
        fingerprint: row.try_get("fingerprint")?,
    })
}

/// Takes over the lease of an executing record whose lease has expired.
/// Exactly one of any number of concurrent callers gets it. The record's
/// life is extended to at least a TTL from now, so that the retries the
/// resumed command's client will send still find it.
async fn take_over(
    pool: &PgPool,
    id: &RecordId,
    lease: Duration,
    ttl: Duration,
) -> Result<Option<Lease>, StoreError> {
    let row = sqlx::query(
        "UPDATE idempotency_record
            SET lease_token = $3, lease_expires_at = now() + $4::bigint * interval '1 millisecond',
                expires_at = greatest(expires_at, now() + $5::bigint * interval '1 millisecond'),
                updated_at = now()
          WHERE merchant_id = $1 AND idempotency_key = $2
            AND state = 'executing' AND lease_expires_at < now()
         RETURNING lease_token, recovery_point, resource_id, command, request, fingerprint",
    )
    .bind(id.merchant_id)
    .bind(&id.key)
    .bind(Uuid::new_v4())
    .bind(millis(lease))
    .bind(millis(ttl))
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(lease_from_row).transpose()
}

/// Takes over up to `limit` records whose lease expired, for the reconciler
/// (extending their life as [`take_over`] does). `SKIP LOCKED` lets several
/// processes do this at once without overlap.
pub(crate) async fn take_over_expired(
    pool: &PgPool,
    limit: i64,
    lease: Duration,
    ttl: Duration,
) -> Result<Vec<(RecordId, Lease)>, StoreError> {
    let rows = sqlx::query(
        "UPDATE idempotency_record r
            SET lease_token = gen_random_uuid(),
                lease_expires_at = now() + $2::bigint * interval '1 millisecond',
                expires_at = greatest(r.expires_at, now() + $3::bigint * interval '1 millisecond'),
                updated_at = now()
           FROM (SELECT merchant_id, idempotency_key FROM idempotency_record
                  WHERE state = 'executing' AND lease_expires_at < now()
                  ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) due
          WHERE r.merchant_id = due.merchant_id AND r.idempotency_key = due.idempotency_key
         RETURNING r.merchant_id, r.idempotency_key, r.lease_token, r.recovery_point,
                   r.resource_id, r.command, r.request, r.fingerprint",
    )
    .bind(limit)
    .bind(millis(lease))
    .bind(millis(ttl))
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                RecordId {
                    merchant_id: row.try_get("merchant_id")?,
                    key: row.try_get("idempotency_key")?,
                },
                lease_from_row(row)?,
            ))
        })
        .collect()
}

/// Records a finished step under the lease.
pub const RECORD_STEP: &str = "UPDATE idempotency_record
            SET recovery_point = $4, resource_id = COALESCE($5, resource_id), updated_at = now()
          WHERE merchant_id = $1 AND idempotency_key = $2 AND lease_token = $3
            AND state = 'executing'";

/// Records that a step finished, in the same transaction as the step's own
/// writes. Fails with `LeaseLost` if another process holds the lease now.
pub(crate) async fn record_step(
    tx: &mut PgConnection,
    id: &RecordId,
    token: Uuid,
    recovery_point: &str,
    resource_id: Option<Uuid>,
) -> Result<(), StoreError> {
    let done = sqlx::query(RECORD_STEP)
        .bind(id.merchant_id)
        .bind(&id.key)
        .bind(token)
        .bind(recovery_point)
        .bind(resource_id)
        .execute(tx)
        .await?;
    fenced(done)
}

/// A write under the lease changed its one row, or the lease was taken over.
fn fenced(done: sqlx::postgres::PgQueryResult) -> Result<(), StoreError> {
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// Completes a record with its response under the lease.
pub const COMPLETE: &str = concat!(
    "UPDATE idempotency_record SET ",
    completed!("$4", "$5", "$6"),
    " WHERE merchant_id = $1 AND idempotency_key = $2 AND lease_token = $3
            AND state = 'executing'"
);

/// Stores the response and completes the record, in the same transaction as
/// the command's last writes.
pub async fn complete(
    tx: &mut PgConnection,
    id: &RecordId,
    token: Uuid,
    response: &StoredResponse,
) -> Result<(), StoreError> {
    let status = crate::store::Corrupt::status_column(response.status)?;
    let done = sqlx::query(COMPLETE)
        .bind(id.merchant_id)
        .bind(&id.key)
        .bind(token)
        .bind(status)
        .bind(&response.body)
        .bind(&response.location)
        .execute(tx)
        .await?;
    fenced(done)
}

/// Deletes a record that recorded no effect, freeing its key. Returns whether
/// it was deleted (a record with an effect, or under another lease, is kept).
pub async fn release(pool: &PgPool, id: &RecordId, token: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_record
          WHERE merchant_id = $1 AND idempotency_key = $2 AND lease_token = $3
            AND state = 'executing' AND recovery_point = 'started'",
    )
    .bind(id.merchant_id)
    .bind(&id.key)
    .bind(token)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes up to `batch` expired records. Each batch is its own short
/// statement, and `SKIP LOCKED` keeps it from waiting on rows in use.
/// A record that recorded an effect but never completed is kept: the
/// reconciler must finish it first.
pub(crate) async fn sweep_expired(pool: &PgPool, batch: i64) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_record
          WHERE (merchant_id, idempotency_key) IN (
                SELECT merchant_id, idempotency_key FROM idempotency_record
                 WHERE expires_at < now()
                   AND (state = 'completed'
                        OR (recovery_point = 'started' AND lease_expires_at < now()))
                 LIMIT $1 FOR UPDATE SKIP LOCKED)",
    )
    .bind(batch)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// A completed record rebuilt from the provider's books (`crate::books`),
/// stored under the hash of its key until the client presents the key
/// ([`LOAD_LIVE`]). Nothing is written if one is stored already.
pub(crate) async fn insert_rebuilt(
    tx: &mut PgConnection,
    id: &RecordId,
    fingerprint: &[u8],
    command: &str,
    response: &StoredResponse,
    ttl: Duration,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO idempotency_record
            (merchant_id, idempotency_key, fingerprint, command, request, state, recovery_point,
             resource_id, response_status, response_body, response_location, expires_at)
         VALUES ($1, $2, $3, $4, '{}'::jsonb, 'completed', 'finished', NULL, $5, $6, $7,
                 now() + $8::bigint * interval '1 millisecond')
         ON CONFLICT (merchant_id, idempotency_key) DO NOTHING",
    )
    .bind(id.merchant_id)
    .bind(&id.key)
    .bind(fingerprint)
    .bind(command)
    .bind(i16::try_from(response.status).unwrap_or(i16::MAX))
    .bind(&response.body)
    .bind(&response.location)
    .bind(millis(ttl))
    .execute(tx)
    .await?;
    Ok(done.rows_affected() == 1)
}
