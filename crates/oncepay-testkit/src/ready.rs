//! Bounded waiting: for a server to answer, or for a condition to hold.
//! Never a fixed sleep: each loop polls with a short pause and gives up
//! with an error after its bound.

use std::future::Future;
use std::time::{Duration, Instant};

/// The port a child process announces on its standard output as a line
/// `PORT <n>` (our Python launchers bind port 0 and say which port they
/// got), within `patience`.
pub async fn announced_port(child: &mut tokio::process::Child, patience: Duration) -> Option<u16> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let stdout = child.stdout.take()?;
    let mut lines = BufReader::new(stdout).lines();
    tokio::time::timeout(patience, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(port) = line.strip_prefix("PORT ") {
                return port.trim().parse::<u16>().ok();
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// Waits until `GET url` answers 2xx, for up to `patience`.
pub async fn until_ready(url: &str, patience: Duration) -> Result<(), String> {
    let client = reqwest::Client::new();
    until(patience, || async {
        client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await
    .map_err(|waited| format!("{url} did not answer 2xx within {waited:?}"))
}

/// Polls `check` every 50 ms until it returns true, for up to `patience`;
/// `Err` carries how long it waited.
pub async fn until<F, Fut>(patience: Duration, mut check: F) -> Result<(), Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return Ok(());
        }
        if started.elapsed() >= patience {
            return Err(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` every 50 ms until it yields `Some`, for up to `patience`.
pub async fn until_some<T, F, Fut>(patience: Duration, mut probe: F) -> Result<T, Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if started.elapsed() >= patience {
            return Err(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
