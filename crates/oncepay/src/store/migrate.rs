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

/// The migrations, in order. A unit test checks that every file in
/// `migrations/` is listed here, so none can be forgotten.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "V1__initial",
        include_str!("../../migrations/V1__initial.sql"),
    ),
    (
        "V2__money_safety",
        include_str!("../../migrations/V2__money_safety.sql"),
    ),
    (
        "V3__checkout",
        include_str!("../../migrations/V3__checkout.sql"),
    ),
    (
        "V4__list_indexes",
        include_str!("../../migrations/V4__list_indexes.sql"),
    ),
    (
        "V5__api_keys",
        include_str!("../../migrations/V5__api_keys.sql"),
    ),
    (
        "V6__events",
        include_str!("../../migrations/V6__events.sql"),
    ),
    (
        "V7__first_statistics",
        include_str!("../../migrations/V7__first_statistics.sql"),
    ),
    (
        "V8__decline_checks",
        include_str!("../../migrations/V8__decline_checks.sql"),
    ),
    (
        "V9__scopes_and_audit",
        include_str!("../../migrations/V9__scopes_and_audit.sql"),
    ),
    (
        "V10__event_retention",
        include_str!("../../migrations/V10__event_retention.sql"),
    ),
    (
        "V11__provider_books",
        include_str!("../../migrations/V11__provider_books.sql"),
    ),
    (
        "V12__customer_action",
        include_str!("../../migrations/V12__customer_action.sql"),
    ),
    (
        "V13__return_url",
        include_str!("../../migrations/V13__return_url.sql"),
    ),
    (
        "V14__lease_index_for_expired_leases_only",
        include_str!("../../migrations/V14__lease_index_for_expired_leases_only.sql"),
    ),
    (
        "V15__revocations_acknowledged",
        include_str!("../../migrations/V15__revocations_acknowledged.sql"),
    ),
];

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
    /// A migration file is malformed or the history diverges.
    #[error("migration failed: {0}")]
    Refinery(#[from] refinery_core::Error),
}

/// Applies pending migrations, holding the migration lock meanwhile.
/// Returns the names of the migrations it applied.
pub async fn run(conn: &mut PgConnection) -> Result<Vec<String>, MigrateError> {
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
    fn every_migration_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("migrations/ exists")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .map(|n| n.trim_end_matches(".sql").to_string())
            .collect();
        // By version number: V10 comes after V9.
        let version = |name: &String| -> u32 {
            name.trim_start_matches('V')
                .split("__")
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX)
        };
        files.sort_by_key(version);
        let listed: Vec<String> = MIGRATIONS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(files, listed);
    }
}
