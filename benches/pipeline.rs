//! Whole-pipeline throughput: updates from the fake Telegram Bot API, through
//! the real intake (inbox write), adapter, runner and delivery engine, to the
//! reply recorded by the fake server. 500 chats, a no-op agent, the rate
//! limiter's limits raised so the figure measures telegate, not Telegram's
//! flood limits. Also: the rate limiter's own cost per reservation.
//!
//! Prints its figures; asserts nothing about time (these machines are noisy).

#[path = "../tests/support/fake_bot.rs"]
mod fake_bot;
#[path = "../tests/support/fake_files.rs"]
mod fake_files;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::FakeBotApi;
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::delivery::{RateLimiter, RateLimits};
use telegate::transport::telegram::TelegramBot;

const CHATS: i64 = 500;
const PER_CHAT: usize = 4;

struct NoOp;

impl Agent for NoOp {
    fn name(&self) -> &str {
        "noop"
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move { Ok(AgentReply::new(format!("ok {}", turn.text))) })
    }
}

fn config(fake: &FakeBotApi, data_dir: &Path) -> Config {
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n\n\
         [sessions]\nbusy_mode = \"queue\"\nmax_pending = 1000\n\n\
         [delivery]\nper_chat_interval_ms = 0\ngroup_messages_per_minute = 1000000\n\
         global_messages_per_second = 1000000\n\n[store]\ndata_dir = \"{}\"\n\n[log]\nlevel = \"error\"\n",
        fake.token(),
        fake.url(),
        data_dir.display()
    );
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

async fn pipeline() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let bot = TelegramBot::start_with_agent(&config(&fake, data.path()), Arc::new(NoOp))
        .await
        .expect("bot starts");
    let total = CHATS as usize * PER_CHAT;
    let started = Instant::now();
    for round in 0..PER_CHAT {
        for chat in 1..=CHATS {
            fake.push_text(chat, chat, &format!("m{round}"));
        }
    }
    let answered = |calls: &[fake_bot::RecordedCall]| {
        calls
            .iter()
            .filter(|c| {
                c.method == "sendMessage"
                    && c.outcome.is_ok()
                    && c.text().is_some_and(|t| t.starts_with("ok "))
            })
            .count()
    };
    let done = fake
        .wait_for(|calls| answered(calls) >= total, Duration::from_secs(300))
        .await;
    let elapsed = started.elapsed();
    let got = answered(&fake.calls());
    println!("pipeline: {CHATS} chats x {PER_CHAT} messages = {total} updates");
    println!(
        "  {} answered in {:.2} s: {:.0} updates/s end to end (inbox write, turn, transcript, delivery){}",
        got,
        elapsed.as_secs_f64(),
        got as f64 / elapsed.as_secs_f64(),
        if done { "" } else { "  [INCOMPLETE]" }
    );
    bot.shutdown().await;
}

fn rate_limiter_overhead() {
    let mut limiter = RateLimiter::new(RateLimits::default());
    let n = 1_000_000u64;
    let start = std::time::Instant::now();
    let mut now = start;
    for i in 0..n {
        // 500 chats at the default limits, time advancing 40 ms per call
        // (about the global 30/s pace): steady-state bookkeeping.
        now += Duration::from_millis(40);
        std::hint::black_box(limiter.reserve((i % 500) as i64, i % 7 == 0, now));
    }
    let per_call = start.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "rate limiter: {per_call:.0} ns per reservation over {n} reservations across 500 chats"
    );
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(pipeline());
    rate_limiter_overhead();
}
