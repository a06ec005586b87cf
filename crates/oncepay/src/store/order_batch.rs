//! Natural batching of create-order: new orders that arrive together share
//! one statement and one commit (PostgreSQL's group commit, done by the
//! caller so the statement, the transaction and the WAL flush are paid once
//! per batch instead of once per order).
//!
//! A writer takes whatever is queued when it becomes free, up to
//! [`BatchConfig::max`]: a lone request goes at once, never waiting for a
//! timer, and under load a batch grows to what arrived while the previous
//! one was committing. One writer by default ([`BatchConfig::writers`],
//! `ONCEPAY_ORDER_BATCH_WRITERS`, 1): an order that finds it free goes
//! alone at once, and one that arrives while it commits goes in its next
//! batch. A second writer would take that order at once, alone, in a
//! statement and a commit of its own: at a constant rate that made the
//! batches smaller and cost PostgreSQL 22-28 % more CPU an order, and at
//! 80 % of the closed loop it left the cores 1.56-1.69 busy where one
//! writer left them 1.34-1.58 (BENCHMARKS.md, twelfth round). More
//! writers than the database has cores only contend (fifth round).
//! The guarantees stay the database's:
//!
//! - each request is answered only after the statement that holds its row
//!   committed (an autocommit statement returns after its commit);
//! - a row that fails (a constraint the domain missed) fails only its own
//!   request: on any error the batch is written again row by row, each row
//!   alone getting its own answer;
//! - a crash mid-batch commits the whole statement or none of it: every
//!   request of the batch is done, or its key is still free to retry;
//! - two requests with one key in one batch: the first goes in it, the
//!   others are told the key is taken and go through the engine's full
//!   protocol, which waits for the first and replays it;
//! - rows are sorted by key, so two batches claim keys in one order and
//!   cannot deadlock.

use std::sync::{Arc, OnceLock};

use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};

use super::orders::{self, ClaimingOrder};
use super::writers::{lost, Jobs, WriterConnection};
use super::StoreError;
use crate::metrics::Metrics;

/// How create-order batches.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// The most orders one statement inserts (`ONCEPAY_ORDER_BATCH_MAX`);
    /// 1 writes each order by itself, as without batching.
    pub max: usize,
    /// How many batches may be in flight at once (the pool's size).
    pub writers: usize,
}

struct Job {
    row: ClaimingOrder,
    answer: oneshot::Sender<Result<bool, StoreError>>,
}

/// The queue of orders waiting for a writer. Its writers start with the
/// first order, on the runtime that runs commands.
pub struct OrderBatcher {
    pool: PgPool,
    metrics: Arc<Metrics>,
    config: BatchConfig,
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl OrderBatcher {
    /// A batcher writing through `pool`.
    pub fn new(pool: PgPool, config: BatchConfig, metrics: Arc<Metrics>) -> Self {
        OrderBatcher {
            pool,
            metrics,
            config,
            queue: OnceLock::new(),
        }
    }

    /// Claims the row's key and inserts its order, in a batch with whatever
    /// else is waiting: `Ok(false)` if the key was taken (nothing of this
    /// row was written), as [`orders::insert_claiming`].
    pub async fn insert_claiming(&self, row: ClaimingOrder) -> Result<bool, StoreError> {
        if self.config.max <= 1 {
            self.metrics.order_batch_rows.observe(1.0);
            return orders::insert_claiming_one(&self.pool, &row).await;
        }
        let (answer, answered) = oneshot::channel();
        let queue = self.queue.get_or_init(|| self.start());
        self.metrics.orders_queued.inc();
        if queue.send(Job { row, answer }).await.is_err() {
            self.metrics.orders_queued.dec();
            return Err(StoreError::Unavailable(sqlx::Error::PoolClosed));
        }
        answered
            .await
            .unwrap_or(Err(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))
    }

    /// How many batches may be in flight at once.
    pub fn writers(&self) -> usize {
        self.config.writers.max(1)
    }

    fn start(&self) -> mpsc::Sender<Job> {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        Jobs::start(self.writers(), self.config.max, move |jobs| {
            writer(pool.clone(), metrics.clone(), jobs)
        })
    }
}

/// Takes what is queued, writes it, answers; until the queue closes. The
/// writer keeps its connection while orders keep coming
/// ([`WriterConnection`]).
async fn writer(pool: PgPool, metrics: Arc<Metrics>, jobs: Jobs<Job>) {
    let mut conn = WriterConnection::new(pool);
    while let Some(batch) = conn.next(&jobs).await {
        metrics.orders_queued.sub(batch.len() as i64);
        metrics.order_batch_rows.observe(batch.len() as f64);
        match conn.get().await {
            Ok(c) => {
                let healthy = write(c, batch).await;
                conn.done(healthy);
            }
            Err(e) => {
                for job in batch {
                    let _ = job.answer.send(Err(StoreError::from(lost(&e))));
                }
            }
        }
    }
}

/// Whether an answer leaves the connection fit for the next batch.
fn healthy(done: &Result<bool, StoreError>) -> bool {
    !matches!(done, Err(StoreError::Unavailable(_)))
}

/// Writes one batch and answers each of its requests. `false` when the
/// connection is no longer fit for the next batch.
async fn write(conn: &mut PgConnection, mut batch: Vec<Job>) -> bool {
    if batch.len() == 1 {
        let job = batch.remove(0);
        let done = orders::insert_claiming_one(&mut *conn, &job.row).await;
        let fit = healthy(&done);
        let _ = job.answer.send(done);
        return fit;
    }
    batch.sort_by(|a, b| {
        let (a, b) = (a.row.record(), b.row.record());
        a.merchant_id
            .cmp(&b.merchant_id)
            .then_with(|| a.key.cmp(&b.key))
    });
    let mut unique: Vec<Job> = Vec::with_capacity(batch.len());
    for job in batch {
        match unique.last() {
            // Its key is in this batch already: taken, as the engine will
            // find once the batch commits.
            Some(last) if last.row.record() == job.row.record() => {
                let _ = job.answer.send(Ok(false));
            }
            _ => unique.push(job),
        }
    }
    let (rows, answers): (Vec<ClaimingOrder>, Vec<_>) =
        unique.into_iter().map(|job| (job.row, job.answer)).unzip();
    let refs: Vec<&ClaimingOrder> = rows.iter().collect();
    match orders::insert_claiming(&mut *conn, &refs).await {
        Ok(inserted) => {
            for (answer, inserted) in answers.into_iter().zip(inserted) {
                let _ = answer.send(Ok(inserted));
            }
            true
        }
        // The connection failed: whether the batch committed is not known,
        // and the connection is not fit for another try. Each request gets
        // what a lost connection gives (`503`, retried with its key, which
        // then replays the batch's order or is free).
        Err(StoreError::Unavailable(e)) => {
            tracing::warn!(error = %e, rows = rows.len(), "a batch of orders lost its connection");
            for answer in answers {
                let _ = answer.send(Err(StoreError::from(lost(&e))));
            }
            false
        }
        // Which row failed is not known: each alone, for its own answer.
        Err(e) => {
            tracing::debug!(error = %e, rows = rows.len(), "a batch of orders failed; writing its rows one by one");
            let mut fit = true;
            for (row, answer) in rows.iter().zip(answers) {
                let done = orders::insert_claiming_one(&mut *conn, row).await;
                fit &= healthy(&done);
                let _ = answer.send(done);
            }
            fit
        }
    }
}
