//! The recent history of the sessions in use, kept in memory beside the
//! store's connection, so that a turn does not read back from SQLite what
//! the store wrote a moment ago.
//!
//! Reading a session's last N transcript entries was a quarter of the store
//! thread's time per turn (an index walk, N rows decoded, N JSON columns
//! parsed). The same entries went through the store thread seconds before,
//! when they were written. This cache keeps them.
//!
//! # What it owns
//!
//! * Per session (of a bot): a suffix of its transcript (entries not undone,
//!   oldest first), how many entries it keeps, and whether that suffix is
//!   the whole transcript (`complete`), so "the last 50" of a session with
//!   12 entries is answered too.
//! * Its size: at most [`MAX_ENTRIES`] per session and a byte budget over
//!   all sessions; past it, the least recently used sessions go.
//!
//! # What it must never do
//!
//! * Never answer what SQLite would not: a read is answered only when the
//!   suffix it holds covers it; otherwise it says "not here" and the caller
//!   reads SQLite and [`HistoryCache::fill`]s it.
//! * Never outlive a rollback: it is updated as rows are written, inside the
//!   transaction, so whoever rolls a transaction or savepoint back must
//!   [`HistoryCache::clear`] it (`store::db` does, on every rollback of the
//!   batch loop). Any other change to a session's rows (/undo, marking an
//!   entry interrupted) [`HistoryCache::forget`]s that session.
//! * Never run SQL: it is a pure structure, tested against a model.

use std::collections::VecDeque;

use hashlink::LruCache;

use super::transcript_entry::TranscriptEntry;

/// At most this many entries are kept per session (a longer history limit
/// reads SQLite).
pub(super) const MAX_ENTRIES: usize = 200;

/// The default byte budget over all sessions (an estimate of the entries'
/// heap and inline size; see [`entry_bytes`]).
pub(super) const DEFAULT_BUDGET: usize = 8 << 20;

/// One session's recent entries.
#[derive(Debug)]
struct Slot {
    bot: i64,
    /// Oldest first; each with its estimated size.
    entries: VecDeque<(TranscriptEntry, usize)>,
    /// The sum of the entries' sizes.
    bytes: usize,
    /// How many entries it keeps (the read that filled it asked for these).
    keep: usize,
    /// `entries` is the session's whole transcript (not undone).
    complete: bool,
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct HistoryCache {
    slots: LruCache<String, Slot>,
    bytes: usize,
    budget: usize,
}

/// The estimated memory of `entry`, whose tool calls take `tool_calls_json`
/// bytes as JSON.
pub(super) fn entry_bytes(entry: &TranscriptEntry, tool_calls_json: usize) -> usize {
    std::mem::size_of::<(TranscriptEntry, usize)>()
        + entry.content.len()
        + tool_calls_json * 2
        + entry.tool_call_id.as_ref().map_or(0, String::len)
        + entry.name.as_ref().map_or(0, String::len)
}

impl HistoryCache {
    /// An empty cache that holds at most `budget` bytes (0: it holds
    /// nothing, every read goes to SQLite).
    pub(super) fn new(budget: usize) -> Self {
        HistoryCache {
            slots: LruCache::new_unbounded(),
            bytes: 0,
            budget,
        }
    }

    /// The last `max` entries (all with `None`) of `bot`'s `session`, oldest
    /// first, if this cache holds them.
    pub(super) fn get(
        &mut self,
        bot: i64,
        session: &str,
        max: Option<usize>,
    ) -> Option<Vec<TranscriptEntry>> {
        let slot = self.slots.get(session).filter(|s| s.bot == bot)?;
        let held = slot.entries.len();
        let wanted = match max {
            Some(n) if slot.complete || held >= n => n.min(held),
            None if slot.complete => held,
            _ => return None,
        };
        Some(
            slot.entries
                .range(held - wanted..)
                .map(|(entry, _)| entry.clone())
                .collect(),
        )
    }

    /// Records what SQLite answered for the last `max` entries of `bot`'s
    /// `session` (oldest first, each with its size), replacing what was held.
    pub(super) fn fill(
        &mut self,
        bot: i64,
        session: &str,
        max: Option<usize>,
        entries: impl ExactSizeIterator<Item = (TranscriptEntry, usize)>,
    ) {
        self.forget(session);
        let keep = max.unwrap_or(MAX_ENTRIES).min(MAX_ENTRIES);
        let found = entries.len();
        if keep == 0 || self.budget == 0 {
            return;
        }
        // Fewer than asked for: that is the whole transcript.
        let complete = max.is_none_or(|n| found < n) && found <= keep;
        let entries: VecDeque<_> = entries.skip(found.saturating_sub(keep)).collect();
        let bytes = entries.iter().map(|(_, b)| b).sum();
        self.bytes += bytes;
        self.slots.insert(
            session.to_owned(),
            Slot {
                bot,
                entries,
                bytes,
                keep,
                complete,
            },
        );
        self.shrink();
    }

    /// `entry` (of `bytes`) was appended to `bot`'s `session`: added if the
    /// session is held (`entry` is called only then).
    pub(super) fn appended(
        &mut self,
        bot: i64,
        session: &str,
        bytes: usize,
        entry: impl FnOnce() -> TranscriptEntry,
    ) {
        let Some(slot) = self.slots.get_mut(session) else {
            return;
        };
        if slot.bot != bot {
            self.forget(session);
            return;
        }
        slot.entries.push_back((entry(), bytes));
        slot.bytes += bytes;
        self.bytes += bytes;
        while slot.entries.len() > slot.keep {
            if let Some((_, gone)) = slot.entries.pop_front() {
                slot.bytes -= gone;
                self.bytes -= gone;
            }
            slot.complete = false;
        }
        self.shrink();
    }

    /// Drops what is held of `session` (its rows changed otherwise than by
    /// an append).
    pub(super) fn forget(&mut self, session: &str) {
        if let Some(slot) = self.slots.remove(session) {
            self.bytes -= slot.bytes;
        }
    }

    /// Drops everything (a rollback undid writes it may hold).
    pub(super) fn clear(&mut self) {
        self.slots.clear();
        self.bytes = 0;
    }

    /// Sessions held (for tests and stats).
    #[cfg(test)]
    fn sessions(&self) -> usize {
        self.slots.len()
    }

    /// Evicts the least recently used sessions until within the budget.
    fn shrink(&mut self) {
        while self.bytes > self.budget {
            match self.slots.remove_lru() {
                Some((_, slot)) => self.bytes -= slot.bytes,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::{prop, prop_oneof, proptest, Just, Strategy};

    use super::{entry_bytes, HistoryCache, MAX_ENTRIES};
    use crate::store::TranscriptEntry;

    /// An operation on one (bot, session) of a small set.
    #[derive(Clone, Debug)]
    enum Op {
        Append { key: usize, len: usize },
        Read { key: usize, max: Option<usize> },
        Forget { key: usize },
        Clear,
    }

    const KEYS: [(i64, &str); 4] = [(1, "a"), (1, "b"), (2, "a"), (2, "c")];

    fn op() -> impl Strategy<Value = Op> {
        let key = 0..KEYS.len();
        prop_oneof![
            4 => (key.clone(), 0usize..300).prop_map(|(key, len)| Op::Append { key, len }),
            4 => (key.clone(), prop::option::of(0usize..12)).prop_map(|(key, max)| Op::Read { key, max }),
            1 => key.prop_map(|key| Op::Forget { key }),
            1 => Just(Op::Clear),
        ]
    }

    fn entry(n: usize, len: usize) -> TranscriptEntry {
        let mut e = TranscriptEntry::user(format!("{n}:{}", "x".repeat(len)));
        e.created_at_ms = i64::try_from(n).unwrap_or_default();
        e
    }

    fn last(truth: &[TranscriptEntry], max: Option<usize>) -> Vec<TranscriptEntry> {
        let n = max.unwrap_or(truth.len()).min(truth.len());
        truth[truth.len() - n..].to_vec()
    }

    proptest! {
        /// Against a model (each session's whole transcript): every read the
        /// cache answers is what SQLite would answer, a miss filled from the
        /// model is answered next time, and the byte count stays within the
        /// budget and equal to the sum of what is held.
        #[test]
        fn a_read_it_answers_is_the_transcripts_suffix(
            ops in prop::collection::vec(op(), 1..200),
            budget in prop_oneof![Just(0usize), 1000usize..20_000, Just(1usize << 30)],
        ) {
            let mut cache = HistoryCache::new(budget);
            let mut truth: HashMap<usize, Vec<TranscriptEntry>> = HashMap::new();
            let mut written = 0;
            for op in ops {
                match op {
                    Op::Append { key, len } => {
                        written += 1;
                        let e = entry(written, len);
                        let bytes = entry_bytes(&e, 0);
                        let (bot, session) = KEYS[key];
                        cache.appended(bot, session, bytes, || e.clone());
                        // Another bot's session of the same id is not it.
                        truth.entry(key).or_default().push(e);
                    }
                    Op::Read { key, max } => {
                        let (bot, session) = KEYS[key];
                        let all = truth.get(&key).cloned().unwrap_or_default();
                        let want = last(&all, max);
                        match cache.get(bot, session, max) {
                            Some(got) => assert_eq!(got, want),
                            None => {
                                let sized = want.iter().map(|e| (e.clone(), entry_bytes(e, 0)));
                                cache.fill(bot, session, max, sized.collect::<Vec<_>>().into_iter());
                                if budget >= 1 << 30 && max != Some(0) {
                                    assert_eq!(cache.get(bot, session, max), Some(want));
                                }
                            }
                        }
                    }
                    Op::Forget { key } => cache.forget(KEYS[key].1),
                    Op::Clear => cache.clear(),
                }
                assert!(cache.bytes <= budget);
                let held: usize = cache.slots.iter().map(|(_, s)| s.bytes).sum();
                assert_eq!(cache.bytes, held);
                for (_, slot) in cache.slots.iter() {
                    assert!(slot.entries.len() <= slot.keep.min(MAX_ENTRIES));
                    assert_eq!(slot.bytes, slot.entries.iter().map(|(_, b)| b).sum::<usize>());
                }
            }
        }
    }

    #[test]
    fn a_session_with_fewer_entries_than_asked_is_answered_whole() {
        let mut cache = HistoryCache::new(1 << 20);
        let held: Vec<_> = (0..3).map(|n| (entry(n, 1), 10)).collect();
        cache.fill(1, "s", Some(50), held.into_iter());
        assert_eq!(cache.get(1, "s", Some(50)).map(|v| v.len()), Some(3));
        assert_eq!(cache.get(1, "s", None).map(|v| v.len()), Some(3));
        cache.appended(1, "s", 10, || entry(3, 1));
        assert_eq!(cache.get(1, "s", Some(50)).map(|v| v.len()), Some(4));
        // Not another bot's session of the same id.
        assert_eq!(cache.get(2, "s", Some(50)), None);
    }

    #[test]
    fn past_what_it_keeps_it_no_longer_knows_the_whole_transcript() {
        let mut cache = HistoryCache::new(1 << 20);
        cache.fill(1, "s", Some(2), Vec::new().into_iter());
        for n in 0..3 {
            cache.appended(1, "s", 10, || entry(n, 1));
        }
        let got = cache.get(1, "s", Some(2)).unwrap_or_default();
        assert_eq!(
            got.iter().map(|e| e.created_at_ms).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(cache.get(1, "s", Some(3)), None);
        assert_eq!(cache.get(1, "s", None), None);
    }

    #[test]
    fn the_least_recently_used_session_goes_first() {
        let one = entry_bytes(&entry(0, 100), 0);
        let mut cache = HistoryCache::new(one * 2);
        for session in ["a", "b"] {
            cache.fill(1, session, Some(5), vec![(entry(0, 100), one)].into_iter());
        }
        assert!(cache.get(1, "a", Some(5)).is_some()); // "b" is now the oldest use
        cache.fill(1, "c", Some(5), vec![(entry(0, 100), one)].into_iter());
        assert_eq!(cache.sessions(), 2);
        assert!(cache.get(1, "b", Some(5)).is_none());
        assert!(cache.get(1, "a", Some(5)).is_some());
        assert!(cache.get(1, "c", Some(5)).is_some());
    }
}
