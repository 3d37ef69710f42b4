//! Bot API requests teloxide-core 0.13 cannot express, sent through
//! teloxide's own client (`JsonRequest`), so the token, API URL, timeouts
//! and error mapping (`retry_after`, API errors) are the same as for every
//! other request.
//!
//! * [`get_updates`]: `getUpdates` returning the updates as raw JSON.
//!   teloxide's typed `Update` turns kinds it cannot parse into an empty
//!   value (its `callback_query` parse fails through `serde(flatten)`), and
//!   re-encoding that loses the update; the intake parses what it needs
//!   from the raw JSON instead, and keeps every update as received.
//!
//! This module owns the wire shape of these requests only.

use serde::Serialize;
use serde_json::Value;
use teloxide::requests::{JsonRequest, Payload, Request};
use teloxide::{Bot, RequestError};

/// `getUpdates`, answered as raw JSON values.
#[derive(Clone, Debug, Serialize)]
struct RawGetUpdates {
    offset: i32,
    timeout: u32,
    allowed_updates: Vec<Value>,
}

impl Payload for RawGetUpdates {
    type Output = Vec<Value>;
    const NAME: &'static str = "getUpdates";

    fn timeout_hint(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(u64::from(self.timeout)))
    }
}

/// [`super::registration::ALLOWED_UPDATES`] plus the update kinds teloxide
/// has no name for: `stopped_message_generation` (Telegram's stop control
/// on a streamed draft).
pub fn allowed_updates() -> Vec<Value> {
    let mut kinds: Vec<Value> = super::registration::ALLOWED_UPDATES
        .iter()
        .filter_map(|kind| serde_json::to_value(kind).ok())
        .collect();
    kinds.push(Value::from("stopped_message_generation"));
    kinds
}

/// One long poll: updates after `offset`, waiting up to `timeout` seconds.
pub async fn get_updates(bot: &Bot, offset: i32, timeout: u32) -> Result<Vec<Value>, RequestError> {
    JsonRequest::new(
        bot.clone(),
        RawGetUpdates {
            offset,
            timeout,
            allowed_updates: allowed_updates(),
        },
    )
    .send()
    .await
}
