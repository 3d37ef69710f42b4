//! The outbox guarantee (invariant 9): a final answer that was delivered is
//! never sent again, even when the process died between delivering it and
//! closing its inbox row.
//!
//! Two layers keep that promise, and each is pinned on its own:
//! * restart recovery sees the outbox row "delivered" and only closes the
//!   inbox row (no turn, no notice, nothing sent), whether interrupted
//!   messages are resumed or their senders asked to resend; an outbox row
//!   that records only the intent to send (the process died mid-send) is
//!   an ambiguous send: the inbox row is closed as failed, nothing is sent;
//! * `TelegramOutbound` (`deliver_answer_once`) skips an answer the outbox
//!   already records as delivered, and finishes a recorded half-streamed
//!   preview in place instead of sending a second message; it records the
//!   intent to send before the request and refuses to repeat a send whose
//!   intent has no outcome.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::{Failure, FakeBotApi, RecordedCall};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::delivery::{Delivery, DeliveryConfig, TelegramOutbound};
use telegate::reply::{Outbound, Reply};
use telegate::store::Store;
use telegate::transport::telegram::intake::AMBIGUOUS_SEND_NOTICE;
use telegate::vocab::{InboxState, Platform, SessionSource};

const WAIT: Duration = Duration::from_secs(20);
const USER: i64 = 42;

fn test_bot(fake: &FakeBotApi, data_dir: &Path, resume: bool) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [sessions]\nresume_interrupted = {resume}\nshutdown_grace_secs = 0\n\n\
             [store]\ndata_dir = \"{}\"\n",
            data_dir.display()
        ))
}

/// Every request that would show the user something in `chat`.
fn visible_calls(calls: &[RecordedCall], chat: i64) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.chat_id() == Some(chat))
        .filter(|c| {
            matches!(
                c.method.as_str(),
                "sendMessage" | "editMessageText" | "sendChatAction" | "deleteMessage"
            )
        })
        .map(|c| format!("{} {:?}", c.method, c.text()))
        .collect()
}

async fn wait_inbox_settled(store: &Store) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if store.inbox().open_inbox().await.unwrap().is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// `ambiguous`: the process died after recording its intent to send the
/// answer and before recording the outcome (the answer may or may not have
/// arrived; here it did).
async fn restart_after_delivery_before_the_inbox_row_closed_sends_nothing(
    resume: bool,
    ambiguous: bool,
) {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, data.path(), resume);

    // First run: the message is answered, the outbox records the delivery.
    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    let update_id = fake.push_text(USER, USER, "hello");
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER) == vec!["answer:hello".to_string()],
            WAIT
        )
        .await
    );
    let store = bot.store.clone();
    let entry = store
        .inbox()
        .inbox_entry(update_id)
        .await
        .unwrap()
        .expect("recorded");
    let message_id = entry.message_id.expect("a message");
    assert!(wait_inbox_settled(&store).await);
    let reply = store
        .outbox()
        .reply_of(USER, message_id)
        .await
        .unwrap()
        .expect("outbox row");
    assert!(reply.delivered);
    // The process "dies" between delivering the answer and closing the
    // inbox row: the row is still running.
    store
        .call(move |conn| {
            conn.execute(
                "UPDATE inbox SET state = 'running', reason = NULL WHERE update_id = ?1",
                [update_id],
            )?;
            if ambiguous {
                conn.execute(
                    "UPDATE outbox SET state = 'streaming', reply_ids = '[]', sending_at = 1
                     WHERE chat_id = ?1 AND message_id = ?2",
                    [USER, message_id],
                )?;
            }
            Ok(())
        })
        .await
        .unwrap();
    bot.shutdown().await;
    drop(store);

    // Second run: recovery must close the row and send nothing.
    fake.clear_calls();
    let agent = ScriptedAgent::new();
    let bot = settings.clone().agent(agent.clone()).start().await.unwrap();
    assert!(wait_inbox_settled(&bot.store).await, "the row was closed");
    let (state, reason) = {
        let entry = bot
            .store
            .inbox()
            .inbox_entry(update_id)
            .await
            .unwrap()
            .unwrap();
        (entry.state, entry.reason)
    };
    if ambiguous {
        // Finished like an ambiguous failure at run time, with its reason.
        assert_eq!(state, InboxState::Failed);
        assert!(
            reason
                .as_deref()
                .is_some_and(|r| r.contains("not sent again")),
            "{reason:?}"
        );
    } else {
        assert_eq!(state, InboxState::Answered);
    }
    // A later message is answered normally, so anything the recovery would
    // have sent has been sent by then (one chat is served in order).
    fake.push_text(USER, USER, "after");
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER).contains(&"answer:after".to_string()),
            WAIT
        )
        .await
    );
    assert_eq!(
        agent.turn_texts(),
        vec!["after".to_string()],
        "the delivered message ran again"
    );
    // An answer cut off mid-send is not sent again, but its sender is told
    // (once) that it may not have arrived.
    let notices = fake
        .sent_texts(USER)
        .iter()
        .filter(|t| t.as_str() == AMBIGUOUS_SEND_NOTICE)
        .count();
    assert_eq!(notices, usize::from(ambiguous), "notices of a cut-off send");
    let visible = visible_calls(&fake.calls(), USER);
    assert!(
        visible.iter().all(|c| c.contains("answer:after")
            || c.starts_with("sendChatAction")
            || (ambiguous && c.contains("restarted while sending the answer"))),
        "the restart showed the user something for the delivered answer: {visible:?}"
    );
    assert_eq!(
        fake.sent_texts(USER)
            .iter()
            .filter(|t| t.as_str() == "answer:hello")
            .count(),
        1,
        "the delivered answer went out twice"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_delivery_sends_nothing_twice_when_resuming() {
    restart_after_delivery_before_the_inbox_row_closed_sends_nothing(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_delivery_sends_nothing_twice_when_asking_to_resend() {
    restart_after_delivery_before_the_inbox_row_closed_sends_nothing(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_an_ambiguous_send_does_not_send_it_again() {
    restart_after_delivery_before_the_inbox_row_closed_sends_nothing(true, true).await;
    restart_after_delivery_before_the_inbox_row_closed_sends_nothing(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_recorded_as_being_sent_is_not_sent_again() {
    let fake = FakeBotApi::start().await;
    let store = Store::open_in_memory().unwrap();
    let out = outbound(&fake, &store);
    // An earlier attempt recorded its intent and never its outcome.
    store
        .outbox()
        .record_send_intent(USER, 11, vec![])
        .await
        .unwrap();
    let result = out
        .deliver(&user(), Reply::answer("maybe sent").in_reply_to(Some(11)))
        .await;
    assert!(result.is_err(), "an ambiguous send must fail, not resend");
    assert!(fake.calls_to("sendMessage").is_empty());
    // A new answer records its intent before the request and its outcome
    // after it.
    out.deliver(&user(), Reply::answer("new").in_reply_to(Some(12)))
        .await
        .unwrap();
    let recorded = store
        .outbox()
        .reply_of(USER, 12)
        .await
        .unwrap()
        .expect("recorded");
    assert!(recorded.delivered && !recorded.sending);
}

fn outbound(fake: &FakeBotApi, store: &Store) -> TelegramOutbound {
    TelegramOutbound::new(
        Delivery::new(fake.bot(), DeliveryConfig::default()),
        Some(telegate::wiring::tables::delivery(store)),
    )
}

fn user() -> SessionSource {
    SessionSource::dm(Platform::Telegram, USER)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_outbox_records_as_delivered_is_not_sent_again() {
    let fake = FakeBotApi::start().await;
    let store = Store::open_in_memory().unwrap();
    let out = outbound(&fake, &store);

    // Not recorded: sent once, then recorded as delivered.
    out.deliver(&user(), Reply::answer("first").in_reply_to(Some(7)))
        .await
        .unwrap();
    assert_eq!(fake.sent_texts(USER), vec!["first".to_string()]);
    let recorded = store
        .outbox()
        .reply_of(USER, 7)
        .await
        .unwrap()
        .expect("recorded");
    assert!(recorded.delivered);
    assert_eq!(recorded.reply_ids.len(), 1);

    // The same answer again (a turn run twice after a restart): nothing.
    out.deliver(&user(), Reply::answer("first").in_reply_to(Some(7)))
        .await
        .unwrap();
    // An answer recorded as delivered by an earlier process: nothing.
    store
        .outbox()
        .record_reply(USER, 8, vec![999], true)
        .await
        .unwrap();
    out.deliver(&user(), Reply::answer("second").in_reply_to(Some(8)))
        .await
        .unwrap();
    assert_eq!(fake.sent_texts(USER), vec!["first".to_string()]);
    assert_eq!(fake.calls_to("sendMessage").len(), 1);
    assert!(fake.calls_to("editMessageText").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_half_streamed_preview_is_finished_in_place() {
    let fake = FakeBotApi::start().await;
    let store = Store::open_in_memory().unwrap();
    let out = outbound(&fake, &store);
    // An earlier process streamed a preview for message 9 and died.
    let preview = fake
        .bot()
        .send_message(teloxide::types::ChatId(USER), "partial…")
        .await
        .unwrap();
    use teloxide::prelude::Requester;
    store
        .outbox()
        .record_reply(USER, 9, vec![preview.id.0], false)
        .await
        .unwrap();
    fake.clear_calls();

    out.deliver(
        &user(),
        Reply::answer("the whole answer").in_reply_to(Some(9)),
    )
    .await
    .unwrap();
    assert!(
        fake.calls_to("sendMessage").is_empty(),
        "a second message was sent"
    );
    let edits = fake.calls_to("editMessageText");
    assert_eq!(edits.len(), 1);
    assert_eq!(edits[0].text(), Some("the whole answer"));
    let history = fake.message_history(USER);
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].text(), "the whole answer");
    assert!(
        store
            .outbox()
            .reply_of(USER, 9)
            .await
            .unwrap()
            .unwrap()
            .delivered
    );
}

/// A preview is a send like the answer's: while its `sendMessage` is in
/// flight, the outbox already records the intent (a restart then treats
/// the message as an ambiguous send instead of answering it again, which
/// would leave the preview's text in the chat twice). Once the preview is
/// out, the row names it, and the final answer finishes it in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_send_records_its_intent_before_the_request() {
    use telegate::reply::TurnStart;
    use telegate::vocab::Progress;
    let fake = FakeBotApi::start().await;
    let store = Store::open_in_memory().unwrap();
    let config = DeliveryConfig {
        edit_interval: Duration::from_millis(20),
        ..DeliveryConfig::default()
    };
    let out = TelegramOutbound::new(
        Delivery::new(fake.bot(), config),
        Some(telegate::wiring::tables::delivery(&store)),
    );
    // The preview's request is held by the fake for a while.
    fake.fail_next(
        "sendMessage",
        1,
        Failure::Delay(Duration::from_millis(1500)),
    );
    let progress = Progress::new();
    let source = user();
    let live = out
        .turn_started_with(
            &TurnStart {
                to: &source,
                answering: Some(11),
                generation: 5,
                replayed: false,
            },
            progress.watch(),
        )
        .expect("a live view");
    progress.set_text("partial answer");
    assert!(
        fake.wait_for(
            |calls| calls.iter().any(|c| c.method == "sendMessage"),
            WAIT
        )
        .await,
        "the preview was never sent"
    );
    let in_flight = store.outbox().reply_of(USER, 11).await.unwrap();
    assert!(
        in_flight.as_ref().is_some_and(|entry| entry.sending),
        "the preview's request is in flight with no intent recorded: {in_flight:?}"
    );
    // Out: the row names the preview and no send is pending.
    let deadline = tokio::time::Instant::now() + WAIT;
    let recorded = loop {
        let entry = store.outbox().reply_of(USER, 11).await.unwrap();
        if entry.as_ref().is_some_and(|e| !e.reply_ids.is_empty()) {
            break entry.expect("checked");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the preview was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!recorded.sending && !recorded.delivered, "{recorded:?}");
    live.finish(Reply::answer("the whole answer").in_reply_to(Some(11)))
        .await
        .unwrap();
    assert_eq!(fake.calls_to("sendMessage").len(), 1, "one message only");
    assert_eq!(fake.sent_texts(USER), vec!["the whole answer".to_string()]);
    assert!(
        store
            .outbox()
            .reply_of(USER, 11)
            .await
            .unwrap()
            .unwrap()
            .delivered
    );
}

/// An answer that waits for its chat's turn and pacing has not left, so
/// its intent is not recorded yet (it is recorded right before the
/// request): telegate stopped during that wait resumes the message after
/// the restart and sends the answer once, instead of taking the send for
/// "may have arrived" and only apologising. Here another member's command
/// reply got a 429, which holds the group for a few seconds, while the
/// answer waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_off_while_it_waits_for_its_pacing_is_sent_once_after_the_restart() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let group = -100;
    let settings = test_bot(&fake, data.path(), true)
        .toml("[telegram]\nallow_all_users = true\n")
        .toml("[delivery]\nstreaming = \"edit\"\ntyping_delay_ms = 60000\n");
    let bot = settings
        .clone()
        .agent(ScriptedAgent::new())
        .start()
        .await
        .unwrap();
    fake.fail_next("sendMessage", 1, Failure::RetryAfter(8));
    fake.push_group_text(group, 7, "@telegate_test_bot /status", false);
    assert!(
        fake.wait_for(
            |calls| calls
                .iter()
                .any(|c| c.method == "sendMessage" && c.outcome.error_code() == Some(429)),
            WAIT
        )
        .await,
        "the group was never held"
    );
    fake.push_group_text(group, 8, "@telegate_test_bot hello", false);
    // The turn is over and its answer handed to delivery: its transcript
    // is in the store (the answer's intent, where it was recorded before
    // the wait, is written in the same commit or earlier).
    let store = bot.store.clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let written = store
            .call(|conn| {
                Ok(conn.query_row(
                    "SELECT count(*) FROM transcripts WHERE content LIKE '%answer:hello%'",
                    [],
                    |row| row.get::<_, i64>(0),
                )?)
            })
            .await
            .unwrap();
        if written > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        fake.sent_texts(group)
            .iter()
            .all(|t| !t.contains("answer:hello")),
        "precondition: the answer was still waiting"
    );
    bot.shutdown().await;
    drop(store);

    let agent = ScriptedAgent::new();
    let bot = settings.agent(agent.clone()).start().await.unwrap();
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(group)
                .iter()
                .any(|t| t.contains("answer:hello")),
            WAIT
        )
        .await,
        "the answer was not sent after the restart: {:?}",
        fake.sent_texts(group)
    );
    assert!(wait_inbox_settled(&bot.store).await);
    let texts = fake.sent_texts(group);
    assert_eq!(
        texts.iter().filter(|t| t.contains("answer:hello")).count(),
        1,
        "{texts:?}"
    );
    assert!(
        !texts.iter().any(|t| t == AMBIGUOUS_SEND_NOTICE),
        "a send that never left was apologised for: {texts:?}"
    );
    bot.shutdown().await;
}
