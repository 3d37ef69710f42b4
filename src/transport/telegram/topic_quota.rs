//! How many forum topics `topics = "auto"` may make per minute
//! ([`TopicQuota`]): at most `topics_per_user_per_minute` for one user and
//! `topics_per_group_per_minute` for one group. Each topic is a turn of
//! its own and takes a share of the group's send budget (Telegram allows
//! about 20 messages a minute in a group), so without a cap one member's
//! burst of messages in the General topic or of `/new`s made forty topics
//! and forty turns, and everyone else's answers waited minutes behind
//! them.
//!
//! A message over a cap runs where it was written (the General topic, or
//! the topic the `/new` was typed in), in that one slot, as when a topic
//! cannot be made: it is not lost, and a burst cannot fan out into more
//! turns than the caps allow. Its user is told once per minute at most
//! ([`Admission::Refused`] says when), not once per message, so the
//! notices do not spend the group's budget either.
//!
//! A calculator: it never reads a clock (the caller passes `now`), sends
//! or stores anything (pure, unit-tested). Memory: the creations of the
//! last minute per forum, forgotten as they age.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The window the caps count creations in.
pub const TOPIC_WINDOW: Duration = Duration::from_secs(60);
/// Topics one user may have made per minute, unless configured.
pub const DEFAULT_TOPICS_PER_USER_PER_MINUTE: u32 = 5;
/// Topics one group may have made per minute, unless configured.
pub const DEFAULT_TOPICS_PER_GROUP_PER_MINUTE: u32 = 10;

/// The caps (`[telegram] topics_per_user_per_minute`,
/// `topics_per_group_per_minute`; 0: no cap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicCaps {
    /// Topics one user may have made in any minute.
    pub per_user: u32,
    /// Topics one group may have made in any minute.
    pub per_group: u32,
}

impl Default for TopicCaps {
    fn default() -> Self {
        TopicCaps {
            per_user: DEFAULT_TOPICS_PER_USER_PER_MINUTE,
            per_group: DEFAULT_TOPICS_PER_GROUP_PER_MINUTE,
        }
    }
}

/// Which cap a creation met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// The user's: `per_user` topics in the last minute.
    User(u32),
    /// The group's: `per_group` topics in the last minute.
    Group(u32),
}

/// Whether a topic may be made now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Yes: it is counted.
    Made,
    /// No: `cap` was met; `tell` is true for the user's first refusal in a
    /// minute (the one to tell them of).
    Refused {
        /// The cap met.
        cap: Cap,
        /// Whether to tell the user (at most once a minute).
        tell: bool,
    },
}

/// The topics made per forum in the last minute, and when each user was
/// last told of a refusal.
#[derive(Debug, Default)]
pub struct TopicQuota {
    caps: TopicCaps,
    /// Per forum: the creations of the last minute, oldest first, by user.
    made: HashMap<i64, VecDeque<(Instant, Option<u64>)>>,
    /// Per forum and user: when they were last told of a refusal.
    told: HashMap<(i64, Option<u64>), Instant>,
}

impl TopicQuota {
    /// Nothing made yet, under `caps`.
    pub fn new(caps: TopicCaps) -> Self {
        TopicQuota {
            caps,
            ..TopicQuota::default()
        }
    }

    /// May `user` make a topic in `chat` at `now`? Counted when it may.
    /// `now` must not go backwards between calls.
    pub fn admit(&mut self, chat: i64, user: Option<u64>, now: Instant) -> Admission {
        self.forget_before(now);
        let made = self.made.entry(chat).or_default();
        let by_user = made.iter().filter(|(_, by)| *by == user).count();
        let cap = if self.caps.per_group > 0 && made.len() >= self.caps.per_group as usize {
            Some(Cap::Group(self.caps.per_group))
        } else if self.caps.per_user > 0 && by_user >= self.caps.per_user as usize {
            Some(Cap::User(self.caps.per_user))
        } else {
            None
        };
        let Some(cap) = cap else {
            made.push_back((now, user));
            return Admission::Made;
        };
        if made.is_empty() {
            self.made.remove(&chat);
        }
        // Told entries a minute old were forgotten above: none left, tell.
        let tell = !self.told.contains_key(&(chat, user));
        if tell {
            self.told.insert((chat, user), now);
        }
        Admission::Refused { cap, tell }
    }

    /// Forgets creations and notices a minute old at `now`.
    fn forget_before(&mut self, now: Instant) {
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < TOPIC_WINDOW;
        self.made.retain(|_, made| {
            while made.front().is_some_and(|(at, _)| !fresh(at)) {
                made.pop_front();
            }
            !made.is_empty()
        });
        self.told.retain(|_, at| fresh(at));
    }
}

/// What the user is told of a refused creation (pure).
pub fn refusal_text(cap: Cap) -> String {
    let (most, whose) = match cap {
        Cap::User(most) => (most, "you"),
        Cap::Group(most) => (most, "this group"),
    };
    format!(
        "⚠️ I make at most {most} new topics a minute for {whose}, so I answer this message \
         here instead of in a new topic. Messages sent here in the next minute are answered \
         here too."
    )
}

#[cfg(test)]
mod tests {
    use super::{refusal_text, Admission, Cap, TopicCaps, TopicQuota, TOPIC_WINDOW};
    use std::time::{Duration, Instant};

    fn caps(per_user: u32, per_group: u32) -> TopicQuota {
        TopicQuota::new(TopicCaps {
            per_user,
            per_group,
        })
    }

    #[test]
    fn a_user_gets_their_cap_a_minute_and_is_told_once() {
        let now = Instant::now();
        let mut quota = caps(2, 10);
        assert_eq!(quota.admit(-1, Some(7), now), Admission::Made);
        assert_eq!(quota.admit(-1, Some(7), now), Admission::Made);
        let refused = |tell| Admission::Refused {
            cap: Cap::User(2),
            tell,
        };
        assert_eq!(quota.admit(-1, Some(7), now), refused(true));
        assert_eq!(
            quota.admit(-1, Some(7), now + Duration::from_secs(1)),
            refused(false)
        );
        // Another user, and the same user in another group, are not held.
        assert_eq!(quota.admit(-1, Some(8), now), Admission::Made);
        assert_eq!(quota.admit(-2, Some(7), now), Admission::Made);
        // A minute after the first two, the user may make topics again.
        assert_eq!(
            quota.admit(-1, Some(7), now + TOPIC_WINDOW),
            Admission::Made
        );
    }

    #[test]
    fn a_group_gets_its_cap_whoever_asks() {
        let now = Instant::now();
        let mut quota = caps(5, 3);
        for user in 1..=3 {
            assert_eq!(quota.admit(-1, Some(user), now), Admission::Made);
        }
        assert_eq!(
            quota.admit(-1, Some(4), now),
            Admission::Refused {
                cap: Cap::Group(3),
                tell: true
            }
        );
        assert_eq!(
            quota.admit(-1, Some(4), now + Duration::from_secs(59)),
            Admission::Refused {
                cap: Cap::Group(3),
                tell: false
            }
        );
        // A minute later the group has room again; a user refused then is
        // told again.
        let later = now + TOPIC_WINDOW;
        for user in [5, 6, 1] {
            assert_eq!(quota.admit(-1, Some(user), later), Admission::Made);
        }
        assert_eq!(
            quota.admit(-1, Some(4), later),
            Admission::Refused {
                cap: Cap::Group(3),
                tell: true
            }
        );
    }

    #[test]
    fn zero_is_no_cap_and_memory_is_forgotten() {
        let now = Instant::now();
        let mut quota = caps(0, 0);
        for _ in 0..100 {
            assert_eq!(quota.admit(-1, Some(7), now), Admission::Made);
        }
        quota.admit(-2, None, now + TOPIC_WINDOW);
        assert_eq!(quota.made.len(), 1, "the old forum is forgotten");
        assert_eq!(quota.made[&-2].len(), 1);
    }

    #[test]
    fn the_refusal_says_the_cap_in_plain_words() {
        assert!(refusal_text(Cap::User(5)).contains("at most 5 new topics a minute for you"));
        assert!(refusal_text(Cap::Group(10)).contains("for this group"));
    }
}
