//! The crash-safety ledger: every accepted update (inbox) and every final
//! reply (outbox).
//!
//! The transport writes an update to the inbox *before* it confirms the
//! update to Telegram, so a crash can lose nothing Telegram will not send
//! again; a redelivered update finds its row and is ignored. The state of a
//! row follows the message (`received → running → answered | failed |
//! dropped`), so a restart knows what is unfinished. The outbox remembers
//! which Telegram messages carry each reply, so a restart neither duplicates
//! a delivered reply nor abandons a half-streamed preview; before an answer
//! is sent as a new message, its row durably records the intent, so a
//! restart that finds the intent without an outcome knows the send is
//! ambiguous and never repeats it.
//!
//! Every row is one bot's (`bot_id`): an update id, a chat's message and a
//! background process id are looked up only among the handle's bot's rows.
//!
//! Contents are user data: this module logs ids and states, never text.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use super::{now_ms, Inbox, Outbox, Processes, StoreError, WriteKind};
use crate::vocab::InboxState;

/// One inbox row.
#[derive(Clone, Debug, PartialEq)]
pub struct InboxEntry {
    /// Telegram's update id.
    pub update_id: i64,
    /// The chat.
    pub chat_id: i64,
    /// The user's message id, if the update carried a message.
    pub message_id: Option<i64>,
    /// The raw update, to replay after a restart.
    pub payload: Value,
    /// Where it stands.
    pub state: InboxState,
    /// Why it was dropped or failed.
    pub reason: Option<String>,
}

/// One outbox row: the reply to a user message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxEntry {
    /// Telegram message ids carrying the reply, in order.
    pub reply_ids: Vec<i32>,
    /// True once the final text went out.
    pub delivered: bool,
    /// A send of the answer was started and its outcome never recorded:
    /// the answer may or may not be in the chat (an ambiguous send, never
    /// repeated).
    pub sending: bool,
}

/// An update to record in the inbox ([`Inbox::record_updates`]).
#[derive(Debug, Clone)]
pub struct NewUpdate {
    /// Telegram's update id (the inbox's key).
    pub update_id: i64,
    /// The chat it belongs to (0 if none).
    pub chat_id: i64,
    /// The message it carries, if any.
    pub message_id: Option<i64>,
    /// The update as Telegram sent it (JSON text).
    pub payload: String,
    /// Its first state (received, or dropped with `reason`).
    pub state: InboxState,
    /// Why it was dropped.
    pub reason: Option<String>,
}

/// Moves a message of the handle's bot on, unless it is finished. "Not
/// finished" is said as the two open states, not as "none of the three
/// finished ones": SQLite builds a temporary table for an `IN` list of
/// three or more on every run (a page cache allocated and freed, most of
/// the statement's cost), and the states are exactly these five (a CHECK).
pub(super) const SET_MESSAGE_STATE: &str =
    "UPDATE inbox SET state = ?3, reason = ?4, updated_at = ?5
     WHERE bot_id = ?6 AND chat_id = ?1 AND message_id = ?2
       AND state IN ('received', 'running')";

impl Inbox {
    /// Record an update. Returns `false` if it was already recorded (a
    /// redelivery), in which case nothing changes.
    pub async fn record_update(
        &self,
        update_id: i64,
        chat_id: i64,
        message_id: Option<i64>,
        payload: Value,
        state: InboxState,
        reason: Option<String>,
    ) -> Result<bool, StoreError> {
        let row = NewUpdate {
            update_id,
            chat_id,
            message_id,
            payload: payload.to_string(),
            state,
            reason,
        };
        let inserted = self.record_updates(vec![row]).await?;
        Ok(inserted.first().copied().unwrap_or(false))
    }

    /// Record several updates in one call (all or none): for each, in
    /// order, `true` if it is new, `false` if it was recorded before (a
    /// redelivery, left unchanged). The polling loop records a whole
    /// `getUpdates` batch this way: one store round trip instead of one per
    /// update.
    pub async fn record_updates(&self, rows: Vec<NewUpdate>) -> Result<Vec<bool>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Inbox, move |conn| {
            let now = now_ms();
            let mut statement = conn.prepare_cached(
                "INSERT OR IGNORE INTO inbox
                 (bot_id, update_id, chat_id, message_id, payload, state, reason, received_at,
                  updated_at)
                 VALUES (?8, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
            )?;
            rows.into_iter()
                .map(|row| {
                    let inserted = statement.execute(params![
                        row.update_id,
                        row.chat_id,
                        row.message_id,
                        row.payload,
                        row.state.as_str(),
                        row.reason,
                        now,
                        bot
                    ])?;
                    Ok(inserted == 1)
                })
                .collect()
        })
        .await
    }

    /// Move the message `message_id` of `chat_id` to `state`. Terminal states
    /// are final: a later update never moves a message out of one.
    pub async fn set_message_state(
        &self,
        chat_id: i64,
        message_id: i64,
        state: InboxState,
        reason: Option<String>,
    ) -> Result<bool, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::InboxState, move |conn| {
            let changed = conn.prepare_cached(SET_MESSAGE_STATE)?.execute(params![
                chat_id,
                message_id,
                state.as_str(),
                reason,
                now_ms(),
                bot
            ])?;
            Ok(changed > 0)
        })
        .await
    }

    /// [`Inbox::set_message_state`] for several messages in one store call,
    /// applied in order (the ledger's writer hands over everything queued
    /// at once: one call, one share of a group commit, instead of one
    /// commit's wait per outcome).
    pub async fn set_message_states(
        &self,
        changes: Vec<(i64, i64, InboxState, Option<String>)>,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::InboxState, move |conn| {
            set_states(conn, bot, &changes)
        })
        .await
    }

    /// [`Inbox::set_message_states`] without waiting: carried by the
    /// store's next batch (`store::carried`), before any call made after
    /// it ([`Inbox::settle`] waits for it). A failure shows in `/healthz`
    /// and the log.
    pub fn set_message_states_later(&self, changes: Vec<(i64, i64, InboxState, Option<String>)>) {
        let bot = self.bot();
        let what = "message states";
        self.defer(
            &[WriteKind::InboxState],
            Default::default(),
            what,
            move |conn| set_states(conn, bot, &changes),
        );
    }

    /// Returns once every write deferred before it (the `*_later`
    /// methods) has been committed or has failed.
    pub async fn settle(&self) -> Result<(), StoreError> {
        self.call(|_| Ok(())).await
    }

    /// Messages not finished yet (received or running), in the order they
    /// were recorded (journaled wakeups have negative ids, so the id alone
    /// does not give the order).
    pub async fn open_inbox(&self) -> Result<Vec<InboxEntry>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut statement = conn.prepare(
                "SELECT update_id, chat_id, message_id, payload, state, reason FROM inbox
                 WHERE bot_id = ?1 AND state IN ('received', 'running')
                 ORDER BY received_at, update_id",
            )?;
            let rows = statement.query_map([bot], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, Option<i64>>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            })?;
            let mut entries = Vec::new();
            for row in rows {
                let (update_id, chat_id, message_id, payload, state, reason) = row?;
                entries.push(InboxEntry {
                    update_id,
                    chat_id,
                    message_id,
                    payload: serde_json::from_str(&payload)?,
                    state: InboxState::parse(&state).unwrap_or(InboxState::Received),
                    reason,
                });
            }
            Ok(entries)
        })
        .await
    }

    /// How many inbox rows are in each state.
    pub async fn inbox_counts(&self) -> Result<Vec<(InboxState, u64)>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut counts: Vec<(InboxState, u64)> =
                InboxState::ALL.iter().map(|s| (*s, 0)).collect();
            let mut statement =
                conn.prepare("SELECT state, COUNT(*) FROM inbox WHERE bot_id = ?1 GROUP BY state")?;
            let rows = statement.query_map([bot], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })?;
            for row in rows {
                let (state, count) = row?;
                if let Some(slot) = counts
                    .iter_mut()
                    .find(|(s, _)| Some(*s) == InboxState::parse(&state))
                {
                    slot.1 = count.max(0) as u64;
                }
            }
            Ok(counts)
        })
        .await
    }

    /// The inbox row of an update.
    pub async fn inbox_entry(&self, update_id: i64) -> Result<Option<InboxEntry>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let row = conn.prepare_cached("SELECT chat_id, message_id, payload, state, reason FROM inbox WHERE bot_id = ?2 AND update_id = ?1")?.query_row(params![update_id, bot],
                    |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, Option<i64>>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, String>(3)?,
                            row.get::<_, Option<String>>(4)?,
                        ))
                    },
                )
                .optional()?;
            match row {
                None => Ok(None),
                Some((chat_id, message_id, payload, state, reason)) => Ok(Some(InboxEntry {
                    update_id,
                    chat_id,
                    message_id,
                    payload: serde_json::from_str(&payload)?,
                    state: InboxState::parse(&state).unwrap_or(InboxState::Received),
                    reason,
                })),
            }
        })
        .await
    }
}

impl Outbox {
    /// Record, durably, that an answer to user message `message_id` in
    /// `chat_id` is about to be sent as new messages (`reply_ids`: those
    /// that carry it so far, a preview). Until [`Outbox::record_reply`]
    /// records its outcome, the row says the send is ambiguous.
    pub async fn record_send_intent(
        &self,
        chat_id: i64,
        message_id: i64,
        reply_ids: Vec<i32>,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write_one(WriteKind::Outbox, move |conn| {
            let ids = serde_json::to_string(&reply_ids)?;
            let now = now_ms();
            conn.prepare_cached(
                "INSERT INTO outbox
                 (bot_id, chat_id, message_id, reply_ids, state, updated_at, sending_at)
                 VALUES (?5, ?1, ?2, ?3, 'streaming', ?4, ?4)
                 ON CONFLICT (bot_id, chat_id, message_id) DO UPDATE
                 SET reply_ids = excluded.reply_ids, updated_at = excluded.updated_at,
                     sending_at = excluded.sending_at
                 WHERE state <> 'delivered'",
            )?
            .execute(params![chat_id, message_id, ids, now, bot])?;
            Ok(())
        })
        .await
    }

    /// Record the reply messages of user message `message_id` in `chat_id`
    /// (clears a send intent: the outcome is known).
    pub async fn record_reply(
        &self,
        chat_id: i64,
        message_id: i64,
        reply_ids: Vec<i32>,
        delivered: bool,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write_one(WriteKind::Outbox, move |conn| {
            upsert_reply(conn, bot, chat_id, message_id, &reply_ids, delivered)
        })
        .await
    }

    /// [`Outbox::record_reply`] without waiting: carried by the store's
    /// next batch (`store::carried`), before any call made after it. A
    /// failure shows in `/healthz` and the log.
    pub fn record_reply_later(
        &self,
        chat_id: i64,
        message_id: i64,
        reply_ids: Vec<i32>,
        delivered: bool,
    ) {
        let bot = self.bot();
        self.defer(
            &[WriteKind::Outbox],
            Default::default(),
            "a reply in the outbox",
            move |conn| upsert_reply(conn, bot, chat_id, message_id, &reply_ids, delivered),
        );
    }

    /// The recorded reply of user message `message_id` in `chat_id`.
    pub async fn reply_of(
        &self,
        chat_id: i64,
        message_id: i64,
    ) -> Result<Option<OutboxEntry>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let row = conn
                .prepare_cached(
                    "SELECT reply_ids, state, sending_at FROM outbox
                     WHERE bot_id = ?3 AND chat_id = ?1 AND message_id = ?2",
                )?
                .query_row(params![chat_id, message_id, bot], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, Option<i64>>(2)?,
                    ))
                })
                .optional()?;
            match row {
                None => Ok(None),
                Some((ids, state, sending_at)) => Ok(Some(OutboxEntry {
                    reply_ids: serde_json::from_str(&ids)?,
                    delivered: state == "delivered",
                    sending: sending_at.is_some() && state != "delivered",
                })),
            }
        })
        .await
    }
}

/// A background process recorded as running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningProcess {
    /// The registry's process id.
    pub process_id: String,
    /// The chat that started it.
    pub chat_id: i64,
    /// Its forum topic, if any.
    pub thread_id: Option<i32>,
    /// The command.
    pub command: String,
}

impl Processes {
    /// Record a background process as running.
    pub async fn process_started(&self, process: RunningProcess) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Process, move |conn| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO background_processes
                 (bot_id, process_id, chat_id, thread_id, command, started_at)
                 VALUES (?6, ?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                process.process_id,
                process.chat_id,
                process.thread_id,
                process.command,
                now_ms(),
                bot
            ])?;
            Ok(())
        })
        .await
    }

    /// Forget a background process (it ended and its owner was told, or
    /// will be by its wakeup).
    pub async fn process_ended(&self, process_id: String) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Process, move |conn| {
            conn.prepare_cached(
                "DELETE FROM background_processes WHERE bot_id = ?2 AND process_id = ?1",
            )?
            .execute(params![process_id, bot])?;
            Ok(())
        })
        .await
    }

    /// Take every process still recorded as running (at start: they died
    /// with the previous process), removing them.
    pub async fn take_lost_processes(&self) -> Result<Vec<RunningProcess>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Process, move |conn| {
            let tx = conn.savepoint()?;
            let lost = {
                let mut statement = tx.prepare(
                    "SELECT process_id, chat_id, thread_id, command FROM background_processes
                     WHERE bot_id = ?1 ORDER BY started_at",
                )?;
                let rows = statement.query_map([bot], |row| {
                    Ok(RunningProcess {
                        process_id: row.get(0)?,
                        chat_id: row.get(1)?,
                        thread_id: row.get(2)?,
                        command: row.get(3)?,
                    })
                })?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            tx.execute("DELETE FROM background_processes WHERE bot_id = ?1", [bot])?;
            tx.commit()?;
            Ok(lost)
        })
        .await
    }
}

/// Sets each message's state, in order (one cached statement).
fn set_states(
    conn: &Connection,
    bot: i64,
    changes: &[(i64, i64, InboxState, Option<String>)],
) -> Result<(), StoreError> {
    let now = now_ms();
    let mut statement = conn.prepare_cached(SET_MESSAGE_STATE)?;
    for (chat_id, message_id, state, reason) in changes {
        statement.execute(params![
            chat_id,
            message_id,
            state.as_str(),
            reason,
            now,
            bot
        ])?;
    }
    Ok(())
}

/// The reply row of `message_id`: its messages, delivered or streaming.
fn upsert_reply(
    conn: &Connection,
    bot: i64,
    chat_id: i64,
    message_id: i64,
    reply_ids: &[i32],
    delivered: bool,
) -> Result<(), StoreError> {
    let ids = serde_json::to_string(reply_ids)?;
    conn.prepare_cached(
        "INSERT INTO outbox (bot_id, chat_id, message_id, reply_ids, state, updated_at)
         VALUES (?6, ?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (bot_id, chat_id, message_id) DO UPDATE
         SET reply_ids = excluded.reply_ids, state = excluded.state,
             updated_at = excluded.updated_at, sending_at = NULL",
    )?
    .execute(params![
        chat_id,
        message_id,
        ids,
        if delivered { "delivered" } else { "streaming" },
        now_ms(),
        bot
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;
    use serde_json::json;

    /// The state updates every turn runs build no temporary table
    /// (`OpenEphemeral`: a page cache allocated and freed on each run); the old
    /// "none of the finished states" form did, and the check sees it.
    #[test]
    fn the_state_updates_build_no_temporary_table() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::store::schema::migrate(&mut conn).unwrap();
        let ephemeral = |sql: &str| crate::store::checks::builds_a_table(&conn, sql);
        assert!(!ephemeral(SET_MESSAGE_STATE));
        assert!(!ephemeral(crate::store::buttons::SET_UPDATE_STATE));
        assert!(ephemeral(
            "UPDATE inbox SET state = ?2 WHERE bot_id = ?3 AND update_id = ?1
               AND state NOT IN ('answered', 'failed', 'dropped')"
        ));
    }

    fn new_update(update_id: i64, message_id: i64) -> NewUpdate {
        NewUpdate {
            update_id,
            chat_id: 5,
            message_id: Some(message_id),
            payload: json!({"update_id": update_id}).to_string(),
            state: InboxState::Received,
            reason: None,
        }
    }

    #[tokio::test]
    async fn a_batch_of_updates_says_which_are_new_in_order() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(
            store
                .inbox()
                .record_updates(vec![new_update(1, 10), new_update(2, 11)])
                .await
                .unwrap(),
            vec![true, true]
        );
        // A redelivered batch overlapping the first: only 3 is new, and the
        // rows recorded before are left as they were.
        store
            .inbox()
            .set_message_state(5, 10, InboxState::Answered, None)
            .await
            .unwrap();
        assert_eq!(
            store
                .inbox()
                .record_updates(vec![
                    new_update(2, 11),
                    new_update(3, 12),
                    new_update(1, 10)
                ])
                .await
                .unwrap(),
            vec![false, true, false]
        );
        let first = store
            .inbox()
            .inbox_entry(1)
            .await
            .unwrap()
            .expect("recorded");
        assert_eq!(first.state, InboxState::Answered);
        assert!(store
            .inbox()
            .record_updates(Vec::new())
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn terminal_states_are_exactly_those_the_store_never_leaves() {
        let store = Store::open_in_memory().unwrap();
        for (index, state) in InboxState::ALL.into_iter().enumerate() {
            let message_id = 100 + index as i64;
            store
                .inbox()
                .record_updates(vec![new_update(message_id, message_id)])
                .await
                .unwrap();
            store
                .inbox()
                .set_message_state(5, message_id, state, None)
                .await
                .unwrap();
            let moved = store
                .inbox()
                .set_message_state(5, message_id, InboxState::Running, None)
                .await
                .unwrap();
            assert_eq!(moved, !state.is_terminal(), "{state:?}");
        }
        assert!(!InboxState::Received.is_terminal() && !InboxState::Running.is_terminal());
    }

    #[tokio::test]
    async fn a_redelivered_update_is_recognised() {
        let store = Store::open_in_memory().unwrap();
        let payload = json!({"update_id": 7});
        assert!(store
            .inbox()
            .record_update(7, 1, Some(10), payload.clone(), InboxState::Received, None)
            .await
            .unwrap());
        assert!(!store
            .inbox()
            .record_update(7, 1, Some(10), payload, InboxState::Received, None)
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn states_move_forward_and_terminal_states_stick() {
        let store = Store::open_in_memory().unwrap();
        store
            .inbox()
            .record_update(1, 5, Some(100), json!({}), InboxState::Received, None)
            .await
            .unwrap();
        store
            .inbox()
            .record_update(2, 5, Some(101), json!({}), InboxState::Received, None)
            .await
            .unwrap();
        assert!(store
            .inbox()
            .set_message_state(5, 100, InboxState::Running, None)
            .await
            .unwrap());
        let open = store.inbox().open_inbox().await.unwrap();
        assert_eq!(open.len(), 2);
        assert_eq!(open[0].state, InboxState::Running);
        assert!(store
            .inbox()
            .set_message_state(5, 100, InboxState::Answered, None)
            .await
            .unwrap());
        assert!(!store
            .inbox()
            .set_message_state(5, 100, InboxState::Running, None)
            .await
            .unwrap());
        let counts = store.inbox().inbox_counts().await.unwrap();
        assert!(counts.contains(&(InboxState::Answered, 1)));
        assert!(counts.contains(&(InboxState::Received, 1)));
        assert_eq!(store.inbox().open_inbox().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn processes_still_recorded_at_start_are_taken_once() {
        let store = Store::open_in_memory().unwrap();
        let process = |id: &str| RunningProcess {
            process_id: id.to_string(),
            chat_id: 5,
            thread_id: None,
            command: "sleep 100".to_string(),
        };
        store
            .processes()
            .process_started(process("p1"))
            .await
            .unwrap();
        store
            .processes()
            .process_started(process("p2"))
            .await
            .unwrap();
        store
            .processes()
            .process_ended("p1".to_string())
            .await
            .unwrap();
        assert_eq!(
            store.processes().take_lost_processes().await.unwrap(),
            vec![process("p2")]
        );
        assert!(store
            .processes()
            .take_lost_processes()
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn replies_are_recorded_per_user_message() {
        let store = Store::open_in_memory().unwrap();
        assert_eq!(store.outbox().reply_of(5, 100).await.unwrap(), None);
        store
            .outbox()
            .record_reply(5, 100, vec![77], false)
            .await
            .unwrap();
        store
            .outbox()
            .record_reply(5, 100, vec![77, 78], true)
            .await
            .unwrap();
        assert_eq!(
            store.outbox().reply_of(5, 100).await.unwrap(),
            Some(OutboxEntry {
                reply_ids: vec![77, 78],
                delivered: true,
                sending: false,
            })
        );
    }

    #[tokio::test]
    async fn a_send_intent_stays_until_its_outcome_is_recorded() {
        let store = Store::open_in_memory().unwrap();
        store
            .outbox()
            .record_send_intent(5, 100, vec![])
            .await
            .unwrap();
        assert_eq!(
            store.outbox().reply_of(5, 100).await.unwrap(),
            Some(OutboxEntry {
                reply_ids: vec![],
                delivered: false,
                sending: true,
            })
        );
        store
            .outbox()
            .record_reply(5, 100, vec![77], true)
            .await
            .unwrap();
        let entry = store.outbox().reply_of(5, 100).await.unwrap().unwrap();
        assert!(entry.delivered && !entry.sending);
        // A delivered answer is never turned back into an intent.
        store
            .outbox()
            .record_send_intent(5, 100, vec![77])
            .await
            .unwrap();
        let entry = store.outbox().reply_of(5, 100).await.unwrap().unwrap();
        assert!(entry.delivered && !entry.sending);
        // A preview's row keeps its ids when the rest is about to go out.
        store
            .outbox()
            .record_reply(5, 101, vec![80], false)
            .await
            .unwrap();
        store
            .outbox()
            .record_send_intent(5, 101, vec![80])
            .await
            .unwrap();
        assert_eq!(
            store.outbox().reply_of(5, 101).await.unwrap(),
            Some(OutboxEntry {
                reply_ids: vec![80],
                delivered: false,
                sending: true,
            })
        );
    }

    /// One store, two bots, as [`Store::for_bot`] hands them out.
    fn two_bots() -> (Store, Store) {
        let store = Store::open_in_memory().unwrap();
        (store.for_bot(BotId(1)), store.for_bot(BotId(2)))
    }

    #[tokio::test]
    async fn two_bots_record_the_same_update_id_each_in_its_own_inbox() {
        let (a, b) = two_bots();
        let record = |store: &Store, bot: i64| {
            let inbox = store.inbox();
            async move {
                inbox
                    .record_update(
                        7,
                        5,
                        Some(10),
                        json!({ "bot": bot }),
                        InboxState::Received,
                        None,
                    )
                    .await
                    .unwrap()
            }
        };
        assert!(record(&a, 1).await);
        assert!(
            record(&b, 2).await,
            "not a redelivery: another bot's update"
        );
        assert!(!record(&a, 1).await, "a redelivery to the same bot");
        let entry = b.inbox().inbox_entry(7).await.unwrap().unwrap();
        assert_eq!(entry.payload, json!({"bot": 2}));
        // The same message of the same chat moves on for one bot only.
        assert!(a
            .inbox()
            .set_message_state(5, 10, InboxState::Answered, None)
            .await
            .unwrap());
        a.inbox()
            .set_message_states(vec![(5, 10, InboxState::Running, None)])
            .await
            .unwrap();
        assert!(a.inbox().open_inbox().await.unwrap().is_empty());
        let open = b.inbox().open_inbox().await.unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].state, InboxState::Received);
        assert!(a
            .inbox()
            .inbox_counts()
            .await
            .unwrap()
            .contains(&(InboxState::Received, 0)));
        assert!(b
            .inbox()
            .inbox_counts()
            .await
            .unwrap()
            .contains(&(InboxState::Received, 1)));
        // Nor does the unscoped handle see either.
        let unclaimed = a.for_bot(BotId::UNCLAIMED);
        assert!(unclaimed.inbox().inbox_entry(7).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn two_bots_keep_their_own_reply_to_the_same_message() {
        let (a, b) = two_bots();
        a.outbox().record_send_intent(5, 100, vec![]).await.unwrap();
        assert_eq!(b.outbox().reply_of(5, 100).await.unwrap(), None);
        b.outbox()
            .record_reply(5, 100, vec![9], true)
            .await
            .unwrap();
        let ours = a.outbox().reply_of(5, 100).await.unwrap().unwrap();
        assert!(ours.sending && !ours.delivered, "{ours:?}");
        // A's intent never turns B's delivered reply back into an intent.
        b.outbox()
            .record_send_intent(5, 100, vec![9])
            .await
            .unwrap();
        a.outbox()
            .record_reply(5, 100, vec![3], false)
            .await
            .unwrap();
        assert_eq!(
            b.outbox().reply_of(5, 100).await.unwrap(),
            Some(OutboxEntry {
                reply_ids: vec![9],
                delivered: true,
                sending: false,
            })
        );
    }

    #[tokio::test]
    async fn each_bot_takes_only_its_own_lost_processes() {
        let (a, b) = two_bots();
        let process = |chat_id: i64| RunningProcess {
            process_id: "p1".to_string(),
            chat_id,
            thread_id: None,
            command: "sleep 100".to_string(),
        };
        a.processes().process_started(process(1)).await.unwrap();
        b.processes().process_started(process(2)).await.unwrap();
        b.processes().process_ended("p1".to_string()).await.unwrap();
        assert!(b
            .processes()
            .take_lost_processes()
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            a.processes().take_lost_processes().await.unwrap(),
            vec![process(1)]
        );
    }
}
