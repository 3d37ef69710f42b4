//! Media in, files out: what a photo, voice note or document becomes before
//! a turn, and how files an agent produces reach the chat after it.
//!
//! Inbound, a Telegram message's media is described by
//! [`describe::describe`] (pure) into [`MediaRef`]s on the event; the
//! chat's preparation stage ([`stage`], its release order in [`order`])
//! gathers album parts ([`album`]) and prepares each message in a task of
//! its own, off the chat's queue, where [`prepare::MediaStage`] downloads
//! ([`download`]), transcribes ([`transcribe`]) and turns them into text,
//! image attachments or saved paths — or into a clear refusal in the
//! user's words. Documents are read by [`document`] (text in any common
//! encoding, PDFs through [`pdf`]); a saved path is named to the model
//! only where [`FileAccess`] says a tool of its can open it. Files live
//! under `<data_dir>/media/<session id>/` and are removed by [`retention`].
//!
//! Outbound, the runner binds a [`TurnFiles`] task-locally around each turn
//! (the attachments, the turn's outbox directory, the file sender): the
//! command backend reads it for `{files}`, `TELEGATE_FILES` and
//! `TELEGATE_OUTBOX`; the openai backend for image parts ([`vision`]) and
//! the `send_file` tool ([`crate::tools::send_file`]). Every outbound file
//! goes through [`outbox`]: opened once by handle below its directory and
//! through no link ([`handle`]), checked on that handle (a regular file
//! with one link, the 50 MB cap, readable by the `run_as` user) and
//! uploaded from it, and the store's record of sent files so a restart
//! never sends one twice. The command backend's outbox directory
//! ([`outbox_dir`]) is sent after the answer, at most
//! `max_files_per_answer` files, and /stop ends such a batch.
//!
//! This module must never run a turn, decide whether an answer is
//! delivered, or log a file URL (it contains the bot token).

pub mod album;
pub mod command_files;
pub mod describe;
pub mod document;
pub mod download;
pub mod handle;
pub mod order;
pub mod outbox;
pub mod outbox_dir;
pub mod pdf;
pub mod prepare;
pub mod retention;
pub mod speech;
pub mod stage;
pub mod transcribe;
pub mod vision;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::vocab::Attachment;
use serde::Deserialize;

pub use outbox::{FileSender, OutboxFiles};
pub use prepare::MediaStage;

/// Telegram's cloud Bot API serves downloads up to this size.
pub const CLOUD_DOWNLOAD_LIMIT: u64 = 20 * 1024 * 1024;
/// Telegram accepts uploads (sendPhoto/sendDocument) up to this size.
pub const UPLOAD_LIMIT: u64 = 50 * 1024 * 1024;
/// Telegram accepts photos (sendPhoto) up to this size; larger images go
/// as documents.
pub const PHOTO_UPLOAD_LIMIT: u64 = 10 * 1024 * 1024;
/// Files one answer carries at most, unless configured.
pub const DEFAULT_MAX_FILES_PER_ANSWER: usize = 20;

/// `[media]`: downloads, inlining, retention, albums.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaConfig {
    /// The largest file downloaded (bytes). Telegram's cloud API serves at
    /// most 20 MB; a local Bot API server lifts that, so raise this then.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// At most this much of a text document's (or a PDF's) text is put
    /// into the message (bytes); a longer one is cut there, with a marker,
    /// and the user is told (0: documents are not read).
    #[serde(default = "default_max_inline_bytes")]
    pub max_inline_bytes: u64,
    /// Downloaded and outbox files older than this many days are removed
    /// (0: keep them forever).
    #[serde(default = "default_keep_days")]
    pub keep_days: u64,
    /// How long to wait for the next part of an album (milliseconds).
    #[serde(default = "default_album_window_ms")]
    pub album_window_ms: u64,
    /// The longest one download may take (seconds). Each download gets 30 s
    /// plus its size at 64 KiB/s, up to this; one that receives nothing for
    /// 30 s is given up.
    #[serde(default = "default_download_timeout_secs")]
    pub download_timeout_secs: u64,

    /// Files sent with one answer at most (the `send_file` tool's and the
    /// outbox's together); the rest are reported in one line.
    #[serde(default = "default_max_files_per_answer")]
    pub max_files_per_answer: usize,
    /// `[media.transcription]`: voice, audio and video notes to text.
    #[serde(default)]
    pub transcription: Option<TranscriptionConfig>,
    /// `[media.speech]`: answers as voice notes (`/voice`).
    #[serde(default)]
    pub speech: Option<speech::SpeechConfig>,
}

fn default_max_file_bytes() -> u64 {
    CLOUD_DOWNLOAD_LIMIT
}
fn default_max_inline_bytes() -> u64 {
    64 * 1024
}
fn default_keep_days() -> u64 {
    7
}
fn default_album_window_ms() -> u64 {
    1500
}
fn default_download_timeout_secs() -> u64 {
    600
}
fn default_max_files_per_answer() -> usize {
    DEFAULT_MAX_FILES_PER_ANSWER
}

impl Default for MediaConfig {
    fn default() -> Self {
        MediaConfig {
            max_file_bytes: default_max_file_bytes(),
            max_inline_bytes: default_max_inline_bytes(),
            keep_days: default_keep_days(),
            album_window_ms: default_album_window_ms(),
            download_timeout_secs: default_download_timeout_secs(),

            max_files_per_answer: default_max_files_per_answer(),
            transcription: None,
            speech: None,
        }
    }
}

impl MediaConfig {
    /// Check the values; the error is one line naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_file_bytes == 0 {
            return Err("media.max_file_bytes must be above 0".into());
        }
        if self.download_timeout_secs == 0 {
            return Err("media.download_timeout_secs must be above 0".into());
        }
        if !(1..=MAX_FILES_PER_ANSWER_LIMIT).contains(&self.max_files_per_answer) {
            return Err(format!(
                "media.max_files_per_answer must be between 1 and {MAX_FILES_PER_ANSWER_LIMIT} (it is {})",
                self.max_files_per_answer
            ));
        }
        if let Some(t) = &self.transcription {
            t.validate()?;
        }
        if let Some(s) = &self.speech {
            s.validate()?;
        }
        Ok(())
    }
}

/// The highest `max_files_per_answer` accepted: at Telegram's pace of
/// about one message a second per chat, more would hold the chat for
/// minutes.
const MAX_FILES_PER_ANSWER_LIMIT: usize = 200;

/// `[media.transcription]`: an OpenAI-compatible `/audio/transcriptions`
/// endpoint (OpenAI, Groq, whisper.cpp's server, faster-whisper servers).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscriptionConfig {
    /// The API root; requests go to `<base_url>/audio/transcriptions`.
    pub base_url: String,
    /// The model, e.g. `whisper-1` or `whisper-large-v3`.
    #[serde(default = "default_transcription_model")]
    pub model: String,
    /// The environment variable holding the API key (none: no
    /// authorization header, fine for local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A file holding the API key (wins over the systemd credential
    /// `transcription_api_key` and over `api_key_env`).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// The key as resolved when the config was loaded, before telegate
    /// scrubbed its environment (never deserialized; see `crate::secrets`).
    #[serde(skip)]
    pub resolved_api_key: Option<crate::secrets::Secret>,
    /// The spoken language (ISO-639-1), if known; the server guesses
    /// otherwise.
    #[serde(default)]
    pub language: Option<String>,
    /// Also show the transcript in the chat ("🎤 …").
    #[serde(default)]
    pub echo_transcript: bool,
    /// Seconds allowed for one transcription.
    #[serde(default = "default_transcription_timeout_secs")]
    pub timeout_secs: u64,
}

fn default_transcription_model() -> String {
    "whisper-1".to_string()
}
fn default_transcription_timeout_secs() -> u64 {
    120
}

impl TranscriptionConfig {
    /// Check the values.
    pub fn validate(&self) -> Result<(), String> {
        let url = url::Url::parse(&self.base_url)
            .map_err(|e| format!("media.transcription.base_url: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("media.transcription.base_url must be an http(s) URL".into());
        }
        if self.model.trim().is_empty() {
            return Err("media.transcription.model is empty".into());
        }
        if let Some(name) = &self.api_key_env {
            let valid = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.as_bytes()[0].is_ascii_digit();
            if !valid {
                return Err(format!(
                    "media.transcription.api_key_env {name:?} is not an environment variable name"
                ));
            }
        }
        Ok(())
    }
}

/// Whether the model is shown saved files' paths: only where a tool it
/// has can open them. Otherwise it sees file names (and what could be read
/// of them) and never a server path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FileAccess {
    /// No tool of the model's opens files (the openai backend without the
    /// terminal tool, or with it running as another user; echo).
    #[default]
    Names,
    /// A tool opens them: the command backend's program (absolute paths,
    /// as `{files}` and `TELEGATE_FILES` give them), or the terminal tool
    /// running as telegate's user (relative to its `workdir` when inside
    /// it, absolute otherwise).
    Paths {
        /// The directory the tool runs in.
        workdir: Option<PathBuf>,
    },
}

impl FileAccess {
    /// How `path` is named to the model (`None`: it is not).
    pub fn shown(&self, path: &Path) -> Option<String> {
        let FileAccess::Paths { workdir } = self else {
            return None;
        };
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let inside = workdir
            .as_ref()
            .and_then(|dir| std::path::absolute(dir).ok())
            .and_then(|dir| path.strip_prefix(dir).ok().map(Path::to_path_buf))
            .filter(|relative| !relative.as_os_str().is_empty());
        Some(inside.unwrap_or(path).display().to_string())
    }
}

/// What the runner binds around a turn (see the module documentation).
#[derive(Clone, Default)]
pub struct TurnFiles {
    /// The inbound files of the message this turn answers.
    pub attachments: Vec<Attachment>,
    /// Where the command backend's program may leave files to send.
    pub outbox: Option<PathBuf>,
    /// The message this turn answers (keys the record of sent files).
    pub answering: Option<i64>,
    /// Sends files to the chat (absent where nothing can be sent).
    pub sender: Option<Arc<OutboxFiles>>,
    /// Files this answer carries so far (shared by every clone).
    pub carried: FileCount,
}

/// How many files one answer carries so far: the `send_file` tool's and
/// the outbox's together, against `max_files_per_answer`. Clones share
/// the count.
#[derive(Clone, Debug, Default)]
pub struct FileCount(Arc<AtomicUsize>);

impl FileCount {
    /// The files counted.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Count one more.
    pub fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for TurnFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnFiles")
            .field("attachments", &self.attachments)
            .field("outbox", &self.outbox)
            .field("answering", &self.answering)
            .field("sender", &self.sender.is_some())
            .field("carried", &self.carried.get())
            .finish()
    }
}

tokio::task_local! {
    static TURN_FILES: TurnFiles;
}

/// Run `future` with `files` as the current turn's files.
pub async fn with_turn_files<F: std::future::Future>(files: TurnFiles, future: F) -> F::Output {
    TURN_FILES.scope(files, future).await
}

/// The current turn's files (empty outside a turn).
pub fn turn_files() -> TurnFiles {
    TURN_FILES.try_with(Clone::clone).unwrap_or_default()
}

/// `<data_dir>/media`: the root of every saved file.
pub fn media_root(data_dir: &Path) -> PathBuf {
    data_dir.join("media")
}

/// A path component made from `raw` that cannot climb or hide: ASCII
/// alphanumerics, `-`, `_` and `.` are kept (no leading dot), the rest
/// becomes `_`, and it is at most 80 bytes.
pub fn safe_component(raw: &str) -> String {
    let mut out: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let dots = out.len() - out.trim_start_matches('.').len();
    out.replace_range(0..dots, &"_".repeat(dots));
    if out.is_empty() {
        out.push('_');
    }
    out
}

/// A MIME type for a file name (by extension), `application/octet-stream`
/// when unknown.
pub fn guess_mime(name: &str) -> String {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    let mime = match ext.as_deref() {
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("png") => "image/png",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("txt" | "log" | "md" | "rs" | "py" | "sh" | "toml" | "ini" | "cfg") => "text/plain",
        Some("csv") => "text/csv",
        Some("json") => "application/json",
        Some("yaml" | "yml") => "application/yaml",
        Some("xml") => "application/xml",
        Some("html" | "htm") => "text/html",
        Some("pdf") => "application/pdf",
        Some("ogg" | "oga") => "audio/ogg",
        Some("mp3") => "audio/mpeg",
        Some("m4a") => "audio/mp4",
        Some("mp4") => "video/mp4",
        _ => "application/octet-stream",
    };
    mime.to_string()
}

/// True for image types a vision model reads (and Telegram shows as photos).
pub fn is_image_mime(mime: &str) -> bool {
    matches!(
        mime.to_ascii_lowercase().as_str(),
        "image/jpeg" | "image/png" | "image/gif" | "image/webp"
    )
}

/// Sizes for messages: `1.5 MB`, `300 KB`, `12 bytes`.
pub fn human_size(bytes: u64) -> String {
    const MB: u64 = 1024 * 1024;
    if bytes >= MB {
        format!("{:.1} MB", bytes as f64 / MB as f64)
    } else if bytes >= 1024 {
        format!("{} KB", bytes / 1024)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_components_cannot_climb_or_hide() {
        assert_eq!(safe_component("../../etc/passwd"), "___.._etc_passwd");
        assert_eq!(safe_component(".hidden"), "_hidden");
        assert_eq!(safe_component(""), "_");
        assert_eq!(safe_component("ok-name_1.txt"), "ok-name_1.txt");
        assert!(!safe_component("a/b\\c\0d").contains(['/', '\\', '\0']));
    }

    #[test]
    fn paths_are_shown_only_to_a_model_with_a_tool_that_opens_them() {
        let path = Path::new("/data/media/s1/5-0-report.pdf");
        assert_eq!(FileAccess::Names.shown(path), None);
        let program = FileAccess::Paths { workdir: None };
        assert_eq!(
            program.shown(path).as_deref(),
            Some("/data/media/s1/5-0-report.pdf")
        );
        let inside = FileAccess::Paths {
            workdir: Some("/data".into()),
        };
        assert_eq!(
            inside.shown(path).as_deref(),
            Some("media/s1/5-0-report.pdf")
        );
        let outside = FileAccess::Paths {
            workdir: Some("/srv/work".into()),
        };
        assert_eq!(
            outside.shown(path).as_deref(),
            Some("/data/media/s1/5-0-report.pdf")
        );
    }

    #[test]
    fn media_config_defaults_and_unknown_keys() {
        let c: MediaConfig = toml::from_str("").unwrap();
        assert_eq!(c, MediaConfig::default());
        assert!(toml::from_str::<MediaConfig>("nope = 1").is_err());
        let t: MediaConfig = toml::from_str(
            "[transcription]\nbase_url = \"http://127.0.0.1:1/v1\"\necho_transcript = true",
        )
        .unwrap();
        let t = t.transcription.unwrap();
        assert_eq!(t.model, "whisper-1");
        assert!(t.echo_transcript);
        assert!(TranscriptionConfig {
            base_url: "ftp://x".into(),
            ..t
        }
        .validate()
        .is_err());
    }
}
