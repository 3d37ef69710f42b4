//! The bounded FIFO of follow-up events waiting for a busy slot.

use std::collections::VecDeque;

use crate::event::MessageEvent;

/// Follow-ups for one slot, oldest first. Bounded: a full queue refuses the
/// event and the caller tells the user (nothing is dropped silently).
#[derive(Debug, Default)]
pub struct PendingQueue {
    events: VecDeque<MessageEvent>,
}

impl PendingQueue {
    /// Append `event` unless `capacity` events already wait; on refusal the
    /// event is handed back.
    pub fn push(
        &mut self,
        event: MessageEvent,
        capacity: usize,
    ) -> Result<usize, Box<MessageEvent>> {
        // Internal events (wakeups) are never refused: losing one would lose
        // a finished background job's result. They are rare and small.
        if self.events.len() >= capacity && !event.internal {
            return Err(Box::new(event));
        }
        self.events.push_back(event);
        Ok(self.events.len())
    }

    /// Put `event` back at the front (undoing a take).
    pub fn push_front(&mut self, event: MessageEvent) {
        self.events.push_front(event);
    }

    /// The oldest waiting event.
    pub fn pop(&mut self) -> Option<MessageEvent> {
        self.events.pop_front()
    }

    /// Remove the user messages (keeping internal events), oldest first.
    pub fn take_user_messages(&mut self) -> Vec<MessageEvent> {
        let (user, internal): (Vec<_>, Vec<_>) = self.events.drain(..).partition(|e| !e.internal);
        self.events.extend(internal);
        user
    }

    /// Number of waiting events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}
