//! The CLI presets finished, end to end with the fake `claude` / `codex`
//! of `tests/fixtures/`: Claude Code's permission prompt answered on
//! telegate's approval card (the fake calls `--permission-prompt-tool
//! mcp__telegate__approve` through the MCP server of its `--mcp-config`,
//! which is the built telegate binary in helper mode, as the real CLI
//! does), Claude's partial messages growing the preview before the end,
//! and Codex's running thread usage counted once per turn in /status.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support;
use support::buttons::{message_text, toasts, wait_button, wait_toast};
use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY};

const WAIT: Duration = Duration::from_secs(20);
const USER: i64 = 42;
const OTHER: i64 = 43;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A bot on `preset` with `extra` in `[agent.command]`, the fake agent
/// recording into `agent_dir`.
fn test_bot(
    fake: &FakeBotApi,
    preset: &str,
    agent_dir: &Path,
    data_dir: &Path,
    extra: &str,
) -> TestBot {
    let path = format!(
        "{}:{}",
        fixtures().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    TestBot::new(fake)
        .users(&[USER, OTHER])
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [agent]\nbackend = \"command\"\n\n\
             [agent.command]\npreset = \"{preset}\"\nkill_grace_ms = 300\n{extra}\n\
             env = {{ PATH = \"{path}\", FAKE_AGENT_DIR = \"{}\" }}\n\n\
             [store]\ndata_dir = \"{}\"\n",
            agent_dir.display(),
            data_dir.display()
        ))
}

/// [`test_bot`] on claude with its permission prompts through telegate.
fn permission_bot(fake: &FakeBotApi, agent_dir: &Path, data_dir: &Path, extra: &str) -> TestBot {
    test_bot(
        fake,
        "claude",
        agent_dir,
        data_dir,
        &format!(
            "permission_prompt = true\npermission_helper = \"{}\"\n{extra}",
            env!("CARGO_BIN_EXE_telegate")
        ),
    )
}

async fn wait_answer(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(
        |_| fake.sent_texts(USER).iter().any(|t| t.contains(needle)),
        WAIT,
    )
    .await
}

fn argv_log(agent_dir: &Path) -> String {
    std::fs::read_to_string(agent_dir.join("argv.log")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claudes_permission_prompt_is_the_approval_card_and_a_press_allows_it() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = permission_bot(&fake, agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "permission please");
    let (card, _, approve) = wait_button(&fake, USER, "Approve").await;
    let text = message_text(&fake, USER, card);
    assert!(
        text.contains("Claude Code wants to use the tool Bash") && text.contains("touch permitted"),
        "{text}"
    );
    // Another member is refused; nothing ran.
    fake.push_callback_query(USER, OTHER, card, &approve);
    assert!(wait_toast(&fake, "Only").await, "{:?}", toasts(&fake));
    assert!(!agent_dir.path().join("permitted").exists());
    fake.push_callback_query(USER, USER, card, &approve);
    assert!(
        wait_answer(&fake, "Permission allowed").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(
        agent_dir.path().join("permitted").exists(),
        "the allowed tool ran"
    );
    assert!(message_text(&fake, USER, card).contains("✅ Approved by"));

    let argv = argv_log(agent_dir.path());
    assert!(
        argv.contains("--permission-prompt-tool\tmcp__telegate__approve"),
        "{argv}"
    );
    let config_file = argv
        .split('\t')
        .skip_while(|a| *a != "--mcp-config")
        .nth(1)
        .unwrap()
        .to_string();
    assert!(
        config_file.starts_with(&data.path().display().to_string()),
        "the per-turn config lives in the data directory: {config_file}"
    );
    assert!(!Path::new(&config_file).exists(), "removed after the turn");
    assert!(
        !argv.contains("TELEGATE_PERMISSION_TOKEN"),
        "the token is never an argument"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_or_unanswered_permission_prompt_refuses_the_tool() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = permission_bot(
        &fake,
        agent_dir.path(),
        data.path(),
        "permission_timeout_secs = 2",
    )
    .start()
    .await
    .unwrap();
    fake.push_text(USER, USER, "permission please");
    let (card, _, deny) = wait_button(&fake, USER, "Deny").await;
    fake.push_callback_query(USER, USER, card, &deny);
    assert!(
        wait_answer(&fake, "Permission denied: denied by the user").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    // Nobody answers the next one: the timeout refuses it.
    fake.push_text(USER, USER, "permission again");
    assert!(
        wait_answer(&fake, "Permission denied: approval timed out").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(!agent_dir.path().join("permitted").exists());
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claudes_partial_messages_grow_the_preview_before_the_end() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "stream it");
    assert!(
        wait_answer(&fake, "Streaming the answer").await,
        "the streamed text shows: {:?}",
        fake.sent_texts(USER)
    );
    assert!(
        !fake.sent_texts(USER).iter().any(|t| t.contains("done")),
        "the agent is still waiting: the text came from the deltas"
    );
    std::fs::write(agent_dir.path().join("release"), "").unwrap();
    assert!(wait_answer(&fake, "Streaming the answer, done").await);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_running_thread_usage_is_counted_once_per_turn() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "codex", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    for (message, answer) in [
        ("one", "Codex answer 1"),
        ("two", "Codex answer 2"),
        ("three", "Codex answer 3"),
    ] {
        fake.push_text(USER, USER, message);
        assert!(
            wait_answer(&fake, answer).await,
            "{:?}",
            fake.sent_texts(USER)
        );
    }
    // The fake reports 1,000 → 2,000 → 3,000 input tokens (the thread's
    // total, as the real CLI does after `exec resume`): 3,000 were used.
    fake.push_text(USER, USER, "/status");
    assert!(wait_answer(&fake, "Agent usage").await);
    let status = fake
        .sent_texts(USER)
        .into_iter()
        .rfind(|t| t.contains("Agent usage"))
        .unwrap();
    assert!(
        status.contains("this session 3 turns, 3.0k tokens in (2.4k cached), 150 out"),
        "{status}"
    );
    bot.shutdown().await;
}
