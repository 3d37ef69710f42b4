//! The record of approval decisions: how each request of the approval gate
//! ended, who chose which option and when (migration "approval
//! decisions").
//!
//! Written once per request by the gate (`tools::approval_gate`), read by
//! the operator and the tests; and the message that shows each request,
//! so its ending can be shown there. This module never decides anything.
//!
//! Prompts (by ticket) and decisions are the handle's bot's (`bot_id`).

use rusqlite::{params, OptionalExtension};

use super::{now_ms, Approvals, StoreError, WriteKind};

/// Prompts older than this are forgotten (their buttons expired long ago).
const KEEP_PROMPT_MS: i64 = 24 * 3600 * 1000;

/// The message that shows an approval request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalPrompt {
    /// The chat.
    pub chat_id: i64,
    /// The forum topic, if any.
    pub thread_id: Option<i32>,
    /// The message (the prompt's last part, with the buttons).
    pub message_id: i32,
    /// Its text.
    pub text: String,
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalRecord {
    /// Its one-time id.
    pub ticket: String,
    /// The slot whose turn asked.
    pub session_key: String,
    /// The chat it was asked in.
    pub chat_id: i64,
    /// What it asked about (the command; the tool and its title), cut to
    /// a bounded length.
    pub subject: String,
    /// `chosen`, or why nothing was: `denied`, `timed_out`, `stopped`,
    /// `superseded`.
    pub outcome: String,
    /// The option chosen: its id, label and kind (`allow_once`…).
    pub option_id: Option<String>,
    /// The option's label.
    pub option_label: Option<String>,
    /// The option's kind.
    pub option_kind: Option<String>,
    /// Who chose (user id), if someone did.
    pub decided_by: Option<u64>,
    /// Their display name.
    pub decided_by_name: Option<String>,
    /// Unix ms when it was asked.
    pub asked_at: i64,
    /// Unix ms when it ended.
    pub decided_at: i64,
}

impl Approvals {
    /// Request `ticket` is shown by `prompt` (and forget prompts long gone).
    pub async fn record_approval_prompt(
        &self,
        ticket: &str,
        prompt: ApprovalPrompt,
    ) -> Result<(), StoreError> {
        let (bot, ticket) = (self.bot(), ticket.to_owned());
        self.write(WriteKind::Approval, move |conn| {
            let now = now_ms();
            conn.prepare_cached(
                "DELETE FROM approval_prompts WHERE bot_id = ?2 AND created_at < ?1",
            )?
            .execute(params![now - KEEP_PROMPT_MS, bot])?;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO approval_prompts
                     (bot_id, ticket, chat_id, thread_id, message_id, text, created_at)
                 VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                ticket,
                prompt.chat_id,
                prompt.thread_id,
                prompt.message_id,
                prompt.text,
                now,
                bot
            ])?;
            Ok(())
        })
        .await
    }

    /// The message showing request `ticket`, taken out (it is edited once).
    pub async fn take_approval_prompt(
        &self,
        ticket: &str,
    ) -> Result<Option<ApprovalPrompt>, StoreError> {
        let (bot, ticket) = (self.bot(), ticket.to_owned());
        self.write(WriteKind::Approval, move |conn| {
            let found = conn
                .prepare_cached(
                    "SELECT chat_id, thread_id, message_id, text FROM approval_prompts
                     WHERE bot_id = ?2 AND ticket = ?1",
                )?
                .query_row(params![&ticket, bot], |r| {
                    Ok(ApprovalPrompt {
                        chat_id: r.get(0)?,
                        thread_id: r.get(1)?,
                        message_id: r.get(2)?,
                        text: r.get(3)?,
                    })
                })
                .optional()?;
            conn.prepare_cached("DELETE FROM approval_prompts WHERE bot_id = ?2 AND ticket = ?1")?
                .execute(params![&ticket, bot])?;
            Ok(found)
        })
        .await
    }

    /// Record how a request ended.
    pub async fn record_approval(&self, record: ApprovalRecord) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Approval, move |conn| {
            conn.prepare_cached(
                "INSERT INTO approval_decisions (bot_id, ticket, session_key, chat_id, subject,
                     outcome, option_id, option_label, option_kind, decided_by, decided_by_name,
                     asked_at, decided_at)
                 VALUES (?13, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?
            .execute(params![
                record.ticket,
                record.session_key,
                record.chat_id,
                record.subject,
                record.outcome,
                record.option_id,
                record.option_label,
                record.option_kind,
                record.decided_by.and_then(|u| i64::try_from(u).ok()),
                record.decided_by_name,
                record.asked_at,
                record.decided_at,
                bot
            ])?;
            Ok(())
        })
        .await
    }

    /// The decisions recorded for the slot `session_key`, oldest first.
    pub async fn approval_records(
        &self,
        session_key: &str,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let (bot, session_key) = (self.bot(), session_key.to_owned());
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT ticket, session_key, chat_id, subject, outcome, option_id, option_label,
                        option_kind, decided_by, decided_by_name, asked_at, decided_at
                 FROM approval_decisions WHERE bot_id = ?2 AND session_key = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map(params![session_key, bot], |r| {
                Ok(ApprovalRecord {
                    ticket: r.get(0)?,
                    session_key: r.get(1)?,
                    chat_id: r.get(2)?,
                    subject: r.get(3)?,
                    outcome: r.get(4)?,
                    option_id: r.get(5)?,
                    option_label: r.get(6)?,
                    option_kind: r.get(7)?,
                    decided_by: r
                        .get::<_, Option<i64>>(8)?
                        .and_then(|u| u64::try_from(u).ok()),
                    decided_by_name: r.get(9)?,
                    asked_at: r.get(10)?,
                    decided_at: r.get(11)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
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
    async fn a_prompt_is_found_once() {
        let store = Store::open_in_memory().unwrap();
        let prompt = ApprovalPrompt {
            chat_id: 1,
            thread_id: Some(3),
            message_id: 7,
            text: "⚠️ Permission".into(),
        };
        store
            .approvals()
            .record_approval_prompt("t1", prompt.clone())
            .await
            .unwrap();
        assert_eq!(
            store.approvals().take_approval_prompt("t1").await.unwrap(),
            Some(prompt)
        );
        assert_eq!(
            store.approvals().take_approval_prompt("t1").await.unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn prompts_and_decisions_are_kept_per_bot() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        let prompt = |message_id| ApprovalPrompt {
            chat_id: -100,
            thread_id: None,
            message_id,
            text: "⚠️ Permission".into(),
        };
        a.approvals()
            .record_approval_prompt("t1", prompt(7))
            .await
            .unwrap();
        b.approvals()
            .record_approval_prompt("t1", prompt(8))
            .await
            .unwrap();
        assert_eq!(
            b.approvals().take_approval_prompt("t1").await.unwrap(),
            Some(prompt(8))
        );
        assert_eq!(
            b.approvals().take_approval_prompt("t1").await.unwrap(),
            None
        );
        assert_eq!(
            a.approvals().take_approval_prompt("t1").await.unwrap(),
            Some(prompt(7))
        );
        let record = ApprovalRecord {
            ticket: "t1".into(),
            session_key: "chat:-100".into(),
            chat_id: -100,
            subject: "rm".into(),
            outcome: "approved".into(),
            option_id: None,
            option_label: None,
            option_kind: None,
            decided_by: Some(42),
            decided_by_name: None,
            asked_at: 1,
            decided_at: 2,
        };
        a.approvals().record_approval(record.clone()).await.unwrap();
        assert_eq!(
            a.approvals().approval_records("chat:-100").await.unwrap(),
            vec![record]
        );
        assert!(b
            .approvals()
            .approval_records("chat:-100")
            .await
            .unwrap()
            .is_empty());
    }
}
