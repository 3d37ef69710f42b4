//! Codex's `codex exec --json` events (the `ThreadEvent`s of
//! `codex-rs/exec/src/exec_events.rs`).
//!
//! * `thread.started`: `thread_id` (what `codex exec resume` takes);
//! * `turn.started`; `turn.completed` with `usage` (`input_tokens`,
//!   `cached_input_tokens`, `output_tokens`; Codex reports no cost). After
//!   `exec resume` the figures are the thread's running total, not the
//!   turn's: the command backend records the difference per thread
//!   ([`crate::store::Store::add_agent_thread_usage`]);
//! * `turn.failed` with `error.message`; `error` with `message`;
//! * `item.started` / `item.updated` / `item.completed` with an `item`
//!   whose `type` is `agent_message` (`text`), `reasoning`,
//!   `command_execution` (`command`), `file_change` (`changes[]` of `path`
//!   and `kind`), `mcp_tool_call` (`server`, `tool`), `web_search`
//!   (`query`), `todo_list`, `plan` or `error` (`message`);
//! * `item.plan.delta` and `request_user_input` are known and ignored.

use serde_json::Value;

use super::{one_line, str_field, u64_field, AgentEvent, Skipped};
use crate::store::AgentUsage;

const ARG_CHARS: usize = 80;

/// The events of one Codex line.
pub fn parse(value: &Value) -> Result<Vec<AgentEvent>, Skipped> {
    let kind = str_field(value, "type").unwrap_or_default();
    Ok(match kind {
        "thread.started" => match str_field(value, "thread_id") {
            Some(id) if !id.is_empty() => vec![AgentEvent::Session(id.to_string())],
            _ => vec![AgentEvent::Nothing],
        },
        "turn.started" | "item.updated" | "item.plan.delta" | "request_user_input" => {
            vec![AgentEvent::Nothing]
        }
        "turn.completed" => vec![AgentEvent::Completed {
            usage: value.get("usage").map(usage),
            answer: None,
        }],
        "turn.failed" => vec![AgentEvent::Failed {
            message: value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("Codex reported that the turn failed")
                .to_string(),
            usage: None,
        }],
        "error" => vec![AgentEvent::Failed {
            message: str_field(value, "message")
                .unwrap_or("Codex reported an error")
                .to_string(),
            usage: None,
        }],
        "item.started" => vec![started(value.get("item").unwrap_or(&Value::Null))],
        "item.completed" => completed(value.get("item").unwrap_or(&Value::Null)),
        other => return Err(Skipped::UnknownType(other.to_string())),
    })
}

/// An item starting: commands, tool calls and searches show a line now.
fn started(item: &Value) -> AgentEvent {
    let arg = |key: &str| str_field(item, key).map(|s| one_line(s, ARG_CHARS));
    match str_field(item, "type") {
        Some("command_execution") => match arg("command") {
            Some(command) => AgentEvent::Tool(format!("🔧 Shell: {command}")),
            None => AgentEvent::Tool("🔧 Shell".to_string()),
        },
        Some("mcp_tool_call") => AgentEvent::Tool(format!(
            "🔧 {}.{}",
            arg("server").unwrap_or_default(),
            arg("tool").unwrap_or_default()
        )),
        Some("web_search") => match arg("query") {
            Some(query) => AgentEvent::Tool(format!("🌐 Search \"{query}\"")),
            None => AgentEvent::Tool("🌐 Search".to_string()),
        },
        _ => AgentEvent::Nothing,
    }
}

/// An item finishing: messages and file changes (which have no start).
fn completed(item: &Value) -> Vec<AgentEvent> {
    match str_field(item, "type") {
        Some("agent_message") => match str_field(item, "text") {
            Some(text) => vec![AgentEvent::Text(text.to_string())],
            None => vec![AgentEvent::Nothing],
        },
        Some("file_change") => {
            let changes = item
                .get("changes")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let lines: Vec<AgentEvent> = changes
                .iter()
                .map(|change| {
                    let path = one_line(str_field(change, "path").unwrap_or("?"), ARG_CHARS);
                    let line = match str_field(change, "kind") {
                        Some("add") => format!("✏️ Add {path}"),
                        Some("delete") => format!("🗑 Delete {path}"),
                        _ => format!("✏️ Edit {path}"),
                    };
                    AgentEvent::Tool(line)
                })
                .collect();
            if lines.is_empty() {
                vec![AgentEvent::Nothing]
            } else {
                lines
            }
        }
        Some("error") => match str_field(item, "message") {
            Some(message) => vec![AgentEvent::Tool(format!(
                "⚠️ {}",
                one_line(message, ARG_CHARS)
            ))],
            None => vec![AgentEvent::Nothing],
        },
        _ => vec![AgentEvent::Nothing],
    }
}

/// Codex counts cached input inside `input_tokens` (as the OpenAI API
/// does); [`AgentUsage`] keeps uncached and cached input apart.
fn usage(usage: &Value) -> AgentUsage {
    let cached = u64_field(usage, "cached_input_tokens");
    AgentUsage {
        turns: 1,
        input_tokens: u64_field(usage, "input_tokens").saturating_sub(cached),
        cached_input_tokens: cached,
        output_tokens: u64_field(usage, "output_tokens"),
        cost_usd: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::command::protocol::{parse_line, JsonlCollector, Protocol};
    use crate::vocab::Progress;

    /// A recorded `codex exec --json` turn.
    const TURN: &str = concat!(
        r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}"#,
        "\n",
        r#"{"type":"turn.started"}"#,
        "\n",
        r#"{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Scanning**"}}"#,
        "\n",
        r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#,
        "\n",
        r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"docs\nsrc\n","exit_code":0,"status":"completed"}}"#,
        "\n",
        r#"{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"src/main.rs","kind":"update"}],"status":"completed"}}"#,
        "\n",
        r#"{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Repo contains docs and src."}}"#,
        "\n",
        r#"{"type":"turn.completed","usage":{"input_tokens":24763,"cached_input_tokens":24448,"output_tokens":122}}"#,
        "\n",
    );

    #[test]
    fn a_recorded_turn_parses_in_any_chunking() {
        for chunk in [1, 7, 64, TURN.len()] {
            let progress = Progress::new();
            let mut seen = Vec::new();
            let (tx, rx) = std::sync::mpsc::channel();
            let mut c = JsonlCollector::new(
                Protocol::CodexJson,
                progress.clone(),
                1 << 20,
                Box::new(move |id| tx.send(id.to_string()).unwrap()),
            );
            for piece in TURN.as_bytes().chunks(chunk) {
                c.push(piece);
                if progress.snapshot().contains("🔧 Shell: bash -lc ls") {
                    seen.push(());
                }
            }
            c.finish();
            let preview = progress.snapshot();
            let out = c.into_outcome();
            assert_eq!(out.skipped, 0, "chunk {chunk}");
            assert_eq!(
                rx.try_iter().collect::<Vec<_>>(),
                ["0199a213-81c0-7800-8aa1-bbab2a035a53"]
            );
            assert_eq!(out.answer.as_deref(), Some("Repo contains docs and src."));
            let usage = out.usage.unwrap();
            assert_eq!(
                (
                    usage.input_tokens,
                    usage.cached_input_tokens,
                    usage.output_tokens
                ),
                (315, 24448, 122)
            );
            assert!(!seen.is_empty(), "the tool line showed before the end");
            assert!(preview.contains("✏️ Edit src/main.rs"), "{preview}");
        }
    }

    #[test]
    fn failures_and_unknown_types() {
        assert_eq!(
            parse_line(
                Protocol::CodexJson,
                r#"{"type":"turn.failed","error":{"message":"quota"}}"#
            ),
            Ok(vec![AgentEvent::Failed {
                message: "quota".into(),
                usage: None
            }])
        );
        assert_eq!(
            parse_line(Protocol::CodexJson, r#"{"type":"thread.archived"}"#),
            Err(Skipped::UnknownType("thread.archived".into()))
        );
    }
}
