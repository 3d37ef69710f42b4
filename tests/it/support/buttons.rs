//! The inline buttons the bot shows in the fake Bot API, and the toasts
//! (`answerCallbackQuery`) it answers presses with.

use serde_json::Value;

use super::fake_bot::FakeBotApi;
use super::tools_bot::WAIT;

/// A button as the chat shows it: (message id, label, callback data).
pub type Shown = (i64, String, String);

/// The buttons currently under the bot's messages in `chat`.
pub fn buttons(fake: &FakeBotApi, chat: i64) -> Vec<Shown> {
    let mut found = Vec::new();
    for message in fake.message_history(chat) {
        let Some(markup) = &message.current().reply_markup else {
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
    found
}

/// Wait for a button whose label contains `label` in `chat`.
pub async fn wait_button(fake: &FakeBotApi, chat: i64, label: &str) -> Shown {
    let found = fake
        .wait_for(
            |_| buttons(fake, chat).iter().any(|b| b.1.contains(label)),
            WAIT,
        )
        .await;
    assert!(found, "a {label} button in {chat}");
    buttons(fake, chat)
        .into_iter()
        .find(|b| b.1.contains(label))
        .unwrap()
}

/// The texts of every `answerCallbackQuery`, in order.
pub fn toasts(fake: &FakeBotApi) -> Vec<String> {
    fake.calls_to("answerCallbackQuery")
        .iter()
        .map(|c| c.text().unwrap_or_default().to_string())
        .collect()
}

/// Wait for a toast containing `needle`.
pub async fn wait_toast(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(|_| toasts(fake).iter().any(|t| t.contains(needle)), WAIT)
        .await
}

/// Wait until bot message `message_id` in `chat` reads with `needle`
/// (an edit is sent after the answer it settles may already be seen).
pub async fn wait_message_text(
    fake: &FakeBotApi,
    chat: i64,
    message_id: i64,
    needle: &str,
) -> bool {
    fake.wait_for(
        |_| message_text(fake, chat, message_id).contains(needle),
        WAIT,
    )
    .await
}

/// The current text of bot message `message_id` in `chat`.
pub fn message_text(fake: &FakeBotApi, chat: i64, message_id: i64) -> String {
    fake.message_history(chat)
        .into_iter()
        .find(|m| m.message_id == message_id)
        .map(|m| m.current().text.clone())
        .unwrap_or_default()
}
