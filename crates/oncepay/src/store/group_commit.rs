//! Group commit of a payment's statements: the one-statement writes of
//! concurrent requests (a payment's first step, its settlement, a provider
//! webhook that repeats what we hold) that arrive together run in one
//! transaction on one connection and share one commit.
//!
//! Unlike create-order's batching ([`super::order_batch`]), the statements
//! stay as they are, each with its own checks; what is shared is what
//! every autocommit statement pays besides its work: the commit and its
//! WAL flush, the transaction's start and end, and the connection's
//! checkout (sqlx pings a connection each time it goes back to the pool;
//! a writer keeps its connection while statements keep coming, see
//! [`super::writers::WriterConnection`]). A writer takes whatever is
//! queued when it becomes free, up to [`GroupConfig::max`]: a lone
//! statement runs at once in autocommit, as without grouping, and never
//! waits for a timer.
//!
//! Why the guarantees are unchanged:
//!
//! - Each statement is answered only after the transaction that holds its
//!   writes committed.
//! - Each statement runs in the group as it would alone. It takes its own
//!   snapshot (read committed) and sees what the statements before it
//!   wrote, as it would have seen them committed. Its checks (the row
//!   locks and the conditions its CTEs test) are the same.
//! - A statement that fails aborts the transaction, so it fails the group
//!   and nothing of the group is written. Each statement then runs again
//!   alone, in autocommit, and gets its own answer, error included. A
//!   statement whose callers turn a constraint's refusal into an answer
//!   ("the key is taken") therefore meets that refusal alone. A group never
//!   commits past a failed statement.
//! - A crash or a lost connection before the commit's answer leaves the
//!   whole group committed or none of it. Each caller gets the error it
//!   would get from one statement whose answer was lost. The engine's
//!   recovery decides such a request, as it does for one statement.
//! - A statement's locks are held until the group commits: a group that
//!   waits on another's locks while holding locks that one needs is a
//!   deadlock, which PostgreSQL breaks by failing one of them, whose
//!   statements then run alone. The statements grouped here lock one
//!   payment's rows each, in the order every path uses.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus::Histogram;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Connection, Execute, PgConnection, PgPool, Postgres};
use tokio::sync::{mpsc, oneshot};

use super::writers::{lost, Jobs, WriterConnection};
use super::StoreError;
use crate::metrics::Metrics;

/// How statements are grouped.
#[derive(Debug, Clone, Copy)]
pub struct GroupConfig {
    /// The most statements one transaction holds
    /// (`ONCEPAY_GROUP_COMMIT_MAX`); 1 runs each alone, as without
    /// grouping.
    pub max: usize,
    /// How many groups may be in flight at once.
    pub writers: usize,
}

/// One statement with its parameters, taken out of a query so that a
/// writer task can run it (and run it again, alone, if its group fails).
pub struct Statement {
    sql: &'static str,
    args: PgArguments,
}

impl Statement {
    /// The statement `sql` with the parameters `bind` gives it.
    pub fn of<'q>(
        sql: &'static str,
        bind: impl FnOnce(Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments>,
    ) -> Result<Statement, StoreError> {
        let mut query = bind(sqlx::query(sql));
        let args = query
            .take_arguments()
            .map_err(|e| StoreError::Unavailable(sqlx::Error::Encode(e)))?
            .unwrap_or_default();
        Ok(Statement { sql, args })
    }

    async fn run(&self, conn: &mut PgConnection) -> Result<Vec<PgRow>, sqlx::Error> {
        sqlx::query_with(self.sql, self.args.clone())
            .fetch_all(conn)
            .await
    }
}

type Answer = oneshot::Sender<Result<Vec<PgRow>, sqlx::Error>>;

struct Job {
    statement: Statement,
    answer: Answer,
    queued: Instant,
}

/// The queue of statements waiting for a writer. Its writers start with
/// the first statement, on the runtime that runs commands.
pub struct GroupCommit {
    pool: PgPool,
    metrics: Arc<Metrics>,
    config: GroupConfig,
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl GroupCommit {
    /// Groups writing through `pool`.
    pub fn new(pool: PgPool, config: GroupConfig, metrics: Arc<Metrics>) -> Self {
        GroupCommit {
            pool,
            metrics,
            config,
            queue: OnceLock::new(),
        }
    }

    /// Runs `statement` (in a group with whatever else is waiting) and
    /// returns its rows once they are committed. The error is the
    /// statement's own, as from running it alone.
    pub async fn fetch_all(&self, statement: Statement) -> Result<Vec<PgRow>, sqlx::Error> {
        if self.config.max <= 1 {
            self.metrics.group_commit_statements.observe(1.0);
            let mut conn = self.pool.acquire().await?;
            return statement.run(&mut conn).await;
        }
        self.metrics.group_commit_queued.inc();
        let (answer, answered) = oneshot::channel();
        let queue = self.queue.get_or_init(|| self.start());
        let job = Job {
            statement,
            answer,
            queued: Instant::now(),
        };
        if queue.send(job).await.is_err() {
            self.metrics.group_commit_queued.dec();
            return Err(sqlx::Error::PoolClosed);
        }
        answered.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }

    /// [`fetch_all`](Self::fetch_all) of a statement that returns at most
    /// one row.
    pub async fn fetch_optional(&self, statement: Statement) -> Result<Option<PgRow>, sqlx::Error> {
        Ok(self.fetch_all(statement).await?.into_iter().next())
    }

    fn start(&self) -> mpsc::Sender<Job> {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        Jobs::start(self.config.writers, self.config.max, move |jobs| {
            writer(pool.clone(), metrics.clone(), jobs)
        })
    }
}

/// Takes what is queued, runs it, answers; until the queue closes. The
/// writer keeps its connection while statements keep coming
/// ([`WriterConnection`]).
async fn writer(pool: PgPool, metrics: Arc<Metrics>, jobs: Jobs<Job>) {
    let mut conn = WriterConnection::new(pool);
    let taken = metrics.group_commit_seconds.with_label_values(&["taken"]);
    let answered = metrics
        .group_commit_seconds
        .with_label_values(&["answered"]);
    while let Some(mut group) = conn.next(&jobs).await {
        let c = match conn.get().await {
            Ok(c) => c,
            Err(e) => {
                metrics.group_commit_queued.sub(group.len() as i64);
                for job in group {
                    // Taken and answered (with the error) at once: the
                    // histogram counts every statement that was queued.
                    let waited = job.queued.elapsed().as_secs_f64();
                    taken.observe(waited);
                    answered.observe(waited);
                    let _ = job.answer.send(Err(lost(&e)));
                }
                continue;
            }
        };
        let healthy = loop {
            metrics.group_commit_queued.sub(group.len() as i64);
            metrics.group_commit_statements.observe(group.len() as f64);
            for job in &group {
                taken.observe(job.queued.elapsed().as_secs_f64());
            }
            if !run_group(c, group, &answered).await {
                break false;
            }
            // Never wait for the queue here: what is queued now, or
            // `conn.next`, which gives the connection back when idle.
            group = jobs.now();
            if group.is_empty() {
                break true;
            }
        };
        conn.done(healthy);
    }
}

/// Runs one group on `conn` and answers each of its statements. `false`
/// when the connection is no longer fit for the next group: it failed, or
/// its node no longer takes writes. Each answer's time since its statement
/// was queued goes to `answered`.
async fn run_group(conn: &mut PgConnection, group: Vec<Job>, answered: &Histogram) -> bool {
    let mut healthy = true;
    let mut answer = |job: Job, done: Result<Vec<PgRow>, sqlx::Error>| {
        if let Err(e) = &done {
            healthy &= !super::is_unavailable(e);
        }
        answered.observe(job.queued.elapsed().as_secs_f64());
        let _ = job.answer.send(done);
    };
    if group.len() == 1 {
        let job = group.into_iter().next().expect("one job");
        let done = job.statement.run(conn).await;
        answer(job, done);
        return healthy;
    }
    match together(conn, &group).await {
        Ok(rows) => {
            for (job, rows) in group.into_iter().zip(rows) {
                answer(job, Ok(rows));
            }
        }
        // The commit's answer was lost: committed or not, nobody knows,
        // and running a statement again could write it twice. Each caller
        // gets the error one statement would have given.
        Err(Failed::Unknown(e)) => {
            tracing::warn!(error = %e, statements = group.len(), "a group's commit was not answered");
            for job in group {
                answer(job, Err(lost(&e)));
            }
        }
        // Nothing of the group was written: each statement alone, for its
        // own answer.
        Err(Failed::RolledBack(e)) => {
            tracing::debug!(error = %e, statements = group.len(), "a group of statements failed; running them one by one");
            for job in group {
                let done = job.statement.run(conn).await;
                answer(job, done);
            }
        }
    }
    healthy
}

enum Failed {
    /// The group was rolled back (or never began): nothing was written.
    RolledBack(sqlx::Error),
    /// The connection failed while committing: the outcome is unknown.
    Unknown(sqlx::Error),
}

/// All of the group's statements in one transaction.
async fn together(conn: &mut PgConnection, group: &[Job]) -> Result<Vec<Vec<PgRow>>, Failed> {
    let mut tx = conn.begin().await.map_err(Failed::RolledBack)?;
    let mut all = Vec::with_capacity(group.len());
    for job in group {
        // A failed statement aborts the transaction: dropping `tx` rolls
        // it back (before the connection is used again).
        all.push(
            job.statement
                .run(&mut tx)
                .await
                .map_err(Failed::RolledBack)?,
        );
    }
    match tx.commit().await {
        Ok(()) => Ok(all),
        // The server refused the commit (a constraint checked at commit):
        // rolled back. A lost or closing connection leaves it unknown.
        Err(e) if !super::is_unavailable(&e) && matches!(e, sqlx::Error::Database(_)) => {
            Err(Failed::RolledBack(e))
        }
        Err(e) => Err(Failed::Unknown(e)),
    }
}
