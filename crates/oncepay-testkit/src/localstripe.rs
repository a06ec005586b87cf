//! localstripe, a stateful fake Stripe nobody here wrote (PyPI; a test
//! tool, never shipped), run for one test: on 127.0.0.1 only, on a free
//! port, keeping its store in memory (its own command line binds every
//! interface and pickles to a shared `/tmp/localstripe.pickle`). What it
//! does and does not do like Stripe: `docs/providers/localstripe.md`.
//!
//! `make localstripe` (and so `make test` and `.ci/run`) installs it into
//! `target/localstripe-venv`; `ONCEPAY_LOCALSTRIPE_PYTHON` names another
//! interpreter that has it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// The launcher that binds loopback and keeps the store in memory.
const LAUNCHER: &str = include_str!("../assets/run_localstripe.py");

/// The Python interpreter that has localstripe installed.
pub fn python() -> PathBuf {
    match std::env::var_os("ONCEPAY_LOCALSTRIPE_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/localstripe-venv/bin/python"),
    }
}

/// Whether localstripe can be started here.
pub fn available() -> bool {
    python().exists()
}

/// A running localstripe, stopped when dropped.
pub struct LocalStripe {
    url: String,
    _process: tokio::process::Child,
}

impl LocalStripe {
    /// Starts localstripe on a free loopback port and waits until it
    /// answers.
    pub async fn start() -> Result<LocalStripe, String> {
        let python = python();
        if !python.exists() {
            return Err(format!(
                "no localstripe at {} (run `make localstripe`, or set ONCEPAY_LOCALSTRIPE_PYTHON)",
                python.display()
            ));
        }
        let mut process = tokio::process::Command::new(&python)
            .arg("-c")
            .arg(LAUNCHER)
            .arg("0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
        let port = crate::ready::announced_port(&mut process, Duration::from_secs(30))
            .await
            .ok_or("localstripe did not say which port it listens on")?;
        let url = format!("http://127.0.0.1:{port}");
        // Any answer (a 401 without a key) means it is serving.
        let client = reqwest::Client::new();
        crate::ready::until(Duration::from_secs(20), || async {
            client.get(format!("{url}/v1/balance")).send().await.is_ok()
        })
        .await
        .map_err(|waited| format!("localstripe did not answer within {waited:?}"))?;
        Ok(LocalStripe {
            url,
            _process: process,
        })
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }
}
