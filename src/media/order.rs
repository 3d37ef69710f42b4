//! The release order of one chat's events around their preparation (pure).
//!
//! Media messages are prepared (downloaded, transcribed) off the chat's
//! queue, each in its own task, while later events keep arriving. What may
//! go on to the session, and when, is decided here:
//!
//! * an event waits only for the preparations that arrived before it *in
//!   its own slot* ([`ReleaseOrder::ordered`]): a slot's messages reach the
//!   session in arrival order, and one user's slow download never holds up
//!   another slot of the same chat;
//! * a finished preparation releases its event and every ready event
//!   behind it, up to the next preparation still running
//!   ([`ReleaseOrder::prepared`]);
//! * a stop cancels the slot's preparations ([`ReleaseOrder::stop`]); what
//!   a cancelled preparation produced anyway is handed back as stopped,
//!   never released; the ready events behind it are released once it is
//!   finished (as follow-ups survive /stop in the adapter);
//! * a new session also takes the slot's waiting events out
//!   ([`ReleaseOrder::take_waiting`]): they belonged to the old one.
//!
//! Control events never enter it: they go on at once (the caller decides
//! which those are). This module owns the decision only; it must never do
//! I/O, spawn, or look at what an event is beyond what its caller tells it.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// One preparation (unique within its [`ReleaseOrder`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// An event not released yet, in arrival order within its slot.
#[derive(Debug)]
enum Entry<E> {
    /// Being prepared; `cancelled` once a stop asked it to end.
    Preparing { ticket: Ticket, cancelled: bool },
    /// Ready, waiting for the preparations before it.
    Ready(E),
}

/// What finishing a preparation decided.
#[derive(Debug, PartialEq, Eq)]
pub struct Finished<E> {
    /// Events to hand on now, in this order.
    pub released: Vec<E>,
    /// The preparation's event if it was cancelled but finished anyway:
    /// to be reported as stopped, never handed on.
    pub stopped: Option<E>,
}

/// The order of one chat's events (see the module documentation).
#[derive(Debug)]
pub struct ReleaseOrder<K, E> {
    next: u64,
    slots: HashMap<K, VecDeque<Entry<E>>>,
    /// The slot of each preparation not finished yet.
    tickets: HashMap<Ticket, K>,
}

impl<K, E> Default for ReleaseOrder<K, E> {
    fn default() -> Self {
        ReleaseOrder {
            next: 0,
            slots: HashMap::new(),
            tickets: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, E> ReleaseOrder<K, E> {
    /// Nothing is waiting or being prepared.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// An ordinary event of `slot` arrived: `Some` (the event itself) if it
    /// may go on now, `None` if it waits for a preparation before it.
    pub fn ordered(&mut self, slot: K, event: E) -> Option<E> {
        match self.slots.get_mut(&slot) {
            Some(waiting) => {
                waiting.push_back(Entry::Ready(event));
                None
            }
            None => Some(event),
        }
    }

    /// An event of `slot` that needs preparing arrived: its ticket.
    pub fn preparing(&mut self, slot: K) -> Ticket {
        let ticket = Ticket(self.next);
        self.next += 1;
        self.slots
            .entry(slot.clone())
            .or_default()
            .push_back(Entry::Preparing {
                ticket,
                cancelled: false,
            });
        self.tickets.insert(ticket, slot);
        ticket
    }

    /// Preparation `ticket` finished: with the prepared event, or `None`
    /// when there is nothing to hand on (refused, or stopped and already
    /// reported). An unknown ticket changes nothing.
    pub fn prepared(&mut self, ticket: Ticket, event: Option<E>) -> Finished<E> {
        let mut finished = Finished {
            released: Vec::new(),
            stopped: None,
        };
        let Some(slot) = self.tickets.remove(&ticket) else {
            return finished;
        };
        let Some(waiting) = self.slots.get_mut(&slot) else {
            return finished;
        };
        let at = waiting
            .iter()
            .position(|e| matches!(e, Entry::Preparing { ticket: t, .. } if *t == ticket));
        if let Some(at) = at {
            let cancelled = matches!(
                waiting[at],
                Entry::Preparing {
                    cancelled: true,
                    ..
                }
            );
            match event {
                Some(event) if !cancelled => waiting[at] = Entry::Ready(event),
                event => {
                    finished.stopped = event;
                    waiting.remove(at);
                }
            }
        }
        while let Some(Entry::Ready(_)) = waiting.front() {
            if let Some(Entry::Ready(event)) = waiting.pop_front() {
                finished.released.push(event);
            }
        }
        if waiting.is_empty() {
            self.slots.remove(&slot);
        }
        finished
    }

    /// Stop `slot`'s preparations: the tickets cancelled now (each to be
    /// told to end; one already cancelled is not listed again).
    pub fn stop(&mut self, slot: &K) -> Vec<Ticket> {
        let Some(waiting) = self.slots.get_mut(slot) else {
            return Vec::new();
        };
        let mut stopped = Vec::new();
        for entry in waiting.iter_mut() {
            if let Entry::Preparing { ticket, cancelled } = entry {
                if !*cancelled {
                    *cancelled = true;
                    stopped.push(*ticket);
                }
            }
        }
        stopped
    }

    /// Take `slot`'s ready events that wait behind a preparation, except
    /// those `keep` says stay (they are still released in order).
    pub fn take_waiting(&mut self, slot: &K, keep: impl Fn(&E) -> bool) -> Vec<E> {
        let Some(waiting) = self.slots.get_mut(slot) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(waiting.len());
        for entry in waiting.drain(..) {
            match entry {
                Entry::Ready(event) if !keep(&event) => taken.push(event),
                other => kept.push_back(other),
            }
        }
        // A slot's line always starts with a preparation (ready events at
        // its head are released when it finishes), and only ready events
        // were taken: what was kept still goes on at the next finish.
        *waiting = kept;
        taken
    }

    /// How many events of `slot` are being prepared or wait.
    pub fn waiting(&self, slot: &K) -> usize {
        self.slots.get(slot).map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::{Finished, ReleaseOrder};

    type Order = ReleaseOrder<&'static str, &'static str>;

    fn released(finished: Finished<&'static str>) -> Vec<&'static str> {
        assert_eq!(finished.stopped, None);
        finished.released
    }

    #[test]
    fn without_a_preparation_an_event_goes_on_at_once() {
        let mut order = Order::default();
        assert_eq!(order.ordered("a", "hi"), Some("hi"));
        assert!(order.is_empty());
    }

    #[test]
    fn events_behind_a_preparation_wait_and_go_on_in_arrival_order() {
        let mut order = Order::default();
        let voice = order.preparing("a");
        assert_eq!(order.ordered("a", "one"), None);
        assert_eq!(order.ordered("a", "two"), None);
        assert_eq!(
            released(order.prepared(voice, Some("voice"))),
            ["voice", "one", "two"]
        );
        assert!(order.is_empty());
        assert_eq!(order.ordered("a", "three"), Some("three"));
    }

    #[test]
    fn another_slot_never_waits_for_this_ones_preparation() {
        let mut order = Order::default();
        let _voice = order.preparing("alice");
        assert_eq!(order.ordered("bob", "hello"), Some("hello"));
        assert_eq!(order.waiting(&"bob"), 0);
        assert_eq!(order.waiting(&"alice"), 1);
    }

    #[test]
    fn a_later_preparation_finishing_first_waits_for_the_earlier_one() {
        let mut order = Order::default();
        let first = order.preparing("a");
        assert_eq!(order.ordered("a", "between"), None);
        let second = order.preparing("a");
        assert_eq!(order.ordered("a", "after"), None);
        assert!(released(order.prepared(second, Some("second"))).is_empty());
        assert_eq!(
            released(order.prepared(first, Some("first"))),
            ["first", "between", "second", "after"]
        );
        assert!(order.is_empty());
    }

    #[test]
    fn a_refused_preparation_releases_what_waited_behind_it() {
        let mut order = Order::default();
        let file = order.preparing("a");
        assert_eq!(order.ordered("a", "and this?"), None);
        assert_eq!(released(order.prepared(file, None)), ["and this?"]);
    }

    #[test]
    fn a_stop_cancels_each_preparation_once_and_its_result_is_never_released() {
        let mut order = Order::default();
        let voice = order.preparing("a");
        let other_slot = order.preparing("b");
        assert_eq!(order.ordered("a", "queued"), None);
        assert_eq!(order.stop(&"a"), vec![voice]);
        assert!(order.stop(&"a").is_empty(), "cancelled twice");
        // The preparation finished anyway: reported stopped, and what
        // waited behind it goes on (like a follow-up after /stop).
        let finished = order.prepared(voice, Some("voice"));
        assert_eq!(finished.stopped, Some("voice"));
        assert_eq!(finished.released, ["queued"]);
        assert_eq!(order.waiting(&"b"), 1, "the other slot was not stopped");
        assert_eq!(released(order.prepared(other_slot, Some("b"))), ["b"]);
    }

    #[test]
    fn a_cancelled_preparation_that_reported_itself_releases_the_rest() {
        let mut order = Order::default();
        let voice = order.preparing("a");
        assert_eq!(order.ordered("a", "next"), None);
        order.stop(&"a");
        assert_eq!(released(order.prepared(voice, None)), ["next"]);
        assert!(order.is_empty());
    }

    #[test]
    fn a_new_session_takes_the_waiting_user_events_but_keeps_the_rest_in_order() {
        let mut order = Order::default();
        let voice = order.preparing("a");
        assert_eq!(order.ordered("a", "user 1"), None);
        assert_eq!(order.ordered("a", "wakeup"), None);
        assert_eq!(order.ordered("a", "user 2"), None);
        order.stop(&"a");
        let taken = order.take_waiting(&"a", |e| *e == "wakeup");
        assert_eq!(taken, ["user 1", "user 2"]);
        assert_eq!(released(order.prepared(voice, None)), ["wakeup"]);
        assert!(order.is_empty());
    }

    #[test]
    fn events_after_a_stop_still_wait_for_the_cancelled_preparation() {
        // The stopped message's notice comes before anything sent later.
        let mut order = Order::default();
        let voice = order.preparing("a");
        order.stop(&"a");
        assert_eq!(order.ordered("a", "after the stop"), None);
        assert_eq!(released(order.prepared(voice, None)), ["after the stop"]);
    }

    #[test]
    fn unknown_or_repeated_tickets_change_nothing() {
        let mut order = Order::default();
        let voice = order.preparing("a");
        assert_eq!(order.ordered("a", "x"), None);
        assert_eq!(released(order.prepared(voice, None)), ["x"]);
        let again = order.prepared(voice, Some("late"));
        assert_eq!(
            again,
            Finished {
                released: vec![],
                stopped: None
            }
        );
        assert!(order.take_waiting(&"nobody", |_| false).is_empty());
        assert!(order.stop(&"nobody").is_empty());
    }
}
