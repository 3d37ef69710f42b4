//! Update builders: users, photos, entities as Telegram detects them.

use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

use super::telegram::KNOWN_METHODS;

pub(super) fn user_json(user_id: i64) -> Value {
    json!({
        "id": user_id,
        "is_bot": false,
        "first_name": format!("User{user_id}"),
        "username": format!("user{user_id}"),
        "language_code": "en",
    })
}

pub(super) fn fake_photo_sizes(message_id: i64) -> Value {
    let size = |suffix: &str, side: u32, bytes: u32| {
        json!({
            "file_id": format!("fake-photo-{message_id}-{suffix}"),
            "file_unique_id": format!("fakeuniq{message_id}{suffix}"),
            "width": side,
            "height": side,
            "file_size": bytes,
        })
    };
    json!([size("s", 90, 1_200), size("m", 800, 64_000)])
}

/// Sets `text_key` and, if any are found, the entities Telegram would add.
pub(super) fn set_text(message: &mut Value, text_key: &str, entities_key: &str, text: &str) {
    message[text_key] = json!(text);
    let entities = detect_entities(text);
    if !entities.is_empty() {
        message[entities_key] = Value::Array(entities);
    }
}

/// `bot_command` for a leading `/command[@bot]` and `mention` for each
/// `@name`, with offsets and lengths in UTF-16 units as Telegram sends them.
pub(super) fn detect_entities(text: &str) -> Vec<Value> {
    let mut entities = Vec::new();
    let mut skip_until = 0; // byte index: mentions inside the command are part of it
    if let Some(end) = command_end(text) {
        entities.push(entity("bot_command", 0, utf16_len(&text[..end])));
        skip_until = end;
    }
    let mut previous: Option<char> = None;
    for (index, c) in text.char_indices() {
        let at_word_start = previous.is_none_or(|p| !is_word_char(p));
        previous = Some(c);
        if c != '@' || index < skip_until || !at_word_start {
            continue;
        }
        let name_len: usize = text[index + 1..]
            .chars()
            .take_while(|c| is_word_char(*c))
            .map(char::len_utf8)
            .sum();
        if name_len > 0 {
            let offset = utf16_len(&text[..index]);
            entities.push(entity(
                "mention",
                offset,
                1 + utf16_len(&text[index + 1..index + 1 + name_len]),
            ));
        }
    }
    entities
}

/// Byte length of a leading `/command` (with optional `@bot`), if any.
pub(super) fn command_end(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('/')?;
    let name: usize = rest
        .chars()
        .take_while(|c| is_word_char(*c))
        .map(char::len_utf8)
        .sum();
    if name == 0 {
        return None;
    }
    let mut end = 1 + name;
    if let Some(after) = text[end..].strip_prefix('@') {
        let bot: usize = after
            .chars()
            .take_while(|c| is_word_char(*c))
            .map(char::len_utf8)
            .sum();
        if bot > 0 {
            end += 1 + bot;
        }
    }
    Some(end)
}

pub(super) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

pub(super) fn entity(kind: &str, offset: usize, length: usize) -> Value {
    json!({ "type": kind, "offset": offset, "length": length })
}

pub(super) fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

pub(super) fn unix_now() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// Telegram matches method names case-insensitively.
pub(super) fn canonical_method(name: &str) -> String {
    let known = KNOWN_METHODS.iter().find(|m| m.eq_ignore_ascii_case(name));
    known.map_or_else(|| name.to_owned(), |m| (*m).to_owned())
}

// ---------------------------------------------------------------------------
