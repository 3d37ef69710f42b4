//! Output protocols: how a program's stdout becomes the turn's preview, its
//! answer, its agent session id and its usage.
//!
//! * `text`: stdout is the answer, streamed as it comes ([`super::output`]).
//! * `claude-stream-json` ([`claude`]) and `codex-json` ([`codex`]): one JSON
//!   event per line (JSONL). Each line is parsed into [`AgentEvent`]s; the
//!   preview shows short tool lines (`🔧 Bash: cargo test`) and the agent's
//!   text, the answer is the agent's final message.
//!
//! A line that is not JSON, or an event of a type this build does not know,
//! is logged and skipped: an agent CLI that adds an event type must never
//! break a turn. This module never touches processes or the store; the
//! agent session id it finds is handed to a callback at once, so a turn
//! stopped half-way still leaves its session continuable.

pub mod claude;
pub mod codex;
mod lines;
mod preview;

pub use lines::LineSplitter;
pub use preview::Preview;

use serde::Deserialize;
use serde_json::Value;

use super::output::StdoutCollector;
use crate::store::AgentUsage;
use crate::vocab::Progress;

/// `[agent.command] protocol`: what the program prints on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Plain text: stdout is the answer.
    #[default]
    Text,
    /// Claude Code's `--output-format stream-json --verbose` events.
    ClaudeStreamJson,
    /// Codex's `exec --json` events.
    CodexJson,
}

impl Protocol {
    /// The name used in the config and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Text => "text",
            Protocol::ClaudeStreamJson => "claude-stream-json",
            Protocol::CodexJson => "codex-json",
        }
    }
}

/// What one event line means for the turn.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentEvent {
    /// The agent's own session (Claude) or thread (Codex) id: what the next
    /// turn resumes.
    Session(String),
    /// A piece of the agent's answer or commentary.
    Text(String),
    /// A streamed part of a text still being written (shown in the
    /// preview; the whole [`AgentEvent::Text`] follows and replaces it).
    TextDelta(String),
    /// The text being streamed is complete (the next delta starts another).
    TextBlockEnd,
    /// A tool started: one short progress line.
    Tool(String),
    /// The turn completed; `answer` is the final text when the protocol
    /// carries one separately (Claude's `result`).
    Completed {
        /// Tokens and cost of the turn, if reported.
        usage: Option<AgentUsage>,
        /// The final answer, if the event carries it.
        answer: Option<String>,
    },
    /// The turn failed (an error result, `turn.failed`, `error`).
    Failed {
        /// What the agent said went wrong.
        message: String,
        /// Tokens and cost spent anyway, if reported.
        usage: Option<AgentUsage>,
    },
    /// A known event with nothing to show (still a sign of life).
    Nothing,
}

/// Why a line was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skipped {
    /// Not a JSON object.
    NotJson,
    /// A JSON object of an event type this build does not know.
    UnknownType(String),
}

/// Parse one line of `protocol` into events.
pub fn parse_line(protocol: Protocol, line: &str) -> Result<Vec<AgentEvent>, Skipped> {
    let value: Value = serde_json::from_str(line).map_err(|_| Skipped::NotJson)?;
    if !value.is_object() {
        return Err(Skipped::NotJson);
    }
    match protocol {
        Protocol::ClaudeStreamJson => claude::parse(&value),
        Protocol::CodexJson => codex::parse(&value),
        Protocol::Text => Ok(Vec::new()),
    }
}

/// The longest event line kept; a longer one (a huge tool result) is
/// skipped whole.
const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// What a JSONL turn produced.
#[derive(Debug, Default)]
pub struct JsonlOutcome {
    /// The agent session id seen, if any.
    pub session: Option<String>,
    /// The final answer.
    pub answer: Option<String>,
    /// Usage and cost, summed over the turn's completion events.
    pub usage: Option<AgentUsage>,
    /// The failure the agent reported (and did not recover from).
    pub failure: Option<String>,
    /// Lines skipped (not JSON, unknown type, too long).
    pub skipped: usize,
}

/// Reads a JSONL protocol's stdout: feeds the preview, reports the session
/// id at once, keeps the answer.
pub struct JsonlCollector {
    protocol: Protocol,
    progress: Progress,
    lines: LineSplitter,
    preview: Preview,
    on_session: Box<dyn FnMut(&str) + Send>,
    texts: Vec<String>,
    text_bytes: usize,
    cap: usize,
    outcome: JsonlOutcome,
}

impl JsonlCollector {
    /// A collector for `protocol`; `on_session` is called with every new
    /// agent session id as soon as it is read. Keeps at most `cap` bytes of
    /// the agent's text.
    pub fn new(
        protocol: Protocol,
        progress: Progress,
        cap: usize,
        on_session: Box<dyn FnMut(&str) + Send>,
    ) -> Self {
        JsonlCollector {
            protocol,
            progress,
            lines: LineSplitter::new(MAX_LINE_BYTES),
            preview: Preview::default(),
            on_session,
            texts: Vec::new(),
            text_bytes: 0,
            cap,
            outcome: JsonlOutcome::default(),
        }
    }

    /// Bytes from stdout, in any chunking.
    pub fn push(&mut self, bytes: &[u8]) {
        self.progress.still_working();
        let mut lines = Vec::new();
        let overlong = self.lines.push(bytes, |line| lines.push(line));
        self.outcome.skipped += overlong;
        if overlong > 0 {
            tracing::warn!(
                protocol = self.protocol.as_str(),
                "an over-long event line was skipped"
            );
        }
        for line in lines {
            self.line(&line);
        }
    }

    /// End of stdout: a last line without a newline still counts.
    pub fn finish(&mut self) {
        if let Some(line) = self.lines.finish() {
            self.line(&line);
        }
    }

    fn line(&mut self, raw: &[u8]) {
        let line = String::from_utf8_lossy(raw);
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        match parse_line(self.protocol, line) {
            Ok(events) => {
                for event in events {
                    self.apply(event);
                }
            }
            Err(skipped) => {
                self.outcome.skipped += 1;
                let start: String = line.chars().take(200).collect();
                match skipped {
                    Skipped::NotJson => tracing::warn!(
                        protocol = self.protocol.as_str(),
                        line = %start,
                        "skipped a line that is not a JSON event"
                    ),
                    Skipped::UnknownType(kind) => tracing::info!(
                        protocol = self.protocol.as_str(),
                        kind,
                        "skipped an event of an unknown type"
                    ),
                }
            }
        }
    }

    fn apply(&mut self, event: AgentEvent) {
        match event {
            AgentEvent::Session(id) => {
                if self.outcome.session.as_deref() != Some(id.as_str()) {
                    (self.on_session)(&id);
                    self.outcome.session = Some(id);
                }
            }
            AgentEvent::Text(text) => {
                if text.trim().is_empty() {
                    return;
                }
                self.preview.text(&text);
                self.progress.set_text(&self.preview.render());
                if self.text_bytes < self.cap {
                    self.text_bytes += text.len();
                    self.texts.push(text);
                }
            }
            AgentEvent::TextDelta(delta) => {
                self.preview.delta(&delta);
                self.progress.set_text(&self.preview.render());
            }
            AgentEvent::TextBlockEnd => self.preview.end_block(),
            AgentEvent::Tool(line) => {
                self.preview.tool(&line);
                self.progress.set_text(&self.preview.render());
            }
            AgentEvent::Completed { usage, answer } => {
                self.add_usage(usage);
                if let Some(answer) = answer.filter(|a| !a.trim().is_empty()) {
                    self.outcome.answer = Some(answer);
                }
                // A completed turn recovered from any earlier error event.
                self.outcome.failure = None;
            }
            AgentEvent::Failed { message, usage } => {
                self.add_usage(usage);
                self.outcome.failure = Some(message);
            }
            AgentEvent::Nothing => {}
        }
    }

    fn add_usage(&mut self, usage: Option<AgentUsage>) {
        if let Some(usage) = usage {
            let total = self.outcome.usage.get_or_insert_with(AgentUsage::default);
            total.add(&usage);
        }
    }

    /// What the turn produced. The answer falls back to the agent's last
    /// message when no event carried a final one.
    pub fn into_outcome(mut self) -> JsonlOutcome {
        if self.outcome.answer.is_none() {
            self.outcome.answer = self.texts.pop();
        }
        self.outcome
    }
}

/// Stdout of either kind of protocol.
pub(in crate::agent::command) enum OutputCollector {
    /// `text`.
    Text(StdoutCollector),
    /// A JSONL protocol.
    Jsonl(Box<JsonlCollector>),
}

impl OutputCollector {
    /// Bytes from stdout.
    pub(super) fn push(&mut self, bytes: &[u8]) {
        match self {
            OutputCollector::Text(c) => c.push(bytes),
            OutputCollector::Jsonl(c) => c.push(bytes),
        }
    }

    /// End of stdout.
    pub(super) fn finish(&mut self) {
        match self {
            OutputCollector::Text(c) => c.finish(),
            OutputCollector::Jsonl(c) => c.finish(),
        }
    }
}

/// A short single line: whitespace collapsed, cut at `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.chars().count() <= max {
        return collapsed;
    }
    let cut: String = collapsed.chars().take(max).collect();
    format!("{cut}…")
}

/// A string field of a JSON object.
pub(crate) fn str_field<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// An unsigned number field (0 when missing).
pub(crate) fn u64_field(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn collector(protocol: Protocol) -> (JsonlCollector, Arc<Mutex<Vec<String>>>, Progress) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let progress = Progress::new();
        let c = JsonlCollector::new(
            protocol,
            progress.clone(),
            1 << 20,
            Box::new(move |id| sink.lock().unwrap().push(id.to_string())),
        );
        (c, seen, progress)
    }

    #[test]
    fn garbage_and_unknown_events_are_skipped_not_fatal() {
        let (mut c, seen, _) = collector(Protocol::ClaudeStreamJson);
        c.push(b"not json at all\n[1,2]\n{\"type\":\"brand_new_event\",\"x\":1}\n");
        c.push(claude::tests_support::INIT.as_bytes());
        c.push(b"\n");
        c.push(claude::tests_support::RESULT.as_bytes());
        c.finish();
        let out = c.into_outcome();
        assert_eq!(out.skipped, 3);
        assert_eq!(out.answer.as_deref(), Some("All tests pass."));
        assert_eq!(out.failure, None);
        assert_eq!(*seen.lock().unwrap(), ["sess-1"]);
    }

    #[test]
    fn streamed_text_grows_the_preview_and_the_whole_message_replaces_it() {
        let (mut c, _, progress) = collector(Protocol::ClaudeStreamJson);
        let delta = |text: &str| {
            format!(
                "{{\"type\":\"stream_event\",\"event\":{{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}},\"parent_tool_use_id\":null}}\n"
            )
        };
        c.push(delta("The answer ").as_bytes());
        assert_eq!(progress.snapshot(), "The answer");
        c.push(delta("is 42.").as_bytes());
        assert_eq!(progress.snapshot(), "The answer is 42.");
        c.push(b"{\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_stop\",\"index\":0}}\n");
        c.push(b"{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"text\",\"text\":\"The answer is 42.\"}]}}\n");
        assert_eq!(progress.snapshot(), "The answer is 42.", "not shown twice");
        c.push(b"{\"type\":\"assistant\",\"message\":{\"content\":[{\"type\":\"tool_use\",\"name\":\"Bash\",\"input\":{\"command\":\"ls\"}}]}}\n");
        c.push(delta("Done").as_bytes());
        assert_eq!(
            progress.snapshot(),
            "The answer is 42.\n\n🔧 Bash: ls\n\nDone"
        );
        c.finish();
        let out = c.into_outcome();
        assert_eq!(
            out.answer.as_deref(),
            Some("The answer is 42."),
            "deltas are only the preview"
        );
    }

    #[test]
    fn a_later_completion_clears_an_earlier_error_event() {
        let (mut c, _, _) = collector(Protocol::CodexJson);
        c.push(b"{\"type\":\"error\",\"message\":\"reconnecting\"}\n");
        c.push(b"{\"type\":\"item.completed\",\"item\":{\"id\":\"i\",\"type\":\"agent_message\",\"text\":\"fine\"}}\n");
        c.push(b"{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"cached_input_tokens\":0,\"output_tokens\":2}}");
        c.finish();
        let out = c.into_outcome();
        assert_eq!(out.failure, None);
        assert_eq!(out.answer.as_deref(), Some("fine"));
        assert_eq!(out.usage.unwrap().output_tokens, 2);
    }
}
