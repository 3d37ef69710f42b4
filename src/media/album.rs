//! Albums: the parts of one `media_group_id` become one message.
//!
//! Telegram delivers each part of an album as its own update, one right
//! after the other. The per-chat intake worker, holding the first part,
//! waits up to `[media] album_window_ms` for each next one and merges the
//! parts that belong together ([`gather`]). The first part's message id
//! stands for the album; the others are recorded as its aliases
//! ([`AlbumAliases`]) so every part's inbox row gets the album's outcome —
//! and after a restart the unfinished parts are all resumed, and gathered
//! again. It must never hold a part that is not of the album: the first
//! other event ends the wait and is handed back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;

use crate::event::MessageEvent;

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
    album.resumed |= part.resumed;
    album.replayed |= part.replayed;
}

/// Starting from `first` (an album part), take the following parts of the
/// same album from `queue`, waiting up to `window` for each. Returns the
/// album and the first event that was not part of it, if one arrived.
pub async fn gather(
    mut first: MessageEvent,
    queue: &mut UnboundedReceiver<MessageEvent>,
    window: Duration,
) -> (MessageEvent, Option<MessageEvent>) {
    if first.media.group.is_none() {
        return (first, None);
    }
    loop {
        let next = match queue.try_recv() {
            Ok(event) => Some(event),
            Err(_) => tokio::time::timeout(window, queue.recv())
                .await
                .ok()
                .flatten(),
        };
        match next {
            Some(part) if same_album(&first, &part) => merge(&mut first, part),
            other => return (first, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Platform, SessionSource};

    fn part(id: i64, group: Option<&str>, caption: &str) -> MessageEvent {
        let mut e = MessageEvent::text(SessionSource::dm(Platform::Telegram, 1), caption)
            .with_message_id(id);
        e.media.group = group.map(str::to_string);
        e
    }

    #[tokio::test]
    async fn parts_of_one_album_are_merged_and_the_next_message_handed_back() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send(part(2, Some("g"), "")).unwrap();
        tx.send(part(3, Some("g"), "second")).unwrap();
        tx.send(part(4, None, "after")).unwrap();
        let (album, rest) =
            gather(part(1, Some("g"), "first"), &mut rx, Duration::from_secs(5)).await;
        assert_eq!(album.media.merged, vec![2, 3]);
        assert_eq!(album.text, "first\n\nsecond");
        assert_eq!(rest.unwrap().message_id, Some(4));
    }

    #[tokio::test]
    async fn the_wait_ends_after_the_window() {
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (album, rest) =
            gather(part(1, Some("g"), ""), &mut rx, Duration::from_millis(10)).await;
        assert!(album.media.merged.is_empty() && rest.is_none());
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
