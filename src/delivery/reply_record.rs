//! The outbox record of one reply ([`ReplyRecord`]): what the store knows
//! of the messages carrying an answer, shared by the sends, the live view
//! and recovery. It only reads and writes the store's outbox row; it never
//! sends anything.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::store::{Outbox, OutboxEntry};

/// The outbox record of one reply: which Telegram messages carry the answer
/// to a user message, so a restart neither sends a delivered answer again
/// nor abandons a half-streamed preview.
///
/// Clones share what this process knows of the row: once it was read, or
/// for a message this process recorded itself ([`ReplyRecord::fresh`]),
/// reads are answered from memory and only writes reach the store. Nobody
/// else writes a message's row while its turn runs (recovery, the only
/// other writer, runs before a replayed message's turn starts), so memory
/// and store agree; where a write fails, memory keeps what was attempted,
/// which is the safe side (an intent stays an intent).
#[derive(Clone)]
pub struct ReplyRecord {
    outbox: Outbox,
    chat_id: i64,
    message_id: i64,
    /// `None` until known; then the row (`None`: no row).
    known: Arc<Mutex<Option<Option<OutboxEntry>>>>,
}

impl ReplyRecord {
    /// The record for the answer to `message_id` in `chat_id`, read from
    /// the store when first needed.
    pub fn new(outbox: Outbox, chat_id: i64, message_id: i64) -> Self {
        ReplyRecord {
            outbox,
            chat_id,
            message_id,
            known: Arc::new(Mutex::new(None)),
        }
    }

    /// The record for the answer to a message this process recorded in the
    /// inbox itself (not replayed by recovery): it has no row yet, so the
    /// first read costs no store call.
    pub fn fresh(outbox: Outbox, chat_id: i64, message_id: i64) -> Self {
        let record = ReplyRecord::new(outbox, chat_id, message_id);
        *record.lock() = Some(None);
        record
    }

    fn lock(&self) -> MutexGuard<'_, Option<Option<OutboxEntry>>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What was recorded before (by this process or an earlier one).
    pub async fn recorded(&self) -> Option<OutboxEntry> {
        if let Some(known) = self.lock().clone() {
            return known;
        }
        match self.outbox.reply_of(self.chat_id, self.message_id).await {
            Ok(entry) => {
                let mut known = self.lock();
                // A write that landed meanwhile is newer than this read.
                known.get_or_insert(entry).clone()
            }
            Err(error) => {
                tracing::warn!(chat_id = self.chat_id, %error, "outbox unavailable");
                None
            }
        }
    }

    /// Record that the answer is about to be sent as new messages (`ids`:
    /// the messages carrying it so far). Written before the request; a
    /// store that refuses is logged and the answer still goes out.
    pub async fn intend(&self, ids: Vec<i32>) {
        {
            // As the store does: an answer delivered stays delivered.
            let mut known = self.lock();
            let delivered = matches!(&*known, Some(Some(entry)) if entry.delivered);
            if !delivered {
                *known = Some(Some(OutboxEntry {
                    reply_ids: ids.clone(),
                    delivered: false,
                    sending: true,
                }));
            }
        }
        if let Err(error) = self
            .outbox
            .record_send_intent(self.chat_id, self.message_id, ids)
            .await
        {
            tracing::warn!(chat_id = self.chat_id, %error, "could not record the intent to send an answer");
        }
    }

    /// Record the reply's messages (`delivered` once the final text is
    /// out). Nobody waits for this write: it is carried by the store's next
    /// batch (before any later call, such as the next intent), and memory
    /// answers this process's reads meanwhile. A crash before it commits
    /// leaves the intent, which recovery treats as "maybe sent" and tells
    /// the user, as for a crash just before this call.
    pub fn save(&self, ids: Vec<i32>, delivered: bool) {
        *self.lock() = Some(Some(OutboxEntry {
            reply_ids: ids.clone(),
            delivered,
            sending: false,
        }));
        self.outbox
            .record_reply_later(self.chat_id, self.message_id, ids, delivered);
    }
}
