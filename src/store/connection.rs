//! The store thread's connection from open to close: open it (private
//! files, integrity check, migrations), configure it, start the checkpoint
//! thread beside it, serve batches on it, then checkpoint and close.
//!
//! This module owns the connection's life and settings. It must never be
//! used from a tokio worker (everything here blocks); only the store thread
//! ([`super::Store`]'s spawn) calls it.

use std::path::Path;
use std::sync::Arc;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::mpsc;

use super::batch::{self, Counters, Msg};
use super::{
    carried, checkpointer, integrity, schema, StoreError, Synchronous, Target, BUSY_TIMEOUT,
    STATEMENT_CACHE,
};

/// Opens and configures the connection, then migrates it.
pub(super) fn open_connection(target: &Target) -> Result<Connection, StoreError> {
    let Target::File(path, _) = target else {
        let mut conn = Connection::open_in_memory()?;
        configure(&mut conn, target)?;
        schema::migrate(&mut conn)?;
        return Ok(conn);
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::private_fs::private_dir(dir)?;
    }
    integrity::check_before_open(path)?;
    // Created by us, 0600, before SQLite creates it with the umask's mode:
    // SQLite gives the -wal and -shm files the database's mode.
    crate::private_fs::private_file(path)?;
    let corrupt = |e| integrity::as_corrupt(e, path);
    let mut conn = Connection::open(path).map_err(corrupt)?;
    configure(&mut conn, target).map_err(|e| match e {
        StoreError::Sqlite(e) => corrupt(e),
        other => other,
    })?;
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        crate::private_fs::tighten_if_present(Path::new(&name), crate::private_fs::FILE_MODE)?;
    }
    integrity::quick_check(&conn, path)?;
    schema::migrate(&mut conn).map_err(|e| match e {
        StoreError::Sqlite(e) => corrupt(e),
        other => other,
    })?;
    integrity::write_marker(path)?;
    Ok(conn)
}

/// Bytes of WAL file kept once the WAL starts over (`journal_size_limit`).
pub(super) const WAL_SIZE_LIMIT: i64 = 16 << 20;

/// Applies the connection settings described in the module docs.
fn configure(conn: &mut Connection, target: &Target) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if matches!(target, Target::File(..)) && !mode.eq_ignore_ascii_case("wal") {
        tracing::warn!(mode, "store could not enable WAL; continuing");
    }
    let synchronous = match target {
        Target::File(_, synchronous) => *synchronous,
        Target::Memory => Synchronous::default(),
    };
    conn.pragma_update(None, "synchronous", synchronous.pragma())?;
    // The commit that starts the WAL over (once a checkpoint has copied
    // all of it) cuts its file back to this size: the WAL of a burst does
    // not keep its disk space, while the steady state rewrites a file it
    // already has.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // Every write transaction takes the write lock up front, so it can wait
    // on the busy timeout instead of failing when upgrading a read lock.
    conn.set_transaction_behavior(TransactionBehavior::Immediate);
    // Every statement of a turn's path (and the batch loop's own) stays
    // parsed: rusqlite's default of 16 makes them evict one another.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Plans do not depend on bound values. Without this, SQLite marks a
    // statement whose plan *could* depend on a parameter (the history query:
    // `session_id = ?1 ... ORDER BY id`) expired at every rebind, so the
    // statement cache re-parsed it on every turn. Every query here is a
    // plain indexed lookup, whatever the values.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Bytes of WAL past which the store thread copies the rest of it itself
/// (its automatic checkpoint, otherwise left to the checkpoint thread).
/// Reached only by a writer that never pauses (see [`checkpointer`]'s
/// known limit): the WAL then stops at about this size, and the stall
/// (copying what the checkpoint thread has not yet, a few milliseconds)
/// comes once per this many bytes written.
pub(super) const WAL_CATCH_UP_BYTES: i64 = 4 * WAL_SIZE_LIMIT;

/// Starts the checkpoint thread for a database file and leaves the store
/// connection's own automatic checkpoint only to a WAL past
/// [`WAL_CATCH_UP_BYTES`] ([`checkpointer`]). An
/// in-memory database has no WAL to checkpoint. When the store goes
/// quiet, the checkpoint thread asks it, through `store` (weak: it never
/// keeps the store thread alive), to give its idle memory back.
pub(super) fn start_checkpointer(
    conn: &Connection,
    target: &Target,
    store: mpsc::WeakSender<Msg>,
) -> Option<checkpointer::Checkpointer> {
    let Target::File(path, _) = target else {
        return None;
    };
    let on_idle: checkpointer::OnIdle = Box::new(move || {
        // A full queue means a busy store, which has nothing to give back.
        if let Some(tx) = store.upgrade() {
            let _ = tx.try_send(Msg::ReleaseMemory);
        }
    });
    let checkpointer = checkpointer::Checkpointer::start(path, on_idle)?;
    let catch_up = conn
        .query_row("PRAGMA page_size", [], |row| row.get::<_, i64>(0))
        .map(|page| WAL_CATCH_UP_BYTES / page.max(512))
        .and_then(|frames| conn.pragma_update(None, "wal_autocheckpoint", frames));
    if let Err(error) = catch_up {
        tracing::warn!(%error, "the store keeps checkpointing as it commits");
    }
    Some(checkpointer)
}

/// The store thread: serve batches (see [`batch`]) until shut down or
/// until every [`Store`] handle is gone, then close.
pub(super) fn serve(
    mut conn: Connection,
    rx: mpsc::Receiver<Msg>,
    carried: &carried::Carried,
    counters: &Arc<Counters>,
    checkpointer: Option<checkpointer::Checkpointer>,
) {
    let shutdown_reply = batch::serve(&mut conn, rx, carried, counters);
    // Its connection closes first: the store's is then the last one, and
    // its final checkpoint removes the WAL.
    if let Some(checkpointer) = checkpointer {
        checkpointer.stop();
    }
    let result = shutdown(conn);
    match shutdown_reply {
        Some(reply) => {
            let _ = reply.send(result);
        }
        None => {
            if let Err(e) = result {
                tracing::warn!(error = %e, "store did not close cleanly");
            }
        }
    }
}

/// Checkpoints the WAL into the main database file and closes.
fn shutdown(conn: Connection) -> Result<(), StoreError> {
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    if busy != 0 {
        tracing::debug!("store checkpoint incomplete: another reader is active");
    }
    conn.close().map_err(|(_, e)| StoreError::Sqlite(e))?;
    tracing::debug!("store closed");
    Ok(())
}
