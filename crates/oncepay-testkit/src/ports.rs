//! Free loopback ports for servers the harness starts on fixed addresses.

use std::net::TcpListener;

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}
