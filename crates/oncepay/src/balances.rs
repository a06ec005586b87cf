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
use crate::store::ledger::{Locked, NewTransfer, Transfer, TransferError};
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
    let key = payment_key(party.payment_id);
    let mut tx = pool.begin().await?;
    if let Some(made) = store::ledger::by_key(&mut tx, party.merchant_id, &key).await? {
        return Ok(Paid::Done(Box::new(made)));
    }
    let account = store::balances::account(party.merchant_id, &party.customer_id, &party.currency);
    let (phase, _, system) = Code::Payment.shape();
    let system = account.system(system);
    let (_, totals) = lock_and_expire(&mut tx, metrics, &account, &system, Cause::Command).await?;
    if totals.after_debit(phase, party.amount, 0).is_err() {
        // The expiries voided on the way stay voided.
        tx.commit().await?;
        return Ok(Paid::Insufficient(totals.available()));
    }
    let inserted = store::ledger::insert(
        &mut tx,
        &NewTransfer {
            id: Uuid::now_v7(),
            holder: &account,
            other: &system,
            holder_is_debit: true,
            amount: party.amount,
            phase,
            pending_id: None,
            expires_at: None,
            code: Code::Payment.as_str(),
            description: None,
            payment_id: Some(party.payment_id),
            refund_id: None,
            order_id: None,
            idempotency_key: Some(&key),
        },
    )
    .await;
    let transfer = match inserted {
        Ok(t) => t,
        Err(TransferError::Insufficient) => return Ok(Paid::Insufficient(totals.available())),
        Err(e) => return Err(e.into()),
    };
    transaction_event(&mut tx, metrics, &transfer, EventType::BalanceDebited).await?;
    tx.commit().await?;
    Ok(Paid::Done(Box::new(transfer)))
}

/// Credits a refund to the customer's balance, once (the refund's key);
/// `balance.credited` with it.
pub async fn credit_refund(
    pool: &sqlx::PgPool,
    metrics: &Metrics,
    party: &Party,
    refund_id: Uuid,
) -> Result<Transfer, StoreError> {
    let key = refund_key(refund_id);
    let mut tx = pool.begin().await?;
    if let Some(made) = store::ledger::by_key(&mut tx, party.merchant_id, &key).await? {
        return Ok(made);
    }
    let account = store::balances::account(party.merchant_id, &party.customer_id, &party.currency);
    let (phase, _, system) = Code::Refund.shape();
    let system = account.system(system);
    lock_and_expire(&mut tx, metrics, &account, &system, Cause::Command).await?;
    let transfer = store::ledger::insert(
        &mut tx,
        &NewTransfer {
            id: Uuid::now_v7(),
            holder: &account,
            other: &system,
            holder_is_debit: false,
            amount: party.amount,
            phase,
            pending_id: None,
            expires_at: None,
            code: Code::Refund.as_str(),
            description: None,
            payment_id: Some(party.payment_id),
            refund_id: Some(refund_id),
            order_id: None,
            idempotency_key: Some(&key),
        },
    )
    .await?;
    transaction_event(&mut tx, metrics, &transfer, EventType::BalanceCredited).await?;
    tx.commit().await?;
    Ok(transfer)
}

/// The transfer a key made, if any.
pub async fn made(
    pool: &sqlx::PgPool,
    merchant_id: Uuid,
    key: &str,
) -> Result<Option<Transfer>, StoreError> {
    let mut conn = pool.acquire().await?;
    store::ledger::by_key(&mut conn, merchant_id, key).await
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
