//! Store failures on demand, as on a full disk: a temporary trigger makes
//! recording a new session fail until it is dropped.

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
