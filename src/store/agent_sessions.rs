//! The CLI agent's own session per telegate session, and what it cost.
//!
//! Claude Code and Codex keep their conversations themselves; telegate
//! keeps, per telegate session id, the agent's session (or thread) id that
//! the next turn resumes, plus the usage and cost the agent reported. The
//! row belongs to the telegate session, so /new and /reset (a new session
//! id) start the agent afresh by construction, and a restart of telegate
//! finds the id again.
//!
//! Rows are the handle's bot's (`bot_id` leads their keys).
//!
//! This module never decides when to resume; it only remembers.

use rusqlite::{params, OptionalExtension};

use super::{now_ms, AgentSessions, StoreError, WriteKind};

/// Tokens and cost, of one turn or summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AgentUsage {
    /// Turns counted.
    pub turns: u64,
    /// Input tokens not read from the cache (cache writes included).
    pub input_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cached_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cost in US dollars, as the agent reported it (0 if it does not).
    pub cost_usd: f64,
}

impl AgentUsage {
    /// Add `other` to this one.
    pub fn add(&mut self, other: &AgentUsage) {
        self.turns += other.turns;
        self.input_tokens += other.input_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl AgentSessions {
    /// The agent session that `session_id`'s next turn resumes, if any.
    pub async fn agent_resume_id(&self, session_id: &str) -> Result<Option<String>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT agent_session_id FROM agent_sessions
                     WHERE bot_id = ?2 AND session_id = ?1",
                )?
                .query_row(params![session_id, bot], |r| r.get::<_, Option<String>>(0))
                .optional()?
                .flatten())
        })
        .await
    }

    /// Remember (or, with `None`, forget) the agent session of `session_id`.
    pub async fn set_agent_resume_id(
        &self,
        session_id: &str,
        backend: &str,
        agent_session_id: Option<String>,
    ) -> Result<(), StoreError> {
        let (bot, session_id, backend) = (self.bot(), session_id.to_owned(), backend.to_owned());
        self.write(WriteKind::AgentSession, move |conn| {
            conn.prepare_cached(
                "INSERT INTO agent_sessions
                     (bot_id, session_id, backend, agent_session_id, updated_at)
                 VALUES (?5, ?1, ?2, ?3, ?4)
                 ON CONFLICT (bot_id, session_id) DO UPDATE SET
                     backend = excluded.backend,
                     agent_session_id = excluded.agent_session_id,
                     updated_at = excluded.updated_at",
            )?
            .execute(params![
                session_id,
                backend,
                agent_session_id,
                now_ms(),
                bot
            ])?;
            Ok(())
        })
        .await
    }

    /// Add one turn's usage to `session_id`'s.
    pub async fn add_agent_usage(
        &self,
        session_id: &str,
        backend: &str,
        usage: AgentUsage,
    ) -> Result<(), StoreError> {
        let (bot, session_id, backend) = (self.bot(), session_id.to_owned(), backend.to_owned());
        self.write(WriteKind::AgentSession, move |conn| {
            add_usage_row(conn, bot, &session_id, &backend, &usage)
        })
        .await
    }

    /// Add one turn's usage to `session_id`'s when the agent reports the
    /// thread's running total (`thread_total`, Codex after a resume): the
    /// turn's own usage is the difference to what `thread_id` reported
    /// last (all of it on a thread's first report, or when a figure went
    /// down). Returns the usage added.
    pub async fn add_agent_thread_usage(
        &self,
        session_id: &str,
        backend: &str,
        thread_id: &str,
        thread_total: AgentUsage,
    ) -> Result<AgentUsage, StoreError> {
        let (bot, session_id, backend, thread_id) = (
            self.bot(),
            session_id.to_owned(),
            backend.to_owned(),
            thread_id.to_owned(),
        );
        self.write(WriteKind::AgentSession, move |conn| {
            let previous = conn
                .prepare_cached(
                    "SELECT input_tokens, cached_input_tokens, output_tokens
                     FROM agent_thread_usage WHERE bot_id = ?2 AND thread_id = ?1",
                )?
                .query_row(params![&thread_id, bot], |r| {
                    Ok(AgentUsage {
                        turns: 0,
                        input_tokens: to_u64(r.get(0)?),
                        cached_input_tokens: to_u64(r.get(1)?),
                        output_tokens: to_u64(r.get(2)?),
                        cost_usd: 0.0,
                    })
                })
                .optional()?;
            let turn = turn_usage(previous.as_ref(), &thread_total);
            conn.prepare_cached(
                "INSERT INTO agent_thread_usage (bot_id, thread_id, backend, input_tokens,
                     cached_input_tokens, output_tokens, updated_at)
                 VALUES (?7, ?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (bot_id, thread_id) DO UPDATE SET
                     input_tokens = excluded.input_tokens,
                     cached_input_tokens = excluded.cached_input_tokens,
                     output_tokens = excluded.output_tokens,
                     updated_at = excluded.updated_at",
            )?
            .execute(params![
                thread_id,
                backend,
                to_i64(thread_total.input_tokens),
                to_i64(thread_total.cached_input_tokens),
                to_i64(thread_total.output_tokens),
                now_ms(),
                bot
            ])?;
            add_usage_row(conn, bot, &session_id, &backend, &turn)?;
            Ok(turn)
        })
        .await
    }

    /// The usage recorded for `session_id` (`None`: nothing recorded).
    pub async fn agent_usage(&self, session_id: &str) -> Result<Option<AgentUsage>, StoreError> {
        let (bot, session_id) = (self.bot(), session_id.to_owned());
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "{SELECT_USAGE} WHERE bot_id = ?2 AND session_id = ?1"
                ))?
                .query_row(params![session_id, bot], usage_row)
                .optional()?
                .filter(|u| u.turns > 0))
        })
        .await
    }

    /// The usage of every session together.
    pub async fn agent_usage_total(&self) -> Result<AgentUsage, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT coalesce(sum(turns), 0), coalesce(sum(input_tokens), 0),
                            coalesce(sum(cached_input_tokens), 0), coalesce(sum(output_tokens), 0),
                            coalesce(sum(cost_usd), 0.0)
                     FROM agent_sessions WHERE bot_id = ?1",
                )?
                .query_row([bot], usage_row)?)
        })
        .await
    }
}

/// A turn's own usage from its thread's running totals, `previous` and
/// `now` (pure). A figure that went down means the thread was counted
/// afresh: then `now` is the turn's.
pub fn turn_usage(previous: Option<&AgentUsage>, now: &AgentUsage) -> AgentUsage {
    let Some(previous) = previous else {
        return AgentUsage { turns: 1, ..*now };
    };
    let went_down = now.input_tokens < previous.input_tokens
        || now.cached_input_tokens < previous.cached_input_tokens
        || now.output_tokens < previous.output_tokens;
    if went_down {
        return AgentUsage { turns: 1, ..*now };
    }
    AgentUsage {
        turns: 1,
        input_tokens: now.input_tokens - previous.input_tokens,
        cached_input_tokens: now.cached_input_tokens - previous.cached_input_tokens,
        output_tokens: now.output_tokens - previous.output_tokens,
        cost_usd: now.cost_usd,
    }
}

/// Add `usage` to the row of `bot`'s `session_id`.
fn add_usage_row(
    conn: &rusqlite::Connection,
    bot: i64,
    session_id: &str,
    backend: &str,
    usage: &AgentUsage,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO agent_sessions (bot_id, session_id, backend, turns, input_tokens,
             cached_input_tokens, output_tokens, cost_usd, updated_at)
         VALUES (?9, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (bot_id, session_id) DO UPDATE SET
             turns = turns + excluded.turns,
             input_tokens = input_tokens + excluded.input_tokens,
             cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
             output_tokens = output_tokens + excluded.output_tokens,
             cost_usd = cost_usd + excluded.cost_usd,
             updated_at = excluded.updated_at",
    )?
    .execute(params![
        session_id,
        backend,
        to_i64(usage.turns),
        to_i64(usage.input_tokens),
        to_i64(usage.cached_input_tokens),
        to_i64(usage.output_tokens),
        usage.cost_usd,
        now_ms(),
        bot
    ])?;
    Ok(())
}

const SELECT_USAGE: &str =
    "SELECT turns, input_tokens, cached_input_tokens, output_tokens, cost_usd FROM agent_sessions";

fn usage_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AgentUsage> {
    Ok(AgentUsage {
        turns: to_u64(r.get(0)?),
        input_tokens: to_u64(r.get(1)?),
        cached_input_tokens: to_u64(r.get(2)?),
        output_tokens: to_u64(r.get(3)?),
        cost_usd: r.get(4)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;

    #[tokio::test]
    async fn resume_ids_and_usage_per_session() {
        let s = Store::open_in_memory().unwrap();
        assert_eq!(s.agent_sessions().agent_resume_id("a").await.unwrap(), None);
        s.agent_sessions()
            .set_agent_resume_id("a", "claude", Some("c1".into()))
            .await
            .unwrap();
        assert_eq!(
            s.agent_sessions()
                .agent_resume_id("a")
                .await
                .unwrap()
                .as_deref(),
            Some("c1")
        );
        let turn = AgentUsage {
            turns: 1,
            input_tokens: 10,
            cached_input_tokens: 5,
            output_tokens: 3,
            cost_usd: 0.25,
        };
        s.agent_sessions()
            .add_agent_usage("a", "claude", turn)
            .await
            .unwrap();
        s.agent_sessions()
            .add_agent_usage("a", "claude", turn)
            .await
            .unwrap();
        s.agent_sessions()
            .add_agent_usage("b", "codex", turn)
            .await
            .unwrap();
        // Usage does not touch the resume id, and forgetting it keeps usage.
        assert_eq!(
            s.agent_sessions()
                .agent_resume_id("a")
                .await
                .unwrap()
                .as_deref(),
            Some("c1")
        );
        s.agent_sessions()
            .set_agent_resume_id("a", "claude", None)
            .await
            .unwrap();
        assert_eq!(s.agent_sessions().agent_resume_id("a").await.unwrap(), None);
        let a = s.agent_sessions().agent_usage("a").await.unwrap().unwrap();
        assert_eq!((a.turns, a.input_tokens, a.output_tokens), (2, 20, 6));
        assert!((a.cost_usd - 0.5).abs() < 1e-9);
        let total = s.agent_sessions().agent_usage_total().await.unwrap();
        assert_eq!(total.turns, 3);
        assert!((total.cost_usd - 0.75).abs() < 1e-9);
        assert_eq!(s.agent_sessions().agent_usage("none").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_threads_running_totals_count_each_turn_once() {
        let s = Store::open_in_memory().unwrap();
        let total = |input, output| AgentUsage {
            turns: 1,
            input_tokens: input,
            cached_input_tokens: 0,
            output_tokens: output,
            cost_usd: 0.0,
        };
        for (reported, added) in [(2000, 2000), (3000, 1000), (4000, 1000)] {
            let turn = s
                .agent_sessions()
                .add_agent_thread_usage("a", "codex", "t1", total(reported, reported / 10))
                .await
                .unwrap();
            assert_eq!(turn.input_tokens, added);
        }
        let a = s.agent_sessions().agent_usage("a").await.unwrap().unwrap();
        assert_eq!((a.turns, a.input_tokens, a.output_tokens), (3, 4000, 400));
        // Another thread starts from nothing; a total that went down is a
        // fresh count.
        let b = s
            .agent_sessions()
            .add_agent_thread_usage("b", "codex", "t2", total(500, 5))
            .await
            .unwrap();
        assert_eq!(b.input_tokens, 500);
        let reset = turn_usage(Some(&total(4000, 400)), &total(100, 10));
        assert_eq!(reset.input_tokens, 100);
    }

    #[tokio::test]
    async fn agent_sessions_and_usage_are_kept_per_bot() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        a.agent_sessions()
            .set_agent_resume_id("s", "claude", Some("c1".into()))
            .await
            .unwrap();
        assert_eq!(b.agent_sessions().agent_resume_id("s").await.unwrap(), None);
        let total = |input_tokens| AgentUsage {
            turns: 1,
            input_tokens,
            ..AgentUsage::default()
        };
        a.agent_sessions()
            .add_agent_thread_usage("s", "codex", "thread", total(1000))
            .await
            .unwrap();
        // The same thread id reported to another bot is that bot's first.
        let theirs = b
            .agent_sessions()
            .add_agent_thread_usage("s", "codex", "thread", total(1500))
            .await
            .unwrap();
        assert_eq!(theirs.input_tokens, 1500);
        b.agent_sessions()
            .add_agent_usage("s", "codex", total(5))
            .await
            .unwrap();
        let usage = |store: &Store| {
            let sessions = store.agent_sessions();
            async move { sessions.agent_usage("s").await.unwrap().unwrap() }
        };
        assert_eq!(
            (usage(&a).await.turns, usage(&a).await.input_tokens),
            (1, 1000)
        );
        assert_eq!(
            (usage(&b).await.turns, usage(&b).await.input_tokens),
            (2, 1505)
        );
        assert_eq!(
            a.agent_sessions().agent_usage_total().await.unwrap().turns,
            1
        );
        assert_eq!(
            a.agent_sessions()
                .agent_resume_id("s")
                .await
                .unwrap()
                .as_deref(),
            Some("c1")
        );
    }
}
