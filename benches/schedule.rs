//! The scheduler with many jobs (issue 24): idle cost and lag.
//!
//! A file store gets 1,000 and then 100,000 jobs (daily cron jobs spread
//! over the day, none due during the measurement). The real scheduler
//! (system clock) runs behind a real engine whose agent records when each
//! turn starts. Printed, each with its target:
//!
//! * process CPU time (user + system, `getrusage`) per idle minute with
//!   1,000 and with 100,000 jobs: flat (the scheduler sleeps until the
//!   next instant; it never walks the jobs);
//! * RSS with 1,000 and with 100,000 jobs: flat (nothing per job in
//!   memory; SQLite's page cache is bounded);
//! * lag from a due instant to its turn's start, p50 and p99 over
//!   [`LAG_RUNS`] one-time jobs due a second apart, with the 100,000 jobs
//!   in the store: target under 50 ms on an idle machine.
//!
//! Figures are printed, never asserted. `SCHEDULE_BENCH_IDLE_SECS` sets
//! the idle window (default 60: one idle minute).

use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "support/allocator.rs"]
mod allocator;
#[path = "support/figures.rs"]
mod figures;

use figures::{figure, Better};
use futures::future::BoxFuture;
use jiff::Timestamp;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::{Engine, EngineParts};
use telegate::metrics::Metrics;
use telegate::reply::{DeliveryError, Outbound, Reply};
use telegate::runner::RunnerConfig;
use telegate::schedule::{Action, Jobs, RunSink, Schedule, ScheduleConfig, SystemClock};
use telegate::store::{now_ms, NewJob, Store};
use telegate::vocab::SessionSource;
use tokio_util::sync::CancellationToken;

const JOBS: usize = 100_000;
const FEW_JOBS: usize = 1_000;
const LAG_RUNS: usize = 20;
const LAG_TARGET_MS: f64 = 50.0;
/// Chats the lag jobs run in (each its own, so no run waits for another).
const LAG_CHAT_BASE: i64 = 1_000_000_000;

/// Records when each turn starts, by chat.
#[derive(Default)]
struct Stamps {
    started: Mutex<Vec<(i64, Timestamp)>>,
}

struct Stamping(Arc<Stamps>);

impl Agent for Stamping {
    fn name(&self) -> &str {
        "stamping"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        let now = Timestamp::now();
        self.0
            .started
            .lock()
            .unwrap()
            .push((turn.source.chat_id, now));
        Box::pin(async { Ok(AgentReply::new("ok")) })
    }
}

struct Silent;

impl Outbound for Silent {
    fn deliver<'a>(
        &'a self,
        _to: &'a SessionSource,
        _reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async { Ok(()) })
    }
}

fn job(chat_id: i64, schedule: &Schedule, action: &Action, next_run: i64) -> NewJob {
    NewJob {
        chat_id,
        chat_type: "dm".into(),
        thread_id: None,
        session_key: format!("agent:main:telegram:dm:{chat_id}"),
        creator_id: Some(chat_id as u64),
        creator_name: None,
        schedule: serde_json::to_value(schedule).unwrap(),
        label: "bench".into(),
        timezone: "UTC".into(),
        action: serde_json::to_value(action).unwrap(),
        next_run,
    }
}

/// Add idle jobs until the store holds `total` (daily, due later today or
/// tomorrow, at least two hours from now).
async fn fill(store: &Store, from: usize, total: usize) {
    let action = Action::Message {
        text: "idle".into(),
    };
    let base = now_ms() + 2 * 3600 * 1000;
    let mut pending = Vec::new();
    for i in from..total {
        let minute = i % 60;
        let hour = (i / 60) % 24;
        let schedule = Schedule::Cron {
            expr: format!("{minute} {hour} * * *"),
        };
        let next = base + (i as i64 % 86_400) * 1000;
        let store = store.clone();
        let new = job(i as i64 + 1, &schedule, &action, next);
        pending.push(tokio::spawn(async move {
            store.jobs().create_job(new, 20).await.unwrap();
        }));
        if pending.len() == 2_000 {
            for task in pending.drain(..) {
                task.await.unwrap();
            }
        }
    }
    for task in pending {
        task.await.unwrap();
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds per idle minute over `window`.
async fn idle_cpu_per_minute(window: Duration) -> f64 {
    let before = cpu_seconds();
    tokio::time::sleep(window).await;
    (cpu_seconds() - before) * 60.0 / window.as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let idle = Duration::from_secs(
        std::env::var("SCHEDULE_BENCH_IDLE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_async(dir.path().join("telegate.db"))
        .await
        .unwrap();
    let stamps = Arc::new(Stamps::default());
    let jobs = Jobs::new(
        store.jobs(),
        ScheduleConfig {
            timezone: Some("UTC".into()),
            max_jobs_per_chat: 20,
            ..ScheduleConfig::default()
        },
        Arc::new(SystemClock),
        Metrics::new(),
    )
    .unwrap();
    let engine = Engine::new(EngineParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        runner: RunnerConfig {
            jobs: Some(jobs.clone()),
            ..RunnerConfig::default()
        },
        ..EngineParts::new(Arc::new(Stamping(stamps.clone())), Arc::new(Silent))
    });
    let adapter = engine.adapter.downgrade();
    let sink: RunSink = Arc::new(move |event| {
        let adapter = adapter.clone();
        Box::pin(async move {
            if let Some(adapter) = adapter.upgrade() {
                adapter.handle_message(event).await;
            }
        })
    });
    let stop = CancellationToken::new();
    telegate::schedule::spawn(jobs.clone(), sink, stop.clone());

    println!("scheduler bench: idle window {} s", idle.as_secs());
    fill(&store, 0, FEW_JOBS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_few = rss_kib();
    let cpu_few = idle_cpu_per_minute(idle).await;
    let started = std::time::Instant::now();
    fill(&store, FEW_JOBS, JOBS).await;
    let filled = started.elapsed();
    jobs.changed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_many = rss_kib();
    let cpu_many = idle_cpu_per_minute(idle).await;
    let count = store.jobs().job_count().await.unwrap();

    // Lag: one-time jobs due a second apart, each in a chat of its own.
    let first_due = (now_ms() / 1000 + 2) * 1000;
    let prompt = Action::Prompt {
        text: "lag".into(),
        fresh: false,
    };
    for k in 0..LAG_RUNS {
        let due = first_due + k as i64 * 1000;
        let once = Schedule::Once { at: due / 1000 };
        store
            .jobs()
            .create_job(job(LAG_CHAT_BASE + k as i64, &once, &prompt, due), 20)
            .await
            .unwrap();
    }
    jobs.changed();
    let deadline = std::time::Instant::now() + Duration::from_secs(LAG_RUNS as u64 + 10);
    while stamps.started.lock().unwrap().len() < LAG_RUNS && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lags: Vec<f64> = stamps
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|(chat, _)| *chat >= LAG_CHAT_BASE)
        .map(|(chat, at)| {
            let due = first_due + (chat - LAG_CHAT_BASE) * 1000;
            (at.as_millisecond() - due) as f64 + f64::from(at.subsec_microsecond() % 1000) / 1000.0
        })
        .collect();
    lags.sort_by(f64::total_cmp);
    stop.cancel();

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "  jobs in the store: {count} (filled {JOBS} in {:.1} s)",
        filled.as_secs_f64()
    );
    println!(
        "  CPU per idle minute: {cpu_few:.4} s with {FEW_JOBS} jobs, {cpu_many:.4} s with {JOBS} jobs \
         (target: flat; the scheduler sleeps until the next instant)"
    );
    println!(
        "  RSS: {:.1} MiB with {FEW_JOBS} jobs, {:.1} MiB with {JOBS} jobs (target: flat, nothing per job in memory)",
        mib(rss_few),
        mib(rss_many)
    );
    let p50 = percentile(&lags, 50.0);
    let p99 = percentile(&lags, 99.0);
    let verdict = |v: f64| if v < LAG_TARGET_MS { "PASS" } else { "MISS" };
    println!(
        "  lag due -> turn start over {} runs: p50 {p50:.2} ms {}, p99 {p99:.2} ms {}, max {:.2} ms \
         (target < {LAG_TARGET_MS} ms on an idle machine)",
        lags.len(),
        verdict(p50),
        verdict(p99),
        lags.last().copied().unwrap_or(f64::NAN)
    );
    println!("  (figures only; timing is never asserted)");
    figure(
        "schedule/idle_cpu_per_minute_few",
        cpu_few,
        "s",
        Better::Lower,
        None,
    );
    figure(
        "schedule/idle_cpu_per_minute_many",
        cpu_many,
        "s",
        Better::Lower,
        None,
    );
    figure(
        "schedule/rss_many_jobs",
        mib(rss_many),
        "MiB",
        Better::Lower,
        None,
    );
    figure(
        "schedule/lag_p50",
        p50,
        "ms",
        Better::Lower,
        Some(LAG_TARGET_MS),
    );
    figure(
        "schedule/lag_p99",
        p99,
        "ms",
        Better::Lower,
        Some(LAG_TARGET_MS),
    );
}
