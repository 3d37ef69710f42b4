//! The command backend's own overhead per turn: from the agent's process
//! being spawned to its first output reaching the fake Telegram Bot API,
//! minus what a bare spawn of the same program costs.
//!
//! Three figures, each the median over many turns (one chat per turn, so
//! every turn takes the same path: a fresh session, a store lookup for the
//! agent session to resume, a preview message):
//! * `in_process`: a message to the first preview at the fake Bot API with
//!   an in-process agent that streams the same text at once (intake,
//!   adapter, runner, delivery: everything but the command backend);
//! * `command`: the same with the claude preset running a script that
//!   prints the same text as its first stream-json events;
//! * `bare`: spawning that script with tokio and reading its first byte.
//!
//! telegate's overhead per command turn = command - in_process - bare.
//! Target: under 5 ms. Prints its figures; asserts nothing about time.

#[path = "support/allocator.rs"]
mod allocator;
#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::FakeBotApi;
use figures::{figure, Better};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::engine::AgentSetup;
use telegate::transport::telegram::TelegramBot;
use tokio::io::AsyncReadExt;

const TURNS: i64 = 40;
const TARGET_MS: f64 = 5.0;

/// Streams "ready" at once, answers a little later (like the script).
struct InProcess;

impl Agent for InProcess {
    fn name(&self) -> &str {
        "in-process"
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            turn.progress.push_text("ready");
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(AgentReply::new("done"))
        })
    }
}

fn script(dir: &Path) -> PathBuf {
    let path = dir.join("agent.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\n\
         echo '{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"bench-session\"}'\n\
         echo '{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"ready\"}]}}'\n\
         sleep 0.3\n\
         echo '{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"done\",\"total_cost_usd\":0.001,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}'\n",
    )
    .expect("script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn config(fake: &FakeBotApi, data_dir: &Path, agent: &str) -> Config {
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n\n\
         [delivery]\nper_chat_interval_ms = 0\nedit_interval_ms = 1\ngroup_messages_per_minute = 1000000\n\
         global_messages_per_second = 1000000\nstreaming = \"edit\"\n\n{agent}\n[store]\ndata_dir = \"{}\"\n\n[log]\nlevel = \"error\"\n",
        fake.token(),
        fake.url(),
        data_dir.display()
    );
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

/// Median time from a message to its first preview ("ready"), one chat
/// per turn, turns one after another.
async fn first_preview(fake: &FakeBotApi, bot_chats: std::ops::Range<i64>) -> Duration {
    let mut samples = Vec::new();
    for chat in bot_chats {
        let started = Instant::now();
        fake.push_text(chat, chat, "go");
        let shown = fake
            .wait_for(
                |calls| {
                    calls.iter().any(|c| {
                        c.chat_id() == Some(chat)
                            && c.outcome.is_ok()
                            && c.text().is_some_and(|t| t.contains("ready"))
                    })
                },
                Duration::from_secs(30),
            )
            .await;
        assert!(shown, "no preview in chat {chat}");
        samples.push(started.elapsed());
        // Let the turn finish so turns do not overlap.
        fake.wait_for(
            |calls| {
                calls.iter().any(|c| {
                    c.chat_id() == Some(chat) && c.text().is_some_and(|t| t.trim() == "done")
                })
            },
            Duration::from_secs(30),
        )
        .await;
    }
    median(samples)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn bare_spawn(script: &Path) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..TURNS {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(script)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut byte = [0u8; 1];
        let _ = stdout.read(&mut byte).await;
        samples.push(started.elapsed());
        let _ = child.kill().await;
    }
    median(samples)
}

async fn measure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = script(dir.path());

    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let bot = TelegramBot::start(
        &config(&fake, data.path(), "[agent]\nbackend = \"echo\"\n"),
        Some(AgentSetup::without_tools(Arc::new(InProcess))),
    )
    .await
    .expect("bot starts");
    let in_process = first_preview(&fake, 1..TURNS + 1).await;
    bot.shutdown().await;

    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let agent = format!(
        "[agent]\nbackend = \"command\"\n\n[agent.command]\npreset = \"claude\"\nprogram = \"{}\"\n",
        script.display()
    );
    let bot = TelegramBot::start(&config(&fake, data.path(), &agent), None)
        .await
        .expect("bot starts");
    let command = first_preview(&fake, 1..TURNS + 1).await;
    bot.shutdown().await;

    let bare = bare_spawn(&script).await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let overhead = ms(command) - ms(in_process) - ms(bare);
    println!("command backend: telegate's own overhead per turn (median of {TURNS} turns)");
    println!(
        "  message -> first preview: in-process agent {:.2} ms, claude-preset command {:.2} ms; bare spawn to first byte {:.2} ms",
        ms(in_process),
        ms(command),
        ms(bare)
    );
    println!(
        "  overhead = command - in-process - bare spawn = {overhead:.2} ms (target < {TARGET_MS} ms){}",
        if overhead < TARGET_MS { "" } else { "  [ABOVE TARGET]" }
    );
    figure(
        "command/in_process_first_preview",
        ms(in_process),
        "ms",
        Better::Lower,
        None,
    );
    figure(
        "command/command_first_preview",
        ms(command),
        "ms",
        Better::Lower,
        None,
    );
    figure("command/bare_spawn", ms(bare), "ms", Better::Lower, None);
    figure(
        "command/overhead_per_turn",
        overhead,
        "ms",
        Better::Lower,
        Some(TARGET_MS),
    );
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(measure());
}
