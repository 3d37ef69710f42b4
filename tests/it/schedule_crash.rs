//! Scheduled runs survive `kill -9` exactly once, on the real binary
//! against the fake Bot API (the slow `echo` backend, a file store shared
//! by successive processes):
//!
//! * two jobs run every few seconds while the process is killed again and
//!   again just before, during and just after a due run: afterwards every
//!   instant from the first to the last was journaled exactly once (the
//!   inbox holds one row per (job, instant), with no gap), every run ended
//!   (answered, or failed as an ambiguous send whose user was told), and
//!   no instant's answer is visible twice or was sent as a new message
//!   twice;
//! * a restart after a two-hour outage runs the newest missed instant once,
//!   labelled late, with `catch_up = "latest"`, and nothing with `"none"`;
//!   the job's next run is in the future either way.
//!
//! Real time, a bounded number of kills (the whole file takes well under
//! a minute); every wait is on a condition and bounded.

use crate::support;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::config::{Config, Purpose};
use telegate::schedule::{run_of, Action, Schedule};
use telegate::store::{now_ms, NewJob, Store};
use telegate::transport::telegram::intake::AMBIGUOUS_SEND_NOTICE;
use telegate::vocab::InboxState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(20);

fn config_text(fake: &FakeBotApi, data_dir: &Path, catch_up: &str) -> String {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[sessions]\nbusy_mode = \"queue\"\nshutdown_grace_secs = 5\n\n\
             [agent]\nbackend = \"echo\"\n\n[agent.echo]\ndelay_ms = 400\n\n\
             [store]\ndata_dir = {data_dir}\n\n\
             [schedule]\ntimezone = \"UTC\"\ncatch_up = \"{catch_up}\"\nmin_interval = \"1s\"\n\n\
             [delivery]\nstreaming = \"edit\"\n\n[log]\nlevel = \"info\"\n",
            data_dir = toml::Value::String(data_dir.display().to_string()),
        ))
        .text()
}

struct Deployment {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Deployment {
    fn new(fake: &FakeBotApi, catch_up: &str) -> Deployment {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("telegate.toml");
        std::fs::write(
            &config,
            config_text(fake, &dir.path().join("data"), catch_up),
        )
        .unwrap();
        Deployment { dir, config }
    }

    async fn open_store(&self) -> Store {
        let config = Config::load(&self.config, Purpose::Telegram).unwrap();
        // The rows of the fake's bot (the bot `getMe` answers for).
        let bot = config.bots.first().expect("one bot").id;
        Store::open_async(config.store.database_path())
            .await
            .unwrap()
            .for_bot(bot)
    }
}

/// One `telegate run`; killed if dropped.
struct Binary {
    child: Child,
    pid: libc::pid_t,
    first_seq: u64,
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Binary {
    fn start(deployment: &Deployment, fake: &FakeBotApi) -> Binary {
        let first_seq = fake.calls().last().map_or(0, |c| c.seq + 1);
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
            "RUST_LOG",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
        ] {
            command.env_remove(var);
        }
        let mut child = command.spawn().expect("the telegate binary starts");
        let pid = child.id().expect("a pid") as libc::pid_t;
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = sink.lock().unwrap_or_else(PoisonError::into_inner);
                if log.len() == 80 {
                    log.pop_front();
                }
                log.push_back(line);
            }
        });
        Binary {
            child,
            pid,
            first_seq,
            log,
        }
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Wait for a log line containing `needle`.
    async fn wait_log(&self, needle: &str) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            if self.log_tail().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Polling for updates: recovery has run, the scheduler started.
    async fn ready(&self, fake: &FakeBotApi) {
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
        assert!(polled, "never polled\n{}", self.log_tail());
    }

    async fn kill9(&mut self) {
        // SAFETY: kill(2) on our own child, not reaped before the wait below.
        assert_eq!(unsafe { libc::kill(self.pid, libc::SIGKILL) }, 0);
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("exits after SIGKILL")
            .unwrap();
    }

    async fn stop(&mut self) {
        // SAFETY: as in `kill9`.
        assert_eq!(unsafe { libc::kill(self.pid, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("exits after SIGTERM")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{}", self.log_tail());
    }
}

/// Every journaled run: (job, instant in unix seconds) -> inbox state and
/// the reason it was dropped or failed.
async fn runs(store: &Store) -> BTreeMap<(i64, i64), (InboxState, Option<String>)> {
    let ids: Vec<i64> = store
        .call(|conn| {
            let mut statement =
                conn.prepare("SELECT update_id FROM inbox WHERE update_id < -4611686018427387904")?;
            let rows = statement.query_map([], |r| r.get::<_, i64>(0))?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
        .unwrap();
    let mut found = BTreeMap::new();
    for id in ids {
        let (job, instant) = run_of(id).expect("a run id");
        let entry = store.inbox().inbox_entry(id).await.unwrap().unwrap();
        found.insert((job, instant.as_second()), (entry.state, entry.reason));
    }
    found
}

/// The due-time words of a prompt run's answer (`today 10:00:02`), which
/// the echo repeats from the run's text.
fn due_of(text: &str) -> Option<String> {
    let start = text.find("), due ")? + "), due ".len();
    let rest = &text[start..];
    Some(rest[..rest.find('.')?].to_string())
}

async fn wait_text(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(
        |_| fake.sent_texts(USER).iter().any(|t| t.contains(needle)),
        WAIT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_around_due_runs_neither_loses_nor_repeats_a_run() {
    let fake = FakeBotApi::start().await;
    let deployment = Deployment::new(&fake, "all");
    let mut binary = Binary::start(&deployment, &fake);
    binary.ready(&fake).await;
    fake.push_text(USER, USER, "/every 2s ping");
    assert!(
        wait_text(&fake, "⏰ Job 1:").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    fake.push_text(USER, USER, "/every 3s remind: tick");
    assert!(
        wait_text(&fake, "⏰ Job 2:").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    // The instants of job 1 are whole seconds 2 s apart from its creation:
    // aim each kill at a point around the next one (before, on, after it).
    let offsets_ms: [i64; 10] = [-250, -60, 0, 15, 60, 150, 300, 500, 800, -5];
    for (round, offset) in offsets_ms.iter().enumerate() {
        let now = now_ms();
        // A second and a bit ahead: a run of one job or the other is due
        // at every whole second of most rounds.
        let next_second = (now / 1000 + 2) * 1000;
        let target = next_second + offset + (round as i64 * 37 % 50);
        let wait = (target - now).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        binary.kill9().await;
        binary = Binary::start(&deployment, &fake);
        binary.ready(&fake).await;
    }
    // A last stretch without kills, then the jobs go and everything settles.
    tokio::time::sleep(Duration::from_secs(3)).await;
    fake.push_text(USER, USER, "/unschedule 1");
    assert!(
        wait_text(&fake, "🗑 Job 1 deleted.").await,
        "{}",
        binary.log_tail()
    );
    fake.push_text(USER, USER, "/unschedule 2");
    assert!(wait_text(&fake, "🗑 Job 2 deleted.").await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    binary.stop().await;

    let store = deployment.open_store().await;
    let journaled = runs(&store).await;
    for (job, every) in [(1i64, 2i64), (2, 3)] {
        let instants: Vec<i64> = journaled
            .keys()
            .filter(|(j, _)| *j == job)
            .map(|(_, at)| *at)
            .collect();
        assert!(instants.len() >= 6, "job {job} ran {instants:?}");
        for pair in instants.windows(2) {
            assert_eq!(
                pair[1] - pair[0],
                every,
                "job {job}: an instant missed or doubled in {instants:?}"
            );
        }
    }
    // Every run ended: answered, or failed as an ambiguous send (told).
    let failed = journaled
        .values()
        .filter(|(state, _)| *state == InboxState::Failed)
        .count();
    println!(
        "{} runs journaled over {} kills, {failed} ambiguous sends",
        journaled.len(),
        offsets_ms.len()
    );
    for (run, (state, reason)) in &journaled {
        assert!(
            matches!(state, InboxState::Answered | InboxState::Failed),
            "run {run:?} is {state:?} ({reason:?}); log:\n{}",
            binary.log_tail()
        );
    }
    let notices = fake
        .sent_texts(USER)
        .iter()
        .filter(|t| t.contains(AMBIGUOUS_SEND_NOTICE))
        .count();
    assert_eq!(notices, failed, "each ambiguous send is told once");

    // Job 1's answers, by instant: visible once if answered, at most once
    // if ambiguous; never sent as a new message twice.
    let visible: Vec<String> = fake
        .sent_texts(USER)
        .into_iter()
        .filter(|t| t.starts_with("⏰ Job 1 — ping"))
        .collect();
    let mut seen = BTreeSet::new();
    for text in &visible {
        let due = due_of(text).unwrap_or_else(|| panic!("no due time in {text:?}"));
        assert!(
            seen.insert(due.clone()),
            "the answer for {due} is visible twice"
        );
    }
    let answered_1 = journaled
        .iter()
        .filter(|((job, _), (state, _))| *job == 1 && *state == InboxState::Answered)
        .count();
    assert!(
        visible.len() >= answered_1,
        "{} visible, {answered_1} answered",
        visible.len()
    );
    let mut sent_per_due: BTreeMap<String, usize> = BTreeMap::new();
    for call in fake.calls_to("sendMessage") {
        if !call.outcome.is_ok() {
            continue;
        }
        if let Some(due) = call
            .text()
            .filter(|t| t.contains("Scheduled job 1"))
            .and_then(due_of)
        {
            *sent_per_due.entry(due).or_default() += 1;
        }
    }
    for (due, sent) in &sent_per_due {
        assert_eq!(*sent, 1, "the answer for {due} went out as {sent} messages");
    }
    // Job 2's reminders: never more visible than runs, at least as many as
    // answered.
    let ticks = fake
        .sent_texts(USER)
        .iter()
        .filter(|t| t.starts_with("⏰ tick"))
        .count();
    let runs_2 = journaled.keys().filter(|(job, _)| *job == 2).count();
    let answered_2 = journaled
        .iter()
        .filter(|((job, _), (state, _))| *job == 2 && *state == InboxState::Answered)
        .count();
    assert!(
        ticks <= runs_2 && ticks >= answered_2,
        "{ticks} ticks, {runs_2} runs, {answered_2} answered"
    );
}

/// A reminder job of `USER`'s with `text`, whose next run is `next_run`
/// (unix seconds): as if no telegate ran since it fell due.
async fn missed_job(
    store: &Store,
    schedule: Schedule,
    label: &str,
    text: &str,
    next_run: i64,
) -> i64 {
    let action = Action::Message { text: text.into() };
    store
        .jobs()
        .create_job(
            NewJob {
                chat_id: USER,
                chat_type: "dm".into(),
                thread_id: None,
                session_key: format!("agent:main:telegram:dm:{USER}"),
                creator_id: Some(USER as u64),
                creator_name: Some("Ann".into()),
                schedule: serde_json::to_value(&schedule).unwrap(),
                label: label.into(),
                timezone: "UTC".into(),
                action: serde_json::to_value(&action).unwrap(),
                next_run: next_run * 1000,
            },
            20,
        )
        .await
        .unwrap()
        .unwrap()
}

/// A job that was due 2 h 10 min ago, then hourly (three instants missed).
async fn missed_for_two_hours(store: &Store) -> i64 {
    let anchor = now_ms() / 1000 - 2 * 3600 - 600;
    let schedule = Schedule::Interval {
        every_secs: 3600,
        anchor,
    };
    missed_job(store, schedule, "every 1h", "stretch", anchor).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_two_hour_outage_latest_runs_the_missed_instant_once_and_none_runs_nothing() {
    for (catch_up, expected_runs) in [("latest", 1usize), ("none", 0)] {
        let fake = FakeBotApi::start().await;
        let deployment = Deployment::new(&fake, catch_up);
        // The outage: the store says the job was due long ago, and no
        // telegate was running since.
        let store = deployment.open_store().await;
        let job = missed_for_two_hours(&store).await;
        store.close().await.unwrap();

        let mut binary = Binary::start(&deployment, &fake);
        binary.ready(&fake).await;
        if expected_runs == 1 {
            assert!(
                wait_text(&fake, "⏰ stretch").await,
                "{}",
                binary.log_tail()
            );
        }
        // Time for anything more (a burst, a second run) to show.
        tokio::time::sleep(Duration::from_secs(2)).await;
        binary.stop().await;

        let reminders: Vec<String> = fake
            .sent_texts(USER)
            .into_iter()
            .filter(|t| t.starts_with("⏰ stretch"))
            .collect();
        assert_eq!(reminders.len(), expected_runs, "{catch_up}: {reminders:?}");
        if let Some(reminder) = reminders.first() {
            assert!(
                reminder.contains("late: due today") || reminder.contains("late: due yesterday"),
                "{reminder}"
            );
            assert!(
                reminder.contains("2 earlier missed runs were left out"),
                "{reminder}"
            );
        }
        let store = deployment.open_store().await;
        let journaled = runs(&store).await;
        assert_eq!(journaled.len(), expected_runs, "{catch_up}: {journaled:?}");
        let stored = store.jobs().job(job).await.unwrap().unwrap();
        assert!(
            stored.next_run.unwrap() > now_ms(),
            "{catch_up}: the next run is ahead"
        );
        store.close().await.unwrap();
        drop(deployment.dir);
    }
}

/// A one-time reminder that fell due `seconds` ago, while no telegate ran.
async fn missed_seconds_ago(store: &Store, seconds: i64) -> i64 {
    let at = now_ms() / 1000 - seconds;
    missed_job(store, Schedule::Once { at }, "in 1m", "blink", at).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instant_missed_in_a_short_outage_is_missed_too() {
    // Well within the 60 s a running scheduler may lag before a run is
    // late: what makes it missed is that no telegate was running.
    for (catch_up, expected_runs) in [("none", 0usize), ("latest", 1)] {
        let fake = FakeBotApi::start().await;
        let deployment = Deployment::new(&fake, catch_up);
        let store = deployment.open_store().await;
        missed_seconds_ago(&store, 15).await;
        store.close().await.unwrap();

        let mut binary = Binary::start(&deployment, &fake);
        binary.ready(&fake).await;
        if expected_runs == 1 {
            assert!(wait_text(&fake, "⏰ blink").await, "{}", binary.log_tail());
        } else {
            // The scheduler decided: the instant is left out.
            assert!(
                binary.wait_log("missed runs left out").await,
                "{}",
                binary.log_tail()
            );
        }
        binary.stop().await;
        let reminders: Vec<String> = fake
            .sent_texts(USER)
            .into_iter()
            .filter(|t| t.starts_with("⏰ blink"))
            .collect();
        assert_eq!(reminders.len(), expected_runs, "{catch_up}: {reminders:?}");
        if let Some(reminder) = reminders.first() {
            assert!(reminder.contains("late: due"), "labelled late: {reminder}");
        }
        let store = deployment.open_store().await;
        assert_eq!(runs(&store).await.len(), expected_runs, "{catch_up}");
        store.close().await.unwrap();
        drop(deployment.dir);
    }
}
