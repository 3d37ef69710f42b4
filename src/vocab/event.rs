//! The platform-neutral event model: what a message *is* once a transport
//! has received it.
//!
//! Every transport (Telegram polling, webhook, the console) turns its input
//! into a [`MessageEvent`]; everything below the transport sees only this
//! type. That is what lets the console exercise the very same adapter and
//! runner as Telegram does. Plain data: no I/O, no state.

use std::sync::Arc;

use super::command::{parse_command, Command};
use super::identity::SessionId;
use super::media::EventMedia;
use super::session::SessionSource;

/// What kind of content a message carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// Text (or a caption).
    Text,
    /// A command (`/name ...`).
    Command,
    /// Media the bot cannot handle yet (photo, voice, document, sticker...).
    Unsupported,
    /// Generated inside telegate (a background-process wakeup).
    Internal,
}

/// Whether a message was received by this process or handed on by restart
/// recovery: what the runner and the outbox must assume about work a
/// previous process may already have done for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// Received (or generated) by this process: nothing of its answer
    /// exists yet.
    #[default]
    Live,
    /// Handed on by restart recovery, whatever its inbox state was: the
    /// previous process may have recorded part of its answer in the
    /// outbox, so the outbox must be read, not assumed empty.
    Recovered {
        /// Its first attempt had started running, so the message (and part
        /// of an answer) may already be in the transcript.
        was_running: bool,
    },
}

impl Origin {
    /// Handed on by restart recovery.
    pub fn is_recovered(self) -> bool {
        matches!(self, Origin::Recovered { .. })
    }

    /// Recovered after its first attempt had started running.
    pub fn was_running(self) -> bool {
        matches!(self, Origin::Recovered { was_running: true })
    }

    /// The origin of messages merged into one (an album): recovered if any
    /// part was, running if any part had started.
    pub fn merged(self, other: Origin) -> Origin {
        if self.is_recovered() || other.is_recovered() {
            Origin::Recovered {
                was_running: self.was_running() || other.was_running(),
            }
        } else {
            Origin::Live
        }
    }
}

/// One inbound message, already stripped of platform detail.
#[derive(Clone, Debug)]
pub struct MessageEvent {
    /// The text (or caption). Empty for media without caption.
    pub text: String,
    /// What the message carried.
    pub kind: MessageKind,
    /// Where it came from.
    pub source: SessionSource,
    /// The platform's message id, used to reply to it.
    pub message_id: Option<i64>,
    /// Generated internally (wakeups): queued silently, never interrupts.
    pub internal: bool,
    /// The bot's own username, so `/cmd@other_bot` can be told apart.
    pub bot_username: Option<Arc<str>>,
    /// Run this internal event against this session instead of the slot's
    /// current one (a wakeup belongs to the session that started its
    /// process, even after /new). Honoured by the runner for internal
    /// events only: a user's message always goes to the current session.
    pub session_override: Option<SessionId>,
    /// Received by this process, or handed on by restart recovery.
    pub origin: Origin,
    /// Photos, voice, documents: still to prepare, or prepared
    /// (see [`crate::media`]).
    pub media: Box<EventMedia>,
    /// Written in a forum supergroup (topics on): with no topic, the
    /// message is in the General topic (see `super::route`).
    pub in_forum: bool,
}

impl MessageEvent {
    /// A text message (kind is set to `Command` when the text is a command).
    pub fn text(source: SessionSource, text: impl Into<String>) -> Self {
        let text = text.into();
        let kind = if parse_command(&text, None).is_some() {
            MessageKind::Command
        } else {
            MessageKind::Text
        };
        MessageEvent {
            text,
            kind,
            source,
            message_id: None,
            internal: false,
            bot_username: None,
            session_override: None,
            origin: Origin::Live,
            media: Default::default(),
            in_forum: false,
        }
    }

    /// An internal event (a wakeup): never a command, never interrupts.
    pub fn internal(source: SessionSource, text: impl Into<String>) -> Self {
        MessageEvent {
            text: text.into(),
            kind: MessageKind::Internal,
            source,
            message_id: None,
            internal: true,
            bot_username: None,
            session_override: None,
            origin: Origin::Live,
            media: Default::default(),
            in_forum: false,
        }
    }

    /// Run this (internal) event against `session` instead of the slot's
    /// current session; see [`MessageEvent::session_override`].
    pub fn with_session_override(mut self, session: SessionId) -> Self {
        self.session_override = Some(session);
        self
    }

    /// The session this event must run against instead of the slot's
    /// current one: the override of an internal event, never anything for
    /// a user's message.
    pub fn override_session(&self) -> Option<&SessionId> {
        self.session_override.as_ref().filter(|_| self.internal)
    }

    /// Set the platform message id.
    pub fn with_message_id(mut self, id: i64) -> Self {
        self.message_id = Some(id);
        self
    }

    /// The command this message carries, if any (see [`parse_command`]).
    /// Internal events never carry commands.
    pub fn command(&self) -> Option<Command<'_>> {
        if self.internal {
            return None;
        }
        parse_command(&self.text, self.bot_username.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::MessageEvent;
    use crate::vocab::{Platform, SessionSource};

    #[test]
    fn internal_events_never_carry_commands() {
        let e = MessageEvent::internal(SessionSource::dm(Platform::Console, 1), "/stop");
        assert!(e.command().is_none());
        assert!(e.internal);
    }
}
