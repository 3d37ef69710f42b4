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
//!
//! Documents are read by [`super::document`] (text in any common
//! encoding, a PDF's text, cut to `max_inline_bytes` with a marker); the
//! model is shown a saved file's path only where [`FileAccess`] says a
//! tool of its can open it, and what it could not see is told to the user
//! in the echo (shown once per message).

use std::path::{Path, PathBuf};

use crate::vocab::MessageEvent;

use super::document::{self, Shown, Told};
use super::download::Downloader;
use super::transcribe::Transcriber;
use super::{guess_mime, human_size, is_image_mime, safe_component, FileAccess, MediaConfig};
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
    /// Shown to the user once, before the turn: the transcript echo
    /// ("🎤 …", when asked for) and a sentence for each file the model
    /// could not see, or saw only in part ("📎 …").
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
    access: FileAccess,
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
            access: FileAccess::Names,
        })
    }

    /// Name saved files' paths to the model as `access` allows (by
    /// default it sees file names only).
    pub fn with_file_access(mut self, access: FileAccess) -> MediaStage {
        self.access = access;
        self
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
        let mut notices = Vec::new();
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
                    spoken.push(self.transcribe(&path, &name, &mime, message_id).await?);
                }
                MediaKind::Photo => {
                    notes.push(match self.access.shown(&path) {
                        Some(at) => format!("[photo saved at {at}]"),
                        None => "[photo]".to_string(),
                    });
                    event.media.attachments.push(Attachment {
                        path,
                        mime,
                        is_image: true,
                    });
                }
                _ => {
                    let is_image = is_image_mime(&mime) && self.images == ImageMode::Vision;
                    let told = self
                        .document(&path, &mime, &shown_name, size, is_image)
                        .await;
                    notes.push(told.note);
                    notices.extend(told.notice);
                    if told.attach {
                        event.media.attachments.push(Attachment {
                            path,
                            mime,
                            is_image,
                        });
                    }
                }
            }
        }
        let echo_spoken = self.transcriber.as_ref().is_some_and(|t| t.echo());
        let echo = echo_text(echo_spoken, &spoken, notices);
        event.media.spoken = !spoken.is_empty();
        event.text = compose(&caption, &spoken, &notes);
        Ok(Prepared { event, echo })
    }

    /// The words of the recording at `path`; none (or a failed
    /// transcription) refuses the message in the user's words.
    async fn transcribe(
        &self,
        path: &Path,
        name: &str,
        mime: &str,
        message_id: i64,
    ) -> Result<String, Refusal> {
        let Some(transcriber) = &self.transcriber else {
            return Err(Refusal(NO_TRANSCRIPTION.to_string()));
        };
        let text = transcriber
            .transcribe(path, name, mime)
            .await
            .map_err(|error| {
                tracing::warn!(message_id, %error, "a recording was not transcribed");
                Refusal(error.user_text().to_string())
            })?;
        if text.is_empty() {
            return Err(Refusal(
                "🎤 I could not make out any words in that recording.".to_string(),
            ));
        }
        Ok(text)
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

    /// Read a saved document (text, PDF, anything else) and say what the
    /// model and the user are told about it (see [`document`]).
    async fn document(&self, path: &Path, mime: &str, name: &str, size: u64, image: bool) -> Told {
        let budget = self.config.max_inline_bytes;
        let reading = document::read(path, mime, name, size, budget).await;
        let location = self.access.shown(path);
        let shown = Shown {
            name,
            mime,
            size,
            location: location.as_deref(),
            sees_images: image,
        };
        document::tell(&shown, &reading)
    }
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

/// What the chat is shown back while the message is prepared: the
/// transcripts (when `echo_spoken` and there are any), then the documents'
/// notices; nothing when both are empty (pure).
fn echo_text(echo_spoken: bool, spoken: &[String], notices: Vec<String>) -> Option<String> {
    let mut shown = Vec::new();
    if echo_spoken && !spoken.is_empty() {
        shown.push(format!("🎤 {}", spoken.join("\n🎤 ")));
    }
    shown.extend(notices);
    (!shown.is_empty()).then(|| shown.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_echo_shows_transcripts_when_asked_then_notices() {
        let spoken = ["one".to_string(), "two".to_string()];
        let notice = || vec!["📄 notice".to_string()];
        assert_eq!(
            echo_text(true, &spoken, notice()).as_deref(),
            Some("🎤 one\n🎤 two\n📄 notice")
        );
        assert_eq!(
            echo_text(false, &spoken, notice()).as_deref(),
            Some("📄 notice")
        );
        assert_eq!(echo_text(true, &[], Vec::new()), None);
        assert_eq!(echo_text(false, &spoken, Vec::new()), None);
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
