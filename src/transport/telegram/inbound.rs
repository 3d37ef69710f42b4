//! Which Telegram messages become events, and what they become.
//!
//! A pure function over teloxide's `Message`: no I/O, so every rule (access
//! control, group mention rules, commands for other bots, unsupported media,
//! service messages) is unit-tested here without a server.

use std::sync::Arc;

use teloxide::types::{MediaKind, Message, MessageEntityKind, MessageKind as TgKind};

use crate::vocab::{
    parse_command, ChatType, KnownCommand, MessageEvent, MessageKind, Platform, SessionSource,
};

/// Who may talk to the bot and when it answers in groups.
#[derive(Clone, Debug)]
pub struct InboundPolicy {
    /// The bot's own user id (replies to it count as addressing it).
    pub bot_id: u64,
    /// The bot's username without `@`.
    pub bot_username: Arc<str>,
    /// User ids allowed everywhere.
    pub allowed_users: Vec<u64>,
    /// Chats where everybody is allowed.
    pub allowed_chats: Vec<i64>,
    /// Everybody is allowed.
    pub allow_all_users: bool,
    /// In groups, only messages addressed to the bot are taken.
    pub require_mention: bool,
    /// The team (pairing, invites): its members are allowed too.
    pub access: Option<crate::access::Access>,
}

/// What to do with one inbound message.
#[derive(Clone, Debug)]
pub enum Inbound {
    /// Hand this event to the adapter.
    Accept(MessageEvent),
    /// A private message from someone not on the allowlist: tell them their
    /// id (rate-limited by the caller), run no turn.
    Stranger {
        /// The chat to answer in.
        chat_id: i64,
        /// Their user id.
        user_id: u64,
    },
    /// A stranger sends a code in private (`/pair CODE`, or `/start CODE`
    /// from an invite link): the caller redeems it, runs no turn.
    Redeem {
        /// The chat to answer in.
        chat_id: i64,
        /// Their user id.
        user_id: u64,
        /// Their name.
        name: String,
        /// What they sent as the code (a secret: never logged).
        code: String,
    },
    /// A forum topic was closed (the service message `forum_topic_closed`):
    /// its sessions end.
    TopicClosed {
        /// The forum.
        chat_id: i64,
        /// The topic.
        thread_id: i32,
    },
    /// Not for us (service message, group chatter, another bot's command,
    /// a stranger in a group). Ignored without error.
    Ignore(&'static str),
}

fn chat_type(message: &Message) -> ChatType {
    if message.chat.is_private() {
        ChatType::Dm
    } else if message.chat.is_supergroup() {
        ChatType::Supergroup
    } else if message.chat.is_group() {
        ChatType::Group
    } else {
        ChatType::Channel
    }
}

fn is_allowed(policy: &InboundPolicy, chat_id: i64, user_id: Option<u64>) -> bool {
    policy.allow_all_users
        || policy.allowed_chats.contains(&chat_id)
        || user_id.is_some_and(|u| {
            policy.allowed_users.contains(&u)
                || policy.access.as_ref().is_some_and(|a| a.is_member(u))
        })
}

/// The code in a stranger's `/pair CODE` or `/start CODE`, if that is
/// what the text is.
fn code_in(text: &str, username: &str) -> Option<String> {
    let command = parse_command(text, Some(username))?;
    let code = command.args.trim();
    ((command.is(KnownCommand::Pair) || command.is(KnownCommand::Start)) && !code.is_empty())
        .then(|| code.to_string())
}

/// A pairing or invite code in `text` (`/pair CODE` or `/start CODE`, to
/// this bot or another, a leading mention allowed): the text without the
/// code (what the inbox may keep) and the code. `None` for any other text,
/// at the cost of a glance at its first characters.
pub fn split_code(text: &str) -> Option<(&str, &str)> {
    let head = text.trim_start().as_bytes().first()?;
    if !matches!(head, b'/' | b'@') {
        return None;
    }
    let command = parse_command(text, None)?;
    if !(command.is(KnownCommand::Pair) || command.is(KnownCommand::Start)) {
        return None;
    }
    let code = command.args;
    if code.is_empty() {
        return None;
    }
    // `args` is a slice of `text`: where it starts is where the code does.
    let start = (code.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    Some((text.get(..start)?.trim_end(), code))
}

/// The text or caption, and whether the message carries media we do not
/// handle. `None` for service messages.
fn content(message: &Message) -> Option<(&str, bool)> {
    let TgKind::Common(common) = &message.kind else {
        return None;
    };
    let text = message.text().or_else(|| message.caption()).unwrap_or("");
    // Photos, voice, documents... are read (see `crate::media`); the rest
    // (stickers, polls, locations...) is not.
    let unsupported = !matches!(common.media_kind, MediaKind::Text(_))
        && crate::media::describe::describe(message).0.is_empty();
    if matches!(common.media_kind, MediaKind::Migration(_)) {
        return None;
    }
    Some((text, unsupported))
}

/// The part of `text` an entity covers, by its UTF-16 `offset` and
/// `length`; `None` if that range does not fit the text (outside it, or
/// splitting a character). Telegram's own entities always fit, but a
/// malformed update must not take the intake down: teloxide's
/// `parse_entities` panics on such ranges.
fn entity_text(text: &str, offset: usize, length: usize) -> Option<&str> {
    let end = offset.checked_add(length)?;
    let (mut start_byte, mut end_byte) = (None, None);
    let mut units = 0usize;
    let sentinel = std::iter::once((text.len(), '\0'));
    for (byte, c) in text.char_indices().chain(sentinel) {
        if units == offset {
            start_byte = Some(byte);
        }
        if units == end {
            end_byte = Some(byte);
            break;
        }
        if units > end {
            break;
        }
        units += c.len_utf16();
    }
    text.get(start_byte?..end_byte?)
}

/// True if the message mentions `@username` (by entity or, for robustness,
/// by text).
fn mentions(message: &Message, text: &str, username: &str) -> bool {
    let spans = [
        (message.text(), message.entities()),
        (message.caption(), message.caption_entities()),
    ];
    let by_entity = spans.into_iter().any(|(text, entities)| {
        let (Some(text), Some(entities)) = (text, entities) else {
            return false;
        };
        entities.iter().any(|e| {
            matches!(e.kind, MessageEntityKind::Mention)
                && entity_text(text, e.offset, e.length).is_some_and(|mention| {
                    mention
                        .trim_start_matches('@')
                        .eq_ignore_ascii_case(username)
                })
        })
    });
    by_entity || {
        let needle = format!("@{}", username.to_ascii_lowercase());
        text.to_ascii_lowercase().contains(&needle)
    }
}

fn strip_leading_mention<'a>(text: &'a str, username: &str) -> &'a str {
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix('@') {
        if rest.len() >= username.len()
            && rest.is_char_boundary(username.len())
            && rest[..username.len()].eq_ignore_ascii_case(username)
        {
            let after = &rest[username.len()..];
            if after.is_empty()
                || after.starts_with(|c: char| c.is_whitespace() || c == ',' || c == ':')
            {
                return after.trim_start_matches([',', ':']).trim_start();
            }
        }
    }
    text
}

/// True if the chat is a forum supergroup (topics on).
fn is_forum(chat: &teloxide::types::Chat) -> bool {
    use teloxide::types::{ChatKind, PublicChatKind};
    match &chat.kind {
        ChatKind::Public(public) => match &public.kind {
            PublicChatKind::Supergroup(supergroup) => supergroup.is_forum,
            _ => false,
        },
        ChatKind::Private(_) => false,
    }
}

/// Decide what one message becomes.
pub fn classify(message: &Message, policy: &InboundPolicy) -> Inbound {
    if let TgKind::ForumTopicClosed(_) = &message.kind {
        return match message.thread_id {
            Some(thread) => Inbound::TopicClosed {
                chat_id: message.chat.id.0,
                thread_id: thread.0 .0,
            },
            None => Inbound::Ignore("service message"),
        };
    }
    let Some((text, unsupported)) = content(message) else {
        return Inbound::Ignore("service message");
    };
    let chat_type = chat_type(message);
    if chat_type == ChatType::Channel {
        return Inbound::Ignore("channel post");
    }
    let from = message.from.as_ref();
    if from.is_some_and(|u| u.is_bot) {
        return Inbound::Ignore("message from a bot");
    }
    let user_id = from.map(|u| u.id.0);
    let chat_id = message.chat.id.0;
    let username = policy.bot_username.as_ref();

    if !is_allowed(policy, chat_id, user_id) {
        return refused(message, text, chat_type, policy);
    }
    if let Some(ignored) = not_for_this_bot(message, text, chat_type, policy) {
        return Inbound::Ignore(ignored);
    }
    let text = strip_leading_mention(text, username).to_string();
    let source = SessionSource {
        platform: Platform::Telegram,
        chat_id,
        chat_type,
        thread_id: message
            .thread_id
            .filter(|_| message.is_topic_message)
            .map(|t| t.0 .0),
        user_id,
        user_name: from.map(|u| u.full_name()),
    };
    Inbound::Accept(accepted(message, source, text, unsupported, policy))
}

/// A message from someone the bot does not serve: a pairing or invite
/// code redeemed in a private chat, else a stranger told their id once
/// (private) or ignored (group).
fn refused(message: &Message, text: &str, chat_type: ChatType, policy: &InboundPolicy) -> Inbound {
    let from = message.from.as_ref();
    let chat_id = message.chat.id.0;
    match (chat_type, from.map(|u| u.id.0)) {
        (ChatType::Dm, Some(user_id)) => match code_in(text, policy.bot_username.as_ref()) {
            Some(code) if policy.access.is_some() => Inbound::Redeem {
                chat_id,
                user_id,
                name: from.map(|u| u.full_name()).unwrap_or_default(),
                code,
            },
            _ => Inbound::Stranger { chat_id, user_id },
        },
        _ => Inbound::Ignore("sender not allowed"),
    }
}

/// Why an allowed sender's message is not this bot's to answer: a command
/// for another bot, or (groups, `require_mention`) a message that neither
/// commands, mentions nor replies to it.
fn not_for_this_bot(
    message: &Message,
    text: &str,
    chat_type: ChatType,
    policy: &InboundPolicy,
) -> Option<&'static str> {
    let username = policy.bot_username.as_ref();
    let command = parse_command(text, None);
    // `/cmd@otherbot` is for another bot, in any chat.
    if command.is_some() && parse_command(text, Some(username)).is_none() {
        return Some("command for another bot");
    }
    if chat_type.is_group() && policy.require_mention {
        let replied_to_bot = message
            .reply_to_message()
            .and_then(|m| m.from.as_ref())
            .is_some_and(|u| u.id.0 == policy.bot_id);
        let addressed = command.is_some() || replied_to_bot || mentions(message, text, username);
        if !addressed {
            return Some("group message not addressed to the bot");
        }
    }
    None
}

/// The event an accepted message becomes: its text (media it carries
/// described, media telegate cannot read said so).
fn accepted(
    message: &Message,
    source: SessionSource,
    text: String,
    unsupported: bool,
    policy: &InboundPolicy,
) -> MessageEvent {
    let mut event = MessageEvent::text(source, text);
    event.message_id = Some(i64::from(message.id.0));
    event.bot_username = Some(policy.bot_username.clone());
    event.in_forum = is_forum(&message.chat);
    if event.kind != MessageKind::Command {
        let (refs, group) = crate::media::describe::describe(message);
        event.media.refs = refs;
        event.media.group = group;
    }
    if unsupported && event.kind != MessageKind::Command && event.text.is_empty() {
        event.kind = MessageKind::Unsupported;
    } else if unsupported && event.kind != MessageKind::Command {
        // Media with a caption: the caption is answered; the media itself is
        // not read yet, and the agent is told so.
        event.text = format!(
            "{}\n\n[The user also sent media that telegate cannot read yet.]",
            event.text
        );
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_code_is_split_off_its_command_and_nothing_else_is() {
        assert_eq!(
            split_code("/pair ABCD-EFGH JK "),
            Some(("/pair", "ABCD-EFGH JK"))
        );
        assert_eq!(
            split_code("@bot /start@bot  XYZ"),
            Some(("@bot /start@bot", "XYZ"))
        );
        assert_eq!(
            split_code("/start@other_bot XYZ"),
            Some(("/start@other_bot", "XYZ")),
            "another bot's code is a secret too"
        );
        assert_eq!(split_code("/pair"), None);
        assert_eq!(split_code("/start "), None);
        assert_eq!(split_code("/status XYZ"), None);
        assert_eq!(split_code("please /pair XYZ"), None);
        assert_eq!(split_code(""), None);
    }

    const BOT: u64 = 999;

    fn policy() -> InboundPolicy {
        InboundPolicy {
            bot_id: BOT,
            bot_username: Arc::from("telegate_test_bot"),
            allowed_users: vec![42],
            allowed_chats: vec![],
            allow_all_users: false,
            require_mention: true,
            access: None,
        }
    }

    fn message(
        chat: serde_json::Value,
        from: i64,
        text: &str,
        extra: serde_json::Value,
    ) -> Message {
        let mut value = json!({
            "message_id": 7,
            "date": 1_700_000_000,
            "chat": chat,
            "from": {"id": from, "is_bot": false, "first_name": "Ann"},
            "text": text,
        });
        if let (Some(obj), Some(extra)) = (value.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                obj.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(value).expect("valid test message")
    }

    fn dm(from: i64, text: &str) -> Message {
        message(
            json!({"id": from, "type": "private", "first_name": "Ann"}),
            from,
            text,
            json!({}),
        )
    }

    fn group(text: &str, extra: serde_json::Value) -> Message {
        message(
            json!({"id": -100, "type": "group", "title": "G"}),
            42,
            text,
            extra,
        )
    }

    fn accepted(inbound: Inbound) -> MessageEvent {
        match inbound {
            Inbound::Accept(event) => event,
            other => panic!("expected Accept, got {other:?}"),
        }
    }

    #[test]
    fn a_closed_topic_and_a_message_in_a_forum_are_told_apart() {
        let forum = json!({"id": -1001, "type": "supergroup", "title": "F", "is_forum": true});
        let closed = serde_json::from_value::<Message>(json!({
            "message_id": 9, "date": 1_700_000_000, "chat": forum.clone(),
            "from": {"id": 42, "is_bot": false, "first_name": "Ann"},
            "message_thread_id": 5, "is_topic_message": true, "forum_topic_closed": {},
        }))
        .expect("a service message");
        assert!(matches!(
            classify(&closed, &policy()),
            Inbound::TopicClosed {
                chat_id: -1001,
                thread_id: 5
            }
        ));
        let general = message(forum, 42, "/status", json!({}));
        let event = accepted(classify(&general, &policy()));
        assert!(event.in_forum);
        assert_eq!(event.source.thread_id, None);
        assert!(!accepted(classify(&dm(42, "hi"), &policy())).in_forum);
    }

    #[test]
    fn an_allowed_private_message_is_accepted() {
        let event = accepted(classify(&dm(42, "hello"), &policy()));
        assert_eq!(event.text, "hello");
        assert_eq!(event.source.chat_type, ChatType::Dm);
        assert_eq!(event.message_id, Some(7));
    }

    #[test]
    fn a_stranger_in_private_is_told_their_id_and_ignored_in_groups() {
        assert!(matches!(
            classify(&dm(5, "hi"), &policy()),
            Inbound::Stranger { user_id: 5, .. }
        ));
        let g = message(
            json!({"id": -100, "type": "group", "title": "G"}),
            5,
            "@telegate_test_bot hi",
            json!({}),
        );
        assert!(matches!(classify(&g, &policy()), Inbound::Ignore(_)));
    }

    #[test]
    fn a_strangers_code_is_redeemed_in_private_only() {
        let mut with_access = policy();
        with_access.access = Some(crate::access::Access::new(
            crate::access::AccessSetup::default(),
            None,
        ));
        for text in [
            "/pair ABCD-EFGH-JK",
            "/start ABCDEFGHJK",
            "/pair@telegate_test_bot X",
        ] {
            assert!(
                matches!(
                    classify(&dm(5, text), &with_access),
                    Inbound::Redeem { user_id: 5, .. }
                ),
                "{text}"
            );
        }
        let Inbound::Redeem { code, name, .. } = classify(&dm(5, "/pair  ab cd "), &with_access)
        else {
            panic!("not a redemption")
        };
        assert_eq!((code.as_str(), name.as_str()), ("ab cd", "Ann"));
        // No code, another command, another bot: the stranger's reply.
        for text in ["/start", "/pair", "/help X", "/pair@other_bot X", "hello"] {
            assert!(
                matches!(
                    classify(&dm(5, text), &with_access),
                    Inbound::Stranger { .. }
                ),
                "{text}"
            );
        }
        // Without a team there is nothing to redeem.
        assert!(matches!(
            classify(&dm(5, "/pair X"), &policy()),
            Inbound::Stranger { .. }
        ));
        let g = message(
            json!({"id": -100, "type": "group", "title": "G"}),
            5,
            "/pair@telegate_test_bot ABCDEFGHJK",
            json!({}),
        );
        assert!(matches!(classify(&g, &with_access), Inbound::Ignore(_)));
    }

    #[test]
    fn group_messages_must_address_the_bot() {
        assert!(matches!(
            classify(&group("just chatting", json!({})), &policy()),
            Inbound::Ignore(_)
        ));
        let event = accepted(classify(
            &group("@telegate_test_bot what's up?", json!({})),
            &policy(),
        ));
        assert_eq!(event.text, "what's up?");
        let reply = json!({"reply_to_message": {
            "message_id": 3, "date": 1_700_000_000,
            "chat": {"id": -100, "type": "group", "title": "G"},
            "from": {"id": BOT, "is_bot": true, "first_name": "Bot"}, "text": "earlier"}});
        accepted(classify(&group("and then?", reply), &policy()));
        let stop = accepted(classify(
            &group("/stop@telegate_test_bot", json!({})),
            &policy(),
        ));
        assert!(stop.command().is_some_and(|c| c.is(KnownCommand::Stop)));
        assert!(matches!(
            classify(&group("/stop@other_bot", json!({})), &policy()),
            Inbound::Ignore(_)
        ));
        let mut open = policy();
        open.require_mention = false;
        accepted(classify(&group("just chatting", json!({})), &open));
    }

    #[test]
    fn unreadable_media_is_unsupported_and_photos_carry_their_files() {
        let with = |extra: serde_json::Value| -> Message {
            let mut value = serde_json::to_value(dm(42, "x")).unwrap();
            value.as_object_mut().unwrap().remove("text");
            for (k, v) in extra.as_object().unwrap() {
                value.as_object_mut().unwrap().insert(k.clone(), v.clone());
            }
            serde_json::from_value(value).unwrap()
        };
        let location = with(json!({"location": {"latitude": 1.0, "longitude": 2.0}}));
        assert_eq!(
            accepted(classify(&location, &policy())).kind,
            MessageKind::Unsupported
        );
        let photo = with(json!({
            "photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}],
            "caption": "look at this", "media_group_id": "g"}));
        let event = accepted(classify(&photo, &policy()));
        assert_eq!(event.text, "look at this");
        assert_eq!(event.kind, MessageKind::Text);
        assert_eq!(event.media.refs.len(), 1);
        assert_eq!(event.media.group.as_deref(), Some("g"));
        let bare = with(json!({
            "photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]}));
        let event = accepted(classify(&bare, &policy()));
        assert_eq!(event.kind, MessageKind::Text);
        assert!(event.text.is_empty());
    }

    #[test]
    fn entities_that_do_not_fit_the_text_are_ignored_without_panicking() {
        // Out of range, past the end, splitting the surrogate pair of 😀,
        // overflowing: found by tests/it/inbound_fuzz.rs (teloxide's
        // `parse_entities` panicked on each).
        for (offset, length) in [(0, 1), (3, 2), (1, 1), (0, usize::MAX), (usize::MAX, 1)] {
            let entities =
                json!({"entities": [{"type": "mention", "offset": offset, "length": length}]});
            let m = group(if offset == 1 { "😀" } else { "" }, entities);
            assert!(matches!(classify(&m, &policy()), Inbound::Ignore(_)));
        }
        assert_eq!(entity_text("a😀b", 1, 2), Some("😀"));
        assert_eq!(entity_text("a😀b", 2, 1), None);
        assert_eq!(entity_text("ab", 0, 2), Some("ab"));
        assert_eq!(entity_text("ab", 2, 0), Some(""));
        assert_eq!(entity_text("ab", 1, 2), None);
        // A well-formed mention entity still addresses the bot.
        let text = "hey 😀 @telegate_test_bot";
        let entities = json!({"entities": [{"type": "mention", "offset": 7, "length": 18}]});
        accepted(classify(&group(text, entities), &policy()));
    }

    #[test]
    fn forum_topics_carry_their_thread_id() {
        let m = message(
            json!({"id": -1001, "type": "supergroup", "title": "F", "is_forum": true}),
            42,
            "/status",
            json!({"message_thread_id": 77, "is_topic_message": true}),
        );
        let event = accepted(classify(&m, &policy()));
        assert_eq!(event.source.thread_id, Some(77));
        assert_eq!(event.source.chat_type, ChatType::Supergroup);
    }
}
