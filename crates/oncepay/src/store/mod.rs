//! All SQL lives under this module: one file per table family, each exposing
//! plain async functions over a pool or a transaction. Handlers and commands
//! never write SQL themselves.

/// When the reconciler next looks at a row it claims (alias `$a`): each
/// further check waits twice as long, up to five minutes. The claim's push
/// is also its lease, so no two reconcilers work on one row at once.
macro_rules! next_check_after_claim {
    ($a:literal) => {
        concat!(
            "now() + least(interval '5 minutes', interval '1 second' * power(2, least(",
            $a,
            ".check_count, 10)))"
        )
    };
}

/// The rows of a statement written once for one row and for many: the
/// CTE `i` its body reads them from (each column as `i.<name>`, each row's
/// position from 1 as `i.n`), in the form `one` or `many`, from the list
/// of its columns, each its parameter with its type, and its name.
/// [`Columns`] binds them for either form.
///
/// `one` takes each column as a parameter of its own, in a one-row
/// subquery that PostgreSQL folds into the body (`NOT MATERIALIZED`), so
/// that a lone write runs as if written with its parameters: a lone write
/// in the form `many` cost more (BENCHMARKS.md, the group commit's
/// statements). `many` takes each column as an array, `unnest`ed back into
/// rows, limited by the count of rows (`$count`): a generic plan guesses
/// that count at a tenth of the ten rows it guesses for the arrays, so
/// that every table is read by key (tests/api/plans.rs).
macro_rules! rows {
    (one, $count:literal; $p0:literal $c0:ident $(, $p:literal $c:ident)* $(,)?) => {
        concat!(
            "i AS NOT MATERIALIZED (SELECT ", $p0, " AS ", stringify!($c0),
            $(", ", $p, " AS ", stringify!($c),)*
            ", 1::bigint AS n)"
        )
    };
    (many, $count:literal; $p0:literal $c0:ident $(, $p:literal $c:ident)* $(,)?) => {
        concat!(
            "i AS (SELECT * FROM unnest(", $p0, "[]", $(", ", $p, "[]",)*
            ") WITH ORDINALITY AS i (", stringify!($c0), $(", ", stringify!($c),)*
            ", n) LIMIT ", $count, ")"
        )
    };
}

/// Declares a statement written once over its rows ([`rows!`]): two
/// constants, the first its form of one row (what a lone write runs), the
/// second its form of many (what writes that arrive together share), whose
/// parameter after the columns is the count of rows; and the function that
/// binds the rows' columns for either form ([`Columns`]). Each column is
/// declared once: its parameter with its type, its name in the rows `i`,
/// and its value in a row. Then the rest of the statement after its
/// `WITH i AS (..)`.
macro_rules! row_statement {
    (
        $(#[$doc:meta])*
        $one:ident, $many:ident, $count:literal;
        fn $bind:ident($r:ident: &$row:ty) {
            $($p:literal $c:ident = $v:expr),+ $(,)?
        }
        $($body:tt)*
    ) => {
        $(#[$doc])*
        pub const $one: &str = concat!("WITH ", rows!(one, $count; $($p $c),+), $($body)*);

        #[doc = concat!(
            "[`", stringify!($one), "`] of several rows at once, each column an array, ",
            "then the count of rows (`", $count, "`)."
        )]
        pub const $many: &str = concat!("WITH ", rows!(many, $count; $($p $c),+), $($body)*);

        #[doc = concat!(
            "Binds the columns of `rows` after what `query`, the form of [`",
            stringify!($one), "`] that fits them ([`form`](crate::store::form)), has."
        )]
        fn $bind<'q>(
            rows: &[&'q $row],
            query: $crate::store::PgQuery<'q>,
        ) -> $crate::store::PgQuery<'q> {
            $crate::store::Columns::new(query, rows)
                $(.bind(|$r: &'q $row| $v))+
                .query()
        }
    };
}

pub mod alarms;
pub mod audit;
pub mod balances;
pub mod books;
pub mod captures;
pub mod checkout;
pub mod deliveries;
pub mod disputes;
pub mod events;
pub mod group_commit;
pub mod identity;
pub mod inbound;
pub mod incidents;
pub mod inventory;
pub mod ledger;
pub mod merchants;
pub mod migrate;
pub mod order_batch;
pub mod orders;
pub mod pages;
pub mod payments;
pub mod provider_keys;
pub mod queue;
pub mod refunds;
pub mod revocations;
pub mod webhook_endpoints;
pub(crate) mod writers;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// A database failure, classified by what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database is unreachable or the connection broke: retrying later may work.
    #[error("database unavailable: {0}")]
    Unavailable(sqlx::Error),
    /// Anything else the database reported.
    #[error("database error: {0}")]
    Other(sqlx::Error),
    /// Another process took over this command's idempotency lease: its
    /// result will come from there, and nothing here may be committed.
    #[error("the idempotency lease was taken over by another process")]
    LeaseLost,
    /// A stored value did not decode into its domain type, or a row that
    /// must exist did not.
    #[error("corrupt stored data: {0}")]
    Corrupt(#[from] Corrupt),
}

/// What was found broken in stored data: a bug or a hand-edited row, never
/// the client's fault (a 500 whose cause the log keeps).
#[derive(Debug, thiserror::Error)]
pub enum Corrupt {
    /// A column holds a value its domain type does not know.
    #[error("unknown {what} {value:?}")]
    Unknown {
        /// The column, as a log reader would name it.
        what: &'static str,
        /// What the column held.
        value: String,
    },
    /// A JSON value does not decode into, or encode from, its type.
    #[error("{what}: {source}")]
    Json {
        /// The value, as a log reader would name it.
        what: &'static str,
        /// serde's reason, with its line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A value does not fit its column (an HTTP status in a `smallint`).
    #[error("{what} out of range")]
    OutOfRange {
        /// The value, as a log reader would name it.
        what: &'static str,
    },
    /// A row this transaction found or locked a moment ago is gone.
    #[error("{what} {id} vanished")]
    Vanished {
        /// The kind of row: order, payment, attempt, refund.
        what: &'static str,
        /// Its id.
        id: uuid::Uuid,
    },
    /// Rows that contradict a rule the service keeps (a paid order without
    /// a succeeded payment): the rule, with the row it failed on.
    #[error("{0}")]
    Broken(String),
}

impl Corrupt {
    /// [`Corrupt::Unknown`], as the store's error.
    pub fn unknown(what: &'static str, value: &str) -> StoreError {
        Corrupt::Unknown {
            what,
            value: value.into(),
        }
        .into()
    }

    /// [`Corrupt::Json`] for `map_err`, as the store's error.
    pub fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> StoreError {
        move |source| Corrupt::Json { what, source }.into()
    }

    /// [`Corrupt::Vanished`], as the store's error.
    pub fn vanished(what: &'static str, id: uuid::Uuid) -> StoreError {
        Corrupt::Vanished { what, id }.into()
    }

    /// An HTTP status as its `smallint` column holds it.
    pub fn status_column(status: u16) -> Result<i16, StoreError> {
        i16::try_from(status).map_err(|_| Corrupt::OutOfRange { what: "status" }.into())
    }
}

/// Which form of a statement written with [`rows!`], `(one, many)`, is
/// the one for `rows`.
pub(crate) fn form<R>(rows: &[R], (one, many): (&'static str, &'static str)) -> &'static str {
    if rows.len() == 1 {
        one
    } else {
        many
    }
}

/// A statement with its parameters bound so far.
pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// The parameters of a statement's rows ([`rows!`]), bound once for both
/// of its forms: for one row each column is its value, for several an
/// array of the rows' values (`unnest`ed back into rows, in their order),
/// and the count of rows follows the columns.
pub(crate) struct Columns<'q, 'r, R> {
    query: PgQuery<'q>,
    rows: &'r [&'q R],
}

impl<'q, 'r, R> Columns<'q, 'r, R> {
    /// The columns of `rows`, to bind after what `query` has (parameters
    /// that are arrays in both forms: the rows' events). `query` is the
    /// statement's form that fits `rows` ([`form`]).
    pub(crate) fn new(query: PgQuery<'q>, rows: &'r [&'q R]) -> Self {
        Columns { query, rows }
    }

    /// Binds the next column: `value` of each row.
    pub(crate) fn bind<T>(self, value: impl Fn(&'q R) -> T) -> Self
    where
        T: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
        Vec<T>: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        let query = match self.rows {
            [row] => self.query.bind(value(*row)),
            rows => self
                .query
                .bind(rows.iter().map(|&r| value(r)).collect::<Vec<T>>()),
        };
        Columns { query, ..self }
    }

    /// The statement, bound: the form `many` takes the count of rows last.
    pub(crate) fn query(self) -> PgQuery<'q> {
        match self.rows {
            [_] => self.query,
            rows => self.query.bind(rows.len() as i64),
        }
    }
}

/// Whether a database error means "unavailable for now; the same work may
/// succeed later" rather than a fault of the request or the code.
pub(crate) fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            // admin_shutdown, crash_shutdown, cannot_connect_now,
            // connection failures (class 08), and
            // read_only_sql_transaction: a node that was demoted during a
            // failover (the write never happened there).
            c == "57P01" || c == "57P02" || c == "57P03" || c == "25006" || c.starts_with("08")
        }),
        _ => false,
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) {
            StoreError::Unavailable(e)
        } else {
            StoreError::Other(e)
        }
    }
}

/// The name of the constraint a database error violated, if any.
pub(crate) fn violated_constraint(e: &sqlx::Error) -> Option<&str> {
    match e {
        sqlx::Error::Database(db) => db.constraint(),
        _ => None,
    }
}

/// Opens the shared pool. Connections open lazily, so a process starts even
/// while the database is briefly away; `/readyz` tells when it is reachable.
pub fn pool(database_url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let options = PgConnectOptions::from_str(database_url)
        .map_err(StoreError::Other)?
        .application_name("oncepay")
        .options([GENERIC_PLANS]);
    Ok(pool_with(options, max_connections))
}

/// Every prepared statement runs on its generic plan. The statements here
/// find rows by key (primary keys, unique keys, the merchant's key-set
/// pages), where a plan made for the actual values is no better; but
/// PostgreSQL's plan cache, left to choose, re-planned the payment path's
/// one-statement writes on every execution (measured with
/// `pg_stat_statements`: 0.56 and 0.76 ms of planning per call, more than
/// their execution), which cost the pay path more CPU than its SQL.
pub const GENERIC_PLANS: (&str, &str) = ("plan_cache_mode", "force_generic_plan");

/// Opens the pool for idempotency claims, whose connections commit with
/// `synchronous_commit = off`. Only statements that record no effect run
/// there (claiming a key, taking a lease over, freeing an effect-free key):
/// every effect commits later on the main pool, synchronously, which flushes
/// the WAL past the claim too; and if the database crashes before that, the
/// lost claim stands for a command that did nothing, so a retry executes it.
/// It saves one WAL flush per money command.
pub(crate) fn claims_pool(database_url: &str, max_connections: u32) -> Result<PgPool, StoreError> {
    let options = PgConnectOptions::from_str(database_url)
        .map_err(StoreError::Other)?
        .application_name("oncepay-claims")
        .options([("synchronous_commit", "off"), GENERIC_PLANS]);
    Ok(pool_with(options, max_connections))
}

/// A connection idle for longer than this is pinged before it is handed
/// out: it may have been cut while it waited (a failover, HAProxy's
/// `shutdown-sessions`, a restart). One used more recently was pinged when
/// it came back to the pool (sqlx pings every connection on release), so
/// pinging it again would only add a round trip to every request: at 2 to
/// 5 acquisitions per payment that was ~10 % of the pay path's round trips.
/// If it broke in that second, the statement fails as unavailable (503,
/// retried by the client) and the broken connection is dropped.
pub(crate) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Idle connections are pinged before they are handed out (see
/// [`PING_IF_IDLE_FOR`]), so one broken by a failover or a restart is
/// dropped there instead of failing a request; connections live at most
/// 30 minutes, so none outlives a topology change for long.
fn pool_with(options: PgConnectOptions, max_connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .idle_timeout(Duration::from_secs(300))
        .max_lifetime(Duration::from_secs(1800))
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(options)
}

/// Whether the database behind the pool takes writes, as `/readyz` tells.
///
/// Asked on up to three pooled connections: one cut by a failover, or one
/// that reached the old primary just as it became a standby (HAProxy sends
/// new connections there until its checks mark the node down), answers for
/// that connection, not for the database. Such a connection is closed
/// instead of going back to the pool, so the next question meets another.
pub(crate) async fn is_writable(pool: &PgPool) -> Result<bool, StoreError> {
    let mut answer = Ok(false);
    for _ in 0..3 {
        let mut conn = pool.acquire().await?;
        answer = sqlx::query_scalar::<_, bool>("SELECT NOT pg_is_in_recovery()")
            .fetch_one(&mut *conn)
            .await
            .map_err(StoreError::from);
        if matches!(answer, Ok(true)) {
            return answer;
        }
        conn.close_on_drop();
    }
    answer
}

/// Connects one connection, creating the database first if it does not exist
/// (so `make run` works on a fresh machine), then applies pending migrations.
pub async fn prepare_database(database_url: &str) -> Result<Vec<String>, migrate::MigrateError> {
    let options = PgConnectOptions::from_str(database_url)?.application_name("oncepay-migrate");
    let mut conn = match PgConnection::connect_with(&options).await {
        Ok(conn) => conn,
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("3D000") => {
            create_database(&options).await?;
            PgConnection::connect_with(&options).await?
        }
        Err(e) => return Err(e.into()),
    };
    let applied = migrate::run(&mut conn).await?;
    conn.close().await?;
    Ok(applied)
}

/// [`prepare_database`], retried while the database is unavailable (no
/// primary yet, a failover under way, a node still read-only: asked
/// before migrating, and recognised inside refinery's errors too) for up
/// to `patience`: a process started during a failover waits for the new
/// primary instead of exiting. Any other error is returned at once.
pub(crate) async fn prepare_database_patiently(
    database_url: &str,
    patience: Duration,
) -> Result<Vec<String>, migrate::MigrateError> {
    let started = std::time::Instant::now();
    loop {
        match prepare_database(database_url).await {
            Err(e) if started.elapsed() < patience && e.is_unavailable() => {
                tracing::warn!(error = %e, "the database is unavailable at start (unreachable or read-only); waiting for a writable primary");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

async fn create_database(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let name = options.get_database().unwrap_or("oncepay").to_string();
    let admin = options.clone().database("postgres");
    let mut conn = PgConnection::connect_with(&admin).await?;
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match sqlx::raw_sql(&format!("CREATE DATABASE {quoted}"))
        .execute(&mut conn)
        .await
    {
        Ok(_) => tracing::info!(database = %name, "created database"),
        // Another process created it at the same moment: that is fine.
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("42P04") | Some("23505")) => {}
        Err(e) => return Err(e),
    }
    conn.close().await
}
