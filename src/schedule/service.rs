//! [`Jobs`]: making, listing and changing a chat's jobs, with the caps and
//! the authority rule; shared by the commands, the model's `schedule`
//! tool, a program's request files and the scheduler.
//!
//! * A chat holds at most `max_jobs_per_chat` jobs (checked in the insert's
//!   transaction) and no recurring job may run more often than
//!   `min_interval`; both refusals say so in the user's words.
//! * Only a job's creator or an approver ([`may_decide`]) may pause,
//!   resume or delete it, and only from the job's chat.
//! * Every change wakes the scheduler, which sleeps until the earliest
//!   next run ([`super::scheduler`]).
//! * A job that runs prompts spends its creator's budget, so it is not
//!   made while they are over it ([`SpendGate`], asked before anything is
//!   stored, whichever surface asks).
//!
//! This module must never run a job itself or send anything: it returns
//! texts for the caller to deliver.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;

use jiff::tz::TimeZone;
use jiff::Timestamp;
use tokio::sync::Notify;

use super::clock::Clock;
use super::config::ScheduleConfig;
use super::health::SchedulerHealth;
use super::spec::Schedule;
use super::text::{confirmation, list_text, JobView};
use super::when::duration_words;
use super::when::{Action, JobRequest};
use crate::metrics::Metrics;
use crate::store::Jobs as JobTable;
use crate::store::{JobState, NewJob, StoreError, StoredJob};
use crate::tools::authority::{may_decide, Deciders};
use crate::vocab::{SessionKey, SessionSource};

/// What a user does to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// `/pause ID`
    Pause,
    /// `/resume ID`
    Resume,
    /// `/unschedule ID`
    Delete,
}

/// What the chat is told when the store cannot be read or written.
pub const JOBS_STORE_DOWN: &str =
    "⚠️ The job store is failing right now (the operator sees this in the logs and on /healthz); nothing was changed.";

/// Whether a user may set up spending now: a prompt job's runs are its
/// creator's turns (a port the runner implements with the budgets).
pub trait SpendGate: Send + Sync {
    /// The refusal, in the user's words, if `owner` is over a limit now.
    fn refusal<'a>(&'a self, owner: &'a SessionSource) -> BoxFuture<'a, Option<String>>;
}

/// The jobs service (cheap to clone; clones share everything).
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<JobsInner>,
}

pub(super) struct JobsInner {
    pub(super) store: JobTable,
    pub(super) config: ScheduleConfig,
    min_interval: Duration,
    default_zone: (String, TimeZone),
    pub(super) clock: Arc<dyn Clock>,
    pub(super) changed: Notify,
    pub(super) metrics: Metrics,
    pub(super) health: SchedulerHealth,
    deciders: Arc<dyn Deciders + Send + Sync>,
    requests_root: Option<PathBuf>,
    spend_gate: OnceLock<Arc<dyn SpendGate>>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs").finish_non_exhaustive()
    }
}

/// A job's schedule, action and zone, read back from its row.
pub(super) struct Decoded {
    pub(super) schedule: Schedule,
    pub(super) action: Action,
    pub(super) tz: TimeZone,
}

/// Read a stored job's schedule, action and zone (`None`: written by a
/// newer telegate, or damaged).
pub(super) fn decode(job: &StoredJob) -> Option<Decoded> {
    Some(Decoded {
        schedule: serde_json::from_value(job.job.schedule.clone()).ok()?,
        action: serde_json::from_value(job.job.action.clone()).ok()?,
        tz: TimeZone::get(&job.job.timezone).ok()?,
    })
}

impl Jobs {
    /// The jobs kept in `store`, timed by `clock`, counted in `metrics`.
    /// Fails only for a configuration [`ScheduleConfig::validate`] refuses.
    pub fn new(
        store: JobTable,
        config: ScheduleConfig,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
    ) -> Result<Jobs, String> {
        config.validate()?;
        let min_interval = config.min_interval_duration()?;
        let default_zone = config.default_zone();
        Ok(Jobs {
            inner: Arc::new(JobsInner {
                store,
                config,
                min_interval,
                default_zone,
                clock,
                changed: Notify::new(),
                metrics,
                health: SchedulerHealth::default(),
                deciders: Arc::new(Vec::<u64>::new()),
                requests_root: None,
                spend_gate: OnceLock::new(),
            }),
        })
    }

    /// Let `deciders` change anyone's jobs: `[telegram] approvers`, or
    /// with a team the owner and admins (the approvers among them).
    pub fn with_deciders(mut self, deciders: Arc<dyn Deciders + Send + Sync>) -> Jobs {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.deciders = deciders;
        }
        self
    }

    /// Whether `chat_id` has a job `id` that is not done (so `/resume ID`
    /// names the job, not a conversation).
    pub async fn has_job(&self, chat_id: i64, id: i64) -> bool {
        matches!(
            self.inner.store.job(id).await,
            Ok(Some(job)) if job.job.chat_id == chat_id && job.state != JobState::Done
        )
    }

    /// Give the command backend's programs a request directory per turn
    /// under `root` (`TELEGATE_SCHEDULE`, see [`super::requests`]).
    pub fn with_requests_dir(mut self, root: PathBuf) -> Jobs {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.requests_root = Some(root);
        }
        self
    }

    /// Ask `gate` before a job that runs prompts is made (the first gate
    /// set stays).
    pub fn set_spend_gate(&self, gate: Arc<dyn SpendGate>) {
        if self.inner.spend_gate.set(gate).is_err() {
            tracing::debug!("the jobs' spend gate was already set");
        }
    }

    pub(super) fn inner(&self) -> &JobsInner {
        &self.inner
    }

    /// Where per-turn request directories live, if anywhere.
    pub(super) fn requests_root(&self) -> Option<&PathBuf> {
        self.inner.requests_root.as_ref()
    }

    /// The store the jobs are kept in.
    pub fn store(&self) -> &JobTable {
        &self.inner.store
    }

    /// The wall time now, as the scheduler sees it.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// How far behind the scheduler is (for `/healthz` and `/metrics`).
    pub fn health(&self) -> SchedulerHealth {
        self.inner.health.clone()
    }

    /// Wake the scheduler: the jobs changed.
    pub fn changed(&self) {
        self.inner.changed.notify_one();
    }

    /// The time zone of `chat_id`: its `/timezone`, else the default.
    pub async fn zone_of(&self, chat_id: i64) -> (String, TimeZone) {
        match self.inner.store.chat_timezone(chat_id).await {
            Ok(Some(name)) => match TimeZone::get(&name) {
                Ok(tz) => (name, tz),
                Err(_) => self.inner.default_zone.clone(),
            },
            Ok(None) => self.inner.default_zone.clone(),
            Err(error) => {
                tracing::warn!(chat_id, %error, "could not read a chat's time zone; using the default");
                self.inner.default_zone.clone()
            }
        }
    }

    /// Make a job for `owner` in slot `key`. The refusal (caps, a schedule
    /// that never runs, a failing store) is a text for the user.
    pub async fn create(
        &self,
        owner: &SessionSource,
        key: &SessionKey,
        request: JobRequest,
    ) -> Result<JobView, String> {
        if let (Action::Prompt { .. }, Some(gate)) = (&request.action, self.inner.spend_gate.get())
        {
            if let Some(refusal) = gate.refusal(owner).await {
                tracing::info!(chat_id = owner.chat_id, user = ?owner.user_id, "prompt job refused: its creator is over budget");
                return Err(refusal);
            }
        }
        let (zone, tz) = self.zone_of(owner.chat_id).await;
        let now = self.now();
        let Some(next) = request.schedule.next_after(now, &tz) else {
            return Err(
                "That schedule never runs (its time has passed, or no date matches).".into(),
            );
        };
        if let Some(gap) = request.schedule.shortest_gap(now, &tz) {
            let gap = Duration::try_from(gap).unwrap_or(Duration::ZERO);
            if gap < self.inner.min_interval {
                return Err(format!(
                    "Jobs here may run at most every {} ([schedule] min_interval); this one would run every {}.",
                    duration_words(self.inner.min_interval.as_secs() as i64),
                    duration_words(gap.as_secs() as i64),
                ));
            }
        }
        let (schedule, action) = match (
            serde_json::to_value(&request.schedule),
            serde_json::to_value(&request.action),
        ) {
            (Ok(schedule), Ok(action)) => (schedule, action),
            _ => return Err("That job could not be saved.".into()),
        };
        let job = NewJob {
            chat_id: owner.chat_id,
            chat_type: owner.chat_type.as_str().to_string(),
            thread_id: owner.thread_id,
            session_key: key.as_str().to_string(),
            creator_id: owner.user_id,
            creator_name: owner.user_name.clone(),
            schedule,
            label: request.label.clone(),
            timezone: zone.clone(),
            action,
            next_run: next.as_millisecond(),
        };
        let max = self.inner.config.max_jobs_per_chat;
        match self.inner.store.create_job(job, max).await {
            Ok(Some(id)) => {
                tracing::info!(job = id, chat_id = owner.chat_id, "job created");
                self.changed();
                Ok(JobView {
                    id,
                    label: request.label,
                    recurring: request.schedule.is_recurring(),
                    action: request.action,
                    zone,
                    next: Some(next),
                    paused: false,
                    creator: creator_name(owner.user_name.as_deref(), owner.user_id),
                    failures: 0,
                    thread_id: owner.thread_id,
                })
            }
            Ok(None) => Err(format!(
                "This chat already has {max} jobs, the most it may hold ([schedule] max_jobs_per_chat). \
                 Remove one with /unschedule ID first (/jobs lists them)."
            )),
            Err(error) => {
                tracing::error!(%error, "could not store a job");
                Err(JOBS_STORE_DOWN.to_string())
            }
        }
    }

    /// The confirmation line of a new job, in its chat's zone.
    pub async fn confirmation(&self, view: &JobView) -> String {
        let tz = TimeZone::get(&view.zone).unwrap_or(TimeZone::UTC);
        confirmation(view, self.now(), &tz)
    }

    /// The jobs of `chat_id`, as the chat sees them.
    pub async fn list(&self, chat_id: i64) -> Result<Vec<JobView>, StoreError> {
        let jobs = self.inner.store.chat_jobs(chat_id).await?;
        Ok(jobs.iter().filter_map(view_of).collect())
    }

    /// The `/jobs` text for `chat_id`.
    pub async fn list_text(&self, chat_id: i64) -> Result<(String, Vec<JobView>), StoreError> {
        let views = self.list(chat_id).await?;
        let (_, tz) = self.zone_of(chat_id).await;
        Ok((list_text(&views, self.now(), &tz), views))
    }

    /// The earliest next run of `chat_id`'s jobs, for `/status`.
    pub async fn next_line(&self, chat_id: i64) -> Option<String> {
        let views = self.list(chat_id).await.ok()?;
        let next = views
            .iter()
            .filter(|v| v.next.is_some())
            .min_by_key(|v| v.next)?;
        let tz = TimeZone::get(&next.zone).unwrap_or(TimeZone::UTC);
        let when = super::text::when_words(next.next?, self.now(), &tz);
        Some(format!(
            "Next job: #{} {when} {} — {}",
            next.id,
            next.zone,
            next.action.summary(40)
        ))
    }

    /// Whether `actor` may change job `id` of their chat (its creator or an
    /// approver); the refusal is the chat's text.
    pub async fn may_change(&self, actor: &SessionSource, id: i64) -> Result<(), String> {
        self.job_for(actor, id).await.map(|_| ())
    }

    /// Job `id` of `actor`'s chat, if `actor` may change it.
    async fn job_for(&self, actor: &SessionSource, id: i64) -> Result<StoredJob, String> {
        let stored = match self.inner.store.job(id).await {
            Ok(Some(job)) if job.job.chat_id == actor.chat_id && job.state != JobState::Done => job,
            Ok(_) => {
                return Err(format!(
                    "There is no job {id} in this chat. /jobs lists them."
                ))
            }
            Err(error) => {
                tracing::error!(%error, "could not read a job");
                return Err(JOBS_STORE_DOWN.to_string());
            }
        };
        if !may_decide(
            stored.job.creator_id,
            actor.user_id,
            actor.chat_id,
            &*self.inner.deciders,
        ) {
            tracing::info!(job = id, actor = ?actor.user_id, "job change refused: not its creator nor an approver");
            return Err(format!(
                "🔒 Only {} (who made job {id}), an admin or one of this bot's approvers can change it.",
                creator_name(stored.job.creator_name.as_deref(), stored.job.creator_id)
            ));
        }
        Ok(stored)
    }

    /// Pause, resume or delete job `id` on behalf of `actor` (in their
    /// chat). Returns the chat's answer, and the job as it is now (none
    /// once deleted).
    pub async fn change(
        &self,
        actor: &SessionSource,
        id: i64,
        change: Change,
    ) -> Result<(String, Option<JobView>), String> {
        let stored = self.job_for(actor, id).await?;
        let decoded = decode(&stored)
            .ok_or_else(|| format!("Job {id} cannot be read by this version of telegate."))?;
        let store = &self.inner.store;
        let written = match change {
            Change::Delete => store.delete_job(id).await.map(|_| None),
            Change::Pause if stored.state == JobState::Paused => {
                return Err(format!(
                    "Job {id} is already paused; /resume {id} starts it again."
                ))
            }
            Change::Pause => store.set_job_active(id, None).await.map(|_| None),
            Change::Resume if stored.state == JobState::Active => {
                return Err(format!("Job {id} is not paused."))
            }
            Change::Resume => {
                let from = stored
                    .last_fired
                    .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                    .map_or(self.now(), |last| last.max(self.now()));
                let Some(next) = decoded.schedule.next_after(from, &decoded.tz) else {
                    return Err(format!(
                        "Job {id}'s time has passed; make a new one (and /unschedule {id})."
                    ));
                };
                store
                    .set_job_active(id, Some(next.as_millisecond()))
                    .await
                    .map(|_| Some(next))
            }
        };
        let next = match written {
            Ok(next) => next,
            Err(error) => {
                tracing::error!(job = id, %error, "could not change a job");
                return Err(JOBS_STORE_DOWN.to_string());
            }
        };
        self.changed();
        tracing::info!(job = id, ?change, "job changed");
        let mut view = view_of(&stored);
        let text = match change {
            Change::Delete => {
                view = None;
                format!("🗑 Job {id} deleted.")
            }
            Change::Pause => {
                if let Some(v) = &mut view {
                    v.paused = true;
                    v.next = None;
                }
                format!("⏸ Job {id} paused; /resume {id} starts it again.")
            }
            Change::Resume => {
                if let Some(v) = &mut view {
                    v.paused = false;
                    v.failures = 0;
                    v.next = next;
                }
                let when = next
                    .map(|at| super::text::when_words(at, self.now(), &decoded.tz))
                    .unwrap_or_default();
                format!(
                    "▶️ Job {id} resumed; next run {when} {}.",
                    stored.job.timezone
                )
            }
        };
        Ok((text, view))
    }

    /// Pause every active job `user` made, in any chat (their access was
    /// taken away: nothing runs as them any more). Returns the ids paused;
    /// a store failure pauses nothing (logged: their runs are still
    /// refused when they start, by the runner's access check).
    pub async fn pause_jobs_of(&self, user: u64) -> Vec<i64> {
        match self.inner.store.pause_jobs_of(user).await {
            Ok(ids) => {
                if !ids.is_empty() {
                    tracing::info!(user, jobs = ?ids, "a revoked user's jobs were paused");
                    self.changed();
                }
                ids
            }
            Err(error) => {
                tracing::error!(user, %error, "could not pause a revoked user's jobs");
                Vec::new()
            }
        }
    }

    /// Record how a run of job `id` ended (`failed`: its turn failed).
    /// Returns what its chat is told when this failure paused the job.
    pub async fn finished(&self, id: i64, failed: bool) -> Option<String> {
        let metrics = &self.inner.metrics;
        if failed {
            metrics.schedule_runs.failed.inc();
        } else {
            metrics.schedule_runs.answered.inc();
        }
        let max = self.inner.config.max_failures;
        match self.inner.store.record_job_outcome(id, failed, max).await {
            Ok(Some(outcome)) if outcome.paused => {
                tracing::warn!(
                    job = id,
                    failures = outcome.failures,
                    "job paused after failing runs"
                );
                Some(format!(
                    "⏸ Job {id} failed {} times in a row, so it is paused. Fix what it needs, then send /resume {id}.",
                    outcome.failures
                ))
            }
            Ok(_) => None,
            Err(error) => {
                tracing::error!(job = id, %error, "could not record a run's outcome");
                None
            }
        }
    }

    /// Job `id` as a run finds it: its action, unless it was deleted or
    /// paused since the run was journaled (then the run does nothing).
    pub async fn action_for_run(&self, id: i64) -> Option<(StoredJob, Action)> {
        let job = match self.inner.store.job(id).await {
            Ok(Some(job)) => job,
            Ok(None) => {
                tracing::info!(job = id, "a run of a deleted job does nothing");
                return None;
            }
            Err(error) => {
                tracing::error!(job = id, %error, "could not read the job of a run");
                return None;
            }
        };
        if job.state == JobState::Paused {
            tracing::info!(job = id, "a run of a paused job does nothing");
            return None;
        }
        let action = decode(&job)?.action;
        Some((job, action))
    }

    /// `/timezone NAME` from `actor`: the chat's zone, and its recurring
    /// jobs moved into it. In a chat where others have recurring jobs, only
    /// an approver (or whoever made them all) may.
    pub async fn set_timezone(&self, actor: &SessionSource, name: &str) -> Result<String, String> {
        let tz = TimeZone::get(name).map_err(|_| {
            format!("I do not know the time zone {name:?}; use an IANA name like Europe/Berlin, America/New_York or UTC.")
        })?;
        let name = tz.iana_name().unwrap_or(name).to_string();
        let jobs = self
            .inner
            .store
            .chat_jobs(actor.chat_id)
            .await
            .map_err(|error| {
                tracing::error!(%error, "could not read a chat's jobs");
                JOBS_STORE_DOWN.to_string()
            })?;
        let now = self.now();
        let mut retimed = Vec::new();
        for job in &jobs {
            let Some(decoded) = decode(job) else { continue };
            if !decoded.schedule.is_recurring() {
                continue;
            }
            if !may_decide(
                job.job.creator_id,
                actor.user_id,
                actor.chat_id,
                &*self.inner.deciders,
            ) {
                return Err(format!(
                    "🔒 Job {} here belongs to {}; only an approver may move this chat's jobs to another time zone.",
                    job.id,
                    creator_name(job.job.creator_name.as_deref(), job.job.creator_id)
                ));
            }
            let from = job
                .last_fired
                .and_then(|ms| Timestamp::from_millisecond(ms).ok())
                .map_or(now, |last| last.max(now));
            let next = match job.state {
                JobState::Active => decoded
                    .schedule
                    .next_after(from, &tz)
                    .map(|t| t.as_millisecond()),
                _ => None,
            };
            retimed.push((job.id, next));
        }
        let moved = retimed.len();
        self.inner
            .store
            .set_chat_timezone(actor.chat_id, name.clone(), retimed)
            .await
            .map_err(|error| {
                tracing::error!(%error, "could not store a chat's time zone");
                JOBS_STORE_DOWN.to_string()
            })?;
        self.changed();
        let local = super::text::when_words(now, now, &tz);
        Ok(match moved {
            0 => format!("🕰 Time zone: {name} (it is {local} there)."),
            1 => format!(
                "🕰 Time zone: {name} (it is {local} there); 1 recurring job follows it now."
            ),
            n => format!(
                "🕰 Time zone: {name} (it is {local} there); {n} recurring jobs follow it now."
            ),
        })
    }

    /// `/timezone` without a name.
    pub async fn timezone_text(&self, chat_id: i64) -> String {
        let (name, tz) = self.zone_of(chat_id).await;
        let now = self.now();
        format!(
            "🕰 Time zone: {name} (it is {} there). Change it with /timezone NAME, e.g. /timezone Europe/Berlin.",
            super::text::when_words(now, now, &tz)
        )
    }
}

/// A stored job as the chat sees it (`None`: unreadable).
fn view_of(job: &StoredJob) -> Option<JobView> {
    let decoded = decode(job)?;
    Some(JobView {
        id: job.id,
        label: job.job.label.clone(),
        recurring: decoded.schedule.is_recurring(),
        action: decoded.action,
        zone: job.job.timezone.clone(),
        next: job
            .next_run
            .and_then(|ms| Timestamp::from_millisecond(ms).ok()),
        paused: job.state == JobState::Paused,
        creator: creator_name(job.job.creator_name.as_deref(), job.job.creator_id),
        failures: job.failures,
        thread_id: job.job.thread_id,
    })
}

/// A creator as the chat names them.
fn creator_name(name: Option<&str>, id: Option<u64>) -> String {
    match (name, id) {
        (Some(name), _) if !name.trim().is_empty() => name.to_string(),
        (_, Some(id)) => format!("user {id}"),
        _ => "someone".to_string(),
    }
}
