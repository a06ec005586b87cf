//! The results: one row a scenario, and the tables `make bench` prints and
//! writes into `BENCHMARKS.md` between markers (the rest of that file is
//! kept).

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;

use crate::capacity::{Capacity, CAPACITY_P99_MS};
use crate::load::{self, Outcome};
use crate::{cpu, floor, Args};

/// One line of the table.
pub struct Row {
    pub scenario: &'static str,
    pub connections: usize,
    pub outcome: Outcome,
    pub floor: Option<(usize, floor::Floor)>,
    /// The minimal-SQL ceiling at each connection count of the sweep.
    pub ceiling: Vec<(usize, floor::Floor)>,
    /// Open-loop runs: (share of the closed-loop maximum, outcome, CPU
    /// per request).
    pub open: Vec<(f64, load::Outcome, cpu::Cpu)>,
    /// pay only: the ceiling's SQL plus the outbox's event rows, at the
    /// ceiling's best connection count (an explanation, not the ceiling).
    pub with_outbox: Option<(usize, floor::Floor)>,
    /// transfers only: the same SQL as the floor's with the merchant's
    /// system account on the other side, as the service writes it.
    pub with_merchant_account: Option<(usize, floor::Floor)>,
    /// reserve-hot and reserve-spread: the same SQL as the floor's on as
    /// many connections as the service's main pool has, the most sessions
    /// the service puts in the row lock's queue.
    pub at_pool: Option<(usize, floor::Floor)>,
    /// reserve-hot and reserve-spread: the row's sweeps in the prepared
    /// protocol, as the service sends its statements (`floor::Protocol`):
    /// the row's own floor, a reservation's own floor, and the row as an
    /// order holds it, each swept like the ceiling.
    pub row_sweeps: Vec<(&'static str, Vec<(usize, floor::Floor)>)>,
    /// reserve-hot and reserve-spread: the service's reservation statement
    /// and its commit, on average, ms, its wait for the row's lock
    /// included (`oncepay_last_write_hold_seconds`).
    pub service_hold_ms: Option<f64>,
    /// pay and capture: how long after the closed loop ended its provider webhooks
    /// went on arriving. Their work belongs to the loop's payments, so the
    /// rate the service sustains counts this time too.
    pub drained: Option<Duration>,
    /// pay only: the highest rate it holds (see [`crate::pay::capacity`]).
    pub capacity: Option<Capacity>,
    /// Highest resident memory of `oncepay serve` seen during it, KiB.
    pub rss_kib: u64,
    /// The closed loop's CPU per request, ms (pay: with its webhooks).
    pub cpu: Option<cpu::Cpu>,
    pub check: String,
}

impl Row {
    /// A scenario's closed loop and its check; the references and open
    /// loops that go with it, where it has them, are set by the caller.
    pub fn closed_loop(
        scenario: &'static str,
        connections: usize,
        outcome: Outcome,
        check: String,
    ) -> Row {
        Row {
            scenario,
            connections,
            outcome,
            floor: None,
            ceiling: Vec::new(),
            open: Vec::new(),
            with_outbox: None,
            with_merchant_account: None,
            at_pool: None,
            row_sweeps: Vec::new(),
            service_hold_ms: None,
            drained: None,
            capacity: None,
            rss_kib: 0,
            cpu: None,
            check,
        }
    }

    /// The closed loop's rate with its deferred work counted: what the open
    /// loop's shares are taken of.
    pub fn sustained_rate(&self) -> f64 {
        let d = self.outcome.elapsed.as_secs_f64();
        let tail = self.drained.unwrap_or_default().as_secs_f64();
        self.outcome.rate() * d / (d + tail)
    }
}

fn machine() -> (String, String) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    (format!("{cores} cores ({cpu})"), mem)
}

pub async fn report(
    db: &PgPool,
    args: &Args,
    rows: &[Row],
    idle_rss: u64,
    peak_rss: u64,
) -> String {
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(db)
        .await
        .unwrap_or_default();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let (cores, mem) = machine();
    let mut out = String::new();
    out += &format!(
        "Machine: {cores}, {mem}; PostgreSQL {version}; commit {commit}; {} per scenario.\n",
        humanize(args.duration)
    );
    out += "The load driver, the sandbox, oncepay and PostgreSQL share the same cores.\n\n";
    out += "| scenario | conns | req/s | p50 ms | p99 ms | p99.9 ms | errors | ceiling tx/s (best conns) | of ceiling | same-SQL floor tx/s (conns) | of same-SQL | RSS MiB | effects |\n";
    out += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    // A database measurement as "tx/s (conns)" and the service's rate over it.
    let against = |point: Option<(usize, floor::Floor)>, rate: f64| match point {
        Some((clients, f)) => (
            format!("{:.0} ({clients})", f.tps),
            format!("{:.2}×", rate / f.tps),
        ),
        None => ("—".to_string(), "—".to_string()),
    };
    for r in rows {
        let o = &r.outcome;
        let (ceiling, of_ceiling) = against(floor::best(&r.ceiling), o.rate());
        let (floor, of_floor) = against(r.floor, o.rate());
        out += &format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {:.1} | {} |\n",
            r.scenario,
            r.connections,
            o.rate(),
            o.ms(0.5),
            o.ms(0.99),
            o.ms(0.999),
            o.failures(),
            ceiling,
            of_ceiling,
            floor,
            of_floor,
            r.rss_kib as f64 / 1024.0,
            r.check
        );
    }
    let opened: Vec<&Row> = rows.iter().filter(|r| !r.open.is_empty()).collect();
    if !opened.is_empty() {
        out += "\nOpen loop (a constant rate; each latency from the request's scheduled send time, coordinated omission corrected):\n\n";
        out += "| scenario | share of max | target req/s | achieved req/s | p50 ms | p99 ms | p99.9 ms | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in opened {
            for (share, o, _) in &r.open {
                out += &format!(
                    "| {} | {:.0} % | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |\n",
                    r.scenario,
                    share * 100.0,
                    r.outcome.rate() * share,
                    o.rate(),
                    o.ms(0.5),
                    o.ms(0.99),
                    o.ms(0.999),
                    o.failures()
                );
            }
        }
    }
    let swept: Vec<&Row> = rows.iter().filter(|r| !r.ceiling.is_empty()).collect();
    if !swept.is_empty() {
        out += "\nThe ceilings' sweep (pgbench, minimal SQL; tx/s at each connection count):\n\n| scenario |";
        for c in floor::SWEEP {
            out += &format!(" {c} |");
        }
        out += "\n|---|";
        for _ in floor::SWEEP {
            out += "---:|";
        }
        out += "\n";
        for r in swept {
            out += &format!("| {} |", r.scenario);
            for (_, f) in &r.ceiling {
                out += &format!(" {:.0} |", f.tps);
            }
            out += "\n";
        }
    }
    for r in rows {
        if let Some(tail) = r.drained {
            out += &format!(
                "\n{}'s provider webhooks went on arriving {:.1} s after its closed loop ended: counting that time, {:.0} req/s{}; the open loop's shares are of this rate.\n",
                r.scenario,
                tail.as_secs_f64(),
                r.sustained_rate(),
                floor::best(&r.ceiling).map_or(String::new(), |(_, f)| format!(
                    " ({:.2}× of the ceiling)",
                    r.sustained_rate() / f.tps
                ))
            );
        }
        if let Some(cap) = &r.capacity {
            let ceiling = floor::best(&r.ceiling).map(|(_, f)| f.tps);
            match &cap.held {
                Some((rate, o)) => {
                    let ratio = ceiling.map_or(String::new(), |tps| {
                        let ratio = rate / tps;
                        format!(
                            ", {ratio:.2}× its minimal ceiling ({tps:.0} tx/s; target ≥ 0.75×: {})",
                            if ratio >= 0.75 { "met" } else { "not met" }
                        )
                    });
                    out += &format!(
                        "\n{}'s capacity: {rate:.0} req/s held for {} with p99 {:.2} ms (p50 {:.2} ms, 0 errors, its webhooks keeping up){ratio}.",
                        r.scenario,
                        humanize(args.sustain),
                        o.ms(0.99),
                        o.ms(0.5),
                    );
                }
                None => {
                    out += &format!(
                        "\n{}'s capacity: no probed rate held p99 under {CAPACITY_P99_MS} ms for {}.",
                        r.scenario,
                        humanize(args.sustain)
                    );
                }
            }
            out += " Probes (asked → achieved req/s, p99 ms; of each second's p99, the median and the worst; the worst of the 8 KiB flushes the bench timed every 10 ms on the system's temporary directory's disk, where a commit's stall shows whatever the service does):";
            for p in &cap.probes {
                let disk = p.flushes.map_or(String::new(), |f| {
                    format!(
                        "; the disk's worst flush {:.1} ms, {} over 20 ms",
                        f.worst_ms, f.over_20_ms
                    )
                });
                out += &format!(
                    " {:.0} → {:.0}, {:.1}; {:.1}, {:.1}{disk} ({});",
                    p.asked,
                    p.achieved,
                    p.p99,
                    p.seconds_median,
                    p.seconds_worst,
                    if p.held { "held" } else { "not held" }
                );
            }
            out.pop();
            out += ".\n";
        }
        if let Some(line) = crate::transfers::verdict_line(r) {
            out += &line;
        }
        if let Some(line) = crate::reserve::verdict_line(r) {
            out += &line;
        }
        if let Some((clients, f)) = r.with_outbox {
            out += &format!(
                "\n{}'s ceiling with the outbox's event rows added (three per payment, as the service writes them; {clients} connections): {:.0} tx/s, the service {:.2}× of it.\n",
                r.scenario,
                f.tps,
                r.outcome.rate() / f.tps
            );
        }
    }
    out += &cpu_table(rows);
    out += &format!(
        "\nRSS of `oncepay serve`: {:.1} MiB idle, {:.1} MiB peak under load.\n",
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0
    );
    out
}

/// Whose CPU each request cost (see [`cpu`]), and for pay the arithmetic
/// it gives: how many payments the cores allow at all, against the ceiling.
fn cpu_table(rows: &[Row]) -> String {
    let measured: Vec<&Row> = rows.iter().filter(|r| r.cpu.is_some()).collect();
    if measured.is_empty() {
        return String::new();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut out = format!(
        "\nCPU per request, in ms of CPU time (read from /proc while each ran; the machine's column is every process and the kernel; {cores:.0} cores give {:.0} ms a second):\n\n| run | req/s | PostgreSQL | oncepay serve | sandbox | driver | machine | cores busy |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        cores * 1000.0
    );
    let ms = |v: f64| {
        if v > 0.0 {
            format!("{v:.3}")
        } else {
            "—".to_string()
        }
    };
    // The driver is this program, or pgbench for a ceiling (the other idles).
    let mut line = |run: String, rate: f64, c: &cpu::Cpu| {
        out += &format!(
            "| {run} | {rate:.0} | {} | {} | {} | {} | {} | {:.2} |\n",
            ms(c.postgres),
            ms(c.serve),
            ms(c.sandbox),
            ms(c.driver + c.pgbench),
            ms(c.machine),
            c.cores_busy
        );
    };
    let mut arithmetic = String::new();
    for r in measured {
        let Some(c) = r.cpu else { continue };
        let what = if r.drained.is_some() {
            "closed loop, its webhooks included"
        } else {
            "closed loop"
        };
        line(format!("{} ({what})", r.scenario), r.outcome.rate(), &c);
        for (share, o, spent) in &r.open {
            line(
                format!("{} at {:.0} % (open loop)", r.scenario, share * 100.0),
                o.rate(),
                spent,
            );
        }
        let held = r.capacity.as_ref().and_then(|cap| {
            cap.probes
                .iter()
                .filter(|p| p.held)
                .max_by(|a, b| a.asked.total_cmp(&b.asked))
        });
        if let Some(p) = held {
            line(
                format!("{} at its capacity", r.scenario),
                p.achieved,
                &p.cpu,
            );
        }
        let ceiling = floor::best(&r.ceiling);
        if let Some((clients, f)) = ceiling {
            let t = f.cpu_per_transaction();
            line(
                format!(
                    "{}'s minimal ceiling (pgbench, {clients} connections)",
                    r.scenario
                ),
                f.tps,
                &t,
            );
            if r.capacity.is_some() {
                let most = cores * 1000.0 / c.machine.max(1e-9);
                let target = 0.75 * f.tps;
                let budget = cores * 1000.0 * 0.85 / target;
                let mut measured = held.map_or(String::new(), |p| {
                    format!(
                        " At its capacity ({:.0}/s) a request cost {:.3} ms.",
                        p.achieved, p.cpu.machine
                    )
                });
                // What the budget leaves the service at the measured rate
                // nearest the target: the database, the provider, the
                // driver and the kernel spend theirs first.
                let nearest = r
                    .open
                    .iter()
                    .map(|(_, o, spent)| (o.rate(), spent))
                    .chain(held.map(|p| (p.achieved, &p.cpu)))
                    .min_by(|a, b| (a.0 - target).abs().total_cmp(&(b.0 - target).abs()));
                if let Some((rate, spent)) = nearest {
                    let others = spent.machine - spent.serve;
                    measured += &format!(
                        " At {rate:.0}/s, the measured rate nearest {target:.0}, everything but `oncepay serve` (PostgreSQL, the sandbox, the driver, the kernel) cost {others:.3} ms a request, which leaves the service {:.3} ms of that budget; it spent {:.3}.",
                        budget - others,
                        spent.serve
                    );
                }
                arithmetic += &format!(
                    "\n{}'s arithmetic: a request costs the machine {:.3} ms (closed loop), so {cores:.0} cores allow at most {most:.0}/s with both busy all the time: {:.2}× the minimal ceiling, whose transaction costs {:.3} ms. Holding 0.75× the ceiling ({target:.0}/s) with the cores 85 % busy needs at most {:.3} ms a request at that rate.{measured}\n",
                    r.scenario,
                    c.machine,
                    most / f.tps,
                    t.machine,
                    budget
                );
            }
        }
    }
    out + &arithmetic
}

fn humanize(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Replaces the block between the markers in `path`, or writes a new file.
pub fn write(path: &PathBuf, report: &str) -> Result<(), String> {
    const START: &str = "<!-- bench:start -->";
    const END: &str = "<!-- bench:end -->";
    let block = format!("{START}\n{report}{END}");
    let text = match std::fs::read_to_string(path) {
        Ok(old) => match (old.find(START), old.find(END)) {
            (Some(a), Some(b)) if a < b => format!("{}{block}{}", &old[..a], &old[b + END.len()..]),
            _ => format!("{old}\n{block}\n"),
        },
        Err(_) => format!("# Benchmarks\n\nLatest `make bench`:\n\n{block}\n"),
    };
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
