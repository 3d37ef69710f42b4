//! The inbox listener: telegate's own teloxide [`UpdateListener`], the only
//! way updates reach the dispatcher ([`super::dispatch`]).
//!
//! It yields only updates already recorded in the inbox: whoever feeds it
//! (the `getUpdates` loop, the webhook, restart recovery; all through
//! [`super::intake::Intake`]) writes the update's row first and feeds it
//! only if the row is new, so a redelivery never reaches the dispatcher,
//! and the offset or the webhook's 200 never depends on what the
//! dispatcher does with it. Recovery feeds the unfinished rows before the
//! first live update is taken.
//!
//! What the intake decided when it recorded a message (its [`Inbound`]
//! verdict, with a replay's origin) travels beside the update in
//! [`Verdicts`], keyed by update id: teloxide's `Update` has no room for
//! it, and deciding again in the handler could disagree with the row
//! already written (a user joining the team in between). [`Progress`]
//! counts the updates the dispatcher finished, so recovery can hand an
//! internal event on only after the replays fed before it.
//!
//! This module owns the feed and the listener. It must never record,
//! decide or run anything itself.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::stream::BoxStream;
use teloxide::stop::{mk_stop_token, StopFlag, StopToken};
use teloxide::types::{Update, UpdateId};
use teloxide::update_listeners::{AsUpdateStream, UpdateListener};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::inbound::Inbound;

/// What the intake decided about recorded messages not dispatched yet.
#[derive(Default)]
pub struct Verdicts(Mutex<HashMap<UpdateId, Inbound>>);

impl Verdicts {
    fn put(&self, id: UpdateId, verdict: Inbound) {
        let mut verdicts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        verdicts.insert(id, verdict);
    }

    /// The verdict recorded with update `id` (once).
    pub fn take(&self, id: UpdateId) -> Option<Inbound> {
        let mut verdicts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let verdict = verdicts.remove(&id);
        crate::memory::shrink_when_sparse(&mut verdicts);
        verdict
    }
}

/// How many fed updates the dispatcher has finished (handled, or passed
/// over because the intake stops).
#[derive(Default)]
pub struct Progress {
    done: AtomicU64,
    changed: Notify,
}

impl Progress {
    /// One more update finished.
    pub fn finished_one(&self) {
        self.done.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Wait until `count` updates have finished, or `stop` fires.
    async fn reached(&self, count: u64, stop: &CancellationToken) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check: a finish in between still wakes it.
            changed.as_mut().enable();
            if self.done.load(Ordering::Acquire) >= count {
                return;
            }
            tokio::select! {
                () = changed => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// The sending half: what the intake feeds the dispatcher through.
pub struct Feed {
    tx: mpsc::UnboundedSender<Update>,
    fed: AtomicU64,
    verdicts: Arc<Verdicts>,
    progress: Arc<Progress>,
    stop: CancellationToken,
    listening: CancellationToken,
}

impl Feed {
    /// A feed and the listener it feeds; the listener ends when `stop`
    /// fires (or the dispatcher stops it).
    pub fn new(stop: CancellationToken) -> (Feed, InboxListener) {
        let (tx, rx) = mpsc::unbounded_channel();
        let listening = CancellationToken::new();
        let feed = Feed {
            tx,
            fed: AtomicU64::new(0),
            verdicts: Arc::default(),
            progress: Arc::default(),
            stop: stop.clone(),
            listening: listening.clone(),
        };
        let listener = InboxListener {
            updates: Arc::new(tokio::sync::Mutex::new(rx)),
            stop,
            token: mk_stop_token(),
            listening,
        };
        (feed, listener)
    }

    /// The verdicts the dispatcher's handlers read.
    pub fn verdicts(&self) -> Arc<Verdicts> {
        self.verdicts.clone()
    }

    /// The count the dispatcher's handlers advance.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Feed a recorded update (a message with the intake's `verdict`).
    /// Past a shutdown nothing listens: the row stays unfinished and the
    /// next start's recovery feeds it again.
    pub fn send(&self, update: Update, verdict: Option<Inbound>) {
        let id = update.id;
        if let Some(verdict) = verdict {
            self.verdicts.put(id, verdict);
        }
        if self.tx.send(update).is_ok() {
            self.fed.fetch_add(1, Ordering::AcqRel);
        } else {
            self.verdicts.take(id);
            tracing::debug!(
                update_id = id.0,
                "the dispatcher has stopped; left for the next start"
            );
        }
    }

    /// Wait until the dispatcher takes updates from the listener (it asks
    /// `getMe` first), or the intake stops.
    pub async fn listening(&self) {
        tokio::select! {
            () = self.listening.cancelled() => {}
            () = self.stop.cancelled() => {}
        }
    }

    /// Wait until the dispatcher finished every update fed so far (or the
    /// intake stops).
    pub async fn settled(&self) {
        let fed = self.fed.load(Ordering::Acquire);
        self.progress.reached(fed, &self.stop).await;
    }
}

/// telegate's update listener: the recorded updates, in the order fed.
pub struct InboxListener {
    /// Shared, so a listener can be made again for a second start of the
    /// dispatcher (its first `getMe` failed) without losing an update.
    updates: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Update>>>,
    stop: CancellationToken,
    token: (StopToken, StopFlag),
    /// Fired once the dispatcher asks for the stream.
    listening: CancellationToken,
}

impl InboxListener {
    /// A listener over the same feed, for another start of the dispatcher.
    pub fn again(&self) -> InboxListener {
        InboxListener {
            updates: self.updates.clone(),
            stop: self.stop.clone(),
            token: mk_stop_token(),
            listening: self.listening.clone(),
        }
    }
}

impl<'a> AsUpdateStream<'a> for InboxListener {
    type StreamErr = Infallible;
    type Stream = BoxStream<'a, Result<Update, Infallible>>;

    fn as_stream(&'a mut self) -> Self::Stream {
        self.listening.cancel();
        let stop = self.stop.clone();
        let stopped = self.token.1.clone();
        let updates = self.updates.clone();
        Box::pin(futures::stream::unfold(
            (updates, stop, stopped),
            |(updates, stop, stopped)| async move {
                let next = {
                    let mut rx = updates.lock().await;
                    // Ended by telegate's shutdown or by the dispatcher's:
                    // what is still queued stays unfinished in the inbox.
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => None,
                        () = stopped.clone() => None,
                        update = rx.recv() => update,
                    }
                };
                next.map(|update| (Ok(update), (updates, stop, stopped)))
            },
        ))
    }
}

impl UpdateListener for InboxListener {
    type Err = Infallible;

    fn stop_token(&mut self) -> StopToken {
        self.token.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use teloxide::types::{Update, UpdateId};
    use teloxide::update_listeners::{AsUpdateStream, UpdateListener};
    use tokio_util::sync::CancellationToken;

    use super::Feed;
    use crate::transport::telegram::inbound::Inbound;

    fn update(id: u32) -> Update {
        let raw = serde_json::json!({"update_id": id, "message": {
            "message_id": id, "date": 1, "text": "hi",
            "chat": {"id": 1, "type": "private", "first_name": "A"},
        }});
        serde_json::from_value(raw).expect("an update")
    }

    #[tokio::test]
    async fn the_listener_yields_what_was_fed_in_order_and_ends_on_stop() {
        let stop = CancellationToken::new();
        let (feed, mut listener) = Feed::new(stop.clone());
        feed.send(update(1), None);
        feed.send(update(2), Some(Inbound::Ignore("test")));
        let mut stream = listener.as_stream();
        let ids: Vec<u32> = [stream.next().await, stream.next().await]
            .into_iter()
            .map(|u| u.expect("fed").expect("no error").id.0)
            .collect();
        assert_eq!(ids, [1, 2]);
        feed.send(update(3), None);
        stop.cancel();
        assert!(
            stream.next().await.is_none(),
            "a stopped listener yields nothing more"
        );
        drop(stream);
        let verdicts = feed.verdicts();
        assert!(matches!(
            verdicts.take(UpdateId(2)),
            Some(Inbound::Ignore("test"))
        ));
        assert!(
            verdicts.take(UpdateId(2)).is_none(),
            "a verdict is taken once"
        );
    }

    #[tokio::test]
    async fn the_dispatchers_stop_token_ends_the_stream_and_a_new_listener_goes_on() {
        let (feed, mut listener) = Feed::new(CancellationToken::new());
        feed.send(update(1), None);
        feed.send(update(2), None);
        let mut again = listener.again();
        {
            let token = listener.stop_token();
            let mut stream = listener.as_stream();
            assert_eq!(stream.next().await.unwrap().unwrap().id.0, 1);
            token.stop();
            assert!(stream.next().await.is_none());
        }
        // A second start of the dispatcher loses nothing.
        let mut stream = again.as_stream();
        assert_eq!(stream.next().await.unwrap().unwrap().id.0, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_every_update_fed_before() {
        let (feed, _listener) = Feed::new(CancellationToken::new());
        feed.send(update(1), None);
        feed.send(update(2), None);
        let progress = feed.progress();
        progress.finished_one();
        let early = tokio::time::timeout(Duration::from_secs(1), feed.settled()).await;
        assert!(early.is_err(), "settled with one of two updates finished");
        let finisher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            progress.finished_one();
        });
        tokio::time::timeout(Duration::from_secs(1), feed.settled())
            .await
            .expect("settled once both finished");
        finisher.await.unwrap();
    }
}
