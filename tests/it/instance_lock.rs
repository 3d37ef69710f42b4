//! One telegate per data directory, and a second poller elsewhere:
//!
//! * the built binary started twice on one `data_dir`: the second exits
//!   non-zero naming the first one's pid; with `--standby` it waits and
//!   takes over when the first exits, and every message is answered once;
//! * a 409 Conflict from getUpdates (another process polling the same
//!   token) is counted in `/metrics`, backed off, and the update it delayed
//!   is answered exactly once when the other poller goes away.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(30);

fn write_config(fake: &FakeBotApi, dir: &Path) -> PathBuf {
    let config = dir.join("telegate.toml");
    let text = TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[agent]\nbackend = \"echo\"\n\n[store]\ndata_dir = {}\n\n[log]\nlevel = \"info\"\n",
            toml::Value::String(dir.join("data").display().to_string()),
        ))
        .text();
    std::fs::write(&config, text).unwrap();
    config
}

/// A `telegate run` child whose stderr is collected.
struct Instance {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Instance {
    fn start(config: &Path, standby: bool) -> Instance {
        let mut command = Command::new(env!("CARGO_BIN_EXE_telegate"));
        command.arg("run").arg("--config").arg(config);
        if standby {
            command.arg("--standby");
        }
        let mut child = command
            .env_remove("TELEGRAM_BOT_TOKEN")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Instance { child, log }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    async fn wait_log(&self, needle: &str) -> bool {
        until(|| self.log().contains(needle)).await
    }

    fn terminate(&self) {
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
    }

    async fn exit_code(&mut self) -> Option<i32> {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the instance exits by itself; log:\n{}", self.log()))
            .unwrap();
        status.code()
    }
}

async fn until(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

fn answers(fake: &FakeBotApi, text: &str) -> usize {
    let wanted = format!("echo: {text}");
    fake.sent_texts(USER)
        .iter()
        .filter(|t| **t == wanted)
        .count()
}

fn lock_holder(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("data/telegate.lock"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_is_refused_and_a_standby_takes_over() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&fake, dir.path());

    let mut first = Instance::start(&config, false);
    fake.push_text(USER, USER, "one");
    assert!(
        until(|| answers(&fake, "one") == 1).await,
        "{}",
        first.log()
    );
    assert_eq!(lock_holder(dir.path()), Some(first.pid()));

    // A second instance exits at once, naming the first one's pid.
    let mut second = Instance::start(&config, false);
    let code = second.exit_code().await;
    assert_ne!(code, Some(0));
    let log = second.log();
    assert!(log.contains(&format!("pid {}", first.pid())), "{log}");
    assert!(log.contains("--standby"), "{log}");

    // A standby waits while the first one runs...
    let mut standby = Instance::start(&config, true);
    assert!(
        standby.wait_log("waiting for it to exit").await,
        "{}",
        standby.log()
    );
    fake.push_text(USER, USER, "two");
    assert!(until(|| answers(&fake, "two") == 1).await);
    // ...and takes over when it exits.
    first.terminate();
    assert_eq!(first.exit_code().await, Some(0), "{}", first.log());
    assert!(until(|| lock_holder(dir.path()) == Some(standby.pid())).await);
    fake.push_text(USER, USER, "three");
    assert!(
        until(|| answers(&fake, "three") == 1).await,
        "{}",
        standby.log()
    );
    standby.terminate();
    assert_eq!(standby.exit_code().await, Some(0), "{}", standby.log());
    for text in ["one", "two", "three"] {
        assert_eq!(answers(&fake, text), 1, "{text} answered once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_with_another_poller_is_counted_backed_off_and_runs_nothing_twice() {
    let fake = FakeBotApi::start().await;
    let agent = ScriptedAgent::new();
    let bot = TestBot::new(&fake)
        .users(&[USER])
        .toml("[delivery]\nper_chat_interval_ms = 1\n\n[store]\nin_memory = true\n")
        .agent(agent.clone())
        .start()
        .await
        .unwrap();
    // Another process polls the same token (without confirming anything):
    // each of its polls ends the bot's held poll with a 409.
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    fake.push_text(USER, USER, "hello");
    let deadline = tokio::time::Instant::now() + WAIT;
    while bot.metrics.getupdates_conflicts.get() < 2 && tokio::time::Instant::now() < deadline {
        let _ = client
            .post(fake.method_url("getUpdates"))
            .json(&serde_json::json!({ "timeout": 0 }))
            .send()
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(bot.metrics.getupdates_conflicts.get() >= 2);
    assert!(bot
        .metrics
        .render_prometheus()
        .contains("getupdates_conflicts_total"));
    // The other poller is gone: the message is answered, once.
    let answered = |_: &_| {
        fake.sent_texts(USER)
            .iter()
            .filter(|t| t.contains("answer:hello"))
            .count()
            >= 1
    };
    assert!(fake.wait_for(answered, WAIT).await);
    fake.push_text(USER, USER, "after");
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("answer:after")),
            WAIT
        )
        .await
    );
    assert_eq!(
        fake.sent_texts(USER)
            .iter()
            .filter(|t| t.contains("answer:hello"))
            .count(),
        1
    );
    bot.shutdown().await;
}
