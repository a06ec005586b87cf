//! Deletes expired idempotency records in small batches: each batch is one
//! short statement that skips locked rows, so the sweeper never holds long
//! locks or blocks requests.

use crate::commands::AppContext;
use crate::store::{self, StoreError};

/// Records deleted per statement.
pub const BATCH: i64 = 500;

/// Deletes every expired record now, batch after batch; returns how many.
pub async fn sweep(ctx: &AppContext) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = store::idempotency::sweep_expired(&ctx.pool, BATCH).await?;
        total += deleted;
        ctx.metrics.swept.inc_by(deleted);
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}
