//! The inbox payload of an internal event: what a journaled wakeup or
//! scheduled run is kept as, so that a restart rebuilds the very event.
//!
//! Internal events do not come from Telegram, but they are journaled in
//! the same inbox as updates (under negative ids) before they enter the
//! adapter: the transport's ledger journals wakeups, the scheduler
//! journals its runs in the transaction that moves the job on
//! ([`crate::store::Store::fire_job`]), and restart recovery reads both
//! back with [`internal_from_payload`]. Both writers and the reader share
//! this one format.
//!
//! This module owns the format. It must never do I/O.

use serde_json::Value;

use crate::vocab::SessionId;
use crate::vocab::{ChatType, MessageEvent, Platform, SessionSource};

/// The inbox payload of an internal event: enough to rebuild it.
pub fn internal_payload(event: &MessageEvent) -> Value {
    let source = &event.source;
    serde_json::json!({
        "telegate_wakeup": {
            "text": event.text,
            "chat_id": source.chat_id,
            "chat_type": source.chat_type.as_str(),
            "thread_id": source.thread_id,
            "user_id": source.user_id,
            "user_name": source.user_name,
            "session_id": event.session_override.as_ref().map(|s| s.as_str().to_string()),
        }
    })
}

/// The chat type named `name` (`dm`, `group`, `supergroup`; anything else
/// is a channel), as [`ChatType::as_str`] writes it.
pub fn chat_type_named(name: &str) -> ChatType {
    match name {
        "dm" => ChatType::Dm,
        "group" => ChatType::Group,
        "supergroup" => ChatType::Supergroup,
        _ => ChatType::Channel,
    }
}

/// The internal event a journaled payload describes (its message id is the
/// inbox row's, set by the caller).
pub fn internal_from_payload(payload: &Value) -> Option<MessageEvent> {
    let wakeup = payload.get("telegate_wakeup")?;
    let source = SessionSource {
        platform: Platform::Telegram,
        chat_id: wakeup.get("chat_id")?.as_i64()?,
        chat_type: chat_type_named(wakeup.get("chat_type")?.as_str()?),
        thread_id: wakeup
            .get("thread_id")
            .and_then(Value::as_i64)
            .and_then(|t| i32::try_from(t).ok()),
        user_id: wakeup.get("user_id").and_then(Value::as_u64),
        user_name: wakeup
            .get("user_name")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let text = wakeup.get("text")?.as_str()?;
    let mut event = MessageEvent::internal(source, text);
    if let Some(session) = wakeup.get("session_id").and_then(Value::as_str) {
        event = event.with_session_override(SessionId::new(session));
    }
    Some(event)
}
