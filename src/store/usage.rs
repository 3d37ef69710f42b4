//! Per-user usage and settings (migration "teams").
//!
//! One row per turn a user started: when, in which chat and session, and
//! the tokens and cost the backend reported for it. Budgets ask for sums
//! over a time range (a day in the bot's time zone, a month) and for the
//! turns of the last hour; /usage and /users show the same sums. Times are
//! plain unix milliseconds: which range is "today" is the caller's
//! decision ([`crate::limits`]), so a change of time zone never rewrites
//! history.
//!
//! Usage and settings are per bot (`bot_id`).
//!
//! Also the per-user settings (`/voice`). This module never decides what
//! a limit is.

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};

use super::{AgentUsage, StoreError, Usage, WriteKind};

/// One turn's usage, to record.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnUsage {
    /// Who started it.
    pub user_id: u64,
    /// Where.
    pub chat_id: i64,
    /// The conversation.
    pub session_id: String,
    /// When it started (unix ms).
    pub at_ms: i64,
    /// What the backend reported (`turns` is ignored: one row, one turn).
    pub usage: AgentUsage,
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Usage {
    /// Record one turn's usage.
    pub async fn record_turn_usage(&self, turn: TurnUsage) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write_one(WriteKind::Usage, move |conn| {
            insert_turn_usage(conn, bot, &turn)
        })
        .await
    }

    /// The usage of each user (or of `user` only) in `[from_ms, to_ms)`:
    /// turns counted, tokens and cost summed.
    pub async fn usage_between(
        &self,
        user: Option<u64>,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<HashMap<u64, AgentUsage>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT user_id, count(*), sum(input_tokens), sum(cached_input_tokens),
                        sum(output_tokens), sum(cost_usd)
                 FROM usage_turns
                 WHERE bot_id = ?4 AND at >= ?1 AND at < ?2 AND (?3 IS NULL OR user_id = ?3)
                 GROUP BY user_id",
            )?;
            let rows = stmt.query_map(params![from_ms, to_ms, user.map(to_i64), bot], |r| {
                Ok((
                    to_u64(r.get(0)?),
                    AgentUsage {
                        turns: to_u64(r.get(1)?),
                        input_tokens: to_u64(r.get(2)?),
                        cached_input_tokens: to_u64(r.get(3)?),
                        output_tokens: to_u64(r.get(4)?),
                        cost_usd: r.get(5)?,
                    },
                ))
            })?;
            Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
        })
        .await
    }

    /// When `user` started turns since `since_ms` (unix ms, oldest first).
    pub async fn turn_times_since(&self, user: u64, since_ms: i64) -> Result<Vec<i64>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT at FROM usage_turns
                 WHERE bot_id = ?3 AND user_id = ?1 AND at > ?2 ORDER BY at",
            )?;
            let rows = stmt.query_map(params![to_i64(user), since_ms, bot], |r| r.get(0))?;
            Ok(rows.collect::<Result<Vec<i64>, _>>()?)
        })
        .await
    }

    /// When each user last started a turn (unix ms).
    pub async fn last_turns(&self) -> Result<HashMap<u64, i64>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT user_id, max(at) FROM usage_turns WHERE bot_id = ?1 GROUP BY user_id",
            )?;
            let rows = stmt.query_map([bot], |r| Ok((to_u64(r.get(0)?), r.get::<_, i64>(1)?)))?;
            Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
        })
        .await
    }

    /// `user`'s `/voice` setting, if they chose one.
    pub async fn voice_setting(&self, user: u64) -> Result<Option<String>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT voice FROM user_settings WHERE bot_id = ?2 AND user_id = ?1",
                )?
                .query_row(params![to_i64(user), bot], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    /// Set `user`'s `/voice` setting (`on`, `off` or `auto`).
    pub async fn set_voice_setting(&self, user: u64, mode: &str) -> Result<(), StoreError> {
        let (bot, mode) = (self.bot(), mode.to_owned());
        self.write_one(WriteKind::Usage, move |conn| {
            conn.prepare_cached(
                "INSERT INTO user_settings (bot_id, user_id, voice) VALUES (?3, ?1, ?2)
                 ON CONFLICT (bot_id, user_id) DO UPDATE SET voice = excluded.voice",
            )?
            .execute(params![to_i64(user), mode, bot])?;
            Ok(())
        })
        .await
    }
}

/// One turn's row in `usage_turns`, `bot`'s (one statement).
pub(super) fn insert_turn_usage(
    conn: &Connection,
    bot: i64,
    turn: &TurnUsage,
) -> Result<(), StoreError> {
    let u = &turn.usage;
    conn.prepare_cached(
        "INSERT INTO usage_turns (bot_id, user_id, chat_id, session_id, at, input_tokens,
             cached_input_tokens, output_tokens, cost_usd)
         VALUES (?9, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        to_i64(turn.user_id),
        turn.chat_id,
        turn.session_id,
        turn.at_ms,
        to_i64(u.input_tokens),
        to_i64(u.cached_input_tokens),
        to_i64(u.output_tokens),
        u.cost_usd,
        bot
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    fn turn(user_id: u64, at_ms: i64, tokens: u64, cost: f64) -> TurnUsage {
        TurnUsage {
            user_id,
            chat_id: 5,
            session_id: "s".into(),
            at_ms,
            usage: AgentUsage {
                turns: 1,
                input_tokens: tokens,
                cached_input_tokens: 1,
                output_tokens: 2,
                cost_usd: cost,
            },
        }
    }

    #[tokio::test]
    async fn sums_per_user_in_a_range_and_the_last_turns() {
        let s = Store::open_in_memory().unwrap();
        s.usage()
            .record_turn_usage(turn(1, 100, 10, 0.5))
            .await
            .unwrap();
        s.usage()
            .record_turn_usage(turn(1, 200, 20, 0.25))
            .await
            .unwrap();
        s.usage()
            .record_turn_usage(turn(2, 150, 7, 0.0))
            .await
            .unwrap();
        s.usage()
            .record_turn_usage(turn(1, 300, 99, 9.0))
            .await
            .unwrap();
        let all = s.usage().usage_between(None, 100, 300).await.unwrap();
        let one = &all[&1];
        assert_eq!((one.turns, one.input_tokens, one.output_tokens), (2, 30, 4));
        assert!((one.cost_usd - 0.75).abs() < 1e-9);
        assert_eq!(all[&2].turns, 1);
        let mine = s.usage().usage_between(Some(2), 0, 1000).await.unwrap();
        assert_eq!(mine.len(), 1);
        assert!(s
            .usage()
            .usage_between(Some(3), 0, 1000)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.usage().turn_times_since(1, 100).await.unwrap(),
            [200, 300]
        );
        let last = s.usage().last_turns().await.unwrap();
        assert_eq!((last[&1], last[&2]), (300, 150));
    }

    #[tokio::test]
    async fn the_voice_setting_is_kept_per_user() {
        let s = Store::open_in_memory().unwrap();
        assert_eq!(s.usage().voice_setting(1).await.unwrap(), None);
        s.usage().set_voice_setting(1, "auto").await.unwrap();
        s.usage().set_voice_setting(1, "on").await.unwrap();
        assert_eq!(
            s.usage().voice_setting(1).await.unwrap().as_deref(),
            Some("on")
        );
        assert!(s.usage().set_voice_setting(2, "loud").await.is_err());
    }

    #[tokio::test]
    async fn usage_and_settings_are_kept_per_bot() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.usage()
            .record_turn_usage(turn(42, 100, 10, 0.5))
            .await
            .unwrap();
        b.usage()
            .record_turn_usage(turn(42, 200, 20, 1.0))
            .await
            .unwrap();
        b.transcripts()
            .append_many_charging(
                "s",
                vec![crate::store::TranscriptEntry::user("hi")],
                Some(turn(42, 300, 30, 1.0)),
            )
            .await
            .unwrap();
        let sums = |store: &Store| {
            let usage = store.usage();
            async move { usage.usage_between(Some(42), 0, 1000).await.unwrap() }
        };
        assert_eq!(sums(&a).await[&42].input_tokens, 10);
        assert_eq!(sums(&b).await[&42].input_tokens, 50);
        assert_eq!(a.usage().turn_times_since(42, 0).await.unwrap(), vec![100]);
        assert_eq!(b.usage().last_turns().await.unwrap()[&42], 300);
        a.usage().set_voice_setting(42, "on").await.unwrap();
        b.usage().set_voice_setting(42, "auto").await.unwrap();
        assert_eq!(
            a.usage().voice_setting(42).await.unwrap().as_deref(),
            Some("on")
        );
        assert_eq!(
            b.usage().voice_setting(42).await.unwrap().as_deref(),
            Some("auto")
        );
        assert!(s.usage().last_turns().await.unwrap().is_empty());
    }
}
