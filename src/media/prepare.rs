//! Preparing a message's media before its turn: download, transcribe,
//! inline, attach — or refuse with a message that says why.
//!
//! Runs in a task of its own, started by the chat's preparation stage
//! ([`super::stage`]) after the update is recorded and before the event
//! reaches the adapter, so a restart during a download or transcription
//! finds the message still unanswered in the inbox and prepares it again (a
//! file already complete on disk is not fetched twice). A [`Refusal`] is
//! worded for the user; the owner's detail (which setting, what the
//! service said) goes to the log. It must never run a turn or send
//! anything itself: the intake sends the echo and refusal texts it
//! returns.

use std::path::{Path, PathBuf};

use crate::vocab::MessageEvent;

use super::download::Downloader;
use super::transcribe::Transcriber;
use super::{guess_mime, human_size, is_image_mime, safe_component, MediaConfig};
use crate::vocab::{Attachment, FileCandidate, MediaKind, MediaRef};

/// What happens to photos.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageMode {
    /// The model sees them (openai backend with `vision = true`).
    Vision,
    /// Their saved path is passed (command backend, echo).
    Path,
    /// The model cannot see images: the user is told so.
    Refuse,
}

/// The user is told this, and no turn runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

/// A prepared event and what to show the user first.
#[derive(Debug)]
pub struct Prepared {
    /// The event, with its text and attachments filled in.
    pub event: MessageEvent,
    /// The transcript to echo ("🎤 …"), when asked for.
    pub echo: Option<String>,
}

/// Turns media into text and attachments.
#[derive(Clone, Debug)]
pub struct MediaStage {
    config: MediaConfig,
    root: PathBuf,
    downloader: Downloader,
    transcriber: Option<Transcriber>,
    images: ImageMode,
}

/// Voice without a transcription endpoint, as the user is told (the
/// owner's detail, [`NO_TRANSCRIPTION_LOG`], goes to the log).
pub const NO_TRANSCRIPTION: &str = "🎤 I cannot listen to voice, audio or video notes here. \
     Please type your message instead.";

/// Why voice was refused, for the owner.
pub const NO_TRANSCRIPTION_LOG: &str = "voice refused: no [media.transcription] is configured \
     (base_url and model of an OpenAI-compatible /audio/transcriptions endpoint)";

/// Photos with a model that cannot see them, as the user is told.
pub const NO_VISION: &str = "🖼 I cannot see images here. Please describe the picture in words.";

/// Why a photo was refused, for the owner.
pub const NO_VISION_LOG: &str = "photo refused: the model is not set up to see images \
     (vision = true under [agent.openai] if it can)";

impl MediaStage {
    /// A stage saving under `root` (`<data_dir>/media`).
    pub fn new(
        config: MediaConfig,
        root: PathBuf,
        downloader: Downloader,
        images: ImageMode,
    ) -> Result<MediaStage, String> {
        let transcriber = match &config.transcription {
            Some(t) => Some(Transcriber::new(t.clone())?),
            None => None,
        };
        Ok(MediaStage {
            config,
            root,
            downloader,
            transcriber,
            images,
        })
    }

    /// The settings.
    pub fn config(&self) -> &MediaConfig {
        &self.config
    }

    /// Where files of `session` are saved.
    pub fn session_dir(&self, session: &str) -> PathBuf {
        self.root.join(safe_component(session))
    }

    /// Prepare `event`'s media; files go under `dir`.
    pub async fn prepare(&self, mut event: MessageEvent, dir: &Path) -> Result<Prepared, Refusal> {
        let refs = std::mem::take(&mut event.media.refs);
        let message_id = event.message_id.unwrap_or_default();
        let caption = event.text.trim().to_string();
        let mut spoken = Vec::new();
        let mut notes = Vec::new();
        for (index, media) in refs.iter().enumerate() {
            if media.kind == MediaKind::Photo && self.images == ImageMode::Refuse {
                tracing::info!(message_id, "{NO_VISION_LOG}");
                return Err(Refusal(NO_VISION.to_string()));
            }
            if media.kind.is_speech() && self.transcriber.is_none() {
                tracing::info!(message_id, "{NO_TRANSCRIPTION_LOG}");
                return Err(Refusal(NO_TRANSCRIPTION.to_string()));
            }
            let file = self.choose(media)?;
            let name = file_name(media, file, message_id, index);
            let path = dir.join(&name);
            let size = self.fetch(file, &path, message_id).await?;
            let mime = media
                .mime
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| guess_mime(&name));
            let shown_name = media.file_name.clone().unwrap_or_else(|| name.clone());
            match media.kind {
                kind if kind.is_speech() => {
                    let Some(transcriber) = &self.transcriber else {
                        return Err(Refusal(NO_TRANSCRIPTION.to_string()));
                    };
                    let text = transcriber.transcribe(&path, &name, &mime).await.map_err(
                        |error| {
                            tracing::warn!(message_id, %error, "a recording was not transcribed");
                            Refusal(error.user_text().to_string())
                        },
                    )?;
                    if text.is_empty() {
                        return Err(Refusal(
                            "🎤 I could not make out any words in that recording.".to_string(),
                        ));
                    }
                    spoken.push(text);
                }
                MediaKind::Photo => {
                    notes.push(format!("[photo saved at {}]", path.display()));
                    event.media.attachments.push(Attachment {
                        path,
                        mime,
                        is_image: true,
                    });
                }
                _ => {
                    if let Some(inline) = self.inline(&path, &mime, size).await {
                        notes.push(format!("[file {shown_name} ({mime})]\n{}", fenced(&inline)));
                    } else {
                        notes.push(format!(
                            "[file {shown_name} ({mime}, {}) saved at {}]",
                            human_size(size),
                            path.display()
                        ));
                        let is_image = is_image_mime(&mime) && self.images == ImageMode::Vision;
                        event.media.attachments.push(Attachment {
                            path,
                            mime,
                            is_image,
                        });
                    }
                }
            }
        }
        let echo = match &self.transcriber {
            Some(t) if t.echo() && !spoken.is_empty() => {
                Some(format!("🎤 {}", spoken.join("\n🎤 ")))
            }
            _ => None,
        };
        event.text = compose(&caption, &spoken, &notes);
        Ok(Prepared { event, echo })
    }

    /// The photo size to fetch: the largest within the limit.
    fn choose<'a>(&self, media: &'a MediaRef) -> Result<&'a FileCandidate, Refusal> {
        let limit = self.config.max_file_bytes;
        let fitting = media.candidates.iter().rev().find(|c| c.size <= limit);
        fitting.ok_or_else(|| {
            let size = media.candidates.iter().map(|c| c.size).min().unwrap_or(0);
            tracing::info!(size, limit, "file not read: above media.max_file_bytes");
            Refusal(format!(
                "📎 That file is {}, and I can only read files of up to {}, so I did not read it.",
                human_size(size),
                human_size(limit)
            ))
        })
    }

    async fn fetch(
        &self,
        file: &FileCandidate,
        path: &Path,
        message_id: i64,
    ) -> Result<u64, Refusal> {
        // Complete from an earlier attempt (renamed only when whole).
        if let Ok(meta) = tokio::fs::metadata(path).await {
            if meta.is_file() {
                return Ok(meta.len());
            }
        }
        self.downloader
            .fetch(&file.file_id, path, self.config.max_file_bytes, file.size)
            .await
            .map_err(|error| {
                tracing::warn!(message_id, %error, "a file was not downloaded");
                Refusal(format!(
                    "📎 I could not read that file: {}.",
                    error.user_text()
                ))
            })
    }

    /// The file's text if it is text-like, small enough and UTF-8.
    async fn inline(&self, path: &Path, mime: &str, size: u64) -> Option<String> {
        if size > self.config.max_inline_bytes || !is_text_mime(mime) {
            return None;
        }
        let bytes = tokio::fs::read(path).await.ok()?;
        String::from_utf8(bytes).ok()
    }
}

/// Text types, by MIME (the UTF-8 check follows).
fn is_text_mime(mime: &str) -> bool {
    let mime = mime.to_ascii_lowercase();
    let essence = mime.split(';').next().unwrap_or("").trim();
    essence.starts_with("text/")
        || matches!(
            essence,
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/x-sh"
                | "application/x-shellscript"
                | "application/sql"
                | "application/csv"
        )
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
}

/// The saved file's name: message id, then the original name or the
/// unique id with an extension.
fn file_name(media: &MediaRef, file: &FileCandidate, message_id: i64, index: usize) -> String {
    let base = match &media.file_name {
        Some(name) => safe_component(name),
        None => {
            let ext = match media.kind {
                MediaKind::Photo => "jpg",
                MediaKind::Voice => "oga",
                MediaKind::VideoNote | MediaKind::Video => "mp4",
                MediaKind::Audio => "mp3",
                MediaKind::Document => "bin",
            };
            format!("{}.{ext}", safe_component(&file.unique_id))
        }
    };
    format!("{message_id}-{index}-{base}")
}

/// A code fence that the content cannot close.
fn fenced(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{}\n{fence}", text.trim_end_matches('\n'))
}

fn compose(caption: &str, spoken: &[String], notes: &[String]) -> String {
    let mut parts: Vec<String> = Vec::new();
    if !caption.is_empty() {
        parts.push(caption.to_string());
    }
    if spoken.len() == 1 && caption.is_empty() {
        parts.push(spoken[0].clone());
    } else {
        parts.extend(spoken.iter().map(|s| format!("[voice message] {s}")));
    }
    parts.extend(notes.iter().cloned());
    parts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types_are_recognised_by_mime() {
        assert!(is_text_mime("text/plain; charset=utf-8"));
        assert!(is_text_mime("application/json"));
        assert!(is_text_mime("application/vnd.api+json"));
        assert!(!is_text_mime("application/pdf"));
        assert!(!is_text_mime("image/png"));
    }

    #[test]
    fn fences_are_longer_than_any_backtick_run_inside() {
        assert_eq!(fenced("a"), "```\na\n```");
        assert_eq!(fenced("x ```` y"), "`````\nx ```` y\n`````");
    }

    #[test]
    fn a_lone_voice_note_becomes_the_message() {
        assert_eq!(compose("", &["hello".into()], &[]), "hello");
        assert_eq!(
            compose("see", &["hi".into()], &["[photo]".into()]),
            "see\n\n[voice message] hi\n\n[photo]"
        );
    }

    #[test]
    fn saved_names_cannot_escape_the_directory() {
        let media = MediaRef {
            kind: MediaKind::Document,
            candidates: vec![],
            mime: None,
            file_name: Some("../../x.txt".into()),
        };
        let file = FileCandidate {
            file_id: "f".into(),
            unique_id: "u".into(),
            size: 1,
        };
        let name = file_name(&media, &file, 5, 0);
        assert_eq!(name, "5-0-___.._x.txt");
        assert!(!name.contains('/'));
    }
}
