//! Bot API requests teloxide-core 0.13 cannot express, with the same
//! token, API URL, timeouts and error mapping (`retry_after`, API errors)
//! as every other request.
//!
//! * [`get_updates`]: `getUpdates` returning each update as the JSON text
//!   Telegram sent ([`RawUpdate`]). teloxide's typed `Update` turns kinds it
//!   cannot parse into an empty value (its `callback_query` parse fails
//!   through `serde(flatten)`), and re-encoding that loses the update; the
//!   intake parses what it needs from the text instead, and keeps every
//!   update as received. It goes through [`BotApi::post`],
//!   not teloxide's `JsonRequest`: that one reads the answer through an
//!   untagged enum, which buffers the whole batch into a tree before a
//!   `RawValue` could take its text (it cannot, from such a buffer), and
//!   sleeps 10 s after a 5xx before the poll loop's own backoff.
//! * [`set_webhook`] and [`get_webhook_info`]: the update types are plain
//!   strings. teloxide's `AllowedUpdate` has no `stopped_message_generation`
//!   (Telegram's stop of a draft), so its `setWebhook` cannot ask for it and
//!   its `getWebhookInfo` fails to parse an answer that lists it.
//!
//! The update types themselves are decided elsewhere
//! ([`super::registration::handled_updates`]). This module owns the wire
//! shape of these requests only.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use teloxide::requests::{JsonRequest, Payload, Request};
use teloxide::types::True;
use teloxide::{ApiError, Bot, RequestError};

use super::parse::RawUpdate;
use crate::delivery::api::AttemptError;
use crate::delivery::bot_api::BotApi;
use crate::secrets::Secret;

/// `getUpdates`, answered as the updates' JSON text.
#[derive(Clone, Debug, Serialize)]
struct RawGetUpdates {
    offset: i32,
    timeout: u32,
    allowed_updates: Vec<&'static str>,
}

impl Payload for RawGetUpdates {
    type Output = Vec<RawUpdate>;
    const NAME: &'static str = "getUpdates";

    fn timeout_hint(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(u64::from(self.timeout)))
    }
}

/// One long poll for the update types `allowed`: updates after `offset`,
/// waiting up to `timeout` seconds.
pub async fn get_updates(
    api: &BotApi,
    offset: i32,
    timeout: u32,
    allowed: &[&'static str],
) -> Result<Vec<RawUpdate>, RequestError> {
    let payload = RawGetUpdates {
        offset,
        timeout,
        allowed_updates: allowed.to_vec(),
    };
    api.clone()
        .post(payload)
        .await
        .map_err(|error| match error {
            AttemptError::Request(error) => error,
            // Failed or unanswered: retried after the poll loop's backoff.
            AttemptError::NotSent(why) | AttemptError::Unanswered(why) => {
                RequestError::Io(Arc::new(std::io::Error::other(why)))
            }
            // Telegram (or a proxy) failed this poll: retried after the
            // poll loop's backoff, reported as what it was.
            AttemptError::Server(status) => RequestError::Api(ApiError::Unknown(format!(
                "Telegram answered HTTP {status}"
            ))),
        })
}

/// `setWebhook` with the update types as strings.
#[derive(Clone, Serialize)]
struct RawSetWebhook {
    url: String,
    secret_token: String,
    allowed_updates: Vec<&'static str>,
    max_connections: u8,
    /// Always false: pending updates are never dropped.
    drop_pending_updates: bool,
}

// Written by hand so the secret never reaches a log through `Debug`.
impl std::fmt::Debug for RawSetWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSetWebhook")
            .field("url", &self.url)
            .field("allowed_updates", &self.allowed_updates)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl Payload for RawSetWebhook {
    type Output = True;
    const NAME: &'static str = "setWebhook";
}

/// Register `url` with `secret`, the update types `allowed` and
/// `max_connections`, keeping the updates that wait at Telegram.
pub async fn set_webhook(
    bot: &Bot,
    url: &url::Url,
    secret: &Secret,
    allowed: &[&'static str],
    max_connections: u8,
) -> Result<(), RequestError> {
    JsonRequest::new(
        bot.clone(),
        RawSetWebhook {
            url: url.to_string(),
            secret_token: secret.expose().to_string(),
            allowed_updates: allowed.to_vec(),
            max_connections,
            drop_pending_updates: false,
        },
    )
    .send()
    .await
    .map(|_| ())
}

/// `getWebhookInfo` (no parameters).
#[derive(Clone, Debug, Serialize)]
struct RawGetWebhookInfo {}

impl Payload for RawGetWebhookInfo {
    type Output = WebhookState;
    const NAME: &'static str = "getWebhookInfo";
}

/// What `getWebhookInfo` says, as far as registration needs it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct WebhookState {
    /// The webhook's URL; empty when none is set.
    #[serde(default)]
    pub url: String,
    /// Updates waiting at Telegram.
    #[serde(default)]
    pub pending_update_count: u32,
    /// `max_connections`, if Telegram shows it.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// The subscribed update types, by Telegram's names (any, even those
    /// telegate does not know).
    #[serde(default)]
    pub allowed_updates: Option<Vec<String>>,
}

/// The webhook Telegram has for this bot, if any.
pub async fn get_webhook_info(bot: &Bot) -> Result<WebhookState, RequestError> {
    JsonRequest::new(bot.clone(), RawGetWebhookInfo {})
        .send()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_info_lists_update_types_teloxide_has_no_name_for() {
        let info: WebhookState = serde_json::from_str(
            r#"{"url":"https://bot.example.com/tg","has_custom_certificate":false,
                "pending_update_count":3,"max_connections":40,
                "allowed_updates":["message","stopped_message_generation"]}"#,
        )
        .unwrap();
        assert_eq!(info.url, "https://bot.example.com/tg");
        assert_eq!(info.pending_update_count, 3);
        assert_eq!(
            info.allowed_updates.as_deref(),
            Some(
                &[
                    "message".to_string(),
                    "stopped_message_generation".to_string()
                ][..]
            )
        );
        let none: WebhookState = serde_json::from_str(
            r#"{"url":"","has_custom_certificate":false,"pending_update_count":0}"#,
        )
        .unwrap();
        assert!(none.url.is_empty() && none.allowed_updates.is_none());
    }

    #[test]
    fn the_secret_stays_out_of_debug_output() {
        let request = RawSetWebhook {
            url: "https://bot.example.com/tg".into(),
            secret_token: "s3cret".into(),
            allowed_updates: vec!["message"],
            max_connections: 40,
            drop_pending_updates: false,
        };
        assert!(!format!("{request:?}").contains("s3cret"));
    }
}
