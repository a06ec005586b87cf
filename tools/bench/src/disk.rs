//! A witness of the disk's flush latency while a run lasts: every 10 ms it
//! writes 8 KiB to a file of its own and waits for `fdatasync`, as a
//! commit waits for the WAL's flush.
//!
//! Why: pay's capacity is the highest rate whose p99 stays under 25 ms for
//! 30 s, so one stalled second decides it. Every commit waits for a flush;
//! when the disk takes 40 ms to flush 8 KiB, every payment of that moment
//! waits too, whatever the service does. Printed beside each probe, the
//! disk's worst flush tells such a stall from one of the service's own.
//! The file lives in the system's temporary directory: the witness speaks
//! for PostgreSQL's disk only where they share one (as on the bench's
//! machine; the report says where it wrote).

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the witness flushes.
const EVERY: Duration = Duration::from_millis(10);

/// What the witness saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Flushes {
    /// How many flushes it timed.
    pub count: usize,
    /// The median flush, ms.
    pub median_ms: f64,
    /// The slowest flush, ms.
    pub worst_ms: f64,
    /// Flushes slower than 20 ms.
    pub over_20_ms: usize,
}

/// A witness running until [`Witness::stop`].
pub struct Witness {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
    path: PathBuf,
}

impl Witness {
    /// Starts flushing; `None` when its file cannot be made (the run goes
    /// on without a witness).
    pub fn start() -> Option<Witness> {
        let path = std::env::temp_dir().join(format!("oncepay-bench-flush-{}", std::process::id()));
        let mut file = std::fs::File::create(&path).ok()?;
        let page = [0x5au8; 8192];
        // Sixteen pages, so each write overwrites a block already allocated
        // (a commit's flush, not a file growing).
        for _ in 0..16 {
            file.write_all(&page).ok()?;
        }
        file.sync_all().ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut times = Vec::new();
            let mut n = 0u64;
            while !stopped.load(Ordering::Relaxed) {
                let started = Instant::now();
                let flushed = file
                    .write_at(&page, (n % 16) * 8192)
                    .and_then(|_| file.sync_data());
                if flushed.is_err() {
                    break;
                }
                times.push(started.elapsed().as_secs_f64() * 1000.0);
                n += 1;
                std::thread::sleep(EVERY);
            }
            times
        });
        Some(Witness { stop, thread, path })
    }

    /// Stops it and says what it saw.
    pub fn stop(self) -> Flushes {
        self.stop.store(true, Ordering::Relaxed);
        let times = self.thread.join().unwrap_or_default();
        let _ = std::fs::remove_file(&self.path);
        summary(times)
    }
}

fn summary(mut times: Vec<f64>) -> Flushes {
    times.sort_by(f64::total_cmp);
    Flushes {
        count: times.len(),
        median_ms: times.get(times.len() / 2).copied().unwrap_or(0.0),
        worst_ms: times.last().copied().unwrap_or(0.0),
        over_20_ms: times.iter().filter(|ms| **ms > 20.0).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_witness_times_flushes_while_it_runs_and_removes_its_file() {
        let witness = Witness::start().expect("a file in the temporary directory");
        let path = witness.path.clone();
        assert!(path.exists());
        std::thread::sleep(Duration::from_millis(120));
        let seen = witness.stop();
        assert!(seen.count >= 1, "flushes timed: {}", seen.count);
        assert!(seen.worst_ms >= seen.median_ms && seen.median_ms > 0.0);
        assert!(!path.exists(), "its file is removed");
    }

    #[test]
    fn the_summary_counts_slow_flushes() {
        let seen = summary(vec![0.3, 45.0, 0.2, 21.0, 0.4]);
        assert_eq!(seen.count, 5);
        assert_eq!(seen.over_20_ms, 2);
        assert_eq!(seen.worst_ms, 45.0);
        assert_eq!(seen.median_ms, 0.4);
    }
}
