//! Replies and the outbound port.
//!
//! The adapter and runner never talk to Telegram (or the console) directly:
//! they hand a [`Reply`] to an [`Outbound`]. The Telegram delivery engine,
//! the console printer and the test recorders implement that one trait, so
//! the session engine is identical everywhere.
//!
//! This module owns the reply types and the trait, and [`SendingStop`],
//! how a stop reaches an answer that is being sent. It must never decide
//! *whether* something is sent: that is the adapter's guard and the runner's
//! generation check.

use futures::future::BoxFuture;

use crate::vocab::{ProgressWatch, SessionSource};

/// What a reply is, so a transport can render or pace it differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// A turn's final answer (Markdown from the agent).
    Answer,
    /// The answer to a command (/stop, /status...).
    Command,
    /// A short acknowledgement or notice ("Queued (position 2)…").
    Notice,
    /// A turn failed; the text says what to do.
    Error,
}

/// How a reply's text is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextFormat {
    /// Markdown from the agent, rendered to the platform's formatting.
    Markdown,
    /// Sent exactly as written (a command's words, a user's own reminder).
    Plain,
}

/// One message to send back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The text, read as `format` says.
    pub text: String,
    /// What the reply is.
    pub kind: ReplyKind,
    /// How the text is read: answers are Markdown unless made
    /// [`Reply::as_written`]; the other kinds are always plain text.
    pub format: TextFormat,
    /// The platform message id this reply answers, if any.
    pub reply_to: Option<i64>,
    /// Inline buttons under the reply (transports without buttons ignore
    /// them; every button's action is also a typed command).
    pub buttons: Vec<crate::vocab::Button>,
    /// The answer spoken (Ogg/Opus): sent as a voice note carrying the
    /// text where the transport can (see `delivery::voice`); others send
    /// the text.
    pub voice: Option<bytes::Bytes>,
}

impl Reply {
    /// A reply of the given kind.
    pub fn new(kind: ReplyKind, text: impl Into<String>) -> Self {
        Reply {
            text: text.into(),
            kind,
            format: match kind {
                ReplyKind::Answer => TextFormat::Markdown,
                ReplyKind::Command | ReplyKind::Notice | ReplyKind::Error => TextFormat::Plain,
            },
            reply_to: None,
            buttons: Vec::new(),
            voice: None,
        }
    }

    /// A final answer.
    pub fn answer(text: impl Into<String>) -> Self {
        Reply::new(ReplyKind::Answer, text)
    }

    /// A command's answer.
    pub fn command(text: impl Into<String>) -> Self {
        Reply::new(ReplyKind::Command, text)
    }

    /// A notice or acknowledgement.
    pub fn notice(text: impl Into<String>) -> Self {
        Reply::new(ReplyKind::Notice, text)
    }

    /// A failure report.
    pub fn error(text: impl Into<String>) -> Self {
        Reply::new(ReplyKind::Error, text)
    }

    /// The text is sent exactly as written, not read as Markdown (a
    /// reminder is the user's own words: `*` and `_` stay what they are).
    pub fn as_written(mut self) -> Self {
        self.format = TextFormat::Plain;
        self
    }

    /// Mark the message this reply answers.
    pub fn in_reply_to(mut self, message_id: Option<i64>) -> Self {
        self.reply_to = message_id;
        self
    }

    /// Put `buttons` under the reply.
    pub fn with_buttons(mut self, buttons: Vec<crate::vocab::Button>) -> Self {
        self.buttons = buttons;
        self
    }

    /// Send the answer as this voice note (Ogg/Opus) with its text.
    pub fn with_voice(mut self, audio: bytes::Bytes) -> Self {
        self.voice = Some(audio);
        self
    }
}

/// What the handler returns to the adapter: a reply, possibly attached to the
/// live view of the turn that produced it (so a streamed preview is turned
/// into the final text instead of being followed by a duplicate).
pub struct Outgoing {
    /// The reply.
    pub reply: Reply,
    /// The turn's live view, if the transport opened one.
    pub live: Option<Box<dyn LiveReply>>,
}

impl From<Reply> for Outgoing {
    fn from(reply: Reply) -> Self {
        Outgoing { reply, live: None }
    }
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("reply", &self.reply)
            .field("live", &self.live.is_some())
            .finish()
    }
}

/// Why a delivery failed after the transport's own retries.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The platform refused the message (and the plain-text fallback).
    #[error("the platform rejected the message: {0}")]
    Rejected(String),
    /// The network or the platform was unreachable; nothing was delivered.
    #[error("delivery failed: {0}")]
    Unavailable(String),
    /// The request may have reached the platform but no answer came back
    /// (a hang, a garbled answer): the message may or may not have
    /// arrived, and it is never sent again blindly.
    #[error("no answer from the platform ({0}); the message may or may not have arrived")]
    Ambiguous(String),
    /// The transport is shutting down.
    #[error("the transport is closed")]
    Closed,
    /// The sender withdrew the request before it was sent (a cancelled
    /// turn's preview update): nothing reached the platform.
    #[error("withdrawn before it was sent")]
    Withdrawn,
}

/// A turn's presence in the chat while it runs (typing indicator, streamed
/// preview). Dropping it without [`LiveReply::finish`] means the turn ended
/// without an answer: the transport stops showing progress.
pub trait LiveReply: Send {
    /// Deliver the final reply through this live view (editing the preview
    /// into the final text where there is one). Delivers exactly once.
    fn finish(self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>>;
}

/// Where replies go.
pub trait Outbound: Send + Sync + 'static {
    /// Send one reply to the chat of `to`.
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>>;

    /// A turn answering message `answering` started in the chat of `to`:
    /// show it (typing, streamed preview read from `progress`). The default
    /// shows nothing.
    fn turn_started(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        progress: ProgressWatch,
    ) -> Option<Box<dyn LiveReply>> {
        let _ = (to, answering, progress);
        None
    }

    /// Message `message_id` from `to` waits behind a running task (called
    /// while the adapter holds its lock: must not block). The default does
    /// nothing.
    fn queued(&self, to: &SessionSource, message_id: Option<i64>) {
        let _ = (to, message_id);
    }

    /// Like [`Outbound::turn_started`], knowing the turn's generation (so
    /// the live view can offer a Stop button bound to this very turn). The
    /// default forgets the generation.
    fn turn_started_with(
        &self,
        turn: &TurnStart<'_>,
        progress: ProgressWatch,
    ) -> Option<Box<dyn LiveReply>> {
        self.turn_started(turn.to, turn.answering, progress)
    }

    /// Approval request `ticket` in the chat of `to` ended: add `line`
    /// (who chose what, when; or why nobody did) to its prompt and take
    /// its buttons away. The default does nothing (no buttons to take).
    fn settle_prompt<'a>(
        &'a self,
        to: &'a SessionSource,
        ticket: &'a str,
        line: &'a str,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        let _ = (to, ticket, line);
        Box::pin(async { Ok(()) })
    }
}

/// A turn that starts, as the outbound sees it.
#[derive(Clone, Copy, Debug)]
pub struct TurnStart<'a> {
    /// The chat (and user) of the turn.
    pub to: &'a SessionSource,
    /// The message it answers.
    pub answering: Option<i64>,
    /// The turn's generation.
    pub generation: u64,
    /// The message was handed on by restart recovery
    /// ([`crate::vocab::MessageEvent::replayed`]): part of its answer may
    /// be recorded already.
    pub replayed: bool,
}

/// The sending of one turn's answer (its parts, then its files), as /stop
/// sees it: the adapter opens it around the delivery
/// ([`SendingStop::scope`]) and fires it when /stop, /new or /reset reach
/// a slot that is only delivering; whatever sends an answer's parts or
/// files reads it ([`SendingStop::current`]), sends nothing more once it
/// fired, and notes what it left unsent, which the adapter then reports
/// in one line ([`unsent_line`]). A request already sent runs to its
/// answer: a stop never cuts one in half.
#[derive(Clone, Debug, Default)]
pub struct SendingStop {
    token: tokio_util::sync::CancellationToken,
    unsent: std::sync::Arc<std::sync::Mutex<Unsent>>,
    /// Set once nothing of the answer is left to send (its last request
    /// was answered): a stop then has nothing to stop.
    delivered: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Set while files are to follow the answer: the answer's last part
    /// is then not the end of the sending.
    files_follow: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a stop left unsent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unsent {
    /// Parts of the answer not sent…
    pub parts: usize,
    /// …of this many.
    pub of_parts: usize,
    /// Files not sent.
    pub files: usize,
}

tokio::task_local! {
    static SENDING: SendingStop;
}

impl SendingStop {
    /// A sending that stops when `token` fires.
    pub fn new(token: tokio_util::sync::CancellationToken) -> Self {
        SendingStop {
            token,
            unsent: std::sync::Arc::default(),
            delivered: std::sync::Arc::default(),
            files_follow: std::sync::Arc::default(),
        }
    }

    /// Files follow the answer: the sending ends with them
    /// ([`SendingStop::finished`]), not with the answer's last part.
    pub fn expect_files(&self) {
        self.files_follow
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The answer's last request was answered (or it was stopped): unless
    /// files follow, nothing is left to send.
    pub fn answer_sent(&self) {
        if !self.files_follow.load(std::sync::atomic::Ordering::Acquire) {
            self.delivered
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// The sending ended (the files after the answer went out or were
    /// stopped, or the delivery returned): nothing is left to send.
    pub fn finished(&self) {
        self.delivered
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// True while something of the answer may still be sent, so that a
    /// stop would keep it back.
    pub fn is_open(&self) -> bool {
        !self.delivered.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Run `future` (a delivery) as this sending.
    pub async fn scope<F: std::future::Future>(self, future: F) -> F::Output {
        SENDING.scope(self, future).await
    }

    /// The sending the current task delivers in, if any.
    pub fn current() -> Option<SendingStop> {
        SENDING.try_with(Clone::clone).ok()
    }

    /// True once the sending was stopped.
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The token that fires on stop (to withdraw a waiting request).
    pub fn token(&self) -> &tokio_util::sync::CancellationToken {
        &self.token
    }

    fn update(&self, change: impl FnOnce(&mut Unsent)) {
        change(
            &mut self
                .unsent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }

    /// `parts` of the answer's `of` parts were not sent.
    pub fn note_parts(&self, parts: usize, of: usize) {
        self.update(|u| {
            u.parts += parts;
            u.of_parts = u.of_parts.max(of);
        });
    }

    /// `files` files were not sent.
    pub fn note_files(&self, files: usize) {
        self.update(|u| u.files += files);
    }

    /// What was left unsent so far.
    pub fn unsent(&self) -> Unsent {
        *self
            .unsent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The one line telling the user what a stop left unsent (none if
/// nothing was).
pub fn unsent_line(unsent: Unsent) -> Option<String> {
    let parts = match unsent.parts {
        0 => None,
        1 => Some(format!("1 of {} parts of the answer", unsent.of_parts)),
        n => Some(format!("{n} of {} parts of the answer", unsent.of_parts)),
    };
    let files = match unsent.files {
        0 => None,
        1 => Some("1 file".to_string()),
        n => Some(format!("{n} files")),
    };
    let (what, one) = match (parts, files) {
        (None, None) => return None,
        (Some(parts), None) => (parts, unsent.parts == 1),
        (None, Some(files)) => (files, unsent.files == 1),
        (Some(parts), Some(files)) => (format!("{parts} and {files}"), false),
    };
    let verb = if one { "was" } else { "were" };
    Some(format!("⏹ Stopped: {what} {verb} not sent."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sending_is_open_until_its_last_part_or_its_files_are_sent() {
        let sending = SendingStop::new(tokio_util::sync::CancellationToken::new());
        assert!(sending.is_open());
        sending.answer_sent();
        assert!(!sending.is_open(), "nothing is left once the answer is out");

        let with_files = SendingStop::new(tokio_util::sync::CancellationToken::new());
        with_files.expect_files();
        with_files.answer_sent();
        assert!(
            with_files.is_open(),
            "the files after the answer are still to go"
        );
        with_files.finished();
        assert!(!with_files.is_open());
        // Clones share it: the guard's copy sees what the delivery did.
        let clone = with_files.clone();
        assert!(!clone.is_open());
    }

    #[test]
    fn a_stop_reports_what_it_left_unsent_in_one_line() {
        let line = |parts, of_parts, files| {
            unsent_line(Unsent {
                parts,
                of_parts,
                files,
            })
        };
        assert_eq!(line(0, 0, 0), None);
        assert_eq!(
            line(7, 10, 0).unwrap(),
            "⏹ Stopped: 7 of 10 parts of the answer were not sent."
        );
        assert_eq!(
            line(1, 3, 0).unwrap(),
            "⏹ Stopped: 1 of 3 parts of the answer was not sent."
        );
        assert_eq!(line(0, 0, 1).unwrap(), "⏹ Stopped: 1 file was not sent.");
        assert_eq!(
            line(2, 4, 15).unwrap(),
            "⏹ Stopped: 2 of 4 parts of the answer and 15 files were not sent."
        );
    }

    #[tokio::test]
    async fn the_sending_is_seen_inside_its_scope_only() {
        assert!(SendingStop::current().is_none());
        let stop = SendingStop::new(tokio_util::sync::CancellationToken::new());
        let seen = stop
            .clone()
            .scope(async {
                let current = SendingStop::current().unwrap();
                current.note_files(3);
                current.token().cancel();
            })
            .await;
        let () = seen;
        assert!(stop.is_stopped());
        assert_eq!(stop.unsent().files, 3);
    }
}
