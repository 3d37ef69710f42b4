//! The intake's media step: what happens to a message that carries media
//! before it is handed to the adapter — prepare the files (see
//! [`crate::media::prepare`]), echo a transcript, or refuse with a clear
//! message and close the message's inbox rows — and the chat's
//! [`StageIo`]: the bridge from the chat's preparation stage
//! ([`crate::media::stage`]) to the engine.
//!
//! Each preparation runs in its own task (so neither the chat's later
//! commands nor another chat wait for a download), shows "typing…" while
//! it runs, and ends early when /stop, /new or /reset cancel it: its
//! message is then reported stopped (the user told, its inbox rows
//! closed), never dropped silently. A shutdown also ends it, but leaves
//! the message unfinished: the next start's recovery prepares it again. It
//! must never run a turn.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::TransportTables;
use crate::adapter::MessageHandler;
use crate::delivery::{ChatTarget, Delivery};
use crate::engine::Engine;
use crate::media::album::AlbumAliases;
use crate::media::prepare::Refusal;
use crate::media::stage::{lane_of, Lane, Preparation, StageIo};
use crate::media::MediaStage;
use crate::reply::Reply;
use crate::vocab::{InboxState, MessageEvent, SessionKey, SessionSource};

/// What a user is told about a message of theirs that /stop, /new or
/// /reset stopped while it was still being prepared.
pub const STOPPED_TEXT: &str =
    "⏹ Stopped before I finished reading this; send it again if you still need it.";

/// What a user is told when reading a message of theirs failed
/// unexpectedly (the detail is in the log).
pub const PREPARATION_FAILED_TEXT: &str =
    "⚠️ Something went wrong while I was reading this, so it was not passed on. Please send it again.";

/// What the chats' preparation stages need for media.
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
    pub store: TransportTables,
    /// Sends files; recovery sends what a restart left in an outbox.
    pub files: Arc<crate::media::OutboxFiles>,
}

/// Whether `event` goes through the media step.
pub fn has_media(event: &MessageEvent) -> bool {
    event.media.needs_preparing() || event.media.group.is_some()
}

/// The message ids an event stands for: its own and its album parts'.
fn ids_of(event: &MessageEvent) -> Vec<i64> {
    event
        .message_id
        .into_iter()
        .chain(event.media.merged.iter().copied())
        .collect()
}

impl IntakeMedia {
    /// Prepare `album` (one message, or an album already gathered).
    /// Returns the event to hand on, or says there is none: refused, or
    /// stopped by `cancel` (both reported), or cut short by the intake's
    /// stop (left for the next start).
    pub async fn prepare(
        &self,
        engine: &Engine,
        album: MessageEvent,
        cancel: CancellationToken,
    ) -> Preparation {
        let chat = album.source.chat_id;
        let first = album.message_id.unwrap_or_default();
        self.aliases.add(chat, first, &album.media.merged);
        let key = engine.adapter.session_key(&album.source);
        let original = album.clone();
        let reply_to = album.message_id;
        let target = ChatTarget::of(&album.source);
        let work = async {
            match engine.runner.resolve_session(&key).await {
                Ok(session) => {
                    let dir = self.stage.session_dir(session.as_str());
                    self.stage.prepare(album, &dir).await
                }
                Err(unavailable) => {
                    tracing::error!(error = %unavailable.0, "no session to keep a file in");
                    Err(Refusal(
                        "⚠️ I cannot keep files right now; please send it again in a moment."
                            .to_string(),
                    ))
                }
            }
        };
        let working = async {
            tokio::select! {
                prepared = work => prepared,
                never = keep_typing(&self.delivery, target) => match never {},
            }
        };
        let prepared = tokio::select! {
            biased;
            () = self.stop.cancelled() => return Preparation::Abandoned,
            () = cancel.cancelled() => {
                self.report_stopped(&original).await;
                return Preparation::Closed;
            }
            prepared = working => prepared,
        };
        match prepared {
            Ok(prepared) => {
                if let Some(echo) = prepared.echo {
                    self.echo_once(target, chat, reply_to, echo).await;
                }
                Preparation::Ready(prepared.event)
            }
            Err(refusal) => {
                tracing::info!(chat_id = chat, reason = %refusal.0, "media not read");
                let reply = Reply::notice(refusal.0).in_reply_to(reply_to);
                if let Err(error) = self.delivery.deliver_reply(target, &reply, None).await {
                    tracing::warn!(%error, "could not tell a user why their file was not read");
                }
                self.close(&original, "media not read").await;
                Preparation::Closed
            }
        }
    }

    /// `event` was stopped while (or right after) it was prepared: tell
    /// its sender and close its inbox rows.
    pub async fn report_stopped(&self, event: &MessageEvent) {
        tracing::info!(
            chat_id = event.source.chat_id,
            message_id = ?event.message_id,
            "a message being prepared was stopped"
        );
        let reply = Reply::notice(STOPPED_TEXT).in_reply_to(event.message_id);
        let target = ChatTarget::of(&event.source);
        if let Err(error) = self.delivery.deliver_reply(target, &reply, None).await {
            tracing::warn!(%error, "could not tell a user their message was stopped");
        }
        self.close(event, "stopped").await;
    }

    /// Preparing `event` failed unexpectedly (a bug, logged where it
    /// happened): its sender is asked to send it again and its rows are
    /// closed, so a restart does not run into the same failure again.
    pub async fn report_failed(&self, event: &MessageEvent) {
        let reply = Reply::notice(PREPARATION_FAILED_TEXT).in_reply_to(event.message_id);
        let target = ChatTarget::of(&event.source);
        if let Err(error) = self.delivery.deliver_reply(target, &reply, None).await {
            tracing::warn!(%error, "could not tell a user their message could not be read");
        }
        self.close(event, "its preparation failed").await;
    }

    /// `events` waited behind a preparation when a new session started:
    /// they belonged to the old one, like the adapter's queue. One notice
    /// tells their sender.
    pub async fn report_dropped(&self, events: &[MessageEvent]) {
        let Some(first) = events.first() else {
            return;
        };
        let n = events.len();
        let note = format!(
            "{n} message{} sent before the new session {} dropped; send {} again if still needed.",
            if n == 1 { "" } else { "s" },
            if n == 1 { "was" } else { "were" },
            if n == 1 { "it" } else { "them" },
        );
        let reply = Reply::notice(note).in_reply_to(first.message_id);
        if let Err(error) = self
            .delivery
            .deliver_reply(ChatTarget::of(&first.source), &reply, None)
            .await
        {
            tracing::warn!(%error, "could not tell a user their messages were dropped");
        }
        for event in events {
            self.close(event, "a new session started").await;
        }
    }

    /// Close every inbox row `event` stands for as dropped for `reason`.
    async fn close(&self, event: &MessageEvent, reason: &str) {
        let chat = event.source.chat_id;
        if let Some(first) = event.message_id {
            self.aliases.of(chat, first, true);
        }
        let changes = ids_of(event)
            .into_iter()
            .map(|id| (chat, id, InboxState::Dropped, Some(reason.to_string())))
            .collect();
        if let Err(error) = self.store.inbox.set_message_states(changes).await {
            tracing::error!(%error, "could not record a message state");
        }
    }
}

/// "typing…" in the chat while a preparation runs (first after the
/// delivery's typing delay, so a quick one shows none); through the
/// delivery engine, which sends it only when the chat's turn is free.
async fn keep_typing(delivery: &Delivery, target: ChatTarget) -> Infallible {
    let config = delivery.config();
    tokio::time::sleep(config.typing_delay).await;
    let every = config.typing_interval.max(Duration::from_millis(100));
    loop {
        delivery.typing(target).await;
        tokio::time::sleep(every).await;
    }
}

/// One chat's [`StageIo`]: events go to the engine's adapter, media is
/// prepared by [`IntakeMedia`].
pub struct ChatStage {
    engine: Engine,
    media: Arc<IntakeMedia>,
}

impl ChatStage {
    /// The stage I/O of a chat of `engine`.
    pub fn new(engine: Engine, media: Arc<IntakeMedia>) -> Self {
        ChatStage { engine, media }
    }
}

impl StageIo for ChatStage {
    fn slot(&self, event: &MessageEvent) -> SessionKey {
        self.engine.adapter.session_key(&event.source)
    }

    fn lane(&self, event: &MessageEvent) -> Lane {
        lane_of(event, has_media(event), || {
            let key = self.slot(event);
            self.engine.runner.claims_while_busy(&key, event)
        })
    }

    fn album_window(&self) -> Duration {
        Duration::from_millis(self.media.stage.config().album_window_ms)
    }

    fn prepare(
        self: Arc<Self>,
        event: MessageEvent,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Preparation> {
        Box::pin(async move { self.media.prepare(&self.engine, event, cancel).await })
    }

    fn report_stopped(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.media.report_stopped(&event).await })
    }

    fn report_failed(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.media.report_failed(&event).await })
    }

    fn report_dropped(self: Arc<Self>, events: Vec<MessageEvent>) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.media.report_dropped(&events).await })
    }

    fn hand_on(&self, event: MessageEvent) -> BoxFuture<'_, ()> {
        Box::pin(self.engine.adapter.handle_message(event))
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
                .file_sends
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
                        .file_sends
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
