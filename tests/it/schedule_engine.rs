//! Scheduled jobs in the session engine, with tokio's clock paused: the
//! scheduler's wall time follows tokio time ([`TokioClock`]), so a job is
//! due exactly when the test has moved time to its instant.
//!
//! Time moves only by `tokio::time::advance`: a blocking task held for the
//! whole test keeps tokio from advancing its paused clock on its own
//! (which it would do whenever every task waits for the store thread,
//! jumping to the scheduler's next instant), and every wait for the engine
//! is bounded in *real* time. Assertions are on what was delivered and
//! run, never on how long it took.
//!
//! * a job fires at its instant, once (and not a second earlier);
//! * a run due while a turn runs waits behind it and does not interrupt it;
//! * /stop during a run stops it, the job is not counted as failing, and
//!   its next run still fires (an interrupting message is no failure
//!   either); /new leaves jobs alone;
//! * runs failing in a row pause the job and tell the chat;
//! * `session = "fresh"` runs in a new session each time, never the chat's;
//! * authority: another member cannot pause or delete someone's job (an
//!   approver can); the per-chat cap and the minimum interval are refused
//!   with their message; the command menu lists the commands.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use support::recorder::{session_key, Recorder};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::{Engine, EngineParts};
use telegate::metrics::Metrics;
use telegate::runner::RunnerConfig;
use telegate::schedule::{Jobs, RunSink, ScheduleConfig, TokioClock};
use telegate::store::{JobState, Store};
use telegate::vocab::COMMANDS;
use telegate::vocab::{ButtonAction, JobButton};
use telegate::vocab::{ChatType, KeyPolicy, MessageEvent, Platform, SessionKey, SessionSource};
use tokio_util::sync::CancellationToken;

/// Real time any one condition may take.
const REAL_WAIT: Duration = Duration::from_secs(20);
const ANN: u64 = 42;
const BOB: u64 = 43;
const APPROVER: u64 = 44;
const GROUP: i64 = -100;

/// Answers `done: <last line>`; a prompt with `BLOCK` waits until it is
/// cancelled, one with `FAIL` fails, `SLOW:<secs>` takes that long.
#[derive(Default)]
struct RunAgent {
    started: AtomicUsize,
    cancelled: AtomicUsize,
    /// (text, session id) of every started turn.
    turns: Mutex<Vec<(String, String)>>,
}

impl RunAgent {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn turns(&self) -> Vec<(String, String)> {
        self.turns.lock().unwrap().clone()
    }
}

impl Agent for RunAgent {
    fn name(&self) -> &str {
        "runs"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            self.started.fetch_add(1, Ordering::SeqCst);
            let text = turn.text.clone();
            self.turns
                .lock()
                .unwrap()
                .push((text.clone(), turn.session_id.to_string()));
            let last = text.lines().last().unwrap_or_default().to_string();
            let wait = if text.contains("BLOCK") {
                Some(Duration::from_secs(100 * 3600))
            } else {
                last.strip_prefix("SLOW:")
                    .and_then(|s| s.parse().ok())
                    .map(Duration::from_secs)
            };
            if let Some(wait) = wait {
                turn.progress.push_text("working…");
                tokio::select! {
                    () = turn.cancel.cancelled() => {
                        self.cancelled.fetch_add(1, Ordering::SeqCst);
                        return Err(AgentError::Cancelled);
                    }
                    () = tokio::time::sleep(wait) => {}
                }
            }
            if text.contains("FAIL") {
                return Err(AgentError::Backend {
                    user_message: "The backend broke.".into(),
                    detail: "on purpose".into(),
                });
            }
            Ok(AgentReply::new(format!("done: {last}")))
        })
    }
}

struct Harness {
    engine: Engine,
    store: Store,
    jobs: Jobs,
    recorder: Arc<Recorder>,
    agent: Arc<RunAgent>,
    metrics: Metrics,
    _stop: tokio_util::sync::DropGuard,
    _manual_time: ManualTime,
}

/// Keeps tokio's paused clock from advancing by itself while it lives: a
/// running blocking task inhibits auto-advance.
struct ManualTime(Arc<std::sync::atomic::AtomicBool>);

impl ManualTime {
    fn hold() -> ManualTime {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        tokio::task::spawn_blocking(move || {
            while !flag.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        ManualTime(done)
    }
}

impl Drop for ManualTime {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn harness(config: ScheduleConfig) -> Harness {
    let manual_time = ManualTime::hold();
    let store = Store::open_in_memory().unwrap();
    let metrics = Metrics::new();
    let clock = TokioClock::starting_at("2026-05-01T10:00:00Z".parse().unwrap());
    let jobs = Jobs::new(
        store.jobs(),
        ScheduleConfig {
            timezone: Some("UTC".into()),
            ..config
        },
        Arc::new(clock),
        metrics.clone(),
    )
    .unwrap()
    .with_deciders(std::sync::Arc::new(vec![APPROVER]));
    let agent = Arc::new(RunAgent::default());
    let recorder = Recorder::new();
    let engine = Engine::new(EngineParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        runner: RunnerConfig {
            stall_timeout: Duration::ZERO,
            approvers: vec![APPROVER],
            jobs: Some(jobs.clone()),
            metrics: metrics.clone(),
            ..RunnerConfig::default()
        },
        ..EngineParts::new(agent.clone(), recorder.clone())
    });
    let adapter = engine.adapter.downgrade();
    let sink: RunSink = Arc::new(move |event| {
        let adapter = adapter.clone();
        Box::pin(async move {
            if let Some(adapter) = adapter.upgrade() {
                adapter.handle_message(event).await;
            }
        })
    });
    let stop = CancellationToken::new();
    telegate::schedule::spawn(jobs.clone(), sink, stop.clone());
    Harness {
        engine,
        store,
        jobs,
        recorder,
        agent,
        metrics,
        _stop: stop.drop_guard(),
        _manual_time: manual_time,
    }
}

fn dm(chat: i64, user: u64) -> SessionSource {
    SessionSource {
        user_id: Some(user),
        user_name: Some(format!("user{user}")),
        ..SessionSource::dm(Platform::Telegram, chat)
    }
}

fn member(user: u64, name: &str) -> SessionSource {
    SessionSource {
        platform: Platform::Telegram,
        chat_id: GROUP,
        chat_type: ChatType::Group,
        thread_id: None,
        user_id: Some(user),
        user_name: Some(name.to_string()),
    }
}

impl Harness {
    async fn send_as(&self, from: &SessionSource, text: &str) {
        self.engine
            .adapter
            .handle_message(MessageEvent::text(from.clone(), text))
            .await;
    }

    async fn send(&self, chat: i64, text: &str) {
        self.send_as(&dm(chat, ANN), text).await;
    }

    fn count(&self, needle: &str) -> usize {
        self.recorder
            .texts()
            .iter()
            .filter(|t| t.contains(needle))
            .count()
    }

    /// Wait (in real time) until `needle` was delivered `n` times.
    async fn delivered(&self, needle: &str, n: usize) {
        let ok = real_wait(|| self.count(needle) >= n).await;
        assert!(
            ok,
            "{needle:?} not delivered {n} times: {:#?}",
            self.recorder.texts()
        );
    }
}

/// Wait in real time (tokio's clock does not move meanwhile) until `cond`.
async fn real_wait(cond: impl Fn() -> bool) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < REAL_WAIT {
        if cond() {
            return true;
        }
        tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(2)))
            .await
            .unwrap();
    }
    cond()
}

/// Let the engine do what it does now, in real time, without moving
/// tokio's clock (for "nothing happens" checks).
async fn real_pause() {
    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(150)))
        .await
        .unwrap();
}

/// Move tokio time (and so the scheduler's wall time) by `by`, in steps no
/// longer than a minute, letting the engine react at each step.
async fn advance(by: Duration) {
    let mut left = by;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(60));
        tokio::time::advance(step).await;
        left -= step;
        real_pause_short().await;
    }
}

async fn real_pause_short() {
    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(5)))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_job_fires_at_its_instant_exactly_once() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/in 30m remind: call Anna").await;
    h.delivered("⏰ Job 1: today 10:30 UTC — remind: call Anna", 1)
        .await;
    // A second before its instant: nothing, also when the scheduler is
    // woken then (the jobs changed) and looks.
    advance(Duration::from_secs(30 * 60 - 1)).await;
    h.jobs.changed();
    real_pause().await;
    assert_eq!(h.count("⏰ call Anna"), 0, "{:#?}", h.recorder.texts());
    // At its instant: the reminder, handed on with no lag on this clock.
    advance(Duration::from_secs(1)).await;
    h.delivered("⏰ call Anna", 1).await;
    assert_eq!(h.metrics.schedule_lag_ms.get(), 0);
    assert_eq!(h.metrics.schedule_runs.answered.get(), 1);
    // And never again.
    advance(Duration::from_secs(3 * 3600)).await;
    real_pause().await;
    assert_eq!(h.count("⏰ call Anna"), 1);
    let job = h.store.jobs().job(1).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Done);
    assert_eq!(h.agent.started(), 0, "a reminder needs no model");
}

#[tokio::test(start_paused = true)]
async fn a_recurring_prompt_runs_each_instant_in_the_chats_session() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/every 1h summarise the news").await;
    h.delivered("⏰ Job 1: every 1h (UTC), next today 11:00", 1)
        .await;
    for hour in 1..=3 {
        advance(Duration::from_secs(3600)).await;
        h.delivered("done: summarise the news", hour).await;
    }
    let turns = h.agent.turns();
    assert_eq!(turns.len(), 3);
    assert!(
        turns[0].0.contains("Scheduled job 1 (every 1h, UTC)"),
        "{}",
        turns[0].0
    );
    let current = h.engine.runner.current_session(&session_key(1)).unwrap();
    assert!(turns.iter().all(|(_, s)| *s == current.to_string()));
    let answers: Vec<String> = h
        .recorder
        .texts()
        .into_iter()
        .filter(|t| t.contains("done:"))
        .collect();
    assert!(
        answers[0].starts_with("⏰ Job 1 — summarise the news\n\n"),
        "{}",
        answers[0]
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_due_during_a_turn_waits_behind_it_without_interrupting_it() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/in 1m ping").await;
    h.delivered("⏰ Job 1:", 1).await;
    h.send(1, "SLOW:600").await;
    assert!(real_wait(|| h.agent.started() == 1).await);
    advance(Duration::from_secs(60)).await;
    // Due now: queued behind the running turn, which goes on.
    assert!(real_wait(|| h.engine.adapter.pending_len(&session_key(1)) == 1).await);
    real_pause().await;
    assert_eq!(h.agent.started(), 1);
    assert_eq!(h.agent.cancelled(), 0);
    assert!(!h.recorder.any_contains("Interrupting"));
    // The turn finishes; then the run starts.
    advance(Duration::from_secs(600)).await;
    h.delivered("done: ping", 1).await;
    let texts = h.recorder.texts();
    let slow = texts
        .iter()
        .position(|t| t.contains("done: SLOW:600"))
        .unwrap();
    let ping = texts.iter().position(|t| t.contains("done: ping")).unwrap();
    assert!(slow < ping, "{texts:#?}");
    assert_eq!(h.agent.cancelled(), 0);
}

#[tokio::test(start_paused = true)]
async fn stop_stops_a_run_and_the_next_run_still_fires() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/every 1h BLOCK until stopped").await;
    h.delivered("⏰ Job 1:", 1).await;
    advance(Duration::from_secs(3600)).await;
    assert!(real_wait(|| h.agent.started() == 1).await);
    h.send(1, "/stop").await;
    h.delivered("⏹ Stopped.", 1).await;
    assert!(
        real_wait(|| h.metrics.turns_cancelled.get() == 1 && h.engine.runner.running_count() == 0)
            .await
    );
    assert!(
        !h.recorder.any_contains("done:"),
        "{:#?}",
        h.recorder.texts()
    );
    // A stopped run is no failure; /new leaves the job alone.
    h.send(1, "/new").await;
    h.delivered("Started a fresh session", 1).await;
    let job = h.store.jobs().job(1).await.unwrap().unwrap();
    assert_eq!((job.state, job.failures), (JobState::Active, 0));
    advance(Duration::from_secs(3600)).await;
    assert!(real_wait(|| h.agent.started() == 2).await);
    // A message interrupting a run is no failure either.
    h.send(1, "hello").await;
    h.delivered("done: hello", 1).await;
    let job = h.store.jobs().job(1).await.unwrap().unwrap();
    assert_eq!((job.state, job.failures), (JobState::Active, 0));
    assert_eq!(h.metrics.schedule_runs.failed.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn runs_failing_in_a_row_pause_the_job_and_say_so() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/every 1m FAIL please").await;
    h.delivered("⏰ Job 1:", 1).await;
    for run in 1..=3 {
        advance(Duration::from_secs(60)).await;
        h.delivered("The backend broke.", run).await;
    }
    h.delivered("Job 1 failed 3 times in a row, so it is paused", 1)
        .await;
    assert_eq!(h.metrics.schedule_runs.failed.get(), 3);
    advance(Duration::from_secs(600)).await;
    real_pause().await;
    assert_eq!(h.agent.started(), 3, "a paused job does not run");
    h.send(1, "/jobs").await;
    h.delivered("⏸ paused after 3 failed runs", 1).await;
    h.send(1, "/resume 1").await;
    h.delivered("▶️ Job 1 resumed; next run today 10:14 UTC", 1)
        .await;
    advance(Duration::from_secs(60)).await;
    assert!(real_wait(|| h.agent.started() == 4).await);
}

#[tokio::test(start_paused = true)]
async fn a_fresh_session_job_never_runs_in_the_chats_session() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "hello").await;
    h.delivered("done: hello", 1).await;
    let current = h.engine.runner.current_session(&session_key(1)).unwrap();
    h.send(1, "/every 1h fresh: brief me").await;
    h.delivered("⏰ Job 1:", 1).await;
    for run in 1..=2 {
        advance(Duration::from_secs(3600)).await;
        h.delivered("done: brief me", run).await;
    }
    let sessions: Vec<String> = h
        .agent
        .turns()
        .into_iter()
        .filter(|(t, _)| t.contains("brief me"))
        .map(|(_, s)| s)
        .collect();
    assert_eq!(sessions.len(), 2);
    assert_ne!(sessions[0], sessions[1], "a fresh session per run");
    assert!(sessions.iter().all(|s| *s != current.to_string()));
    // The chat's own session is untouched, and each run's session is
    // known to belong to the chat.
    assert_eq!(
        h.engine.runner.current_session(&session_key(1)),
        Some(current)
    );
    for session in &sessions {
        let owner = h.store.sessions().session_owner_key(session).await.unwrap();
        assert_eq!(owner.as_deref(), Some(session_key(1).as_str()));
    }
}

#[tokio::test(start_paused = true)]
async fn only_the_creator_or_an_approver_may_change_a_job() {
    let h = harness(ScheduleConfig::default());
    let ann = member(ANN, "Ann");
    let bob = member(BOB, "Bob");
    let approver = member(APPROVER, "Ada");
    h.send_as(&ann, "/every day 08:00 remind: stand-up").await;
    h.delivered("⏰ Job 1: every day at 08:00 (UTC), next tomorrow 08:00", 1)
        .await;
    h.send_as(&bob, "/pause 1").await;
    h.send_as(&bob, "/unschedule 1").await;
    h.delivered("🔒 Only Ann (who made job 1)", 2).await;
    assert_eq!(
        h.store.jobs().job(1).await.unwrap().unwrap().state,
        JobState::Active
    );
    // Bob sees it, and who made it.
    h.send_as(&bob, "/jobs").await;
    h.delivered(
        "#1 · every day at 08:00 (UTC), next tomorrow 08:00 — remind: stand-up · by Ann",
        1,
    )
    .await;
    // The list's buttons act on the job (their command checks who presses).
    let listed = h
        .recorder
        .all()
        .into_iter()
        .find(|d| d.reply.text.starts_with("Jobs in this chat"))
        .unwrap();
    let actions: Vec<ButtonAction> = listed
        .reply
        .buttons
        .iter()
        .map(|b| b.action.clone())
        .collect();
    assert_eq!(
        actions,
        vec![
            ButtonAction::Job {
                id: 1,
                change: JobButton::Pause
            },
            ButtonAction::Job {
                id: 1,
                change: JobButton::Delete
            },
        ]
    );
    assert!(h.engine.runner.may_change_job(&bob, 1).await.is_err());
    assert!(h.engine.runner.may_change_job(&ann, 1).await.is_ok());
    // An approver may; so may Ann.
    h.send_as(&approver, "/pause 1").await;
    h.delivered("⏸ Job 1 paused", 1).await;
    h.send_as(&ann, "/unschedule 1").await;
    h.delivered("🗑 Job 1 deleted.", 1).await;
    // Another chat cannot reach it at all.
    h.send_as(&ann, "/every day 09:00 remind: x").await;
    h.delivered("⏰ Job 2:", 1).await;
    h.send(7, "/unschedule 2").await;
    h.delivered("There is no job 2 in this chat", 1).await;
    // The runs go to Ann's own slot in the group.
    let key = SessionKey::for_source(&ann, KeyPolicy::default());
    assert_eq!(
        h.store
            .jobs()
            .job(2)
            .await
            .unwrap()
            .unwrap()
            .job
            .session_key,
        key.as_str()
    );
}

#[tokio::test(start_paused = true)]
async fn the_caps_are_refused_with_their_message() {
    let h = harness(ScheduleConfig {
        max_jobs_per_chat: 2,
        ..ScheduleConfig::default()
    });
    h.send(1, "/every 30s remind: too often").await;
    h.delivered("Jobs here may run at most every 1m ([schedule] min_interval); this one would run every 30s.", 1)
        .await;
    h.send(1, "/cron \"* * * * *\" remind: fine").await;
    h.send(1, "/in 2h remind: fine too").await;
    h.delivered("⏰ Job 2:", 1).await;
    h.send(1, "/in 3h remind: one too many").await;
    h.delivered(
        "This chat already has 2 jobs, the most it may hold ([schedule] max_jobs_per_chat)",
        1,
    )
    .await;
    // Another chat has its own allowance.
    h.send(2, "/in 3h remind: elsewhere").await;
    h.delivered("⏰ Job 3:", 1).await;
    assert_eq!(h.jobs.list(1).await.unwrap().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn status_shows_the_next_run_and_timezone_moves_recurring_jobs() {
    let h = harness(ScheduleConfig::default());
    h.send(1, "/every day 08:00 remind: water").await;
    h.delivered("⏰ Job 1:", 1).await;
    h.send(1, "/status").await;
    h.delivered("Next job: #1 tomorrow 08:00 UTC — remind: water", 1)
        .await;
    h.send(1, "/timezone Europe/Berlin").await;
    h.delivered(
        "🕰 Time zone: Europe/Berlin (it is today 12:00 there); 1 recurring job follows it now.",
        1,
    )
    .await;
    h.send(1, "/status").await;
    h.delivered(
        "Next job: #1 tomorrow 08:00 Europe/Berlin — remind: water",
        1,
    )
    .await;
    let job = h.store.jobs().job(1).await.unwrap().unwrap();
    // 08:00 in Berlin (CEST) is 06:00 UTC.
    assert_eq!(job.next_run, Some(1_777_701_600_000));
    h.send(1, "/timezone Mars/Base").await;
    h.delivered("I do not know the time zone \"Mars/Base\"", 1)
        .await;
}

#[test]
fn the_command_menu_lists_the_job_commands() {
    for name in [
        "jobs",
        "at",
        "in",
        "every",
        "cron",
        "pause",
        "resume",
        "unschedule",
        "timezone",
    ] {
        assert!(COMMANDS.iter().any(|(n, _)| *n == name), "/{name}");
    }
}
