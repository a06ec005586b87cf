//! A private PostgreSQL cluster with continuous WAL archiving and
//! point-in-time restore, for the disaster drill (`make chaos-restore`):
//! the database is destroyed at a random moment and restored to a point
//! some seconds in the past.
//!
//! Under `root`:
//!
//! - `pg/`: the data directory (a [`PgCluster`], so the same tools, user,
//!   port and log conventions), wiped by every restore;
//! - `archive/`: every WAL segment the server completed, copied there by
//!   `archive_command`;
//! - `base/`: the latest base backup ([`ArchivedCluster::base_backup`]);
//! - `logs/`: the server logs of the data directories a restore wiped.
//!
//! What can be restored: any moment after the end of the base backup and
//! up to the last WAL segment that reached the archive. Segments are 1 MB
//! and `archive_timeout` is 5 s, so a busy server's archive lags by at most
//! ~5 s (plus one copy); whatever was written after the last archived
//! segment is lost with the data directory, as in a real disaster.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::types::chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, Postgres};

use crate::ports::free_port;
use crate::processes::{is_root, PgCluster};

/// `archive_timeout`: the longest a written commit waits before its
/// segment is closed and archived.
pub const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The file holding the recovery settings while a restore runs. It is
/// included by `postgresql.conf` (`include_if_exists`) and deleted once
/// the server is promoted, so later (re)starts are ordinary ones. (Not
/// `recovery.conf`: PostgreSQL 12+ refuses to start if that name exists.)
/// Its absence costs one "skipping missing configuration file" line in the
/// log at each start.
const RECOVERY_CONF: &str = "pitr_recovery.conf";

/// How long a restore may take to replay and promote.
const PROMOTION_LIMIT: Duration = Duration::from_secs(60);

/// A PostgreSQL cluster whose WAL is archived continuously, and which can
/// be destroyed and restored to a point in time. Like [`PgCluster`], it is
/// not stopped on drop: call [`ArchivedCluster::stop`] (and remove `root`).
pub struct ArchivedCluster {
    pg: PgCluster,
    root: PathBuf,
    /// When the latest base backup ended: the earliest restorable moment.
    base_end: Mutex<Option<DateTime<Utc>>>,
    /// Restores so far (numbers the logs kept of wiped data directories).
    restores: AtomicU32,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The timeline the promoted server writes on (one more than the
    /// highest timeline the archive knew).
    pub timeline: u32,
    /// From stopping the old server to a promoted server whose new
    /// timeline's history file is archived.
    pub took: Duration,
    /// The commit time of the last transaction replayed (`None` if none
    /// was replayed after the base backup): at or before the target.
    pub last_replayed_commit: Option<DateTime<Utc>>,
}

/// `s` as one shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` as a `postgresql.conf` string.
fn conf_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// `dir/%f` for `archive_command` / `restore_command`: a shell word in
/// which a `%` of the path is not taken for a placeholder.
fn archived_file(dir: &Path) -> String {
    sh_quote(&format!(
        "{}/%f",
        dir.display().to_string().replace('%', "%%")
    ))
}

/// The last lines of the file at `path`, for error messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The PostgreSQL tool `name` of the same installation as the `pg_ctl` on
/// the PATH (e.g. `/usr/lib/postgresql/15/bin/pg_basebackup`, rather than
/// Debian's version-guessing wrapper in `/usr/bin`), or `name` itself.
fn pg_tool(name: &str) -> String {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("pg_ctl"))
                .find(|p| p.is_file())
        })
        .and_then(|ctl| std::fs::canonicalize(ctl).ok())
        .map(|ctl| ctl.with_file_name(name))
        .filter(|tool| tool.is_file())
        .map(|tool| tool.display().to_string())
        .unwrap_or_else(|| name.to_string())
}

/// The postmaster's pid, from the pid file of data directory `dir`.
fn postmaster_pid(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether process `pid` still runs. A zombie does not: the postmaster
/// is orphaned by `pg_ctl`, and the init process of some machines (or
/// containers) reaps orphans only now and then.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) state ...": comm may hold spaces and parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

impl ArchivedCluster {
    /// `initdb` into `root/pg` with 1 MB WAL segments and archiving into
    /// `root/archive`, and start it (on 127.0.0.1, a free port, trust
    /// authentication, as [`PgCluster`]).
    pub async fn create(root: &Path) -> Result<ArchivedCluster, String> {
        let dir = root.join("pg");
        for d in [&dir, &root.join("archive"), &root.join("logs")] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let cluster = ArchivedCluster {
            pg: PgCluster {
                dir,
                port: free_port()?,
            },
            root: root.to_path_buf(),
            base_end: Mutex::new(None),
            restores: AtomicU32::new(0),
        };
        if is_root() {
            let mut chown = tokio::process::Command::new("chown");
            chown.args(["-R", "postgres"]).arg(root);
            cluster.pg.run(chown, "chown").await?;
        }
        let mut init = cluster.pg.tool("initdb");
        init.arg("-D").arg(&cluster.pg.dir).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "--wal-segsize=1",
        ]);
        cluster.pg.run(init, "initdb").await?;
        let archive = cluster.archive_dir();
        // Never overwrites an archived segment: an identical copy is a
        // success (a segment archived again after a crash lost its .done
        // status), a different one a failure that stops archiving. The copy
        // is renamed into place, so a server killed mid-copy (as every
        // restore does) leaves a stray `.part`, never a truncated segment.
        let archive_command = format!(
            "if test -f {f}; then cmp -s %p {f}; else cp %p {part} && mv {part} {f}; fi",
            f = archived_file(&archive),
            part = sh_quote(&format!(
                "{}/%f.part",
                archive.display().to_string().replace('%', "%%")
            )),
        );
        let settings = format!(
            "\n# oncepay-testkit pitr: continuous archiving (see src/pitr.rs)\n\
             wal_level = replica\n\
             archive_mode = on\n\
             archive_command = {}\n\
             archive_timeout = '{}s'\n\
             fsync = off\n\
             include_if_exists = '{RECOVERY_CONF}'\n",
            conf_quote(&archive_command),
            ARCHIVE_TIMEOUT.as_secs(),
        );
        let conf = cluster.pg.dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).map_err(|e| e.to_string())?;
        text.push_str(&settings);
        std::fs::write(&conf, text).map_err(|e| e.to_string())?;
        let mut cluster = cluster;
        if let Err(e) = cluster.pg.start_on_a_free_port().await {
            return Err(cluster.with_log(e));
        }
        Ok(cluster)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.pg.port
    }

    /// A URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        self.pg.url(name)
    }

    /// Where the WAL segments are archived.
    pub fn archive_dir(&self) -> PathBuf {
        self.root.join("archive")
    }

    /// Where the latest base backup is.
    pub fn base_dir(&self) -> PathBuf {
        self.root.join("base")
    }

    /// The running server's log.
    pub fn log(&self) -> PathBuf {
        self.pg.log()
    }

    /// When the latest base backup ended: the earliest moment
    /// [`ArchivedCluster::restore_to`] accepts (`None` before the first).
    pub fn earliest_target(&self) -> Option<DateTime<Utc>> {
        *self.base_end.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Restarts the server, as [`PgCluster::restart`] (`crash`: `-m
    /// immediate`). After a restore this is an ordinary (crash) recovery:
    /// the recovery settings are gone.
    pub async fn restart(&self, crash: bool) -> Result<(), String> {
        self.pg.restart(crash).await.map_err(|e| self.with_log(e))
    }

    /// Stops the server at once, as [`PgCluster::stop`].
    pub async fn stop(&self) {
        self.pg.stop().await
    }

    /// `what` with the end of the server's log.
    fn with_log(&self, what: String) -> String {
        format!(
            "{what}\n--- end of {} ---\n{}",
            self.pg.log().display(),
            tail(&self.pg.log(), 30)
        )
    }

    async fn connect(&self) -> Result<PgConnection, String> {
        PgConnection::connect(&self.url("postgres"))
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.url("postgres")))
    }

    /// The value of `sql`, on a fresh connection.
    async fn scalar<T>(&self, sql: &str) -> Result<T, String>
    where
        T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
    {
        let mut conn = self.connect().await?;
        let value = sqlx::query_scalar::<_, T>(sql)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| format!("{sql}: {e}"));
        let _ = conn.close().await;
        value
    }

    /// The timeline the server writes on.
    pub async fn timeline(&self) -> Result<u32, String> {
        let hex: String = self
            .scalar("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
            .await?;
        u32::from_str_radix(&hex, 16).map_err(|e| format!("timeline {hex:?}: {e}"))
    }

    /// Waits until the WAL written so far (up to the current insert
    /// position) is in the archive: at most [`ARCHIVE_TIMEOUT`] and a copy
    /// on a server that is writing. On an idle server the last segment is
    /// not switched, so this times out.
    pub async fn wait_archived(&self, limit: Duration) -> Result<(), String> {
        let segment: String = self
            .scalar("SELECT pg_walfile_name(pg_current_wal_lsn())")
            .await?;
        let file = self.archive_dir().join(&segment);
        let deadline = Instant::now() + limit;
        while !file.exists() {
            if Instant::now() > deadline {
                let archiver: String = self
                    .scalar(
                        "SELECT format('last archived %s at %s, %s failures (last %s at %s)', \
                         last_archived_wal, last_archived_time, failed_count, \
                         last_failed_wal, last_failed_time) FROM pg_stat_archiver",
                    )
                    .await
                    .unwrap_or_else(|e| e);
                return Err(self.with_log(format!(
                    "WAL segment {segment} not archived after {limit:?}: {archiver}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// `pg_basebackup` (fast checkpoint, WAL streamed) into `root/base`,
    /// replacing the previous one only once the new one is complete.
    /// Returns when it ended: the earliest moment a restore can target.
    ///
    /// Take one once the schema exists and again after every restore, so
    /// that each restore replays from a backup on the current timeline and
    /// only a little WAL.
    pub async fn base_backup(&self) -> Result<DateTime<Utc>, String> {
        let new = self.root.join("base.new");
        let _ = std::fs::remove_dir_all(&new);
        let mut backup = self.pg.tool(&pg_tool("pg_basebackup"));
        backup
            .args(["-h", "127.0.0.1", "-p", &self.pg.port.to_string()])
            .args(["-U", "postgres", "-D"])
            .arg(&new)
            // The default, "spread", paces the checkpoint over minutes.
            .args(["--checkpoint=fast", "--wal-method=stream", "--no-sync"]);
        self.pg.run(backup, "pg_basebackup").await?;
        let ended = Utc::now();
        // The log as of the backup would open the restored server's log.
        let _ = std::fs::remove_file(new.join("server.log"));
        let _ = std::fs::remove_file(new.join(RECOVERY_CONF));
        let base = self.base_dir();
        if base.exists() {
            std::fs::remove_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
        }
        std::fs::rename(&new, &base).map_err(|e| format!("{}: {e}", base.display()))?;
        *self.base_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(ended);
        Ok(ended)
    }

    /// Destroys the database and restores it to `target`: the server is
    /// stopped at once (`pg_ctl stop -m immediate`: nothing more is
    /// archived), its data directory deleted, the base backup copied in,
    /// and the archived WAL replayed up to the last commit at or before
    /// `target`; then the server is promoted onto a new timeline, and this
    /// returns once it accepts writes and the new timeline's history file
    /// is archived (which the next restore needs to choose the timeline
    /// after it).
    ///
    /// `target` must be after the end of the latest base backup
    /// ([`ArchivedCluster::earliest_target`]): PostgreSQL cannot stop a
    /// replay before the backup is consistent ("requested recovery stop
    /// point is before consistent recovery point"), so this refuses such a
    /// target up front. It must also be covered by the archive: a target
    /// later than the last archived commit ends the replay with "recovery
    /// ended before configured recovery target was reached" (the error then
    /// carries the server log's end).
    pub async fn restore_to(&self, target: DateTime<Utc>) -> Result<RestoreReport, String> {
        let Some(base_end) = self.earliest_target() else {
            return Err("no base backup to restore from: call base_backup() first".into());
        };
        if target < base_end {
            return Err(format!(
                "recovery target {target} is before the end of the base backup ({base_end}): \
                 PostgreSQL cannot stop before the backup is consistent; take base backups \
                 more often than the oldest point you restore to"
            ));
        }
        if target > Utc::now() {
            return Err(format!("recovery target {target} is in the future"));
        }
        let started = Instant::now();

        // Destroy: no shutdown checkpoint, no last archiving.
        let dir = &self.pg.dir;
        let pid = postmaster_pid(dir);
        self.pg.stop().await;
        if let Some(pid) = pid.filter(|&pid| alive(pid)) {
            // pg_ctl could not stop it (say its pid file was gone): it would
            // keep the port.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while alive(pid) {
                if Instant::now() > deadline {
                    return Err(format!("postmaster {pid} survives SIGKILL"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let n = self.restores.fetch_add(1, Ordering::Relaxed) + 1;
        let kept = self
            .root
            .join("logs")
            .join(format!("server.before-restore-{n}.log"));
        let _ = std::fs::rename(self.pg.log(), &kept);
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }

        // Restore: the base backup, and what to replay from the archive.
        let mut copy = self.pg.tool("cp");
        copy.arg("-a").arg(self.base_dir()).arg(dir);
        self.pg.run(copy, "copying the base backup").await?;
        let settings = format!(
            "# Written by oncepay-testkit's pitr::restore_to; deleted once promoted.\n\
             restore_command = {}\n\
             recovery_target_time = '{}'\n\
             recovery_target_action = 'promote'\n\
             recovery_target_timeline = 'latest'\n",
            // A missing file ends the replay: no "cp: cannot stat" for it
            // in the log, which would hide the log's useful lines.
            conf_quote(&format!(
                "test -f {f} && cp {f} %p",
                f = archived_file(&self.archive_dir())
            )),
            // What PostgreSQL parses as a timestamptz, to the microsecond
            // of commit timestamps, in UTC whatever the server's TimeZone.
            target.format("%Y-%m-%d %H:%M:%S%.6f+00"),
        );
        for (name, text) in [(RECOVERY_CONF, settings.as_str()), ("recovery.signal", "")] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            if is_root() {
                let mut chown = tokio::process::Command::new("chown");
                chown.arg("postgres").arg(&path);
                self.pg.run(chown, "chown").await?;
            }
        }
        self.pg
            .start()
            .await
            .map_err(|e| self.recovery_error(format!("restore to {target}: {e}")))?;
        let deadline = Instant::now() + PROMOTION_LIMIT;
        loop {
            if postmaster_pid(dir).is_none() {
                return Err(self.recovery_error(format!(
                    "restore to {target}: the server stopped during recovery"
                )));
            }
            if let Ok(false) = self.scalar::<bool>("SELECT pg_is_in_recovery()").await {
                break;
            }
            if Instant::now() > deadline {
                return Err(self.recovery_error(format!(
                    "restore to {target}: still in recovery after {PROMOTION_LIMIT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Promoted (PostgreSQL removed recovery.signal): later restarts
        // must not see the target again.
        let conf = dir.join(RECOVERY_CONF);
        std::fs::remove_file(&conf).map_err(|e| format!("{}: {e}", conf.display()))?;

        let timeline = self.timeline().await?;
        let last_replayed_commit: Option<DateTime<Utc>> = self
            .scalar("SELECT pg_last_xact_replay_timestamp()")
            .await?;
        let history = self.archive_dir().join(format!("{timeline:08X}.history"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !history.exists() {
            if Instant::now() > deadline {
                return Err(self.with_log(format!(
                    "{} not archived 30 s after the promotion",
                    history.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(RestoreReport {
            timeline,
            took: started.elapsed(),
            last_replayed_commit,
        })
    }

    /// `what`, with a hint for PostgreSQL's usual reasons and the log's end.
    fn recovery_error(&self, what: String) -> String {
        let log = tail(&self.pg.log(), 30);
        let hint = if log.contains("before configured recovery target was reached") {
            "\nhint: the archive ends before the target; WAL reaches the archive up to \
             archive_timeout after it is written and whatever was not archived when the \
             server was destroyed is lost: choose an older target"
        } else if log.contains("before consistent recovery point") {
            "\nhint: the target is before the end of the base backup"
        } else {
            ""
        };
        format!(
            "{what}{hint}\n--- end of {} ---\n{log}",
            self.pg.log().display()
        )
    }
}
