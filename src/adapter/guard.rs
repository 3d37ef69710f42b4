//! Slot guards and owner tasks: the two facts that make a slot busy.
//!
//! A [`SessionGuard`] in `active_sessions` says "this slot is busy"; it also
//! carries the interrupt flag of the turn that holds it. An [`OwnerTask`] in
//! `session_tasks` says which task holds the guard, so that a guard whose
//! owner has finished (done, panicked or aborted) can be recognised as stale
//! and healed instead of trapping the chat forever.

use crate::reply::SendingStop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;

/// Whether a guard belongs to a turn or to a command on the command path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardKind {
    /// An owner task's turn.
    Turn,
    /// /stop, /new or /reset swapped this guard in while it runs.
    Command,
}

/// The busy marker of a slot. Guards compare by identity: two guards are
/// equal only if one is a clone of the other.
#[derive(Clone, Debug)]
pub struct SessionGuard {
    id: u64,
    kind: GuardKind,
    interrupt: CancellationToken,
    finishing: Arc<AtomicBool>,
    /// The delivery of this turn's answer, which /stop, /new or /reset end
    /// (see [`SessionGuard::stop_sending`]).
    sending: SendingStop,
    /// Set when the command that holds a [`GuardKind::Command`] guard ended
    /// without handing the slot on (its future was dropped): only then may
    /// the guard be healed. Unused for turn guards.
    abandoned: Arc<AtomicBool>,
}

impl SessionGuard {
    /// A new turn guard.
    pub fn new() -> Self {
        SessionGuard::with_kind(GuardKind::Turn)
    }

    /// A new guard of the given kind.
    pub fn with_kind(kind: GuardKind) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        SessionGuard {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            kind,
            interrupt: CancellationToken::new(),
            finishing: Arc::new(AtomicBool::new(false)),
            sending: SendingStop::new(CancellationToken::new()),
            abandoned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A command guard and the lease its command path holds while it runs:
    /// while the lease lives, the guard is never stale, whatever became of
    /// the old turn's owner task. Dropping the lease (the command finished,
    /// or its future was dropped) lets a guard still installed be healed.
    pub fn command() -> (Self, CommandLease) {
        let guard = SessionGuard::with_kind(GuardKind::Command);
        let lease = CommandLease {
            abandoned: guard.abandoned.clone(),
        };
        (guard, lease)
    }

    /// True for a command guard whose command no longer runs.
    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }

    /// Mark that the turn holding this guard has its answer and is only
    /// delivering it: a message arriving now neither interrupts it nor needs
    /// an acknowledgement, it simply runs next.
    pub fn mark_finishing(&self) {
        self.finishing.store(true, Ordering::Release);
    }

    /// See [`SessionGuard::mark_finishing`].
    pub fn is_finishing(&self) -> bool {
        self.finishing.load(Ordering::Acquire)
    }

    /// End the delivery of this turn's answer: parts and files not sent
    /// yet are not sent (a request already sent runs to its answer).
    pub fn stop_sending(&self) {
        self.sending.token().cancel();
    }

    /// The delivery [`SessionGuard::stop_sending`] ends.
    pub fn sending(&self) -> &SendingStop {
        &self.sending
    }

    /// True while the turn holding this guard has its answer and some of
    /// it is still to be sent: what a stop would keep back.
    pub fn is_sending(&self) -> bool {
        self.is_finishing() && self.sending.is_open()
    }

    /// Turn or command.
    pub fn kind(&self) -> GuardKind {
        self.kind
    }

    /// The interrupt flag of the turn holding this guard.
    pub fn interrupt(&self) -> &CancellationToken {
        &self.interrupt
    }

    /// True if `other` is this very guard.
    pub fn same(&self, other: &SessionGuard) -> bool {
        self.id == other.id
    }
}

impl Default for SessionGuard {
    fn default() -> Self {
        SessionGuard::new()
    }
}

impl PartialEq for SessionGuard {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}

impl Eq for SessionGuard {}

/// Held by a running command for its [`GuardKind::Command`] guard; see
/// [`SessionGuard::command`].
#[derive(Debug)]
pub struct CommandLease {
    abandoned: Arc<AtomicBool>,
}

impl Drop for CommandLease {
    fn drop(&mut self) {
        self.abandoned.store(true, Ordering::Release);
    }
}

/// The task that holds a slot's guard: how to ask it to stop, how to force
/// it, and how to know it has finished.
#[derive(Clone, Debug)]
pub struct OwnerTask {
    abort: AbortHandle,
    cancel: CancellationToken,
    done: CancellationToken,
}

impl OwnerTask {
    pub(crate) fn new(
        abort: AbortHandle,
        cancel: CancellationToken,
        done: CancellationToken,
    ) -> Self {
        OwnerTask {
            abort,
            cancel,
            done,
        }
    }

    /// Record an arbitrary task as an owner (tests install locks this way).
    pub fn watching<T>(task: &JoinHandle<T>) -> Self {
        OwnerTask {
            abort: task.abort_handle(),
            cancel: CancellationToken::new(),
            done: CancellationToken::new(),
        }
    }

    /// True once the task has completed, panicked or been aborted.
    pub fn is_finished(&self) -> bool {
        self.abort.is_finished()
    }

    /// The tokio id of the task.
    pub fn id(&self) -> tokio::task::Id {
        self.abort.id()
    }

    /// Ask the task to stop at its next await point (cooperative).
    pub(crate) fn request_cancel(&self) {
        self.cancel.cancel();
    }

    /// Force the task to stop (after the cooperative wait timed out).
    pub(crate) fn abort(&self) {
        self.abort.abort();
    }

    /// Wait until the task has finished, at most `limit`. Returns whether it
    /// finished.
    pub(crate) async fn finished_within(&self, limit: std::time::Duration) -> bool {
        if self.is_finished() {
            return true;
        }
        tokio::select! {
            _ = self.done.cancelled() => true,
            _ = tokio::time::sleep(limit) => self.is_finished(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_is_sending_only_while_its_answer_is_not_all_out() {
        let guard = SessionGuard::new();
        assert!(!guard.is_sending(), "a running turn is not sending yet");
        guard.mark_finishing();
        assert!(guard.is_sending());
        guard.sending().answer_sent();
        assert!(
            !guard.is_sending(),
            "once the last part is out, /stop has nothing to stop"
        );
    }

    #[test]
    fn a_command_guard_is_abandoned_only_once_its_lease_is_dropped() {
        // The heal may take a command's slot only after the command ended:
        // a lease that never marks it (or a guard that never reads it)
        // leaves the slot locked, or heals it too early.
        let (guard, lease) = SessionGuard::command();
        assert_eq!(guard.kind(), GuardKind::Command);
        assert!(!guard.is_abandoned());
        let copy = guard.clone();
        drop(lease);
        assert!(guard.is_abandoned() && copy.is_abandoned());
        assert!(!SessionGuard::new().is_abandoned());
    }

    #[test]
    fn finishing_is_seen_through_every_copy_of_the_guard() {
        let guard = SessionGuard::new();
        let held_by_the_adapter = guard.clone();
        assert!(!held_by_the_adapter.is_finishing());
        guard.mark_finishing();
        assert!(held_by_the_adapter.is_finishing());
    }

    #[test]
    fn guards_are_equal_only_to_themselves() {
        let guard = SessionGuard::new();
        assert_eq!(guard, guard.clone());
        assert_ne!(guard, SessionGuard::new());
        assert_ne!(SessionGuard::command().0, SessionGuard::command().0);
    }

    #[tokio::test]
    async fn abort_ends_an_owner_task_that_ignores_cancellation() {
        let task = tokio::spawn(std::future::pending::<()>());
        let owner = OwnerTask::watching(&task);
        owner.request_cancel();
        let short = std::time::Duration::from_millis(20);
        assert!(
            !owner.finished_within(short).await,
            "it ignores the request"
        );
        owner.abort();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), task).await;
        assert!(ended.is_ok_and(|joined| joined.is_err_and(|e| e.is_cancelled())));
        assert!(owner.is_finished());
    }
}
