//! The `openai` backend: any server that speaks OpenAI's
//! `/v1/chat/completions` (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp,
//! LM Studio…), streamed, with a tool-call loop.
//!
//! Why it is built the way it is:
//!
//! * **Lenient reading.** "OpenAI-compatible" servers differ in the details:
//!   SSE comments as keep-alives, chunks without `choices` or `delta`, tool
//!   call deltas without `index`, a plain JSON body where a stream was asked
//!   for. Chunks are read as loose JSON and anything that is not clearly an
//!   error is tolerated, so one quirky server does not break a chat.
//! * **Every network wait races the turn's cancel token.** Cancelling drops
//!   the response, which closes the connection, so the server sees the
//!   disconnect and stops generating (and billing) right away.
//! * **A failure is one short chat message** ([`AgentError::Backend`]) that
//!   says what is wrong and what to check. Status codes, response bodies and
//!   error chains go to the log only; the API key is never logged.
//! * **Tools cannot break a turn.** An unknown tool, bad arguments, a failing
//!   or even panicking tool become an `error: …` tool result the model reads
//!   and reacts to. Only cancellation ends the loop early, and
//!   `max_tool_rounds` bounds it.
//! * **History is trimmed to a character budget**, oldest first, never
//!   separating an assistant's tool calls from their results (the API
//!   rejects such histories). See [`trim_history`].
//!
//! Streamed text across tool rounds: the text a round streamed stays visible
//! when the next round starts (a model often says "Let me look that up"
//! before calling a tool), and the next round's text follows after a blank
//! line. Only when everything shown so far is whitespace is the progress text
//! reset to empty. The reply text is exactly what was shown, so the final
//! edit never jumps; the transcript keeps each round's text in its own
//! assistant message, so the model later sees what it said when.
//!
//! Timeouts: `request_timeout_secs` bounds connecting and waiting for the
//! response headers. A stream that goes quiet after that is left to the
//! runner's stall watchdog (reasoning models can be silent for minutes), and
//! with `stream = false` the whole answer must arrive within the timeout,
//! because servers send the headers only once the completion is done.
//!
//! This module owns the wire format, the request/response cycle and the tool
//! loop. It must never decide whether a reply is delivered, never log the API
//! key, and never log message contents above `debug`.

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use url::Url;

use super::{Agent, AgentError, AgentReply, ChatMessage, Progress, Role, TurnRequest};
use crate::config::Secret;
use crate::tools::{ToolContext, ToolDefinition, ToolError, ToolRegistry};

/// The base URL used when the config names none: OpenAI itself.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The environment variable read for the API key by default.
pub const DEFAULT_API_KEY_ENV: &str = "OPENAI_API_KEY";

/// At most this many characters of a response body go to the log.
const LOG_BODY_CHARS: usize = 500;
/// At most this many characters of a provider's error message go to the chat.
const CHAT_PROVIDER_CHARS: usize = 300;
/// Shown when the model answered with nothing at all.
const EMPTY_ANSWER: &str = "(The model returned an empty answer.)";

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// `[agent.openai]`: which OpenAI-compatible server and model answer, and how.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API root including the version path, e.g.
    /// `https://api.openai.com/v1` (the default) or
    /// `http://127.0.0.1:11434/v1` for Ollama. Requests go to
    /// `<base_url>/chat/completions`.
    #[serde(default = "default_base_url")]
    pub base_url: String,
    /// The model name (required), e.g. `gpt-4o-mini` or `llama3.1`.
    pub model: String,
    /// The environment variable holding the API key. A missing key is fine
    /// for local servers: the request then goes out without authorization.
    #[serde(default = "default_api_key_env")]
    pub api_key_env: String,
    /// A file holding the API key (wins over the systemd credential
    /// `openai_api_key` and over `api_key_env`).
    #[serde(default)]
    pub api_key_file: Option<std::path::PathBuf>,
    /// The key as resolved when the config was loaded (never deserialized).
    #[serde(skip)]
    pub resolved_api_key: Option<Secret>,
    /// The system prompt, sent first in every request (never trimmed).
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Sampling temperature, 0 to 2 (the server's default when unset).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The most tokens an answer may have (the server's default when unset).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Seconds allowed for connecting and for the response to start.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// Stream the answer as it is generated (shown while it is written).
    #[serde(default = "yes")]
    pub stream: bool,
    /// The most characters of system prompt, history and message sent with
    /// a turn's first request; the oldest history is dropped first to fit.
    /// (Tool calls and results of the running turn come on top.)
    #[serde(default = "default_history_budget_chars")]
    pub history_budget_chars: usize,
    /// How many rounds of tool calls one turn may run before it stops.
    #[serde(default = "default_max_tool_rounds")]
    pub max_tool_rounds: u32,
    /// The model can see images: photos are sent as `image_url` content
    /// parts (else the user is told it cannot see them).
    #[serde(default)]
    pub vision: bool,
    /// Models a chat may switch to with /model (buttons); empty: /model
    /// only shows `model`.
    #[serde(default)]
    pub models: Vec<String>,
}

fn default_base_url() -> String {
    DEFAULT_BASE_URL.to_string()
}
fn default_api_key_env() -> String {
    DEFAULT_API_KEY_ENV.to_string()
}
fn default_request_timeout_secs() -> u64 {
    60
}
fn yes() -> bool {
    true
}
fn default_history_budget_chars() -> usize {
    24_000
}
fn default_max_tool_rounds() -> u32 {
    8
}

impl OpenAiConfig {
    /// A config for `model` at `base_url` with every other key at its default.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key_env: default_api_key_env(),
            api_key_file: None,
            resolved_api_key: None,
            system_prompt: None,
            temperature: None,
            max_tokens: None,
            request_timeout_secs: default_request_timeout_secs(),
            stream: true,
            history_budget_chars: default_history_budget_chars(),
            max_tool_rounds: default_max_tool_rounds(),
            vision: false,
            models: Vec::new(),
        }
    }

    /// Check the values; the error is one line naming the key and the fix.
    pub fn validate(&self) -> Result<(), String> {
        parse_base_url(&self.base_url)?;
        if self.model.trim().is_empty() {
            return Err(
                "agent.openai.model is empty: name the model to use, e.g. \"gpt-4o-mini\""
                    .to_string(),
            );
        }
        if !is_env_var_name(&self.api_key_env) {
            return Err(format!(
                "agent.openai.api_key_env {:?} is not an environment variable name",
                self.api_key_env
            ));
        }
        if let Some(temperature) = self.temperature {
            if !(0.0..=2.0).contains(&temperature) {
                return Err(format!(
                    "agent.openai.temperature {temperature} is out of range: use 0 to 2"
                ));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(
                "agent.openai.max_tokens must be at least 1 (or left out for the server's default)"
                    .to_string(),
            );
        }
        if self.request_timeout_secs == 0 {
            return Err("agent.openai.request_timeout_secs must be at least 1".to_string());
        }
        if self.max_tool_rounds == 0 {
            return Err("agent.openai.max_tool_rounds must be at least 1".to_string());
        }
        Ok(())
    }

    /// The API key from the environment variable `api_key_env`, looked up
    /// with `env` (blank counts as missing).
    pub fn api_key_from(&self, env: impl Fn(&str) -> Option<String>) -> Option<Secret> {
        env(&self.api_key_env)
            .filter(|key| !key.trim().is_empty())
            .map(Secret::new)
    }

    /// Record the key resolved at config load (file, credential or
    /// environment; see `crate::secrets`).
    pub fn set_api_key(&mut self, key: Option<Secret>) {
        self.resolved_api_key = key;
    }

    /// The key resolved at config load, else the one in `api_key_env` now
    /// (for configs built in code).
    pub fn api_key(&self) -> Option<Secret> {
        self.resolved_api_key
            .clone()
            .or_else(|| self.api_key_from_env())
    }

    /// The API key from the process environment (see [`Self::api_key_from`]).
    pub fn api_key_from_env(&self) -> Option<Secret> {
        self.api_key_from(|name| std::env::var(name).ok())
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    fn system_prompt(&self) -> Option<&str> {
        self.system_prompt
            .as_deref()
            .filter(|prompt| !prompt.trim().is_empty())
    }
}

fn parse_base_url(base_url: &str) -> Result<Url, String> {
    let url = Url::parse(base_url)
        .map_err(|e| format!("agent.openai.base_url {base_url:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(format!(
            "agent.openai.base_url {base_url:?} must be an http:// or https:// URL, \
             e.g. \"https://api.openai.com/v1\""
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("agent.openai.base_url {base_url:?} has no host"));
    }
    Ok(url)
}

fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// `<base_url>/chat/completions`, keeping any query the base URL has.
fn chat_completions_url(base: &Url) -> Url {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(["chat", "completions"]);
    }
    url
}

/// The base URL as it may appear in chat and logs: no credentials, no query.
fn shareable_url(base: &Url) -> String {
    let mut url = base.clone();
    // Both only fail for URLs that cannot have credentials, which is fine.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.as_str().trim_end_matches('/').to_string()
}

// ---------------------------------------------------------------------------
// The agent
// ---------------------------------------------------------------------------

/// Answers turns with an OpenAI-compatible chat completions server, running
/// the model's tool calls through a [`ToolRegistry`].
pub struct OpenAiAgent {
    config: OpenAiConfig,
    api_key: Option<Secret>,
    tools: Arc<dyn ToolRegistry>,
    /// One client for all turns, so connections are pooled and reused.
    client: reqwest::Client,
    endpoint: Url,
    /// The base URL without credentials, for messages and logs.
    shown_base_url: String,
}

impl fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiAgent")
            .field("config", &self.config)
            .field("api_key", &self.api_key)
            .field("endpoint", &self.shown_base_url)
            .finish_non_exhaustive()
    }
}

impl OpenAiAgent {
    /// Validate `config` and set up the HTTP client. `api_key` is sent as a
    /// bearer token when present (see [`OpenAiConfig::api_key_from_env`]).
    pub fn new(
        config: OpenAiConfig,
        api_key: Option<Secret>,
        tools: Arc<dyn ToolRegistry>,
    ) -> Result<Self, String> {
        config.validate()?;
        let base = parse_base_url(&config.base_url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.request_timeout())
            .user_agent(concat!("telegate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot set up the HTTP client for agent.openai: {e}"))?;
        Ok(OpenAiAgent {
            endpoint: chat_completions_url(&base),
            shown_base_url: shareable_url(&base),
            api_key: api_key.filter(|key| !key.expose().trim().is_empty()),
            config,
            tools,
            client,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }
}

impl Agent for OpenAiAgent {
    fn name(&self) -> &str {
        "openai"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(self.run_turn(turn))
    }
}

// ---------------------------------------------------------------------------
// The tool loop
// ---------------------------------------------------------------------------

/// One tool call the model asked for, complete.
#[derive(Clone, Debug, PartialEq)]
struct ToolCall {
    id: String,
    name: String,
    /// Raw JSON text (`{}` when the model sent nothing).
    arguments: String,
}

/// What one completion request produced.
#[derive(Clone, Debug, Default, PartialEq)]
struct ModelAnswer {
    text: String,
    tool_calls: Vec<ToolCall>,
    finish_reason: Option<String>,
}

impl OpenAiAgent {
    async fn run_turn(&self, turn: TurnRequest) -> Result<AgentReply, AgentError> {
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
    fn tool_budget_exhausted(
        &self,
        answer: ModelAnswer,
        mut shown: ShownText<'_>,
        mut transcript: Vec<ChatMessage>,
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
        // The unanswered tool calls stay out of the transcript: a history with
        // calls but no results is rejected by the API.
        let content = if answer.text.trim().is_empty() {
            notice.clone()
        } else {
            answer.text
        };
        transcript.push(ChatMessage::new(Role::Assistant, content));
        shown.push_paragraph(&notice);
        AgentReply {
            text: shown.into_text(),
            transcript,
            history_trimmed: 0,
        }
    }

    /// Run one tool call; every failure becomes the result text. Only
    /// cancellation is an error.
    async fn run_tool(
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

/// The reply for a round without tool calls.
fn final_reply(
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
struct ShownText<'a> {
    progress: &'a Progress,
    text: String,
    /// Text was kept from an earlier round: separate the next text from it.
    separate_next: bool,
}

impl<'a> ShownText<'a> {
    fn new(progress: &'a Progress) -> Self {
        ShownText {
            progress,
            text: String::new(),
            separate_next: false,
        }
    }

    fn start_round(&mut self) {
        if self.text.trim().is_empty() {
            self.text.clear();
            self.separate_next = false;
            self.progress.set_text("");
        } else {
            self.separate_next = true;
        }
    }

    fn push(&mut self, delta: &str) {
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
    fn push_paragraph(&mut self, text: &str) {
        self.separate_next = !self.text.trim().is_empty();
        self.push(text);
    }

    fn into_text(self) -> String {
        self.text
    }
}

fn paragraph_separator(before: &str) -> &'static str {
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
fn tool_specs(definitions: &[ToolDefinition]) -> Option<Value> {
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

fn assistant_tool_call_message(answer: &ModelAnswer) -> ChatMessage {
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

fn tool_result_message(call: &ToolCall, result: String) -> ChatMessage {
    ChatMessage {
        tool_call_id: Some(call.id.clone()),
        name: Some(call.name.clone()),
        ..ChatMessage::new(Role::Tool, result)
    }
}

fn tool_error_text(error: &ToolError, definitions: &[ToolDefinition]) -> String {
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
async fn call_tool_catching_panics(
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

fn tool_panicked(payload: &(dyn Any + Send)) -> ToolError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string());
    tracing::error!(%message, "a tool panicked");
    ToolError::Failed(format!("the tool crashed ({message})"))
}

// ---------------------------------------------------------------------------
// One completion request
// ---------------------------------------------------------------------------

impl OpenAiAgent {
    /// Send one request and read the answer, streamed or not.
    async fn complete(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        round: u32,
        (cancel, model): (&CancellationToken, Option<&str>),
        shown: &mut ShownText<'_>,
    ) -> Result<ModelAnswer, AgentError> {
        let mut body = self.request_body(messages, tools);
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
        if is_json_response(&response) {
            let answer = self.read_json_answer(response, round, cancel).await?;
            shown.push(&answer.text);
            Ok(answer)
        } else {
            self.read_stream_answer(response, round, cancel, shown)
                .await
        }
    }

    fn request_body(&self, messages: &[ChatMessage], tools: Option<&Value>) -> Value {
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
        body
    }

    /// POST the request; a non-success status becomes its error here.
    async fn send(
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
    async fn read_error_body(
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

    async fn read_json_answer(
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

    async fn read_stream_answer(
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
            match answer.apply(&event.event, &event.data) {
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

fn is_json_response(response: &reqwest::Response) -> bool {
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
fn wire_message(message: &ChatMessage) -> Value {
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

fn has_entries(value: &Value) -> bool {
    value.as_array().is_some_and(|entries| !entries.is_empty())
}

// ---------------------------------------------------------------------------
// Reading answers
// ---------------------------------------------------------------------------

/// What one SSE event meant.
#[derive(Debug, PartialEq)]
enum StreamStep {
    /// New answer text.
    Text(String),
    /// Nothing to show (role chunk, tool call delta, keep-alive, unreadable).
    Continue,
    /// `[DONE]`.
    Done,
}

/// A tool call being assembled from stream deltas.
#[derive(Debug, Default)]
struct PartialCall {
    index: usize,
    id: String,
    name: String,
    arguments: String,
}

/// Accumulates a streamed answer from its chunks.
#[derive(Debug, Default)]
struct StreamedAnswer {
    text: String,
    calls: Vec<PartialCall>,
    finish_reason: Option<String>,
}

impl StreamedAnswer {
    /// Apply one event's data. `Err` carries the provider's error message.
    fn apply(&mut self, event_name: &str, data: &str) -> Result<StreamStep, String> {
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
        Ok(if text.is_empty() {
            StreamStep::Continue
        } else {
            StreamStep::Text(text)
        })
    }

    /// Merge one `tool_calls` delta: by `index`, or (servers that omit it) by
    /// a new `id` starting a new call and anything else continuing the last.
    fn merge_call_delta(&mut self, delta: &Value) {
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
    }

    /// A stream ends with `[DONE]` or at least a finish reason; anything
    /// else means the connection was cut and the answer (or a tool call's
    /// arguments) may be incomplete, so it must not be used.
    fn ended_properly(&self, saw_done: bool) -> bool {
        saw_done || self.finish_reason.is_some()
    }

    fn finish(mut self, round: u32) -> ModelAnswer {
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
        }
    }
}

/// Why a non-streamed completion could not be used.
#[derive(Debug, PartialEq)]
enum CompletionError {
    /// The body is an `{"error": …}` with this message.
    Provider(String),
    /// The body is not a completion.
    Unreadable,
}

/// Parse a non-streamed completion body.
fn parse_completion(body: &str, round: u32) -> Result<ModelAnswer, CompletionError> {
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
    })
}

/// The choices for the first (and normally only) completion: index 0 or
/// no index at all.
fn first_choices(chunk: &Value) -> impl Iterator<Item = &Value> {
    chunk["choices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|choice| choice["index"].as_u64().unwrap_or(0) == 0)
}

/// Text content: a string, or an array of parts with `text`.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

fn normalize_arguments(arguments: String) -> String {
    if arguments.trim().is_empty() {
        "{}".to_string()
    } else {
        arguments
    }
}

/// The message of an `{"error": …}` object, if `value` is one.
fn provider_error_message(value: &Value) -> Option<String> {
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
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

impl OpenAiAgent {
    fn backend_error(&self, user_message: String, detail: String) -> AgentError {
        // Provider bodies can quote the key or other credentials.
        let key = self.api_key.as_ref().map(Secret::expose);
        let detail = crate::secrets::redact(&detail, key.as_slice());
        tracing::warn!(base_url = %self.shown_base_url, %detail, "LLM request failed");
        AgentError::Backend {
            user_message,
            detail,
        }
    }

    fn unreachable(&self, reason: &str, detail: &str) -> AgentError {
        self.backend_error(
            format!(
                "Could not reach the LLM at {}: {reason}.",
                self.shown_base_url
            ),
            format!("request to {} failed: {detail}", self.shown_base_url),
        )
    }

    fn http_error(&self, status: u16, body: &str) -> AgentError {
        let provider_message = provider_message_in_body(body);
        let user_message = http_error_message(
            status,
            provider_message.as_deref(),
            &self.config,
            self.api_key.is_some(),
            &self.shown_base_url,
        );
        self.backend_error(
            user_message,
            format!("HTTP {status}: {}", excerpt(body, LOG_BODY_CHARS)),
        )
    }

    fn provider_error(&self, message: &str) -> AgentError {
        self.backend_error(
            format!(
                "The LLM provider reported an error: {}",
                classify_provider_message(message)
            ),
            format!("error event from the provider: {message}"),
        )
    }

    fn broke_off(&self, detail: &str) -> AgentError {
        self.backend_error(
            format!(
                "The connection to the LLM at {} broke off mid-answer. Try again.",
                self.shown_base_url
            ),
            format!("reading the response failed: {detail}"),
        )
    }

    fn unreadable(&self, body: &str) -> AgentError {
        self.backend_error(
            format!(
                "The LLM at {} sent an answer telegate could not read. Check that \
                 agent.openai.base_url points to an OpenAI-compatible API.",
                self.shown_base_url
            ),
            format!("unreadable response: {}", excerpt(body, LOG_BODY_CHARS)),
        )
    }
}

/// The provider's own error message in an error response body, if any.
fn provider_message_in_body(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    provider_error_message(&value).or_else(|| {
        ["message", "detail"]
            .iter()
            .find_map(|key| value[*key].as_str())
            .map(|message| excerpt(message, CHAT_PROVIDER_CHARS))
    })
}

/// The chat message for an HTTP error status.
fn http_error_message(
    status: u16,
    provider_message: Option<&str>,
    config: &OpenAiConfig,
    key_set: bool,
    base_url: &str,
) -> String {
    // The provider's own words never reach the chat (they can quote keys,
    // prompts or account details); only their class does. They are logged.
    let provider_suffix = |message: Option<&str>| match message {
        Some(message) if !message.trim().is_empty() => {
            format!(" {}", classify_provider_message(message))
        }
        _ => String::new(),
    };
    match status {
        401 | 403 => {
            let hint = if key_set { "" } else { " (it is not set)" };
            format!(
                "The LLM provider rejected the API key (HTTP {status}). Check the key in {}{hint}.",
                config.api_key_env
            )
        }
        404 => format!(
            "The LLM provider has no model \"{}\" at {base_url} (HTTP 404). Check \
             agent.openai.model, and that agent.openai.base_url is the API root (often ending in /v1).",
            config.model
        ),
        429 => "The LLM provider is rate limiting us or the quota is used up (HTTP 429). Try again later."
            .to_string(),
        500..=599 => format!(
            "The LLM provider had an internal error (HTTP {status}). Try again in a moment."
        ),
        400..=499 => format!(
            "The LLM provider rejected the request (HTTP {status}).{}",
            provider_suffix(provider_message)
        ),
        _ => format!("The LLM provider answered with an unexpected HTTP {status}."),
    }
}

/// What a provider's error message is about, in one short sentence of our
/// own: the chat never sees the provider's text itself.
fn classify_provider_message(message: &str) -> &'static str {
    let lower = message.to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if has(&[
        "context length",
        "context_length",
        "maximum context",
        "too long",
        "too many tokens",
    ]) {
        "The conversation is too long for the model: send /reset to start fresh."
    } else if has(&["overload", "capacity", "unavailable", "busy"]) {
        "The model is overloaded right now. Try again in a moment."
    } else if has(&["quota", "billing", "insufficient", "credit"]) {
        "The account's quota or credit is used up."
    } else if has(&["rate limit", "rate_limit", "too many requests"]) {
        "Too many requests: try again in a moment."
    } else if has(&["content", "policy", "safety", "moderation"]) {
        "The request was refused by the provider's content policy."
    } else {
        "Details are in telegate's log."
    }
}

/// A short reason for a failed connection, for the chat.
fn describe_transport_error(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "the connection timed out".to_string();
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => return "connection reset".to_string(),
                std::io::ErrorKind::TimedOut => return "the connection timed out".to_string(),
                _ => {}
            }
        }
        source = current.source();
    }
    let chain = error_chain(error).to_ascii_lowercase();
    if chain.contains("dns error") || chain.contains("failed to lookup address") {
        "the host name could not be resolved".to_string()
    } else if chain.contains("certificate") || chain.contains("tls") {
        "the TLS handshake failed (check the certificate)".to_string()
    } else if error.is_connect() {
        "the connection failed".to_string()
    } else {
        "the request failed".to_string()
    }
}

/// An error and all its sources on one line, for the log.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(current) = source {
        chain.push_str(": ");
        chain.push_str(&current.to_string());
        source = current.source();
    }
    chain
}

// ---------------------------------------------------------------------------
// History trimming
// ---------------------------------------------------------------------------

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
fn history_groups(history: &[ChatMessage]) -> Vec<&[ChatMessage]> {
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
fn group_is_complete(group: &[ChatMessage]) -> bool {
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

fn message_chars(message: &ChatMessage) -> usize {
    let calls = message
        .tool_calls
        .as_ref()
        .map_or(0, |calls| calls.to_string().chars().count());
    message.content.chars().count() + calls
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    fn calls(ids: &[&str]) -> ChatMessage {
        let calls = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "t", "arguments": "{}"}}))
            .collect();
        ChatMessage {
            tool_calls: Some(Value::Array(calls)),
            ..msg(Role::Assistant, "")
        }
    }

    fn result(id: &str, content: &str) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(id.to_string()),
            name: Some("t".to_string()),
            ..msg(Role::Tool, content)
        }
    }

    fn roles(messages: &[ChatMessage]) -> Vec<Role> {
        messages.iter().map(|m| m.role).collect()
    }

    fn total_chars(messages: &[ChatMessage]) -> usize {
        messages.iter().map(message_chars).sum()
    }

    // --- trim_history ---

    #[test]
    fn everything_fits_in_a_large_budget() {
        let history = vec![msg(Role::User, "hi"), msg(Role::Assistant, "hello")];
        let (messages, dropped) = trim_history(Some("be brief"), &history, "again", 1000);
        assert_eq!(dropped, 0);
        assert_eq!(
            roles(&messages),
            [Role::System, Role::User, Role::Assistant, Role::User]
        );
        assert_eq!(messages[0].content, "be brief");
        assert_eq!(messages[3].content, "again");
    }

    #[test]
    fn the_oldest_history_goes_first_and_the_budget_holds() {
        let history: Vec<_> = (0..10)
            .map(|i| {
                msg(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    &format!("{i:0>10}"),
                )
            })
            .collect();
        // system 4 + user 6 + room for three 10-char messages.
        let (messages, dropped) = trim_history(Some("sys!"), &history, "latest", 40);
        assert_eq!(dropped, 7);
        assert!(total_chars(&messages) <= 40);
        assert_eq!(messages[0].role, Role::System);
        assert_eq!(messages[1].content, history[7].content);
        assert_eq!(messages.last().unwrap().content, "latest");
    }

    #[test]
    fn system_and_user_are_kept_even_over_the_budget() {
        let history = vec![msg(Role::User, "old")];
        let (messages, dropped) = trim_history(Some("a long system prompt"), &history, "now", 5);
        assert_eq!(dropped, 1);
        assert_eq!(roles(&messages), [Role::System, Role::User]);
        let (messages, _) = trim_history(None, &history, "now", 0);
        assert_eq!(roles(&messages), [Role::User]);
    }

    #[test]
    fn a_tool_call_group_is_kept_or_dropped_whole() {
        let history = vec![
            msg(Role::User, "add things"),
            calls(&["a", "b"]),
            result("a", "1111111111"),
            result("b", "2222222222"),
            msg(Role::Assistant, "done"),
        ];
        let call_cost = message_chars(&history[1]);
        // Room for "done" and one result but not the whole group.
        let budget = 4 + 10 + 1 + call_cost;
        let (messages, dropped) = trim_history(None, &history, "x", budget);
        assert_eq!(roles(&messages), [Role::Assistant, Role::User]);
        assert_eq!(dropped, 4);
        // Room for the whole group.
        let (messages, dropped) = trim_history(None, &history, "x", budget + 10);
        assert_eq!(
            roles(&messages),
            [
                Role::Assistant,
                Role::Tool,
                Role::Tool,
                Role::Assistant,
                Role::User
            ]
        );
        assert_eq!(dropped, 1);
    }

    #[test]
    fn history_never_starts_with_a_tool_result() {
        let history = vec![
            result("gone", "orphan"),
            msg(Role::User, "q"),
            msg(Role::Assistant, "a"),
        ];
        let (messages, dropped) = trim_history(None, &history, "x", 1000);
        assert_eq!(roles(&messages), [Role::User, Role::Assistant, Role::User]);
        assert_eq!(dropped, 1);
    }

    #[test]
    fn calls_without_all_their_results_are_left_out() {
        let history = vec![
            msg(Role::User, "q"),
            calls(&["a", "b"]),
            result("a", "1"),
            msg(Role::User, "next"),
        ];
        let (messages, dropped) = trim_history(None, &history, "x", 1000);
        assert_eq!(roles(&messages), [Role::User, Role::User, Role::User]);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn an_empty_history_gives_system_and_user() {
        let (messages, dropped) = trim_history(Some("s"), &[], "u", 0);
        assert_eq!(dropped, 0);
        assert_eq!(roles(&messages), [Role::System, Role::User]);
    }

    // --- stream chunks ---

    fn apply_all(answer: &mut StreamedAnswer, chunks: &[&str]) -> Vec<StreamStep> {
        chunks
            .iter()
            .map(|chunk| answer.apply("", chunk).unwrap())
            .collect()
    }

    #[test]
    fn text_deltas_accumulate_and_odd_chunks_are_tolerated() {
        let mut answer = StreamedAnswer::default();
        let steps = apply_all(
            &mut answer,
            &[
                r#"{"id":"x"}"#,
                r#"{"choices":[]}"#,
                r#"{"choices":[{"index":0,"delta":{"role":"assistant"},"extra":1}]}"#,
                r#"{"choices":[{"delta":{"content":"Hel"}}]}"#,
                "not json at all",
                r#"{"choices":[{"index":0,"delta":{"content":[{"type":"text","text":"lo"}]}}]}"#,
                r#"{"choices":[{"index":1,"delta":{"content":"other choice"}}]}"#,
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
                "[DONE]",
            ],
        );
        assert_eq!(steps[3], StreamStep::Text("Hel".into()));
        assert_eq!(steps[8], StreamStep::Done);
        let answer = answer.finish(0);
        assert_eq!(answer.text, "Hello");
        assert_eq!(answer.finish_reason.as_deref(), Some("stop"));
        assert!(answer.tool_calls.is_empty());
    }

    #[test]
    fn tool_call_deltas_merge_by_index() {
        let mut answer = StreamedAnswer::default();
        apply_all(
            &mut answer,
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"add","arguments":""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"c2","function":{"name":"mul","arguments":"{\"x\""}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":":2}"}}]}}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
            ],
        );
        let answer = answer.finish(0);
        assert_eq!(
            answer.tool_calls,
            [
                ToolCall {
                    id: "c1".into(),
                    name: "add".into(),
                    arguments: r#"{"a":1}"#.into()
                },
                ToolCall {
                    id: "c2".into(),
                    name: "mul".into(),
                    arguments: r#"{"x":2}"#.into()
                },
            ]
        );
    }

    #[test]
    fn tool_call_deltas_without_index_or_id_still_merge() {
        let mut answer = StreamedAnswer::default();
        apply_all(
            &mut answer,
            &[
                r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"ls"}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"function":{"name":"ls","arguments":{"path":"/"}}}]}}]}"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","function":{"name":"pwd"}}]}}]}"#,
            ],
        );
        let answer = answer.finish(3);
        assert_eq!(answer.tool_calls.len(), 2);
        assert_eq!(answer.tool_calls[0].id, "call_3_0");
        assert_eq!(answer.tool_calls[0].name, "ls");
        assert_eq!(answer.tool_calls[0].arguments, r#"{"path":"/"}"#);
        assert_eq!(answer.tool_calls[1].id, "b");
        assert_eq!(answer.tool_calls[1].arguments, "{}");
    }

    #[test]
    fn a_stream_cut_before_its_end_is_not_used() {
        let mut answer = StreamedAnswer::default();
        apply_all(
            &mut answer,
            &[r#"{"choices":[{"delta":{"content":"half an ans"}}]}"#],
        );
        assert!(!answer.ended_properly(false));
        assert!(answer.ended_properly(true));
        apply_all(
            &mut answer,
            &[r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#],
        );
        assert!(
            answer.ended_properly(false),
            "a finish reason without [DONE] is enough"
        );
    }

    #[test]
    fn an_error_chunk_carries_the_provider_message() {
        let mut answer = StreamedAnswer::default();
        let error = answer
            .apply(
                "",
                r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
            )
            .unwrap_err();
        assert_eq!(error, "overloaded");
        assert_eq!(
            answer.apply("error", "plain words").unwrap_err(),
            "plain words"
        );
        assert_eq!(
            answer.apply("", r#"{"error":"short"}"#).unwrap_err(),
            "short"
        );
    }

    // --- non-streamed completions ---

    #[test]
    fn a_completion_body_parses_text_and_tool_calls() {
        let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"t1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}},
                          {"type":"function","function":{"name":"pwd","arguments":{}}}]},
            "finish_reason":"tool_calls"}]}"#;
        let answer = parse_completion(body, 2).unwrap();
        assert_eq!(answer.text, "");
        assert_eq!(answer.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(answer.tool_calls[1].id, "call_2_1");
        assert_eq!(answer.tool_calls[1].arguments, "{}");
        assert_eq!(
            parse_completion(r#"{"error":{"message":"nope"}}"#, 0),
            Err(CompletionError::Provider("nope".into()))
        );
        assert_eq!(
            parse_completion("<html>", 0),
            Err(CompletionError::Unreadable)
        );
        assert_eq!(
            parse_completion(r#"{"choices":[]}"#, 0),
            Err(CompletionError::Unreadable)
        );
    }

    // --- wire format ---

    #[test]
    fn wire_messages_follow_the_api_shape() {
        let call = calls(&["a"]);
        let wire = wire_message(&call);
        assert_eq!(wire["content"], Value::Null);
        assert_eq!(wire["tool_calls"][0]["id"], "a");
        let wire = wire_message(&result("a", "42"));
        assert_eq!(
            wire,
            json!({"role": "tool", "content": "42", "tool_call_id": "a"})
        );
        let empty_calls = ChatMessage {
            tool_calls: Some(json!([])),
            ..msg(Role::Assistant, "hi")
        };
        assert_eq!(
            wire_message(&empty_calls),
            json!({"role": "assistant", "content": "hi"})
        );
    }

    #[test]
    fn no_tools_means_no_tools_key() {
        assert_eq!(tool_specs(&[]), None);
        let specs = tool_specs(&[ToolDefinition {
            name: "add".into(),
            description: "adds".into(),
            parameters: json!({"type": "object"}),
        }])
        .unwrap();
        assert_eq!(specs[0]["type"], "function");
        assert_eq!(specs[0]["function"]["name"], "add");
    }

    // --- progress across rounds ---

    #[test]
    fn shown_text_keeps_earlier_rounds_and_drops_whitespace() {
        let progress = Progress::new();
        let mut shown = ShownText::new(&progress);
        shown.start_round();
        shown.push("\n");
        shown.start_round();
        assert_eq!(progress.snapshot(), "");
        shown.push("Let me check.");
        shown.start_round();
        shown.push("  ");
        shown.push("Found it.");
        assert_eq!(progress.snapshot(), "Let me check.\n\nFound it.");
        assert_eq!(shown.into_text(), "Let me check.\n\nFound it.");
    }

    // --- config ---

    #[test]
    fn config_defaults_and_unknown_keys() {
        let config: OpenAiConfig = toml::from_str("model = \"m\"").unwrap();
        assert_eq!(config, OpenAiConfig::new(DEFAULT_BASE_URL, "m"));
        assert!(config.validate().is_ok());
        assert!(config.stream);
        assert_eq!(config.history_budget_chars, 24_000);
        assert_eq!(config.max_tool_rounds, 8);
        assert_eq!(config.request_timeout_secs, 60);
        assert!(toml::from_str::<OpenAiConfig>("model = \"m\"\nmodle = 1").is_err());
        assert!(toml::from_str::<OpenAiConfig>("base_url = \"http://x/v1\"").is_err());
    }

    #[test]
    fn validation_names_the_bad_key() {
        let bad = |edit: fn(&mut OpenAiConfig)| {
            let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", "m");
            edit(&mut config);
            config.validate().unwrap_err()
        };
        assert!(bad(|c| c.base_url = "ftp://host/v1".into()).contains("base_url"));
        assert!(bad(|c| c.base_url = "not a url".into()).contains("base_url"));
        assert!(bad(|c| c.model = " ".into()).contains("model"));
        assert!(bad(|c| c.api_key_env = "A-B".into()).contains("api_key_env"));
        assert!(bad(|c| c.temperature = Some(3.0)).contains("temperature"));
        assert!(bad(|c| c.max_tokens = Some(0)).contains("max_tokens"));
        assert!(bad(|c| c.request_timeout_secs = 0).contains("request_timeout_secs"));
        assert!(bad(|c| c.max_tool_rounds = 0).contains("max_tool_rounds"));
    }

    #[test]
    fn the_api_key_comes_from_the_named_variable() {
        let config = OpenAiConfig {
            api_key_env: "MY_KEY".into(),
            ..OpenAiConfig::new(DEFAULT_BASE_URL, "m")
        };
        let key = config.api_key_from(|name| (name == "MY_KEY").then(|| "sk-1".to_string()));
        assert_eq!(key.unwrap().expose(), "sk-1");
        assert!(config.api_key_from(|_| Some("  ".to_string())).is_none());
    }

    #[test]
    fn urls_keep_their_path_and_lose_credentials_when_shown() {
        let base = parse_base_url("https://user:pw@example.com/v1/?x=1").unwrap();
        assert_eq!(
            chat_completions_url(&base).as_str(),
            "https://user:pw@example.com/v1/chat/completions?x=1"
        );
        assert_eq!(shareable_url(&base), "https://example.com/v1");
        let base = parse_base_url("http://127.0.0.1:11434").unwrap();
        assert_eq!(
            chat_completions_url(&base).as_str(),
            "http://127.0.0.1:11434/chat/completions"
        );
    }

    // --- error messages ---

    #[test]
    fn each_http_status_class_has_its_message() {
        let config = OpenAiConfig::new("http://h/v1", "gpt-x");
        let message =
            |status, provider| http_error_message(status, provider, &config, true, "http://h/v1");
        assert_eq!(
            message(401, Some("Incorrect API key provided: sk-12***")),
            "The LLM provider rejected the API key (HTTP 401). Check the key in OPENAI_API_KEY."
        );
        assert!(http_error_message(403, None, &config, false, "u").contains("(it is not set)"));
        let not_found = message(404, None);
        assert!(not_found.contains("\"gpt-x\"") && not_found.contains("http://h/v1"));
        assert!(message(429, Some("quota exceeded sk-1234567890")).contains("quota"));
        assert!(!message(429, Some("quota exceeded sk-1234567890")).contains("sk-"));
        assert!(message(503, Some("boom")).contains("HTTP 503"));
        assert!(!message(503, Some("boom")).contains("boom"));
        let too_long = message(400, Some("context too long for acct 42"));
        assert!(too_long.contains("too long for the model"), "{too_long}");
        assert!(!too_long.contains("acct 42"), "{too_long}");
        let other = message(400, Some("weird thing about org-secret"));
        assert!(!other.contains("org-secret"), "{other}");
    }

    #[test]
    fn provider_messages_are_found_in_common_body_shapes() {
        assert_eq!(
            provider_message_in_body(r#"{"error":{"message":"m1"}}"#).as_deref(),
            Some("m1")
        );
        assert_eq!(
            provider_message_in_body(r#"{"detail":"m2"}"#).as_deref(),
            Some("m2")
        );
        assert_eq!(provider_message_in_body("plain"), None);
    }

    #[test]
    fn excerpts_cut_on_character_boundaries() {
        assert_eq!(excerpt("héllo", 2), "hé…");
        assert_eq!(excerpt("hi", 2), "hi");
    }
}
