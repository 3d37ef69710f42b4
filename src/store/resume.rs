//! Conversations a chat slot had, and making one of them current again
//! (`/sessions`, `/resume`).
//!
//! Every session id a key ever had is in `session_history` (see
//! [`super::sessions`]); its transcript is kept under that id, and a CLI
//! agent's resume id is keyed by it too ([`super::agent_sessions`]). So
//! going back to a conversation is only a matter of making its id the
//! key's current session again: the history the next turn is given, the
//! agent session it resumes and the session's settings (`overrides`,
//! among them its title) all come back with the id. The session being left
//! is archived exactly as `/new` archives it.
//!
//! Only the handle's bot's sessions can be listed or resumed.
//!
//! This module never shows message contents in logs.

use rusqlite::{params, OptionalExtension};
use serde_json::Value;

use super::sessions::{archive, select_current, Overrides};
use super::{now_ms, Sessions, StoreError, WriteKind};

/// One conversation of a key, as /sessions lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    /// Its session id.
    pub session_id: String,
    /// When it started (unix ms).
    pub created_at_ms: i64,
    /// When it was last used (unix ms).
    pub last_active_at_ms: i64,
    /// It is the key's current session.
    pub current: bool,
    /// Its `/title`, if it has one.
    pub title: Option<String>,
    /// The first message the user sent in it.
    pub first_message: Option<String>,
    /// The user's messages in it (not undone, wakeups left out).
    pub exchanges: u64,
}

/// What making a conversation current again did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// It is the current session now.
    Resumed,
    /// It was the current session already.
    AlreadyCurrent,
    /// The key never had that session.
    NotFound,
}

fn title_of(overrides: Option<&str>) -> Option<String> {
    let overrides: Overrides = serde_json::from_str(overrides?).ok()?;
    match overrides.get("title") {
        Some(Value::String(title)) if !title.trim().is_empty() => Some(title.clone()),
        _ => None,
    }
}

impl Sessions {
    /// The key's conversations, newest first, at most `limit`.
    pub async fn conversations(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Vec<Conversation>, StoreError> {
        let (bot, key) = (self.bot(), key.to_owned());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT h.session_id, h.created_at,
                        coalesce(s.last_active_at, h.last_active_at),
                        s.session_id IS NOT NULL,
                        coalesce(s.overrides, h.overrides),
                        (SELECT content FROM transcripts t
                          WHERE t.bot_id = h.bot_id AND t.session_id = h.session_id
                            AND t.role = 'user' AND t.name IS NULL
                          ORDER BY t.id LIMIT 1),
                        (SELECT count(*) FROM transcripts t
                          WHERE t.bot_id = h.bot_id AND t.session_id = h.session_id
                            AND t.role = 'user' AND t.name IS NULL AND t.undone_at IS NULL)
                 FROM session_history h
                 LEFT JOIN sessions s ON s.bot_id = h.bot_id AND s.session_id = h.session_id
                 WHERE h.bot_id = ?3 AND h.session_key = ?1
                 ORDER BY h.created_at DESC, h.rowid DESC
                 LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![key, limit, bot], |r| {
                Ok(Conversation {
                    session_id: r.get(0)?,
                    created_at_ms: r.get(1)?,
                    last_active_at_ms: r.get(2)?,
                    current: r.get(3)?,
                    title: title_of(r.get::<_, Option<String>>(4)?.as_deref()),
                    first_message: r.get(5)?,
                    exchanges: u64::try_from(r.get::<_, i64>(6)?).unwrap_or(0),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Make `session_id`, an earlier session of `key`, its current session
    /// again; the current one is archived (as by a rotation).
    pub async fn resume_session(&self, key: &str, session_id: &str) -> Result<Resumed, StoreError> {
        let (bot, key, session_id) = (self.bot(), key.to_owned(), session_id.to_owned());
        self.write(WriteKind::Session, move |conn| {
            let tx = conn.savepoint()?;
            let old: Option<(String, i64, Option<String>)> = tx
                .prepare_cached(
                    "SELECT session_key, created_at, overrides FROM session_history
                     WHERE bot_id = ?2 AND session_id = ?1",
                )?
                .query_row(params![&session_id, bot], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            let Some((owner, created_at, overrides)) = old.filter(|(owner, ..)| *owner == key)
            else {
                return Ok(Resumed::NotFound);
            };
            let now = now_ms();
            if let Some(current) = select_current(&tx, bot, &owner)? {
                if current.session_id == session_id {
                    return Ok(Resumed::AlreadyCurrent);
                }
                archive(&tx, bot, &current, now)?;
            }
            tx.execute(
                "UPDATE session_history SET rotated_at = NULL WHERE bot_id = ?2 AND session_id = ?1",
                params![&session_id, bot],
            )?;
            tx.execute(
                "INSERT INTO sessions
                 (bot_id, session_key, session_id, created_at, last_active_at, overrides)
                 VALUES (?6, ?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (bot_id, session_key) DO UPDATE SET
                     session_id = excluded.session_id,
                     created_at = excluded.created_at,
                     last_active_at = excluded.last_active_at,
                     overrides = excluded.overrides",
                params![
                    owner,
                    session_id,
                    created_at,
                    now,
                    overrides.unwrap_or_else(|| "{}".to_string()),
                    bot
                ],
            )?;
            tx.commit()?;
            tracing::debug!(key = owner, session_id, "session resumed");
            Ok(Resumed::Resumed)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::store::TranscriptEntry;
    use crate::vocab::BotId;
    use serde_json::json;

    #[tokio::test]
    async fn a_rotated_session_comes_back_with_its_settings() {
        let s = Store::open_in_memory().unwrap();
        s.sessions()
            .get_or_create_session("k", "a".into())
            .await
            .unwrap();
        s.transcripts()
            .append("a", TranscriptEntry::user("first question"))
            .await
            .unwrap();
        s.transcripts()
            .append("a", TranscriptEntry::assistant("answer"))
            .await
            .unwrap();
        s.transcripts()
            .append("a", TranscriptEntry::user("second"))
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "title", json!("Taxes"))
            .await
            .unwrap();
        s.sessions()
            .set_override("k", "model", json!("big"))
            .await
            .unwrap();
        s.sessions().rotate_session("k", "b".into()).await.unwrap();
        s.transcripts()
            .append("b", TranscriptEntry::user("other"))
            .await
            .unwrap();

        let list = s.sessions().conversations("k", 10).await.unwrap();
        let ids: Vec<_> = list.iter().map(|c| c.session_id.as_str()).collect();
        assert_eq!(ids, ["b", "a"]);
        assert!(list[0].current && !list[1].current);
        assert_eq!(list[1].title.as_deref(), Some("Taxes"));
        assert_eq!(list[1].first_message.as_deref(), Some("first question"));
        assert_eq!(list[1].exchanges, 2);
        assert_eq!(list[0].title, None);

        assert_eq!(
            s.sessions().resume_session("k", "a").await.unwrap(),
            Resumed::Resumed
        );
        let current = s.sessions().current_session("k").await.unwrap().unwrap();
        assert_eq!(current.session_id, "a");
        assert_eq!(current.overrides.get("model"), Some(&json!("big")));
        assert_eq!(
            s.sessions().resume_session("k", "a").await.unwrap(),
            Resumed::AlreadyCurrent
        );
        // Back and forth: "b" was archived with its state, and returns.
        assert_eq!(
            s.sessions().resume_session("k", "b").await.unwrap(),
            Resumed::Resumed
        );
        assert!(s.sessions().overrides("k").await.unwrap().is_empty());
        let history = s.sessions().session_history("k").await.unwrap();
        let current_rows: Vec<_> = history
            .iter()
            .filter(|h| h.rotated_at_ms.is_none())
            .map(|h| h.session_id.as_str())
            .collect();
        assert_eq!(current_rows, ["b"]);
        // A session of another key, or none at all, is not found.
        s.sessions()
            .get_or_create_session("other", "x".into())
            .await
            .unwrap();
        assert_eq!(
            s.sessions().resume_session("k", "x").await.unwrap(),
            Resumed::NotFound
        );
        assert_eq!(
            s.sessions().resume_session("k", "never").await.unwrap(),
            Resumed::NotFound
        );
    }

    #[tokio::test]
    async fn a_bot_never_resumes_or_lists_another_bots_conversation() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (store.for_bot(BotId(1)), store.for_bot(BotId(2)));
        let key = "agent:main:telegram:group:-100";
        a.sessions()
            .get_or_create_session(key, "sa".into())
            .await
            .unwrap();
        a.transcripts()
            .append("sa", TranscriptEntry::user("hello"))
            .await
            .unwrap();
        a.sessions()
            .rotate_session(key, "sa2".into())
            .await
            .unwrap();
        b.sessions()
            .get_or_create_session(key, "sb".into())
            .await
            .unwrap();
        assert_eq!(
            b.sessions().resume_session(key, "sa").await.unwrap(),
            Resumed::NotFound
        );
        let theirs = b.sessions().conversations(key, 10).await.unwrap();
        assert_eq!(theirs.len(), 1);
        assert_eq!(theirs[0].session_id, "sb");
        assert_eq!(
            a.sessions().resume_session(key, "sa").await.unwrap(),
            Resumed::Resumed
        );
        let ours = a.sessions().conversations(key, 10).await.unwrap();
        assert_eq!(ours.len(), 2);
        assert_eq!(ours[1].first_message.as_deref(), Some("hello"));
        let current = b.sessions().current_session(key).await.unwrap();
        assert_eq!(current.map(|s| s.session_id).as_deref(), Some("sb"));
    }
}
