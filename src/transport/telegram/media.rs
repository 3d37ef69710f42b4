//! The intake's media step: what a chat worker does with a message that
//! carries media before handing it to the adapter — gather the album,
//! prepare the files (see [`crate::media::prepare`]), echo a transcript,
//! or refuse with a clear message and close the message's inbox rows.
//!
//! It runs inside the per-chat worker (so one chat's download never holds
//! up another chat) after the update is recorded, and stops with the
//! intake: a preparation cut short by a shutdown is resumed by the next
//! start's recovery. It must never run a turn.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::delivery::{ChatTarget, Delivery};
use crate::engine::Engine;
use crate::event::{MessageEvent, SessionSource};
use crate::media::album::{self, AlbumAliases};
use crate::media::MediaStage;
use crate::reply::Reply;
use crate::store::{InboxState, Store};

/// What the chat workers need for media.
pub struct IntakeMedia {
    /// Prepares files.
    pub stage: MediaStage,
    /// Album parts standing in for each other in the inbox.
    pub aliases: AlbumAliases,
    /// Fires when the intake stops.
    pub stop: CancellationToken,
    /// Sends echoes and refusals.
    pub delivery: Delivery,
    /// Closes refused messages' inbox rows.
    pub store: Store,
    /// Sends files; recovery sends what a restart left in an outbox.
    pub files: Arc<crate::media::OutboxFiles>,
}

/// Whether `event` goes through the media step.
pub fn has_media(event: &MessageEvent) -> bool {
    event.media.needs_preparing() || event.media.group.is_some()
}

impl IntakeMedia {
    /// Gather `event`'s album from `queue`, then prepare it. Returns the
    /// event to hand on (`None`: refused, or stopping) and the next event
    /// taken from the queue that was not part of the album.
    pub async fn take(
        self: &Arc<Self>,
        engine: &Engine,
        event: MessageEvent,
        queue: &mut UnboundedReceiver<MessageEvent>,
    ) -> (Option<MessageEvent>, Option<MessageEvent>) {
        let window = Duration::from_millis(self.stage.config().album_window_ms);
        let (album, rest) = album::gather(event, queue, window).await;
        let chat = album.source.chat_id;
        let first = album.message_id.unwrap_or_default();
        self.aliases.add(chat, first, &album.media.merged);
        let key = engine.adapter.session_key(&album.source);
        let session = engine.runner.resolve_session(&key).await;
        let merged = album.media.merged.clone();
        let reply_to = album.message_id;
        let target = ChatTarget::of(&album.source);
        let prepared = match session {
            Ok(session) => {
                let dir = self.stage.session_dir(session.as_str());
                tokio::select! {
                    _ = self.stop.cancelled() => return (None, rest),
                    prepared = self.stage.prepare(album, &dir) => prepared,
                }
            }
            Err(unavailable) => {
                tracing::error!(error = %unavailable.0, "no session to keep a file in");
                Err(crate::media::prepare::Refusal(
                    "telegate cannot store files right now (its database is unavailable); \
                     please send it again in a moment."
                        .to_string(),
                ))
            }
        };
        match prepared {
            Ok(prepared) => {
                if let Some(echo) = prepared.echo {
                    self.echo_once(target, chat, reply_to, echo).await;
                }
                (Some(prepared.event), rest)
            }
            Err(refusal) => {
                tracing::info!(chat_id = chat, reason = %refusal.0, "media not read");
                let reply = Reply::notice(refusal.0).in_reply_to(reply_to);
                if let Err(error) = self.delivery.deliver_reply(target, &reply, None).await {
                    tracing::warn!(%error, "could not tell a user why their file was not read");
                }
                self.aliases.of(chat, first, true);
                for id in std::iter::once(first).chain(merged) {
                    if let Err(error) = self
                        .store
                        .set_message_state(
                            chat,
                            id,
                            InboxState::Dropped,
                            Some("media not read".into()),
                        )
                        .await
                    {
                        tracing::error!(%error, "could not record a message state");
                    }
                }
                (None, rest)
            }
        }
    }
}

/// The outbox ledger key of a message's transcript echo.
const ECHO_KEY: &str = "echo:transcript";

impl IntakeMedia {
    /// Recovery, for a message whose answer went out before the restart:
    /// send the files its turn left in the outbox and that are not
    /// recorded as sent (see [`crate::media::OutboxFiles::send_leftovers`]).
    pub async fn send_leftover_files(&self, to: &SessionSource, message_id: i64) -> usize {
        let outbound = crate::delivery::TelegramOutbound::new(self.delivery.clone(), None);
        self.files.send_leftovers(&outbound, to, message_id).await
    }

    /// Echo a transcript unless the echo for this message already went out
    /// (a message resumed after a restart is transcribed again, but its
    /// "🎤 …" is shown once). Recorded in the outbox ledger like a sent
    /// file, after the send.
    async fn echo_once(&self, target: ChatTarget, chat: i64, message: Option<i64>, echo: String) {
        if let Some(id) = message {
            if self
                .store
                .file_sent(chat, id, ECHO_KEY.to_string())
                .await
                .unwrap_or(false)
            {
                tracing::debug!(chat_id = chat, message_id = id, "transcript already echoed");
                return;
            }
        }
        let reply = Reply::notice(echo).in_reply_to(message);
        match self.delivery.deliver_reply(target, &reply, None).await {
            Ok(sent) => {
                if let (Some(id), Some(first)) = (message, sent.first()) {
                    if let Err(error) = self
                        .store
                        .record_file_sent(chat, id, ECHO_KEY.to_string(), i64::from(*first))
                        .await
                    {
                        tracing::error!(%error, "could not record a transcript echo");
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "could not echo a transcript"),
        }
    }
}

/// Where saved files live: `<data_dir>/media`, or a temporary directory
/// for an in-memory store.
pub fn media_dir(config: &crate::config::Config) -> std::path::PathBuf {
    if config.store.in_memory {
        std::env::temp_dir().join(format!("telegate-media-{}", std::process::id()))
    } else {
        crate::media::media_root(&config.store.data_dir)
    }
}

/// The media step and the file output of a Telegram bot, from the config.
#[allow(clippy::too_many_arguments)]
pub fn build(
    config: &crate::config::Config,
    bot: &teloxide::Bot,
    api_url: &url::Url,
    token: &str,
    store: &Store,
    delivery: &Delivery,
    aliases: AlbumAliases,
    stop: CancellationToken,
) -> Result<(IntakeMedia, Arc<crate::media::OutboxFiles>), String> {
    use crate::config::Backend;
    use crate::media::prepare::ImageMode;
    let images = match config.agent.backend {
        Backend::Openai if config.agent.openai.as_ref().is_some_and(|o| o.vision) => {
            ImageMode::Vision
        }
        Backend::Openai => ImageMode::Refuse,
        _ => ImageMode::Path,
    };
    let root = media_dir(config);
    let downloader = crate::media::download::Downloader::new(bot.clone(), api_url, token)?;
    let stage = MediaStage::new(config.media.clone(), root.clone(), downloader, images)?;
    crate::media::retention::spawn_retention(root.clone(), config.media.keep_days, stop.clone());
    let sender = Arc::new(crate::delivery::files::TelegramFileSender::new(
        delivery.clone(),
    ));
    let files = Arc::new(crate::media::OutboxFiles::new(
        sender,
        Some(store.clone()),
        root,
    ));
    let media = IntakeMedia {
        stage,
        aliases,
        stop,
        delivery: delivery.clone(),
        store: store.clone(),
        files: files.clone(),
    };
    Ok((media, files))
}
