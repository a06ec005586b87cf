//! The load driver, two ways:
//!
//! - closed loop ([`run`]): `connections` tasks, each sending its next
//!   request as soon as the previous answer arrived — the maximum rate, but
//!   at saturation its latencies are queueing, not service time;
//! - open loop ([`run_open`]): requests sent at a constant rate whatever
//!   the answers do, each one's latency measured from when it *should* have
//!   been sent (coordinated omission corrected, as wrk2 does), so a stall
//!   shows in every request it delayed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// What a run measured.
pub struct Outcome {
    /// Answers by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Transport errors (no answer).
    pub errors: u64,
    /// The first transport error's text, to tell a lost connection from a
    /// timeout.
    pub first_error: Option<String>,
    /// Answers marked `Idempotent-Replayed: true`; the rest executed.
    pub replayed: u64,
    /// Latency of every answered request, in microseconds.
    pub latency: Histogram<u64>,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Open loop: p99 of each second's requests (by scheduled send time),
    /// in ms: whether a tail is spread or comes from a few stalls.
    pub seconds_p99: Vec<f64>,
}

impl Outcome {
    /// Nothing measured yet.
    fn empty() -> Outcome {
        Outcome {
            statuses: BTreeMap::new(),
            errors: 0,
            first_error: None,
            replayed: 0,
            latency: histogram(),
            elapsed: Duration::ZERO,
            seconds_p99: Vec::new(),
        }
    }

    /// Answers per second.
    pub fn rate(&self) -> f64 {
        self.latency.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// Requests that failed: no answer, or an answer other than 2xx.
    pub fn failures(&self) -> u64 {
        let non_2xx: u64 = self
            .statuses
            .iter()
            .filter(|(s, _)| !(200..300).contains(*s))
            .map(|(_, n)| n)
            .sum();
        self.errors + non_2xx
    }

    /// Answers with this status.
    pub fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }

    /// A latency quantile in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1000.0
    }
}

/// Builds request number `n` of connection `c`.
pub type MakeRequest =
    Arc<dyn Fn(&reqwest::Client, usize, u64) -> reqwest::RequestBuilder + Send + Sync>;

fn histogram() -> Histogram<u64> {
    // 1 µs to 60 s, 3 significant digits; these bounds are valid constants.
    Histogram::new_with_bounds(1, 60_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

/// The driver's HTTP client, keeping up to `connections` idle. It drops a
/// connection idle for 4 s, before the service's keep-alive (actix's
/// default, 5 s) closes it: a request written on a connection the server
/// is closing at that moment gets no answer, which a probe counts as a
/// failure. At an open loop's moderate rates most of the pooled
/// connections sit idle for seconds while a few carry the load.
fn client(connections: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .pool_idle_timeout(Duration::from_secs(4))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default()
}

/// The text of a transport error with its causes.
fn error_text(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs the load and merges every connection's measurements.
pub async fn run(connections: usize, duration: Duration, make: MakeRequest) -> Outcome {
    let client = client(connections);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let (client, make) = (client.clone(), make.clone());
        tasks.spawn(async move {
            let mut latency = histogram();
            let mut statuses = BTreeMap::new();
            let mut errors = 0u64;
            let mut first_error = None;
            let mut replayed = 0u64;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let sent = Instant::now();
                match make(&client, c, n).send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        replayed +=
                            u64::from(response.headers().contains_key("idempotent-replayed"));
                        let _ = response.bytes().await;
                        let _ = latency.record(sent.elapsed().as_micros() as u64);
                        *statuses.entry(status).or_insert(0) += 1;
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| error_text(&e));
                    }
                }
                n += 1;
            }
            (latency, statuses, (errors, first_error), replayed)
        });
    }
    let mut outcome = Outcome::empty();
    while let Some(Ok((latency, statuses, (errors, first_error), replayed))) =
        tasks.join_next().await
    {
        if outcome.first_error.is_none() {
            outcome.first_error = first_error;
        }
        outcome.replayed += replayed;
        let _ = outcome.latency.add(&latency);
        for (status, n) in statuses {
            *outcome.statuses.entry(status).or_insert(0) += n;
        }
        outcome.errors += errors;
    }
    outcome.elapsed = started.elapsed();
    outcome
}

/// Sends requests at `rate` per second for `duration`, at most `in_flight`
/// at once (a request that finds none free waits, and its wait counts);
/// every latency runs from the request's scheduled send time.
pub async fn run_open(
    rate: f64,
    duration: Duration,
    in_flight: usize,
    make: MakeRequest,
) -> Outcome {
    let client = client(in_flight);
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let started = Instant::now();
    let total = (duration.as_secs_f64() * rate.max(1.0)) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    let mut outcome = Outcome::empty();
    let mut seconds: Vec<Histogram<u64>> = Vec::new();
    for n in 0..total {
        let scheduled = started + interval.mul_f64(n as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        // Finished requests are counted as they finish: a set holding
        // every finished task until the end grew by ~250 bytes a request,
        // a quarter of the driver's CPU went to the allocator, and the
        // driver's CPU per request was 15-20 % higher, taken from the
        // cores it shares with what it measures (BENCHMARKS.md, twelfth
        // round).
        while let Some(done) = tasks.try_join_next() {
            count_open(&mut outcome, &mut seconds, done);
        }
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let request = make(&client, (n as usize) % in_flight.max(1), n);
        tasks.spawn(async move {
            let _permit = permit;
            match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    let _ = response.bytes().await;
                    let second = (scheduled - started).as_secs() as usize;
                    Ok((status, replayed, scheduled.elapsed(), second))
                }
                Err(e) => Err(error_text(&e)),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        count_open(&mut outcome, &mut seconds, done);
    }
    outcome.elapsed = started.elapsed();
    outcome.seconds_p99 = seconds
        .iter()
        .map(|h| h.value_at_quantile(0.99) as f64 / 1000.0)
        .collect();
    outcome
}

/// What one open-loop request ended with: its status, whether it was a
/// replay, its latency from the scheduled send time and that time's
/// second; or the transport error's text.
type OpenDone = Result<(u16, bool, Duration, usize), String>;

/// Counts one finished open-loop request into the run and its second.
fn count_open(
    outcome: &mut Outcome,
    seconds: &mut Vec<Histogram<u64>>,
    done: Result<OpenDone, tokio::task::JoinError>,
) {
    // A task that panicked lost its answer as a transport error does.
    match done.unwrap_or_else(|e| Err(e.to_string())) {
        Ok((status, replayed, latency, second)) => {
            if seconds.len() <= second {
                seconds.resize_with(second + 1, histogram);
            }
            let _ = seconds[second].record(latency.as_micros() as u64);
            *outcome.statuses.entry(status).or_insert(0) += 1;
            outcome.replayed += u64::from(replayed);
            let _ = outcome.latency.record(latency.as_micros() as u64);
        }
        Err(e) => {
            outcome.errors += 1;
            outcome.first_error.get_or_insert(e);
        }
    }
}
