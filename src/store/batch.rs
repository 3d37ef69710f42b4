//! Group commit: the store thread's loop, which runs queued calls in shared
//! transactions and answers each caller only after its transaction
//! committed.
//!
//! # What it owns
//!
//! * The loop ([`serve`]): take the first queued message, then every job
//!   already waiting behind it (at most [`MAX_BATCH`]), run them in one
//!   `BEGIN IMMEDIATE … COMMIT`, each inside its own `SAVEPOINT` (or, for
//!   a call that writes with one statement, [`Call::one_write`], none:
//!   SQLite undoes a failed statement by itself; nor for a deferred write,
//!   which runs again if another job's failure rolls the batch back), then
//!   answer them all.
//! * The per-call envelope ([`Call`]): runs the caller's closure (catching
//!   a panic), says whether its writes are kept, and later answers the
//!   caller with the closure's result or with why it was not saved.
//! * The counters behind [`StoreStats`].
//!
//! # What it must never do
//!
//! * Never answer a caller whose writes are not committed yet: an `Ok`
//!   reaches a caller only after the `COMMIT` of its batch returned.
//! * Never let one failing call undo another call's work: a failing or
//!   panicking call is rolled back to its own savepoint. (A job without one
//!   that fails after changing rows rolls the batch back: the calls before
//!   it are told, the deferred writes before it run again.)
//! * Never wait for more work once the queue is empty (no added latency for
//!   a lone call): batches form from what queued up while the thread was
//!   busy.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{ffi, Connection};
use tokio::sync::{mpsc, oneshot};

use super::carried::Carried;
pub(super) use super::job::Job;
use super::StoreError;

/// At most this many calls share one transaction (bounds how long a batch
/// holds the write lock and how late its first caller hears back).
pub(super) const MAX_BATCH: usize = 256;

/// A call slower than this is logged at warn level: something is wrong with
/// the disk or a query.
const SLOW_JOB: Duration = Duration::from_secs(1);

/// A commit slower than this is logged at warn level.
const SLOW_COMMIT: Duration = Duration::from_secs(1);

/// The savepoint each call runs in.
const SAVEPOINT: &str = "SAVEPOINT telegate_call";
const RELEASE: &str = "RELEASE telegate_call";
const ROLLBACK_TO: &str = "ROLLBACK TO telegate_call; RELEASE telegate_call";

/// A message to the store thread.
pub(super) enum Msg {
    /// Run this call.
    Job(Box<dyn Job>),
    /// Run the deferred writes waiting on the carried list
    /// ([`super::carried`]); sent when the first one is put on it.
    Flush,
    /// The store has gone quiet (sent by the checkpoint thread): give the
    /// memory it holds for nothing back ([`release_idle_memory`]).
    ReleaseMemory,
    /// Stop accepting work, checkpoint, close, then report.
    Shutdown(oneshot::Sender<Result<(), StoreError>>),
}

/// What a caller receives: the closure's result, or the panic it raised.
pub(super) type Outcome<R> = std::thread::Result<Result<R, StoreError>>;

/// A [`super::Store::call`] on its way through the store thread.
pub(super) struct Call<R, F> {
    work: Option<F>,
    outcome: Option<Outcome<R>>,
    reply: oneshot::Sender<Outcome<R>>,
    savepoint: bool,
}

impl<R, F> Call<R, F> {
    pub(super) fn new(work: F, reply: oneshot::Sender<Outcome<R>>) -> Self {
        Call {
            work: Some(work),
            outcome: None,
            reply,
            savepoint: true,
        }
    }

    /// A call whose work changes the database with at most one statement,
    /// its last fallible step. It runs without a savepoint: a statement
    /// that fails is undone by SQLite itself, so a failing call still
    /// leaves nothing behind. (The savepoint's cost, SQLite copying every
    /// page the call touches, was a quarter of the store thread's time per
    /// turn.) If such a call fails after all with changes made, its batch
    /// is rolled back and reported as not saved (never half a call kept).
    pub(super) fn one_write(work: F, reply: oneshot::Sender<Outcome<R>>) -> Self {
        Call {
            savepoint: false,
            ..Call::new(work, reply)
        }
    }
}

impl<R, F> Job for Call<R, F>
where
    R: Send + 'static,
    F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &mut Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let started = Instant::now();
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| work(conn)));
        let took = started.elapsed();
        if took > SLOW_JOB {
            tracing::warn!(?took, "slow store job");
        }
        let keep = matches!(outcome, Ok(Ok(_)));
        self.outcome = Some(outcome);
        keep
    }

    fn answer(self: Box<Self>, lost: Option<&rusqlite::Error>) {
        let outcome = match (self.outcome, lost) {
            // Its own failure says more than the batch's.
            (Some(Ok(Err(own))), _) => Ok(Err(own)),
            (Some(Err(panic)), _) => Err(panic),
            (Some(Ok(Ok(_))) | None, Some(lost)) => Ok(Err(not_saved(lost))),
            (Some(Ok(Ok(value))), None) => Ok(Ok(value)),
            (None, None) => Ok(Err(StoreError::Closed)),
        };
        // The caller may have given up waiting; that is fine.
        let _ = self.reply.send(outcome);
    }

    fn needs_savepoint(&self) -> bool {
        self.savepoint
    }
}

/// The error a caller gets when its work was rolled back with its batch:
/// the batch's own error, with its SQLite code kept.
fn not_saved(lost: &rusqlite::Error) -> StoreError {
    let code = match lost {
        rusqlite::Error::SqliteFailure(code, _) => *code,
        _ => ffi::Error::new(ffi::SQLITE_ERROR),
    };
    StoreError::Sqlite(rusqlite::Error::SqliteFailure(
        code,
        Some(format!("not saved, the store's transaction failed: {lost}")),
    ))
}

/// Why the calls before a job that ended the shared transaction are lost.
fn ended_by_a_job() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        ffi::Error::new(ffi::SQLITE_ABORT_ROLLBACK),
        Some("a call in the same batch ended the store's transaction".into()),
    )
}

/// Counts kept by the store thread, read by [`super::Store::stats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    calls: AtomicU64,
    carried: AtomicU64,
    commits: AtomicU64,
    busy_ns: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> StoreStats {
        StoreStats {
            calls: self.calls.load(Ordering::Relaxed),
            carried: self.carried.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
        }
    }
}

/// What the store thread has done since it started (see
/// [`super::Store::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Calls run (every typed method that waits for its result is one
    /// call).
    pub calls: u64,
    /// Deferred writes run, carried by batches instead of calls of their
    /// own ([`super::carried`]).
    pub carried: u64,
    /// Transactions committed (one per batch of calls).
    pub commits: u64,
    /// Time the store thread spent running calls and committing (not
    /// waiting for work).
    pub busy: Duration,
}

impl StoreStats {
    /// The difference `self - earlier` (figures over an interval).
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            calls: self.calls.saturating_sub(earlier.calls),
            carried: self.carried.saturating_sub(earlier.carried),
            commits: self.commits.saturating_sub(earlier.commits),
            busy: self.busy.saturating_sub(earlier.busy),
        }
    }
}

/// The store thread's loop: run batches of jobs in order until shut down
/// or until every [`super::Store`] handle is gone, each batch led by the
/// deferred writes waiting on `carried`. Returns the shutdown request's
/// reply channel, if one came.
pub(super) fn serve(
    conn: &mut Connection,
    mut rx: mpsc::Receiver<Msg>,
    carried: &Carried,
    counters: &Arc<Counters>,
) -> Option<oneshot::Sender<Result<(), StoreError>>> {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    loop {
        let mut shutdown = None;
        // Deferred writes left over (more than a batch's worth) go on
        // without waiting for a message.
        let first = if carried.is_empty() {
            rx.blocking_recv()
        } else {
            match rx.try_recv() {
                Ok(msg) => Some(msg),
                Err(mpsc::error::TryRecvError::Empty) => Some(Msg::Flush),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            }
        };
        match first {
            // The writes nobody waited for still go in before closing.
            None => {
                drain_carried(conn, carried, counters);
                return None;
            }
            Some(Msg::Shutdown(reply)) => {
                drain_carried(conn, carried, counters);
                return Some(reply);
            }
            Some(Msg::Job(job)) => batch.push(job),
            Some(Msg::Flush) => {}
            Some(Msg::ReleaseMemory) => {
                release_idle_memory(conn);
                continue;
            }
        }
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(Msg::Job(job)) => batch.push(job),
                // Busy again: nothing to give back.
                Ok(Msg::Flush | Msg::ReleaseMemory) => {}
                Ok(Msg::Shutdown(reply)) => {
                    shutdown = Some(reply);
                    break;
                }
                // Empty, or every handle is gone: the next receive says which.
                Err(_) => break,
            }
        }
        run_carried(conn, carried, std::mem::take(&mut batch), counters);
        if shutdown.is_some() {
            drain_carried(conn, carried, counters);
            // Jobs still queued were sent after the shutdown; dropping them
            // drops their reply channels, which their callers see as
            // `Closed`.
            return shutdown;
        }
    }
}

/// Gives back what a quiet store holds for nothing: SQLite's page cache
/// (up to its 2 MB `cache_size`, filled by the open-time integrity check
/// and by bursts; the next call reads what it needs again) and the heap
/// that freed, which glibc otherwise keeps (its trim threshold is raised,
/// see [`crate::memory::tune_allocator`]).
fn release_idle_memory(conn: &Connection) {
    if let Err(error) = conn.release_memory() {
        tracing::debug!(%error, "store could not release its page cache");
    }
    crate::memory::trim_heap();
}

/// Runs every deferred write still on `carried` (before closing).
fn drain_carried(conn: &mut Connection, carried: &Carried, counters: &Counters) {
    while !carried.is_empty() {
        run_carried(conn, carried, Vec::new(), counters);
    }
}

/// Runs the deferred writes on `carried` (at most [`MAX_BATCH`]), then
/// `calls`, as one batch, counting both and the time taken.
fn run_carried(
    conn: &mut Connection,
    carried: &Carried,
    calls: Vec<Box<dyn Job>>,
    counters: &Counters,
) {
    let deferred = carried.take(MAX_BATCH);
    if deferred.is_empty() && calls.is_empty() {
        return;
    }
    let started = Instant::now();
    counters
        .calls
        .fetch_add(calls.len() as u64, Ordering::Relaxed);
    counters
        .carried
        .fetch_add(deferred.len() as u64, Ordering::Relaxed);
    run_batch(conn, deferred.into_iter().chain(calls), counters);
    let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counters.busy_ns.fetch_add(busy, Ordering::Relaxed);
}

/// Runs `jobs` in as few transactions as possible and answers them all,
/// counting commits (before answering, so a caller sees its own).
fn run_batch(conn: &mut Connection, jobs: impl Iterator<Item = Box<dyn Job>>, counters: &Counters) {
    // At most MAX_BATCH carried writes and MAX_BATCH calls.
    let mut jobs: VecDeque<Box<dyn Job>> = jobs.collect();
    while !jobs.is_empty() {
        if let Err(error) = run_cached(conn, "BEGIN IMMEDIATE") {
            tracing::warn!(%error, "store could not start a shared transaction; committing calls one by one");
            for job in jobs.drain(..) {
                run_alone(conn, job, counters);
            }
            break;
        }
        let mut waiting: Vec<Box<dyn Job>> = Vec::new();
        let mut ended = false;
        while let Some(mut job) = jobs.pop_front() {
            let ran = if job.needs_savepoint() {
                run_in_savepoint(conn, &mut *job)
            } else {
                run_one_write(conn, &mut *job)
            };
            match ran {
                Ran::Kept | Ran::RolledBack => waiting.push(job),
                Ran::Unsaved(error) => job.answer(Some(&error)),
                Ran::EndedTransaction { kept, rolled_back } => {
                    end_early(std::mem::take(&mut waiting), &mut jobs, rolled_back);
                    job.answer(kept.then_some(&ended_by_a_job()));
                    ended = true;
                    break;
                }
            }
        }
        if ended {
            continue;
        }
        let started = Instant::now();
        let committed = run_cached(conn, "COMMIT");
        let took = started.elapsed();
        if took > SLOW_COMMIT {
            tracing::warn!(?took, calls = waiting.len(), "slow store commit");
        }
        if let Err(error) = &committed {
            tracing::warn!(%error, calls = waiting.len(), "store commit failed; the batch's calls are told");
            rollback(conn);
        } else {
            counters.commits.fetch_add(1, Ordering::Relaxed);
        }
        let lost = committed.err();
        for job in waiting {
            job.answer(lost.as_ref());
        }
    }
}

/// A job ended the shared transaction before its batch's `COMMIT`: the
/// jobs that ran before it in that transaction (`earlier`) are told their
/// work was not saved, except that, when the transaction is known to be
/// rolled back (`rolled_back`, not ended by the job's own SQL, which may
/// have committed it), those that can run again are put back in front of
/// `jobs`, in their order, for the next transaction.
fn end_early(earlier: Vec<Box<dyn Job>>, jobs: &mut VecDeque<Box<dyn Job>>, rolled_back: bool) {
    let lost = ended_by_a_job();
    let mut again = Vec::new();
    for job in earlier {
        if rolled_back && job.can_run_again() {
            again.push(job);
        } else {
            job.answer(Some(&lost));
        }
    }
    tracing::warn!(
        running_again = again.len(),
        "a store job ended the shared transaction: the calls that ran before it are reported as not saved"
    );
    for job in again.into_iter().rev() {
        jobs.push_front(job);
    }
}

/// How one job ended inside the shared transaction.
enum Ran {
    /// It succeeded; its savepoint was released into the transaction.
    Kept,
    /// It failed (or panicked); its writes were rolled back.
    RolledBack,
    /// Its savepoint could not be set or released: it is answered at once
    /// with this error, its writes (if any) rolled back.
    Unsaved(rusqlite::Error),
    /// It ended the shared transaction itself (or SQLite did, after an
    /// error that rolls back the transaction, or the loop did, after a job
    /// without a savepoint failed with changes made).
    EndedTransaction {
        /// Whether the job itself reported success.
        kept: bool,
        /// Whether the transaction is known to be rolled back (the loop
        /// rolled it back), not possibly committed by the job's own SQL.
        rolled_back: bool,
    },
}

/// Runs one statement of the loop's own (savepoint, release, begin,
/// commit) from the statement cache: parsed once, not once per call.
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn run_in_savepoint(conn: &mut Connection, job: &mut dyn Job) -> Ran {
    if let Err(error) = run_cached(conn, SAVEPOINT) {
        return Ran::Unsaved(error);
    }
    let keep = job.run(conn);
    if conn.is_autocommit() {
        return Ran::EndedTransaction {
            kept: keep,
            rolled_back: false,
        };
    }
    if !keep {
        if let Err(error) = conn.execute_batch(ROLLBACK_TO) {
            tracing::warn!(%error, "store could not roll back a failed call");
        }
        return Ran::RolledBack;
    }
    match run_cached(conn, RELEASE) {
        Ok(()) => Ran::Kept,
        Err(error) => {
            // E.g. the job released our savepoint itself.
            let _ = conn.execute_batch(ROLLBACK_TO);
            Ran::Unsaved(error)
        }
    }
}

/// Runs a job without a savepoint (a [`Call::one_write`] call or a deferred
/// write). A failed job that changed nothing needs no undo; one that failed
/// after changing rows cannot be undone alone, so the whole transaction is
/// rolled back (the earlier calls of the batch are told their work was not
/// saved, which is true; the earlier deferred writes run again).
fn run_one_write(conn: &mut Connection, job: &mut dyn Job) -> Ran {
    let before = conn.total_changes();
    let keep = job.run(conn);
    if conn.is_autocommit() {
        return Ran::EndedTransaction {
            kept: keep,
            rolled_back: false,
        };
    }
    if keep {
        return Ran::Kept;
    }
    if conn.total_changes() == before {
        return Ran::RolledBack;
    }
    tracing::error!(
        "a store job without a savepoint failed after changing rows; its batch is rolled back"
    );
    rollback(conn);
    Ran::EndedTransaction {
        kept: false,
        rolled_back: true,
    }
}

/// Runs one job in a transaction of its own and answers it (the fallback
/// when no shared transaction can be started).
fn run_alone(conn: &mut Connection, mut job: Box<dyn Job>, counters: &Counters) {
    // Outside a transaction, a savepoint is a (deferred) transaction and
    // releasing it commits.
    if let Err(error) = conn.execute_batch(SAVEPOINT) {
        job.answer(Some(&error));
        return;
    }
    let keep = job.run(conn);
    let (lost, committed) = if conn.is_autocommit() {
        (keep.then(ended_by_a_job), false)
    } else if keep {
        match run_cached(conn, RELEASE) {
            Ok(()) => (None, true),
            Err(error) => (Some(error), false),
        }
    } else {
        let _ = conn.execute_batch(ROLLBACK_TO);
        (None, false)
    };
    rollback(conn);
    if committed {
        counters.commits.fetch_add(1, Ordering::Relaxed);
    }
    job.answer(lost.as_ref());
}

/// Ends a transaction left open (after a failed commit).
fn rollback(conn: &mut Connection) {
    if !conn.is_autocommit() {
        if let Err(error) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(%error, "store rollback failed");
        }
    }
}

#[cfg(test)]
pub(in crate::store) mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::mpsc as std_mpsc;

    use futures::poll;

    use super::super::Store;
    use super::*;

    /// Occupies the store thread until the returned sender is used (or
    /// dropped), so that calls made meanwhile queue up and share the next
    /// batch.
    pub(in crate::store) async fn hold(
        store: &Store,
    ) -> (std_mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
        let (entered_tx, entered_rx) = std_mpsc::channel::<()>();
        let (release_tx, release_rx) = std_mpsc::channel::<()>();
        let s = store.clone();
        let held = tokio::spawn(async move {
            s.call(move |_| {
                let _ = entered_tx.send(());
                let _ = release_rx.recv();
                Ok(())
            })
            .await
            .expect("the holding call");
        });
        tokio::task::spawn_blocking(move || entered_rx.recv())
            .await
            .expect("join")
            .expect("the store thread runs the holding call");
        (release_tx, held)
    }

    pub(in crate::store) type Pending<T> =
        Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

    /// Sends `f` to the store now (first poll), without waiting for it.
    pub(in crate::store) async fn queue<T: Send + 'static>(
        store: &Store,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Pending<T> {
        let s = store.clone();
        let mut call: Pending<T> = Box::pin(async move { s.call(f).await });
        assert!(poll!(&mut call).is_pending(), "queued, not run yet");
        call
    }

    /// [`queue`] through [`Store::call_one_write`].
    async fn queue_one_write<T: Send + 'static>(
        store: &Store,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Pending<T> {
        let s = store.clone();
        let mut call: Pending<T> = Box::pin(async move { s.call_one_write(f).await });
        assert!(poll!(&mut call).is_pending(), "queued, not run yet");
        call
    }

    #[tokio::test]
    async fn a_failing_one_write_call_leaves_nothing_and_undoes_no_other_call() {
        let store = store_with_table().await;
        let (release, held) = hold(&store).await;
        let a = queue(&store, insert(1)).await;
        // Its one statement inserts 5, then fails on the duplicate 1: SQLite
        // undoes the statement, nothing else is touched.
        let b = queue_one_write(&store, |c| {
            c.execute("INSERT INTO t (n) VALUES (5), (1)", [])?;
            Ok(())
        })
        .await;
        let c = queue_one_write(&store, insert(2)).await;
        release.send(()).expect("release");
        held.await.expect("held");
        assert!(a.await.is_ok(), "an earlier call keeps its work");
        assert!(b.await.is_err());
        assert!(c.await.is_ok());
        assert_eq!(rows(&store).await, [1, 2]);
    }

    #[tokio::test]
    async fn a_one_write_call_failing_after_its_write_rolls_its_batch_back() {
        // Breaking the promise (a write, then a failure) must not keep half
        // a call: the batch is rolled back and its callers told so.
        let store = store_with_table().await;
        let (release, held) = hold(&store).await;
        let a = queue(&store, insert(1)).await;
        let b = queue_one_write(&store, |c| -> Result<(), StoreError> {
            insert(2)(c)?;
            Err(StoreError::NoSuchSession { key: "b".into() })
        })
        .await;
        let c = queue(&store, insert(3)).await;
        release.send(()).expect("release");
        held.await.expect("held");
        let a = a.await;
        assert!(
            matches!(&a, Err(StoreError::Sqlite(_))),
            "the earlier call is told it was not saved: {a:?}"
        );
        assert!(matches!(b.await, Err(StoreError::NoSuchSession { .. })));
        assert!(c.await.is_ok(), "a later call runs in a new transaction");
        assert_eq!(rows(&store).await, [3]);
    }

    fn insert(n: i64) -> impl FnOnce(&mut Connection) -> Result<(), StoreError> + Send {
        move |c| {
            c.execute("INSERT INTO t (n) VALUES (?1)", [n])?;
            Ok(())
        }
    }

    async fn rows(store: &Store) -> Vec<i64> {
        store
            .call(|c| {
                let mut s = c.prepare("SELECT n FROM t ORDER BY n")?;
                let rows = s.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .expect("rows")
    }

    async fn store_with_table() -> Store {
        let store = Store::open_in_memory().expect("store");
        store
            .call(|c| Ok(c.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)")?))
            .await
            .expect("table");
        store
    }

    #[tokio::test]
    async fn calls_queued_together_share_one_commit_and_a_failing_one_undoes_only_itself() {
        let store = store_with_table().await;
        let (release, held) = hold(&store).await;
        let before = store.stats();
        let a = queue(&store, insert(1)).await;
        let b = queue(&store, |c| -> Result<(), StoreError> {
            insert(2)(c)?;
            Err(StoreError::NoSuchSession { key: "b".into() })
        })
        .await;
        let c = queue(&store, |c| -> Result<(), StoreError> {
            insert(3)(c)?;
            panic!("a deliberate panic in a batched call");
        })
        .await;
        let d = queue(&store, insert(4)).await;
        let dup = queue(&store, insert(1)).await;
        release.send(()).expect("release");
        held.await.expect("held");
        assert!(a.await.is_ok());
        assert!(matches!(b.await, Err(StoreError::NoSuchSession { .. })));
        let panicked = tokio::spawn(c).await;
        assert!(panicked
            .expect_err("the panic reaches the caller")
            .is_panic());
        assert!(d.await.is_ok());
        assert!(
            matches!(dup.await, Err(StoreError::Sqlite(_))),
            "a constraint error is the call's own"
        );
        let after = store.stats().since(&before);
        // The five queued calls (the held one was counted when its batch
        // started); two commits: the held call's batch and one for all five.
        assert_eq!(after.calls, 5, "{after:?}");
        assert_eq!(after.commits, 2, "{after:?}");
        assert_eq!(rows(&store).await, vec![1, 4]);
    }

    #[tokio::test]
    async fn no_caller_hears_of_its_write_before_the_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g.db");
        let store = Store::open_async(&path).await.expect("store");
        store
            .call(|c| Ok(c.execute_batch("CREATE TABLE t (n INTEGER PRIMARY KEY)")?))
            .await
            .expect("table");
        let (release, held) = hold(&store).await;
        let mut written = queue(&store, insert(7)).await;
        // A call behind it in the same batch that blocks: the batch cannot
        // commit until it returns.
        let (entered_tx, entered_rx) = std_mpsc::channel::<()>();
        let (finish_tx, finish_rx) = std_mpsc::channel::<()>();
        let blocker = queue(&store, move |_| {
            let _ = entered_tx.send(());
            let _ = finish_rx.recv();
            Ok(())
        })
        .await;
        release.send(()).expect("release");
        held.await.expect("held");
        tokio::task::spawn_blocking(move || entered_rx.recv())
            .await
            .expect("join")
            .expect("the blocker runs");
        // The insert has run, but its batch has not committed.
        assert!(poll!(&mut written).is_pending(), "answered before commit");
        let other = Connection::open(&path).expect("a second connection");
        let seen = |c: &Connection| -> i64 {
            c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .expect("count")
        };
        assert_eq!(seen(&other), 0, "not committed yet");
        finish_tx.send(()).expect("finish");
        blocker.await.expect("blocker");
        written
            .await
            .expect("the insert is answered after the commit");
        assert_eq!(seen(&other), 1, "committed when answered");
        store.close().await.expect("close");
    }

    #[tokio::test]
    async fn a_failed_commit_fails_every_call_of_its_batch() {
        let store = store_with_table().await;
        store
            .call(|c| {
                Ok(c.execute_batch(
                    "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                     CREATE TABLE child (parent INTEGER REFERENCES parent(id)
                         DEFERRABLE INITIALLY DEFERRED);",
                )?)
            })
            .await
            .expect("tables");
        let (release, held) = hold(&store).await;
        let a = queue(&store, insert(1)).await;
        // Fine on its own terms; the deferred foreign key fails the COMMIT.
        let orphan = queue(&store, |c| {
            c.execute("INSERT INTO child (parent) VALUES (99)", [])?;
            Ok(())
        })
        .await;
        release.send(()).expect("release");
        held.await.expect("held");
        for result in [a.await, orphan.await] {
            let error = result.expect_err("the batch did not commit");
            assert!(
                error.to_string().contains("not saved")
                    && error.to_string().contains("FOREIGN KEY"),
                "{error}"
            );
        }
        assert!(rows(&store).await.is_empty());
        // The store goes on.
        store.call(insert(2)).await.expect("next call");
        assert_eq!(rows(&store).await, vec![2]);
    }

    #[tokio::test]
    async fn a_call_that_ends_the_transaction_costs_the_calls_before_it_not_after() {
        let store = store_with_table().await;
        let (release, held) = hold(&store).await;
        let before = queue(&store, insert(1)).await;
        let rollback = queue(&store, |c| Ok(c.execute_batch("ROLLBACK")?)).await;
        let begin = queue(&store, |c| Ok(c.execute_batch("BEGIN")?)).await;
        let after = queue(&store, insert(2)).await;
        release.send(()).expect("release");
        held.await.expect("held");
        let error = before.await.expect_err("rolled back by a later call");
        assert!(error.to_string().contains("not saved"), "{error}");
        assert!(rollback.await.is_err(), "ending the transaction is refused");
        assert!(begin.await.is_err(), "no transaction inside the batch");
        after.await.expect("a later call runs in a new transaction");
        assert_eq!(rows(&store).await, vec![2]);
    }

    #[test]
    fn stats_subtract() {
        let later = StoreStats {
            calls: 10,
            carried: 7,
            commits: 3,
            busy: Duration::from_millis(5),
        };
        let earlier = StoreStats {
            calls: 4,
            carried: 2,
            commits: 1,
            busy: Duration::from_millis(2),
        };
        assert_eq!(
            later.since(&earlier),
            StoreStats {
                calls: 6,
                carried: 5,
                commits: 2,
                busy: Duration::from_millis(3)
            }
        );
    }
}
