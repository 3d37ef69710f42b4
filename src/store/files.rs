//! The record of files sent to chats (migration "outbox files"): one row
//! per file per answered message, so a turn replayed after a restart does
//! not send a file twice, nor one a stop left unsent. Keys are chosen by
//! [`crate::media::outbox`].
//!
//! Rows are the handle's bot's (`bot_id` leads the key).

use rusqlite::{params, OptionalExtension};

use super::{now_ms, FileSends, StoreError, WriteKind};

/// What the record says of one file of one answered message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileSend {
    /// Sent (as the recorded message).
    Sent,
    /// Its send was started and its outcome never recorded (the process
    /// died in between): it may or may not be in the chat, and is not sent
    /// again.
    Ambiguous,
    /// Left unsent on purpose (/stop ended the answer's files): never
    /// sent, not even by a restart.
    Withheld,
}

/// `sent_message_id` of a row that records only the intent to send.
const SENDING: i64 = 0;
/// `sent_message_id` of a row that records a file left unsent on purpose
/// (message ids are positive).
const WITHHELD: i64 = -1;

/// How [`FileSends::write_file_row`] treats a row already there.
#[derive(Clone, Copy)]
enum WriteRow {
    /// Keep it (an intent never overwrites a recorded send).
    UnlessRecorded,
    /// Replace it (the outcome replaces the intent).
    Always,
}

impl FileSends {
    /// Whether the file `key` was already sent answering `message_id` in
    /// `chat_id` (or its send started: see [`FileSends::file_send`]).
    pub async fn file_sent(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
    ) -> Result<bool, StoreError> {
        Ok(self.file_send(chat_id, message_id, key).await?.is_some())
    }

    /// What is recorded of the file `key` answering `message_id` in
    /// `chat_id`: nothing, sent, or a send whose outcome is unknown.
    pub async fn file_send(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
    ) -> Result<Option<FileSend>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let sent_id: Option<i64> = conn
                .prepare_cached(
                    "SELECT sent_message_id FROM outbox_files
                     WHERE bot_id = ?4 AND chat_id = ?1 AND answering_id = ?2 AND file_key = ?3",
                )?
                .query_row(params![chat_id, message_id, key, bot], |row| row.get(0))
                .optional()?;
            Ok(sent_id.map(|id| match id {
                SENDING => FileSend::Ambiguous,
                WITHHELD => FileSend::Withheld,
                _ => FileSend::Sent,
            }))
        })
        .await
    }

    /// Record that the file `key` is about to be sent (before the request):
    /// until [`FileSends::record_file_sent`] or [`FileSends::forget_file_send`], a
    /// restart finds the send [`FileSend::Ambiguous`].
    pub async fn record_file_sending(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
    ) -> Result<(), StoreError> {
        self.write_file_row(WriteRow::UnlessRecorded, chat_id, message_id, key, SENDING)
            .await
    }

    /// Record that the files `keys` answering `message_id` in `chat_id`
    /// are left unsent on purpose (one transaction). A file already
    /// recorded (sent, or its send started) keeps its record.
    pub async fn record_files_withheld(
        &self,
        chat_id: i64,
        message_id: i64,
        keys: Vec<String>,
    ) -> Result<(), StoreError> {
        // One call: all or nothing (its own savepoint).
        let bot = self.bot();
        self.call(move |conn| {
            let mut insert = conn.prepare_cached(
                "INSERT OR IGNORE INTO outbox_files
                 (bot_id, chat_id, answering_id, file_key, sent_message_id, sent_at)
                 VALUES (?6, ?1, ?2, ?3, ?4, ?5)",
            )?;
            let now = now_ms();
            for key in keys {
                insert.execute(params![chat_id, message_id, key, WITHHELD, now, bot])?;
            }
            Ok(())
        })
        .await
    }

    /// Take back the intent to send the file `key` (its send failed for
    /// sure); a file already recorded as sent stays so.
    pub async fn forget_file_send(
        &self,
        chat_id: i64,
        message_id: i64,
        key: String,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::SentFile, move |conn| {
            conn.prepare_cached(
                "DELETE FROM outbox_files
                 WHERE bot_id = ?5 AND chat_id = ?1 AND answering_id = ?2 AND file_key = ?3
                   AND sent_message_id = ?4",
            )?
            .execute(params![chat_id, message_id, key, SENDING, bot])?;
            Ok(())
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
        self.write_file_row(WriteRow::Always, chat_id, message_id, key, sent_id)
            .await
    }

    /// Writes the row of the file `key` with `sent_id` (or [`SENDING`]).
    async fn write_file_row(
        &self,
        mode: WriteRow,
        chat_id: i64,
        message_id: i64,
        key: String,
        sent_id: i64,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::SentFile, move |conn| {
            let sql = match mode {
                WriteRow::UnlessRecorded => {
                    "INSERT OR IGNORE INTO outbox_files
                     (bot_id, chat_id, answering_id, file_key, sent_message_id, sent_at)
                     VALUES (?6, ?1, ?2, ?3, ?4, ?5)"
                }
                WriteRow::Always => {
                    "INSERT OR REPLACE INTO outbox_files
                     (bot_id, chat_id, answering_id, file_key, sent_message_id, sent_at)
                     VALUES (?6, ?1, ?2, ?3, ?4, ?5)"
                }
            };
            conn.prepare_cached(sql)?.execute(params![
                chat_id,
                message_id,
                key,
                sent_id,
                now_ms(),
                bot
            ])?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    #[tokio::test]
    async fn sent_files_are_remembered_per_answered_message() {
        let store = Store::open_in_memory().unwrap();
        assert!(!store
            .file_sends()
            .file_sent(1, 10, "a".into())
            .await
            .unwrap());
        store
            .file_sends()
            .record_file_sent(1, 10, "a".into(), 99)
            .await
            .unwrap();
        assert!(store
            .file_sends()
            .file_sent(1, 10, "a".into())
            .await
            .unwrap());
        assert!(!store
            .file_sends()
            .file_sent(1, 11, "a".into())
            .await
            .unwrap());
        assert!(!store
            .file_sends()
            .file_sent(2, 10, "a".into())
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn a_send_without_its_outcome_is_ambiguous_until_recorded_or_forgotten() {
        let store = Store::open_in_memory().unwrap();
        let sends = store.file_sends();
        let state = |key: &'static str| sends.file_send(1, 10, key.into());
        store
            .file_sends()
            .record_file_sending(1, 10, "a".into())
            .await
            .unwrap();
        assert_eq!(state("a").await.unwrap(), Some(FileSend::Ambiguous));
        assert!(store
            .file_sends()
            .file_sent(1, 10, "a".into())
            .await
            .unwrap());
        store
            .file_sends()
            .record_file_sent(1, 10, "a".into(), 77)
            .await
            .unwrap();
        assert_eq!(state("a").await.unwrap(), Some(FileSend::Sent));
        // Forgetting takes back only an intent, never a sent file.
        store
            .file_sends()
            .forget_file_send(1, 10, "a".into())
            .await
            .unwrap();
        assert_eq!(state("a").await.unwrap(), Some(FileSend::Sent));
        store
            .file_sends()
            .record_file_sending(1, 10, "b".into())
            .await
            .unwrap();
        store
            .file_sends()
            .forget_file_send(1, 10, "b".into())
            .await
            .unwrap();
        assert_eq!(state("b").await.unwrap(), None);
        // An intent does not overwrite a recorded send.
        store
            .file_sends()
            .record_file_sending(1, 10, "a".into())
            .await
            .unwrap();
        assert_eq!(state("a").await.unwrap(), Some(FileSend::Sent));
    }

    #[tokio::test]
    async fn withheld_files_stay_withheld_and_never_overwrite_a_send() {
        let store = Store::open_in_memory().unwrap();
        let sends = store.file_sends();
        let state = |key: &'static str| sends.file_send(1, 10, key.into());
        store
            .file_sends()
            .record_file_sent(1, 10, "sent".into(), 5)
            .await
            .unwrap();
        store
            .file_sends()
            .record_file_sending(1, 10, "started".into())
            .await
            .unwrap();
        let keys = ["sent", "started", "left", "out"]
            .map(String::from)
            .to_vec();
        store
            .file_sends()
            .record_files_withheld(1, 10, keys)
            .await
            .unwrap();
        assert_eq!(state("sent").await.unwrap(), Some(FileSend::Sent));
        assert_eq!(state("started").await.unwrap(), Some(FileSend::Ambiguous));
        assert_eq!(state("left").await.unwrap(), Some(FileSend::Withheld));
        assert_eq!(state("out").await.unwrap(), Some(FileSend::Withheld));
        // An intent does not make a withheld file sendable.
        store
            .file_sends()
            .record_file_sending(1, 10, "left".into())
            .await
            .unwrap();
        assert_eq!(state("left").await.unwrap(), Some(FileSend::Withheld));
    }

    #[tokio::test]
    async fn sent_files_are_remembered_per_bot() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        a.file_sends()
            .record_file_sending(1, 10, "f".into())
            .await
            .unwrap();
        a.file_sends()
            .record_files_withheld(1, 10, vec!["g".into()])
            .await
            .unwrap();
        assert_eq!(
            b.file_sends().file_send(1, 10, "f".into()).await.unwrap(),
            None
        );
        assert_eq!(
            b.file_sends().file_send(1, 10, "g".into()).await.unwrap(),
            None
        );
        b.file_sends()
            .record_file_sending(1, 10, "f".into())
            .await
            .unwrap();
        b.file_sends()
            .forget_file_send(1, 10, "f".into())
            .await
            .unwrap();
        assert_eq!(
            a.file_sends().file_send(1, 10, "f".into()).await.unwrap(),
            Some(FileSend::Ambiguous)
        );
        b.file_sends()
            .record_file_sent(1, 10, "g".into(), 99)
            .await
            .unwrap();
        assert_eq!(
            a.file_sends().file_send(1, 10, "g".into()).await.unwrap(),
            Some(FileSend::Withheld)
        );
    }
}
