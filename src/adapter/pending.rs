//! The bounded FIFO of follow-up events waiting for a busy slot.

use std::collections::VecDeque;

use crate::vocab::MessageEvent;

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

    /// Remove the messages `user` sent (keeping everything else, internal
    /// events included, in order), oldest first.
    pub fn take_messages_of(&mut self, user: u64) -> Vec<MessageEvent> {
        let (theirs, rest): (Vec<_>, Vec<_>) = self
            .events
            .drain(..)
            .partition(|e| !e.internal && e.source.user_id == Some(user));
        self.events.extend(rest);
        theirs
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Platform, SessionSource};

    fn event(text: &str) -> MessageEvent {
        MessageEvent::text(SessionSource::dm(Platform::Telegram, 1), text)
    }

    fn texts(queue: &mut PendingQueue) -> Vec<String> {
        std::iter::from_fn(|| queue.pop()).map(|e| e.text).collect()
    }

    #[test]
    fn counts_refuses_when_full_and_puts_back_in_front() {
        let mut queue = PendingQueue::default();
        assert_eq!((queue.len(), queue.is_empty()), (0, true));
        assert_eq!(queue.push(event("a"), 2).ok(), Some(1));
        assert_eq!(queue.push(event("b"), 2).ok(), Some(2));
        assert!(queue.push(event("c"), 2).is_err(), "full");
        assert_eq!((queue.len(), queue.is_empty()), (2, false));
        // A command that failed puts what it took back, in order, first.
        let taken = queue.take_user_messages();
        assert_eq!(queue.len(), 0);
        for event in taken.into_iter().rev() {
            queue.push_front(event);
        }
        queue.push(event("d"), 3).ok();
        assert_eq!(queue.len(), 3);
        assert_eq!(texts(&mut queue), ["a", "b", "d"]);
    }

    #[test]
    fn one_users_messages_leave_the_queue_and_the_rest_keep_their_order() {
        let mut queue = PendingQueue::default();
        let from = |user: u64, text: &str| {
            let mut source = SessionSource::dm(Platform::Telegram, 1);
            source.user_id = Some(user);
            MessageEvent::text(source, text)
        };
        let mut wakeup = from(5, "w");
        wakeup.internal = true;
        for event in [
            from(5, "a"),
            from(6, "b"),
            wakeup,
            from(5, "c"),
            from(6, "d"),
        ] {
            queue.push(event, 10).ok();
        }
        let taken: Vec<String> = queue
            .take_messages_of(5)
            .into_iter()
            .map(|e| e.text)
            .collect();
        assert_eq!(taken, ["a", "c"]);
        assert_eq!(texts(&mut queue), ["b", "w", "d"]);
    }
}
