//! Files out: the rules a file must pass, the record of sent files, and
//! the sending.
//!
//! Every file an agent wants sent — through the `send_file` tool or by
//! leaving it in `$TELEGATE_OUTBOX` ([`super::outbox_dir`]) — is opened
//! once, by handle, below its directory and through no link, and checked
//! on that handle ([`super::handle`]): a regular file with one link, not
//! empty, within Telegram's 50 MB upload cap, and readable by the
//! workspace's [`Reader`] when there is one (`run_as`). The upload reads
//! that same handle; the path is never opened again. Images (JPEG, PNG,
//! GIF, WebP up to 10 MB) go as photos, everything else as documents.
//!
//! Each sent file is recorded in the store under the message the turn
//! answers; a turn replayed after a restart finds the record and does not
//! send the file again. Like an answer, a file's send is recorded as
//! intended before its request: a restart that finds the intent without an
//! outcome does not send that file again (it may have arrived) and tells
//! the user ([`FileRefusal::Ambiguous`]); a send that failed for sure takes
//! its intent back. A file left unsent on purpose (/stop) is recorded as
//! withheld and never sent later.
//!
//! This module must never send a file outside the directory it was given,
//! never open a path again after its checks, and never fail a turn:
//! refusals are texts for the model or the user.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::handle::{self, OpenError, PathProblem, Reader, Unfit};
use super::{guess_mime, human_size, is_image_mime, PHOTO_UPLOAD_LIMIT, UPLOAD_LIMIT};
use crate::reply::DeliveryError;
use crate::store::{FileSend, FileSends};
use crate::vocab::SessionSource;

/// What an upload reads.
#[derive(Clone, Debug)]
pub enum FileBody {
    /// A file opened and checked by [`super::handle`] (read from the
    /// start on each attempt).
    Opened {
        /// The open file.
        file: Arc<std::fs::File>,
        /// Its size when it was checked.
        size: u64,
    },
    /// Bytes telegate made (an answer too long for messages).
    Bytes(bytes::Bytes),
}

impl FileBody {
    /// The size in bytes (sizes the upload's timeout).
    pub fn size(&self) -> u64 {
        match self {
            FileBody::Opened { size, .. } => *size,
            FileBody::Bytes(bytes) => bytes.len() as u64,
        }
    }
}

/// One file to send.
#[derive(Clone, Debug)]
pub struct OutgoingFile {
    /// The file's name in the chat.
    pub name: String,
    /// What is uploaded.
    pub body: FileBody,
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
    /// An absolute path outside the allowed directory.
    #[error("{0} is outside the workspace {1}; only files inside it can be sent")]
    Outside(String, String),
    /// It, or a directory on its way, is a symbolic link.
    #[error(
        "{0} is a symbolic link or inside one; only regular files inside the workspace can be sent"
    )]
    Link(String),
    /// It does not exist.
    #[error("{0} is not a file that exists")]
    Missing(String),
    /// A directory, FIFO, device...
    #[error("{0} is not a regular file")]
    NotAFile(String),
    /// It has other hard links (it may be another user's file).
    #[error("{0} has more than one hard link; only a file with a single link can be sent")]
    Linked(String),
    /// The user commands run as could not read it.
    #[error("{0} is not readable by the user commands run as, so it is not sent")]
    Unreadable(String),
    /// Empty files cannot be sent.
    #[error("{0} is empty; Telegram does not send empty files")]
    Empty(String),
    /// Above Telegram's upload cap.
    #[error("{0} is {1}, above Telegram's 50 MB upload limit")]
    TooBig(String, String),
    /// This answer already carries the most files it may.
    #[error("{1} was not sent: at most {0} files go with one answer")]
    TooMany(usize, String),
    /// Telegram refused or could not be reached.
    #[error("sending {0} failed: {1}")]
    Failed(String, String),
    /// Nothing to send with (no chat transport).
    #[error("files cannot be sent from here")]
    Unavailable,
    /// Its send was cut short (no answer from Telegram, or a restart): it
    /// may have arrived, so it is not sent again.
    #[error("{0}: its sending was cut short (Telegram did not answer, or telegate restarted), so it may not have arrived; it is not sent again")]
    Ambiguous(String),
}

/// The directory files may be sent from, and on whose behalf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
    reader: Option<Reader>,
}

impl Workspace {
    /// Files below `root` (the admin's path; made canonical here, once),
    /// sent only if `reader` (if any) could read them.
    pub fn new(root: &Path, reader: Option<Reader>) -> Workspace {
        Workspace {
            root: root.canonicalize().unwrap_or_else(|_| root.to_path_buf()),
            reader,
        }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// A file opened and checked, ready to send.
#[derive(Debug)]
pub struct OpenedFile {
    /// The open file.
    pub file: std::fs::File,
    /// Its size.
    pub size: u64,
    /// Its name (the last component).
    pub name: String,
}

/// The refusal for a handle that failed a check.
fn unfit(shown: String, why: Unfit) -> FileRefusal {
    match why {
        Unfit::NotAFile => FileRefusal::NotAFile(shown),
        Unfit::Linked => FileRefusal::Linked(shown),
        Unfit::Empty => FileRefusal::Empty(shown),
        Unfit::TooBig(size) => FileRefusal::TooBig(shown, human_size(size)),
        Unfit::Unreadable => FileRefusal::Unreadable(shown),
    }
}

/// The refusal for a path that could not be opened.
pub(crate) fn unopened(shown: String, why: OpenError) -> FileRefusal {
    match why {
        OpenError::Link => FileRefusal::Link(shown),
        OpenError::Missing => FileRefusal::Missing(shown),
        OpenError::Denied => FileRefusal::Unreadable(shown),
        OpenError::Io(error) => FileRefusal::Failed(shown, error.to_string()),
    }
}

/// Open `relative` below the open directory `dir` and check the handle
/// (`shown` names it in refusals).
pub(crate) fn open_checked(
    dir: std::os::fd::BorrowedFd<'_>,
    relative: &Path,
    shown: &str,
    reader: Option<Reader>,
) -> Result<OpenedFile, FileRefusal> {
    let fd = handle::open_file_beneath(dir, relative, reader)
        .map_err(|why| unopened(shown.to_string(), why))?;
    let facts = handle::Facts::of(fd.as_fd())
        .map_err(|error| FileRefusal::Failed(shown.to_string(), error.to_string()))?;
    handle::check_file(&facts, UPLOAD_LIMIT, reader)
        .map_err(|why| unfit(shown.to_string(), why))?;
    let name = relative
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(OpenedFile {
        file: std::fs::File::from(fd),
        size: facts.size,
        name,
    })
}

/// Open `requested` (relative to the workspace, or absolute inside it)
/// and check it; also returns the path below the root it names.
pub fn open_in(
    workspace: &Workspace,
    requested: &Path,
) -> Result<(OpenedFile, PathBuf), FileRefusal> {
    let shown = requested.display().to_string();
    let relative =
        handle::beneath(&workspace.root, requested).map_err(|problem| match problem {
            PathProblem::Climbs => FileRefusal::Climbs(shown.clone()),
            PathProblem::Outside => {
                FileRefusal::Outside(shown.clone(), workspace.root.display().to_string())
            }
            PathProblem::Nothing => FileRefusal::NotAFile(shown.clone()),
        })?;
    let root = handle::open_root(&workspace.root)
        .map_err(|why| unopened(workspace.root.display().to_string(), why))?;
    let opened = open_checked(root.as_fd(), &relative, &shown, workspace.reader)?;
    Ok((opened, relative))
}

/// What came of one send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// Sent now.
    Sent,
    /// Sent before (a replayed turn); not sent again.
    AlreadySent,
    /// Left unsent on purpose before (/stop); never sent.
    Withheld,
}

/// Sends checked files and keeps the record of what was sent.
pub struct OutboxFiles {
    sender: Arc<dyn FileSender>,
    pub(super) store: Option<FileSends>,
    pub(super) root: PathBuf,
    pub(super) max_files: usize,
}

impl std::fmt::Debug for OutboxFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxFiles")
            .field("root", &self.root)
            .field("max_files", &self.max_files)
            .finish_non_exhaustive()
    }
}

impl OutboxFiles {
    /// Sending through `sender`, recording in `store`; outbox directories
    /// live under `root` (`<data_dir>/media`). At most
    /// [`super::MediaConfig::max_files_per_answer`]'s default per answer
    /// (see [`OutboxFiles::with_max_files`]).
    pub fn new(
        sender: Arc<dyn FileSender>,
        store: Option<FileSends>,
        root: PathBuf,
    ) -> OutboxFiles {
        OutboxFiles {
            sender,
            store,
            root,
            max_files: super::DEFAULT_MAX_FILES_PER_ANSWER,
        }
    }

    /// At most `max` files per answer (`[media] max_files_per_answer`).
    pub fn with_max_files(mut self, max: usize) -> OutboxFiles {
        self.max_files = max.max(1);
        self
    }

    /// The most files one answer may carry.
    pub fn max_files(&self) -> usize {
        self.max_files
    }

    /// Send `requested` (inside `workspace`) to the chat of `to`.
    pub async fn send(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        workspace: &Workspace,
        requested: &Path,
        caption: Option<String>,
        key_prefix: &str,
    ) -> Result<SendOutcome, FileRefusal> {
        let (opened, relative) = open_in(workspace, requested)?;
        let key = format!("{key_prefix}{}", workspace.root.join(relative).display());
        self.send_opened(to, answering, opened, caption, key).await
    }

    /// Send a file already opened and checked, recorded under `key`.
    pub(crate) async fn send_opened(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        opened: OpenedFile,
        caption: Option<String>,
        key: String,
    ) -> Result<SendOutcome, FileRefusal> {
        let chat = to.chat_id;
        let name = opened.name.clone();
        let record = match (&self.store, answering) {
            (Some(store), Some(answering)) => Some((store, answering)),
            _ => None,
        };
        if let Some((store, answering)) = record {
            match store.file_send(chat, answering, key.clone()).await {
                Ok(Some(FileSend::Sent)) => return Ok(SendOutcome::AlreadySent),
                Ok(Some(FileSend::Withheld)) => return Ok(SendOutcome::Withheld),
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
        let as_photo = is_image_mime(&guess_mime(&name)) && opened.size <= PHOTO_UPLOAD_LIMIT;
        let file = OutgoingFile {
            name: name.clone(),
            body: FileBody::Opened {
                file: Arc::new(opened.file),
                size: opened.size,
            },
            as_photo,
            caption: caption.filter(|c| !c.trim().is_empty()),
            reply_to: answering,
        };
        let sent = self.sender.send_file(to, &file).await;
        let message_id = match sent {
            Ok(id) => id,
            Err(DeliveryError::Ambiguous(why)) => {
                // It may have arrived: the intent stays, so neither this
                // turn nor a replay of it sends the file again.
                tracing::warn!(file = %name, %why, "a file's send went unanswered; it is not sent again");
                return Err(FileRefusal::Ambiguous(name));
            }
            Err(error) => {
                // Not sent for sure: the intent is taken back, so a later
                // attempt may try again.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::Platform;
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    /// Counts sends; fails them while `failing` is set; checks that the
    /// intent of each send is recorded while its request is in flight;
    /// keeps what each upload read.
    struct CountingSender {
        store: Store,
        root: PathBuf,
        sends: AtomicUsize,
        failing: AtomicBool,
        unanswered: AtomicBool,
        intent_missing: AtomicBool,
        read: Mutex<Vec<Vec<u8>>>,
    }

    impl FileSender for CountingSender {
        fn send_file<'a>(
            &'a self,
            _to: &'a SessionSource,
            file: &'a OutgoingFile,
        ) -> BoxFuture<'a, Result<i64, DeliveryError>> {
            Box::pin(async move {
                let key = format!("outbox:{}", self.root.join(&file.name).display());
                let recorded = self.store.file_sends().file_send(5, 9, key).await;
                if !matches!(recorded, Ok(Some(FileSend::Ambiguous))) {
                    self.intent_missing.store(true, Ordering::SeqCst);
                }
                if let FileBody::Opened { file, .. } = &file.body {
                    let mut bytes = Vec::new();
                    (&**file).read_to_end(&mut bytes).unwrap();
                    self.read.lock().unwrap().push(bytes);
                }
                if self.failing.load(Ordering::SeqCst) {
                    return Err(DeliveryError::Rejected("refused".into()));
                }
                if self.unanswered.load(Ordering::SeqCst) {
                    self.sends.fetch_add(1, Ordering::SeqCst);
                    return Err(DeliveryError::Ambiguous("no answer".into()));
                }
                Ok(100 + self.sends.fetch_add(1, Ordering::SeqCst) as i64)
            })
        }
    }

    fn counting(store: &Store, root: &Path) -> Arc<CountingSender> {
        Arc::new(CountingSender {
            store: store.clone(),
            root: root.to_path_buf(),
            sends: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            unanswered: AtomicBool::new(false),
            intent_missing: AtomicBool::new(false),
            read: Mutex::new(Vec::new()),
        })
    }

    #[tokio::test]
    async fn a_file_is_sent_once_and_a_send_cut_short_is_not_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for name in ["a.txt", "b.txt", "c.txt"] {
            std::fs::write(root.join(name), b"x").unwrap();
        }
        let store = Store::open_in_memory().unwrap();
        let sender = counting(&store, &root);
        let files = OutboxFiles::new(sender.clone(), Some(store.file_sends()), root.clone());
        let workspace = Workspace::new(&root, None);
        let to = SessionSource::dm(Platform::Telegram, 5);
        let send = |name: &'static str| {
            files.send(&to, Some(9), &workspace, Path::new(name), None, "outbox:")
        };
        assert_eq!(send("a.txt").await, Ok(SendOutcome::Sent));
        assert_eq!(send("a.txt").await, Ok(SendOutcome::AlreadySent));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 1);

        // An earlier process recorded the intent to send b.txt and died
        // before its outcome: b.txt may be in the chat; it is not resent.
        let key = format!("outbox:{}", root.join("b.txt").display());
        store
            .file_sends()
            .record_file_sending(5, 9, key)
            .await
            .unwrap();
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

        // A send Telegram never answered may have arrived: its intent
        // stays, and the file is not sent again (not by a replay either).
        std::fs::write(root.join("d.txt"), b"x").unwrap();
        sender.unanswered.store(true, Ordering::SeqCst);
        assert!(matches!(
            send("d.txt").await,
            Err(FileRefusal::Ambiguous(_))
        ));
        sender.unanswered.store(false, Ordering::SeqCst);
        assert_eq!(sender.sends.load(Ordering::SeqCst), 3);
        assert!(matches!(
            send("d.txt").await,
            Err(FileRefusal::Ambiguous(_))
        ));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 3);
        assert!(
            !sender.intent_missing.load(Ordering::SeqCst),
            "a file was sent with no intent recorded"
        );

        // A file withheld by /stop is never sent.
        let key = format!("outbox:{}", root.join("a.txt").display());
        store
            .file_sends()
            .record_files_withheld(5, 10, vec![key])
            .await
            .unwrap();
        let again = files
            .send(
                &to,
                Some(10),
                &workspace,
                Path::new("a.txt"),
                None,
                "outbox:",
            )
            .await;
        assert_eq!(again, Ok(SendOutcome::Withheld));
        assert_eq!(sender.sends.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn the_upload_reads_the_handle_that_was_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("a.txt"), b"checked").unwrap();
        let store = Store::open_in_memory().unwrap();
        let sender = counting(&store, &root);
        let files = OutboxFiles::new(sender.clone(), Some(store.file_sends()), root.clone());
        let workspace = Workspace::new(&root, None);
        let (opened, relative) = open_in(&workspace, Path::new("a.txt")).unwrap();
        // Swapped after the check: the upload still reads what was checked.
        std::fs::remove_file(root.join("a.txt")).unwrap();
        std::fs::write(root.join("a.txt"), b"swapped").unwrap();
        let key = format!("outbox:{}", root.join(relative).display());
        let to = SessionSource::dm(Platform::Telegram, 5);
        let sent = files.send_opened(&to, Some(9), opened, None, key).await;
        assert_eq!(sent, Ok(SendOutcome::Sent));
        assert_eq!(*sender.read.lock().unwrap(), vec![b"checked".to_vec()]);
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
        std::os::unix::fs::symlink(root.join("ok.txt"), root.join("inside.txt")).unwrap();
        std::fs::hard_link(dir.path().join("secret.txt"), root.join("hard.txt")).unwrap();
        let ws = Workspace::new(&root, None);
        let open = |p: &Path| open_in(&ws, p).map(|(o, _)| o.size);

        assert_eq!(open(Path::new("ok.txt")), Ok(1));
        assert_eq!(open(&root.join("ok.txt")), Ok(1));
        let refused = [
            ("../secret.txt", "Climbs"),
            ("link.txt", "Link"),
            ("inside.txt", "Link"),
            ("hard.txt", "Linked"),
            ("empty.txt", "Empty"),
            ("nope.txt", "Missing"),
            (".", "NotAFile"),
        ];
        for (path, why) in refused {
            let refusal = open(Path::new(path)).unwrap_err();
            assert!(
                format!("{refusal:?}").starts_with(why),
                "{path}: {refusal:?}"
            );
        }
        assert!(matches!(
            open(&dir.path().join("secret.txt")),
            Err(FileRefusal::Outside(..))
        ));
    }

    #[test]
    fn with_a_reader_a_file_only_root_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("private"), b"s").unwrap();
        std::fs::set_permissions(root.join("private"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::write(root.join("public"), b"p").unwrap();
        std::fs::set_permissions(root.join("public"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        // SAFETY: no preconditions.
        let me = unsafe { libc::geteuid() };
        let stranger = Reader {
            uid: me.wrapping_add(4242),
            gid: 4242,
        };
        let ws = Workspace::new(&root, Some(stranger));
        assert!(matches!(
            open_in(&ws, Path::new("private")),
            Err(FileRefusal::Unreadable(_))
        ));
        assert!(open_in(&ws, Path::new("public")).is_ok());
    }
}
