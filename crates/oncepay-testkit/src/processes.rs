//! The processes a harness starts and breaks: a private PostgreSQL cluster
//! (so restarting it disturbs nothing else) and restartable `oncepay`
//! children (the sandbox, serve processes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::ports::free_port;

/// The binary `name` built beside the running one (`target/<profile>/`):
/// how the bench and the chaos harness find `oncepay`.
pub fn sibling_binary(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let bin = me.with_file_name(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build the workspace's binaries first (`cargo build --bins`, or `--release`)",
            bin.display()
        ))
    }
}

pub(crate) fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// A PostgreSQL cluster in a temporary folder on a free port. PostgreSQL
/// refuses to run as root, so as root its tools run as user `postgres`.
pub struct PgCluster {
    pub(crate) dir: PathBuf,
    /// Its port.
    pub port: u16,
}

impl PgCluster {
    pub(crate) fn tool(&self, name: &str) -> Command {
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", name]);
            c
        } else {
            Command::new(name)
        }
    }

    pub(crate) async fn run(&self, mut cmd: Command, what: &str) -> Result<(), String> {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("{what}: {e} (are initdb and pg_ctl on the PATH?)"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `initdb` into `root/pg` and start it.
    pub async fn create(root: &Path) -> Result<PgCluster, String> {
        let dir = root.join("pg");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let cluster = PgCluster {
            dir,
            port: free_port()?,
        };
        if is_root() {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres"]).arg(root);
            cluster.run(chown, "chown").await?;
        }
        let mut init = cluster.tool("initdb");
        init.arg("-D")
            .arg(&cluster.dir)
            .args(["-U", "postgres", "-A", "trust", "--no-sync"]);
        cluster.run(init, "initdb").await?;
        let mut cluster = cluster;
        cluster.start_on_a_free_port().await?;
        Ok(cluster)
    }

    /// Starts a new cluster; a port that another process took between
    /// `free_port` and the server's bind (tests start clusters at once)
    /// is given up for another, a few times.
    pub(crate) async fn start_on_a_free_port(&mut self) -> Result<(), String> {
        let mut tries = 0;
        loop {
            match self.start().await {
                Ok(()) => return Ok(()),
                Err(e) if tries < 3 => {
                    tries += 1;
                    eprintln!(
                        "PostgreSQL did not start on port {} ({e}); another port",
                        self.port
                    );
                    self.port = free_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The server's log (it lives in the data directory).
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn ctl(&self, action: &str) -> Command {
        let mut c = self.tool("pg_ctl");
        c.arg("-D")
            .arg(&self.dir)
            .args(["-w", "-t", "60", "-l"])
            .arg(self.log());
        c.args([
            "-o",
            &format!(
                "-p {} -c listen_addresses=127.0.0.1 -k /tmp -c max_connections=200",
                self.port
            ),
        ]);
        c.arg(action);
        c
    }

    /// Starts the server.
    pub async fn start(&self) -> Result<(), String> {
        self.run(self.ctl("start"), "pg_ctl start").await
    }

    /// Restarts the server; `crash` stops it the way a power cut would
    /// (`-m immediate`: recovery from the WAL on start).
    pub async fn restart(&self, crash: bool) -> Result<(), String> {
        let mut c = self.ctl("restart");
        c.args(["-m", if crash { "immediate" } else { "fast" }]);
        self.run(c, "pg_ctl restart").await
    }

    /// A URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Stops the server at once.
    pub async fn stop(&self) {
        let mut c = self.tool("pg_ctl");
        c.arg("-D")
            .arg(&self.dir)
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = self.run(c, "pg_ctl stop").await;
    }
}

/// A restartable `oncepay` child process on a fixed port.
pub struct Service {
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    /// Its base URL.
    pub base: String,
}

impl Service {
    /// A service that runs `oncepay <args>` with `env` on `port`.
    pub fn new(
        bin: &Path,
        args: &[&str],
        env: Vec<(String, String)>,
        base: String,
        log: PathBuf,
    ) -> Service {
        Service {
            bin: bin.to_path_buf(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            log,
            child: None,
            base,
        }
    }

    /// Starts it and waits until `ready` answers 2xx.
    pub async fn start(&mut self, ready: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        self.child = Some(
            cmd.spawn()
                .map_err(|e| format!("starting {:?}: {e}", self.args))?,
        );
        crate::ready::until_ready(&format!("{}{ready}", self.base), Duration::from_secs(30))
            .await
            .map_err(|e| format!("{:?}: {e}", self.args))
    }

    /// SIGKILL: no goodbye, no cleanup, as when a machine dies.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}
