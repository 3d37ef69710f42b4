//! Several bots in one process: what a bot costs when it runs beside 49
//! others. One process runs a fleet of 50 bots (`[[bots]]`), each polling
//! its own fake Bot API, 100 chats each; and, in the same sitting, one bot
//! with the same 100 chats. The figures:
//!
//! * telegate's CPU per update (its runtime and store threads, from
//!   `/proc/self/task/*/schedstat`; the fakes serve from a runtime thread
//!   of their own) with 50 bots against one bot's: target within 10%.
//! * idle RSS per additional bot: the process's `VmRSS` once 50 bots were
//!   started (before any traffic) minus what it was with only the fakes
//!   running, over 50 (the first bot's shared costs included, so an upper
//!   bound): target under 1 MB.
//!
//! Wall time and the load average are printed beside them; nothing is
//! asserted (these machines are noisy). `BOTS_BENCH_BOTS` (default 50) and
//! `BOTS_BENCH_PER_CHAT` (default 4) change the sizes.

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
    idle_rss_per_bot: f64,
}

/// Start a fleet on `fakes`, then push `CHATS` chats x `per_chat`
/// messages to each and wait for every answer.
async fn run(fakes: &[FakeBotApi], per_chat: usize) -> Run {
    let data = tempfile::tempdir().expect("tempdir");
    let config = config(fakes, data.path());
    let rss_before = rss_bytes();
    let fleet = Fleet::start(&config, |_| Some(AgentSetup::without_tools(Arc::new(NoOp))))
        .await
        .expect("the bots start");
    // Idle: every bot polling, nothing to do yet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss_per_bot = (rss_bytes() - rss_before) / fakes.len() as f64;
    let backlog: Vec<(i64, i64, String)> = (0..per_chat)
        .flat_map(|round| (1..=CHATS).map(move |chat| (chat, chat, format!("m{round}"))))
        .collect();
    let per_bot = backlog.len();
    let threads_before = ThreadCpu::now();
    let started = Instant::now();
    for fake in fakes {
        fake.push_texts(&backlog);
    }
    let is_answer = |c: &fake_bot::RecordedCall| {
        c.method == "sendMessage"
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.starts_with("ok "))
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    // A fake that served an earlier run has its calls still recorded.
    let mut progress: Vec<(usize, usize, Vec<usize>)> = fakes
        .iter()
        .map(|fake| (0, fake.calls().len(), Vec::new()))
        .collect();
    loop {
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
        idle_rss_per_bot,
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
    // One bot first, then all of them, on the same machine in one sitting.
    let one = runtime.block_on(run(&fakes[..1], per_chat));
    let many = runtime.block_on(run(&fakes, per_chat));
    let per_update = |run: &Run| run.telegate_cpu.as_secs_f64() * 1e6 / run.updates.max(1) as f64;
    let ratio = per_update(&many) / per_update(&one);
    println!("bots: 1 bot and {bots} bots, {CHATS} chats each, {per_chat} messages per chat");
    for (label, run) in [("1 bot", &one), ("fleet", &many)] {
        println!(
            "  {label}: {} updates in {:.2} s ({:.0}/s wall), telegate CPU {:.0} us per update",
            run.updates,
            run.wall.as_secs_f64(),
            run.updates as f64 / run.wall.as_secs_f64(),
            per_update(run)
        );
    }
    println!(
        "  CPU per update, {bots} bots over 1: {ratio:.2}  target <= {TARGET_CPU_RATIO:.2}; \
         idle RSS per bot {:.0} KiB  target < {:.0} KiB; load average {:.1}",
        many.idle_rss_per_bot / 1024.0,
        TARGET_RSS_PER_BOT / 1024.0,
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
        "bots/idle_rss_per_bot",
        many.idle_rss_per_bot,
        "bytes",
        Better::Lower,
        Some(TARGET_RSS_PER_BOT),
    );
    figure(
        "bots/load_average",
        load_average(),
        "load",
        Better::Lower,
        None,
    );
}
