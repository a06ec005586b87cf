//! Adopting a provider object we have no row for: the row is rebuilt with
//! its own id, its state, its owner's state, its events and the completed
//! idempotency record, so the client's retry with its key gets the answer
//! it would have had. A charge and a refund take the same steps in the same
//! transaction, here; what differs is their [`Owner`]'s (`charges.rs`,
//! `refunds.rs`).

use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::orphan::orphan;
use super::outcome::{mismatch, one, Owners};
use super::{BooksError, Options};
use crate::commands::{AppContext, CommandError};
use crate::idempotency::{RecordId, StoredResponse};
use crate::provider::trace::{adopted_key, unhex, Trace};
use crate::provider::{BookEntry, PaymentProvider};
use crate::store::books::Counts;
use crate::store::{self, StoreError};

/// What the owner of an object we have no row for, locked, makes of it.
pub(super) enum Decision<O> {
    /// Rebuild the row under its owner.
    Adopt(O),
    /// Nothing to do (a failed charge moved no money, a vanished order).
    Ignore,
    /// A charge no order of ours can own, and why.
    Orphan(&'static str),
    /// An object our rows cannot hold: a `books_mismatch` incident, whose
    /// and with what detail.
    Mismatch(Owners, String),
}

/// A provider object we have no row for, and what adopting it runs with.
pub(super) struct Found<'a> {
    pub ctx: &'a AppContext,
    pub provider: &'a dyn PaymentProvider,
    pub entry: &'a BookEntry,
    pub trace: &'a Trace,
    /// The stored key a rebuilt row and record get: the key's hash stands
    /// for the key (`None`: the object predates the trace).
    pub key: Option<String>,
    /// The stored fingerprint of the request that made it.
    pub fingerprint: Option<Vec<u8>>,
}

/// What a step of an adoption gives.
pub(super) type Adopting<T> = Result<T, BooksError>;

/// The completed idempotency record a rebuilt row gets: whose key it is,
/// the stored name of the command that made the row, and what the command
/// answers for the row as it now is.
pub(super) type Record = (Uuid, &'static str, Result<StoredResponse, CommandError>);

/// What a rebuilt row belongs to: an order rebuilds a charge's attempt, a
/// payment a refund. [`adopt`] takes the steps both share; these are the
/// ones that differ, in the adoption's transaction.
pub(super) trait Owner {
    /// The rebuilt row.
    type Row;

    /// Inserts the row as its command would have (pending), writes its
    /// event and settles it by the provider's state with the webhook's
    /// rules; `None` when a command's own row took the key first (the next
    /// pass sees that row).
    async fn rebuild(&self, tx: &mut PgConnection, f: &Found<'_>) -> Adopting<Option<Self::Row>>;

    /// The idempotency record to rebuild for the settled row, if the
    /// command's answer is the row's (`None`: it is not).
    fn record(&self, row: &Self::Row, trace: &Trace) -> Option<Record>;

    /// Logs the adoption (a warning: rows were lost).
    fn adopted(&self, row: &Self::Row, f: &Found<'_>);
}

/// Adopts `entry`, an object we have no row for, by what its owner decided
/// under its lock in `tx`: rebuilds the row, its events and its record in
/// that transaction.
pub(super) async fn adopt<O: Owner>(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
    (mut tx, decided): (Transaction<'static, Postgres>, Decision<O>),
) -> Result<Counts, BooksError> {
    let owner = match decided {
        Decision::Adopt(owner) => owner,
        Decision::Ignore => return Ok(Counts::default()),
        Decision::Orphan(why) => {
            drop(tx);
            return orphan(ctx, provider, entry, trace, why, options).await;
        }
        Decision::Mismatch(ids, detail) => {
            drop(tx);
            return mismatch(ctx, provider, entry, ids, &detail, options).await;
        }
    };
    if options.dry_run {
        return Ok(one(|c| c.adopted += 1));
    }
    let found = Found {
        ctx,
        provider,
        entry,
        trace,
        key: trace.origin.key_sha256.as_deref().map(adopted_key),
        fingerprint: trace.origin.fingerprint.as_deref().and_then(unhex),
    };
    let Some(row) = owner.rebuild(&mut tx, &found).await? else {
        return Ok(Counts::default());
    };
    if let (Some(key), Some(fingerprint)) = (&found.key, &found.fingerprint) {
        if let Some(record) = owner.record(&row, trace) {
            rebuild_record(ctx, &mut tx, record, key, fingerprint).await?;
        }
    }
    tx.commit().await?;
    owner.adopted(&row, &found);
    Ok(one(|c| c.adopted += 1))
}

/// The completed idempotency record of a rebuilt row, under its key's
/// hash (it takes the key when the client presents it), with the answer
/// the command gives for the row as it now is.
async fn rebuild_record(
    ctx: &AppContext,
    tx: &mut PgConnection,
    (merchant_id, command, response): Record,
    key: &str,
    fingerprint: &[u8],
) -> Result<(), StoreError> {
    let response = response.map_err(command_store_error)?;
    let id = RecordId {
        merchant_id,
        key: key.to_string(),
    };
    let ttl = ctx.engine.config().ttl;
    crate::idempotency::persistence::insert_rebuilt(tx, &id, fingerprint, command, &response, ttl)
        .await?;
    Ok(())
}

fn command_store_error(e: CommandError) -> StoreError {
    match e {
        CommandError::Store(e) => e,
        CommandError::Reject(p) => store::Corrupt::Broken(p.detail).into(),
    }
}
