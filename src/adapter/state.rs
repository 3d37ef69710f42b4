//! The adapter's bookkeeping per slot, as plain data under one mutex:
//! `active_sessions` (the guard of whoever owns the slot), `session_tasks`
//! (the owner task, for the stale-lock heal), the pending follow-ups, and
//! what acknowledgements and refusal notices are in flight.
//!
//! No I/O and no `.await`: the adapter holds this lock only between awaits.

use crate::adapter::GuardKind;
use crate::adapter::OwnerTask;
use crate::adapter::PendingQueue;
use crate::adapter::SessionGuard;
use crate::memory::shrink_when_sparse;
use crate::vocab::MessageEvent;
use crate::vocab::SessionKey;
use crate::vocab::SessionSource;
use std::collections::HashMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(super) struct AdapterState {
    pub(super) active_sessions: HashMap<SessionKey, SessionGuard>,
    pub(super) session_tasks: HashMap<SessionKey, OwnerTask>,
    pub(super) pending: HashMap<SessionKey, PendingQueue>,
    pub(super) last_ack: HashMap<SessionKey, Instant>,
    /// Refused messages not yet reported, per slot (see [`Refusals`]).
    pub(super) refusals: HashMap<SessionKey, Refusals>,
    /// The slot's latest notice being sent (fires when it is out): a turn's
    /// answer waits for it, so "Queued…" never arrives after the answer.
    pub(super) last_notice: HashMap<SessionKey, CancellationToken>,
}

/// The coalesced "not queued" notice of one slot: while its notifier task
/// lives, every refusal only adds to `count`; the task reports them at most
/// once per acknowledgement interval.
pub(super) struct Refusals {
    /// Refused since the last notice.
    pub(super) count: usize,
    /// The first of them (the notice quotes it).
    pub(super) first: Option<i64>,
    /// Where the notice goes.
    pub(super) source: SessionSource,
    /// A notifier task is reporting for this slot.
    pub(super) notifier: bool,
}

impl AdapterState {
    /// A turn guard is stale once its owner task has finished; a command
    /// guard only once its command no longer runs (the old turn's owner
    /// may finish on its own while the command still works: that does not
    /// free the slot).
    pub(super) fn is_stale(&self, key: &SessionKey) -> bool {
        match self.active_sessions.get(key) {
            None => false,
            Some(guard) if guard.kind() == GuardKind::Command => guard.is_abandoned(),
            Some(_) => self
                .session_tasks
                .get(key)
                .is_some_and(OwnerTask::is_finished),
        }
    }

    pub(super) fn heal(&mut self, key: &SessionKey) -> bool {
        if !self.is_stale(key) {
            return false;
        }
        self.active_sessions.remove(key);
        self.session_tasks.remove(key);
        self.last_ack.remove(key);
        let waiting = self.pending.get(key).map_or(0, PendingQueue::len);
        // The queued follow-ups are kept: they run next, in arrival order.
        tracing::warn!(session_key = %key, waiting, "healed a stale session lock (owner task had finished)");
        true
    }

    pub(super) fn pending_len(&self, key: &SessionKey) -> usize {
        self.pending.get(key).map_or(0, PendingQueue::len)
    }

    pub(super) fn pop_pending(&mut self, key: &SessionKey) -> Option<MessageEvent> {
        let queue = self.pending.get_mut(key)?;
        let event = queue.pop();
        if queue.is_empty() {
            self.pending.remove(key);
        }
        event
    }

    pub(super) fn owns(&self, key: &SessionKey, guard: &SessionGuard) -> bool {
        self.active_sessions.get(key).is_some_and(|g| g.same(guard))
    }

    pub(super) fn release_guard(&mut self, key: &SessionKey, guard: Option<&SessionGuard>) -> bool {
        match guard {
            Some(guard) if !self.owns(key, guard) => false,
            _ => self.active_sessions.remove(key).is_some(),
        }
    }

    /// A notice of `key` is out: forget it if the slot is idle and nothing
    /// newer is on its way.
    pub(super) fn forget_sent_notice(&mut self, key: &SessionKey) {
        if !self.active_sessions.contains_key(key)
            && self
                .last_notice
                .get(key)
                .is_some_and(CancellationToken::is_cancelled)
        {
            self.last_notice.remove(key);
            shrink_when_sparse(&mut self.last_notice);
        }
    }

    /// The slot fell idle: forget everything kept for it.
    pub(super) fn forget_idle(&mut self, key: &SessionKey) {
        if self.pending.get(key).is_some_and(PendingQueue::is_empty) {
            self.pending.remove(key);
        }
        self.last_ack.remove(key);
        if self
            .last_notice
            .get(key)
            .is_some_and(CancellationToken::is_cancelled)
        {
            self.last_notice.remove(key);
        }
        shrink_when_sparse(&mut self.last_notice);
        shrink_when_sparse(&mut self.active_sessions);
        shrink_when_sparse(&mut self.session_tasks);
        shrink_when_sparse(&mut self.pending);
        shrink_when_sparse(&mut self.last_ack);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_respects_guard_identity() {
        let mut state = AdapterState::default();
        let key = SessionKey::from_raw("k");
        let older = SessionGuard::new();
        let newer = SessionGuard::new();
        state.active_sessions.insert(key.clone(), newer.clone());
        assert!(!state.release_guard(&key, Some(&older)));
        assert!(state.owns(&key, &newer));
        assert!(state.release_guard(&key, Some(&newer)));
        assert!(!state.active_sessions.contains_key(&key));
        state.active_sessions.insert(key.clone(), older);
        assert!(state.release_guard(&key, None));
        assert!(!state.active_sessions.contains_key(&key));
    }
}
