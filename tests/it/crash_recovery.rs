//! Crash safety of the real binary (issue 6), seen from the chat.
//!
//! Every test runs the built `telegate run` as a child process, pointed at
//! the fake Telegram Bot API served by this test process, with the slow
//! `echo` backend (it streams word by word) and an SQLite store in a
//! temporary directory that successive processes share. Like Telegram, the
//! fake keeps each update until a `getUpdates` offset confirms it and serves
//! unconfirmed updates again to the next process; invariant 9 promises that
//! the inbox and outbox cover everything else. What is proven, from the
//! fake's recorded calls (what the user sees, edits included):
//!
//! * `kill -9` while a turn streams and two follow-ups wait in the queue:
//!   after a restart every message is answered exactly once, in its original
//!   order, the cut-short answer finishing in place in its old preview
//!   (`resume_interrupted = true`), or its sender is told once to send it
//!   again and the follow-ups are still answered (`false`);
//! * updates delivered again after they were answered (a lost offset
//!   confirmation), to a restarted process or to the running one, never
//!   start a second turn;
//! * `kill -9` while an answer streams as a draft (`streaming = "auto"`):
//!   the restart resumes it and sends the final answer once, with
//!   `sendMessage`, editing no message that was never sent; a restart after
//!   the answer but before its inbox row was closed sends nothing;
//! * `kill -9`, again and again, while 40 chats are answered: every update
//!   the process confirmed to Telegram is in the inbox after each kill, and
//!   no answer is ever sent twice (an answer whose send a kill cut short,
//!   its outcome unknown, is recorded as failed and never sent again);
//! * SIGTERM lets the process exit 0 within the grace period (plus a margin)
//!   and the turns it cut short are answered, once, after the restart; a
//!   second signal during the grace period exits at once (130) and the next
//!   start still works on the same store;
//! * `/healthz` and `/metrics` over HTTP follow what happens: updates,
//!   finished and cancelled turns, 429s, inbox states, a failing update
//!   source.
//!
//! Start, restart and shutdown times are printed (run with `--nocapture`)
//! and asserted only with generous bounds. Every wait is on a condition and
//! bounded; there are no fixed sleeps.

use crate::support;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::fake_bot::{Failure, FakeBotApi, Outcome, RecordedCall};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::config::{Config, Purpose};
use telegate::store::Store;
use telegate::transport::telegram::intake::AMBIGUOUS_SEND_NOTICE;
use telegate::vocab::InboxState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// The allowed user (and their private chat).
const USER: i64 = 42;
/// A second private chat of the same user.
const OTHER_CHAT: i64 = 43;
/// Upper bound of any single wait for a condition.
const WAIT: Duration = Duration::from_secs(20);
/// Lines of the child's log kept for failure messages.
const LOG_LINES: usize = 60;
/// What a user whose turn was cut short by a restart is told.
const RESTART_NOTICE: &str = "telegate restarted while working on this message";

// ---------------------------------------------------------------------------
// Configuration and data directory
// ---------------------------------------------------------------------------

/// What the tests vary in the configuration.
#[derive(Clone, Copy)]
struct Settings {
    /// How long an echo takes, streamed word by word.
    delay_ms: u64,
    resume_interrupted: bool,
    shutdown_grace_secs: u64,
    /// Serve `/healthz` and `/metrics` on this port of 127.0.0.1.
    metrics_port: Option<u16>,
    /// `[delivery] streaming`: most tests follow an edited preview.
    streaming: &'static str,
    /// `[telegram] topics` (with `require_mention = false`), if set.
    topics: Option<&'static str>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            delay_ms: 0,
            resume_interrupted: true,
            shutdown_grace_secs: 10,
            metrics_port: None,
            streaming: "edit",
            topics: None,
        }
    }
}

fn config_text(fake: &FakeBotApi, data_dir: &Path, s: Settings) -> String {
    let metrics = s
        .metrics_port
        .map(|port| format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"))
        .unwrap_or_default();
    let topics = s
        .topics
        .map(|mode| format!("[telegram]\nrequire_mention = false\ntopics = \"{mode}\"\n"))
        .unwrap_or_default();
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(topics)
        .toml(format!(
            "[sessions]\nbusy_mode = \"queue\"\nresume_interrupted = {resume}\n\
             shutdown_grace_secs = {grace}\n\n\
             [agent]\nbackend = \"echo\"\n\n[agent.echo]\ndelay_ms = {delay}\n\n\
             [store]\ndata_dir = {data_dir}\n\n\
             [delivery]\nstreaming = \"{streaming}\"\n\n\
             [log]\nlevel = \"info\"\n\n{metrics}",
            resume = s.resume_interrupted,
            grace = s.shutdown_grace_secs,
            delay = s.delay_ms,
            streaming = s.streaming,
            data_dir = toml::Value::String(data_dir.display().to_string()),
        ))
        .text()
}

/// A configuration file and the data directory successive processes share.
struct Deployment {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Deployment {
    fn new(fake: &FakeBotApi, settings: Settings) -> Deployment {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("telegate.toml");
        let deployment = Deployment { dir, config };
        deployment.configure(fake, settings);
        deployment
    }

    /// (Re)write the configuration; the data directory stays.
    fn configure(&self, fake: &FakeBotApi, settings: Settings) {
        let data_dir = self.dir.path().join("data");
        std::fs::write(&self.config, config_text(fake, &data_dir, settings))
            .expect("the configuration is written");
    }

    /// Open the store the processes used (none may be running).
    async fn open_store(&self) -> Store {
        let config =
            Config::load(&self.config, Purpose::Telegram).expect("the test configuration is valid");
        // The rows of the fake's bot (the bot `getMe` answers for).
        let bot = config.bots.first().expect("one bot").id;
        Store::open_async(config.store.database_path())
            .await
            .expect("the store opens after the process is gone")
            .for_bot(bot)
    }
}

// ---------------------------------------------------------------------------
// The binary as a child process
// ---------------------------------------------------------------------------

/// One `telegate run` process. Killed (SIGKILL) if dropped while running.
struct Binary {
    label: &'static str,
    child: Child,
    pid: libc::pid_t,
    spawned: Instant,
    /// The fake's next call sequence number when this process was spawned:
    /// every call from `first_seq` on is from this process (the previous one
    /// is gone by then).
    first_seq: u64,
    log: Arc<Mutex<VecDeque<String>>>,
    log_lines: watch::Receiver<usize>,
}

impl Binary {
    fn start(label: &'static str, deployment: &Deployment, fake: &FakeBotApi) -> Binary {
        let first_seq = next_seq(fake);
        let mut command = Command::new(env!("CARGO_BIN_EXE_telegate"));
        command
            .arg("run")
            .arg("--config")
            .arg(&deployment.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("NO_COLOR", "1");
        for var in [
            "TELEGRAM_BOT_TOKEN",
            "TELEGRAM_WEBHOOK_SECRET",
            "RUST_LOG",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            command.env_remove(var);
        }
        let spawned = Instant::now();
        let mut child = command.spawn().expect("the telegate binary starts");
        let pid = child.id().expect("a running child has a pid") as libc::pid_t;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (count_tx, log_lines) = watch::channel(0usize);
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap_or_else(PoisonError::into_inner);
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
                drop(log);
                count_tx.send_modify(|n| *n += 1);
            }
        });
        Binary {
            label,
            child,
            pid,
            spawned,
            first_seq,
            log,
            log_lines,
        }
    }

    /// The last lines of the process's log, for failure messages.
    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let lines: Vec<&str> = log.iter().map(String::as_str).collect();
        format!(
            "--- last log lines of {} ---\n{}",
            self.label,
            lines.join("\n")
        )
    }

    /// Wait until the process polls for updates (its restart recovery has
    /// run by then). Returns the time since spawn.
    async fn ready(&self, fake: &FakeBotApi) -> Duration {
        let first = self.first_seq;
        let polled = fake
            .wait_for(
                |calls| {
                    calls
                        .iter()
                        .any(|c| c.seq >= first && c.method == "getUpdates")
                },
                WAIT,
            )
            .await;
        assert!(
            polled,
            "{} never polled for updates\n{}",
            self.label,
            self.log_tail()
        );
        self.spawned.elapsed()
    }

    /// Wait until a log line contains `needle`.
    async fn wait_log(&mut self, needle: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let seen = self
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .any(|line| line.contains(needle));
            if seen {
                return;
            }
            match tokio::time::timeout_at(deadline, self.log_lines.changed()).await {
                Ok(Ok(())) => continue,
                _ => panic!(
                    "{} never logged {needle:?}\n{}",
                    self.label,
                    self.log_tail()
                ),
            }
        }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the pid of our own child, which is not reaped
        // before `wait_exit`, so the pid cannot have been reused.
        let sent = unsafe { libc::kill(self.pid, signal) };
        assert_eq!(sent, 0, "{}: kill({signal}) failed", self.label);
    }

    /// Wait (bounded) for the process to exit.
    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => panic!("{}: wait failed: {error}", self.label),
            Err(_) => panic!(
                "{} did not exit within {within:?}\n{}",
                self.label,
                self.log_tail()
            ),
        }
    }

    /// `kill -9`: no shutdown code runs at all.
    async fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit(WAIT).await;
    }

    /// SIGTERM; returns the exit status and how long the exit took.
    async fn terminate(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let asked = Instant::now();
        self.signal(libc::SIGTERM);
        let status = self.wait_exit(within).await;
        (status, asked.elapsed())
    }

    /// SIGTERM, and expect a clean exit (code 0).
    async fn stop(&mut self) {
        let (status, _) = self.terminate(WAIT).await;
        assert_eq!(
            status.code(),
            Some(0),
            "{} exited with {status}\n{}",
            self.label,
            self.log_tail()
        );
    }
}

// ---------------------------------------------------------------------------
// Reading the fake's record
// ---------------------------------------------------------------------------

fn next_seq(fake: &FakeBotApi) -> u64 {
    fake.calls().last().map_or(0, |c| c.seq + 1)
}

fn echo(text: &str) -> String {
    format!("echo: {text}")
}

/// The bot's visible messages in `chat` that carry an echo (final answers
/// and previews left behind), in message order, after edits.
fn echo_texts(fake: &FakeBotApi, chat: i64) -> Vec<String> {
    fake.sent_texts(chat)
        .into_iter()
        .filter(|t| t.starts_with("echo:"))
        .collect()
}

/// How often `text` is visible in `chat`.
fn visible_count(fake: &FakeBotApi, chat: i64, text: &str) -> usize {
    fake.sent_texts(chat).iter().filter(|t| *t == text).count()
}

/// Whether every text in `texts` is visible in `chat`.
fn all_visible(fake: &FakeBotApi, chat: i64, texts: &[String]) -> bool {
    let sent = fake.sent_texts(chat);
    texts.iter().all(|t| sent.contains(t))
}

/// Whether a `getUpdates` request confirmed `update_id` (asked for an
/// offset past it): the update is in the inbox by then (invariant 9).
fn confirmed(calls: &[RecordedCall], update_id: i64) -> bool {
    calls.iter().any(|c| {
        c.method == "getUpdates"
            && c.body
                .get("offset")
                .and_then(Value::as_i64)
                .is_some_and(|offset| offset > update_id)
    })
}

/// The raw update `update_id` exactly as the fake served it.
fn served_update(fake: &FakeBotApi, update_id: i64) -> Value {
    fake.calls_to("getUpdates")
        .iter()
        .find_map(|c| match &c.outcome {
            Outcome::Ok(Value::Array(updates)) => updates
                .iter()
                .find(|u| u["update_id"].as_i64() == Some(update_id))
                .cloned(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("update {update_id} was never served"))
}

/// A successful send or edit in `chat` whose text starts with `prefix`.
fn writes<'a>(
    calls: &'a [RecordedCall],
    chat: i64,
    prefix: &'a str,
) -> impl Iterator<Item = &'a RecordedCall> + 'a {
    calls.iter().filter(move |c| {
        matches!(c.method.as_str(), "sendMessage" | "editMessageText")
            && c.chat_id() == Some(chat)
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.starts_with(prefix))
    })
}

/// A turn in `chat` streams and its preview is recorded in the outbox: the
/// preview was sent and later edited (the record is written in between).
fn preview_recorded(calls: &[RecordedCall], chat: i64, since: u64) -> bool {
    let mut own = writes(calls, chat, "echo:").filter(|c| c.seq >= since);
    // One iterator: the edit is looked for after the send.
    own.any(|c| c.method == "sendMessage") && own.any(|c| c.method == "editMessageText")
}

/// The turn in `chat` is visibly running: "typing…" or a preview.
fn turn_visible(calls: &[RecordedCall], chat: i64, since: u64) -> bool {
    calls.iter().any(|c| {
        c.seq >= since
            && c.chat_id() == Some(chat)
            && c.outcome.is_ok()
            && (c.method == "sendChatAction"
                || (c.method == "sendMessage" && c.text().is_some_and(|t| t.starts_with("echo:"))))
    })
}

/// The message id of the first preview sent in `chat`.
fn preview_id(calls: &[RecordedCall], chat: i64) -> i64 {
    writes(calls, chat, "echo:")
        .find(|c| c.method == "sendMessage")
        .and_then(|c| match &c.outcome {
            Outcome::Ok(message) => message["message_id"].as_i64(),
            _ => None,
        })
        .expect("a preview was sent")
}

/// When `text` first became visible in `chat` (sequence number of the send
/// or edit that showed it).
fn first_shown(calls: &[RecordedCall], chat: i64, text: &str) -> Option<u64> {
    writes(calls, chat, text)
        .find(|c| c.text() == Some(text))
        .map(|c| c.seq)
}

async fn inbox_state(store: &Store, update_id: i64) -> (InboxState, Option<String>) {
    let entry = store
        .inbox()
        .inbox_entry(update_id)
        .await
        .expect("the store is readable")
        .unwrap_or_else(|| panic!("update {update_id} is in the inbox"));
    (entry.state, entry.reason)
}

// ---------------------------------------------------------------------------
// 1. kill -9 mid-turn
// ---------------------------------------------------------------------------

async fn crash_mid_turn_with_queued_follow_ups(resume: bool) {
    let fake = FakeBotApi::start().await;
    let settings = Settings {
        delay_ms: 3000,
        resume_interrupted: resume,
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let mut first = Binary::start("the first process", &deployment, &fake);
    let started_in = first.ready(&fake).await;

    let long = "alpha beta gamma delta epsilon zeta";
    let follow_ups = ["second message", "third message"];
    let u1 = fake.push_text(USER, USER, long);
    let since = first.first_seq;
    assert!(
        fake.wait_for(|calls| preview_recorded(calls, USER, since), WAIT)
            .await,
        "the first turn never streamed: {:?}\n{}",
        fake.sent_texts(USER),
        first.log_tail()
    );
    let u2 = fake.push_text(USER, USER, follow_ups[0]);
    let u3 = fake.push_text(USER, USER, follow_ups[1]);
    // The follow-ups are in the inbox (queued): the offset moved past them.
    assert!(
        fake.wait_for(|calls| confirmed(calls, u3), WAIT).await,
        "the follow-ups were never confirmed\n{}",
        first.log_tail()
    );
    first.kill9().await;
    assert!(
        echo_texts(&fake, USER).iter().all(|t| t != &echo(long)),
        "precondition: the first turn was still running at the kill (machine too slow?): {:?}",
        fake.sent_texts(USER)
    );

    let mut second = Binary::start("the restarted process", &deployment, &fake);
    let restarted_in = second.ready(&fake).await;
    let mut finals: Vec<String> = follow_ups.iter().map(|t| echo(t)).collect();
    if resume {
        finals.insert(0, echo(long));
    }
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &finals), WAIT)
            .await,
        "not every message was answered after the restart: {:?}\n{}",
        fake.sent_texts(USER),
        second.log_tail()
    );
    let answered_in = second.spawned.elapsed();
    // A clean stop waits for anything still running: nothing can arrive later.
    second.stop().await;
    println!(
        "kill -9 (resume_interrupted = {resume}): first start {started_in:?}, \
         restart until polling {restarted_in:?}, until all answered {answered_in:?}"
    );

    let calls = fake.calls();
    let texts = fake.sent_texts(USER);
    for text in &finals {
        assert_eq!(
            visible_count(&fake, USER, text),
            1,
            "{text:?} must be visible exactly once: {texts:?}"
        );
    }
    let order: Vec<u64> = finals
        .iter()
        .map(|t| first_shown(&calls, USER, t).expect("shown"))
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "answers out of order (first shown at seqs {order:?}): {texts:?}"
    );
    let notices: Vec<String> = texts
        .iter()
        .filter(|t| t.contains(RESTART_NOTICE))
        .cloned()
        .collect();

    // No half answer is left behind and nothing is answered twice.
    assert_eq!(
        echo_texts(&fake, USER),
        finals,
        "exactly the expected answers, in order"
    );
    // The message the first process was streaming into now carries the
    // outcome: the finished answer, or the notice.
    let history = fake.message_history(USER);
    let crash_preview = history
        .iter()
        .find(|m| m.message_id == preview_id(&calls, USER))
        .expect("the preview from before the crash");
    if resume {
        assert_eq!(
            crash_preview.text(),
            echo(long),
            "the resumed answer finished the preview sent before the crash"
        );
        assert!(notices.is_empty(), "no restart notice when resuming");
    } else {
        assert_eq!(
            notices.len(),
            1,
            "the interrupted message's sender is told exactly once: {texts:?}"
        );
        assert!(
            crash_preview.text().contains(RESTART_NOTICE),
            "the notice replaced the half-streamed preview: {texts:?}"
        );
        // The interrupted message never ran again.
        let restart = second.first_seq;
        assert!(
            writes(&calls, USER, "echo: alpha").all(|c| c.seq < restart),
            "the interrupted message ran again after the restart: {texts:?}"
        );
    }

    let store = deployment.open_store().await;
    let expected_first = if resume {
        InboxState::Answered
    } else {
        InboxState::Dropped
    };
    assert_eq!(inbox_state(&store, u1).await.0, expected_first);
    if !resume {
        assert_eq!(
            inbox_state(&store, u1).await.1.as_deref(),
            Some("interrupted by a restart")
        );
    }
    for update in [u2, u3] {
        assert_eq!(inbox_state(&store, update).await.0, InboxState::Answered);
    }
    assert!(store.inbox().open_inbox().await.unwrap().is_empty());
    // The resumed message is in the transcript once, not once per attempt.
    for session in store.sessions().list_sessions().await.unwrap() {
        let history = store
            .transcripts()
            .load_history(&session.session_id, None)
            .await
            .unwrap();
        for pair in history.windows(2) {
            assert!(
                !(pair[0].role == telegate::vocab::Role::User
                    && pair[1].role == telegate::vocab::Role::User
                    && pair[0].content == pair[1].content),
                "a user message was recorded twice in a row: {:?}",
                history
                    .iter()
                    .map(|e| (e.role, &e.content))
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_turn_resumes_every_message_once_in_order() {
    crash_mid_turn_with_queued_follow_ups(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_turn_without_resume_tells_the_sender_once_and_answers_the_rest() {
    crash_mid_turn_with_queued_follow_ups(false).await;
}

// ---------------------------------------------------------------------------
// 2. Redelivered updates
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_delivered_again_after_their_answer_never_run_twice() {
    let fake = FakeBotApi::start().await;
    let port = free_port();
    let settings = Settings {
        metrics_port: Some(port),
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let client = http_client();
    let base = format!("http://127.0.0.1:{port}");

    let mut first = Binary::start("the first process", &deployment, &fake);
    first.ready(&fake).await;
    let u1 = fake.push_text(USER, USER, "one");
    let u2 = fake.push_text(USER, USER, "two");
    let answered = [echo("one"), echo("two")];
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &answered), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        first.log_tail()
    );
    // Both are recorded as answered; then the process dies without any
    // shutdown code.
    wait_metric(
        &client,
        &base,
        "telegate_inbox_messages{state=\"answered\"}",
        |v| v == 2.0,
    )
    .await;
    first.kill9().await;
    let raw1 = served_update(&fake, u1);
    let raw2 = served_update(&fake, u2);

    // Telegram serves both again (as if the offset never reached it), then
    // a new message.
    fake.push_update(raw1.clone());
    fake.push_update(raw2);
    fake.push_text(USER, USER, "three");
    let mut second = Binary::start("the restarted process", &deployment, &fake);
    second.ready(&fake).await;
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("three")]), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        second.log_tail()
    );
    // And once more to the running process.
    fake.push_update(raw1);
    fake.push_text(USER, USER, "four");
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("four")]), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        second.log_tail()
    );
    let scrape = scrape(&client, &base).await;
    second.stop().await;

    assert_eq!(
        echo_texts(&fake, USER),
        ["one", "two", "three", "four"].map(echo),
        "every message answered once"
    );
    let calls = fake.calls();
    let restart = second.first_seq;
    let again: Vec<&RecordedCall> = calls
        .iter()
        .filter(|c| c.seq >= restart)
        .filter(|c| matches!(c.method.as_str(), "sendMessage" | "editMessageText"))
        .filter(|c| {
            c.text()
                .is_some_and(|t| t.contains("one") || t.contains("two"))
        })
        .collect();
    assert!(
        again.is_empty(),
        "a redelivered update ran again: {again:?}"
    );
    assert_eq!(
        sample(&scrape, "telegate_updates_duplicate_total"),
        Some(3.0),
        "three redeliveries recognised"
    );
    assert_eq!(
        sample(&scrape, "telegate_updates_received_total"),
        Some(2.0),
        "only the new messages count as received"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_recorded_but_not_confirmed_before_the_kill_runs_once() {
    let fake = FakeBotApi::start().await;
    let settings = Settings {
        delay_ms: 1500,
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    // The message is waiting when the bot starts; its first poll gets it,
    // the poll after it, which would confirm it, hangs: the update is
    // recorded and its turn starts, but Telegram never learns it arrived.
    let text = "recorded but never confirmed";
    let u1 = fake.push_text(USER, USER, text);
    fake.fail_next("getUpdates", 1, Failure::Delay(Duration::ZERO));
    fake.fail_next("getUpdates", 1, Failure::Delay(Duration::from_secs(120)));
    let mut first = Binary::start("the first process", &deployment, &fake);
    first.ready(&fake).await;
    let since = first.first_seq;
    assert!(
        fake.wait_for(|calls| preview_recorded(calls, USER, since), WAIT)
            .await,
        "the turn never streamed\n{}",
        first.log_tail()
    );
    assert_eq!(fake.pending_updates_len(), 1, "precondition: not confirmed");
    first.kill9().await;

    // The restart finds it twice: in its inbox (resumed) and from Telegram.
    let mut second = Binary::start("the restarted process", &deployment, &fake);
    second.ready(&fake).await;
    assert!(
        fake.wait_for(|calls| confirmed(calls, u1), WAIT).await,
        "the update was served again and confirmed\n{}",
        second.log_tail()
    );
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo(text)]), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        second.log_tail()
    );
    second.wait_log("already recorded, ignored").await;
    second.stop().await;
    assert_eq!(
        echo_texts(&fake, USER),
        [echo(text)],
        "answered once, in the preview from before the kill"
    );
    let store = deployment.open_store().await;
    assert_eq!(inbox_state(&store, u1).await.0, InboxState::Answered);
}

// ---------------------------------------------------------------------------
// 2b. kill -9 while an answer streams as a draft
// ---------------------------------------------------------------------------

/// Successful `sendMessageDraft` calls to `chat` from sequence `since` on.
fn drafts_since(calls: &[RecordedCall], chat: i64, since: u64) -> usize {
    calls
        .iter()
        .filter(|c| {
            c.seq >= since
                && c.method == "sendMessageDraft"
                && c.chat_id() == Some(chat)
                && c.outcome.is_ok()
        })
        .count()
}

/// Anything a turn shows in `chat` from `since` on: a draft, "typing…",
/// or a message.
fn turn_activity_since(calls: &[RecordedCall], chat: i64, since: u64) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.seq >= since && c.chat_id() == Some(chat))
        .filter(|c| {
            matches!(
                c.method.as_str(),
                "sendMessageDraft" | "sendChatAction" | "sendMessage" | "editMessageText"
            )
        })
        .map(|c| format!("{} {:?}", c.method, c.text()))
        .collect()
}

/// The message ids of successful `sendMessage` calls to `chat`.
fn sent_ids(calls: &[RecordedCall], chat: i64) -> Vec<i64> {
    calls
        .iter()
        .filter(|c| c.method == "sendMessage" && c.chat_id() == Some(chat))
        .filter_map(|c| match &c.outcome {
            Outcome::Ok(message) => message["message_id"].as_i64(),
            _ => None,
        })
        .collect()
}

/// Invariants 9 and 21 on the binary, with drafts (`streaming = "auto"`, a
/// private chat): `kill -9` while the answer streams as a draft (at least
/// two drafts recorded, no message sent yet). The restart resumes the
/// message and streams it again; the final answer is sent once with
/// `sendMessage`, no edit touches a message that was never sent (a draft is
/// not a message), and nothing is sent twice. Then the window a kill right
/// after the final `sendMessage` leaves (outbox: delivered; inbox row still
/// running) is recreated in the store: the next start finishes the row
/// without running or sending anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_draft_resumes_the_turn_and_sends_the_final_answer_once() {
    let fake = FakeBotApi::start().await;
    let settings = Settings {
        delay_ms: 3000,
        streaming: "auto",
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let mut first = Binary::start("the first process", &deployment, &fake);
    first.ready(&fake).await;

    let text = "one two three four five six seven eight nine ten";
    let u1 = fake.push_text(USER, USER, text);
    let since = first.first_seq;
    assert!(
        fake.wait_for(|calls| drafts_since(calls, USER, since) >= 2, WAIT)
            .await,
        "the answer never streamed as drafts: {:?}\n{}",
        turn_activity_since(&fake.calls(), USER, since),
        first.log_tail()
    );
    first.kill9().await;
    assert!(
        sent_ids(&fake.calls(), USER).is_empty(),
        "precondition: killed mid-draft, before any message (machine too slow?): {:?}",
        fake.sent_texts(USER)
    );

    let mut second = Binary::start("the restarted process", &deployment, &fake);
    second.ready(&fake).await;
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo(text)]), WAIT)
            .await,
        "the message was not answered after the restart: {:?}\n{}",
        fake.sent_texts(USER),
        second.log_tail()
    );
    // A clean stop waits for anything still running: nothing arrives later.
    second.stop().await;

    let calls = fake.calls();
    assert!(
        drafts_since(&calls, USER, second.first_seq) >= 1,
        "the resumed turn streamed as a draft again: {:?}",
        turn_activity_since(&calls, USER, second.first_seq)
    );
    let finals: Vec<&RecordedCall> = writes(&calls, USER, "echo:").collect();
    assert_eq!(
        finals.len(),
        1,
        "one write of the answer in all: {finals:?}"
    );
    assert_eq!(finals[0].method, "sendMessage");
    assert_eq!(finals[0].text(), Some(echo(text).as_str()));
    assert!(finals[0].seq >= second.first_seq);
    // No edit of a message that was never sent (a draft id is no message).
    let sent = sent_ids(&calls, USER);
    for call in calls.iter().filter(|c| c.chat_id() == Some(USER)) {
        if let Some(id) = call.body.get("message_id").and_then(Value::as_i64) {
            assert!(
                sent.contains(&id),
                "{} of message {id}, which was never sent: {:?}",
                call.method,
                call.body
            );
        }
    }
    // Nothing sent twice.
    let texts = fake.sent_texts(USER);
    let mut unique = texts.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        texts.len(),
        "a message was sent twice: {texts:?}"
    );
    assert_eq!(echo_texts(&fake, USER), [echo(text)]);
    let store = deployment.open_store().await;
    assert_eq!(inbox_state(&store, u1).await.0, InboxState::Answered);
    assert!(store.inbox().open_inbox().await.unwrap().is_empty());

    // A kill just after the final sendMessage, before the inbox row was
    // closed, leaves it running while the outbox records the answer as
    // delivered. The next start must finish the row, not run it again.
    // (Answered is final for the store's API: written here as SQL.)
    store.close().await.unwrap();
    let database = Config::load(&deployment.config, Purpose::Telegram)
        .expect("the test configuration is valid")
        .store
        .database_path();
    let reopened = rusqlite::Connection::open(&database).expect("the database opens");
    let changed = reopened
        .execute(
            "UPDATE inbox SET state = 'running', reason = NULL WHERE update_id = ?1",
            [u1],
        )
        .expect("the inbox row is updated");
    assert_eq!(changed, 1);
    drop(reopened);
    let mut third = Binary::start("the third process", &deployment, &fake);
    // Restart recovery has run once the process polls.
    third.ready(&fake).await;
    third.stop().await;
    let calls = fake.calls();
    let again = turn_activity_since(&calls, USER, third.first_seq);
    assert!(
        again.is_empty(),
        "an answered message ran or was sent again: {again:?}"
    );
    assert_eq!(echo_texts(&fake, USER), [echo(text)]);
    let store = deployment.open_store().await;
    assert_eq!(inbox_state(&store, u1).await.0, InboxState::Answered);
}

// ---------------------------------------------------------------------------
// 2c. kill -9, again and again, while many chats are answered
// ---------------------------------------------------------------------------

/// Chats and messages per chat of the flood.
const FLOOD_CHATS: i64 = 40;
const FLOOD_ROUNDS: usize = 10;
/// How many processes are killed before the last one finishes the work.
const FLOOD_KILLS: usize = 5;

/// The highest `getUpdates` offset the bot sent: every update below it was
/// confirmed to Telegram.
fn highest_offset(calls: &[RecordedCall]) -> i64 {
    calls
        .iter()
        .filter(|c| c.method == "getUpdates")
        .filter_map(|c| c.body.get("offset").and_then(Value::as_i64))
        .max()
        .unwrap_or(0)
}

/// Answers (echoes) sent by calls numbered `since` or later.
fn echoes_sent_since(calls: &[RecordedCall], since: u64) -> usize {
    calls
        .iter()
        .filter(|c| {
            c.seq >= since
                && c.method == "sendMessage"
                && c.outcome.is_ok()
                && c.text().is_some_and(|t| t.starts_with("echo:"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_batches_commit_loses_no_confirmed_update() {
    let fake = FakeBotApi::start().await;
    let port = free_port();
    let settings = Settings {
        metrics_port: Some(port),
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let client = http_client();
    let base = format!("http://127.0.0.1:{port}");
    // Everything is waiting when the first process starts: it records
    // update after update while the turns of many chats are answered.
    let mut pushed = Vec::new();
    for round in 0..FLOOD_ROUNDS {
        for chat in 0..FLOOD_CHATS {
            let text = format!("flood {round} in {chat}");
            let id = fake.push_text(1000 + chat, USER, &text);
            pushed.push((id, 1000 + chat, text));
        }
    }
    let total = pushed.len();
    // Each process is killed right after a call the fake recorded as an
    // answer sent (a few dozen into its run): answers of other chats are
    // then between their `sendMessage` and their outbox record.
    let mut confirmed_at_kills = Vec::new();
    for kill in 0..FLOOD_KILLS {
        let mut process = Binary::start("a process killed with -9", &deployment, &fake);
        let since = process.first_seq;
        let answers = 15 + 10 * kill;
        let answering = fake
            .wait_for(|calls| echoes_sent_since(calls, since) >= answers, WAIT)
            .await;
        process.kill9().await;
        assert!(
            answering,
            "kill {kill}: the process never sent {answers} answers\n{}",
            process.log_tail()
        );
        // Every update confirmed to Telegram is in the inbox.
        let offset = highest_offset(&fake.calls());
        let store = deployment.open_store().await;
        let mut missing = Vec::new();
        let mut confirmed = 0;
        for (id, _, _) in pushed.iter().filter(|(id, _, _)| *id < offset) {
            confirmed += 1;
            if store
                .inbox()
                .inbox_entry(*id)
                .await
                .expect("the store is readable")
                .is_none()
            {
                missing.push(*id);
            }
        }
        store.close().await.expect("the store closes");
        assert!(
            missing.is_empty(),
            "kill {kill}: confirmed to Telegram but not in the inbox: {missing:?}"
        );
        confirmed_at_kills.push(confirmed);
    }

    // The last process finishes every message.
    let mut last = Binary::start("the last process", &deployment, &fake);
    last.ready(&fake).await;
    let finished = |text: &str| {
        ["answered", "failed", "dropped"]
            .iter()
            .map(|state| {
                sample(
                    text,
                    &format!("telegate_inbox_messages{{state=\"{state}\"}}"),
                )
                .unwrap_or(0.0)
            })
            .sum::<f64>()
    };
    let deadline = Instant::now() + WAIT * 3;
    loop {
        let text = scrape(&client, &base).await;
        if finished(&text) >= total as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every message was finished\n{text}\n{}",
            last.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last.stop().await;

    // No answer is ever sent twice; one that is missing is one whose send
    // was cut by a kill with its outcome unknown, recorded as such (never
    // sent again: it may have arrived).
    let store = deployment.open_store().await;
    let mut twice = Vec::new();
    let mut ambiguous = 0;
    let mut arrived = 0;
    let mut unanswered_in: HashMap<i64, usize> = HashMap::new();
    for (id, chat, text) in &pushed {
        let count = visible_count(&fake, *chat, &echo(text));
        if count > 1 {
            twice.push((text.clone(), count));
        }
        let entry = store
            .inbox()
            .inbox_entry(*id)
            .await
            .expect("the store is readable")
            .unwrap_or_else(|| panic!("{text:?} is not in the inbox"));
        assert!(entry.state.is_terminal(), "{text:?} is {:?}", entry.state);
        if count == 0 {
            assert_eq!(
                entry.state,
                InboxState::Failed,
                "{text:?} was never answered, and its inbox row says {:?} ({:?})",
                entry.state,
                entry.reason
            );
        }
        if entry.state == InboxState::Failed {
            ambiguous += 1;
            arrived += count;
            if count == 0 {
                *unanswered_in.entry(*chat).or_default() += 1;
            }
        } else {
            assert_eq!(entry.state, InboxState::Answered, "{text:?}");
        }
    }
    store.close().await.expect("the store closes");
    assert!(
        twice.is_empty(),
        "answers sent again after a kill -9 ({} of {total}): {twice:?}",
        twice.len()
    );
    // Nothing is lost silently: whoever's answer may not have arrived was
    // told so.
    for (chat, unanswered) in &unanswered_in {
        let told = visible_count(&fake, *chat, AMBIGUOUS_SEND_NOTICE);
        assert!(
            told >= *unanswered,
            "chat {chat}: {unanswered} answers cut off by a kill, {told} notices"
        );
    }
    println!(
        "{FLOOD_KILLS} x kill -9 while {FLOOD_CHATS} chats were answered: {total} updates, \
         confirmed at the kills {confirmed_at_kills:?}, every confirmed one in the inbox, \
         none answered twice, {ambiguous} recorded as \
         ambiguous sends (a kill came between the intent and the outcome; not sent again), \
         {arrived} of them had reached the chat"
    );
}

// ---------------------------------------------------------------------------
// 3. SIGTERM
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_within_the_grace_and_the_next_start_finishes_the_work() {
    let fake = FakeBotApi::start().await;
    let grace = 1;
    let slow = Settings {
        delay_ms: 4000,
        shutdown_grace_secs: grace,
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, slow);

    // Two turns run (two chats) when SIGTERM arrives; they outlast the grace.
    let mut first = Binary::start("the first process", &deployment, &fake);
    first.ready(&fake).await;
    let first_text = "slow answer in the first chat";
    let other_text = "slow answer in the second chat";
    let u1 = fake.push_text(USER, USER, first_text);
    let u2 = fake.push_text(OTHER_CHAT, USER, other_text);
    let since = first.first_seq;
    assert!(
        fake.wait_for(
            |calls| preview_recorded(calls, USER, since)
                && preview_recorded(calls, OTHER_CHAT, since),
            WAIT
        )
        .await,
        "the turns never streamed\n{}",
        first.log_tail()
    );
    let bound = Duration::from_secs(grace + 10);
    let (status, took) = first.terminate(bound).await;
    println!("SIGTERM with two running turns: exited {status} after {took:?} (grace {grace} s)");
    assert_eq!(
        status.code(),
        Some(0),
        "a clean shutdown\n{}",
        first.log_tail()
    );
    assert!(took < bound, "took {took:?}");
    assert_eq!(
        visible_count(&fake, USER, &echo(first_text)),
        0,
        "precondition: cut short"
    );
    assert_eq!(
        visible_count(&fake, OTHER_CHAT, &echo(other_text)),
        0,
        "precondition: cut short"
    );

    // The next start resumes both and answers each once.
    let patient = Settings {
        shutdown_grace_secs: 30,
        ..slow
    };
    deployment.configure(&fake, patient);
    let mut second = Binary::start("the second process", &deployment, &fake);
    let restarted_in = second.ready(&fake).await;
    assert!(
        fake.wait_for(
            |_| all_visible(&fake, USER, &[echo(first_text)])
                && all_visible(&fake, OTHER_CHAT, &[echo(other_text)]),
            WAIT
        )
        .await,
        "the cut-short turns were not answered after the restart: {:?} {:?}\n{}",
        fake.sent_texts(USER),
        fake.sent_texts(OTHER_CHAT),
        second.log_tail()
    );
    println!(
        "restart after SIGTERM: polling after {restarted_in:?}, both answered after {:?}",
        second.spawned.elapsed()
    );

    // A second signal during the (long) grace period exits at once.
    let third_text = "cut short twice";
    let u3 = fake.push_text(USER, USER, third_text);
    let since = next_seq(&fake);
    assert!(
        fake.wait_for(|calls| preview_recorded(calls, USER, since), WAIT)
            .await,
        "the third turn never streamed\n{}",
        second.log_tail()
    );
    second.signal(libc::SIGTERM);
    second.wait_log("shutting down").await;
    let (status, took) = second.terminate(Duration::from_secs(5)).await;
    println!("second SIGTERM during a 30 s grace: exited {status} after {took:?}");
    assert_eq!(status.code(), Some(130), "{}", second.log_tail());
    assert_eq!(
        visible_count(&fake, USER, &echo(third_text)),
        0,
        "precondition: cut short"
    );

    // A third start still works on that store and finishes the work.
    let mut third = Binary::start("the third process", &deployment, &fake);
    third.ready(&fake).await;
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo(third_text)]), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        third.log_tail()
    );
    third.stop().await;

    assert_eq!(
        echo_texts(&fake, USER),
        [echo(first_text), echo(third_text)],
        "each answer once, finished in its preview"
    );
    assert_eq!(echo_texts(&fake, OTHER_CHAT), [echo(other_text)]);
    let store = deployment.open_store().await;
    for update in [u1, u2, u3] {
        assert_eq!(inbox_state(&store, update).await.0, InboxState::Answered);
    }
    assert!(store.inbox().open_inbox().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_while_the_bot_starts_still_shuts_it_down_cleanly() {
    let fake = FakeBotApi::start().await;
    let deployment = Deployment::new(&fake, Settings::default());
    let mut bot = Binary::start("the starting process", &deployment, &fake);
    let first = bot.first_seq;
    assert!(
        fake.wait_for(
            |calls| calls.iter().any(|c| c.seq >= first && c.method == "getMe"),
            WAIT
        )
        .await,
        "the bot never connected\n{}",
        bot.log_tail()
    );
    // Mid-start: connected, not polling yet.
    let (status, took) = bot.terminate(WAIT).await;
    println!("SIGTERM while starting: exited {status} after {took:?}");
    assert_eq!(
        status.code(),
        Some(0),
        "a signal during the start must not kill the process outright\n{}",
        bot.log_tail()
    );
    let mut again = Binary::start("the next process", &deployment, &fake);
    again.ready(&fake).await;
    fake.push_text(USER, USER, "still fine");
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("still fine")]), WAIT)
            .await,
        "{}",
        again.log_tail()
    );
    again.stop().await;
}

// ---------------------------------------------------------------------------
// 4. /healthz and /metrics
// ---------------------------------------------------------------------------

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// The value of the sample `series` (name with labels) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
}

async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let response = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("/metrics answers");
    assert_eq!(response.status(), 200);
    response.text().await.expect("a text body")
}

async fn health(client: &reqwest::Client, base: &str) -> (u16, Value) {
    let response = client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("/healthz answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// Scrape until `series` satisfies `ok` (bounded); returns the scrape.
async fn wait_metric(
    client: &reqwest::Client,
    base: &str,
    series: &str,
    ok: impl Fn(f64) -> bool,
) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = scrape(client, base).await;
        if sample(&text, series).is_some_and(&ok) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached the expected value:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Probe `/healthz` until its status is `status` (bounded); returns the body.
async fn wait_health(client: &reqwest::Client, base: &str, status: u16) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (got, body) = health(client, base).await;
        if got == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz never answered {status}; last {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_metrics_follow_the_bot_over_http() {
    let fake = FakeBotApi::start().await;
    let port = free_port();
    let settings = Settings {
        delay_ms: 1500,
        metrics_port: Some(port),
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let mut bot = Binary::start("the bot", &deployment, &fake);
    bot.ready(&fake).await;
    let client = http_client();
    let base = format!("http://127.0.0.1:{port}");

    let (status, body) = health(&client, &base).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok", "{body}");
    assert_eq!(body["updates"], "ok", "{body}");
    assert_eq!(body["store"], "ok", "{body}");
    let text = scrape(&client, &base).await;
    assert_eq!(sample(&text, "telegate_updates_received_total"), Some(0.0));
    assert_eq!(sample(&text, "telegate_turns_finished_total"), Some(0.0));

    // An answer, delayed by a 429 on its first message.
    fake.fail_next("sendMessage", 1, Failure::RetryAfter(1));
    fake.push_text(USER, USER, "hello there");
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("hello there")]), WAIT)
            .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        bot.log_tail()
    );
    let text = wait_metric(&client, &base, "telegate_turns_finished_total", |v| {
        v == 1.0
    })
    .await;
    assert_eq!(sample(&text, "telegate_updates_received_total"), Some(1.0));
    assert!(
        sample(&text, "telegate_telegram_retry_after_total").is_some_and(|v| v >= 1.0),
        "the 429 is counted:\n{text}"
    );
    wait_metric(
        &client,
        &base,
        "telegate_inbox_messages{state=\"answered\"}",
        |v| v == 1.0,
    )
    .await;

    // /stop during a slow turn.
    let since = next_seq(&fake);
    fake.push_text(USER, USER, "slow one two three four five");
    assert!(
        fake.wait_for(|calls| turn_visible(calls, USER, since), WAIT)
            .await,
        "{}",
        bot.log_tail()
    );
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER).iter().any(|t| t == "⏹ Stopped."),
            WAIT
        )
        .await,
        "{:?}\n{}",
        fake.sent_texts(USER),
        bot.log_tail()
    );
    let text = wait_metric(&client, &base, "telegate_turns_cancelled_total", |v| {
        v == 1.0
    })
    .await;
    assert_eq!(sample(&text, "telegate_updates_received_total"), Some(3.0));
    wait_metric(
        &client,
        &base,
        "telegate_inbox_messages{state=\"dropped\"}",
        |v| v == 1.0,
    )
    .await;

    // getUpdates starts failing (the held poll returns with the next
    // message, the polls after it fail): /healthz names the update source.
    fake.fail_next(
        "getUpdates",
        2,
        Failure::BadRequest("Bad Request: updates are unavailable".into()),
    );
    fake.push_text(USER, USER, "ping");
    let body = wait_health(&client, &base, 503).await;
    assert_eq!(body["status"], "unhealthy", "{body}");
    assert!(
        body["updates"]
            .as_str()
            .is_some_and(|r| r != "ok" && r.contains("getUpdates")),
        "the failing component is named: {body}"
    );
    assert_eq!(body["store"], "ok", "{body}");
    // It recovers with the first poll that succeeds again. (A long poll
    // answers when an update arrives or after its timeout; one more message
    // ends the poll that is waiting.)
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("ping")]), WAIT)
            .await,
        "{}",
        bot.log_tail()
    );
    fake.push_text(USER, USER, "pong");
    let body = wait_health(&client, &base, 200).await;
    assert_eq!(body["updates"], "ok", "{body}");
    assert!(
        fake.wait_for(|_| all_visible(&fake, USER, &[echo("pong")]), WAIT)
            .await,
        "{}",
        bot.log_tail()
    );
    let text = wait_metric(&client, &base, "telegate_turns_finished_total", |v| {
        v == 3.0
    })
    .await;
    assert_eq!(sample(&text, "telegate_updates_received_total"), Some(5.0));
    // hello, /stop, ping and pong are answered; the stopped turn's message
    // is dropped.
    let text = wait_metric(
        &client,
        &base,
        "telegate_inbox_messages{state=\"answered\"}",
        |v| v == 4.0,
    )
    .await;
    assert_eq!(
        sample(&text, "telegate_inbox_messages{state=\"dropped\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "telegate_inbox_messages{state=\"running\"}"),
        Some(0.0),
        "{text}"
    );
    bot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_long_poll_ends_normally_and_health_stays_ok() {
    let fake = FakeBotApi::start().await;
    let port = free_port();
    let settings = Settings {
        metrics_port: Some(port),
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let mut bot = Binary::start("the quiet bot", &deployment, &fake);
    bot.ready(&fake).await;
    let first = bot.first_seq;
    // Nobody writes: the first poll is held until its timeout, then
    // Telegram answers it with an empty batch.
    let ended = |calls: &[RecordedCall]| {
        calls
            .iter()
            .find(|c| c.seq >= first && c.method == "getUpdates")
            .is_some_and(|c| c.outcome != Outcome::Pending)
    };
    assert!(
        fake.wait_for(ended, Duration::from_secs(40)).await,
        "the first long poll never ended\n{}",
        bot.log_tail()
    );
    let poll = fake
        .calls_to("getUpdates")
        .into_iter()
        .find(|c| c.seq >= first)
        .expect("polled");
    assert_eq!(
        poll.outcome,
        Outcome::Ok(Value::Array(Vec::new())),
        "a quiet long poll must end with Telegram's empty answer, not be cut \
         short by the HTTP client (held {:?})\n{}",
        poll.at.elapsed(),
        bot.log_tail()
    );
    let client = http_client();
    let (status, body) = health(&client, &format!("http://127.0.0.1:{port}")).await;
    assert_eq!(status, 200, "a quiet bot is healthy: {body}");
    fake.push_text(USER, USER, "after the quiet");
    assert!(
        fake.wait_for(
            |_| all_visible(&fake, USER, &[echo("after the quiet")]),
            WAIT
        )
        .await,
        "{}",
        bot.log_tail()
    );
    bot.stop().await;
}

// ---------------------------------------------------------------------------
// kill -9 after a forum topic was made for the message
// ---------------------------------------------------------------------------

/// A forum the bot manages topics in (`topics = "auto"`).
const FORUM: i64 = -1_001_000_000_777;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_replayed_after_a_kill_runs_in_the_topic_made_for_it() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let settings = Settings {
        delay_ms: 3000,
        topics: Some("auto"),
        ..Settings::default()
    };
    let deployment = Deployment::new(&fake, settings);
    let mut first = Binary::start("the first process", &deployment, &fake);
    first.ready(&fake).await;
    let text = "alpha beta gamma delta epsilon zeta";
    fake.push_topic_text(FORUM, USER, None, text);
    let since = first.first_seq;
    assert!(
        fake.wait_for(|calls| preview_recorded(calls, FORUM, since), WAIT)
            .await,
        "the turn never streamed in its topic: {:?}\n{}",
        fake.sent_texts(FORUM),
        first.log_tail()
    );
    assert_eq!(fake.calls_to("createForumTopic").len(), 1);
    first.kill9().await;

    let mut second = Binary::start("the restarted process", &deployment, &fake);
    second.ready(&fake).await;
    assert!(
        fake.wait_for(|_| all_visible(&fake, FORUM, &[echo(text)]), WAIT)
            .await,
        "the replayed message was never answered: {:?}\n{}",
        fake.sent_texts(FORUM),
        second.log_tail()
    );
    second.stop().await;
    assert_eq!(
        fake.calls_to("createForumTopic").len(),
        1,
        "no second topic for the replayed message"
    );
    let topics = fake.topics(FORUM);
    let made = *topics.keys().next().expect("the topic made");
    let answered_in: Vec<Option<i64>> = fake
        .calls()
        .iter()
        .filter(|c| c.method == "sendMessage" && c.chat_id() == Some(FORUM) && c.outcome.is_ok())
        .filter(|c| c.text().is_some_and(|t| t.starts_with("echo:")))
        .map(|c| {
            c.body
                .get("message_thread_id")
                .and_then(serde_json::Value::as_i64)
        })
        .collect();
    assert!(
        !answered_in.is_empty() && answered_in.iter().all(|t| *t == Some(made)),
        "every send of the turn (both processes) is in the topic made for the message ({made}): {answered_in:?}"
    );
}
