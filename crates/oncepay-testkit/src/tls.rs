//! A real TLS endpoint for tests: a certificate authority and a
//! certificate for `127.0.0.1` made with the `openssl` command, and a
//! Python TLS server (`assets/tls_forward.py`) that forwards to a plain
//! HTTP upstream. A client trusts it through `SSL_CERT_FILE` (which the
//! platform-roots loader of rustls honours) pointed at [`TlsForward::ca`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const FORWARDER: &str = include_str!("../assets/tls_forward.py");

/// A running TLS forwarder, stopped when dropped.
pub struct TlsForward {
    url: String,
    ca: PathBuf,
    _dir: TempDir,
    _process: tokio::process::Child,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl TlsForward {
    /// Makes a CA and a certificate for `127.0.0.1`, and starts a TLS
    /// server on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: &str) -> Result<TlsForward, String> {
        let dir = std::env::temp_dir().join(format!("oncepay-tls-{}", uuid_like()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let dir = TempDir(dir);
        let d = &dir.0;
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=oncepay test CA",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        )?;
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "leaf.key",
                "-out",
                "leaf.csr",
            ],
        )?;
        std::fs::write(
            d.join("leaf.ext"),
            "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .map_err(|e| e.to_string())?;
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "leaf.ext",
                "-out",
                "leaf.pem",
            ],
        )?;
        let mut process = tokio::process::Command::new("python3")
            .arg("-c")
            .arg(FORWARDER)
            .arg(upstream.trim_end_matches('/'))
            .arg(d.join("leaf.pem"))
            .arg(d.join("leaf.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start python3: {e}"))?;
        let port = crate::ready::announced_port(&mut process, Duration::from_secs(20))
            .await
            .ok_or("the TLS forwarder did not say which port it listens on")?;
        Ok(TlsForward {
            url: format!("https://127.0.0.1:{port}"),
            ca: d.join("ca.pem"),
            _dir: dir,
            _process: process,
        })
    }

    /// Its base URL (`https://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA certificate (PEM) that signed its certificate.
    pub fn ca(&self) -> &Path {
        &self.ca
    }
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}
