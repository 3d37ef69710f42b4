//! Invites and roles end to end against the fake Bot API (issue 26, item
//! 2): an invite works once and expires (a manual clock), it gives its
//! role, the team commands check the sender's role, an invited admin may
//! stop and approve anyone's turn while a user may not, and a revoked
//! member gets the stranger's reply.
//!
//! Assertions are on what the fakes recorded, never on timing.

use crate::support;

use std::time::Duration;

use serde_json::{json, Value};
use support::agents::ScriptedAgent;
use support::fake_bot::{ChatType, FakeBotApi};
use support::fake_openai::{last_user_contains, tool_result_after, Script};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use support::tools_bot::{ToolsBot, CHAT_A, CHAT_B};
use telegate::access::Role;
use telegate::clock::Clock;
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(10);
const OWNER: i64 = 1;
const GROUP: i64 = -100;

/// No allowed users: access is by pairing and invites.
fn test_bot(fake: &FakeBotApi) -> TestBot {
    TestBot::new(fake)
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml("[delivery]\nstreaming = \"edit\"\n\n[store]\nin_memory = true\n")
}

async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str) {
    let seen = fake
        .wait_for(
            |_| fake.sent_texts(chat).iter().any(|t| t.contains(needle)),
            WAIT,
        )
        .await;
    assert!(seen, "no {needle:?} in {chat}: {:?}", fake.sent_texts(chat));
}

/// Wait until `chat` got `n` texts containing `needle`.
async fn wait_count(fake: &FakeBotApi, chat: i64, needle: &str, n: usize) {
    let count = || {
        fake.sent_texts(chat)
            .iter()
            .filter(|t| t.contains(needle))
            .count()
    };
    let seen = fake.wait_for(|_| count() >= n, WAIT).await;
    assert!(
        seen,
        "not {n} {needle:?} in {chat}: {:?}",
        fake.sent_texts(chat)
    );
}

/// The code of the newest invite shown in `chat`.
fn invite_code(fake: &FakeBotApi, chat: i64) -> String {
    let texts = fake.sent_texts(chat);
    let text = texts
        .iter()
        .rev()
        .find(|t| t.contains("Invite for"))
        .expect("an invite was shown");
    let code = text.split("/start ").nth(1).unwrap()[..10].to_string();
    assert!(
        text.contains(&format!("https://t.me/telegate_test_bot?start={code}")),
        "{text}"
    );
    code
}

/// `user` sends `text` in their private chat and waits for `needle`.
async fn says(fake: &FakeBotApi, user: i64, text: &str, needle: &str) {
    let before = fake
        .sent_texts(user)
        .iter()
        .filter(|t| t.contains(needle))
        .count();
    fake.push_text(user, user, text);
    wait_count(fake, user, needle, before + 1).await;
}

/// The owner pairs with a code made in process (the binary's printed code
/// is tested in teams_pairing.rs).
async fn pair_owner(bot: &TelegramBot, fake: &FakeBotApi) {
    let access = bot.engine.runner.access().expect("teams are on");
    let code = access.pairing_code().await.unwrap();
    says(fake, OWNER, &format!("/pair {code}"), "You are the owner").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invites_work_once_expire_and_give_their_role_which_the_commands_check() {
    let fake = FakeBotApi::start().await;
    let clock = Clock::manual(1_700_000_000_000);
    let test_clock = clock.clone();
    let agent = ScriptedAgent::new();
    let bot = test_bot(&fake)
        .adjust(move |config| config.clock = test_clock.clone())
        .agent(agent.clone())
        .start()
        .await
        .unwrap();
    pair_owner(&bot, &fake).await;

    // A user invite: works once.
    says(&fake, OWNER, "/invite", "Invite for a new user").await;
    let code = invite_code(&fake, OWNER);
    says(
        &fake,
        2,
        &format!("/start {code}"),
        "You have access to this bot now (as user)",
    )
    .await;
    says(
        &fake,
        3,
        &format!("/start {code}"),
        "That code is not valid",
    )
    .await;
    says(&fake, 2, "hello", "answer:hello").await;

    // An admin invite expires after its hours (72 by default).
    says(&fake, OWNER, "/invite admin", "Invite for a new admin").await;
    let late = invite_code(&fake, OWNER);
    clock.advance_ms(72 * 3_600_000 + 1);
    says(
        &fake,
        4,
        &format!("/start {late}"),
        "That code is not valid",
    )
    .await;
    says(&fake, OWNER, "/invite admin", "Invite for a new admin").await;
    let admin = invite_code(&fake, OWNER);
    says(&fake, 5, &format!("/start {admin}"), "(as admin)").await;

    // What each role may do.
    says(&fake, 2, "/invite", "Only the owner or an admin").await;
    says(&fake, 2, "/users", "Only the owner or an admin").await;
    says(
        &fake,
        2,
        "/revoke 5",
        "Only the owner or an admin can revoke",
    )
    .await;
    says(&fake, 2, "/usage all", "Only the owner or an admin").await;
    says(
        &fake,
        5,
        "/invite admin",
        "Only the owner can invite admins",
    )
    .await;
    says(&fake, 5, "/role 2 admin", "Only the owner can change roles").await;
    says(&fake, 5, "/revoke 1", "The owner cannot be revoked").await;
    says(
        &fake,
        OWNER,
        "/role 1 user",
        "The owner's role cannot be changed",
    )
    .await;
    says(&fake, OWNER, "/role 2 admin", "User 2 is an admin now").await;
    says(&fake, 5, "/revoke 2", "Only the owner can revoke an admin").await;
    says(&fake, OWNER, "/role 2 user", "User 2 is a user now").await;
    says(&fake, 5, "a question", "answer:a question").await;
    says(&fake, 5, "/users", "People with access (3)").await;
    let users = fake.sent_texts(5).last().cloned().unwrap();
    assert!(users.contains("(1): owner · never active"), "{users}");
    // User 2's turn was before the clock moved on three days.
    assert!(users.contains("(2): user · active 3d ago\n"), "{users}");
    assert!(
        users.contains("(5): admin · active 0s ago · today 1 turn"),
        "{users}"
    );
    // An invite code is not shown in a group.
    fake.register_chat(GROUP, ChatType::Group);
    fake.push_group_text(GROUP, OWNER, "/invite@telegate_test_bot", false);
    wait_text(&fake, GROUP, "private chat").await;

    // The admin revokes the user: a stranger again.
    says(&fake, 5, "/revoke 2", "User 2 no longer has access").await;
    says(&fake, 2, "are you there?", "Your user id is 2").await;
    assert_eq!(
        agent.started(),
        2,
        "only user 2's first message and 5's ran"
    );
    assert!(
        !fake
            .sent_texts(2)
            .iter()
            .any(|t| t.contains("are you there")),
        "a revoked member's message ran"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invited_admin_may_stop_anyones_turn_a_user_may_not() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let agent = ScriptedAgent::new();
    let bot = test_bot(&fake).agent(agent.clone()).start().await.unwrap();
    pair_owner(&bot, &fake).await;
    let access = bot.engine.runner.access().unwrap();
    for (user, role) in [(2, Role::User), (3, Role::User), (5, Role::Admin)] {
        let invite = access.invite(OWNER as u64, role).await.unwrap();
        says(
            &fake,
            user,
            &format!("/start {}", invite.code),
            "You have access",
        )
        .await;
    }
    fake.push_group_text(GROUP, 2, "slow:60000", true);
    let (preview, stop) = stop_button(&fake).await;
    fake.push_callback_query(GROUP, 3, preview, &stop);
    assert!(wait_toast(&fake, "Only").await, "{:?}", toasts(&fake));
    assert_eq!(agent.cancelled(), 0, "another user's press changed nothing");
    fake.push_callback_query(GROUP, 5, preview, &stop);
    assert!(wait_toast(&fake, "Stopping").await, "{:?}", toasts(&fake));
    wait_text(&fake, GROUP, "⏹ Stopped.").await;
    assert_eq!(agent.cancelled(), 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invited_admin_may_approve_anyones_command_a_user_may_not() {
    let t = ToolsBot::start("").await;
    std::fs::create_dir(t.path("build")).unwrap();
    t.llm.push_when(
        last_user_contains("clean up"),
        Script::tool_call(
            "terminal",
            &json!({"command": "rm -rf build && echo removed"}).to_string(),
            "call-1",
        ),
    );
    t.llm
        .push_when(tool_result_after("clean up"), Script::text("cleaned"));
    // 44 joins as an admin, by an invite the config user 42 could not
    // make from the chat (config users are users); made in process here.
    let access = t.bot.engine.runner.access().unwrap();
    let invite = access.invite(CHAT_A as u64, Role::Admin).await.unwrap();
    says(
        &t.fake,
        44,
        &format!("/start {}", invite.code),
        "(as admin)",
    )
    .await;

    t.send(CHAT_A, "clean up");
    assert!(
        t.wait_text(CHAT_A, "/approve").await,
        "{:?}",
        t.texts(CHAT_A)
    );
    // CHAT_B is a user: may not answer another's approval.
    t.fake.push_text(CHAT_A, CHAT_B, "/approve");
    assert!(t.wait_text(CHAT_A, "You cannot answer approval").await);
    assert!(t.path("build").exists(), "nothing ran");
    // The admin may.
    t.fake.push_text(CHAT_A, 44, "/approve");
    assert!(
        t.wait_text(CHAT_A, "cleaned").await,
        "{:?}",
        t.texts(CHAT_A)
    );
    assert!(!t.path("build").exists(), "the approved command ran");
    t.shutdown().await;
}

fn toasts(fake: &FakeBotApi) -> Vec<String> {
    fake.calls_to("answerCallbackQuery")
        .iter()
        .map(|c| c.text().unwrap_or_default().to_string())
        .collect()
}

async fn wait_toast(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(|_| toasts(fake).iter().any(|t| t.contains(needle)), WAIT)
        .await
}

/// The Stop button under the group's preview: (message id, callback data).
async fn stop_button(fake: &FakeBotApi) -> (i64, String) {
    let find = || {
        for message in fake.message_history(GROUP) {
            let Some(markup) = &message.current().reply_markup else {
                continue;
            };
            let markup = match markup {
                Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
                other => other.clone(),
            };
            for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
                for key in row.as_array().into_iter().flatten() {
                    if key["text"].as_str().unwrap_or_default().contains("Stop") {
                        let data = key["callback_data"].as_str().unwrap_or_default();
                        return Some((message.message_id, data.to_string()));
                    }
                }
            }
        }
        None
    };
    let seen = fake.wait_for(|_| find().is_some(), WAIT).await;
    assert!(seen, "no Stop button: {:?}", fake.message_history(GROUP));
    find().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invited_admin_may_change_anyones_job_another_user_may_not() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let agent = ScriptedAgent::new();
    let bot = test_bot(&fake).agent(agent.clone()).start().await.unwrap();
    pair_owner(&bot, &fake).await;
    let access = bot.engine.runner.access().unwrap();
    for (user, role) in [(2, Role::User), (3, Role::User), (5, Role::Admin)] {
        let invite = access.invite(OWNER as u64, role).await.unwrap();
        says(
            &fake,
            user,
            &format!("/start {}", invite.code),
            "You have access",
        )
        .await;
    }
    fake.push_group_text(
        GROUP,
        2,
        "/every@telegate_test_bot day 08:00 remind: stand-up",
        false,
    );
    wait_text(&fake, GROUP, "⏰ Job 1:").await;
    // Another user may not pause it; the admin (a role, not a config
    // approver) may, and `/resume 1` names the job, not a conversation.
    fake.push_group_text(GROUP, 3, "/pause@telegate_test_bot 1", false);
    wait_text(&fake, GROUP, "🔒 Only").await;
    fake.push_group_text(GROUP, 5, "/pause@telegate_test_bot 1", false);
    wait_text(&fake, GROUP, "⏸ Job 1 paused").await;
    fake.push_group_text(GROUP, 3, "/resume@telegate_test_bot 1", false);
    wait_count(&fake, GROUP, "🔒 Only", 2).await;
    fake.push_group_text(GROUP, 5, "/resume@telegate_test_bot 1", false);
    wait_text(&fake, GROUP, "▶️ Job 1 resumed").await;
    assert!(
        !fake
            .sent_texts(GROUP)
            .iter()
            .any(|t| t.contains("no conversation")),
        "/resume 1 was read as a conversation: {:?}",
        fake.sent_texts(GROUP)
    );
    assert_eq!(agent.started(), 0, "job commands run no turn");
    bot.shutdown().await;
}
