//! Schema migrations: refinery's runner over a sqlx connection.
//!
//! refinery has no sqlx driver, and a second PostgreSQL driver only for
//! migrations would double what we compile; its async traits are small, so
//! this module implements them over `PgConnection`. refinery takes no lock of
//! its own: a session-level advisory lock makes processes that start together
//! on a fresh database migrate one after the other.

use refinery_core::traits::r#async::{AsyncMigrate, AsyncQuery, AsyncTransaction};
use refinery_core::{Migration, Runner};
use sqlx::{Connection, Executor, PgConnection, Row};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The migrations, in version order: every `migrations/V<n>__<name>.sql`,
/// listed by `build.rs` at compile time, so a new file needs no line here.
/// A unit test checks the versions run 1, 2, 3… without a gap.
pub const MIGRATIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// Arbitrary constant naming oncepay's migration lock among advisory locks.
const MIGRATION_LOCK: i64 = 0x6f6e_6365_7061_7901;

struct SqlxConn<'c>(&'c mut PgConnection);

impl AsyncTransaction for SqlxConn<'_> {
    type Error = sqlx::Error;

    async fn execute<'a, T: Iterator<Item = &'a str> + Send + 'a>(
        &mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        // Each migration is a multi-statement script: `execute` with a bare
        // `&str` uses the simple query protocol, which runs them all.
        let mut tx = self.0.begin().await?;
        let mut count = 0;
        for query in queries {
            (&mut *tx).execute(query).await?;
            count += 1;
        }
        tx.commit().await?;
        Ok(count)
    }
}

impl AsyncQuery<Vec<Migration>> for SqlxConn<'_> {
    async fn query(&mut self, query: &str) -> Result<Vec<Migration>, Self::Error> {
        let rows = (&mut *self.0).fetch_all(query).await?;
        let decode = |e: Box<dyn std::error::Error + Send + Sync>| sqlx::Error::Decode(e);
        let mut applied = Vec::with_capacity(rows.len());
        for row in rows {
            let version: i32 = row.try_get(0)?;
            let name: String = row.try_get(1)?;
            let applied_on: String = row.try_get(2)?;
            let checksum: String = row.try_get(3)?;
            let applied_on =
                OffsetDateTime::parse(&applied_on, &Rfc3339).map_err(|e| decode(Box::new(e)))?;
            let checksum = checksum.parse::<u64>().map_err(|e| decode(Box::new(e)))?;
            applied.push(Migration::applied(version, name, applied_on, checksum));
        }
        Ok(applied)
    }
}

impl AsyncMigrate for SqlxConn<'_> {}

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database could not be reached or refused a statement.
    #[error("database error while migrating: {0}")]
    Database(#[from] sqlx::Error),
    /// The database takes no writes (a standby, or a primary demoted or
    /// not promoted yet in a failover): migrations wait for a writable
    /// primary.
    #[error("the database is read-only (no writable primary yet)")]
    ReadOnly,
    /// A migration file is malformed or the history diverges.
    #[error("migration failed: {0}")]
    Refinery(#[from] refinery_core::Error),
}

impl MigrateError {
    /// Whether the database is unavailable for now (unreachable, a
    /// failover under way, read-only), so that the same step may succeed
    /// later: also when refinery wrapped the database's error in its own
    /// (it reports a statement refused on a read-only node as a
    /// migration that failed).
    pub fn is_unavailable(&self) -> bool {
        match self {
            MigrateError::Database(e) => super::is_unavailable(e),
            MigrateError::ReadOnly => true,
            MigrateError::Refinery(e) => {
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
                while let Some(cause) = source {
                    if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
                        return super::is_unavailable(e);
                    }
                    source = cause.source();
                }
                false
            }
        }
    }
}

/// Applies pending migrations, holding the migration lock meanwhile.
/// Returns the names of the migrations it applied.
pub async fn run(conn: &mut PgConnection) -> Result<Vec<String>, MigrateError> {
    // A node that takes no writes is no place to migrate (nor to serve
    // from): asked first, so that a standby answers "not yet" rather than
    // a migration's failure.
    let read_only: bool =
        sqlx::query_scalar("SELECT current_setting('transaction_read_only') = 'on'")
            .fetch_one(&mut *conn)
            .await?;
    if read_only {
        return Err(MigrateError::ReadOnly);
    }
    let migrations = MIGRATIONS
        .iter()
        .map(|(name, sql)| Migration::unapplied(name, sql))
        .collect::<Result<Vec<_>, _>>()?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    let report = Runner::new(&migrations)
        .set_abort_divergent(true)
        .run_async(&mut SqlxConn(&mut *conn))
        .await;
    // Unlock whatever happened; a lost connection releases it anyway.
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await;
    let report = report?;
    unlocked?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    #[test]
    fn every_migration_file_is_listed_in_version_order_without_a_gap() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let files = std::fs::read_dir(dir)
            .expect("migrations/ exists")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".sql"))
            .count();
        assert_eq!(MIGRATIONS.len(), files);
        for (i, (name, sql)) in MIGRATIONS.iter().enumerate() {
            assert!(name.starts_with(&format!("V{}__", i + 1)), "{name}");
            assert!(!sql.trim().is_empty(), "{name} is empty");
        }
    }
}
