//! WAL checkpoints on a thread of their own, off the store thread.
//!
//! SQLite's automatic checkpoint runs inside the commit that makes the WAL
//! pass 1,000 pages: on the store thread, with every caller of that batch
//! (and everyone queued behind it) waiting while it copies pages into the
//! database file and syncs it. The store's connection therefore has the
//! automatic checkpoint off, and this thread, with a connection of its own,
//! runs a `PASSIVE` checkpoint once the WAL has grown past
//! [`WAL_PAGES`] pages, nudged by the store thread every
//! [`COMMITS_PER_NUDGE`] commits. A passive checkpoint takes no lock a
//! writer needs: commits go on while it copies.
//!
//! # What it must never do
//!
//! * Never write anything but the checkpoint: durability is the commit's
//!   (a checkpoint only moves committed pages into the main file).
//! * Never make the store thread wait: a nudge is a non-blocking send, and
//!   a nudge while a checkpoint runs is dropped (the next one comes).
//! * Never outlive the store thread: it is stopped (and joined) before the
//!   store's final `TRUNCATE` checkpoint and close.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

/// The WAL size (in pages) past which a checkpoint runs: SQLite's own
/// automatic threshold.
pub(super) const WAL_PAGES: u64 = 1000;

/// Commits between two nudges: a commit appends a few pages, so the WAL is
/// looked at long before it passes [`WAL_PAGES`] by much.
pub(super) const COMMITS_PER_NUDGE: u64 = 16;

/// How long the checkpointer's connection waits for a lock (it only reads
/// the WAL index; a passive checkpoint never waits for writers anyway).
const BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// The checkpointing thread, from the store thread's side.
pub(super) struct Checkpointer {
    nudge: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    commits_since_nudge: u64,
}

impl Checkpointer {
    /// A checkpointer for the database at `path`, with a connection of its
    /// own; `None` if that cannot be opened (the store then keeps SQLite's
    /// automatic checkpoint).
    pub(super) fn start(path: &Path) -> Option<Checkpointer> {
        let conn = match open(path) {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "store: no checkpoint thread; checkpoints run on the store thread");
                return None;
            }
        };
        let (nudge, nudged) = sync_channel(1);
        let wal = wal_path(path);
        let thread = std::thread::Builder::new()
            .name("telegate-ckpt".into())
            .spawn(move || run(&conn, &wal, &nudged))
            .map_err(|error| tracing::warn!(%error, "store: no checkpoint thread"))
            .ok()?;
        Some(Checkpointer {
            nudge: Some(nudge),
            thread: Some(thread),
            commits_since_nudge: 0,
        })
    }

    /// The store thread committed `commits` transactions.
    pub(super) fn committed(&mut self, commits: u64) {
        self.commits_since_nudge += commits;
        if self.commits_since_nudge < COMMITS_PER_NUDGE {
            return;
        }
        self.commits_since_nudge = 0;
        if let Some(nudge) = &self.nudge {
            match nudge.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => self.nudge = None,
            }
        }
    }

    /// Stops the thread and waits for it (a checkpoint under way ends
    /// first).
    pub(super) fn stop(mut self) {
        self.nudge = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

fn wal_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// The thread: on each nudge, checkpoint if the WAL is past the threshold.
fn run(conn: &Connection, wal: &Path, nudged: &Receiver<()>) {
    let page_size = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
        .map_or(4096, |n| u64::try_from(n).unwrap_or(4096));
    while nudged.recv().is_ok() {
        let bytes = std::fs::metadata(wal).map_or(0, |m| m.len());
        if bytes < WAL_PAGES * page_size {
            continue;
        }
        // (busy, WAL frames, frames checkpointed); a busy answer only means
        // another checkpoint ran: the next nudge tries again.
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        }) {
            Ok((busy, frames, done)) => {
                tracing::trace!(busy, frames, done, "store checkpoint");
            }
            Err(error) => {
                tracing::debug!(%error, "store checkpoint failed; the next nudge tries again")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Checkpointer, WAL_PAGES};
    use crate::store::{Store, TranscriptEntry};

    /// The store's connection checkpoints no more: without the thread, the
    /// WAL would grow without bound; with it, it stays near the threshold.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_stays_bounded_with_checkpoints_off_the_store_thread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telegate.db");
        let store = Store::open_async(&path).await.unwrap();
        let text = "x".repeat(2000);
        for i in 0..6000 {
            store
                .append(&format!("s{}", i % 7), TranscriptEntry::user(text.clone()))
                .await
                .unwrap();
        }
        let wal = std::fs::metadata(super::wal_path(&path)).unwrap().len();
        let page_size = 4096;
        // 6,000 commits of a page or more each: far past the threshold
        // unless something checkpointed.
        assert!(wal < 4 * WAL_PAGES * page_size, "WAL of {wal} bytes");
        store.close().await.unwrap();
    }

    #[test]
    fn a_checkpointer_stops_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        let mut ckpt = Checkpointer::start(&path).unwrap();
        ckpt.committed(1000);
        ckpt.stop();
    }
}
