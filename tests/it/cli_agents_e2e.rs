//! Claude Code and Codex behind the real bot, end to end: the fake Bot API
//! in front, the fake `claude` and `codex` executables of `tests/fixtures/`
//! (first on the program's `PATH`) behind. They print the documented JSONL
//! events and record their argv, so these tests see exactly what telegate
//! asked the agent to do: continue a session (`--resume ID`,
//! `exec resume ID -`), start fresh after /new or an expired id, show tool
//! progress, stop the whole process group, survive garbage lines, and
//! report usage in /status.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY};

const WAIT: Duration = Duration::from_secs(20);
const USER: i64 = 42;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A bot on `preset`, its fake agent recording into `agent_dir`.
pub(crate) fn test_bot(
    fake: &FakeBotApi,
    preset: &str,
    agent_dir: &Path,
    data_dir: &Path,
    extra: &str,
) -> TestBot {
    agent_bot(
        fake,
        agent_dir,
        data_dir,
        &format!("preset = \"{preset}\"\n{extra}"),
    )
}

/// A bot whose `[agent.command]` section is `body` (plus the fake agent's
/// environment).
fn agent_bot(fake: &FakeBotApi, agent_dir: &Path, data_dir: &Path, body: &str) -> TestBot {
    let path = format!(
        "{}:{}",
        fixtures().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [agent]\nbackend = \"command\"\n\n\
             [agent.command]\nkill_grace_ms = 300\n{body}\n\
             env = {{ PATH = \"{path}\", FAKE_AGENT_DIR = \"{}\" }}\n\n\
             [store]\ndata_dir = \"{}\"\n",
            agent_dir.display(),
            data_dir.display()
        ))
}

fn sent_ok(fake: &FakeBotApi, needle: &str) -> bool {
    fake.calls().iter().any(|c| {
        c.method == "sendMessage"
            && c.chat_id() == Some(USER)
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.contains(needle))
    })
}

/// A finished reply (not a live preview, which shows tool lines) in the
/// chat contains `needle`. Final replies may be edits of the preview.
fn answered(fake: &FakeBotApi, needle: &str) -> bool {
    fake.sent_texts(USER)
        .iter()
        .any(|t| t.contains(needle) && !t.contains("🔧"))
}

async fn say_and_wait(fake: &FakeBotApi, text: &str, needle: &str) {
    fake.push_text(USER, USER, text);
    assert!(
        fake.wait_for(|_| answered(fake, needle), WAIT).await,
        "no reply containing {needle:?} to {text:?}; sent: {:?}",
        fake.sent_texts(USER)
    );
}

/// Every recorded invocation, as its argv (without the program).
pub(crate) fn invocations(agent_dir: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(agent_dir.join("argv.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('\t').skip(1).map(str::to_string).collect())
        .collect()
}

pub(crate) fn resumed_id(argv: &[String], flag: &str) -> Option<String> {
    argv.iter()
        .position(|a| a == flag)
        .and_then(|i| argv.get(i + 1).cloned())
}

fn count_sent(fake: &FakeBotApi, needle: &str) -> usize {
    fake.sent_texts(USER)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_turns_continue_one_session_across_a_restart_and_new_starts_fresh() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, "claude", agent_dir.path(), data.path(), "");

    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "first", "Answer 1 in claude-session-1").await;
    say_and_wait(&fake, "second", "Answer 2 in claude-session-1").await;
    bot.shutdown().await;

    // A new telegate process on the same data directory continues.
    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "third", "Answer 3 in claude-session-1").await;

    let calls = invocations(agent_dir.path());
    assert_eq!(calls.len(), 3);
    assert_eq!(
        &calls[0][..4],
        ["-p", "--output-format", "stream-json", "--verbose"]
    );
    assert_eq!(resumed_id(&calls[0], "--resume"), None);
    assert_eq!(
        resumed_id(&calls[1], "--resume").as_deref(),
        Some("claude-session-1")
    );
    assert_eq!(
        resumed_id(&calls[2], "--resume").as_deref(),
        Some("claude-session-1")
    );
    // The message went to stdin, never into argv.
    assert!(calls.iter().flatten().all(|a| a != "third"));

    // /new drops the resume id: the agent starts a fresh session.
    say_and_wait(&fake, "/new", "✨").await;
    say_and_wait(&fake, "fourth", "Answer 1 in claude-session-2").await;
    let calls = invocations(agent_dir.path());
    assert_eq!(resumed_id(&calls[3], "--resume"), None);

    // /status: this session's usage and the total, with cost.
    say_and_wait(&fake, "/status", "Agent usage").await;
    let status = fake
        .sent_texts(USER)
        .into_iter()
        .rfind(|t| t.contains("Agent usage"))
        .unwrap();
    assert!(
        status.contains("this session 1 turn, 150 tokens in (50 cached), 20 out, $0.0125"),
        "{status}"
    );
    assert!(
        status.contains("all sessions: 4 turns, 600 tokens in (200 cached), 80 out, $0.0500"),
        "{status}"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claude_session_starts_fresh_once_with_one_notice() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "one", "Answer 1 in claude-session-1").await;
    // The agent forgets the session (expired, cleaned up, another machine).
    std::fs::remove_file(agent_dir.path().join("sessions/claude-session-1")).unwrap();
    say_and_wait(&fake, "two", "Answer 1 in claude-session-2").await;
    assert_eq!(count_sent(&fake, "could not be resumed"), 1);
    let reply = fake
        .sent_texts(USER)
        .into_iter()
        .rfind(|t| t.contains("claude-session-2"))
        .unwrap();
    assert!(
        reply.starts_with("ℹ️ The agent's previous session could not be resumed"),
        "{reply}"
    );
    assert_eq!(
        reply.lines().filter(|l| !l.trim().is_empty()).count(),
        2,
        "{reply}"
    );
    // And the fresh session is the one continued afterwards, without a notice.
    say_and_wait(&fake, "three", "Answer 2 in claude-session-2").await;
    assert_eq!(count_sent(&fake, "could not be resumed"), 1);
    let calls = invocations(agent_dir.path());
    let resumes: Vec<Option<String>> = calls.iter().map(|c| resumed_id(c, "--resume")).collect();
    assert_eq!(
        resumes,
        [
            None,
            Some("claude-session-1".to_string()),
            None,
            Some("claude-session-2".to_string())
        ]
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_progress_lines_appear_in_the_preview_and_the_answer_is_final() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "slow one");
    let shows_tool = |calls: &[support::fake_bot::RecordedCall]| {
        calls.iter().any(|c| {
            c.outcome.is_ok()
                && c.chat_id() == Some(USER)
                && c.text().is_some_and(|t| t.contains("🔧 Bash: cargo test"))
        })
    };
    assert!(
        fake.wait_for(shows_tool, WAIT).await,
        "no preview with the tool line: {:?}",
        fake.calls()
    );
    // The agent is still waiting: the line came from the live preview.
    assert!(!sent_ok(&fake, "Answer 1"));
    std::fs::write(agent_dir.path().join("release"), "").unwrap();
    assert!(
        fake.wait_for(
            |calls| calls.iter().any(|c| c.outcome.is_ok()
                && c.text()
                    .is_some_and(|t| t.trim() == "Answer 1 in claude-session-1")),
            WAIT
        )
        .await,
        "the final message is the agent's answer alone: {:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_the_agent_and_its_children_and_the_next_message_continues() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "hang please");
    let pids_file = agent_dir.path().join("pids");
    assert!(eventually(|| pids_file.exists()).await);
    let pids: Vec<i32> = std::fs::read_to_string(&pids_file)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|&p| pid_alive(p)));
    say_and_wait(&fake, "/stop", "⏹ Stopped").await;
    assert!(
        eventually(|| pids.iter().all(|&p| !pid_alive(p))).await,
        "processes left: {pids:?}"
    );
    // The stopped turn's agent session is continued by the next message.
    say_and_wait(&fake, "go on", "Answer 2 in claude-session-1").await;
    let calls = invocations(agent_dir.path());
    assert_eq!(
        resumed_id(&calls[1], "--resume").as_deref(),
        Some("claude-session-1")
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lines_and_unknown_events_do_not_break_the_turn() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "malformed please", "Answer 1 in claude-session-1").await;
    let texts = fake.sent_texts(USER);
    assert!(texts.iter().all(|t| !t.contains("⚠️")), "{texts:?}");
    assert!(texts.iter().all(|t| !t.contains("not JSON")), "{texts:?}");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_threads_continue_and_an_unknown_thread_starts_fresh() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let extra = "model = \"gpt-test\"\npermission_mode = \"workspace-write\"";
    let bot = test_bot(&fake, "codex", agent_dir.path(), data.path(), extra)
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "one", "Codex answer 1 in codex-thread-1").await;
    // Tool lines of Codex items reach the chat's live preview.
    fake.push_text(USER, USER, "slow two");
    let shows_tool = |calls: &[support::fake_bot::RecordedCall]| {
        calls.iter().any(|c| {
            c.outcome.is_ok()
                && c.text()
                    .is_some_and(|t| t.contains("🔧 Shell: bash -lc ls"))
        })
    };
    assert!(fake.wait_for(shows_tool, WAIT).await, "{:?}", fake.calls());
    std::fs::write(agent_dir.path().join("release"), "").unwrap();
    // The final answer replaces the preview in place.
    let answered = |calls: &[support::fake_bot::RecordedCall]| {
        calls.iter().any(|c| {
            c.outcome.is_ok()
                && c.text()
                    .is_some_and(|t| t.trim() == "Codex answer 2 in codex-thread-1")
        })
    };
    assert!(
        fake.wait_for(answered, WAIT).await,
        "{:?}",
        fake.sent_texts(USER)
    );
    std::fs::remove_file(agent_dir.path().join("threads/codex-thread-1")).unwrap();
    say_and_wait(&fake, "three", "Codex answer 1 in codex-thread-2").await;
    assert_eq!(count_sent(&fake, "could not be resumed"), 1);
    let calls = invocations(agent_dir.path());
    let joined: Vec<String> = calls.iter().map(|c| c.join(" ")).collect();
    assert_eq!(
        joined,
        [
            "exec --json --skip-git-repo-check --model gpt-test --sandbox workspace-write -",
            "exec --json --skip-git-repo-check --model gpt-test --sandbox workspace-write resume codex-thread-1 -",
            "exec --json --skip-git-repo-check --model gpt-test --sandbox workspace-write resume codex-thread-1 -",
            "exec --json --skip-git-repo-check --model gpt-test --sandbox workspace-write -",
        ]
    );
    say_and_wait(&fake, "/status", "Agent usage").await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workdir_per_chat_is_created_private_and_used() {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let extra = format!("workdir = \"{}/chat-{{chat_id}}\"", work.path().display());
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), &extra)
        .start()
        .await
        .unwrap();
    say_and_wait(&fake, "hi", "Answer 1").await;
    let dir = work.path().join(format!("chat-{USER}"));
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    bot.shutdown().await;
}

/// A photo of `size` bytes from the user, with a caption.
fn push_photo(fake: &FakeBotApi, size: usize, caption: &str) {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(size).collect();
    let file = fake.files().add(bytes, "jpg");
    let unique = fake.files().unique_id(&file);
    let mut media = support::fake_files::photo_json(&file, &unique, size);
    media["caption"] = serde_json::json!(caption);
    fake.push_media(USER, USER, media);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_reads_a_photo_by_its_path_in_a_directory_it_was_given() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    push_photo(&fake, 3000, "what is this?");
    assert!(
        fake.wait_for(|_| answered(&fake, "read image of 3000 bytes"), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let calls = invocations(agent_dir.path());
    let dir = resumed_id(&calls[0], "--add-dir").expect("--add-dir given");
    assert!(dir.starts_with(&data.path().display().to_string()), "{dir}");
    // `--add-dir` takes several values: the next argument is an option.
    let at = calls[0].iter().position(|a| a == "--add-dir").unwrap();
    assert!(calls[0][at + 2].starts_with("--"), "{:?}", calls[0]);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_gets_photos_with_image_on_fresh_and_resumed_runs() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, "codex", agent_dir.path(), data.path(), "")
        .start()
        .await
        .unwrap();
    push_photo(&fake, 1200, "first");
    say_and_wait_for(&fake, "in codex-thread-1 (images of bytes: 1200)").await;
    push_photo(&fake, 700, "second");
    say_and_wait_for(&fake, "in codex-thread-1 (images of bytes: 700)").await;
    let calls = invocations(agent_dir.path());
    let shape = |argv: &[String]| -> Vec<String> {
        argv.iter()
            .map(|a| {
                if a.starts_with('/') {
                    "PATH".to_string()
                } else {
                    a.clone()
                }
            })
            .collect()
    };
    assert_eq!(
        shape(&calls[0]).join(" "),
        "exec --image PATH --json --skip-git-repo-check -"
    );
    assert_eq!(
        shape(&calls[1]).join(" "),
        "exec --json --skip-git-repo-check resume codex-thread-1 --image PATH -"
    );
    bot.shutdown().await;
}

async fn say_and_wait_for(fake: &FakeBotApi, needle: &str) {
    assert!(
        fake.wait_for(|_| answered(fake, needle), WAIT).await,
        "no reply containing {needle:?}; sent: {:?}",
        fake.sent_texts(USER)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_argv_with_resume_args_continues_the_session_across_stop_and_restart() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let body = format!(
        "argv = [\"{}\", \"-p\", \"{{resume}}\", \"--output-format\", \"stream-json\"]\n\
         protocol = \"claude-stream-json\"\nstdin = true\n\
         resume_args = [\"--resume\", \"{{resume_id}}\"]",
        fixtures().join("claude").display()
    );
    let settings = agent_bot(&fake, agent_dir.path(), data.path(), &body);
    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "one", "Answer 1 in claude-session-1").await;
    say_and_wait(&fake, "two", "Answer 2 in claude-session-1").await;
    // Stopped mid-turn: the session id came with the init event.
    fake.push_text(USER, USER, "hang please");
    let pids = agent_dir.path().join("pids");
    assert!(eventually(|| pids.exists()).await);
    say_and_wait(&fake, "/stop", "⏹ Stopped").await;
    bot.shutdown().await;

    let bot = settings.start().await.unwrap();
    say_and_wait(&fake, "four", "Answer 4 in claude-session-1").await;
    say_and_wait(&fake, "/new", "✨").await;
    say_and_wait(&fake, "five", "Answer 1 in claude-session-2").await;
    let calls: Vec<String> = invocations(agent_dir.path())
        .iter()
        .map(|c| c.join(" "))
        .collect();
    assert_eq!(
        calls,
        [
            "-p --output-format stream-json",
            "-p --resume claude-session-1 --output-format stream-json",
            "-p --resume claude-session-1 --output-format stream-json",
            "-p --resume claude-session-1 --output-format stream-json",
            "-p --output-format stream-json",
        ]
    );
    bot.shutdown().await;
}
