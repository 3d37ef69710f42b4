//! The scheduler: one task that sleeps until the earliest next run, fires
//! what is due, and hands each run on as an internal event.
//!
//! It keeps nothing per job in memory. Each round asks the store for the
//! earliest `next_run` (one lookup in the `jobs_due` index, however many
//! jobs exist), sleeps until then on tokio's timer (through the
//! [`Clock`](super::clock::Clock), at most a minute at a time on the
//! system clock) or until the jobs change ([`super::Jobs::changed`]), and
//! when woken fires every due job:
//!
//! 1. the catch-up plan ([`super::run::plan_firing`]) picks the runs;
//! 2. one store transaction moves each job on and journals its runs in the
//!    inbox under ids derived from (job, instant) ([`crate::store::JobTable::fire_jobs`]);
//! 3. only then is each run handed to the [`RunSink`] (the adapter): an
//!    internal event, queued behind a running turn like a wakeup, never
//!    interrupting it. A crash between 2 and 3 leaves the run in the inbox
//!    for restart recovery; a crash before 2 fires the same instant again
//!    under the same id.
//!
//! The scheduler produces internal events and nothing else: it never
//! calls the transport, never runs a turn and never sends anything.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::run::{plan_firing, run_id, FirePlan, Planned};
use super::service::{decode, Decoded, Jobs};
use super::text::late_words;
use super::when::Action;
use crate::journal::{chat_type_named, internal_payload};
use crate::store::{JobFiring, NewRun, StoreError, StoredJob};
use crate::vocab::SessionId;
use crate::vocab::{MessageEvent, Platform, SessionSource};

/// Where the scheduler hands its runs (the adapter's `handle_message`).
pub type RunSink = Arc<dyn Fn(MessageEvent) -> BoxFuture<'static, ()> + Send + Sync>;

/// At most this many due jobs are fired per store transaction.
const FIRE_BATCH: usize = 256;

/// The pause after the store failed, before the scheduler tries again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(2);

/// Start the scheduler; it ends when `stop` fires.
pub fn spawn(jobs: Jobs, sink: RunSink, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move { run(jobs, sink, stop).await })
}

async fn run(jobs: Jobs, sink: RunSink, stop: CancellationToken) {
    let inner = jobs.inner();
    // An instant before this was missed (telegate was not scheduling).
    let since = inner.clock.now();
    loop {
        if stop.is_cancelled() {
            return;
        }
        let next = match inner.store.next_job_due().await {
            Ok(next) => next,
            Err(error) => {
                tracing::warn!(%error, "the scheduler could not read the next due job; retrying");
                if pause(&stop, RETRY_AFTER_FAILURE).await {
                    return;
                }
                continue;
            }
        };
        inner.health.set_next_due(next);
        let Some(next) = next.and_then(|ms| Timestamp::from_millisecond(ms).ok()) else {
            tokio::select! {
                () = stop.cancelled() => return,
                () = inner.changed.notified() => continue,
            }
        };
        let now = inner.clock.now();
        if next > now {
            let deadline = inner.clock.deadline(next);
            tokio::select! {
                () = stop.cancelled() => return,
                () = inner.changed.notified() => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
            continue;
        }
        if let Err(error) = fire_due(&jobs, &sink, now, since).await {
            tracing::warn!(%error, "the scheduler could not fire the due jobs; retrying");
            if pause(&stop, RETRY_AFTER_FAILURE).await {
                return;
            }
        }
    }
}

/// Sleep `wait` unless stopped first (then true).
async fn pause(stop: &CancellationToken, wait: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// Fire every job due at `now` (in batches), then hand the runs on; the
/// scheduler started at `since`.
pub(super) async fn fire_due(
    jobs: &Jobs,
    sink: &RunSink,
    now: Timestamp,
    since: Timestamp,
) -> Result<(), StoreError> {
    let inner = jobs.inner();
    loop {
        let due = inner
            .store
            .due_jobs(now.as_millisecond(), FIRE_BATCH)
            .await?;
        let full = due.len() == FIRE_BATCH;
        let mut firings = Vec::with_capacity(due.len());
        let mut events = Vec::with_capacity(due.len());
        for job in &due {
            match prepare(jobs, job, now, since) {
                Some((firing, prepared)) => {
                    firings.push(firing);
                    events.push(prepared);
                }
                None => {
                    // Unreadable (a newer telegate wrote it): paused, so it
                    // is not found due again and again.
                    tracing::error!(job = job.id, "a job cannot be read; it is paused");
                    inner.store.set_job_active(job.id, None).await?;
                }
            }
        }
        let journaled = inner.store.fire_jobs(firings).await?;
        for (prepared, journaled) in events.into_iter().zip(journaled) {
            for (due, event) in prepared {
                let Some(id) = event.message_id else { continue };
                if !journaled.contains(&id) {
                    continue;
                }
                let lag = inner.clock.now().duration_since(due);
                let lag_ms = u64::try_from(lag.as_millis()).unwrap_or(0);
                inner.metrics.schedule_lag_ms.set(lag_ms);
                tracing::info!(run = id, lag_ms, "a scheduled run starts");
                (sink)(event).await;
            }
        }
        if !full {
            return Ok(());
        }
    }
}

/// The runs of one due job: what to write, and the events to hand on
/// after the write (with their instants).
type Prepared = Vec<(Timestamp, MessageEvent)>;

fn prepare(
    jobs: &Jobs,
    job: &StoredJob,
    now: Timestamp,
    since: Timestamp,
) -> Option<(JobFiring, Prepared)> {
    let inner = jobs.inner();
    let decoded = decode(job)?;
    let expected = job.next_run?;
    let first = Timestamp::from_millisecond(expected).ok()?;
    let plan = plan_firing(
        &decoded.schedule,
        &decoded.tz,
        first,
        now,
        since,
        inner.config.catch_up,
    );
    if plan.skipped > 0 {
        inner.metrics.schedule_runs.skipped_late.add(plan.skipped);
        tracing::info!(
            job = job.id,
            skipped = plan.skipped,
            "missed runs left out (catch_up)"
        );
    }
    let mut runs = Vec::with_capacity(plan.runs.len());
    let mut prepared = Vec::with_capacity(plan.runs.len());
    for planned in &plan.runs {
        let Some(id) = run_id(job.id, planned.due) else {
            tracing::error!(
                job = job.id,
                "a run id cannot be made for this job; run left out"
            );
            continue;
        };
        let mut event = run_event(job, &decoded, planned, &plan, now);
        event.message_id = Some(id);
        runs.push(NewRun {
            run_id: id,
            payload: internal_payload(&event),
            fresh_session: event.session_override.as_ref().map(|s| s.to_string()),
        });
        prepared.push((planned.due, event));
    }
    let firing = JobFiring {
        job_id: job.id,
        expected_next: expected,
        next_run: plan.next_run.map(Timestamp::as_millisecond),
        last_fired: plan.last.as_millisecond(),
        runs,
    };
    Some((firing, prepared))
}

/// The internal event of one run: the job's chat and creator, the text the
/// turn runs (or the reminder), a fresh session when the job asks for one.
fn run_event(
    job: &StoredJob,
    decoded: &Decoded,
    planned: &Planned,
    plan: &FirePlan,
    now: Timestamp,
) -> MessageEvent {
    let j = &job.job;
    let source = SessionSource {
        platform: Platform::Telegram,
        chat_id: j.chat_id,
        chat_type: chat_type_named(&j.chat_type),
        thread_id: j.thread_id,
        user_id: j.creator_id,
        user_name: j.creator_name.clone(),
    };
    let late = planned
        .late
        .then(|| late_words(planned.due, now, &decoded.tz, plan.skipped, plan.more));
    let due = super::text::when_words(planned.due, now, &decoded.tz);
    match &decoded.action {
        Action::Message { text } => {
            let mut body = match (&j.creator_name, source.chat_type.is_group()) {
                (Some(name), true) => format!("⏰ {name}: {text}"),
                _ => format!("⏰ {text}"),
            };
            if let Some(late) = late {
                body.push_str(&format!("\n({late})"));
            }
            MessageEvent::internal(source, body)
        }
        Action::Prompt { text, fresh } => {
            let mut body = format!(
                "[telegate] Scheduled job {} ({}, {}), due {due}",
                job.id, j.label, j.timezone
            );
            if let Some(late) = late {
                body.push_str(&format!(" ({late})"));
            }
            body.push_str(
                ". This is an automatic run the user set up, not a new message from them; \
                 do what it asks and answer them:\n\n",
            );
            body.push_str(text);
            let event = MessageEvent::internal(source, body);
            if *fresh {
                event.with_session_override(SessionId::generate())
            } else {
                event
            }
        }
    }
}
