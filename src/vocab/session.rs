//! Where a message comes from and which chat *slot* it belongs to.
//!
//! [`SessionSource`] (platform, chat, thread, sender) is enough to route a
//! reply back; [`SessionKey`] names the slot a message runs in (decided by
//! `super::route`). Plain data: no I/O, no state.

use std::fmt;
use std::sync::Arc;

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

/// The name of a chat *slot*: `agent:main:<platform>:<chat_type>:<chat_id>[:<thread_id>][:<user_id>]`.
///
/// A slot holds at most one running turn at a time. The conversation living in
/// the slot (the session id) changes on /new and /reset; the key does not.
/// Cloning is cheap (the string is shared).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(Arc<str>);

impl SessionKey {
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
