//! Adopting the rows of a database from before several bots.
//!
//! Migration 14 gave every row a `bot_id`; rows written before it (and by
//! handles not scoped to a bot) carry [`BotId::UNCLAIMED`]. The first
//! configured bot calls [`Store::adopt_unclaimed_rows`] at start: every
//! unclaimed row becomes its own, in one transaction, and `store_meta`
//! remembers that it was done, so a later start (or a second bot) moves
//! nothing and pays one look-up.

use rusqlite::{params, Connection, OptionalExtension};

use super::{Store, StoreError};
use crate::vocab::BotId;

/// The `store_meta` row that says the unclaimed rows were adopted (its
/// value: by which bot).
const ADOPTED: &str = "unclaimed rows adopted by";

impl Store {
    /// Moves every row of [`BotId::UNCLAIMED`] (a database from before
    /// several bots) to `bot`, all tables in one transaction, and remembers
    /// that it did: a later call moves nothing, whichever bot makes it.
    /// Returns how many rows moved. Adopting for `UNCLAIMED` itself does
    /// nothing and is not remembered.
    ///
    /// A row that `bot` already has under the same key makes the whole
    /// adoption fail (nothing moves): the bot wrote before adopting.
    pub async fn adopt_unclaimed_rows(&self, bot: BotId) -> Result<u64, StoreError> {
        if bot == BotId::UNCLAIMED {
            return Ok(0);
        }
        // The start-up owner's one-off call, not a writing handle's: a
        // failure fails the start instead of showing in /healthz.
        self.call(move |conn| adopt(conn, bot.get())).await
    }
}

/// The adoption on the store thread (in the call's savepoint: all or
/// nothing).
fn adopt(conn: &Connection, bot: i64) -> Result<u64, StoreError> {
    let done = conn
        .prepare_cached("SELECT value FROM store_meta WHERE name = ?1")?
        .query_row([ADOPTED], |r| r.get::<_, i64>(0))
        .optional()?;
    if done.is_some() {
        return Ok(0);
    }
    let mut moved = 0u64;
    for table in tables_with_bot_id(conn)? {
        let quoted = table.replace('"', "\"\"");
        let sql = format!("UPDATE \"{quoted}\" SET bot_id = ?1 WHERE bot_id = 0");
        moved += u64::try_from(conn.execute(&sql, [bot])?).unwrap_or(0);
    }
    conn.execute(
        "INSERT INTO store_meta (name, value) VALUES (?1, ?2)",
        params![ADOPTED, bot],
    )?;
    tracing::info!(bot, moved, "adopted the store's unclaimed rows");
    Ok(moved)
}

/// Every table with a `bot_id` column, read from the schema itself so a
/// table added later cannot be forgotten here.
pub(super) fn tables_with_bot_id(conn: &Connection) -> Result<Vec<String>, StoreError> {
    let mut statement = conn.prepare(
        "SELECT m.name FROM sqlite_schema m, pragma_table_info(m.name) c
         WHERE m.type = 'table' AND c.name = 'bot_id' ORDER BY m.name",
    )?;
    let names = statement.query_map([], |r| r.get::<_, String>(0))?;
    Ok(names.collect::<Result<Vec<_>, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::{self, MIGRATIONS};
    use crate::vocab::InboxState;

    /// Rows in most tables of a version-13 database (before bot ids).
    const V13_ROWS: &str = "
        INSERT INTO inbox (update_id, chat_id, message_id, payload, state, received_at, updated_at)
            VALUES (7, -100, 10, '{}', 'received', 1, 1);
        INSERT INTO outbox (chat_id, message_id, reply_ids, state, updated_at)
            VALUES (-100, 10, '[11]', 'delivered', 1);
        INSERT INTO session_history (session_id, session_key, created_at, last_active_at)
            VALUES ('s1', 'chat:-100', 1, 1);
        INSERT INTO sessions (session_key, session_id, created_at, last_active_at)
            VALUES ('chat:-100', 's1', 1, 1);
        INSERT INTO transcripts (session_id, role, content, created_at)
            VALUES ('s1', 'user', 'hi', 1);
        INSERT INTO members (user_id, role, added_at, via) VALUES (42, 'owner', 1, 'pairing');
        INSERT INTO usage_turns (user_id, chat_id, session_id, at) VALUES (42, -100, 's1', 1);
        INSERT INTO child_groups (pgid, leader_start, session_id, boot_id, what, recorded_at)
            VALUES (999999, 1, 1, 'boot', 'command', 1);
        INSERT INTO background_processes (process_id, chat_id, command, started_at)
            VALUES ('p1', -100, 'sleep 1', 1);
        INSERT INTO agent_sessions (session_id, backend, turns, updated_at)
            VALUES ('s1', 'claude', 1, 1);
        INSERT INTO topic_creations (chat_id, message_id, thread_id, created_at)
            VALUES (-100, 10, 5, 1);
    ";

    /// A database file at version 13 holding [`V13_ROWS`].
    fn version_13_database(path: &std::path::Path) {
        let conn = Connection::open(path).unwrap();
        for step in &MIGRATIONS[..13] {
            conn.execute_batch(step.sql).unwrap();
        }
        conn.pragma_update(None, "user_version", 13).unwrap();
        conn.execute_batch(V13_ROWS).unwrap();
    }

    async fn unclaimed_rows(store: &Store) -> i64 {
        store
            .call(|conn| {
                let mut total = 0;
                for table in tables_with_bot_id(conn)? {
                    let sql = format!("SELECT count(*) FROM \"{table}\" WHERE bot_id = 0");
                    total += conn.query_row(&sql, [], |r| r.get::<_, i64>(0))?;
                }
                Ok(total)
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_version_13_database_migrated_and_adopted_belongs_to_that_bot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telegate.db");
        version_13_database(&path);
        let store = Store::open_async(&path).await.unwrap();
        let bot = store.for_bot(BotId(123456));
        // Migrated, the rows are nobody's yet.
        assert!(bot.inbox().inbox_entry(7).await.unwrap().is_none());
        assert_eq!(unclaimed_rows(&store).await, 11);

        assert_eq!(store.adopt_unclaimed_rows(BotId(123456)).await.unwrap(), 11);
        assert_eq!(unclaimed_rows(&store).await, 0);
        let entry = bot.inbox().inbox_entry(7).await.unwrap().expect("adopted");
        assert_eq!(entry.state, InboxState::Received);
        assert!(bot.outbox().reply_of(-100, 10).await.unwrap().is_some());
        let session = bot.sessions().current_session("chat:-100").await.unwrap();
        assert_eq!(session.map(|s| s.session_id).as_deref(), Some("s1"));
        assert_eq!(bot.transcripts().transcript_len("s1").await.unwrap(), 1);
        assert_eq!(bot.users().owner().await.unwrap(), Some(42));
        assert_eq!(
            bot.child_groups().take_child_groups().await.unwrap().len(),
            1
        );
        // The unscoped handles see none of it now.
        assert!(store.inbox().inbox_entry(7).await.unwrap().is_none());
        assert_eq!(store.users().owner().await.unwrap(), None);

        // Done once: a second adoption, by any bot, moves nothing.
        store
            .inbox()
            .record_update(
                8,
                -100,
                Some(12),
                serde_json::json!({}),
                InboxState::Received,
                None,
            )
            .await
            .unwrap();
        assert_eq!(store.adopt_unclaimed_rows(BotId(123456)).await.unwrap(), 0);
        assert_eq!(store.adopt_unclaimed_rows(BotId(777)).await.unwrap(), 0);
        assert!(bot.inbox().inbox_entry(8).await.unwrap().is_none());
        store.close().await.unwrap();

        // And it stays done after a restart.
        let store = Store::open_async(&path).await.unwrap();
        assert_eq!(store.adopt_unclaimed_rows(BotId(777)).await.unwrap(), 0);
        let conn_version = store.call(|c| schema::schema_version(c)).await.unwrap();
        assert_eq!(conn_version, schema::SCHEMA_VERSION);
    }

    #[tokio::test]
    async fn adopting_for_the_unclaimed_bot_changes_nothing_and_is_not_remembered() {
        let store = Store::open_in_memory().unwrap();
        store
            .inbox()
            .record_update(
                1,
                5,
                Some(1),
                serde_json::json!({}),
                InboxState::Received,
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            store.adopt_unclaimed_rows(BotId::UNCLAIMED).await.unwrap(),
            0
        );
        assert_eq!(store.adopt_unclaimed_rows(BotId(9)).await.unwrap(), 1);
        let bot = store.for_bot(BotId(9));
        assert!(bot.inbox().inbox_entry(1).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn an_adoption_that_meets_the_bots_own_row_moves_nothing() {
        let store = Store::open_in_memory().unwrap();
        let bot = store.for_bot(BotId(9));
        for handle in [&store, &bot] {
            handle
                .inbox()
                .record_update(
                    1,
                    5,
                    Some(1),
                    serde_json::json!({}),
                    InboxState::Received,
                    None,
                )
                .await
                .unwrap();
        }
        assert!(store.adopt_unclaimed_rows(BotId(9)).await.is_err());
        assert_eq!(unclaimed_rows(&store).await, 1, "all or nothing");
        // Not remembered either: it can be retried once resolved.
        assert!(store.adopt_unclaimed_rows(BotId(9)).await.is_err());
    }
}
