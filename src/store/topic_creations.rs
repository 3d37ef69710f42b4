//! Forum topics made for messages (migration "forum topics made for
//! messages"): which topic `createForumTopic` made for which message, so a
//! message replayed after a crash runs in the topic made for it instead of
//! getting a second one.
//!
//! The row is written before the request is sent (the thread id empty)
//! and completed with its answer: a row still empty at replay means the
//! request may have made a topic whose id was never recorded, which the
//! caller tells the user instead of trying again. Owns only this table.
//!
//! Claims are per bot (`bot_id` leads the key).

use rusqlite::{params, OptionalExtension};

use super::{now_ms, StoreError, TopicCreations, WriteKind};

/// What the store knew of a message's topic when its creation was begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicClaim {
    /// Nothing before: the caller makes the topic (the claim is recorded).
    New,
    /// The topic made for this message before (a replay).
    Made(i32),
    /// A creation was begun before and its answer never recorded: a topic
    /// may exist without its id.
    Unclear,
}

impl TopicCreations {
    /// Claim the creation of the topic for `message_id` in `chat_id`.
    pub async fn begin_topic(
        &self,
        chat_id: i64,
        message_id: i64,
    ) -> Result<TopicClaim, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Session, move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO topic_creations
                     (bot_id, chat_id, message_id, thread_id, created_at)
                     VALUES (?4, ?1, ?2, NULL, ?3)",
                )?
                .execute(params![chat_id, message_id, now_ms(), bot])?;
            if inserted == 1 {
                return Ok(TopicClaim::New);
            }
            let thread: Option<Option<i64>> = conn
                .prepare_cached(
                    "SELECT thread_id FROM topic_creations
                     WHERE bot_id = ?3 AND chat_id = ?1 AND message_id = ?2",
                )?
                .query_row(params![chat_id, message_id, bot], |row| row.get(0))
                .optional()?;
            Ok(match thread.flatten().and_then(|t| i32::try_from(t).ok()) {
                Some(thread) => TopicClaim::Made(thread),
                None => TopicClaim::Unclear,
            })
        })
        .await
    }

    /// The topic `thread_id` was made for `message_id`.
    pub async fn topic_made(
        &self,
        chat_id: i64,
        message_id: i64,
        thread_id: i32,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write_one(WriteKind::Session, move |conn| {
            conn.prepare_cached(
                "UPDATE topic_creations SET thread_id = ?3
                 WHERE bot_id = ?4 AND chat_id = ?1 AND message_id = ?2",
            )?
            .execute(params![chat_id, message_id, i64::from(thread_id), bot])?;
            Ok(())
        })
        .await
    }

    /// The creation failed (Telegram refused it): no topic was made, so a
    /// replay may try again.
    pub async fn topic_refused(&self, chat_id: i64, message_id: i64) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write_one(WriteKind::Session, move |conn| {
            conn.prepare_cached(
                "DELETE FROM topic_creations
                 WHERE bot_id = ?3 AND chat_id = ?1 AND message_id = ?2 AND thread_id IS NULL",
            )?
            .execute(params![chat_id, message_id, bot])?;
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::TopicClaim;
    use crate::store::Store;
    use crate::vocab::BotId;

    #[tokio::test]
    async fn a_replayed_message_finds_its_topic_and_an_unanswered_creation_is_unclear() {
        let store = Store::open_in_memory().unwrap();
        let topics = store.topic_creations();
        assert_eq!(topics.begin_topic(-1, 10).await.unwrap(), TopicClaim::New);
        assert_eq!(
            topics.begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Unclear
        );
        topics.topic_made(-1, 10, 77).await.unwrap();
        assert_eq!(
            topics.begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Made(77)
        );
        // Another message, refused: a replay may try again.
        assert_eq!(topics.begin_topic(-1, 11).await.unwrap(), TopicClaim::New);
        topics.topic_refused(-1, 11).await.unwrap();
        assert_eq!(topics.begin_topic(-1, 11).await.unwrap(), TopicClaim::New);
        // The same message id in another chat is another message.
        assert_eq!(topics.begin_topic(-2, 10).await.unwrap(), TopicClaim::New);
    }

    #[tokio::test]
    async fn an_old_claim_goes_with_the_inbox_retention() {
        let store = Store::open_in_memory().unwrap();
        let topics = store.topic_creations();
        assert_eq!(topics.begin_topic(-1, 10).await.unwrap(), TopicClaim::New);
        topics.topic_made(-1, 10, 77).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        store.inbox().prune_inbox(7).await.unwrap();
        assert_eq!(
            topics.begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Made(77),
            "kept within the retention"
        );
        store.inbox().prune_inbox(0).await.unwrap();
        assert_eq!(
            topics.begin_topic(-1, 10).await.unwrap(),
            TopicClaim::New,
            "pruned after it"
        );
    }

    #[tokio::test]
    async fn two_bots_claim_a_topic_for_the_same_message_each() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        assert_eq!(
            a.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::New
        );
        assert_eq!(
            b.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::New
        );
        b.topic_creations().topic_made(-1, 10, 88).await.unwrap();
        a.topic_creations().topic_refused(-1, 10).await.unwrap();
        assert_eq!(
            a.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::New
        );
        assert_eq!(
            b.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Made(88)
        );
        a.topic_creations().topic_made(-1, 10, 77).await.unwrap();
        assert_eq!(
            a.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Made(77)
        );
        assert_eq!(
            b.topic_creations().begin_topic(-1, 10).await.unwrap(),
            TopicClaim::Made(88)
        );
    }
}
