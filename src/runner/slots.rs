//! The runner's bookkeeping of running agents and turn generations, as plain
//! data with no I/O and no clock of its own (callers pass `now`).
//!
//! The generation guard is what makes a stopped turn harmless: /stop, /new
//! and /reset bump the slot's generation, and a turn whose generation is no
//! longer current may not install itself, may not clear a newer turn's slot,
//! and has its result discarded.
//!
//! Generations come from one process-wide counter, so a slot that has no
//! entry simply has no current generation: every generation ever handed out
//! for it is stale. That is why an idle slot needs no entry at all here.

use std::collections::HashMap;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::memory::shrink_when_sparse;
use crate::vocab::{Progress, SessionKey, TurnGeneration};

/// A live turn's handle: how to stop it and how to see its progress.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    /// The generation the turn runs under.
    pub generation: TurnGeneration,
    /// Cancels the turn's agent.
    pub cancel: CancellationToken,
    /// The turn's progress (for /status and the watchdog).
    pub progress: Progress,
}

/// What occupies a slot in `running_agents`.
#[derive(Clone, Debug)]
pub enum RunningAgent {
    /// A turn is being set up; its agent does not exist yet.
    Pending,
    /// The turn's agent is running.
    Live(AgentHandle),
}

impl RunningAgent {
    /// The live handle, if the turn got that far.
    pub fn live(&self) -> Option<&AgentHandle> {
        match self {
            RunningAgent::Live(handle) => Some(handle),
            RunningAgent::Pending => None,
        }
    }
}

/// Why a generation was invalidated (for logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidateReason {
    /// /stop.
    Stop,
    /// /new.
    New,
    /// /reset.
    Reset,
    /// The stall watchdog.
    Watchdog,
    /// /revoke: the user who started the turn lost access.
    Revoked,
    /// Anything else (tests, shutdown).
    Other(&'static str),
}

/// `running_agents`, `running_since` and the generation per slot.
#[derive(Debug, Default)]
pub struct AgentSlots {
    running_agents: HashMap<SessionKey, RunningAgent>,
    running_since: HashMap<SessionKey, Instant>,
    generations: HashMap<SessionKey, TurnGeneration>,
    /// The user whose message started each running turn (known ones only).
    starters: HashMap<SessionKey, u64>,
}

impl AgentSlots {
    /// Start a new generation for `key` and return it. It is current until
    /// the next `begin_generation` or `invalidate_generation` for `key`.
    pub fn begin_generation(&mut self, key: &SessionKey) -> TurnGeneration {
        let generation = TurnGeneration::next();
        self.generations.insert(key.clone(), generation);
        generation
    }

    /// Make every generation handed out so far for `key` stale.
    pub fn invalidate_generation(&mut self, key: &SessionKey, reason: InvalidateReason) {
        let generation = TurnGeneration::next();
        tracing::debug!(session_key = %key, ?reason, %generation, "generation invalidated");
        self.generations.insert(key.clone(), generation);
    }

    /// Whether `generation` is still the current one for `key`.
    pub fn is_current(&self, key: &SessionKey, generation: TurnGeneration) -> bool {
        self.generations.get(key) == Some(&generation)
    }

    /// Put the pending sentinel in the slot (a turn is being set up).
    pub fn install_pending(&mut self, key: &SessionKey, now: Instant) {
        self.running_agents
            .insert(key.clone(), RunningAgent::Pending);
        self.running_since.insert(key.clone(), now);
    }

    /// Remember who started the turn in `key`'s slot (until it is released).
    pub fn set_starter(&mut self, key: &SessionKey, user: Option<u64>) {
        match user {
            Some(user) => self.starters.insert(key.clone(), user),
            None => self.starters.remove(key),
        };
    }

    /// The slots whose running turn (being set up or live) `user` started.
    pub fn started_by(&self, user: u64) -> Vec<SessionKey> {
        self.starters
            .iter()
            .filter(|(key, by)| **by == user && self.running_agents.contains_key(*key))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Install a live agent, only if its generation is still current.
    /// Returns false (and installs nothing) for a stale turn.
    pub fn promote(&mut self, key: &SessionKey, handle: AgentHandle) -> bool {
        if !self.is_current(key, handle.generation) {
            return false;
        }
        self.running_agents
            .insert(key.clone(), RunningAgent::Live(handle));
        true
    }

    /// Put anything in the slot, unconditionally (tests, recovery).
    pub fn install(&mut self, key: &SessionKey, agent: RunningAgent, since: Instant) {
        self.running_agents.insert(key.clone(), agent);
        self.running_since.insert(key.clone(), since);
    }

    /// Clear the slot. With `Some(generation)` only if it is still current
    /// (a stale turn must not clear a newer turn's slot); with `None`
    /// unconditionally. Returns whether the slot was cleared.
    pub fn release(&mut self, key: &SessionKey, generation: Option<TurnGeneration>) -> bool {
        if let Some(generation) = generation {
            if !self.is_current(key, generation) {
                return false;
            }
        }
        self.running_agents.remove(key);
        self.running_since.remove(key);
        self.starters.remove(key);
        // No entry means no current generation: everything handed out before
        // is stale, and the next begin_generation hands out a larger one.
        self.generations.remove(key);
        shrink_when_sparse(&mut self.running_agents);
        shrink_when_sparse(&mut self.running_since);
        shrink_when_sparse(&mut self.generations);
        shrink_when_sparse(&mut self.starters);
        true
    }

    /// What runs in the slot.
    pub fn running_agent(&self, key: &SessionKey) -> Option<&RunningAgent> {
        self.running_agents.get(key)
    }

    /// When the slot's turn started.
    pub fn running_since(&self, key: &SessionKey) -> Option<Instant> {
        self.running_since.get(key).copied()
    }

    /// Number of occupied slots.
    pub fn running_count(&self) -> usize {
        self.running_agents.len()
    }

    /// Number of slots with a generation entry (0 when everything is idle).
    pub fn generation_entries(&self) -> usize {
        self.generations.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(generation: TurnGeneration) -> AgentHandle {
        AgentHandle {
            generation,
            cancel: CancellationToken::new(),
            progress: Progress::new(),
        }
    }

    #[test]
    fn a_stale_turn_cannot_promote_itself() {
        let mut slots = AgentSlots::default();
        let key = SessionKey::from_raw("k");
        let g = slots.begin_generation(&key);
        slots.install_pending(&key, Instant::now());
        slots.invalidate_generation(&key, InvalidateReason::Stop);
        assert!(!slots.promote(&key, handle(g)));
        assert!(matches!(
            slots.running_agent(&key),
            Some(RunningAgent::Pending)
        ));
    }

    #[test]
    fn release_of_the_current_turn_leaves_nothing_behind() {
        let mut slots = AgentSlots::default();
        let key = SessionKey::from_raw("k");
        let g = slots.begin_generation(&key);
        slots.install_pending(&key, Instant::now());
        assert!(slots.promote(&key, handle(g)));
        assert!(slots.release(&key, Some(g)));
        assert_eq!(slots.running_count(), 0);
        assert_eq!(slots.generation_entries(), 0);
        assert!(!slots.is_current(&key, g));
    }

    #[test]
    fn the_counts_follow_the_slots_in_use() {
        // The counts feed /status, the idle checks and the gauges: a count
        // stuck at 0 would call a busy engine idle.
        let mut slots = AgentSlots::default();
        let (a, b) = (SessionKey::from_raw("a"), SessionKey::from_raw("b"));
        let ga = slots.begin_generation(&a);
        slots.install_pending(&a, Instant::now());
        assert_eq!((slots.running_count(), slots.generation_entries()), (1, 1));
        let gb = slots.begin_generation(&b);
        slots.install_pending(&b, Instant::now());
        assert!(slots.promote(&b, handle(gb)));
        assert_eq!((slots.running_count(), slots.generation_entries()), (2, 2));
        assert!(slots.release(&a, Some(ga)));
        assert_eq!((slots.running_count(), slots.generation_entries()), (1, 1));
        assert!(slots.release(&b, Some(gb)));
        assert_eq!((slots.running_count(), slots.generation_entries()), (0, 0));
    }

    #[test]
    fn a_turns_starter_is_known_while_it_runs() {
        let mut slots = AgentSlots::default();
        let (a, b) = (SessionKey::from_raw("a"), SessionKey::from_raw("b"));
        let ga = slots.begin_generation(&a);
        slots.install_pending(&a, Instant::now());
        slots.set_starter(&a, Some(7));
        let gb = slots.begin_generation(&b);
        slots.install_pending(&b, Instant::now());
        slots.set_starter(&b, Some(8));
        assert_eq!(slots.started_by(7), std::slice::from_ref(&a));
        assert!(slots.promote(&a, handle(ga)));
        let live = slots.started_by(7);
        assert_eq!(live, std::slice::from_ref(&a), "live as while set up");
        assert!(slots.release(&a, Some(ga)));
        assert!(slots.started_by(7).is_empty());
        assert!(slots.release(&b, Some(gb)));
        assert!(slots.started_by(8).is_empty());
    }
}
