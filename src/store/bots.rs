//! The bots that used this store (migration "the bots of this store",
//! 15): each bot's id with the name and `@username` it last started
//! under. A bot records itself at every start ([`Store::record_bot`]);
//! `telegate pair --bot NAME` reads them ([`known_bots`]) through a
//! connection of its own, so it finds a bot's rows without the bot's token
//! and without asking Telegram.

use rusqlite::{params, Connection};

use super::{now_ms, Store, StoreError};
use crate::vocab::BotId;

impl Store {
    /// This store's bot started as `name` (`@username`): remembered, or
    /// its earlier name replaced.
    pub async fn record_bot(&self, name: &str, username: &str) -> Result<(), StoreError> {
        let bot = self.bot().get();
        let (name, username) = (name.to_string(), username.to_string());
        self.call_one_write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO bots (bot_id, name, username, started_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (bot_id) DO UPDATE
                 SET name = excluded.name, username = excluded.username,
                     started_at = excluded.started_at",
            )?
            .execute(params![bot, name, username, now_ms()])?;
            Ok(())
        })
        .await
    }
}

/// Every bot recorded in the database `conn` is open on, by name (none
/// when the database is older than the table).
pub fn known_bots(conn: &Connection) -> Result<Vec<(BotId, String)>, StoreError> {
    let has_table: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'bots'",
        [],
        |r| r.get(0),
    )?;
    if has_table == 0 {
        return Ok(Vec::new());
    }
    let mut statement = conn.prepare("SELECT bot_id, name FROM bots ORDER BY name")?;
    let bots = statement
        .query_map([], |r| Ok((BotId(r.get(0)?), r.get(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(bots)
}

#[cfg(test)]
mod tests {
    use super::known_bots;
    use crate::store::Store;
    use crate::vocab::BotId;

    #[tokio::test]
    async fn a_bot_is_recorded_under_its_latest_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("telegate.db");
        let store = Store::open_async(&path).await.unwrap();
        store
            .for_bot(BotId(7))
            .record_bot("old", "b7")
            .await
            .unwrap();
        store
            .for_bot(BotId(7))
            .record_bot("coder", "b7")
            .await
            .unwrap();
        store
            .for_bot(BotId(9))
            .record_bot("helper", "b9")
            .await
            .unwrap();
        store.close().await.unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(
            known_bots(&conn).unwrap(),
            [
                (BotId(7), "coder".to_string()),
                (BotId(9), "helper".to_string())
            ]
        );
        let empty = rusqlite::Connection::open_in_memory().unwrap();
        assert!(known_bots(&empty).unwrap().is_empty());
    }
}
