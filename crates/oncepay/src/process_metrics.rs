//! The process's own metrics, in the names every Prometheus client library
//! uses (`process_resident_memory_bytes`, `process_cpu_seconds_total`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`),
//! read from Linux's `/proc/self` at each scrape. Elsewhere (no `/proc`)
//! they are left out rather than reported as 0.

use std::fmt::Write;

/// Clock ticks per second of `/proc/self/stat`'s times (`sysconf(_SC_CLK_TCK)`
/// is 100 on every Linux architecture oncepay runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// Page size of `/proc/self/statm` (4 KiB on x86-64 and aarch64 Linux).
const PAGE_BYTES: u64 = 4096;

struct Sample {
    resident_bytes: u64,
    cpu_seconds: f64,
    open_fds: u64,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

fn sample() -> Option<Sample> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident_pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: fields are counted after
    // its closing parenthesis; utime, stime and starttime are fields 14,
    // 15 and 22.
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i - 3)?.parse::<u64>().ok();
    let cpu_seconds = (ticks(14)? + ticks(15)?) as f64 / TICKS_PER_SECOND;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|line| line.starts_with("Max open files"))?
                .split_whitespace()
                .nth(3)?
                .parse()
                .ok()
        });
    let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse::<f64>()
            .ok()
    });
    let start_time_seconds = boot_time
        .zip(ticks(22))
        .map(|(boot, start)| boot + start as f64 / TICKS_PER_SECOND);
    Some(Sample {
        resident_bytes: resident_pages * PAGE_BYTES,
        cpu_seconds,
        open_fds,
        max_fds,
        start_time_seconds,
    })
}

/// The exposition text of the process metrics (empty without `/proc`).
pub fn render() -> String {
    let Some(s) = sample() else {
        return String::new();
    };
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        );
    };
    metric(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        s.resident_bytes.to_string(),
    );
    metric(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        s.cpu_seconds.to_string(),
    );
    metric(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        s.open_fds.to_string(),
    );
    if let Some(max) = s.max_fds {
        metric(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            max.to_string(),
        );
    }
    if let Some(start) = s.start_time_seconds {
        metric(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            start.to_string(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_reports_itself() {
        let text = super::render();
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let value = |name: &str| -> f64 {
            let line = text.lines().find(|l| l.starts_with(name)).expect(name);
            line[name.len()..].parse().expect("a number")
        };
        for name in [
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(value(name) > 0.0, "{name}");
        }
        // A test process may not have used a clock tick of CPU yet.
        assert!(value("process_cpu_seconds_total ") >= 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let started = value("process_start_time_seconds ");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "{started} vs {now}"
        );
    }
}
