//! The Makefile's targets that run without a build: `make test-dbs-drop`
//! drops its own run's test databases and never another run's live ones
//! (a second checkout, or CI beside a developer, on one PostgreSQL), and
//! `make help` prints values where the Makefile names variables.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use oncepay_testkit::test_db;
use sqlx::{Connection, PgConnection};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `make ARGS` in the workspace, with `env`; never the make that may be
/// running this test (its jobserver, level and command-line variables).
fn make(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("make");
    cmd.arg("-C")
        .arg(workspace())
        .arg("--no-print-directory")
        .args(args);
    for var in [
        "MAKEFLAGS",
        "MFLAGS",
        "MAKELEVEL",
        "MAKEFILES",
        "MAKEOVERRIDES",
        "ONCEPAY_TEST_RUN_ID",
        "TEST_DB_STALE_HOURS",
        "RUN_PORT",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("make runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A run id of this test's own: not the id of the run executing it, whose
/// databases are in use.
fn fresh_run_id() -> String {
    format!("t{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

async fn exists(admin: &mut PgConnection, name: &str) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(admin)
        .await
        .expect("pg_database")
}

async fn alive(conn: &mut PgConnection) -> bool {
    sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(conn)
        .await
        .is_ok()
}

const CONNECTED: bool = true;
const IDLE: bool = false;
const KEPT: bool = true;
const DROPPED: bool = false;

/// A database the drop step meets.
struct Case {
    what: &'static str,
    name: String,
    /// Whether a connection to it is open while the drop step runs.
    connected: bool,
    /// Whether it must be there afterwards.
    remains: bool,
}

impl Case {
    /// A database of run `run` made at `created` (Unix seconds).
    fn of(what: &'static str, run: &str, created: u64, connected: bool, remains: bool) -> Case {
        Case {
            what,
            name: test_db::name_for(run, created),
            connected,
            remains,
        }
    }
}

#[tokio::test]
async fn the_drop_step_drops_this_runs_databases_and_no_other_runs_live_ones() {
    if !on_path("make") || !on_path("psql") {
        eprintln!("SKIPPED: make test-dbs-drop needs make and psql");
        return;
    }
    let server = test_db::server();
    let mut admin = PgConnection::connect(&format!("{server}/postgres"))
        .await
        .expect("the test server");
    let (mine, other) = (fresh_run_id(), fresh_run_id());
    // Made now, or a month ago (older than any TEST_DB_STALE_HOURS the
    // Makefile would default to).
    let new = unix_now();
    let old = new - 30 * 86_400;
    let cases = [
        Case::of("this run's, connected", &mine, new, CONNECTED, DROPPED),
        Case::of("this run's, old", &mine, old, IDLE, DROPPED),
        Case::of("another run's, connected", &other, new, CONNECTED, KEPT),
        // A live run between two connections.
        Case::of("another run's, idle", &other, new, IDLE, KEPT),
        // A connection of hours is still someone's.
        Case::of(
            "another run's, old, connected",
            &other,
            old,
            CONNECTED,
            KEPT,
        ),
        // What a crashed run left.
        Case::of("another run's, old, idle", &other, old, IDLE, DROPPED),
        // Named as older checkouts named them: nothing says whose or how old.
        Case {
            what: "an older checkout's",
            name: format!("oncepay_test_{:032x}", fastrand::u128(..)),
            connected: IDLE,
            remains: KEPT,
        },
    ];
    let mut held = Vec::new();
    for case in &cases {
        sqlx::raw_sql(&format!("CREATE DATABASE \"{}\"", case.name))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("create {} ({}): {e}", case.what, case.name));
        if case.connected {
            let conn = PgConnection::connect(&format!("{server}/{}", case.name))
                .await
                .expect("connect");
            held.push((case.what, case.name.clone(), conn));
        }
    }
    let out = make(
        &["test-dbs-drop"],
        &[
            ("ONCEPAY_TEST_RUN_ID", mine.as_str()),
            ("TEST_DATABASE_SERVER", server.as_str()),
        ],
    );
    let mut found = Vec::new();
    for case in &cases {
        found.push((
            case.what,
            case.remains,
            exists(&mut admin, &case.name).await,
        ));
    }
    let mut connections = Vec::new();
    for (what, name, conn) in &mut held {
        let expected = !name.starts_with(&format!("oncepay_test_{mine}_"));
        connections.push((*what, expected, alive(conn).await));
    }
    // Clean up before judging, so that a failure leaves nothing behind.
    for (_, _, conn) in held {
        let _ = conn.close().await;
    }
    for case in &cases {
        let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", case.name);
        let _ = sqlx::raw_sql(&drop).execute(&mut admin).await;
    }
    assert!(out.status.success(), "make test-dbs-drop: {}", text(&out));
    for (what, remains, exists) in found {
        assert_eq!(
            exists, remains,
            "{what}: should remain {remains}, exists {exists}"
        );
    }
    for (what, expected, alive) in connections {
        assert_eq!(
            alive, expected,
            "the connection to {what}: should live {expected}"
        );
    }
}

#[test]
fn the_drop_step_refuses_a_run_id_that_could_match_other_runs() {
    if !on_path("make") {
        eprintln!("SKIPPED: no make");
        return;
    }
    for bad in ["%", "a_b", "A", "abcdefghij0123456"] {
        let out = make(
            &["test-dbs-drop"],
            &[
                ("ONCEPAY_TEST_RUN_ID", bad),
                ("TEST_DATABASE_SERVER", "postgres://nobody@192.0.2.1:1"),
            ],
        );
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        assert!(
            text(&out).contains("ONCEPAY_TEST_RUN_ID"),
            "{bad}: {}",
            text(&out)
        );
    }
}

#[test]
fn make_help_prints_values_not_variable_names() {
    if !on_path("make") {
        eprintln!("SKIPPED: no make");
        return;
    }
    let out = make(&["help", "PGHOST=192.0.2.7", "PGPORT=6543"], &[]);
    let help = text(&out);
    assert!(out.status.success(), "{help}");
    assert!(
        !help.contains("$("),
        "a variable's name, not its value: {help}"
    );
    assert!(help.contains("192.0.2.7:6543"), "{help}");
    assert!(help.contains("make test-dbs-drop"), "{help}");
}

/// The curl `make run` prints shows the answer's headers (the replay's
/// `Idempotent-Replayed: true`) and ends the JSON body with a newline.
#[test]
fn make_runs_payment_curl_shows_the_headers() {
    if !on_path("make") {
        eprintln!("SKIPPED: no make");
        return;
    }
    // -n prints the recipe without running it (nothing is built or started).
    let out = make(&["-n", "run"], &[]);
    let recipe = text(&out);
    assert!(out.status.success(), "{recipe}");
    assert!(
        recipe.contains("curl -si -w '\\n' -X POST http://127.0.0.1:8080/payments"),
        "{recipe}"
    );
}
