//! Store failures on demand, as on a full disk: a temporary trigger makes
//! one kind of write (recording a new session, an inbox row, a transcript
//! entry…) fail until it is dropped.

use telegate::store::Store;

/// From now on, creating a session fails with "database or disk is full".
pub async fn refuse_new_sessions(store: &Store) {
    store
        .call(|c| {
            Ok(c.execute_batch(
                "CREATE TEMP TRIGGER no_new_sessions BEFORE INSERT ON session_history
                 BEGIN SELECT RAISE(FAIL, 'database or disk is full (injected)'); END;",
            )?)
        })
        .await
        .expect("install the failing trigger");
}

/// Undoes [`refuse_new_sessions`].
pub async fn allow_new_sessions(store: &Store) {
    store
        .call(|c| Ok(c.execute_batch("DROP TRIGGER no_new_sessions")?))
        .await
        .expect("drop the failing trigger");
}

/// From now on, every `event` (`INSERT` or `UPDATE`) on `table` fails
/// with "database or disk is full" (as on a full disk, but for that one
/// kind of write).
pub async fn fail_writes(store: &Store, event: &'static str, table: &'static str) {
    store
        .call(move |c| {
            Ok(c.execute_batch(&format!(
                "CREATE TEMP TRIGGER fail_{event}_{table} BEFORE {event} ON {table}
                 BEGIN SELECT RAISE(FAIL, 'database or disk is full (injected)'); END;"
            ))?)
        })
        .await
        .expect("install the failing trigger");
}

/// Undoes [`fail_writes`].
pub async fn allow_writes(store: &Store, event: &'static str, table: &'static str) {
    store
        .call(move |c| Ok(c.execute_batch(&format!("DROP TRIGGER fail_{event}_{table}"))?))
        .await
        .expect("drop the failing trigger");
}
