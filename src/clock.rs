//! Wall-clock time, injectable: what "now" is for expiring codes and for
//! budgets that reset at local midnight.
//!
//! tokio's paused clock moves `Instant`s, not the wall clock, so tests of
//! "an invite expires after a day" or "the budget resets at midnight in
//! New York" set a [`Clock::manual`] clock and move it themselves.
//! Everything else runs on [`Clock::System`].
//!
//! This module owns reading the time. It must never sleep or schedule.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Where "now" comes from. Cheap to clone; clones of a manual clock share
/// its time.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A clock that moves only when told (tests).
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock showing `unix_ms`.
    pub fn manual(unix_ms: i64) -> Clock {
        Clock::Manual(Arc::new(AtomicI64::new(unix_ms)))
    }

    /// Now, in unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => crate::store::now_ms(),
            Clock::Manual(at) => at.load(Ordering::SeqCst),
        }
    }

    /// Now, as a timestamp.
    pub fn now(&self) -> jiff::Timestamp {
        jiff::Timestamp::from_millisecond(self.now_ms()).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
    }

    /// Set a manual clock to `unix_ms` (the system clock is not moved).
    pub fn set_ms(&self, unix_ms: i64) {
        if let Clock::Manual(at) = self {
            at.store(unix_ms, Ordering::SeqCst);
        }
    }

    /// Move a manual clock forward by `ms`.
    pub fn advance_ms(&self, ms: i64) {
        if let Clock::Manual(at) = self {
            at.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = Clock::manual(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        other.advance_ms(500);
        assert_eq!(clock.now_ms(), 1_500);
        clock.set_ms(7);
        assert_eq!(other.now().as_millisecond(), 7);
        let system = Clock::System;
        system.set_ms(0);
        assert!(system.now_ms() > 1_600_000_000_000);
    }
}
