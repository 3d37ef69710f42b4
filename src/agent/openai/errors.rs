//! Failures as one short chat message each; status codes, bodies and
//! error chains go to the log only, with credentials redacted.

use crate::agent::openai::stream::excerpt;
use crate::agent::openai::stream::provider_error_message;
use crate::agent::openai::CHAT_PROVIDER_CHARS;
use crate::agent::openai::LOG_BODY_CHARS;
use crate::agent::AgentError;
use crate::agent::OpenAiAgent;
use crate::agent::OpenAiConfig;
use crate::secrets::Secret;
use serde_json::Value;

impl OpenAiAgent {
    pub(super) fn backend_error(&self, user_message: String, detail: String) -> AgentError {
        // Provider bodies can quote the key or other credentials.
        let key = self.api_key.as_ref().map(Secret::expose);
        let detail = crate::secrets::redact(&detail, key.as_slice());
        tracing::warn!(base_url = %self.shown_base_url, %detail, "LLM request failed");
        AgentError::Backend {
            user_message,
            detail,
        }
    }

    pub(super) fn unreachable(&self, reason: &str, detail: &str) -> AgentError {
        self.backend_error(
            format!(
                "Could not reach the LLM at {}: {reason}.",
                self.shown_base_url
            ),
            format!("request to {} failed: {detail}", self.shown_base_url),
        )
    }

    pub(super) fn http_error(&self, status: u16, body: &str) -> AgentError {
        let provider_message = provider_message_in_body(body);
        let user_message = http_error_message(
            status,
            provider_message.as_deref(),
            &self.config,
            &self.shown_base_url,
        );
        let hint = owner_hint(status, &self.config, self.api_key.is_some());
        let error = self.backend_error(
            user_message,
            format!("HTTP {status}{hint}: {}", excerpt(body, LOG_BODY_CHARS)),
        );
        match (status, error) {
            // A refused key or a model that does not exist: only the
            // owner's setting can change that, not a fresh session.
            (
                401 | 403 | 404,
                AgentError::Backend {
                    user_message,
                    detail,
                },
            ) => AgentError::Setup {
                user_message,
                detail,
            },
            (_, error) => error,
        }
    }

    pub(super) fn provider_error(&self, message: &str) -> AgentError {
        self.backend_error(
            format!(
                "The LLM provider reported an error: {}",
                classify_provider_message(message)
            ),
            format!("error event from the provider: {message}"),
        )
    }

    pub(super) fn broke_off(&self, detail: &str) -> AgentError {
        self.backend_error(
            format!(
                "The connection to the LLM at {} broke off mid-answer. Try again.",
                self.shown_base_url
            ),
            format!("reading the response failed: {detail}"),
        )
    }

    pub(super) fn unreadable(&self, body: &str) -> AgentError {
        self.backend_error(
            format!(
                "The LLM at {} sent an answer telegate could not read.",
                self.shown_base_url
            ),
            format!(
                "unreadable response (check that agent.openai.base_url points to an \
                 OpenAI-compatible API): {}",
                excerpt(body, LOG_BODY_CHARS)
            ),
        )
    }
}

/// The provider's own error message in an error response body, if any.
pub(super) fn provider_message_in_body(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    provider_error_message(&value).or_else(|| {
        ["message", "detail"]
            .iter()
            .find_map(|key| value[*key].as_str())
            .map(|message| excerpt(message, CHAT_PROVIDER_CHARS))
    })
}

/// What the owner should check for an HTTP error status (for the log: the
/// chat is told in its users' words, without config keys).
pub(super) fn owner_hint(status: u16, config: &OpenAiConfig, key_set: bool) -> String {
    match status {
        401 | 403 if key_set => format!(" (check the key in {})", config.api_key_env),
        401 | 403 => format!(" (no API key is set: {} is empty)", config.api_key_env),
        404 => " (check agent.openai.model, and that agent.openai.base_url is the API root, \
                often ending in /v1)"
            .to_string(),
        _ => String::new(),
    }
}

/// The chat message for an HTTP error status.
pub(super) fn http_error_message(
    status: u16,
    provider_message: Option<&str>,
    config: &OpenAiConfig,
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
        401 | 403 => format!(
            "The LLM provider rejected this bot's API key (HTTP {status}). \
             The bot's owner needs to check it."
        ),
        404 => format!(
            "The LLM provider has no model \"{}\" at {base_url} (HTTP 404). \
             The bot's owner needs to check its model setting.",
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
pub(super) fn classify_provider_message(message: &str) -> &'static str {
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
pub(super) fn describe_transport_error(error: &reqwest::Error) -> String {
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
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(current) = source {
        chain.push_str(": ");
        chain.push_str(&current.to_string());
        source = current.source();
    }
    chain
}
