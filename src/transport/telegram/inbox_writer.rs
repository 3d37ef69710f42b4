//! The store-backed [`OutcomeSink`]: the adapter's outcomes (running,
//! answered, failed, dropped) become inbox states, written in order by one
//! writer task so the adapter never waits for the disk; and the journal of
//! internal events (wakeups), so a wakeup survives a restart.
//!
//! This module owns the mapping from outcomes to inbox states and the
//! journaling of wakeups (their payload's format is [`crate::journal`]'s). It must never block the caller of `record`.

use std::sync::atomic::{AtomicI64, Ordering};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::adapter::{EventOutcome, OutcomeSink};
use crate::media::album::AlbumAliases;
use crate::store::Inbox;
use crate::vocab::{InboxState, MessageEvent, SessionSource};

/// At most this many outcomes go to the store in one call.
const LEDGER_BATCH: usize = 512;

/// The [`OutcomeSink`] backed by the store: outcomes go, in order, to one
/// writer task (the adapter never waits for the disk).
#[derive(Clone)]
pub struct InboxWriter {
    tx: mpsc::UnboundedSender<LedgerOp>,
    store: Inbox,
    aliases: AlbumAliases,
}

enum LedgerOp {
    Record(i64, i64, EventOutcome),
    Flush(oneshot::Sender<()>),
}

impl InboxWriter {
    /// Start the writer task for `store`.
    pub fn spawn(store: Inbox) -> (InboxWriter, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let aliases = AlbumAliases::default();
        let inbox_writer = InboxWriter {
            tx,
            store: store.clone(),
            aliases: aliases.clone(),
        };
        let writer = tokio::spawn(async move {
            // Everything queued is written as one deferred write (in
            // order), carried by the store's next batch: no store call of
            // its own, and the writer never waits for a commit.
            let mut ops = Vec::new();
            while rx.recv_many(&mut ops, LEDGER_BATCH).await > 0 {
                let mut changes = Vec::new();
                let mut flushed = Vec::new();
                for op in ops.drain(..) {
                    match op {
                        LedgerOp::Record(chat_id, message_id, outcome) => {
                            let (state, reason) = inbox_state(outcome);
                            // An album's first part stands for all of its parts.
                            let parts = aliases.of(chat_id, message_id, state.is_terminal());
                            for id in std::iter::once(message_id).chain(parts) {
                                changes.push((chat_id, id, state, reason.clone()));
                            }
                        }
                        LedgerOp::Flush(done) => flushed.push(done),
                    }
                }
                // Not waited for: carried by the store's next batch (a
                // failure is logged and shows in /healthz).
                if !changes.is_empty() {
                    store.set_message_states_later(changes);
                }
                if !flushed.is_empty() {
                    // Whatever the outcome, the writes were tried.
                    let _ = store.settle().await;
                }
                for done in flushed {
                    let _ = done.send(());
                }
            }
        });
        (inbox_writer, writer)
    }

    /// The album aliases this inbox_writer applies (shared with the intake).
    pub fn album_aliases(&self) -> AlbumAliases {
        self.aliases.clone()
    }

    /// Wait until every outcome recorded so far is written.
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.tx.send(LedgerOp::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }
}

fn inbox_state(outcome: EventOutcome) -> (InboxState, Option<String>) {
    match outcome {
        EventOutcome::Running => (InboxState::Running, None),
        EventOutcome::Answered => (InboxState::Answered, None),
        EventOutcome::Failed => (InboxState::Failed, None),
        EventOutcome::Dropped(reason) => (InboxState::Dropped, Some(reason.to_string())),
    }
}

impl OutcomeSink for InboxWriter {
    fn record(&self, source: &SessionSource, message_id: i64, outcome: EventOutcome) {
        let _ = self
            .tx
            .send(LedgerOp::Record(source.chat_id, message_id, outcome));
    }

    fn journal<'a>(&'a self, event: &'a MessageEvent) -> BoxFuture<'a, Option<i64>> {
        Box::pin(async move {
            let id = synthetic_id();
            let recorded = self
                .store
                .record_update(
                    id,
                    event.source.chat_id,
                    Some(id),
                    wakeup_payload(event),
                    InboxState::Received,
                    None,
                )
                .await;
            match recorded {
                Ok(_) => Some(id),
                Err(error) => {
                    tracing::error!(%error, "could not journal a wakeup; it is delivered but not kept across a restart");
                    None
                }
            }
        })
    }
}

/// A negative id for a journaled internal event: never a Telegram update or
/// message id (those are positive). Unique within a process (each id is
/// past the last one, even for more than a thousand ids in a millisecond)
/// and across restarts (time-based: the clock in milliseconds, times 1000).
fn synthetic_id() -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = crate::store::now_ms().max(1).saturating_mul(1000);
    let next = |last: i64| now.max(last.saturating_add(1));
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(next(last))
        })
        .unwrap_or_else(|last| last);
    -next(previous)
}

/// The inbox payload of a journaled wakeup (the format every internal
/// event shares, [`crate::journal`]).
pub(super) use crate::journal::{
    internal_from_payload as wakeup_from_payload, internal_payload as wakeup_payload,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::SessionId;
    use crate::vocab::{ChatType, Platform};
    use std::time::Duration;

    fn source(chat_id: i64) -> SessionSource {
        SessionSource::dm(Platform::Telegram, chat_id)
    }

    /// Record message `message_id` of chat 7 as received (update id =
    /// message id).
    async fn received(store: &Store, message_id: i64) {
        store
            .inbox()
            .record_update(
                message_id,
                7,
                Some(message_id),
                serde_json::json!({}),
                InboxState::Received,
                None,
            )
            .await
            .unwrap();
    }

    async fn state_of(store: &Store, update_id: i64) -> InboxState {
        store
            .inbox()
            .inbox_entry(update_id)
            .await
            .unwrap()
            .unwrap()
            .state
    }

    #[tokio::test]
    async fn flush_returns_once_every_outcome_recorded_before_it_is_written() {
        let store = Store::open_in_memory().unwrap();
        received(&store, 1).await;
        let (inbox_writer, _writer) = InboxWriter::spawn(store.inbox());
        inbox_writer.record(&source(7), 1, EventOutcome::Answered);
        inbox_writer.flush().await;
        assert_eq!(state_of(&store, 1).await, InboxState::Answered);
    }

    #[tokio::test]
    async fn an_albums_first_part_records_the_outcome_of_every_part() {
        let store = Store::open_in_memory().unwrap();
        for id in [1, 2, 3] {
            received(&store, id).await;
        }
        let (inbox_writer, _writer) = InboxWriter::spawn(store.inbox());
        // The intake registers the album through the inbox_writer's aliases.
        inbox_writer.album_aliases().add(7, 1, &[2, 3]);
        inbox_writer.record(&source(7), 1, EventOutcome::Answered);
        inbox_writer.flush().await;
        for id in [1, 2, 3] {
            assert_eq!(
                state_of(&store, id).await,
                InboxState::Answered,
                "part {id}"
            );
        }
    }

    #[tokio::test]
    async fn the_writer_ends_once_every_handle_is_gone() {
        let store = Store::open_in_memory().unwrap();
        let (inbox_writer, writer) = InboxWriter::spawn(store.inbox());
        drop(inbox_writer);
        tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("the writer outlived its handles")
            .unwrap();
    }

    #[test]
    fn journal_ids_are_negative_and_never_repeat() {
        let ids: Vec<i64> = (0..2000).map(|_| synthetic_id()).collect();
        assert!(ids.iter().all(|id| *id < 0), "a Telegram id could collide");
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
    }

    #[tokio::test]
    async fn a_journaled_wakeup_is_kept_and_read_back_as_the_same_event() {
        let store = Store::open_in_memory().unwrap();
        let (inbox_writer, _writer) = InboxWriter::spawn(store.inbox());
        let mut event = MessageEvent::internal(source(7), "the build finished");
        event = event.with_session_override(SessionId::new("s-1"));
        let first = inbox_writer.journal(&event).await.expect("journaled");
        let second = inbox_writer.journal(&event).await.expect("journaled");
        assert_ne!(first, second);
        let entry = store
            .inbox()
            .inbox_entry(first)
            .await
            .unwrap()
            .expect("kept");
        assert_eq!(entry.state, InboxState::Received);
        let back = wakeup_from_payload(&entry.payload).expect("readable");
        assert_eq!(back.text, "the build finished");
        assert_eq!(back.source.chat_id, 7);
        assert_eq!(back.session_override, event.session_override);
    }

    #[test]
    fn a_wakeups_chat_type_and_sender_survive_the_journal() {
        for chat_type in [
            ChatType::Dm,
            ChatType::Group,
            ChatType::Supergroup,
            ChatType::Channel,
        ] {
            let mut from = source(-100);
            from.chat_type = chat_type;
            from.thread_id = Some(12);
            from.user_id = Some(42);
            from.user_name = Some("ann".to_string());
            let event = MessageEvent::internal(from.clone(), "done");
            let back = wakeup_from_payload(&wakeup_payload(&event)).expect("readable");
            assert_eq!(back.source, from, "{chat_type:?}");
        }
    }
}
