//! A turn's budget: checked and booked before it runs (`budget_for`, for
//! every turn of a user: their messages, their jobs' runs, their
//! background tasks' results), and charged once it ran ([`Charge`]: what
//! its meter saw, or an estimate where the backend reported nothing),
//! the booking ended only after the usage row was handed to the store.
//! Also whether a user may make a prompt job now (`over_budget`, the
//! runner's [`crate::schedule::SpendGate`]).
//!
//! This module decides nothing about limits ([`crate::limits`] does) and
//! never refuses a command.

use crate::reply::Reply;
use crate::runner::Runner;
use crate::vocab::ChatMessage;
use crate::vocab::MessageEvent;
use crate::vocab::Progress;
use crate::vocab::SessionId;

impl Runner {
    /// The meter of `event`'s turn, booked with what is left of its
    /// user's budget; `Err`: the user is over budget (the refusal). Every
    /// turn of a user is checked: their messages, their scheduled jobs'
    /// runs, their background tasks' results. A store that cannot be read
    /// does not refuse the turn (its failure shows elsewhere).
    pub(super) async fn budget_for(
        &self,
        event: &MessageEvent,
    ) -> Result<crate::limits::TurnMeter, Reply> {
        let limits = &self.inner.config.limits;
        let (Some(store), Some(user)) = (self.store(), event.source.user_id) else {
            return Ok(crate::limits::TurnMeter::default());
        };
        if limits.config().is_unlimited() {
            return Ok(crate::limits::TurnMeter::default());
        }
        let role = self.access().and_then(|a| a.standing(user)).map(|s| s.role);
        match limits
            .check(&store.usage, &store.jobs, user, role, event.source.chat_id)
            .await
        {
            Ok(crate::limits::Verdict::Go(meter)) => Ok(meter),
            Ok(crate::limits::Verdict::Refused(refusal)) => {
                Err(Reply::notice(refusal.text(refused_what(event))))
            }
            Err(error) => {
                tracing::error!(%error, "could not read the usage; the turn runs unchecked");
                Ok(crate::limits::TurnMeter::default())
            }
        }
    }

    /// Whether `source`'s user is over a limit now (a job that runs
    /// prompts is not made then): the refusal, in their words.
    pub(super) async fn over_budget(&self, source: &crate::vocab::SessionSource) -> Option<String> {
        let limits = &self.inner.config.limits;
        let (store, user) = (self.store()?, source.user_id?);
        let role = self.access().and_then(|a| a.standing(user)).map(|s| s.role);
        match limits
            .over_limit(&store.usage, &store.jobs, user, role, source.chat_id)
            .await
        {
            Ok(refusal) => refusal.map(|r| r.job_text()),
            Err(error) => {
                tracing::error!(%error, "could not read the usage; the job is made unchecked");
                None
            }
        }
    }

    /// What charges `event`'s turn (its user's usage row) once it ran:
    /// what its meter saw, or (a backend that reported nothing) the
    /// estimate of the `sent` characters and those `progress` showed.
    pub(super) fn charge_for(
        &self,
        event: &MessageEvent,
        session_id: &SessionId,
        meter: &crate::limits::TurnMeter,
        (sent, progress): (usize, &Progress),
    ) -> Option<Charge> {
        let (usage, user) = (self.store()?.usage.clone(), event.source.user_id?);
        Some(Charge {
            usage,
            meter: Some(meter.clone()),
            sent,
            progress: progress.clone(),
            turn: Some(crate::store::TurnUsage {
                user_id: user,
                chat_id: event.source.chat_id,
                session_id: session_id.to_string(),
                at_ms: self.inner.config.limits.clock().now_ms(),
                usage: crate::store::AgentUsage::default(),
            }),
        })
    }
}

/// Records a turn's usage once it ran: by [`Charge::charge`], or when the
/// turn's future is dropped first (a stop), by a short task. The turn's
/// booking (its meter) ends only after its row was handed to the store.
pub(super) struct Charge {
    usage: crate::store::Usage,
    meter: Option<crate::limits::TurnMeter>,
    /// Characters the turn sent (its message and history).
    sent: usize,
    /// What the turn showed so far (the characters it received).
    progress: Progress,
    turn: Option<crate::store::TurnUsage>,
}

impl Charge {
    /// The usage row and the meter (whose booking ends when it is
    /// dropped); a backend that reported nothing is charged its estimate.
    fn take(&mut self) -> Option<(crate::store::TurnUsage, crate::limits::TurnMeter)> {
        let mut turn = self.turn.take()?;
        let meter = self.meter.take()?;
        if meter.estimate_if_silent(self.sent, self.progress.snapshot().len()) {
            tracing::debug!("the backend reported no usage; the turn is charged an estimate");
        }
        turn.usage = meter.used();
        Some((turn, meter))
    }

    /// The usage row, recorded by the caller (with the transcript), and
    /// the meter to drop once it is queued.
    pub(super) fn into_usage(
        mut self,
    ) -> (
        Option<crate::store::TurnUsage>,
        Option<crate::limits::TurnMeter>,
    ) {
        self.take().unzip()
    }

    pub(super) async fn charge(mut self) {
        if let Some((turn, meter)) = self.take() {
            if let Err(error) = self.usage.record_turn_usage(turn).await {
                tracing::error!(%error, "could not record a turn's usage");
            }
            drop(meter);
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let Some((turn, meter)) = self.take() else {
            return;
        };
        let usage = self.usage.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = usage.record_turn_usage(turn).await {
                    tracing::error!(%error, "could not record a stopped turn's usage");
                }
                drop(meter);
            });
        }
    }
}

/// The characters a turn sends: its message and its history.
pub(super) fn sent_chars(text: &str, history: &[ChatMessage]) -> usize {
    history
        .iter()
        .map(|m| m.content.len())
        .fold(text.len(), usize::saturating_add)
}

/// What a refusal says was not run: the user's message, their job's run,
/// or their background task's result.
fn refused_what(event: &MessageEvent) -> &'static str {
    if !event.internal {
        "this message"
    } else if event.message_id.and_then(crate::schedule::run_of).is_some() {
        "this scheduled run"
    } else {
        "this background task's result"
    }
}
