//! `[agent.openai]`: the server, model and limits of the `openai` backend,
//! and their validation (URLs, the API key's source).

use crate::agent::openai::DEFAULT_API_KEY_ENV;
use crate::agent::openai::DEFAULT_BASE_URL;
use crate::secrets::Secret;
use serde::Deserialize;
use std::time::Duration;
use url::Url;

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
    /// Ask a streamed answer to end with its token usage
    /// (`stream_options.include_usage`), which budgets and /usage count.
    /// Turn off for a server that refuses the option.
    #[serde(default = "yes")]
    pub stream_usage: bool,
}

pub(super) fn default_base_url() -> String {
    DEFAULT_BASE_URL.to_string()
}
pub(super) fn default_api_key_env() -> String {
    DEFAULT_API_KEY_ENV.to_string()
}
pub(super) fn default_request_timeout_secs() -> u64 {
    60
}
pub(super) fn yes() -> bool {
    true
}
pub(super) fn default_history_budget_chars() -> usize {
    24_000
}
pub(super) fn default_max_tool_rounds() -> u32 {
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
            stream_usage: true,
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

    pub(super) fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub(super) fn system_prompt(&self) -> Option<&str> {
        self.system_prompt
            .as_deref()
            .filter(|prompt| !prompt.trim().is_empty())
    }
}

pub(super) fn parse_base_url(base_url: &str) -> Result<Url, String> {
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

pub(super) fn is_env_var_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// `<base_url>/chat/completions`, keeping any query the base URL has.
pub(super) fn chat_completions_url(base: &Url) -> Url {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(["chat", "completions"]);
    }
    url
}

/// The base URL as it may appear in chat and logs: no credentials, no query.
pub(super) fn shareable_url(base: &Url) -> String {
    let mut url = base.clone();
    // Both only fail for URLs that cannot have credentials, which is fine.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.as_str().trim_end_matches('/').to_string()
}
