//! A turn's partial output and liveness.
//!
//! Agents push text deltas and "still working" pings into [`Progress`]; the
//! stall watchdog reads how long ago the last one came, and the streaming
//! editor reads the latest text when it is ready to edit. Readers never see a
//! queue of intermediate states, only the newest one: latest text wins.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Why a turn ended without an answer, as the chat is told (the partial
/// preview keeps its text and gets this marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnEnd {
    /// /stop, /new or /reset.
    Stopped,
    /// A newer message interrupted it (busy mode `interrupt`).
    Interrupted,
}

impl TurnEnd {
    /// The marker appended to the turn's preview.
    pub fn marker(self) -> &'static str {
        match self {
            TurnEnd::Stopped => "⏹ stopped",
            TurnEnd::Interrupted => "⚡ interrupted",
        }
    }
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    /// Milliseconds since `started` at the last sign of life.
    last_ms: AtomicU64,
    text: Mutex<String>,
    version: watch::Sender<u64>,
    /// Set once when the turn is stopped or interrupted, with a token that
    /// fires once whatever must reach the chat first (the command's reply)
    /// is out.
    ended: Mutex<Option<(TurnEnd, CancellationToken)>>,
    /// Fires when `ended` is set.
    ending: CancellationToken,
}

/// The writer side, handed to the agent inside its turn request.
#[derive(Clone, Debug)]
pub struct Progress {
    shared: Arc<Shared>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

impl Progress {
    /// A fresh progress record starting now.
    pub fn new() -> Self {
        let (version, _) = watch::channel(0);
        Progress {
            shared: Arc::new(Shared {
                started: Instant::now(),
                last_ms: AtomicU64::new(0),
                text: Mutex::new(String::new()),
                version,
                ended: Mutex::new(None),
                ending: CancellationToken::new(),
            }),
        }
    }

    fn mark_alive(&self) {
        let ms = self.shared.started.elapsed().as_millis() as u64;
        self.shared.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Append streamed text.
    pub fn push_text(&self, delta: &str) {
        self.mark_alive();
        if delta.is_empty() {
            return;
        }
        self.shared
            .text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_str(delta);
        self.shared.version.send_modify(|v| *v += 1);
    }

    /// Replace the streamed text (a backend that re-renders, or a new tool
    /// round starting over).
    pub fn set_text(&self, text: &str) {
        self.mark_alive();
        {
            let mut current = self
                .shared
                .text
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *current == text {
                return;
            }
            current.clear();
            current.push_str(text);
        }
        self.shared.version.send_modify(|v| *v += 1);
    }

    /// Signal that the turn is alive without new text (a tool is running).
    pub fn still_working(&self) {
        self.mark_alive();
    }

    /// How long ago the last sign of life was.
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.shared.last_ms.load(Ordering::Relaxed));
        self.shared.started.elapsed().saturating_sub(last)
    }

    /// The text streamed so far.
    pub fn snapshot(&self) -> String {
        self.shared
            .text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Record that the turn ends without an answer, for `why`; the preview
    /// gets its marker once `after` fires. The first call wins.
    pub fn mark_ended(&self, why: TurnEnd, after: CancellationToken) {
        let mut ended = self
            .shared
            .ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if ended.is_none() {
            *ended = Some((why, after));
            self.shared.ending.cancel();
        }
    }

    /// A reader for the streaming editor.
    pub fn watch(&self) -> ProgressWatch {
        ProgressWatch {
            shared: self.shared.clone(),
            rx: self.shared.version.subscribe(),
        }
    }
}

/// The reader side: wait for a change, then take the newest text.
#[derive(Clone, Debug)]
pub struct ProgressWatch {
    shared: Arc<Shared>,
    rx: watch::Receiver<u64>,
}

impl ProgressWatch {
    /// Fires when the turn is marked as ended without an answer.
    pub fn ending(&self) -> CancellationToken {
        self.shared.ending.clone()
    }

    /// Why the turn ended without an answer, if it did, and the token that
    /// fires when its marker may be shown.
    pub fn ended(&self) -> Option<(TurnEnd, CancellationToken)> {
        self.shared
            .ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Wait until the text changed since the last [`ProgressWatch::latest`].
    /// Returns `false` once the writer side is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// The newest text, marking it as seen.
    pub fn latest(&mut self) -> String {
        self.rx.borrow_and_update();
        self.shared
            .text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_see_only_the_latest_text() {
        let p = Progress::new();
        let mut w = p.watch();
        p.push_text("a");
        p.push_text("b");
        p.set_text("xyz");
        assert!(w.changed().await);
        assert_eq!(w.latest(), "xyz");
        p.set_text("xyz"); // unchanged: no new version
        assert!(!w.rx.has_changed().unwrap());
    }
}
