//! Whose turn it is to send to a chat.
//!
//! The delivery engine sends one request at a time to a chat (see
//! [`super::telegram`] for why). Requests waiting for a chat form a
//! two-lane queue: the control lane (replies to /stop, /new, … see
//! [`Priority::Control`]) is served before the normal lane, and each lane
//! in arrival order. The holder of a chat's turn passes it on by dropping
//! it; a waiter that is cancelled after the turn was handed to it, before
//! it took it, passes it on too, so a cancelled request never leaves a
//! chat stuck.
//!
//! This module owns the queue only. It never paces, sends or retries.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::ratelimit::Priority;

/// One lane per chat with a request in flight or waiting; an entry is
/// removed when nobody holds or waits for its turn.
#[derive(Default)]
pub(super) struct ChatLanes {
    lanes: Mutex<HashMap<i64, ChatLane>>,
}

/// Whom a request to a chat is for: the user whose message it answers
/// (`None`: nobody's, such as a topic's creation or a scheduled run's
/// notice) and the forum topic it goes to. A chat's normal requests are
/// served round-robin across users, and within a user across topics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Party {
    /// The user the request is for.
    pub(super) user: Option<u64>,
    /// The forum topic it goes to.
    pub(super) thread: Option<i32>,
}

/// Who sends next to one chat: the holder of the turn, then the control
/// lane's waiters in arrival order, then the others round-robin.
#[derive(Default)]
struct ChatLane {
    busy: bool,
    control: VecDeque<oneshot::Sender<()>>,
    normal: RoundRobin,
}

/// One user's waiting requests to a chat, by topic, in rotation.
type Topics = VecDeque<(Option<i32>, VecDeque<oneshot::Sender<()>>)>;

/// A chat's waiting normal requests: users in turn, within a user its
/// topics in turn, within a topic arrival order. The front user and its
/// front topic go next; each goes to the back of its rotation once served.
/// Only a busy chat's waiters are here: a free chat's request never
/// touches it. Lookups are linear in the users (and one user's topics)
/// waiting for this one chat, a handful in practice.
#[derive(Default)]
struct RoundRobin {
    users: VecDeque<(Option<u64>, Topics)>,
}

impl RoundRobin {
    fn push(&mut self, party: Party, waiter: oneshot::Sender<()>) {
        let at = match self.users.iter().position(|(user, _)| *user == party.user) {
            Some(at) => at,
            None => {
                self.users.push_back((party.user, VecDeque::new()));
                self.users.len() - 1
            }
        };
        let threads = &mut self.users[at].1;
        match threads
            .iter_mut()
            .find(|(thread, _)| *thread == party.thread)
        {
            Some((_, waiters)) => waiters.push_back(waiter),
            None => threads.push_back((party.thread, VecDeque::from([waiter]))),
        }
    }

    /// The next waiter in the rotation, which moves on past it.
    fn pop(&mut self) -> Option<oneshot::Sender<()>> {
        let (user, mut threads) = self.users.pop_front()?;
        let (thread, mut waiters) = threads.pop_front()?;
        let next = waiters.pop_front();
        if !waiters.is_empty() {
            threads.push_back((thread, waiters));
        }
        if !threads.is_empty() {
            self.users.push_back((user, threads));
        }
        next
    }
}

impl ChatLanes {
    fn lanes(&self) -> MutexGuard<'_, HashMap<i64, ChatLane>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait until no other request to `chat_id` is in flight and this one
    /// is next: every control request queued before it (for a normal
    /// request: every control request, and the normal requests the
    /// rotation across parties puts before it) has had its turn.
    pub(super) async fn turn(
        self: &Arc<Self>,
        chat_id: i64,
        priority: Priority,
        party: Party,
    ) -> ChatTurn {
        loop {
            let handed = {
                let mut lanes = self.lanes();
                let lane = lanes.entry(chat_id).or_default();
                if !lane.busy {
                    lane.busy = true;
                    return self.turn_of(chat_id);
                }
                let (tx, rx) = oneshot::channel();
                match priority {
                    Priority::Control => lane.control.push_back(tx),
                    Priority::Normal | Priority::FirstText => lane.normal.push(party, tx),
                }
                rx
            };
            // Built before the wait, so a cancelled wait still passes on a
            // turn handed to it.
            let mut waiter = TurnWaiter {
                lanes: self.clone(),
                chat_id,
                handed: Some(handed),
            };
            let received = match waiter.handed.as_mut() {
                Some(handed) => handed.await.is_ok(),
                None => false,
            };
            waiter.handed = None;
            if received {
                return self.turn_of(chat_id);
            }
            // The lane was dropped under us (cannot happen while we wait in
            // it); queue again rather than send out of turn.
        }
    }

    /// The chat's turn right now, or `None` if a request holds or waits
    /// for it.
    pub(super) fn turn_now(self: &Arc<Self>, chat_id: i64) -> Option<ChatTurn> {
        let mut lanes = self.lanes();
        let lane = lanes.entry(chat_id).or_default();
        if lane.busy {
            return None;
        }
        lane.busy = true;
        Some(self.turn_of(chat_id))
    }

    fn turn_of(self: &Arc<Self>, chat_id: i64) -> ChatTurn {
        ChatTurn {
            lanes: self.clone(),
            chat_id,
        }
    }

    /// Hand `chat_id`'s turn to the next waiter (control first), or free it.
    fn pass_turn(&self, chat_id: i64) {
        let mut lanes = self.lanes();
        let Some(lane) = lanes.get_mut(&chat_id) else {
            return;
        };
        while let Some(next) = lane.control.pop_front().or_else(|| lane.normal.pop()) {
            // A waiter that gave up has dropped its receiver: try the next.
            if next.send(()).is_ok() {
                return;
            }
        }
        lanes.remove(&chat_id);
    }
}

/// The right to send the next request to one chat; passed on when dropped.
pub(super) struct ChatTurn {
    lanes: Arc<ChatLanes>,
    chat_id: i64,
}

impl Drop for ChatTurn {
    fn drop(&mut self) {
        self.lanes.pass_turn(self.chat_id);
    }
}

/// A request waiting for its chat's turn. If it is dropped after the turn
/// was handed to it but before it took it, it passes the turn on.
struct TurnWaiter {
    lanes: Arc<ChatLanes>,
    chat_id: i64,
    handed: Option<oneshot::Receiver<()>>,
}

impl Drop for TurnWaiter {
    fn drop(&mut self) {
        if let Some(mut handed) = self.handed.take() {
            handed.close();
            if handed.try_recv().is_ok() {
                self.lanes.pass_turn(self.chat_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::time::Duration;

    type Waiting = Pin<Box<dyn Future<Output = ChatTurn>>>;

    /// Polls `waiting` once: the turn, if it has it now.
    fn poll_once(waiting: &mut Waiting) -> Option<ChatTurn> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match waiting.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(turn) => Some(turn),
            std::task::Poll::Pending => None,
        }
    }

    /// A request queued for `chat_id`'s turn (polled once, so it is in its
    /// lane).
    fn queued(lanes: &Arc<ChatLanes>, chat_id: i64, priority: Priority) -> Waiting {
        queued_for(lanes, chat_id, priority, Party::default())
    }

    /// A request for `party` queued for `chat_id`'s turn.
    fn queued_for(
        lanes: &Arc<ChatLanes>,
        chat_id: i64,
        priority: Priority,
        party: Party,
    ) -> Waiting {
        let lanes = lanes.clone();
        let mut waiting: Waiting =
            Box::pin(async move { lanes.turn(chat_id, priority, party).await });
        assert!(poll_once(&mut waiting).is_none(), "not queued");
        waiting
    }

    /// Whether `waiting` has the turn now (which it then drops at once).
    fn is_ready(waiting: &mut Waiting) -> bool {
        poll_once(waiting).is_some()
    }

    #[tokio::test]
    async fn a_waiter_cancelled_after_the_turn_was_handed_to_it_passes_it_on() {
        let lanes = Arc::new(ChatLanes::default());
        let holder = lanes.turn(1, Priority::Normal, Party::default()).await;
        let second = queued(&lanes, 1, Priority::Normal);
        let third = queued(&lanes, 1, Priority::Normal);
        // The turn goes to `second`, which gives up before taking it.
        drop(holder);
        drop(second);
        let third = tokio::time::timeout(Duration::from_secs(1), third)
            .await
            .expect("the turn was lost with the cancelled waiter");
        drop(third);
        assert!(lanes.lanes().is_empty(), "a free chat kept its lane");
    }

    #[tokio::test]
    async fn control_requests_go_first_then_each_lane_in_arrival_order() {
        let lanes = Arc::new(ChatLanes::default());
        let holder = lanes.turn(1, Priority::Normal, Party::default()).await;
        let mut normal_1 = queued(&lanes, 1, Priority::Normal);
        let mut normal_2 = queued(&lanes, 1, Priority::Normal);
        let mut control_1 = queued(&lanes, 1, Priority::Control);
        let mut control_2 = queued(&lanes, 1, Priority::Control);
        // Another chat never waits for this one.
        assert!(lanes.turn_now(2).is_some());
        assert!(lanes.turn_now(1).is_none(), "a busy chat's turn was taken");
        drop(holder);
        // Each turn is taken and dropped at once: the next waiter in order
        // gets it, and nobody else.
        for (name, waiting) in [
            ("control 1", &mut control_1),
            ("control 2", &mut control_2),
            ("normal 1", &mut normal_1),
            ("normal 2", &mut normal_2),
        ] {
            assert!(is_ready(waiting), "{name} did not get its turn");
        }
        assert!(lanes.lanes().is_empty(), "a free chat kept its lane");
        assert!(lanes.turn_now(1).is_some());
    }

    #[tokio::test]
    async fn only_the_next_waiter_gets_the_turn() {
        let lanes = Arc::new(ChatLanes::default());
        let holder = lanes.turn(1, Priority::Normal, Party::default()).await;
        let mut first = queued(&lanes, 1, Priority::Normal);
        let mut second = queued(&lanes, 1, Priority::Normal);
        drop(holder);
        assert!(!is_ready(&mut second), "the turn skipped a waiter");
        let turn = poll_once(&mut first).expect("the first waiter did not get the turn");
        assert!(!is_ready(&mut second), "two requests held one chat's turn");
        drop(turn);
        assert!(is_ready(&mut second));
    }

    fn party(user: u64, thread: Option<i32>) -> Party {
        Party {
            user: Some(user),
            thread,
        }
    }

    #[tokio::test]
    async fn normal_requests_go_round_robin_across_users_then_topics() {
        let lanes = Arc::new(ChatLanes::default());
        let holder = lanes.turn(1, Priority::Normal, party(7, None)).await;
        // User 7 bursts into three topics (two requests in topic 10), then
        // user 8 asks once, then a request for nobody (a topic's creation).
        let mut a10 = queued_for(&lanes, 1, Priority::Normal, party(7, Some(10)));
        let mut b10 = queued_for(&lanes, 1, Priority::Normal, party(7, Some(10)));
        let mut a11 = queued_for(&lanes, 1, Priority::Normal, party(7, Some(11)));
        let mut a12 = queued_for(&lanes, 1, Priority::Normal, party(7, Some(12)));
        let mut other = queued_for(&lanes, 1, Priority::Normal, party(8, None));
        let mut nobody = queued_for(&lanes, 1, Priority::Normal, Party::default());
        drop(holder);
        for (name, waiting) in [
            ("7 in topic 10", &mut a10),
            ("user 8", &mut other),
            ("nobody's", &mut nobody),
            ("7 in topic 11", &mut a11),
            ("7 in topic 12", &mut a12),
            ("7's second in topic 10", &mut b10),
        ] {
            assert!(is_ready(waiting), "{name} did not get its turn");
        }
        assert!(lanes.lanes().is_empty(), "a free chat kept its lane");
    }
}
