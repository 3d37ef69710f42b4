//! The adapter's view of what handles a message: the runner in production,
//! a small closure in the adapter's own tests.

use std::future::Future;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::reply::Outgoing;
use crate::vocab::{MessageEvent, SessionKey};

/// What the adapter tells the handler about the slot a message belongs to.
#[derive(Clone, Debug)]
pub struct DispatchContext {
    /// The chat slot.
    pub key: SessionKey,
    /// Fires when this turn should stop because a newer message interrupted
    /// it (busy mode `interrupt`). Commands get a token that never matters.
    pub interrupt: CancellationToken,
    /// True when the slot was busy with a turn the handler did not start
    /// (a command on the command path, or a bypass command mid-turn).
    pub slot_busy: bool,
    /// True for a command on the command path while the slot's turn has
    /// its answer and is only delivering it (/stop then ends the sending).
    pub slot_sending: bool,
    /// Messages waiting in the slot's queue when this was dispatched.
    pub queue_depth: usize,
    /// True for an ordinary message the handler claimed while the slot was
    /// busy ([`MessageHandler::claims_while_busy`]): it must be answered at
    /// once, never started as a turn.
    pub claimed_while_busy: bool,
}

/// Handles one message and returns what to send back (nothing for a turn
/// whose result was discarded).
pub trait MessageHandler: Send + Sync + 'static {
    /// Handle `event`. The adapter awaits this inside the slot's owner task
    /// (turns) or inline (commands); it may be dropped at any await point when
    /// the turn is cancelled.
    fn handle(
        &self,
        event: MessageEvent,
        ctx: DispatchContext,
    ) -> BoxFuture<'static, Option<Outgoing>>;

    /// Whether an ordinary message for the busy slot `key` is something the
    /// handler answers at once instead of a follow-up (a bare "yes" or "no"
    /// to a pending approval: the running turn is the one waiting for it, so
    /// it must neither interrupt nor queue behind that turn). Claimed
    /// messages are dispatched like bypass commands, with
    /// [`DispatchContext::claimed_while_busy`] set.
    ///
    /// Called with the adapter's lock held: it must be quick, must not block
    /// and must not call into the adapter. The default claims nothing.
    fn claims_while_busy(&self, key: &SessionKey, event: &MessageEvent) -> bool {
        let _ = (key, event);
        false
    }
}

impl<F, Fut> MessageHandler for F
where
    F: Fn(MessageEvent, DispatchContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Outgoing>> + Send + 'static,
{
    fn handle(
        &self,
        event: MessageEvent,
        ctx: DispatchContext,
    ) -> BoxFuture<'static, Option<Outgoing>> {
        Box::pin(self(event, ctx))
    }
}
