//! Where a message comes from and which chat *slot* it belongs to.
//!
//! [`SessionSource`] (platform, chat, thread, sender) is enough to route a
//! reply back; [`SessionKey`] names the slot a message runs in, under the
//! [`KeyPolicy`]. Plain data: no I/O, no state.

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

#[cfg(test)]
mod tests {
    use super::{ChatType, KeyPolicy, Platform, SessionKey, SessionSource};

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
}
