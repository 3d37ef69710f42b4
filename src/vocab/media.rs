//! A message's media as the event carries it: described by the transport
//! (nothing downloaded yet), then prepared into attachments by the media
//! stage (`crate::media`). Plain data: no I/O.

use std::path::PathBuf;

/// What a message carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaKind {
    /// A photo (several sizes).
    Photo,
    /// A voice note.
    Voice,
    /// An audio file.
    Audio,
    /// A round video note.
    VideoNote,
    /// A file.
    Document,
    /// A video or animation.
    Video,
}

impl MediaKind {
    /// Voice, audio and video notes are transcribed.
    pub fn is_speech(self) -> bool {
        matches!(
            self,
            MediaKind::Voice | MediaKind::Audio | MediaKind::VideoNote
        )
    }
}

/// One downloadable file of a message (a photo has one per size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileCandidate {
    /// Telegram's `file_id` (to download).
    pub file_id: String,
    /// Telegram's `file_unique_id` (stable; names the saved file).
    pub unique_id: String,
    /// The size Telegram announced (0: unknown).
    pub size: u64,
}

/// A message's media, as described by the update (nothing downloaded yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaRef {
    /// What it is.
    pub kind: MediaKind,
    /// The files to choose from, smallest first (one except for photos).
    pub candidates: Vec<FileCandidate>,
    /// The MIME type Telegram reported, if any.
    pub mime: Option<String>,
    /// The original file name, if any.
    pub file_name: Option<String>,
}

/// A prepared inbound file handed to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    /// Where it was saved.
    pub path: PathBuf,
    /// Its MIME type (guessed when Telegram named none).
    pub mime: String,
    /// An image the model may look at (photos, image documents).
    pub is_image: bool,
}

/// The media part of a [`MessageEvent`](super::MessageEvent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventMedia {
    /// What the message carries, still to be prepared.
    pub refs: Vec<MediaRef>,
    /// The album (`media_group_id`) this message belongs to.
    pub group: Option<String>,
    /// The message ids of the other album parts merged into this event.
    pub merged: Vec<i64>,
    /// Prepared files (set by the media stage, `crate::media::MediaStage`).
    pub attachments: Vec<Attachment>,
    /// On /stop, /new or /reset: how many of the slot's messages this
    /// command stopped while they were still being prepared (set by the
    /// `crate::media::stage`); the command stopped something even if no turn ran.
    pub stopped: usize,
    /// The message was spoken (a voice, audio or video note transcribed):
    /// `/voice auto` answers it with a voice note.
    pub spoken: bool,
}

impl EventMedia {
    /// True while there is media to prepare.
    pub fn needs_preparing(&self) -> bool {
        !self.refs.is_empty()
    }
}
