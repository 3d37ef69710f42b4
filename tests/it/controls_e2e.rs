//! Telegram-native controls end to end against the fake Bot API (and the
//! fake LLM where the model's requests matter): the Stop button on a
//! streaming preview, button authority in groups, presses across a
//! restart, /retry, /undo and /model as seen by the LLM.
//!
//! Assertions are on what the fakes recorded, never on timing.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::agents::ScriptedAgent;
use support::fake_bot::{ChatType, FakeBotApi};
use support::fake_openai::{last_user_contains, messages, FakeOpenAi, Script};
use support::test_bot::{TestBot, FAST_DELIVERY};
use telegate::store::Store;
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::InboxState;

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;
const OTHER: i64 = 43;
const APPROVER: i64 = 44;
const GROUP: i64 = -100;

/// The bot of these tests: three users, APPROVER approving, fast edited
/// previews; `extra` more settings.
fn test_bot(fake: &FakeBotApi, extra: &str) -> TestBot {
    TestBot::new(fake)
        .users(&[USER, OTHER, APPROVER])
        .approvers(&[APPROVER])
        .toml(FAST_DELIVERY)
        .toml("[delivery]\ngroup_messages_per_minute = 100000\nstreaming = \"edit\"\n")
        .toml(extra)
}

async fn start_scripted(fake: &FakeBotApi) -> (TelegramBot, Arc<ScriptedAgent>) {
    let agent = ScriptedAgent::new();
    let bot = test_bot(fake, "[store]\nin_memory = true\n")
        .agent(agent.clone())
        .start()
        .await
        .expect("bot starts against the fake");
    (bot, agent)
}

/// A button as the chat shows it: (message id, label, callback data).
type Shown = (i64, String, String);

/// The buttons currently under the bot's messages in `chat`.
fn buttons(fake: &FakeBotApi, chat: i64) -> Vec<Shown> {
    shown_buttons(fake, chat, false)
}

/// The buttons now under the bot's messages in `chat`, or (`ever`) under
/// any version of them.
fn shown_buttons(fake: &FakeBotApi, chat: i64, ever: bool) -> Vec<Shown> {
    let mut found = Vec::new();
    for message in fake.message_history(chat) {
        let versions = if ever {
            message.versions.clone()
        } else {
            vec![message.current().clone()]
        };
        for version in versions {
            let Some(markup) = &version.reply_markup else {
                continue;
            };
            let markup = match markup {
                Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
                other => other.clone(),
            };
            for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
                for key in row.as_array().into_iter().flatten() {
                    found.push((
                        message.message_id,
                        key["text"].as_str().unwrap_or_default().to_string(),
                        key["callback_data"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ));
                }
            }
        }
    }
    found
}

async fn wait_button(fake: &FakeBotApi, chat: i64, label: &str) -> Shown {
    let found = fake
        .wait_for(
            |_| buttons(fake, chat).iter().any(|b| b.1.contains(label)),
            WAIT,
        )
        .await;
    assert!(
        found,
        "a {label} button in {chat}: {:?}",
        fake.message_history(chat)
    );
    buttons(fake, chat)
        .into_iter()
        .find(|b| b.1.contains(label))
        .unwrap()
}

/// The texts of every `answerCallbackQuery`, in order.
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

fn count_texts(fake: &FakeBotApi, chat: i64, needle: &str) -> usize {
    fake.sent_texts(chat)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str) -> bool {
    fake.wait_for(|_| count_texts(fake, chat, needle) > 0, WAIT)
        .await
}

async fn until(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cond()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_button_stops_its_turn_and_a_stale_one_touches_nothing() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start_scripted(&fake).await;

    // Turn 1 shows a Stop button, then finishes: the final text takes the
    // button away.
    fake.push_text(USER, USER, "slow:300");
    assert!(wait_text(&fake, USER, "answer:slow:300").await);
    let (first_preview, _, old_stop) = shown_buttons(&fake, USER, true)
        .into_iter()
        .find(|b| b.1.contains("Stop"))
        .expect("the preview had a Stop button");
    assert!(
        until(|| buttons(&fake, USER).is_empty()).await,
        "the answer carries no Stop button: {:?}",
        buttons(&fake, USER)
    );

    // Turn 2 runs. Turn 1's button is stale: "already finished", and
    // turn 2 is not touched.
    fake.push_text(USER, USER, "slow:60000");
    let (preview, _, stop) = wait_button(&fake, USER, "Stop").await;
    assert_ne!(stop, old_stop, "each turn has its own button");
    fake.push_callback_query(USER, USER, first_preview, &old_stop);
    assert!(
        wait_toast(&fake, "Already finished").await,
        "{:?}",
        toasts(&fake)
    );
    assert_eq!(agent.cancelled(), 0, "a stale button stopped nothing");
    assert!(bot.engine.runner.running_count() == 1);

    // Turn 2's own button stops it, like /stop.
    fake.push_callback_query(USER, USER, preview, &stop);
    assert!(wait_toast(&fake, "Stopping").await);
    assert!(wait_text(&fake, USER, "⏹ Stopped.").await);
    assert!(until(|| agent.cancelled() == 1).await);
    assert!(
        until(|| buttons(&fake, USER).is_empty()).await,
        "the stopped preview lost its button: {:?}",
        buttons(&fake, USER)
    );
    // Pressing it again does nothing more.
    fake.push_callback_query(USER, USER, preview, &stop);
    assert!(
        fake.wait_for(|_| toasts(&fake).len() == 3, WAIT).await,
        "every press is answered: {:?}",
        toasts(&fake)
    );
    assert_eq!(toasts(&fake)[2], "Already finished.");
    assert_eq!(count_texts(&fake, USER, "⏹ Stopped."), 1);
    assert_eq!(agent.started(), 2);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_group_only_the_sessions_user_or_an_approver_may_stop() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let (bot, agent) = start_scripted(&fake).await;
    fake.push_group_text(GROUP, USER, "slow:60000", true);
    let (preview, _, stop) = wait_button(&fake, GROUP, "Stop").await;

    fake.push_callback_query(GROUP, OTHER, preview, &stop);
    assert!(wait_toast(&fake, "Only").await, "{:?}", toasts(&fake));
    assert_eq!(
        agent.cancelled(),
        0,
        "another member's press changed nothing"
    );
    assert_eq!(buttons(&fake, GROUP).len(), 1, "the button is still there");

    fake.push_callback_query(GROUP, APPROVER, preview, &stop);
    assert!(wait_toast(&fake, "Stopping").await, "{:?}", toasts(&fake));
    assert!(until(|| agent.cancelled() == 1).await);
    assert!(wait_text(&fake, GROUP, "⏹ Stopped.").await);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_or_unknown_button_is_answered_and_does_nothing() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start_scripted(&fake).await;
    fake.push_callback_query(USER, USER, 1, "something else");
    fake.push_callback_query(USER, USER, 1, "b:nosuchbutton");
    assert!(
        fake.wait_for(|_| toasts(&fake).len() == 2, WAIT).await,
        "{:?}",
        toasts(&fake)
    );
    assert_eq!(agent.started(), 0);
    bot.shutdown().await;
}

/// A bot on the openai backend against `llm`, storing in `dir`.
async fn start_openai(fake: &FakeBotApi, llm: &FakeOpenAi, dir: &Path) -> TelegramBot {
    let extra = format!(
        "[store]\ndata_dir = \"{}\"\n\n[agent]\nbackend = \"openai\"\n\n\
         [agent.openai]\nbase_url = \"{}\"\nmodel = \"small\"\nmodels = [\"small\", \"big\"]\n\
         api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n",
        dir.display(),
        llm.base_url()
    );
    test_bot(fake, &extra)
        .start()
        .await
        .expect("bot starts against the fakes")
}

/// The store a bot storing in `dir` uses, opened while no bot runs.
async fn store_in(fake: &FakeBotApi, dir: &Path) -> Store {
    let path = test_bot(
        fake,
        &format!("[store]\ndata_dir = \"{}\"\n", dir.display()),
    )
    .config()
    .store
    .database_path();
    Store::open_async(path)
        .await
        .expect("the store opens")
        .for_bot(telegate::vocab::BotId(fake.config().bot_id))
}

/// Wait until the private chat of USER has no task running or queued (an
/// answer may be visible as a preview before its turn has ended).
async fn idle(bot: &TelegramBot) {
    let key = telegate::vocab::SessionKey::from_raw(format!("agent:main:telegram:dm:{USER}"));
    let adapter = &bot.engine.adapter;
    assert!(until(|| !adapter.is_active(&key) && adapter.pending_len(&key) == 0).await);
}

fn user_texts(request: &Value) -> Vec<String> {
    messages(request)
        .into_iter()
        .filter(|(role, _)| role == "user")
        .map(|(_, text)| text)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_undo_and_model_change_what_the_llm_receives() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bot = start_openai(&fake, &llm, dir.path()).await;
    // The command menu (setMyCommands at start, in the background) offers
    // the new commands.
    assert!(
        fake.wait_for_ok_calls("setMyCommands", 1, Duration::from_secs(10))
            .await,
        "the command menu was registered"
    );
    let menu: Vec<String> = fake.my_commands().into_iter().map(|(c, _)| c).collect();
    for command in ["retry", "undo", "model", "stop", "approve"] {
        assert!(menu.iter().any(|c| c == command), "{command} in {menu:?}");
    }

    llm.push_when(last_user_contains("one"), Script::text("first answer"));
    fake.push_text(USER, USER, "one");
    assert!(wait_text(&fake, USER, "first answer").await);
    idle(&bot).await;
    llm.push_when(last_user_contains("two"), Script::text("second answer"));
    fake.push_text(USER, USER, "two");
    assert!(wait_text(&fake, USER, "second answer").await);
    idle(&bot).await;

    // /retry runs "two" again in place of its exchange.
    llm.push_when(
        last_user_contains("two"),
        Script::text("second answer, again"),
    );
    fake.push_text(USER, USER, "/retry");
    assert!(wait_text(&fake, USER, "second answer, again").await);
    idle(&bot).await;
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(user_texts(&requests[2]), vec!["one", "two"]);
    let assistant: Vec<String> = messages(&requests[2])
        .into_iter()
        .filter(|(role, _)| role == "assistant")
        .map(|(_, text)| text)
        .collect();
    assert_eq!(assistant, vec!["first answer"], "the old answer is gone");

    // /undo takes that exchange out; the next request does not have it.
    fake.push_text(USER, USER, "/undo");
    assert!(wait_text(&fake, USER, "Removed the last exchange").await);
    idle(&bot).await;
    assert!(wait_text(&fake, USER, "\"two\"").await);

    // /model: unknown names are refused, known ones used from then on.
    fake.push_text(USER, USER, "/model huge");
    assert!(wait_text(&fake, USER, "Unknown model \"huge\"").await);
    fake.push_text(USER, USER, "/model");
    let (list, _, big) = wait_button(&fake, USER, "big").await;
    fake.push_callback_query(USER, USER, list, &big);
    assert!(wait_text(&fake, USER, "🧠 Model: big").await);
    fake.push_text(USER, USER, "/status");
    assert!(wait_text(&fake, USER, "Model: big").await);

    llm.push_when(last_user_contains("three"), Script::text("third answer"));
    fake.push_text(USER, USER, "three");
    assert!(wait_text(&fake, USER, "third answer").await);
    let requests = llm.requests();
    let last = requests.last().unwrap();
    assert_eq!(last["model"], json!("big"));
    assert_eq!(
        user_texts(last),
        vec!["one", "three"],
        "the undone exchange is not sent"
    );
    assert_eq!(requests[0]["model"], json!("small"));

    // The transcript keeps the undone and retried exchanges, marked.
    let store = bot.store.clone();
    let session = bot
        .engine
        .runner
        .current_session(&telegate::vocab::SessionKey::from_raw(format!(
            "agent:main:telegram:dm:{USER}"
        )))
        .unwrap();
    assert_eq!(
        store
            .transcripts()
            .undone_len(session.as_str())
            .await
            .unwrap(),
        4
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_chosen_before_a_restart_is_still_the_sessions_after_it() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bot = start_openai(&fake, &llm, dir.path()).await;
    fake.push_text(USER, USER, "/model");
    let (list, _, big) = wait_button(&fake, USER, "big").await;
    fake.push_callback_query(USER, USER, list, &big);
    assert!(wait_text(&fake, USER, "🧠 Model: big").await);
    bot.shutdown().await;

    // A new process knows the choice only from the store.
    let bot = start_openai(&fake, &llm, dir.path()).await;
    llm.push_when(last_user_contains("after"), Script::text("answered after"));
    fake.push_text(USER, USER, "after the restart");
    assert!(wait_text(&fake, USER, "answered after").await);
    let requests = llm.requests();
    assert_eq!(requests.last().unwrap()["model"], json!("big"));
    // The /model list ticks the session's model.
    fake.push_text(USER, USER, "/model");
    let ticked = |label: &str| {
        let shown = buttons(&fake, USER);
        let newest = shown.iter().map(|b| b.0).max();
        shown
            .iter()
            .any(|b| Some(b.0) == newest && b.0 != list && b.1 == label)
    };
    assert!(
        fake.wait_for(|_| ticked("✓ big"), WAIT).await,
        "{:?}",
        buttons(&fake, USER)
    );
    assert!(ticked("small") && !ticked("✓ small"));
    // /new starts a session on the configured model again.
    fake.push_text(USER, USER, "/new");
    assert!(wait_text(&fake, USER, "Started a fresh session").await);
    llm.push_when(last_user_contains("fresh"), Script::text("answered fresh"));
    fake.push_text(USER, USER, "fresh start");
    assert!(wait_text(&fake, USER, "answered fresh").await);
    assert_eq!(llm.requests().last().unwrap()["model"], json!("small"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_recorded_before_a_restart_is_carried_out_once() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bot = start_openai(&fake, &llm, dir.path()).await;
    fake.push_text(USER, USER, "/model");
    let (list, _, big) = wait_button(&fake, USER, "big").await;
    bot.shutdown().await;

    // The press arrives and is recorded, then the process dies before
    // carrying it out (the row is written as the intake writes it).
    let update_id = fake.push_callback_query(USER, USER, list, &big);
    let payload = json!({
        "update_id": update_id,
        "callback_query": {
            "id": "cbq-before-crash",
            "from": {"id": USER, "is_bot": false, "first_name": "U"},
            "message": {"message_id": list, "date": 0,
                        "chat": {"id": USER, "type": "private", "first_name": "U"},
                        "text": "Model: small"},
            "chat_instance": "i",
            "data": big,
        }
    });
    {
        let store = store_in(&fake, dir.path()).await;
        assert!(store
            .inbox()
            .record_update(update_id, USER, None, payload, InboxState::Received, None)
            .await
            .unwrap());
        store.close().await.unwrap();
    }

    // The restart carries it out; Telegram delivering it again changes
    // nothing.
    let bot = start_openai(&fake, &llm, dir.path()).await;
    assert!(wait_text(&fake, USER, "🧠 Model: big").await);
    assert!(
        fake.wait_for(|_| fake.pending_updates_len() == 0, WAIT)
            .await,
        "the redelivered press was confirmed"
    );
    fake.push_text(USER, USER, "/status");
    assert!(wait_text(&fake, USER, "Model: big").await);
    assert_eq!(count_texts(&fake, USER, "🧠 Model: big"), 1);
    // Its row is closed as carried out, not as "not resumable".
    let entry = bot
        .store
        .inbox()
        .inbox_entry(update_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (entry.state, entry.reason.as_deref()),
        (InboxState::Answered, None)
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_press_recorded_before_a_restart_is_closed_not_kept() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A press recorded by an earlier version that this one cannot read
    // (no `from`): nothing to carry out.
    {
        let store = store_in(&fake, dir.path()).await;
        let payload = json!({"update_id": 5, "callback_query": {"id": "cbq-odd", "data": "b:1"}});
        assert!(store
            .inbox()
            .record_update(5, USER, None, payload, InboxState::Received, None)
            .await
            .unwrap());
        store.close().await.unwrap();
    }
    let bot = start_openai(&fake, &llm, dir.path()).await;
    let entry = bot.store.inbox().inbox_entry(5).await.unwrap().unwrap();
    assert_eq!(
        (entry.state, entry.reason.as_deref()),
        (InboxState::Dropped, Some("not resumable"))
    );
    assert!(bot.store.inbox().open_inbox().await.unwrap().is_empty());
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_buttons_decide_that_request_once_and_say_who_decided() {
    use support::fake_openai::tool_result_after;
    use support::tools_bot::{ToolsBot, CHAT_A, CHAT_B};

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
    t.send(CHAT_A, "clean up");
    let (prompt, _, approve) = wait_button(&t.fake, CHAT_A, "Approve").await;
    let (_, _, deny) = wait_button(&t.fake, CHAT_A, "Deny").await;

    // Someone else (not an approver) cannot answer it.
    t.fake.push_callback_query(CHAT_A, CHAT_B, prompt, &approve);
    assert!(wait_toast(&t.fake, "Only").await, "{:?}", toasts(&t.fake));
    assert!(t.path("build").exists(), "nothing ran");

    // The session's user approves with the button: it runs, and the
    // prompt says who decided, without buttons.
    t.fake.push_callback_query(CHAT_A, CHAT_A, prompt, &approve);
    assert!(
        wait_toast(&t.fake, "Approved.").await,
        "{:?}",
        toasts(&t.fake)
    );
    assert!(t.wait_text(CHAT_A, "cleaned").await);
    assert!(!t.path("build").exists(), "the approved command ran");
    let edited = t
        .fake
        .message_history(CHAT_A)
        .into_iter()
        .find(|m| m.message_id == prompt)
        .unwrap();
    let text = &edited.current().text;
    assert!(
        text.contains("rm -rf build") && text.contains("✅ Approved by User42"),
        "{text}"
    );
    assert!(edited.current().reply_markup.is_none());

    // Its Deny (same row) is used up.
    t.fake.push_callback_query(CHAT_A, CHAT_A, prompt, &deny);
    assert!(
        wait_toast(&t.fake, "Already answered").await,
        "{:?}",
        toasts(&t.fake)
    );
    assert_eq!(t.fake.calls_to("answerCallbackQuery").len(), 3);
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reactions_follow_a_turns_life() {
    let fake = FakeBotApi::start().await;
    let agent = ScriptedAgent::new();
    let bot = test_bot(
        &fake,
        "[store]\nin_memory = true\n\n[sessions]\nbusy_mode = \"queue\"\n",
    )
    .toml("[delivery]\nreactions = true\n")
    .agent(agent.clone())
    .start()
    .await
    .expect("bot starts against the fake");
    let with = |emoji: &str| -> Vec<i64> {
        fake.reactions()
            .into_iter()
            .filter(|(chat, _, e)| *chat == USER && e.iter().any(|x| x == emoji))
            .map(|(_, message, _)| message)
            .collect()
    };

    // A running turn shows 👀; a message waiting behind it 👌.
    fake.push_text(USER, USER, "block");
    assert!(fake.wait_for(|_| with("👀").len() == 1, WAIT).await);
    let running = with("👀")[0];
    fake.push_text(USER, USER, "next");
    assert!(fake.wait_for(|_| with("👌").len() == 1, WAIT).await);
    let waiting = with("👌")[0];
    assert_ne!(running, waiting);

    // Stopped: its reaction goes. The waiting one runs and is answered: 👍.
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(
            |_| fake.reaction_on(USER, waiting) == Some(vec!["👍".to_string()]),
            WAIT
        )
        .await,
        "{:?}",
        fake.reactions()
    );
    assert!(
        fake.wait_for(|_| fake.reaction_on(USER, running) == Some(vec![]), WAIT)
            .await
    );

    // A failed turn: 👎. Reactions the fake refuses never touch the turn.
    fake.push_text(USER, USER, "fail");
    assert!(
        fake.wait_for(|_| with("👎").len() == 1, WAIT).await,
        "{:?}",
        fake.reactions()
    );
    assert!(wait_text(&fake, USER, "The backend broke").await);
    fake.fail_next(
        "setMessageReaction",
        10,
        support::fake_bot::Failure::BadRequest("Bad Request: REACTION_INVALID".into()),
    );
    fake.push_text(USER, USER, "still answered");
    assert!(wait_text(&fake, USER, "answer:still answered").await);
    bot.shutdown().await;
}
