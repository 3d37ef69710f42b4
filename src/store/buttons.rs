//! Inline buttons kept server-side, and the state of inbox rows that carry
//! no message (button presses).
//!
//! A button's `callback_data` carries only its short id; what the button
//! does, whom it belongs to, until when it works and whether it was used
//! live here. Using a button is one conditional update over its whole row
//! (the buttons shown together), so two presses, or a press of Approve and
//! one of Deny, can never both win. The press that won is remembered by its
//! update id: the same press replayed after a restart still wins, any other
//! loses.
//!
//! A button is read and claimed only through the bot that stored it.
//!
//! This module logs ids only.

use rusqlite::{params, OptionalExtension};

use super::{now_ms, Buttons, Inbox, StoreError, WriteKind};
use crate::vocab::InboxState;

/// A button to remember.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewButton {
    /// Its id (the `callback_data` payload).
    pub id: String,
    /// The buttons shown together share this id; using one uses them all.
    pub row_id: String,
    /// The chat it is shown in.
    pub chat_id: i64,
    /// `dm`, `group`, `supergroup` or `channel`.
    pub chat_type: String,
    /// The forum topic, if any.
    pub thread_id: Option<i32>,
    /// The user whose session it acts on.
    pub owner_id: Option<u64>,
    /// Their display name.
    pub owner_name: Option<String>,
    /// What it does (JSON of [`crate::vocab::ButtonAction`]).
    pub action: serde_json::Value,
    /// Unix ms after which it no longer works.
    pub expires_at: i64,
}

/// A remembered button.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredButton {
    /// What was stored.
    pub button: NewButton,
    /// The update id of the press that used it (or its row), if any.
    pub used_by: Option<i64>,
}

/// Buttons expired longer ago than this are deleted.
const KEEP_EXPIRED_MS: i64 = 24 * 3600 * 1000;

/// Moves an update of the handle's bot on, unless it is finished (the open
/// states named, as in `inbox::SET_MESSAGE_STATE`, so no temporary table).
pub(super) const SET_UPDATE_STATE: &str =
    "UPDATE inbox SET state = ?2, reason = ?3, updated_at = ?4
     WHERE bot_id = ?5 AND update_id = ?1 AND state IN ('received', 'running')";

impl Buttons {
    /// Remember `buttons` (and forget buttons long expired).
    pub async fn create_buttons(&self, buttons: Vec<NewButton>) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Button, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            tx.execute(
                "DELETE FROM buttons WHERE bot_id = ?2 AND expires_at < ?1",
                params![now - KEEP_EXPIRED_MS, bot],
            )?;
            for b in &buttons {
                tx.execute(
                    "INSERT INTO buttons (bot_id, id, row_id, chat_id, chat_type, thread_id,
                         owner_id, owner_name, action, created_at, expires_at)
                     VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                    params![
                        b.id,
                        b.row_id,
                        b.chat_id,
                        b.chat_type,
                        b.thread_id,
                        b.owner_id.and_then(|u| i64::try_from(u).ok()),
                        b.owner_name,
                        b.action.to_string(),
                        now,
                        b.expires_at,
                        bot
                    ],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The button with `id`, if it is known.
    pub async fn button(&self, id: &str) -> Result<Option<StoredButton>, StoreError> {
        let (bot, id) = (self.bot(), id.to_owned());
        self.call(move |conn| {
            let row = conn
                .prepare_cached(
                    "SELECT id, row_id, chat_id, chat_type, thread_id, owner_id, owner_name,
                            action, expires_at, used_by
                     FROM buttons WHERE bot_id = ?2 AND id = ?1",
                )?
                .query_row(params![id, bot], |r| {
                    Ok((
                        NewButton {
                            id: r.get(0)?,
                            row_id: r.get(1)?,
                            chat_id: r.get(2)?,
                            chat_type: r.get(3)?,
                            thread_id: r.get(4)?,
                            owner_id: r
                                .get::<_, Option<i64>>(5)?
                                .and_then(|u| u64::try_from(u).ok()),
                            owner_name: r.get(6)?,
                            action: serde_json::Value::Null,
                            expires_at: r.get(8)?,
                        },
                        r.get::<_, String>(7)?,
                        r.get::<_, Option<i64>>(9)?,
                    ))
                })
                .optional()?;
            match row {
                Some((mut button, action, used_by)) => {
                    button.action = serde_json::from_str(&action)?;
                    Ok(Some(StoredButton { button, used_by }))
                }
                None => Ok(None),
            }
        })
        .await
    }

    /// Use button `id` (and the rest of its row) for the press of update
    /// `update_id`. True if this press holds it: it was unused, or this
    /// very press used it before (a replay after a restart).
    pub async fn claim_button(&self, id: &str, update_id: i64) -> Result<bool, StoreError> {
        let (bot, id) = (self.bot(), id.to_owned());
        self.write(WriteKind::Button, move |conn| {
            let tx = conn.savepoint()?;
            tx.execute(
                "UPDATE buttons SET used_by = ?2, used_at = ?3
                 WHERE bot_id = ?4 AND used_by IS NULL
                   AND row_id = (SELECT row_id FROM buttons WHERE bot_id = ?4 AND id = ?1)",
                params![id, update_id, now_ms(), bot],
            )?;
            let used_by: Option<i64> = tx
                .query_row(
                    "SELECT used_by FROM buttons WHERE bot_id = ?2 AND id = ?1",
                    params![&id, bot],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            tx.commit()?;
            Ok(used_by == Some(update_id))
        })
        .await
    }
}

/// Button presses are inbox rows without a message: their state is set by
/// update id, on the transport's handle.
impl Inbox {
    /// Move the inbox row of update `update_id` to `state` (rows without a
    /// message, such as button presses). Terminal states are final.
    pub async fn set_update_state(
        &self,
        update_id: i64,
        state: InboxState,
        reason: Option<String>,
    ) -> Result<bool, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::InboxState, move |conn| {
            let changed = conn.prepare_cached(SET_UPDATE_STATE)?.execute(params![
                update_id,
                state.as_str(),
                reason,
                now_ms(),
                bot
            ])?;
            Ok(changed > 0)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    fn button(id: &str, row: &str) -> NewButton {
        NewButton {
            id: id.into(),
            row_id: row.into(),
            chat_id: 1,
            chat_type: "dm".into(),
            thread_id: None,
            owner_id: Some(42),
            owner_name: Some("Ann".into()),
            action: serde_json::json!({"do": "stop", "generation": 3}),
            expires_at: now_ms() + 60_000,
        }
    }

    #[tokio::test]
    async fn a_row_is_used_once_and_the_same_press_may_replay() {
        let s = Store::open_in_memory().unwrap();
        s.buttons()
            .create_buttons(vec![
                button("a", "r"),
                button("b", "r"),
                button("c", "other"),
            ])
            .await
            .unwrap();
        let a = s.buttons().button("a").await.unwrap().unwrap();
        assert_eq!(
            a.button,
            button("a", "r").clone_with_expiry(a.button.expires_at)
        );
        assert!(a.used_by.is_none());
        assert!(s.buttons().claim_button("a", 10).await.unwrap());
        assert!(
            s.buttons().claim_button("a", 10).await.unwrap(),
            "replay of the same press"
        );
        assert!(
            !s.buttons().claim_button("a", 11).await.unwrap(),
            "a second press"
        );
        assert!(
            !s.buttons().claim_button("b", 12).await.unwrap(),
            "its row is used up"
        );
        assert!(
            s.buttons().claim_button("c", 13).await.unwrap(),
            "other rows are untouched"
        );
        assert!(!s.buttons().claim_button("zzz", 14).await.unwrap());
        assert!(s.buttons().button("zzz").await.unwrap().is_none());
    }

    impl NewButton {
        fn clone_with_expiry(mut self, expires_at: i64) -> Self {
            self.expires_at = expires_at;
            self
        }
    }

    #[tokio::test]
    async fn a_button_is_read_and_claimed_only_through_its_own_bot() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.buttons()
            .create_buttons(vec![button("x", "r"), button("y", "r")])
            .await
            .unwrap();
        assert_eq!(b.buttons().button("x").await.unwrap(), None);
        assert!(!b.buttons().claim_button("x", 10).await.unwrap());
        assert!(a
            .buttons()
            .button("y")
            .await
            .unwrap()
            .unwrap()
            .used_by
            .is_none());
        assert!(a.buttons().claim_button("x", 10).await.unwrap());
        // A press's inbox state is the pressing bot's update.
        for bot in [&a, &b] {
            bot.inbox()
                .record_update(
                    10,
                    1,
                    None,
                    serde_json::json!({}),
                    InboxState::Received,
                    None,
                )
                .await
                .unwrap();
        }
        assert!(a
            .inbox()
            .set_update_state(10, InboxState::Answered, None)
            .await
            .unwrap());
        let theirs = b.inbox().inbox_entry(10).await.unwrap().unwrap();
        assert_eq!(theirs.state, InboxState::Received);
    }
}
