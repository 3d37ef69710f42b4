//! Port of the reference regression tests for "sessions trapped in
//! 'Interrupting current task…' while /stop reports no active task"
//! (hermes-agent issue 11016), plus the four guard-identity tests the
//! reference system added later (see DESIGN.md, "Guard identity").
//!
//! Three layers, all exercised on the real adapter and runner:
//! 1. the adapter's task ownership: /stop, /new and /reset really cancel the
//!    in-flight task and release the guard in order;
//! 2. the adapter's on-entry self-heal of a lock whose owner has finished;
//! 3. the runner's generation guard on slot promotion and release.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::recorder::{eventually, make_event, session_key, Recorder};
use telegate::adapter::{
    Adapter, AdapterConfig, AdapterParts, DispatchContext, OwnerTask, SessionGuard,
};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::reply::{Outgoing, Reply};
use telegate::runner::{
    AgentHandle, InvalidateReason, Runner, RunnerConfig, RunnerParts, RunningAgent,
};
use telegate::vocab::{MessageEvent, Progress, TurnGeneration};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(2);

fn command_name(event: &MessageEvent) -> Option<String> {
    event.command().map(|c| c.name.to_ascii_lowercase())
}

fn handled(text: String) -> Option<Outgoing> {
    Some(Reply::command(text).into())
}

/// Records `label` into `log` when dropped, unless disarmed: the Rust shape of
/// `except asyncio.CancelledError: ...; raise`.
struct OnCancel {
    log: Arc<Mutex<Vec<&'static str>>>,
    label: &'static str,
    armed: bool,
}

impl Drop for OnCancel {
    fn drop(&mut self) {
        if self.armed {
            self.log.lock().unwrap().push(self.label);
        }
    }
}

fn make_adapter(
    handler: impl Fn(MessageEvent, DispatchContext) -> futures::future::BoxFuture<'static, Option<Outgoing>>
        + Send
        + Sync
        + 'static,
) -> (Adapter, Arc<Recorder>) {
    let recorder = Recorder::new();
    let adapter = Adapter::new(AdapterParts {
        ..AdapterParts::new(Arc::new(handler), recorder.clone())
    });
    (adapter, recorder)
}

// ===========================================================================
// Layer 1: the adapter cancels the session's task on /stop /new /reset
// ===========================================================================

async fn command_cancels_active_task_and_unblocks_follow_up(command_text: &str) {
    let sk = session_key(12345);
    let processing_started = Arc::new(Notify::new());
    let cancelled = Arc::new(Mutex::new(Vec::new()));
    let first = Arc::new(Mutex::new(true));

    let (started, log, first_flag) = (processing_started.clone(), cancelled.clone(), first.clone());
    let (adapter, sent) = make_adapter(move |event, _ctx| {
        let (started, log, first_flag) = (started.clone(), log.clone(), first_flag.clone());
        Box::pin(async move {
            if let Some(cmd) = command_name(&event) {
                if ["stop", "new", "reset", "model"].contains(&cmd.as_str()) {
                    return handled(format!("handled:{cmd}"));
                }
            }
            let block = std::mem::replace(&mut *first_flag.lock().unwrap(), false);
            if block {
                let mut guard = OnCancel {
                    log,
                    label: "cancelled",
                    armed: true,
                };
                started.notify_one();
                std::future::pending::<()>().await;
                guard.armed = false;
            }
            handled(format!("handled:text:{}", event.text))
        })
    });

    adapter
        .handle_message(make_event("hello world", 12345))
        .await;
    tokio::time::timeout(WAIT, processing_started.notified())
        .await
        .expect("the first message started processing");
    tokio::task::yield_now().await;

    assert!(adapter.is_active(&sk));
    assert!(adapter.has_owner_task(&sk));

    adapter
        .handle_message(make_event(command_text, 12345))
        .await;

    assert_eq!(
        *cancelled.lock().unwrap(),
        vec!["cancelled"],
        "{command_text} did not cancel the active processing task"
    );
    assert!(!adapter.is_active(&sk));
    assert!(!adapter.has_pending(&sk));
    assert!(!adapter.has_owner_task(&sk));
    let expected = command_text.trim_start_matches('/');
    assert!(sent.any_contains(&format!("handled:{expected}")));

    // The follow-up goes through normally now that the session is clean.
    adapter
        .handle_message(make_event(
            "/model xiaomi/mimo-v2-pro --provider nous",
            12345,
        ))
        .await;
    assert!(
        sent.wait_for_text("handled:model", WAIT).await,
        "follow-up /model stayed blocked after {command_text}"
    );
    assert!(!adapter.has_pending(&sk));
    assert!(!sent.any_contains("handled:text:hello world"));
}

#[tokio::test]
async fn stop_cancels_active_task_and_unblocks_follow_up() {
    command_cancels_active_task_and_unblocks_follow_up("/stop").await;
}

#[tokio::test]
async fn new_cancels_active_task_and_unblocks_follow_up() {
    command_cancels_active_task_and_unblocks_follow_up("/new").await;
}

#[tokio::test]
async fn reset_cancels_active_task_and_unblocks_follow_up() {
    command_cancels_active_task_and_unblocks_follow_up("/reset").await;
}

#[tokio::test]
async fn new_keeps_guard_until_command_finishes_then_runs_follow_up() {
    let sk = session_key(12345);
    let processing_started = Arc::new(Notify::new());
    let command_started = Arc::new(Notify::new());
    let allow_command_finish = Arc::new(Notify::new());
    let follow_up_processed = Arc::new(Notify::new());
    let call_order: Arc<Mutex<Vec<&'static str>>> = Arc::new(Mutex::new(Vec::new()));

    let (ps, cs, allow, fp, order) = (
        processing_started.clone(),
        command_started.clone(),
        allow_command_finish.clone(),
        follow_up_processed.clone(),
        call_order.clone(),
    );
    let (adapter, sent) = make_adapter(move |event, _ctx| {
        let (ps, cs, allow, fp, order) = (
            ps.clone(),
            cs.clone(),
            allow.clone(),
            fp.clone(),
            order.clone(),
        );
        Box::pin(async move {
            if command_name(&event).as_deref() == Some("new") {
                order.lock().unwrap().push("command:start");
                cs.notify_one();
                allow.notified().await;
                order.lock().unwrap().push("command:end");
                return handled("handled:new".to_string());
            }
            if event.text == "hello world" {
                let _guard = OnCancel {
                    log: order.clone(),
                    label: "original:cancelled",
                    armed: true,
                };
                ps.notify_one();
                std::future::pending::<()>().await;
            }
            if event.text == "after reset" {
                order.lock().unwrap().push("followup:processed");
                fp.notify_one();
            }
            handled(format!("handled:text:{}", event.text))
        })
    });

    adapter
        .handle_message(make_event("hello world", 12345))
        .await;
    tokio::time::timeout(WAIT, processing_started.notified())
        .await
        .unwrap();

    let command_task = {
        let adapter = adapter.clone();
        tokio::spawn(async move { adapter.handle_message(make_event("/new", 12345)).await })
    };
    tokio::time::timeout(WAIT, command_started.notified())
        .await
        .unwrap();
    tokio::task::yield_now().await;

    assert!(adapter.is_active(&sk));

    adapter
        .handle_message(make_event("after reset", 12345))
        .await;
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;

    assert!(
        adapter.is_active(&sk),
        "guard must stay active while /new is still running"
    );
    assert!(
        adapter.has_pending(&sk),
        "follow-up should stay queued until /new finishes"
    );
    assert!(
        !call_order.lock().unwrap().contains(&"followup:processed"),
        "follow-up ran before /new completed"
    );
    assert!(
        !call_order.lock().unwrap().contains(&"original:cancelled"),
        "old task was cancelled before runner completed /new"
    );

    allow_command_finish.notify_one();
    command_task.await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), follow_up_processed.notified())
        .await
        .expect("the follow-up was processed");

    assert!(sent.any_contains("handled:new"));
    let order = call_order.lock().unwrap().clone();
    let at = |label| order.iter().position(|l| *l == label).unwrap();
    assert!(at("command:end") < at("original:cancelled"), "{order:?}");
    assert!(
        at("original:cancelled") < at("followup:processed"),
        "{order:?}"
    );
    assert!(!adapter.has_pending(&sk));
}

// ===========================================================================
// Layer 2: on-entry self-heal of stale session locks
// ===========================================================================

fn reply_with_command_or_text(
) -> impl Fn(MessageEvent, DispatchContext) -> futures::future::BoxFuture<'static, Option<Outgoing>>
       + Send
       + Sync
       + 'static {
    |event, _ctx| {
        Box::pin(async move {
            let what = command_name(&event).unwrap_or_else(|| "text".to_string());
            handled(format!("handled:{what}"))
        })
    }
}

/// The owner entry of a task that has already finished.
async fn finished_owner() -> OwnerTask {
    let done_task = tokio::spawn(async {});
    let owner = OwnerTask::watching(&done_task);
    done_task.await.unwrap();
    owner
}

#[tokio::test]
async fn stale_lock_with_done_task_is_healed_on_next_message() {
    let (adapter, sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);

    // The production split-brain: a guard is installed AND a recorded owner
    // task, but that task is already done.
    let owner = finished_owner().await;
    assert!(owner.is_finished());
    adapter.install_lock(&sk, SessionGuard::new(), Some(owner));

    assert!(adapter.session_task_is_stale(&sk));

    // An ordinary message heals the stale lock and falls through to normal
    // dispatch: the user gets a reply instead of a busy acknowledgement.
    adapter.handle_message(make_event("hello", 12345)).await;
    assert!(
        sent.wait_for_text("handled:text", WAIT).await,
        "stale lock trapped a normal message — split-brain not healed"
    );
}

#[tokio::test]
async fn a_stale_lock_heals_on_request_and_leaves_the_slot_free() {
    let (adapter, _sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);
    adapter.install_lock(&sk, SessionGuard::new(), Some(finished_owner().await));

    assert!(
        adapter.heal_stale_session_lock(&sk),
        "a stale lock must heal"
    );
    assert!(!adapter.is_active(&sk));
    assert!(!adapter.has_owner_task(&sk));
    assert!(
        !adapter.heal_stale_session_lock(&sk),
        "nothing left to heal"
    );
}

#[tokio::test]
async fn no_owner_task_is_not_treated_as_stale() {
    // Tests and rare legitimate paths install guards directly; healing
    // those would break them.
    let (adapter, _sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);
    adapter.install_lock(&sk, SessionGuard::new(), None);

    assert!(!adapter.session_task_is_stale(&sk));
    assert!(!adapter.heal_stale_session_lock(&sk));
}

#[tokio::test]
async fn live_owner_task_is_not_stale() {
    // The owner is alive: the agent really is busy, do not heal.
    let (adapter, _sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);
    let live = tokio::spawn(std::future::pending::<()>());
    adapter.install_lock(&sk, SessionGuard::new(), Some(OwnerTask::watching(&live)));

    assert!(!adapter.session_task_is_stale(&sk));
    assert!(!adapter.heal_stale_session_lock(&sk));
    // The lock is still in place.
    assert!(adapter.is_active(&sk));
    assert!(adapter.has_owner_task(&sk));
    live.abort();
}

// ===========================================================================
// Guard identity (added to the reference system after the file above)
// ===========================================================================

#[tokio::test]
async fn releasing_with_a_stale_guard_keeps_the_newer_one() {
    let (adapter, _sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);
    let older = SessionGuard::new();
    let newer = SessionGuard::new();
    adapter.install_lock(&sk, newer.clone(), None);

    assert!(!adapter.release_session_guard(&sk, Some(&older)));
    assert_eq!(adapter.active_guard(&sk), Some(newer.clone()));

    assert!(adapter.release_session_guard(&sk, Some(&newer)));
    assert!(!adapter.is_active(&sk));

    adapter.install_lock(&sk, older, None);
    assert!(adapter.release_session_guard(&sk, None));
    assert!(!adapter.is_active(&sk));
}

#[tokio::test]
async fn finished_turn_with_its_own_guard_releases_guard_and_owner() {
    let (adapter, sent) = make_adapter(reply_with_command_or_text());
    let sk = session_key(12345);
    adapter.handle_message(make_event("hello", 12345)).await;
    assert!(sent.wait_for_text("handled:text", WAIT).await);
    assert!(
        eventually(WAIT, || !adapter.is_active(&sk)
            && !adapter.has_owner_task(&sk))
        .await
    );
}

#[tokio::test]
async fn finished_turn_after_a_guard_swap_keeps_its_owner_so_the_lock_heals() {
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (r, s) = (release.clone(), started.clone());
    let (adapter, sent) = make_adapter(move |event, _ctx| {
        let (r, s) = (r.clone(), s.clone());
        Box::pin(async move {
            if event.text == "slow" {
                s.notify_one();
                r.notified().await;
            }
            handled(format!("handled:text:{}", event.text))
        })
    });
    let sk = session_key(12345);

    adapter.handle_message(make_event("slow", 12345)).await;
    tokio::time::timeout(WAIT, started.notified())
        .await
        .unwrap();

    // A command swaps in a newer guard while the turn runs...
    let newer = SessionGuard::new();
    adapter.swap_guard(&sk, newer.clone());
    // ...then the turn finishes. Its cleanup must release nothing and keep
    // its owner entry.
    release.notify_one();
    assert!(eventually(WAIT, || adapter.session_task_is_stale(&sk)).await);
    assert_eq!(adapter.active_guard(&sk), Some(newer));
    assert!(adapter.has_owner_task(&sk));
    assert!(
        !sent.any_contains("handled:text:slow"),
        "a turn that lost its guard must not reply"
    );

    // The next message sees the stale lock (owner finished) and heals it.
    adapter.handle_message(make_event("next", 12345)).await;
    assert!(sent.wait_for_text("handled:text:next", WAIT).await);
    assert!(
        eventually(WAIT, || !adapter.is_active(&sk)
            && !adapter.has_owner_task(&sk))
        .await
    );
}

#[tokio::test]
async fn follow_ups_kept_across_a_heal_go_before_the_next_message() {
    // Queued follow-ups outlive a stale lock: the next message must not
    // overtake them.
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let (r, s) = (release.clone(), started.clone());
    let recorder = Recorder::new();
    let adapter = Adapter::new(AdapterParts {
        config: AdapterConfig {
            busy_mode: telegate::adapter::BusyMode::Queue,
            ..AdapterConfig::default()
        },
        ..AdapterParts::new(
            Arc::new(move |event: MessageEvent, _ctx: DispatchContext| {
                let (r, s) = (r.clone(), s.clone());
                Box::pin(async move {
                    if event.text == "slow" {
                        s.notify_one();
                        r.notified().await;
                    }
                    handled(format!("handled:text:{}", event.text))
                }) as futures::future::BoxFuture<'static, Option<Outgoing>>
            }),
            recorder.clone(),
        )
    });
    let sk = session_key(12345);

    adapter.handle_message(make_event("slow", 12345)).await;
    tokio::time::timeout(WAIT, started.notified())
        .await
        .unwrap();
    adapter.handle_message(make_event("q1", 12345)).await;
    adapter.handle_message(make_event("q2", 12345)).await;
    // A newer guard takes the slot, then the turn ends: it leaves the
    // queue alone (not its guard any more) and the lock goes stale.
    adapter.swap_guard(&sk, SessionGuard::new());
    release.notify_one();
    assert!(eventually(WAIT, || adapter.session_task_is_stale(&sk)).await);

    // Healed, the slot has no guard and no owner, but it is not idle: the
    // follow-ups still wait.
    assert!(adapter.heal_stale_session_lock(&sk));
    assert!(!adapter.is_active(&sk) && !adapter.has_owner_task(&sk));
    assert!(!adapter.is_idle(), "queued follow-ups count as work");
    assert_eq!(adapter.pending_total(), 2);

    adapter.handle_message(make_event("next", 12345)).await;
    assert!(recorder.wait_for_text("handled:text:next", WAIT).await);
    let answers: Vec<String> = recorder
        .texts()
        .into_iter()
        .filter(|t| t.starts_with("handled:text:"))
        .collect();
    assert_eq!(
        answers,
        ["handled:text:q1", "handled:text:q2", "handled:text:next"],
        "the next message overtook the queue"
    );
}

// ===========================================================================
// Layer 3: the runner's generation guard on promotion and release
// ===========================================================================

struct NeverCalled;

impl Agent for NeverCalled {
    fn name(&self) -> &str {
        "never"
    }
    fn run(
        &self,
        _turn: TurnRequest,
    ) -> futures::future::BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async { Err(AgentError::backend("not used")) })
    }
}

fn make_runner() -> Runner {
    Runner::new(RunnerParts {
        ..RunnerParts::new(Arc::new(NeverCalled), Recorder::new())
    })
}

fn agent_marked(marker: u64) -> RunningAgent {
    RunningAgent::Live(AgentHandle {
        generation: TurnGeneration(marker),
        cancel: CancellationToken::new(),
        progress: Progress::new(),
    })
}

fn marker_of(agent: Option<RunningAgent>) -> Option<u64> {
    match agent? {
        RunningAgent::Live(handle) => Some(handle.generation.0),
        RunningAgent::Pending => None,
    }
}

const SK: &str = "agent:main:telegram:dm:12345";

#[test]
fn release_without_generation_behaves_as_before() {
    let runner = make_runner();
    let sk = telegate::vocab::SessionKey::from_raw(SK);
    runner.install_running_agent(&sk, agent_marked(1), Instant::now());
    assert!(runner.release(&sk, None));
    assert!(runner.running_agent(&sk).is_none());
    assert!(runner.running_since(&sk).is_none());
}

#[test]
fn release_with_current_generation_clears_slot() {
    let runner = make_runner();
    let sk = telegate::vocab::SessionKey::from_raw(SK);
    let generation = runner.begin_generation(&sk);
    runner.install_running_agent(&sk, agent_marked(1), Instant::now());

    assert!(runner.release(&sk, Some(generation)));
    assert!(runner.running_agent(&sk).is_none());
}

#[test]
fn release_with_stale_generation_blocks() {
    let runner = make_runner();
    let sk = telegate::vocab::SessionKey::from_raw(SK);
    let stale = runner.begin_generation(&sk);
    // /stop bumps the generation: the stale run's generation is no longer current.
    runner.invalidate_generation(&sk, InvalidateReason::Stop);
    // The fresh run lands next, with its own state installed.
    let fresh_since = Instant::now();
    runner.install_running_agent(&sk, agent_marked(u64::MAX), fresh_since);

    // The stale run's unwind must not clobber the fresh run's state.
    let released = runner.release(&sk, Some(stale));

    assert!(!released);
    assert_eq!(marker_of(runner.running_agent(&sk)), Some(u64::MAX));
    assert_eq!(runner.running_since(&sk), Some(fresh_since));
}

#[test]
fn is_session_run_current_tracks_bumps() {
    let runner = make_runner();
    let sk = telegate::vocab::SessionKey::from_raw(SK);
    let gen1 = runner.begin_generation(&sk);
    assert!(runner.is_current(&sk, gen1));

    runner.invalidate_generation(&sk, InvalidateReason::Other("test"));
    assert!(!runner.is_current(&sk, gen1));

    let gen2 = runner.begin_generation(&sk);
    assert!(gen2 > gen1);
    assert!(runner.is_current(&sk, gen2));
}

// ===========================================================================
// Invariant 4's order: the command's reply goes out, then the old task is
// cancelled
// ===========================================================================

/// An outbound that writes "reply:<text>" into the shared order log once a
/// delivery has completed (after a few scheduler turns, like a real send).
struct OrderedOutbound {
    log: Arc<Mutex<Vec<String>>>,
}

impl telegate::reply::Outbound for OrderedOutbound {
    fn deliver<'a>(
        &'a self,
        _to: &'a telegate::vocab::SessionSource,
        reply: Reply,
    ) -> futures::future::BoxFuture<'a, Result<(), telegate::reply::DeliveryError>> {
        Box::pin(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            self.log
                .lock()
                .unwrap()
                .push(format!("reply:{}", reply.text));
            Ok(())
        })
    }
}

/// Records `label` into a `String` log when dropped (the turn's future was
/// cancelled).
struct LogOnDrop {
    log: Arc<Mutex<Vec<String>>>,
    label: &'static str,
}

impl Drop for LogOnDrop {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(self.label.to_string());
    }
}

async fn command_reply_goes_out_before_the_old_task_is_cancelled(command_text: &str) {
    let log: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(Notify::new());
    let (l, s) = (log.clone(), started.clone());
    let adapter = Adapter::new(AdapterParts {
        ..AdapterParts::new(
            Arc::new(
                move |event: MessageEvent,
                      _ctx: DispatchContext|
                      -> futures::future::BoxFuture<'static, Option<Outgoing>> {
                    let (l, s) = (l.clone(), s.clone());
                    Box::pin(async move {
                        if let Some(cmd) = command_name(&event) {
                            return handled(format!("handled:{cmd}"));
                        }
                        let _cancelled = LogOnDrop {
                            log: l,
                            label: "old:cancelled",
                        };
                        s.notify_one();
                        std::future::pending::<()>().await;
                        None
                    })
                },
            ),
            Arc::new(OrderedOutbound { log: log.clone() }),
        )
    });
    adapter.handle_message(make_event("long turn", 12345)).await;
    tokio::time::timeout(WAIT, started.notified())
        .await
        .expect("the turn started");

    adapter
        .handle_message(make_event(command_text, 12345))
        .await;

    let name = command_text.trim_start_matches('/');
    let order = log.lock().unwrap().clone();
    assert_eq!(
        order,
        vec![format!("reply:handled:{name}"), "old:cancelled".to_string()],
        "{command_text}: the reply must be delivered before the old task is cancelled"
    );
    assert!(!adapter.is_active(&session_key(12345)));
}

#[tokio::test]
async fn stop_reply_is_delivered_before_the_old_task_is_cancelled() {
    command_reply_goes_out_before_the_old_task_is_cancelled("/stop").await;
}

#[tokio::test]
async fn new_reply_is_delivered_before_the_old_task_is_cancelled() {
    command_reply_goes_out_before_the_old_task_is_cancelled("/new").await;
}

#[tokio::test]
async fn reset_reply_is_delivered_before_the_old_task_is_cancelled() {
    command_reply_goes_out_before_the_old_task_is_cancelled("/reset").await;
}

// ===========================================================================
// Layer 3 at engine level: a stale turn that resumes after /stop
// ===========================================================================

/// An agent whose turns wait for the test (ignoring their cancellation
/// token, as a misbehaving backend would) and then answer.
#[derive(Default)]
struct StubbornAgent {
    started: Mutex<Vec<String>>,
    gates: Mutex<std::collections::HashMap<String, Arc<Notify>>>,
}

impl StubbornAgent {
    fn gate(&self, text: &str) -> Arc<Notify> {
        self.gates
            .lock()
            .unwrap()
            .entry(text.to_string())
            .or_default()
            .clone()
    }

    fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }
}

impl Agent for StubbornAgent {
    fn name(&self) -> &str {
        "stubborn"
    }
    fn run(
        &self,
        turn: TurnRequest,
    ) -> futures::future::BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            self.started.lock().unwrap().push(turn.text.clone());
            let gate = self.gate(&turn.text);
            gate.notified().await;
            Ok(AgentReply::new(format!("answer:{}", turn.text)))
        })
    }
}

fn dispatch_ctx(slot_busy: bool) -> DispatchContext {
    DispatchContext {
        key: session_key(12345),
        interrupt: CancellationToken::new(),
        slot_busy,
        slot_sending: false,
        queue_depth: 0,
        claimed_while_busy: false,
    }
}

fn reply_text(out: Option<Outgoing>) -> Option<String> {
    out.map(|o| o.reply.text)
}

#[tokio::test]
async fn a_stale_turn_resuming_after_stop_cannot_release_the_newer_turn_or_answer() {
    use telegate::adapter::MessageHandler;
    let agent = Arc::new(StubbornAgent::default());
    let metrics = telegate::metrics::Metrics::default();
    let runner = Runner::new(RunnerParts {
        config: RunnerConfig {
            metrics: metrics.clone(),
            ..RunnerConfig::default()
        },
        ..RunnerParts::new(agent.clone(), Recorder::new())
    });
    let sk = session_key(12345);

    // Turn A runs (live), and keeps running after /stop: its future was not
    // dropped and its agent ignores the cancellation token.
    let old_gate = agent.gate("old");
    let old = tokio::spawn(runner.handle(make_event("old", 12345), dispatch_ctx(false)));
    assert!(eventually(WAIT, || agent.started() == vec!["old"]).await);
    let stopped = runner
        .handle(make_event("/stop", 12345), dispatch_ctx(true))
        .await;
    assert_eq!(reply_text(stopped).as_deref(), Some("⏹ Stopped."));
    assert!(runner.running_agent(&sk).is_none());

    // Turn B takes the slot and is live.
    let new_gate = agent.gate("new");
    let new = tokio::spawn(runner.handle(make_event("new", 12345), dispatch_ctx(false)));
    assert!(eventually(WAIT, || agent.started() == vec!["old", "new"]).await);
    let new_since = runner.running_since(&sk).expect("B is running");
    let new_generation = match runner.running_agent(&sk) {
        Some(RunningAgent::Live(handle)) => handle.generation,
        other => panic!("B should be live, got {other:?}"),
    };

    // A resumes and finishes with an answer: it must neither release B's
    // slot nor answer.
    old_gate.notify_one();
    let old_out = tokio::time::timeout(WAIT, old).await.unwrap().unwrap();
    assert_eq!(reply_text(old_out), None, "a stale turn answered");
    assert_eq!(metrics.generation_discards.get(), 1);
    match runner.running_agent(&sk) {
        Some(RunningAgent::Live(handle)) => assert_eq!(handle.generation, new_generation),
        other => panic!("the stale turn released the newer turn's slot: {other:?}"),
    }
    assert_eq!(runner.running_since(&sk), Some(new_since));
    assert!(runner.is_current(&sk, new_generation));

    // B is unaffected: it answers, and then the slot is idle.
    new_gate.notify_one();
    let new_out = tokio::time::timeout(WAIT, new).await.unwrap().unwrap();
    assert_eq!(reply_text(new_out).as_deref(), Some("answer:new"));
    assert!(runner.running_agent(&sk).is_none());
    assert_eq!(runner.generation_entries(), 0);
    // The stopped turn counts as cancelled (although its agent answered);
    // the answered one does not.
    assert_eq!(metrics.turns_cancelled.get(), 1);
}

#[tokio::test]
async fn a_stale_turn_resuming_after_stop_in_set_up_cannot_install() {
    use telegate::adapter::MessageHandler;
    let agent = Arc::new(StubbornAgent::default());
    let store = telegate::store::Store::open_in_memory().unwrap();
    let runner = Runner::new(RunnerParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        ..RunnerParts::new(agent.clone(), Recorder::new())
    });
    let sk = session_key(12345);

    // Hold the store thread, so turn A's set-up (which loads its session)
    // waits with only the pending sentinel installed.
    let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let blocker = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .call(move |_| {
                    entered_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(())
                })
                .await
        })
    };
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
        .await
        .unwrap();
    let old = tokio::spawn(runner.handle(make_event("old", 12345), dispatch_ctx(false)));
    assert!(
        eventually(WAIT, || matches!(
            runner.running_agent(&sk),
            Some(RunningAgent::Pending)
        ))
        .await
    );

    let stopped = runner
        .handle(make_event("/stop", 12345), dispatch_ctx(true))
        .await;
    assert_eq!(
        reply_text(stopped).as_deref(),
        Some("⏹ Stopped (the task was still starting).")
    );
    assert!(runner.running_agent(&sk).is_none());

    // A resumes its set-up: it must not install itself, run its agent or
    // answer.
    release_tx.send(()).unwrap();
    blocker.await.unwrap().unwrap();
    let old_out = tokio::time::timeout(WAIT, old).await.unwrap().unwrap();
    assert_eq!(reply_text(old_out), None, "a stale turn answered");
    assert!(agent.started().is_empty(), "a stale turn ran its agent");
    assert!(runner.running_agent(&sk).is_none());
    assert_eq!(runner.generation_entries(), 0);

    // The slot works normally afterwards.
    let gate = agent.gate("next");
    gate.notify_one();
    let next = runner
        .handle(make_event("next", 12345), dispatch_ctx(false))
        .await;
    assert_eq!(reply_text(next).as_deref(), Some("answer:next"));
}
