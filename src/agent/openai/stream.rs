//! Reading answers leniently: SSE chunks and plain JSON bodies into a
//! `ModelAnswer` (text, tool calls merged from deltas, finish reason).

use crate::agent::openai::tool_loop::ModelAnswer;
use crate::agent::openai::tool_loop::ToolCall;
use crate::agent::openai::CHAT_PROVIDER_CHARS;
use crate::agent::openai::LOG_BODY_CHARS;
use serde_json::Value;

/// What one SSE event meant.
#[derive(Debug, PartialEq)]
pub(super) enum StreamStep {
    /// New answer text.
    Text(String),
    /// Nothing to show (role chunk, tool call delta, keep-alive, unreadable).
    Continue,
    /// `[DONE]`.
    Done,
}

/// A tool call being assembled from stream deltas.
#[derive(Debug, Default)]
pub(super) struct PartialCall {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments: String,
}

/// Accumulates a streamed answer from its chunks.
#[derive(Debug, Default)]
pub(super) struct StreamedAnswer {
    pub(super) text: String,
    pub(super) calls: Vec<PartialCall>,
    pub(super) finish_reason: Option<String>,
    pub(super) usage: Option<crate::store::AgentUsage>,
    /// Characters of text and tool calls received since the reader last
    /// took them (the estimate of a request that ends without usage).
    pub(super) received: usize,
}

impl StreamedAnswer {
    /// Apply one event's data. `Err` carries the provider's error message.
    pub(super) fn apply(&mut self, event_name: &str, data: &str) -> Result<StreamStep, String> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(StreamStep::Done);
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(_) if event_name == "error" => return Err(excerpt(data, CHAT_PROVIDER_CHARS)),
            Err(_) => {
                if !data.is_empty() {
                    tracing::debug!(data = %excerpt(data, LOG_BODY_CHARS), "skipped an unreadable stream chunk");
                }
                return Ok(StreamStep::Continue);
            }
        };
        if let Some(message) = provider_error_message(&chunk) {
            return Err(message);
        }
        if event_name == "error" {
            return Err(excerpt(data, CHAT_PROVIDER_CHARS));
        }
        if let Some(usage) = usage_of(&chunk) {
            self.usage = Some(usage);
        }
        let mut text = String::new();
        for choice in first_choices(&chunk) {
            // `delta` per the spec; some servers send `message` instead.
            let delta = if choice["delta"].is_object() {
                &choice["delta"]
            } else {
                &choice["message"]
            };
            text.push_str(&content_text(&delta["content"]));
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                self.merge_call_delta(call);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(reason.to_string());
            }
        }
        self.text.push_str(&text);
        self.received = self.received.saturating_add(text.len());
        Ok(if text.is_empty() {
            StreamStep::Continue
        } else {
            StreamStep::Text(text)
        })
    }

    /// Merge one `tool_calls` delta: by `index`, or (servers that omit it) by
    /// a new `id` starting a new call and anything else continuing the last.
    pub(super) fn merge_call_delta(&mut self, delta: &Value) {
        let id = delta["id"].as_str().filter(|id| !id.is_empty());
        let index = match delta["index"].as_u64() {
            Some(index) => usize::try_from(index).unwrap_or(usize::MAX),
            None => match (id, self.calls.last()) {
                (Some(id), Some(last)) if last.id != id => last.index.saturating_add(1),
                (_, Some(last)) => last.index,
                (_, None) => 0,
            },
        };
        let position = match self.calls.iter().position(|call| call.index == index) {
            Some(position) => position,
            None => {
                self.calls.push(PartialCall {
                    index,
                    ..PartialCall::default()
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[position];
        if let (Some(id), true) = (id, call.id.is_empty()) {
            call.id = id.to_string();
        }
        let function = &delta["function"];
        let before = call.name.len() + call.arguments.len();
        // The name normally comes once; a server repeating it whole must not
        // double it.
        if let Some(name) = function["name"].as_str() {
            if call.name != name {
                call.name.push_str(name);
            }
        }
        match &function["arguments"] {
            Value::String(fragment) => call.arguments.push_str(fragment),
            Value::Null => {}
            whole => call.arguments = whole.to_string(),
        }
        let after = call.name.len() + call.arguments.len();
        self.received = self.received.saturating_add(after.saturating_sub(before));
    }

    /// A stream ends with `[DONE]` or at least a finish reason; anything
    /// else means the connection was cut and the answer (or a tool call's
    /// arguments) may be incomplete, so it must not be used.
    pub(super) fn ended_properly(&self, saw_done: bool) -> bool {
        saw_done || self.finish_reason.is_some()
    }

    pub(super) fn finish(mut self, round: u32) -> ModelAnswer {
        self.calls.sort_by_key(|call| call.index);
        let tool_calls = self
            .calls
            .into_iter()
            .map(|call| ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{round}_{}", call.index)
                } else {
                    call.id
                },
                name: call.name,
                arguments: normalize_arguments(call.arguments),
            })
            .collect();
        ModelAnswer {
            text: self.text,
            tool_calls,
            finish_reason: self.finish_reason,
            usage: self.usage,
        }
    }
}

/// Why a non-streamed completion could not be used.
#[derive(Debug, PartialEq)]
pub(super) enum CompletionError {
    /// The body is an `{"error": …}` with this message.
    Provider(String),
    /// The body is not a completion.
    Unreadable,
}

/// Parse a non-streamed completion body.
pub(super) fn parse_completion(body: &str, round: u32) -> Result<ModelAnswer, CompletionError> {
    let completion: Value = serde_json::from_str(body).map_err(|_| CompletionError::Unreadable)?;
    if let Some(message) = provider_error_message(&completion) {
        return Err(CompletionError::Provider(message));
    }
    let choice = first_choices(&completion)
        .next()
        .ok_or(CompletionError::Unreadable)?;
    let message = &choice["message"];
    let tool_calls = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(index, call)| {
            let function = &call["function"];
            ToolCall {
                id: call["id"]
                    .as_str()
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("call_{round}_{index}"), str::to_string),
                name: function["name"].as_str().unwrap_or_default().to_string(),
                arguments: normalize_arguments(match &function["arguments"] {
                    Value::String(arguments) => arguments.clone(),
                    Value::Null => String::new(),
                    whole => whole.to_string(),
                }),
            }
        })
        .collect();
    Ok(ModelAnswer {
        text: content_text(&message["content"]),
        tool_calls,
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        usage: usage_of(&completion),
    })
}

/// The choices for the first (and normally only) completion: index 0 or
/// no index at all.
pub(super) fn first_choices(chunk: &Value) -> impl Iterator<Item = &Value> {
    chunk["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|choice| choice["index"].as_u64().unwrap_or(0) == 0)
}

/// The `usage` object of a completion or of a stream's last chunk:
/// `prompt_tokens` (of which `prompt_tokens_details.cached_tokens` came
/// from the cache), `completion_tokens`, and `cost` (US dollars) where the
/// server reports one (OpenRouter). `None` without a usable object.
pub(super) fn usage_of(body: &Value) -> Option<crate::store::AgentUsage> {
    let usage = body.get("usage").filter(|u| u.is_object())?;
    let count = |v: &Value| v.as_u64().unwrap_or(0);
    let prompt = count(&usage["prompt_tokens"]);
    let cached = count(&usage["prompt_tokens_details"]["cached_tokens"]).min(prompt);
    let output = count(&usage["completion_tokens"]);
    let cost = usage["cost"]
        .as_f64()
        .filter(|c| c.is_finite() && *c >= 0.0);
    if prompt == 0 && output == 0 && cost.is_none() {
        return None;
    }
    Some(crate::store::AgentUsage {
        turns: 1,
        input_tokens: prompt - cached,
        cached_input_tokens: cached,
        output_tokens: output,
        cost_usd: cost.unwrap_or(0.0),
    })
}

/// Text content: a string, or an array of parts with `text`.
pub(super) fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

pub(super) fn normalize_arguments(arguments: String) -> String {
    if arguments.trim().is_empty() {
        "{}".to_string()
    } else {
        arguments
    }
}

/// The message of an `{"error": …}` object, if `value` is one.
pub(super) fn provider_error_message(value: &Value) -> Option<String> {
    let message = match &value["error"] {
        Value::Null => return None,
        Value::String(message) => message.clone(),
        error => error["message"]
            .as_str()
            .map_or_else(|| error.to_string(), str::to_string),
    };
    Some(excerpt(&message, CHAT_PROVIDER_CHARS))
}

/// At most `max` characters of `text`, marked when cut.
pub(super) fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}
