//! The names of the databases tests create, so that a test run drops only
//! what it made and never another run's (a second checkout, CI beside a
//! developer on one PostgreSQL).
//!
//! Every test database is `oncepay_test_<run>_<created>_<random>`:
//!
//! - `<run>`: the run's id, `ONCEPAY_TEST_RUN_ID` (`make test` sets one for
//!   the whole run), else one made for this process from its pid and the
//!   time, so that plain `cargo test` works; 1 to 16 lowercase letters and
//!   digits;
//! - `<created>`: the Unix second the name was made (10 digits), so that a
//!   run left behind by a crash can be told by its age;
//! - `<random>`: 20 hex digits.
//!
//! At most 13 + 16 + 1 + 10 + 1 + 20 = 61 bytes, within PostgreSQL's 63.
//! `make test-dbs-drop` drops `oncepay_test_<its run>_*` (`WITH (FORCE)`),
//! and of other runs only those older than `TEST_DB_STALE_HOURS` with no
//! connection (without `FORCE`: a connection that arrives meanwhile makes
//! the drop fail, not the connection).

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// What every test database's name starts with.
pub const PREFIX: &str = "oncepay_test_";

/// The longest run id (see the module's arithmetic).
pub const RUN_ID_MAX: usize = 16;

/// The variable `make test` sets to the run's id.
pub const RUN_ID_VAR: &str = "ONCEPAY_TEST_RUN_ID";

/// Whether `id` may be a run id: 1 to [`RUN_ID_MAX`] lowercase ASCII
/// letters and digits (no `_`, so `oncepay_test_<id>_%` matches that run
/// alone, and nothing to quote in SQL or a shell).
pub fn is_run_id(id: &str) -> bool {
    (1..=RUN_ID_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// This process's run id: `ONCEPAY_TEST_RUN_ID`, else one made once for
/// this process (its pid and the time, in hex). Panics on a malformed
/// `ONCEPAY_TEST_RUN_ID`, naming it.
pub fn run_id() -> &'static str {
    static RUN_ID: OnceLock<String> = OnceLock::new();
    RUN_ID.get_or_init(|| match std::env::var(RUN_ID_VAR) {
        Ok(id) if !id.trim().is_empty() => {
            let id = id.trim().to_string();
            assert!(
                is_run_id(&id),
                "{RUN_ID_VAR}={id:?}: expected 1 to {RUN_ID_MAX} lowercase letters and digits"
            );
            id
        }
        _ => format!("{:x}{:x}", now_unix(), std::process::id()),
    })
}

/// A new, unique database name of this process's run.
pub fn database_name() -> String {
    name_for(run_id(), now_unix())
}

/// A new, unique database name of run `run` as if made at `created` (Unix
/// seconds): what [`database_name`] makes, for tests of the drop step.
/// Panics if `run` is not a run id.
pub fn name_for(run: &str, created: u64) -> String {
    assert!(is_run_id(run), "not a run id: {run:?}");
    static MADE: AtomicU64 = AtomicU64::new(0);
    // RandomState's keys come from the operating system's random source;
    // the counter keeps two names of this process apart whatever they are.
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(made);
    let random = hasher.finish();
    let name = format!(
        "{PREFIX}{run}_{created:010}_{:04x}{random:016x}",
        made & 0xffff
    );
    debug_assert!(name.len() <= 63, "{name}");
    name
}

/// The PostgreSQL server the tests use (`TEST_DATABASE_SERVER`, a URL
/// without a database name).
pub fn server() -> String {
    std::env::var("TEST_DATABASE_SERVER")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".into())
}

/// The URL of a new, unique database of this run on [`server`] (created
/// by whoever connects first and migrates).
pub fn database_url() -> String {
    format!("{}/{}", server().trim_end_matches('/'), database_name())
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_run_and_fit_postgres() {
        let longest = "z".repeat(RUN_ID_MAX);
        let name = name_for(&longest, u64::from(u32::MAX) * 2);
        assert!(name.len() <= 63, "{name}: {} bytes", name.len());
        assert!(name.starts_with(&format!("{PREFIX}{longest}_")));
        let (a, b) = (name_for("r1", 1_700_000_000), name_for("r1", 1_700_000_000));
        assert_ne!(a, b, "unique within a process");
        assert!(a.starts_with("oncepay_test_r1_1700000000_"), "{a}");
        assert_eq!(a.len(), "oncepay_test_r1_1700000000_".len() + 20);
        assert!(is_run_id(run_id()), "{}", run_id());
        assert!(database_name().starts_with(&format!("{PREFIX}{}_", run_id())));
    }

    #[test]
    fn run_ids_are_short_lowercase_letters_and_digits() {
        for good in ["a", "0", "1a2b3c", "abcdefghij012345"] {
            assert!(is_run_id(good), "{good}");
        }
        for bad in ["", "A", "a_b", "a-b", "a%", "a'b", "abcdefghij0123456", "ü"] {
            assert!(!is_run_id(bad), "{bad}");
        }
    }
}
