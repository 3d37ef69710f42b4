//! Pacing of outgoing requests to stay inside Telegram's flood limits.
//!
//! Telegram answers too many requests with 429 and a `retry_after`, and a
//! bot that keeps hammering gets throttled for longer. Its documented
//! guidance is: about one message per second per chat, at most 20 per
//! minute in a group, and about 30 per second overall. Pacing ourselves is
//! cheaper than recovering from 429s, and keeps a long multi-chunk reply
//! from starving every other chat.
//!
//! [`RateLimiter`] is a calculator, not a scheduler: it never reads a clock
//! or sleeps. The sender passes `now`, gets back the instant at which its
//! request may go out, and waits until then itself. Each reservation is
//! booked, so the next caller is paced behind it; a 429 is reported with
//! [`RateLimiter::retry_after`]. Being pure, it is deterministic and
//! property-tested against the limits it promises.
//!
//! Reservations need not come out in time order: a chat held back by a 429
//! must not hold back the others, so a later reservation for another chat
//! may be booked *before* earlier ones. The global limit therefore keeps a
//! small ordered calendar of booked sends rather than a queue.
//!
//! Complexity: [`RateLimiter::reserve`] is O(log R) plus amortised O(1)
//! pruning, where R is the number of separate bursts of sends still in the
//! future (at most the number of reservations not yet sent). It never
//! scans all chats; [`RateLimiter::prune`] does, and `reserve` calls it only
//! once per as many reservations as there are tracked chats.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::time::{Duration, Instant};

use super::global_window::{SendWindow, MAX_COUNTED_PER_SECOND, WINDOW as GLOBAL_WINDOW};

/// The window over which the group limit counts messages.
const GROUP_WINDOW: Duration = Duration::from_secs(60);
/// Upper bound for `per_chat_interval`, so that time arithmetic can never
/// overflow however the limits are configured.
const MAX_CHAT_INTERVAL: Duration = Duration::from_secs(3600);
/// Fewest reservations between two automatic prunes.
const MIN_RESERVATIONS_BETWEEN_PRUNES: usize = 256;
/// Sends one chat may burst (Telegram tolerates short bursts above one per
/// second): a token bucket of this size refills one token per
/// `per_chat_interval`. Ordinary sends leave one token in it, so a control
/// reply always finds one ([`Priority::Control`]); a typing action only goes
/// when the bucket is full, so it never delays a message.
pub const PER_CHAT_BURST: f64 = 3.0;

/// What a reservation is for: how much of a chat's burst it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The reply to a control command (/stop, /new, /status…): may use the
    /// last token of the chat's burst instead of waiting out
    /// `per_chat_interval`.
    Control,
    /// Everything else that must be delivered: paced one per
    /// `per_chat_interval`, always leaving a token for a control reply.
    Normal,
    /// A turn's first visible text (its first draft or preview): paced in
    /// its chat as [`Priority::Normal`], but without the global spacing,
    /// like a control reply (how soon the answer starts moving is what a
    /// user feels first; another chat's stream must not sit in front).
    FirstText,
}

/// Telegram's flood limits, as the limiter should respect them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimits {
    /// Minimum time between two sends to the same chat (capped at one
    /// hour). Default: 1 s.
    pub per_chat_interval: Duration,
    /// Most sends to one group chat in any 60-second window; 0 disables
    /// this limit. Default: 20.
    pub group_per_minute: u32,
    /// Most sends overall in any 1-second window; 0 disables this limit.
    /// Default: 30.
    pub global_per_second: u32,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self {
            per_chat_interval: Duration::from_secs(1),
            group_per_minute: 20,
            global_per_second: 30,
        }
    }
}

/// What the limiter remembers about one chat.
#[derive(Debug, Default)]
struct ChatState {
    /// The latest send booked for this chat; bookings per chat only ever
    /// move forward, so this is also the last one in time.
    last_send: Option<Instant>,
    /// Nothing for this chat before this instant (after a 429).
    blocked_until: Option<Instant>,
    /// The most recent group sends, oldest first, at most
    /// `group_per_minute` of them.
    recent_group_sends: VecDeque<Instant>,
    /// The chat's burst bucket: tokens left right after the send at the
    /// given instant; `None` means full.
    bucket: Option<(f64, Instant)>,
}

impl ChatState {
    /// Tokens in the bucket at `at` (not before the last booking).
    fn tokens_at(&self, at: Instant, interval: Duration) -> f64 {
        match self.bucket {
            None => PER_CHAT_BURST,
            Some(_) if interval.is_zero() => PER_CHAT_BURST,
            Some((tokens, since)) => {
                let refilled =
                    at.saturating_duration_since(since).as_secs_f64() / interval.as_secs_f64();
                (tokens + refilled).min(PER_CHAT_BURST)
            }
        }
    }

    /// The earliest instant at or after `now` with at least `need` tokens.
    fn bucket_allows_at(&self, need: f64, now: Instant, interval: Duration) -> Instant {
        let tokens = self.tokens_at(now, interval);
        if tokens >= need || interval.is_zero() {
            return now;
        }
        let missing = Duration::from_secs_f64((need - tokens) * interval.as_secs_f64());
        // Rounded up by a microsecond so that float error never leaves the
        // bucket a hair short at the booked instant.
        after(now, missing + Duration::from_micros(1))
    }

    /// Takes one token at `at`.
    fn take_token(&mut self, at: Instant, interval: Duration) {
        let tokens = (self.tokens_at(at, interval) - 1.0).max(0.0);
        self.bucket = Some((tokens, at));
    }

    /// When the bucket is full again.
    fn bucket_full_at(&self, interval: Duration) -> Option<Instant> {
        let (tokens, since) = self.bucket?;
        let missing = (PER_CHAT_BURST - tokens).max(0.0);
        Some(after(
            since,
            Duration::from_secs_f64(missing * interval.as_secs_f64()),
        ))
    }
}

impl ChatState {
    /// Whether this state no longer constrains any send at or after `now`,
    /// so forgetting it changes nothing.
    fn is_idle(&self, now: Instant, per_chat_interval: Duration) -> bool {
        let passed = |instant: Option<Instant>, delay: Duration| {
            instant.is_none_or(|instant| after(instant, delay) <= now)
        };
        passed(self.last_send, per_chat_interval)
            && passed(self.bucket_full_at(per_chat_interval), Duration::ZERO)
            && passed(self.blocked_until, Duration::ZERO)
            && passed(self.recent_group_sends.back().copied(), GROUP_WINDOW)
    }
}

/// Books send times for outgoing requests so that they respect
/// [`RateLimits`]. See the module documentation for how to use it.
///
/// `now` must not go backwards between calls (pass `Instant::now()`), and a
/// chat should always be passed with the same `is_group`.
#[derive(Debug)]
pub struct RateLimiter {
    limits: RateLimits,
    /// Minimum gap between any two sends, derived from
    /// `global_per_second`; `None` if that limit is disabled.
    global_spacing: Option<Duration>,
    chats: HashMap<i64, ChatState>,
    /// Booked sends grouped into bursts: first send → last send, where
    /// consecutive sends of a burst are less than two spacings apart.
    /// Between bursts there is always room for another send.
    global_bursts: BTreeMap<Instant, Instant>,
    /// Nothing at all before this instant (after a global 429).
    global_blocked_until: Option<Instant>,
    /// Every send of the last second and after, counted, so that a control
    /// reply can go without the spacing (`None` if the global limit is off
    /// or above [`MAX_COUNTED_PER_SECOND`]: control replies are spaced too).
    window: Option<SendWindow>,
    reservations_since_prune: usize,
    /// Reservations to make before the next automatic prune: as many as
    /// chats were left by the last one (at least a minimum), fixed at that
    /// time so that new chats cannot keep postponing it.
    reservations_between_prunes: usize,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(RateLimits::default())
    }
}

impl RateLimiter {
    /// A limiter with nothing booked yet.
    pub fn new(limits: RateLimits) -> Self {
        let limits = RateLimits {
            per_chat_interval: limits.per_chat_interval.min(MAX_CHAT_INTERVAL),
            ..limits
        };
        Self {
            limits,
            global_spacing: global_spacing(limits.global_per_second),
            chats: HashMap::new(),
            global_bursts: BTreeMap::new(),
            global_blocked_until: None,
            window: (1..=MAX_COUNTED_PER_SECOND)
                .contains(&limits.global_per_second)
                .then(SendWindow::default),
            reservations_since_prune: 0,
            reservations_between_prunes: MIN_RESERVATIONS_BETWEEN_PRUNES,
        }
    }

    /// The limits in force (with `per_chat_interval` capped).
    pub fn limits(&self) -> RateLimits {
        self.limits
    }

    /// Books the earliest instant, not before `now`, at which a request to
    /// `chat` may be sent without breaking any limit, and returns it. The
    /// caller must wait until then before sending.
    ///
    /// O(log R) plus amortised O(1); see the module documentation.
    pub fn reserve(&mut self, chat: i64, is_group: bool, now: Instant) -> Instant {
        self.reserve_with(chat, is_group, now, Priority::Normal)
    }

    /// [`reserve`](Self::reserve) for a request of the given priority: a
    /// control reply may go before `per_chat_interval` has passed, using
    /// the token ordinary sends leave in the chat's burst bucket, and
    /// without the global spacing, as soon as every one-second window
    /// around it has room (it never queues behind other chats' spaced
    /// sends). Group, global and `retry_after` limits apply to every
    /// priority.
    pub fn reserve_with(
        &mut self,
        chat: i64,
        is_group: bool,
        now: Instant,
        priority: Priority,
    ) -> Instant {
        self.prune_if_due(now);
        self.forget_past_bursts(now);
        let mut send_at = self.earliest_for_chat(chat, is_group, now, priority);
        if let Some(blocked_until) = self.global_blocked_until {
            send_at = send_at.max(blocked_until);
        }
        let most = self.limits.global_per_second;
        let unspaced = priority != Priority::Normal && self.window.is_some();
        send_at = match &self.window {
            Some(window) if unspaced => window.earliest_with_room(send_at, most),
            _ => self.earliest_spaced_slot(send_at),
        };
        self.book_global(send_at, unspaced);
        self.book_chat(chat, is_group, send_at);
        send_at
    }

    /// Books a send at `now` for a best-effort request (a typing action)
    /// only if it needs no wait and leaves every limit with room: the
    /// chat's burst bucket full, no block, the group window and the global
    /// spacing free. Returns whether it was booked. Such a send never
    /// moves the chat's `per_chat_interval`, so it delays no message.
    pub fn try_reserve_now(&mut self, chat: i64, is_group: bool, now: Instant) -> bool {
        self.prune_if_due(now);
        self.forget_past_bursts(now);
        if self.global_blocked_until.is_some_and(|until| until > now) {
            return false;
        }
        let interval = self.limits.per_chat_interval;
        let group_limit = self.limits.group_per_minute as usize;
        if let Some(state) = self.chats.get(&chat) {
            if state.blocked_until.is_some_and(|until| until > now)
                || state.tokens_at(now, interval) < PER_CHAT_BURST
            {
                return false;
            }
            if is_group && group_limit > 0 {
                let in_window = state
                    .recent_group_sends
                    .iter()
                    .filter(|sent| after(**sent, GROUP_WINDOW) > now)
                    .count();
                // Leave room for a message and a control reply.
                if in_window + 2 >= group_limit {
                    return false;
                }
            }
        }
        if self.earliest_spaced_slot(now) != now {
            return false;
        }
        self.book_global(now, false);
        let state = self.chats.entry(chat).or_default();
        state.take_token(now, interval);
        if is_group && group_limit > 0 {
            state.recent_group_sends.push_back(now);
            while state.recent_group_sends.len() > group_limit {
                state.recent_group_sends.pop_front();
            }
        }
        true
    }

    /// Records a 429: nothing for `chat` (or, with `None`, nothing at all)
    /// will be booked before `until`. Instants already handed out are not
    /// changed; a request that got a 429 should reserve again. O(1).
    pub fn retry_after(&mut self, chat: Option<i64>, until: Instant) {
        let blocked_until = match chat {
            Some(chat) => &mut self.chats.entry(chat).or_default().blocked_until,
            None => &mut self.global_blocked_until,
        };
        *blocked_until = Some(blocked_until.map_or(until, |current| current.max(until)));
    }

    /// Forgets everything that can no longer delay a send at or after
    /// `now`: chats idle for longer than their limits look back, bursts
    /// that are over, an expired global block. O(number of tracked chats);
    /// [`reserve`](Self::reserve) calls it often enough to keep memory
    /// proportional to the chats active in the last minute.
    pub fn prune(&mut self, now: Instant) {
        let interval = self.limits.per_chat_interval;
        self.chats.retain(|_, state| !state.is_idle(now, interval));
        self.forget_past_bursts(now);
        if self.global_blocked_until.is_some_and(|until| until <= now) {
            self.global_blocked_until = None;
        }
        self.reservations_since_prune = 0;
        self.reservations_between_prunes = self.chats.len().max(MIN_RESERVATIONS_BETWEEN_PRUNES);
    }

    /// Number of chats the limiter currently remembers.
    pub fn tracked_chats(&self) -> usize {
        self.chats.len()
    }

    /// Prunes after as many reservations as there were chats left by the
    /// previous prune (at least `MIN_RESERVATIONS_BETWEEN_PRUNES`). A prune
    /// then scans at most twice as many chats as reservations made since
    /// the last one, so its cost is O(1) amortised, and memory stays below
    /// twice the chats still active plus that minimum.
    fn prune_if_due(&mut self, now: Instant) {
        self.reservations_since_prune += 1;
        if self.reservations_since_prune >= self.reservations_between_prunes {
            self.prune(now);
        }
    }

    /// The earliest instant `chat`'s own limits allow, not before `now`.
    fn earliest_for_chat(
        &self,
        chat: i64,
        is_group: bool,
        now: Instant,
        priority: Priority,
    ) -> Instant {
        let Some(state) = self.chats.get(&chat) else {
            return now;
        };
        let interval = self.limits.per_chat_interval;
        let mut earliest = now;
        let need = match priority {
            Priority::Control => 1.0,
            Priority::Normal | Priority::FirstText => 2.0,
        };
        if priority != Priority::Control {
            if let Some(last_send) = state.last_send {
                earliest = earliest.max(after(last_send, interval));
            }
        }
        earliest = earliest.max(state.bucket_allows_at(need, earliest, interval));
        if let Some(blocked_until) = state.blocked_until {
            earliest = earliest.max(blocked_until);
        }
        let group_limit = self.limits.group_per_minute as usize;
        if is_group && group_limit > 0 && state.recent_group_sends.len() >= group_limit {
            // The send `group_limit` places back must leave the window.
            let index = state.recent_group_sends.len() - group_limit;
            if let Some(&oldest_in_window) = state.recent_group_sends.get(index) {
                earliest = earliest.max(after(oldest_in_window, GROUP_WINDOW));
            }
        }
        earliest
    }

    /// The earliest instant at or after `earliest` for a send that keeps
    /// the global spacing: one spacing away from every booked send and,
    /// within a second of an unspaced send, in windows with room.
    fn earliest_spaced_slot(&self, earliest: Instant) -> Instant {
        let mut slot = self.earliest_global_slot(earliest);
        if let Some(window) = &self.window {
            let most = self.limits.global_per_second;
            while window.unspaced_near(slot) {
                let roomy = window.earliest_with_room(slot, most);
                if roomy == slot {
                    break;
                }
                slot = self.earliest_global_slot(roomy);
            }
        }
        slot
    }

    /// The earliest instant at or after `earliest` that is at least one
    /// global spacing away from every booked send.
    fn earliest_global_slot(&self, earliest: Instant) -> Instant {
        let Some(spacing) = self.global_spacing else {
            return earliest;
        };
        let mut slot = earliest;
        if let Some((_, &last)) = self.global_bursts.range(..=slot).next_back() {
            slot = slot.max(after(last, spacing));
        }
        let later = (Bound::Excluded(slot), Bound::Unbounded);
        if let Some((&first, &last)) = self.global_bursts.range(later).next() {
            if after(slot, spacing) > first {
                // Too close to the next burst: go after it. The burst after
                // that starts at least two spacings later, so this fits.
                slot = after(last, spacing);
            }
        }
        slot
    }

    /// Adds a send at `send_at` to the burst calendar, merging bursts that
    /// it brings within two spacings of each other, and to the counted
    /// window (`unspaced`: booked without the spacing).
    fn book_global(&mut self, send_at: Instant, unspaced: bool) {
        if let Some(window) = &mut self.window {
            window.book(send_at, unspaced);
        }
        let Some(spacing) = self.global_spacing else {
            return;
        };
        let merge_distance = spacing.saturating_mul(2);
        let (mut first, mut last) = (send_at, send_at);
        let previous = self.global_bursts.range(..=send_at).next_back();
        if let Some((&previous_first, &previous_last)) = previous {
            if send_at < after(previous_last, merge_distance) {
                self.global_bursts.remove(&previous_first);
                first = previous_first;
                last = last.max(previous_last);
            }
        }
        let later = (Bound::Excluded(send_at), Bound::Unbounded);
        if let Some((&next_first, &next_last)) = self.global_bursts.range(later).next() {
            if next_first < after(send_at, merge_distance) {
                self.global_bursts.remove(&next_first);
                last = last.max(next_last);
            }
        }
        self.global_bursts.insert(first, last);
    }

    /// Records a send to `chat` at `send_at`.
    fn book_chat(&mut self, chat: i64, is_group: bool, send_at: Instant) {
        let group_limit = self.limits.group_per_minute as usize;
        let interval = self.limits.per_chat_interval;
        let state = self.chats.entry(chat).or_default();
        state.last_send = Some(state.last_send.map_or(send_at, |last| last.max(send_at)));
        state.take_token(send_at, interval);
        if is_group && group_limit > 0 {
            state.recent_group_sends.push_back(send_at);
            while state.recent_group_sends.len() > group_limit {
                state.recent_group_sends.pop_front();
            }
        }
    }

    /// Drops bursts that ended at least a spacing before `now`: no send at
    /// or after `now` can be too close to them. Amortised O(1).
    fn forget_past_bursts(&mut self, now: Instant) {
        if let Some(window) = &mut self.window {
            window.forget_before(now);
        }
        let Some(spacing) = self.global_spacing else {
            return;
        };
        while let Some(entry) = self.global_bursts.first_entry() {
            if after(*entry.get(), spacing) > now {
                break;
            }
            entry.remove();
        }
    }
}

/// The global limit as a minimum gap between any two sends: ⌈1 s / N⌉.
/// Sends at least that far apart can never put N + 1 of them in one
/// second, and they are spread out instead of bursting. Rounding up
/// matters: with 1 s / 30 rounded down, 31 sends would fit in 999.99 ms.
fn global_spacing(per_second: u32) -> Option<Duration> {
    if per_second == 0 {
        return None;
    }
    let window = GLOBAL_WINDOW.as_nanos();
    let nanos = window.div_ceil(u128::from(per_second));
    Some(Duration::from_nanos(
        u64::try_from(nanos).unwrap_or(u64::MAX),
    ))
}

/// `instant + delay`. Saturates instead of panicking; only an instant
/// within `delay` of the end of `Instant`'s range (centuries away on every
/// platform) could overflow.
fn after(instant: Instant, delay: Duration) -> Instant {
    instant.checked_add(delay).unwrap_or(instant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn limits(interval: Duration, group_per_minute: u32, global_per_second: u32) -> RateLimits {
        RateLimits {
            per_chat_interval: interval,
            group_per_minute,
            global_per_second,
        }
    }

    #[test]
    fn defaults_match_telegram_guidance() {
        let limits = RateLimits::default();
        assert_eq!(limits.per_chat_interval, Duration::from_secs(1));
        assert_eq!(limits.group_per_minute, 20);
        assert_eq!(limits.global_per_second, 30);
        assert_eq!(RateLimiter::default().limits(), limits);
    }

    #[test]
    fn first_send_goes_now() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        assert_eq!(limiter.reserve(1, false, now), now);
    }

    #[test]
    fn sends_to_one_chat_are_spaced_by_the_interval() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        let times: Vec<Instant> = (0..4).map(|_| limiter.reserve(1, false, now)).collect();
        let expected: Vec<Instant> = (0..4).map(|n| now + Duration::from_secs(n)).collect();
        assert_eq!(times, expected);
        // Once the interval has passed, the next send goes at once.
        let later = now + Duration::from_secs(10);
        assert_eq!(limiter.reserve(1, false, later), later);
    }

    #[test]
    fn other_chats_are_only_spaced_by_the_global_limit() {
        let now = Instant::now();
        let mut limiter = RateLimiter::new(limits(Duration::from_secs(1), 20, 0));
        assert_eq!(limiter.reserve(1, false, now), now);
        assert_eq!(limiter.reserve(2, false, now), now);
        let mut limiter = RateLimiter::default();
        assert_eq!(limiter.reserve(1, false, now), now);
        let second = limiter.reserve(2, false, now);
        assert!(second > now && second < now + ms(40), "{:?}", second - now);
    }

    #[test]
    fn global_limit_allows_n_per_second() {
        let now = Instant::now();
        let mut limiter = RateLimiter::new(limits(Duration::ZERO, 0, 30));
        let times: Vec<Instant> = (0..31)
            .map(|chat| limiter.reserve(chat, false, now))
            .collect();
        assert!(times[29] < now + Duration::from_secs(1));
        assert!(times[30] >= now + Duration::from_secs(1));
    }

    #[test]
    fn groups_get_at_most_n_per_minute() {
        let now = Instant::now();
        let mut limiter = RateLimiter::new(limits(Duration::from_secs(1), 20, 30));
        let times: Vec<Instant> = (0..21).map(|_| limiter.reserve(-100, true, now)).collect();
        assert_eq!(times[19], now + Duration::from_secs(19));
        assert_eq!(times[20], now + Duration::from_secs(60));
        // A private chat is not held to the group limit.
        let mut limiter = RateLimiter::new(limits(Duration::from_secs(1), 20, 30));
        let times: Vec<Instant> = (0..21).map(|_| limiter.reserve(7, false, now)).collect();
        assert_eq!(times[20], now + Duration::from_secs(20));
    }

    #[test]
    fn a_control_reply_goes_past_spaced_sends_within_the_window() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        for chat in 0..10 {
            limiter.reserve(chat, false, now);
        }
        // Ten ordinary sends spaced over 300 ms: a control reply to another
        // chat does not queue behind them.
        assert_eq!(limiter.reserve_with(99, false, now, Priority::Control), now);
        // The next ordinary send keeps its spacing after the ten.
        let next = limiter.reserve(50, false, now);
        assert!(next >= now + ms(333), "{:?}", next - now);
    }

    #[test]
    fn a_first_text_skips_the_spacing_but_not_its_chats_pacing() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        let times: Vec<Instant> = (0..10)
            .map(|chat| limiter.reserve(chat, false, now))
            .collect();
        assert_eq!(
            limiter.reserve_with(99, false, now, Priority::FirstText),
            now
        );
        // In its own chat it is an ordinary send: an interval after the last.
        assert_eq!(
            limiter.reserve_with(3, false, now, Priority::FirstText),
            times[3] + Duration::from_secs(1)
        );
    }

    #[test]
    fn a_control_reply_waits_for_a_full_window() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        let times: Vec<Instant> = (0..30)
            .map(|chat| limiter.reserve(chat, false, now))
            .collect();
        assert!(times[29] < now + Duration::from_secs(1));
        // Thirty in [now, now + 1 s): the reply goes when the first leaves.
        assert_eq!(
            limiter.reserve_with(99, false, now, Priority::Control),
            now + Duration::from_secs(1)
        );
        // An ordinary send near the unspaced one counts it too.
        let later = limiter.reserve(98, false, now + Duration::from_secs(1));
        let in_window = times
            .iter()
            .chain([now + Duration::from_secs(1)].iter())
            .filter(|t| **t + Duration::from_secs(1) > later)
            .count();
        assert!(
            in_window < 30,
            "{in_window} sends in the window before {later:?}"
        );
    }

    #[test]
    fn retry_after_holds_back_only_that_chat() {
        let now = Instant::now();
        let until = now + Duration::from_secs(30);
        let mut limiter = RateLimiter::default();
        limiter.retry_after(Some(1), until);
        assert_eq!(limiter.reserve(1, false, now), until);
        // Another chat is booked before the held-back one, not after it.
        assert_eq!(limiter.reserve(2, false, now), now);
        // A shorter retry_after does not shorten the block.
        limiter.retry_after(Some(3), until);
        limiter.retry_after(Some(3), now + Duration::from_secs(1));
        assert!(limiter.reserve(3, false, now) >= until);
    }

    #[test]
    fn global_retry_after_holds_back_everything() {
        let now = Instant::now();
        let until = now + Duration::from_secs(5);
        let mut limiter = RateLimiter::default();
        limiter.retry_after(None, until);
        for chat in 0..5 {
            assert!(limiter.reserve(chat, chat % 2 == 0, now) >= until);
        }
    }

    #[test]
    fn sends_fill_gaps_between_future_bookings() {
        let now = Instant::now();
        let mut limiter = RateLimiter::new(limits(Duration::ZERO, 0, 10));
        limiter.retry_after(Some(1), now + Duration::from_secs(10));
        assert_eq!(
            limiter.reserve(1, false, now),
            now + Duration::from_secs(10)
        );
        let five = now + Duration::from_secs(5);
        assert_eq!(limiter.reserve(2, false, five), five);
        // Just before a booked send: pushed behind it by one spacing.
        let almost_ten = now + ms(9_950);
        assert_eq!(
            limiter.reserve(3, false, almost_ten),
            now + Duration::from_secs(10) + ms(100)
        );
    }

    #[test]
    fn prune_forgets_idle_chats_only() {
        let now = Instant::now();
        let mut limiter = RateLimiter::default();
        limiter.reserve(1, false, now);
        limiter.reserve(-2, true, now);
        limiter.retry_after(Some(3), now + Duration::from_secs(120));
        limiter.prune(now + Duration::from_secs(2));
        assert_eq!(limiter.tracked_chats(), 2, "group window and 429 remain");
        limiter.prune(now + Duration::from_secs(61));
        assert_eq!(limiter.tracked_chats(), 1, "only the 429 remains");
        limiter.prune(now + Duration::from_secs(120));
        assert_eq!(limiter.tracked_chats(), 0);
        assert!(limiter.global_bursts.is_empty());
    }

    #[test]
    fn memory_stays_bounded_with_many_chats() {
        let start = Instant::now();
        let mut limiter = RateLimiter::default();
        for chat in 0..3_000 {
            let now = start + Duration::from_secs(chat as u64);
            limiter.reserve(chat, chat % 3 == 0, now);
            assert!(limiter.tracked_chats() <= MIN_RESERVATIONS_BETWEEN_PRUNES + 25);
            assert!(limiter.global_bursts.len() <= 2);
        }
    }

    #[test]
    fn spacing_rounds_up() {
        assert_eq!(global_spacing(0), None);
        assert_eq!(global_spacing(1), Some(Duration::from_secs(1)));
        assert_eq!(global_spacing(30), Some(Duration::from_nanos(33_333_334)));
        assert_eq!(global_spacing(u32::MAX), Some(Duration::from_nanos(1)));
    }

    #[test]
    fn huge_interval_is_capped() {
        let limiter = RateLimiter::new(limits(Duration::MAX, 20, 30));
        assert_eq!(limiter.limits().per_chat_interval, MAX_CHAT_INTERVAL);
        let now = Instant::now();
        let mut limiter = limiter;
        limiter.reserve(1, false, now);
        assert_eq!(limiter.reserve(1, false, now), now + MAX_CHAT_INTERVAL);
    }

    #[derive(Clone, Debug)]
    enum Operation {
        Reserve {
            chat: i64,
            advance: Duration,
            priority: Priority,
        },
        /// A typing action: booked only if it needs no wait.
        TryNow {
            chat: i64,
            advance: Duration,
        },
        RetryAfter {
            chat: Option<i64>,
            advance: Duration,
            wait: Duration,
        },
        Prune {
            advance: Duration,
        },
    }

    fn operation() -> impl Strategy<Value = Operation> {
        let advance = prop_oneof![Just(0u64), 0u64..50, 0u64..1_500, 0u64..70_000].prop_map(ms);
        prop_oneof![
            10 => (0i64..6, advance.clone())
                .prop_map(|(chat, advance)| Operation::Reserve { chat, advance, priority: Priority::Normal }),
            3 => (0i64..6, advance.clone(), prop::sample::select(vec![Priority::Control, Priority::FirstText]))
                .prop_map(|(chat, advance, priority)| Operation::Reserve { chat, advance, priority }),
            2 => (0i64..6, advance.clone())
                .prop_map(|(chat, advance)| Operation::TryNow { chat, advance }),
            1 => (prop::option::of(0i64..6), advance.clone(), (0u64..5_000).prop_map(ms))
                .prop_map(|(chat, advance, wait)| Operation::RetryAfter { chat, advance, wait }),
            1 => advance.prop_map(|advance| Operation::Prune { advance }),
        ]
    }

    fn any_limits() -> impl Strategy<Value = RateLimits> {
        (
            prop::sample::select(vec![0u64, 300, 1_000]).prop_map(ms),
            prop::sample::select(vec![0u32, 1, 3, 20]),
            prop::sample::select(vec![0u32, 1, 2, 5, 30]),
        )
            .prop_map(|(interval, group, global)| limits(interval, group, global))
    }

    /// Whether `times` (sorted) ever has more than `most` within `window`.
    fn exceeds(times: &[Instant], most: u32, window: Duration) -> bool {
        let most = most as usize;
        most > 0
            && times
                .windows(most + 1)
                .any(|run| run[most] - run[0] < window)
    }

    proptest! {
        #[test]
        fn bookings_respect_every_limit(
            limits in any_limits(),
            operations in prop::collection::vec(operation(), 1..150),
            prune_every in prop::sample::select(vec![1usize, 3, 1_000]),
        ) {
            let mut limiter = RateLimiter::new(limits);
            let mut now = Instant::now();
            let mut chat_blocks: HashMap<i64, Instant> = HashMap::new();
            let mut global_block: Option<Instant> = None;
            // Per chat: each booking, and whether it was an ordinary one
            // (`Some(true)`), a control reply or a typing action (`None`).
            let mut per_chat: HashMap<i64, Vec<(Instant, Option<bool>)>> = HashMap::new();
            let mut all = Vec::new();
            for (index, operation) in operations.into_iter().enumerate() {
                match operation {
                    Operation::TryNow { chat, advance } => {
                        now += advance;
                        if limiter.try_reserve_now(chat, chat % 2 == 0, now) {
                            if let Some(&until) = chat_blocks.get(&chat) {
                                prop_assert!(now >= until);
                            }
                            all.push(now);
                            per_chat.entry(chat).or_default().push((now, None));
                        }
                    }
                    Operation::Reserve { chat, advance, priority } => {
                        now += advance;
                        let is_group = chat % 2 == 0;
                        let send_at = limiter.reserve_with(chat, is_group, now, priority);
                        prop_assert!(send_at >= now);
                        if let Some(&until) = chat_blocks.get(&chat) {
                            prop_assert!(send_at >= until);
                        }
                        if let Some(until) = global_block {
                            prop_assert!(send_at >= until);
                        }
                        per_chat
                            .entry(chat)
                            .or_default()
                            .push((send_at, Some(priority != Priority::Control)));
                        all.push(send_at);
                    }
                    Operation::RetryAfter { chat, advance, wait } => {
                        now += advance;
                        let until = now + wait;
                        limiter.retry_after(chat, until);
                        let block = match chat {
                            Some(chat) => chat_blocks.entry(chat).or_insert(until),
                            None => global_block.get_or_insert(until),
                        };
                        *block = (*block).max(until);
                    }
                    Operation::Prune { advance } => {
                        now += advance;
                        limiter.prune(now);
                    }
                }
                if index % prune_every == 0 {
                    limiter.prune(now);
                }
            }
            let interval = limiter.limits().per_chat_interval;
            for (chat, bookings) in &per_chat {
                // An ordinary send is an interval after the send booked
                // before it (a control reply may come sooner; a typing
                // action moves nothing).
                let sends: Vec<_> = bookings.iter().filter(|b| b.1.is_some()).collect();
                for pair in sends.windows(2) {
                    if pair[1].1 == Some(true) {
                        prop_assert!(pair[1].0 >= pair[0].0 + interval, "chat {chat}: {pair:?}");
                    }
                }
                if chat % 2 == 0 {
                    let mut times: Vec<Instant> = bookings.iter().map(|b| b.0).collect();
                    times.sort();
                    prop_assert!(!exceeds(&times, limits.group_per_minute, GROUP_WINDOW));
                }
            }
            all.sort();
            prop_assert!(!exceeds(&all, limits.global_per_second, GLOBAL_WINDOW));
        }
    }
}
