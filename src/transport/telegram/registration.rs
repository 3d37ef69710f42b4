//! The webhook's lifecycle at Telegram, and the update types telegate asks for.
//!
//! Webhook mode: telegate registers its own webhook (`setWebhook` with the
//! public URL, the secret, [`ALLOWED_UPDATES`] and `max_connections`) unless
//! `getWebhookInfo` shows it already has exactly that. Telegram never shows
//! the secret, so a fingerprint of URL + secret is kept next to the database:
//! a changed secret alone still re-registers. Polling mode: a webhook left
//! behind (which makes every `getUpdates` fail with 409) is removed, keeping
//! the updates that wait at Telegram.
//!
//! This module owns those Bot API calls and [`ALLOWED_UPDATES`]. It must
//! never drop pending updates (`drop_pending_updates` is always false) and
//! never log the secret.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ring::digest;
use teloxide::payloads::{DeleteWebhookSetters, SetWebhookSetters};
use teloxide::requests::Requester;
use teloxide::types::AllowedUpdate;
use teloxide::{Bot, RequestError};

use crate::config::Secret;

/// Every update type telegate handles: messages, and the callback queries
/// of its buttons. Polling and the webhook both ask for exactly these.
pub const ALLOWED_UPDATES: &[AllowedUpdate] =
    &[AllowedUpdate::Message, AllowedUpdate::CallbackQuery];

/// The file, next to the database, that remembers which URL + secret the
/// registered webhook has (a SHA-256 fingerprint, not the secret).
pub const FINGERPRINT_FILE: &str = "webhook.fingerprint";

/// A webhook Bot API call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// `getWebhookInfo` failed.
    #[error("getWebhookInfo failed: {0}")]
    Info(#[source] RequestError),
    /// Telegram refused the webhook.
    #[error("setWebhook for {url} was refused: {source} (check that the URL is public HTTPS on port 443, 80, 88 or 8443)")]
    Set {
        /// The URL (not secret).
        url: String,
        /// Telegram's answer.
        #[source]
        source: RequestError,
    },
    /// `deleteWebhook` failed.
    #[error("deleteWebhook failed (getUpdates cannot work while a webhook is set): {0}")]
    Delete(#[source] RequestError),
}

/// The webhook telegate wants Telegram to have.
pub struct WantedWebhook<'a> {
    /// The public URL.
    pub url: &'a url::Url,
    /// The secret Telegram sends back with each update.
    pub secret: &'a Secret,
    /// `max_connections`.
    pub max_connections: u8,
    /// Where the fingerprint file lives (the data directory); `None` (an
    /// in-memory store) registers every time.
    pub state_dir: Option<&'a Path>,
}

/// What [`ensure_webhook`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Registration {
    /// Telegram already had exactly this webhook; nothing was sent.
    AlreadySet,
    /// `setWebhook` was sent and accepted.
    Registered,
}

/// Register the webhook unless Telegram already has exactly it.
pub async fn ensure_webhook(
    bot: &Bot,
    wanted: &WantedWebhook<'_>,
) -> Result<Registration, RegistrationError> {
    let info = bot
        .get_webhook_info()
        .await
        .map_err(RegistrationError::Info)?;
    let fingerprint = fingerprint(wanted.url, wanted.secret);
    let file = wanted.state_dir.map(|dir| dir.join(FINGERPRINT_FILE));
    let same_url = info.url.as_ref() == Some(wanted.url);
    let same_types = info
        .allowed_updates
        .as_ref()
        .is_some_and(|types| as_set(types) == as_set(ALLOWED_UPDATES));
    let same_connections = info.max_connections == Some(u32::from(wanted.max_connections));
    let same_secret = file
        .as_ref()
        .and_then(|file| std::fs::read_to_string(file).ok())
        .is_some_and(|stored| stored.trim() == fingerprint);
    if same_url && same_types && same_connections && same_secret {
        tracing::info!(url = %wanted.url, "webhook already registered");
        return Ok(Registration::AlreadySet);
    }
    bot.set_webhook(wanted.url.clone())
        .secret_token(wanted.secret.expose().to_string())
        .allowed_updates(ALLOWED_UPDATES.to_vec())
        .max_connections(wanted.max_connections)
        .drop_pending_updates(false)
        .await
        .map_err(|source| RegistrationError::Set {
            url: wanted.url.to_string(),
            source,
        })?;
    tracing::info!(url = %wanted.url, "webhook registered");
    if let Some(file) = file {
        remember(&file, &fingerprint);
    }
    Ok(Registration::Registered)
}

/// Polling mode: remove a webhook left behind, keeping pending updates.
/// Returns whether there was one.
pub async fn remove_leftover_webhook(bot: &Bot) -> Result<bool, RegistrationError> {
    let info = bot
        .get_webhook_info()
        .await
        .map_err(RegistrationError::Info)?;
    let Some(url) = info.url else {
        return Ok(false);
    };
    bot.delete_webhook()
        .drop_pending_updates(false)
        .await
        .map_err(RegistrationError::Delete)?;
    tracing::info!(
        %url,
        pending = info.pending_update_count,
        "removed a webhook left behind (polling mode); its pending updates are kept"
    );
    Ok(true)
}

fn as_set(types: &[AllowedUpdate]) -> BTreeSet<String> {
    types
        .iter()
        .filter_map(|kind| serde_json::to_value(kind).ok())
        .filter_map(|value| value.as_str().map(str::to_owned))
        .collect()
}

fn fingerprint(url: &url::Url, secret: &Secret) -> String {
    let mut context = digest::Context::new(&digest::SHA256);
    context.update(url.as_str().as_bytes());
    context.update(b"\n");
    context.update(secret.expose().as_bytes());
    context
        .finish()
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Best effort: a missing fingerprint only means one more `setWebhook` at
/// the next start.
fn remember(file: &PathBuf, fingerprint: &str) {
    if let Err(error) = std::fs::write(file, format!("{fingerprint}\n")) {
        tracing::warn!(%error, file = %file.display(), "could not remember the webhook registration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_depends_on_url_and_secret_and_hides_the_secret() {
        let url = url::Url::parse("https://bot.example.com/tg").unwrap();
        let a = fingerprint(&url, &Secret::new("one"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, fingerprint(&url, &Secret::new("two")));
        let other = url::Url::parse("https://bot.example.com/other").unwrap();
        assert_ne!(a, fingerprint(&other, &Secret::new("one")));
        assert!(!a.contains("one"));
    }

    #[test]
    fn allowed_updates_are_named_as_telegram_names_them() {
        let names = as_set(ALLOWED_UPDATES);
        assert_eq!(
            names,
            ["callback_query", "message"]
                .into_iter()
                .map(String::from)
                .collect()
        );
    }
}
