//! Deletes expired idempotency records, and events (with their deliveries
//! and attempts) past `ONCEPAY_EVENT_RETENTION`, in small batches: each
//! batch is one short statement that skips locked rows, so the sweeper
//! never holds long locks or blocks requests. It also ends holds
//! ([`authorizations`]): a hold past its `capture_before`, or whose void
//! was asked for and not answered, is voided at its provider, and a hold
//! near its deadline gets its reminder event.

use crate::commands::AppContext;
use crate::store::{self, StoreError};

/// Records deleted per statement.
pub(crate) const BATCH: i64 = 500;

/// Deletes every expired record now, batch after batch; returns how many.
pub async fn sweep(ctx: &AppContext) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = crate::idempotency::persistence::sweep_expired(&ctx.pool, BATCH).await?;
        total += deleted;
        ctx.metrics.swept.inc_by(deleted);
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Holders whose overdue balance holds one pass voids, at most.
pub(crate) const HOLDS_BATCH: i64 = 500;

/// Voids the balance holds past their expiry (each with its
/// `balance_hold.expired`), batch after batch; returns how many holders
/// were swept. A hold already stops counting at its expiry (reads use the
/// database's clock); this writes its void, so it reads `expired` in the
/// ledger too. Each holder is locked as by a transfer on it, so an expiry
/// and a capture of one hold never both happen.
pub async fn expire_holds(ctx: &AppContext) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let swept = crate::balances::expire_holds(&ctx.pool, &ctx.metrics, HOLDS_BATCH).await?;
        total += swept;
        if swept < HOLDS_BATCH as usize {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Orders whose overdue stock reservations one pass voids, at most.
pub(crate) const RESERVATIONS_BATCH: i64 = 200;

/// Voids the stock reservations past their deadline (each order's with
/// one `order.stock_released`), batch after batch; returns how many
/// orders were swept. A reservation already stops counting at its
/// deadline (reads use the database's clock); this writes its void. Each
/// order is locked, then its stock, as a payment or cancel of it would.
pub async fn expire_reservations(ctx: &AppContext) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let swept =
            crate::inventory::expire_reservations(&ctx.pool, &ctx.metrics, RESERVATIONS_BATCH)
                .await?;
        total += swept;
        if swept < RESERVATIONS_BATCH as usize {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}

/// Holds looked at per pass.
pub(crate) const HOLD_BATCH: i64 = 100;

/// What one pass over holds did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    /// Holds voided (expired, or their void confirmed).
    pub voided: u32,
    /// Holds the provider answered were captured first.
    pub captured: u32,
    /// Holds whose provider could not say now (asked again later).
    pub unknown: u32,
    /// `payment.capture_deadline_approaching` events written.
    pub reminded: u32,
}

/// Ends holds that must end: each one past its `capture_before` (and no
/// capture under way: a capture still unknown is the reconciler's, which
/// reads the provider) is voided at its provider and becomes `voided`,
/// `expired`; a void asked for and not answered is asked again. Only the
/// provider's answer moves a hold: one that answers it was captured first
/// makes it `succeeded`. Then writes the reminders due
/// (`ONCEPAY_CAPTURE_REMINDER` before the deadline), once per payment.
pub async fn authorizations(ctx: &AppContext) -> Result<Holds, StoreError> {
    use crate::domain::payment::PaymentStatus;
    let mut done = Holds::default();
    for hold in store::payments::claim_holds_to_void(&ctx.pool, HOLD_BATCH).await? {
        let settled = crate::commands::captures::void_and_settle(
            ctx,
            hold.id,
            crate::commands::settle::Cause::Reconciler,
        )
        .await;
        let outcome = match settled {
            Ok((tx, payment)) => {
                tx.commit().await?;
                match payment.status {
                    PaymentStatus::Voided => {
                        done.voided += 1;
                        "settled"
                    }
                    PaymentStatus::Succeeded => {
                        done.captured += 1;
                        "settled"
                    }
                    _ => {
                        done.unknown += 1;
                        "still_pending"
                    }
                }
            }
            Err(e) => {
                tracing::warn!(payment_id = %hold.id, error = %e, "ending a hold failed; it is retried at its next look");
                "error"
            }
        };
        ctx.metrics
            .reconciler
            .with_label_values(&["hold", outcome])
            .inc();
    }
    let mut tx = ctx.pool.begin().await?;
    let due = store::payments::holds_to_remind(&mut tx, ctx.capture_reminder, HOLD_BATCH).await?;
    for payment in &due {
        crate::events::payment_capture_deadline_approaching(&mut tx, &ctx.metrics, payment).await?;
    }
    tx.commit().await?;
    done.reminded = u32::try_from(due.len()).unwrap_or(u32::MAX);
    Ok(done)
}

/// Events looked at per statement.
pub(crate) const RETENTION_BATCH: i64 = 500;

/// At most this many retention batches per pass: a backlog of millions is
/// worked through over many passes.
pub(crate) const RETENTION_BATCHES_PER_PASS: u32 = 40;

/// Each batch is followed by a pause of this many times its own duration
/// (at least [`RETENTION_MIN_PAUSE`]): the sweep takes at most a quarter
/// of one connection's time, and slows down by itself when the database
/// is busy, so it never competes with payments.
pub(crate) const RETENTION_PAUSE_FACTOR: u32 = 3;

/// The least pause between two retention batches.
pub(crate) const RETENTION_MIN_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// The smallest UUID v7 of the instant `at`: every event id made before it
/// sorts lower (ids are time-ordered).
fn first_id_at(at: chrono::DateTime<chrono::Utc>) -> uuid::Uuid {
    let ms = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    bytes[8] = 0x80;
    uuid::Uuid::from_bytes(bytes)
}

/// Deletes events older than the retention (never one whose delivery is
/// pending, never an object's newest: see `store::events::delete_old`),
/// with their deliveries and attempts; one process at a time across the
/// fleet (an advisory lock). Each pass walks the old events from the
/// oldest, a batch at a time, paced. Returns what this pass deleted.
pub async fn retention(ctx: &AppContext) -> Result<store::events::Deleted, StoreError> {
    let retention = chrono::Duration::from_std(ctx.event_retention)
        .unwrap_or_else(|_| chrono::Duration::days(36_500));
    let before = first_id_at(chrono::Utc::now() - retention);
    let mut after = uuid::Uuid::nil();
    let mut total = store::events::Deleted::default();
    for n in 0..RETENTION_BATCHES_PER_PASS {
        let started = std::time::Instant::now();
        let (batch, last) =
            store::events::delete_old(&ctx.pool, after, before, RETENTION_BATCH).await?;
        total.held |= batch.held;
        total.events += batch.events;
        total.deliveries += batch.deliveries;
        total.attempts += batch.attempts;
        for (table, count) in [
            ("event", batch.events),
            ("webhook_delivery", batch.deliveries),
            ("webhook_attempt", batch.attempts),
        ] {
            ctx.metrics
                .retention_deleted
                .with_label_values(&[table])
                .inc_by(count);
        }
        let Some(last) = last.filter(|_| batch.held) else {
            break;
        };
        after = last;
        if n + 1 < RETENTION_BATCHES_PER_PASS {
            let pause = started.elapsed() * RETENTION_PAUSE_FACTOR;
            tokio::time::sleep(pause.max(RETENTION_MIN_PAUSE)).await;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_id_of_an_instant_sorts_below_every_later_id_and_above_earlier_ones() {
        let now = chrono::Utc::now();
        let boundary = super::first_id_at(now);
        let later = uuid::Uuid::now_v7();
        assert!(boundary < later);
        let earlier = super::first_id_at(now - chrono::Duration::milliseconds(1));
        assert!(earlier < boundary);
        assert_eq!(boundary.get_version_num(), 7);
    }
}
