//! A real high-availability PostgreSQL stack on loopback, for the failover
//! test and `make chaos-ha`: one etcd member, two or three PostgreSQL
//! nodes managed by Patroni, and HAProxy sending connections to whichever
//! node Patroni's REST API reports as primary. All from Debian's packages
//! (`patroni`, `etcd-server`, `haproxy`), in a temporary folder, on free
//! ports, torn down when dropped.
//!
//! Timing is tightened for a harness (`ttl` 10 s, `loop_wait` 1 s,
//! `retry_timeout` 3 s; HAProxy checks every 500 ms and cuts the sessions
//! of a node it marks down); production values are in the README.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::ports::free_port;

/// What the stack needs on the machine, or why it cannot start here.
pub fn available() -> Result<PathBuf, String> {
    for tool in ["patroni", "etcd", "haproxy", "setpriv"] {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!(
                "`{tool}` is not on the PATH (apt-get install patroni etcd-server haproxy)"
            ));
        }
    }
    pg_bin_dir()
}

/// The newest installed PostgreSQL's `bin` folder (Debian's layout).
fn pg_bin_dir() -> Result<PathBuf, String> {
    let base = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<u32> = std::fs::read_dir(base)
        .map_err(|e| format!("{}: {e}", base.display()))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let bin = base
        .join(
            versions
                .last()
                .ok_or("no PostgreSQL under /usr/lib/postgresql")?
                .to_string(),
        )
        .join("bin");
    if bin.join("postgres").is_file() {
        Ok(bin)
    } else {
        Err(format!("no postgres in {}", bin.display()))
    }
}

/// How to build the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// PostgreSQL nodes (2 or 3).
    pub nodes: usize,
    /// Patroni's `synchronous_mode`: a standby is promoted only if it holds
    /// every acknowledged commit. `false` is the misconfiguration the
    /// harness demonstrates.
    pub synchronous: bool,
}

/// One Patroni-managed PostgreSQL node.
struct Node {
    name: String,
    dir: PathBuf,
    pg_port: u16,
    rest_port: u16,
    patroni: Option<Child>,
}

impl Node {
    fn config(&self) -> PathBuf {
        self.dir.join("patroni.yml")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The postmaster's pid, from its pid file.
    fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }
}

/// A running cluster.
pub struct HaCluster {
    root: PathBuf,
    etcd: Child,
    haproxy: Child,
    nodes: Vec<Node>,
    /// HAProxy's port: the address the service connects to.
    pub port: u16,
    options: Options,
    http: reqwest::Client,
}

fn spawn(cmd: &mut Command, log: &Path) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn signal(pid: i32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl HaCluster {
    /// Starts etcd, the nodes and HAProxy under `root`, and waits until a
    /// primary answers through HAProxy (and, in synchronous mode, until it
    /// has a synchronous standby).
    ///
    /// A start that fails is tried once more from scratch (the failed one's
    /// processes killed and folder removed, new ports): the ports are picked
    /// free but bound only later by etcd, PostgreSQL and HAProxy, so a busy
    /// machine can take one meanwhile. The first failure is printed with
    /// the ends of its logs.
    pub async fn start(root: &Path, options: Options) -> Result<HaCluster, String> {
        match HaCluster::start_once(root, options).await {
            Ok(cluster) => Ok(cluster),
            Err(first) => {
                eprintln!("the Patroni cluster did not start; starting it again: {first}");
                let _ = std::fs::remove_dir_all(root);
                HaCluster::start_once(root, options)
                    .await
                    .map_err(|second| format!("{second}\n(after a first failure: {first})"))
            }
        }
    }

    async fn start_once(root: &Path, options: Options) -> Result<HaCluster, String> {
        let pg_bin = available()?;
        std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
        let (client, peer) = (free_port()?, free_port()?);
        let etcd_dir = root.join("etcd");
        let mut etcd = Command::new("etcd");
        etcd.args(["--name", "e0", "--data-dir"])
            .arg(&etcd_dir)
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args([
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
            ])
            .args(["--initial-cluster", &format!("e0=http://127.0.0.1:{peer}")])
            .args(["--initial-cluster-state", "new", "--log-level", "warn"]);
        let etcd = spawn(&mut etcd, &root.join("etcd.log"))?;

        let mut nodes = Vec::new();
        for i in 0..options.nodes {
            let dir = root.join(format!("node{i}"));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let node = Node {
                name: format!("node{i}"),
                dir,
                pg_port: free_port()?,
                rest_port: free_port()?,
                patroni: None,
            };
            std::fs::write(node.config(), patroni_yaml(&node, client, &pg_bin, options))
                .map_err(|e| e.to_string())?;
            nodes.push(node);
        }
        if is_root() {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(root)
                .status()
                .map_err(|e| e.to_string())?;
            if !status.success() {
                return Err("chown of the cluster folder failed".into());
            }
        }
        let port = free_port()?;
        let haproxy_cfg = root.join("haproxy.cfg");
        std::fs::write(&haproxy_cfg, haproxy_cfg_text(port, &nodes)).map_err(|e| e.to_string())?;
        let mut haproxy = Command::new("haproxy");
        haproxy.arg("-db").arg("-f").arg(&haproxy_cfg);
        let haproxy = spawn(&mut haproxy, &root.join("haproxy.log"))?;

        let mut cluster = HaCluster {
            root: root.to_path_buf(),
            etcd,
            haproxy,
            nodes,
            port,
            options,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| e.to_string())?,
        };
        // The first node bootstraps; the others clone it once it leads.
        cluster.start_node(0)?;
        cluster
            .wait_for(Duration::from_secs(90), "a first primary", || async {
                cluster.leader().await.is_some()
            })
            .await?;
        for i in 1..options.nodes {
            cluster.start_node(i)?;
        }
        cluster
            .wait_for(Duration::from_secs(120), "every node streaming", || async {
                cluster.members().await.is_some_and(|m| {
                    m.len() == options.nodes
                        && m.iter()
                            .all(|n| n["state"] == "running" || n["state"] == "streaming")
                })
            })
            .await?;
        cluster.wait_until_healthy(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    fn start_node(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let mut cmd = if is_root() {
            // setpriv execs patroni in place, so the child's pid is
            // Patroni's own and SIGKILL reaches it.
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "patroni",
            ]);
            c
        } else {
            Command::new("patroni")
        };
        cmd.arg(node.config()).env("HOME", &node.dir);
        node.patroni = Some(spawn(&mut cmd, &node.dir.join("patroni.log"))?);
        Ok(())
    }

    /// A URL of database `name` through HAProxy.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// URLs of database `name` on each node that does not lead (directly,
    /// not through HAProxy): where a test looks for what reached standbys.
    pub async fn standby_urls(&self, name: &str) -> Vec<String> {
        let leader = self.leader().await;
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != leader)
            .map(|(_, n)| format!("postgres://postgres@127.0.0.1:{}/{name}", n.pg_port))
            .collect()
    }

    /// Patroni's view of the members, from any node that answers.
    pub async fn members(&self) -> Option<Vec<Value>> {
        for node in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", node.rest_port);
            if let Ok(r) = self.http.get(&url).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    if let Some(members) = v["members"].as_array() {
                        return Some(members.clone());
                    }
                }
            }
        }
        None
    }

    /// The index of the node that leads, if one does.
    pub async fn leader(&self) -> Option<usize> {
        let members = self.members().await?;
        let name = members
            .iter()
            .find(|m| m["role"] == "leader" && m["state"] == "running")?["name"]
            .as_str()?
            .to_string();
        self.nodes.iter().position(|n| n.name == name)
    }

    async fn wait_for<F, Fut>(&self, limit: Duration, what: &str, check: F) -> Result<(), String>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        while started.elapsed() < limit {
            if check().await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!(
            "the Patroni cluster never reached {what} in {limit:?} (logs in {}, removed when the cluster drops; their ends:){}",
            self.root.display(),
            self.log_tails()
        ))
    }

    /// The last lines of every log under the cluster's folder: the folder
    /// is removed when the cluster drops, and a CI run shows only what the
    /// failing test printed.
    fn log_tails(&self) -> String {
        const LINES: usize = 20;
        let mut logs = Vec::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "log") {
                    logs.push(path);
                }
            }
        }
        logs.sort();
        let mut out = String::new();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LINES)..];
            out.push_str(&format!("\n--- {}\n{}", log.display(), tail.join("\n")));
        }
        out
    }

    /// Waits until a write commits through HAProxy.
    pub async fn wait_until_writable(&self, limit: Duration) -> Result<(), String> {
        let url = self.url("postgres");
        self.wait_for(limit, "a writable primary behind HAProxy", || {
            let url = url.clone();
            async move {
                let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await
                else {
                    return false;
                };
                sqlx::query_scalar::<_, bool>("SELECT NOT pg_is_in_recovery()")
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or(false)
            }
        })
        .await
    }

    /// A planned switchover (`POST /switchover` to the leader, Patroni
    /// choosing the candidate, as `patronictl switchover --force` does);
    /// returns the old leader once another node leads.
    pub async fn switchover(&self) -> Result<usize, String> {
        self.wait_until_healthy(Duration::from_secs(60)).await?;
        let old = self.leader().await.ok_or("no leader to switch over from")?;
        let node = &self.nodes[old];
        let r = self
            .http
            .post(format!("http://127.0.0.1:{}/switchover", node.rest_port))
            .json(&serde_json::json!({"leader": node.name}))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| format!("switchover: {e}"))?;
        if !r.status().is_success() {
            let status = r.status();
            return Err(format!(
                "switchover refused: {status} {}",
                r.text().await.unwrap_or_default()
            ));
        }
        self.wait_for(Duration::from_secs(60), "a new leader", || async {
            self.leader().await.is_some_and(|l| l != old)
        })
        .await?;
        Ok(old)
    }

    /// An unplanned failover: the leader's Patroni and its postmaster die
    /// at once (SIGKILL), as when its machine does. Returns the dead node;
    /// [`HaCluster::revive`] brings it back as a standby.
    pub async fn kill_leader(&mut self) -> Result<usize, String> {
        let old = self.leader().await.ok_or("no leader to kill")?;
        let node = &mut self.nodes[old];
        if let Some(mut patroni) = node.patroni.take() {
            let _ = patroni.start_kill();
            let _ = patroni.wait().await;
        }
        if let Some(pid) = node.postmaster_pid() {
            signal(pid, "-KILL");
        }
        Ok(old)
    }

    /// Waits up to `limit` for a node other than `old` to lead; false if
    /// none did.
    pub async fn wait_for_leader_other_than(&self, old: usize, limit: Duration) -> bool {
        self.wait_for(limit, "a new leader", || async {
            self.leader().await.is_some_and(|l| l != old)
        })
        .await
        .is_ok()
    }

    /// SIGKILLs the leader's postmaster alone: Patroni, still holding the
    /// leader key, restarts it (crash recovery) or hands over.
    pub async fn kill_leader_postmaster(&self) -> Result<usize, String> {
        let leader = self.leader().await.ok_or("no leader")?;
        let pid = self.nodes[leader]
            .postmaster_pid()
            .ok_or("the leader has no postmaster.pid")?;
        signal(pid, "-KILL");
        Ok(leader)
    }

    /// Starts a killed node's Patroni again: it rejoins as a standby
    /// (rewinding its data if it diverged).
    pub fn revive(&mut self, node: usize) -> Result<(), String> {
        if self.nodes[node].patroni.is_none() {
            // Leftovers of the killed postmaster's children die too.
            if let Some(pid) = self.nodes[node].postmaster_pid() {
                signal(pid, "-KILL");
            }
            self.start_node(node)?;
        }
        Ok(())
    }

    /// Leaves every standby behind: its startup process (which would start
    /// a new WAL receiver) is frozen with SIGSTOP and its WAL receiver
    /// ended with SIGTERM, so the primary goes on acknowledging commits
    /// that reach no standby: the fault that makes asynchronous replication
    /// lose them. (Pausing the receiver alone is not enough: the primary's
    /// WAL would wait in the socket's buffer and arrive on resume.) Returns
    /// the frozen processes, for [`HaCluster::resume_recovery`].
    pub async fn stop_replication(&self) -> Result<Vec<i32>, String> {
        let mut frozen = Vec::new();
        for node in &self.nodes {
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", node.pg_port);
            let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await else {
                continue;
            };
            let pids: Vec<(i32, String)> = sqlx::query_as(
                "SELECT pid, backend_type FROM pg_stat_activity
                  WHERE backend_type IN ('startup', 'walreceiver') ORDER BY backend_type",
            )
            .fetch_all(&mut conn)
            .await
            .unwrap_or_default();
            // The startup process first, so it cannot start a new receiver.
            for (pid, kind) in pids {
                if kind == "startup" {
                    signal(pid, "-STOP");
                    frozen.push(pid);
                } else {
                    signal(pid, "-TERM");
                }
            }
        }
        Ok(frozen)
    }

    /// Thaws the processes [`HaCluster::stop_replication`] froze.
    pub fn resume_recovery(&self, frozen: &[i32]) {
        for pid in frozen {
            signal(*pid, "-CONT");
        }
    }

    /// Waits until every node runs again, one leads (with a synchronous
    /// standby, in synchronous mode) and a write commits behind HAProxy.
    pub async fn wait_until_healthy(&self, limit: Duration) -> Result<(), String> {
        let n = self.nodes.len();
        let synchronous = self.options.synchronous;
        self.wait_for(limit, "every node running again", || async {
            self.members().await.is_some_and(|m| {
                m.len() == n
                    && m.iter()
                        .all(|x| x["state"] == "running" || x["state"] == "streaming")
                    && m.iter().any(|x| x["role"] == "leader")
                    && (!synchronous || m.iter().any(|x| x["role"] == "sync_standby"))
            })
        })
        .await?;
        self.wait_until_writable(limit).await
    }

    /// Stops everything (also done, less tidily, on drop).
    pub async fn stop(mut self) {
        for node in &mut self.nodes {
            if let Some(mut patroni) = node.patroni.take() {
                let _ = patroni.start_kill();
                let _ = patroni.wait().await;
            }
            if let Some(pid) = node.postmaster_pid() {
                signal(pid, "-KILL");
            }
        }
        let _ = self.haproxy.start_kill();
        let _ = self.haproxy.wait().await;
        let _ = self.etcd.start_kill();
        let _ = self.etcd.wait().await;
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        // The patroni children die by kill_on_drop; their postmasters
        // would outlive them.
        for node in &mut self.nodes {
            if let Some(patroni) = node.patroni.as_mut() {
                let _ = patroni.start_kill();
            }
            if let Some(pid) = node.postmaster_pid() {
                signal(pid, "-KILL");
            }
        }
        let _ = self.haproxy.start_kill();
        let _ = self.etcd.start_kill();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn patroni_yaml(node: &Node, etcd_port: u16, pg_bin: &Path, options: Options) -> String {
    let dir = node.dir.display();
    format!(
        r#"scope: oncepay-harness
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: {max_lag}
    synchronous_mode: {sync}
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        max_connections: 200
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {dir}/data
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: harness
    replication:
      username: postgres
      password: harness
    rewind:
      username: postgres
      password: harness
  parameters:
    unix_socket_directories: {dir}
    fsync: "off"
watchdog:
  mode: "off"
tags:
  nofailover: false
  noloadbalance: false
"#,
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        bin = pg_bin.display(),
        sync = options.synchronous,
        // Asynchronous mode must be allowed to promote a standby however
        // far behind it is: that is the loss the harness shows.
        max_lag = if options.synchronous {
            1_048_576u64
        } else {
            1u64 << 40
        },
    )
}

fn haproxy_cfg_text(port: u16, nodes: &[Node]) -> String {
    let mut servers = String::new();
    for n in nodes {
        servers.push_str(&format!(
            "  server {} 127.0.0.1:{} check port {}\n",
            n.name, n.pg_port, n.rest_port
        ));
    }
    format!(
        "global\n  maxconn 2000\n\
         defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30m\n  timeout server 30m\n  timeout check 1s\n\
         listen primary\n  bind 127.0.0.1:{port}\n  option httpchk GET /primary\n  http-check expect status 200\n\
         \x20 default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n{servers}"
    )
}
