//! What media a Telegram message carries, read from the update alone.
//!
//! Pure (no I/O): the intake's classification calls it, and the result
//! travels on the event until the chat's preparation stage prepares it. It must
//! never choose anything that depends on configuration (which photo size
//! fits the limit is decided when preparing).

use teloxide::types::{FileMeta, Message};

use crate::vocab::{FileCandidate, MediaKind, MediaRef};

fn candidate(file: &FileMeta) -> FileCandidate {
    FileCandidate {
        file_id: file.id.0.clone(),
        unique_id: file.unique_id.0.clone(),
        size: u64::from(file.size),
    }
}

fn single(
    kind: MediaKind,
    file: &FileMeta,
    mime: Option<String>,
    file_name: Option<String>,
) -> MediaRef {
    MediaRef {
        kind,
        candidates: vec![candidate(file)],
        mime,
        file_name,
    }
}

/// The media of `message` (empty for text and for media telegate does not
/// read, such as stickers, polls or locations) and its album id.
pub fn describe(message: &Message) -> (Vec<MediaRef>, Option<String>) {
    let mut refs = Vec::new();
    if let Some(sizes) = message.photo() {
        let mut candidates: Vec<FileCandidate> =
            sizes.iter().map(|size| candidate(&size.file)).collect();
        // Telegram lists sizes smallest first; sort anyway (by announced
        // size, stable for unknown sizes).
        candidates.sort_by_key(|c| c.size);
        if !candidates.is_empty() {
            refs.push(MediaRef {
                kind: MediaKind::Photo,
                candidates,
                mime: Some("image/jpeg".to_string()),
                file_name: None,
            });
        }
    }
    if let Some(voice) = message.voice() {
        let mime = voice.mime_type.as_ref().map(ToString::to_string);
        refs.push(single(MediaKind::Voice, &voice.file, mime, None));
    }
    if let Some(audio) = message.audio() {
        let mime = audio.mime_type.as_ref().map(ToString::to_string);
        refs.push(single(
            MediaKind::Audio,
            &audio.file,
            mime,
            audio.file_name.clone(),
        ));
    }
    if let Some(note) = message.video_note() {
        refs.push(single(
            MediaKind::VideoNote,
            &note.file,
            Some("video/mp4".to_string()),
            None,
        ));
    }
    if let Some(document) = message.document() {
        let mime = document.mime_type.as_ref().map(ToString::to_string);
        refs.push(single(
            MediaKind::Document,
            &document.file,
            mime,
            document.file_name.clone(),
        ));
    } else if let Some(video) = message.video() {
        let mime = video.mime_type.as_ref().map(ToString::to_string);
        refs.push(single(
            MediaKind::Video,
            &video.file,
            mime,
            video.file_name.clone(),
        ));
    }
    let group = message.media_group_id().map(|g| g.0.clone());
    (refs, group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(extra: serde_json::Value) -> Message {
        let mut value = json!({
            "message_id": 7, "date": 1_700_000_000,
            "chat": {"id": 1, "type": "private", "first_name": "A"},
            "from": {"id": 1, "is_bot": false, "first_name": "A"},
        });
        for (k, v) in extra.as_object().unwrap() {
            value[k] = v.clone();
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn photos_voice_and_documents_are_described() {
        let m = message(json!({"media_group_id": "g1", "photo": [
            {"file_id": "big", "file_unique_id": "ub", "width": 800, "height": 800, "file_size": 9000},
            {"file_id": "small", "file_unique_id": "us", "width": 90, "height": 90, "file_size": 100}]}));
        let (refs, group) = describe(&m);
        assert_eq!(group.as_deref(), Some("g1"));
        assert_eq!(refs[0].kind, MediaKind::Photo);
        assert_eq!(refs[0].candidates[0].file_id, "small");
        assert_eq!(refs[0].candidates[1].file_id, "big");

        let m = message(json!({"voice": {"file_id": "v", "file_unique_id": "uv",
            "duration": 2, "mime_type": "audio/ogg", "file_size": 10}}));
        let (refs, _) = describe(&m);
        assert_eq!(refs[0].kind, MediaKind::Voice);
        assert_eq!(refs[0].mime.as_deref(), Some("audio/ogg"));

        let m = message(json!({"document": {"file_id": "d", "file_unique_id": "ud",
            "file_name": "log.txt", "mime_type": "text/plain", "file_size": 10}}));
        let (refs, _) = describe(&m);
        assert_eq!(refs[0].file_name.as_deref(), Some("log.txt"));

        let m = message(json!({"text": "hi"}));
        assert!(describe(&m).0.is_empty());
    }
}
