//! Routing is data: the one function from where a message was written to
//! the session slot it runs in.
//!
//! [`route`] takes everything that decides a slot (platform, chat kind and
//! id, forum topic, sender, whether the message sits in a forum's General
//! topic or starts a conversation with /new) and the [`KeyPolicy`] (group
//! sessions per user or shared, [`TopicsMode`]), and answers a
//! [`Route`]: a [`Slot`] (the bot, and the conversation's [`SessionKey`]
//! within it), or "create a topic first" (topics `auto`).
//! [`SessionKey::for_source`] is this function's key for a message already
//! placed, so no other place decides a slot. The bot comes first: one
//! process may serve several bots, and two bots in the same group never
//! share a slot (each bot's slots live in its own engine, its rows under
//! its id in the store).
//!
//! Pure: no I/O, no state.

use serde::Deserialize;

use super::bot::BotId;
use super::command::KnownCommand;
use super::event::MessageEvent;
use super::session::{ChatType, Platform, SessionKey, SessionSource};

/// `[telegram] topics`: what forum topics (and topics in private chats) mean.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicsMode {
    /// Topics are ignored: every topic of a chat shares the chat's slot
    /// (replies still go to the topic a message was written in).
    Off,
    /// Each topic is its own session slot (the default).
    #[default]
    PerTopic,
    /// As `per-topic`, and in a forum supergroup `/new` or a message in the
    /// General topic creates a new topic the conversation runs in.
    Auto,
}

impl TopicsMode {
    /// The name in the configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            TopicsMode::Off => "off",
            TopicsMode::PerTopic => "per-topic",
            TopicsMode::Auto => "auto",
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
    /// What forum topics mean (`[telegram] topics`).
    pub topics: TopicsMode,
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy {
            group_sessions_per_user: true,
            topics: TopicsMode::default(),
        }
    }
}

/// Everything about one message that decides its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteInput {
    /// The platform.
    pub platform: Platform,
    /// Private chat, group, supergroup or channel.
    pub chat_type: ChatType,
    /// The platform's chat id.
    pub chat_id: i64,
    /// The forum topic (`message_thread_id` of a topic message), if any.
    pub thread_id: Option<i32>,
    /// The sender, if known.
    pub user_id: Option<u64>,
    /// Written in a forum supergroup's General topic (a forum chat, no
    /// topic).
    pub in_general_topic: bool,
    /// The message is `/new` (a conversation of its own is asked for).
    pub starts_conversation: bool,
}

/// A session slot: the bot, and the conversation's key within it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The bot the message was written to.
    pub bot: BotId,
    /// The conversation within that bot.
    pub key: SessionKey,
}

/// Where a message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Run it in this slot.
    Slot(Slot),
    /// Topics `auto`: create a forum topic, then route the message again
    /// as written in it.
    CreateTopic,
}

impl RouteInput {
    /// A message already placed (its topic, if any, exists): no General
    /// topic, no /new.
    pub fn placed(source: &SessionSource) -> RouteInput {
        RouteInput {
            platform: source.platform,
            chat_type: source.chat_type,
            chat_id: source.chat_id,
            thread_id: source.thread_id,
            user_id: source.user_id,
            in_general_topic: false,
            starts_conversation: false,
        }
    }
}

impl RouteInput {
    /// A message as it arrived: in a forum's General topic when it names no
    /// topic, starting a conversation when it is `/new`.
    pub fn arrived(event: &MessageEvent) -> RouteInput {
        RouteInput {
            in_general_topic: event.in_forum && event.source.thread_id.is_none(),
            starts_conversation: event.command().is_some_and(|c| c.is(KnownCommand::New)),
            ..RouteInput::placed(&event.source)
        }
    }
}

impl SessionKey {
    /// The key of a message already placed (see [`RouteInput::placed`]):
    /// [`route`] never asks to create a topic for one.
    pub fn for_source(source: &SessionSource, policy: KeyPolicy) -> SessionKey {
        slot_key(&RouteInput::placed(source), policy)
    }
}

/// The slot of one message written to `bot` (see the module docs).
pub fn route(bot: BotId, input: &RouteInput, policy: KeyPolicy) -> Route {
    let forum_message = input.chat_type == ChatType::Supergroup
        && (input.in_general_topic || input.thread_id.is_some());
    if policy.topics == TopicsMode::Auto
        && forum_message
        && (input.in_general_topic || input.starts_conversation)
    {
        return Route::CreateTopic;
    }
    Route::Slot(Slot {
        bot,
        key: slot_key(input, policy),
    })
}

/// Whether `key` is a slot of the topic `thread` of `source`'s chat (a
/// forum topic per conversation): `Some(user)` for the slot of `user` in
/// it (`None` when the topic's members share one), `None` for a key of
/// anywhere else.
pub fn slot_in_topic(key: &SessionKey, source: &SessionSource, thread: i32) -> Option<Option<u64>> {
    let topic = RouteInput {
        thread_id: Some(thread),
        user_id: None,
        ..RouteInput::placed(source)
    };
    let shared = slot_key(
        &topic,
        KeyPolicy {
            group_sessions_per_user: false,
            topics: TopicsMode::PerTopic,
        },
    );
    let rest = key.as_str().strip_prefix(shared.as_str())?;
    if rest.is_empty() {
        return Some(None);
    }
    rest.strip_prefix(':')?.parse::<u64>().ok().map(Some)
}

fn slot_key(input: &RouteInput, policy: KeyPolicy) -> SessionKey {
    use std::fmt::Write;
    let mut key = String::with_capacity(48);
    // Writing to a String cannot fail.
    let _ = write!(
        key,
        "agent:main:{}:{}:{}",
        input.platform.as_str(),
        input.chat_type.as_str(),
        input.chat_id
    );
    if let Some(thread) = input.thread_id.filter(|_| policy.topics != TopicsMode::Off) {
        let _ = write!(key, ":{thread}");
    }
    if policy.group_sessions_per_user && input.chat_type.is_group() {
        if let Some(user) = input.user_id {
            let _ = write!(key, ":{user}");
        }
    }
    SessionKey::from_raw(key)
}

#[cfg(test)]
mod tests {
    use super::{route, KeyPolicy, Route, RouteInput, Slot, TopicsMode};
    use crate::vocab::{BotId, ChatType, Platform, SessionKey, SessionSource};

    const USER: u64 = 42;
    const BOT: BotId = BotId(777);

    fn input(chat_type: ChatType, chat_id: i64, thread: Option<i32>) -> RouteInput {
        RouteInput {
            platform: Platform::Telegram,
            chat_type,
            chat_id,
            thread_id: thread,
            user_id: Some(USER),
            in_general_topic: false,
            starts_conversation: false,
        }
    }

    fn policy(per_user: bool, topics: TopicsMode) -> KeyPolicy {
        KeyPolicy {
            group_sessions_per_user: per_user,
            topics,
        }
    }

    fn slot(key: &str) -> Route {
        Route::Slot(Slot {
            bot: BOT,
            key: SessionKey::from_raw(key),
        })
    }

    /// Every case of issue 27's item 4: (what, input, policy, route).
    #[test]
    fn the_routing_table() {
        use ChatType::{Dm, Group, Supergroup};
        use TopicsMode::{Auto, Off, PerTopic};
        let general = RouteInput {
            in_general_topic: true,
            ..input(Supergroup, -1001, None)
        };
        let new_in_topic = RouteInput {
            starts_conversation: true,
            ..input(Supergroup, -1001, Some(7))
        };
        let new_in_plain_group = RouteInput {
            starts_conversation: true,
            ..input(Supergroup, -1002, None)
        };
        let new_in_dm = RouteInput {
            starts_conversation: true,
            ..input(Dm, 5, None)
        };
        let anonymous = RouteInput {
            user_id: None,
            ..input(Group, -100, None)
        };
        let cases: Vec<(&str, RouteInput, KeyPolicy, Route)> = vec![
            // Private chats: one slot per chat, whatever the group mode.
            (
                "private",
                input(Dm, 5, None),
                policy(true, PerTopic),
                slot("agent:main:telegram:dm:5"),
            ),
            (
                "private, shared groups",
                input(Dm, 5, None),
                policy(false, Auto),
                slot("agent:main:telegram:dm:5"),
            ),
            (
                "private topic, per-topic",
                input(Dm, 5, Some(3)),
                policy(true, PerTopic),
                slot("agent:main:telegram:dm:5:3"),
            ),
            (
                "private topic, off",
                input(Dm, 5, Some(3)),
                policy(true, Off),
                slot("agent:main:telegram:dm:5"),
            ),
            (
                "private topic, auto",
                input(Dm, 5, Some(3)),
                policy(true, Auto),
                slot("agent:main:telegram:dm:5:3"),
            ),
            (
                "/new in private, auto (no forum)",
                new_in_dm,
                policy(true, Auto),
                slot("agent:main:telegram:dm:5"),
            ),
            // Groups: per user or shared.
            (
                "group per-user",
                input(Group, -100, None),
                policy(true, PerTopic),
                slot("agent:main:telegram:group:-100:42"),
            ),
            (
                "group shared",
                input(Group, -100, None),
                policy(false, PerTopic),
                slot("agent:main:telegram:group:-100"),
            ),
            (
                "group per-user, sender unknown",
                anonymous,
                policy(true, PerTopic),
                slot("agent:main:telegram:group:-100"),
            ),
            (
                "supergroup per-user",
                input(Supergroup, -1002, None),
                policy(true, Auto),
                slot("agent:main:telegram:supergroup:-1002:42"),
            ),
            (
                "/new in a group without topics, auto",
                new_in_plain_group,
                policy(true, Auto),
                slot("agent:main:telegram:supergroup:-1002:42"),
            ),
            // Forum topics.
            (
                "topic, per-topic, per-user",
                input(Supergroup, -1001, Some(7)),
                policy(true, PerTopic),
                slot("agent:main:telegram:supergroup:-1001:7:42"),
            ),
            (
                "topic, per-topic, shared",
                input(Supergroup, -1001, Some(7)),
                policy(false, PerTopic),
                slot("agent:main:telegram:supergroup:-1001:7"),
            ),
            (
                "topic, off, per-user",
                input(Supergroup, -1001, Some(7)),
                policy(true, Off),
                slot("agent:main:telegram:supergroup:-1001:42"),
            ),
            (
                "topic, off, shared",
                input(Supergroup, -1001, Some(7)),
                policy(false, Off),
                slot("agent:main:telegram:supergroup:-1001"),
            ),
            (
                "topic, auto, shared",
                input(Supergroup, -1001, Some(7)),
                policy(false, Auto),
                slot("agent:main:telegram:supergroup:-1001:7"),
            ),
            (
                "topic, auto, per-user",
                input(Supergroup, -1001, Some(7)),
                policy(true, Auto),
                slot("agent:main:telegram:supergroup:-1001:7:42"),
            ),
            (
                "/new in a topic, auto",
                new_in_topic,
                policy(false, Auto),
                Route::CreateTopic,
            ),
            (
                "/new in a topic, per-topic",
                new_in_topic,
                policy(false, PerTopic),
                slot("agent:main:telegram:supergroup:-1001:7"),
            ),
            (
                "/new in a topic, off",
                new_in_topic,
                policy(false, Off),
                slot("agent:main:telegram:supergroup:-1001"),
            ),
            // The General topic.
            (
                "General, per-topic",
                general,
                policy(false, PerTopic),
                slot("agent:main:telegram:supergroup:-1001"),
            ),
            (
                "General, per-topic, per-user",
                general,
                policy(true, PerTopic),
                slot("agent:main:telegram:supergroup:-1001:42"),
            ),
            (
                "General, off",
                general,
                policy(false, Off),
                slot("agent:main:telegram:supergroup:-1001"),
            ),
            (
                "General, auto",
                general,
                policy(false, Auto),
                Route::CreateTopic,
            ),
            (
                "General, auto, per-user",
                general,
                policy(true, Auto),
                Route::CreateTopic,
            ),
        ];
        for (what, input, policy, expected) in cases {
            assert_eq!(route(BOT, &input, policy), expected, "{what}");
        }
    }

    /// Two bots in the same group (one process serving both): the same
    /// chat, topic and sender are two slots, each bot's own, whatever the
    /// group and topic modes.
    #[test]
    fn two_bots_in_the_same_group_never_share_a_slot() {
        use ChatType::{Group, Supergroup};
        use TopicsMode::{Auto, Off, PerTopic};
        let (one, two) = (BotId(1), BotId(2));
        for (input, policy) in [
            (input(Group, -100, None), policy(false, PerTopic)),
            (input(Group, -100, None), policy(true, Off)),
            (input(Supergroup, -1001, Some(7)), policy(false, Auto)),
            (input(Supergroup, -1001, Some(7)), policy(true, PerTopic)),
        ] {
            let (Route::Slot(a), Route::Slot(b)) =
                (route(one, &input, policy), route(two, &input, policy))
            else {
                panic!("a placed message has a slot");
            };
            assert_eq!((a.bot, b.bot), (one, two));
            assert_eq!(a.key, b.key, "the key is the conversation within its bot");
            assert_ne!(a, b);
        }
        // "Create a topic first" is each bot's own answer too.
        let general = RouteInput {
            in_general_topic: true,
            ..input(Supergroup, -1001, None)
        };
        assert_eq!(
            route(one, &general, policy(false, Auto)),
            Route::CreateTopic
        );
        assert_eq!(
            route(two, &general, policy(false, Off)),
            slot_of(two, "agent:main:telegram:supergroup:-1001")
        );
    }

    fn slot_of(bot: BotId, key: &str) -> Route {
        Route::Slot(Slot {
            bot,
            key: SessionKey::from_raw(key),
        })
    }

    #[test]
    fn a_placed_source_routes_like_its_input() {
        let mut source = SessionSource {
            chat_type: ChatType::Supergroup,
            user_id: Some(USER),
            ..SessionSource::dm(Platform::Telegram, -1001)
        };
        source.thread_id = Some(7);
        let key = SessionKey::for_source(&source, KeyPolicy::default());
        assert_eq!(key.as_str(), "agent:main:telegram:supergroup:-1001:7:42");
        let input = RouteInput::placed(&source);
        assert_eq!(
            route(BOT, &input, KeyPolicy::default()),
            Route::Slot(Slot { bot: BOT, key })
        );
    }

    #[test]
    fn the_slots_of_a_topic_are_found_by_key() {
        let forum = SessionSource {
            chat_type: ChatType::Supergroup,
            ..SessionSource::dm(Platform::Telegram, -1001)
        };
        let of = |k: &str, thread| super::slot_in_topic(&SessionKey::from_raw(k), &forum, thread);
        assert_eq!(of("agent:main:telegram:supergroup:-1001:7", 7), Some(None));
        assert_eq!(
            of("agent:main:telegram:supergroup:-1001:7:42", 7),
            Some(Some(42))
        );
        assert_eq!(of("agent:main:telegram:supergroup:-1001:7:42", 8), None);
        assert_eq!(of("agent:main:telegram:supergroup:-1001:77:42", 7), None);
        assert_eq!(of("agent:main:telegram:supergroup:-1001:42", 7), None);
        assert_eq!(of("agent:main:telegram:supergroup:-10017", 7), None);
    }

    #[test]
    fn topics_modes_read_as_written_in_the_file() {
        for mode in [TopicsMode::Off, TopicsMode::PerTopic, TopicsMode::Auto] {
            let parsed: TopicsMode =
                serde_json::from_str(&format!("\"{}\"", mode.as_str())).unwrap();
            assert_eq!(parsed, mode);
        }
        assert_eq!(TopicsMode::default(), TopicsMode::PerTopic);
    }
}
