//! `make chaos-ha`: the soak on PostgreSQL under Patroni. Besides the usual
//! faults, a driver fails the database over on its own clock — planned
//! switchovers, the primary's machine dying (Patroni and postmaster
//! SIGKILLed together), the primary's postmaster crashing alone — and a
//! probe writes through the service all along, so each failover's window
//! without a successful write can be measured.
//!
//! With `--async-replication` (the misconfiguration docs/operations.md warns
//! about) every failover first lets the standbys fall behind (their WAL
//! receivers stopped, their startup processes frozen) while the primary
//! keeps acknowledging commits, then
//! kills the primary: the promoted standby lacks what was acknowledged,
//! and the invariants show what that costs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use oncepay_testkit::patroni::HaCluster;
use tokio::sync::Mutex;

/// The kinds of failover, in the order the driver cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failover {
    /// `POST /switchover` to the leader (what `patronictl switchover` does).
    Switchover,
    /// The primary's Patroni and postmaster SIGKILLed at once.
    PrimaryDied,
    /// The primary's postmaster SIGKILLed alone (Patroni restarts it).
    PostmasterCrashed,
    /// The standbys left behind (WAL receivers stopped), then the primary
    /// killed: asynchronous replication promotes one without what it
    /// never received; synchronous mode must refuse to.
    LaggingStandbyPromoted,
}

impl Failover {
    /// How the table names it.
    pub fn describe(self) -> &'static str {
        match self {
            Failover::Switchover => "planned switchover",
            Failover::PrimaryDied => "primary's Patroni + postmaster SIGKILLed",
            Failover::PostmasterCrashed => "primary's postmaster SIGKILLed",
            Failover::LaggingStandbyPromoted => "standbys left behind, then the primary SIGKILLed",
        }
    }
}

/// One failover the driver made.
pub struct Event {
    /// What it was.
    pub kind: Failover,
    /// When it began.
    pub at: Instant,
}

/// Drives failovers and remembers them.
pub struct Driver {
    asynchronous: bool,
    turn: usize,
    /// A node killed by the last failover, revived before the next.
    dead: Option<usize>,
    /// Every failover made.
    pub events: Vec<Event>,
}

impl Driver {
    /// A driver for a cluster in synchronous (or, misconfigured,
    /// asynchronous) mode.
    pub fn new(asynchronous: bool) -> Driver {
        Driver {
            asynchronous,
            turn: 0,
            dead: None,
            events: Vec::new(),
        }
    }

    /// Brings a killed node back and waits for a healthy cluster.
    pub async fn heal(&mut self, cluster: &mut HaCluster) -> Result<(), String> {
        if let Some(node) = self.dead.take() {
            cluster.revive(node)?;
        }
        cluster.wait_until_healthy(Duration::from_secs(120)).await
    }

    /// Makes the next failover (after healing the last one's damage).
    pub async fn next(&mut self, cluster: &mut HaCluster) -> Result<(), String> {
        self.heal(cluster).await?;
        let kind = if self.asynchronous {
            Failover::LaggingStandbyPromoted
        } else {
            [
                Failover::Switchover,
                Failover::PrimaryDied,
                Failover::PostmasterCrashed,
                Failover::LaggingStandbyPromoted,
            ][self.turn % 4]
        };
        self.turn += 1;
        let mut frozen = Vec::new();
        if kind == Failover::LaggingStandbyPromoted {
            frozen = cluster.stop_replication().await?;
            if frozen.is_empty() {
                return Err("no standby was replicating: nothing to leave behind".into());
            }
            // Commits acknowledged by the primary alone pile up.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let at = Instant::now();
        match kind {
            Failover::Switchover => {
                cluster.switchover().await?;
            }
            Failover::PrimaryDied | Failover::LaggingStandbyPromoted => {
                self.dead = Some(cluster.kill_leader().await?);
            }
            Failover::PostmasterCrashed => {
                cluster.kill_leader_postmaster().await?;
            }
        }
        // With the primary dead, the standbys may go on: asynchronous mode
        // promotes one without what it never received.
        cluster.resume_recovery(&frozen);
        self.events.push(Event { kind, at });
        if let Some(dead) = self.dead {
            // Patroni promotes a standby once the dead leader's key expires
            // (ttl 10 s) — or, in synchronous mode after the standbys were
            // left behind, rightly none: then only the old primary's return
            // ends the outage. Either way it comes back now, as a machine
            // would after a reboot.
            let promoted = cluster
                .wait_for_leader_other_than(dead, Duration::from_secs(20))
                .await;
            eprintln!(
                "  {}",
                if promoted {
                    "a standby was promoted"
                } else {
                    "no standby was promoted; waiting for the old primary"
                }
            );
            self.heal(cluster).await?;
        }
        Ok(())
    }
}

/// Times of successful writes through the service, from the probe.
pub type Successes = Arc<Mutex<Vec<Instant>>>;

/// Creates an order through the service every 20 ms (trying the next
/// process when one does not answer) and notes when each succeeded, until
/// `stop` turns true.
pub async fn probe(
    bases: Vec<String>,
    api_key: String,
    successes: Successes,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let body = serde_json::json!({
        "customer_id": "probe",
        "currency": "EUR",
        "items": [{"sku": "probe", "quantity": 1, "unit_amount": 100}],
    });
    let mut i = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        i += 1;
        let base = &bases[i % bases.len()];
        let sent = http
            .post(format!("{base}/orders"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", format!("probe-{i}"))
            .json(&body)
            .send()
            .await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            successes.lock().await.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// For each failover, the longest time without a successful write from
/// the last success before it until the next failover (or the end): the
/// unavailability a client saw, however long the failover took to show.
pub fn windows(events: &[Event], successes: &[Instant]) -> Vec<(Failover, Option<Duration>)> {
    events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let until = events.get(i + 1).map(|n| n.at);
            let start = successes.iter().rev().find(|t| **t <= e.at).copied();
            let mut times: Vec<Instant> = start.into_iter().collect();
            times.extend(
                successes
                    .iter()
                    .filter(|t| **t > e.at && until.is_none_or(|u| **t <= u)),
            );
            // No success after the failover (before the next): unmeasured.
            if times.len() < 2 || times.last() == start.as_ref() {
                return (e.kind, None);
            }
            let longest = times.windows(2).map(|w| w[1].duration_since(w[0])).max();
            (e.kind, longest)
        })
        .collect()
}

/// The table of failovers and their windows.
pub fn table(windows: &[(Failover, Option<Duration>)]) -> String {
    let mut out = String::from(
        "\n| # | failover | longest window without a successful write |\n|---:|---|---:|\n",
    );
    for (i, (kind, window)) in windows.iter().enumerate() {
        let shown = window.map_or("no write after it".to_string(), |w| format!("{w:.2?}"));
        out += &format!("| {} | {} | {shown} |\n", i + 1, kind.describe());
    }
    let measured: Vec<Duration> = windows.iter().filter_map(|(_, w)| *w).collect();
    if let Some(max) = measured.iter().max() {
        let mean = measured.iter().sum::<Duration>() / measured.len() as u32;
        out += &format!(
            "\n{} failovers; windows: mean {mean:.2?}, longest {max:.2?}.\n",
            windows.len()
        );
    }
    out
}
