//! Reserved turn generations: the durable high-water mark that keeps a
//! turn's generation unique across restarts.
//!
//! A Stop button lives 24 hours and a draft's stop control names the
//! draft id; both carry the turn's generation. If every process counted
//! from 1 again, turn 1's button pressed after a restart would stop the new
//! process's turn 1. So a process hands out generations only from a block
//! it reserved here first: the reservation stores the block's last value,
//! and the next reservation (by this process or the next one) starts above
//! it. Reserving costs one store call per block, never one per turn.
//!
//! A store without a mark (a fresh or an upgraded database) starts at
//! [`FIRST_GENERATION`], above anything a process of an older telegate
//! counted to, so its stored buttons are stale too.
//!
//! This module owns the mark. It must never lower it.

use std::ops::RangeInclusive;

use rusqlite::{params, OptionalExtension};

use super::{Generations, StoreError};

/// The first generation of a store that has no mark yet: above the
/// generations of processes that counted from 1 (an older telegate).
pub const FIRST_GENERATION: u64 = 1 << 32;

/// The row of the generation mark in `reserved_ids`.
const GENERATION_ROW: &str = "generation";

/// The block to reserve: it starts at the mark + 1, but never below `from`
/// (what this process may already have handed out) or [`FIRST_GENERATION`].
/// Pure, for the tests.
pub fn next_block(mark: Option<u64>, from: u64, len: u64) -> RangeInclusive<u64> {
    let start = mark
        .map_or(FIRST_GENERATION, |m| m.saturating_add(1))
        .max(from)
        .max(FIRST_GENERATION);
    start..=start.saturating_add(len.max(1) - 1)
}

impl Generations {
    /// Reserve `len` generations, none below `from`, above every one
    /// reserved before in this store; returns the block (durable when
    /// this returns).
    pub async fn reserve_generations(
        &self,
        from: u64,
        len: u64,
    ) -> Result<RangeInclusive<u64>, StoreError> {
        // Not scoped to the handle's bot: turn generations are unique
        // process-wide, whichever bot's turn takes one.
        self.call(move |conn| {
            let mark: Option<i64> = conn
                .prepare_cached("SELECT upto FROM reserved_ids WHERE name = ?1")?
                .query_row([GENERATION_ROW], |r| r.get(0))
                .optional()?;
            let block = next_block(mark.and_then(|m| u64::try_from(m).ok()), from, len);
            // SQLite integers are signed: the mark stays below 2^63.
            let upto = i64::try_from(*block.end()).unwrap_or(i64::MAX);
            conn.prepare_cached(
                "INSERT INTO reserved_ids (name, upto) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET upto = max(upto, excluded.upto)",
            )?
            .execute(params![GENERATION_ROW, upto])?;
            Ok(block)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn blocks_start_above_the_mark_what_was_handed_out_and_the_old_counters() {
        assert_eq!(
            next_block(None, 1, 10),
            FIRST_GENERATION..=FIRST_GENERATION + 9
        );
        let mark = FIRST_GENERATION + 99;
        assert_eq!(next_block(Some(mark), 1, 10), mark + 1..=mark + 10);
        assert_eq!(
            next_block(Some(mark), mark + 500, 10),
            mark + 500..=mark + 509
        );
        // A mark below the floor (written by hand, say) does not matter.
        assert_eq!(
            next_block(Some(5), 1, 1),
            FIRST_GENERATION..=FIRST_GENERATION
        );
    }

    #[tokio::test]
    async fn a_reservation_survives_reopening_and_the_next_one_starts_above_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.db");
        let store = Store::open_async(&path).await.unwrap();
        let first = store
            .generations()
            .reserve_generations(1, 100)
            .await
            .unwrap();
        assert_eq!(*first.start(), FIRST_GENERATION);
        let second = store
            .generations()
            .reserve_generations(1, 100)
            .await
            .unwrap();
        assert_eq!(*second.start(), first.end() + 1);
        store.close().await.unwrap();

        let store = Store::open_async(&path).await.unwrap();
        let third = store
            .generations()
            .reserve_generations(1, 100)
            .await
            .unwrap();
        assert_eq!(*third.start(), second.end() + 1);
        store.close().await.unwrap();
    }
}
