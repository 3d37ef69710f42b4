//! The terminal tool end to end (fake Bot API + fake OpenAI scripting the
//! tool calls): background wakeups reach the chat and session that started
//! the process (while another chat is busy, while the owner is busy, after
//! /new), and /kill, /stop, /ps and /status deal with processes without
//! leaving any of their group behind.

use crate::support;

use serde_json::json;
use support::fake_openai::{
    last_tool_result, last_user_contains, messages, tool_result_after, Gate, Script,
};
use support::tools_bot::{live_group_members, ToolsBot, CHAT_A, CHAT_B};
use telegate::tools::process::{ProcessMode, ProcessState};

const WAKEUP: &str = "[telegate] Background process";

fn terminal_call(arguments: serde_json::Value) -> Script {
    Script::tool_call("terminal", &arguments.to_string(), "call-1")
}

fn mentions(request: &serde_json::Value, needle: &str) -> bool {
    messages(request)
        .iter()
        .any(|(_, text)| text.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_runs_in_the_owner_chat_and_session_while_another_chat_is_busy() {
    let t = ToolsBot::start("").await;
    t.llm.push_when(
        last_user_contains("A: start the job"),
        terminal_call(json!({
            "command": "sleep 1; echo done",
            "background": true,
            "notify_on_complete": true
        })),
    );
    t.llm.push_when(
        tool_result_after("A: start the job"),
        Script::text("A: started it"),
    );
    t.llm.push_when(
        last_user_contains(WAKEUP),
        Script::text("A: the job said done"),
    );
    t.llm
        .push_when(last_user_contains("B: think hard"), Script::Hang);

    // Chat B is busy for the whole test.
    t.send(CHAT_B, "B: think hard");
    assert!(
        t.until(|| !t
            .llm
            .requests_matching(&last_user_contains("B: think"))
            .is_empty())
            .await
    );
    t.send(CHAT_A, "A: start the job");
    assert!(t.wait_text(CHAT_A, "A: started it").await);
    assert!(t.wait_text(CHAT_A, "A: the job said done").await);

    // The wakeup turn ran once, with chat A's conversation only.
    let wakeups = t.llm.requests_matching(&last_user_contains(WAKEUP));
    assert_eq!(wakeups.len(), 1);
    let wakeup = &wakeups[0];
    assert!(mentions(wakeup, "A: start the job"));
    assert!(!mentions(wakeup, "B: think hard"));
    let (_, text) = messages(wakeup).pop().unwrap();
    assert!(text.contains("exit code 0"), "{text}");
    assert!(text.contains("Command: sleep 1; echo done"), "{text}");
    assert!(text.contains("done"), "{text}");
    assert!(!text.contains("moved on"), "{text}");

    // In chat A's session: the process's owner, and the transcript.
    let session_a = t.session(CHAT_A).unwrap();
    let process = &t.processes(CHAT_A)[0];
    assert_eq!(process.spawn_session_id(), Some(&session_a));
    let transcript_a = t.transcript(&session_a).await;
    assert!(transcript_a.iter().any(|e| e.content.starts_with(WAKEUP)));
    assert!(transcript_a
        .iter()
        .any(|e| e.content == "A: the job said done"));
    let session_b = t.session(CHAT_B).unwrap();
    let transcript_b = t.transcript(&session_b).await;
    assert!(!transcript_b.iter().any(|e| e.content.contains("A:")));
    // Chat B saw nothing of it and is still busy.
    assert!(!t.texts(CHAT_B).iter().any(|m| m.contains("A:")));
    assert!(t
        .bot
        .engine
        .runner
        .running_agent(&ToolsBot::key(CHAT_B))
        .is_some());

    t.send(CHAT_B, "/stop");
    assert!(t.wait_text(CHAT_B, "Stopped").await);
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_for_a_busy_owner_waits_silently_and_runs_right_after_once() {
    let t = ToolsBot::start("").await;
    let gate = Gate::new();
    t.llm.push_when(
        last_user_contains("A: run it and keep busy"),
        terminal_call(json!({
            "command": "echo quick",
            "background": true,
            "notify_on_complete": true
        })),
    );
    t.llm.push_when(
        tool_result_after("A: run it and keep busy"),
        Script::Gated(gate.clone(), Box::new(Script::text("A: my turn is over"))),
    );
    t.llm.push_when(
        last_user_contains(WAKEUP),
        Script::text("A: handled the wakeup"),
    );

    t.send(CHAT_A, "A: run it and keep busy");
    let key = ToolsBot::key(CHAT_A);
    // The process ended while the turn still waits for the model.
    assert!(
        t.until(|| {
            t.processes(CHAT_A)
                .iter()
                .any(|p| matches!(p.state, ProcessState::Exited(_)))
                && t.bot.engine.adapter.pending_len(&key) == 1
        })
        .await,
        "the wakeup is queued behind the running turn"
    );
    assert!(t
        .llm
        .requests_matching(&last_user_contains(WAKEUP))
        .is_empty());
    assert!(t.bot.engine.adapter.is_active(&key));

    gate.open();
    assert!(t.wait_text(CHAT_A, "A: handled the wakeup").await);
    assert!(t.settled(CHAT_A).await);
    let (turn, wakeup) = (
        t.position(CHAT_A, "A: my turn is over").unwrap(),
        t.position(CHAT_A, "A: handled the wakeup").unwrap(),
    );
    assert!(
        turn < wakeup,
        "the turn answered first: {:?}",
        t.texts(CHAT_A)
    );
    assert_eq!(
        t.llm.requests_matching(&last_user_contains(WAKEUP)).len(),
        1
    );
    // Queued silently: no acknowledgement, no interruption.
    assert!(!t
        .texts(CHAT_A)
        .iter()
        .any(|m| m.contains("Queued") || m.contains("Interrupting")));
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_after_new_reaches_the_chat_in_the_session_that_started_it() {
    let t = ToolsBot::start("").await;
    let go = t.path("go");
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo finished",
        go.display()
    );
    t.llm.push_when(
        last_user_contains("A: start the watcher"),
        terminal_call(json!({"command": command, "background": true, "notify_on_complete": true})),
    );
    t.llm.push_when(
        tool_result_after("A: start the watcher"),
        Script::text("A: watching"),
    );
    t.llm.push_when(
        last_user_contains(WAKEUP),
        Script::text("A: the old session got it"),
    );
    t.llm.push_when(
        last_user_contains("A: hello again"),
        Script::text("A: fresh"),
    );

    t.send(CHAT_A, "A: start the watcher");
    assert!(t.wait_text(CHAT_A, "A: watching").await);
    let old = t.session(CHAT_A).unwrap();
    t.send(CHAT_A, "/new");
    assert!(t.wait_text(CHAT_A, "Started a fresh session").await);
    let new = t.session(CHAT_A).unwrap();
    assert_ne!(old, new);
    assert!(
        t.processes(CHAT_A)[0].is_running(),
        "/new leaves processes running"
    );

    std::fs::write(&go, "").unwrap();
    assert!(t.wait_text(CHAT_A, "A: the old session got it").await);
    let wakeup = t.llm.requests_matching(&last_user_contains(WAKEUP));
    assert_eq!(wakeup.len(), 1);
    // It ran with the old conversation, and says so.
    assert!(mentions(&wakeup[0], "A: start the watcher"));
    let (_, text) = messages(&wakeup[0]).pop().unwrap();
    assert!(
        text.contains(&format!("started in session {old}")),
        "{text}"
    );
    assert!(text.contains(&new.to_string()), "{text}");
    assert!(text.contains("finished"), "{text}");
    // Its transcript is the old session's; the new one is untouched.
    let old_transcript = t.transcript(&old).await;
    assert!(old_transcript
        .iter()
        .any(|e| e.content == "A: the old session got it"));
    assert!(t.transcript(&new).await.is_empty());
    assert_eq!(
        t.session(CHAT_A),
        Some(new.clone()),
        "the chat stays in its new session"
    );

    // The next message runs in the new session, without the old history.
    assert!(t.settled(CHAT_A).await);
    t.send(CHAT_A, "A: hello again");
    assert!(t.wait_text(CHAT_A, "A: fresh").await);
    let hello = t
        .llm
        .requests_matching(&last_user_contains("A: hello again"));
    assert!(!mentions(&hello[0], "A: start the watcher"));
    t.shutdown().await;
}

/// The running foreground process of `chat`, once it has started.
async fn running_foreground(t: &ToolsBot, chat: i64) -> telegate::tools::process::ProcessRecord {
    assert!(
        t.until(|| t
            .processes(chat)
            .iter()
            .any(|p| p.mode == ProcessMode::Foreground && p.is_running()))
            .await
    );
    t.processes(chat)
        .into_iter()
        .find(|p| p.mode == ProcessMode::Foreground)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_during_a_foreground_command_leaves_nothing_of_its_group() {
    let t = ToolsBot::start("").await;
    t.llm.push_when(
        last_user_contains("A: wait a long time"),
        terminal_call(json!({"command": "sleep 30 & sleep 30; wait"})),
    );
    t.send(CHAT_A, "A: wait a long time");
    let process = running_foreground(&t, CHAT_A).await;
    let pgid = process.pgid.unwrap();
    assert!(t.until(|| live_group_members(pgid).len() >= 2).await);

    t.send(CHAT_A, "/stop");
    assert!(t.wait_text(CHAT_A, "Stopped").await);
    assert!(
        t.until(|| live_group_members(pgid).is_empty()).await,
        "left alive: {:?}",
        live_group_members(pgid)
    );
    assert!(t.until(|| t.processes(CHAT_A).is_empty()).await);
    assert!(t.settled(CHAT_A).await);
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_ends_a_foreground_command_and_the_agent_carries_on() {
    let t = ToolsBot::start("").await;
    t.llm.push_when(
        last_user_contains("A: hang around"),
        terminal_call(json!({"command": "sleep 30 & sleep 30; wait"})),
    );
    t.llm.push_when(
        tool_result_after("A: hang around"),
        Script::text("A: it was killed, moving on"),
    );
    t.send(CHAT_A, "A: hang around");
    let process = running_foreground(&t, CHAT_A).await;
    let pgid = process.pgid.unwrap();

    t.send(CHAT_A, "/ps");
    assert!(t.wait_text(CHAT_A, "running (foreground)").await);
    t.send(CHAT_A, &format!("/kill {}", process.id));
    assert!(t.wait_text(CHAT_A, &format!("Killed {}", process.id)).await);
    assert!(live_group_members(pgid).is_empty());
    assert!(t.wait_text(CHAT_A, "A: it was killed, moving on").await);
    let result = last_tool_result(
        &t.llm
            .requests_matching(&tool_result_after("A: hang around"))[0],
    )
    .unwrap();
    assert!(result.contains("killed on request"), "{result}");
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_status_and_kill_manage_background_processes_without_a_wakeup() {
    let t = ToolsBot::start("").await;
    t.llm.push_when(
        last_user_contains("A: run forever"),
        terminal_call(json!({
            "command": "sleep 30 & sleep 30; wait",
            "background": true,
            "notify_on_complete": true
        })),
    );
    t.llm.push_when(
        tool_result_after("A: run forever"),
        Script::text("A: it runs"),
    );
    t.send(CHAT_A, "A: run forever");
    assert!(t.wait_text(CHAT_A, "A: it runs").await);
    let process = t.processes(CHAT_A).remove(0);
    let pgid = process.pgid.unwrap();

    t.send(CHAT_A, "/ps");
    assert!(t.wait_text(CHAT_A, "Background processes (id").await);
    let ps = t
        .texts(CHAT_A)
        .into_iter()
        .find(|m| m.contains("(id"))
        .unwrap();
    assert!(ps.contains(&format!("{}  running", process.id)), "{ps}");
    assert!(ps.contains("sleep 30 & sleep 30; wait"), "{ps}");
    t.send(CHAT_A, "/status");
    assert!(t.wait_text(CHAT_A, "Background processes running: 1").await);
    let status = t
        .texts(CHAT_A)
        .into_iter()
        .find(|m| m.contains("Background processes running"))
        .unwrap();
    assert!(
        status.contains(process.id.as_str()) && status.contains("sleep 30"),
        "/status does not show the process: {status}"
    );
    // Another chat neither sees nor kills it.
    t.send(CHAT_B, &format!("/kill {}", process.id));
    assert!(t.wait_text(CHAT_B, "There is no process").await);
    assert!(t.processes(CHAT_A)[0].is_running());

    t.send(CHAT_A, &format!("/kill {}", process.id));
    assert!(t.wait_text(CHAT_A, &format!("Killed {}", process.id)).await);
    assert!(live_group_members(pgid).is_empty());
    t.send(CHAT_A, "/ps");
    assert!(
        t.fake
            .wait_for(
                |_| t
                    .texts(CHAT_A)
                    .iter()
                    .any(|m| m.contains("(id") && m.contains("killed on request")),
                support::tools_bot::WAIT
            )
            .await
    );
    // Killed on request: the user knows, no wakeup turn follows.
    assert!(t.settled(CHAT_A).await);
    assert!(t
        .llm
        .requests_matching(&last_user_contains(WAKEUP))
        .is_empty());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_background_processes_are_recorded_until_they_end() {
    let t = ToolsBot::start("").await;
    t.llm.push_when(
        last_user_contains("start both"),
        terminal_call(json!({"command": "sleep 30", "background": true})),
    );
    t.llm.push_when(
        tool_result_after("start both"),
        terminal_call(json!({"command": "sleep 0.1", "background": true})),
    );
    t.llm.push(Script::text("both started"));
    t.send(CHAT_A, "start both");
    assert!(t.wait_text(CHAT_A, "both started").await);
    // The short one ends; only the long one is still recorded as running,
    // which is what a restart would report to chat A as lost.
    assert!(
        t.until(|| t
            .processes(CHAT_A)
            .iter()
            .any(|p| p.command == "sleep 0.1" && !matches!(p.state, ProcessState::Running)))
            .await
    );
    let store = t.bot.store.clone();
    let mut lost = Vec::new();
    for _ in 0..200 {
        lost = store.processes().take_lost_processes().await.unwrap();
        if lost.len() == 1 {
            break;
        }
        // Put them back and look again once the end was recorded.
        for process in lost.drain(..) {
            store.processes().process_started(process).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].command, "sleep 30");
    assert_eq!(lost[0].chat_id, CHAT_A);
    t.shutdown().await;
}
