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
//! The reference's "module exposes X" tests are compile-time facts here: this
//! file only compiles because `telegate::identity::bind_turn_identity` and
//! `telegate::tools::wakeup::resolve_wakeup_target` exist with these
//! signatures (see the two `*_is_exposed` tests).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use telegate::agent::Progress;
use telegate::event::{Platform, SessionKey, SessionSource};
use telegate::identity::{
    bind_turn_identity, current_identity, current_session_id, SessionId, TurnGeneration,
    TurnIdentity,
};
use telegate::tools::process::{ProcessId, ProcessOwner, ProcessRecord, Scope};
use telegate::tools::wakeup::resolve_wakeup_target;
use telegate::tools::{tool_events, TerminalConfig, TerminalTool, ToolContext, ToolRegistry};
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

#[test]
fn the_turn_identity_binder_is_exposed() {
    // Compiles only while the binder is public and takes an identity and a
    // future; `current_identity` is its reader.
    let _binder = bind_turn_identity::<std::future::Ready<()>>;
    let _reader: fn() -> Option<TurnIdentity> = current_identity;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_capture_their_own_session_under_a_global_race() {
    let saved_global = std::mem::take(&mut *GLOBAL_SESSION.lock().unwrap());
    let (tool, mut wakeups) = terminal_tool();
    let barrier = Arc::new(Barrier::new(2));
    let b_stamped = Arc::new(Notify::new());

    // Each turn stamps the global slot (as a fallback writer would), then
    // performs the exact capture the terminal tool makes for a background
    // spawn, once directly and once through a real tool call.
    let turn = |session: &'static str, chat: i64, is_b: bool| {
        let (tool, barrier, b_stamped) = (tool.clone(), barrier.clone(), b_stamped.clone());
        tokio::spawn(bind_turn_identity(identity(session, chat), async move {
            *GLOBAL_SESSION.lock().unwrap() = session.to_string();
            barrier.wait().await;
            if is_b {
                // B stamps last, while A is still mid-turn.
                *GLOBAL_SESSION.lock().unwrap() = session.to_string();
                b_stamped.notify_one();
            } else {
                tokio::time::timeout(Duration::from_secs(5), b_stamped.notified())
                    .await
                    .expect("B never stamped the global session");
                assert_eq!(
                    *GLOBAL_SESSION.lock().unwrap(),
                    SESS_B,
                    "the race is set up"
                );
            }
            let captured = ProcessOwner::capture().expect("inside a turn");
            let started = tool
                .call(
                    "terminal",
                    &json!({"command": "true", "background": true, "notify_on_complete": true})
                        .to_string(),
                    tool_context(),
                )
                .await
                .expect("background spawn");
            (captured, started)
        }))
    };
    let a = turn(SESS_A, 1, false);
    let b = turn(SESS_B, 2, true);
    let joined = tokio::time::timeout(Duration::from_secs(10), async { (a.await, b.await) })
        .await
        .expect("both turns finished (no deadlock)");
    let ((captured_a, started_a), (captured_b, started_b)) = (
        joined.0.expect("turn A did not panic"),
        joined.1.expect("turn B did not panic"),
    );

    // No residue: outside the turns there is no identity.
    assert!(current_identity().is_none());
    assert!(current_session_id().is_none());

    assert_eq!(
        captured_a.spawn_session_id.as_ref().map(SessionId::as_str),
        Some(SESS_A),
        "MISROUTE: turn A captured another session"
    );
    assert_eq!(
        captured_b.spawn_session_id.as_ref().map(SessionId::as_str),
        Some(SESS_B),
        "MISROUTE: turn B captured another session"
    );
    // The registry recorded each process with its own turn's owner.
    let owners: Vec<(i64, String)> = tool
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
    assert!(owners.contains(&(1, SESS_A.to_string())), "{owners:?}");
    assert!(owners.contains(&(2, SESS_B.to_string())), "{owners:?}");
    assert!(
        started_a.contains("Started background process"),
        "{started_a}"
    );
    assert!(
        started_b.contains("Started background process"),
        "{started_b}"
    );

    // Both wakeups name their own owner.
    let mut woken = Vec::new();
    while woken.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), wakeups.recv())
            .await
            .expect("a wakeup for each process")
            .expect("the channel is open");
        if let telegate::tools::ToolEvent::Wakeup(wakeup) = event {
            let owner = wakeup.owner().expect("owner").clone();
            woken.push((
                owner.source.chat_id,
                owner.spawn_session_id.unwrap().to_string(),
            ));
        }
    }
    woken.sort();
    assert_eq!(
        woken,
        vec![(1, SESS_A.to_string()), (2, SESS_B.to_string())]
    );

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
fn the_wakeup_target_resolver_is_exposed() {
    // Compiles only while the resolver is public with this shape.
    let _: fn(&ProcessId, SessionId, Option<&ProcessRecord>) -> SessionId = resolve_wakeup_target;
}

#[test]
fn the_resolver_reroutes_to_the_owner_on_a_positive_mismatch() {
    // The key resolved to B (contaminated), but A spawned the process.
    let process = record(SESS_B, SESS_A);
    let target = resolve_wakeup_target(
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
