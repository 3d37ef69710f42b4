//! What an ACP turn shows and answers: the agent's `session/update`
//! notifications folded into one bounded view.
//!
//! * `agent_message_chunk` text is the answer (streamed into the preview,
//!   kept up to the output cap; a message after a tool call starts a new
//!   paragraph);
//! * `tool_call` starts a progress line (`🔧 title`, the mark by kind),
//!   `tool_call_update` changes its title or marks it failed;
//! * `plan` replaces the turn's one plan line (`📋 Plan 2/5: current step`);
//! * `usage_update` carries the session's cumulative cost.
//!
//! Everything is bounded: the answer by its cap, tool lines by count (the
//! oldest are dropped, counted in one "… earlier steps" line), the
//! preview by characters. Pure: no I/O, no protocol types beyond the
//! schema's.

use std::collections::VecDeque;

use agent_client_protocol::v1::schema::{
    ContentBlock, Plan, PlanEntryStatus, SessionUpdate, ToolCall, ToolCallStatus, ToolCallUpdate,
    ToolKind,
};

use crate::agent::command::protocol::one_line;

/// At most this many tool lines are kept (the preview shows fewer).
const MAX_TOOL_LINES: usize = 50;
/// Tool lines shown in the preview.
const SHOWN_TOOL_LINES: usize = 8;
/// The preview shows about this many characters of text.
const PREVIEW_TEXT_CHARS: usize = 2500;
/// A tool line's title is cut here.
const TITLE_CHARS: usize = 100;

/// One tool call the preview shows.
#[derive(Clone, Debug, PartialEq)]
struct ToolLine {
    id: String,
    mark: &'static str,
    title: String,
    failed: bool,
}

impl ToolLine {
    fn render(&self) -> String {
        let mark = if self.failed { "❌" } else { self.mark };
        format!("{mark} {}", self.title)
    }
}

/// The state of one turn, fed with every update of its session.
#[derive(Debug)]
pub(super) struct TurnView {
    answer: String,
    cap: usize,
    truncated: bool,
    /// A tool ran since the last text: the next text starts a paragraph.
    paragraph: bool,
    tools: VecDeque<ToolLine>,
    hidden_tools: usize,
    plan: Option<String>,
    /// Shown above everything (a session that could not be continued).
    notice: Option<String>,
    /// The session's cumulative cost in USD, if the agent reports one.
    pub cost_usd: Option<f64>,
}

impl TurnView {
    /// A view keeping at most `cap` bytes of answer.
    pub(super) fn new(cap: usize) -> TurnView {
        TurnView {
            answer: String::new(),
            cap,
            truncated: false,
            paragraph: false,
            tools: VecDeque::new(),
            hidden_tools: 0,
            plan: None,
            notice: None,
            cost_usd: None,
        }
    }

    /// Fold one update in. True when what the preview shows changed.
    pub(super) fn apply(&mut self, update: &SessionUpdate) -> bool {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => match &chunk.content {
                ContentBlock::Text(text) => {
                    self.push_text(&text.text);
                    true
                }
                _ => false,
            },
            SessionUpdate::ToolCall(call) => {
                self.tool_started(call);
                true
            }
            SessionUpdate::ToolCallUpdate(update) => self.tool_updated(update),
            SessionUpdate::Plan(plan) => {
                let line = plan_line(plan);
                let changed = self.plan.as_ref() != line.as_ref();
                self.plan = line;
                changed
            }
            SessionUpdate::UsageUpdate(usage) => {
                if let Some(cost) = usage.cost.as_ref().filter(|c| c.currency == "USD") {
                    self.cost_usd = Some(cost.amount);
                }
                false
            }
            _ => false,
        }
    }

    fn push_text(&mut self, text: &str) {
        if text.is_empty() || self.truncated {
            return;
        }
        if self.paragraph && !self.answer.is_empty() && !self.answer.ends_with("\n\n") {
            let trimmed = self.answer.trim_end_matches('\n').len();
            self.answer.truncate(trimmed);
            self.answer.push_str("\n\n");
        }
        self.paragraph = false;
        let room = self.cap.saturating_sub(self.answer.len());
        if text.len() <= room {
            self.answer.push_str(text);
            return;
        }
        let mut cut = room;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.answer.push_str(&text[..cut]);
        self.truncated = true;
    }

    fn tool_started(&mut self, call: &ToolCall) {
        self.paragraph = true;
        let id = call.tool_call_id.0.to_string();
        let line = ToolLine {
            id: id.clone(),
            mark: kind_mark(&call.kind),
            title: one_line(&call.title, TITLE_CHARS),
            failed: call.status == ToolCallStatus::Failed,
        };
        if let Some(existing) = self.tools.iter_mut().find(|t| t.id == id) {
            *existing = line;
            return;
        }
        self.tools.push_back(line);
        while self.tools.len() > MAX_TOOL_LINES {
            self.tools.pop_front();
            self.hidden_tools += 1;
        }
    }

    fn tool_updated(&mut self, update: &ToolCallUpdate) -> bool {
        let id = update.tool_call_id.0.as_ref();
        let Some(line) = self.tools.iter_mut().find(|t| t.id == id) else {
            return false;
        };
        let before = line.clone();
        if let Some(title) = &update.fields.title {
            line.title = one_line(title, TITLE_CHARS);
        }
        if let Some(kind) = &update.fields.kind {
            line.mark = kind_mark(kind);
        }
        if let Some(status) = &update.fields.status {
            line.failed = *status == ToolCallStatus::Failed;
        }
        *line != before
    }

    /// Show `notice` above the preview from now on.
    pub(super) fn set_notice(&mut self, notice: &str) {
        self.notice = Some(notice.to_string());
    }

    /// The answer so far.
    pub(super) fn answer(&self) -> &str {
        &self.answer
    }

    /// True when the answer reached its cap.
    pub(super) fn truncated(&self) -> bool {
        self.truncated
    }

    /// The preview: the plan line, the newest tool lines, then the tail of
    /// the text.
    pub(super) fn render(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(notice) = &self.notice {
            parts.push(notice.clone());
        }
        if let Some(plan) = &self.plan {
            parts.push(plan.clone());
        }
        if !self.tools.is_empty() {
            let hidden = self.hidden_tools + self.tools.len().saturating_sub(SHOWN_TOOL_LINES);
            let mut lines = Vec::new();
            if hidden > 0 {
                lines.push(format!("… ({hidden} earlier steps)"));
            }
            let skip = self.tools.len().saturating_sub(SHOWN_TOOL_LINES);
            lines.extend(self.tools.iter().skip(skip).map(ToolLine::render));
            parts.push(lines.join("\n"));
        }
        let text = self.answer.trim();
        if !text.is_empty() {
            let count = text.chars().count();
            if count > PREVIEW_TEXT_CHARS {
                let tail: String = text.chars().skip(count - PREVIEW_TEXT_CHARS).collect();
                parts.push(format!("…{tail}"));
            } else {
                parts.push(text.to_string());
            }
        }
        parts.join("\n\n")
    }
}

/// The mark of a tool line, by what the tool does.
fn kind_mark(kind: &ToolKind) -> &'static str {
    match kind {
        ToolKind::Read => "📖",
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => "✏️",
        ToolKind::Search => "🔎",
        ToolKind::Fetch => "🌐",
        ToolKind::Think => "💭",
        _ => "🔧",
    }
}

/// A plan in one line: how far it is, and the step in progress (or the
/// next one).
fn plan_line(plan: &Plan) -> Option<String> {
    if plan.entries.is_empty() {
        return None;
    }
    let done = plan
        .entries
        .iter()
        .filter(|e| e.status == PlanEntryStatus::Completed)
        .count();
    let total = plan.entries.len();
    let current = plan
        .entries
        .iter()
        .find(|e| e.status == PlanEntryStatus::InProgress)
        .or_else(|| {
            plan.entries
                .iter()
                .find(|e| e.status == PlanEntryStatus::Pending)
        });
    Some(match current {
        Some(entry) => format!(
            "📋 Plan {done}/{total}: {}",
            one_line(&entry.content, TITLE_CHARS)
        ),
        None => format!("📋 Plan {done}/{total} done"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(value: serde_json::Value) -> SessionUpdate {
        serde_json::from_value(value).unwrap()
    }

    fn text(t: &str) -> SessionUpdate {
        update(
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": t}}),
        )
    }

    #[test]
    fn text_streams_tools_are_lines_and_a_plan_is_one_line() {
        let mut view = TurnView::new(1000);
        assert!(view.apply(&text("Let me ")));
        view.apply(&text("look."));
        view.apply(&update(
            json!({"sessionUpdate": "tool_call", "toolCallId": "t1",
            "title": "Read src/main.rs", "kind": "read", "status": "pending"}),
        ));
        view.apply(&update(
            json!({"sessionUpdate": "tool_call", "toolCallId": "t2",
            "title": "cargo test", "kind": "execute"}),
        ));
        assert!(
            view.apply(&update(json!({"sessionUpdate": "tool_call_update",
            "toolCallId": "t2", "status": "failed"})))
        );
        assert!(
            !view.apply(&update(json!({"sessionUpdate": "tool_call_update",
            "toolCallId": "nope", "status": "failed"})))
        );
        view.apply(&update(json!({"sessionUpdate": "plan", "entries": [
            {"content": "read", "priority": "high", "status": "completed"},
            {"content": "fix the bug", "priority": "high", "status": "in_progress"},
            {"content": "test", "priority": "low", "status": "pending"}]})));
        view.apply(&text("Done."));
        assert_eq!(view.answer(), "Let me look.\n\nDone.");
        assert_eq!(
            view.render(),
            "📋 Plan 1/3: fix the bug\n\n📖 Read src/main.rs\n❌ cargo test\n\nLet me look.\n\nDone."
        );
        view.apply(&update(
            json!({"sessionUpdate": "usage_update", "used": 10, "size": 100,
            "cost": {"amount": 0.25, "currency": "USD"}}),
        ));
        assert_eq!(view.cost_usd, Some(0.25));
    }

    #[test]
    fn everything_stays_bounded() {
        let mut view = TurnView::new(10);
        view.apply(&text("ééééééééé"));
        assert!(view.truncated());
        assert!(view.answer().len() <= 10 && view.answer().chars().all(|c| c == 'é'));
        for i in 0..500 {
            view.apply(&update(
                json!({"sessionUpdate": "tool_call", "toolCallId": format!("t{i}"),
                "title": "x".repeat(1000)}),
            ));
        }
        let shown = view.render();
        assert!(shown.starts_with("… (492 earlier steps)"), "{shown}");
        assert!(shown.chars().count() < 1200, "{}", shown.len());
        assert!(view.tools.len() <= MAX_TOOL_LINES);
    }
}
