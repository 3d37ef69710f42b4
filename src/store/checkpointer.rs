//! WAL checkpoints on a thread of their own, off the store thread.
//!
//! In WAL mode every commit appends pages to the `-wal` file, and a
//! checkpoint copies them back into the database file (with an fsync).
//! SQLite runs one automatically inside whichever commit crosses 1,000 WAL
//! pages, on the committing connection: the store thread, which then holds
//! every caller of that batch while it copies and syncs (about a tenth of
//! its time in the pipeline bench). Here the store's connection checkpoints
//! by itself only past `connection::WAL_CATCH_UP_BYTES` (see below), and
//! this thread, with a connection of its
//! own, runs a `PASSIVE` checkpoint every [`EVERY`] (backing off to
//! [`IDLE_EVERY`] while the WAL does not change). A passive checkpoint
//! never takes the write lock, so commits go on meanwhile; the writer
//! starts the WAL over once everything in it has been copied, and that
//! commit cuts the file back to the store's `journal_size_limit`
//! (`connection::WAL_SIZE_LIMIT`), so a burst does not keep its disk.
//! SQLite starts the WAL over only when a write transaction begins with
//! every frame copied, which a store thread that never pauses (a
//! sustained overload of thousands of updates a second, as the pipeline
//! bench drives it) never gives this thread: the frames written while it
//! copies are always left. A `RESTART` checkpoint from here rarely wins
//! the write lock from such a writer, and stalls it when it does. So the
//! store's own automatic checkpoint stays on with a high threshold: past
//! `WAL_CATCH_UP_BYTES` of WAL, the commit copies what this thread has not
//! yet (between its own writes, so all of it), and the next write starts
//! the WAL over. The WAL's disk is bounded under any load.
//!
//! The same tick tells when the store has gone quiet: a checkpoint that
//! finds the WAL as the previous one left it means no commit for at least
//! [`EVERY`]. Then, once per quiet spell, it calls the store's `on_idle`
//! (which asks the store thread to give its page cache back, see
//! `batch::release_idle_memory`): an idle bot should not hold the pages a
//! burst or the open-time integrity check read.
//!
//! This module owns the thread and its connection. It must never write a
//! row, and it stops (closing its connection) before the store's own final
//! checkpoint, so the last connection to close removes the WAL as before.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// Between checkpoints while the WAL grows.
const EVERY: Duration = Duration::from_millis(500);
/// Between checkpoints once one found nothing to copy.
const IDLE_EVERY: Duration = Duration::from_secs(2);
/// Pages of cache for this connection: a checkpoint copies frames from
/// the WAL to the file directly, it needs next to none.
const CACHE_PAGES: i64 = 16;

/// Called once each time the store goes quiet (see the module docs). It
/// runs on the checkpoint thread, so it must not block: it only queues a
/// message.
pub(super) type OnIdle = Box<dyn Fn() + Send>;

/// The running checkpointer; [`Checkpointer::stop`] ends it.
pub(super) struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Opens a second connection to `path` and starts the thread. `None`
    /// (logged) if that fails: the store then keeps SQLite's automatic
    /// checkpoints.
    pub(super) fn start(path: &Path, on_idle: OnIdle) -> Option<Checkpointer> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match Connection::open_with_flags(path, flags).and_then(|conn| {
            conn.pragma_update(None, "cache_size", CACHE_PAGES)?;
            conn.pragma_update(None, "wal_autocheckpoint", 0)?;
            Ok(conn)
        }) {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "no checkpoint thread; the store checkpoints as it commits");
                return None;
            }
        };
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop_in = stop.clone();
        let thread = std::thread::Builder::new()
            .name("telegate-ckpt".into())
            .spawn(move || run(conn, &stop_in, &on_idle));
        match thread {
            Ok(thread) => Some(Checkpointer { stop, thread }),
            Err(error) => {
                tracing::warn!(%error, "no checkpoint thread; the store checkpoints as it commits");
                None
            }
        }
    }

    /// Stops the thread and waits until its connection is closed.
    pub(super) fn stop(self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        wake.notify_all();
        if self.thread.join().is_err() {
            tracing::warn!("the checkpoint thread panicked");
        }
    }
}

fn run(conn: Connection, stop: &(Mutex<bool>, Condvar), on_idle: &OnIdle) {
    let (stopped, wake) = stop;
    let mut wait = EVERY;
    // The WAL's size at the last checkpoint: unchanged means nothing new.
    let mut last_frames = None;
    // Whether this quiet spell was already reported.
    let mut told_idle = false;
    loop {
        {
            let guard = stopped.lock().unwrap_or_else(PoisonError::into_inner);
            let (guard, _) = wake
                .wait_timeout_while(guard, wait, |stopped| !*stopped)
                .unwrap_or_else(PoisonError::into_inner);
            if *guard {
                break;
            }
        }
        wait = match checkpoint(&conn) {
            Ok(frames) if last_frames == Some(frames) => {
                if !told_idle {
                    told_idle = true;
                    on_idle();
                }
                IDLE_EVERY
            }
            Ok(frames) => {
                last_frames = Some(frames);
                told_idle = false;
                EVERY
            }
            Err(error) => {
                tracing::debug!(%error, "checkpoint failed; trying again later");
                EVERY
            }
        };
    }
    if let Err((_, error)) = conn.close() {
        tracing::debug!(%error, "checkpoint connection did not close cleanly");
    }
}

/// A passive checkpoint; how many frames the WAL holds (copied or not).
fn checkpoint(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| row.get(1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::connection::{WAL_CATCH_UP_BYTES, WAL_SIZE_LIMIT};
    use crate::store::{Store, TranscriptEntry};

    #[tokio::test]
    async fn the_wal_is_copied_into_the_file_without_a_store_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = Store::open_async(&path).await.unwrap();
        let autocheckpoint: i64 = store
            .call(|c| Ok(c.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(
            autocheckpoint,
            WAL_CATCH_UP_BYTES / 4096,
            "the store's own commits checkpoint only a WAL past the catch-up size"
        );
        let before = std::fs::metadata(&path).unwrap().len();
        let text = "x".repeat(2_000);
        for _ in 0..5 {
            let entries = (0..100)
                .map(|_| TranscriptEntry::user(text.clone()))
                .collect();
            store.transcripts().append_many("s", entries).await.unwrap();
        }
        // About 1 MB written to the WAL: the checkpoint thread copies it.
        let mut size = before;
        for _ in 0..100 {
            size = std::fs::metadata(&path).unwrap().len();
            if size > before + 500_000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(size > before + 500_000, "file {before} -> {size} bytes");
        store.close().await.unwrap();
        assert!(
            !dir.path().join("t.db-wal").exists(),
            "the WAL is removed at close"
        );
    }

    #[tokio::test]
    async fn the_wal_of_a_burst_is_cut_back_once_it_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_async(dir.path().join("t.db")).await.unwrap();
        let wal = dir.path().join("t.db-wal");
        let limit = u64::try_from(WAL_SIZE_LIMIT).unwrap();
        // One call of about 24 MB: one transaction, a WAL past the limit.
        let text = "x".repeat(8_000);
        let entries: Vec<TranscriptEntry> = (0..3_000)
            .map(|_| TranscriptEntry::user(text.clone()))
            .collect();
        store.transcripts().append_many("s", entries).await.unwrap();
        let burst = std::fs::metadata(&wal).unwrap().len();
        assert!(burst > limit, "the burst's WAL: {burst} bytes");
        // Once the checkpoint thread has copied all of it, the next commit
        // starts the WAL over and cuts its file back.
        let mut size = burst;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store
                .transcripts()
                .append_many("s", vec![TranscriptEntry::user("y")])
                .await
                .unwrap();
            size = std::fs::metadata(&wal).unwrap().len();
            if size <= limit {
                break;
            }
        }
        assert!(size <= limit, "WAL {burst} -> {size} bytes");
        let history = store.transcripts().load_history("s", None).await.unwrap();
        assert!(history.len() > 3_000, "{} rows", history.len());
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_writer_that_never_pauses_keeps_its_wal_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_async(dir.path().join("t.db")).await.unwrap();
        let wal = dir.path().join("t.db-wal");
        let catch_up = u64::try_from(WAL_CATCH_UP_BYTES).unwrap();
        // Four writers, each call about 400 KB: the store thread always has
        // the next call waiting, so the checkpoint thread never sees the
        // WAL with every frame copied.
        let text = "x".repeat(4_000);
        let calls_each = usize::try_from(4 * catch_up / 400_000 / 4).unwrap();
        let (sizes_tx, mut sizes) = tokio::sync::mpsc::unbounded_channel();
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (store, text, sizes) = (store.clone(), text.clone(), sizes_tx.clone());
                let wal = wal.clone();
                tokio::spawn(async move {
                    for _ in 0..calls_each {
                        let entries = (0..100)
                            .map(|_| TranscriptEntry::user(text.clone()))
                            .collect();
                        store
                            .transcripts()
                            .append_many(&format!("s{w}"), entries)
                            .await
                            .unwrap();
                        let _ = sizes.send(std::fs::metadata(&wal).map_or(0, |m| m.len()));
                    }
                })
            })
            .collect();
        drop(sizes_tx);
        for writer in writers {
            writer.await.unwrap();
        }
        let mut largest = 0;
        while let Some(size) = sizes.recv().await {
            largest = largest.max(size);
        }
        // Four times the catch-up size written; the WAL stops at about it
        // (over by what is written while the checkpoint thread's own
        // checkpoint holds the store's off: well under as much again).
        assert!(
            largest <= 2 * catch_up,
            "WAL reached {largest} bytes (catch-up at {catch_up})"
        );
        let rows: i64 = store
            .call(|c| Ok(c.query_row("SELECT count(*) FROM transcripts", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(rows, i64::try_from(4 * calls_each * 100).unwrap());
        store.close().await.unwrap();
    }

    /// Bytes of page cache the store's connection holds.
    async fn cache_used(store: &Store) -> i32 {
        store
            .call(|c| {
                let (mut used, mut highest) = (0, 0);
                // SAFETY: the handle is the live connection this closure
                // was lent; both out-pointers are valid.
                let rc = unsafe {
                    rusqlite::ffi::sqlite3_db_status(
                        c.handle(),
                        rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
                        &mut used,
                        &mut highest,
                        0,
                    )
                };
                assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
                Ok(used)
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_quiet_store_gives_its_page_cache_back_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_async(dir.path().join("t.db")).await.unwrap();
        let text = "x".repeat(2_000);
        for _ in 0..3 {
            let entries = (0..100)
                .map(|_| TranscriptEntry::user(text.clone()))
                .collect();
            store.transcripts().append_many("s", entries).await.unwrap();
        }
        let busy = cache_used(&store).await;
        assert!(busy > 500_000, "a burst fills the cache: {busy} bytes");
        // Reads keep the store quiet (they add nothing to the WAL): the
        // checkpoint thread sees it within two of its ticks.
        let mut idle = busy;
        for _ in 0..100 {
            idle = cache_used(&store).await;
            if idle < busy / 10 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(idle < busy / 10, "page cache {busy} -> {idle} bytes");
        let history = store.transcripts().load_history("s", None).await.unwrap();
        assert_eq!(history.len(), 300);
        store.close().await.unwrap();
    }
}
