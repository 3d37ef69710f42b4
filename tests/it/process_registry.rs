//! The process registry against real processes: bounded output, whole-group
//! kills (checked in /proc), limits, working directory and secrets, chat
//! isolation, and the wakeup bookkeeping around `process wait`.

use crate::support;

use std::time::Duration;

use futures::FutureExt;
use serde_json::json;
use support::tools_bot::live_group_members;
use telegate::tools::process::{
    ProcessMode, ProcessOwner, ProcessRegistry, RegistryConfig, Scope, SpawnError, SpawnSpec,
    WaitOutcome,
};
use telegate::tools::{
    tool_events, TerminalConfig, TerminalTool, ToolContext, ToolEvent, ToolEventReceiver,
    ToolRegistry,
};
use telegate::vocab::{
    bind_turn_identity, Platform, Progress, SessionId, SessionKey, SessionSource, TurnGeneration,
    TurnIdentity,
};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(5);
const CAP: usize = 64 * 1024;

fn registry(config: RegistryConfig) -> (ProcessRegistry, ToolEventReceiver) {
    let (events, receiver) = tool_events();
    (ProcessRegistry::new(config, events), receiver)
}

fn owner(chat_id: i64) -> ProcessOwner {
    ProcessOwner {
        session_key: SessionKey::from_raw(format!("chat-{chat_id}")),
        source: SessionSource::dm(Platform::Telegram, chat_id),
        spawn_session_id: Some(SessionId::new(format!("session-{chat_id}"))),
    }
}

fn background(command: &str, chat_id: i64, notify: bool) -> SpawnSpec {
    SpawnSpec {
        command: command.to_string(),
        owner: Some(owner(chat_id)),
        mode: ProcessMode::Background {
            notify_on_complete: notify,
        },
    }
}

async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_printing_forever_never_outgrows_its_buffer() {
    let (registry, _events) = registry(RegistryConfig {
        output_cap_bytes: CAP,
        ..RegistryConfig::default()
    });
    let record = registry
        .spawn_background(background("yes telegate", 1, false))
        .expect("yes starts");
    let id = record.id.clone();
    let scope_key = owner(1).session_key;
    let scope = Scope::Chat(&scope_key);
    let mut samples = Vec::new();
    let produced_a_lot = eventually(WAIT, || {
        let stats = registry.get(&id, scope).expect("listed").output;
        samples.push(stats);
        stats.total >= 16 * CAP as u64
    })
    .await;
    assert!(produced_a_lot, "yes produced {:?}", samples.last());
    // While it keeps printing, the ring stays at its cap and its one
    // allocation never grows.
    for _ in 0..20 {
        let stats = registry.get(&id, scope).expect("listed").output;
        samples.push(stats);
        tokio::task::yield_now().await;
    }
    assert!(registry.get(&id, scope).unwrap().is_running());
    for stats in &samples {
        assert!(stats.held <= CAP, "held {} > cap", stats.held);
        assert!(
            stats.allocated <= CAP,
            "allocated {} > cap",
            stats.allocated
        );
    }
    let last = samples.last().unwrap();
    assert_eq!(last.held, CAP);
    let output = registry.output(&id, scope).unwrap();
    assert!(output.len() <= CAP);
    assert!(output.contains("telegate\ntelegate\n"));

    let pgid = record.pgid.unwrap();
    let killed = registry.kill(&id, scope).await.unwrap();
    assert!(!killed.is_running());
    assert!(eventually(WAIT, || live_group_members(pgid).is_empty()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_background_process_kills_its_whole_group() {
    let (registry, mut events) = registry(RegistryConfig::default());
    let record = registry
        .spawn_background(background("sleep 30 & sleep 30 & wait", 1, true))
        .unwrap();
    let pgid = record.pgid.unwrap();
    assert!(eventually(WAIT, || live_group_members(pgid).len() >= 3).await);
    let key = owner(1).session_key;
    let killed = registry.kill(&record.id, Scope::Chat(&key)).await.unwrap();
    assert!(
        killed.state_text().contains("killed on request"),
        "{}",
        killed.state_text()
    );
    assert!(
        live_group_members(pgid).is_empty(),
        "{:?}",
        live_group_members(pgid)
    );
    // A kill on request sends no wakeup: the exit was recorded before kill
    // returned, and no event is waiting.
    assert!(try_next_signal(&mut events).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_with_a_clear_error() {
    let (registry, _events) = registry(RegistryConfig {
        max_background_per_chat: 2,
        max_background_total: 3,
        ..RegistryConfig::default()
    });
    for _ in 0..2 {
        registry
            .spawn_background(background("sleep 30", 1, false))
            .unwrap();
    }
    let refused = registry
        .spawn_background(background("sleep 30", 1, false))
        .unwrap_err();
    assert!(matches!(refused, SpawnError::ChatLimit { limit: 2 }));
    assert!(refused.to_string().contains("max_background"), "{refused}");
    registry
        .spawn_background(background("sleep 30", 2, false))
        .unwrap();
    let refused = registry
        .spawn_background(background("sleep 30", 3, false))
        .unwrap_err();
    assert!(matches!(refused, SpawnError::TotalLimit { limit: 3 }));
    // Foreground commands are not background processes.
    let run = registry
        .spawn_foreground("true".to_string(), Some(owner(1)))
        .unwrap();
    drop(run);
    // A finished process frees its place.
    let key = owner(1).session_key;
    let first = registry.list(Scope::Chat(&key))[0].id.clone();
    registry.kill(&first, Scope::Chat(&key)).await.unwrap();
    registry
        .spawn_background(background("sleep 30", 1, false))
        .unwrap();
    for record in registry.list_all() {
        let key = record.owner.as_ref().unwrap().session_key.clone();
        registry.kill(&record.id, Scope::Chat(&key)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_command_is_killed_with_its_group_on_timeout_and_on_drop() {
    let (registry, _events) = registry(RegistryConfig {
        kill_grace: Duration::from_millis(300),
        ..RegistryConfig::default()
    });
    let run = registry
        .spawn_foreground("sleep 30 & sleep 30; wait".to_string(), None)
        .unwrap();
    let pgid = registry.list(Scope::Unowned)[0].pgid.unwrap();
    let outcome = run
        .wait(
            Duration::from_millis(200),
            &CancellationToken::new(),
            &Progress::new(),
        )
        .await;
    assert!(matches!(outcome, WaitOutcome::StillRunning(_)));
    assert!(live_group_members(pgid).is_empty());
    drop(run);
    assert!(
        registry.list(Scope::Unowned).is_empty(),
        "the record left with its run"
    );

    // Dropped mid-wait (a cancelled turn): the guard kills the group.
    let run = registry
        .spawn_foreground("sleep 30 & sleep 30; wait".to_string(), None)
        .unwrap();
    let pgid = registry.list(Scope::Unowned)[0].pgid.unwrap();
    assert!(eventually(WAIT, || live_group_members(pgid).len() >= 2).await);
    let progress = Progress::new();
    let cancel = CancellationToken::new();
    let waiting = run.wait(WAIT, &cancel, &progress);
    assert!(tokio::time::timeout(Duration::from_millis(50), waiting)
        .await
        .is_err());
    drop(run);
    assert!(eventually(WAIT, || live_group_members(pgid).is_empty()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_saw_the_exit_consumes_the_wakeup_and_an_abandoned_one_does_not() {
    let (registry, mut events) = registry(RegistryConfig::default());
    let key = owner(1).session_key;
    let scope = Scope::Chat(&key);
    let cancel = CancellationToken::new();

    // 1. The agent waits and sees the exit: no wakeup.
    let record = registry
        .spawn_background(background("sleep 0.2; echo done", 1, true))
        .unwrap();
    let outcome = registry
        .wait(&record.id, scope, WAIT, &cancel, None)
        .await
        .unwrap();
    assert!(matches!(outcome, WaitOutcome::Exited(_)));
    assert!(
        try_next_signal(&mut events).is_none(),
        "the wait consumed the wakeup"
    );

    // 2. A wait that times out leaves the wakeup to come.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; echo done",
        go.display()
    );
    let record = registry
        .spawn_background(background(&command, 1, true))
        .unwrap();
    let outcome = registry
        .wait(&record.id, scope, Duration::from_millis(50), &cancel, None)
        .await
        .unwrap();
    assert!(matches!(outcome, WaitOutcome::StillRunning(_)));
    std::fs::write(&go, "").unwrap();
    let event = tokio::time::timeout(WAIT, next_signal(&mut events))
        .await
        .unwrap();
    let Some(ToolEvent::Wakeup(wakeup)) = event else {
        panic!("expected a wakeup");
    };
    assert_eq!(wakeup.process.id, record.id);
    assert_eq!(wakeup.output_tail, "done\n");

    // 3. A wait abandoned after the exit but before it reported it (its
    //    turn was dropped) hands the wakeup back.
    std::fs::remove_file(&go).unwrap();
    let record = registry
        .spawn_background(background(&command, 1, true))
        .unwrap();
    let mut waiting = Box::pin(registry.wait(&record.id, scope, WAIT, &cancel, None));
    assert!(
        (&mut waiting).now_or_never().is_none(),
        "the waiter is registered"
    );
    std::fs::write(&go, "").unwrap();
    assert!(
        eventually(WAIT, || !registry
            .get(&record.id, scope)
            .unwrap()
            .is_running())
        .await
    );
    assert!(
        try_next_signal(&mut events).is_none(),
        "held back for the waiter"
    );
    drop(waiting);
    let Some(ToolEvent::Wakeup(wakeup)) = try_next_signal(&mut events) else {
        panic!("the abandoned wait handed the wakeup back");
    };
    assert_eq!(wakeup.process.id, record.id);
    assert!(try_next_signal(&mut events).is_none(), "exactly once");
}

fn turn(chat_id: i64) -> TurnIdentity {
    TurnIdentity {
        session_key: owner(chat_id).session_key,
        session_id: owner(chat_id).spawn_session_id.unwrap(),
        generation: TurnGeneration::next(),
        source: owner(chat_id).source,
    }
}

fn ctx() -> ToolContext {
    ToolContext {
        cancel: CancellationToken::new(),
        progress: Progress::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_tool_lists_polls_waits_and_kills_within_its_chat_only() {
    let (events, _receiver) = tool_events();
    let tool = TerminalTool::new(
        &TerminalConfig {
            enabled: true,
            ..TerminalConfig::default()
        },
        Vec::new(),
        events,
    )
    .unwrap();
    let call = |name: &'static str, args: serde_json::Value, chat: i64| {
        let tool = &tool;
        bind_turn_identity(turn(chat), async move {
            tool.call(name, &args.to_string(), ctx()).await
        })
    };
    let started = call(
        "terminal",
        json!({"command": "echo first; sleep 0.3; echo second", "background": true}),
        1,
    )
    .await
    .unwrap();
    // "Started background process p1a2b (process group …). …"
    let id = started.split_whitespace().nth(3).unwrap().to_string();
    let listed = call("process", json!({"action": "list"}), 1).await.unwrap();
    assert!(
        listed.contains(&id) && listed.contains("echo first"),
        "{listed}"
    );
    // Another chat sees nothing of it.
    let other = call("process", json!({"action": "list"}), 2).await.unwrap();
    assert_eq!(other, "No background processes.");
    let poll = call("process", json!({"action": "poll", "id": id}), 2).await;
    assert!(poll.unwrap_err().to_string().contains("no process"));
    let kill = call("process", json!({"action": "kill", "id": id}), 2).await;
    assert!(kill.is_err());

    let waited = call(
        "process",
        json!({"action": "wait", "id": id, "timeout": 5}),
        1,
    )
    .await
    .unwrap();
    assert!(waited.contains("exit code 0"), "{waited}");
    assert!(waited.contains("first\nsecond"), "{waited}");
    let polled = call("process", json!({"action": "poll", "id": id}), 1)
        .await
        .unwrap();
    assert!(polled.contains("exit code 0"), "{polled}");
    let missing = call("process", json!({"action": "wait"}), 1)
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("needs the process id"),
        "{missing}"
    );
}

/// The next wakeup or notice already waiting, skipping the bookkeeping
/// events (a background process started / ended) the registry also sends.
fn try_next_signal(events: &mut ToolEventReceiver) -> Option<ToolEvent> {
    while let Some(event) = events.try_recv() {
        if !is_bookkeeping(&event) {
            return Some(event);
        }
    }
    None
}

/// The next wakeup or notice, skipping bookkeeping events.
async fn next_signal(events: &mut ToolEventReceiver) -> Option<ToolEvent> {
    loop {
        match events.recv().await {
            Some(event) if is_bookkeeping(&event) => continue,
            other => return other,
        }
    }
}

fn is_bookkeeping(event: &ToolEvent) -> bool {
    matches!(
        event,
        ToolEvent::BackgroundStarted { .. } | ToolEvent::BackgroundEnded { .. }
    )
}
