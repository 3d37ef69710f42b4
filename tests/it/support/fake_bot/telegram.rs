//! What Telegram accepts and how it words its refusals: limits, method
//! names, update kinds, reactions, chat actions, error descriptions.

/// Telegram's limit on message text, counted in UTF-16 code units.
pub(super) const MAX_TEXT_UTF16: usize = 4096;
/// Telegram never holds a long poll longer than this, whatever `timeout` says.
pub(super) const MAX_POLL_SECS: u64 = 50;
/// Bodies are small JSON documents; this only guards against nonsense.
pub(super) const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Canonical spelling of every method the fake implements. Telegram matches
/// method names case-insensitively; recording the canonical form lets tests
/// filter on one spelling.
pub(super) const KNOWN_METHODS: &[&str] = &[
    "getMe",
    "getUpdates",
    "getWebhookInfo",
    "setWebhook",
    "deleteWebhook",
    "sendMessage",
    "editMessageText",
    "sendChatAction",
    "setMyCommands",
    "getMyCommands",
    "deleteMyCommands",
    "deleteMessage",
    "answerCallbackQuery",
    "getFile",
    "sendPhoto",
    "sendDocument",
    "sendVoice",
    "editMessageReplyMarkup",
    "setMessageReaction",
    "sendMessageDraft",
    "createForumTopic",
    "editForumTopic",
    "closeForumTopic",
    "deleteForumTopic",
];

/// Telegram's limit on a topic's name, in characters.
pub(super) const TOPIC_NAME_MAX: usize = 128;
/// A topic method in a chat that is no forum.
pub(super) const NOT_A_FORUM: &str = "Bad Request: the chat is not a forum";
/// A topic method without the `can_manage_topics` right.
pub(super) const NO_TOPIC_RIGHTS: &str = "Bad Request: not enough rights to create a topic";
/// A topic's name left empty.
pub(super) const TOPIC_TITLE_EMPTY: &str = "Bad Request: TOPIC_TITLE_EMPTY";
/// An edit or close that changes nothing.
pub(super) const TOPIC_NOT_MODIFIED: &str = "Bad Request: TOPIC_NOT_MODIFIED";
/// A message into a deleted (or never made) topic.
pub(super) const THREAD_NOT_FOUND: &str = "Bad Request: message thread not found";
/// A message into a closed topic.
pub(super) const TOPIC_CLOSED: &str = "Bad Request: TOPIC_CLOSED";

/// The emoji Telegram accepts as reactions (`ReactionTypeEmoji`); anything
/// else is refused with `REACTION_INVALID`.
pub(super) const REACTION_EMOJI: &[&str] = &[
    "👍",
    "👎",
    "❤",
    "🔥",
    "🥰",
    "👏",
    "😁",
    "🤔",
    "🤯",
    "😱",
    "🤬",
    "😢",
    "🎉",
    "🤩",
    "🤮",
    "💩",
    "🙏",
    "👌",
    "🕊",
    "🤡",
    "🥱",
    "🥴",
    "😍",
    "🐳",
    "❤\u{200d}🔥",
    "🌚",
    "🌭",
    "💯",
    "🤣",
    "⚡",
    "🍌",
    "🏆",
    "💔",
    "🤨",
    "😐",
    "🍓",
    "🍾",
    "💋",
    "🖕",
    "😈",
    "😴",
    "😭",
    "🤓",
    "👻",
    "👨\u{200d}💻",
    "👀",
    "🎃",
    "🙈",
    "😇",
    "😨",
    "🤝",
    "✍",
    "🤗",
    "🫡",
    "🎅",
    "🎄",
    "☃",
    "💅",
    "🤪",
    "🗿",
    "🆒",
    "💘",
    "🙉",
    "🦄",
    "😘",
    "💊",
    "🙊",
    "😎",
    "👾",
    "🤷\u{200d}♂",
    "🤷",
    "🤷\u{200d}♀",
    "😡",
];

/// Methods whose flood limits Telegram applies per chat; a 429 on one of
/// them forbids all of them for that chat until `retry_after` expires.
pub(super) const CHAT_SCOPED_METHODS: &[&str] =
    &["sendMessage", "editMessageText", "sendChatAction"];

/// Update kinds Telegram delivers when `allowed_updates` is empty or unset.
pub(super) const NOT_DELIVERED_BY_DEFAULT: &[&str] =
    &["chat_member", "message_reaction", "message_reaction_count"];

pub(super) const KNOWN_UPDATE_KINDS: &[&str] = &[
    "message",
    "stopped_message_generation",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_connection",
    "business_message",
    "edited_business_message",
    "deleted_business_messages",
    "message_reaction",
    "message_reaction_count",
    "inline_query",
    "chosen_inline_result",
    "callback_query",
    "shipping_query",
    "pre_checkout_query",
    "purchased_paid_media",
    "poll",
    "poll_answer",
    "my_chat_member",
    "chat_member",
    "chat_join_request",
    "chat_boost",
    "removed_chat_boost",
];

pub(super) const CHAT_ACTIONS: &[&str] = &[
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

pub(super) const NOT_MODIFIED: &str =
    "Bad Request: message is not modified: specified new message content and \
     reply markup are exactly the same as a current content and reply markup of the message";
pub(super) const TERMINATED_BY_OTHER_POLL: &str =
    "Conflict: terminated by other getUpdates request; \
     make sure that only one bot instance is running";
pub(super) const WEBHOOK_ACTIVE: &str =
    "Conflict: can't use getUpdates method while webhook is active; \
     use deleteWebhook to delete the webhook first";
