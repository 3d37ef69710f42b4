//! Draft streaming end to end against the fake Bot API (which answers
//! `sendMessageDraft` like Telegram: ok in private chats, 400 in groups, or
//! 404 "method not found" when switched to an old server): drafts stream
//! in private chats and the final answer arrives once as a new message
//! (also across a restart); groups and servers refusing drafts stream by
//! edits; Telegram's own stop control on a draft stops the turn like /stop,
//! and a stale one touches nothing. All of this is also what a
//! configuration without `streaming` gets (`auto` is the default).
//!
//! Assertions are on what the fake recorded, never on timing.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::{ChatType, Failure, FakeBotApi};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;
const GROUP: i64 = -100;

/// `streaming` as the configuration says it; [`DEFAULT`] leaves it out.
fn test_bot(fake: &FakeBotApi, streaming: &str, store: &str) -> TestBot {
    let streaming = if streaming == DEFAULT {
        String::new()
    } else {
        format!("[delivery]\nstreaming = \"{streaming}\"\n")
    };
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(streaming)
        .toml(store)
}

async fn start(
    fake: &FakeBotApi,
    streaming: &str,
    store: &str,
) -> (TelegramBot, Arc<ScriptedAgent>) {
    let agent = ScriptedAgent::new();
    let bot = test_bot(fake, streaming, store)
        .agent(agent.clone())
        .start()
        .await
        .expect("bot starts against the fake");
    (bot, agent)
}

const IN_MEMORY: &str = "[store]\nin_memory = true\n";
/// No `streaming` line in the configuration.
const DEFAULT: &str = "";

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

/// `editMessageText` calls to `chat`.
fn edits(fake: &FakeBotApi, chat: i64) -> usize {
    fake.calls_to("editMessageText")
        .iter()
        .filter(|c| c.chat_id() == Some(chat))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_stream_in_private_chats_and_the_final_arrives_once() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "auto", IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    let drafts = fake.drafts(USER);
    assert!(
        drafts.len() >= 2,
        "the answer streamed as drafts: {drafts:?}"
    );
    let id = drafts[0].0;
    assert!(
        id != 0 && drafts.iter().all(|d| d.0 == id),
        "one draft per turn"
    );
    assert!(
        drafts.iter().all(|d| d.2),
        "drafts offer Telegram's stop control"
    );
    assert!(drafts.last().is_some_and(|d| d.1.contains("w")));
    // No preview message: the final answer is the chat's only message,
    // sent once, never edited.
    assert_eq!(
        fake.sent_texts(USER).len(),
        1,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(edits(&fake, USER), 0);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_and_edit_mode_stream_by_edits() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let (bot, _agent) = start(&fake, "auto", IN_MEMORY).await;
    fake.push_group_text(GROUP, USER, "stream:8:60", true);
    assert!(wait_text(&fake, GROUP, "w7").await);
    assert!(fake.drafts(GROUP).is_empty());
    assert!(
        fake.calls_to("sendMessageDraft").is_empty(),
        "never tried in a group"
    );
    assert!(edits(&fake, GROUP) >= 1, "the preview was edited");
    bot.shutdown().await;

    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "edit", IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    assert!(fake.calls_to("sendMessageDraft").is_empty());
    assert!(edits(&fake, USER) >= 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_api_without_drafts_falls_back_to_edits() {
    let fake = FakeBotApi::start().await;
    fake.refuse_drafts(true);
    let (bot, _agent) = start(&fake, "auto", IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    assert_eq!(fake.calls_to("sendMessageDraft").len(), 1, "tried once");
    assert!(
        edits(&fake, USER) >= 1,
        "the turn went on as an edited preview"
    );
    assert_eq!(count_texts(&fake, USER, "w7"), 1, "one final message");
    // The next turn goes straight to edits.
    fake.push_text(USER, USER, "stream:4:60");
    assert!(
        fake.wait_for(|_| count_texts(&fake, USER, "w3") == 2, WAIT)
            .await
    );
    assert_eq!(fake.calls_to("sendMessageDraft").len(), 1);
    bot.shutdown().await;
}

/// Without a `streaming` setting: drafts in a private chat, edits in a
/// group, and edits again when the Bot API does not know drafts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_private_chats_stream_drafts_and_groups_stream_edits() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let (bot, _agent) = start(&fake, DEFAULT, IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    assert!(
        fake.drafts(USER).len() >= 2,
        "the private chat streamed drafts: {:?}",
        fake.drafts(USER)
    );
    assert_eq!(
        edits(&fake, USER),
        0,
        "no preview edited in the private chat"
    );
    assert_eq!(count_texts(&fake, USER, "w7"), 1, "one final message");

    fake.push_group_text(GROUP, USER, "stream:8:60", true);
    assert!(wait_text(&fake, GROUP, "w7").await);
    assert!(
        fake.calls_to("sendMessageDraft")
            .iter()
            .all(|c| c.chat_id() == Some(USER)),
        "no draft tried in the group"
    );
    assert!(edits(&fake, GROUP) >= 1, "the group's preview was edited");
    bot.shutdown().await;

    // A Bot API without sendMessageDraft: the default falls back to edits.
    let fake = FakeBotApi::start().await;
    fake.refuse_drafts(true);
    let (bot, _agent) = start(&fake, DEFAULT, IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    assert_eq!(fake.calls_to("sendMessageDraft").len(), 1, "tried once");
    assert!(fake.drafts(USER).is_empty());
    assert!(edits(&fake, USER) >= 1, "the turn streamed by edits");
    assert_eq!(count_texts(&fake, USER, "w7"), 1, "one final message");
    bot.shutdown().await;

    // A 400 for one draft (Telegram refusing it in this chat): that turn
    // streams by edits, the next one tries drafts again.
    let fake = FakeBotApi::start().await;
    fake.fail_next(
        "sendMessageDraft",
        1,
        Failure::BadRequest("Bad Request: TEXTDRAFT_PEER_INVALID".into()),
    );
    let (bot, _agent) = start(&fake, DEFAULT, IN_MEMORY).await;
    fake.push_text(USER, USER, "stream:8:60");
    assert!(wait_text(&fake, USER, "w7").await);
    assert!(fake.drafts(USER).is_empty(), "the only draft was refused");
    assert!(edits(&fake, USER) >= 1, "the turn streamed by edits");
    assert_eq!(count_texts(&fake, USER, "w7"), 1, "one final message");
    fake.push_text(USER, USER, "stream:4:60");
    assert!(
        fake.wait_for(|_| count_texts(&fake, USER, "w3") == 2, WAIT)
            .await
    );
    assert!(!fake.drafts(USER).is_empty(), "the next turn drafted again");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegrams_stop_on_a_draft_stops_the_turn_and_a_stale_one_does_nothing() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start(&fake, "draft", IN_MEMORY).await;
    fake.push_text(USER, USER, "hello");
    assert!(wait_text(&fake, USER, "answer:hello").await);

    fake.push_text(USER, USER, "slow:60000");
    assert!(fake.wait_for(|_| !fake.drafts(USER).is_empty(), WAIT).await);
    let id = fake.drafts(USER)[0].0;
    // A stop of a draft no turn streams any more: nothing happens.
    fake.push_draft_stop(USER, id - 1);
    fake.push_draft_stop(USER, id + 1000);
    assert!(
        fake.wait_for(|_| fake.pending_updates_len() == 0, WAIT)
            .await
    );
    assert_eq!(agent.cancelled(), 0, "a stale draft stop stopped nothing");
    assert_eq!(bot.engine.runner.running_count(), 1);

    fake.push_draft_stop(USER, id);
    assert!(wait_text(&fake, USER, "⏹ Stopped.").await);
    assert!(fake.wait_for(|_| agent.cancelled() == 1, WAIT).await);
    assert!(!fake
        .sent_texts(USER)
        .iter()
        .any(|t| t.contains("answer:slow")));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_draft_sends_the_final_answer_once() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("[store]\ndata_dir = \"{}\"\n", dir.path().display());
    let (bot, _agent) = start(&fake, "auto", &store).await;
    fake.push_text(USER, USER, "slow:1500");
    assert!(fake.wait_for(|_| !fake.drafts(USER).is_empty(), WAIT).await);
    // A shutdown lets the turn finish or leaves it for the next start
    // (whichever comes first); either way the answer arrives once.
    bot.shutdown().await;

    // The restart runs the message again if it was not answered; a second
    // restart sends nothing more.
    let (bot, _agent) = start(&fake, "auto", &store).await;
    assert!(wait_text(&fake, USER, "answer:slow:1500").await);
    bot.shutdown().await;
    let (bot, agent) = start(&fake, "auto", &store).await;
    fake.push_text(USER, USER, "ping");
    assert!(wait_text(&fake, USER, "answer:ping").await);
    assert_eq!(agent.turn_texts(), vec!["ping".to_string()]);
    assert_eq!(count_texts(&fake, USER, "answer:slow:1500"), 1);
    assert_eq!(edits(&fake, USER), 0, "no preview message was ever edited");
    bot.shutdown().await;
}
