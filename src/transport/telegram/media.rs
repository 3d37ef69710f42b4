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

/// The media directory of a bot with an in-memory store: a fresh directory
/// under the system's temporary directory that lives exactly as long as
/// this value (the bot), so nothing is left behind in `/tmp`.
#[derive(Debug)]
pub struct ScratchMediaDir(std::path::PathBuf);

impl ScratchMediaDir {
    /// Create a directory of our own (never one that already exists: bots
    /// in one process each get theirs), mode 0700.
    pub fn create() -> std::io::Result<ScratchMediaDir> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let pid = std::process::id();
        let mut attempt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let path = base.join(format!("telegate-media-{pid}-{attempt:08x}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(ScratchMediaDir(path)),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    attempt = attempt.wrapping_add(1);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchMediaDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0) {
            tracing::debug!(dir = %self.0.display(), %error, "could not remove the scratch media directory");
        }
    }
}

/// The media step and the file output of a Telegram bot, from the config.
/// Saved files go to `<data_dir>/media`; with an in-memory store, to a
/// [`ScratchMediaDir`] returned for the bot to keep.
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
) -> Result<
    (
        IntakeMedia,
        Arc<crate::media::OutboxFiles>,
        Option<ScratchMediaDir>,
    ),
    String,
> {
    use crate::config::Backend;
    use crate::media::prepare::ImageMode;
    let images = match config.agent.backend {
        Backend::Openai if config.agent.openai.as_ref().is_some_and(|o| o.vision) => {
            ImageMode::Vision
        }
        Backend::Openai => ImageMode::Refuse,
        _ => ImageMode::Path,
    };
    let scratch = if config.store.in_memory {
        Some(
            ScratchMediaDir::create()
                .map_err(|error| format!("could not create a media directory: {error}"))?,
        )
    } else {
        None
    };
    let root = match &scratch {
        Some(scratch) => scratch.path().to_path_buf(),
        None => crate::media::media_root(&config.store.data_dir),
    };
    let downloader = crate::media::download::Downloader::new(bot.clone(), api_url, token)?;
    let stage = MediaStage::new(config.media.clone(), root.clone(), downloader, images)?
        .with_file_access(crate::media::FileAccess::for_config(config));
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
    Ok((media, files, scratch))
}

#[cfg(test)]
mod tests {
    use super::ScratchMediaDir;

    #[test]
    fn each_scratch_media_dir_is_new_private_and_removed_with_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let first = ScratchMediaDir::create().unwrap();
        let second = ScratchMediaDir::create().unwrap();
        assert_ne!(first.path(), second.path(), "two bots share no directory");
        let mode = std::fs::metadata(first.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::create_dir_all(first.path().join("123/456")).unwrap();
        std::fs::write(first.path().join("123/456/photo.jpg"), b"x").unwrap();
        let path = first.path().to_path_buf();
        drop(first);
        assert!(!path.exists(), "removed with everything in it");
        assert!(second.path().is_dir(), "the other bot's directory stays");
    }
}
