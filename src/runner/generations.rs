//! Keeping the process-wide generation counter inside a block reserved in
//! the store, so that a turn's generation is unique across restarts.
//!
//! Generations come from one process-wide counter ([`TurnGeneration::next`])
//! that only grows. At start the runner reserves a block in the store
//! ([`RunnerTables::reserve_generations`]) and moves the counter to its first
//! value; a new block is reserved in the background when half of the
//! current one is used, long before it runs out. The counter never passes
//! a mark the next process could start below unless the store failed to
//! take a reservation for half a block's worth of turns (that is logged):
//! a Stop button or a draft from before a restart then names no turn of the
//! new process, and a stale one is refused like any other stale button.
//!
//! This module owns the reservation. It must never move the counter back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::store::{Generations, StoreError};
use crate::vocab::TurnGeneration;

/// Generations reserved at a time: one store call per this many turns and
/// stops, at most this many left unused by a restart.
pub const BLOCK: u64 = 1 << 20;

/// The reservation of one runner (one store).
#[derive(Debug)]
pub struct GenerationLease {
    store: Generations,
    /// The last generation the store has reserved for this process.
    reserved_upto: AtomicU64,
    /// A reservation is on its way.
    refilling: AtomicBool,
    /// The counter passed the reservation (logged once).
    overrun_told: AtomicBool,
}

impl GenerationLease {
    /// A lease on `store` with nothing reserved yet.
    pub fn new(store: Generations) -> Arc<GenerationLease> {
        Arc::new(GenerationLease {
            store,
            reserved_upto: AtomicU64::new(0),
            refilling: AtomicBool::new(false),
            overrun_told: AtomicBool::new(false),
        })
    }

    /// Reserve a block and move the counter into it. Call at start, before
    /// any turn runs.
    pub async fn reserve(&self) -> Result<(), StoreError> {
        let block = self
            .store
            .reserve_generations(TurnGeneration::peek_next(), BLOCK)
            .await?;
        TurnGeneration::advance_to(*block.start());
        self.reserved_upto.fetch_max(*block.end(), Ordering::AcqRel);
        tracing::debug!(
            first = block.start(),
            last = block.end(),
            "turn generations reserved"
        );
        Ok(())
    }

    /// After handing out a generation: reserve the next block in the
    /// background once half of this one is used.
    pub fn keep_ahead(self: &Arc<Self>) {
        let next = TurnGeneration::peek_next();
        let upto = self.reserved_upto.load(Ordering::Acquire);
        if upto > 0 && next > upto && !self.overrun_told.swap(true, Ordering::Relaxed) {
            tracing::error!(
                next,
                reserved_upto = upto,
                "turn generations run past what the store reserved: a Stop button from this \
                 run could match a turn after a restart"
            );
        }
        if !needs_refill(next, upto) || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.refilling.store(false, Ordering::Release);
            return;
        };
        let lease = self.clone();
        runtime.spawn(async move {
            if let Err(error) = lease.reserve().await {
                tracing::warn!(%error, "could not reserve more turn generations; retrying with the next turn");
            }
            lease.refilling.store(false, Ordering::Release);
        });
    }
}

/// Is less than half a block left before `upto` when `next` is the next
/// generation to hand out? (Pure.)
pub fn needs_refill(next: u64, upto: u64) -> bool {
    upto.saturating_sub(next) < BLOCK / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn a_new_block_is_asked_for_at_half_the_current_one() {
        assert!(needs_refill(1, 0), "nothing reserved yet");
        assert!(!needs_refill(100, 100 + BLOCK - 1));
        assert!(!needs_refill(100, 100 + BLOCK / 2));
        assert!(needs_refill(100, 100 + BLOCK / 2 - 1));
        assert!(needs_refill(200, 100));
    }

    #[tokio::test]
    async fn the_counter_moves_into_the_reserved_block_and_stays_ahead() {
        let store = Store::open_in_memory().unwrap();
        let lease = GenerationLease::new(store.generations());
        lease.reserve().await.unwrap();
        let first = TurnGeneration::next();
        assert!(first.0 >= crate::store::generations::FIRST_GENERATION);
        let upto = lease.reserved_upto.load(Ordering::Acquire);
        assert!(first.0 <= upto);
        // Using up half the block makes the lease reserve the next one.
        TurnGeneration::advance_to(upto - BLOCK / 4);
        lease.keep_ahead();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while lease.reserved_upto.load(Ordering::Acquire) == upto {
            assert!(tokio::time::Instant::now() < deadline, "never refilled");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(lease.reserved_upto.load(Ordering::Acquire) >= upto + BLOCK);
        // The store remembers it: the next reservation starts above.
        let next = store.generations().reserve_generations(1, 1).await.unwrap();
        assert!(*next.start() > lease.reserved_upto.load(Ordering::Acquire));
    }
}
