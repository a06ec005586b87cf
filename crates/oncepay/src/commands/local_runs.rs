//! Which commands execute in this process, so that a provider webhook
//! waiting for the command on its charge is woken the moment that command
//! ends instead of re-reading the database on a timer.
//!
//! A hint, never a decision: whether a command still executes is the
//! database's answer (its record, executing under a live lease), and the
//! webhook reads it again once woken. A command running in another
//! `oncepay serve` process is not here, and its webhook polls as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

/// Commands executing in this process, by the resource their first step
/// created (a payment attempt, a refund).
#[derive(Default)]
pub struct LocalRuns {
    running: Mutex<HashMap<Uuid, Entry>>,
}

/// One resource's executions here (normally one; a command that lost its
/// lease may still be unwinding while the one that took it over runs).
struct Entry {
    ended: Arc<Notify>,
    executions: usize,
}

/// Marks a resource's command as executing here until dropped; dropping
/// wakes whoever waits for it. Dropped after the command's last write
/// committed (or it failed), when the database already shows the outcome.
pub struct Executing<'a> {
    runs: &'a LocalRuns,
    resource: Uuid,
}

/// What [`LocalRuns::wait_for_end`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    /// No command on this resource executes here: poll the database.
    NotHere,
    /// The command here ended, or the wait ran out: read the database.
    Woken,
}

impl LocalRuns {
    /// Marks `resource`'s command as executing here.
    pub fn enter(&self, resource: Uuid) -> Executing<'_> {
        let mut running = self.lock();
        let entry = running.entry(resource).or_insert_with(|| Entry {
            ended: Arc::new(Notify::new()),
            executions: 0,
        });
        entry.executions += 1;
        Executing {
            runs: self,
            resource,
        }
    }

    /// Waits, at most `within`, for the command executing here on
    /// `resource` to end.
    pub async fn wait_for_end(&self, resource: Uuid, within: Duration) -> Waited {
        let Some(ended) = self.lock().get(&resource).map(|e| e.ended.clone()) else {
            return Waited::NotHere;
        };
        let notified = ended.notified();
        tokio::pin!(notified);
        // Registered before looking again, so an end between the two
        // lookups is either seen here or wakes the registered waiter.
        notified.as_mut().enable();
        if !self.lock().contains_key(&resource) {
            return Waited::Woken;
        }
        let _ = tokio::time::timeout(within, notified).await;
        Waited::Woken
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Entry>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Executing<'_> {
    fn drop(&mut self) {
        let mut running = self.runs.lock();
        let ended = match running.get_mut(&self.resource) {
            Some(entry) if entry.executions > 1 => {
                entry.executions -= 1;
                return;
            }
            Some(_) => running.remove(&self.resource).map(|e| e.ended),
            None => None,
        };
        drop(running);
        if let Some(ended) = ended {
            ended.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_is_woken_when_the_command_ends_and_not_before() {
        let runs = Arc::new(LocalRuns::default());
        let resource = Uuid::now_v7();
        let executing = runs.enter(resource);
        let waiter = {
            let runs = runs.clone();
            tokio::spawn(async move { runs.wait_for_end(resource, Duration::from_secs(30)).await })
        };
        // The waiter cannot finish while the command executes.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(executing);
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the end, long before its own 30 s")
            .expect("the waiter ran");
        assert_eq!(waited, Waited::Woken);
        assert_eq!(
            runs.wait_for_end(resource, Duration::from_secs(30)).await,
            Waited::NotHere
        );
    }

    #[tokio::test]
    async fn a_resource_stays_executing_until_its_last_execution_ends() {
        let runs = LocalRuns::default();
        let resource = Uuid::now_v7();
        let first = runs.enter(resource);
        let second = runs.enter(resource);
        drop(first);
        let waited = runs.wait_for_end(resource, Duration::from_millis(20)).await;
        // Still here: the wait ran out rather than finding nothing.
        assert_eq!(waited, Waited::Woken);
        assert!(runs.lock().contains_key(&resource));
        drop(second);
        assert_eq!(
            runs.wait_for_end(resource, Duration::from_secs(30)).await,
            Waited::NotHere
        );
    }
}
