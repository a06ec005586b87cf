//! Whose CPU a run spent, read from `/proc`: what one request costs the
//! machine, split between PostgreSQL, `oncepay serve`, the sandbox and the
//! load driver (this program, or pgbench for the ceilings).
//!
//! Why: on this machine everything shares the same cores, so a scenario's
//! rate is bounded by the CPU time one request costs in *all* of them. The
//! ceiling's transaction pays PostgreSQL and pgbench only; a payment also
//! pays the service, the provider and its webhook. Dividing the cores by
//! each cost is the arithmetic behind every ratio the table prints.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Clock ticks per second in `/proc`: `USER_HZ`, fixed at 100 by the
/// kernel's ABI whatever the kernel's own tick rate.
const TICKS_PER_SECOND: f64 = 100.0;

/// How often short-lived processes (a pgbench and its backends) are read
/// while the run lasts, so that their time is counted after they exit.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// CPU seconds spent during a run, by whom.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// Every PostgreSQL process (backends, WAL writer, checkpointer, …).
    pub postgres: f64,
    /// `oncepay serve`.
    pub serve: f64,
    /// The sandbox provider.
    pub sandbox: f64,
    /// This program: the load driver.
    pub driver: f64,
    /// pgbench (the ceilings' and floors' driver).
    pub pgbench: f64,
    /// The whole machine's busy time (every process and the kernel).
    pub machine: f64,
    /// The run's wall-clock time, seconds.
    pub elapsed: f64,
    /// The machine's busy share over the run, in cores (2.0: both cores
    /// all the time).
    pub cores_busy: f64,
}

impl Cpu {
    /// The same in milliseconds per one of `n` requests (its `elapsed`
    /// and `cores_busy` stay the run's).
    pub fn per(&self, n: f64) -> Cpu {
        let ms = |s: f64| s * 1000.0 / n.max(1.0);
        Cpu {
            postgres: ms(self.postgres),
            serve: ms(self.serve),
            sandbox: ms(self.sandbox),
            driver: ms(self.driver),
            pgbench: ms(self.pgbench),
            machine: ms(self.machine),
            elapsed: self.elapsed,
            cores_busy: self.cores_busy,
        }
    }
}

/// The processes a meter tells apart besides PostgreSQL and pgbench.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watched {
    /// `oncepay serve`'s pid.
    pub serve: Option<u32>,
    /// The sandbox's pid.
    pub sandbox: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Postgres,
    Serve,
    Sandbox,
    Driver,
    Pgbench,
}

/// One reading: each process's ticks, and the machine's busy ticks.
struct Reading {
    processes: HashMap<u32, (Who, u64)>,
    machine_busy: u64,
}

fn read(watched: Watched) -> Reading {
    let own = std::process::id();
    let mut processes = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`: comm may hold spaces, so split at
            // the last ')'; utime and stime are fields 14 and 15.
            let Some((head, tail)) = stat.rsplit_once(')') else {
                continue;
            };
            let comm = head.split_once('(').map_or("", |(_, c)| c);
            let who = if Some(pid) == watched.serve {
                Who::Serve
            } else if Some(pid) == watched.sandbox {
                Who::Sandbox
            } else if pid == own {
                Who::Driver
            } else if comm == "postgres" {
                Who::Postgres
            } else if comm == "pgbench" {
                Who::Pgbench
            } else {
                continue;
            };
            let fields: Vec<&str> = tail.split_whitespace().collect();
            let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
            if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
                processes.insert(pid, (who, user + system));
            }
        }
    }
    let machine_busy = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let line = s.lines().next()?.to_string();
            let n: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal …: busy is all
            // but idle and iowait.
            Some(n.iter().sum::<u64>() - n.get(3)? - n.get(4)?)
        })
        .unwrap_or(0);
    Reading {
        processes,
        machine_busy,
    }
}

/// Measures from [`Meter::start`] to [`Meter::stop`].
pub struct Meter {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Cpu>,
}

impl Meter {
    /// Starts measuring.
    pub fn start(watched: Watched) -> Meter {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        // Read here, not in the task: the window starts when this returns,
        // whenever the task first runs.
        let started = Instant::now();
        let first = read(watched);
        let task = tokio::spawn(async move {
            let mut last = HashMap::new();
            let machine_busy = loop {
                let done = tokio::select! {
                    _ = &mut stopped => true,
                    () = tokio::time::sleep(SAMPLE_EVERY) => false,
                };
                let now = read(watched);
                // A process gone since keeps its last reading.
                last.extend(now.processes);
                if done {
                    break now.machine_busy;
                }
            };
            let machine = machine_busy.saturating_sub(first.machine_busy) as f64 / TICKS_PER_SECOND;
            let elapsed = started.elapsed().as_secs_f64();
            let mut cpu = Cpu {
                machine,
                elapsed,
                cores_busy: machine / elapsed.max(1e-9),
                ..Cpu::default()
            };
            for (pid, (who, ticks)) in last {
                // A process born during the run spent all its time in it.
                let before = first.processes.get(&pid).map_or(0, |p| p.1);
                let seconds = ticks.saturating_sub(before) as f64 / TICKS_PER_SECOND;
                match who {
                    Who::Postgres => cpu.postgres += seconds,
                    Who::Serve => cpu.serve += seconds,
                    Who::Sandbox => cpu.sandbox += seconds,
                    Who::Driver => cpu.driver += seconds,
                    Who::Pgbench => cpu.pgbench += seconds,
                }
            }
            cpu
        });
        Meter { stop, task }
    }

    /// Stops, and says what was spent.
    pub async fn stop(self) -> Cpu {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_ticks() -> u64 {
        read(Watched::default())
            .processes
            .get(&std::process::id())
            .map_or(0, |p| p.1)
    }

    /// CPU this process spends while the meter runs is counted as the
    /// driver's, and within the machine's; nothing is put on processes
    /// that did not run. Spins for an amount of CPU, not of wall-clock
    /// time, so a busy machine only makes it slower.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_time_this_process_spends_is_counted_as_the_drivers() {
        let meter = Meter::start(Watched {
            serve: Some(u32::MAX),
            sandbox: Some(u32::MAX - 1),
        });
        tokio::task::spawn_blocking(|| {
            let until = own_ticks() + 30;
            let mut x = 0u64;
            while own_ticks() < until {
                for _ in 0..100_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
        })
        .await
        .unwrap();
        let cpu = meter.stop().await;
        assert!(cpu.driver >= 0.3, "{cpu:?}");
        assert!(cpu.machine >= cpu.driver * 0.9, "{cpu:?}");
        assert!(cpu.serve == 0.0 && cpu.sandbox == 0.0, "{cpu:?}");
        assert!(cpu.cores_busy > 0.0, "{cpu:?}");
    }
}
