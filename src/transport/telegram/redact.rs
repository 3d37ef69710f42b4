//! Pairing and invite codes never reach the inbox: an update whose message
//! is `/pair CODE` or `/start CODE` is recorded with the code cut off its
//! text (`/pair`, `/start`), so the inbox (and the database's WAL) keeps
//! no code for the retention period, and a row replayed after a restart
//! is an ordinary `/pair` or `/start` without one (a member is told they
//! have access or greeted; a stranger is told their id; no wrong try is
//! counted for anyone). The code itself lives on only in memory, in the
//! verdict the dispatcher redeems (or, seen in a group, voids).
//!
//! Pure: no I/O. Only an update whose text or caption starts with such a
//! command costs more than a glance at its first character.

use serde_json::Value;
use teloxide::types::{Update, UpdateKind};

use super::inbound::split_code;

/// An update's JSON text with the code taken out, and the code.
#[derive(Debug, PartialEq, Eq)]
pub struct Redacted {
    /// What the inbox records instead of the update as sent.
    pub payload: String,
    /// The code (a secret: never logged, never recorded).
    pub code: String,
}

/// `payload` (the JSON text of `update`) without the code its message
/// carries; `None` when it carries none.
pub fn redact(payload: &str, update: &Update) -> Option<Redacted> {
    let (field, message) = match &update.kind {
        UpdateKind::Message(m) => ("message", m),
        UpdateKind::EditedMessage(m) => ("edited_message", m),
        UpdateKind::ChannelPost(m) => ("channel_post", m),
        UpdateKind::EditedChannelPost(m) => ("edited_channel_post", m),
        _ => return None,
    };
    let (key, entities, text) = match (message.text(), message.caption()) {
        (Some(text), _) => ("text", "entities", text),
        (None, Some(caption)) => ("caption", "caption_entities", caption),
        (None, None) => return None,
    };
    let (kept, code) = split_code(text)?;
    let payload = without_code(payload, field, key, entities, kept).unwrap_or_else(|| {
        // Not readable as a tree here (nesting too deep for serde_json):
        // keep nothing of it but its id rather than the code.
        serde_json::json!({ "update_id": update.id.0, "redacted": true }).to_string()
    });
    Some(Redacted {
        payload,
        code: code.to_string(),
    })
}

/// The update's text with `update[field][key]` set to `kept`, and the
/// entities that pointed past `kept` dropped (a range outside the text
/// would make the update unreadable).
fn without_code(
    payload: &str,
    field: &str,
    key: &str,
    entities: &str,
    kept: &str,
) -> Option<String> {
    let mut value: Value = serde_json::from_str(payload).ok()?;
    let message = value.get_mut(field)?.as_object_mut()?;
    message.insert(key.to_string(), Value::String(kept.to_string()));
    let units = kept.encode_utf16().count() as u64;
    if let Some(list) = message.get_mut(entities).and_then(Value::as_array_mut) {
        list.retain(|entity| {
            let at = |name: &str| entity.get(name).and_then(Value::as_u64);
            matches!((at("offset"), at("length")), (Some(o), Some(l)) if o.saturating_add(l) <= units)
        });
    }
    Some(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(message: Value) -> (String, Update) {
        let text = json!({"update_id": 9, "message": message}).to_string();
        let update = serde_json::from_str(&text).unwrap();
        (text, update)
    }

    fn message(text_key: &str, text: &str) -> Value {
        json!({
            "message_id": 1, "date": 0,
            "chat": {"id": 5, "type": "private", "first_name": "A"},
            "from": {"id": 5, "is_bot": false, "first_name": "A"},
            text_key: text,
            "entities": [
                {"type": "bot_command", "offset": 0, "length": 5},
                {"type": "bold", "offset": 6, "length": 4}
            ]
        })
    }

    #[test]
    fn the_code_leaves_the_recorded_update_and_the_rest_stays() {
        let (text, parsed) = update(message("text", "/pair ABCD-EFGHJK"));
        let redacted = redact(&text, &parsed).unwrap();
        assert_eq!(redacted.code, "ABCD-EFGHJK");
        assert!(!redacted.payload.contains("ABCD"), "{}", redacted.payload);
        let back: Value = serde_json::from_str(&redacted.payload).unwrap();
        assert_eq!(back["message"]["text"], "/pair");
        assert_eq!(back["message"]["chat"]["id"], 5);
        assert_eq!(
            back["message"]["entities"],
            json!([{"type": "bot_command", "offset": 0, "length": 5}]),
            "an entity over the code would point past the text"
        );
        // What is recorded still reads as an update: the command alone.
        let again: Update = serde_json::from_str(&redacted.payload).unwrap();
        assert!(redact(&redacted.payload, &again).is_none());
    }

    #[test]
    fn only_a_code_command_is_touched() {
        for text in ["hello ABCDEFGHJK", "/status ABCDEFGHJK", "/start"] {
            let (raw, parsed) = update(message("text", text));
            assert_eq!(redact(&raw, &parsed), None, "{text}");
        }
        let mut captioned = message("caption", "/start ABCDEFGHJK");
        captioned["photo"] =
            json!([{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]);
        let (raw, parsed) = update(captioned);
        let redacted = redact(&raw, &parsed).unwrap();
        assert!(!redacted.payload.contains("ABCDEFGHJK"));
    }
}
