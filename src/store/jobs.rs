//! Scheduled jobs: their rows, the journal of their runs and the chats'
//! time zones.
//!
//! The store keeps a job as the schedule module hands it over (schedule
//! and action as JSON it interprets, [`crate::schedule`]); what this module
//! guarantees is the bookkeeping that makes a run happen exactly once:
//!
//! * **Firing is one transaction** ([`Jobs::fire_job`]): the job's
//!   `next_run` moves on (compare-and-set on the value the scheduler read,
//!   so a pause, delete or concurrent firing in between wins), `last_fired`
//!   records the newest instant, and each run's inbox row is written (its
//!   id derived from the job and the instant, so the `inbox` primary key
//!   refuses a second row for the same run). A crash before the commit
//!   leaves the job due and no row: the next start fires the same instant
//!   under the same id. A crash after it leaves the row for recovery.
//! * A run in a **fresh session** gets its session id recorded in
//!   `session_history` in that same transaction, under the slot's key and
//!   already marked rotated: it is issued (so wakeups and lookups resolve
//!   it to the chat) but never the slot's current session.
//! * The number of jobs a chat holds is checked in the transaction that
//!   inserts one ([`Jobs::create_job`]).
//!
//! Jobs, their runs' inbox rows and time zones are the handle's bot's:
//! the scheduler of one bot lists, fires and changes only its own jobs
//! (job ids are global, the look-up by id is scoped all the same).
//!
//! Every write goes through [`Jobs::write`] ([`WriteKind::Job`]). Job texts
//! are user data: this module logs ids only.

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;

use super::{now_ms, Jobs, StoreError, WriteKind};

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for its next run (`next_run` is set).
    Active,
    /// Paused by a user or after failing runs; keeps its schedule.
    Paused,
    /// A one-time job that has fired.
    Done,
}

impl JobState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Active => "active",
            JobState::Paused => "paused",
            JobState::Done => "done",
        }
    }

    fn parse(s: &str) -> JobState {
        match s {
            "active" => JobState::Active,
            "paused" => JobState::Paused,
            _ => JobState::Done,
        }
    }
}

/// A job to store.
#[derive(Clone, Debug, PartialEq)]
pub struct NewJob {
    /// The chat it runs in.
    pub chat_id: i64,
    /// `dm`, `group`, `supergroup` or `channel`.
    pub chat_type: String,
    /// The forum topic, if any.
    pub thread_id: Option<i32>,
    /// The slot its runs belong to.
    pub session_key: String,
    /// Who made it.
    pub creator_id: Option<u64>,
    /// Their display name.
    pub creator_name: Option<String>,
    /// When it runs (JSON the schedule module reads).
    pub schedule: Value,
    /// The schedule as people read it ("every weekday at 08:00").
    pub label: String,
    /// The IANA time zone its times are in.
    pub timezone: String,
    /// What it does (JSON the schedule module reads).
    pub action: Value,
    /// Its first run (unix ms).
    pub next_run: i64,
}

/// A stored job.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredJob {
    /// Its id (never reused).
    pub id: i64,
    /// What was stored (`next_run` as it is now, or 0 when not active).
    pub job: NewJob,
    /// Active, paused or done.
    pub state: JobState,
    /// The next run while active.
    pub next_run: Option<i64>,
    /// The newest instant a run was journaled for.
    pub last_fired: Option<i64>,
    /// Runs that failed in a row.
    pub failures: u32,
}

/// One run to journal when a job fires.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRun {
    /// The run's inbox id (also its message id), derived from the job and
    /// the instant.
    pub run_id: i64,
    /// The inbox payload that rebuilds the run's event.
    pub payload: Value,
    /// A fresh session this run starts (recorded as issued, not current).
    pub fresh_session: Option<String>,
}

/// What firing a job writes ([`Jobs::fire_job`]).
#[derive(Clone, Debug, PartialEq)]
pub struct JobFiring {
    /// The job.
    pub job_id: i64,
    /// The `next_run` the scheduler read: nothing happens if it changed.
    pub expected_next: i64,
    /// The run after these (`None`: the job is done).
    pub next_run: Option<i64>,
    /// The newest instant considered (run or skipped).
    pub last_fired: i64,
    /// The runs to journal (may be empty when every due run was skipped).
    pub runs: Vec<NewRun>,
}

/// After a run's outcome was recorded ([`Jobs::record_job_outcome`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    /// Runs failed in a row now.
    pub failures: u32,
    /// This failure paused the job.
    pub paused: bool,
}

/// One-time jobs that fired longer ago than this are deleted.
const KEEP_DONE_MS: i64 = 7 * 24 * 3600 * 1000;

const COLUMNS: &str = "id, chat_id, chat_type, thread_id, session_key, creator_id, creator_name,
     schedule, label, timezone, action, state, next_run, last_fired, failures";

fn read_job(row: &Row<'_>) -> rusqlite::Result<(StoredJob, String, String)> {
    let next_run: Option<i64> = row.get(12)?;
    let job = NewJob {
        chat_id: row.get(1)?,
        chat_type: row.get(2)?,
        thread_id: row.get(3)?,
        session_key: row.get(4)?,
        creator_id: row
            .get::<_, Option<i64>>(5)?
            .and_then(|u| u64::try_from(u).ok()),
        creator_name: row.get(6)?,
        schedule: Value::Null,
        label: row.get(8)?,
        timezone: row.get(9)?,
        action: Value::Null,
        next_run: next_run.unwrap_or(0),
    };
    let stored = StoredJob {
        id: row.get(0)?,
        job,
        state: JobState::parse(&row.get::<_, String>(11)?),
        next_run,
        last_fired: row.get(13)?,
        failures: u32::try_from(row.get::<_, i64>(14)?).unwrap_or(u32::MAX),
    };
    Ok((stored, row.get(7)?, row.get(10)?))
}

fn decode(parts: (StoredJob, String, String)) -> Result<StoredJob, StoreError> {
    let (mut stored, schedule, action) = parts;
    stored.job.schedule = serde_json::from_str(&schedule)?;
    stored.job.action = serde_json::from_str(&action)?;
    Ok(stored)
}

fn select_jobs(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<StoredJob>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM jobs WHERE {filter}");
    let mut statement = conn.prepare_cached(&sql)?;
    let rows = statement.query_map(params, read_job)?;
    let mut jobs = Vec::new();
    for row in rows {
        jobs.push(decode(row?)?);
    }
    Ok(jobs)
}

/// Fires one of `bot`'s jobs: its runs are journaled in `bot`'s inbox.
fn fire_one(
    conn: &Connection,
    bot: i64,
    firing: &JobFiring,
    now: i64,
) -> Result<Vec<i64>, StoreError> {
    let state = if firing.next_run.is_some() {
        "active"
    } else {
        "done"
    };
    let moved = conn
        .prepare_cached(
            "UPDATE jobs SET next_run = ?3, last_fired = ?4, state = ?5, updated_at = ?6
             WHERE bot_id = ?7 AND id = ?1 AND state = 'active' AND next_run = ?2",
        )?
        .execute(params![
            firing.job_id,
            firing.expected_next,
            firing.next_run,
            firing.last_fired,
            state,
            now,
            bot
        ])?;
    if moved == 0 {
        return Ok(Vec::new());
    }
    let (chat_id, key): (i64, String) = conn.query_row(
        "SELECT chat_id, session_key FROM jobs WHERE bot_id = ?2 AND id = ?1",
        params![firing.job_id, bot],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let mut journaled = Vec::with_capacity(firing.runs.len());
    for run in &firing.runs {
        let inserted = conn
            .prepare_cached(
                "INSERT OR IGNORE INTO inbox
                 (bot_id, update_id, chat_id, message_id, payload, state, received_at, updated_at)
                 VALUES (?5, ?1, ?2, ?1, ?3, 'received', ?4, ?4)",
            )?
            .execute(params![
                run.run_id,
                chat_id,
                run.payload.to_string(),
                now,
                bot
            ])?;
        if inserted == 0 {
            // Journaled before (the same run): never a second turn.
            continue;
        }
        if let Some(session) = &run.fresh_session {
            conn.execute(
                "INSERT INTO session_history
                 (bot_id, session_id, session_key, created_at, last_active_at, rotated_at)
                 VALUES (?4, ?1, ?2, ?3, ?3, ?3)",
                params![session, key, now, bot],
            )?;
        }
        journaled.push(run.run_id);
    }
    Ok(journaled)
}

impl Jobs {
    /// Store `job`, unless its chat already holds `max_per_chat` jobs that
    /// are active or paused: `None` then. Returns the new id.
    pub async fn create_job(
        &self,
        job: NewJob,
        max_per_chat: usize,
    ) -> Result<Option<i64>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            tx.execute(
                "DELETE FROM jobs WHERE bot_id = ?2 AND state = 'done' AND updated_at < ?1",
                params![now - KEEP_DONE_MS, bot],
            )?;
            let held: i64 = tx.query_row(
                "SELECT COUNT(*) FROM jobs
                 WHERE bot_id = ?2 AND chat_id = ?1 AND state IN ('active', 'paused')",
                params![job.chat_id, bot],
                |r| r.get(0),
            )?;
            if usize::try_from(held).unwrap_or(usize::MAX) >= max_per_chat {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO jobs (bot_id, chat_id, chat_type, thread_id, session_key,
                     creator_id, creator_name, schedule, label, timezone, action, state,
                     next_run, created_at, updated_at)
                 VALUES (?13, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'active', ?11, ?12, ?12)",
                params![
                    job.chat_id,
                    job.chat_type,
                    job.thread_id,
                    job.session_key,
                    job.creator_id.and_then(|u| i64::try_from(u).ok()),
                    job.creator_name,
                    job.schedule.to_string(),
                    job.label,
                    job.timezone,
                    job.action.to_string(),
                    job.next_run,
                    now,
                    bot
                ],
            )?;
            let id = tx.last_insert_rowid();
            tx.commit()?;
            Ok(Some(id))
        })
        .await
    }

    /// The job with `id`, whatever its state.
    pub async fn job(&self, id: i64) -> Result<Option<StoredJob>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            Ok(select_jobs(conn, "bot_id = ?2 AND id = ?1", params![id, bot])?.pop())
        })
        .await
    }

    /// The active and paused jobs of `chat_id`, oldest first.
    pub async fn chat_jobs(&self, chat_id: i64) -> Result<Vec<StoredJob>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            select_jobs(
                conn,
                "bot_id = ?2 AND chat_id = ?1 AND state IN ('active', 'paused') ORDER BY id",
                params![chat_id, bot],
            )
        })
        .await
    }

    /// When the earliest active job is due (unix ms), if any job is active.
    /// One lookup in the `jobs_due` index, however many jobs there are.
    pub async fn next_job_due(&self) -> Result<Option<i64>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT next_run FROM jobs WHERE bot_id = ?1 AND state = 'active'
                     ORDER BY next_run LIMIT 1",
                )?
                .query_row([bot], |r| r.get::<_, i64>(0))
                .optional()?)
        })
        .await
    }

    /// Active jobs due at `now` (unix ms), earliest first, at most `limit`.
    pub async fn due_jobs(&self, now: i64, limit: usize) -> Result<Vec<StoredJob>, StoreError> {
        let (bot, limit) = (self.bot(), i64::try_from(limit).unwrap_or(i64::MAX));
        self.call(move |conn| {
            select_jobs(
                conn,
                "bot_id = ?3 AND state = 'active' AND next_run <= ?1 ORDER BY next_run LIMIT ?2",
                params![now, limit, bot],
            )
        })
        .await
    }

    /// Fire a job: move it on and journal its runs, in one transaction
    /// (see the module docs). Returns the ids of the runs journaled now;
    /// nothing at all happens (and nothing is returned) if the job is no
    /// longer active with `expected_next` as its next run.
    pub async fn fire_job(&self, firing: JobFiring) -> Result<Vec<i64>, StoreError> {
        let mut fired = self.fire_jobs(vec![firing]).await?;
        Ok(fired.pop().unwrap_or_default())
    }

    /// [`Jobs::fire_job`] for several jobs in one transaction (all or
    /// none): the runs journaled for each, in order.
    pub async fn fire_jobs(&self, firings: Vec<JobFiring>) -> Result<Vec<Vec<i64>>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            let mut fired = Vec::with_capacity(firings.len());
            for firing in &firings {
                fired.push(fire_one(&tx, bot, firing, now)?);
            }
            tx.commit()?;
            Ok(fired)
        })
        .await
    }

    /// Pause job `id` (`next_run: None`) or make it active again with
    /// `next_run` (its failures forgotten). False if the job is gone or
    /// done.
    pub async fn set_job_active(&self, id: i64, next_run: Option<i64>) -> Result<bool, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            let state = if next_run.is_some() {
                "active"
            } else {
                "paused"
            };
            let changed = conn.execute(
                "UPDATE jobs SET state = ?2, next_run = ?3, failures = 0, updated_at = ?4
                 WHERE bot_id = ?5 AND id = ?1 AND state IN ('active', 'paused')",
                params![id, state, next_run, now_ms(), bot],
            )?;
            Ok(changed > 0)
        })
        .await
    }

    /// Pause every active job `creator` made (their access was taken
    /// away). Returns the ids paused, lowest first.
    pub async fn pause_jobs_of(&self, creator: u64) -> Result<Vec<i64>, StoreError> {
        let (bot, creator) = (self.bot(), i64::try_from(creator).unwrap_or(i64::MAX));
        self.write(WriteKind::Job, move |conn| {
            let tx = conn.savepoint()?;
            let ids = tx
                .prepare(
                    "SELECT id FROM jobs WHERE bot_id = ?1 AND creator_id = ?2 AND state = 'active'
                     ORDER BY id",
                )?
                .query_map(params![bot, creator], |r| r.get::<_, i64>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            tx.execute(
                "UPDATE jobs SET state = 'paused', next_run = NULL, updated_at = ?3
                 WHERE bot_id = ?1 AND creator_id = ?2 AND state = 'active'",
                params![bot, creator, now_ms()],
            )?;
            tx.commit()?;
            Ok(ids)
        })
        .await
    }

    /// Delete job `id`. False if there was none. Runs already journaled
    /// stay in the inbox (their turn finds the job gone and does nothing).
    pub async fn delete_job(&self, id: i64) -> Result<bool, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            Ok(conn.execute(
                "DELETE FROM jobs WHERE bot_id = ?2 AND id = ?1",
                params![id, bot],
            )? > 0)
        })
        .await
    }

    /// Record how a run of job `id` ended: a success clears its failures,
    /// a failure counts one more and pauses the job once `max_failures`
    /// are reached. `None` if the job is gone.
    pub async fn record_job_outcome(
        &self,
        id: i64,
        failed: bool,
        max_failures: u32,
    ) -> Result<Option<JobOutcome>, StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            let Some((failures, state)): Option<(i64, String)> = tx
                .query_row(
                    "SELECT failures, state FROM jobs WHERE bot_id = ?2 AND id = ?1",
                    params![id, bot],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?
            else {
                return Ok(None);
            };
            let failures = if failed {
                u32::try_from(failures)
                    .unwrap_or(u32::MAX)
                    .saturating_add(1)
            } else {
                0
            };
            let pause = failed && failures >= max_failures && state == "active";
            tx.execute(
                "UPDATE jobs SET failures = ?2, updated_at = ?3 WHERE bot_id = ?4 AND id = ?1",
                params![id, failures, now, bot],
            )?;
            if pause {
                tx.execute(
                    "UPDATE jobs SET state = 'paused', next_run = NULL WHERE bot_id = ?2 AND id = ?1",
                    params![id, bot],
                )?;
            }
            tx.commit()?;
            Ok(Some(JobOutcome {
                failures,
                paused: pause,
            }))
        })
        .await
    }

    /// The time zone `chat_id` chose with `/timezone`, if any.
    pub async fn chat_timezone(&self, chat_id: i64) -> Result<Option<String>, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT timezone FROM chat_timezones WHERE bot_id = ?2 AND chat_id = ?1",
                )?
                .query_row(params![chat_id, bot], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    /// Set `chat_id`'s time zone and move its jobs into it: each of
    /// `retimed` is `(job id, next_run)` (`None` for a paused job, whose
    /// next run is computed when it resumes).
    pub async fn set_chat_timezone(
        &self,
        chat_id: i64,
        timezone: String,
        retimed: Vec<(i64, Option<i64>)>,
    ) -> Result<(), StoreError> {
        let bot = self.bot();
        self.write(WriteKind::Job, move |conn| {
            let tx = conn.savepoint()?;
            let now = now_ms();
            tx.execute(
                "INSERT INTO chat_timezones (bot_id, chat_id, timezone, updated_at)
                 VALUES (?4, ?1, ?2, ?3)
                 ON CONFLICT (bot_id, chat_id) DO UPDATE SET timezone = ?2, updated_at = ?3",
                params![chat_id, timezone, now, bot],
            )?;
            for (id, next_run) in retimed {
                tx.execute(
                    "UPDATE jobs SET timezone = ?3, updated_at = ?4,
                         next_run = CASE WHEN state = 'active' THEN coalesce(?2, next_run) END
                     WHERE bot_id = ?6 AND id = ?1 AND chat_id = ?5
                       AND state IN ('active', 'paused')",
                    params![id, next_run, timezone, now, chat_id, bot],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Jobs stored, in every state (for the benchmark and diagnostics).
    pub async fn job_count(&self) -> Result<u64, StoreError> {
        let bot = self.bot();
        self.call(move |conn| {
            let n: i64 =
                conn.query_row("SELECT COUNT(*) FROM jobs WHERE bot_id = ?1", [bot], |r| {
                    r.get(0)
                })?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use crate::vocab::BotId;
    use crate::vocab::InboxState;

    fn job(chat_id: i64, next_run: i64) -> NewJob {
        NewJob {
            chat_id,
            chat_type: "dm".into(),
            thread_id: None,
            session_key: format!("agent:main:telegram:dm:{chat_id}"),
            creator_id: Some(42),
            creator_name: Some("Ann".into()),
            schedule: serde_json::json!({"once": next_run}),
            label: "once".into(),
            timezone: "UTC".into(),
            action: serde_json::json!({"message": "hi"}),
            next_run,
        }
    }

    fn firing(job_id: i64, expected_next: i64, run_id: i64) -> JobFiring {
        JobFiring {
            job_id,
            expected_next,
            next_run: Some(expected_next + 60_000),
            last_fired: expected_next,
            runs: vec![NewRun {
                run_id,
                payload: serde_json::json!({"run": run_id}),
                fresh_session: None,
            }],
        }
    }

    #[tokio::test]
    async fn a_creators_active_jobs_are_paused_together_and_no_one_elses() {
        let s = Store::open_in_memory().unwrap();
        let jobs = s.jobs();
        let a = jobs.create_job(job(1, 1000), 9).await.unwrap().unwrap();
        let b = jobs.create_job(job(2, 2000), 9).await.unwrap().unwrap();
        let other = jobs
            .create_job(
                NewJob {
                    creator_id: Some(7),
                    ..job(1, 3000)
                },
                9,
            )
            .await
            .unwrap()
            .unwrap();
        assert!(jobs.set_job_active(b, None).await.unwrap(), "paused before");
        assert_eq!(jobs.pause_jobs_of(42).await.unwrap(), [a]);
        assert_eq!(jobs.job(a).await.unwrap().unwrap().state, JobState::Paused);
        assert_eq!(
            jobs.job(other).await.unwrap().unwrap().state,
            JobState::Active
        );
        assert_eq!(jobs.next_job_due().await.unwrap(), Some(3000));
        assert!(jobs.pause_jobs_of(42).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn ids_are_never_reused_and_the_cap_counts_live_jobs() {
        let s = Store::open_in_memory().unwrap();
        let a = s.jobs().create_job(job(1, 1000), 2).await.unwrap().unwrap();
        let b = s.jobs().create_job(job(1, 2000), 2).await.unwrap().unwrap();
        assert_eq!(s.jobs().create_job(job(1, 3000), 2).await.unwrap(), None);
        // Another chat has its own cap.
        assert!(s
            .jobs()
            .create_job(job(2, 3000), 2)
            .await
            .unwrap()
            .is_some());
        assert!(s.jobs().delete_job(b).await.unwrap());
        let c = s.jobs().create_job(job(1, 3000), 2).await.unwrap().unwrap();
        assert!(c > b && b > a, "ids {a} {b} {c}");
        let listed: Vec<i64> = s
            .jobs()
            .chat_jobs(1)
            .await
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(listed, vec![a, c]);
    }

    #[tokio::test]
    async fn the_next_due_job_and_the_due_ones_come_from_active_jobs_only() {
        let s = Store::open_in_memory().unwrap();
        assert_eq!(s.jobs().next_job_due().await.unwrap(), None);
        let late = s
            .jobs()
            .create_job(job(1, 5000), 20)
            .await
            .unwrap()
            .unwrap();
        let early = s
            .jobs()
            .create_job(job(1, 1000), 20)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(s.jobs().next_job_due().await.unwrap(), Some(1000));
        assert!(s.jobs().set_job_active(early, None).await.unwrap());
        assert_eq!(s.jobs().next_job_due().await.unwrap(), Some(5000));
        let due: Vec<i64> = s
            .jobs()
            .due_jobs(6000, 10)
            .await
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(due, vec![late]);
        assert!(s.jobs().due_jobs(4999, 10).await.unwrap().is_empty());
        let stored = s.jobs().job(late).await.unwrap().unwrap();
        assert_eq!(stored.job.action, serde_json::json!({"message": "hi"}));
        assert_eq!(stored.state, JobState::Active);
    }

    #[tokio::test]
    async fn firing_moves_the_job_and_journals_each_run_once() {
        let s = Store::open_in_memory().unwrap();
        let id = s
            .jobs()
            .create_job(job(7, 1000), 20)
            .await
            .unwrap()
            .unwrap();
        let journaled = s.jobs().fire_job(firing(id, 1000, -5)).await.unwrap();
        assert_eq!(journaled, vec![-5]);
        let entry = s.inbox().inbox_entry(-5).await.unwrap().unwrap();
        assert_eq!(
            (entry.chat_id, entry.message_id, entry.state),
            (7, Some(-5), InboxState::Received)
        );
        let moved = s.jobs().job(id).await.unwrap().unwrap();
        assert_eq!(moved.next_run, Some(61_000));
        assert_eq!(moved.last_fired, Some(1000));
        // The same firing again (a replay with what was read before): the
        // job moved on, so nothing happens.
        assert!(s
            .jobs()
            .fire_job(firing(id, 1000, -5))
            .await
            .unwrap()
            .is_empty());
        // A firing whose run was journaled already (same id) moves the job
        // but starts nothing new.
        assert!(s
            .jobs()
            .fire_job(firing(id, 61_000, -5))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            s.jobs().job(id).await.unwrap().unwrap().next_run,
            Some(121_000)
        );
    }

    #[tokio::test]
    async fn a_one_time_job_is_done_after_firing_and_a_fresh_session_is_issued() {
        let s = Store::open_in_memory().unwrap();
        let id = s
            .jobs()
            .create_job(job(7, 1000), 20)
            .await
            .unwrap()
            .unwrap();
        let mut once = firing(id, 1000, -9);
        once.next_run = None;
        once.runs[0].fresh_session = Some("fresh-1".into());
        assert_eq!(s.jobs().fire_job(once).await.unwrap(), vec![-9]);
        let done = s.jobs().job(id).await.unwrap().unwrap();
        assert_eq!((done.state, done.next_run), (JobState::Done, None));
        assert!(s.jobs().chat_jobs(7).await.unwrap().is_empty());
        assert_eq!(
            s.sessions()
                .session_owner_key("fresh-1")
                .await
                .unwrap()
                .as_deref(),
            Some("agent:main:telegram:dm:7")
        );
        // Issued, never current.
        assert!(s
            .sessions()
            .current_session("agent:main:telegram:dm:7")
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn failures_in_a_row_pause_the_job_and_a_success_clears_them() {
        let s = Store::open_in_memory().unwrap();
        let id = s
            .jobs()
            .create_job(job(1, 1000), 20)
            .await
            .unwrap()
            .unwrap();
        let one = s
            .jobs()
            .record_job_outcome(id, true, 3)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            one,
            JobOutcome {
                failures: 1,
                paused: false
            }
        );
        s.jobs().record_job_outcome(id, false, 3).await.unwrap();
        for _ in 0..2 {
            s.jobs().record_job_outcome(id, true, 3).await.unwrap();
        }
        assert_eq!(
            s.jobs().job(id).await.unwrap().unwrap().state,
            JobState::Active
        );
        let third = s
            .jobs()
            .record_job_outcome(id, true, 3)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            third,
            JobOutcome {
                failures: 3,
                paused: true
            }
        );
        assert_eq!(
            s.jobs().job(id).await.unwrap().unwrap().state,
            JobState::Paused
        );
        assert!(s.jobs().set_job_active(id, Some(9000)).await.unwrap());
        let resumed = s.jobs().job(id).await.unwrap().unwrap();
        assert_eq!((resumed.failures, resumed.next_run), (0, Some(9000)));
        assert_eq!(
            s.jobs().record_job_outcome(999, true, 3).await.unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn a_chats_time_zone_moves_its_jobs() {
        let s = Store::open_in_memory().unwrap();
        let active = s
            .jobs()
            .create_job(job(1, 1000), 20)
            .await
            .unwrap()
            .unwrap();
        let paused = s
            .jobs()
            .create_job(job(1, 2000), 20)
            .await
            .unwrap()
            .unwrap();
        let other = s
            .jobs()
            .create_job(job(2, 3000), 20)
            .await
            .unwrap()
            .unwrap();
        s.jobs().set_job_active(paused, None).await.unwrap();
        assert_eq!(s.jobs().chat_timezone(1).await.unwrap(), None);
        s.jobs()
            .set_chat_timezone(
                1,
                "Europe/Berlin".into(),
                vec![(active, Some(500)), (paused, None), (other, Some(1))],
            )
            .await
            .unwrap();
        assert_eq!(
            s.jobs().chat_timezone(1).await.unwrap().as_deref(),
            Some("Europe/Berlin")
        );
        let a = s.jobs().job(active).await.unwrap().unwrap();
        assert_eq!(
            (a.job.timezone.as_str(), a.next_run),
            ("Europe/Berlin", Some(500))
        );
        let p = s.jobs().job(paused).await.unwrap().unwrap();
        assert_eq!(
            (p.job.timezone.as_str(), p.next_run),
            ("Europe/Berlin", None)
        );
        // Another chat's job is not this chat's to move.
        let o = s.jobs().job(other).await.unwrap().unwrap();
        assert_eq!((o.job.timezone.as_str(), o.next_run), ("UTC", Some(3000)));
    }

    #[tokio::test]
    async fn each_bot_lists_and_fires_only_its_own_jobs() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        // The same chat with each bot: each has its own cap of one.
        let ours = a.jobs().create_job(job(5, 1000), 1).await.unwrap().unwrap();
        let theirs = b.jobs().create_job(job(5, 2000), 1).await.unwrap().unwrap();
        let ids = |jobs: Vec<StoredJob>| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(ids(a.jobs().chat_jobs(5).await.unwrap()), vec![ours]);
        assert_eq!(
            ids(b.jobs().due_jobs(9000, 10).await.unwrap()),
            vec![theirs]
        );
        assert_eq!(b.jobs().next_job_due().await.unwrap(), Some(2000));
        assert_eq!(a.jobs().job(theirs).await.unwrap(), None);
        assert_eq!(a.jobs().job_count().await.unwrap(), 1);
        // Another bot's job can be neither fired, paused, failed nor deleted.
        assert!(a
            .jobs()
            .fire_job(firing(theirs, 2000, -10))
            .await
            .unwrap()
            .is_empty());
        assert!(!a.jobs().set_job_active(theirs, None).await.unwrap());
        assert_eq!(
            a.jobs().record_job_outcome(theirs, true, 1).await.unwrap(),
            None
        );
        assert!(!a.jobs().delete_job(theirs).await.unwrap());
        assert_eq!(
            b.jobs().job(theirs).await.unwrap().unwrap().state,
            JobState::Active
        );
        // A run is journaled in its own bot's inbox.
        assert_eq!(
            a.jobs()
                .fire_jobs(vec![firing(ours, 1000, -11)])
                .await
                .unwrap(),
            vec![vec![-11]]
        );
        assert!(a.inbox().inbox_entry(-11).await.unwrap().is_some());
        assert!(b.inbox().inbox_entry(-11).await.unwrap().is_none());
        assert!(b.inbox().open_inbox().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn each_bot_keeps_its_own_time_zone_for_the_same_chat() {
        let s = Store::open_in_memory().unwrap();
        let (a, b) = (s.for_bot(BotId(1)), s.for_bot(BotId(2)));
        let theirs = b.jobs().create_job(job(5, 2000), 5).await.unwrap().unwrap();
        a.jobs()
            .set_chat_timezone(5, "Europe/Berlin".into(), vec![(theirs, Some(7000))])
            .await
            .unwrap();
        b.jobs()
            .set_chat_timezone(5, "Asia/Tokyo".into(), Vec::new())
            .await
            .unwrap();
        let zone = |s: &Store| {
            let jobs = s.jobs();
            async move { jobs.chat_timezone(5).await.unwrap() }
        };
        assert_eq!(zone(&a).await.as_deref(), Some("Europe/Berlin"));
        assert_eq!(zone(&b).await.as_deref(), Some("Asia/Tokyo"));
        let job = b.jobs().job(theirs).await.unwrap().unwrap();
        assert_eq!(
            (job.job.timezone.as_str(), job.next_run),
            ("UTC", Some(2000))
        );
    }
}
