//! Taking the last exchange out of a session's history (/undo, /retry).
//!
//! The rows are never deleted: the transcript keeps what was said, and the
//! taken-out rows are marked (`undone_at`) so they are no longer given to
//! the agent or counted in /status. An exchange is the last user message
//! and everything recorded after it (tool calls, results, the answer).
//!
//! Only the handle's bot's entries are marked or counted.
//!
//! Contents are user data: this module logs nothing.

use rusqlite::{params, OptionalExtension};

use super::{now_ms, StoreError, Transcripts, WriteKind};

/// What /undo took out of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndoneExchange {
    /// The user message that opened the exchange.
    pub user_text: String,
    /// How many transcript entries were taken out (the user message
    /// included).
    pub entries: usize,
}

impl Transcripts {
    /// The last user message still in the history of `session_id`.
    pub async fn last_user_message(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT content FROM transcripts
                     WHERE bot_id = ?2 AND session_id = ?1 AND role = 'user'
                       AND undone_at IS NULL
                     ORDER BY id DESC LIMIT 1",
                )?
                .query_row(params![session_id, bot], |r| r.get::<_, String>(0))
                .optional()?)
        })
        .await
    }

    /// Take the last exchange of `session_id` out of its history (marked,
    /// kept in the transcript). `None` when the history has no user message.
    pub async fn undo_last_exchange(
        &self,
        session_id: &str,
    ) -> Result<Option<UndoneExchange>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.write(WriteKind::Transcript, move |conn| {
            let tx = conn.savepoint()?;
            let last = tx
                .prepare_cached(
                    "SELECT id, content FROM transcripts
                     WHERE bot_id = ?2 AND session_id = ?1 AND role = 'user'
                       AND undone_at IS NULL
                     ORDER BY id DESC LIMIT 1",
                )?
                .query_row(params![&session_id, bot], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                })
                .optional()?;
            let Some((first_id, user_text)) = last else {
                return Ok(None);
            };
            let entries = tx.execute(
                "UPDATE transcripts SET undone_at = ?3
                 WHERE bot_id = ?4 AND session_id = ?1 AND id >= ?2 AND undone_at IS NULL",
                params![session_id, first_id, now_ms(), bot],
            )?;
            tx.commit()?;
            Ok(Some(UndoneExchange { user_text, entries }))
        })
        .await
    }

    /// How many entries of `session_id` were taken out by /undo or /retry
    /// (they stay in the transcript, marked).
    pub async fn undone_len(&self, session_id: &str) -> Result<usize, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM transcripts
                     WHERE bot_id = ?2 AND session_id = ?1 AND undone_at IS NOT NULL",
                )?
                .query_row(params![session_id, bot], |r| r.get(0))?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::store::{Store, TranscriptEntry};
    use crate::vocab::BotId;

    #[tokio::test]
    async fn undo_marks_the_last_exchange_and_keeps_it() {
        let s = Store::open_in_memory().unwrap();
        s.transcripts()
            .append_many(
                "s",
                vec![
                    TranscriptEntry::user("one"),
                    TranscriptEntry::assistant("1"),
                    TranscriptEntry::user("two"),
                    TranscriptEntry::assistant("2"),
                ],
            )
            .await
            .unwrap();
        let undone = s
            .transcripts()
            .undo_last_exchange("s")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((undone.user_text.as_str(), undone.entries), ("two", 2));
        let history = s.transcripts().load_history("s", None).await.unwrap();
        assert_eq!(history.len(), 2);
        assert_eq!(history[1].content, "1");
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 2);
        assert_eq!(s.transcripts().undone_len("s").await.unwrap(), 2);
        assert_eq!(
            s.transcripts()
                .last_user_message("s")
                .await
                .unwrap()
                .as_deref(),
            Some("one")
        );
        s.transcripts()
            .undo_last_exchange("s")
            .await
            .unwrap()
            .unwrap();
        assert!(s
            .transcripts()
            .undo_last_exchange("s")
            .await
            .unwrap()
            .is_none());
        assert!(s
            .transcripts()
            .last_user_message("s")
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn undo_takes_back_only_the_bots_own_exchange() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        for (bot, text) in [(&a, "from a"), (&b, "from b")] {
            bot.transcripts()
                .append_many(
                    "s",
                    vec![
                        TranscriptEntry::user(text),
                        TranscriptEntry::assistant("ok"),
                    ],
                )
                .await
                .unwrap();
        }
        let undone = a.transcripts().undo_last_exchange("s").await.unwrap();
        assert_eq!(
            undone.map(|u| (u.user_text, u.entries)),
            Some(("from a".into(), 2))
        );
        assert_eq!(a.transcripts().undone_len("s").await.unwrap(), 2);
        assert_eq!(b.transcripts().undone_len("s").await.unwrap(), 0);
        assert_eq!(b.transcripts().transcript_len("s").await.unwrap(), 2);
        assert_eq!(
            b.transcripts()
                .last_user_message("s")
                .await
                .unwrap()
                .as_deref(),
            Some("from b")
        );
        assert_eq!(a.transcripts().last_user_message("s").await.unwrap(), None);
    }
}
