//! The webhook's lifecycle at Telegram, and the update types telegate asks for.
//!
//! [`handled_updates`] is the one decision which update types telegate asks
//! Telegram for: polling sends it with every `getUpdates`, the webhook with
//! `setWebhook`, and "already registered" compares against it.
//!
//! Webhook mode: telegate registers its own webhook (`setWebhook` with the
//! public URL, the secret, [`handled_updates`] and `max_connections`) unless
//! `getWebhookInfo` shows it already has exactly that. Telegram never shows
//! the secret, so a fingerprint of URL + secret is kept next to the database:
//! a changed secret alone still re-registers. Polling mode: a webhook left
//! behind (which makes every `getUpdates` fail with 409) is removed, keeping
//! the updates that wait at Telegram.
//!
//! Both calls are raw requests ([`super::raw`]): teloxide-core 0.13 has no
//! name for `stopped_message_generation`, so it can neither ask for it in
//! `setWebhook` nor read a `getWebhookInfo` that lists it.
//!
//! This module owns those Bot API calls and [`handled_updates`]. It must
//! never drop pending updates (`drop_pending_updates` is always false) and
//! never log the secret.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ring::digest;
use teloxide::payloads::DeleteWebhookSetters;
use teloxide::requests::Requester;
use teloxide::{Bot, RequestError};

use super::raw;
use crate::delivery::draft::StreamingMode;
use crate::secrets::Secret;

/// A message (text, media, command).
pub const MESSAGE_UPDATE: &str = "message";
/// A press of one of telegate's inline buttons.
pub const CALLBACK_QUERY_UPDATE: &str = "callback_query";
/// Telegram's stop control on a streamed draft (kept where updates are read).
pub use super::parse::DRAFT_STOP_UPDATE;

/// Every update type telegate handles, as Telegram names them. Polling
/// and the webhook both ask for exactly these:
///
/// * messages, always;
/// * callback queries: the Telegram transport always has a store, so its
///   buttons always exist (Stop on an edited preview, Approve/Deny on
///   approval prompts, `/model`);
/// * Telegram's stop of a draft, when turns may stream as drafts
///   (`[delivery] streaming` is not `edit`). Without it Telegram never
///   sends the stop, and the draft's stop control does nothing.
pub fn handled_updates(streaming: StreamingMode) -> Vec<&'static str> {
    let mut kinds = vec![MESSAGE_UPDATE, CALLBACK_QUERY_UPDATE];
    if streaming != StreamingMode::Edit {
        kinds.push(DRAFT_STOP_UPDATE);
    }
    kinds
}

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
    /// The update types to subscribe to ([`handled_updates`]).
    pub allowed_updates: &'a [&'static str],
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
    let info = raw::get_webhook_info(bot)
        .await
        .map_err(RegistrationError::Info)?;
    let fingerprint = fingerprint(wanted.url, wanted.secret);
    let file = wanted.state_dir.map(|dir| dir.join(FINGERPRINT_FILE));
    let same_url = info.url == wanted.url.as_str();
    let same_types = info
        .allowed_updates
        .as_ref()
        .is_some_and(|types| same_kinds(types, wanted.allowed_updates));
    let same_connections = info.max_connections == Some(u32::from(wanted.max_connections));
    let same_secret = file
        .as_ref()
        .and_then(|file| std::fs::read_to_string(file).ok())
        .is_some_and(|stored| stored.trim() == fingerprint);
    if same_url && same_types && same_connections && same_secret {
        tracing::info!(url = %wanted.url, "webhook already registered");
        return Ok(Registration::AlreadySet);
    }
    raw::set_webhook(
        bot,
        wanted.url,
        wanted.secret,
        wanted.allowed_updates,
        wanted.max_connections,
    )
    .await
    .map_err(|source| RegistrationError::Set {
        url: wanted.url.to_string(),
        source,
    })?;
    tracing::info!(url = %wanted.url, kinds = ?wanted.allowed_updates, "webhook registered");
    if let Some(file) = file {
        remember(&file, &fingerprint);
    }
    Ok(Registration::Registered)
}

/// Polling mode: remove a webhook left behind, keeping pending updates.
/// Returns whether there was one.
pub async fn remove_leftover_webhook(bot: &Bot) -> Result<bool, RegistrationError> {
    let info = raw::get_webhook_info(bot)
        .await
        .map_err(RegistrationError::Info)?;
    if info.url.is_empty() {
        return Ok(false);
    }
    let url = info.url;
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

/// The same update types, in any order.
fn same_kinds(registered: &[String], wanted: &[&str]) -> bool {
    let registered: BTreeSet<&str> = registered.iter().map(String::as_str).collect();
    registered == wanted.iter().copied().collect()
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
    fn the_draft_stop_is_asked_for_only_when_drafts_may_be_used() {
        let all = ["message", "callback_query", "stopped_message_generation"];
        assert_eq!(handled_updates(StreamingMode::Auto), all);
        assert_eq!(handled_updates(StreamingMode::Draft), all);
        assert_eq!(
            handled_updates(StreamingMode::Edit),
            ["message", "callback_query"]
        );
    }

    #[test]
    fn registered_kinds_compare_as_sets() {
        let wanted = handled_updates(StreamingMode::Auto);
        let shuffled: Vec<String> = wanted.iter().rev().map(|k| k.to_string()).collect();
        assert!(same_kinds(&shuffled, &wanted));
        assert!(!same_kinds(&shuffled[1..], &wanted));
        assert!(!same_kinds(
            &shuffled,
            &handled_updates(StreamingMode::Edit)
        ));
    }
}
