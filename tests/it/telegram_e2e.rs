//! End to end against the fake Bot API: the real teloxide dispatcher, the
//! real adapter and runner, the real delivery engine, a scripted agent.
//! Assertions are on the fake server's recorded calls (their order and
//! content), never on wall-clock thresholds.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::agents::ScriptedAgent;
use support::fake_bot::{ChatType, Failure, FakeBotApi, RecordedCall};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::config::Config;
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;

/// What every bot of these tests has: fast pacing, edited previews.
fn common(fake: &FakeBotApi) -> TestBot {
    TestBot::new(fake)
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml("[delivery]\nstreaming = \"edit\"\n")
}

const NO_TYPING_DELAY: &str = "[delivery]\ntyping_delay_ms = 0\n";
const IN_MEMORY: &str = "[store]\nin_memory = true\n";

/// USER's bot, in memory, no typing delay; `telegram_extra` more
/// `[telegram]` keys, `rest` more settings.
fn test_bot(fake: &FakeBotApi, telegram_extra: &str, rest: &str) -> TestBot {
    common(fake)
        .users(&[USER])
        .toml(format!("[telegram]\n{telegram_extra}"))
        .toml(NO_TYPING_DELAY)
        .toml(IN_MEMORY)
        .toml(rest)
}

async fn start(
    fake: &FakeBotApi,
    telegram_extra: &str,
    rest: &str,
) -> (TelegramBot, Arc<ScriptedAgent>) {
    let agent = ScriptedAgent::new();
    let bot = test_bot(fake, telegram_extra, rest)
        .agent(agent.clone())
        .start()
        .await
        .expect("bot starts against the fake");
    (bot, agent)
}

fn sends_to(calls: &[RecordedCall], chat: i64) -> Vec<&RecordedCall> {
    calls
        .iter()
        .filter(|c| c.method == "sendMessage" && c.chat_id() == Some(chat))
        .collect()
}

fn has_text(calls: &[RecordedCall], method: &str, chat: i64, needle: &str) -> bool {
    calls.iter().any(|c| {
        c.method == method
            && c.chat_id() == Some(chat)
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.contains(needle))
    })
}

async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str) -> bool {
    fake.wait_for(|calls| has_text(calls, "sendMessage", chat, needle), WAIT)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_message_gets_a_reply() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.push_text(USER, USER, "hello");
    assert!(wait_text(&fake, USER, "answer:hello").await);
    // The command menu was registered at start.
    assert!(fake.my_commands().iter().any(|(name, _)| name == "stop"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_turn_shows_typing_and_streams_edits_then_the_final_text_once() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.push_text(USER, USER, "stream:8:80");
    let final_text = "w0 w1 w2 w3 w4 w5 w6 w7";
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER) == vec![final_text.to_string()],
            WAIT
        )
        .await,
        "got {:?}",
        fake.sent_texts(USER)
    );
    let calls = fake.calls();
    assert!(
        calls.iter().any(|c| c.method == "sendChatAction"),
        "typing was shown"
    );
    let edits = calls
        .iter()
        .filter(|c| c.method == "editMessageText")
        .count();
    assert!(
        edits >= 2,
        "the preview was edited as the text grew ({edits} edits)"
    );
    // One message: the preview became the final text; no duplicate final.
    assert_eq!(sends_to(&calls, USER).len(), 1);
    let history = fake.message_history(USER);
    assert_eq!(history.len(), 1);
    assert!(history[0].versions.len() >= 3);
    bot.shutdown().await;
}

/// With the default `typing_delay_ms`, an answer that comes at once costs
/// no chat action; a turn that stays quiet past the delay shows "typing…".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_shows_only_for_a_turn_that_outlasts_the_typing_delay() {
    let fake = FakeBotApi::start().await;
    let settings = common(&fake).users(&[USER]).toml(IN_MEMORY);
    let bot = settings
        .agent(ScriptedAgent::new())
        .start()
        .await
        .expect("bot starts against the fake");
    // An answer within the delay (its preview, then the final text).
    fake.push_text(USER, USER, "slow:150");
    assert!(
        fake.wait_for(|_| fake.sent_texts(USER) == ["answer:slow:150"], WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let typing = |fake: &FakeBotApi| fake.calls_to("sendChatAction").len();
    assert_eq!(typing(&fake), 0, "an answer within the delay showed typing");
    // A turn that shows nothing for longer than the delay: typing.
    fake.push_text(USER, USER, "block");
    assert!(
        fake.wait_for(|_| typing(&fake) > 0, WAIT).await,
        "a quiet turn never showed typing"
    );
    fake.push_text(USER, USER, "/stop");
    assert!(wait_text(&fake, USER, "⏹ Stopped.").await);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_is_answered_while_the_turn_runs_and_the_turn_never_writes_again() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start(&fake, "", "").await;
    fake.push_text(USER, USER, "stream:200:50");
    // The turn is visibly running: its preview exists.
    assert!(
        fake.wait_for(|c| has_text(c, "sendMessage", USER, "w0"), WAIT)
            .await
    );
    fake.push_text(USER, USER, "/stop");
    assert!(wait_text(&fake, USER, "⏹ Stopped.").await);
    assert!(agent_cancelled(&agent).await);

    fake.push_text(USER, USER, "after");
    assert!(wait_text(&fake, USER, "answer:after").await);
    let calls = fake.calls();
    let stop_seq = calls
        .iter()
        .find(|c| c.text() == Some("⏹ Stopped."))
        .map(|c| c.seq)
        .unwrap();
    // After the reply, the preview's one marker edit (issue 9), nothing else.
    let turn_writes_after_stop: Vec<_> = calls
        .iter()
        .filter(|c| {
            c.seq > stop_seq
                && matches!(c.method.as_str(), "sendMessage" | "editMessageText")
                && c.text().is_some_and(|t| t.starts_with("w0"))
        })
        .collect();
    assert!(
        turn_writes_after_stop.len() <= 1
            && turn_writes_after_stop
                .iter()
                .all(|c| c.method == "editMessageText"
                    && c.text().is_some_and(|t| t.ends_with("\n\n⏹ stopped"))),
        "the stopped turn wrote after /stop: {turn_writes_after_stop:?}"
    );
    assert!(!fake.sent_texts(USER).iter().any(|t| t.contains("w199")));
    bot.shutdown().await;
}

async fn agent_cancelled(agent: &ScriptedAgent) -> bool {
    for _ in 0..500 {
        if agent.cancelled() >= 1 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_during_a_turn_replies_first_and_the_follow_up_runs_in_the_new_session() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start(&fake, "", "").await;
    fake.push_text(USER, USER, "first");
    assert!(wait_text(&fake, USER, "answer:first").await);
    fake.push_text(USER, USER, "block");
    assert!(fake.wait_for(|_| agent.started() == 2, WAIT).await);
    fake.push_text(USER, USER, "/new");
    fake.push_text(USER, USER, "fresh");
    assert!(wait_text(&fake, USER, "answer:fresh").await);
    let calls = fake.calls();
    let new_seq = calls
        .iter()
        .find(|c| c.text().is_some_and(|t| t.starts_with("✨")))
        .unwrap()
        .seq;
    let fresh_seq = calls
        .iter()
        .find(|c| c.text() == Some("answer:fresh"))
        .unwrap()
        .seq;
    assert!(new_seq < fresh_seq, "the /new reply came first");
    assert!(!has_text(&calls, "sendMessage", USER, "answer:block"));
    assert_ne!(agent.session_of("fresh"), agent.session_of("first"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_are_answered_in_order_each_once() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start(&fake, "", "[sessions]\nbusy_mode = \"queue\"\n").await;
    fake.push_text(USER, USER, "slow:300");
    assert!(fake.wait_for(|_| agent.started() == 1, WAIT).await);
    for text in ["one", "two", "three"] {
        fake.push_text(USER, USER, text);
    }
    assert!(wait_text(&fake, USER, "answer:three").await);
    let answers: Vec<String> = fake
        .sent_texts(USER)
        .into_iter()
        .filter(|t| t.starts_with("answer:"))
        .collect();
    assert_eq!(
        answers,
        vec![
            "answer:slow:300",
            "answer:one",
            "answer:two",
            "answer:three"
        ]
    );
    bot.shutdown().await;
}

fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_reply_with_code_and_emoji_arrives_in_valid_chunks() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.push_text(USER, USER, "long:9000");
    // The reply ends with the last part's code block.
    let last_part = support::agents::long_markdown(9000)
        .matches("## Part")
        .count();
    let last = format!("fn part_{last_part}()");
    assert!(wait_text(&fake, USER, &last).await);
    let calls = fake.calls();
    let sends = sends_to(&calls, USER);
    assert!(sends.len() >= 2, "9,000 characters need several messages");
    for call in &sends {
        assert!(
            call.outcome.is_ok(),
            "Telegram refused a chunk: {:?}",
            call.outcome
        );
        let text = call.text().unwrap();
        let len = utf16_len(text);
        assert!(len <= 4096, "chunk of {len} UTF-16 units");
        for entity in call.body["entities"].as_array().into_iter().flatten() {
            let offset = entity["offset"].as_u64().unwrap() as usize;
            let length = entity["length"].as_u64().unwrap() as usize;
            assert!(
                length > 0 && offset + length <= len,
                "entity out of bounds: {entity}"
            );
        }
    }
    let joined: String = sends.iter().map(|c| c.text().unwrap()).collect();
    assert!(joined.contains("fn part_1()"));
    assert!(joined.contains("👩‍👩‍👧‍👦"));
    bot.shutdown().await;
}

/// The sendMessage calls to `chat` whose text belongs to the reply to
/// `prompt` (everything after the prompt was pushed).
async fn reply_chunks(fake: &FakeBotApi, prompt: &str, expect_last: &str) -> Vec<RecordedCall> {
    fake.clear_calls();
    fake.push_text(USER, USER, prompt);
    assert!(
        fake.wait_for(
            |calls| sends_to(calls, USER)
                .iter()
                .any(|c| c.outcome.is_ok() && c.text().is_some_and(|t| t.ends_with(expect_last))),
            WAIT
        )
        .await,
        "no reply to {prompt}"
    );
    let calls = fake.calls();
    // A prompt sent while the previous turn is still releasing its slot may
    // get a "Queued…"/"Interrupting…" acknowledgement: not part of the reply.
    sends_to(&calls, USER)
        .into_iter()
        .filter(|c| {
            !c.text()
                .is_some_and(|t| t.starts_with('⏳') || t.starts_with('⚡'))
        })
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_right_at_the_limit_arrives_whole_and_one_unit_more_splits() {
    // Telegram counts 4,096 UTF-16 units per message (the fake refuses
    // more, like Telegram): replies that land on the limit must go out as
    // one message, one unit more as two, never cutting a surrogate pair.
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    for units in [4093, 4095, 4096] {
        let text = support::agents::near_limit_text(units);
        let sends = reply_chunks(&fake, &format!("near:{units}"), &text).await;
        assert_eq!(sends.len(), 1, "{units} units need one message");
        assert!(sends[0].outcome.is_ok(), "{:?}", sends[0].outcome);
        assert_eq!(sends[0].text(), Some(text.as_str()));
        assert_eq!(utf16_len(&text), units);
    }
    let text = support::agents::near_limit_text(4097);
    let sends = reply_chunks(&fake, "near:4097", "z").await;
    assert_eq!(sends.len(), 2, "4,097 units need two messages");
    let mut joined = String::new();
    for call in &sends {
        assert!(
            call.outcome.is_ok(),
            "Telegram refused a chunk: {:?}",
            call.outcome
        );
        let chunk = call.text().unwrap();
        assert!(utf16_len(chunk) <= 4096);
        assert!(!chunk.trim().is_empty());
        joined.push_str(chunk);
    }
    assert_eq!(joined.replace('\n', ""), text);

    // Markdown markers do not count: "**" + 4,096 units + "**" is one
    // message whose bold entity covers exactly the 4,096 units.
    let inner = support::agents::near_limit_text(4096);
    let sends = reply_chunks(&fake, "nearbold:4096", &inner).await;
    assert_eq!(sends.len(), 1);
    assert!(sends[0].outcome.is_ok(), "{:?}", sends[0].outcome);
    assert_eq!(sends[0].text(), Some(inner.as_str()));
    let entities = sends[0].body["entities"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(entities.len(), 1, "{entities:?}");
    assert_eq!(entities[0]["type"], "bold");
    assert_eq!(entities[0]["offset"], 0);
    assert_eq!(entities[0]["length"], 4096);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_429_storm_every_final_reply_arrives_once_and_retry_after_is_honoured() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.fail_next("sendMessage", 3, Failure::RetryAfter(1));
    fake.fail_next("editMessageText", 2, Failure::RetryAfter(1));
    let chats = [USER, 43, 44];
    let text = |chat: i64| format!("stream:4:60 chat {chat}");
    for chat in chats {
        fake.push_text(chat, USER, &text(chat));
    }
    let all_done = |_: &[RecordedCall]| {
        chats
            .iter()
            .all(|&c| fake.sent_texts(c).iter().any(|t| t == "w0 w1 w2 w3"))
    };
    assert!(
        fake.wait_for(all_done, Duration::from_secs(20)).await,
        "{:?}",
        chats.map(|c| fake.sent_texts(c))
    );
    for chat in chats {
        let finals = fake
            .sent_texts(chat)
            .iter()
            .filter(|t| *t == "w0 w1 w2 w3")
            .count();
        assert_eq!(finals, 1, "chat {chat}: {:?}", fake.sent_texts(chat));
    }
    assert!(
        fake.violations_of_retry_after().is_empty(),
        "requests sent before retry_after passed: {:?}",
        fake.violations_of_retry_after()
    );
    assert!(bot.delivery.stats().retry_after_hits >= 3);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_groups_only_messages_addressed_to_the_bot_are_handled() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(-100, ChatType::Group);
    let (bot, agent) = start(&fake, "", "").await;
    fake.push_group_text(-100, USER, "just chatting", false);
    fake.push_group_text(-100, USER, "/stop@other_bot", false);
    fake.push_group_text(-100, USER, "@telegate_test_bot hi there", false);
    assert!(wait_text(&fake, -100, "answer:hi there").await);
    fake.push_group_text(-100, USER, "a reply to you", true);
    assert!(wait_text(&fake, -100, "answer:a reply to you").await);
    // The answer is all out once its message is recorded as answered: a
    // /stop before that would (rightly) say the rest is not sent.
    let mut settled = false;
    for _ in 0..500 {
        if bot.store.inbox().open_inbox().await.unwrap().is_empty() {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(settled, "both answered messages reach a final state");
    fake.push_group_text(-100, USER, "/stop@telegate_test_bot", false);
    assert!(wait_text(&fake, -100, "Nothing to stop.").await);
    let texts = fake.sent_texts(-100);
    assert!(!texts.iter().any(|t| t.contains("just chatting")));
    assert_eq!(
        agent.started(),
        2,
        "only the two addressed messages ran: {:?}",
        agent.turn_texts()
    );
    let stop_replies = texts.iter().filter(|t| t.contains("stop")).count();
    assert_eq!(stop_replies, 1, "/stop@other_bot was ignored: {texts:?}");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_their_id_and_no_turn() {
    let fake = FakeBotApi::start().await;
    let (bot, agent) = start(&fake, "", "").await;
    fake.push_text(7, 7, "let me in");
    fake.push_text(7, 7, "please");
    assert!(wait_text(&fake, 7, "Your user id is 7").await);
    fake.push_text(USER, USER, "hello");
    assert!(wait_text(&fake, USER, "answer:hello").await);
    assert_eq!(agent.started(), 1);
    // Rate-limited: one notice, not one per message.
    assert_eq!(fake.sent_texts(7).len(), 1);
    let notice = &fake.sent_texts(7)[0];
    assert!(
        !notice.contains("telegram."),
        "a setting shown to a stranger: {notice}"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_nobody_may_use_yet_starts_and_runs_no_strangers_turn() {
    // No allowlist: the bot starts (showing a pairing code, see
    // teams_pairing.rs); a wrong code and plain text run nothing.
    let fake = FakeBotApi::start().await;
    // An empty allowlist is valid: the bot pairs.
    let settings = common(&fake).toml(NO_TYPING_DELAY).toml(IN_MEMORY);
    let agent = ScriptedAgent::new();
    let bot = settings
        .clone()
        .agent(agent.clone())
        .start()
        .await
        .expect("starts");
    fake.push_text(7, 7, "/pair AAAAAAAAAA");
    assert!(wait_text(&fake, 7, "That code is not valid").await);
    fake.push_text(7, 7, "hello");
    assert!(wait_text(&fake, 7, "Your user id is 7").await);
    assert_eq!(agent.started(), 0);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_updates_need_the_secret() {
    let fake = FakeBotApi::start().await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let telegram_extra = format!(
        "mode = \"webhook\"\n[telegram.webhook]\nlisten = \"127.0.0.1:{port}\"\n\
         public_url = \"http://127.0.0.1:{port}/telegram\"\nsecret_token = \"s3cret\"\n"
    );
    let (bot, agent) = start(&fake, &telegram_extra, "").await;
    assert_eq!(
        fake.webhook_url().as_deref(),
        Some(format!("http://127.0.0.1:{port}/telegram").as_str())
    );
    let update = json!({
        "update_id": 1,
        "message": {
            "message_id": 1, "date": 1_700_000_000,
            "chat": {"id": USER, "type": "private", "first_name": "Ann"},
            "from": {"id": USER, "is_bot": false, "first_name": "Ann"},
            "text": "via webhook"
        }
    });
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/telegram");
    let post = |secret: Option<&'static str>| {
        let mut request = client.post(&url).json(&update);
        if let Some(secret) = secret {
            request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
        }
        request.send()
    };
    let mut status = None;
    for _ in 0..100 {
        // The listener may need a moment to bind.
        match post(Some("wrong")).await {
            Ok(response) => {
                status = Some(response.status().as_u16());
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(status, Some(401));
    assert_eq!(post(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(agent.started(), 0);
    assert_eq!(post(Some("s3cret")).await.unwrap().status().as_u16(), 200);
    assert!(wait_text(&fake, USER, "answer:via webhook").await);
    assert_eq!(agent.started(), 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_entities_fall_back_to_plain_text_and_the_reply_still_arrives() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.fail_next(
        "sendMessage",
        1,
        Failure::BadRequest(
            "Bad Request: can't parse entities: Can't find end of the entity".into(),
        ),
    );
    fake.push_text(USER, USER, "**bold** claim");
    assert!(wait_text(&fake, USER, "answer:").await);
    let calls = fake.calls();
    let sends: Vec<_> = sends_to(&calls, USER);
    assert_eq!(sends.len(), 2, "one refused attempt, one plain-text resend");
    assert!(
        sends[1].body.get("entities").is_none(),
        "the resend carries no entities"
    );
    assert_eq!(bot.delivery.stats().plain_fallbacks, 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_queued_behind_a_turn_survives_a_restart_and_runs_once() {
    use telegate::vocab::{MessageEvent, Platform, SessionSource};
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "[sessions]\nshutdown_grace_secs = 0\n");

    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    fake.push_text(USER, USER, "slow:400");
    assert!(fake.wait_for(|_| agent.started() == 1, WAIT).await);
    // A background job finishes while the chat is busy: its wakeup waits.
    let wakeup = MessageEvent::internal(
        SessionSource::dm(Platform::Telegram, USER),
        "wakeup: job 7 done",
    );
    bot.engine.adapter.wake(wakeup).await;
    // The bot stops before either turn could answer.
    bot.shutdown().await;
    assert!(!fake
        .sent_texts(USER)
        .iter()
        .any(|t| t.starts_with("answer:")));

    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(wait_text(&fake, USER, "answer:wakeup: job 7 done").await);
    let texts = fake.sent_texts(USER);
    let count = |needle: &str| texts.iter().filter(|t| t.as_str() == needle).count();
    assert_eq!(count("answer:slow:400"), 1, "{texts:?}");
    assert_eq!(count("answer:wakeup: job 7 done"), 1, "{texts:?}");
    // The resumed turn ran first, then the wakeup, as they were queued.
    assert_eq!(agent.turn_texts(), vec!["slow:400", "wakeup: job 7 done"]);
    let mut settled = false;
    for _ in 0..200 {
        if bot.store.inbox().open_inbox().await.unwrap().is_empty() {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        settled,
        "every recorded message and wakeup ends in a final state"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_cut_short_by_a_restart_is_resumed_when_it_is_all_there_is() {
    use telegate::vocab::{MessageEvent, Platform, SessionSource};
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "[sessions]\nshutdown_grace_secs = 0\n");

    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    // A background job's wakeup starts a turn in an idle chat (one that
    // shows no progress), and the bot stops in the middle of it: the
    // wakeup is the only unfinished entry.
    let wakeup =
        MessageEvent::internal(SessionSource::dm(Platform::Telegram, USER), "block: job 7");
    bot.engine.adapter.wake(wakeup).await;
    assert!(fake.wait_for(|_| agent.started() == 1, WAIT).await);
    bot.shutdown().await;

    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(fake.wait_for(|_| agent.started() == 1, WAIT).await);
    assert_eq!(agent.turn_texts(), vec!["block: job 7"]);
    bot.shutdown().await;
}

/// USER's bot storing in `data`, no typing delay (`rest`: more settings).
fn file_backed_bot(fake: &FakeBotApi, data: &Path, rest: &str) -> TestBot {
    common(fake)
        .users(&[USER])
        .toml(NO_TYPING_DELAY)
        .toml(format!("[store]\ndata_dir = \"{}\"\n", data.display()))
        .toml(rest)
}

/// Leave the store as a kill -9 during a wakeup's turn does: the wakeup's
/// inbox row running, and `transcript` (user messages) in USER's session
/// "s-killed".
async fn seed_killed_wakeup(config: &Config, transcript: &[&str], wakeup: &str) {
    use telegate::store::TranscriptEntry;
    use telegate::vocab::InboxState;
    let key = format!("agent:main:telegram:dm:{USER}");
    let store = telegate::wiring::engine::open_store(&config.store)
        .await
        .unwrap();
    let session = store
        .sessions()
        .get_or_create_session(&key, "s-killed".into())
        .await
        .unwrap();
    for text in transcript {
        // (An internal event's entry is named as the runner names it.)
        let mut entry = TranscriptEntry::user(*text);
        entry.name = Some("telegate".into());
        store
            .transcripts()
            .append(&session.session_id, entry)
            .await
            .unwrap();
    }
    let id = -1_700_000_000_000_007;
    let payload = json!({"telegate_wakeup": {
        "text": wakeup, "chat_id": USER, "chat_type": "dm",
        "thread_id": null, "user_id": null, "user_name": null, "session_id": null,
    }});
    store
        .inbox()
        .record_update(id, USER, Some(id), payload, InboxState::Running, None)
        .await
        .unwrap();
    store.close().await.unwrap();
}

/// How often the user messages of session "s-killed" say `text`.
/// How many times `text` is recorded as the user's in the killed slot's
/// transcript.
async fn recorded_times(bot: &TelegramBot, text: &str) -> usize {
    let line = format!("User: {text}");
    transcript_of(bot, "s-killed")
        .await
        .iter()
        .filter(|recorded| **recorded == line)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_killed_mid_turn_is_resumed_without_being_recorded_twice() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "");
    // Killed after the turn recorded the wakeup, before any answer.
    seed_killed_wakeup(&settings.config(), &["job 7 done"], "job 7 done").await;
    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(wait_text(&fake, USER, "answer:job 7 done").await);
    assert_eq!(agent.turn_texts(), vec!["job 7 done"]);
    assert_eq!(
        recorded_times(&bot, "job 7 done").await,
        1,
        "recorded again"
    );
    bot.shutdown().await;
}

/// The user and assistant entries of `session`, as "role: text".
async fn transcript_of(bot: &TelegramBot, session: &str) -> Vec<String> {
    let history = bot
        .store
        .transcripts()
        .load_history(session, None)
        .await
        .unwrap();
    history
        .iter()
        .map(|m| format!("{:?}: {}", m.role, m.content))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_sessions_of_its_own_gets_no_history_and_every_turn_is_still_recorded() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = ScriptedAgent::with_own_sessions();
    let bot = file_backed_bot(&fake, data.path(), "")
        .agent(agent.clone())
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "one");
    assert!(wait_text(&fake, USER, "answer:one").await);
    fake.push_text(USER, USER, "two");
    assert!(wait_text(&fake, USER, "answer:two").await);
    let histories = agent.histories.lock().unwrap().clone();
    assert_eq!(histories, vec![Vec::<String>::new(), Vec::new()]);
    // The user's message is recorded without a call of its own: carried by
    // the next one, so any read after the turn sees it, in order.
    let session = agent.session_of("one").unwrap();
    assert_eq!(
        transcript_of(&bot, &session).await,
        [
            "User: one",
            "Assistant: answer:one",
            "User: two",
            "Assistant: answer:two"
        ]
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_replayed_for_an_agent_with_sessions_of_its_own_is_recorded_once_without_history() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "");
    seed_killed_wakeup(&settings.config(), &["an older question"], "job 9 done").await;
    let agent = ScriptedAgent::with_own_sessions();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(wait_text(&fake, USER, "answer:job 9 done").await);
    assert_eq!(agent.histories.lock().unwrap()[0], Vec::<String>::new());
    assert_eq!(recorded_times(&bot, "job 9 done").await, 1);
    assert_eq!(recorded_times(&bot, "an older question").await, 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wakeup_killed_before_it_was_recorded_is_recorded_on_resuming() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "");
    // Killed before the turn recorded the wakeup: the transcript ends with
    // an older user message, which is not this one.
    seed_killed_wakeup(&settings.config(), &["an older question"], "job 8 done").await;
    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(wait_text(&fake, USER, "answer:job 8 done").await);
    // Resumed with the session's history.
    assert_eq!(
        agent.histories.lock().unwrap()[0],
        ["an older question"],
        "the resumed turn lost its history"
    );
    assert_eq!(
        recorded_times(&bot, "job 8 done").await,
        1,
        "never recorded"
    );
    assert_eq!(recorded_times(&bot, "an older question").await, 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_of_background_processes_lost_in_a_restart_are_told() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = file_backed_bot(&fake, data.path(), "");
    // The previous run died while chat 42's job was still running.
    let store = telegate::wiring::engine::open_store(&settings.config().store)
        .await
        .unwrap();
    store
        .processes()
        .process_started(telegate::store::RunningProcess {
            process_id: "p1a2b".into(),
            chat_id: USER,
            thread_id: None,
            command: "make release".into(),
        })
        .await
        .unwrap();
    store.close().await.unwrap();

    let bot = settings
        .clone()
        .agent(ScriptedAgent::new())
        .start()
        .await
        .unwrap();
    assert!(wait_text(&fake, USER, "p1a2b").await);
    let notice = fake
        .sent_texts(USER)
        .into_iter()
        .find(|t| t.contains("p1a2b"))
        .unwrap();
    assert!(
        notice.contains("make release") && notice.contains("restarted"),
        "{notice}"
    );
    bot.shutdown().await;

    // Told once: the next start says nothing more.
    let before = fake.sent_texts(USER).len();
    let bot = settings
        .clone()
        .agent(ScriptedAgent::new())
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "ping");
    assert!(wait_text(&fake, USER, "answer:ping").await);
    assert_eq!(fake.sent_texts(USER).len(), before + 1);
    bot.shutdown().await;
}

/// Sends to `chat` whose text is exactly `text`, in arrival order.
fn sends_of<'a>(calls: &'a [RecordedCall], chat: i64, text: &str) -> Vec<&'a RecordedCall> {
    sends_to(calls, chat)
        .into_iter()
        .filter(|c| c.text() == Some(text))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_refused_with_500_for_a_while_arrives_once() {
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.fail_next("sendMessage", 3, Failure::ServerError(500));
    fake.push_text(USER, USER, "hello");
    assert!(
        wait_text(&fake, USER, "answer:hello").await,
        "{:?}",
        fake.calls_to("sendMessage")
    );
    bot.shutdown().await;
    let calls = fake.calls();
    let attempts = sends_of(&calls, USER, "answer:hello");
    assert_eq!(attempts.len(), 4, "{attempts:?}");
    assert_eq!(
        attempts.iter().filter(|c| c.outcome.is_ok()).count(),
        1,
        "{attempts:?}"
    );
    assert_eq!(fake.sent_texts(USER), ["answer:hello"]);
}

/// An answer whose send got no usable answer (`failure`): never sent again,
/// and once Telegram answers again (here after two more 502s to `getMe`)
/// its sender is told, once, in reply to the message.
async fn an_unconfirmed_answer_is_reported_once_telegram_answers(failure: Failure) -> FakeBotApi {
    use telegate::delivery::answer::UNCONFIRMED_ANSWER_NOTICE;
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    fake.fail_next("sendMessage", 1, failure);
    fake.fail_next("getMe", 2, Failure::ServerError(502));
    fake.push_text(USER, USER, "hello");
    // teloxide's client gives up on a hung request after 17 s.
    let told = fake
        .wait_for(
            |calls| has_text(calls, "sendMessage", USER, UNCONFIRMED_ANSWER_NOTICE),
            Duration::from_secs(60),
        )
        .await;
    assert!(told, "{:?}", fake.calls_to("sendMessage"));
    // Anything else for the chat would come right after: a second notice,
    // or the answer sent again.
    fake.push_text(USER, USER, "after");
    assert!(wait_text(&fake, USER, "answer:after").await);
    bot.shutdown().await;
    let calls = fake.calls();
    let answers = sends_of(&calls, USER, "answer:hello");
    assert_eq!(answers.len(), 1, "the answer was sent again: {answers:?}");
    let notices = sends_of(&calls, USER, UNCONFIRMED_ANSWER_NOTICE);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(
        notices[0].body["reply_parameters"]["message_id"],
        answers[0].body["reply_parameters"]["message_id"],
        "the notice answers the message whose answer went missing"
    );
    // Only once the API answered again.
    let probes: Vec<_> = calls
        .iter()
        .filter(|c| c.method == "getMe" && c.seq > answers[0].seq)
        .collect();
    assert_eq!(probes.len(), 3, "{probes:?}");
    assert!(probes[2].outcome.is_ok() && probes[2].seq < notices[0].seq);
    fake
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_send_hangs_is_not_resent_and_its_sender_is_told_once() {
    let fake = an_unconfirmed_answer_is_reported_once_telegram_answers(Failure::Hang).await;
    assert!(!fake.sent_texts(USER).contains(&"answer:hello".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_answered_with_garbage_is_not_resent_and_its_sender_is_told_once() {
    let fake = an_unconfirmed_answer_is_reported_once_telegram_answers(Failure::Garbage).await;
    // It did arrive: once.
    let texts = fake.sent_texts(USER);
    assert_eq!(
        texts.iter().filter(|t| *t == "answer:hello").count(),
        1,
        "{texts:?}"
    );
}

/// The notice of an unconfirmed answer is itself retried until Telegram
/// confirms it: here its first send is hung up on too (after getMe
/// answered again), and it still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notice_of_an_unconfirmed_answer_is_retried_until_confirmed() {
    use telegate::delivery::answer::UNCONFIRMED_ANSWER_NOTICE;
    let fake = FakeBotApi::start().await;
    let (bot, _agent) = start(&fake, "", "").await;
    // The answer, then the first notice: both hung up on after being read.
    fake.fail_next("sendMessage", 2, Failure::Drop);
    fake.push_text(USER, USER, "hello");
    let told = fake
        .wait_for(
            |calls| has_text(calls, "sendMessage", USER, UNCONFIRMED_ANSWER_NOTICE),
            Duration::from_secs(60),
        )
        .await;
    assert!(
        told,
        "the notice was lost: {:?}",
        fake.calls_to("sendMessage")
    );
    bot.shutdown().await;
    let calls = fake.calls();
    let tries = sends_of(&calls, USER, UNCONFIRMED_ANSWER_NOTICE);
    assert!(tries.len() >= 2, "{tries:?}");
    assert!(!tries[0].outcome.is_ok() && tries.last().is_some_and(|c| c.outcome.is_ok()));
}
