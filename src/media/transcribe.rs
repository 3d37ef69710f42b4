//! Speech to text through an OpenAI-compatible transcription endpoint:
//! `POST <base_url>/audio/transcriptions`, `multipart/form-data` with the
//! audio as `file` plus `model` (and `language` when configured), answered
//! with `{"text": "..."}` (`response_format=json`). OpenAI, Groq,
//! whisper.cpp's server and faster-whisper servers all speak it.
//!
//! A failure is told to the user in their terms
//! ([`TranscribeError::user_text`]: the service is not answering, the
//! recording could not be made out, voice cannot be transcribed here); what
//! the owner needs (the status, the shortened response body, which setting
//! to check) goes to the log. The API key is never logged.

use std::path::Path;
use std::time::Duration;

use super::TranscriptionConfig;
use crate::secrets::Secret;

/// Why a transcription failed. The `Display` text is the owner's detail
/// (for the log); [`TranscribeError::user_text`] is what the chat is told.
#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    /// The endpoint could not be reached, timed out, is overloaded or
    /// failed on its side (5xx, 429): worth trying again later.
    #[error("the transcription service is unavailable ({0})")]
    Unavailable(String),
    /// The endpoint refused the request for a reason of its setup (bad
    /// key, unknown model or path): the owner's to fix.
    #[error("the transcription service refused the request ({0}); check [media.transcription]")]
    Misconfigured(String),
    /// The endpoint could not read this recording (400, 413, 415, 422):
    /// damaged, too long, or in a format it does not take.
    #[error("the transcription service could not read the recording ({0})")]
    BadAudio(String),
    /// The saved audio file could not be read.
    #[error("the audio could not be read ({0})")]
    Io(String),
}

impl TranscribeError {
    /// What the chat is told (no config keys, no internals).
    pub fn user_text(&self) -> &'static str {
        match self {
            TranscribeError::Unavailable(_) => {
                "🎤 The speech-to-text service is not answering right now, so I could not \
                 listen to that. Please try again in a while, or type your message."
            }
            TranscribeError::Misconfigured(_) => {
                "🎤 I cannot turn voice messages into text right now. Please type your message instead."
            }
            TranscribeError::BadAudio(_) => {
                "🎤 I could not make out that recording (it may be damaged, too long or in a \
                 format I cannot read). Please send it again, or type your message."
            }
            TranscribeError::Io(_) => {
                "🎤 I could not read that recording. Please send it again."
            }
        }
    }
}

/// The failure an HTTP status of the endpoint stands for.
fn status_error(status: u16) -> TranscribeError {
    let detail = format!("HTTP {status}");
    match status {
        400 | 413 | 415 | 422 => TranscribeError::BadAudio(detail),
        429 | 500..=599 => TranscribeError::Unavailable(detail),
        _ => TranscribeError::Misconfigured(detail),
    }
}

/// A client for the configured endpoint.
#[derive(Clone)]
pub struct Transcriber {
    config: TranscriptionConfig,
    client: reqwest::Client,
    api_key: Option<Secret>,
}

impl std::fmt::Debug for Transcriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcriber")
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

impl Transcriber {
    /// A client for `config`, with the key resolved when the config was
    /// loaded (`resolved_api_key`). The environment is never read here:
    /// by now `main` has scrubbed the secrets from it.
    pub fn new(config: TranscriptionConfig) -> Result<Transcriber, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            .timeout(Duration::from_secs(config.timeout_secs.max(1)))
            .build()
            .map_err(|e| format!("cannot set up the transcription client: {e}"))?;
        let api_key = config
            .resolved_api_key
            .clone()
            .filter(|k| !k.expose().trim().is_empty());
        Ok(Transcriber {
            config,
            client,
            api_key,
        })
    }

    /// Whether the transcript is also shown in the chat.
    pub fn echo(&self) -> bool {
        self.config.echo_transcript
    }

    fn endpoint(&self) -> String {
        format!(
            "{}/audio/transcriptions",
            self.config.base_url.trim_end_matches('/')
        )
    }

    /// Transcribe the audio at `path` (named `file_name`, of type `mime`).
    pub async fn transcribe(
        &self,
        path: &Path,
        file_name: &str,
        mime: &str,
    ) -> Result<String, TranscribeError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|e| TranscribeError::Io(e.to_string()))?;
        let part = reqwest::multipart::Part::bytes(bytes)
            .file_name(file_name.to_string())
            .mime_str(mime)
            .or_else(|_| {
                reqwest::multipart::Part::bytes(Vec::new()).mime_str("application/octet-stream")
            })
            .map_err(|e| TranscribeError::Io(e.to_string()))?;
        let mut form = reqwest::multipart::Form::new()
            .part("file", part)
            .text("model", self.config.model.clone())
            .text("response_format", "json");
        if let Some(language) = &self.config.language {
            form = form.text("language", language.clone());
        }
        let mut request = self.client.post(self.endpoint()).multipart(form);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = request.send().await.map_err(|e| {
            TranscribeError::Unavailable(if e.is_timeout() {
                "timed out".into()
            } else {
                "could not connect".into()
            })
        })?;
        let status = response.status();
        let body = response.text().await.map_err(|e| {
            TranscribeError::Unavailable(if e.is_timeout() {
                "timed out".into()
            } else {
                "the answer could not be read".into()
            })
        })?;
        if !status.is_success() {
            tracing::warn!(status = status.as_u16(), body = %body.chars().take(300).collect::<String>(), "transcription failed");
            return Err(status_error(status.as_u16()));
        }
        parse_answer(&body)
    }
}

/// `{"text": "..."}` (json), or the plain text a `text` format server sends.
fn parse_answer(body: &str) -> Result<String, TranscribeError> {
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(value) => value
            .get("text")
            .and_then(serde_json::Value::as_str)
            .map(|t| t.trim().to_string())
            .ok_or_else(|| TranscribeError::Misconfigured("the answer had no text".into())),
        Err(_) => Ok(body.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_json_or_plain_text() {
        assert_eq!(parse_answer(r#"{"text":" hello "}"#).unwrap(), "hello");
        assert_eq!(parse_answer("plain words\n").unwrap(), "plain words");
        assert!(parse_answer(r#"{"error":"x"}"#).is_err());
    }

    #[test]
    fn a_recording_the_service_cannot_read_is_not_blamed_on_the_setup() {
        for status in [400, 413, 415, 422] {
            assert!(matches!(status_error(status), TranscribeError::BadAudio(_)));
        }
        for status in [429, 500, 503] {
            assert!(matches!(
                status_error(status),
                TranscribeError::Unavailable(_)
            ));
        }
        for status in [401, 403, 404] {
            let error = status_error(status);
            assert!(matches!(error, TranscribeError::Misconfigured(_)));
            // The owner is told what to check, in the log.
            assert!(error.to_string().contains("[media.transcription]"));
        }
    }

    #[test]
    fn what_the_user_is_told_names_no_setting() {
        let errors = [
            TranscribeError::Unavailable("timed out".into()),
            TranscribeError::Misconfigured("HTTP 401".into()),
            TranscribeError::BadAudio("HTTP 400".into()),
            TranscribeError::Io("permission denied".into()),
        ];
        for error in errors {
            let text = error.user_text();
            for word in ["media.", "[", "HTTP", "config", "permission"] {
                assert!(!text.contains(word), "{text}");
            }
        }
    }
}
