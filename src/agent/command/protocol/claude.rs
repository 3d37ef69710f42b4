//! Claude Code's `claude -p --output-format stream-json --verbose` events.
//!
//! One JSON object per line, with a `type`:
//! * `system` / `subtype: "init"`: carries `session_id` (what `--resume`
//!   takes); other `system` subtypes are ignored;
//! * `assistant`: `message.content[]` blocks of `text`, `tool_use`
//!   (`name`, `input`) and `thinking`;
//! * `user`: `message.content[]` with `tool_result` blocks (a sign of life);
//! * `result`: the end: `result` (the final text), `is_error`, `subtype`,
//!   `total_cost_usd`, `usage` (`input_tokens`, `output_tokens`,
//!   `cache_read_input_tokens`, `cache_creation_input_tokens`);
//! * `stream_event` (with `--include-partial-messages`): the API's raw
//!   stream events under `event`; a `content_block_delta` whose `delta`
//!   is a `text_delta` streams the answer's text into the preview before
//!   the whole `assistant` message arrives (which then replaces it), and
//!   a `content_block_stop` ends that piece. Deltas of a subagent
//!   (`parent_tool_use_id` set), of thinking and of tool input are not
//!   shown.

use serde_json::Value;

use super::{one_line, str_field, u64_field, AgentEvent, Skipped};
use crate::store::AgentUsage;

/// How long a tool's argument may be in its progress line.
const ARG_CHARS: usize = 80;

/// The events of one Claude line.
pub fn parse(value: &Value) -> Result<Vec<AgentEvent>, Skipped> {
    let kind = str_field(value, "type").unwrap_or_default();
    Ok(match kind {
        "system" => match (str_field(value, "subtype"), str_field(value, "session_id")) {
            (Some("init"), Some(id)) if !id.is_empty() => vec![AgentEvent::Session(id.to_string())],
            _ => vec![AgentEvent::Nothing],
        },
        "assistant" => assistant(value),
        "stream_event" => vec![stream_event(value)],
        "user" | "rate_limit_event" => vec![AgentEvent::Nothing],
        "result" => vec![result(value)],
        other => return Err(Skipped::UnknownType(other.to_string())),
    })
}

/// A raw stream event: only the main agent's text deltas show.
fn stream_event(value: &Value) -> AgentEvent {
    if value
        .get("parent_tool_use_id")
        .is_some_and(|id| !id.is_null())
    {
        return AgentEvent::Nothing;
    }
    let event = value.get("event").unwrap_or(&Value::Null);
    match str_field(event, "type") {
        Some("content_block_delta") => {
            let delta = event.get("delta").unwrap_or(&Value::Null);
            match (str_field(delta, "type"), str_field(delta, "text")) {
                (Some("text_delta"), Some(text)) => AgentEvent::TextDelta(text.to_string()),
                _ => AgentEvent::Nothing,
            }
        }
        Some("content_block_stop" | "message_stop") => AgentEvent::TextBlockEnd,
        _ => AgentEvent::Nothing,
    }
}

fn assistant(value: &Value) -> Vec<AgentEvent> {
    let blocks = value
        .pointer("/message/content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut events = Vec::new();
    for block in blocks {
        match str_field(block, "type") {
            Some("text") => {
                if let Some(text) = str_field(block, "text") {
                    events.push(AgentEvent::Text(text.to_string()));
                }
            }
            Some("tool_use") => {
                let name = str_field(block, "name").unwrap_or("tool");
                let input = block.get("input").unwrap_or(&Value::Null);
                events.push(AgentEvent::Tool(tool_line(name, input)));
            }
            _ => {}
        }
    }
    if events.is_empty() {
        events.push(AgentEvent::Nothing);
    }
    events
}

/// `🔧 Bash: cargo test`, `✏️ Edit src/main.rs`, `🔎 Grep "todo"`.
pub fn tool_line(name: &str, input: &Value) -> String {
    let arg = |key: &str| str_field(input, key).map(|s| one_line(s, ARG_CHARS));
    match name {
        "Bash" => match arg("command") {
            Some(command) => format!("🔧 Bash: {command}"),
            None => "🔧 Bash".to_string(),
        },
        "Edit" | "MultiEdit" | "Write" | "NotebookEdit" => {
            match arg("file_path").or_else(|| arg("notebook_path")) {
                Some(path) => format!("✏️ {name} {path}"),
                None => format!("✏️ {name}"),
            }
        }
        "Read" => match arg("file_path") {
            Some(path) => format!("📖 Read {path}"),
            None => "📖 Read".to_string(),
        },
        "Grep" | "Glob" => match arg("pattern") {
            Some(pattern) => format!("🔎 {name} \"{pattern}\""),
            None => format!("🔎 {name}"),
        },
        "WebFetch" => match arg("url") {
            Some(url) => format!("🌐 WebFetch {url}"),
            None => "🌐 WebFetch".to_string(),
        },
        "WebSearch" => match arg("query") {
            Some(query) => format!("🌐 WebSearch \"{query}\""),
            None => "🌐 WebSearch".to_string(),
        },
        "Task" | "Agent" => match arg("description") {
            Some(what) => format!("🤖 {name}: {what}"),
            None => format!("🤖 {name}"),
        },
        "TodoWrite" => "📝 Updated the plan".to_string(),
        other => format!("🔧 {}", one_line(other, ARG_CHARS)),
    }
}

fn result(value: &Value) -> AgentEvent {
    let usage = usage(value);
    let text = str_field(value, "result").map(str::to_string);
    let is_error = value
        .get("is_error")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || str_field(value, "subtype").is_some_and(|s| s.starts_with("error"));
    if is_error {
        let message = text
            .filter(|t| !t.trim().is_empty())
            .or_else(|| str_field(value, "error").map(str::to_string))
            .or_else(|| {
                value
                    .get("errors")
                    .and_then(Value::as_array)
                    .and_then(|e| e.first())
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| {
                format!(
                    "Claude Code ended with {}",
                    str_field(value, "subtype").unwrap_or("an error")
                )
            });
        return AgentEvent::Failed { message, usage };
    }
    AgentEvent::Completed {
        usage,
        answer: text,
    }
}

fn usage(value: &Value) -> Option<AgentUsage> {
    let cost = value.get("total_cost_usd").and_then(Value::as_f64);
    let tokens = value.get("usage").filter(|u| u.is_object());
    if cost.is_none() && tokens.is_none() {
        return None;
    }
    let tokens = tokens.unwrap_or(&Value::Null);
    Some(AgentUsage {
        turns: 1,
        input_tokens: u64_field(tokens, "input_tokens")
            + u64_field(tokens, "cache_creation_input_tokens"),
        cached_input_tokens: u64_field(tokens, "cache_read_input_tokens"),
        output_tokens: u64_field(tokens, "output_tokens"),
        cost_usd: cost.unwrap_or(0.0),
    })
}

/// Recorded lines for tests elsewhere in the protocol module.
#[cfg(test)]
pub mod tests_support {
    /// `system/init`.
    pub const INIT: &str = r#"{"type":"system","subtype":"init","session_id":"sess-1","cwd":"/repo","model":"claude-sonnet","permissionMode":"default","tools":["Bash","Edit"],"mcp_servers":[]}"#;
    /// A successful `result`.
    pub const RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":1200,"num_turns":2,"result":"All tests pass.","session_id":"sess-1","total_cost_usd":0.0123,"usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":300,"output_tokens":50}}"#;
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;
    use crate::agent::command::protocol::{parse_line, Protocol};

    fn events(line: &str) -> Vec<AgentEvent> {
        parse_line(Protocol::ClaudeStreamJson, line).unwrap()
    }

    #[test]
    fn a_recorded_turn_parses_into_session_text_tools_and_result() {
        assert_eq!(events(INIT), [AgentEvent::Session("sess-1".into())]);
        let assistant = r#"{"type":"assistant","session_id":"sess-1","message":{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Running the tests."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"cargo test\n  --all","description":"run tests"}}]}}"#;
        assert_eq!(
            events(assistant),
            [
                AgentEvent::Text("Running the tests.".into()),
                AgentEvent::Tool("🔧 Bash: cargo test --all".into()),
            ]
        );
        let tool_result = r#"{"type":"user","session_id":"sess-1","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"ok","is_error":false}]}}"#;
        assert_eq!(events(tool_result), [AgentEvent::Nothing]);
        match &events(RESULT)[..] {
            [AgentEvent::Completed {
                usage: Some(u),
                answer: Some(a),
            }] => {
                assert_eq!(a, "All tests pass.");
                assert_eq!(
                    (u.input_tokens, u.cached_input_tokens, u.output_tokens),
                    (120, 300, 50)
                );
                assert!((u.cost_usd - 0.0123).abs() < 1e-9);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn partial_messages_stream_the_main_agents_text() {
        let delta = r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}},"session_id":"s","parent_tool_use_id":null,"uuid":"u1"}"#;
        assert_eq!(events(delta), [AgentEvent::TextDelta("Hel".into())]);
        let stop = r#"{"type":"stream_event","event":{"type":"content_block_stop","index":0},"session_id":"s","parent_tool_use_id":null}"#;
        assert_eq!(events(stop), [AgentEvent::TextBlockEnd]);
        let sub = r#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"parent_tool_use_id":"toolu_9"}"#;
        assert_eq!(events(sub), [AgentEvent::Nothing]);
        let json_delta = r#"{"type":"stream_event","event":{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a"}}}"#;
        assert_eq!(events(json_delta), [AgentEvent::Nothing]);
        let start =
            r#"{"type":"stream_event","event":{"type":"message_start","message":{"id":"m"}}}"#;
        assert_eq!(events(start), [AgentEvent::Nothing]);
    }

    #[test]
    fn tool_lines_are_short_and_say_what_runs() {
        let input = serde_json::json!({"file_path": "src/main.rs", "pattern": "todo"});
        assert_eq!(tool_line("Edit", &input), "✏️ Edit src/main.rs");
        assert_eq!(tool_line("Grep", &input), "🔎 Grep \"todo\"");
        assert_eq!(tool_line("Read", &input), "📖 Read src/main.rs");
        assert_eq!(tool_line("mcp__x__y", &Value::Null), "🔧 mcp__x__y");
        let long = serde_json::json!({"command": "x".repeat(500)});
        assert!(tool_line("Bash", &long).chars().count() < 100);
    }

    #[test]
    fn an_error_result_is_a_failure_with_its_cost() {
        let line = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"result":"","total_cost_usd":0.5,"usage":{"input_tokens":1,"output_tokens":1},"session_id":"s"}"#;
        match &events(line)[..] {
            [AgentEvent::Failed {
                message,
                usage: Some(u),
            }] => {
                assert!(message.contains("error_during_execution"), "{message}");
                assert!((u.cost_usd - 0.5).abs() < 1e-9);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_system_events_and_unknown_types() {
        assert_eq!(
            events(r#"{"type":"system","subtype":"compact_boundary"}"#),
            [AgentEvent::Nothing]
        );
        assert_eq!(
            parse_line(Protocol::ClaudeStreamJson, r#"{"type":"hologram"}"#),
            Err(Skipped::UnknownType("hologram".into()))
        );
        assert_eq!(
            parse_line(Protocol::ClaudeStreamJson, "{\"type\":\"assist"),
            Err(Skipped::NotJson)
        );
    }
}
