//! Point-in-time restore for real, as the disaster drill uses it: a row
//! committed before the target survives, one committed after it is gone,
//! the server continues on a new timeline, restarts normally afterwards,
//! and a second restore (from a base backup on that timeline) works too.

use std::path::Path;
use std::time::{Duration, Instant};

use oncepay_testkit::pitr::{ArchivedCluster, ARCHIVE_TIMEOUT};
use sqlx::types::chrono::Utc;
use sqlx::{Connection, PgConnection};

/// Enough for `archive_timeout` and a copy.
const ARCHIVED: Duration = Duration::from_secs(15);

async fn connect(cluster: &ArchivedCluster) -> Result<PgConnection, String> {
    PgConnection::connect(&cluster.url("postgres"))
        .await
        .map_err(|e| e.to_string())
}

async fn execute(cluster: &ArchivedCluster, sql: &str) -> Result<(), String> {
    let mut conn = connect(cluster).await?;
    sqlx::query(sql)
        .execute(&mut conn)
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    conn.close().await.map_err(|e| e.to_string())
}

async fn rows(cluster: &ArchivedCluster) -> Result<Vec<String>, String> {
    let mut conn = connect(cluster).await?;
    let names = sqlx::query_scalar("SELECT name FROM drill ORDER BY name")
        .fetch_all(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    conn.close().await.map_err(|e| e.to_string())?;
    Ok(names)
}

fn check(ok: bool, what: String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what)
    }
}

async fn drill(cluster: &ArchivedCluster, root: &Path) -> Result<(), String> {
    execute(cluster, "CREATE TABLE drill (name text PRIMARY KEY)").await?;
    let first = cluster.timeline().await?;
    cluster.base_backup().await?;

    // Restore 1: A before the target, B after it.
    execute(cluster, "INSERT INTO drill VALUES ('A')").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let target = Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    execute(cluster, "INSERT INTO drill VALUES ('B')").await?;
    let waited = Instant::now();
    cluster.wait_archived(ARCHIVED).await?;
    eprintln!(
        "B's WAL archived after {:?} (archive_timeout {ARCHIVE_TIMEOUT:?})",
        waited.elapsed()
    );
    let report = cluster.restore_to(target).await?;
    eprintln!("restore 1 to {target}: {report:?}");
    let names = rows(cluster).await?;
    check(names == ["A"], format!("after restore 1: {names:?}"))?;
    check(
        report.timeline == first + 1,
        format!("timeline {} after {first}", report.timeline),
    )?;
    check(
        report
            .last_replayed_commit
            .is_some_and(|t| t <= target && (target - t).num_seconds() < 5),
        format!(
            "last replayed commit {:?}, target {target}",
            report.last_replayed_commit
        ),
    )?;

    // Later restarts, even crashes, are ordinary ones: no second recovery
    // to the old target, same timeline, writable.
    cluster.restart(true).await?;
    let names = rows(cluster).await?;
    check(names == ["A"], format!("after a crash restart: {names:?}"))?;
    let timeline = cluster.timeline().await?;
    check(
        timeline == report.timeline,
        format!("timeline {timeline} after a restart"),
    )?;
    check(
        !root.join("pg/pitr_recovery.conf").exists() && !root.join("pg/recovery.signal").exists(),
        "recovery settings left in the data directory".into(),
    )?;

    // Restore 2, from a base backup on the new timeline.
    execute(cluster, "INSERT INTO drill VALUES ('C')").await?;
    let base_end = cluster.base_backup().await?;
    let refused = cluster.restore_to(target).await;
    check(
        matches!(&refused, Err(e) if e.contains("before the end of the base backup")),
        format!("a target before the base backup ({base_end}): {refused:?}"),
    )?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let target = Utc::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    execute(cluster, "INSERT INTO drill VALUES ('D')").await?;
    cluster.wait_archived(ARCHIVED).await?;
    // A target no archived commit follows cannot be reached: the replay
    // fails (and leaves no server), the next restore starts over.
    let unreachable = cluster.restore_to(Utc::now()).await;
    check(
        matches!(&unreachable, Err(e) if e.contains("choose an older target")),
        format!("a target after the archive's end: {unreachable:?}"),
    )?;
    let second = cluster.restore_to(target).await?;
    eprintln!("restore 2 to {target}: {second:?}");
    let names = rows(cluster).await?;
    check(names == ["A", "C"], format!("after restore 2: {names:?}"))?;
    check(
        second.timeline == first + 2,
        format!("timeline {} after {first}", second.timeline),
    )?;
    execute(cluster, "INSERT INTO drill VALUES ('E')").await
}

#[tokio::test]
async fn pitr_restores_twice_to_a_point_in_time() {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join("initdb").is_file()));
    if !found {
        eprintln!("\n*** SKIPPED: no initdb on the PATH ***\n");
        return;
    }
    let root = std::env::temp_dir().join(format!(
        "oncepay-pitr-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    let started = Instant::now();
    let result = match ArchivedCluster::create(&root).await {
        Ok(cluster) => {
            let result = drill(&cluster, &root).await;
            cluster.stop().await;
            result
        }
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&root);
    eprintln!("drill took {:?}", started.elapsed());
    if let Err(e) = result {
        panic!("{e}");
    }
}
