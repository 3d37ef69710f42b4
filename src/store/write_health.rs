//! Whether the store's writes currently work, per kind of write, as seen by
//! the store's own writing methods.
//!
//! A read (`SELECT 1`) can succeed while every write fails (disk full, a
//! read-only file system, a damaged page), so `/healthz` cannot learn about
//! failing writes by probing. Every writing method of [`super::Store`]
//! reports its outcome here instead ([`super::Link::write`]): a failure of
//! one kind ([`WriteKind`]) is remembered until a write of the same kind
//! changes a row again, so a working kind (say, the outbox) never hides a
//! failing one (say, transcripts).
//!
//! This module owns those flags and their last error texts. It must never
//! decide what a writer does about a failure (retry, tell the user): that
//! stays with the writer.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rusqlite::Connection;

use super::{Link, StoreError, StoreHealth};

/// What a write was writing (named in `/healthz` when it fails).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WriteKind {
    /// Recording updates in the inbox (intake, journaled wakeups).
    Inbox,
    /// A message's or update's state in the inbox (the outcome ledger).
    InboxState,
    /// The outbox: an answer's send intent and its reply ids.
    Outbox,
    /// Transcript entries, undo marks.
    Transcript,
    /// A chat's current session, its rotation and overrides.
    Session,
    /// Inline buttons and their single use.
    Button,
    /// The record of files sent from a turn's outbox.
    SentFile,
    /// Running background processes.
    Process,
    /// A CLI agent's session id and usage.
    AgentSession,
    /// Pruning old inbox rows.
    Retention,
    /// The record of approval decisions.
    Approval,
    /// Scheduled jobs, their runs' journal, chat time zones.
    Job,
    /// Members, pairing codes, invites and wrong tries.
    Access,
    /// Per-user usage (turns, tokens, cost) and settings.
    Usage,
}

impl WriteKind {
    /// The name shown in `/healthz`.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Inbox => "inbox",
            WriteKind::InboxState => "message states",
            WriteKind::Outbox => "outbox",
            WriteKind::Transcript => "transcripts",
            WriteKind::Session => "sessions",
            WriteKind::Button => "buttons",
            WriteKind::SentFile => "sent files",
            WriteKind::Process => "background processes",
            WriteKind::AgentSession => "agent sessions",
            WriteKind::Retention => "inbox retention",
            WriteKind::Approval => "approval decisions",
            WriteKind::Job => "scheduled jobs",
            WriteKind::Access => "access",
            WriteKind::Usage => "usage",
        }
    }
}

/// Shared by every clone of a [`super::Store`].
#[derive(Clone, Debug, Default)]
pub struct WriteHealth {
    failing: Arc<Mutex<Vec<(WriteKind, String)>>>,
}

impl WriteHealth {
    /// A write of `kind` failed with `error`.
    pub fn failed(&self, kind: WriteKind, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        let mut failing = self.lock();
        match failing.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, last)) => *last = error,
            None => {
                tracing::warn!(kind = kind.as_str(), %error, "store writes are failing");
                failing.push((kind, error));
                failing.sort_by_key(|(k, _)| *k);
            }
        }
    }

    /// A write of `kind` changed the database: earlier failures of that
    /// kind are over.
    pub fn succeeded(&self, kind: WriteKind) {
        let mut failing = self.lock();
        if let Some(at) = failing.iter().position(|(k, _)| *k == kind) {
            failing.remove(at);
            tracing::info!(kind = kind.as_str(), "store writes work again");
        }
    }

    /// Every kind whose last write failed, with its error (in
    /// [`WriteKind`] order).
    pub fn failures(&self) -> Vec<(WriteKind, String)> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(WriteKind, String)>> {
        // A plain list of values: a poisoned lock is consistent.
        self.failing.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Link {
    /// [`Link::call`] for a method that writes: its outcome is reported
    /// to [`WriteHealth`] under `kind` (a failure of SQLite or of the disk
    /// marks `kind` failing; a call that changed a row, once committed,
    /// marks it working again). Every writing method goes through this,
    /// so `/healthz` sees every failing write without each caller
    /// remembering to report it.
    pub(super) async fn write<R, F>(&self, kind: WriteKind, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let result = self.call(move |conn| changed_by(conn, f)).await;
        self.report(kind, result)
    }

    /// [`Link::call_one_write`], reported like [`Link::write`].
    pub(super) async fn write_one<R, F>(&self, kind: WriteKind, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let result = self.call_one_write(move |conn| changed_by(conn, f)).await;
        self.report(kind, result)
    }

    /// [`Link::call_with_writes`], reported like [`Link::write`].
    pub(super) async fn write_with_writes<R, F>(
        &self,
        kind: WriteKind,
        writes: usize,
        f: F,
    ) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let result = self
            .call_with_writes(writes, move |conn| changed_by(conn, f))
            .await;
        self.report(kind, result)
    }

    /// [`Link::write_with_writes`] for work that writes the tables of
    /// several kinds in one call (a turn's answer and its usage): success
    /// is reported under each of `kinds`, a failure under the kind the
    /// work set in `failed` (whose statement failed), else under all.
    pub(super) async fn write_kinds<R, F>(
        &self,
        kinds: &[WriteKind],
        failed: Arc<OnceLock<WriteKind>>,
        writes: usize,
        f: F,
    ) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let result = self
            .call_with_writes(writes, move |conn| changed_by(conn, f))
            .await;
        match (&result, failed.get()) {
            (Err(_), Some(kind)) => self.report_kinds(&[*kind], result),
            _ => self.report_kinds(kinds, result),
        }
    }

    fn report<R>(
        &self,
        kind: WriteKind,
        result: Result<(R, bool), StoreError>,
    ) -> Result<R, StoreError> {
        self.report_kinds(&[kind], result)
    }

    fn report_kinds<R>(
        &self,
        kinds: &[WriteKind],
        result: Result<(R, bool), StoreError>,
    ) -> Result<R, StoreError> {
        match result {
            Ok((value, changed)) => {
                if changed {
                    for kind in kinds {
                        self.write_health.succeeded(*kind);
                    }
                }
                Ok(value)
            }
            Err(error) => {
                if error.is_write_failure() {
                    for kind in kinds {
                        self.write_health.failed(*kind, &error);
                    }
                }
                Err(error)
            }
        }
    }
}

impl StoreError {
    /// Whether this error means the database could not be written (SQLite
    /// or the disk failed: full, read-only, I/O, damaged, locked, a
    /// failing constraint or trigger), as opposed to a caller's mistake
    /// (no such session, bad JSON) or a closed store.
    pub fn is_write_failure(&self) -> bool {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(..)) | StoreError::Io(_) => true,
            StoreError::Sqlite(_)
            | StoreError::Closed
            | StoreError::TooNew { .. }
            | StoreError::Serde(_)
            | StoreError::Corrupt { .. }
            | StoreError::Vanished { .. }
            | StoreError::NoSuchSession { .. } => false,
        }
    }
}

/// Run `f` and say whether it changed any row (the connection's change
/// counter moved).
pub(super) fn changed_by<R>(
    conn: &mut Connection,
    f: impl FnOnce(&mut Connection) -> Result<R, StoreError>,
) -> Result<(R, bool), StoreError> {
    let before = conn.total_changes();
    let value = f(conn)?;
    Ok((value, conn.total_changes() != before))
}

/// What /healthz and the watchdog ask of the store.
impl StoreHealth {
    /// Whether the store thread answers a query (`SELECT 1`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.call(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    /// Whether writes work, as reported by the writers (shared by all
    /// handles).
    pub fn write_health(&self) -> &WriteHealth {
        &self.link.write_health
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn a_failure_lasts_until_the_next_success_of_its_kind() {
        let health = WriteHealth::default();
        assert_eq!(health.failures(), vec![]);
        health.clone().failed(WriteKind::Transcript, &"disk full");
        health.failed(WriteKind::Inbox, &"read-only");
        assert_eq!(
            health.failures(),
            vec![
                (WriteKind::Inbox, "read-only".to_string()),
                (WriteKind::Transcript, "disk full".to_string())
            ]
        );
        // Another kind working does not hide it.
        health.succeeded(WriteKind::Outbox);
        health.succeeded(WriteKind::Inbox);
        assert_eq!(
            health.failures(),
            vec![(WriteKind::Transcript, "disk full".to_string())]
        );
        health.failed(WriteKind::Transcript, &"still full");
        assert_eq!(
            health.failures(),
            vec![(WriteKind::Transcript, "still full".to_string())]
        );
        health.succeeded(WriteKind::Transcript);
        assert_eq!(health.failures(), vec![]);
    }

    /// Every insert into `table` fails as on a full disk (a temp trigger).
    pub(in crate::store) async fn fail_inserts_into(store: &Store, table: &'static str) {
        store
            .call(move |c| {
                Ok(c.execute_batch(&format!(
                    "CREATE TEMP TRIGGER fail_{table} BEFORE INSERT ON {table}
                     BEGIN SELECT RAISE(FAIL, 'database or disk is full (injected)'); END;"
                ))?)
            })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn the_store_reports_each_failing_write_by_kind_until_it_writes_again() {
        let store = Store::open_in_memory().unwrap();
        let health = store.write_health().clone();
        fail_inserts_into(&store, "transcripts").await;
        let entry = || crate::store::TranscriptEntry::user("hi");
        assert!(store.transcripts().append("s", entry()).await.is_err());
        let failures = health.failures();
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0, WriteKind::Transcript);
        assert!(failures[0].1.contains("disk is full"), "{failures:?}");

        // Reads and other kinds of writes working do not hide it.
        assert_eq!(store.transcripts().transcript_len("s").await.unwrap(), 0);
        store
            .outbox()
            .record_reply(1, 2, vec![3], true)
            .await
            .unwrap();
        assert_eq!(health.failures().len(), 1);
        // A caller's mistake is no failing write.
        let sessions = store.sessions();
        let unknown = sessions.set_override("nobody", "model", serde_json::json!("m"));
        assert!(unknown.await.is_err());
        assert_eq!(health.failures().len(), 1);

        store
            .call(|c| Ok(c.execute_batch("DROP TRIGGER fail_transcripts")?))
            .await
            .unwrap();
        store.transcripts().append("s", entry()).await.unwrap();
        assert_eq!(health.failures(), vec![]);
    }
}
