//! The tool loop: a turn is rounds of completion requests, each either a
//! final answer or tool calls whose results feed the next round. Tools
//! cannot break a turn: errors and panics become tool results. Also the
//! text shown across rounds (`ShownText`).

use crate::agent::openai::trim_history;
use crate::agent::openai::EMPTY_ANSWER;
use crate::agent::AgentError;
use crate::agent::AgentReply;
use crate::agent::OpenAiAgent;
use crate::agent::TurnRequest;
use crate::tools::ToolContext;
use crate::tools::ToolDefinition;
use crate::tools::ToolError;
use crate::tools::ToolRegistry;
use crate::vocab::ChatMessage;
use crate::vocab::Progress;
use crate::vocab::Role;
use futures::FutureExt;
use serde_json::json;
use serde_json::Value;
use std::any::Any;
use std::panic::AssertUnwindSafe;

/// One tool call the model asked for, complete.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct ToolCall {
    pub(super) id: String,
    pub(super) name: String,
    /// Raw JSON text (`{}` when the model sent nothing).
    pub(super) arguments: String,
}

/// What one completion request produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ModelAnswer {
    pub(super) text: String,
    pub(super) tool_calls: Vec<ToolCall>,
    pub(super) finish_reason: Option<String>,
    /// The tokens (and cost) the server reported for this request.
    pub(super) usage: Option<crate::store::AgentUsage>,
}

impl OpenAiAgent {
    pub(super) async fn run_turn(&self, turn: TurnRequest) -> Result<AgentReply, AgentError> {
        let (mut messages, dropped) = trim_history(
            self.config.system_prompt(),
            &turn.history,
            &turn.text,
            self.config.history_budget_chars,
        );
        if dropped > 0 {
            tracing::debug!(
                dropped,
                budget_chars = self.config.history_budget_chars,
                "dropped the oldest history messages to fit the budget"
            );
        }
        // Tools from elsewhere (MCP servers) start or restart here,
        // bounded by their own timeouts and the turn's cancellation.
        let prepare_ctx = ToolContext {
            cancel: turn.cancel.clone(),
            progress: turn.progress.clone(),
        };
        tokio::select! {
            biased;
            _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
            () = self.tools.prepare(&prepare_ctx) => {}
        }
        let definitions = self.tools.definitions();
        let tools = tool_specs(&definitions);
        let mut shown = ShownText::new(&turn.progress);
        let mut transcript = Vec::new();
        let mut rounds_run = 0;
        loop {
            if turn.cancel.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            shown.start_round();
            let answer = self
                .complete(
                    &messages,
                    tools.as_ref(),
                    rounds_run,
                    (&turn.cancel, turn.model.as_deref()),
                    &mut shown,
                )
                .await?;
            if answer.tool_calls.is_empty() {
                return Ok(AgentReply {
                    history_trimmed: dropped,
                    ..final_reply(answer, shown, transcript)
                });
            }
            if rounds_run == self.config.max_tool_rounds {
                return Ok(AgentReply {
                    history_trimmed: dropped,
                    ..self.tool_budget_exhausted(answer, shown, transcript)
                });
            }
            // The user's budget ran out during the task: end it here.
            if let Some(note) = crate::limits::meter::exhausted() {
                tracing::info!("the user's budget ran out during a tool loop; stopping it");
                return Ok(AgentReply {
                    history_trimmed: dropped,
                    ..stop_with_note(answer, shown, transcript, &note)
                });
            }
            rounds_run += 1;
            let call_message = assistant_tool_call_message(&answer);
            messages.push(call_message.clone());
            transcript.push(call_message);
            for call in &answer.tool_calls {
                let result = self.run_tool(call, &definitions, &turn).await?;
                let result_message = tool_result_message(call, result);
                messages.push(result_message.clone());
                transcript.push(result_message);
            }
        }
    }

    /// The model wants more tools than allowed: stop with what it said so far.
    pub(super) fn tool_budget_exhausted(
        &self,
        answer: ModelAnswer,
        shown: ShownText<'_>,
        transcript: Vec<ChatMessage>,
    ) -> AgentReply {
        let rounds = self.config.max_tool_rounds;
        tracing::warn!(
            rounds,
            "the model still called tools after the last allowed round"
        );
        let notice = format!(
            "(Stopped: the model still wanted to call tools after {rounds} rounds, the limit set \
             by agent.openai.max_tool_rounds. Ask again to continue, or narrow the request.)"
        );
        stop_with_note(answer, shown, transcript, &notice)
    }

    /// Run one tool call; every failure becomes the result text. Only
    /// cancellation is an error.
    pub(super) async fn run_tool(
        &self,
        call: &ToolCall,
        definitions: &[ToolDefinition],
        turn: &TurnRequest,
    ) -> Result<String, AgentError> {
        turn.progress.still_working();
        tracing::info!(tool = %call.name, call_id = %call.id, "running a tool");
        tracing::debug!(tool = %call.name, arguments = %call.arguments, "tool arguments");
        let ctx = ToolContext {
            cancel: turn.cancel.clone(),
            progress: turn.progress.clone(),
        };
        let outcome = tokio::select! {
            biased;
            _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
            outcome = call_tool_catching_panics(self.tools.as_ref(), &call.name, &call.arguments, ctx) => outcome,
        };
        turn.progress.still_working();
        Ok(match outcome {
            Ok(result) => result,
            Err(error) => {
                tracing::info!(tool = %call.name, %error, "tool call failed");
                tool_error_text(&error, definitions)
            }
        })
    }
}

/// End the loop before `answer`'s tool calls run: what the model said so
/// far, then `notice`. The unanswered tool calls stay out of the
/// transcript (a history with calls but no results is rejected by the
/// API).
pub(super) fn stop_with_note(
    answer: ModelAnswer,
    mut shown: ShownText<'_>,
    mut transcript: Vec<ChatMessage>,
    notice: &str,
) -> AgentReply {
    let content = if answer.text.trim().is_empty() {
        notice.to_string()
    } else {
        answer.text
    };
    transcript.push(ChatMessage::new(Role::Assistant, content));
    shown.push_paragraph(notice);
    AgentReply {
        text: shown.into_text(),
        transcript,
        history_trimmed: 0,
    }
}

/// The reply for a round without tool calls.
pub(super) fn final_reply(
    answer: ModelAnswer,
    mut shown: ShownText<'_>,
    mut transcript: Vec<ChatMessage>,
) -> AgentReply {
    let note = match answer.finish_reason.as_deref() {
        Some("length") => Some("(The answer was cut off at the model's token limit.)"),
        Some("content_filter") => Some("(The LLM provider's content filter withheld the answer.)"),
        _ => None,
    };
    if let Some(note) = note {
        tracing::info!(finish_reason = ?answer.finish_reason, "the answer ended early");
        shown.push_paragraph(note);
    }
    if shown.text.trim().is_empty() {
        shown.push_paragraph(EMPTY_ANSWER);
    }
    let content = if answer.text.trim().is_empty() {
        note.unwrap_or(EMPTY_ANSWER).to_string()
    } else {
        answer.text
    };
    transcript.push(ChatMessage::new(Role::Assistant, content));
    AgentReply {
        text: shown.into_text(),
        transcript,
        history_trimmed: 0,
    }
}

/// The text shown through [`Progress`] across tool rounds (see the module
/// docs): earlier rounds' text stays, the next round follows after a blank
/// line; whitespace-only text is dropped when a round starts.
pub(super) struct ShownText<'a> {
    pub(super) progress: &'a Progress,
    pub(super) text: String,
    /// Text was kept from an earlier round: separate the next text from it.
    pub(super) separate_next: bool,
}

impl<'a> ShownText<'a> {
    pub(super) fn new(progress: &'a Progress) -> Self {
        ShownText {
            progress,
            text: String::new(),
            separate_next: false,
        }
    }

    pub(super) fn start_round(&mut self) {
        if self.text.trim().is_empty() {
            self.text.clear();
            self.separate_next = false;
            self.progress.set_text("");
        } else {
            self.separate_next = true;
        }
    }

    pub(super) fn push(&mut self, delta: &str) {
        let delta = if self.separate_next {
            delta.trim_start()
        } else {
            delta
        };
        if delta.is_empty() {
            self.progress.still_working();
            return;
        }
        if self.separate_next {
            self.separate_next = false;
            let separator = paragraph_separator(&self.text);
            self.text.push_str(separator);
            self.progress.push_text(separator);
        }
        self.text.push_str(delta);
        self.progress.push_text(delta);
    }

    /// Add `text` as its own paragraph after whatever was shown.
    pub(super) fn push_paragraph(&mut self, text: &str) {
        self.separate_next = !self.text.trim().is_empty();
        self.push(text);
    }

    pub(super) fn into_text(self) -> String {
        self.text
    }
}

pub(super) fn paragraph_separator(before: &str) -> &'static str {
    if before.ends_with("\n\n") {
        ""
    } else if before.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    }
}

/// The `tools` request value, or `None` when there are no tools (the key is
/// then left out: some servers reject an empty list).
pub(super) fn tool_specs(definitions: &[ToolDefinition]) -> Option<Value> {
    if definitions.is_empty() {
        return None;
    }
    let specs = definitions
        .iter()
        .map(|tool| {
            json!({
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            })
        })
        .collect();
    Some(Value::Array(specs))
}

pub(super) fn assistant_tool_call_message(answer: &ModelAnswer) -> ChatMessage {
    let calls = answer
        .tool_calls
        .iter()
        .map(|call| {
            json!({
                "id": call.id,
                "type": "function",
                "function": { "name": call.name, "arguments": call.arguments },
            })
        })
        .collect();
    ChatMessage {
        tool_calls: Some(Value::Array(calls)),
        ..ChatMessage::new(Role::Assistant, answer.text.clone())
    }
}

pub(super) fn tool_result_message(call: &ToolCall, result: String) -> ChatMessage {
    ChatMessage {
        tool_call_id: Some(call.id.clone()),
        name: Some(call.name.clone()),
        ..ChatMessage::new(Role::Tool, result)
    }
}

pub(super) fn tool_error_text(error: &ToolError, definitions: &[ToolDefinition]) -> String {
    match error {
        ToolError::UnknownTool(_) => {
            let names: Vec<&str> = definitions.iter().map(|d| d.name.as_str()).collect();
            let available = if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            };
            format!("error: {error}; available tools: {available}")
        }
        _ => format!("error: {error}"),
    }
}

/// Call a tool, turning a panic (while creating or polling its future) into
/// [`ToolError::Failed`].
pub(super) async fn call_tool_catching_panics(
    tools: &dyn ToolRegistry,
    name: &str,
    arguments: &str,
    ctx: ToolContext,
) -> Result<String, ToolError> {
    let future =
        match std::panic::catch_unwind(AssertUnwindSafe(|| tools.call(name, arguments, ctx))) {
            Ok(future) => future,
            Err(panic) => return Err(tool_panicked(panic.as_ref())),
        };
    match AssertUnwindSafe(future).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => Err(tool_panicked(panic.as_ref())),
    }
}

pub(super) fn tool_panicked(payload: &(dyn Any + Send)) -> ToolError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string());
    tracing::error!(%message, "a tool panicked");
    ToolError::Failed(format!("the tool crashed ({message})"))
}
