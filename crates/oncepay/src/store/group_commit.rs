//! Group commit of a payment's statements: the one-statement writes of
//! concurrent requests (a payment's first step, its settlement, a provider
//! webhook that repeats what we hold) that arrive together share one
//! transaction, one commit and, where they are of one kind, one statement.
//!
//! Each kind of write is one multi-row statement ([`Write::statement`]):
//! a lone write is a statement of one row, and the writes of one kind
//! that a writer takes together are one statement of many rows, matched
//! back to their requests by each row's position (`n`). What is shared is
//! what every statement pays besides its work: the round trip, the
//! executor's start, the commit and its WAL flush, and the connection's
//! checkout (sqlx pings a connection each time it goes back to the pool;
//! a writer keeps its connection while writes keep coming, see
//! [`super::writers::WriterConnection`]). A writer takes whatever is
//! queued when it becomes free, up to [`GroupConfig::max`]: a lone write
//! runs at once in autocommit, as without grouping, and never waits for a
//! timer. Before writes of one kind shared a statement, a group's
//! statements ran one after another, each its own round trip, so under
//! load a writer's groups took as many round trips as they held writes.
//!
//! Why the guarantees are unchanged:
//!
//! - Each write is answered only after the transaction that holds it
//!   committed.
//! - Writes share a statement only when they touch no row in common
//!   ([`Write::shares_with`]); the others run as statements of their own
//!   after it. A statement sees one snapshot, so two rows of one statement
//!   cannot see each other's writes; rows that touch different orders,
//!   keys and events need not. Each row's checks (the row locks and the
//!   conditions its CTEs test) are those it has alone, and each statement
//!   sees what the statements before it in the group wrote, as it would
//!   have seen them committed: the group runs as the writes would one
//!   after another, in the order of their kinds.
//! - A statement that fails aborts the transaction, so it fails the group
//!   and nothing of the group is written. Each write then runs again
//!   alone, in autocommit, and gets its own answer, error included. A
//!   write whose callers turn a constraint's refusal into an answer ("the
//!   key is taken") therefore meets that refusal alone. A group never
//!   commits past a failed statement.
//! - A crash or a lost connection before the commit's answer leaves the
//!   whole group committed or none of it. Each caller gets the error it
//!   would get from one statement whose answer was lost. The engine's
//!   recovery decides such a request, as it does for one statement.
//! - A statement's locks are held until the group commits: a group that
//!   waits on another's locks while holding locks that one needs is a
//!   deadlock, which PostgreSQL breaks by failing one of them, whose
//!   writes then run alone. Each row locks one payment's rows, in the
//!   order every path uses.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus::Histogram;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Connection, Execute, PgConnection, PgPool, Postgres, Row};
use tokio::sync::{mpsc, oneshot};

use super::writers::{lost, Jobs, WriterConnection};
use super::StoreError;
use crate::metrics::Metrics;

/// How statements are grouped.
#[derive(Debug, Clone, Copy)]
pub struct GroupConfig {
    /// The most writes one transaction holds (`ONCEPAY_GROUP_COMMIT_MAX`);
    /// 1 runs each alone, as without grouping.
    pub max: usize,
    /// How many groups may be in flight at once.
    pub writers: usize,
}

/// A write that can share a statement with others of its kind.
pub trait Write: Send + Sync + 'static {
    /// Whether `self` and `other` may be rows of one statement: of one
    /// kind, and touching no row in common (then neither needs to see the
    /// other's writes).
    fn shares_with(&self, other: &Self) -> bool;

    /// Where a group runs `self` among its kinds: lower first.
    fn order(&self) -> u8;

    /// The statement that makes `rows` (all of one kind, sharing with each
    /// other); when there are several, every row of its answer names its
    /// write's position in `rows`, from 1, in a column `n` (bigint).
    fn statement(rows: &[&Self]) -> Result<Statement, StoreError>;
}

/// One statement with its parameters.
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

    /// Runs the statement and gives each of its `writes` writes the rows
    /// that name it.
    async fn run(
        self,
        conn: &mut PgConnection,
        writes: usize,
    ) -> Result<Vec<Vec<PgRow>>, sqlx::Error> {
        let rows = sqlx::query_with(self.sql, self.args)
            .fetch_all(conn)
            .await?;
        if writes == 1 {
            // A statement of one write: all its rows are that write's.
            return Ok(vec![rows]);
        }
        let mut each: Vec<Vec<PgRow>> = (0..writes).map(|_| Vec::new()).collect();
        for row in rows {
            let n: i64 = row.try_get("n")?;
            let at = usize::try_from(n - 1)
                .ok()
                .filter(|&i| i < writes)
                .ok_or_else(|| {
                    sqlx::Error::Protocol(format!("a row names write {n} of {writes}"))
                })?;
            each[at].push(row);
        }
        Ok(each)
    }
}

/// Runs `write` alone: a statement of one row.
async fn run_alone<W: Write>(
    write: &W,
    conn: &mut PgConnection,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let statement = W::statement(&[write]).map_err(encoding)?;
    Ok(statement.run(conn, 1).await?.pop().unwrap_or_default())
}

/// A statement that could not be built is refused as sqlx refuses a
/// parameter it cannot encode.
fn encoding(e: StoreError) -> sqlx::Error {
    match e {
        StoreError::Unavailable(e) => e,
        other => sqlx::Error::Encode(other.to_string().into()),
    }
}

type Answer = oneshot::Sender<Result<Vec<PgRow>, sqlx::Error>>;

struct Job<W> {
    write: W,
    answer: Answer,
    queued: Instant,
}

/// The queue of writes waiting for a writer. Its writers start with the
/// first write, on the runtime that runs commands.
pub struct GroupCommit<W> {
    pool: PgPool,
    metrics: Arc<Metrics>,
    config: GroupConfig,
    queue: OnceLock<mpsc::Sender<Job<W>>>,
}

impl<W: Write> GroupCommit<W> {
    /// Groups writing through `pool`.
    pub fn new(pool: PgPool, config: GroupConfig, metrics: Arc<Metrics>) -> Self {
        GroupCommit {
            pool,
            metrics,
            config,
            queue: OnceLock::new(),
        }
    }

    /// Makes `write` (in a group with whatever else is waiting) and
    /// returns its rows once they are committed. The error is the write's
    /// own, as from running it alone.
    pub async fn fetch_all(&self, write: W) -> Result<Vec<PgRow>, sqlx::Error> {
        if self.config.max <= 1 {
            self.metrics.group_commit_statements.observe(1.0);
            self.metrics.group_commit_rows.observe(1.0);
            let mut conn = self.pool.acquire().await?;
            return run_alone(&write, &mut conn).await;
        }
        self.metrics.group_commit_queued.inc();
        let (answer, answered) = oneshot::channel();
        let queue = self.queue.get_or_init(|| self.start());
        let job = Job {
            write,
            answer,
            queued: Instant::now(),
        };
        if queue.send(job).await.is_err() {
            self.metrics.group_commit_queued.dec();
            return Err(sqlx::Error::PoolClosed);
        }
        answered.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }

    /// [`fetch_all`](Self::fetch_all) of a write that returns at most one
    /// row.
    pub async fn fetch_optional(&self, write: W) -> Result<Option<PgRow>, sqlx::Error> {
        Ok(self.fetch_all(write).await?.into_iter().next())
    }

    fn start(&self) -> mpsc::Sender<Job<W>> {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        Jobs::start(self.config.writers, self.config.max, move |jobs| {
            writer(pool.clone(), metrics.clone(), jobs)
        })
    }
}

/// Takes what is queued, runs it, answers; until the queue closes. The
/// writer keeps its connection while writes keep coming
/// ([`WriterConnection`]).
async fn writer<W: Write>(pool: PgPool, metrics: Arc<Metrics>, jobs: Jobs<Job<W>>) {
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
                    // histogram counts every write that was queued.
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
            if !run_group(c, group, &answered, &metrics.group_commit_rows).await {
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

/// The group's statements: its writes in the order of their kinds, each
/// statement a run of writes that share with each other, as positions in
/// the group. A write that cannot share the current statement starts the
/// next, so a write that touches a row another touched runs after it.
fn statements<W: Write>(group: &[Job<W>]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..group.len()).collect();
    // Stable: within a kind, writes keep the order they arrived in.
    order.sort_by_key(|&i| group[i].write.order());
    let mut statements: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let write = &group[i].write;
        match statements.last_mut() {
            Some(rows) if rows.iter().all(|&j| write.shares_with(&group[j].write)) => rows.push(i),
            _ => statements.push(vec![i]),
        }
    }
    statements
}

/// Runs one group on `conn` and answers each of its writes. `false` when
/// the connection is no longer fit for the next group: it failed, or its
/// node no longer takes writes. Each answer's time since its write was
/// queued goes to `answered`, and each statement's writes to `rows`.
async fn run_group<W: Write>(
    conn: &mut PgConnection,
    group: Vec<Job<W>>,
    answered: &Histogram,
    rows: &Histogram,
) -> bool {
    let mut healthy = true;
    let mut answer = |job: Job<W>, done: Result<Vec<PgRow>, sqlx::Error>| {
        if let Err(e) = &done {
            healthy &= !super::is_unavailable(e);
        }
        answered.observe(job.queued.elapsed().as_secs_f64());
        let _ = job.answer.send(done);
    };
    if group.len() == 1 {
        rows.observe(1.0);
        let job = group.into_iter().next().expect("one job");
        let done = run_alone(&job.write, conn).await;
        answer(job, done);
        return healthy;
    }
    let statements = statements(&group);
    for positions in &statements {
        rows.observe(positions.len() as f64);
    }
    let done = if statements.len() == 1 {
        // One statement is atomic by itself: no transaction around it.
        alone(conn, &group, &statements[0]).await
    } else {
        together(conn, &group, &statements).await
    };
    match done {
        Ok(each) => {
            for (job, its) in group.into_iter().zip(each) {
                answer(job, Ok(its));
            }
        }
        // The commit's answer was lost: committed or not, nobody knows,
        // and running a write again could make it twice. Each caller gets
        // the error one statement would have given.
        Err(Failed::Unknown(e)) => {
            tracing::warn!(error = %e, writes = group.len(), "a group's commit was not answered");
            for job in group {
                answer(job, Err(lost(&e)));
            }
        }
        // Nothing of the group was written: each write alone, for its own
        // answer.
        Err(Failed::RolledBack(e)) => {
            tracing::debug!(error = %e, writes = group.len(), "a group of writes failed; running them one by one");
            for job in group {
                rows.observe(1.0);
                let done = run_alone(&job.write, conn).await;
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

/// Runs the statement of the writes at `positions` (in the group) and
/// puts each write's rows at its position in `all`.
async fn run_statement<W: Write>(
    conn: &mut PgConnection,
    group: &[Job<W>],
    positions: &[usize],
    all: &mut [Vec<PgRow>],
) -> Result<(), sqlx::Error> {
    let writes: Vec<&W> = positions.iter().map(|&i| &group[i].write).collect();
    let statement = W::statement(&writes).map_err(encoding)?;
    for (rows, &i) in statement
        .run(conn, writes.len())
        .await?
        .into_iter()
        .zip(positions)
    {
        all[i] = rows;
    }
    Ok(())
}

/// The whole group as one statement, in autocommit.
async fn alone<W: Write>(
    conn: &mut PgConnection,
    group: &[Job<W>],
    positions: &[usize],
) -> Result<Vec<Vec<PgRow>>, Failed> {
    let mut all: Vec<Vec<PgRow>> = group.iter().map(|_| Vec::new()).collect();
    match run_statement(conn, group, positions, &mut all).await {
        Ok(()) => Ok(all),
        // An error from the server says the statement did not commit. Any
        // other (a lost connection, or an answer that could not be read
        // after it committed) leaves it unknown: running its writes again
        // could make them twice.
        Err(e @ sqlx::Error::Database(_)) if !super::is_unavailable(&e) => {
            Err(Failed::RolledBack(e))
        }
        Err(e) => Err(Failed::Unknown(e)),
    }
}

/// All of the group's statements in one transaction.
async fn together<W: Write>(
    conn: &mut PgConnection,
    group: &[Job<W>],
    statements: &[Vec<usize>],
) -> Result<Vec<Vec<PgRow>>, Failed> {
    let mut all: Vec<Vec<PgRow>> = group.iter().map(|_| Vec::new()).collect();
    let mut tx = conn.begin().await.map_err(Failed::RolledBack)?;
    for positions in statements {
        // A failed statement aborts the transaction: dropping `tx` rolls
        // it back (before the connection is used again).
        run_statement(&mut tx, group, positions, &mut all)
            .await
            .map_err(Failed::RolledBack)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of kind `kind` touching row `row`.
    struct Toy {
        kind: u8,
        row: u32,
    }

    impl Write for Toy {
        fn shares_with(&self, other: &Self) -> bool {
            self.kind == other.kind && self.row != other.row
        }
        fn order(&self) -> u8 {
            self.kind
        }
        fn statement(_: &[&Self]) -> Result<Statement, StoreError> {
            unreachable!("not run")
        }
    }

    fn group(writes: &[(u8, u32)]) -> Vec<Job<Toy>> {
        writes
            .iter()
            .map(|&(kind, row)| Job {
                write: Toy { kind, row },
                answer: oneshot::channel().0,
                queued: Instant::now(),
            })
            .collect()
    }

    #[test]
    fn writes_of_a_kind_share_a_statement_and_kinds_run_in_their_order() {
        let g = group(&[(2, 1), (0, 7), (2, 2), (0, 8), (1, 5)]);
        assert_eq!(statements(&g), vec![vec![1, 3], vec![4], vec![0, 2]]);
    }

    #[test]
    fn a_write_that_touches_a_row_of_the_statement_runs_in_the_next_after_it() {
        // The second write of row 1 runs after the first, in a statement
        // of its own that the writes after it may join.
        let g = group(&[(0, 1), (0, 2), (0, 1), (0, 3)]);
        assert_eq!(statements(&g), vec![vec![0, 1], vec![2, 3]]);
    }
}
