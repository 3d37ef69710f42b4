//! /stop → "Stopped" while an answer streams, default pacing (issue 9).
//!
//! 100 trials: a turn streams text (so its preview is edited about once a
//! second and Telegram's per-chat pacing is in use), then /stop arrives at
//! a varying phase of the edit cycle. The figure is the time from pushing
//! /stop into the fake Bot API to the fake recording the "⏹ Stopped." send.
//! Target: every trial within 1 s. The fake enforces Telegram's flood
//! limits; the 429s it had to give are printed too (target 0).
//!
//! Ten chats run their trials at once (ten rounds), as a busy bot would.

#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::{FakeBotApi, FloodLimits, RecordedCall};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::transport::telegram::TelegramBot;

const TRIALS: usize = 100;
const AT_ONCE: usize = 10;
const TARGET: Duration = Duration::from_secs(1);

/// Streams a word every 50 ms until cancelled.
struct Streamer;

impl Agent for Streamer {
    fn name(&self) -> &str {
        "streamer"
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            for i in 0.. {
                turn.progress.push_text(&format!("word{i} "));
                tokio::select! {
                    _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            Ok(AgentReply::new("unreachable"))
        })
    }
}

fn config(fake: &FakeBotApi) -> Config {
    // Default pacing; answers stream by edits (the preview /stop marks).
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n\n\
         [delivery]\nstreaming = \"edit\"\n\n[store]\nin_memory = true\n\n[log]\nlevel = \"error\"\n",
        fake.token(),
        fake.url()
    );
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

fn edits_to(calls: &[RecordedCall], chat: i64) -> usize {
    calls
        .iter()
        .filter(|c| c.method == "editMessageText" && c.chat_id() == Some(chat) && c.outcome.is_ok())
        .count()
}

fn stopped_at(calls: &[RecordedCall], chat: i64) -> Option<Instant> {
    calls
        .iter()
        .find(|c| {
            c.method == "sendMessage"
                && c.chat_id() == Some(chat)
                && c.text().is_some_and(|t| t.contains("⏹ Stopped."))
        })
        .map(|c| c.at)
}

/// One trial in `chat`: stream, wait for `edits` preview edits plus a
/// phase offset, /stop; the latency seen by the fake.
async fn trial(
    fake: Arc<FakeBotApi>,
    chat: i64,
    edits: usize,
    phase: Duration,
) -> Option<Duration> {
    fake.push_text(chat, chat, "go");
    let streaming = fake
        .wait_for(
            |calls| edits_to(calls, chat) >= edits,
            Duration::from_secs(60),
        )
        .await;
    if !streaming {
        return None;
    }
    tokio::time::sleep(phase).await;
    let pushed = Instant::now();
    fake.push_text(chat, chat, "/stop");
    fake.wait_for(
        |calls| stopped_at(calls, chat).is_some(),
        Duration::from_secs(60),
    )
    .await;
    stopped_at(&fake.calls(), chat).map(|at| at.saturating_duration_since(pushed))
}

async fn run() {
    let fake = Arc::new(FakeBotApi::start().await);
    fake.enforce_flood_limits(FloodLimits::telegram());
    let bot = TelegramBot::start_with_agent(&config(&fake), Arc::new(Streamer))
        .await
        .expect("bot starts");
    let mut latencies = Vec::with_capacity(TRIALS);
    let mut lost = 0;
    for round in 0..TRIALS / AT_ONCE {
        let mut tasks = Vec::new();
        for slot in 0..AT_ONCE {
            let n = round * AT_ONCE + slot;
            let chat = 1000 + n as i64;
            // Vary where in the edit cycle /stop lands.
            let edits = 1 + n % 3;
            let phase = Duration::from_millis((n as u64 * 97) % 1000);
            tasks.push(tokio::spawn(trial(fake.clone(), chat, edits, phase)));
        }
        for task in tasks {
            match task.await.ok().flatten() {
                Some(latency) => latencies.push(latency),
                None => lost += 1,
            }
        }
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let within = latencies.iter().filter(|l| **l <= TARGET).count();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    println!("stop_latency: /stop -> \"Stopped\" recorded by the fake Bot API, streaming, default pacing");
    println!(
        "  {TRIALS} trials ({AT_ONCE} chats at once): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(pick(0.5)),
        ms(pick(0.99)),
        ms(pick(1.0))
    );
    println!(
        "  within {} ms: {within}/{TRIALS} (target: {TRIALS}/{TRIALS}){}",
        TARGET.as_millis(),
        if lost > 0 {
            format!("; {lost} trials got no Stopped reply")
        } else {
            String::new()
        }
    );
    println!(
        "  429 answers from the fake's flood limits: {} (target: 0)",
        fake.flood_refusals()
    );
    bot.shutdown().await;
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run());
}
