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

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use url::Url;

use super::{Agent, AgentError, AgentReply, TurnRequest};
use crate::secrets::Secret;
use crate::tools::ToolRegistry;

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

mod config;
mod errors;
mod history;
mod request;
mod stream;
#[cfg(test)]
mod tests;
mod tool_loop;

use crate::agent::openai::config::chat_completions_url;
use crate::agent::openai::config::parse_base_url;
use crate::agent::openai::config::shareable_url;
pub use config::OpenAiConfig;
pub use history::trim_history;

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

    fn attach_store(&self, tables: &crate::agent::AgentTables) {
        self.tools.attach_store(&tables.child_groups);
    }
}
