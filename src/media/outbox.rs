//! Files out: the path rules, the record of sent files, and the sending.
//!
//! Every file an agent wants sent — through the `send_file` tool or by
//! leaving it in `$TELEGATE_OUTBOX` — goes through [`confine`]: the path
//! may not contain `..`, must resolve (symlinks followed) inside the
//! allowed directory, must be a regular, non-empty file within Telegram's
//! 50 MB upload cap. Images (JPEG, PNG, GIF, WebP up to 10 MB) go as
//! photos, everything else as documents.
//!
//! Each sent file is recorded in the store under the message the turn
//! answers; a turn replayed after a restart finds the record and does not
//! send the file again. The outbox directory of a turn is found from its
//! chat and message alone (`<media>/outbox/<chat>/<message>`), so a restart
//! between the answer and its files sends the files not yet recorded
//! ([`OutboxFiles::send_leftovers`], called by the intake's recovery).
//! Like an answer, a file's send is recorded as intended before its
//! request: a restart that finds the intent without an outcome does not
//! send that file again (it may have arrived) and tells the user
//! ([`FileRefusal::Ambiguous`]); a send that failed for sure takes its
//! intent back.
//!
//! This module must never send a file outside the directory it was given,
//! and never fail a turn: refusals are texts for the model or the user.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::event::SessionSource;
use crate::reply::{DeliveryError, LiveReply, Outbound, Reply};
use crate::store::{FileSend, Store};

use super::{guess_mime, human_size, is_image_mime, TurnFiles, PHOTO_UPLOAD_LIMIT, UPLOAD_LIMIT};

/// One file to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutgoingFile {
    /// The confined, canonical path.
    pub path: PathBuf,
    /// Send it as a photo (else as a document).
    pub as_photo: bool,
    /// The caption, if any.
    pub caption: Option<String>,
    /// The message it answers (quoted when positive).
    pub reply_to: Option<i64>,
}

/// Sends files to a chat (Telegram's sendPhoto/sendDocument; a recorder in
/// tests).
pub trait FileSender: Send + Sync + 'static {
    /// Send `file` to the chat of `to`; the sent message's id.
    fn send_file<'a>(
        &'a self,
        to: &'a SessionSource,
        file: &'a OutgoingFile,
    ) -> BoxFuture<'a, Result<i64, DeliveryError>>;
}

/// Why a file was not sent. The text is shown to the model or the user.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FileRefusal {
    /// The path climbs out with `..`.
    #[error("the path {0} contains `..`; give a path inside the workspace")]
    Climbs(String),
    /// It resolves outside the allowed directory (directly or by symlink).
    #[error("{0} is outside the workspace {1}; only files inside it can be sent")]
    Outside(String, String),
    /// It does not exist or is no regular file.
    #[error("{0} is not a file that exists")]
    Missing(String),
    /// Empty files cannot be sent.
    #[error("{0} is empty; Telegram does not send empty files")]
    Empty(String),
    /// Above Telegram's upload cap.
    #[error("{0} is {1}, above Telegram's 50 MB upload limit")]
    TooBig(String, String),
    /// Telegram refused or could not be reached.
    #[error("sending {0} failed: {1}")]
    Failed(String, String),
    /// Nothing to send with (no chat transport).
    #[error("files cannot be sent from here")]
    Unavailable,
    /// A restart cut its send short: it may have arrived, so it is not
    /// sent again.
    #[error("{0}: telegate restarted while sending it, so it may not have arrived; it is not sent again")]
    Ambiguous(String),
}

/// The canonical path of `requested` (relative to `root`, or absolute)
/// if it is a regular file inside `root`, within the limits.
pub fn confine(root: &Path, requested: &Path) -> Result<(PathBuf, u64), FileRefusal> {
    let shown = requested.display().to_string();
    if requested
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(FileRefusal::Climbs(shown));
    }
    let root = root
        .canonicalize()
        .map_err(|_| FileRefusal::Missing(root.display().to_string()))?;
    let joined = if requested.is_absolute() {
        requested.to_path_buf()
    } else {
        root.join(requested)
    };
    let real = joined
        .canonicalize()
        .map_err(|_| FileRefusal::Missing(shown.clone()))?;
    if !real.starts_with(&root) {
        return Err(FileRefusal::Outside(shown, root.display().to_string()));
    }
    let meta = std::fs::metadata(&real).map_err(|_| FileRefusal::Missing(shown.clone()))?;
    if !meta.is_file() {
        return Err(FileRefusal::Missing(shown));
    }
    if meta.len() == 0 {
        return Err(FileRefusal::Empty(shown));
    }
    if meta.len() > UPLOAD_LIMIT {
        return Err(FileRefusal::TooBig(shown, human_size(meta.len())));
    }
    Ok((real, meta.len()))
}

/// What came of one send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// Sent now.
    Sent,
    /// Sent before (a replayed turn); not sent again.
    AlreadySent,
}

/// Sends confined files and keeps the record of what was sent.
pub struct OutboxFiles {
    sender: Arc<dyn FileSender>,
    store: Option<Store>,
    root: PathBuf,
}

impl std::fmt::Debug for OutboxFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxFiles")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl OutboxFiles {
    /// Sending through `sender`, recording in `store`; outbox directories
    /// live under `root` (`<data_dir>/media`).
    pub fn new(sender: Arc<dyn FileSender>, store: Option<Store>, root: PathBuf) -> OutboxFiles {
        OutboxFiles {
            sender,
            store,
            root,
        }
    }

    /// Where the outbox of the turn answering `answering` in `chat` lives:
    /// `<root>/outbox/<chat>/<message id>` (`t<ms>` without a message), so
    /// a restart finds the directory of a message from the message alone.
    fn dir_of(&self, chat: i64, answering: Option<i64>) -> PathBuf {
        let name = match answering {
            Some(id) => id.to_string(),
            None => format!("t{}", crate::store::now_ms()),
        };
        self.root
            .join("outbox")
            .join(super::safe_component(&chat.to_string()))
            .join(super::safe_component(&name))
    }

    /// A fresh, empty outbox directory for the turn answering `answering`
    /// in `chat` (None if it cannot be made).
    pub async fn outbox_dir(&self, chat: i64, answering: Option<i64>) -> Option<PathBuf> {
        let dir = self.dir_of(chat, answering);
        // A replayed turn starts with an empty outbox: what its first run
        // left there was either sent (recorded) or is made again.
        let _ = tokio::fs::remove_dir_all(&dir).await;
        match crate::private_fs::create_private_dir(&dir).await {
            Ok(()) => Some(dir),
            Err(error) => {
                tracing::warn!(%error, "could not create the turn's outbox directory");
                None
            }
        }
    }

    /// Send `requested` (inside `root`) to the chat of `to`.
    pub async fn send(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        root: &Path,
        requested: &Path,
        caption: Option<String>,
        key_prefix: &str,
    ) -> Result<SendOutcome, FileRefusal> {
        let (path, size) = confine(root, requested)?;
        let key = format!("{key_prefix}{}", path.display());
        let chat = to.chat_id;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let record = match (&self.store, answering) {
            (Some(store), Some(answering)) => Some((store, answering)),
            _ => None,
        };
        if let Some((store, answering)) = record {
            match store.file_send(chat, answering, key.clone()).await {
                Ok(Some(FileSend::Sent)) => return Ok(SendOutcome::AlreadySent),
                Ok(Some(FileSend::Ambiguous)) => return Err(FileRefusal::Ambiguous(name)),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "could not read the record of sent files"),
            }
            // Durable before the request, like an answer's intent: a
            // restart that finds it without an outcome does not send the
            // file again.
            if let Err(error) = store
                .record_file_sending(chat, answering, key.clone())
                .await
            {
                tracing::warn!(%error, "could not record the intent to send a file");
            }
        }
        let as_photo = is_image_mime(&guess_mime(&name)) && size <= PHOTO_UPLOAD_LIMIT;
        let file = OutgoingFile {
            path,
            as_photo,
            caption: caption.filter(|c| !c.trim().is_empty()),
            reply_to: answering,
        };
        let sent = self.sender.send_file(to, &file).await;
        let message_id = match sent {
            Ok(id) => id,
            Err(error) => {
                // Not sent (or not known to be): the intent is taken back,
                // so a later attempt may try again.
                if let Some((store, answering)) = record {
                    if let Err(error) = store.forget_file_send(chat, answering, key).await {
                        tracing::warn!(%error, "could not take back the intent to send a file");
                    }
                }
                return Err(FileRefusal::Failed(name, error.to_string()));
            }
        };
        if let Some((store, answering)) = record {
            if let Err(error) = store
                .record_file_sent(chat, answering, key, message_id)
                .await
            {
                tracing::error!(%error, "could not record a sent file");
            }
        }
        Ok(SendOutcome::Sent)
    }

    /// After a restart: the answer to `answering` went out but the process
    /// died before the files its turn left in the outbox were all sent.
    /// Sends those not recorded as sent (each once), then reports refusals
    /// like [`files_after_answer`]. Nothing happens if the turn left no
    /// outbox directory.
    pub async fn send_leftovers(
        &self,
        outbound: &dyn Outbound,
        to: &SessionSource,
        answering: i64,
    ) -> usize {
        let dir = self.dir_of(to.chat_id, Some(answering));
        if !tokio::fs::try_exists(&dir).await.unwrap_or(false) {
            return 0;
        }
        let (sent, problems) = self.send_dir_counted(to, Some(answering), &dir).await;
        if sent > 0 {
            tracing::info!(
                chat_id = to.chat_id,
                message_id = answering,
                sent,
                "sent outbox files left unsent by the restart"
            );
        }
        report_unsent(outbound, to, Some(answering), problems).await;
        sent
    }

    /// Send every regular file in `dir` (by name order); returns the
    /// refusals as lines for the user.
    pub async fn send_dir(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        dir: &Path,
    ) -> Vec<String> {
        self.send_dir_counted(to, answering, dir).await.1
    }

    /// [`OutboxFiles::send_dir`], also counting the files sent now.
    async fn send_dir_counted(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        dir: &Path,
    ) -> (usize, Vec<String>) {
        let mut names = Vec::new();
        if let Ok(mut entries) = tokio::fs::read_dir(dir).await {
            while let Ok(Some(entry)) = entries.next_entry().await {
                names.push(PathBuf::from(entry.file_name()));
            }
        }
        names.sort();
        let mut problems = Vec::new();
        let mut sent = 0;
        for name in names {
            match self.send(to, answering, dir, &name, None, "outbox:").await {
                Ok(SendOutcome::Sent) => sent += 1,
                Ok(SendOutcome::AlreadySent) => {}
                Err(refusal) => problems.push(refusal.to_string()),
            }
        }
        (sent, problems)
    }
}

/// Tell the user which files were not sent (nothing if none).
async fn report_unsent(
    outbound: &dyn Outbound,
    to: &SessionSource,
    answering: Option<i64>,
    problems: Vec<String>,
) {
    if problems.is_empty() {
        return;
    }
    let text = format!("📎 Some files were not sent:\n{}", problems.join("\n"));
    let notice = Reply::notice(text).in_reply_to(answering);
    if let Err(error) = outbound.deliver(to, notice).await {
        tracing::warn!(%error, "could not report unsent files");
    }
}

/// The turn's live reply, finished first; then the files its program left
/// in the outbox are sent (after the answer, as promised).
pub fn files_after_answer(
    live: Option<Box<dyn LiveReply>>,
    files: &TurnFiles,
    outbound: Arc<dyn Outbound>,
    source: SessionSource,
) -> Option<Box<dyn LiveReply>> {
    let (Some(dir), Some(sender)) = (files.outbox.clone(), files.sender.clone()) else {
        return live;
    };
    Some(Box::new(FilesAfter {
        inner: live,
        outbound,
        source,
        dir,
        sender,
        answering: files.answering,
    }))
}

struct FilesAfter {
    inner: Option<Box<dyn LiveReply>>,
    outbound: Arc<dyn Outbound>,
    source: SessionSource,
    dir: PathBuf,
    sender: Arc<OutboxFiles>,
    answering: Option<i64>,
}

impl LiveReply for FilesAfter {
    fn finish(self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        Box::pin(async move {
            let this = *self;
            match this.inner {
                Some(live) => live.finish(reply).await,
                None => this.outbound.deliver(&this.source, reply).await,
            }?;
            let problems = this
                .sender
                .send_dir(&this.source, this.answering, &this.dir)
                .await;
            report_unsent(
                this.outbound.as_ref(),
                &this.source,
                this.answering,
                problems,
            )
            .await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Platform;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Counts sends; fails them while `failing` is set; checks that the
    /// intent of each send is recorded while its request is in flight.
    struct CountingSender {
        store: Store,
        sends: AtomicUsize,
        failing: AtomicBool,
        intent_missing: AtomicBool,
    }

    impl FileSender for CountingSender {
        fn send_file<'a>(
            &'a self,
            _to: &'a SessionSource,
            file: &'a OutgoingFile,
        ) -> BoxFuture<'a, Result<i64, DeliveryError>> {
            Box::pin(async move {
                let key = format!("outbox:{}", file.path.display());
                let recorded = self.store.file_send(5, 9, key).await;
                if !matches!(recorded, Ok(Some(FileSend::Ambiguous))) {
                    self.intent_missing.store(true, Ordering::SeqCst);
                }
                if self.failing.load(Ordering::SeqCst) {
                    return Err(DeliveryError::Rejected("refused".into()));
                }
                Ok(100 + self.sends.fetch_add(1, Ordering::SeqCst) as i64)
            })
        }
    }

    #[tokio::test]
    async fn a_file_is_sent_once_and_a_send_cut_short_is_not_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for name in ["a.txt", "b.txt", "c.txt"] {
            std::fs::write(root.join(name), b"x").unwrap();
        }
        let store = Store::open_in_memory().unwrap();
        let sender = Arc::new(CountingSender {
            store: store.clone(),
            sends: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            intent_missing: AtomicBool::new(false),
        });
        let files = OutboxFiles::new(sender.clone(), Some(store.clone()), root.clone());
        let to = SessionSource::dm(Platform::Telegram, 5);
        let send =
            |name: &'static str| files.send(&to, Some(9), &root, Path::new(name), None, "outbox:");
        assert_eq!(send("a.txt").await, Ok(SendOutcome::Sent));
        assert_eq!(send("a.txt").await, Ok(SendOutcome::AlreadySent));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 1);

        // An earlier process recorded the intent to send b.txt and died
        // before its outcome: b.txt may be in the chat; it is not resent.
        let key = format!("outbox:{}", root.join("b.txt").display());
        store.record_file_sending(5, 9, key).await.unwrap();
        assert!(matches!(
            send("b.txt").await,
            Err(FileRefusal::Ambiguous(_))
        ));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 1);

        // A send that fails for sure takes its intent back: it may be
        // tried again.
        sender.failing.store(true, Ordering::SeqCst);
        assert!(matches!(send("c.txt").await, Err(FileRefusal::Failed(..))));
        sender.failing.store(false, Ordering::SeqCst);
        assert_eq!(send("c.txt").await, Ok(SendOutcome::Sent));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 2);
        assert!(
            !sender.intent_missing.load(Ordering::SeqCst),
            "a file was sent with no intent recorded"
        );
    }

    #[test]
    fn paths_are_confined_to_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("ok.txt"), b"x").unwrap();
        std::fs::write(root.join("empty.txt"), b"").unwrap();
        std::fs::write(dir.path().join("secret.txt"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("link.txt")).unwrap();

        assert!(confine(&root, Path::new("ok.txt")).is_ok());
        assert!(confine(&root, &root.join("ok.txt")).is_ok());
        assert!(matches!(
            confine(&root, Path::new("../secret.txt")),
            Err(FileRefusal::Climbs(_))
        ));
        assert!(matches!(
            confine(&root, Path::new("link.txt")),
            Err(FileRefusal::Outside(..))
        ));
        assert!(matches!(
            confine(&root, &dir.path().join("secret.txt")),
            Err(FileRefusal::Outside(..))
        ));
        assert!(matches!(
            confine(&root, Path::new("empty.txt")),
            Err(FileRefusal::Empty(_))
        ));
        assert!(matches!(
            confine(&root, Path::new("nope.txt")),
            Err(FileRefusal::Missing(_))
        ));
        assert!(matches!(
            confine(&root, Path::new(".")),
            Err(FileRefusal::Missing(_))
        ));
    }
}
