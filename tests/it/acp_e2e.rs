//! The `acp` backend behind the real bot, end to end: the fake Bot API in
//! front, the fake ACP agent of `tests/fixtures/acp-agent` (a Python
//! program speaking the protocol from its spec) behind. The agent logs
//! every message it receives, so these tests see what telegate asked:
//! a prompt streams, tool calls and plans show, a permission request
//! becomes buttons only the starter may press, a timeout rejects, /stop
//! cancels (and kills an agent deaf to it), a restart, a crash or an idle
//! exit continues the session with `session/load`, file access stays in
//! the workdir, and usage reaches /status.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::fake_bot::FakeBotApi;
use support::fake_files::photo_json;
use support::test_bot::{TestBot, FAST_DELIVERY};

const WAIT: Duration = Duration::from_secs(20);
const USER: i64 = 42;
/// Another allowed user of the bot.
const OTHER: i64 = 43;

fn agent_program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/acp-agent")
}

/// A bot on the fake ACP agent recording into `agent_dir`; `extra` goes
/// into `[agent.acp]`, `env` into the agent's environment.
fn test_bot(fake: &FakeBotApi, agent_dir: &Path, data: &Path, extra: &str, env: &str) -> TestBot {
    TestBot::new(fake)
        .users(&[USER, OTHER])
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [sessions]\nshutdown_grace_secs = 1\n\n\
             [agent]\nbackend = \"acp\"\n\n\
             [agent.acp]\nprogram = \"{}\"\nkill_grace_ms = 300\ncancel_grace_ms = 500\n{extra}\n\
             env = {{ FAKE_ACP_DIR = \"{}\"{env} }}\n\n\
             [store]\ndata_dir = \"{}\"\n",
            agent_program().display(),
            agent_dir.display(),
            data.display()
        ))
}

/// A finished reply in the chat contains `needle`: a message whose text
/// now has it and no buttons (a running turn's preview has its Stop
/// button; the answer takes it away).
fn answered(fake: &FakeBotApi, needle: &str) -> bool {
    fake.message_history(USER).iter().any(|m| {
        let now = m.current();
        now.text.contains(needle) && now.reply_markup.is_none()
    })
}

async fn say_and_wait(fake: &FakeBotApi, text: &str, needle: &str) {
    fake.push_text(USER, USER, text);
    wait_answer(fake, needle).await;
}

async fn wait_answer(fake: &FakeBotApi, needle: &str) {
    assert!(
        fake.wait_for(|_| answered(fake, needle), WAIT).await,
        "no reply containing {needle:?}; sent: {:?}",
        fake.sent_texts(USER)
    );
}

/// Every version of every message the bot showed in the chat.
fn every_version(fake: &FakeBotApi) -> Vec<String> {
    fake.message_history(USER)
        .iter()
        .flat_map(|m| m.versions.iter().map(|v| v.text.clone()))
        .collect()
}

/// What the agent received: (pid, method, params), in order.
fn calls(agent_dir: &Path) -> Vec<(i64, String, Value)> {
    std::fs::read_to_string(agent_dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                v["pid"].as_i64().unwrap_or_default(),
                v["method"].as_str().unwrap_or_default().to_string(),
                v["params"].clone(),
            )
        })
        .collect()
}

fn methods(agent_dir: &Path) -> Vec<String> {
    calls(agent_dir)
        .into_iter()
        .map(|(_, method, _)| method)
        .filter(|m| m != "response")
        .collect()
}

/// The pids of every agent process started, in order.
fn pids(agent_dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(agent_dir.join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition()
}

/// (message id, label, callback data) of the buttons now shown in the chat.
fn buttons(fake: &FakeBotApi) -> Vec<(i64, String, String)> {
    let mut found = Vec::new();
    for message in fake.message_history(USER) {
        let Some(markup) = &message.current().reply_markup else {
            continue;
        };
        let markup = match markup {
            Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
            other => other.clone(),
        };
        for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
            for key in row.as_array().into_iter().flatten() {
                found.push((
                    message.message_id,
                    key["text"].as_str().unwrap_or_default().to_string(),
                    key["callback_data"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
        }
    }
    found
}

/// How many permission prompts the chat got.
fn prompts(fake: &FakeBotApi) -> usize {
    fake.message_history(USER)
        .iter()
        .filter(|m| m.versions[0].text.contains("⚠️ Permission"))
        .count()
}

async fn wait_button(fake: &FakeBotApi, label: &str) -> (i64, String, String) {
    assert!(
        fake.wait_for(|_| buttons(fake).iter().any(|b| b.1.contains(label)), WAIT)
            .await,
        "a {label} button: {:?}",
        fake.message_history(USER)
    );
    buttons(fake)
        .into_iter()
        .find(|b| b.1.contains(label))
        .unwrap()
}

fn toasts(fake: &FakeBotApi) -> Vec<String> {
    fake.calls_to("answerCallbackQuery")
        .iter()
        .map(|c| c.text().unwrap_or_default().to_string())
        .collect()
}

async fn wait_toast(fake: &FakeBotApi, needle: &str) {
    assert!(
        fake.wait_for(|_| toasts(fake).iter().any(|t| t.contains(needle)), WAIT)
            .await,
        "a toast {needle:?}: {:?}",
        toasts(fake)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_streams_and_tool_calls_plans_and_usage_show() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", "")
        .start()
        .await
        .unwrap();

    say_and_wait(
        &fake,
        "hello",
        "Answer 1 in fake-session-1 (0 earlier prompts)",
    )
    .await;
    // Streamed: the chat saw the answer grow before it was whole.
    let versions = every_version(&fake);
    assert!(
        versions
            .iter()
            .any(|t| t.starts_with("Answer 1") && !t.contains("earlier prompts")),
        "{versions:?}"
    );

    say_and_wait(&fake, "use a tool please", "The tool ran.").await;
    assert!(
        every_version(&fake).iter().any(|t| t.contains("🔧 ls -la")),
        "{:?}",
        every_version(&fake)
    );
    assert!(
        fake.sent_texts(USER)
            .iter()
            .any(|t| t.trim() == "Let me look.\n\nThe tool ran."),
        "the answer is the agent's text alone: {:?}",
        fake.sent_texts(USER)
    );
    say_and_wait(&fake, "make a plan", "planned").await;
    assert!(every_version(&fake)
        .iter()
        .any(|t| t.contains("📋 Plan 1/3: write the fix")));

    // One process, one session, for all three turns; no file access
    // offered without a workdir.
    assert_eq!(pids(agent_dir.path()).len(), 1);
    let calls = calls(agent_dir.path());
    let init = &calls.iter().find(|c| c.1 == "initialize").unwrap().2;
    assert_eq!(init["protocolVersion"], 1);
    assert_eq!(init["clientCapabilities"]["fs"]["readTextFile"], false);
    assert_eq!(init["clientCapabilities"]["fs"]["writeTextFile"], false);
    assert_eq!(init["clientCapabilities"]["terminal"], false);
    assert_eq!(
        methods(agent_dir.path()),
        [
            "initialize",
            "session/new",
            "session/prompt",
            "session/prompt",
            "session/prompt"
        ]
    );

    // Usage as the agent reported it: 3 turns of 20 in (5 cached), 10
    // out, and the cumulative cost's growth ($0.03).
    say_and_wait(&fake, "/status", "Agent usage").await;
    let status = fake
        .sent_texts(USER)
        .into_iter()
        .rfind(|t| t.contains("Agent usage"))
        .unwrap();
    assert!(
        status.contains("this session 3 turns, 75 tokens in (15 cached), 30 out, $0.0300"),
        "{status}"
    );
    assert!(
        status.contains("backend") || status.contains("acp"),
        "{status}"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_becomes_buttons_only_the_starter_may_press() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", "")
        .start()
        .await
        .unwrap();

    fake.push_text(USER, USER, "ask permission");
    let (prompt, _, always) = wait_button(&fake, "Allow always").await;
    let labels: Vec<String> = buttons(&fake)
        .into_iter()
        .filter(|b| b.0 == prompt)
        .map(|b| b.1)
        .collect();
    assert_eq!(labels, ["✅ Allow once", "☑️ Allow always", "🚫 Reject"]);
    let shown = fake
        .message_history(USER)
        .into_iter()
        .find(|m| m.message_id == prompt)
        .unwrap()
        .text()
        .to_string();
    assert!(
        shown.contains("Write notes.txt") && shown.contains("hello from the agent"),
        "the tool and its whole input: {shown}"
    );

    // Another member of the bot cannot answer it.
    fake.push_callback_query(USER, OTHER, prompt, &always);
    wait_toast(&fake, "Only").await;
    assert!(!answered(&fake, "permission:"));

    // The starter allows it always.
    fake.push_callback_query(USER, USER, prompt, &always);
    wait_toast(&fake, "Allow always.").await;
    wait_answer(&fake, "permission: allow-always").await;
    // The prompt's edit and the answer go out on their own: either may
    // reach the chat first.
    fake.wait_for(
        |_| {
            fake.message_history(USER)
                .iter()
                .any(|m| m.message_id == prompt && m.text().contains("chosen by"))
        },
        WAIT,
    )
    .await;
    let edited = fake
        .message_history(USER)
        .into_iter()
        .find(|m| m.message_id == prompt)
        .unwrap();
    assert!(
        edited.text().contains("☑️ Allow always — chosen by"),
        "{}",
        edited.text()
    );
    assert!(edited.current().reply_markup.is_none());
    let records = bot
        .store
        .approvals()
        .approval_records(&format!("agent:main:telegram:dm:{USER}"))
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (
            records[0].outcome.as_str(),
            records[0].option_id.as_deref(),
            records[0].decided_by
        ),
        ("chosen", Some("allow-always"), Some(USER as u64))
    );

    // Typed answers take the first option of their kind.
    fake.push_text(USER, USER, "ask permission again");
    assert!(fake.wait_for(|_| prompts(&fake) == 2, WAIT).await);
    say_and_wait(&fake, "/deny", "Denied").await;
    wait_answer(&fake, "permission: reject-once").await;
    // A typed answer is shown under its prompt too, and its buttons go.
    let second = |fake: &FakeBotApi| {
        fake.message_history(USER)
            .into_iter()
            .filter(|m| m.versions[0].text.contains("⚠️ Permission"))
            .nth(1)
            .unwrap()
    };
    assert!(
        fake.wait_for(
            |_| second(&fake)
                .text()
                .contains("🚫 Reject — chosen by User42"),
            WAIT
        )
        .await,
        "{}",
        second(&fake).text()
    );
    assert!(second(&fake).current().reply_markup.is_none());
    fake.push_text(USER, USER, "ask permission once more");
    assert!(fake.wait_for(|_| prompts(&fake) == 3, WAIT).await);
    say_and_wait(&fake, "yes", "Approved").await;
    wait_answer(&fake, "permission: allow-once").await;

    // /stop while one waits: the agent is told `cancelled`, then its turn
    // is cancelled.
    fake.push_text(USER, USER, "ask permission then stop");
    assert!(fake.wait_for(|_| prompts(&fake) == 4, WAIT).await);
    say_and_wait(&fake, "/stop", "⏹ Stopped").await;
    let cancelled = || {
        calls(agent_dir.path())
            .iter()
            .any(|(_, m, p)| m == "response" && p["result"]["outcome"]["outcome"] == "cancelled")
    };
    assert!(eventually(cancelled).await, "{:?}", calls(agent_dir.path()));
    assert!(eventually(|| methods(agent_dir.path()).contains(&"session/cancel".to_string())).await);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_permission_request_is_rejected() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let extra = "permission_timeout_secs = 1";
    let bot = test_bot(&fake, agent_dir.path(), data.path(), extra, "")
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "ask permission", "permission: reject-once").await;
    assert!(fake
        .sent_texts(USER)
        .iter()
        .any(|t| t.contains("No answer in time")));
    // The prompt says so and loses its buttons; the refusal is recorded.
    assert!(
        fake.wait_for(|_| answered(&fake, "⌛ No answer in time: refused"), WAIT)
            .await
    );
    let records = bot
        .store
        .approvals()
        .approval_records(&format!("agent:main:telegram:dm:{USER}"))
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        (records[0].outcome.as_str(), records[0].decided_by),
        ("timed_out", None)
    );

    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cancels_the_turn_and_kills_an_agent_deaf_to_it() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", "")
        .start()
        .await
        .unwrap();

    // An agent that honours session/cancel ends its turn and lives on.
    fake.push_text(USER, USER, "slow please");
    assert!(
        fake.wait_for(
            |_| every_version(&fake)
                .iter()
                .any(|t| t.contains("working on it")),
            WAIT
        )
        .await
    );
    say_and_wait(&fake, "/stop", "⏹ Stopped").await;
    assert!(eventually(|| methods(agent_dir.path()).contains(&"session/cancel".to_string())).await);
    say_and_wait(&fake, "hello", "Answer 2 in fake-session-1").await;
    assert_eq!(pids(agent_dir.path()).len(), 1, "the same process goes on");

    // One that ignores it is killed with its whole group after the grace.
    fake.push_text(USER, USER, "be deaf");
    let deaf = agent_dir.path().join("deaf.pids");
    assert!(eventually(|| deaf.exists()).await);
    let group: Vec<i32> = std::fs::read_to_string(&deaf)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(group.len(), 2);
    assert!(group.iter().all(|&p| pid_alive(p)));
    say_and_wait(&fake, "/stop", "⏹ Stopped").await;
    assert!(
        eventually(|| group.iter().all(|&p| !pid_alive(p))).await,
        "left running: {group:?}"
    );
    // The next message starts a new agent, which continues the session.
    say_and_wait(
        &fake,
        "again",
        "Answer 4 in fake-session-1 (3 earlier prompts)",
    )
    .await;
    assert_eq!(pids(agent_dir.path()).len(), 2);
    let last = calls(agent_dir.path());
    let new_pid = i64::from(pids(agent_dir.path())[1]);
    assert!(last.iter().any(|(pid, m, p)| *pid == new_pid
        && m == "session/load"
        && p["sessionId"] == "fake-session-1"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_with_session_load_and_new_starts_fresh() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, agent_dir.path(), data.path(), "", "");
    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "first", "Answer 1 in fake-session-1").await;
    bot.shutdown().await;
    let first = pids(agent_dir.path())[0];
    assert!(
        eventually(|| !pid_alive(first)).await,
        "shutdown ends the agent"
    );

    let bot = settings.start().await.unwrap();
    say_and_wait(
        &fake,
        "second",
        "Answer 2 in fake-session-1 (1 earlier prompts)",
    )
    .await;
    assert!(
        every_version(&fake).iter().all(|t| !t.contains("REPLAYED")),
        "the replayed history is not shown"
    );
    say_and_wait(&fake, "/new", "✨").await;
    say_and_wait(&fake, "third", "Answer 1 in fake-session-2").await;
    assert_eq!(
        methods(agent_dir.path()),
        [
            "initialize",
            "session/new",
            "session/prompt",
            "initialize",
            "session/load",
            "session/prompt",
            "session/new",
            "session/prompt"
        ]
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_session_load_a_restart_starts_fresh_once_and_says_so() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = ", FAKE_ACP_NO_LOAD = \"1\"";
    let settings = test_bot(&fake, agent_dir.path(), data.path(), "", env);
    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "first", "Answer 1 in fake-session-1").await;
    bot.shutdown().await;
    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "second", "Answer 1 in fake-session-2").await;
    say_and_wait(&fake, "third", "Answer 2 in fake-session-2").await;
    let notices = fake
        .sent_texts(USER)
        .iter()
        .filter(|t| t.contains("cannot continue a conversation"))
        .count();
    assert_eq!(notices, 1, "said once: {:?}", fake.sent_texts(USER));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_is_reported_and_an_idle_agent_exits_both_then_continue() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "idle_secs = 1", "")
        .start()
        .await
        .unwrap();
    say_and_wait(
        &fake,
        "please crash",
        "stopped unexpectedly (exit status 3)",
    )
    .await;
    assert!(
        answered(&fake, "boom, something broke"),
        "{:?}",
        fake.sent_texts(USER)
    );
    say_and_wait(&fake, "hello", "Answer 2 in fake-session-1").await;
    let second = pids(agent_dir.path())[1];
    // Idle for a second: it ends; the next message loads the session.
    assert!(
        eventually(|| !pid_alive(second)).await,
        "the idle agent ended"
    );
    say_and_wait(&fake, "hello again", "Answer 3 in fake-session-1").await;
    assert_eq!(pids(agent_dir.path()).len(), 3);
    let loads = methods(agent_dir.path())
        .iter()
        .filter(|m| *m == "session/load")
        .count();
    assert_eq!(loads, 2);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_not_logged_in_is_told_as_the_owners_to_fix_without_a_reset_hint() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", "")
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "you are not logged in", "is not logged in").await;
    let told = fake
        .sent_texts(USER)
        .into_iter()
        .find(|t| t.contains("is not logged in"))
        .unwrap();
    assert!(
        told.contains("The bot's owner needs to log it in"),
        "{told}"
    );
    assert!(
        !told.contains("/reset"),
        "starting over cannot log the agent in: {told}"
    );
    // The chat is free again: the next message is answered.
    say_and_wait(&fake, "hello", "Answer 2 in").await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_access_stays_inside_the_chats_workdir() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let extra = format!("workdir = \"{}/{{chat_id}}\"", work.path().display());
    let bot = test_bot(&fake, agent_dir.path(), data.path(), &extra, "")
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "write notes/today.txt", "wrote notes/today.txt").await;
    let written = work.path().join("42/notes/today.txt");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap(),
        "written by the agent"
    );
    let absolute = written.display().to_string();
    say_and_wait(
        &fake,
        &format!("read {absolute}"),
        "read: written by the agent",
    )
    .await;
    say_and_wait(
        &fake,
        "read /etc/hostname",
        "outside the session's working directory",
    )
    .await;
    say_and_wait(
        &fake,
        "write ../escape.txt",
        "outside the session's working directory",
    )
    .await;
    assert!(!work.path().join("escape.txt").exists());

    let calls = calls(agent_dir.path());
    let init = &calls.iter().find(|c| c.1 == "initialize").unwrap().2;
    assert_eq!(init["clientCapabilities"]["fs"]["readTextFile"], true);
    let new = &calls.iter().find(|c| c.1 == "session/new").unwrap().2;
    assert_eq!(new["cwd"], work.path().join("42").display().to_string());
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_goes_as_an_image_block_when_the_agent_takes_images() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = ", FAKE_ACP_IMAGES = \"1\"";
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", env)
        .start()
        .await
        .unwrap();
    let image: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let file = fake.files().add(image, "jpg");
    let mut media = photo_json(&file, "uphoto", 3000);
    media["caption"] = serde_json::json!("what is this?");
    fake.push_media(USER, USER, media);
    wait_answer(&fake, "[1 images, 0 links]").await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_does_not_start_is_stopped_and_reported() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = ", FAKE_ACP_INIT_HANG = \"1\"";
    let bot = test_bot(
        &fake,
        agent_dir.path(),
        data.path(),
        "start_timeout_secs = 1",
        env,
    )
    .start()
    .await
    .unwrap();
    say_and_wait(&fake, "hello", "did not answer `initialize` within 1 s").await;
    let pid = pids(agent_dir.path())[0];
    assert!(
        eventually(|| !pid_alive(pid)).await,
        "the silent agent was stopped"
    );
    bot.shutdown().await;

    let missing = format!("{}/no-such-agent", agent_dir.path().display());
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "", "")
        .adjust(move |config| {
            if let Some(acp) = config.agent.acp_mut() {
                acp.program = Some(missing.clone());
            }
        })
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "hello?", "not found. Check agent.acp.program").await;
    bot.shutdown().await;
}

/// A forum whose topics are conversations.
const FORUM: i64 = -1_001_000_000_555;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_topic_ends_its_idle_agent_and_leaves_another_topics() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let a = fake.add_topic(FORUM, "A");
    let b = fake.add_topic(FORUM, "B");
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, agent_dir.path(), data.path(), "idle_secs = 600", "")
        .toml("[telegram]\nrequire_mention = false\ntopics = \"per-topic\"\n")
        .toml("[delivery]\ngroup_messages_per_minute = 100000\n")
        .start()
        .await
        .unwrap();
    let answered_in_forum =
        |needle: &str| fake.sent_texts(FORUM).iter().any(|t| t.contains(needle));
    fake.push_topic_text(FORUM, USER, Some(a), "hello from a");
    assert!(
        fake.wait_for(|_| answered_in_forum("Answer 1"), WAIT).await,
        "{:?}",
        fake.sent_texts(FORUM)
    );
    fake.push_topic_text(FORUM, USER, Some(b), "hello from b");
    assert!(
        eventually(|| pids(agent_dir.path()).len() == 2).await,
        "one agent per topic"
    );
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(FORUM)
                .iter()
                .filter(|t| t.contains("Answer 1"))
                .count()
                == 2,
            WAIT
        )
        .await,
        "{:?}",
        fake.sent_texts(FORUM)
    );
    let (agent_a, agent_b) = (pids(agent_dir.path())[0], pids(agent_dir.path())[1]);
    assert!(pid_alive(agent_a) && pid_alive(agent_b), "both idle, kept");

    // Topic A is closed: its idle agent ends now, not after idle_secs.
    fake.close_topic_as_user(FORUM, USER, a);
    assert!(
        eventually(|| !pid_alive(agent_a)).await,
        "the closed topic's agent ended"
    );
    assert!(pid_alive(agent_b), "the other topic's agent is kept");
    bot.shutdown().await;
}
