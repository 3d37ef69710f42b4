//! What a store call works on: the store thread's connection, and what the
//! thread keeps in memory beside it (the recent history of the sessions in
//! use, [`super::history_cache`]).
//!
//! It is its own type, not a bare [`Connection`], so that what lives next
//! to the connection goes wherever the connection goes (into every call's
//! closure) without a global, and so that the batch loop has one place to
//! say "this transaction was rolled back" ([`Db::rolled_back`]).
//!
//! # What it must never do
//!
//! * Never leave the store thread (it is not `Sync`; only the thread's own
//!   loop hands out `&mut Db`).
//! * Never keep in memory what a rollback undid: every rollback of the
//!   batch loop calls [`Db::rolled_back`].
//! * Transcript rows change only through `store::transcript` and
//!   `store::undo`, which keep the history cache true (a tidy test holds
//!   this): a call that writes `transcripts` with its own SQL would leave
//!   the cache answering the old rows.

use std::ops::{Deref, DerefMut};

use rusqlite::Connection;

use super::history_cache::HistoryCache;

/// The connection of the store thread and its in-memory companions. It
/// dereferences to the [`Connection`], so a call's closure uses it as one.
#[derive(Debug)]
pub struct Db {
    conn: Connection,
    history: HistoryCache,
}

impl Db {
    /// `conn`, with a history cache of at most `history_bytes` (0: none).
    pub(super) fn new(conn: Connection, history_bytes: usize) -> Self {
        Db {
            conn,
            history: HistoryCache::new(history_bytes),
        }
    }

    /// The connection alone (to close it).
    pub(super) fn into_connection(self) -> Connection {
        self.conn
    }

    /// The recent history of the sessions in use.
    pub(super) fn history(&mut self) -> &mut HistoryCache {
        &mut self.history
    }

    /// The batch loop rolled a transaction or a savepoint back: whatever
    /// was cached from its writes is gone with it.
    pub(super) fn rolled_back(&mut self) {
        self.history.clear();
    }
}

impl Deref for Db {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl DerefMut for Db {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

#[cfg(test)]
mod tests {
    use futures::future::join_all;
    use proptest::prelude::{prop, prop_oneof, proptest, ProptestConfig, Strategy};
    use rusqlite::Error as SqliteError;

    use crate::store::transcript::{insert_entry, select_last, select_last_from_sqlite};
    use crate::store::{Store, StoreError, TranscriptEntry};
    use crate::vocab::BotId;

    /// A change to bot `bot`'s session `session` (ids shared by the two
    /// bots on purpose).
    #[derive(Clone, Debug)]
    enum Op {
        Append {
            bot: i64,
            session: usize,
            n: usize,
        },
        AppendLater {
            bot: i64,
            session: usize,
        },
        ReadThenAppend {
            bot: i64,
            session: usize,
            max: usize,
        },
        Read {
            bot: i64,
            session: usize,
            max: Option<usize>,
        },
        Undo {
            bot: i64,
            session: usize,
        },
        MarkInterrupted {
            bot: i64,
            session: usize,
        },
        FailAfterInsert {
            bot: i64,
            session: usize,
        },
        FailOneWriteAfterInsert {
            bot: i64,
            session: usize,
        },
    }

    const SESSIONS: [&str; 2] = ["a", "b"];

    fn op() -> impl Strategy<Value = Op> {
        let at = (0i64..2, 0..SESSIONS.len());
        prop_oneof![
            3 => (at.clone(), 1usize..4).prop_map(|((bot, session), n)| Op::Append { bot, session, n }),
            2 => at.clone().prop_map(|(bot, session)| Op::AppendLater { bot, session }),
            3 => (at.clone(), 0usize..6).prop_map(|((bot, session), max)| Op::ReadThenAppend { bot, session, max }),
            2 => (at.clone(), prop::option::of(0usize..6)).prop_map(|((bot, session), max)| Op::Read { bot, session, max }),
            1 => at.clone().prop_map(|(bot, session)| Op::Undo { bot, session }),
            1 => at.clone().prop_map(|(bot, session)| Op::MarkInterrupted { bot, session }),
            1 => at.clone().prop_map(|(bot, session)| Op::FailAfterInsert { bot, session }),
            1 => at.prop_map(|(bot, session)| Op::FailOneWriteAfterInsert { bot, session }),
        ]
    }

    fn failure() -> StoreError {
        StoreError::Sqlite(SqliteError::QueryReturnedNoRows)
    }

    /// Runs `op`; its result does not matter (some fail on purpose, and a
    /// failing single-write call takes its batch with it).
    async fn apply(store: &Store, op: Op, n: usize) {
        let text = |i: usize| format!("{n}.{i}");
        match op {
            Op::Append { bot, session, n } => {
                let entries = (0..n).map(|i| TranscriptEntry::user(text(i))).collect();
                let t = store.for_bot(BotId(bot)).transcripts();
                let _ = t.append_many(SESSIONS[session], entries).await;
            }
            Op::AppendLater { bot, session } => {
                let entry = TranscriptEntry::assistant(text(0));
                let t = store.for_bot(BotId(bot)).transcripts();
                t.append_many_charging_later(SESSIONS[session], vec![entry], None);
            }
            Op::ReadThenAppend { bot, session, max } => {
                let t = store.for_bot(BotId(bot)).transcripts();
                let user = vec![TranscriptEntry::user(text(0))];
                let _ = t
                    .load_history_then_append(SESSIONS[session], Some(max), user)
                    .await;
            }
            Op::Read { bot, session, max } => {
                let t = store.for_bot(BotId(bot)).transcripts();
                let _ = t.load_history(SESSIONS[session], max).await;
            }
            Op::Undo { bot, session } => {
                let t = store.for_bot(BotId(bot)).transcripts();
                let _ = t.undo_last_exchange(SESSIONS[session]).await;
            }
            Op::MarkInterrupted { bot, session } => {
                let t = store.for_bot(BotId(bot)).transcripts();
                let _ = t.mark_last_interrupted(SESSIONS[session]).await;
            }
            Op::FailAfterInsert { bot, session } => {
                let entry = TranscriptEntry::user(text(0));
                let _ = store
                    .call(move |db| {
                        insert_entry(db, bot, SESSIONS[session], &entry)?;
                        Err::<(), _>(failure())
                    })
                    .await;
            }
            Op::FailOneWriteAfterInsert { bot, session } => {
                let entry = TranscriptEntry::user(text(0));
                let _ = store
                    .call_one_write(move |db| {
                        insert_entry(db, bot, SESSIONS[session], &entry)?;
                        Err::<(), _>(failure())
                    })
                    .await;
            }
        }
    }

    /// Every read the store answers equals what SQLite holds: first what
    /// the cache holds as it is (a read that misses replaces a slot, which
    /// would hide a stale one), then reads that fill it.
    async fn check(store: &Store) {
        store
            .call(|db| {
                for fill in [false, true] {
                    for bot in 0..2 {
                        for session in SESSIONS {
                            for max in [None, Some(0), Some(1), Some(2), Some(5)] {
                                let answered = if fill {
                                    Some(select_last(db, bot, session, max)?)
                                } else {
                                    db.history().get(bot, session, max)
                                };
                                let held: Vec<_> = select_last_from_sqlite(db, bot, session, max)?
                                    .into_iter()
                                    .map(|(entry, _)| entry)
                                    .collect();
                                if let Some(answered) = answered {
                                    assert_eq!(
                                        answered, held,
                                        "bot {bot} session {session} last {max:?}"
                                    );
                                }
                            }
                        }
                    }
                }
                Ok(())
            })
            .await
            .expect("the check runs");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever runs, fails, is rolled back alone or with its batch,
        /// is undone or marked interrupted, alone or several calls sharing
        /// a batch: a history read answers what SQLite holds.
        #[test]
        fn the_history_read_answers_what_sqlite_holds(
            rounds in prop::collection::vec(prop::collection::vec(op(), 1..5), 1..12),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let store = Store::open_in_memory().expect("a store");
                let mut n = 0;
                for round in rounds {
                    // Sent together: they share a batch.
                    join_all(round.into_iter().map(|op| {
                        n += 1;
                        apply(&store, op, n)
                    }))
                    .await;
                    check(&store).await;
                }
            });
        }
    }
}
