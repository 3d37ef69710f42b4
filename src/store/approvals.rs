//! The record of approval decisions: how each request of the approval gate
//! ended, who chose which option and when (migration "approval
//! decisions").
//!
//! Written once per request by the gate (`tools::approval_gate`), read by
//! the operator and the tests. This module never decides anything.

use rusqlite::params;

use super::{Store, StoreError, WriteKind};

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

impl Store {
    /// Record how a request ended.
    pub async fn record_approval(&self, record: ApprovalRecord) -> Result<(), StoreError> {
        self.write(WriteKind::Approval, move |conn| {
            conn.prepare_cached(
                "INSERT INTO approval_decisions (ticket, session_key, chat_id, subject, outcome,
                     option_id, option_label, option_kind, decided_by, decided_by_name,
                     asked_at, decided_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
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
                record.decided_at
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
        let session_key = session_key.to_owned();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT ticket, session_key, chat_id, subject, outcome, option_id, option_label,
                        option_kind, decided_by, decided_by_name, asked_at, decided_at
                 FROM approval_decisions WHERE session_key = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([session_key], |r| {
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
