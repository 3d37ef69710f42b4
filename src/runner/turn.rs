//! One agent turn from start to answer: the generation guard around it,
//! history and transcript, the live preview, the stall watchdog, and what
//! a stopped, interrupted or stale turn leaves behind.
//!
//! The slot is released only by a turn whose generation is still current
//! ([`SlotRelease`] also when the turn's future is dropped), so a turn
//! that is still unwinding never writes into a newer one.

use crate::adapter::DispatchContext;
use crate::agent::AgentReply;
use crate::agent::TurnRequest;
use crate::reply::LiveReply;
use crate::reply::Outgoing;
use crate::reply::Reply;
use crate::reply::TurnStart;
use crate::runner::budget::Charge;
use crate::runner::commands;
use crate::runner::outcome::{turn_outcome, TurnOutcome, TurnRun};
use crate::runner::watch_for_stall;
use crate::runner::AgentHandle;
use crate::runner::Runner;
use crate::runner::RunningAgent;
use crate::runner::STORE_DOWN_TEXT;
use crate::store::TranscriptEntry;
use crate::vocab::bind_turn_identity;
use crate::vocab::ChatMessage;
use crate::vocab::MessageEvent;
use crate::vocab::Progress;
use crate::vocab::Role;
use crate::vocab::SessionId;
use crate::vocab::SessionKey;
use crate::vocab::TurnEnd;
use crate::vocab::TurnGeneration;
use crate::vocab::TurnIdentity;
use crate::vocab::RESET_HINT;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

impl Runner {
    /// One turn: admitted (session, budget), the agent run under its
    /// generation, then counted, recorded and answered by its outcome.
    pub(super) async fn turn(self, event: MessageEvent, ctx: DispatchContext) -> Option<Outgoing> {
        self.turn_admitted(event, ctx, None).await
    }

    /// [`Runner::turn`]; `budget`: the turn's budget was already checked
    /// and booked (by a command that decides before it changes anything).
    pub(super) async fn turn_admitted(
        self,
        event: MessageEvent,
        ctx: DispatchContext,
        budget: Option<crate::limits::TurnMeter>,
    ) -> Option<Outgoing> {
        let key = ctx.key.clone();
        let generation = self.begin_turn_generation(&key, event.source.user_id);
        // Set-up may await the store; whatever happens, the pending sentinel
        // must not outlive this future.
        let mut slot = SlotRelease {
            runner: &self,
            key: &key,
            generation,
            armed: true,
            interrupted: None,
        };
        let (session_id, meter) = match self.admit(&event, &key, budget).await {
            Ok(admitted) => admitted,
            Err(refusal) => return Some(refusal),
        };
        let history = self.turn_history(&event, &session_id).await;
        let cancel = ctx.interrupt.child_token();
        let progress = Progress::new();
        if !self.promote(&key, generation, &cancel, &progress) {
            return None;
        }
        slot.interrupted = Some((session_id.clone(), progress.clone()));
        self.inner.config.metrics.turns_started.inc();
        let started = Instant::now();
        let live = self.show_turn(&event, generation, &progress);
        let model = self.session_model(&key, &session_id).await;
        let message_id = event.message_id;
        let turn_files = self.turn_files(&event).await;
        let turn_jobs = self.turn_jobs(&event).await;
        let job_owner = event.source.clone();
        let mut after = self.after_answer(&event, &turn_files).await;
        let sent = super::budget::sent_chars(&event.text, &history);
        let charge = self.charge_for(&event, &session_id, &meter, (sent, &progress));
        let request = TurnRequest {
            session_key: key.clone(),
            session_id: session_id.clone(),
            generation,
            source: event.source,
            text: event.text,
            history,
            internal: event.internal,
            cancel: cancel.clone(),
            progress: progress.clone(),
            model: model.filter(|m| Some(m) != self.inner.config.default_model.as_ref()),
        };
        let watched = self
            .run_agent(request, turn_jobs.clone(), turn_files, meter)
            .await;
        mark_if_interrupted(&ctx, &progress);
        // Only a turn that is still current may release the slot and answer.
        slot.armed = false;
        let current = self.state().slots.release(&key, Some(generation));
        let outcome = turn_outcome(current, cancel.is_cancelled(), watched);
        charge_by_outcome(&outcome, charge, &mut after).await;
        self.inner
            .config
            .metrics
            .turn_duration
            .observe(started.elapsed());
        self.count_cancelled(&outcome);
        self.record_partial(&outcome, &progress, &session_id).await;
        let (reply, live) = self
            .reply_for(outcome, &key, generation, &session_id, after, live)
            .await?;
        // Jobs the turn made (the model's tool, a program's requests)
        // are confirmed under its reply.
        let reply = with_lines(reply, turn_jobs.finish(&job_owner, &key).await);
        Some(Outgoing {
            reply: reply.in_reply_to(message_id),
            live,
        })
    }

    /// What follows the turn's answer (its voice note, its files); charged
    /// once the turn ran.
    async fn after_answer(
        &self,
        event: &MessageEvent,
        files: &crate::media::TurnFiles,
    ) -> AfterAnswer {
        AfterAnswer {
            speaker: self.speaker_for(event).await,
            source: event.source.clone(),
            files: files.clone(),
            charge: None,
        }
    }

    /// The turn's live view in the chat (typing, preview), if the
    /// outbound shows one.
    fn show_turn(
        &self,
        event: &MessageEvent,
        generation: TurnGeneration,
        progress: &Progress,
    ) -> Option<Box<dyn LiveReply>> {
        self.inner.outbound.turn_started_with(
            &TurnStart {
                to: &event.source,
                answering: event.message_id,
                generation: generation.0,
                replayed: event.origin.is_recovered(),
            },
            progress.watch(),
        )
    }

    /// A new generation for `key`'s slot, installed as pending, started by
    /// `user` (so /revoke finds the turns of whoever loses access).
    fn begin_turn_generation(&self, key: &SessionKey, user: Option<u64>) -> TurnGeneration {
        let generation = {
            let mut state = self.state();
            let generation = state.slots.begin_generation(key);
            state.slots.install_pending(key, Instant::now());
            state.slots.set_starter(key, user);
            generation
        };
        self.keep_generations_reserved();
        tracing::Span::current().record("generation", tracing::field::display(generation));
        generation
    }

    /// The session `event` runs against and its user's meter; `Err`: the
    /// reply refusing the turn (the store is down, the user over budget).
    async fn admit(
        &self,
        event: &MessageEvent,
        key: &SessionKey,
        budget: Option<crate::limits::TurnMeter>,
    ) -> Result<(SessionId, crate::limits::TurnMeter), Outgoing> {
        // Access as it is now, not as it was when the message was taken.
        self.still_allowed(event)?;
        // A wakeup runs against the session that started its process, even
        // if the chat has moved on (/new) since; everything else runs
        // against the slot's current session.
        let session_id = match event.override_session() {
            Some(session) => session.clone(),
            None => match self.resolve_session(key).await {
                Ok(id) => id,
                Err(_) => {
                    return Err(Reply::error(STORE_DOWN_TEXT)
                        .in_reply_to(event.message_id)
                        .into())
                }
            },
        };
        tracing::Span::current().record("session_id", tracing::field::display(&session_id));
        // A user over budget is refused before anything of the turn is
        // recorded or charged.
        let budget = match budget {
            Some(meter) => Ok(meter),
            None => self.budget_for(event).await,
        };
        match budget {
            Ok(meter) => Ok((session_id, meter)),
            Err(refusal) => {
                tracing::info!(session_key = %key, user = ?event.source.user_id, "turn refused: over budget");
                Err(refusal.in_reply_to(event.message_id).into())
            }
        }
    }

    /// The history the turn runs with, the user's message recorded after
    /// it. A backend that keeps its conversation itself gets none: the message
    /// is recorded without a store call of its own (carried by the next
    /// one, so every later read sees it).
    async fn turn_history(&self, event: &MessageEvent, session_id: &SessionId) -> Vec<ChatMessage> {
        let reads_history = self.inner.agent.reads_history();
        if !event.origin.was_running() {
            if !reads_history {
                self.record_later(session_id, vec![user_entry(event)]);
                return Vec::new();
            }
            return self
                .load_history_and_record(session_id, user_entry(event))
                .await;
        }
        let mut history = self.load_history(session_id).await;
        // A message replayed after a crash may already be the
        // transcript's last entry: keep it once, and not also in the
        // history.
        let already_recorded = history
            .last()
            .is_some_and(|m| m.role == Role::User && m.content == event.text);
        if already_recorded {
            history.pop();
        } else {
            self.record(session_id, vec![user_entry(event)]).await;
        }
        if !reads_history {
            history.clear();
        }
        history
    }

    /// The pending generation becomes the running agent; `false`: the turn
    /// went stale during set-up.
    fn promote(
        &self,
        key: &SessionKey,
        generation: TurnGeneration,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> bool {
        let handle = AgentHandle {
            generation,
            cancel: cancel.clone(),
            progress: progress.clone(),
        };
        if !self.state().slots.promote(key, handle) {
            tracing::debug!(session_key = %key, %generation, "turn went stale during set-up");
            return false;
        }
        true
    }

    /// The jobs the turn's agent may ask for, confirmed under its reply.
    async fn turn_jobs(&self, event: &MessageEvent) -> crate::schedule::TurnJobs {
        crate::schedule::TurnJobs::start(
            self.inner.config.jobs.as_ref(),
            event.source.chat_id,
            event.message_id,
            self.inner.agent.leaves_files(),
        )
        .await
    }

    /// The agent's run under the turn's identity, jobs, files and meter,
    /// watched for stalls.
    async fn run_agent(
        &self,
        request: TurnRequest,
        turn_jobs: crate::schedule::TurnJobs,
        turn_files: crate::media::TurnFiles,
        meter: crate::limits::TurnMeter,
    ) -> TurnRun<AgentReply> {
        let identity = TurnIdentity {
            session_key: request.session_key.clone(),
            session_id: request.session_id.clone(),
            generation: request.generation,
            source: request.source.clone(),
        };
        let (progress, cancel) = (request.progress.clone(), request.cancel.clone());
        let run = AssertUnwindSafe(self.inner.agent.run(request)).catch_unwind();
        bind_turn_identity(
            identity,
            crate::schedule::with_turn_jobs(
                turn_jobs,
                crate::media::with_turn_files(
                    turn_files,
                    crate::limits::meter::with_meter(
                        meter,
                        watch_for_stall(run, &progress, &cancel, self.inner.config.stall_timeout),
                    ),
                ),
            ),
        )
        .await
    }

    /// Counted before the transcript write: a stopped turn still
    /// unwinding when the command's bounded wait ends is aborted at that
    /// await, and must have been counted by then.
    fn count_cancelled(&self, outcome: &TurnOutcome<AgentReply>) {
        let metrics = &self.inner.config.metrics;
        if outcome.counts_as_cancelled() {
            metrics.turns_cancelled.inc();
            if matches!(outcome, TurnOutcome::Stale) {
                metrics.generation_discards.inc();
            }
        }
    }

    /// Stopped, interrupted, stalled, failed or stale: the transcript
    /// keeps what the user saw so far, marked as interrupted.
    async fn record_partial(
        &self,
        outcome: &TurnOutcome<AgentReply>,
        progress: &Progress,
        session_id: &SessionId,
    ) {
        if outcome.keeps_partial() {
            let partial = progress.snapshot();
            if !partial.is_empty() || matches!(outcome, TurnOutcome::Stale) {
                self.record(session_id, vec![interrupted_entry(partial)])
                    .await;
            }
        }
    }

    /// The reply by the turn's outcome (and the live view it finishes);
    /// `None`: nothing is answered (stale, stopped).
    async fn reply_for(
        &self,
        outcome: TurnOutcome<AgentReply>,
        key: &SessionKey,
        generation: TurnGeneration,
        session_id: &SessionId,
        after: AfterAnswer,
        live: Option<Box<dyn LiveReply>>,
    ) -> Option<(Reply, Option<Box<dyn LiveReply>>)> {
        let metrics = &self.inner.config.metrics;
        let reply = match outcome {
            TurnOutcome::Stale => {
                tracing::debug!(session_key = %key, %generation, "stale turn result discarded");
                return None;
            }
            TurnOutcome::Stalled => {
                tracing::warn!(session_key = %key, "turn stalled; cancelled by the watchdog");
                metrics.watchdog_cancels.inc();
                metrics.turns_cancelled.inc();
                Reply::error(format!(
                    "⏱ The task showed no progress for {} and was stopped. Send your message again, or /reset to start fresh.",
                    commands::human_duration(self.inner.config.stall_timeout)
                ))
            }
            // Interrupted (a newer message) or stopped: never answered
            // (counted above).
            TurnOutcome::Stopped => return None,
            TurnOutcome::Answered(answer) => {
                return Some(self.answered(answer, key, session_id, after, live).await);
            }
            TurnOutcome::Failed {
                user_message,
                detail,
                owner_must_fix,
            } => {
                metrics.turns_failed.inc();
                tracing::warn!(session_key = %key, %detail, "turn failed");
                if owner_must_fix {
                    // Starting over cannot help: no /reset hint.
                    Reply::error(format!("⚠️ {user_message}"))
                } else {
                    Reply::error(format!("⚠️ {user_message}\n{RESET_HINT}"))
                }
            }
            TurnOutcome::Panicked(panic) => {
                metrics.turns_failed.inc();
                tracing::error!(session_key = %key, %panic, "agent panicked");
                Reply::error(format!(
                    "⚠️ Something went wrong inside the agent.\n{RESET_HINT}"
                ))
            }
        };
        Some((reply, live))
    }

    /// The agent answered: counted, its trimming noted for /status, its
    /// transcript recorded; the answer spoken (if asked) and followed by
    /// the files the program left.
    async fn answered(
        &self,
        answer: AgentReply,
        key: &SessionKey,
        session_id: &SessionId,
        after: AfterAnswer,
        mut live: Option<Box<dyn LiveReply>>,
    ) -> (Reply, Option<Box<dyn LiveReply>>) {
        self.inner.config.metrics.turns_finished.inc();
        {
            let mut state = self.state();
            if answer.history_trimmed > 0 {
                state.trimmed.insert(key.clone(), answer.history_trimmed);
            } else {
                state.trimmed.remove(key);
            }
        }
        let entries = if answer.transcript.is_empty() {
            vec![TranscriptEntry::assistant(answer.text.clone())]
        } else {
            answer
                .transcript
                .into_iter()
                .map(TranscriptEntry::from_message)
                .collect()
        };
        // Not waited for: the answer's send intent (or the next turn's
        // history read) is the next store call and commits it first.
        if let Some(store) = &self.inner.store {
            let (usage, booking) = after.charge.map(Charge::into_usage).unzip();
            store.transcripts.append_many_charging_later(
                session_id.as_str(),
                entries,
                usage.flatten(),
            );
            // The booking ends once the usage row is queued before any later read.
            drop(booking);
        }
        // Spoken first (the voice note carries the text), as asked.
        if let Some(speaker) = after.speaker {
            live = super::voice::spoken_answer(
                live,
                speaker,
                self.inner.outbound.clone(),
                after.source.clone(),
            );
        }
        // Files the program left in its outbox follow the answer.
        live = crate::media::outbox_dir::files_after_answer(
            live,
            &after.files,
            self.inner.outbound.clone(),
            after.source,
        );
        (Reply::answer(answer.text), live)
    }

    /// The files bound around a turn: the event's attachments and, with
    /// file output, the sender and (for a backend whose program leaves
    /// files, [`Agent::leaves_files`]) a fresh outbox directory.
    pub(super) async fn turn_files(&self, event: &MessageEvent) -> crate::media::TurnFiles {
        let mut files = crate::media::TurnFiles {
            attachments: event.media.attachments.clone(),
            answering: event.message_id,
            ..Default::default()
        };
        if let Some(sender) = &self.inner.config.files {
            if self.inner.agent.leaves_files() {
                files.outbox = sender
                    .outbox_dir(event.source.chat_id, event.message_id)
                    .await;
            }
            files.sender = Some(sender.clone());
        }
        files
    }

    pub(super) async fn load_history(&self, session_id: &SessionId) -> Vec<ChatMessage> {
        let Some(store) = &self.inner.store else {
            return Vec::new();
        };
        let limit = self.inner.config.history_max_messages;
        match store
            .transcripts
            .load_history(session_id.as_str(), Some(limit))
            .await
        {
            Ok(entries) => entries
                .into_iter()
                .map(TranscriptEntry::into_message)
                .collect(),
            Err(error) => {
                tracing::error!(%session_id, %error, "could not load the history; the turn runs without it");
                Vec::new()
            }
        }
    }

    /// The history, then the user's message recorded after it: one store
    /// call. If the store fails, the turn runs without history (and the
    /// failure shows in `/healthz`), as with each step on its own.
    pub(super) async fn load_history_and_record(
        &self,
        session_id: &SessionId,
        user: TranscriptEntry,
    ) -> Vec<ChatMessage> {
        let Some(store) = &self.inner.store else {
            return Vec::new();
        };
        let limit = self.inner.config.history_max_messages;
        match store
            .transcripts
            .load_history_then_append(session_id.as_str(), Some(limit), vec![user])
            .await
        {
            Ok(entries) => entries
                .into_iter()
                .map(TranscriptEntry::into_message)
                .collect(),
            Err(error) => {
                tracing::error!(%session_id, %error, "could not load the history and record the message; the turn runs without history");
                Vec::new()
            }
        }
    }

    /// [`Runner::record`] without waiting: carried by the store's next
    /// call, which commits it first (a failure shows in `/healthz` and the
    /// log, as the store reports it).
    fn record_later(&self, session_id: &SessionId, entries: Vec<TranscriptEntry>) {
        if let Some(store) = &self.inner.store {
            store
                .transcripts
                .append_many_charging_later(session_id.as_str(), entries, None);
        }
    }

    pub(super) async fn record(&self, session_id: &SessionId, entries: Vec<TranscriptEntry>) {
        self.record_charging(session_id, entries, None).await;
    }

    /// [`Runner::record`], with the turn's usage row in the same store
    /// call when `charge` has one.
    async fn record_charging(
        &self,
        session_id: &SessionId,
        entries: Vec<TranscriptEntry>,
        charge: Option<Charge>,
    ) {
        let (usage, booking) = charge.map(Charge::into_usage).unzip();
        let usage = usage.flatten();
        if let Some(store) = &self.inner.store {
            // A failure shows in /healthz (the store reports it).
            if let Err(error) = store
                .transcripts
                .append_many_charging(session_id.as_str(), entries, usage)
                .await
            {
                tracing::error!(%session_id, %error, "could not record the transcript and the turn's usage");
            }
        }
        drop(booking);
    }
}

/// What follows an answer: its voice note, the files the program left.
struct AfterAnswer {
    speaker: Option<std::sync::Arc<crate::media::speech::Speaker>>,
    source: crate::vocab::SessionSource,
    files: crate::media::TurnFiles,
    /// The turn's usage, recorded with the answer's transcript.
    charge: Option<Charge>,
}

/// What the turn used is charged however it ended: an answer's with its
/// transcript (one store call, in [`Runner::answered`]), any other's now.
async fn charge_by_outcome(
    outcome: &TurnOutcome<AgentReply>,
    charge: Option<Charge>,
    after: &mut AfterAnswer,
) {
    match (outcome, charge) {
        (TurnOutcome::Answered(_), charge) => after.charge = charge,
        (_, Some(charge)) => charge.charge().await,
        (_, None) => {}
    }
}

/// A newer message interrupted the turn (a /stop before wins).
fn mark_if_interrupted(ctx: &DispatchContext, progress: &Progress) {
    if ctx.interrupt.is_cancelled() {
        let now = CancellationToken::new();
        now.cancel();
        progress.mark_ended(TurnEnd::Interrupted, now);
    }
}

/// `reply` with `lines` below it (a blank line between).
fn with_lines(mut reply: Reply, lines: Vec<String>) -> Reply {
    if !lines.is_empty() {
        reply.text.push_str("\n\n");
        reply.text.push_str(&lines.join("\n"));
    }
    reply
}

pub(super) fn user_entry(event: &MessageEvent) -> TranscriptEntry {
    let mut entry = TranscriptEntry::user(event.text.clone());
    if event.internal {
        entry.name = Some("telegate".to_string());
    }
    entry
}

pub(super) fn interrupted_entry(partial: String) -> TranscriptEntry {
    let mut entry = TranscriptEntry::assistant(partial);
    entry.interrupted = true;
    entry
}

/// Releases a turn's slot (generation-checked) if the turn's future is
/// dropped before it could do so itself, and records the interruption in the
/// transcript.
pub(super) struct SlotRelease<'a> {
    runner: &'a Runner,
    key: &'a SessionKey,
    generation: TurnGeneration,
    armed: bool,
    /// Set once the agent runs: what to record if the turn is dropped.
    interrupted: Option<(SessionId, Progress)>,
}

impl Drop for SlotRelease<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut state = self.runner.state();
            if let Some(handle) = state
                .slots
                .running_agent(self.key)
                .and_then(RunningAgent::live)
            {
                if handle.generation == self.generation {
                    handle.cancel.cancel();
                }
            }
            state.slots.release(self.key, Some(self.generation));
        }
        if self.interrupted.is_some() {
            self.runner.inner.config.metrics.turns_cancelled.inc();
        }
        if let (Some(store), Some((session_id, progress))) =
            (self.runner.inner.store.clone(), self.interrupted.take())
        {
            // Drop cannot await: the record is written by a short task.
            let entry = interrupted_entry(progress.snapshot());
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(error) = store.transcripts.append(session_id.as_str(), entry).await {
                        tracing::error!(%session_id, %error, "could not record an interrupted turn");
                    }
                });
            }
        }
    }
}
