//! A recording [`Outbound`]: every reply is kept, in order, with the time it
//! was delivered; tests wait on it instead of sleeping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use telegate::reply::{DeliveryError, Outbound, Reply};
use telegate::vocab::{KeyPolicy, MessageEvent, Platform, SessionKey, SessionSource};
use tokio::sync::Notify;

/// One delivered reply.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub chat_id: i64,
    pub reply: Reply,
}

/// Records deliveries.
#[derive(Default)]
pub struct Recorder {
    delivered: Mutex<Vec<Delivered>>,
    changed: Notify,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Recorder::default())
    }

    pub fn all(&self) -> Vec<Delivered> {
        self.delivered.lock().unwrap().clone()
    }

    pub fn texts(&self) -> Vec<String> {
        self.all().into_iter().map(|d| d.reply.text).collect()
    }

    pub fn texts_for(&self, chat_id: i64) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|d| d.chat_id == chat_id)
            .map(|d| d.reply.text)
            .collect()
    }

    pub fn any_contains(&self, needle: &str) -> bool {
        self.texts().iter().any(|t| t.contains(needle))
    }

    pub fn len(&self) -> usize {
        self.delivered.lock().unwrap().len()
    }

    /// Wait until `pred` holds over the deliveries, at most `limit`.
    pub async fn wait_until(&self, limit: Duration, pred: impl Fn(&[Delivered]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if pred(&self.delivered.lock().unwrap()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return pred(&self.delivered.lock().unwrap());
            }
        }
    }

    /// Wait until some reply contains `needle`.
    pub async fn wait_for_text(&self, needle: &str, limit: Duration) -> bool {
        self.wait_until(limit, |d| d.iter().any(|d| d.reply.text.contains(needle)))
            .await
    }
}

impl Outbound for Recorder {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        self.delivered.lock().unwrap().push(Delivered {
            chat_id: to.chat_id,
            reply,
        });
        self.changed.notify_waiters();
        Box::pin(async { Ok(()) })
    }
}

/// A private-chat text event, like the reference tests' `_make_event`.
pub fn make_event(text: &str, chat_id: i64) -> MessageEvent {
    MessageEvent::text(SessionSource::dm(Platform::Telegram, chat_id), text)
}

/// The key of a private chat, like the reference tests' `_session_key`.
pub fn session_key(chat_id: i64) -> SessionKey {
    SessionKey::for_source(
        &SessionSource::dm(Platform::Telegram, chat_id),
        KeyPolicy::default(),
    )
}

/// Poll `cond` (yielding to the runtime) until it holds, at most `limit`.
pub async fn eventually(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    cond()
}
