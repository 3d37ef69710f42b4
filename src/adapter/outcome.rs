//! What the adapter reports about each message's fate.
//!
//! The adapter is where every message's outcome is decided (run, answered,
//! refused, dropped by /new, cut short by /stop), so it is the one place
//! that reports it. A transport with a durable inbox implements
//! [`OutcomeSink`] to keep those outcomes across restarts; without one,
//! nothing is recorded.

use futures::future::BoxFuture;

use crate::vocab::{MessageEvent, SessionSource};

/// The fate of one message (identified by its chat and message id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventOutcome {
    /// Its turn started.
    Running,
    /// Its answer or command reply was delivered.
    Answered,
    /// Its turn failed (the user was told) or the reply could not be
    /// delivered.
    Failed,
    /// It will not be answered, for the given reason (the user was told or
    /// caused it).
    Dropped(&'static str),
}

/// Receives message outcomes. Must not block: implementations hand the
/// record to a writer and return.
pub trait OutcomeSink: Send + Sync + 'static {
    /// Record that message `message_id` of `source`'s chat reached `outcome`.
    fn record(&self, source: &SessionSource, message_id: i64, outcome: EventOutcome);

    /// Make an internal event (a wakeup) durable before it enters the
    /// adapter, so a restart still delivers it. Returns the message id the
    /// event is tracked under from now on (`None`: not journaled; the
    /// default).
    fn journal<'a>(&'a self, event: &'a MessageEvent) -> BoxFuture<'a, Option<i64>> {
        let _ = event;
        Box::pin(async { None })
    }
}
