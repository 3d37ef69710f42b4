//! Albums: the parts of one `media_group_id` become one message.
//!
//! Telegram delivers each part of an album as its own update, one right
//! after the other. The chat's preparation stage ([`super::stage`]),
//! holding the first part, waits up to `[media] album_window_ms` after each
//! part for the next one and merges the parts that belong together
//! ([`same_album`], [`merge`]). The first part's message id stands for the
//! album; the others are recorded as its aliases ([`AlbumAliases`]) so
//! every part's inbox row gets the album's outcome — and after a restart
//! the unfinished parts are all resumed, and gathered again. It must never
//! hold a part that is not of the album: the first other event ends the
//! wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::vocab::MessageEvent;

/// `(chat, first message id)` → the ids of the album's other parts.
type AliasMap = HashMap<(i64, i64), Vec<i64>>;

/// Album message ids standing in for others.
#[derive(Clone, Debug, Default)]
pub struct AlbumAliases(Arc<Mutex<AliasMap>>);

impl AlbumAliases {
    /// Record that `first` (in `chat`) stands for `others` too.
    pub fn add(&self, chat: i64, first: i64, others: &[i64]) {
        if others.is_empty() {
            return;
        }
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((chat, first), others.to_vec());
    }

    /// The ids `first` stands for; with `done`, forget them.
    pub fn of(&self, chat: i64, first: i64, done: bool) -> Vec<i64> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if done {
            map.remove(&(chat, first)).unwrap_or_default()
        } else {
            map.get(&(chat, first)).cloned().unwrap_or_default()
        }
    }
}

/// True if `part` belongs to the album `first` started.
pub fn same_album(first: &MessageEvent, part: &MessageEvent) -> bool {
    first.media.group.is_some()
        && first.media.group == part.media.group
        && first.source.chat_id == part.source.chat_id
        && first.source.user_id == part.source.user_id
        && first.source.thread_id == part.source.thread_id
}

/// Merge `part` into `album`: captions joined, media appended, its id kept
/// as merged.
pub fn merge(album: &mut MessageEvent, part: MessageEvent) {
    let caption = part.text.trim();
    if !caption.is_empty() {
        if album.text.trim().is_empty() {
            album.text = caption.to_string();
        } else {
            album.text = format!("{}\n\n{caption}", album.text);
        }
    }
    album.media.refs.extend(part.media.refs);
    album.media.merged.extend(part.message_id);
    album.media.merged.extend(part.media.merged);
    album.origin = album.origin.merged(part.origin);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Platform, SessionSource};

    fn part(id: i64, group: Option<&str>, caption: &str) -> MessageEvent {
        let mut e = MessageEvent::text(SessionSource::dm(Platform::Telegram, 1), caption)
            .with_message_id(id);
        e.media.group = group.map(str::to_string);
        e
    }

    #[test]
    fn parts_are_merged_with_their_captions_and_ids() {
        let mut album = part(1, Some("g"), "first");
        let second = part(2, Some("g"), "");
        let third = part(3, Some("g"), "second");
        assert!(same_album(&album, &second));
        assert!(!same_album(&album, &part(4, None, "after")));
        assert!(!same_album(&album, &part(5, Some("h"), "")));
        merge(&mut album, second);
        merge(&mut album, third);
        assert_eq!(album.media.merged, vec![2, 3]);
        assert_eq!(album.text, "first\n\nsecond");
    }

    #[test]
    fn aliases_are_forgotten_when_done() {
        let aliases = AlbumAliases::default();
        aliases.add(1, 10, &[11, 12]);
        assert_eq!(aliases.of(1, 10, false), vec![11, 12]);
        assert_eq!(aliases.of(1, 10, true), vec![11, 12]);
        assert!(aliases.of(1, 10, false).is_empty());
    }
}
