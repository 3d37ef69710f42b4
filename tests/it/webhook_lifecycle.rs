//! The webhook's lifecycle against the fake Bot API: telegate registers its
//! own webhook (URL, secret, the update types it handles, max_connections),
//! leaves an identical registration alone, re-registers when the secret
//! changed (the secret, `max_connections`, the update types), fails with a
//! clear error when Telegram refuses, and in polling mode removes a webhook
//! left behind without dropping pending updates. Polling and the webhook
//! ask for the same update types, Telegram's stop of a draft included, and
//! that stop, delivered to the webhook, stops a turn like /stop.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::{Failure, FakeBotApi};
use support::test_bot::{TestBot, FAST_DELIVERY};
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(30);
const USER: i64 = 42;
/// The update types telegate handles by default (`streaming = "auto"`).
const HANDLED: &[&str] = &["message", "callback_query", "stopped_message_generation"];
/// With `streaming = "edit"` no draft is ever shown, so its stop is not
/// asked for.
const HANDLED_WITHOUT_DRAFTS: &[&str] = &["message", "callback_query"];

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn test_bot(fake: &FakeBotApi, data_dir: &Path, telegram_extra: &str) -> TestBot {
    test_bot_with(fake, data_dir, telegram_extra, "")
}

/// Like [`test_bot`], with more sections after `[store]`.
fn test_bot_with(fake: &FakeBotApi, data_dir: &Path, telegram_extra: &str, rest: &str) -> TestBot {
    TestBot::new(fake).users(&[USER]).toml(format!(
        "[telegram]\n{telegram_extra}\n[store]\ndata_dir = {:?}\n\n{rest}\n",
        data_dir.display().to_string(),
    ))
}

fn webhook_mode(port: u16, secret: &str, max_connections: u8) -> String {
    format!(
        "mode = \"webhook\"\n[telegram.webhook]\nlisten = \"127.0.0.1:{port}\"\n\
         public_url = \"https://bot.example.com/telegram\"\nsecret_token = \"{secret}\"\n\
         max_connections = {max_connections}\n"
    )
}

fn sorted(kinds: &[&str]) -> Vec<String> {
    let mut kinds: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
    kinds.sort();
    kinds
}

async fn start(_fake: &FakeBotApi, test_bot: &TestBot) -> TelegramBot {
    test_bot
        .clone()
        .agent(ScriptedAgent::new())
        .start()
        .await
        .expect("the bot starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mode_registers_once_and_again_only_when_something_changed() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();

    // First start: registered with everything telegate needs.
    let first = test_bot(&fake, dir.path(), &webhook_mode(free_port(), "s3cret", 17));
    start(&fake, &first).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 1);
    assert_eq!(
        fake.webhook_url().as_deref(),
        Some("https://bot.example.com/telegram")
    );
    let settings = fake.webhook_settings();
    assert_eq!(settings.secret_token.as_deref(), Some("s3cret"));
    assert_eq!(settings.max_connections, Some(17));
    let mut asked = settings
        .allowed_updates
        .clone()
        .expect("allowed_updates sent");
    asked.sort();
    assert_eq!(asked, sorted(HANDLED));
    let set = &fake.calls_to("setWebhook")[0];
    assert_ne!(
        set.body
            .get("drop_pending_updates")
            .and_then(|v| v.as_bool()),
        Some(true),
        "pending updates are never dropped"
    );

    // Same settings: Telegram already has them, nothing is sent.
    let again = test_bot(&fake, dir.path(), &webhook_mode(free_port(), "s3cret", 17));
    start(&fake, &again).await.shutdown().await;
    assert_eq!(
        fake.calls_to("setWebhook").len(),
        1,
        "an identical webhook is not registered again"
    );
    assert!(!fake.calls_to("getWebhookInfo").is_empty());

    // A new secret (invisible in getWebhookInfo) registers again.
    let rotated = test_bot(&fake, dir.path(), &webhook_mode(free_port(), "n3w", 17));
    start(&fake, &rotated).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 2);
    assert_eq!(fake.webhook_settings().secret_token.as_deref(), Some("n3w"));

    // So does another max_connections.
    let wider = test_bot(&fake, dir.path(), &webhook_mode(free_port(), "n3w", 60));
    start(&fake, &wider).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 3);
    assert_eq!(fake.webhook_settings().max_connections, Some(60));

    // And other update types: without drafts, their stop is not asked for.
    let no_drafts = test_bot_with(
        &fake,
        dir.path(),
        &webhook_mode(free_port(), "n3w", 60),
        "[delivery]\nstreaming = \"edit\"\n",
    );
    start(&fake, &no_drafts).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 4);
    let mut asked = fake.webhook_settings().allowed_updates.unwrap_or_default();
    asked.sort();
    assert_eq!(asked, sorted(HANDLED_WITHOUT_DRAFTS));
    // Back to the default: the draft stop is asked for again.
    start(&fake, &wider).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 5);
    assert!(fake.delete_webhook_requests().is_empty());
}

/// Telegram's stop control on a draft reaches a webhook only if `setWebhook`
/// asked for `stopped_message_generation` (the fake, like Telegram, drops
/// update kinds the webhook did not ask for). Delivered, it stops the
/// streaming turn exactly like /stop: the same reply, the agent cancelled,
/// no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegrams_draft_stop_reaches_the_webhook_and_stops_the_turn_like_stop() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let settings = test_bot_with(
        &fake,
        dir.path(),
        &webhook_mode(free_port(), "s3cret", 40),
        FAST_DELIVERY,
    );
    let agent = ScriptedAgent::new();
    let bot = settings
        .agent(agent.clone())
        .start()
        .await
        .expect("the bot starts");
    let mut asked = fake
        .webhook_settings()
        .allowed_updates
        .expect("allowed_updates sent");
    asked.sort();
    assert_eq!(
        asked,
        sorted(HANDLED),
        "the webhook asks for the draft stop"
    );
    let listen = bot.webhook_addr.expect("the webhook listens");
    let stopped = |n: usize| {
        let fake = &fake;
        move |_: &[support::fake_bot::RecordedCall]| {
            fake.sent_texts(USER)
                .iter()
                .filter(|t| t.as_str() == "⏹ Stopped.")
                .count()
                == n
        }
    };

    // The reference: a streaming turn stopped with /stop.
    fake.push_text(USER, USER, "slow:60000");
    assert_eq!(fake.deliver_to_webhook(listen).await, 1);
    assert!(fake.wait_for(|_| !fake.drafts(USER).is_empty(), WAIT).await);
    fake.push_text(USER, USER, "/stop");
    assert_eq!(fake.deliver_to_webhook(listen).await, 1);
    assert!(
        fake.wait_for(stopped(1), WAIT).await,
        "/stop stopped the turn"
    );
    assert!(fake.wait_for(|_| agent.cancelled() == 1, WAIT).await);
    let first_draft = fake.drafts(USER)[0].0;

    // The same with Telegram's stop control on the next turn's draft.
    fake.push_text(USER, USER, "slow:60000");
    assert_eq!(fake.deliver_to_webhook(listen).await, 1);
    assert!(
        fake.wait_for(
            |_| fake.drafts(USER).iter().any(|d| d.0 != first_draft),
            WAIT
        )
        .await,
        "the second turn streams a draft"
    );
    let draft = fake
        .drafts(USER)
        .iter()
        .rev()
        .find(|d| d.0 != first_draft)
        .map(|d| d.0)
        .expect("a draft of the second turn");
    assert_eq!(bot.engine.runner.running_count(), 1);
    fake.push_draft_stop(USER, draft);
    assert_eq!(
        fake.deliver_to_webhook(listen).await,
        1,
        "the draft stop was delivered to the webhook"
    );
    assert!(
        fake.wait_for(stopped(2), WAIT).await,
        "the draft stop stopped the turn: {:?}",
        fake.sent_texts(USER)
    );
    assert!(fake.wait_for(|_| agent.cancelled() == 2, WAIT).await);
    assert!(
        !fake
            .sent_texts(USER)
            .iter()
            .any(|t| t.contains("answer:slow")),
        "a stopped turn answers nothing"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_webhook_is_a_clear_start_error() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    fake.fail_next(
        "setWebhook",
        1,
        Failure::BadRequest(
            "Bad Request: bad webhook: HTTPS url must be provided for webhook".into(),
        ),
    );
    let port = free_port();
    let error = test_bot(&fake, dir.path(), &webhook_mode(port, "s3cret", 40))
        .agent(ScriptedAgent::new())
        .start()
        .await
        .err()
        .expect("the start fails")
        .to_string();
    assert!(error.contains("setWebhook"), "{error}");
    assert!(
        error.contains("https://bot.example.com/telegram"),
        "{error}"
    );
    assert!(error.contains("HTTPS url must be provided"), "{error}");
    assert!(
        !error.contains("s3cret"),
        "the secret is never shown: {error}"
    );
    assert_eq!(fake.webhook_url(), None);
    // The webhook listener it had opened is closed again.
    let closed = async {
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("the listener is closed after the failed start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_removes_a_leftover_webhook_and_keeps_pending_updates() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bot = fake.bot();
    use teloxide::requests::Requester;
    bot.set_webhook(reqwest::Url::parse("https://old.example.com/hook").unwrap())
        .await
        .unwrap();
    fake.push_text(USER, USER, "sent while the webhook was set");
    let running = start(&fake, &test_bot(&fake, dir.path(), "")).await;
    assert_eq!(fake.delete_webhook_requests(), vec![false]);
    assert_eq!(fake.webhook_url(), None);
    let answered = fake
        .wait_for(
            |calls| {
                calls.iter().any(|c| {
                    c.method == "sendMessage"
                        && c.text()
                            .is_some_and(|t| t.contains("sent while the webhook was set"))
                })
            },
            WAIT,
        )
        .await;
    assert!(answered, "the pending update is still answered");
    // Polling asks for exactly the update types the webhook asks for.
    let polls = fake.calls_to("getUpdates");
    let mut asked: Vec<String> = polls[0].body["allowed_updates"]
        .as_array()
        .expect("allowed_updates sent")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    asked.sort();
    assert_eq!(asked, sorted(HANDLED));
    running.shutdown().await;

    // No webhook: nothing to remove, no deleteWebhook call.
    let running = start(&fake, &test_bot(&fake, dir.path(), "")).await;
    running.shutdown().await;
    assert_eq!(fake.delete_webhook_requests(), vec![false]);
}
