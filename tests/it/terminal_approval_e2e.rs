//! Approval of dangerous commands end to end: the chat is asked, /approve
//! (or a bare "yes") reaches the waiting turn although the chat is busy,
//! /deny and a timeout give the model the refusal, /stop refuses, and a
//! harmless command runs without asking.

use crate::support;

use serde_json::json;
use support::fake_bot::{Failure, RecordedCall};
use support::fake_openai::{last_tool_result, last_user_contains, tool_result_after, Script};
use support::tools_bot::{ToolsBot, CHAT_A};

const ASKED: &str = "wants to run this command";

/// The model asks to run `command` when it sees `trigger`, then answers
/// `answer` after the tool result.
fn script(t: &ToolsBot, trigger: &str, command: &str, answer: &str) {
    t.llm.push_when(
        last_user_contains(trigger),
        Script::tool_call(
            "terminal",
            &json!({"command": command}).to_string(),
            "call-1",
        ),
    );
    t.llm
        .push_when(tool_result_after(trigger), Script::text(answer));
}

fn tool_result(t: &ToolsBot, trigger: &str) -> String {
    let requests = t.llm.requests_matching(&tool_result_after(trigger));
    assert_eq!(requests.len(), 1, "one request with the tool result");
    last_tool_result(&requests[0]).unwrap()
}

/// A `build` directory with a file, for `rm -rf build` to remove.
fn make_build_dir(t: &ToolsBot) {
    std::fs::create_dir(t.path("build")).unwrap();
    std::fs::write(t.path("build/artifact"), "x").unwrap();
}

fn approval_pending(t: &ToolsBot) -> bool {
    t.bot
        .engine
        .runner
        .tools()
        .unwrap()
        .approvals()
        .is_pending(&ToolsBot::key(CHAT_A))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dangerous_command_asks_and_approve_unblocks_the_busy_turn() {
    let t = ToolsBot::start("").await;
    make_build_dir(&t);
    script(
        &t,
        "A: clean up",
        "rm -rf build && echo removed",
        "A: cleaned",
    );
    t.send(CHAT_A, "A: clean up");
    assert!(t.wait_text(CHAT_A, ASKED).await);
    let notice = t
        .texts(CHAT_A)
        .into_iter()
        .find(|m| m.contains(ASKED))
        .unwrap();
    assert!(notice.contains("rm -rf build && echo removed"), "{notice}");
    assert!(notice.contains("\"rm ** -*r*\""), "{notice}");
    assert!(t.path("build").exists(), "nothing ran before the answer");
    assert!(t.bot.engine.adapter.is_active(&ToolsBot::key(CHAT_A)));

    t.send(CHAT_A, "/approve");
    assert!(t.wait_text(CHAT_A, "Approved").await);
    assert!(t.wait_text(CHAT_A, "A: cleaned").await);
    let result = tool_result(&t, "A: clean up");
    assert!(
        result.contains("exit code 0") && result.contains("removed"),
        "{result}"
    );
    assert!(!t.path("build").exists());
    // The turn was neither interrupted nor queued behind.
    assert!(!t
        .texts(CHAT_A)
        .iter()
        .any(|m| m.contains("Interrupting") || m.contains("Queued")));
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_yes_approves_and_a_bare_no_denies() {
    let t = ToolsBot::start("").await;
    make_build_dir(&t);
    // Harmless, but it names a dangerous word, so it asks.
    script(&t, "A: first", "echo shutdown now", "A: first done");
    script(&t, "A: second", "rm -r build", "A: second done");
    t.send(CHAT_A, "A: first");
    assert!(t.wait_text(CHAT_A, ASKED).await);
    t.send(CHAT_A, "yes");
    assert!(t.wait_text(CHAT_A, "A: first done").await);
    let result = tool_result(&t, "A: first");
    assert!(
        result.contains("exit code 0") && result.contains("shutdown now"),
        "{result}"
    );
    assert!(t.settled(CHAT_A).await);

    t.send(CHAT_A, "A: second");
    assert!(t.until(|| approval_pending(&t)).await);
    t.send(CHAT_A, "No");
    assert!(t.wait_text(CHAT_A, "A: second done").await);
    assert!(tool_result(&t, "A: second").contains("denied by the user"));
    assert!(t.path("build").exists());
    // "yes" and "no" were answers, not turns of their own.
    assert!(t
        .llm
        .requests_matching(&last_user_contains("yes"))
        .is_empty());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_gives_the_agent_the_refusal() {
    let t = ToolsBot::start("").await;
    make_build_dir(&t);
    script(&t, "A: clean up", "rm -rf build", "A: ok, I left it");
    t.send(CHAT_A, "A: clean up");
    assert!(t.wait_text(CHAT_A, ASKED).await);
    t.send(CHAT_A, "/deny");
    assert!(t.wait_text(CHAT_A, "Denied").await);
    assert!(t.wait_text(CHAT_A, "A: ok, I left it").await);
    let result = tool_result(&t, "A: clean up");
    assert!(result.contains("denied by the user"), "{result}");
    assert!(t.path("build").exists());
    // Nothing is pending any more.
    t.send(CHAT_A, "/approve");
    assert!(
        t.wait_text(CHAT_A, "Nothing is waiting for your approval")
            .await
    );
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_times_out_as_a_denial() {
    let t = ToolsBot::start("approval_timeout_secs = 1").await;
    make_build_dir(&t);
    script(&t, "A: clean up", "rm -rf build", "A: it timed out");
    t.send(CHAT_A, "A: clean up");
    assert!(t.wait_text(CHAT_A, ASKED).await);
    assert!(t.wait_text(CHAT_A, "No answer in time").await);
    assert!(t.wait_text(CHAT_A, "A: it timed out").await);
    let result = tool_result(&t, "A: clean up");
    assert!(result.contains("approval timed out"), "{result}");
    assert!(t.path("build").exists());
    assert!(!approval_pending(&t));
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_denies_the_pending_approval() {
    let t = ToolsBot::start("").await;
    make_build_dir(&t);
    script(&t, "A: clean up", "rm -rf build", "A: never said");
    t.send(CHAT_A, "A: clean up");
    assert!(t.wait_text(CHAT_A, ASKED).await);
    // "Stopped" is slow to be answered: while it is on its way (the old
    // turn is cancelled only after it), the approval must already be
    // refused, or an Approve press could still run the command.
    t.fake.fail_next(
        "sendMessage",
        1,
        Failure::Delay(std::time::Duration::from_millis(800)),
    );
    t.send(CHAT_A, "/stop");
    let stopping = |calls: &[RecordedCall]| {
        calls
            .iter()
            .any(|c| c.method == "sendMessage" && c.text().is_some_and(|t| t.contains("Stopped")))
    };
    assert!(t.fake.wait_for(stopping, support::tools_bot::WAIT).await);
    assert!(
        !approval_pending(&t),
        "the approval was still pending while \"Stopped\" was on its way"
    );
    assert!(t.wait_text(CHAT_A, "Stopped").await);
    assert!(!approval_pending(&t));
    assert!(t.settled(CHAT_A).await);
    // An approval after /stop finds nothing, and nothing ran.
    t.send(CHAT_A, "/approve");
    assert!(
        t.wait_text(CHAT_A, "Nothing is waiting for your approval")
            .await
    );
    assert!(t.path("build").exists());
    assert!(t
        .llm
        .requests_matching(&tool_result_after("A: clean up"))
        .is_empty());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harmless_command_runs_without_asking() {
    let t = ToolsBot::start("").await;
    std::fs::write(t.path("notes.txt"), "hello").unwrap();
    script(
        &t,
        "A: look around",
        "ls && cat notes.txt",
        "A: I see notes",
    );
    t.send(CHAT_A, "A: look around");
    assert!(t.wait_text(CHAT_A, "A: I see notes").await);
    let result = tool_result(&t, "A: look around");
    assert!(result.contains("exit code 0"), "{result}");
    assert!(
        result.contains("notes.txt") && result.contains("hello"),
        "{result}"
    );
    assert!(!t.texts(CHAT_A).iter().any(|m| m.contains(ASKED)));
    t.shutdown().await;
}
