//! SQL of the double-entry ledger (`ledger_account`, `ledger_transfer`,
//! `ledger_open_pending`; migration V19): the engine every ledger uses,
//! generic over what it counts (see `domain::ledger`).
//!
//! The protocol of a transfer, inside the caller's transaction:
//!
//! 1. [`lock_holder`]: make sure its accounts exist and lock the holder's
//!    row (the only row lock a transfer takes: the merchant's system
//!    accounts are never updated, their balances derived);
//! 2. [`void_overdue`]: void the holder's holds past their expiry, so that
//!    the totals on its row are what is live;
//! 3. decide with the totals read (`domain::ledger::Totals`);
//! 4. [`insert`]: the transfer. Its trigger admits it (accounts of one
//!    merchant, ledger and unit; a post within its pending and before it
//!    expires; a pending resolved once) and applies it to the holder's
//!    row, whose CHECK refuses a negative balance: a refusal here is the
//!    database's second line of defence ([`TransferError`]).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{Corrupt, StoreError};
use crate::domain::ledger::{AccountRef, Ledger, Phase, Totals};

/// A holder's row, locked: its id, its totals, and how much of `held`
/// belongs to holds already past their expiry.
#[derive(Debug, Clone, Copy)]
pub struct Locked {
    /// The account's id.
    pub account_id: Uuid,
    /// Its totals, as on its row.
    pub totals: Totals,
    /// Held by holds past their expiry (voided by [`void_overdue`]).
    pub overdue: i64,
    /// The database's clock (new holds expire from it).
    pub now: DateTime<Utc>,
}

/// Creates the accounts that do not exist yet (see [`ensure`]).
pub const ENSURE: &str = "INSERT INTO ledger_account (id, merchant_id, ledger, unit, kind, owner)
     SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[])
     ON CONFLICT DO NOTHING";

/// Creates the accounts that do not exist yet. An existing row is left
/// alone and not locked: a system account's row is never written twice.
pub async fn ensure(conn: &mut PgConnection, accounts: &[&AccountRef]) -> Result<(), StoreError> {
    let col = |f: fn(&AccountRef) -> String| accounts.iter().map(|a| f(a)).collect::<Vec<_>>();
    sqlx::query(ENSURE)
        .bind(accounts.iter().map(|a| a.id()).collect::<Vec<_>>())
        .bind(accounts.iter().map(|a| a.merchant_id).collect::<Vec<_>>())
        .bind(col(|a| a.ledger.as_str().to_string()))
        .bind(col(|a| a.unit.clone()))
        .bind(col(|a| a.kind.as_str().to_string()))
        .bind(col(|a| a.owner.clone()))
        .execute(conn)
        .await?;
    Ok(())
}

/// Locks a holder's row (see [`lock_holder`]).
pub const LOCK: &str = "SELECT a.posted, a.held, statement_timestamp() AS now,
            COALESCE((SELECT sum(o.amount) FROM ledger_open_pending o
                       WHERE o.account_id = a.id AND o.expires_at <= statement_timestamp()), 0)::bigint AS overdue
       FROM ledger_account a WHERE a.id = $1 FOR UPDATE";

/// Step 1: creates `holder` and `others` if need be and locks the
/// holder's row until the transaction ends.
pub async fn lock_holder(
    conn: &mut PgConnection,
    holder: &AccountRef,
    others: &[&AccountRef],
) -> Result<Locked, StoreError> {
    let mut all = vec![holder];
    all.extend_from_slice(others);
    ensure(conn, &all).await?;
    let id = holder.id();
    let row = sqlx::query(LOCK)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Corrupt::vanished("ledger account", id))?;
    Ok(Locked {
        account_id: id,
        totals: Totals {
            posted: row.try_get("posted")?,
            held: row.try_get("held")?,
        },
        overdue: row.try_get("overdue")?,
        now: row.try_get("now")?,
    })
}

/// Locks several holders' rows in one statement (see [`lock_holders`]).
pub const LOCK_MANY: &str = "SELECT a.id, a.unit, a.owner, a.posted, a.held, statement_timestamp() AS now,
            COALESCE((SELECT sum(o.amount) FROM ledger_open_pending o
                       WHERE o.account_id = a.id AND o.expires_at <= statement_timestamp()), 0)::bigint AS overdue
       FROM ledger_account a WHERE a.id = ANY($1)
      ORDER BY a.unit COLLATE \"C\", a.owner COLLATE \"C\"
        FOR UPDATE OF a";

/// Step 1 for a transfer on several holders in one transaction (an
/// order's SKUs): locks those of `holders` that exist, in one statement,
/// in the order of their units and owners (bytewise), which is the order
/// every caller locks in, so two transactions sharing holders never wait
/// for each other in a cycle. Holders that do not exist are not created:
/// they are absent from the answer, keyed by account id.
pub async fn lock_holders(
    conn: &mut PgConnection,
    holders: &[AccountRef],
) -> Result<std::collections::BTreeMap<Uuid, Locked>, StoreError> {
    let ids: Vec<Uuid> = holders.iter().map(AccountRef::id).collect();
    let rows = sqlx::query(LOCK_MANY).bind(&ids).fetch_all(conn).await?;
    rows.iter()
        .map(|row| {
            let id: Uuid = row.try_get("id")?;
            Ok((
                id,
                Locked {
                    account_id: id,
                    totals: Totals {
                        posted: row.try_get("posted")?,
                        held: row.try_get("held")?,
                    },
                    overdue: row.try_get("overdue")?,
                    now: row.try_get("now")?,
                },
            ))
        })
        .collect()
}

/// A transfer as stored.
#[derive(Debug, Clone)]
pub struct Transfer {
    /// UUID v7.
    pub id: Uuid,
    /// Whose.
    pub merchant_id: Uuid,
    /// Its ledger.
    pub ledger: Ledger,
    /// What its amount counts.
    pub unit: String,
    /// Taken from.
    pub debit_account_id: Uuid,
    /// Given to.
    pub credit_account_id: Uuid,
    /// Always positive.
    pub amount: i64,
    /// Single, pending, post or void.
    pub phase: Phase,
    /// For a post or void: the pending it resolves.
    pub pending_id: Option<Uuid>,
    /// For a pending: when it stops counting.
    pub expires_at: Option<DateTime<Utc>>,
    /// What it is, in its ledger's words.
    pub code: String,
    /// The holder's side.
    pub holder_account_id: Uuid,
    /// The holder's owner (a customer id).
    pub holder: String,
    /// The holder's totals right after it.
    pub after: Totals,
    /// Free text.
    pub description: Option<String>,
    /// The payment it paid, if any.
    pub payment_id: Option<Uuid>,
    /// The refund it credited, if any.
    pub refund_id: Option<Uuid>,
    /// The order it reserves, converts, releases or sells stock for.
    pub order_id: Option<Uuid>,
    /// The key it was made under.
    pub idempotency_key: Option<String>,
    /// By the database's clock.
    pub created_at: DateTime<Utc>,
}

impl Transfer {
    /// Whether this transfer, found under `new`'s key, is the transfer
    /// `new` describes: its phase, code, amount, accounts and the objects
    /// it is for. `Err` names the first that differs (TigerBeetle's
    /// `exists_with_different_*`): a key found on another transfer is
    /// never reused as if it were this one.
    pub fn same_as(&self, new: &NewTransfer<'_>) -> Result<(), &'static str> {
        let (debit, credit) = match new.holder_is_debit {
            true => (new.holder.id(), new.other.id()),
            false => (new.other.id(), new.holder.id()),
        };
        let differs = [
            (self.phase != new.phase, "phase"),
            (self.code != new.code, "code"),
            (self.amount != new.amount, "amount"),
            (self.holder_account_id != new.holder.id(), "holder account"),
            (self.debit_account_id != debit, "debit account"),
            (self.credit_account_id != credit, "credit account"),
            (self.pending_id != new.pending_id, "pending transfer"),
            (self.payment_id != new.payment_id, "payment"),
            (self.refund_id != new.refund_id, "refund"),
            (self.order_id != new.order_id, "order"),
        ];
        match differs.into_iter().find(|(d, _)| *d) {
            Some((_, what)) => Err(what),
            None => Ok(()),
        }
    }
}

/// The columns [`from_row`] reads, of the alias `t` (a literal, so the
/// statements that read them are whole constants: `oncepay-bench` runs
/// them as its same-SQL floor).
macro_rules! transfer_columns {
    () => {
        "t.id, t.merchant_id, t.ledger, t.unit,
    t.debit_account_id, t.credit_account_id, t.amount, t.phase, t.pending_id, t.expires_at,
    t.code, t.holder_account_id, t.holder, t.posted_after, t.held_after, t.description,
    t.payment_id, t.refund_id, t.order_id, t.idempotency_key, t.created_at"
    };
}

/// The columns [`from_row`] reads, of the alias `t`.
pub(crate) const TRANSFER_COLUMNS: &str = transfer_columns!();

/// Reads a transfer selected with [`TRANSFER_COLUMNS`].
pub(crate) fn from_row(row: &PgRow) -> Result<Transfer, StoreError> {
    let ledger: String = row.try_get("ledger")?;
    let phase: String = row.try_get("phase")?;
    Ok(Transfer {
        id: row.try_get("id")?,
        merchant_id: row.try_get("merchant_id")?,
        ledger: Ledger::parse(&ledger).ok_or_else(|| Corrupt::unknown("ledger", &ledger))?,
        unit: row.try_get("unit")?,
        debit_account_id: row.try_get("debit_account_id")?,
        credit_account_id: row.try_get("credit_account_id")?,
        amount: row.try_get("amount")?,
        phase: Phase::parse(&phase).ok_or_else(|| Corrupt::unknown("transfer phase", &phase))?,
        pending_id: row.try_get("pending_id")?,
        expires_at: row.try_get("expires_at")?,
        code: row.try_get("code")?,
        holder_account_id: row.try_get("holder_account_id")?,
        holder: row.try_get("holder")?,
        after: Totals {
            posted: row.try_get("posted_after")?,
            held: row.try_get("held_after")?,
        },
        description: row.try_get("description")?,
        payment_id: row.try_get("payment_id")?,
        refund_id: row.try_get("refund_id")?,
        order_id: row.try_get("order_id")?,
        idempotency_key: row.try_get("idempotency_key")?,
        created_at: row.try_get("created_at")?,
    })
}

/// A transfer to write.
#[derive(Debug, Clone)]
pub struct NewTransfer<'a> {
    /// UUID v7 (time-ordered: lists page on it).
    pub id: Uuid,
    /// The holder's account.
    pub holder: &'a AccountRef,
    /// The other side (a system account of the same merchant, ledger and unit).
    pub other: &'a AccountRef,
    /// True when the holder is debited (value leaves it).
    pub holder_is_debit: bool,
    /// Positive.
    pub amount: i64,
    /// Its phase.
    pub phase: Phase,
    /// For a post or void.
    pub pending_id: Option<Uuid>,
    /// For a pending.
    pub expires_at: Option<DateTime<Utc>>,
    /// Its code.
    pub code: &'a str,
    /// Free text.
    pub description: Option<&'a str>,
    /// The payment it pays.
    pub payment_id: Option<Uuid>,
    /// The refund it credits.
    pub refund_id: Option<Uuid>,
    /// The order it is for (stock).
    pub order_id: Option<Uuid>,
    /// One transfer per key, space and merchant.
    pub key: Option<TransferKey<'a>>,
}

/// A transfer's key, in its space: a client's Idempotency-Key, or a key
/// the service derives from its own ids (`payment:<id>`,
/// `reservation:<order>:<sku>`, ...). The database keeps one transfer per
/// key within each space (`ledger_transfer_one_per_key` on merchant,
/// space and key), so a client's key can never take a key the service
/// will use, whatever text it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferKey<'a> {
    /// The Idempotency-Key of the client's request.
    Client(&'a str),
    /// A key the service made.
    Service(&'a str),
}

impl<'a> TransferKey<'a> {
    /// Its space, as stored.
    pub fn space(self) -> &'static str {
        match self {
            TransferKey::Client(_) => "client",
            TransferKey::Service(_) => "service",
        }
    }

    /// The key itself.
    pub fn text(self) -> &'a str {
        match self {
            TransferKey::Client(k) | TransferKey::Service(k) => k,
        }
    }
}

/// Why the database refused a transfer.
#[derive(Debug)]
pub enum TransferError {
    /// The holder would go below zero or hold more than it has.
    Insufficient,
    /// A post above its pending.
    ExceedsPending,
    /// A post of a pending past its expiry.
    PendingExpired,
    /// The pending was already resolved.
    AlreadyResolved,
    /// A transfer was already made under this key.
    KeyUsed,
    /// Anything else.
    Store(StoreError),
}

impl From<TransferError> for StoreError {
    fn from(e: TransferError) -> Self {
        match e {
            TransferError::Store(e) => e,
            other => Corrupt::Broken(format!("a ledger transfer refused: {other:?}")).into(),
        }
    }
}

/// Writes a transfer (see [`insert`]).
pub const INSERT: &str = concat!(
    "INSERT INTO ledger_transfer AS t
        (id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount, phase,
         pending_id, expires_at, code, holder_account_id, holder, description, payment_id,
         refund_id, idempotency_key, order_id, key_space)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
     RETURNING ",
    transfer_columns!()
);

/// Step 4: writes the transfer; its trigger applies it to the holder.
pub async fn insert(
    conn: &mut PgConnection,
    new: &NewTransfer<'_>,
) -> Result<Transfer, TransferError> {
    let (debit, credit) = match new.holder_is_debit {
        true => (new.holder, new.other),
        false => (new.other, new.holder),
    };
    let row = sqlx::query(INSERT)
        .bind(new.id)
        .bind(new.holder.merchant_id)
        .bind(new.holder.ledger.as_str())
        .bind(&new.holder.unit)
        .bind(debit.id())
        .bind(credit.id())
        .bind(new.amount)
        .bind(new.phase.as_str())
        .bind(new.pending_id)
        .bind(new.expires_at)
        .bind(new.code)
        .bind(new.holder.id())
        .bind(&new.holder.owner)
        .bind(new.description)
        .bind(new.payment_id)
        .bind(new.refund_id)
        .bind(new.key.map(TransferKey::text))
        .bind(new.order_id)
        .bind(new.key.map(TransferKey::space))
        .fetch_one(conn)
        .await
        .map_err(|e| match super::violated_constraint(&e) {
            Some("ledger_account_never_negative") => TransferError::Insufficient,
            Some("ledger_post_within_pending") => TransferError::ExceedsPending,
            Some("ledger_post_before_expiry") => TransferError::PendingExpired,
            Some("ledger_transfer_resolved_once") => TransferError::AlreadyResolved,
            Some("ledger_transfer_one_per_key") => TransferError::KeyUsed,
            _ => TransferError::Store(e.into()),
        })?;
    from_row(&row).map_err(TransferError::Store)
}

/// Places holds in one statement (see [`hold_all`]). `$1`..`$16` are one
/// array per column of the pending transfers, one element per hold.
pub const HOLD_ALL: &str = "WITH w AS (
        SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::uuid[],
                             $6::uuid[], $7::bigint[], $8::timestamptz[], $9::text[],
                             $10::uuid[], $11::text[], $12::text[], $13::uuid[], $14::uuid[],
                             $15::text[], $16::uuid[], $17::text[])
            AS w(id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount,
                 expires_at, code, holder_account_id, holder, description, payment_id,
                 refund_id, idempotency_key, order_id, key_space)),
     enough AS (
        SELECT count(a.id) = (SELECT count(*) FROM w)
               AND COALESCE(bool_and(a.posted - a.held >= w.amount), false) AS ok
          FROM w LEFT JOIN ledger_account a ON a.id = w.holder_account_id),
     placed AS (
        INSERT INTO ledger_transfer
               (id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount, phase,
                expires_at, code, holder_account_id, holder, description, payment_id, refund_id,
                idempotency_key, order_id, key_space)
        SELECT w.id, w.merchant_id, w.ledger, w.unit, w.debit_account_id, w.credit_account_id,
               w.amount, 'pending', w.expires_at, w.code, w.holder_account_id, w.holder,
               w.description, w.payment_id, w.refund_id, w.idempotency_key, w.order_id,
               w.key_space
          FROM w JOIN ledger_account a ON a.id = w.holder_account_id
         WHERE (SELECT ok FROM enough)
         ORDER BY a.unit COLLATE \"C\", a.owner COLLATE \"C\"
        RETURNING 1)
     SELECT (SELECT ok FROM enough) AS ok, (SELECT count(*) FROM placed) AS placed";

/// Steps 1 to 4 for holds on several holders at once, one hold each, in
/// one statement, as cheap for a holder's row as one transfer's
/// [`insert`]: each holder read to have the hold's amount on its row
/// (`posted - held`, holds past their expiry still counting) as of the
/// statement's start, without a lock, and the pending transfers written
/// only if every one has, in the order every caller locks holders in
/// (their trigger locks and moves each row, as [`insert`]'s does). A
/// holder many writers contend for is then locked by this statement's
/// writes and the commit alone, however much the transaction wrote before
/// it: what a flash sale on one SKU queues on. The row's own `CHECK` is
/// the decision where a writer moved the row after the read: the
/// statement runs under a savepoint, and that refusal rolls back to it.
/// `false` when any holder is missing or short, read or refused: nothing
/// is written, and the caller decides by the steps one at a time, the
/// holders locked (voiding the overdue holds first). Each `holds` entry
/// must be a pending on its own holder.
pub async fn hold_all(
    conn: &mut PgConnection,
    holds: &[NewTransfer<'_>],
) -> Result<bool, StoreError> {
    debug_assert!(holds
        .iter()
        .all(|h| h.phase == Phase::Pending && h.pending_id.is_none()));
    let sides = |h: &NewTransfer<'_>| match h.holder_is_debit {
        true => (h.holder.id(), h.other.id()),
        false => (h.other.id(), h.holder.id()),
    };
    let col = |f: &dyn Fn(&NewTransfer<'_>) -> String| holds.iter().map(f).collect::<Vec<_>>();
    let ids = |f: &dyn Fn(&NewTransfer<'_>) -> Uuid| holds.iter().map(f).collect::<Vec<_>>();
    let opt =
        |f: &dyn Fn(&NewTransfer<'_>) -> Option<Uuid>| holds.iter().map(f).collect::<Vec<_>>();
    let text =
        |f: &dyn Fn(&NewTransfer<'_>) -> Option<String>| holds.iter().map(f).collect::<Vec<_>>();
    sqlx::query("SAVEPOINT hold_all")
        .execute(&mut *conn)
        .await?;
    let placed = sqlx::query(HOLD_ALL)
        .bind(ids(&|h| h.id))
        .bind(ids(&|h| h.holder.merchant_id))
        .bind(col(&|h| h.holder.ledger.as_str().to_string()))
        .bind(col(&|h| h.holder.unit.clone()))
        .bind(ids(&|h| sides(h).0))
        .bind(ids(&|h| sides(h).1))
        .bind(holds.iter().map(|h| h.amount).collect::<Vec<_>>())
        .bind(holds.iter().map(|h| h.expires_at).collect::<Vec<_>>())
        .bind(col(&|h| h.code.to_string()))
        .bind(ids(&|h| h.holder.id()))
        .bind(col(&|h| h.holder.owner.clone()))
        .bind(text(&|h| h.description.map(str::to_string)))
        .bind(opt(&|h| h.payment_id))
        .bind(opt(&|h| h.refund_id))
        .bind(text(&|h| h.key.map(|k| k.text().to_string())))
        .bind(opt(&|h| h.order_id))
        .bind(text(&|h| h.key.map(|k| k.space().to_string())))
        .fetch_one(&mut *conn)
        .await;
    let row = match placed {
        Ok(row) => row,
        Err(e) if super::violated_constraint(&e) == Some("ledger_account_never_negative") => {
            sqlx::query("ROLLBACK TO SAVEPOINT hold_all")
                .execute(&mut *conn)
                .await?;
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let ok: bool = row.try_get("ok")?;
    let placed: i64 = row.try_get("placed")?;
    match (ok, usize::try_from(placed).ok() == Some(holds.len())) {
        (true, true) => Ok(true),
        (false, _) if placed == 0 => Ok(false),
        _ => Err(Corrupt::Broken(format!(
            "{placed} of {} holds placed in one statement",
            holds.len()
        ))
        .into()),
    }
}

/// Step 2: voids the holds of the locked holder `account_id` that are past
/// their expiry, each with a transfer of `code`; returns the voids. Under
/// the holder's lock, so no capture of them can race; the sweeper does
/// the same for holders nobody touches ([`overdue`]).
pub async fn void_overdue(
    conn: &mut PgConnection,
    account_id: Uuid,
    code: &str,
) -> Result<Vec<Transfer>, StoreError> {
    let due: Vec<Uuid> = sqlx::query_scalar(
        "SELECT pending_id FROM ledger_open_pending
          WHERE account_id = $1 AND expires_at <= statement_timestamp() ORDER BY expires_at",
    )
    .bind(account_id)
    .fetch_all(&mut *conn)
    .await?;
    let mut voids = Vec::with_capacity(due.len());
    for pending_id in due {
        let row = sqlx::query(&format!(
            "INSERT INTO ledger_transfer AS t
                    (id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount,
                     phase, pending_id, code, holder_account_id, holder, order_id)
             SELECT $1, p.merchant_id, p.ledger, p.unit, p.debit_account_id, p.credit_account_id,
                    p.amount, 'void', p.id, $3, p.holder_account_id, p.holder, p.order_id
               FROM ledger_transfer p WHERE p.id = $2
             RETURNING {TRANSFER_COLUMNS}"
        ))
        .bind(Uuid::now_v7())
        .bind(pending_id)
        .bind(code)
        .fetch_one(&mut *conn)
        .await?;
        voids.push(from_row(&row)?);
    }
    Ok(voids)
}

/// Voids pending `pending_id` (held by the locked holder) with a
/// transfer of `code`: its release, or its expiry. The trigger refuses a
/// pending already resolved.
pub async fn void(
    conn: &mut PgConnection,
    pending_id: Uuid,
    code: &str,
) -> Result<Transfer, TransferError> {
    let row = sqlx::query(&format!(
        "INSERT INTO ledger_transfer AS t
                (id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount,
                 phase, pending_id, code, holder_account_id, holder, order_id)
         SELECT $1, p.merchant_id, p.ledger, p.unit, p.debit_account_id, p.credit_account_id,
                p.amount, 'void', p.id, $3, p.holder_account_id, p.holder, p.order_id
           FROM ledger_transfer p WHERE p.id = $2 AND p.phase = 'pending'
         RETURNING {TRANSFER_COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(pending_id)
    .bind(code)
    .fetch_one(conn)
    .await
    .map_err(|e| match super::violated_constraint(&e) {
        Some("ledger_transfer_resolved_once") => TransferError::AlreadyResolved,
        _ => TransferError::Store(e.into()),
    })?;
    from_row(&row).map_err(TransferError::Store)
}

/// The pending transfers of `accounts` past their expiry and not yet
/// resolved: (pending id, its account, the order it is for).
pub async fn overdue_of(
    conn: &mut PgConnection,
    accounts: &[Uuid],
) -> Result<Vec<(Uuid, Uuid, Option<Uuid>)>, StoreError> {
    let rows = sqlx::query(
        "SELECT o.pending_id, o.account_id, t.order_id
           FROM ledger_open_pending o JOIN ledger_transfer t ON t.id = o.pending_id
          WHERE o.account_id = ANY($1) AND o.expires_at <= statement_timestamp()
          ORDER BY o.expires_at",
    )
    .bind(accounts)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get("pending_id")?,
                r.try_get("account_id")?,
                r.try_get("order_id")?,
            ))
        })
        .collect()
}

/// Posts the whole of pending `pending_id` (held by the locked holder)
/// with a transfer of `code`, if it has not expired: `None` when its
/// deadline has passed, decided by the statement's own clock, which is
/// the clock the trigger checks (`ledger_post_before_expiry`), so a
/// pending that expires between the caller's read and this write is
/// answered, not refused in a way that aborts the transaction.
pub async fn post_pending(
    conn: &mut PgConnection,
    pending_id: Uuid,
    code: &str,
) -> Result<Option<Transfer>, TransferError> {
    let row = sqlx::query(&format!(
        "INSERT INTO ledger_transfer AS t
                (id, merchant_id, ledger, unit, debit_account_id, credit_account_id, amount,
                 phase, pending_id, code, holder_account_id, holder, order_id)
         SELECT $1, p.merchant_id, p.ledger, p.unit, p.debit_account_id, p.credit_account_id,
                p.amount, 'post', p.id, $3, p.holder_account_id, p.holder, p.order_id
           FROM ledger_transfer p
          WHERE p.id = $2 AND p.phase = 'pending' AND p.expires_at > statement_timestamp()
         RETURNING {TRANSFER_COLUMNS}"
    ))
    .bind(Uuid::now_v7())
    .bind(pending_id)
    .bind(code)
    .fetch_optional(conn)
    .await
    .map_err(|e| match super::violated_constraint(&e) {
        Some("ledger_account_never_negative") => TransferError::Insufficient,
        Some("ledger_transfer_resolved_once") => TransferError::AlreadyResolved,
        _ => TransferError::Store(e.into()),
    })?;
    row.as_ref()
        .map(from_row)
        .transpose()
        .map_err(TransferError::Store)
}

/// Holds of `ledger` past their expiry, oldest first, at most `limit`:
/// (merchant, ledger, unit, holder) of each, for the sweeper to lock and
/// void. Each ledger voids its own, with its own code and events.
pub async fn overdue(
    pool: &PgPool,
    ledger: Ledger,
    limit: i64,
) -> Result<Vec<AccountRef>, StoreError> {
    let rows = sqlx::query(
        "SELECT DISTINCT a.merchant_id, a.ledger, a.unit, a.owner
           FROM (SELECT o.account_id FROM ledger_open_pending o
                   JOIN ledger_transfer p ON p.id = o.pending_id
                  WHERE o.expires_at <= statement_timestamp() AND p.ledger = $2
                  ORDER BY o.expires_at LIMIT $1) o
           JOIN ledger_account a ON a.id = o.account_id",
    )
    .bind(limit)
    .bind(ledger.as_str())
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let ledger: String = row.try_get("ledger")?;
            Ok(AccountRef::holder(
                row.try_get("merchant_id")?,
                Ledger::parse(&ledger).ok_or_else(|| Corrupt::unknown("ledger", &ledger))?,
                &row.try_get::<String, _>("unit")?,
                &row.try_get::<String, _>("owner")?,
            ))
        })
        .collect()
}

/// One of the merchant's transfers in `ledger`.
pub async fn get(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    ledger: Ledger,
    id: Uuid,
) -> Result<Option<Transfer>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {TRANSFER_COLUMNS} FROM ledger_transfer t
          WHERE t.id = $1 AND t.merchant_id = $2 AND t.ledger = $3"
    ))
    .bind(id)
    .bind(merchant_id)
    .bind(ledger.as_str())
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(from_row).transpose()
}

/// Reads the transfer made under a key (see [`by_key`]).
pub const BY_KEY: &str = concat!(
    "SELECT ",
    transfer_columns!(),
    " FROM ledger_transfer t
          WHERE t.merchant_id = $1 AND t.idempotency_key = $2 AND t.key_space = $3"
);

/// The merchant's transfer made under `key` (in its space), if any.
pub async fn by_key(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    key: TransferKey<'_>,
) -> Result<Option<Transfer>, StoreError> {
    let row = sqlx::query(BY_KEY)
        .bind(merchant_id)
        .bind(key.text())
        .bind(key.space())
        .fetch_optional(conn)
        .await?;
    row.as_ref().map(from_row).transpose()
}

/// A pending transfer and what resolved it, if anything has.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The pending transfer.
    pub transfer: Transfer,
    /// The post or void that resolved it.
    pub resolution: Option<Transfer>,
    /// The database's clock when read (to judge its expiry).
    pub now: DateTime<Utc>,
}

/// One of the merchant's pending transfers in `ledger`, with its
/// resolution.
pub async fn pending(
    conn: &mut PgConnection,
    merchant_id: Uuid,
    ledger: Ledger,
    id: Uuid,
) -> Result<Option<Pending>, StoreError> {
    let Some(transfer) = get(conn, merchant_id, ledger, id).await? else {
        return Ok(None);
    };
    if transfer.phase != Phase::Pending {
        return Ok(None);
    }
    let row = sqlx::query(&format!(
        "SELECT statement_timestamp() AS now, r.* FROM (SELECT 1) one
           LEFT JOIN LATERAL (SELECT {TRANSFER_COLUMNS} FROM ledger_transfer t
                               WHERE t.pending_id = $1) r ON true"
    ))
    .bind(id)
    .fetch_one(&mut *conn)
    .await?;
    let resolved: Option<Uuid> = row.try_get("id")?;
    Ok(Some(Pending {
        transfer,
        resolution: resolved.map(|_| from_row(&row)).transpose()?,
        now: row.try_get("now")?,
    }))
}

/// A holder's totals now, and how much of `held` is past its expiry;
/// zeros for an account that does not exist yet.
pub async fn totals(
    conn: &mut PgConnection,
    account: &AccountRef,
) -> Result<(Totals, i64), StoreError> {
    let row = sqlx::query(
        "SELECT a.posted, a.held,
                COALESCE((SELECT sum(o.amount) FROM ledger_open_pending o
                           WHERE o.account_id = a.id AND o.expires_at <= statement_timestamp()), 0)::bigint
                    AS overdue
           FROM ledger_account a WHERE a.id = $1",
    )
    .bind(account.id())
    .fetch_optional(conn)
    .await?;
    match row {
        None => Ok((Totals::default(), 0)),
        Some(row) => Ok((
            Totals {
                posted: row.try_get("posted")?,
                held: row.try_get("held")?,
            },
            row.try_get("overdue")?,
        )),
    }
}

/// One line of `oncepay ledger check`: a merchant's ledger and unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    /// The merchant's name.
    pub merchant: String,
    /// The ledger.
    pub ledger: String,
    /// The unit.
    pub unit: String,
    /// Accounts in it.
    pub accounts: i64,
    /// Transfers in it.
    pub transfers: i64,
    /// The sum of every account's posted balance, derived from transfers
    /// (zero when every transfer gave what it took).
    pub posted_sum: i64,
    /// Pending amounts not yet resolved, minus those on the open list
    /// (zero when the list of open holds is the holds not resolved).
    pub pending_sum: i64,
    /// Holder accounts whose row disagrees with their transfers.
    pub totals_mismatched: i64,
    /// Holder accounts below zero or holding more than they have.
    pub negative: i64,
    /// Pending transfers resolved more than once, or posted above their amount.
    pub bad_resolutions: i64,
    /// Transfers the payments and refunds disagree with, and the reverse
    /// (issue 54): a balance payment's transfer without a succeeded (or
    /// still pending) balance payment of that amount, a balance refund's
    /// without its refund, a stock conversion or sale for an order no
    /// payment paid; a succeeded balance payment or balance refund without
    /// its transfer.
    pub unmatched: i64,
}

impl CheckLine {
    /// True when every rule holds.
    pub fn holds(&self) -> bool {
        self.posted_sum == 0
            && self.pending_sum == 0
            && self.totals_mismatched == 0
            && self.negative == 0
            && self.bad_resolutions == 0
            && self.unmatched == 0
    }
}

/// Verifies the ledger rules for every merchant (or the one named), per
/// ledger and unit: each account's totals derived from its transfers sum
/// to zero, every holder's row equals what its transfers derive, no holder
/// is negative, no pending is resolved twice or posted above itself.
pub async fn check(pool: &PgPool, merchant: Option<&str>) -> Result<Vec<CheckLine>, StoreError> {
    let rows = sqlx::query(
        "WITH legs AS (
            -- Each transfer's effect on each side: posted and pending.
            SELECT t.debit_account_id AS account_id,
                   CASE WHEN t.phase IN ('single', 'post') THEN -t.amount ELSE 0 END AS posted,
                   CASE t.phase WHEN 'pending' THEN t.amount
                                WHEN 'post' THEN -p.amount WHEN 'void' THEN -p.amount
                                ELSE 0 END AS held
              FROM ledger_transfer t LEFT JOIN ledger_transfer p ON p.id = t.pending_id
            UNION ALL
            -- A pending holds on its debit side only (what may not be
            -- spent); the credit side gets nothing until it is posted.
            SELECT t.credit_account_id,
                   CASE WHEN t.phase IN ('single', 'post') THEN t.amount ELSE 0 END, 0
              FROM ledger_transfer t LEFT JOIN ledger_transfer p ON p.id = t.pending_id),
         derived AS (
            SELECT a.id, a.merchant_id, a.ledger, a.unit, a.kind, a.posted, a.held,
                   COALESCE(sum(l.posted), 0) AS d_posted, COALESCE(sum(l.held), 0) AS d_held
              FROM ledger_account a LEFT JOIN legs l ON l.account_id = a.id
             GROUP BY a.id),
         per_unit AS (
            SELECT merchant_id, ledger, unit, count(*) AS accounts,
                   sum(d_posted)::bigint AS posted_sum,
                   count(*) FILTER (WHERE kind = 'holder'
                                      AND (posted <> d_posted OR held <> d_held))
                       AS mismatched,
                   count(*) FILTER (WHERE kind = 'holder'
                                      AND (posted < 0 OR held < 0 OR held > posted))
                       AS negative
              FROM derived GROUP BY merchant_id, ledger, unit),
         pending_sums AS (
            SELECT t.merchant_id, t.ledger, t.unit, count(*) AS transfers,
                   (sum(CASE t.phase WHEN 'pending' THEN t.amount ELSE 0 END)
                    - sum(CASE WHEN t.phase IN ('post', 'void') THEN p.amount ELSE 0 END)
                    - (SELECT COALESCE(sum(o.amount), 0) FROM ledger_open_pending o
                         JOIN ledger_transfer op ON op.id = o.pending_id
                        WHERE op.merchant_id = t.merchant_id AND op.ledger = t.ledger
                          AND op.unit = t.unit))::bigint AS pending_sum,
                   count(*) FILTER (WHERE t.phase = 'post' AND t.amount > p.amount)
                   + count(*) FILTER (WHERE t.phase = 'post' AND p.expires_at <= t.created_at)
                       AS bad_resolutions
              FROM ledger_transfer t LEFT JOIN ledger_transfer p ON p.id = t.pending_id
             GROUP BY t.merchant_id, t.ledger, t.unit),
         -- The ledger against the payments and refunds it stands for. A
         -- payment or refund still pending is in flight (its transfer is
         -- written before the payment is settled), not a disagreement.
         unmatched AS (
            SELECT t.merchant_id, t.ledger, t.unit FROM ledger_transfer t
             WHERE (t.ledger = 'balance' AND t.code = 'payment' AND NOT EXISTS (
                      SELECT 1 FROM payment_attempt p
                       WHERE p.id = t.payment_id AND p.provider = 'balance'
                         AND p.status IN ('succeeded', 'pending')
                         AND p.amount = t.amount AND p.currency = t.unit))
                OR (t.ledger = 'balance' AND t.code = 'refund' AND NOT EXISTS (
                      SELECT 1 FROM refund r
                       WHERE r.id = t.refund_id AND r.status IN ('succeeded', 'pending')
                         AND r.amount = t.amount))
                OR (t.ledger = 'stock' AND t.code IN ('conversion', 'sale') AND NOT EXISTS (
                      SELECT 1 FROM payment_attempt p
                       WHERE p.order_id = t.order_id AND p.status = 'succeeded'))
            UNION ALL
            SELECT p.merchant_id, 'balance', p.currency FROM payment_attempt p
             WHERE p.provider = 'balance' AND p.status = 'succeeded' AND NOT EXISTS (
                   SELECT 1 FROM ledger_transfer t
                    WHERE t.payment_id = p.id AND t.ledger = 'balance' AND t.code = 'payment'
                      AND t.amount = p.amount)
            UNION ALL
            SELECT r.merchant_id, 'balance', p.currency
              FROM refund r JOIN payment_attempt p ON p.id = r.payment_id
             WHERE r.status = 'succeeded' AND (r.destination = 'balance' OR p.provider = 'balance')
               AND NOT EXISTS (
                   SELECT 1 FROM ledger_transfer t
                    WHERE t.refund_id = r.id AND t.ledger = 'balance' AND t.code = 'refund'
                      AND t.amount = r.amount)),
         unmatched_sums AS (
            SELECT merchant_id, ledger, unit, count(*) AS unmatched
              FROM unmatched GROUP BY merchant_id, ledger, unit)
         SELECT m.name, u.ledger, u.unit, u.accounts, COALESCE(s.transfers, 0) AS transfers,
                u.posted_sum, COALESCE(s.pending_sum, 0) AS pending_sum,
                u.mismatched, u.negative, COALESCE(s.bad_resolutions, 0) AS bad_resolutions,
                COALESCE(x.unmatched, 0) AS unmatched
           FROM per_unit u JOIN merchant m ON m.id = u.merchant_id
           LEFT JOIN pending_sums s
             ON s.merchant_id = u.merchant_id AND s.ledger = u.ledger AND s.unit = u.unit
           LEFT JOIN unmatched_sums x
             ON x.merchant_id = u.merchant_id AND x.ledger = u.ledger AND x.unit = u.unit
          WHERE $1::text IS NULL OR m.name = $1
          ORDER BY m.name, u.ledger, u.unit",
    )
    .bind(merchant)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(CheckLine {
                merchant: row.try_get("name")?,
                ledger: row.try_get("ledger")?,
                unit: row.try_get("unit")?,
                accounts: row.try_get("accounts")?,
                transfers: row.try_get("transfers")?,
                posted_sum: row.try_get("posted_sum")?,
                pending_sum: row.try_get("pending_sum")?,
                totals_mismatched: row.try_get("mismatched")?,
                negative: row.try_get("negative")?,
                bad_resolutions: row.try_get("bad_resolutions")?,
                unmatched: row.try_get("unmatched")?,
            })
        })
        .collect()
}

/// Whether a merchant of this name exists (for `oncepay ledger check
/// --merchant`, which must not pass a name it does not know).
pub async fn merchant_exists(pool: &PgPool, name: &str) -> Result<bool, StoreError> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM merchant WHERE name = $1)")
            .bind(name)
            .fetch_one(pool)
            .await?,
    )
}
