//! One completion request: the request body, sending it with the turn's
//! cancel token raced against every wait, and reading the answer (JSON or
//! a stream).

use crate::agent::openai::errors::describe_transport_error;
use crate::agent::openai::errors::error_chain;
use crate::agent::openai::stream::parse_completion;
use crate::agent::openai::stream::CompletionError;
use crate::agent::openai::stream::StreamStep;
use crate::agent::openai::stream::StreamedAnswer;
use crate::agent::openai::tool_loop::ModelAnswer;
use crate::agent::openai::tool_loop::ShownText;
use crate::agent::AgentError;
use crate::agent::OpenAiAgent;
use crate::vocab::ChatMessage;
use eventsource_stream::EventStreamError;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::json;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

impl OpenAiAgent {
    /// Send one request and read the answer, streamed or not.
    pub(super) async fn complete(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        round: u32,
        (cancel, model): (&CancellationToken, Option<&str>),
        shown: &mut ShownText<'_>,
    ) -> Result<ModelAnswer, AgentError> {
        let mut body = self.request_body(messages, tools);
        // What a request that ends without usage is charged by.
        crate::limits::meter::request_sent(sent_chars(messages, tools));
        if self.config.vision {
            crate::media::vision::attach_images(&mut body).await;
        }
        // The session's /model choice, if any, replaces the configured one.
        if let Some(model) = model {
            body["model"] = json!(model);
        }
        tracing::debug!(
            round,
            messages = messages.len(),
            model = %self.config.model,
            "sending a chat completion request"
        );
        let response = self.send(&body, cancel).await?;
        let answer = if is_json_response(&response) {
            let answer = self.read_json_answer(response, round, cancel).await?;
            crate::limits::meter::received(answer.text.len());
            shown.push(&answer.text);
            answer
        } else {
            self.read_stream_answer(response, round, cancel, shown)
                .await?
        };
        // Counted for the user's budget and /usage.
        if let Some(usage) = &answer.usage {
            crate::limits::meter::record(usage);
        }
        Ok(answer)
    }

    pub(super) fn request_body(&self, messages: &[ChatMessage], tools: Option<&Value>) -> Value {
        let mut body = json!({
            "model": self.config.model,
            "messages": messages.iter().map(wire_message).collect::<Vec<_>>(),
            "stream": self.config.stream,
        });
        if let Some(temperature) = self.config.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(max_tokens) = self.config.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(tools) = tools {
            body["tools"] = tools.clone();
        }
        if self.config.stream && self.config.stream_usage {
            // The last chunk then carries the usage (budgets, /usage).
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// POST the request; a non-success status becomes its error here.
    pub(super) async fn send(
        &self,
        body: &Value,
        cancel: &CancellationToken,
    ) -> Result<reqwest::Response, AgentError> {
        let mut request = self.client.post(self.endpoint.clone()).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let timeout = self.config.request_timeout();
        let sent = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(AgentError::Cancelled),
            sent = tokio::time::timeout(timeout, request.send()) => sent,
        };
        let response = match sent {
            Err(_elapsed) => {
                let reason = format!(
                    "no answer within {} s (agent.openai.request_timeout_secs)",
                    timeout.as_secs()
                );
                return Err(self.unreachable(&reason, "timed out waiting for the response"));
            }
            Ok(Err(error)) => {
                // The URL may carry credentials; the shareable one is logged instead.
                let error = error.without_url();
                return Err(
                    self.unreachable(&describe_transport_error(&error), &error_chain(&error))
                );
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = self.read_error_body(response, cancel).await?;
        Err(self.http_error(status.as_u16(), &body))
    }

    /// The body of an error response, or what went wrong reading it.
    pub(super) async fn read_error_body(
        &self,
        response: reqwest::Response,
        cancel: &CancellationToken,
    ) -> Result<String, AgentError> {
        let read = tokio::time::timeout(self.config.request_timeout(), response.text());
        let body = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(AgentError::Cancelled),
            body = read => body,
        };
        Ok(match body {
            Ok(Ok(body)) => body,
            Ok(Err(error)) => format!("(could not read the body: {error})"),
            Err(_elapsed) => "(the body did not arrive in time)".to_string(),
        })
    }

    pub(super) async fn read_json_answer(
        &self,
        response: reqwest::Response,
        round: u32,
        cancel: &CancellationToken,
    ) -> Result<ModelAnswer, AgentError> {
        let body = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(AgentError::Cancelled),
            body = response.text() => body,
        };
        let body = body.map_err(|error| self.broke_off(&error_chain(&error.without_url())))?;
        match parse_completion(&body, round) {
            Ok(answer) => Ok(answer),
            Err(CompletionError::Provider(message)) => Err(self.provider_error(&message)),
            Err(CompletionError::Unreadable) => Err(self.unreadable(&body)),
        }
    }

    pub(super) async fn read_stream_answer(
        &self,
        response: reqwest::Response,
        round: u32,
        cancel: &CancellationToken,
        shown: &mut ShownText<'_>,
    ) -> Result<ModelAnswer, AgentError> {
        // Dropping `events` (on any return) drops the response and closes the
        // connection, which is how the server learns we stopped listening.
        let mut events = response.bytes_stream().eventsource();
        let mut answer = StreamedAnswer::default();
        let mut saw_done = false;
        loop {
            let event = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(AgentError::Cancelled),
                event = events.next() => event,
            };
            let event = match event {
                None => break,
                Some(Ok(event)) => event,
                Some(Err(EventStreamError::Transport(error))) => {
                    return Err(self.broke_off(&error_chain(&error.without_url())))
                }
                Some(Err(error)) => return Err(self.unreadable(&error.to_string())),
            };
            let step = answer.apply(&event.event, &event.data);
            crate::limits::meter::received(std::mem::take(&mut answer.received));
            match step {
                Ok(StreamStep::Text(delta)) => shown.push(&delta),
                Ok(StreamStep::Continue) => shown.progress.still_working(),
                Ok(StreamStep::Done) => {
                    saw_done = true;
                    break;
                }
                Err(message) => return Err(self.provider_error(&message)),
            }
        }
        if !answer.ended_properly(saw_done) {
            return Err(self.broke_off("the stream ended without [DONE] or a finish reason"));
        }
        Ok(answer.finish(round))
    }
}

/// The characters a request sends: its messages' text and tool calls, and
/// the tools it offers.
fn sent_chars(messages: &[ChatMessage], tools: Option<&Value>) -> usize {
    let calls = |m: &ChatMessage| m.tool_calls.as_ref().map_or(0, |c| c.to_string().len());
    messages
        .iter()
        .map(|m| m.content.len().saturating_add(calls(m)))
        .fold(
            tools.map_or(0, |t| t.to_string().len()),
            usize::saturating_add,
        )
}

pub(super) fn is_json_response(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let value = value.to_ascii_lowercase();
            value.contains("json") && !value.contains("event-stream")
        })
}

/// A message as the API expects it: `content` is `null` next to tool calls
/// without text, and `name` stays out of tool results (not in the spec).
pub(super) fn wire_message(message: &ChatMessage) -> Value {
    let mut wire = json!({ "role": message.role.as_str(), "content": message.content });
    if let Some(calls) = message.tool_calls.as_ref().filter(|c| has_entries(c)) {
        wire["tool_calls"] = calls.clone();
        if message.content.is_empty() {
            wire["content"] = Value::Null;
        }
    }
    if let Some(id) = &message.tool_call_id {
        wire["tool_call_id"] = json!(id);
    }
    wire
}

pub(super) fn has_entries(value: &Value) -> bool {
    value.as_array().is_some_and(|entries| !entries.is_empty())
}
