//! Writes whose caller does not wait: carried by the store thread's next
//! batch instead of making a call of their own.
//!
//! A call costs more than its SQL: a message to the store thread, a
//! savepoint, a oneshot answer and the wake-up of the task awaiting it. A
//! turn made four of them (history, the answer's transcript, the send
//! intent, the reply record); the pipeline bench showed the store thread
//! 90% busy, much of it in that overhead. Two of those writes have no
//! reader waiting for them: the answer's transcript (the next turn reads it
//! through the store, after it) and the reply record once the answer is
//! out (recovery reads it at the next start). [`super::Link::defer`] puts
//! such a write on a shared list; the store thread runs the whole list at
//! the start of its next batch, in the batch's transaction, before the
//! calls of that batch. So:
//!
//! * **Order is kept for whoever waits.** A call sent after `defer`
//!   returned runs after the deferred write (same batch or a later one):
//!   the send intent that follows a turn's deferred transcript commits with
//!   it or after it, and the next turn's history read sees it.
//! * **Nothing waits for a carrier.** The first write put on an empty list
//!   also sends a wake-up message ([`super::batch::Msg::Flush`]), so a lone
//!   deferred write is committed as soon as the thread is free; under load
//!   the list is carried by calls already queued and no message is sent.
//! * **Failures are reported where calls report them:** the write health
//!   of its kinds (`/healthz`) and the log (the caller, who did not wait,
//!   only logged a failure before too). A panic is caught and logged.
//! * **Shutdown runs what is on the list** before the store closes.
//! * **No savepoint, yet nothing half kept.** A deferred write runs without
//!   one, however many statements it has (SQLite copying every page such a
//!   write touched into the savepoint's journal was a fifth of the store
//!   thread's time per turn). One that fails after changing rows has its
//!   batch rolled back; the deferred writes that ran before it in that
//!   batch run again in the next transaction (their closures are `Fn` over
//!   what they own), so only the failing one is lost, as with a savepoint.
//!   They are not run again after a call whose own SQL ended the
//!   transaction: that may have committed them.
//!
//! This module owns the list and the deferred job. It must never hold its
//! lock while a job runs, and never be used for a write someone waits
//! for, or one whose failure the caller must act on.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rusqlite::Connection;

use super::job::Job;
use super::write_health::{changed_by, WriteHealth, WriteKind};
use super::StoreError;

/// The writes waiting for the store thread's next batch.
#[derive(Default)]
pub(super) struct Carried {
    jobs: Mutex<Vec<Box<dyn Job>>>,
}

impl Carried {
    /// Adds `job`; true if the list was empty (the store thread must be
    /// woken: no batch may be coming to carry it).
    pub(super) fn push(&self, job: Box<dyn Job>) -> bool {
        let mut jobs = self.lock();
        jobs.push(job);
        jobs.len() == 1
    }

    /// Takes the oldest writes on the list, at most `most` of them.
    pub(super) fn take(&self, most: usize) -> Vec<Box<dyn Job>> {
        let mut jobs = self.lock();
        if jobs.len() <= most {
            return std::mem::take(&mut *jobs);
        }
        jobs.drain(..most).collect()
    }

    /// Whether no write is waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Box<dyn Job>>> {
        // A list of boxed jobs: a poisoned lock is still consistent.
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One deferred write: runs like a call, then reports to the write health
/// and the log instead of to a caller. It takes no savepoint, however many
/// statements it runs (SQLite's copy of every page it touches was a fifth
/// of the store thread's time per turn): when it fails after changing rows,
/// the batch loop rolls the whole batch back, and runs again, in a new
/// transaction, the deferred writes that ran before it ([`Job::can_run_again`]).
pub(super) struct Deferred<F> {
    /// The work: it may run more than once (see above).
    work: F,
    /// What it writes (success is reported under each).
    kinds: &'static [WriteKind],
    /// Which kind's statement failed, if the work says (a failure is
    /// reported under that kind alone, else under all of `kinds`).
    failed: Arc<OnceLock<WriteKind>>,
    /// For the log: what could not be recorded.
    what: &'static str,
    health: WriteHealth,
    /// Whether it changed a row, or why it failed (its last run).
    outcome: Option<Result<bool, Failure>>,
}

/// Why a deferred write failed.
struct Failure {
    text: String,
    /// The database could not be written (reported to the write health).
    of_the_disk: bool,
}

impl<F> Deferred<F> {
    pub(super) fn new(
        work: F,
        kinds: &'static [WriteKind],
        failed: Arc<OnceLock<WriteKind>>,
        what: &'static str,
        health: WriteHealth,
    ) -> Self {
        Deferred {
            work,
            kinds,
            failed,
            what,
            health,
            outcome: None,
        }
    }
}

impl<F> Job for Deferred<F>
where
    F: Fn(&mut Connection) -> Result<(), StoreError> + Send + 'static,
{
    fn run(&mut self, conn: &mut Connection) -> bool {
        let work = &self.work;
        let ran = panic::catch_unwind(AssertUnwindSafe(|| changed_by(conn, work)));
        let outcome = match ran {
            Ok(Ok(((), changed))) => Ok(changed),
            Ok(Err(error)) => Err(Failure {
                text: error.to_string(),
                of_the_disk: error.is_write_failure(),
            }),
            Err(_) => Err(Failure {
                text: "the write panicked".to_owned(),
                of_the_disk: false,
            }),
        };
        let keep = outcome.is_ok();
        self.outcome = Some(outcome);
        keep
    }

    fn answer(self: Box<Self>, lost: Option<&rusqlite::Error>) {
        let failure = match (self.outcome, lost) {
            // Its own failure says more than the batch's.
            (Some(Err(own)), _) => own,
            (_, Some(lost)) => Failure {
                text: format!("its batch was not saved: {lost}"),
                of_the_disk: true,
            },
            (Some(Ok(changed)), None) => {
                if changed {
                    for kind in self.kinds {
                        self.health.succeeded(*kind);
                    }
                }
                return;
            }
            (None, None) => Failure {
                text: "the store closed first".to_owned(),
                of_the_disk: false,
            },
        };
        if failure.of_the_disk {
            let failed = self.failed.get().map(std::slice::from_ref);
            for kind in failed.unwrap_or(self.kinds) {
                self.health.failed(*kind, &failure.text);
            }
        }
        tracing::error!(what = self.what, error = %failure.text, "could not record (a write nobody waited for)");
    }

    fn needs_savepoint(&self) -> bool {
        false
    }

    fn can_run_again(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::batch::tests::{hold, queue};
    use crate::store::write_health::tests::fail_inserts_into;
    use crate::store::{AgentUsage, Store, TranscriptEntry, TurnUsage, WriteKind};

    async fn wait_until(what: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if what() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        what()
    }

    #[tokio::test]
    async fn a_call_made_after_a_deferred_write_sees_it() {
        let store = Store::open_in_memory().unwrap();
        let transcripts = store.transcripts();
        for n in 0..50 {
            transcripts.append_many_charging_later(
                "s",
                vec![TranscriptEntry::user(format!("m{n}"))],
                None,
            );
            // Each read comes after its write, with no wait in between.
            assert_eq!(transcripts.transcript_len("s").await.unwrap(), n + 1);
        }
        let stats = store.stats();
        assert_eq!(stats.carried, 50);
    }

    #[tokio::test]
    async fn a_lone_deferred_write_is_committed_without_another_call() {
        let store = Store::open_in_memory().unwrap();
        let before = store.stats();
        store.outbox().record_reply_later(1, 2, vec![3], true);
        // No call is made: the wake-up alone gets it run.
        assert!(wait_until(|| store.stats().since(&before).carried == 1).await);
        assert_eq!(store.stats().since(&before).calls, 0);
        let entry = store.outbox().reply_of(1, 2).await.unwrap().unwrap();
        assert_eq!(entry.reply_ids, vec![3]);
        assert!(entry.delivered);
    }

    #[tokio::test]
    async fn a_failing_deferred_write_is_reported_and_spares_its_batch() {
        let store = Store::open_in_memory().unwrap();
        let health = store.write_health().clone();
        fail_inserts_into(&store, "transcripts").await;
        // Its first statement fails: nothing of it to undo.
        let entries = vec![TranscriptEntry::user("a"), TranscriptEntry::assistant("b")];
        store
            .transcripts()
            .append_many_charging_later("s", entries, None);
        store.outbox().record_reply_later(1, 2, vec![3], true);
        // The call that carries them succeeds, and so does the other write.
        store
            .outbox()
            .record_send_intent(5, 6, vec![])
            .await
            .unwrap();
        assert!(store.outbox().reply_of(1, 2).await.unwrap().is_some());
        assert_eq!(store.transcripts().transcript_len("s").await.unwrap(), 0);
        let failures = health.failures();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].0, WriteKind::Transcript);
    }

    #[tokio::test]
    async fn a_deferred_write_failing_midway_keeps_nothing_and_the_writes_before_it_run_again() {
        let store = Store::open_in_memory().unwrap();
        let health = store.write_health().clone();
        fail_inserts_into(&store, "usage_turns").await;
        // All three wait on the list and run in one batch, in this order.
        let (release, held) = hold(&store).await;
        store.outbox().record_reply_later(1, 2, vec![3], true);
        // Its two transcript rows go in, then its usage row fails: no
        // savepoint to undo the rows alone, so the batch is rolled back.
        let usage = TurnUsage {
            user_id: 7,
            chat_id: 1,
            session_id: "s".into(),
            at_ms: 200,
            usage: AgentUsage::default(),
        };
        let entries = vec![TranscriptEntry::user("a"), TranscriptEntry::assistant("b")];
        store
            .transcripts()
            .append_many_charging_later("s", entries, Some(usage));
        store
            .transcripts()
            .append_many_charging_later("t", vec![TranscriptEntry::user("c")], None);
        release.send(()).expect("release");
        held.await.expect("held");
        store.inbox().settle().await.unwrap();
        // The write before it ran again, the one after it ran once, and
        // nothing of the failing one is kept.
        assert!(store.outbox().reply_of(1, 2).await.unwrap().is_some());
        assert_eq!(store.transcripts().transcript_len("t").await.unwrap(), 1);
        assert_eq!(store.transcripts().transcript_len("s").await.unwrap(), 0);
        let failures = health.failures();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].0, WriteKind::Usage);
        let outbox = health
            .failures()
            .iter()
            .any(|(kind, _)| *kind == WriteKind::Outbox);
        assert!(!outbox, "the write that ran again is not reported");
    }

    #[tokio::test]
    async fn a_deferred_write_is_not_run_again_after_a_call_that_may_have_committed_it() {
        let store = Store::open_in_memory().unwrap();
        let (release, held) = hold(&store).await;
        store
            .transcripts()
            .append_many_charging_later("u", vec![TranscriptEntry::user("a")], None);
        // A call that ends the shared transaction with SQL of its own: what
        // ran before it may be committed, so it must not run twice.
        let ends = queue(&store, |c| {
            c.execute_batch("COMMIT")?;
            Ok(())
        })
        .await;
        release.send(()).expect("release");
        held.await.expect("held");
        let _ = ends.await;
        store.inbox().settle().await.unwrap();
        assert_eq!(store.transcripts().transcript_len("u").await.unwrap(), 1);
    }

    #[tokio::test]
    async fn closing_runs_the_writes_still_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = Store::open_async(&path).await.unwrap();
        for n in 0..300 {
            store.outbox().record_reply_later(1, n, vec![1], true);
        }
        store.close().await.unwrap();
        let store = Store::open_async(&path).await.unwrap();
        for n in [0, 150, 299] {
            assert!(
                store.outbox().reply_of(1, n).await.unwrap().is_some(),
                "reply {n}"
            );
        }
    }
}
