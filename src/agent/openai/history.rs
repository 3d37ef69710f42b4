//! History trimming to a character budget, oldest first, never separating
//! an assistant's tool calls from their results.

use crate::vocab::ChatMessage;
use crate::vocab::Role;
use serde_json::Value;

/// Build a request's messages: `system` first (never trimmed), as much of
/// `history` as fits `budget_chars`, then `user` (always included). Returns
/// the messages and how many history messages were left out.
///
/// History is dropped oldest first, in groups: an assistant message with
/// tool calls goes together with its tool results, so the result never
/// starts with a `tool` message nor has calls without results (the API
/// rejects both). Groups that are already broken in `history` (tool results
/// without their call, calls missing a result) are always left out. Sizes are
/// counted in characters of content (plus tool call JSON); when `system` and
/// `user` alone exceed the budget, no history is sent.
pub fn trim_history(
    system: Option<&str>,
    history: &[ChatMessage],
    user: &str,
    budget_chars: usize,
) -> (Vec<ChatMessage>, usize) {
    let fixed = system.map_or(0, |s| s.chars().count()) + user.chars().count();
    let mut room = budget_chars.saturating_sub(fixed);
    let mut kept_groups = Vec::new();
    for group in history_groups(history).into_iter().rev() {
        if !group_is_complete(group) {
            continue;
        }
        let cost: usize = group.iter().map(message_chars).sum();
        if cost > room {
            break;
        }
        room -= cost;
        kept_groups.push(group);
    }
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(ChatMessage::new(Role::System, system));
    }
    for group in kept_groups.into_iter().rev() {
        messages.extend_from_slice(group);
    }
    let kept = messages.len() - usize::from(system.is_some());
    messages.push(ChatMessage::new(Role::User, user));
    (messages, history.len() - kept)
}

/// Split history into groups that are kept or dropped as a whole: each
/// starts at a non-`tool` message and takes the `tool` messages after it
/// (a leading run of `tool` messages is a group of its own).
pub(super) fn history_groups(history: &[ChatMessage]) -> Vec<&[ChatMessage]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, message) in history.iter().enumerate().skip(1) {
        if message.role != Role::Tool {
            groups.push(&history[start..i]);
            start = i;
        }
    }
    if start < history.len() {
        groups.push(&history[start..]);
    }
    groups
}

/// A group may be sent: it does not start with a tool result, and tool
/// results appear exactly when its first message called tools, answering
/// every call.
pub(super) fn group_is_complete(group: &[ChatMessage]) -> bool {
    let Some((first, results)) = group.split_first() else {
        return false;
    };
    if first.role == Role::Tool {
        return false;
    }
    let calls = first
        .tool_calls
        .as_ref()
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if calls.is_empty() {
        return results.is_empty();
    }
    calls.iter().all(|call| {
        call["id"].as_str().is_some_and(|id| {
            results
                .iter()
                .any(|result| result.tool_call_id.as_deref() == Some(id))
        })
    })
}

pub(super) fn message_chars(message: &ChatMessage) -> usize {
    let calls = message
        .tool_calls
        .as_ref()
        .map_or(0, |calls| calls.to_string().chars().count());
    message.content.chars().count() + calls
}
