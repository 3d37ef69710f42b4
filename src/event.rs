//! The platform-neutral event model: what a message *is* once a transport
//! has received it, and which chat slot it belongs to.
//!
//! Every transport (Telegram polling, webhook, the console) turns its input
//! into a [`MessageEvent`]; everything below the transport sees only this
//! type. That is what lets the console exercise the very same adapter and
//! runner as Telegram does.
//!
//! This module owns: [`SessionSource`] (where a message came from),
//! [`SessionKey`] (the chat *slot* a message belongs to) and command parsing.
//! It must never do I/O or hold state.

use std::fmt;
use std::sync::Arc;

use crate::identity::SessionId;

/// The messaging platform an event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// Telegram (polling or webhook).
    Telegram,
    /// The local console transport (`telegate console`).
    Console,
}

impl Platform {
    /// The lower-case name used inside session keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Telegram => "telegram",
            Platform::Console => "console",
        }
    }
}

/// What kind of chat a message was sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChatType {
    /// A private (one-to-one) chat with the bot.
    Dm,
    /// A basic group.
    Group,
    /// A supergroup (possibly with forum topics).
    Supergroup,
    /// A broadcast channel.
    Channel,
}

impl ChatType {
    /// The lower-case name used inside session keys.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatType::Dm => "dm",
            ChatType::Group => "group",
            ChatType::Supergroup => "supergroup",
            ChatType::Channel => "channel",
        }
    }

    /// True for chats shared by several people (groups and supergroups).
    pub fn is_group(self) -> bool {
        matches!(self, ChatType::Group | ChatType::Supergroup)
    }
}

/// Where a message came from: enough to route a reply back and to name the
/// session slot it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionSource {
    /// The platform.
    pub platform: Platform,
    /// The platform's chat id.
    pub chat_id: i64,
    /// Private chat, group, supergroup or channel.
    pub chat_type: ChatType,
    /// Forum topic (Telegram `message_thread_id`), if any.
    pub thread_id: Option<i32>,
    /// The sender's user id, if known.
    pub user_id: Option<u64>,
    /// The sender's display name, if known (for logs and transcripts).
    pub user_name: Option<String>,
}

impl SessionSource {
    /// A private chat source with only the required fields set.
    pub fn dm(platform: Platform, chat_id: i64) -> Self {
        SessionSource {
            platform,
            chat_id,
            chat_type: ChatType::Dm,
            thread_id: None,
            user_id: None,
            user_name: None,
        }
    }
}

/// Options that change how session keys are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPolicy {
    /// In groups, give each user their own session (the user id is appended
    /// to the key). On by default: a group full of people otherwise shares
    /// one conversation and one busy slot.
    pub group_sessions_per_user: bool,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy {
            group_sessions_per_user: true,
        }
    }
}

/// The name of a chat *slot*: `agent:main:<platform>:<chat_type>:<chat_id>[:<thread_id>][:<user_id>]`.
///
/// A slot holds at most one running turn at a time. The conversation living in
/// the slot (the session id) changes on /new and /reset; the key does not.
/// Cloning is cheap (the string is shared).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(Arc<str>);

impl SessionKey {
    /// Build the key for a source under the given policy.
    pub fn for_source(source: &SessionSource, policy: KeyPolicy) -> SessionKey {
        use std::fmt::Write;
        let mut key = String::with_capacity(48);
        // Writing to a String cannot fail.
        let _ = write!(
            key,
            "agent:main:{}:{}:{}",
            source.platform.as_str(),
            source.chat_type.as_str(),
            source.chat_id
        );
        if let Some(thread) = source.thread_id {
            let _ = write!(key, ":{thread}");
        }
        if policy.group_sessions_per_user && source.chat_type.is_group() {
            if let Some(user) = source.user_id {
                let _ = write!(key, ":{user}");
            }
        }
        SessionKey(Arc::from(key))
    }

    /// Wrap an already-built key string (tests, stored keys).
    pub fn from_raw(raw: impl AsRef<str>) -> SessionKey {
        SessionKey(Arc::from(raw.as_ref()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({})", &self.0)
    }
}

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
    /// Replayed after a restart: its first attempt may already be in the
    /// transcript.
    pub resumed: bool,
    /// Handed on by restart recovery (whatever its inbox state was): the
    /// previous process may have recorded part of its answer in the
    /// outbox, so the outbox must be read, not assumed empty. False for an
    /// update this process recorded itself.
    pub replayed: bool,
    /// Photos, voice, documents: still to prepare, or prepared
    /// (see [`crate::media`]).
    pub media: Box<crate::media::EventMedia>,
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
            resumed: false,
            replayed: false,
            media: Default::default(),
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
            resumed: false,
            replayed: false,
            media: Default::default(),
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

/// A parsed command: its name as typed (compare with [`Command::is`]) and the
/// raw argument text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command<'a> {
    /// The name without the slash or `@botname`, as typed.
    pub name: &'a str,
    /// Everything after the name, trimmed.
    pub args: &'a str,
}

impl Command<'_> {
    /// The name compared case-insensitively with `other`.
    pub fn is(&self, other: &str) -> bool {
        self.name.eq_ignore_ascii_case(other)
    }
}

/// Parse `/cmd`, `/cmd args`, `/cmd@botname args` (case-insensitive) and the
/// same preceded by a leading `@mention` (as people type in groups).
///
/// Returns `None` for ordinary text, for `/` alone, and for a command
/// addressed to another bot when `bot_username` is known.
pub fn parse_command<'a>(text: &'a str, bot_username: Option<&str>) -> Option<Command<'a>> {
    let mut rest = text.trim_start();
    if let Some(after_at) = rest.strip_prefix('@') {
        // A leading mention: "@bot /stop". Skip the mention word.
        let end = after_at.find(char::is_whitespace).unwrap_or(after_at.len());
        rest = after_at[end..].trim_start();
    }
    let body = rest.strip_prefix('/')?;
    let word_end = body.find(char::is_whitespace).unwrap_or(body.len());
    let word = &body[..word_end];
    let args = body[word_end..].trim();
    let (name, target) = match word.split_once('@') {
        Some((name, target)) => (name, Some(target)),
        None => (word, None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    if let (Some(target), Some(me)) = (target, bot_username) {
        if !target.eq_ignore_ascii_case(me.trim_start_matches('@')) {
            return None;
        }
    }
    Some(Command { name, args })
}

/// The commands that take the adapter's command path while a turn runs:
/// they must reach the runner even though the slot is busy.
pub fn is_control_command(name: &str) -> bool {
    ["stop", "new", "reset"]
        .iter()
        .any(|c| c.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(chat_type: ChatType, chat_id: i64) -> SessionSource {
        SessionSource {
            chat_type,
            user_id: Some(42),
            ..SessionSource::dm(Platform::Telegram, chat_id)
        }
    }

    #[test]
    fn dm_key_has_no_user_suffix() {
        let key = SessionKey::for_source(&src(ChatType::Dm, 12345), KeyPolicy::default());
        assert_eq!(key.as_str(), "agent:main:telegram:dm:12345");
    }

    #[test]
    fn group_key_is_per_user_by_default_and_can_be_shared() {
        let s = src(ChatType::Group, -100);
        let per_user = SessionKey::for_source(&s, KeyPolicy::default());
        assert_eq!(per_user.as_str(), "agent:main:telegram:group:-100:42");
        let shared = SessionKey::for_source(
            &s,
            KeyPolicy {
                group_sessions_per_user: false,
            },
        );
        assert_eq!(shared.as_str(), "agent:main:telegram:group:-100");
    }

    #[test]
    fn forum_topic_gets_its_own_key() {
        let mut s = src(ChatType::Supergroup, -1001);
        s.thread_id = Some(7);
        let key = SessionKey::for_source(&s, KeyPolicy::default());
        assert_eq!(key.as_str(), "agent:main:telegram:supergroup:-1001:7:42");
    }

    #[test]
    fn commands_parse_case_insensitively_with_bot_suffix_and_mention() {
        let c = parse_command("/STOP", None).unwrap();
        assert!(c.is("stop"));
        let c = parse_command("/model@MyBot gpt-4 --fast", Some("mybot")).unwrap();
        assert_eq!((c.name, c.args), ("model", "gpt-4 --fast"));
        assert!(parse_command("/stop@otherbot", Some("mybot")).is_none());
        let c = parse_command("@mybot /new  hello ", Some("mybot")).unwrap();
        assert_eq!((c.name, c.args), ("new", "hello"));
        assert!(parse_command("hello /stop", None).is_none());
        assert!(parse_command("/", None).is_none());
        assert!(parse_command("/ stop", None).is_none());
        assert!(parse_command("/path/to/file", None).is_none());
    }

    #[test]
    fn internal_events_never_carry_commands() {
        let e = MessageEvent::internal(SessionSource::dm(Platform::Console, 1), "/stop");
        assert!(e.command().is_none());
        assert!(e.internal);
    }
}
