//! Parameter parsing and validation, worded as Telegram words it.

use serde_json::{json, Value};
use std::time::Duration;

use super::flood::RetryScope;
use super::state::ApiFailure;
use super::telegram::{
    CHAT_SCOPED_METHODS, KNOWN_UPDATE_KINDS, MAX_POLL_SECS, MAX_TEXT_UTF16,
    NOT_DELIVERED_BY_DEFAULT,
};
use super::types::MessageVersion;
use super::updates::{unix_now, utf16_len};

pub(super) struct PollParams {
    pub(super) offset: i64,
    pub(super) limit: usize,
    pub(super) hold: Duration,
    pub(super) allowed_updates: Option<Vec<String>>,
}

impl PollParams {
    pub(super) fn parse(body: &Value) -> Result<Self, ApiFailure> {
        let offset = int_param(body, "offset")?.unwrap_or(0);
        let limit = int_param(body, "limit")?.unwrap_or(100).clamp(1, 100);
        let timeout = int_param(body, "timeout")?
            .unwrap_or(0)
            .clamp(0, MAX_POLL_SECS as i64);
        let allowed_updates = allowed_updates_param(body)?;
        Ok(Self {
            offset,
            // Both clamped to small positive ranges above, so the casts are lossless.
            limit: limit as usize,
            hold: Duration::from_secs(timeout as u64),
            allowed_updates,
        })
    }
}

/// Which limit applies to an over-long text: Telegram words it differently
/// for sends and edits (teloxide: `MessageIsTooLong` vs `EditedMessageIsTooLong`).
#[derive(Clone, Copy)]
pub(super) enum TooLong {
    Send,
    Edit,
}

/// Validates `text`, `entities` and `reply_markup` the way Telegram does
/// and turns them into a message version.
pub(super) fn parse_version(body: &Value, too_long: TooLong) -> Result<MessageVersion, ApiFailure> {
    let text = str_param(body, "text")?.unwrap_or_default();
    if text.trim().is_empty() {
        return Err(ApiFailure::bad_request(
            "Bad Request: message text is empty",
        ));
    }
    if utf16_len(&text) > MAX_TEXT_UTF16 {
        let description = match too_long {
            TooLong::Send => "Bad Request: message is too long",
            TooLong::Edit => "Bad Request: MESSAGE_TOO_LONG",
        };
        return Err(ApiFailure::bad_request(description));
    }
    let entities = parse_entities(&text, body.get("entities"))?;
    Ok(MessageVersion {
        text,
        entities,
        reply_markup: inline_markup(body.get("reply_markup")),
        parse_mode: str_param(body, "parse_mode")?,
        date: unix_now(),
    })
}

/// Checks every entity lies within the text (offsets are UTF-16 units).
pub(super) fn parse_entities(text: &str, raw: Option<&Value>) -> Result<Vec<Value>, ApiFailure> {
    let cant_parse =
        |why: String| ApiFailure::bad_request(format!("Bad Request: can't parse entities: {why}"));
    let parsed;
    let list = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => {
            parsed = serde_json::from_str::<Value>(s).map_err(|e| cant_parse(e.to_string()))?;
            &parsed
        }
        Some(value) => value,
    };
    let Value::Array(entities) = list else {
        return Err(cant_parse("entities must be an array".to_owned()));
    };
    let text_len = utf16_len(text) as u64;
    for (i, entity) in entities.iter().enumerate() {
        let offset = entity.get("offset").and_then(Value::as_u64);
        let length = entity.get("length").and_then(Value::as_u64);
        let kind = entity.get("type").and_then(Value::as_str);
        let (Some(offset), Some(length), Some(_)) = (offset, length, kind) else {
            return Err(cant_parse(format!(
                "entity {i} needs a type, an offset and a length"
            )));
        };
        if offset.saturating_add(length) > text_len {
            return Err(cant_parse(format!(
                "entity {i} (offset {offset}, length {length}) ends beyond the text ({text_len} UTF-16 code units)"
            )));
        }
    }
    Ok(entities.clone())
}

/// Messages only carry inline keyboards; reply keyboards aren't echoed
/// (and would break teloxide's `Message` parsing if they were).
pub(super) fn inline_markup(raw: Option<&Value>) -> Option<Value> {
    let markup = match raw? {
        Value::String(s) => serde_json::from_str(s).ok()?,
        value => value.clone(),
    };
    markup.get("inline_keyboard").is_some().then_some(markup)
}

pub(super) fn is_valid_command(entry: &Value) -> bool {
    let command = entry.get("command").and_then(Value::as_str).unwrap_or("");
    let description = entry
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let command_ok = (1..=32).contains(&command.len())
        && command
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let description_ok = (1..=256).contains(&description.chars().count());
    command_ok && description_ok
}

pub(super) fn scope_of(body: &Value) -> &Value {
    body.get("scope").unwrap_or(&Value::Null)
}

pub(super) fn language_of(body: &Value) -> &Value {
    body.get("language_code").unwrap_or(&Value::Null)
}

/// Commands are stored per (scope, language); a missing scope means the
/// default scope.
pub(super) fn commands_key(scope: &Value, language: &Value) -> String {
    let scope = match scope {
        Value::Null => json!({ "type": "default" }),
        other => other.clone(),
    };
    format!("{scope}|{}", language.as_str().unwrap_or(""))
}

pub(super) fn retry_scope(method: &str, body: &Value) -> RetryScope {
    let chat_id = body.get("chat_id").and_then(value_as_i64);
    match chat_id {
        Some(chat_id) if CHAT_SCOPED_METHODS.contains(&method) => RetryScope::Chat(chat_id),
        _ => RetryScope::Method(method.to_owned()),
    }
}

pub(super) fn is_allowed(update: &Value, allowed: Option<&[String]>) -> bool {
    let Some(kind) = update_kind(update) else {
        // Odd test updates with no known kind are always delivered.
        return true;
    };
    match allowed {
        Some(list) if !list.is_empty() => list.iter().any(|a| a == kind),
        _ => !NOT_DELIVERED_BY_DEFAULT.contains(&kind),
    }
}

pub(super) fn update_kind(update: &Value) -> Option<&'static str> {
    let object = update.as_object()?;
    KNOWN_UPDATE_KINDS
        .iter()
        .copied()
        .find(|kind| object.contains_key(*kind))
}

pub(super) fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn int_param(body: &Value, key: &str) -> Result<Option<i64>, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value_as_i64(value).map(Some).ok_or_else(|| {
            ApiFailure::bad_request(format!("Bad Request: field \"{key}\" must be an Integer"))
        }),
    }
}

pub(super) fn str_param(body: &Value, key: &str) -> Result<Option<String>, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => Err(ApiFailure::bad_request(format!(
            "Bad Request: field \"{key}\" must be a String"
        ))),
    }
}

pub(super) fn bool_param(body: &Value, key: &str) -> Result<bool, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(ApiFailure::bad_request(format!(
            "Bad Request: field \"{key}\" must be a Boolean"
        ))),
    }
}

/// `chat_id` is required; `@username` strings can't be resolved by the fake.
pub(super) fn chat_id_param(body: &Value) -> Result<i64, ApiFailure> {
    match body.get("chat_id") {
        None | Some(Value::Null) => Err(ApiFailure::bad_request("Bad Request: chat_id is empty")),
        Some(value) => value_as_i64(value)
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: chat not found")),
    }
}

// ---------------------------------------------------------------------------

/// `allowed_updates` (getUpdates and setWebhook read it alike): absent or
/// null is "unchanged", an array of kinds, anything else refused.
pub(super) fn allowed_updates_param(body: &Value) -> Result<Option<Vec<String>>, ApiFailure> {
    match body.get("allowed_updates") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(kinds)) => Ok(Some(
            kinds
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        )),
        Some(_) => Err(ApiFailure::bad_request(
            "Bad Request: can't parse allowed updates",
        )),
    }
}
