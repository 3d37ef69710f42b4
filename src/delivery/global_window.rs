//! The global limit counted exactly: every booked send in a sliding
//! one-second window, for the sends that do not keep the global spacing.
//!
//! [`super::ratelimit::RateLimiter`] spreads ordinary sends one spacing
//! (⌈1 s / N⌉) apart, which keeps any second to N sends without counting
//! them. A control reply (the answer to /stop) must not queue behind those
//! spaced sends: it goes as soon as the one-second windows around it have
//! room, whatever the spacing says. Once such an unspaced send is booked,
//! spacing alone no longer proves the limit for the windows it falls in,
//! so every send booked within a second of one is checked here too.
//!
//! This module owns the record of booked sends (a multiset of instants,
//! forgotten a second after they passed) and the one question asked of it:
//! the earliest instant at or after a given one where one more send leaves
//! every one-second window at most N. It is pure: no clock, no sleeping.
//! It must never be consulted for a limit above
//! [`MAX_COUNTED_PER_SECOND`] (a window then holds too many sends to scan;
//! the spacing is short enough there that nothing needs to go unspaced).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::{Duration, Instant};

/// The window the global limit counts sends in.
pub(super) const WINDOW: Duration = Duration::from_secs(1);

/// Highest global limit for which sends are counted (and control replies
/// may go unspaced): a check scans at most about twice this many booked
/// sends.
pub(super) const MAX_COUNTED_PER_SECOND: u32 = 100;

/// Every send booked from a second ago on, and which of them went
/// unspaced.
#[derive(Debug, Default)]
pub(super) struct SendWindow {
    /// Booked sends: instant → how many at that instant.
    sends: BTreeMap<Instant, u32>,
    /// The unspaced ones among them (same form).
    unspaced: BTreeMap<Instant, u32>,
}

impl SendWindow {
    /// Records a send at `at` (`unspaced`: booked without the spacing).
    pub(super) fn book(&mut self, at: Instant, unspaced: bool) {
        *self.sends.entry(at).or_default() += 1;
        if unspaced {
            *self.unspaced.entry(at).or_default() += 1;
        }
    }

    /// Whether an unspaced send lies within a second of `at` (either
    /// side): only then can a window around `at` hold more than spacing
    /// allows, and a spaced send needs [`SendWindow::earliest_with_room`].
    pub(super) fn unspaced_near(&self, at: Instant) -> bool {
        self.unspaced.range(around(at)).next().is_some()
    }

    /// The earliest instant at or after `at` at which one more send keeps
    /// every one-second window at most `most` sends.
    pub(super) fn earliest_with_room(&self, mut at: Instant, most: u32) -> Instant {
        while let Some(later) = self.full_window_end(at, most) {
            at = later;
        }
        at
    }

    /// If a window containing `at` already holds `most` sends: the instant
    /// the last of those full windows ends (a send there is outside all of
    /// them). Windows containing `at` start in `(at - 1 s, at]`; the count
    /// of a window only changes where a send is, so its candidates are the
    /// sends in that range and `at` itself.
    fn full_window_end(&self, at: Instant, most: u32) -> Option<Instant> {
        let near: Vec<(Instant, u32)> = self
            .sends
            .range(around(at))
            .map(|(&t, &n)| (t, n))
            .collect();
        let mut ends = Vec::new();
        let starts = near
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t <= at)
            .chain(std::iter::once(at));
        for start in starts {
            let end = start.checked_add(WINDOW)?;
            let count: u32 = near
                .iter()
                .filter(|&&(t, _)| t >= start && t < end)
                .map(|&(_, n)| n)
                .sum();
            if count >= most {
                ends.push(end);
            }
        }
        ends.into_iter().max()
    }

    /// Forgets sends that no window containing an instant at or after
    /// `now` can hold.
    pub(super) fn forget_before(&mut self, now: Instant) {
        let Some(horizon) = now.checked_sub(WINDOW) else {
            return;
        };
        for map in [&mut self.sends, &mut self.unspaced] {
            while let Some(entry) = map.first_entry() {
                if *entry.key() > horizon {
                    break;
                }
                entry.remove();
            }
        }
    }

    /// Booked sends remembered (distinct instants).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.sends.len()
    }
}

/// The open interval `(at - 1 s, at + 1 s)`.
fn around(at: Instant) -> (Bound<Instant>, Bound<Instant>) {
    let before = at
        .checked_sub(WINDOW)
        .map_or(Bound::Unbounded, Bound::Excluded);
    let after = at
        .checked_add(WINDOW)
        .map_or(Bound::Unbounded, Bound::Excluded);
    (before, after)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{SendWindow, WINDOW};

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn room_until_a_window_is_full() {
        let now = Instant::now();
        let mut window = SendWindow::default();
        for n in 0..3 {
            window.book(now + ms(n * 10), false);
        }
        assert_eq!(window.earliest_with_room(now + ms(20), 4), now + ms(20));
        // Full at 3: the next send goes when the first one leaves.
        assert_eq!(window.earliest_with_room(now + ms(20), 3), now + WINDOW);
        // Before them all, a window [t, t + 1 s) still holds all three.
        assert_eq!(window.earliest_with_room(now, 3), now + WINDOW);
    }

    #[test]
    fn a_later_full_window_pushes_past_its_end() {
        let now = Instant::now();
        let mut window = SendWindow::default();
        window.book(now, false);
        window.book(now + ms(900), false);
        window.book(now + ms(1_500), false);
        // At 1 s: [0.5 s, 1.5 s) holds 900 ms only, [0.9 s, 1.9 s) holds
        // 900 and 1500: full at 2, so after 1.9 s.
        assert_eq!(
            window.earliest_with_room(now + ms(1_000), 2),
            now + ms(1_900)
        );
    }

    #[test]
    fn forgets_what_no_window_can_hold() {
        let now = Instant::now();
        let mut window = SendWindow::default();
        window.book(now, true);
        window.book(now + ms(500), false);
        assert!(window.unspaced_near(now + ms(999)));
        window.forget_before(now + WINDOW);
        assert_eq!(window.len(), 1);
        assert!(!window.unspaced_near(now + ms(1_500)));
    }
}
