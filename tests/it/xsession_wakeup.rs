//! Port of the reference `test_xsession_wakeup_misroute.py`: a background
//! process must wake the chat (and session) that started it, even when two
//! turns run at once and something process-global says otherwise.
//!
//! The two fix layers of the reference, in telegate's terms:
//! * **root fix**: each turn binds its identity task-locally
//!   (`bind_turn_identity`), and the terminal tool captures a background
//!   process's owner from it (`ProcessOwner::capture`), never from global
//!   state;
//! * **defence in depth**: at completion, `resolve_wakeup_target`
//!   cross-checks the session the chat key resolves to against the owner
//!   recorded at spawn time and re-routes on a positive mismatch.
//!
//! The race test drives both turns through the real engine: nothing here
//! binds an identity in place of the runner, so it fails if the runner stops
//! binding one. The reference's two "module exposes X" tests are folded into
//! tests that assert behaviour (the binder test and the resolver tests use
//! the public items with their exact shapes).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use support::recorder::{eventually, Recorder};
use telegate::adapter::AdapterConfig;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::{AgentSetup, Engine, EngineParts, TerminalSetup};
use telegate::runner::RunnerConfig;
use telegate::store::Store;
use telegate::tools::process::{ProcessId, ProcessOwner, ProcessRecord, Scope};
use telegate::tools::wakeup::resolve_wakeup_target;
use telegate::tools::{tool_events, TerminalConfig, TerminalTool, ToolContext, ToolRegistry};
use telegate::vocab::{
    bind_turn_identity, current_identity, current_session_id, MessageEvent, Platform, Progress,
    SessionId, SessionKey, SessionSource, TurnGeneration, TurnIdentity,
};
use tokio::sync::{Barrier, Notify};
use tokio_util::sync::CancellationToken;

const SESS_A: &str = "20260518_161627_60b5f4";
const SESS_B: &str = "47ec28f66dff";

/// The process-global "current session" the Python system raced on,
/// simulated. telegate's capture path must never read it.
static GLOBAL_SESSION: Mutex<String> = Mutex::new(String::new());

tokio::task_local! {
    /// Another per-turn value (like the reference's session platform var):
    /// the identity binder must not touch it.
    static TURN_PLATFORM: &'static str;
}

fn identity(session_id: &str, chat_id: i64) -> TurnIdentity {
    let source = SessionSource::dm(Platform::Telegram, chat_id);
    TurnIdentity {
        session_key: SessionKey::from_raw(format!("agent:main:telegram:dm:{chat_id}")),
        session_id: SessionId::new(session_id),
        generation: TurnGeneration::next(),
        source,
    }
}

fn record(session_key: &str, spawn_session_id: &str) -> ProcessRecord {
    ProcessRecord::detached(
        ProcessId::new("proc_f377e2f552cd"),
        "sleep 1; echo done",
        Some(ProcessOwner {
            session_key: SessionKey::from_raw(session_key),
            source: SessionSource::dm(Platform::Telegram, 1),
            spawn_session_id: Some(SessionId::new(spawn_session_id)),
        }),
    )
}

fn terminal_tool() -> (Arc<TerminalTool>, telegate::tools::ToolEventReceiver) {
    let (events, receiver) = tool_events();
    let config = TerminalConfig {
        enabled: true,
        ..TerminalConfig::default()
    };
    let tool = TerminalTool::new(&config, Vec::new(), events).expect("valid terminal config");
    (Arc::new(tool), receiver)
}

fn tool_context() -> ToolContext {
    ToolContext {
        cancel: CancellationToken::new(),
        progress: Progress::new(),
    }
}

// ---------------------------------------------------------------------------
// Root fix: task-local identity makes per-turn capture race-immune
// ---------------------------------------------------------------------------

/// The agent of the race test: each user turn stamps the process-global
/// slot, meets the other turn at a barrier, then captures its owner and
/// starts a background process through the real terminal tool, all inside
/// the identity the *runner* bound. Wakeup turns are only recorded.
struct RaceAgent {
    tool: Arc<TerminalTool>,
    barrier: Barrier,
    b_stamped: Notify,
    /// (chat, session the runner gave the turn, generation, identity seen
    /// inside the turn, owner captured, tool answer) per user turn.
    turns: Mutex<Vec<RaceTurn>>,
    /// (chat, session) of every wakeup turn.
    wakeups: Mutex<Vec<(i64, String)>>,
}

#[derive(Clone, Debug)]
struct RaceTurn {
    chat: i64,
    session: String,
    generation: TurnGeneration,
    seen: Option<TurnIdentity>,
    captured: Option<ProcessOwner>,
    global_at_capture: String,
    started: String,
}

impl Agent for RaceAgent {
    fn name(&self) -> &str {
        "race"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let chat = turn.source.chat_id;
            let session = turn.session_id.to_string();
            if turn.internal {
                self.wakeups.lock().unwrap().push((chat, session));
                return Ok(AgentReply::new("woken"));
            }
            *GLOBAL_SESSION.lock().unwrap() = session.clone();
            self.barrier.wait().await;
            if chat == 2 {
                // B stamps last, while A is still mid-turn.
                *GLOBAL_SESSION.lock().unwrap() = session.clone();
                self.b_stamped.notify_one();
            } else {
                tokio::time::timeout(Duration::from_secs(10), self.b_stamped.notified())
                    .await
                    .expect("B never stamped the global session");
            }
            let global_at_capture = GLOBAL_SESSION.lock().unwrap().clone();
            let seen = current_identity();
            let captured = ProcessOwner::capture();
            let started = self
                .tool
                .call(
                    "terminal",
                    &json!({"command": "true", "background": true, "notify_on_complete": true})
                        .to_string(),
                    tool_context(),
                )
                .await
                .unwrap_or_else(|e| format!("refused: {e}"));
            self.turns.lock().unwrap().push(RaceTurn {
                chat,
                session,
                generation: turn.generation,
                seen,
                captured,
                global_at_capture,
                started,
            });
            Ok(AgentReply::new("spawned"))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_capture_their_own_session_under_a_global_race() {
    // Two chats' turns run at once through the real engine (adapter, runner,
    // terminal tool, wakeup forwarder). Nothing in this test binds a turn
    // identity: whatever the turns see inside, the runner bound.
    let saved_global = std::mem::take(&mut *GLOBAL_SESSION.lock().unwrap());
    let (tool, events) = terminal_tool();
    let agent = Arc::new(RaceAgent {
        tool: tool.clone(),
        barrier: Barrier::new(2),
        b_stamped: Notify::new(),
        turns: Mutex::new(Vec::new()),
        wakeups: Mutex::new(Vec::new()),
    });
    let sent = Recorder::new();
    let engine = Engine::new(EngineParts {
        setup: AgentSetup {
            agent: agent.clone(),
            terminal: Some(TerminalSetup {
                tool: tool.clone(),
                events,
            }),
            approvals: None,
        },
        outbound: sent.clone(),
        store: Some(telegate::wiring::tables::runner(
            &Store::open_in_memory().unwrap(),
        )),
        outcomes: None,
        adapter: AdapterConfig::default(),
        runner: RunnerConfig::default(),
    });
    let a_source = SessionSource::dm(Platform::Telegram, 1);
    let b_source = SessionSource::dm(Platform::Telegram, 2);
    engine
        .adapter
        .handle_message(MessageEvent::text(a_source.clone(), "spawn").with_message_id(10))
        .await;
    engine
        .adapter
        .handle_message(MessageEvent::text(b_source.clone(), "spawn").with_message_id(20))
        .await;
    assert!(
        eventually(Duration::from_secs(20), || agent
            .turns
            .lock()
            .unwrap()
            .len()
            == 2
            && agent.wakeups.lock().unwrap().len() == 2)
        .await,
        "both turns spawned and both wakeups ran: {:?} / {:?}",
        agent.turns.lock().unwrap(),
        agent.wakeups.lock().unwrap()
    );

    // No residue: outside the turns there is no identity.
    assert!(current_identity().is_none());
    assert!(current_session_id().is_none());

    let session_of = |source: &SessionSource| {
        engine
            .runner
            .current_session(&engine.adapter.session_key(source))
            .expect("the runner resolved a session")
            .to_string()
    };
    let (sess_a, sess_b) = (session_of(&a_source), session_of(&b_source));
    assert_ne!(sess_a, sess_b);
    let turns = agent.turns.lock().unwrap().clone();
    for (source, own) in [(&a_source, &sess_a), (&b_source, &sess_b)] {
        let turn = turns
            .iter()
            .find(|t| t.chat == source.chat_id)
            .expect("a turn per chat");
        assert_eq!(&turn.session, own);
        let seen = turn.seen.as_ref().expect("the runner bound an identity");
        assert_eq!(seen.session_key, engine.adapter.session_key(source));
        assert_eq!(seen.session_id.as_str(), own.as_str());
        assert_eq!(seen.generation, turn.generation);
        assert_eq!(seen.source.chat_id, source.chat_id);
        let captured = turn.captured.as_ref().expect("inside a turn");
        assert_eq!(
            captured.spawn_session_id.as_ref().map(SessionId::as_str),
            Some(own.as_str()),
            "MISROUTE: chat {} captured another session",
            source.chat_id
        );
        assert_eq!(captured.source.chat_id, source.chat_id);
        assert!(
            turn.started.contains("Started background process"),
            "{}",
            turn.started
        );
    }
    // The race was really set up: A captured while the global said B.
    let a_turn = turns.iter().find(|t| t.chat == 1).unwrap();
    assert_eq!(a_turn.global_at_capture, sess_b, "the race is set up");

    // The registry recorded each process with its own turn's owner...
    let mut owners: Vec<(i64, String)> = tool
        .registry()
        .list_all()
        .iter()
        .map(|r| {
            let owner = r.owner.as_ref().expect("background processes have owners");
            (
                owner.source.chat_id,
                r.spawn_session_id()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    owners.sort();
    assert_eq!(owners, vec![(1, sess_a.clone()), (2, sess_b.clone())]);
    // ...and each wakeup ran in its own chat, against its own session.
    let mut woken = agent.wakeups.lock().unwrap().clone();
    woken.sort();
    assert_eq!(woken, vec![(1, sess_a), (2, sess_b)]);

    *GLOBAL_SESSION.lock().unwrap() = saved_global;
}

#[tokio::test]
async fn the_binder_restores_the_previous_identity_and_touches_nothing_else() {
    let owner_session = || ProcessOwner::capture().and_then(|o| o.spawn_session_id);
    assert!(current_identity().is_none());
    assert!(TURN_PLATFORM.try_with(|p| *p).is_err());

    bind_turn_identity(identity("sid-outer", 1), async {
        assert_eq!(owner_session(), Some(SessionId::new("sid-outer")));
        bind_turn_identity(identity("sid-inner", 1), async {
            assert_eq!(owner_session(), Some(SessionId::new("sid-inner")));
        })
        .await;
        // The outer value is back (not cleared).
        assert_eq!(owner_session(), Some(SessionId::new("sid-outer")));
        // Other per-turn values are untouched.
        assert!(TURN_PLATFORM.try_with(|p| *p).is_err());
    })
    .await;
    assert!(current_identity().is_none());
    assert!(TURN_PLATFORM.try_with(|p| *p).is_err());

    // A per-turn value set outside survives the binder unchanged.
    TURN_PLATFORM
        .scope("telegram", async {
            bind_turn_identity(identity("sid", 1), async {
                assert_eq!(TURN_PLATFORM.with(|p| *p), "telegram");
            })
            .await;
            assert_eq!(TURN_PLATFORM.with(|p| *p), "telegram");
            assert!(current_identity().is_none());
        })
        .await;
}

#[tokio::test]
async fn outside_a_turn_there_is_no_owner_and_the_tool_says_so() {
    assert!(ProcessOwner::capture().is_none());
    let (tool, _wakeups) = terminal_tool();
    let refused = tool
        .call(
            "terminal",
            r#"{"command": "true", "background": true, "notify_on_complete": true}"#,
            tool_context(),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("chat turn"), "{refused}");
    // A foreground command needs no owner.
    let ran = tool
        .call("terminal", r#"{"command": "echo hi"}"#, tool_context())
        .await
        .unwrap();
    assert!(ran.contains("exit code 0") && ran.contains("hi"), "{ran}");
    assert!(tool.registry().list(Scope::Unowned).is_empty());
}

// ---------------------------------------------------------------------------
// Defence in depth: completion-time check against the spawn-time owner
// ---------------------------------------------------------------------------

#[test]
fn the_resolver_reroutes_to_the_owner_on_a_positive_mismatch() {
    // The key resolved to B (contaminated), but A spawned the process.
    // (The resolver is public with exactly this shape.)
    let resolve: fn(&ProcessId, SessionId, Option<&ProcessRecord>) -> SessionId =
        resolve_wakeup_target;
    let process = record(SESS_B, SESS_A);
    let target = resolve(
        &ProcessId::new("proc_f377e2f552cd"),
        SessionId::new(SESS_B),
        Some(&process),
    );
    assert_eq!(
        target.as_str(),
        SESS_A,
        "the wakeup must go to the spawn-time owner"
    );
}

#[test]
fn the_resolver_passes_through_when_consistent() {
    let process = record("session-normal", "session-normal");
    let target = resolve_wakeup_target(
        &ProcessId::new("proc_ok"),
        SessionId::new("session-normal"),
        Some(&process),
    );
    assert_eq!(target.as_str(), "session-normal");
}

#[test]
fn the_resolver_passes_through_when_the_owner_is_unknown() {
    let resolved = || SessionId::new("session-unknown-owner");
    let id = ProcessId::new("proc_cron");
    // An empty owner (a process from outside any turn, or an old record).
    let empty_owner = record("session-unknown-owner", "");
    assert_eq!(
        resolve_wakeup_target(&id, resolved(), Some(&empty_owner)),
        resolved()
    );
    // No owner at all.
    let no_owner = ProcessRecord::detached(id.clone(), "true", None);
    assert_eq!(
        resolve_wakeup_target(&id, resolved(), Some(&no_owner)),
        resolved()
    );
    // No record.
    assert_eq!(resolve_wakeup_target(&id, resolved(), None), resolved());
}
