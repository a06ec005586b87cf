//! The stack under test: a fresh database, the sandbox and `oncepay serve`,
//! started from the release binaries next to this one; and the database
//! dropped when the run is over.

use std::process::Stdio;
use std::time::Duration;

use oncepay_testkit::ports::free_port;
use oncepay_testkit::processes::sibling_binary;
use oncepay_testkit::ready::until_ready;
use sqlx::PgPool;
use tokio::process::{Child, Command};

/// A running sandbox and service on a fresh database.
pub struct Stack {
    /// `http://127.0.0.1:PORT` of oncepay.
    pub base: String,
    /// `http://127.0.0.1:PORT` of the sandbox.
    pub sandbox: String,
    /// The fresh database's URL.
    pub db_url: String,
    /// The bench merchant's API key.
    pub api_key: String,
    /// The `oncepay serve` process.
    pub serve: Child,
    sandbox_process: Child,
}

/// How a stack differs from the default one.
#[derive(Debug, Default)]
pub struct Variant {
    /// The URL `oncepay serve` reaches the database by (through a proxy,
    /// say); `None`: the same as everyone.
    pub serve_db_url: Option<String>,
    /// More variables for the sandbox.
    pub sandbox_env: Vec<(String, String)>,
}

impl Stack {
    /// Creates `database` on `pg_server`, a merchant and key, and starts both servers.
    pub async fn start(
        pg_server: &str,
        database: &str,
        serve_env: &[(String, String)],
    ) -> Result<Stack, String> {
        Stack::start_as(pg_server, database, serve_env, Variant::default()).await
    }

    /// [`Stack::start`], with the differences `variant` names.
    pub async fn start_as(
        pg_server: &str,
        database: &str,
        serve_env: &[(String, String)],
        variant: Variant,
    ) -> Result<Stack, String> {
        let bin = sibling_binary("oncepay")?;
        let db_url = format!("{pg_server}/{database}");
        oncepay::store::prepare_database(&db_url)
            .await
            .map_err(|e| e.to_string())?;
        let pool = oncepay::store::pool(&db_url, 1).map_err(|e| e.to_string())?;
        let api_key = oncepay::api_keys::create(&pool, "bench")
            .await
            .map_err(|e| e.to_string())?;
        pool.close().await;
        let (serve_port, sandbox_port) = (free_port()?, free_port()?);
        let base = format!("http://127.0.0.1:{serve_port}");
        let sandbox = format!("http://127.0.0.1:{sandbox_port}");
        let sandbox_child = Command::new(&bin)
            .arg("sandbox")
            .env("ONCEPAY_SANDBOX_BIND", format!("127.0.0.1:{sandbox_port}"))
            .env(
                "ONCEPAY_SANDBOX_WEBHOOK_URL",
                format!("{base}/webhooks/sandbox"),
            )
            // With a log, its retried deliveries too.
            .env("ONCEPAY_LOG", if logged() { "info" } else { "warn" })
            .envs(variant.sandbox_env)
            .stdout(Stdio::null())
            .stderr(log_to(database, "sandbox"))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting the sandbox: {e}"))?;
        let mut serve = Command::new(&bin);
        serve
            .arg("serve")
            .env(
                "DATABASE_URL",
                variant.serve_db_url.as_deref().unwrap_or(&db_url),
            )
            .env("ONCEPAY_BIND", format!("127.0.0.1:{serve_port}"))
            .env("ONCEPAY_PROVIDER_URL", &sandbox)
            // The bench measures the service's capacity, not the limiter.
            .env("ONCEPAY_RATE_LIMIT_PER_SECOND", "0")
            .stdout(Stdio::null())
            .stderr(log_to(database, "serve"))
            .kill_on_drop(true);
        for (k, v) in serve_env {
            serve.env(k, v);
        }
        let serve = serve
            .spawn()
            .map_err(|e| format!("starting oncepay serve: {e}"))?;
        until_ready(&format!("{sandbox}/healthz"), Duration::from_secs(15)).await?;
        until_ready(&format!("{base}/readyz"), Duration::from_secs(15)).await?;
        Ok(Stack {
            base,
            sandbox,
            db_url,
            api_key,
            serve,
            sandbox_process: sandbox_child,
        })
    }

    /// The processes a [`crate::cpu::Meter`] tells apart.
    pub fn watched(&self) -> crate::cpu::Watched {
        crate::cpu::Watched {
            serve: self.serve.id(),
            sandbox: self.sandbox_process.id(),
        }
    }

    /// Current and peak resident memory of `oncepay serve`, in KiB.
    pub fn memory_kib(&self) -> Option<(u64, u64)> {
        let pid = self.serve.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }
}

/// Where a process of the stack logs: `BENCH_LOG_DIR/<database>-<name>.log`
/// when `BENCH_LOG_DIR` is set (to read why a run stalled or retried;
/// `ONCEPAY_LOG` sets the service's level), else nowhere.
fn log_to(database: &str, name: &str) -> Stdio {
    let Some(dir) = std::env::var_os("BENCH_LOG_DIR").filter(|_| logged()) else {
        return Stdio::null();
    };
    let path = std::path::Path::new(&dir).join(format!("{database}-{name}.log"));
    match std::fs::File::create(&path) {
        Ok(file) => Stdio::from(file),
        Err(e) => {
            eprintln!("cannot log to {}: {e}", path.display());
            Stdio::null()
        }
    }
}

fn logged() -> bool {
    std::env::var_os("BENCH_LOG_DIR").is_some_and(|d| !d.is_empty())
}

/// Drops a bench database (they are disposable; runs must not pile up).
pub async fn drop_database(pg_server: &str, database: &str) {
    if let Ok(admin) = PgPool::connect(&format!("{pg_server}/postgres")).await {
        let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&admin)
            .await;
        admin.close().await;
    }
}
