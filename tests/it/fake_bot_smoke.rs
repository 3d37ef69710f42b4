//! Tests of the fake Bot API itself, driven through a real teloxide `Bot`
//! so that every JSON shape the fake produces is proven to parse the way
//! teloxide expects from Telegram.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::fake_bot::{ChatType, Failure, FakeBotApi, FakeConfig, Outcome};
use teloxide::prelude::*;
use teloxide::types::{
    BotCommand, CallbackQueryId, ChatAction, InlineKeyboardButton, InlineKeyboardMarkup,
    MessageEntity, MessageEntityKind, MessageId, UpdateKind,
};
use teloxide::{ApiError, RequestError};

const WAIT: Duration = Duration::from_secs(5);
const USER: i64 = 42;

/// Raw POST for cases teloxide can't express (odd bodies, timing).
async fn post(fake: &FakeBotApi, method: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(fake.method_url(method))
        .json(&body)
        .send()
        .await
        .expect("request to the fake");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON answer"))
}

#[tokio::test]
async fn get_me_returns_a_complete_bot_user() {
    let fake = FakeBotApi::start().await;
    let me = fake.bot().get_me().await.expect("getMe");
    assert!(me.is_bot);
    assert_eq!(me.username(), "telegate_test_bot");
    assert_eq!(me.id.0, 123);

    let config = FakeConfig {
        username: "other_bot".into(),
        bot_id: 777,
        ..FakeConfig::default()
    };
    let custom = FakeBotApi::start_with(config).await;
    let me = custom.bot().get_me().await.expect("getMe");
    assert_eq!((me.username(), me.id.0), ("other_bot", 777));
    assert_eq!(
        fake.calls_to("getme").len(),
        1,
        "method lookup is case-insensitive"
    );
}

#[tokio::test]
async fn send_message_returns_realistic_messages() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let first = bot.send_message(ChatId(USER), "hello").await.expect("send");
    let second = bot.send_message(ChatId(USER), "world").await.expect("send");
    assert_eq!(first.chat.id, ChatId(USER));
    assert!(first.chat.is_private());
    assert_eq!(first.text(), Some("hello"));
    assert_eq!(first.from.as_ref().map(|u| u.is_bot), Some(true));
    assert!(second.id.0 > first.id.0, "message ids increase per chat");

    let entities = vec![MessageEntity::bold(0, 4)];
    let group = bot
        .send_message(ChatId(-5), "bold text")
        .entities(entities.clone())
        .await
        .expect("send");
    assert!(group.chat.is_group());
    assert_eq!(group.entities(), Some(&entities[..]));
    assert_eq!(group.id.0, 1, "each chat has its own id sequence");

    let supergroup = ChatId(-1_001_234_567_890);
    let in_topic = bot
        .send_message(supergroup, "in topic")
        .message_thread_id(teloxide::types::ThreadId(MessageId(7)))
        .await
        .expect("send");
    assert!(in_topic.chat.is_supergroup());
    assert_eq!(in_topic.thread_id.map(|t| t.0 .0), Some(7));

    fake.register_chat(-77, ChatType::Supergroup);
    let registered = bot.send_message(ChatId(-77), "hi").await.expect("send");
    assert!(registered.chat.is_supergroup());

    assert_eq!(fake.sent_texts(USER), ["hello", "world"]);
    assert_eq!(fake.calls_to("sendMessage").len(), 5);
}

#[tokio::test]
async fn edit_message_text_edits_and_rejects_identical_content() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let sent = bot.send_message(ChatId(USER), "draft").await.expect("send");
    let edited = bot
        .edit_message_text(ChatId(USER), sent.id, "final")
        .await
        .expect("edit");
    assert_eq!(edited.text(), Some("final"));
    assert!(edited.edit_date().is_some());

    let same = bot.edit_message_text(ChatId(USER), sent.id, "final").await;
    assert!(
        matches!(same, Err(RequestError::Api(ApiError::MessageNotModified))),
        "{same:?}"
    );

    // Same text but a new keyboard is a modification, like in Telegram.
    let keyboard = InlineKeyboardMarkup::new([[InlineKeyboardButton::callback("ok", "ok")]]);
    let with_keyboard = bot
        .edit_message_text(ChatId(USER), sent.id, "final")
        .reply_markup(keyboard)
        .await;
    assert!(with_keyboard.expect("edit").reply_markup().is_some());

    let missing = bot
        .edit_message_text(ChatId(USER), MessageId(999), "x")
        .await;
    assert!(
        matches!(
            missing,
            Err(RequestError::Api(ApiError::MessageToEditNotFound))
        ),
        "{missing:?}"
    );

    let history = fake.message_history(USER);
    let versions: Vec<&str> = history[0]
        .versions
        .iter()
        .map(|v| v.text.as_str())
        .collect();
    assert_eq!(versions, ["draft", "final", "final"]);
    assert_eq!(fake.sent_texts(USER), ["final"]);
}

#[tokio::test]
async fn delete_message_hides_it_from_sent_texts() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let keep = bot.send_message(ChatId(USER), "keep").await.expect("send");
    let gone = bot.send_message(ChatId(USER), "gone").await.expect("send");
    bot.delete_message(ChatId(USER), gone.id)
        .await
        .expect("delete");
    let again = bot.delete_message(ChatId(USER), gone.id).await;
    assert!(
        matches!(
            again,
            Err(RequestError::Api(ApiError::MessageToDeleteNotFound))
        ),
        "{again:?}"
    );
    assert_eq!(fake.sent_texts(USER), ["keep"]);
    assert!(fake.message_history(USER)[1].deleted);
    assert_eq!(keep.id.0, 1);
}

#[tokio::test]
async fn injected_retry_after_surfaces_and_early_retries_are_reported() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    fake.fail_next("sendMessage", 1, Failure::RetryAfter(3));
    let limited = bot.send_message(ChatId(USER), "one").await;
    match limited {
        Err(RequestError::RetryAfter(secs)) => assert_eq!(secs.seconds(), 3),
        other => panic!("expected RetryAfter, got {other:?}"),
    }
    assert!(fake.violations_of_retry_after().is_empty());

    // Another chat is not limited; the same chat is, across per-chat methods.
    bot.send_message(ChatId(USER + 1), "other chat")
        .await
        .expect("send");
    assert!(fake.violations_of_retry_after().is_empty());
    bot.send_chat_action(ChatId(USER), ChatAction::Typing)
        .await
        .expect("action");
    let violations = fake.violations_of_retry_after();
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].method, "sendChatAction");
    assert!(violations[0].early_by() > Duration::from_secs(2));
}

#[tokio::test]
async fn retry_after_respected_is_not_a_violation() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    fake.fail_next("sendMessage", 1, Failure::RetryAfter(1));
    let Err(RequestError::RetryAfter(secs)) = bot.send_message(ChatId(USER), "x").await else {
        panic!("expected RetryAfter");
    };
    tokio::time::sleep(secs.duration()).await;
    bot.send_message(ChatId(USER), "x")
        .await
        .expect("send after waiting");
    assert!(fake.violations_of_retry_after().is_empty());
}

#[tokio::test]
async fn validates_text_like_telegram() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let too_long = bot.send_message(ChatId(USER), "a".repeat(4097)).await;
    assert!(
        matches!(too_long, Err(RequestError::Api(ApiError::MessageIsTooLong))),
        "{too_long:?}"
    );
    // Length is counted in UTF-16 units: 2048 emoji = 4096 units is fine.
    bot.send_message(ChatId(USER), "😀".repeat(2048))
        .await
        .expect("exactly at the limit");
    let emoji_too_long = bot.send_message(ChatId(USER), "😀".repeat(2049)).await;
    assert!(matches!(
        emoji_too_long,
        Err(RequestError::Api(ApiError::MessageIsTooLong))
    ));

    let empty = bot.send_message(ChatId(USER), "").await;
    assert!(
        matches!(empty, Err(RequestError::Api(ApiError::MessageTextIsEmpty))),
        "{empty:?}"
    );

    // "😀" is 2 UTF-16 units, so an entity of length 3 overruns it.
    let beyond = bot
        .send_message(ChatId(USER), "😀")
        .entities(vec![MessageEntity::bold(0, 3)])
        .await;
    assert!(
        matches!(
            beyond,
            Err(RequestError::Api(ApiError::CantParseEntities(_)))
        ),
        "{beyond:?}"
    );

    let sent = bot.send_message(ChatId(USER), "short").await.expect("send");
    let edit_too_long = bot
        .edit_message_text(ChatId(USER), sent.id, "b".repeat(4097))
        .await;
    assert!(matches!(
        edit_too_long,
        Err(RequestError::Api(ApiError::EditedMessageIsTooLong))
    ));
    assert_eq!(fake.sent_texts(USER).len(), 2);
}

#[tokio::test]
async fn malformed_requests_get_telegram_shaped_errors() {
    let fake = FakeBotApi::start().await;
    let (status, body) = post(&fake, "noSuchMethod", json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"ok": false, "error_code": 404, "description": "Not Found: method not found"})
    );

    let (status, body) = post(&fake, "SENDMESSAGE", json!({"chat_id": "1", "text": "x"})).await;
    assert_eq!((status, body["ok"].clone()), (200, json!(true)));
    assert_eq!(fake.calls_to("sendMessage").len(), 1);

    let (status, body) = post(&fake, "sendMessage", json!({"chat_id": [1], "text": "x"})).await;
    assert_eq!((status, body["error_code"].clone()), (400, json!(400)));

    let client = reqwest::Client::new();
    let garbage = client
        .post(fake.method_url("sendMessage"))
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(garbage.status(), 400);
    let file = reqwest::multipart::Part::bytes(vec![1, 2, 3]).file_name("cat.jpg");
    let form = reqwest::multipart::Form::new()
        .text("chat_id", "1")
        .part("photo", file);
    let multipart = client
        .post(fake.method_url("sendPhoto"))
        .multipart(form)
        .send()
        .await
        .expect("post");
    // File uploads are served like Telegram does (media outbound).
    assert_eq!(multipart.status(), 200);
    let text = multipart.text().await.expect("body");
    assert!(text.contains("\"ok\":true"), "{text}");
    let outside = client
        .post(fake.url().join("favicon.ico").expect("url"))
        .send()
        .await
        .expect("post");
    assert_eq!(outside.status(), 404);

    let errors = fake
        .calls()
        .iter()
        .filter(|c| c.outcome.error_code() == Some(400))
        .count();
    // The garbage body and the bad JSON (the upload above succeeds).
    assert_eq!(errors, 2, "bad calls are recorded with their outcome");
}

#[tokio::test]
async fn dropped_and_delayed_calls() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    fake.fail_next("sendMessage", 1, Failure::Drop);
    let dropped = bot.send_message(ChatId(USER), "lost").await;
    assert!(
        matches!(dropped, Err(RequestError::Network(_))),
        "{dropped:?}"
    );
    assert_eq!(fake.calls_to("sendMessage")[0].outcome, Outcome::Dropped);
    assert!(
        fake.sent_texts(USER).is_empty(),
        "a dropped call has no effect"
    );

    fake.fail_next("sendMessage", 1, Failure::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    bot.send_message(ChatId(USER), "late")
        .await
        .expect("delayed send");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(fake.sent_texts(USER), ["late"]);
    assert_eq!(
        fake.calls_to("sendMessage").len(),
        2,
        "the client did not retry the dropped call"
    );

    let blocked = "Forbidden: bot was blocked by the user".to_owned();
    fake.fail_next(
        "sendMessage",
        1,
        Failure::Api {
            code: 403,
            description: blocked,
        },
    );
    let forbidden = bot.send_message(ChatId(USER), "x").await;
    assert!(
        matches!(forbidden, Err(RequestError::Api(ApiError::BotBlocked))),
        "{forbidden:?}"
    );
}

#[tokio::test]
async fn failure_rate_is_deterministic() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    fake.set_failure_rate(
        "sendChatAction",
        0.5,
        Failure::BadRequest("Bad Request: chat not found".into()),
    );
    let mut pattern = Vec::new();
    for _ in 0..6 {
        pattern.push(
            bot.send_chat_action(ChatId(USER), ChatAction::Typing)
                .await
                .is_ok(),
        );
    }
    assert_eq!(pattern, [true, false, true, false, true, false]);
    fake.clear_failures();
    bot.send_chat_action(ChatId(USER), ChatAction::Typing)
        .await
        .expect("no more failures");
}

#[tokio::test]
async fn commands_webhook_and_callbacks() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let commands = vec![
        BotCommand::new("start", "Start"),
        BotCommand::new("stop", "Stop the agent"),
    ];
    bot.set_my_commands(commands.clone())
        .await
        .expect("set commands");
    assert_eq!(bot.get_my_commands().await.expect("get commands"), commands);
    assert_eq!(
        fake.my_commands()[1],
        ("stop".to_owned(), "Stop the agent".to_owned())
    );
    let invalid = bot.set_my_commands([BotCommand::new("Start", "x")]).await;
    assert!(
        invalid.is_err(),
        "Telegram rejects upper-case command names"
    );
    bot.delete_my_commands().await.expect("delete commands");
    assert!(bot
        .get_my_commands()
        .await
        .expect("get commands")
        .is_empty());

    let url = reqwest::Url::parse("https://example.com/hook").expect("url");
    bot.set_webhook(url).await.expect("set webhook");
    let info = bot.get_webhook_info().await.expect("webhook info");
    assert_eq!(
        info.url.map(|u| u.to_string()),
        Some("https://example.com/hook".into())
    );
    let polling = bot.get_updates().await;
    assert!(
        polling.is_err(),
        "getUpdates conflicts with an active webhook"
    );
    fake.push_text(USER, USER, "pending");
    bot.delete_webhook()
        .drop_pending_updates(true)
        .await
        .expect("delete webhook");
    assert_eq!(
        (fake.webhook_url(), fake.delete_webhook_requests()),
        (None, vec![true])
    );
    assert_eq!(fake.pending_updates_len(), 0);
    assert!(bot
        .get_webhook_info()
        .await
        .expect("webhook info")
        .url
        .is_none());

    bot.answer_callback_query(CallbackQueryId("cbq-1".to_owned()))
        .await
        .expect("answer callback");
}

#[tokio::test]
async fn builders_produce_updates_teloxide_parses() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    let sent = bot
        .send_message(ChatId(-5), "bot says")
        .await
        .expect("send");
    fake.push_text(USER, USER, "/start@telegate_test_bot hi @alice 😀 @bob");
    fake.push_group_text(-5, USER, "@telegate_test_bot what?", true);
    fake.push_edited_message(USER, USER, 1, "edited");
    fake.push_photo(USER, USER, Some("/cap"));
    fake.push_callback_query(-5, USER, sent.id.0.into(), "data");
    fake.push_update(json!({"totally": "odd"}));
    assert_eq!(fake.pending_updates_len(), 6);

    let first_two = bot.get_updates().limit(2).await.expect("getUpdates");
    assert_eq!(first_two.len(), 2, "limit is honoured");
    let updates = bot.get_updates().await.expect("getUpdates");
    assert_eq!(updates.len(), 6);
    for update in &updates[..5] {
        assert!(
            !matches!(update.kind, UpdateKind::Error(_)),
            "builder update must parse: {update:?}"
        );
    }
    assert!(matches!(updates[5].kind, UpdateKind::Error(_)));

    let UpdateKind::Message(command) = &updates[0].kind else {
        panic!("message")
    };
    let kinds: Vec<(MessageEntityKind, usize, usize)> = command
        .entities()
        .unwrap_or_default()
        .iter()
        .map(|e| (e.kind.clone(), e.offset, e.length))
        .collect();
    assert_eq!(
        kinds,
        [
            (MessageEntityKind::BotCommand, 0, 24),
            (MessageEntityKind::Mention, 28, 6),
            (MessageEntityKind::Mention, 38, 4), // after a 2-unit emoji
        ]
    );
    let UpdateKind::Message(reply) = &updates[1].kind else {
        panic!("message")
    };
    assert_eq!(reply.reply_to_message().map(|m| m.id), Some(sent.id));
    assert!(matches!(&updates[2].kind, UpdateKind::EditedMessage(m) if m.text() == Some("edited")));
    assert!(
        matches!(&updates[3].kind, UpdateKind::Message(m) if m.photo().is_some() && m.caption() == Some("/cap"))
    );
    assert!(
        matches!(&updates[4].kind, UpdateKind::CallbackQuery(q) if q.data.as_deref() == Some("data"))
    );

    // Confirming with offset forgets everything below it.
    let next = updates[5].id.as_offset();
    bot.get_updates()
        .offset(next)
        .timeout(0)
        .await
        .expect("confirm");
    assert_eq!(fake.pending_updates_len(), 0);
}

#[tokio::test]
async fn get_updates_holds_until_timeout_or_update() {
    let fake = FakeBotApi::start().await;
    let started = Instant::now();
    let (_, empty) = post(&fake, "getUpdates", json!({"timeout": 1})).await;
    let held = started.elapsed();
    assert_eq!(empty, json!({"ok": true, "result": []}));
    assert!(
        held >= Duration::from_millis(950) && held < Duration::from_secs(2),
        "held {held:?}"
    );

    let started = Instant::now();
    let poll = post(&fake, "getUpdates", json!({"timeout": 10}));
    let push = async {
        assert!(
            fake.wait_for(|c| c.iter().any(|c| c.outcome == Outcome::Pending), WAIT)
                .await
        );
        fake.push_text(USER, USER, "wake up")
    };
    let ((_, answer), update_id) = tokio::join!(poll, push);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "returned at once when an update arrived"
    );
    assert_eq!(answer["result"][0]["update_id"], json!(update_id));
    assert_eq!(answer["result"][0]["message"]["text"], json!("wake up"));

    // A second concurrent poll terminates the first one, like Telegram.
    fake.clear_calls();
    let first = post(
        &fake,
        "getUpdates",
        json!({"offset": update_id + 1, "timeout": 10}),
    );
    let second = async {
        assert!(
            fake.wait_for(|c| c.iter().any(|c| c.outcome == Outcome::Pending), WAIT)
                .await
        );
        post(
            &fake,
            "getUpdates",
            json!({"offset": update_id + 1, "timeout": 0}),
        )
        .await
    };
    let ((first_status, first_body), (second_status, _)) = tokio::join!(first, second);
    assert_eq!((first_status, second_status), (409, 200));
    assert!(first_body["description"]
        .as_str()
        .is_some_and(|d| d.contains("terminated by other getUpdates")));
}

#[tokio::test]
async fn dispatcher_receives_pushed_message_and_replies() {
    let fake = FakeBotApi::start().await;
    let handler = Update::filter_message().endpoint(|bot: Bot, msg: Message| async move {
        let text = format!("echo: {}", msg.text().unwrap_or_default());
        bot.send_message(msg.chat.id, text).await?;
        respond(())
    });
    let mut dispatcher = Dispatcher::builder(fake.bot(), handler).build();
    let shutdown = dispatcher.shutdown_token();
    let running = tokio::spawn(async move { dispatcher.dispatch().await });

    let polling =
        |calls: &[support::fake_bot::RecordedCall]| calls.iter().any(|c| c.method == "getUpdates");
    assert!(
        fake.wait_for(polling, WAIT).await,
        "dispatcher never polled"
    );
    assert!(fake.calls_to("getMe")[0].outcome.is_ok());
    fake.push_text(USER, USER, "ping");
    assert!(
        fake.wait_for_ok_calls("sendMessage", 1, WAIT).await,
        "no reply recorded"
    );
    assert_eq!(fake.sent_texts(USER), ["echo: ping"]);

    let stopped = shutdown.shutdown().expect("dispatcher is running");
    tokio::time::timeout(WAIT, stopped)
        .await
        .expect("dispatcher stops");
    tokio::time::timeout(WAIT, running)
        .await
        .expect("task ends")
        .expect("no panic");
    assert_eq!(
        fake.pending_updates_len(),
        0,
        "the final poll confirmed the update"
    );
}

#[tokio::test]
async fn shutdown_stops_the_server() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    bot.get_me().await.expect("getMe while running");
    let client = reqwest::Client::new();
    let held = client
        .post(fake.method_url("getUpdates"))
        .json(&json!({"timeout": 10}))
        .send();
    let stop = async {
        assert!(
            fake.wait_for(|c| c.iter().any(|c| c.outcome == Outcome::Pending), WAIT)
                .await
        );
        fake.shutdown();
    };
    let started = Instant::now();
    let _ = tokio::join!(tokio::time::timeout(WAIT, held), stop);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "held poll released by shutdown"
    );
    assert!(bot.get_me().await.is_err(), "no answers after shutdown");
}

#[tokio::test]
async fn whitespace_only_text_and_entities_past_the_utf16_end_are_refused() {
    let fake = FakeBotApi::start().await;
    let bot = fake.bot();
    for blank in [" ", "\n\n", " \t\n "] {
        let sent = bot.send_message(ChatId(USER), blank).await;
        assert!(
            matches!(sent, Err(RequestError::Api(ApiError::MessageTextIsEmpty))),
            "{blank:?}: {sent:?}"
        );
    }
    let sent = bot.send_message(ChatId(USER), "short").await.expect("send");
    let blank_edit = bot.edit_message_text(ChatId(USER), sent.id, "  ").await;
    assert!(
        matches!(
            blank_edit,
            Err(RequestError::Api(ApiError::MessageTextIsEmpty))
        ),
        "{blank_edit:?}"
    );

    // "a😀b" is 3 chars but 4 UTF-16 units: an entity ending at unit 4 is
    // inside the text, one starting at unit 4 is not (offsets are counted in
    // UTF-16 units, not chars or bytes).
    bot.send_message(ChatId(USER), "a😀b")
        .entities(vec![MessageEntity::bold(1, 3)])
        .await
        .expect("entity within the text");
    let past = bot
        .send_message(ChatId(USER), "a😀b")
        .entities(vec![MessageEntity::italic(4, 1)])
        .await;
    match past {
        Err(RequestError::Api(ApiError::CantParseEntities(description))) => {
            assert!(
                description.starts_with("Bad Request: can't parse entities: "),
                "{description}"
            );
        }
        other => panic!("expected can't parse entities, got {other:?}"),
    }
    // Exactly 4,096 units with an entity over all of them is fine.
    let text = "ab😀".repeat(1024);
    bot.send_message(ChatId(USER), text.clone())
        .entities(vec![MessageEntity::bold(0, 4096)])
        .await
        .expect("at the limit");
    let beyond = bot
        .send_message(ChatId(USER), text)
        .entities(vec![MessageEntity::bold(0, 4097)])
        .await;
    assert!(
        matches!(
            beyond,
            Err(RequestError::Api(ApiError::CantParseEntities(_)))
        ),
        "{beyond:?}"
    );
    // Refused sends leave nothing behind.
    assert_eq!(fake.sent_texts(USER).len(), 3);
}
