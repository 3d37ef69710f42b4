//! What tools hand upwards, outside any tool call's result.
//!
//! Tools run deep below the adapter, and some of what they produce has to
//! reach a chat later, on its own: a background process finished and its
//! owner must be woken ([`ToolEvent::Wakeup`]), or a command needs the
//! user's approval and the chat must be asked ([`ToolEvent::Approval`]).
//! Tools must not depend on the adapter or on a transport, so they only put
//! [`ToolEvent`]s into a channel; `engine.rs` drains it into the adapter and
//! the outbound. The channel also buffers events that happen before the
//! engine is fully wired.
//!
//! Unbounded on purpose: a wakeup must never be dropped or block a process
//! watcher, and the number of events is bounded by the process and approval
//! limits anyway.

use tokio::sync::mpsc;

use super::wakeup::Wakeup;
use crate::vocab::SessionSource;

/// Something a tool produced for a chat, outside a tool result.
#[derive(Debug)]
pub enum ToolEvent {
    /// A background process with `notify_on_complete` finished: wake its
    /// owner (see [`super::wakeup`]).
    Wakeup(Box<Wakeup>),
    /// Show `text` in the chat of `to` (an approval request).
    Notice {
        /// The chat.
        to: SessionSource,
        /// Plain text.
        text: String,
    },
    /// Ask the chat of `to` to approve the request with one-time id
    /// `ticket`: `text` is shown with a button per option (Approve and
    /// Deny for the two-option case; where the transport has buttons;
    /// typed `/approve <ticket>` works everywhere). A button press is that
    /// ticket's answer.
    Approval {
        /// The chat (and the user whose turn asks).
        to: SessionSource,
        /// The request's one-time id (`/approve <ticket>`).
        ticket: String,
        /// Plain text.
        text: String,
        /// The answers offered, in order.
        options: Vec<super::approval_options::ApprovalOption>,
    },
    /// The approval request `ticket` of the chat of `to` ended other than
    /// by a button (whose press shows it itself): show `line` under its
    /// prompt and take the buttons away.
    Settled {
        /// The chat.
        to: SessionSource,
        /// The request's one-time id.
        ticket: String,
        /// Who chose what and when, or why nobody did.
        line: String,
    },
    /// A background process started for the chat of `owner`: recorded, so
    /// that if telegate dies before it ends, the next start tells the owner.
    BackgroundStarted {
        /// The process id.
        id: String,
        /// The chat that started it.
        owner: SessionSource,
        /// The command.
        command: String,
    },
    /// A background process ended (its wakeup, if any, was sent before).
    BackgroundEnded {
        /// The process id.
        id: String,
    },
}

/// Where tools put their events. Cheap to clone; sending never blocks.
#[derive(Clone, Debug)]
pub struct ToolEventSender(mpsc::UnboundedSender<ToolEvent>);

/// Where the engine takes tool events from.
#[derive(Debug)]
pub struct ToolEventReceiver(mpsc::UnboundedReceiver<ToolEvent>);

/// A new tool event channel.
pub fn tool_events() -> (ToolEventSender, ToolEventReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    (ToolEventSender(tx), ToolEventReceiver(rx))
}

impl ToolEventSender {
    /// Hand `event` on. If nobody listens any more (the engine is shutting
    /// down) the event is logged and dropped: there is no chat left to show
    /// it in.
    pub fn send(&self, event: ToolEvent) {
        if let Err(mpsc::error::SendError(event)) = self.0.send(event) {
            tracing::warn!(?event, "tool event dropped: the engine is gone");
        }
    }
}

impl ToolEventReceiver {
    /// The next event; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<ToolEvent> {
        self.0.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Option<ToolEvent> {
        self.0.try_recv().ok()
    }
}
