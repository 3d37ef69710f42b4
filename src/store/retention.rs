//! Pruning the inbox: finished rows older than the retention are deleted.
//!
//! The inbox keeps one row per update (strangers' included) so that a
//! redelivered update is recognised and an unfinished one resumed. A
//! finished row (answered, failed, dropped) is only needed while Telegram
//! might deliver its update again, which it does for at most a day; after
//! `[store] inbox_retention_days` (default 7) it is deleted.
//!
//! The forum-topic claims of messages no longer unfinished go with the
//! same retention (`topic_creations`).
//!
//! It prunes only the handle's bot's rows.
//!
//! This module owns these deletes. It must never touch rows that are not
//! finished (received, running: they are still to be answered) nor the
//! transcripts, which are the conversations themselves.

use rusqlite::params;

use super::{now_ms, Inbox, StoreError, WriteKind};

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

impl Inbox {
    /// Delete finished inbox rows last updated more than `days` days ago,
    /// and topic claims as old whose message is finished. Returns how many
    /// inbox rows were deleted.
    pub async fn prune_inbox(&self, days: u64) -> Result<usize, StoreError> {
        let age = i64::try_from(days)
            .unwrap_or(i64::MAX)
            .saturating_mul(DAY_MS);
        let bot = self.bot();
        self.write(WriteKind::Retention, move |conn| {
            let cutoff = now_ms().saturating_sub(age);
            let deleted = conn.execute(
                "DELETE FROM inbox
                 WHERE bot_id = ?2 AND state IN ('answered', 'failed', 'dropped')
                   AND updated_at < ?1",
                params![cutoff, bot],
            )?;
            // A topic claim is needed while its message may be replayed:
            // as long as the message's inbox row is unfinished.
            conn.execute(
                "DELETE FROM topic_creations
                 WHERE bot_id = ?2 AND created_at < ?1 AND NOT EXISTS (
                     SELECT 1 FROM inbox
                     WHERE inbox.bot_id = topic_creations.bot_id
                       AND inbox.chat_id = topic_creations.chat_id
                       AND inbox.message_id = topic_creations.message_id
                       AND inbox.state IN ('received', 'running'))",
                params![cutoff, bot],
            )?;
            Ok(deleted)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;
    use crate::store::TranscriptEntry;
    use crate::vocab::BotId;
    use crate::vocab::InboxState;

    #[tokio::test]
    async fn only_old_finished_rows_go_and_transcripts_stay() {
        let store = Store::open_in_memory().unwrap();
        for (id, state) in [
            (1, InboxState::Answered),
            (2, InboxState::Dropped),
            (3, InboxState::Failed),
            (4, InboxState::Received),
            (5, InboxState::Running),
            (6, InboxState::Answered),
        ] {
            store
                .inbox()
                .record_update(id, 7, Some(id), serde_json::json!({}), state, None)
                .await
                .unwrap();
        }
        store
            .transcripts()
            .append_many("s", vec![TranscriptEntry::user("hi")])
            .await
            .unwrap();
        // Rows 1-5 are eight days old; row 6 is new.
        store
            .call(|c| {
                Ok(c.execute(
                    "UPDATE inbox SET updated_at = updated_at - 8 * 86400000 WHERE update_id < 6",
                    [],
                )?)
            })
            .await
            .unwrap();
        assert_eq!(store.inbox().prune_inbox(7).await.unwrap(), 3);
        let left: Vec<i64> = store
            .call(|c| {
                let mut s = c.prepare("SELECT update_id FROM inbox ORDER BY update_id")?;
                let rows = s.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        assert_eq!(left, vec![4, 5, 6]);
        assert_eq!(store.transcripts().transcript_len("s").await.unwrap(), 1);
    }

    #[tokio::test]
    async fn pruning_deletes_only_the_handles_bots_rows() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        for bot in [&a, &b] {
            bot.inbox()
                .record_update(
                    1,
                    7,
                    Some(1),
                    serde_json::json!({}),
                    InboxState::Answered,
                    None,
                )
                .await
                .unwrap();
            bot.topic_creations().begin_topic(7, 1).await.unwrap();
        }
        // B's message is unfinished again under A's identical ids: A's
        // claim must not be kept alive by B's row, nor B's pruned by A.
        b.inbox()
            .record_update(
                2,
                7,
                Some(2),
                serde_json::json!({}),
                InboxState::Received,
                None,
            )
            .await
            .unwrap();
        a.topic_creations().begin_topic(7, 2).await.unwrap();
        store
            .call(|c| {
                c.execute_batch(
                    "UPDATE inbox SET updated_at = updated_at - 8 * 86400000;
                     UPDATE topic_creations SET created_at = created_at - 8 * 86400000;",
                )?;
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(a.inbox().prune_inbox(7).await.unwrap(), 1);
        assert!(a.inbox().inbox_entry(1).await.unwrap().is_none());
        assert!(b.inbox().inbox_entry(1).await.unwrap().is_some());
        let claims = |bot: i64| {
            let store = store.clone();
            async move {
                store
                    .call(move |c| {
                        let mut s = c.prepare(
                            "SELECT message_id FROM topic_creations WHERE bot_id = ?1
                             ORDER BY message_id",
                        )?;
                        let rows = s.query_map([bot], |r| r.get::<_, i64>(0))?;
                        Ok(rows.collect::<Result<Vec<_>, _>>()?)
                    })
                    .await
                    .unwrap()
            }
        };
        assert_eq!(claims(1).await, Vec::<i64>::new());
        assert_eq!(claims(2).await, vec![1]);
    }
}
