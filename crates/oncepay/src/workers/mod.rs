//! Background work of `oncepay serve`: the reconciler and the sweeper (the
//! merchant events' delivery lives in `events::deliveries`). Each claims its rows in the database
//! (`SKIP LOCKED`, leases), so any number of processes can run them at once.

pub mod reconciler;
pub mod sweeper;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Runs `tick` every `interval` until `shutdown` turns true.
pub async fn every<F, Fut>(
    name: &'static str,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut tick: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => tick().await,
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    tracing::info!(worker = name, "stopped");
                    return;
                }
            }
        }
    }
}
