//! Authority is checked at every decision with the decider's current
//! standing (issue 57, items 1 and 2), end to end against the fake Bot API:
//!
//! * a user whose access was taken away cannot press Approve on the card of
//!   their own waiting turn (nor any other button): the press is refused
//!   and the command does not run;
//! * `/revoke` ends what the user had going: their running turn is stopped,
//!   the approval it waits for refused, their queued messages dropped and
//!   their jobs paused, all said in the answer (and to the owner when an
//!   admin revoked);
//! * a message of theirs queued before their access went is refused when
//!   its turn would start, not run.
//!
//! Assertions are on what the fakes recorded, waited for, never on timing.

use crate::support;

use serde_json::json;
use support::agents::ScriptedAgent;
use support::buttons::{toasts, wait_button, wait_toast};
use support::fake_bot::{ChatType, FakeBotApi};
use support::fake_openai::{last_user_contains, tool_result_after, Script};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use support::tools_bot::{ToolsBot, WAIT};
use telegate::access::Role;
use telegate::tools::approval::Lookup;
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::{Platform, SessionKey, SessionSource};

/// Pairs as the owner.
const OWNER: i64 = 50;
/// Joins by an invite as a user, then loses access.
const MEMBER: i64 = 60;
/// Joins by an invite as an admin.
const ADMIN: i64 = 70;
/// A group the members talk to the bot in.
const GROUP: i64 = -100;

/// Wait until a bot message in `chat` contains `needle`.
async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str) {
    let seen = fake
        .wait_for(
            |_| fake.sent_texts(chat).iter().any(|t| t.contains(needle)),
            WAIT,
        )
        .await;
    assert!(seen, "no {needle:?} in {chat}: {:?}", fake.sent_texts(chat));
}

/// `OWNER` pairs, then each of `joining` redeems an invite for its role.
async fn team(bot: &TelegramBot, fake: &FakeBotApi, joining: &[(i64, Role)]) {
    let access = bot.engine.runner.access().expect("teams are on");
    let code = access.pairing_code().await.unwrap();
    fake.push_text(OWNER, OWNER, &format!("/pair {code}"));
    wait_text(fake, OWNER, "You are the owner").await;
    for (user, role) in joining {
        let invite = access.invite(OWNER as u64, *role).await.unwrap();
        fake.push_text(*user, *user, &format!("/start {}", invite.code));
        wait_text(fake, *user, "You have access").await;
    }
}

/// The model answers "clean up" with a command that needs approval.
fn script_cleanup(t: &ToolsBot) {
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
}

fn pending_in(t: &ToolsBot, chat: i64) -> Lookup {
    let gate = t.bot.engine.runner.tools().unwrap().approvals();
    gate.lookup(&SessionKey::from_raw("none"), chat, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_user_cannot_approve_the_card_of_their_own_waiting_turn() {
    let t = ToolsBot::start("").await;
    team(&t.bot, &t.fake, &[(MEMBER, Role::User)]).await;
    script_cleanup(&t);
    t.send(MEMBER, "clean up");
    let (card, _, approve) = wait_button(&t.fake, MEMBER, "Approve").await;
    // Access only, in process: the turn and its request still wait.
    let access = t.bot.engine.runner.access().unwrap();
    assert!(access.revoke(MEMBER as u64).await.unwrap());

    t.fake.push_callback_query(MEMBER, MEMBER, card, &approve);
    assert!(
        wait_toast(&t.fake, "no longer have access").await,
        "{:?}",
        toasts(&t.fake)
    );
    assert!(
        matches!(pending_in(&t, MEMBER), Lookup::Found(_)),
        "the press decided nothing"
    );
    assert!(t.path("build").exists(), "the command did not run");
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_stops_the_turn_refuses_its_approval_drops_the_queue_and_pauses_jobs() {
    let t = ToolsBot::start_with("", "busy_mode = \"queue\"", "").await;
    team(
        &t.bot,
        &t.fake,
        &[(MEMBER, Role::User), (ADMIN, Role::Admin)],
    )
    .await;
    script_cleanup(&t);
    t.send(MEMBER, "/every day 08:00 remind: stand-up");
    wait_text(&t.fake, MEMBER, "Job 1").await;
    t.send(MEMBER, "clean up");
    wait_button(&t.fake, MEMBER, "Approve").await;
    t.send(MEMBER, "and then this");
    let key = ToolsBot::key(MEMBER);
    assert!(
        t.until(|| t.bot.engine.adapter.pending_len(&key) == 1)
            .await
    );

    // An admin revokes: the answer says what ended, the owner is told too.
    t.send(ADMIN, &format!("/revoke {MEMBER}"));
    wait_text(&t.fake, ADMIN, "no longer has access").await;
    let answer = t
        .texts(ADMIN)
        .into_iter()
        .find(|m| m.contains("no longer has access"))
        .unwrap();
    for said in [
        "1 running task stopped",
        "1 approval request refused",
        "1 waiting message dropped",
        "1 job paused (1;",
    ] {
        assert!(answer.contains(said), "{said:?} in {answer}");
    }
    wait_text(&t.fake, OWNER, "revoked access").await;
    wait_text(&t.fake, MEMBER, "1 waiting message of yours was not run").await;

    assert_eq!(t.bot.engine.adapter.pending_len(&key), 0);
    assert!(matches!(pending_in(&t, MEMBER), Lookup::Nothing));
    assert!(
        t.until(|| t.bot.engine.runner.running_agent(&key).is_none())
            .await
    );
    let jobs = t
        .bot
        .engine
        .runner
        .jobs()
        .unwrap()
        .list(MEMBER)
        .await
        .unwrap();
    assert!(jobs.iter().all(|j| j.paused), "{jobs:?}");
    assert!(t.path("build").exists(), "the refused command did not run");
    let asked_about = |needle: &str| {
        t.llm
            .requests()
            .iter()
            .any(|r| r.to_string().contains(needle))
    };
    assert!(!asked_about("and then this"), "a dropped message ran");
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_queued_before_access_went_is_refused_when_its_turn_starts() {
    let fake = FakeBotApi::start().await;
    let agent = ScriptedAgent::new();
    let bot = TestBot::new(&fake)
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml("[delivery]\nstreaming = \"edit\"\n\n[store]\nin_memory = true\n")
        .toml("[sessions]\nbusy_mode = \"queue\"\n")
        .agent(agent.clone())
        .start()
        .await
        .unwrap();
    fake.register_chat(GROUP, ChatType::Group);
    team(&bot, &fake, &[(MEMBER, Role::User)]).await;
    fake.push_group_text(GROUP, MEMBER, "slow:60000", true);
    let (preview, _, stop) = wait_button(&fake, GROUP, "Stop").await;
    fake.push_group_text(GROUP, MEMBER, "hello again", true);
    let key = bot.engine.adapter.session_key(&SessionSource {
        chat_type: telegate::vocab::ChatType::Group,
        user_id: Some(MEMBER as u64),
        ..SessionSource::dm(Platform::Telegram, GROUP)
    });
    let queued = fake
        .wait_for(|_| bot.engine.adapter.pending_len(&key) == 1, WAIT)
        .await;
    assert!(queued, "the second message waits behind the first");
    // Access only, in process: the queued message stays queued.
    let access = bot.engine.runner.access().unwrap();
    assert!(access.revoke(MEMBER as u64).await.unwrap());
    // Their own Stop button is theirs no more…
    fake.push_callback_query(GROUP, MEMBER, preview, &stop);
    assert!(wait_toast(&fake, "no longer have access").await);
    assert_eq!(agent.cancelled(), 0);
    // …the owner's press stops the turn, and the queued message is
    // refused as it would start.
    fake.push_callback_query(GROUP, OWNER, preview, &stop);
    wait_text(&fake, GROUP, "you no longer have access").await;
    assert_eq!(agent.started(), 1, "{:?}", agent.turn_texts());
    assert!(!agent.turn_texts().iter().any(|t| t.contains("hello again")));
    bot.shutdown().await;
}
