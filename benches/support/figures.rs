//! One parseable line per figure, and the CPU clocks the figures use.
//!
//! Every bench prints, beside its prose, each figure as
//!
//! ```text
//! FIGURE <bench>/<name> <value> <unit> <lower|higher> [target<op><value>]
//! ```
//!
//! (`lower`: smaller is better). `scripts/bench-compare.sh` collects these
//! lines from interleaved runs of two builds and prints the medians and
//! their ratio. CPU time is the figure to trust on a shared machine: wall
//! time swings with the other load, the CPU a unit of work costs much less.
//! Included by the benches through `#[path]`; nothing here asserts.

#![allow(dead_code)]

use std::time::Duration;

/// Which way a figure improves.
#[derive(Clone, Copy)]
pub enum Better {
    Lower,
    Higher,
}

/// Prints one `FIGURE` line. `target` is the bound the figure should meet
/// (`<=` for a lower-is-better figure, `>=` otherwise).
pub fn figure(name: &str, value: f64, unit: &str, better: Better, target: Option<f64>) {
    let (word, op) = match better {
        Better::Lower => ("lower", "<="),
        Better::Higher => ("higher", ">="),
    };
    let target = target.map_or_else(String::new, |t| format!(" target{op}{t}"));
    println!("FIGURE {name} {value:.3} {unit} {word}{target}");
}

/// Milliseconds of a duration, for figures.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Microseconds of a duration, for figures.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// CPU time (user + system) this process has used so far (`getrusage`).
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage fills a struct we own; RUSAGE_SELF is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time per kind of thread, from `/proc/self/task/*/schedstat`
/// (nanoseconds on the CPU; threads that ended are lost, so a bench's
/// threads should live through what it measures).
#[derive(Default, Clone)]
pub struct ThreadCpu {
    /// telegate's tokio workers.
    pub runtime: Duration,
    /// The store thread.
    pub store: Duration,
    /// The fake Bot API's runtime thread (Telegram's side).
    pub fake: Duration,
    /// The bench's main thread.
    pub waiter: Duration,
    /// Any other thread (blocking pool, forker…), counted as telegate's.
    pub other: Duration,
}

impl ThreadCpu {
    /// Now, per kind of thread.
    pub fn now() -> ThreadCpu {
        let mut cpu = ThreadCpu::default();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return cpu;
        };
        let main_tid = std::process::id().to_string();
        for task in tasks.flatten() {
            let path = task.path();
            let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let on_cpu = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .map(Duration::from_nanos)
                .unwrap_or_default();
            let slot = match name.trim() {
                _ if task.file_name().to_string_lossy() == main_tid => &mut cpu.waiter,
                "fake-bot-api" => &mut cpu.fake,
                "telegate-store" => &mut cpu.store,
                "tokio-runtime-w" | "tokio-rt-worker" => &mut cpu.runtime,
                _ => &mut cpu.other,
            };
            *slot += on_cpu;
        }
        cpu
    }

    /// telegate's own threads: runtime, store and the rest.
    pub fn telegate(&self) -> Duration {
        self.runtime + self.store + self.other
    }

    /// What each kind used since `before`.
    pub fn since(&self, before: &ThreadCpu) -> ThreadCpu {
        ThreadCpu {
            runtime: self.runtime.saturating_sub(before.runtime),
            store: self.store.saturating_sub(before.store),
            fake: self.fake.saturating_sub(before.fake),
            waiter: self.waiter.saturating_sub(before.waiter),
            other: self.other.saturating_sub(before.other),
        }
    }
}

/// The `q` quantile (0..=1) of sorted durations, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The machine's 1-minute load average (`/proc/loadavg`), to print beside
/// wall-time figures.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
