//! Replies and the outbound port.
//!
//! The adapter and runner never talk to Telegram (or the console) directly:
//! they hand a [`Reply`] to an [`Outbound`]. The Telegram delivery engine,
//! the console printer and the test recorders implement that one trait, so
//! the session engine is identical everywhere.
//!
//! This module owns the reply types and the trait. It must never decide
//! *whether* something is sent: that is the adapter's guard and the runner's
//! generation check.

use futures::future::BoxFuture;

use crate::agent::ProgressWatch;
use crate::event::SessionSource;

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

/// One message to send back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The text. Answers are Markdown; the other kinds are plain text.
    pub text: String,
    /// What the reply is.
    pub kind: ReplyKind,
    /// The platform message id this reply answers, if any.
    pub reply_to: Option<i64>,
    /// Inline buttons under the reply (transports without buttons ignore
    /// them; every button's action is also a typed command).
    pub buttons: Vec<crate::buttons::Button>,
}

impl Reply {
    /// A reply of the given kind.
    pub fn new(kind: ReplyKind, text: impl Into<String>) -> Self {
        Reply {
            text: text.into(),
            kind,
            reply_to: None,
            buttons: Vec::new(),
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

    /// Mark the message this reply answers.
    pub fn in_reply_to(mut self, message_id: Option<i64>) -> Self {
        self.reply_to = message_id;
        self
    }

    /// Put `buttons` under the reply.
    pub fn with_buttons(mut self, buttons: Vec<crate::buttons::Button>) -> Self {
        self.buttons = buttons;
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
    /// ([`crate::event::MessageEvent::replayed`]): part of its answer may
    /// be recorded already.
    pub replayed: bool,
}
