//! A turn's outbox directory (`$TELEGATE_OUTBOX` of the command backend):
//! where it lives, and sending what the program left there after the
//! answer.
//!
//! The directory of a turn is found from its chat and message alone
//! (`<media>/outbox/<chat>/<message>`), so a restart between the answer
//! and its files sends the files not yet recorded
//! ([`OutboxFiles::send_leftovers`], called by the intake's recovery).
//!
//! A batch opens the directory once, by handle, below the media root and
//! through no link (a directory the program replaced by a link is refused
//! whole), lists it from that handle and opens each file below it
//! ([`super::handle`]). At most `max_files_per_answer` files go with one
//! answer (those the `send_file` tool sent count too); the rest are
//! reported in one line. /stop during a batch ends it: the files not sent
//! are recorded as withheld (a restart does not send them) and counted for
//! the stop's report ([`crate::reply::SendingStop`]).
//!
//! This module must never send a file from outside the turn's directory,
//! and never send a file a stop withheld.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::handle::{self, OpenError};
use super::outbox::{open_checked, OutboxFiles, SendOutcome};
use super::{FileCount, TurnFiles};
use crate::reply::{DeliveryError, LiveReply, Outbound, Reply, SendingStop};
use crate::vocab::SessionSource;

/// What one batch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Files sent now.
    pub sent: usize,
    /// Refusals and failures, one line each, for the user.
    pub problems: Vec<String>,
    /// Files left out because the answer carried the most it may.
    pub over_limit: usize,
    /// Files left out by a stop.
    pub stopped: usize,
}

/// What to do with the next file of a batch (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send it.
    Send,
    /// Leave it and the rest out: the sending was stopped.
    Stopped,
    /// Leave it out: the answer carries `max` files already.
    OverLimit,
}

/// The next step for a batch that was `stopped` or not, with `carried`
/// files sent for this answer so far and at most `max` allowed.
pub fn next_step(stopped: bool, carried: usize, max: usize) -> Step {
    if stopped {
        Step::Stopped
    } else if carried >= max {
        Step::OverLimit
    } else {
        Step::Send
    }
}

/// The line for files left out over the limit (none if none).
pub fn over_limit_line(left_out: usize, max: usize) -> Option<String> {
    match left_out {
        0 => None,
        1 => Some(format!(
            "1 more file was not sent: at most {max} go with one answer"
        )),
        n => Some(format!(
            "{n} more files were not sent: at most {max} go with one answer"
        )),
    }
}

impl OutboxFiles {
    /// `<root>/outbox/<chat>/<message id>` below the media root (`t<ms>`
    /// without a message), so a restart finds the directory of a message
    /// from the message alone.
    fn relative_dir_of(chat: i64, answering: Option<i64>) -> PathBuf {
        let name = match answering {
            Some(id) => id.to_string(),
            None => format!("t{}", crate::store::now_ms()),
        };
        PathBuf::from("outbox")
            .join(super::safe_component(&chat.to_string()))
            .join(super::safe_component(&name))
    }

    /// A fresh, empty outbox directory for the turn answering `answering`
    /// in `chat` (None if it cannot be made).
    pub async fn outbox_dir(&self, chat: i64, answering: Option<i64>) -> Option<PathBuf> {
        let dir = self.root.join(Self::relative_dir_of(chat, answering));
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

    /// After a restart: the answer to `answering` went out but the process
    /// died before the files its turn left in the outbox were all sent.
    /// Sends those not recorded (each once, within the limit), then
    /// reports refusals like [`files_after_answer`]. Nothing happens if
    /// the turn left no outbox directory.
    pub async fn send_leftovers(
        &self,
        outbound: &dyn Outbound,
        to: &SessionSource,
        answering: i64,
    ) -> usize {
        let dir = self
            .root
            .join(Self::relative_dir_of(to.chat_id, Some(answering)));
        if !tokio::fs::try_exists(&dir).await.unwrap_or(false) {
            return 0;
        }
        let report = self
            .send_batch(to, Some(answering), &dir, None, &FileCount::default())
            .await;
        if report.sent > 0 {
            tracing::info!(
                chat_id = to.chat_id,
                message_id = answering,
                sent = report.sent,
                "sent outbox files left unsent by the restart"
            );
        }
        let sent = report.sent;
        report_unsent(outbound, to, Some(answering), self.max_files, report).await;
        sent
    }

    /// Send the regular files of the outbox directory `dir` (by name
    /// order) while `stop` has not fired and the answer carries fewer
    /// than the most files allowed (`carried` counts them, the tool's
    /// too).
    pub async fn send_batch(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        dir: &Path,
        stop: Option<&SendingStop>,
        carried: &FileCount,
    ) -> BatchReport {
        let mut report = BatchReport::default();
        let Some((dir_fd, key_dir)) = self.open_outbox(dir, &mut report) else {
            return report;
        };
        let names = match handle::list(dir_fd.as_fd()) {
            Ok(names) => names,
            Err(error) => {
                tracing::warn!(%error, "could not list the turn's outbox");
                return report;
            }
        };
        let mut withheld = Vec::new();
        for name in names {
            let step = next_step(
                stop.is_some_and(SendingStop::is_stopped),
                carried.get(),
                self.max_files,
            );
            let key = format!("outbox:{}", key_dir.join(&name).display());
            match step {
                Step::Stopped => {
                    withheld.push(key);
                    continue;
                }
                Step::OverLimit => {
                    report.over_limit += 1;
                    continue;
                }
                Step::Send => {}
            }
            let opened = match open_checked(dir_fd.as_fd(), Path::new(&name), &name, None) {
                Ok(opened) => opened,
                Err(refusal) => {
                    report.problems.push(refusal.to_string());
                    continue;
                }
            };
            match self.send_opened(to, answering, opened, None, key).await {
                Ok(SendOutcome::Sent) => {
                    report.sent += 1;
                    carried.add();
                }
                Ok(SendOutcome::AlreadySent) => carried.add(),
                Ok(SendOutcome::Withheld) => {}
                Err(refusal) => {
                    carried.add();
                    report.problems.push(refusal.to_string());
                }
            }
        }
        report.stopped = withheld.len();
        self.withhold(to.chat_id, answering, withheld).await;
        report
    }

    /// The outbox directory opened by handle below the media root, and
    /// the directory its files' records are keyed by (None: nothing to
    /// send, a problem noted if the directory was replaced).
    fn open_outbox(
        &self,
        dir: &Path,
        report: &mut BatchReport,
    ) -> Option<(std::os::fd::OwnedFd, PathBuf)> {
        let relative = dir.strip_prefix(&self.root).ok()?;
        let opened = handle::open_root(&self.root)
            .and_then(|root| handle::open_dir_beneath(root.as_fd(), relative, None));
        match opened {
            Ok(fd) => {
                let root = self
                    .root
                    .canonicalize()
                    .unwrap_or_else(|_| self.root.clone());
                Some((fd, root.join(relative)))
            }
            Err(OpenError::Missing) => None,
            Err(OpenError::Link) => {
                tracing::warn!(dir = %dir.display(), "the turn's outbox was replaced by a link; nothing sent from it");
                report.problems.push(
                    "the outbox directory was replaced by a link, so none of its files were sent"
                        .to_string(),
                );
                None
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), ?error, "could not open the turn's outbox");
                None
            }
        }
    }

    /// Record `keys` as withheld (a stop left them unsent): never sent
    /// later, not even by a restart.
    async fn withhold(&self, chat: i64, answering: Option<i64>, keys: Vec<String>) {
        let (Some(store), Some(answering), false) = (&self.store, answering, keys.is_empty())
        else {
            return;
        };
        if let Err(error) = store.record_files_withheld(chat, answering, keys).await {
            tracing::error!(%error, "could not record the files a stop left unsent");
        }
    }
}

/// Tell the user which files were not sent (nothing if none): refusals
/// and the files over the limit, in one message.
async fn report_unsent(
    outbound: &dyn Outbound,
    to: &SessionSource,
    answering: Option<i64>,
    max_files: usize,
    report: BatchReport,
) {
    let mut lines = report.problems;
    if let Some(line) = over_limit_line(report.over_limit, max_files) {
        tracing::info!(
            chat_id = to.chat_id,
            left_out = report.over_limit,
            max_files,
            "outbox files over [media] max_files_per_answer were not sent"
        );
        lines.push(line);
    }
    if lines.is_empty() {
        return;
    }
    let text = format!("📎 Some files were not sent:\n{}", lines.join("\n"));
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
        carried: files.carried.clone(),
    }))
}

struct FilesAfter {
    inner: Option<Box<dyn LiveReply>>,
    outbound: Arc<dyn Outbound>,
    source: SessionSource,
    dir: PathBuf,
    sender: Arc<OutboxFiles>,
    answering: Option<i64>,
    carried: FileCount,
}

impl LiveReply for FilesAfter {
    fn finish(self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        // Read here, inside the sending's scope: the future may be polled
        // elsewhere.
        let stop = SendingStop::current();
        if let Some(stop) = &stop {
            stop.expect_files();
        }
        Box::pin(async move {
            let this = *self;
            match this.inner {
                Some(live) => live.finish(reply).await,
                None => this.outbound.deliver(&this.source, reply).await,
            }?;
            let report = this
                .sender
                .send_batch(
                    &this.source,
                    this.answering,
                    &this.dir,
                    stop.as_ref(),
                    &this.carried,
                )
                .await;
            if let Some(stop) = &stop {
                stop.note_files(report.stopped);
                stop.finished();
            }
            report_unsent(
                this.outbound.as_ref(),
                &this.source,
                this.answering,
                this.sender.max_files,
                report,
            )
            .await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::outbox::{FileSender, OutgoingFile};
    use crate::store::{FileSend, Store};
    use crate::vocab::Platform;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts sends; fires `stop` once `stop_after` files went out.
    struct StoppingSender {
        sends: AtomicUsize,
        stop_after: usize,
        stop: SendingStop,
    }

    impl FileSender for StoppingSender {
        fn send_file<'a>(
            &'a self,
            _to: &'a SessionSource,
            _file: &'a OutgoingFile,
        ) -> BoxFuture<'a, Result<i64, DeliveryError>> {
            Box::pin(async move {
                let n = self.sends.fetch_add(1, Ordering::SeqCst) + 1;
                if n == self.stop_after {
                    self.stop.token().cancel();
                }
                Ok(100 + n as i64)
            })
        }
    }

    /// An outbound that drops everything.
    struct Silent;

    impl Outbound for Silent {
        fn deliver<'a>(
            &'a self,
            _to: &'a SessionSource,
            _reply: Reply,
        ) -> BoxFuture<'a, Result<(), DeliveryError>> {
            Box::pin(async { Ok(()) })
        }
    }

    #[test]
    fn a_batch_sends_until_stopped_or_full() {
        assert_eq!(next_step(false, 0, 20), Step::Send);
        assert_eq!(next_step(false, 19, 20), Step::Send);
        assert_eq!(next_step(false, 20, 20), Step::OverLimit);
        assert_eq!(next_step(true, 0, 20), Step::Stopped);
        assert_eq!(next_step(true, 20, 20), Step::Stopped);
        assert_eq!(over_limit_line(0, 20), None);
        assert_eq!(
            over_limit_line(1, 20).unwrap(),
            "1 more file was not sent: at most 20 go with one answer"
        );
        assert!(over_limit_line(980, 20)
            .unwrap()
            .starts_with("980 more files"));
    }

    async fn outbox_with(
        names: usize,
        stop_after: usize,
    ) -> (
        Arc<StoppingSender>,
        OutboxFiles,
        PathBuf,
        Store,
        SendingStop,
        tempfile::TempDir,
    ) {
        let media = tempfile::tempdir().unwrap();
        let store = Store::open_in_memory().unwrap();
        let stop = SendingStop::new(tokio_util::sync::CancellationToken::new());
        let sender = Arc::new(StoppingSender {
            sends: AtomicUsize::new(0),
            stop_after,
            stop: stop.clone(),
        });
        let files = OutboxFiles::new(
            sender.clone(),
            Some(store.file_sends()),
            media.path().into(),
        )
        .with_max_files(5);
        let dir = files.outbox_dir(7, Some(9)).await.unwrap();
        for n in 0..names {
            std::fs::write(dir.join(format!("f{n:02}.txt")), b"x").unwrap();
        }
        (sender, files, dir, store, stop, media)
    }

    #[tokio::test]
    async fn files_over_the_limit_are_left_out_and_counted() {
        let (sender, files, dir, _store, stop, _media) = outbox_with(12, 0).await;
        let to = SessionSource::dm(Platform::Telegram, 7);
        let carried = FileCount::default();
        carried.add(); // the tool sent one already
        let report = files
            .send_batch(&to, Some(9), &dir, Some(&stop), &carried)
            .await;
        assert_eq!(sender.sends.load(Ordering::SeqCst), 4);
        assert_eq!((report.sent, report.over_limit, report.stopped), (4, 8, 0));
    }

    #[tokio::test]
    async fn a_stopped_batch_withholds_the_rest_and_a_restart_sends_none_of_them() {
        let (sender, files, dir, store, stop, _media) = outbox_with(4, 2).await;
        let to = SessionSource::dm(Platform::Telegram, 7);
        let report = files
            .send_batch(&to, Some(9), &dir, Some(&stop), &FileCount::default())
            .await;
        assert_eq!((report.sent, report.stopped), (2, 2));
        let key = format!(
            "outbox:{}",
            dir.canonicalize().unwrap().join("f03.txt").display()
        );
        assert_eq!(
            store.file_sends().file_send(7, 9, key).await.unwrap(),
            Some(FileSend::Withheld)
        );
        // The restart's leftovers: nothing more goes out.
        assert_eq!(files.send_leftovers(&Silent, &to, 9).await, 0);
        assert_eq!(sender.sends.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_outbox_replaced_by_a_link_sends_nothing() {
        let (sender, files, dir, _store, _stop, _media) = outbox_with(0, 0).await;
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("secret"), b"s").unwrap();
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
        let to = SessionSource::dm(Platform::Telegram, 7);
        let report = files
            .send_batch(&to, Some(9), &dir, None, &FileCount::default())
            .await;
        assert_eq!(sender.sends.load(Ordering::SeqCst), 0);
        assert!(
            report.problems[0].contains("replaced by a link"),
            "{report:?}"
        );
    }
}
