//! Transcripts: the ordered messages of each session.
//!
//! The transcript is what the agent is replayed from, so it is append-only
//! and ordered by insertion (`id`), never by timestamp: wall clocks jump,
//! insertion order does not. Loading takes the *last* N entries (the recent
//! context a model can hold) using the `(session_id, id)` index, so it costs
//! the same for a session with ten messages or a hundred thousand.
//!
//! A reply cut short (the user interrupted, the bot restarted mid-stream)
//! is still recorded, with `interrupted` set, so the agent can be told the
//! user did not see the whole thing.
//!
//! Every entry is one bot's (`bot_id`); a bot reads only its own.
//!
//! Contents are user data: this module logs counts and ids, never contents.

use std::sync::{Arc, OnceLock};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, Row, ToSql};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{now_ms, StoreError, Transcripts, TurnUsage, WriteKind};

use crate::vocab::Role;

impl ToSql for Role {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for Role {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        Role::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown role {text:?}").into()))
    }
}

/// One message of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptEntry {
    /// Who wrote it.
    pub role: Role,
    /// The text (may be empty for an assistant message that only calls tools).
    pub content: String,
    /// The tool calls an assistant message makes (JSON, as the model sent it).
    pub tool_calls: Option<Value>,
    /// For a tool result: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// Optional author name (e.g. the tool's name).
    pub name: Option<String>,
    /// The message was cut short before it was complete.
    pub interrupted: bool,
    /// When it was written (unix ms).
    pub created_at_ms: i64,
}

impl TranscriptEntry {
    /// A plain message with `role` and `content`, stamped now.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        TranscriptEntry {
            role,
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            interrupted: false,
            created_at_ms: now_ms(),
        }
    }

    /// A system message, stamped now.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message, stamped now.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message, stamped now.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// A tool result answering call `tool_call_id`, stamped now.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        TranscriptEntry {
            tool_call_id: Some(tool_call_id.into()),
            ..Self::new(Role::Tool, content)
        }
    }
}

impl Transcripts {
    /// Appends one entry to the transcript of `session_id`; returns its row
    /// id (increasing within the database).
    pub async fn append(
        &self,
        session_id: &str,
        entry: TranscriptEntry,
    ) -> Result<i64, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.write(WriteKind::Transcript, move |conn| {
            insert_entry(conn, bot, &session_id, &entry)
        })
        .await
    }

    /// Appends several entries in one transaction (all or none); returns
    /// their row ids in order.
    pub async fn append_many(
        &self,
        session_id: &str,
        entries: Vec<TranscriptEntry>,
    ) -> Result<Vec<i64>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        // A call is all-or-nothing already (its own savepoint; one entry is
        // one statement and needs none).
        self.write_with_writes(WriteKind::Transcript, entries.len(), move |conn| {
            entries
                .iter()
                .map(|e| insert_entry(conn, bot, &session_id, e))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
    }

    /// [`Transcripts::append_many`], and the turn's usage row
    /// ([`Usage::record_turn_usage`](super::Usage::record_turn_usage)) in
    /// the same call (all or none): a turn that ran records its answer
    /// and what it cost with one store round trip.
    pub async fn append_many_charging(
        &self,
        session_id: &str,
        entries: Vec<TranscriptEntry>,
        usage: Option<TurnUsage>,
    ) -> Result<Vec<i64>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        let writes = entries.len() + usize::from(usage.is_some());
        let kinds: &[WriteKind] = match usage {
            Some(_) => &[WriteKind::Transcript, WriteKind::Usage],
            None => &[WriteKind::Transcript],
        };
        let failed = Arc::new(OnceLock::new());
        let failing = failed_as(&failed);
        self.link
            .write_kinds(kinds, failed, writes, move |conn| {
                let ids = entries
                    .iter()
                    .map(|e| insert_entry(conn, bot, &session_id, e))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(failing(WriteKind::Transcript))?;
                if let Some(turn) = &usage {
                    super::usage::insert_turn_usage(conn, bot, turn)
                        .map_err(failing(WriteKind::Usage))?;
                }
                Ok(ids)
            })
            .await
    }

    /// [`Transcripts::append_many_charging`] without waiting: carried by
    /// the store's next batch (`store::carried`), so the call that follows
    /// it (the answer's send intent, the next turn's history) commits with
    /// it or after it. A failure shows in `/healthz` and the log.
    pub fn append_many_charging_later(
        &self,
        session_id: &str,
        entries: Vec<TranscriptEntry>,
        usage: Option<TurnUsage>,
    ) {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        let kinds: &'static [WriteKind] = match usage {
            Some(_) => &[WriteKind::Transcript, WriteKind::Usage],
            None => &[WriteKind::Transcript],
        };
        let failed = Arc::new(OnceLock::new());
        let failing = failed_as(&failed);
        let what = "the transcript and the turn's usage";
        self.defer(kinds, failed, what, move |conn| {
            for entry in &entries {
                insert_entry(conn, bot, &session_id, entry)
                    .map_err(failing(WriteKind::Transcript))?;
            }
            if let Some(turn) = &usage {
                super::usage::insert_turn_usage(conn, bot, turn)
                    .map_err(failing(WriteKind::Usage))?;
            }
            Ok(())
        });
    }

    /// [`Transcripts::load_history`], then [`Transcripts::append_many`] of `entries`,
    /// in one call (all or none): a turn reads its history and records its
    /// user message with one store round trip. The history returned is the
    /// one before `entries`.
    pub async fn load_history_then_append(
        &self,
        session_id: &str,
        max_entries: Option<usize>,
        entries: Vec<TranscriptEntry>,
    ) -> Result<Vec<TranscriptEntry>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        // A read, then (usually) one insert: then no savepoint is needed.
        self.write_with_writes(WriteKind::Transcript, entries.len(), move |conn| {
            let history = select_last(conn, bot, &session_id, max_entries)?;
            for entry in &entries {
                insert_entry(conn, bot, &session_id, entry)?;
            }
            Ok(history)
        })
        .await
    }

    /// The transcript of `session_id` in chronological order; with
    /// `Some(n)`, only its last `n` entries.
    pub async fn load_history(
        &self,
        session_id: &str,
        max_entries: Option<usize>,
    ) -> Result<Vec<TranscriptEntry>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| select_last(conn, bot, &session_id, max_entries))
            .await
    }

    /// How many entries the transcript of `session_id` has.
    pub async fn transcript_len(&self, session_id: &str) -> Result<usize, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            let n: i64 = conn
                .prepare_cached(
                    "SELECT count(*) FROM transcripts
                     WHERE bot_id = ?2 AND session_id = ?1 AND undone_at IS NULL",
                )?
                .query_row(params![session_id, bot], |r| r.get(0))?;
            Ok(usize::try_from(n).unwrap_or(0))
        })
        .await
    }

    /// Flags the last entry of `session_id` as interrupted (cut short).
    /// Returns `false` if the transcript is empty.
    pub async fn mark_last_interrupted(&self, session_id: &str) -> Result<bool, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.write(WriteKind::Transcript, move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE transcripts SET interrupted = 1
                     WHERE id = (SELECT max(id) FROM transcripts
                                 WHERE bot_id = ?2 AND session_id = ?1)",
                )?
                .execute(params![session_id, bot])?;
            Ok(changed > 0)
        })
        .await
    }
}

/// Appends `e` to `bot`'s transcript of `session_id`.
fn insert_entry(
    conn: &Connection,
    bot: i64,
    session_id: &str,
    e: &TranscriptEntry,
) -> Result<i64, StoreError> {
    let tool_calls = e
        .tool_calls
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    conn.prepare_cached(
        "INSERT INTO transcripts
             (bot_id, session_id, role, content, tool_calls, tool_call_id, name, interrupted,
              created_at)
         VALUES (?9, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        session_id,
        e.role,
        e.content,
        tool_calls,
        e.tool_call_id,
        e.name,
        e.interrupted,
        e.created_at_ms,
        bot
    ])?;
    Ok(conn.last_insert_rowid())
}

/// The last `max` entries (all when `None`), oldest first.
fn select_last(
    conn: &Connection,
    bot: i64,
    session_id: &str,
    max: Option<usize>,
) -> Result<Vec<TranscriptEntry>, StoreError> {
    // SQLite reads a negative LIMIT as "no limit".
    let limit = max.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
    let mut stmt = conn.prepare_cached(SELECT_LAST)?;
    let raw = stmt
        .query_map(params![session_id, limit, bot], RawEntry::from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    // Fetched newest first so LIMIT keeps the most recent; hand back oldest first.
    raw.into_iter().rev().map(RawEntry::into_entry).collect()
}

/// The newest `?2` entries of bot `?3`'s session `?1` that were not undone.
const SELECT_LAST: &str =
    "SELECT role, content, tool_calls, tool_call_id, name, interrupted, created_at
     FROM transcripts WHERE session_id = ?1 AND bot_id = ?3 AND undone_at IS NULL
     ORDER BY id DESC LIMIT ?2";

/// A `transcripts` row before its JSON column is decoded.
struct RawEntry {
    role: Role,
    content: String,
    tool_calls: Option<String>,
    tool_call_id: Option<String>,
    name: Option<String>,
    interrupted: bool,
    created_at: i64,
}

impl RawEntry {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawEntry {
            role: r.get(0)?,
            content: r.get(1)?,
            tool_calls: r.get(2)?,
            tool_call_id: r.get(3)?,
            name: r.get(4)?,
            interrupted: r.get(5)?,
            created_at: r.get(6)?,
        })
    }

    fn into_entry(self) -> Result<TranscriptEntry, StoreError> {
        Ok(TranscriptEntry {
            role: self.role,
            content: self.content,
            tool_calls: self
                .tool_calls
                .as_deref()
                .map(serde_json::from_str)
                .transpose()?,
            tool_call_id: self.tool_call_id,
            name: self.name,
            interrupted: self.interrupted,
            created_at_ms: self.created_at,
        })
    }
}

impl TranscriptEntry {
    /// The entry as the agent sees it (its texts moved, not copied: a
    /// turn's history is read for the agent and nothing else).
    pub fn into_message(self) -> crate::vocab::ChatMessage {
        crate::vocab::ChatMessage {
            role: self.role,
            content: self.content,
            tool_calls: self.tool_calls,
            tool_call_id: self.tool_call_id,
            name: self.name,
        }
    }

    /// A message produced by a turn, stamped now.
    pub fn from_message(message: crate::vocab::ChatMessage) -> Self {
        TranscriptEntry {
            tool_calls: message.tool_calls,
            tool_call_id: message.tool_call_id,
            name: message.name,
            ..TranscriptEntry::new(message.role, message.content)
        }
    }
}

/// `failing(kind)`: an error mapper that notes `kind` in `failed` (the
/// kind whose statement failed, for the write health) and passes the error
/// on.
fn failed_as(
    failed: &Arc<OnceLock<WriteKind>>,
) -> impl Fn(WriteKind) -> Box<dyn FnOnce(StoreError) -> StoreError + Send> + Send + 'static {
    let failed = failed.clone();
    move |kind: WriteKind| {
        let failed = failed.clone();
        Box::new(move |error: StoreError| {
            let _ = failed.set(kind);
            error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn contents(entries: &[TranscriptEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.content.as_str()).collect()
    }

    #[tokio::test]
    async fn append_and_load_in_order() {
        let s = Store::open_in_memory().unwrap();
        assert!(s
            .transcripts()
            .load_history("s", None)
            .await
            .unwrap()
            .is_empty());
        let a = s
            .transcripts()
            .append("s", TranscriptEntry::system("be nice"))
            .await
            .unwrap();
        let b = s
            .transcripts()
            .append("s", TranscriptEntry::user("hi"))
            .await
            .unwrap();
        assert!(b > a);
        s.transcripts()
            .append("other", TranscriptEntry::user("elsewhere"))
            .await
            .unwrap();
        s.transcripts()
            .append("s", TranscriptEntry::assistant("hello"))
            .await
            .unwrap();
        let h = s.transcripts().load_history("s", None).await.unwrap();
        assert_eq!(contents(&h), ["be nice", "hi", "hello"]);
        let roles: Vec<_> = h.iter().map(|e| e.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant]);
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 3);
        assert_eq!(s.transcripts().transcript_len("nobody").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn loading_history_reuses_its_parsed_statement() {
        // Each turn loads another session's history: the cached statement
        // must not be parsed again. Without the planner stability setting
        // (see `configure`), SQLite re-prepared it at every new session id.
        let s = Store::open_in_memory().unwrap();
        for session in ["a", "b", "c"] {
            s.transcripts()
                .append(session, TranscriptEntry::user(session))
                .await
                .unwrap();
        }
        let reprepared = s
            .call(|conn| {
                for session in ["a", "b", "c", "a"] {
                    let history = select_last(conn, 0, session, Some(50))?;
                    assert_eq!(contents(&history), [session]);
                }
                let stmt = conn.prepare_cached(SELECT_LAST)?;
                Ok(stmt.get_status(rusqlite::StatementStatus::RePrepare))
            })
            .await
            .unwrap();
        assert_eq!(reprepared, 0, "the history query was parsed again");
    }

    #[tokio::test]
    async fn limit_returns_the_last_n_in_order() {
        let s = Store::open_in_memory().unwrap();
        let entries: Vec<_> = (0..10)
            .map(|i| TranscriptEntry::user(format!("m{i}")))
            .collect();
        let ids = s.transcripts().append_many("s", entries).await.unwrap();
        assert_eq!(ids.len(), 10);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let h = s.transcripts().load_history("s", Some(3)).await.unwrap();
        assert_eq!(contents(&h), ["m7", "m8", "m9"]);
        assert!(s
            .transcripts()
            .load_history("s", Some(0))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.transcripts()
                .load_history("s", Some(100))
                .await
                .unwrap()
                .len(),
            10
        );
        assert_eq!(
            s.transcripts()
                .load_history("s", Some(usize::MAX))
                .await
                .unwrap()
                .len(),
            10
        );
    }

    #[tokio::test]
    async fn append_many_is_all_or_nothing() {
        let s = Store::open_in_memory().unwrap();
        // Make the second insert of the batch fail after the first succeeded.
        let bad = TranscriptEntry {
            name: Some("x".into()),
            ..TranscriptEntry::user("second")
        };
        s.call(|c| {
            Ok(c.execute_batch(
                "CREATE TRIGGER reject_x BEFORE INSERT ON transcripts
                 WHEN NEW.name = 'x' BEGIN SELECT RAISE(ABORT, 'rejected'); END;",
            )?)
        })
        .await
        .unwrap();
        let res = s
            .transcripts()
            .append_many("s", vec![TranscriptEntry::user("first"), bad])
            .await;
        assert!(matches!(res, Err(StoreError::Sqlite(_))), "{res:?}");
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn tool_fields_unicode_and_large_content_round_trip() {
        let s = Store::open_in_memory().unwrap();
        let call = TranscriptEntry {
            tool_calls: Some(json!([{"id": "c1", "type": "function",
                "function": {"name": "search", "arguments": "{\"q\":\"ß\"}"}}])),
            ..TranscriptEntry::assistant("")
        };
        let result = TranscriptEntry {
            name: Some("search".into()),
            ..TranscriptEntry::tool("c1", "résultat 🔍 — 検索 \u{0} nul and \u{202e}rtl")
        };
        let big: String = "ünïcødé ✓ 𝄞 ".repeat(1024 * 1024 / 20);
        assert!(big.len() >= 1_000_000);
        let large = TranscriptEntry::user(big);
        let sent = vec![call, result, large];
        s.transcripts()
            .append_many("s", sent.clone())
            .await
            .unwrap();
        assert_eq!(s.transcripts().load_history("s", None).await.unwrap(), sent);
    }

    #[tokio::test]
    async fn interrupted_flag_on_append_and_after_the_fact() {
        let s = Store::open_in_memory().unwrap();
        assert!(!s.transcripts().mark_last_interrupted("s").await.unwrap());
        let cut = TranscriptEntry {
            interrupted: true,
            ..TranscriptEntry::assistant("half a rep")
        };
        s.transcripts().append("s", cut).await.unwrap();
        s.transcripts()
            .append("s", TranscriptEntry::user("again"))
            .await
            .unwrap();
        s.transcripts()
            .append("s", TranscriptEntry::assistant("streaming..."))
            .await
            .unwrap();
        s.transcripts()
            .append("t", TranscriptEntry::assistant("other session"))
            .await
            .unwrap();
        assert!(s.transcripts().mark_last_interrupted("s").await.unwrap());
        let flags: Vec<_> = s
            .transcripts()
            .load_history("s", None)
            .await
            .unwrap()
            .iter()
            .map(|e| e.interrupted)
            .collect();
        assert_eq!(flags, [true, false, true]);
        assert!(!s.transcripts().load_history("t", None).await.unwrap()[0].interrupted);
    }

    #[tokio::test]
    async fn rotation_keeps_the_old_transcript_and_starts_empty() {
        let s = Store::open_in_memory().unwrap();
        let first = s
            .sessions()
            .get_or_create_session("chat", "s1".into())
            .await
            .unwrap();
        s.transcripts()
            .append(&first.session_id, TranscriptEntry::user("before"))
            .await
            .unwrap();
        let (_, second) = s
            .sessions()
            .rotate_session("chat", "s2".into())
            .await
            .unwrap();
        assert!(s
            .transcripts()
            .load_history(&second.session_id, None)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.transcripts()
                .transcript_len(&second.session_id)
                .await
                .unwrap(),
            0
        );
        let old = s.transcripts().load_history("s1", None).await.unwrap();
        assert_eq!(contents(&old), ["before"]);
    }

    #[tokio::test]
    async fn data_survives_close_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/telegate.db");
        let s = Store::open(&path).unwrap();
        s.sessions()
            .get_or_create_session("chat", "s1".into())
            .await
            .unwrap();
        s.sessions()
            .set_override("chat", "model", json!("m"))
            .await
            .unwrap();
        s.transcripts()
            .append("s1", TranscriptEntry::user("persist me ✓"))
            .await
            .unwrap();
        s.sessions()
            .rotate_session("chat", "s2".into())
            .await
            .unwrap();
        s.transcripts()
            .append("s2", TranscriptEntry::user("and me"))
            .await
            .unwrap();
        s.close().await.unwrap();

        let s = Store::open_async(&path).await.unwrap();
        let current = s.sessions().current_session("chat").await.unwrap().unwrap();
        assert_eq!(current.session_id, "s2");
        assert_eq!(
            s.sessions()
                .session_owner_key("s1")
                .await
                .unwrap()
                .as_deref(),
            Some("chat")
        );
        assert_eq!(
            contents(&s.transcripts().load_history("s1", None).await.unwrap()),
            ["persist me ✓"]
        );
        assert_eq!(
            contents(&s.transcripts().load_history("s2", None).await.unwrap()),
            ["and me"]
        );
        assert_eq!(s.sessions().list_sessions().await.unwrap(), vec![current]);
        s.close().await.unwrap();
    }

    #[tokio::test]
    async fn unknown_role_in_the_database_is_an_error_not_a_guess() {
        let s = Store::open_in_memory().unwrap();
        // Bypass the CHECK constraint the way a hand edit would.
        s.call(|c| {
            c.execute_batch(
                "PRAGMA ignore_check_constraints = ON;
                 INSERT INTO transcripts (session_id, role, content, created_at)
                 VALUES ('s', 'wizard', 'x', 0);",
            )?;
            Ok(())
        })
        .await
        .unwrap();
        let err = s.transcripts().load_history("s", None).await.unwrap_err();
        assert!(err.to_string().contains("wizard"), "{err}");
    }

    #[test]
    fn entries_serialize_with_lowercase_roles() {
        let e = TranscriptEntry::tool("c9", "ok");
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["role"], "tool");
        assert_eq!(v["tool_call_id"], "c9");
        let back: TranscriptEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);
        for r in [Role::System, Role::User, Role::Assistant, Role::Tool] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
    }

    /// 200 tasks on a multi-thread runtime each own a session and append 20
    /// messages, loading history after each; meanwhile a ticker proves the
    /// runtime's workers are never blocked by SQLite.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_sessions_stay_whole_and_ordered() {
        const TASKS: usize = 200;
        const MESSAGES: usize = 20;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_async(dir.path().join("c.db")).await.unwrap();

        let ticks = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let ticker = tokio::spawn({
            let (ticks, done) = (ticks.clone(), done.clone());
            async move {
                let mut interval = tokio::time::interval(Duration::from_millis(1));
                while !done.load(Ordering::Relaxed) {
                    interval.tick().await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            }
        });

        let workers: Vec<_> = (0..TASKS)
            .map(|t| {
                let s = store.clone();
                tokio::spawn(async move {
                    let session = s
                        .sessions()
                        .get_or_create_session(&format!("chat-{t}"), format!("sess-{t}"))
                        .await
                        .unwrap();
                    let id = session.session_id;
                    for m in 0..MESSAGES {
                        let role = if m % 2 == 0 {
                            Role::User
                        } else {
                            Role::Assistant
                        };
                        s.transcripts()
                            .append(&id, TranscriptEntry::new(role, format!("{t}:{m}")))
                            .await
                            .unwrap();
                        let recent = s.transcripts().load_history(&id, Some(5)).await.unwrap();
                        let expected: Vec<_> = (m.saturating_sub(4)..=m)
                            .map(|i| format!("{t}:{i}"))
                            .collect();
                        assert_eq!(contents(&recent), expected);
                    }
                })
            })
            .collect();
        let ticks_at_start = ticks.load(Ordering::Relaxed);
        for w in workers {
            w.await.unwrap();
        }
        let ticks_during = ticks.load(Ordering::Relaxed) - ticks_at_start;
        done.store(true, Ordering::Relaxed);
        ticker.await.unwrap();

        for t in 0..TASKS {
            let h = store
                .transcripts()
                .load_history(&format!("sess-{t}"), None)
                .await
                .unwrap();
            let expected: Vec<_> = (0..MESSAGES).map(|i| format!("{t}:{i}")).collect();
            assert_eq!(contents(&h), expected, "session {t}");
        }
        assert_eq!(store.sessions().list_sessions().await.unwrap().len(), TASKS);
        assert!(ticks_during >= 3, "runtime starved: {ticks_during} ticks");
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn an_answer_and_its_usage_are_one_call_and_both_kept() {
        let s = Store::open_in_memory().unwrap();
        let before = s.stats();
        let usage = TurnUsage {
            user_id: 7,
            chat_id: 1,
            session_id: "s".into(),
            at_ms: 200,
            usage: crate::store::AgentUsage {
                output_tokens: 5,
                ..Default::default()
            },
        };
        s.transcripts()
            .append_many_charging("s", vec![TranscriptEntry::assistant("hi")], Some(usage))
            .await
            .unwrap();
        assert_eq!(s.stats().since(&before).calls, 1, "one store call");
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 1);
        let used = s.usage().usage_between(Some(7), 100, 300).await.unwrap();
        assert_eq!((used[&7].turns, used[&7].output_tokens), (1, 5));
        // Without usage it is a plain append.
        s.transcripts()
            .append_many_charging("s", vec![TranscriptEntry::assistant("again")], None)
            .await
            .unwrap();
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 2);
        let used = s.usage().usage_between(Some(7), 100, 300).await.unwrap();
        assert_eq!(used[&7].turns, 1);
    }

    #[tokio::test]
    async fn two_bots_keep_separate_transcripts_under_the_same_session_id() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.transcripts()
            .append_many(
                "s",
                vec![
                    TranscriptEntry::user("a1"),
                    TranscriptEntry::assistant("a2"),
                ],
            )
            .await
            .unwrap();
        let before = b
            .transcripts()
            .load_history_then_append("s", None, vec![TranscriptEntry::user("b1")])
            .await
            .unwrap();
        assert!(before.is_empty(), "another bot's history");
        assert!(b.transcripts().mark_last_interrupted("s").await.unwrap());
        let ours = a.transcripts().load_history("s", None).await.unwrap();
        assert_eq!(contents(&ours), ["a1", "a2"]);
        assert!(!ours[1].interrupted, "flagged through the other bot");
        assert_eq!(a.transcripts().transcript_len("s").await.unwrap(), 2);
        assert_eq!(b.transcripts().transcript_len("s").await.unwrap(), 1);
        assert_eq!(s.transcripts().transcript_len("s").await.unwrap(), 0);
    }
}
