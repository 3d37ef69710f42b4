//! Reading raw updates: an update's JSON text kept as Telegram sent it
//! ([`RawUpdate`], with the few top-level fields the intake sorts it by),
//! and teloxide's types parsed from such text on a stack deep enough for
//! however deeply it nests. Pure apart from the helper thread; it never
//! touches the store or the network.
//!
//! Why text and not a `serde_json::Value`: a polled batch's updates are
//! sliced out of the answer's text as they are (`serde_json`'s
//! `RawValue`), the inbox records that text as the payload, and teloxide
//! parses its `Update` from it once. A `Value` tree per update, and the
//! serialization back to text the inbox needs, cost about as much again as
//! teloxide's own parse (a few microseconds per update, allocation-heavy);
//! only the rare updates that need more than the head (a button press, a
//! draft stop) are read into a `Value`.

use serde::de::Deserializer;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Number, Value};
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

/// Telegram's stop control on a streamed draft (Bot API
/// `MessageGenerationStopped`: chat, message_thread_id, draft_id): the
/// update's field, and the update type polling and the webhook ask for.
pub const DRAFT_STOP_UPDATE: &str = "stopped_message_generation";

/// One update as received: its JSON text, whole, and its [`Head`].
#[derive(Debug)]
pub struct RawUpdate {
    text: Box<RawValue>,
    head: Head,
}

/// The top-level fields of an update the intake sorts it by, read the way
/// `serde_json::Value`'s accessors read them (`update_id` as `as_i64` /
/// `as_u64` would; a key counts as present whatever its value, `null`
/// included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// `update_id`, when it is an integer that fits an `i64`.
    pub id: Option<i64>,
    /// `update_id`, when it is an integer that fits a `u64` (the polling
    /// offset is computed from it).
    pub id_u64: Option<u64>,
    /// A `callback_query` is present (a button press).
    pub callback_query: bool,
    /// A `stopped_message_generation` is present (Telegram's draft stop,
    /// [`DRAFT_STOP_UPDATE`]).
    pub draft_stop: bool,
}

impl RawUpdate {
    /// The update whose JSON text is `text` (valid JSON by construction).
    pub fn new(text: Box<RawValue>) -> RawUpdate {
        let head = Head::read(text.get());
        RawUpdate { text, head }
    }

    /// The update as Telegram sent it.
    pub fn text(&self) -> &str {
        self.text.get()
    }

    /// The fields the intake sorts it by.
    pub fn head(&self) -> Head {
        self.head
    }

    /// The whole update as a tree, for the rare paths that read more than
    /// its head (a button press, a draft stop).
    pub fn to_value(&self) -> Value {
        // The text is valid JSON (a `RawValue`): only a nesting deeper than
        // serde_json's recursion limit fails, read as `null` (no fields).
        serde_json::from_str(self.text()).unwrap_or(Value::Null)
    }
}

impl From<Value> for RawUpdate {
    fn from(value: Value) -> RawUpdate {
        // A `Value`'s serialization is always valid JSON.
        let text =
            RawValue::from_string(value.to_string()).unwrap_or_else(|_| RawValue::NULL.to_owned());
        RawUpdate::new(text)
    }
}

impl<'de> Deserialize<'de> for RawUpdate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RawUpdate, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(RawUpdate::new)
    }
}

/// The head's fields as borrowed slices of the update's text; a key that is
/// present is `Some` even when its value is `null`.
#[derive(Deserialize)]
struct HeadFields<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    update_id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    callback_query: Option<&'a RawValue>,
    // `DRAFT_STOP_UPDATE` (a test holds them equal).
    #[serde(
        default,
        borrow,
        deserialize_with = "present",
        rename = "stopped_message_generation"
    )]
    draft_stop: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

impl Head {
    /// Read the head of the JSON text `text`. Not an object: no fields. An
    /// object the quick read refuses (a key given twice) is read through a
    /// `Value`, so the last of a repeated key counts, as it does there.
    fn read(text: &str) -> Head {
        if !text.trim_start().starts_with('{') {
            return Head::default();
        }
        match serde_json::from_str::<HeadFields>(text) {
            Ok(fields) => Head::of_fields(
                fields.update_id.map(RawValue::get),
                fields.callback_query.is_some(),
                fields.draft_stop.is_some(),
            ),
            Err(_) => {
                let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
                Head::of_value(&value)
            }
        }
    }

    fn of_fields(update_id: Option<&str>, callback_query: bool, draft_stop: bool) -> Head {
        let id = update_id.and_then(|text| serde_json::from_str::<Number>(text).ok());
        Head {
            id: id.as_ref().and_then(Number::as_i64),
            id_u64: id.as_ref().and_then(Number::as_u64),
            callback_query,
            draft_stop,
        }
    }

    /// The head as `Value`'s accessors read it.
    fn of_value(value: &Value) -> Head {
        let id = value.get("update_id");
        Head {
            id: id.and_then(Value::as_i64),
            id_u64: id.and_then(Value::as_u64),
            callback_query: value.get("callback_query").is_some(),
            draft_stop: value.get(DRAFT_STOP_UPDATE).is_some(),
        }
    }
}

/// Parse an update (one read back from the inbox).
pub(super) fn parse_update(raw: &Value) -> Option<Update> {
    parse_guarded(raw)
}

/// Parse an update from its JSON text (the text the inbox records as its
/// payload): no `Value` in between.
pub(super) fn parse_update_text(text: &str) -> Option<Update> {
    parse_text(text)
}

/// Parse a Telegram object (an update, a callback query) from raw JSON on
/// a stack deep enough for its nesting: teloxide's deserializers recurse
/// (a chain of `reply_to_message` would overflow the task's stack).
/// (teloxide's types deserialize reliably from text, not from a
/// `serde_json::Value`, hence the detour through a string.)
pub(super) fn parse_guarded<T: serde::de::DeserializeOwned + Send>(raw: &Value) -> Option<T> {
    parse_text(&raw.to_string())
}

/// Parse the JSON text `text` on a stack deep enough for its nesting.
fn parse_text<T: serde::de::DeserializeOwned + Send>(text: &str) -> Option<T> {
    let depth = nesting_depth(text);
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

/// How deep objects and arrays nest in the JSON text `text` (0 for a
/// scalar), counted in one pass over its bytes: brackets inside strings
/// (escapes included) do not count. For text that is not JSON it is a
/// bound the parser's own checks make harmless, never a panic.
fn nesting_depth(text: &str) -> usize {
    let mut deepest = 0;
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in text.as_bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use proptest::prelude::{any, prop, prop_assert_eq, prop_oneof, proptest, Just, Strategy};
    use serde_json::value::RawValue;
    use serde_json::{json, Value};
    use teloxide::types::UpdateKind;

    use super::{
        nesting_depth, parse_update, parse_update_text, Head, RawUpdate, DRAFT_STOP_UPDATE,
    };

    /// The depth of a tree, counted on the tree: the oracle for the count
    /// on its text.
    fn tree_depth(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(tree_depth).max().unwrap_or(0),
            Value::Object(fields) => 1 + fields.values().map(tree_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    fn head_of(text: &str) -> Head {
        RawUpdate::new(RawValue::from_string(text.to_string()).expect("valid JSON")).head()
    }

    #[test]
    fn nesting_depth_counts_objects_and_arrays_but_not_brackets_in_strings() {
        assert_eq!(nesting_depth("1"), 0);
        assert_eq!(nesting_depth(r#"{"a": 1}"#), 1);
        assert_eq!(nesting_depth(r#"{"a": [1, {"b": []}], "c": {}}"#), 4);
        assert_eq!(nesting_depth(r#"{"a": "[[[{{{"}"#), 1);
        assert_eq!(nesting_depth(r#"{"a": "\"[[", "b": "\\", "c": [[]]}"#), 3);
        assert_eq!(nesting_depth(r#"{"a": "\"[[[[", "b": "\\[["}"#), 1);
        assert_eq!(nesting_depth(r#"["]\\\"]"]"#), 1);
    }

    #[test]
    fn the_head_is_read_as_values_read_it() {
        let head = head_of(r#"{"update_id": 7, "message": {"update_id": 9}}"#);
        assert_eq!(
            head,
            Head {
                id: Some(7),
                id_u64: Some(7),
                ..Head::default()
            }
        );
        assert_eq!(head_of(r#"{"update_id": -3}"#).id, Some(-3));
        assert_eq!(head_of(r#"{"update_id": -3}"#).id_u64, None);
        assert_eq!(head_of(r#"{"update_id": 18446744073709551615}"#).id, None);
        assert_eq!(
            head_of(r#"{"update_id": 18446744073709551615}"#).id_u64,
            Some(u64::MAX)
        );
        assert_eq!(head_of(r#"{"update_id": 7.0}"#).id, None);
        assert_eq!(head_of(r#"{"update_id": "7"}"#).id, None);
        // A key counts as present whatever its value.
        assert!(head_of(r#"{"update_id": 1, "callback_query": null}"#).callback_query);
        assert!(!head_of(r#"{"update_id": 1, "message": {"callback_query": {}}}"#).callback_query);
        let stop = json!({"update_id": 1, DRAFT_STOP_UPDATE: {"draft_id": 3}});
        assert!(head_of(&stop.to_string()).draft_stop);
        // A key given twice: the last counts (as in a `Value`).
        assert_eq!(head_of(r#"{"update_id": 1, "update_id": 2}"#).id, Some(2));
        // Not an object: nothing, even where a struct would read a list.
        assert_eq!(head_of("[5, {}, {}]"), Head::default());
        assert_eq!(head_of("5"), Head::default());
    }

    #[test]
    fn a_batch_is_read_as_the_texts_telegram_sent() {
        let answer = r#"{"ok": true, "result": [{"update_id": 1, "message": {"text": "a \"b\""}}, {"update_id":2}]}"#;
        let updates: Vec<RawUpdate> =
            crate::delivery::api::read_answer(answer).expect("a getUpdates answer");
        let texts: Vec<&str> = updates.iter().map(RawUpdate::text).collect();
        assert_eq!(
            texts,
            [
                r#"{"update_id": 1, "message": {"text": "a \"b\""}}"#,
                r#"{"update_id":2}"#
            ]
        );
        assert_eq!(updates[1].head().id, Some(2));
        let from_value = RawUpdate::from(json!({"update_id": 3}));
        assert_eq!(from_value.head().id, Some(3));
        assert_eq!(from_value.to_value(), json!({"update_id": 3}));
        assert_eq!(from_value.text(), r#"{"update_id":3}"#);
    }

    #[test]
    fn a_batch_with_an_update_nested_past_the_parsers_limit_is_still_read() {
        // serde_json refuses to build a tree (or a teloxide type) nested
        // deeper than 128 levels; the batch around such an update must
        // still be read, so that polling moves past it.
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        let answer = format!(
            r#"{{"ok": true, "result": [{{"update_id": 1, "message": {deep}}}, {{"update_id": 2}}]}}"#
        );
        let updates: Vec<RawUpdate> =
            crate::delivery::api::read_answer(&answer).expect("the batch is read");
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[0].head().id, Some(1));
        assert_eq!(nesting_depth(updates[0].text()), 301);
        assert!(parse_update_text(updates[0].text()).is_none());
        assert_eq!(updates[1].head().id, Some(2));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            r#"[\[\]{}"\\a-z\n ]{0,8}"#.prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..6)
                    .prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("update_id".to_string()),
            Just("callback_query".to_string()),
            Just(DRAFT_STOP_UPDATE.to_string()),
            r#"[a-z\["{\\]{0,4}"#,
        ]
    }

    proptest! {
        #[test]
        fn the_depth_of_the_text_is_the_depth_of_the_tree(value in json_value()) {
            prop_assert_eq!(nesting_depth(&value.to_string()), tree_depth(&value));
            let pretty = serde_json::to_string_pretty(&value).expect("serializes");
            prop_assert_eq!(nesting_depth(&pretty), tree_depth(&value));
        }

        #[test]
        fn the_head_of_the_text_is_the_head_of_the_tree(value in json_value()) {
            prop_assert_eq!(head_of(&value.to_string()), Head::of_value(&value));
        }

        #[test]
        fn the_head_of_an_update_is_read_whatever_its_fields_hold(
            fields in prop::collection::vec(
                (key(), prop_oneof![Just(Value::Null), json_value()]),
                0..5,
            ),
        ) {
            let value = Value::Object(fields.into_iter().collect());
            prop_assert_eq!(head_of(&value.to_string()), Head::of_value(&value));
        }
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
        let update = parse_update_text(&raw.to_string()).expect("parses from its text");
        assert!(matches!(update.kind, UpdateKind::Message(_)));
    }
}
