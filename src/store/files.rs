//! The record of files sent to chats (migration "outbox files"): one row
//! per file per answered message, so a turn replayed after a restart does
//! not send a file twice. Keys are chosen by [`crate::media::outbox`].

use rusqlite::{params, OptionalExtension};

use super::{now_ms, Store, StoreError};

impl Store {
    /// Whether the file `key` was already sent answering `message_id` in
    /// `chat_id`.
    pub async fn file_sent(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
    ) -> Result<bool, StoreError> {
        self.call(move |conn| {
            let found: Option<i64> = conn.prepare_cached("SELECT 1 FROM outbox_files WHERE chat_id = ?1 AND answering_id = ?2 AND file_key = ?3")?.query_row(params![chat_id, message_id, key],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(found.is_some())
        })
        .await
    }

    /// Record that the file `key` went out (as message `sent_id`).
    pub async fn record_file_sent(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
        sent_id: i64,
    ) -> Result<(), StoreError> {
        self.call(move |conn| {
            conn.prepare_cached("INSERT OR REPLACE INTO outbox_files (chat_id, answering_id, file_key, sent_message_id, sent_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)")?.execute(params![chat_id, message_id, key, sent_id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sent_files_are_remembered_per_answered_message() {
        let store = Store::open_in_memory().unwrap();
        assert!(!store.file_sent(1, 10, "a".into()).await.unwrap());
        store.record_file_sent(1, 10, "a".into(), 99).await.unwrap();
        assert!(store.file_sent(1, 10, "a".into()).await.unwrap());
        assert!(!store.file_sent(1, 11, "a".into()).await.unwrap());
        assert!(!store.file_sent(2, 10, "a".into()).await.unwrap());
    }
}
