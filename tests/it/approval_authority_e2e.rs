//! Who may answer an approval, and what an answer is bound to, end to end
//! (fake Bot API + fake OpenAI scripting the terminal tool calls):
//!
//! * in a group sharing one session (`group_sessions_per_user = false`,
//!   open to strangers through `allowed_chats`), only the user whose message
//!   started the turn, or an approver, may /approve or /deny; others are
//!   told who can, and their bare "yes" is an ordinary message;
//! * a user in `[telegram] approvers` may answer someone else's request;
//! * the request shows the whole command (over several messages when long)
//!   and every pattern it matched, under a one-time id; an answer naming an
//!   old id never approves the command that replaced it.

use crate::support;

use serde_json::json;
use support::fake_openai::{last_tool_result, last_user_contains, tool_result_after, Script};
use support::tools_bot::{ToolsBot, CHAT_A, CHAT_B};
use telegate::tools::approval::Lookup;
use telegate::vocab::{ChatType, KeyPolicy, Platform, SessionKey, SessionSource};

/// A group open to everyone in it (allowed_chats).
const GROUP: i64 = -100;
/// Someone in the group who is not in allowed_users.
const STRANGER: i64 = 77;
const ASKED: &str = "wants to run this command";

fn group_key() -> SessionKey {
    SessionKey::for_source(
        &SessionSource {
            chat_type: ChatType::Group,
            ..SessionSource::dm(Platform::Telegram, GROUP)
        },
        KeyPolicy {
            group_sessions_per_user: false,
            ..KeyPolicy::default()
        },
    )
}

fn pending_in(t: &ToolsBot, chat: i64) -> Lookup {
    t.bot.engine.runner.tools().unwrap().approvals().lookup(
        &SessionKey::from_raw("none"),
        chat,
        None,
    )
}

/// The one-time id in the request sent to `chat`.
fn ticket(t: &ToolsBot, chat: i64) -> String {
    let text = t
        .texts(chat)
        .into_iter()
        .find(|m| m.contains(ASKED))
        .expect("a request was sent");
    let start = text.find("Approval ").expect("the request names its id") + "Approval ".len();
    text[start..start + 6].to_string()
}

fn make_build_dir(t: &ToolsBot) {
    std::fs::create_dir(t.path("build")).unwrap();
    std::fs::write(t.path("build/artifact"), "x").unwrap();
}

async fn group_bot(telegram_extra: &str) -> ToolsBot {
    ToolsBot::start_with(
        &format!("allowed_chats = [{GROUP}]\nrequire_mention = false\n{telegram_extra}"),
        "busy_mode = \"queue\"\ngroup_sessions_per_user = false",
        "",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_shared_group_session_only_the_starter_may_answer() {
    let t = group_bot("").await;
    make_build_dir(&t);
    t.llm.push_when(
        last_user_contains("G: clean up"),
        Script::tool_call(
            "terminal",
            &json!({"command": "rm -rf build"}).to_string(),
            "c1",
        ),
    );
    t.llm
        .push_when(tool_result_after("G: clean up"), Script::text("G: cleaned"));
    t.fake.push_group_text(GROUP, CHAT_A, "G: clean up", false);
    assert!(t.wait_text(GROUP, ASKED).await);

    // A stranger in the group and another allowed user are refused, told who can.
    t.fake.push_group_text(GROUP, STRANGER, "/approve", false);
    assert!(t.wait_text(GROUP, "You cannot answer approval").await);
    t.fake.push_group_text(GROUP, CHAT_B, "/deny", false);
    assert!(
        t.until(|| t
            .texts(GROUP)
            .iter()
            .filter(|m| m.contains("You cannot answer approval"))
            .count()
            == 2)
            .await
    );
    let refusal = t
        .texts(GROUP)
        .into_iter()
        .find(|m| m.contains("You cannot answer"))
        .unwrap();
    assert!(refusal.contains("who started this task"), "{refusal}");
    assert!(refusal.contains("approvers"), "{refusal}");
    // A stranger's bare "yes" is an ordinary message: queued behind the turn.
    t.fake.push_group_text(GROUP, STRANGER, "yes", false);
    assert!(
        t.until(|| t.bot.engine.adapter.pending_len(&group_key()) == 1)
            .await
    );
    assert!(matches!(pending_in(&t, GROUP), Lookup::Found(_)));
    assert!(t.path("build").exists(), "nothing ran");

    // The starter approves.
    t.fake.push_group_text(GROUP, CHAT_A, "/approve", false);
    assert!(t.wait_text(GROUP, "Approved").await);
    assert!(t.wait_text(GROUP, "G: cleaned").await);
    assert!(!t.path("build").exists());
    // The stranger's "yes" became a turn of its own afterwards.
    assert!(
        t.until(|| !t
            .llm
            .requests_matching(&last_user_contains("yes"))
            .is_empty())
            .await
    );
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_may_answer_another_users_request() {
    let t = group_bot(&format!("approvers = [{CHAT_B}]")).await;
    make_build_dir(&t);
    t.llm.push_when(
        last_user_contains("G: clean up"),
        Script::tool_call(
            "terminal",
            &json!({"command": "rm -rf build"}).to_string(),
            "c1",
        ),
    );
    t.llm
        .push_when(tool_result_after("G: clean up"), Script::text("G: cleaned"));
    t.fake.push_group_text(GROUP, CHAT_A, "G: clean up", false);
    assert!(t.wait_text(GROUP, ASKED).await);
    // The approver's bare "yes" answers it.
    t.fake.push_group_text(GROUP, CHAT_B, "yes", false);
    assert!(t.wait_text(GROUP, "G: cleaned").await);
    assert!(!t.path("build").exists());
    assert!(t
        .llm
        .requests_matching(&last_user_contains("yes"))
        .is_empty());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_shows_the_whole_command_and_every_match_under_a_one_time_id() {
    let t = ToolsBot::start("").await;
    make_build_dir(&t);
    // A long harmless middle hides a dangerous tail past the old 1,500-character cut.
    let command = format!("sudo true; echo {}; rm -rf build", "x".repeat(6000));
    t.llm.push_when(
        last_user_contains("A: long"),
        Script::tool_call("terminal", &json!({"command": command}).to_string(), "c1"),
    );
    // After the denial the model asks for another command, which replaces it.
    t.llm.push_when(
        tool_result_after("A: long"),
        Script::tool_call(
            "terminal",
            &json!({"command": "sudo echo second"}).to_string(),
            "c2",
        ),
    );
    t.llm
        .push_when(tool_result_after("A: long"), Script::text("A: done"));
    t.send(CHAT_A, "A: long");
    assert!(t.wait_text(CHAT_A, "rm -rf build").await);
    let first = ticket(&t, CHAT_A);
    let shown: String = t.texts(CHAT_A).concat();
    let squeeze = |s: &str| s.split_whitespace().collect::<String>();
    assert!(
        squeeze(&shown).contains(&squeeze(&command)),
        "the whole command is shown"
    );
    assert!(
        shown.contains("\"sudo\"") && shown.contains("\"rm ** -*r*\""),
        "every match: {shown}"
    );
    assert!(
        t.texts(CHAT_A).len() >= 2,
        "a long request spans several messages"
    );

    // A wrong id approves nothing.
    t.send(CHAT_A, "/approve zzzzzz");
    assert!(t.wait_text(CHAT_A, "Approval zzzzzz is not waiting").await);
    assert!(t.path("build").exists());
    // Deny the first; the model asks for a second command.
    t.send(CHAT_A, &format!("/deny {first}"));
    assert!(t.wait_text(CHAT_A, "Denied").await);
    assert!(
        t.until(|| t.texts(CHAT_A).iter().filter(|m| m.contains(ASKED)).count() == 2)
            .await
    );
    // The old id cannot approve the command that replaced it.
    t.send(CHAT_A, &format!("/approve {first}"));
    assert!(
        t.wait_text(CHAT_A, &format!("Approval {first} is not waiting"))
            .await
    );
    assert!(matches!(pending_in(&t, CHAT_A), Lookup::Found(p) if p.command == "sudo echo second"));
    t.send(CHAT_A, "/deny");
    assert!(t.wait_text(CHAT_A, "A: done").await);
    let results = t.llm.requests_matching(&tool_result_after("A: long"));
    assert!(results
        .iter()
        .all(|r| last_tool_result(r).unwrap().contains("denied by the user")));
    assert!(t.path("build").exists());
    t.shutdown().await;
}
