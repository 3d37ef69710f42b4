//! Telegram's flood limits as the fake enforces them, and the record of
//! calls that ignored a `retry_after`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Telegram's flood limits as the fake enforces them (see
/// [`FakeBotApi::enforce_flood_limits`]).
#[derive(Clone, Copy, Debug)]
pub struct FloodLimits {
    /// Calls one chat may burst.
    pub per_chat_burst: f64,
    /// Calls per second one chat sustains (the bucket's refill rate).
    pub per_chat_per_second: f64,
    /// Calls to one group in any minute.
    pub group_per_minute: usize,
    /// Calls overall in any second.
    pub global_per_second: usize,
    /// Network jitter tolerated on the group and global windows: calls are
    /// counted in windows this much shorter than a minute / a second (a
    /// client pacing exactly at the limit sees its requests arrive a little
    /// bunched by scheduling, which Telegram tolerates too).
    pub window_grace: Duration,
}

impl FloodLimits {
    /// Telegram's documented limits, with a burst of 3 per chat.
    pub fn telegram() -> Self {
        FloodLimits {
            per_chat_burst: 3.0,
            per_chat_per_second: 1.0,
            group_per_minute: 20,
            global_per_second: 30,
            window_grace: Duration::from_millis(100),
        }
    }
}

#[derive(Default)]
pub(super) struct Flood {
    pub(super) limits: Option<FloodLimits>,
    /// Per chat: tokens left after the last accepted call, and when.
    pub(super) buckets: HashMap<i64, (f64, Instant)>,
    pub(super) group_calls: HashMap<i64, VecDeque<Instant>>,
    pub(super) global_calls: VecDeque<Instant>,
    pub(super) refusals: u64,
}

impl Flood {
    /// `Some(retry_after secs)` if a call to `chat_id` at `at` breaks a
    /// limit; otherwise books it.
    pub(super) fn check(&mut self, chat_id: i64, is_group: bool, at: Instant) -> Option<u32> {
        let limits = self.limits?;
        let minute = Duration::from_secs(60).saturating_sub(limits.window_grace);
        let second = Duration::from_secs(1).saturating_sub(limits.window_grace);
        while self
            .global_calls
            .front()
            .is_some_and(|t| at.duration_since(*t) >= second)
        {
            self.global_calls.pop_front();
        }
        if self.global_calls.len() >= limits.global_per_second {
            self.refusals += 1;
            return Some(1);
        }
        let tokens = match self.buckets.get(&chat_id) {
            None => limits.per_chat_burst,
            Some((tokens, since)) => (tokens
                + at.duration_since(*since).as_secs_f64() * limits.per_chat_per_second)
                .min(limits.per_chat_burst),
        };
        if tokens < 1.0 {
            self.refusals += 1;
            return Some(1);
        }
        if is_group {
            let calls = self.group_calls.entry(chat_id).or_default();
            while calls
                .front()
                .is_some_and(|t| at.duration_since(*t) >= minute)
            {
                calls.pop_front();
            }
            if calls.len() >= limits.group_per_minute {
                let wait = calls.front().map_or(Duration::ZERO, |t| {
                    minute.saturating_sub(at.duration_since(*t))
                });
                self.refusals += 1;
                return Some(wait.as_secs().max(1) as u32);
            }
            calls.push_back(at);
        }
        self.buckets.insert(chat_id, (tokens - 1.0, at));
        self.global_calls.push_back(at);
        None
    }
}

/// What a 429 forbade: one chat (for per-chat methods) or one method.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RetryScope {
    Chat(i64),
    Method(String),
}

/// A call that arrived while a previously announced `retry_after` was
/// still running for its scope.
#[derive(Clone, Debug)]
pub struct RetryAfterViolation {
    pub scope: RetryScope,
    /// `seq` of the call that was answered with the 429.
    pub announced_by: u64,
    /// Instant until which the client was told to wait.
    pub retry_until: Instant,
    /// The offending call.
    pub seq: u64,
    pub method: String,
    pub at: Instant,
}

impl RetryAfterViolation {
    /// How much too early the offending call arrived.
    pub fn early_by(&self) -> Duration {
        self.retry_until.saturating_duration_since(self.at)
    }
}
