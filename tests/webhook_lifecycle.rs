//! The webhook's lifecycle against the fake Bot API: telegate registers its
//! own webhook (URL, secret, the update types it handles, max_connections),
//! leaves an identical registration alone, re-registers when the secret
//! changed, fails with a clear error when Telegram refuses, and in polling
//! mode removes a webhook left behind without dropping pending updates.

mod support;

use std::path::Path;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::{Failure, FakeBotApi};
use telegate::config::{Config, Purpose};
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(30);
const USER: i64 = 42;
const HANDLED: &[&str] = &["message", "callback_query"];

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn config(fake: &FakeBotApi, data_dir: &Path, telegram_extra: &str) -> Config {
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallowed_users = [{USER}]\n{telegram_extra}\n\
         [store]\ndata_dir = {:?}\n",
        fake.token(),
        fake.url(),
        data_dir.display().to_string(),
    );
    Config::parse(Path::new("webhook.toml"), &text, Purpose::Telegram, |_| {
        None
    })
    .unwrap()
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

async fn start(_fake: &FakeBotApi, config: &Config) -> TelegramBot {
    TelegramBot::start_with_agent(config, ScriptedAgent::new())
        .await
        .expect("the bot starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mode_registers_once_and_again_only_when_something_changed() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();

    // First start: registered with everything telegate needs.
    let first = config(&fake, dir.path(), &webhook_mode(free_port(), "s3cret", 17));
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
    let again = config(&fake, dir.path(), &webhook_mode(free_port(), "s3cret", 17));
    start(&fake, &again).await.shutdown().await;
    assert_eq!(
        fake.calls_to("setWebhook").len(),
        1,
        "an identical webhook is not registered again"
    );
    assert!(!fake.calls_to("getWebhookInfo").is_empty());

    // A new secret (invisible in getWebhookInfo) registers again.
    let rotated = config(&fake, dir.path(), &webhook_mode(free_port(), "n3w", 17));
    start(&fake, &rotated).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 2);
    assert_eq!(fake.webhook_settings().secret_token.as_deref(), Some("n3w"));

    // So does another max_connections.
    let wider = config(&fake, dir.path(), &webhook_mode(free_port(), "n3w", 60));
    start(&fake, &wider).await.shutdown().await;
    assert_eq!(fake.calls_to("setWebhook").len(), 3);
    assert_eq!(fake.webhook_settings().max_connections, Some(60));
    assert!(fake.delete_webhook_requests().is_empty());
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
    let config = config(&fake, dir.path(), &webhook_mode(port, "s3cret", 40));
    let error = TelegramBot::start_with_agent(&config, ScriptedAgent::new())
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
    let running = start(&fake, &config(&fake, dir.path(), "")).await;
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
    // Polling asks for exactly the update types telegate handles (and
    // Telegram's stop of a streamed draft, which only polling asks for).
    let polls = fake.calls_to("getUpdates");
    let mut asked: Vec<String> = polls[0].body["allowed_updates"]
        .as_array()
        .expect("allowed_updates sent")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    asked.sort();
    let mut polled: Vec<&str> = HANDLED.to_vec();
    polled.push("stopped_message_generation");
    assert_eq!(asked, sorted(&polled));
    running.shutdown().await;

    // No webhook: nothing to remove, no deleteWebhook call.
    let running = start(&fake, &config(&fake, dir.path(), "")).await;
    running.shutdown().await;
    assert_eq!(fake.delete_webhook_requests(), vec![false]);
}
