//! Several bots in one process: what a bot costs when it runs beside 49
//! others. One process runs a fleet of 50 bots (`[[bots]]`), each polling
//! its own fake Bot API, 100 chats each, the messages arriving at a steady
//! rate (3,000 updates/s in all, 60 per bot); the same sitting, interleaved
//! (A, B, A, B), runs one bot alone with one bot's share of that traffic
//! (100 chats, 60 updates/s): what each of the 50 would be as a process of
//! its own, the alternative a fleet replaces. The figures:
//!
//! * telegate's CPU per update (its runtime and store threads, from
//!   `/proc/self/task/*/schedstat`; the fakes serve from a runtime thread
//!   of their own and the bench's main thread sends and counts) in the
//!   fleet over the lone bot's: target within 10%.
//! * the same against one bot carrying all the traffic (5,000 chats at
//!   3,000 updates/s), no target: a bot's long poll returns as soon as an
//!   update is there, so 50 bots at 60/s make a `getUpdates` round trip
//!   for about every update where one bot at 3,000/s takes several per
//!   round trip, and each bot's writers batch only their own rows.
//! * idle RSS per additional bot: the process's `VmRSS` once the bots were
//!   started (before any traffic) minus what it was before, over the
//!   number of bots (the first bot's shared costs included, so an upper
//!   bound): target under 1 MB. And the idle CPU per additional bot.
//!
//! Wall time and the load average are printed beside them; nothing is
//! asserted (these machines are noisy). `BOTS_BENCH_BOTS` (default 50),
//! `BOTS_BENCH_PER_CHAT` (messages per chat, default 4), `BOTS_BENCH_RATE`
//! (updates/s in all, default 3000) and `BOTS_BENCH_REPEATS` (default 2)
//! change the sizes.

#[path = "support/allocator.rs"]
mod allocator;
#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::{FakeBotApi, FakeConfig};
use figures::{figure, load_average, Better, ThreadCpu};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::engine::AgentSetup;
use telegate::wiring::fleet::Fleet;

const BOTS: usize = 50;
const CHATS: i64 = 100;
const PER_CHAT: usize = 4;
/// Updates per second, all bots together: well under what two cores
/// answer, so both runs are steady rather than a backlog's burst.
const RATE: usize = 3000;
/// Runs of each kind, interleaved.
const REPEATS: usize = 2;
/// CPU per update with many bots over one bot's.
const TARGET_CPU_RATIO: f64 = 1.10;
/// Idle RSS per additional bot, bytes.
const TARGET_RSS_PER_BOT: f64 = 1024.0 * 1024.0;

struct NoOp;

impl Agent for NoOp {
    fn name(&self) -> &str {
        "noop"
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move { Ok(AgentReply::new(format!("ok {}", turn.text))) })
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A `[[bots]]` configuration for `fakes`, paced out of the way.
fn config(fakes: &[FakeBotApi], data_dir: &Path) -> Config {
    let mut text = format!(
        "[sessions]\nbusy_mode = \"queue\"\nmax_pending = 1000\n\n\
         [delivery]\nper_chat_interval_ms = 0\ngroup_messages_per_minute = 1000000\n\
         global_messages_per_second = 1000000\n\n[store]\ndata_dir = \"{}\"\n\n\
         [log]\nlevel = \"error\"\n",
        data_dir.display()
    );
    for (index, fake) in fakes.iter().enumerate() {
        let _ = write!(
            text,
            "\n[[bots]]\nname = \"b{index}\"\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n",
            fake.token(),
            fake.url()
        );
    }
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

fn rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib * 1024.0)
}

/// What one run measured.
struct Run {
    updates: usize,
    wall: Duration,
    telegate_cpu: Duration,
    /// Of which the store thread.
    store_cpu: Duration,
    idle_rss_per_bot: f64,
    /// telegate's CPU in half a second of idling after the start.
    idle_cpu: Duration,
}

/// The workload: `rounds` messages to each of `chats` chats of every bot,
/// in the order they are sent (round by round; within a round, chat by
/// chat, each chat's message going to every bot in turn), each as the
/// index of its bot and the message.
fn workload(bots: usize, chats: i64, rounds: usize) -> Vec<(usize, (i64, i64, String))> {
    (0..rounds)
        .flat_map(|round| {
            (1..=chats).flat_map(move |chat| {
                (0..bots).map(move |bot| (bot, (chat, chat, format!("m{round}"))))
            })
        })
        .collect()
}

/// Start a fleet on `fakes`, then send `chats` chats x `rounds` messages
/// to each bot at `rate` updates per second in all (so one bot and fifty
/// see the same traffic, as a host would), and wait for every answer.
async fn run(fakes: &[FakeBotApi], chats: i64, rounds: usize, rate: f64) -> Run {
    let data = tempfile::tempdir().expect("tempdir");
    let config = config(fakes, data.path());
    let rss_before = rss_bytes();
    let fleet = Fleet::start(&config, |_| Some(AgentSetup::without_tools(Arc::new(NoOp))))
        .await
        .expect("the bots start");
    // Idle: every bot polling, nothing to do yet.
    let idle_before = ThreadCpu::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_cpu = ThreadCpu::now().since(&idle_before).telegate();
    let idle_rss_per_bot = (rss_bytes() - rss_before) / fakes.len() as f64;
    let work = workload(fakes.len(), chats, rounds);
    let per_bot = chats as usize * rounds;
    // A fake that served an earlier run has its calls still recorded: count
    // from where each one stands now, before any message is pushed (an
    // answer that came before this mark would never be counted).
    let mut progress: Vec<(usize, usize, Vec<usize>)> = fakes
        .iter()
        .map(|fake| (0, fake.calls_len(), Vec::new()))
        .collect();
    let is_answer = |c: &fake_bot::RecordedCall| {
        c.method == "sendMessage"
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.starts_with("ok "))
    };
    let threads_before = ThreadCpu::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    let mut sent = 0;
    let mut batches: Vec<Vec<(i64, i64, String)>> = vec![Vec::new(); fakes.len()];
    loop {
        // Send what is due by now (the messages arrive at Telegram at
        // `rate`, whatever the bots' pace).
        let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(work.len());
        for (bot, message) in &work[sent..due] {
            batches[*bot].push(message.clone());
        }
        sent = due;
        for (fake, batch) in fakes.iter().zip(batches.iter_mut()) {
            if !batch.is_empty() {
                fake.push_texts(batch);
                batch.clear();
            }
        }
        let mut all = true;
        for (fake, (answered, seen, unanswered)) in fakes.iter().zip(progress.iter_mut()) {
            if *answered < per_bot {
                let (new, next) = fake.count_answered_calls_since(*seen, unanswered, is_answer);
                *answered += new;
                *seen = next;
                all &= *answered >= per_bot;
            }
        }
        if all || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let wall = started.elapsed();
    let threads = ThreadCpu::now().since(&threads_before);
    let updates = progress.iter().map(|(answered, _, _)| *answered).sum();
    fleet.shutdown().await;
    Run {
        updates,
        wall,
        telegate_cpu: threads.telegate(),
        store_cpu: threads.store,
        idle_rss_per_bot,
        idle_cpu,
    }
}

fn main() {
    telegate::memory::tune_allocator();
    let bots = env_or("BOTS_BENCH_BOTS", BOTS).max(2);
    let per_chat = env_or("BOTS_BENCH_PER_CHAT", PER_CHAT);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let fake_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fake-bot-api")
        .enable_all()
        .build()
        .expect("fake runtime");
    let fakes: Vec<FakeBotApi> = fake_runtime.block_on(async {
        let mut fakes = Vec::new();
        for index in 0..bots {
            fakes.push(
                FakeBotApi::start_with(FakeConfig {
                    bot_id: 5000 + index as i64,
                    username: format!("bench_bot_{index}"),
                    ..FakeConfig::default()
                })
                .await,
            );
        }
        fakes
    });
    // One bot with every chat, then the fleet, interleaved in one sitting
    // (A, B, A, B…): the same machine, the same traffic.
    let rate = env_or("BOTS_BENCH_RATE", RATE) as f64;
    let repeats = env_or("BOTS_BENCH_REPEATS", REPEATS).max(1);
    let mut one = Vec::new();
    let mut one_all = Vec::new();
    let mut many = Vec::new();
    for _ in 0..repeats {
        one.push(runtime.block_on(run(&fakes[..1], CHATS, per_chat, rate / bots as f64)));
        many.push(runtime.block_on(run(&fakes, CHATS, per_chat, rate)));
        one_all.push(runtime.block_on(run(&fakes[..1], CHATS * bots as i64, per_chat, rate)));
    }
    let per_update = |runs: &[Run]| {
        let cpu: f64 = runs.iter().map(|r| r.telegate_cpu.as_secs_f64()).sum();
        let updates: usize = runs.iter().map(|r| r.updates).sum();
        cpu * 1e6 / updates.max(1) as f64
    };
    let ratio = per_update(&many) / per_update(&one);
    let ratio_all = per_update(&many) / per_update(&one_all);
    let idle_rss_per_bot = many.iter().map(|r| r.idle_rss_per_bot).sum::<f64>() / many.len() as f64;
    // The fleet's idle CPU over one bot's, per additional bot and second.
    let idle = |runs: &[Run]| {
        runs.iter().map(|r| r.idle_cpu.as_secs_f64()).sum::<f64>() / runs.len() as f64 / 0.5
    };
    let idle_cpu_per_bot = (idle(&many) - idle(&one)).max(0.0) / (bots - 1) as f64;
    println!(
        "bots: {bots} bots x {CHATS} chats at {rate:.0} updates/s in all, against 1 bot x \
         {CHATS} chats at {:.0}/s and 1 bot x {} chats at {rate:.0}/s; {per_chat} messages \
         per chat, {repeats} runs each, interleaved",
        rate / bots as f64,
        CHATS * bots as i64
    );
    let runs = [
        ("1 bot alone", &one),
        ("fleet", &many),
        ("1 bot, all traffic", &one_all),
    ];
    for (label, runs) in runs {
        for run in runs.iter() {
            println!(
                "  {label}: {} updates in {:.2} s, telegate CPU {:.0} us per update (store \
                 thread {:.0} us)",
                run.updates,
                run.wall.as_secs_f64(),
                run.telegate_cpu.as_secs_f64() * 1e6 / run.updates.max(1) as f64,
                run.store_cpu.as_secs_f64() * 1e6 / run.updates.max(1) as f64
            );
        }
    }
    println!(
        "  CPU per update, fleet over 1 bot alone: {ratio:.2}  target <= {TARGET_CPU_RATIO:.2}; \
         over 1 bot with all the traffic: {ratio_all:.2}; \
         idle RSS per bot {:.0} KiB  target < {:.0} KiB; idle CPU per additional bot {:.1} \
         us/s; load average {:.1}",
        idle_rss_per_bot / 1024.0,
        TARGET_RSS_PER_BOT / 1024.0,
        idle_cpu_per_bot * 1e6,
        load_average()
    );
    figure(
        "bots/cpu_per_update_one_bot",
        per_update(&one),
        "us",
        Better::Lower,
        None,
    );
    figure(
        "bots/cpu_per_update_fleet",
        per_update(&many),
        "us",
        Better::Lower,
        None,
    );
    figure(
        "bots/cpu_per_update_ratio",
        ratio,
        "x",
        Better::Lower,
        Some(TARGET_CPU_RATIO),
    );
    figure(
        "bots/cpu_per_update_ratio_all_traffic",
        ratio_all,
        "x",
        Better::Lower,
        None,
    );
    figure(
        "bots/idle_rss_per_bot",
        idle_rss_per_bot,
        "bytes",
        Better::Lower,
        Some(TARGET_RSS_PER_BOT),
    );
    figure(
        "bots/idle_cpu_per_bot",
        idle_cpu_per_bot * 1e6,
        "us/s",
        Better::Lower,
        None,
    );
    figure(
        "bots/load_average",
        load_average(),
        "load",
        Better::Lower,
        None,
    );
}
