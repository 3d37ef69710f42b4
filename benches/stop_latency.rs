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
//!
//! Beside the wall-clock figures, telegate's CPU per trial (its runtime and
//! store threads, `support/figures.rs`): on a shared machine it swings far
//! less than the latencies. A trial's unit of work is the whole of it: the
//! turn streaming its preview for one to three edits, then its /stop (the
//! bench's own waits share telegate's runtime threads; they read the fake
//! in place, so they add next to nothing).

#[path = "support/allocator.rs"]
mod allocator;
#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::{FakeBotApi, FloodLimits, RecordedCall};
use figures::{figure, load_average, quantile, us, Better, ThreadCpu};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::engine::AgentSetup;
use telegate::transport::telegram::TelegramBot;

const TRIALS: usize = 100;
const AT_ONCE: usize = 10;
/// Every trial within this.
const TARGET: Duration = Duration::from_secs(1);
/// p99 of the trials.
const TARGET_P99: Duration = Duration::from_millis(100);

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

fn is_edit_to(c: &RecordedCall, chat: i64) -> bool {
    c.method == "editMessageText" && c.chat_id() == Some(chat) && c.outcome.is_ok()
}

fn is_stopped_in(c: &RecordedCall, chat: i64) -> bool {
    c.method == "sendMessage"
        && c.chat_id() == Some(chat)
        && c.text().is_some_and(|t| t.contains("⏹ Stopped."))
}

/// What one trial saw, all from the fake's records.
struct Trial {
    /// /stop pushed -> the "Stopped" request arrived.
    latency: Duration,
    /// /stop pushed -> handed out by getUpdates (the long poll's pickup:
    /// Telegram's side).
    pickup: Duration,
    /// Handed out -> the request to the chat in flight at that moment had
    /// its answer (zero if none was in flight).
    in_flight: Duration,
}

/// One trial in `chat`: stream, wait for `edits` preview edits plus a
/// phase offset, /stop; the latency seen by the fake.
async fn trial(fake: Arc<FakeBotApi>, chat: i64, edits: usize, phase: Duration) -> Option<Trial> {
    fake.push_text(chat, chat, "go");
    // Waits read the fake in place (no copy of its whole record per
    // call), so the bench's own waiting costs next to nothing of the CPU
    // counted as telegate's runtime.
    let streaming = fake
        .wait_until(
            |f| f.count_calls(|c| is_edit_to(c, chat)) >= edits,
            Duration::from_secs(60),
        )
        .await;
    if !streaming {
        return None;
    }
    tokio::time::sleep(phase).await;
    let pushed = Instant::now();
    let id = fake.push_text(chat, chat, "/stop");
    fake.wait_until(
        |f| f.count_calls(|c| is_stopped_in(c, chat)) > 0,
        Duration::from_secs(60),
    )
    .await;
    let calls = fake.calls_where(|c| c.chat_id() == Some(chat));
    let stopped = calls.iter().find(|c| is_stopped_in(c, chat))?.at;
    let handed = fake.handed_out_at(id).unwrap_or(pushed);
    let in_flight = calls
        .iter()
        .filter(|c| c.at <= handed)
        .filter_map(|c| match c.done {
            Some(done) if done > handed => Some(done - handed),
            Some(_) => None,
            None => Some(stopped.saturating_duration_since(handed)),
        })
        .max()
        .unwrap_or_default();
    Some(Trial {
        latency: stopped.saturating_duration_since(pushed),
        pickup: handed.saturating_duration_since(pushed),
        in_flight,
    })
}

async fn run() {
    let fake = Arc::new(FakeBotApi::start().await);
    fake.enforce_flood_limits(FloodLimits::telegram());
    let bot = TelegramBot::start(
        &config(&fake),
        Some(AgentSetup::without_tools(Arc::new(Streamer))),
    )
    .await
    .expect("bot starts");
    let mut trials = Vec::with_capacity(TRIALS);
    let mut lost = 0;
    let before = bot.delivery.stats();
    let cpu_before = ThreadCpu::now();
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
                Some(trial) => trials.push(trial),
                None => lost += 1,
            }
        }
    }
    let telegate_cpu = ThreadCpu::now().since(&cpu_before).telegate();
    let cpu_per_trial = us(telegate_cpu) / TRIALS as f64;
    let stats = bot.delivery.stats();
    let mut latencies: Vec<Duration> = trials.iter().map(|t| t.latency).collect();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let within = latencies.iter().filter(|l| **l <= TARGET).count();
    let pick = |q: f64| quantile(&latencies, q);
    println!("stop_latency: /stop -> \"Stopped\" recorded by the fake Bot API, streaming, default pacing");
    println!(
        "  {TRIALS} trials ({AT_ONCE} chats at once): p50 {:.0} ms, p99 {:.0} ms (target <= {} ms), max {:.0} ms",
        ms(pick(0.5)),
        ms(pick(0.99)),
        TARGET_P99.as_millis(),
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
    println!("  telegate CPU {cpu_per_trial:.0} us per trial (the streaming turn and its /stop)");
    // Where the time goes, on average per trial: the poll's pickup
    // (Telegram's side), a request to the chat in flight when /stop came,
    // the control reply's wait for the chat's turn and for its pacing
    // (telegate's delivery stats), and the rest (intake, inbox write,
    // stopping the turn).
    let mean = |f: &dyn Fn(&Trial) -> Duration| {
        let total: Duration = trials.iter().map(f).sum();
        ms(total) / trials.len().max(1) as f64
    };
    let control = (stats.control_sends - before.control_sends).max(1) as f64;
    let turn_wait =
        (stats.control_turn_wait_us - before.control_turn_wait_us) as f64 / 1e3 / control;
    let pace_wait =
        (stats.control_pace_wait_us - before.control_pace_wait_us) as f64 / 1e3 / control;
    let (total, pickup, in_flight) = (
        mean(&|t| t.latency),
        mean(&|t| t.pickup),
        mean(&|t| t.in_flight),
    );
    let rest = total - pickup - turn_wait - pace_wait;
    println!(
        "  mean per trial {total:.1} ms: getUpdates pickup {pickup:.1} ms, the chat's turn (a request in flight: \
         {in_flight:.1} ms) {turn_wait:.1} ms, pacing {pace_wait:.1} ms, the rest (intake, stopping the turn) {rest:.1} ms"
    );
    figure(
        "stop_latency/telegate_cpu_per_trial",
        cpu_per_trial,
        "us",
        Better::Lower,
        None,
    );
    figure(
        "stop_latency/mean_pickup",
        pickup,
        "ms",
        Better::Lower,
        None,
    );
    figure(
        "stop_latency/mean_in_flight",
        in_flight,
        "ms",
        Better::Lower,
        None,
    );
    figure(
        "stop_latency/mean_control_turn_wait",
        turn_wait,
        "ms",
        Better::Lower,
        None,
    );
    figure(
        "stop_latency/mean_control_pacing",
        pace_wait,
        "ms",
        Better::Lower,
        None,
    );
    figure("stop_latency/mean_rest", rest, "ms", Better::Lower, None);
    figure("stop_latency/p50", ms(pick(0.5)), "ms", Better::Lower, None);
    figure(
        "stop_latency/p99",
        ms(pick(0.99)),
        "ms",
        Better::Lower,
        Some(ms(TARGET_P99)),
    );
    figure(
        "stop_latency/max",
        ms(pick(1.0)),
        "ms",
        Better::Lower,
        Some(ms(TARGET)),
    );
    figure(
        "stop_latency/flood_429s",
        fake.flood_refusals() as f64,
        "429s",
        Better::Lower,
        Some(0.0),
    );
    figure(
        "stop_latency/lost_trials",
        lost as f64,
        "trials",
        Better::Lower,
        Some(0.0),
    );
    figure(
        "stop_latency/load_average",
        load_average(),
        "load",
        Better::Lower,
        None,
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
