//! Wall time for the scheduler, and how to sleep until a wall instant.
//!
//! Jobs are due at wall-clock instants ("08:00 in Berlin"); the scheduler
//! sleeps on tokio's timer. The two meet here: a [`Clock`] says what time
//! it is and turns a wall instant into a tokio deadline.
//!
//! * [`SystemClock`] (production) reads the system's wall clock. A wall
//!   clock can jump (NTP, a suspended machine) while tokio's monotonic
//!   timer does not, so one sleep never lasts longer than
//!   [`MAX_SLEEP`]: after it the scheduler looks again (one indexed
//!   query, once a minute while idle) instead of trusting an old deadline.
//! * [`TokioClock`] (tests) derives wall time from tokio's clock: a fixed
//!   wall origin plus the tokio time elapsed since it was made. With
//!   tokio's clock paused (`start_paused`, `advance`), wall time moves
//!   exactly as the test moves tokio time, and the scheduler's sleeps
//!   end exactly then: jobs fire at their instant, deterministically.
//!
//! This module must never be the one that decides what is due.

use std::time::Duration;

use jiff::Timestamp;

/// The longest single sleep of the scheduler on the system clock.
pub const MAX_SLEEP: Duration = Duration::from_secs(60);

/// What time it is, and when a wall instant comes on tokio's timer.
pub trait Clock: Send + Sync + 'static {
    /// The wall time now.
    fn now(&self) -> Timestamp;

    /// The tokio deadline to sleep until, waking at `at` (or earlier: the
    /// caller checks [`Clock::now`] again after waking).
    fn deadline(&self, at: Timestamp) -> tokio::time::Instant;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn deadline(&self, at: Timestamp) -> tokio::time::Instant {
        let wait = at
            .duration_since(self.now())
            .try_into()
            .unwrap_or(Duration::ZERO);
        tokio::time::Instant::now() + wait.min(MAX_SLEEP)
    }
}

/// Wall time that follows tokio's clock from a fixed origin (tests and
/// benchmarks; see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: Timestamp,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading `origin` now (must be called inside a runtime).
    pub fn starting_at(origin: Timestamp) -> TokioClock {
        TokioClock {
            origin,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = tokio::time::Instant::now().duration_since(self.started);
        let elapsed = jiff::SignedDuration::try_from(elapsed).unwrap_or(jiff::SignedDuration::MAX);
        self.origin.checked_add(elapsed).unwrap_or(Timestamp::MAX)
    }

    fn deadline(&self, at: Timestamp) -> tokio::time::Instant {
        let offset = at
            .duration_since(self.origin)
            .try_into()
            .unwrap_or(Duration::ZERO);
        self.started + offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_time_moves_the_test_clock() {
        let origin: Timestamp = "2026-03-29T00:59:00Z".parse().unwrap();
        let clock = TokioClock::starting_at(origin);
        assert_eq!(clock.now(), origin);
        let due: Timestamp = "2026-03-29T01:00:00Z".parse().unwrap();
        let deadline = clock.deadline(due);
        tokio::time::sleep_until(deadline).await;
        assert_eq!(clock.now(), due);
        // A past instant is due at once.
        assert!(clock.deadline(origin) <= tokio::time::Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn the_system_clock_never_sleeps_past_its_limit() {
        let far = Timestamp::now()
            .checked_add(jiff::SignedDuration::from_hours(5))
            .unwrap();
        let deadline = SystemClock.deadline(far);
        assert!(deadline <= tokio::time::Instant::now() + MAX_SLEEP);
        let past = SystemClock.deadline(Timestamp::UNIX_EPOCH);
        assert!(past <= tokio::time::Instant::now());
    }
}
