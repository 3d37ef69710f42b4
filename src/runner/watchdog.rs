//! The stall watchdog: a turn that shows no sign of life for `stall_timeout`
//! is cancelled, so a hung backend can never keep a chat busy forever.
//!
//! "Sign of life" is anything the agent reports through its
//! [`Progress`](crate::vocab::Progress): text, or a bare "still working" ping
//! from a long tool call. The watchdog is a wrapper around the turn's future,
//! not a global scanner: no extra task, no shared state.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::vocab::Progress;

/// How a watched future ended.
#[derive(Debug)]
pub enum Watched<T> {
    /// It finished on its own.
    Finished(T),
    /// It showed no progress for the stall timeout and was cancelled.
    Stalled,
}

/// Run `future`, cancelling `cancel` and giving up on it if `progress` shows
/// no sign of life for `stall_timeout`. A zero timeout disables the watchdog.
pub async fn watch_for_stall<F: Future>(
    future: F,
    progress: &Progress,
    cancel: &CancellationToken,
    stall_timeout: Duration,
) -> Watched<F::Output> {
    if stall_timeout.is_zero() {
        return Watched::Finished(future.await);
    }
    tokio::pin!(future);
    loop {
        let remaining = stall_timeout.saturating_sub(progress.idle_for());
        if remaining.is_zero() {
            cancel.cancel();
            return Watched::Stalled;
        }
        tokio::select! {
            output = &mut future => return Watched::Finished(output),
            _ = tokio::time::sleep(remaining) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_future_is_cancelled_and_a_chatty_one_is_not() {
        let progress = Progress::new();
        let cancel = CancellationToken::new();
        let silent = std::future::pending::<()>();
        let out = watch_for_stall(silent, &progress, &cancel, Duration::from_secs(5)).await;
        assert!(matches!(out, Watched::Stalled));
        assert!(cancel.is_cancelled());

        let progress = Progress::new();
        let cancel = CancellationToken::new();
        let p = progress.clone();
        let chatty = async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                p.still_working();
            }
            7
        };
        let out = watch_for_stall(chatty, &progress, &cancel, Duration::from_secs(5)).await;
        assert!(matches!(out, Watched::Finished(7)));
        assert!(!cancel.is_cancelled());
    }
}
