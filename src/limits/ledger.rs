//! Spend reserved before it runs: what each user's running turns in this
//! process have booked, so turns started together cannot all pass one
//! check and then all spend.
//!
//! * A turn is **booked** when its check lets it start
//!   ([`super::Limits::check`]), under the same lock that summed the
//!   user's running turns, with a reservation: the estimate of one turn
//!   ([`super::LimitsConfig::reserve_for`]).
//! * While it runs it counts as the larger of its reservation and what its
//!   meter saw so far ([`super::meter`] asks [`Ledger::in_flight`] between
//!   rounds, so one turn's loop sees the others' spending).
//! * When its [`Reservation`] is dropped (after its usage row was handed
//!   to the store) what it used moves into the user's settled sum. A check
//!   or meter that read the store before that adds what settled since, so
//!   a finished turn is never counted in neither (at worst in both, for a
//!   moment: the safe side).
//!
//! Keyed by user, across every slot of this process. This module never
//! touches the store and never decides a limit (the caller's `decide` does,
//! under the lock).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::counts::{spent_of, Amount, Shared};

/// Every user's running turns in this process. Cheap to clone; clones
/// share the book.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    users: Arc<Mutex<HashMap<u64, Book>>>,
}

#[derive(Debug, Default)]
struct Book {
    next_id: u64,
    running: HashMap<u64, Running>,
    /// What every released turn of this user used (only grows).
    settled: Amount,
}

#[derive(Debug)]
struct Running {
    reserved: Amount,
    meter: Shared,
}

impl Running {
    /// The larger of the reservation and what the turn used so far; one
    /// turn.
    fn counted(&self) -> Amount {
        let used = spent_of(&self.meter);
        Amount { turns: 1, ..used }.max(self.reserved)
    }
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Book>> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `user`'s released turns used so far: taken before the store is
    /// read, handed back to [`Ledger::book`] and [`Ledger::in_flight`].
    pub fn settled(&self, user: u64) -> Amount {
        self.lock()
            .get(&user)
            .map(|b| b.settled)
            .unwrap_or_default()
    }

    /// What `user` spends beyond the store read that followed
    /// `settled_before`: what settled since, and every running turn (but
    /// `except`) at the larger of its reservation and its use.
    pub fn in_flight(&self, user: u64, settled_before: Amount, except: Option<u64>) -> Amount {
        let users = self.lock();
        let Some(book) = users.get(&user) else {
            return Amount::default();
        };
        in_flight_of(book, settled_before, except)
    }

    /// Under one lock: `decide` is given what `user` spends in flight
    /// (as [`Ledger::in_flight`]); `Ok(reserve)` books a running turn
    /// reserving `reserve`, metered by `meter`.
    pub(super) fn book<E>(
        &self,
        user: u64,
        settled_before: Amount,
        meter: Shared,
        decide: impl FnOnce(Amount) -> Result<Amount, E>,
    ) -> Result<Reservation, E> {
        let mut users = self.lock();
        let book = users.entry(user).or_default();
        let reserved = decide(in_flight_of(book, settled_before, None))?;
        let id = book.next_id;
        book.next_id += 1;
        book.running.insert(id, Running { reserved, meter });
        Ok(Reservation {
            ledger: self.clone(),
            user,
            id,
        })
    }
}

fn in_flight_of(book: &Book, settled_before: Amount, except: Option<u64>) -> Amount {
    book.running
        .iter()
        .filter(|(id, _)| Some(**id) != except)
        .fold(book.settled.since(settled_before), |sum, (_, running)| {
            sum.plus(running.counted())
        })
}

/// One running turn's booking: dropping it ends the turn's reservation and
/// settles what it used (see the module docs for when).
#[derive(Debug)]
pub struct Reservation {
    ledger: Ledger,
    user: u64,
    id: u64,
}

impl Reservation {
    /// Which running turn of its user this is.
    pub(super) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut users = self.ledger.lock();
        let Some(book) = users.get_mut(&self.user) else {
            return;
        };
        if let Some(running) = book.running.remove(&self.id) {
            let used = spent_of(&running.meter);
            book.settled = book.settled.plus(Amount { turns: 1, ..used });
        }
        // The book stays (its settled sum is what earlier readers compare
        // with): a few words per user who ever ran a turn.
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;
    use crate::limits::counts::{add_to, Amount, Shared};
    use crate::store::AgentUsage;

    fn tokens(n: u64) -> Amount {
        Amount {
            tokens: n,
            ..Amount::default()
        }
    }

    fn meter_with(n: u64) -> Shared {
        let shared = Shared::default();
        add_to(
            &shared,
            &AgentUsage {
                input_tokens: n,
                ..AgentUsage::default()
            },
        );
        shared
    }

    #[test]
    fn a_running_turn_counts_its_reservation_or_its_use_whichever_is_more() {
        let ledger = Ledger::default();
        let before = ledger.settled(1);
        let small = ledger
            .book(1, before, meter_with(10), |_| Ok::<_, ()>(tokens(100)))
            .unwrap();
        let big = ledger
            .book(1, before, meter_with(500), |seen| {
                assert_eq!(seen.tokens, 100, "the first turn's reservation");
                Ok::<_, ()>(tokens(100))
            })
            .unwrap();
        let seen = ledger.in_flight(1, before, None);
        assert_eq!((seen.tokens, seen.turns), (600, 2));
        assert_eq!(ledger.in_flight(1, before, Some(big.id())).tokens, 100);
        assert_eq!(ledger.in_flight(2, before, None), Amount::default());
        // Released: what it used (not its reservation) is settled, and
        // counted for whoever read the store before.
        drop(small);
        assert_eq!(ledger.settled(1).tokens, 10);
        assert_eq!(ledger.in_flight(1, before, None).tokens, 510);
        let after = ledger.settled(1);
        assert_eq!(ledger.in_flight(1, after, None).tokens, 500);
        drop(big);
        assert_eq!(ledger.in_flight(1, after, None).tokens, 500);
    }

    #[test]
    fn a_refused_booking_books_nothing() {
        let ledger = Ledger::default();
        let before = ledger.settled(1);
        let refused = ledger.book(1, before, Shared::default(), |_| Err("no"));
        assert_eq!(refused.unwrap_err(), "no");
        assert_eq!(ledger.in_flight(1, before, None), Amount::default());
    }
}
