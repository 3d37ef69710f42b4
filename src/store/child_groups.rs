//! The process groups telegate started and that may still run, so the next
//! start can kill what a crash left behind (see `tools::childgroups`).
//!
//! A row is written when a program is spawned and removed when its group
//! is gone. A row left by a crash names a group that may still hold
//! processes: the next start reads every row, kills the groups that are
//! verifiably still those recorded, and forgets them all.
//!
//! Each bot records and takes only its own groups (`bot_id`), so a bot's
//! start never kills another running bot's children.
//!
//! This module stores the rows only; it never signals anything.

use rusqlite::params;

use super::{now_ms, ChildGroups, StoreError};

/// A recorded process group: its id and what tells its leader from a
/// process that got the same id later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildGroup {
    /// The group id (the pid of its leader).
    pub pgid: i32,
    /// The leader's start time, in clock ticks since boot (`/proc/<pid>/stat`
    /// field 22).
    pub leader_start: u64,
    /// The session the group lives in.
    pub session_id: i32,
    /// The boot the start time counts from (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// What runs in it (`command`, `terminal`), for the log.
    pub what: String,
}

/// A change to the recorded groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChildGroupChange {
    /// A group was started.
    Started(ChildGroup),
    /// The group with this id is gone.
    Ended(i32),
}

impl ChildGroups {
    /// Apply `changes` in order (one call for a batch of them).
    pub async fn record_child_groups(
        &self,
        changes: Vec<ChildGroupChange>,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            for change in &changes {
                match change {
                    ChildGroupChange::Started(group) => {
                        conn.prepare_cached(
                            "INSERT OR REPLACE INTO child_groups
                             (bot_id, pgid, leader_start, session_id, boot_id, what, recorded_at)
                             VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)",
                        )?
                        .execute(params![
                            group.pgid,
                            i64::try_from(group.leader_start).unwrap_or(i64::MAX),
                            group.session_id,
                            group.boot_id,
                            group.what,
                            now_ms(),
                            bot
                        ])?;
                    }
                    ChildGroupChange::Ended(pgid) => {
                        conn.prepare_cached(
                            "DELETE FROM child_groups WHERE bot_id = ?2 AND pgid = ?1",
                        )?
                        .execute(params![pgid, bot])?;
                    }
                }
            }
            Ok(())
        })
        .await
    }

    /// Take every recorded group (at start: the previous run's), removing
    /// them.
    pub async fn take_child_groups(&self) -> Result<Vec<ChildGroup>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let groups = {
                let mut statement = conn.prepare(
                    "SELECT pgid, leader_start, session_id, boot_id, what FROM child_groups
                     WHERE bot_id = ?1 ORDER BY recorded_at",
                )?;
                let rows = statement.query_map([bot], |row| {
                    Ok(ChildGroup {
                        pgid: row.get(0)?,
                        leader_start: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                        session_id: row.get(2)?,
                        boot_id: row.get(3)?,
                        what: row.get(4)?,
                    })
                })?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            conn.execute("DELETE FROM child_groups WHERE bot_id = ?1", [bot])?;
            Ok(groups)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    fn group(pgid: i32) -> ChildGroup {
        ChildGroup {
            pgid,
            leader_start: 1234,
            session_id: 7,
            boot_id: "boot".into(),
            what: "command".into(),
        }
    }

    #[tokio::test]
    async fn groups_are_recorded_until_they_end_and_taken_once() {
        let store = Store::open_in_memory().unwrap();
        store
            .child_groups()
            .record_child_groups(vec![
                ChildGroupChange::Started(group(10)),
                ChildGroupChange::Started(group(11)),
                ChildGroupChange::Ended(10),
            ])
            .await
            .unwrap();
        // A reused id replaces the old row.
        let mut again = group(11);
        again.leader_start = 99;
        store
            .child_groups()
            .record_child_groups(vec![ChildGroupChange::Started(again.clone())])
            .await
            .unwrap();
        assert_eq!(
            store.child_groups().take_child_groups().await.unwrap(),
            vec![again]
        );
        assert!(store
            .child_groups()
            .take_child_groups()
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn each_bot_takes_only_its_own_leftover_groups() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.child_groups()
            .record_child_groups(vec![
                ChildGroupChange::Started(group(10)),
                ChildGroupChange::Started(group(11)),
            ])
            .await
            .unwrap();
        b.child_groups()
            .record_child_groups(vec![
                ChildGroupChange::Started(group(10)),
                ChildGroupChange::Ended(11),
            ])
            .await
            .unwrap();
        assert_eq!(
            b.child_groups().take_child_groups().await.unwrap(),
            vec![group(10)]
        );
        assert_eq!(
            a.child_groups().take_child_groups().await.unwrap(),
            vec![group(10), group(11)]
        );
    }
}
