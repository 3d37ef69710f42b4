//! The runner's side of scheduled jobs: the job commands (`/jobs`, `/at`,
//! `/in`, `/every`, `/cron`, `/pause`, `/resume`, `/unschedule`,
//! `/timezone`) and a scheduled run reaching the slot.
//!
//! The commands never touch the running turn, so they are answered
//! mid-turn like /status; they know who sends them (the authority rule of
//! [`crate::schedule::Jobs`]). A scheduled run arrives as an internal event
//! (its message id is a run id, [`crate::schedule::run_of`]): a reminder
//! is answered at once with its text, a prompt runs as a turn (the
//! event's session override is its fresh session, if the job asks for
//! one); how it ended is recorded on the job (failures in a row pause it,
//! and the chat is told). A run of a job deleted or paused since it was
//! journaled does nothing.

use crate::adapter::DispatchContext;
use crate::reply::{Outgoing, Reply};
use crate::runner::Runner;
use crate::vocab::{Button, KnownCommand, MessageEvent, SessionKey};
use tracing::Instrument;

use crate::reply::ReplyKind;
use crate::schedule::run::LATE_AFTER;
use crate::schedule::{parse_job, Action, Change, Form, Jobs};
use crate::vocab::SessionSource;

/// Said when a job command is used where nothing schedules.
pub(super) const NO_JOBS_TEXT: &str =
    "Scheduling is not available here ([schedule] enabled = false, or this transport runs no scheduler).";

impl Runner {
    /// Whether `/resume ARGS` names a job of this chat: a number that is
    /// the id of one of its jobs (ids are numbers; a conversation's id is
    /// hex and may be typed in more characters). Anything else names a
    /// conversation.
    pub(super) async fn resumes_job(&self, args: &str, event: &MessageEvent) -> bool {
        let Some(jobs) = &self.inner.config.jobs else {
            return false;
        };
        match args.trim().parse::<i64>() {
            Ok(id) => jobs.has_job(event.source.chat_id, id).await,
            Err(_) => false,
        }
    }

    /// The scheduled jobs, if the schedule is on.
    pub fn jobs(&self) -> Option<&Jobs> {
        self.inner.config.jobs.as_ref()
    }

    /// Whether `actor` may change job `id` (a job button's press is checked
    /// with this before its row is used up).
    pub async fn may_change_job(&self, actor: &SessionSource, id: i64) -> Result<(), String> {
        match self.jobs() {
            Some(jobs) => jobs.may_change(actor, id).await,
            None => Err(NO_JOBS_TEXT.to_string()),
        }
    }

    /// A job command from `source` in slot `key`.
    pub(super) async fn job_command(
        &self,
        command: KnownCommand,
        args: &str,
        source: &SessionSource,
        key: &SessionKey,
    ) -> Reply {
        let Some(jobs) = self.jobs() else {
            return Reply::command(NO_JOBS_TEXT);
        };
        let form = match command {
            KnownCommand::At => Some(Form::At),
            KnownCommand::In => Some(Form::In),
            KnownCommand::Every => Some(Form::Every),
            KnownCommand::Cron => Some(Form::Cron),
            _ => None,
        };
        if let Some(form) = form {
            let (_, tz) = jobs.zone_of(source.chat_id).await;
            let request = match parse_job(form, args, jobs.now(), &tz) {
                Ok(request) => request,
                Err(refusal) => return Reply::command(refusal),
            };
            return match jobs.create(source, key, request).await {
                Ok(view) => Reply::command(jobs.confirmation(&view).await)
                    .with_buttons(Button::job_pair(view.id, false)),
                Err(refusal) => Reply::command(refusal),
            };
        }
        let change = match command {
            KnownCommand::Pause => Change::Pause,
            KnownCommand::Resume => Change::Resume,
            KnownCommand::Unschedule => Change::Delete,
            KnownCommand::Timezone => {
                let name = args.trim();
                return Reply::command(if name.is_empty() {
                    jobs.timezone_text(source.chat_id).await
                } else {
                    match jobs.set_timezone(source, name).await {
                        Ok(text) | Err(text) => text,
                    }
                });
            }
            _ => return self.jobs_list(jobs, source).await,
        };
        let Some(id) = args
            .split_whitespace()
            .next()
            .map(|w| w.trim_start_matches('#'))
            .and_then(|w| w.parse::<i64>().ok())
        else {
            return Reply::command(
                "Which job? Send it with its id, e.g. /pause 3; /jobs lists them.",
            );
        };
        match jobs.change(source, id, change).await {
            Ok((text, Some(view))) => {
                Reply::command(text).with_buttons(Button::job_pair(view.id, view.paused))
            }
            Ok((text, None)) => Reply::command(text),
            Err(refusal) => Reply::command(refusal),
        }
    }

    /// `/jobs`: the chat's jobs, each with its buttons.
    async fn jobs_list(&self, jobs: &Jobs, source: &SessionSource) -> Reply {
        match jobs.list_text(source.chat_id).await {
            Ok((text, views)) => {
                let buttons = views
                    .iter()
                    .flat_map(|v| Button::job_pair(v.id, v.paused))
                    .collect();
                Reply::command(text).with_buttons(buttons)
            }
            Err(error) => {
                tracing::error!(%error, "could not list a chat's jobs");
                Reply::command(crate::schedule::service::JOBS_STORE_DOWN)
            }
        }
    }

    /// A run of job `job` reaching its slot (see the module docs).
    pub(super) async fn scheduled_run(
        self,
        event: MessageEvent,
        ctx: DispatchContext,
        job: i64,
    ) -> Option<Outgoing> {
        let Some(jobs) = self.jobs().cloned() else {
            tracing::warn!(
                job,
                "a scheduled run arrived but scheduling is off; it does nothing"
            );
            return None;
        };
        let (_, action) = jobs.action_for_run(job).await?;
        // Its creator's access as it is now (a reminder runs no turn).
        if let Err(refusal) = self.still_allowed(&event) {
            return Some(refusal);
        }
        let late = event
            .message_id
            .and_then(crate::schedule::run_of)
            .is_some_and(|(_, due)| jobs.now().duration_since(due) > LATE_AFTER);
        match action {
            Action::Message { .. } => {
                // A reminder is the user's own words, sent as written.
                let mut reply = Reply::answer(event.text.clone())
                    .as_written()
                    .in_reply_to(event.message_id);
                if let Some(notice) = jobs.finished(job, false).await {
                    reply.text.push_str(&format!("\n\n{notice}"));
                }
                Some(reply.into())
            }
            Action::Prompt { .. } => {
                let header = format!(
                    "⏰ Job {job}{} — {}",
                    if late { " (late)" } else { "" },
                    action.summary(60)
                );
                let span = tracing::info_span!(
                    "turn",
                    session_key = %ctx.key,
                    session_id = tracing::field::Empty,
                    generation = tracing::field::Empty,
                    job,
                );
                // Stopped, interrupted or stale: no answer, no outcome.
                let mut out = self.turn(event, ctx).instrument(span).await?;
                let failed = out.reply.kind == ReplyKind::Error;
                if let Some(notice) = jobs.finished(job, failed).await {
                    out.reply.text.push_str(&format!("\n\n{notice}"));
                }
                out.reply.text = format!("{header}\n\n{}", out.reply.text);
                Some(out)
            }
        }
    }
}
