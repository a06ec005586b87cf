//! The balance ledger's writes that more than one path makes: the
//! commands (`commands::balances`), the `balance` payment provider
//! (`provider::balance`) and the sweeper each lock a customer's account,
//! void its holds past their expiry and write their events the same way.
//! The engine itself (generic over what it counts) is `store::ledger`.

use uuid::Uuid;

use crate::domain::event::{Cause, EventType};
use crate::domain::ledger::balance::Code;
use crate::domain::ledger::{self, AccountRef, Totals};
use crate::metrics::Metrics;
use crate::store::balances::{BalanceHold, BalanceTransaction};
use crate::store::ledger::{Locked, NewTransfer, Transfer, TransferError, TransferKey};
use crate::store::{self, StoreError};

/// Step 1 and 2 of a transfer on a customer's balance: locks the
/// customer's account (creating it and `system` if need be), and voids
/// the holds past their expiry, each with its `balance_hold.expired`.
/// Returns the lock and the totals once they are voided.
pub async fn lock_and_expire(
    tx: &mut sqlx::PgConnection,
    metrics: &Metrics,
    account: &AccountRef,
    system: &AccountRef,
    cause: Cause,
) -> Result<(Locked, Totals), StoreError> {
    let locked = store::ledger::lock_holder(tx, account, &[system]).await?;
    let mut totals = locked.totals;
    if locked.overdue > 0 {
        let voids =
            store::ledger::void_overdue(tx, locked.account_id, Code::HoldExpiry.as_str()).await?;
        for void in &voids {
            totals = void.after;
            hold_event(tx, metrics, void, EventType::BalanceHoldExpired, cause).await?;
        }
    }
    Ok((locked, totals))
}

/// Writes the event of a hold that `transfer` placed or resolved.
pub async fn hold_event(
    tx: &mut sqlx::PgConnection,
    metrics: &Metrics,
    transfer: &Transfer,
    event_type: EventType,
    cause: Cause,
) -> Result<BalanceHold, StoreError> {
    let hold_id = transfer.pending_id.unwrap_or(transfer.id);
    let pending =
        store::ledger::pending(tx, transfer.merchant_id, ledger::Ledger::Balance, hold_id)
            .await?
            .ok_or_else(|| store::Corrupt::vanished("balance hold", hold_id))?;
    let hold = BalanceHold::of(&pending);
    crate::events::ledger_changed(
        tx,
        metrics,
        transfer.merchant_id,
        event_type,
        hold.id,
        &hold,
        cause,
    )
    .await?;
    Ok(hold)
}

/// The sweeper's pass over holds past their expiry: each holder found is
/// locked and its overdue holds voided with their `balance_hold.expired`,
/// as a transfer on it would. Returns how many holders it swept.
pub async fn expire_holds(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    limit: i64,
) -> Result<usize, StoreError> {
    let holders = store::ledger::overdue(pool, ledger::Ledger::Balance, limit).await?;
    for account in &holders {
        let mut tx = pool.begin().await?;
        let system = account.system(Code::HoldExpiry.shape().2);
        lock_and_expire(&mut tx, metrics, account, &system, Cause::Reconciler).await?;
        tx.commit().await?;
    }
    Ok(holders.len())
}

/// What paying from a balance came to.
#[derive(Debug)]
pub enum Paid {
    /// The payment's transfer (made now, or before under its key).
    Done(Box<Transfer>),
    /// The balance had this much available: less than the amount.
    Insufficient(i64),
}

/// The key of the one transfer a payment may make.
pub fn payment_key(payment_id: Uuid) -> String {
    format!("payment:{payment_id}")
}

/// The key of the one transfer a refund may make.
pub fn refund_key(refund_id: Uuid) -> String {
    format!("refund:{refund_id}")
}

pub use crate::store::balances::Party;

/// Pays `party.amount` from the customer's balance for its payment, once:
/// the transfer carries the payment's key, so a repeat (a retry, a
/// resume) finds it instead of paying twice. `balance.debited` with it.
pub async fn pay(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    party: &Party,
) -> Result<Paid, StoreError> {
    let (account, system, key) = payment_side(party);
    let new = payment_transfer(party, &account, &system, &key);
    let mut tx = pool.begin().await?;
    if let Some(made) = made_before(&mut tx, pool, metrics, &new).await? {
        return Ok(Paid::Done(Box::new(made)));
    }
    let (_, totals) = lock_and_expire(&mut tx, metrics, &account, &system, Cause::Command).await?;
    if totals.after_debit(new.phase, party.amount, 0).is_err() {
        // The expiries voided on the way stay voided.
        tx.commit().await?;
        return Ok(Paid::Insufficient(totals.available()));
    }
    let transfer = match store::ledger::insert(&mut tx, &new).await {
        Ok(t) => t,
        Err(TransferError::Insufficient) => return Ok(Paid::Insufficient(totals.available())),
        Err(e) => return Err(e.into()),
    };
    transaction_event(&mut tx, metrics, &transfer, EventType::BalanceDebited).await?;
    tx.commit().await?;
    Ok(Paid::Done(Box::new(transfer)))
}

/// The accounts and the key of a payment from a balance.
fn payment_side(party: &Party) -> (AccountRef, AccountRef, String) {
    let account = store::balances::account(party.merchant_id, &party.customer_id, &party.currency);
    let system = account.system(Code::Payment.shape().2);
    (account, system, payment_key(party.payment_id))
}

/// The one transfer a payment from a balance makes.
fn payment_transfer<'a>(
    party: &Party,
    account: &'a AccountRef,
    system: &'a AccountRef,
    key: &'a str,
) -> NewTransfer<'a> {
    NewTransfer {
        id: Uuid::now_v7(),
        holder: account,
        other: system,
        holder_is_debit: true,
        amount: party.amount,
        phase: Code::Payment.shape().0,
        pending_id: None,
        expires_at: None,
        code: Code::Payment.as_str(),
        description: None,
        payment_id: Some(party.payment_id),
        refund_id: None,
        order_id: None,
        key: Some(TransferKey::Service(key)),
    }
}

/// The accounts and the key of a refund to a balance.
fn refund_side(party: &Party, refund_id: Uuid) -> (AccountRef, AccountRef, String) {
    let account = store::balances::account(party.merchant_id, &party.customer_id, &party.currency);
    let system = account.system(Code::Refund.shape().2);
    (account, system, refund_key(refund_id))
}

/// The one transfer a refund to a balance makes.
fn refund_transfer<'a>(
    party: &Party,
    refund_id: Uuid,
    account: &'a AccountRef,
    system: &'a AccountRef,
    key: &'a str,
) -> NewTransfer<'a> {
    NewTransfer {
        id: Uuid::now_v7(),
        holder: account,
        other: system,
        holder_is_debit: false,
        amount: party.amount,
        phase: Code::Refund.shape().0,
        pending_id: None,
        expires_at: None,
        code: Code::Refund.as_str(),
        description: None,
        payment_id: Some(party.payment_id),
        refund_id: Some(refund_id),
        order_id: None,
        key: Some(TransferKey::Service(key)),
    }
}

/// The transfer a payment from a balance made, if any (compared, as
/// [`made_before`] does).
pub async fn payment_made(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    party: &Party,
) -> Result<Option<Transfer>, StoreError> {
    let (account, system, key) = payment_side(party);
    let new = payment_transfer(party, &account, &system, &key);
    let mut conn = pool.acquire().await?;
    made_before(&mut conn, pool, metrics, &new).await
}

/// The transfer a refund to a balance made, if any (compared, as
/// [`made_before`] does).
pub async fn refund_made(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    party: &Party,
    refund_id: Uuid,
) -> Result<Option<Transfer>, StoreError> {
    let (account, system, key) = refund_side(party, refund_id);
    let new = refund_transfer(party, refund_id, &account, &system, &key);
    let mut conn = pool.acquire().await?;
    made_before(&mut conn, pool, metrics, &new).await
}

/// The transfer the service's key of `new` made before, if any: it must
/// be the transfer `new` describes (same phase, code, amount, accounts,
/// objects). A key found on another transfer is never reused: it is
/// recorded once as a `ledger_key_conflict` incident and refused.
pub async fn made_before(
    tx: &mut sqlx::PgConnection,
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    new: &NewTransfer<'_>,
) -> Result<Option<Transfer>, StoreError> {
    let Some(key) = new.key else {
        return Ok(None);
    };
    let Some(made) = store::ledger::by_key(tx, new.holder.merchant_id, key).await? else {
        return Ok(None);
    };
    let Err(what) = made.same_as(new) else {
        return Ok(Some(made));
    };
    let detail = format!(
        "the key {:?} ({} space) names transfer {}, whose {what} differs from the transfer it should be",
        key.text(),
        key.space(),
        made.id
    );
    if store::incidents::ledger_key_conflict(
        pool,
        new.holder.merchant_id,
        key.text(),
        &detail,
        "command",
    )
    .await?
    {
        metrics
            .incidents
            .with_label_values(&["ledger_key_conflict"])
            .inc();
    }
    tracing::error!(key = key.text(), transfer_id = %made.id, %what, "INCIDENT: a ledger key found on another transfer; refused, not reused");
    Err(store::Corrupt::Broken(detail).into())
}

/// Credits a refund to the customer's balance, once (the refund's key);
/// `balance.credited` with it.
pub async fn credit_refund(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    party: &Party,
    refund_id: Uuid,
) -> Result<Transfer, StoreError> {
    let (account, system, key) = refund_side(party, refund_id);
    let new = refund_transfer(party, refund_id, &account, &system, &key);
    let mut tx = pool.begin().await?;
    if let Some(made) = made_before(&mut tx, pool, metrics, &new).await? {
        return Ok(made);
    }
    lock_and_expire(&mut tx, metrics, &account, &system, Cause::Command).await?;
    let transfer = store::ledger::insert(&mut tx, &new).await?;
    transaction_event(&mut tx, metrics, &transfer, EventType::BalanceCredited).await?;
    tx.commit().await?;
    Ok(transfer)
}

/// Writes the event of a balance transaction (`balance.credited`,
/// `balance.debited`), whose object is the transaction.
pub async fn transaction_event(
    tx: &mut sqlx::PgConnection,
    metrics: &Metrics,
    transfer: &Transfer,
    event_type: EventType,
) -> Result<(), StoreError> {
    let view = BalanceTransaction::from(transfer);
    crate::events::ledger_changed(
        tx,
        metrics,
        transfer.merchant_id,
        event_type,
        view.id,
        &view,
        Cause::Command,
    )
    .await
}
