//! The queue that natural batching ([`super::order_batch`]) and group
//! commit ([`super::group_commit`]) share: requests wait in a channel, and
//! a few writer tasks each take whatever is queued when they become free.
//! Nothing waits for a timer: a lone job is taken at once, and a batch
//! grows only with what arrived while the writers were busy.
//!
//! A writer keeps its connection between batches while jobs keep coming
//! ([`WriterConnection`]): sqlx pings every connection that goes back to
//! the pool, so a writer that gave its connection back after each batch
//! paid a second round trip (and the wake-ups of both processes) for
//! every batch, which at moderate rates, where batches are small, is every
//! statement.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use tokio::sync::{mpsc, Mutex};

use super::PING_IF_IDLE_FOR;

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

/// How long a writer keeps a connection before it gives it back, however
/// busy it is: given back, the pool's own limits (`max_lifetime`) apply to
/// it again.
const HOLD_AT_MOST: Duration = Duration::from_secs(60);

/// A writer's connection: taken from the pool for a batch, kept while
/// batches keep coming, given back once the writer has had nothing to do
/// for [`PING_IF_IDLE_FOR`] (or the pool closes). A connection used in the
/// last second is trusted as the pool trusts one (`store::pool_with`); one
/// idle for longer is pinged first; one that failed is closed, not kept.
pub(crate) struct WriterConnection {
    pool: PgPool,
    held: Option<Held>,
}

struct Held {
    conn: PoolConnection<Postgres>,
    taken: Instant,
    used: Instant,
}

impl WriterConnection {
    /// A writer's connection from `pool`, taken at its first batch.
    pub(crate) fn new(pool: PgPool) -> Self {
        WriterConnection { pool, held: None }
    }

    /// [`Jobs::next`], giving the held connection back while it waits
    /// once it has been idle for [`PING_IF_IDLE_FOR`].
    pub(crate) async fn next<J: Send + 'static>(&mut self, jobs: &Jobs<J>) -> Option<Vec<J>> {
        loop {
            let Some(held) = &self.held else {
                return jobs.next().await;
            };
            let idle_until = tokio::time::Instant::from_std(held.used + PING_IF_IDLE_FOR);
            tokio::select! {
                next = jobs.next() => return next,
                () = tokio::time::sleep_until(idle_until) => self.held = None,
                () = self.pool.close_event() => self.held = None,
            }
        }
    }

    /// The connection for the next batch: the held one (pinged first if
    /// it was idle), or one from the pool.
    pub(crate) async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if let Some(held) = &mut self.held {
            if held.used.elapsed() >= PING_IF_IDLE_FOR && held.conn.ping().await.is_err() {
                self.done(false);
            }
        }
        if self.held.is_none() {
            let conn = self.pool.acquire().await?;
            let now = Instant::now();
            self.held = Some(Held {
                conn,
                taken: now,
                used: now,
            });
        }
        Ok(&mut self.held.as_mut().expect("held").conn)
    }

    /// After a batch: the connection is kept if `healthy` (its statements
    /// succeeded, or failed for reasons of their own), and closed
    /// otherwise (broken, or on a node that no longer takes writes)
    /// rather than given back to the pool.
    pub(crate) fn done(&mut self, healthy: bool) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        held.used = Instant::now();
        if !healthy {
            held.conn.close_on_drop();
        } else if held.taken.elapsed() < HOLD_AT_MOST {
            self.held = Some(held);
        }
    }
}

/// The error each job of a batch gets when the batch's outcome cannot be
/// known (or it could not start): as a lost connection, which callers
/// answer `503` and clients retry.
pub(crate) fn lost(e: &sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        other => sqlx::Error::Io(std::io::Error::other(other.to_string())),
    }
}
