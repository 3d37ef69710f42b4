//! Reading raw updates: teloxide's types from the raw JSON the inbox keeps,
//! on a stack deep enough for however deeply an update nests. Pure apart
//! from the helper thread; it never touches the store or the network.

use serde_json::Value;
use teloxide::types::Update;

/// Updates nested at most this deep (objects and arrays) are parsed in
/// place; deeper ones on a thread with a stack sized for them. teloxide's
/// `Message` deserializer recurses once per nested message
/// (`reply_to_message`, `pinned_message`) with large frames: a chain of a
/// dozen nested messages overflows a 2 MiB task stack (debug build) and
/// aborts the whole process. Telegram nests messages at most a level or
/// two, so only malformed or hostile updates take the slow path.
const PARSE_IN_PLACE_DEPTH: usize = 8;
/// Stack reserved per level of nesting on that thread (committed lazily).
const PARSE_STACK_PER_LEVEL: usize = 512 * 1024;

/// Parse an update. (teloxide's types deserialize reliably from text, not
/// from a `serde_json::Value`, hence the detour through a string.)
pub(super) fn parse_update(raw: &Value) -> Option<Update> {
    parse_guarded(raw)
}

/// Parse an update whose JSON text is already at hand (the text the inbox
/// records as its payload): one serialization per update, not two.
pub(super) fn parse_update_text(raw: &Value, text: &str) -> Option<Update> {
    parse_text(raw, text)
}

/// Parse a Telegram object (an update, a callback query) from raw JSON on
/// a stack deep enough for its nesting: teloxide's deserializers recurse
/// (a chain of `reply_to_message` would overflow the task's stack).
pub(super) fn parse_guarded<T: serde::de::DeserializeOwned + Send>(raw: &Value) -> Option<T> {
    parse_text(raw, &raw.to_string())
}

/// Parse `text`, the serialization of `raw`, on a stack deep enough for
/// `raw`'s nesting.
fn parse_text<T: serde::de::DeserializeOwned + Send>(raw: &Value, text: &str) -> Option<T> {
    let depth = nesting_depth(raw);
    if depth <= PARSE_IN_PLACE_DEPTH {
        return serde_json::from_str(text).ok();
    }
    let stack = depth
        .saturating_add(4)
        .saturating_mul(PARSE_STACK_PER_LEVEL);
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("telegate-parse".into())
            .stack_size(stack)
            .spawn_scoped(scope, || serde_json::from_str::<T>(text).ok())
            .ok()?
            .join()
            .ok()
            .flatten()
    })
}

/// How deep objects and arrays nest in `value` (0 for a scalar), found
/// without recursion.
fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut todo = vec![(value, 0usize)];
    while let Some((value, depth)) = todo.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(fields) => Box::new(fields.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        todo.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use teloxide::types::UpdateKind;

    use super::{nesting_depth, parse_update, parse_update_text};

    #[test]
    fn nesting_depth_counts_objects_and_arrays() {
        assert_eq!(nesting_depth(&json!(1)), 0);
        assert_eq!(nesting_depth(&json!({"a": 1})), 1);
        assert_eq!(nesting_depth(&json!({"a": [1, {"b": []}], "c": {}})), 4);
    }

    #[test]
    fn a_deep_reply_chain_is_parsed_without_overflowing_the_stack() {
        // Found by tests/it/inbound_fuzz.rs: a dozen nested `reply_to_message`
        // overflowed the stack inside teloxide and aborted the process.
        let base = json!({
            "message_id": 1, "date": 1, "text": "hi",
            "chat": {"id": 1, "type": "private", "first_name": "A"},
        });
        let mut message = base.clone();
        for _ in 0..100 {
            let mut outer = base.clone();
            outer["reply_to_message"] = message;
            message = outer;
        }
        let raw = json!({"update_id": 5, "message": message});
        let update = parse_update(&raw).expect("a deep but valid update parses");
        assert!(matches!(update.kind, UpdateKind::Message(_)));
        // The intake's path: the payload text it records, parsed as is.
        let update = parse_update_text(&raw, &raw.to_string()).expect("parses from its text");
        assert!(matches!(update.kind, UpdateKind::Message(_)));
    }
}
