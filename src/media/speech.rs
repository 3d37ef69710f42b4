//! Text to speech through an OpenAI-compatible speech endpoint:
//! `POST <base_url>/audio/speech` with `{model, voice, input,
//! response_format: "opus"}`, answered with the audio bytes. OpenAI (and
//! servers copying it: Kokoro-FastAPI, openedai-speech, LocalAI) answer
//! `opus` with Ogg/Opus, the one format Telegram shows as a voice note.
//!
//! telegate converts nothing: audio that is not an Ogg container (`OggS`)
//! is refused ([`SpeechError::NotOgg`]) and the answer goes out as text.
//! A failure is one line for the chat; the status and the shortened
//! response body go to the log. The API key is read with the config,
//! before the process scrubs its environment, and never logged.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::secrets::Secret;

/// `[media.speech]`: voice answers.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeechConfig {
    /// The API root; requests go to `<base_url>/audio/speech`.
    pub base_url: String,
    /// The model, e.g. `tts-1` or `gpt-4o-mini-tts`.
    #[serde(default = "default_model")]
    pub model: String,
    /// The voice, e.g. `alloy`.
    #[serde(default = "default_voice")]
    pub voice: String,
    /// The environment variable holding the API key (none: no
    /// authorization header, fine for local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A file holding the API key (wins over the systemd credential
    /// `speech_api_key` and over `api_key_env`).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// The key as resolved when the config was loaded (never deserialized).
    #[serde(skip)]
    pub resolved_api_key: Option<Secret>,
    /// Seconds allowed for one answer to be spoken.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Answers longer than this (characters) are sent as text.
    #[serde(default = "default_max_chars")]
    pub max_chars: usize,
}

fn default_model() -> String {
    "tts-1".to_string()
}
fn default_voice() -> String {
    "alloy".to_string()
}
fn default_timeout_secs() -> u64 {
    60
}
fn default_max_chars() -> usize {
    4000
}

impl SpeechConfig {
    /// Check the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        crate::vocab::check_http_url("media.speech.base_url", &self.base_url)?;
        if self.model.trim().is_empty() {
            return Err("media.speech.model is empty".into());
        }
        if self.voice.trim().is_empty() {
            return Err("media.speech.voice is empty".into());
        }
        if let Some(name) = &self.api_key_env {
            let valid = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !valid {
                return Err(format!(
                    "media.speech.api_key_env {name:?} is not an environment variable name"
                ));
            }
        }
        if !(1..=600).contains(&self.timeout_secs) {
            return Err(format!(
                "media.speech.timeout_secs must be between 1 and 600 (it is {})",
                self.timeout_secs
            ));
        }
        if !(1..=100_000).contains(&self.max_chars) {
            return Err(format!(
                "media.speech.max_chars must be between 1 and 100000 (it is {})",
                self.max_chars
            ));
        }
        Ok(())
    }
}

/// Why an answer could not be spoken. `Display` is the owner's detail
/// (the log); the chat is told [`SpeechError::user_line`].
#[derive(Debug, thiserror::Error)]
pub enum SpeechError {
    /// The endpoint could not be reached or failed.
    #[error("the speech service is unavailable ({0})")]
    Unavailable(String),
    /// The endpoint refused the request (setup: key, model, voice).
    #[error("the speech service refused the request ({0}); check [media.speech]")]
    Refused(String),
    /// The audio is not Ogg/Opus, which Telegram needs for a voice note.
    #[error("the speech service answered audio that is not Ogg/Opus (it starts with {0:?}); telegate sends only Ogg/Opus voice notes")]
    NotOgg(String),
    /// The answer is too long to speak.
    #[error("the answer is longer than media.speech.max_chars ({0})")]
    TooLong(usize),
}

impl SpeechError {
    /// The one line the chat is told above the text answer.
    pub fn user_line(&self) -> &'static str {
        match self {
            SpeechError::TooLong(_) => {
                "🔇 (This answer is too long to read aloud, so here it is as text.)"
            }
            _ => "🔇 (I could not answer with voice this time, so here it is as text.)",
        }
    }
}

/// A client for the configured endpoint.
pub struct Speaker {
    config: SpeechConfig,
    client: reqwest::Client,
    api_key: Option<Secret>,
}

impl std::fmt::Debug for Speaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speaker")
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

/// What is read aloud of a Markdown answer: its text, without markup
/// (code kept as its text, blocks on lines of their own).
pub fn plain_text(markdown: &str) -> String {
    use pulldown_cmark::{Event, Parser, TagEnd};
    let mut text = String::new();
    for event in Parser::new(markdown) {
        match event {
            Event::Text(t) | Event::Code(t) => text.push_str(&t),
            Event::SoftBreak | Event::HardBreak => text.push(' '),
            Event::End(
                TagEnd::Paragraph | TagEnd::Heading(_) | TagEnd::Item | TagEnd::CodeBlock,
            ) => text.push('\n'),
            _ => {}
        }
    }
    text.trim().to_string()
}

/// True for an Ogg container (every page starts with `OggS`).
pub fn is_ogg(audio: &[u8]) -> bool {
    audio.starts_with(b"OggS")
}

impl Speaker {
    /// A client for `config`, with the key resolved at config load.
    pub fn new(config: SpeechConfig) -> Result<Speaker, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(20))
            .timeout(Duration::from_secs(config.timeout_secs.max(1)))
            .build()
            .map_err(|e| format!("cannot set up the speech client: {e}"))?;
        let api_key = config
            .resolved_api_key
            .clone()
            .filter(|k| !k.expose().trim().is_empty());
        Ok(Speaker {
            config,
            client,
            api_key,
        })
    }

    fn endpoint(&self) -> String {
        format!(
            "{}/audio/speech",
            self.config.base_url.trim_end_matches('/')
        )
    }

    /// `text` (plain, no Markdown) as Ogg/Opus audio.
    pub async fn speak(&self, text: &str) -> Result<bytes::Bytes, SpeechError> {
        let chars = text.chars().count();
        if chars > self.config.max_chars {
            return Err(SpeechError::TooLong(self.config.max_chars));
        }
        let body = serde_json::json!({
            "model": self.config.model,
            "voice": self.config.voice,
            "input": text,
            "response_format": "opus",
        });
        let mut request = self.client.post(self.endpoint()).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        let unavailable = |e: reqwest::Error| {
            SpeechError::Unavailable(if e.is_timeout() {
                "timed out".into()
            } else {
                "could not connect or read the answer".into()
            })
        };
        let response = request.send().await.map_err(unavailable)?;
        let status = response.status();
        let audio = response.bytes().await.map_err(unavailable)?;
        if !status.is_success() {
            let shown: String = String::from_utf8_lossy(&audio).chars().take(300).collect();
            tracing::warn!(status = status.as_u16(), body = %shown, "speech failed");
            let detail = format!("HTTP {}", status.as_u16());
            return Err(match status.as_u16() {
                429 | 500..=599 => SpeechError::Unavailable(detail),
                _ => SpeechError::Refused(detail),
            });
        }
        if !is_ogg(&audio) {
            let start: String = String::from_utf8_lossy(&audio[..audio.len().min(8)]).into_owned();
            return Err(SpeechError::NotOgg(start));
        }
        Ok(audio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SpeechConfig {
        toml::from_str("base_url = \"http://127.0.0.1:1/v1\"").unwrap()
    }

    #[test]
    fn defaults_and_validation() {
        let c = config();
        assert_eq!((c.model.as_str(), c.voice.as_str()), ("tts-1", "alloy"));
        assert!(c.validate().is_ok());
        let bad = SpeechConfig {
            base_url: "ftp://x".into(),
            ..config()
        };
        assert!(bad.validate().is_err());
        let bad = SpeechConfig {
            voice: " ".into(),
            ..config()
        };
        assert!(bad.validate().unwrap_err().contains("media.speech.voice"));
        assert!(toml::from_str::<SpeechConfig>("base_url = \"x\"\nvoise = \"a\"").is_err());
    }

    #[test]
    fn markdown_is_read_as_its_text() {
        assert_eq!(
            plain_text("# Title\n\nSome **bold** and `code`.\n\n- one\n- two"),
            "Title\nSome bold and code.\none\ntwo"
        );
    }

    #[test]
    fn only_ogg_is_a_voice_note() {
        assert!(is_ogg(b"OggS\0\x02rest"));
        assert!(!is_ogg(b"ID3\x04 mp3"));
        assert!(!is_ogg(b""));
        for error in [
            SpeechError::Unavailable("x".into()),
            SpeechError::NotOgg("ID3".into()),
            SpeechError::TooLong(5),
        ] {
            assert!(!error.user_line().contains("media."));
        }
    }

    #[tokio::test]
    async fn a_long_answer_is_not_sent_to_the_service() {
        let speaker = Speaker::new(SpeechConfig {
            max_chars: 5,
            ..config()
        })
        .unwrap();
        assert!(matches!(
            speaker.speak("too long").await,
            Err(SpeechError::TooLong(5))
        ));
    }
}
