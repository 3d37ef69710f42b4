//! Sessions: which agent session each chat key is talking to.
//!
//! A *session key* identifies a conversation place (a chat, a topic, a
//! user); a *session id* identifies one agent session, i.e. one transcript.
//! A key has at most one current session. Rotating (`/new`) gives the key a
//! fresh session id and an empty transcript while the old transcript stays
//! readable under the old id.
//!
//! Every id ever issued is recorded in `session_history` with its key and
//! its creation and rotation times. That is what lets a late event that
//! still carries an old session id (a delayed agent reply, a tool result
//! after `/new`) be attributed to the right chat, or recognised as stale,
//! instead of being lost. Session ids are therefore never reused: creating
//! or rotating to an id that was ever issued fails with a constraint error.
//!
//! Per-session settings (`overrides`, e.g. `{"model": "..."}`) belong to the
//! session, not the key, so rotation clears them; the old values are kept
//! in the history row.
//!
//! Keys and ids are looked up among the handle's bot's rows only (`bot_id`):
//! two bots in one group have the same key and never each other's session.

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{now_ms, Sessions, StoreError, WriteKind};

/// Per-session settings, a JSON object such as `{"model": "gpt-x"}`.
pub type Overrides = Map<String, Value>;

/// The current session of a key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The conversation place this session belongs to.
    pub session_key: String,
    /// The agent session id (names the transcript).
    pub session_id: String,
    /// When this session was created (unix ms).
    pub created_at_ms: i64,
    /// When the session was last used ([`Sessions::touch`]) (unix ms).
    pub last_active_at_ms: i64,
    /// Per-session settings; empty for a fresh session.
    pub overrides: Overrides,
}

/// One session id in a key's history, current or rotated away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHistoryEntry {
    /// The session id.
    pub session_id: String,
    /// The key it belongs (or belonged) to.
    pub session_key: String,
    /// When it was created (unix ms).
    pub created_at_ms: i64,
    /// When it was last used (unix ms); frozen at rotation.
    pub last_active_at_ms: i64,
    /// When it was replaced by a newer session; `None` while current.
    pub rotated_at_ms: Option<i64>,
}

impl Sessions {
    /// The current session of `key`, if it has one.
    pub async fn current_session(&self, key: &str) -> Result<Option<SessionRecord>, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.call(move |conn| select_current(conn, bot, &key)).await
    }

    /// The current session of `key`, creating it with id `new_id` if the key
    /// has none. `new_id` is ignored when a session exists.
    pub async fn get_or_create_session(
        &self,
        key: &str,
        new_id: String,
    ) -> Result<SessionRecord, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.write(WriteKind::Session, move |conn| {
            let tx = conn.savepoint()?;
            if let Some(existing) = select_current(&tx, bot, &key)? {
                return Ok(existing);
            }
            let created = insert_session(&tx, bot, &key, new_id, now_ms())?;
            tx.commit()?;
            tracing::debug!(key, session_id = created.session_id, "session created");
            Ok(created)
        })
        .await
    }

    /// Gives `key` a fresh session `new_id` with no overrides and an empty
    /// transcript. The old session (if any) is archived with its rotation
    /// time and stays resolvable through [`Sessions::session_owner_key`]; its
    /// transcript is untouched.
    ///
    /// Returns the old record as it was, and the new one.
    pub async fn rotate_session(
        &self,
        key: &str,
        new_id: String,
    ) -> Result<(Option<SessionRecord>, SessionRecord), StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.write(WriteKind::Session, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            let old = select_current(&tx, bot, &key)?;
            if let Some(old) = &old {
                archive(&tx, bot, old, now)?;
            }
            let new = insert_session(&tx, bot, &key, new_id, now)?;
            tx.commit()?;
            tracing::debug!(
                key,
                old = old.as_ref().map(|o| o.session_id.as_str()),
                new = new.session_id,
                "session rotated"
            );
            Ok((old, new))
        })
        .await
    }

    /// Marks the current session of `key` as used now. Returns `false` if
    /// the key has no session.
    pub async fn touch(&self, key: &str) -> Result<bool, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.write(WriteKind::Session, move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE sessions SET last_active_at = max(last_active_at, ?2)
                     WHERE bot_id = ?3 AND session_key = ?1",
                )?
                .execute(params![key, now_ms(), bot])?;
            Ok(changed > 0)
        })
        .await
    }

    /// Sets one per-session setting of the current session of `key`.
    /// A `null` value removes the setting.
    ///
    /// Fails with [`StoreError::NoSuchSession`] if the key has no session.
    pub async fn set_override(
        &self,
        key: &str,
        name: &str,
        value: Value,
    ) -> Result<(), StoreError> {
        let (bot, key, name) = (self.bot(), key.to_owned(), name.to_owned());
        self.write(WriteKind::Session, move |conn| {
            let tx = conn.savepoint()?;
            let mut overrides = select_current(&tx, bot, &key)?
                .ok_or_else(|| StoreError::NoSuchSession { key: key.clone() })?
                .overrides;
            if value.is_null() {
                overrides.remove(&name);
            } else {
                overrides.insert(name, value);
            }
            tx.execute(
                "UPDATE sessions SET overrides = ?2 WHERE bot_id = ?3 AND session_key = ?1",
                params![key, serde_json::to_string(&overrides)?, bot],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The per-session settings of the current session of `key`; empty if
    /// there are none or the key has no session.
    pub async fn overrides(&self, key: &str) -> Result<Overrides, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.call(move |conn| {
            Ok(select_current(conn, bot, &key)?
                .map(|s| s.overrides)
                .unwrap_or_default())
        })
        .await
    }

    /// The key that `session_id` belongs to, or belonged to before it was
    /// rotated away; `None` for an id this store never issued.
    pub async fn session_owner_key(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT session_key FROM session_history WHERE bot_id = ?2 AND session_id = ?1",
                )?
                .query_row(params![session_id, bot], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    /// Every session `key` has had, oldest first (the current one last).
    pub async fn session_history(&self, key: &str) -> Result<Vec<SessionHistoryEntry>, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT h.session_id, h.session_key, h.created_at,
                        coalesce(s.last_active_at, h.last_active_at), h.rotated_at
                 FROM session_history h
                 LEFT JOIN sessions s ON s.bot_id = h.bot_id AND s.session_id = h.session_id
                 WHERE h.bot_id = ?2 AND h.session_key = ?1
                 ORDER BY h.created_at, h.rowid",
            )?;
            let rows = stmt.query_map(params![key, bot], |r| {
                Ok(SessionHistoryEntry {
                    session_id: r.get(0)?,
                    session_key: r.get(1)?,
                    created_at_ms: r.get(2)?,
                    last_active_at_ms: r.get(3)?,
                    rotated_at_ms: r.get(4)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// All current sessions, ordered by key: what to resume after a restart.
    pub async fn list_sessions(&self) -> Result<Vec<SessionRecord>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(SELECT_ALL)?;
            let raw = stmt
                .query_map([bot], RawSession::from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            raw.into_iter().map(RawSession::into_record).collect()
        })
        .await
    }
}

const SELECT_CURRENT: &str = "SELECT session_key, session_id, created_at, last_active_at, overrides
     FROM sessions WHERE bot_id = ?1 AND session_key = ?2";
const SELECT_ALL: &str = "SELECT session_key, session_id, created_at, last_active_at, overrides
     FROM sessions WHERE bot_id = ?1 ORDER BY session_key";

/// A `sessions` row before its JSON column is decoded (decoding can fail
/// with a serde error, which a rusqlite row closure cannot return).
struct RawSession {
    key: String,
    id: String,
    created_at: i64,
    last_active_at: i64,
    overrides: String,
}

impl RawSession {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawSession {
            key: r.get(0)?,
            id: r.get(1)?,
            created_at: r.get(2)?,
            last_active_at: r.get(3)?,
            overrides: r.get(4)?,
        })
    }

    fn into_record(self) -> Result<SessionRecord, StoreError> {
        Ok(SessionRecord {
            session_key: self.key,
            session_id: self.id,
            created_at_ms: self.created_at,
            last_active_at_ms: self.last_active_at,
            overrides: serde_json::from_str(&self.overrides)?,
        })
    }
}

/// The current session of `bot`'s `key`.
pub(super) fn select_current(
    conn: &Connection,
    bot: i64,
    key: &str,
) -> Result<Option<SessionRecord>, StoreError> {
    let raw = conn
        .prepare_cached(SELECT_CURRENT)?
        .query_row(params![bot, key], RawSession::from_row)
        .optional()?;
    raw.map(RawSession::into_record).transpose()
}

/// Records a new session id in the history and makes it the key's current
/// session (replacing any current row; callers archive it first).
fn insert_session(
    conn: &Connection,
    bot: i64,
    key: &str,
    id: String,
    now: i64,
) -> Result<SessionRecord, StoreError> {
    conn.prepare_cached(
        "INSERT INTO session_history (bot_id, session_id, session_key, created_at, last_active_at)
         VALUES (?4, ?1, ?2, ?3, ?3)",
    )?
    .execute(params![id, key, now, bot])?;
    conn.prepare_cached(
        "INSERT INTO sessions
         (bot_id, session_key, session_id, created_at, last_active_at, overrides)
         VALUES (?4, ?1, ?2, ?3, ?3, '{}')
         ON CONFLICT (bot_id, session_key) DO UPDATE SET
             session_id = excluded.session_id,
             created_at = excluded.created_at,
             last_active_at = excluded.last_active_at,
             overrides = excluded.overrides",
    )?
    .execute(params![key, id, now, bot])?;
    Ok(SessionRecord {
        session_key: key.to_owned(),
        session_id: id,
        created_at_ms: now,
        last_active_at_ms: now,
        overrides: Overrides::new(),
    })
}

/// Freezes the final state of a session that is being rotated away.
pub(super) fn archive(
    conn: &Connection,
    bot: i64,
    old: &SessionRecord,
    now: i64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE session_history SET rotated_at = ?2, last_active_at = ?3, overrides = ?4
         WHERE bot_id = ?5 AND session_id = ?1",
    )?
    .execute(params![
        old.session_id,
        now,
        old.last_active_at_ms,
        serde_json::to_string(&old.overrides)?,
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

    fn store() -> Store {
        Store::open_in_memory().unwrap()
    }

    #[tokio::test]
    async fn get_or_create_creates_once() {
        let s = store();
        assert_eq!(s.sessions().current_session("k").await.unwrap(), None);
        let a = s
            .sessions()
            .get_or_create_session("k", "id-1".into())
            .await
            .unwrap();
        assert_eq!(a.session_id, "id-1");
        assert_eq!(a.session_key, "k");
        assert!(a.overrides.is_empty());
        let b = s
            .sessions()
            .get_or_create_session("k", "id-2".into())
            .await
            .unwrap();
        assert_eq!(b, a, "existing session is kept, new id ignored");
        assert_eq!(s.sessions().current_session("k").await.unwrap(), Some(a));
    }

    #[tokio::test]
    async fn rotate_archives_old_and_clears_overrides() {
        let s = store();
        s.sessions()
            .get_or_create_session("k", "old".into())
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "model", json!("big"))
            .await
            .unwrap();
        let (old, new) = s
            .sessions()
            .rotate_session("k", "new".into())
            .await
            .unwrap();
        let old = old.unwrap();
        assert_eq!(old.session_id, "old");
        assert_eq!(old.overrides.get("model"), Some(&json!("big")));
        assert_eq!(new.session_id, "new");
        assert!(new.overrides.is_empty());
        assert!(s.sessions().overrides("k").await.unwrap().is_empty());
        assert_eq!(s.sessions().current_session("k").await.unwrap(), Some(new));
        assert_eq!(
            s.sessions()
                .session_owner_key("old")
                .await
                .unwrap()
                .as_deref(),
            Some("k")
        );
        assert_eq!(
            s.sessions()
                .session_owner_key("new")
                .await
                .unwrap()
                .as_deref(),
            Some("k")
        );
        assert_eq!(s.sessions().session_owner_key("never").await.unwrap(), None);

        let history = s.sessions().session_history("k").await.unwrap();
        let ids: Vec<_> = history.iter().map(|h| h.session_id.as_str()).collect();
        assert_eq!(ids, ["old", "new"]);
        let rotated_at = history[0].rotated_at_ms.unwrap();
        assert!(rotated_at >= history[0].created_at_ms);
        assert_eq!(history[1].rotated_at_ms, None);
    }

    #[tokio::test]
    async fn rotate_without_a_session_creates_one() {
        let s = store();
        let (old, new) = s
            .sessions()
            .rotate_session("k", "first".into())
            .await
            .unwrap();
        assert_eq!(old, None);
        assert_eq!(new.session_id, "first");
    }

    #[tokio::test]
    async fn session_ids_are_never_reused() {
        let s = store();
        s.sessions()
            .get_or_create_session("a", "x".into())
            .await
            .unwrap();
        s.sessions().rotate_session("a", "y".into()).await.unwrap();
        // Back to an archived id, or taking another key's id: both refused,
        // and the failed call changes nothing.
        assert!(matches!(
            s.sessions().rotate_session("a", "x".into()).await,
            Err(StoreError::Sqlite(_))
        ));
        assert!(s
            .sessions()
            .get_or_create_session("b", "y".into())
            .await
            .is_err());
        assert_eq!(
            s.sessions()
                .current_session("a")
                .await
                .unwrap()
                .unwrap()
                .session_id,
            "y"
        );
        assert_eq!(s.sessions().current_session("b").await.unwrap(), None);
        assert_eq!(s.sessions().session_history("a").await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn overrides_set_replace_and_remove() {
        let s = store();
        let err = s
            .sessions()
            .set_override("k", "model", json!("m"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::NoSuchSession { ref key } if key == "k"));
        assert!(s.sessions().overrides("k").await.unwrap().is_empty());

        s.sessions()
            .get_or_create_session("k", "id".into())
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "model", json!("m1"))
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "temperature", json!(0.5))
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "model", json!({"name": "m2"}))
            .await
            .unwrap();
        let o = s.sessions().overrides("k").await.unwrap();
        assert_eq!(
            Value::Object(o),
            json!({"model": {"name": "m2"}, "temperature": 0.5})
        );
        s.sessions()
            .set_override("k", "temperature", Value::Null)
            .await
            .unwrap();
        let o = s.sessions().overrides("k").await.unwrap();
        assert_eq!(Value::Object(o), json!({"model": {"name": "m2"}}));
    }

    #[tokio::test]
    async fn touch_moves_last_active_forward() {
        let s = store();
        assert!(!s.sessions().touch("k").await.unwrap());
        let created = s
            .sessions()
            .get_or_create_session("k", "id".into())
            .await
            .unwrap();
        // Backdate so the touch is visible regardless of clock resolution.
        s.call(|c| Ok(c.execute("UPDATE sessions SET last_active_at = 5", [])?))
            .await
            .unwrap();
        assert!(s.sessions().touch("k").await.unwrap());
        let now = s.sessions().current_session("k").await.unwrap().unwrap();
        assert!(now.last_active_at_ms >= created.created_at_ms);
        assert_eq!(now.created_at_ms, created.created_at_ms);
    }

    #[tokio::test]
    async fn list_sessions_returns_current_ones_by_key() {
        let s = store();
        s.sessions()
            .get_or_create_session("b", "b1".into())
            .await
            .unwrap();
        s.sessions()
            .get_or_create_session("a", "a1".into())
            .await
            .unwrap();
        s.sessions().rotate_session("b", "b2".into()).await.unwrap();
        let all = s.sessions().list_sessions().await.unwrap();
        let pairs: Vec<_> = all
            .iter()
            .map(|r| (r.session_key.as_str(), r.session_id.as_str()))
            .collect();
        assert_eq!(pairs, [("a", "a1"), ("b", "b2")]);
    }

    #[tokio::test]
    async fn two_bots_have_their_own_current_session_for_the_same_key() {
        let store = store();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        let key = "agent:main:telegram:group:-100";
        a.sessions()
            .get_or_create_session(key, "sa".into())
            .await
            .unwrap();
        let theirs = b
            .sessions()
            .get_or_create_session(key, "sb".into())
            .await
            .unwrap();
        assert_eq!(theirs.session_id, "sb", "not the other bot's session");
        a.sessions()
            .set_override(key, "model", json!("m"))
            .await
            .unwrap();
        assert!(b.sessions().overrides(key).await.unwrap().is_empty());
        a.sessions()
            .rotate_session(key, "sa2".into())
            .await
            .unwrap();
        let current = |s: &Store| {
            let sessions = s.sessions();
            async move {
                let record = sessions.current_session(key).await.unwrap();
                record.map(|r| r.session_id)
            }
        };
        assert_eq!(current(&a).await.as_deref(), Some("sa2"));
        assert_eq!(current(&b).await.as_deref(), Some("sb"));
        assert_eq!(b.sessions().session_owner_key("sa").await.unwrap(), None);
        assert_eq!(b.sessions().session_history(key).await.unwrap().len(), 1);
        assert_eq!(a.sessions().session_history(key).await.unwrap().len(), 2);
        let listed = b.sessions().list_sessions().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(!store.sessions().touch(key).await.unwrap());
        assert!(store.sessions().list_sessions().await.unwrap().is_empty());
    }
}
