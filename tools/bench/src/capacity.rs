//! What pay's capacity probes found, as the probes (`pay`) make it and
//! the report (`report`) prints it: the data both read, so neither
//! imports the other's.

use crate::load::Outcome;
use crate::{cpu, disk};

/// A scenario's capacity: the highest constant rate it holds for
/// `--sustain` with p99 under [`CAPACITY_P99_MS`], every request answered
/// 2xx and its deferred work keeping up; and every probe made.
pub struct Capacity {
    pub held: Option<(f64, Outcome)>,
    pub probes: Vec<Probe>,
}

/// The latency a rate must hold to count as sustained.
pub const CAPACITY_P99_MS: f64 = 25.0;

/// One capacity probe: the rate asked and achieved, its p99, and how its
/// seconds' p99s spread (a worst second far above the median is a stall,
/// not a rate the service cannot hold).
pub struct Probe {
    pub asked: f64,
    pub achieved: f64,
    pub p99: f64,
    pub seconds_median: f64,
    pub seconds_worst: f64,
    pub held: bool,
    /// CPU per request, ms, webhooks included.
    pub cpu: cpu::Cpu,
    /// The disk's flushes meanwhile ([`disk`]).
    pub flushes: Option<disk::Flushes>,
}
