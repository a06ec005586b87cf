//! The queue that natural batching ([`super::order_batch`]) and group
//! commit ([`super::group_commit`]) share: requests wait in a channel, and
//! a few writer tasks each take whatever is queued when they become free.
//! Nothing waits for a timer: a lone job is taken at once, and a batch
//! grows only with what arrived while the writers were busy.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, Mutex};

/// The waiting jobs, shared by the writers.
pub(crate) struct Jobs<J> {
    waiting: Arc<Mutex<mpsc::Receiver<J>>>,
    max: usize,
}

impl<J> Clone for Jobs<J> {
    fn clone(&self) -> Self {
        Jobs {
            waiting: self.waiting.clone(),
            max: self.max,
        }
    }
}

impl<J: Send + 'static> Jobs<J> {
    /// Starts `writers` tasks running `writer` over one queue of jobs taken
    /// up to `max` at a time; returns where jobs are sent. Dropping every
    /// sender ends the writers.
    pub(crate) fn start<W, F>(writers: usize, max: usize, writer: W) -> mpsc::Sender<J>
    where
        W: Fn(Jobs<J>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let writers = writers.max(1);
        let (queue, waiting) = mpsc::channel(max * writers * 4);
        let jobs = Jobs {
            waiting: Arc::new(Mutex::new(waiting)),
            max,
        };
        for _ in 0..writers {
            tokio::spawn(writer(jobs.clone()));
        }
        queue
    }

    /// Waits for the next job, then takes what else is queued, up to the
    /// maximum; `None` once the queue is closed.
    pub(crate) async fn next(&self) -> Option<Vec<J>> {
        let mut waiting = self.waiting.lock().await;
        let first = waiting.recv().await?;
        let mut taken = vec![first];
        self.drain(&mut waiting, &mut taken);
        Some(taken)
    }

    /// What is queued now, up to the maximum, without waiting: empty when
    /// the queue is, or when another writer is waiting on it (which it
    /// does only when it is empty).
    pub(crate) fn now(&self) -> Vec<J> {
        let mut taken = Vec::new();
        if let Ok(mut waiting) = self.waiting.try_lock() {
            self.drain(&mut waiting, &mut taken);
        }
        taken
    }

    fn drain(&self, waiting: &mut mpsc::Receiver<J>, taken: &mut Vec<J>) {
        while taken.len() < self.max {
            match waiting.try_recv() {
                Ok(job) => taken.push(job),
                Err(_) => break,
            }
        }
    }
}
