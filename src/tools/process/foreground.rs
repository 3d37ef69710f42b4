//! Waiting for a process (`process wait`, foreground runs): a waiter that
//! is cancelled after the exit hands the wakeup back, and `ForegroundRun`
//! kills its group when dropped.

use crate::tools::process::kill_entry;
use crate::tools::process::Entry;
use crate::tools::process::ProcessId;
use crate::tools::process::ProcessRegistry;
use crate::tools::process::WaitOutcome;
use crate::tools::process::WakeupState;
use crate::tools::process::ALIVE_PING;
use crate::tools::ToolEvent;
use crate::tools::ToolEventSender;
use crate::vocab::Progress;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a wait ended.
pub(super) enum Waited {
    Exited,
    TimedOut,
    Cancelled,
}

pub(super) async fn wait_for_exit(
    entry: &Entry,
    limit: Duration,
    cancel: &CancellationToken,
    progress: Option<&Progress>,
) -> Waited {
    let mut exited = entry.exited.subscribe();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if *exited.borrow_and_update() {
            return Waited::Exited;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Waited::Cancelled,
            changed = exited.changed() => {
                if changed.is_err() {
                    // The entry is gone with its sender: treat as ended.
                    return Waited::Exited;
                }
            }
            () = tokio::time::sleep_until(deadline) => return Waited::TimedOut,
            () = tokio::time::sleep(ALIVE_PING) => {
                if let Some(progress) = progress {
                    progress.still_working();
                }
            }
        }
    }
}

/// A `process wait` in progress. If it is dropped after the process ended
/// but before it reported the exit (the turn was cancelled), and nobody else
/// waits, it sends the wakeup the exit was holding back.
pub(super) struct Waiter {
    pub(super) entry: Arc<Entry>,
    pub(super) events: ToolEventSender,
}

impl Waiter {
    pub(super) fn register(entry: Arc<Entry>, events: ToolEventSender) -> Waiter {
        entry.state().waiters += 1;
        Waiter { entry, events }
    }

    /// The exit reaches the agent through this wait: no wakeup.
    pub(super) fn consume(&self) {
        let mut state = self.entry.state();
        if state.wakeup == WakeupState::Pending {
            state.wakeup = WakeupState::Consumed;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let send = {
            let mut state = self.entry.state();
            state.waiters = state.waiters.saturating_sub(1);
            let due =
                state.waiters == 0 && state.exit.is_some() && state.wakeup == WakeupState::Pending;
            if due {
                state.wakeup = WakeupState::Sent;
            }
            due
        };
        if send {
            if let Some(wakeup) = self.entry.wakeup() {
                self.events.send(ToolEvent::Wakeup(Box::new(wakeup)));
            }
        }
    }
}

/// A foreground process and the tool call waiting for it. Dropping it (the
/// call returned, or its future was dropped mid-wait) kills the process
/// group if it still runs and removes the record.
pub struct ForegroundRun {
    pub(super) registry: ProcessRegistry,
    pub(super) entry: Arc<Entry>,
}

impl fmt::Debug for ForegroundRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForegroundRun")
            .field("id", &self.entry.id)
            .finish()
    }
}

impl ForegroundRun {
    /// The process's id.
    pub fn id(&self) -> &ProcessId {
        &self.entry.id
    }

    /// Wait for the process to end, at most `limit`, pinging `progress`.
    /// On timeout or cancellation the group is stopped before returning.
    pub async fn wait(
        &self,
        limit: Duration,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> WaitOutcome {
        match wait_for_exit(&self.entry, limit, cancel, Some(progress)).await {
            Waited::Exited => WaitOutcome::Exited(self.entry.record()),
            Waited::TimedOut => {
                kill_entry(&self.entry, self.registry.inner.config.kill_grace).await;
                WaitOutcome::StillRunning(self.entry.record())
            }
            Waited::Cancelled => {
                self.kill_now();
                WaitOutcome::Cancelled
            }
        }
    }

    /// Everything the ring holds of the output.
    pub fn output(&self) -> String {
        self.entry.output().text()
    }

    pub(super) fn kill_now(&self) {
        let mut state = self.entry.state();
        if state.exit.is_none() {
            state.kill_requested = true;
            self.entry.group.send(libc::SIGKILL);
        }
    }
}

impl Drop for ForegroundRun {
    fn drop(&mut self) {
        self.kill_now();
        let id = self.entry.id.clone();
        self.registry.entries().retain(|e| e.id != id);
    }
}
