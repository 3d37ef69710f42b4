//! The runner's answers to commands: /status, /ps, /kill, /approve and
//! /deny (and their buttons), /retry, /undo, /model, and stopping a slot's
//! turn for /stop, /new and /reset.
//!
//! Commands are answered at once and never wait for the running turn; like
//! the rest of the runner they never send anything themselves and never
//! hold the runner's lock across an `.await`.

use crate::adapter::DispatchContext;
use crate::reply::DeliveryError;
use crate::reply::LiveReply;
use crate::reply::Outbound;
use crate::reply::Outgoing;
use crate::reply::Reply;
use crate::runner::commands;
use crate::runner::help_text;
use crate::runner::process_line;
use crate::runner::ps_text;
use crate::runner::status_text;
use crate::runner::ApprovalPress;
use crate::runner::InvalidateReason;
use crate::runner::Runner;
use crate::runner::RunningAgent;
use crate::runner::StatusView;
use crate::runner::STORE_DOWN_TEXT;
use crate::tools::approval::Answerer;
use crate::tools::approval::Choice;
use crate::tools::approval::Denial;
use crate::tools::approval::Lookup;
use crate::tools::authority::may_decide;
use crate::tools::authority::who_may_decide;
use crate::tools::process::ProcessId;
use crate::tools::process::ProcessMode;
use crate::tools::process::ProcessRecord;
use crate::tools::process::Scope;
use crate::vocab::Button;
use crate::vocab::ButtonAction;
use crate::vocab::KnownCommand;
use crate::vocab::MessageEvent;
use crate::vocab::MessageKind;
use crate::vocab::SessionId;
use crate::vocab::SessionKey;
use crate::vocab::TurnEnd;
use futures::future::BoxFuture;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

impl Runner {
    pub(super) async fn command(
        &self,
        command: KnownCommand,
        args: &str,
        ctx: &DispatchContext,
        source: &crate::vocab::SessionSource,
    ) -> Reply {
        let key = &ctx.key;
        match command {
            KnownCommand::Start => Reply::command(commands::start_text(self.backend_name())),
            KnownCommand::Help => Reply::command(help_text()),
            KnownCommand::Status => self.status_reply(ctx, source).await,
            KnownCommand::Ps => Reply::command(self.ps(key)),
            KnownCommand::Diff => self.worktree_command(None, args, key, source).await,
            KnownCommand::Merge => {
                let change = Some(crate::vocab::WorktreeButton::Merge);
                self.worktree_command(change, args, key, source).await
            }
            KnownCommand::Discard => {
                let change = Some(crate::vocab::WorktreeButton::Discard);
                self.worktree_command(change, args, key, source).await
            }
            KnownCommand::Kill => Reply::command(self.kill(key, args).await),
            // Answered in `dispatch`, which knows the sender; never here.
            KnownCommand::Approve | KnownCommand::Deny => {
                Reply::command("Reply /approve or /deny in the chat that asked.")
            }
            // Answered in `dispatch` with the sender (see `team.rs`).
            KnownCommand::Pair
            | KnownCommand::Invite
            | KnownCommand::Users
            | KnownCommand::Role
            | KnownCommand::Revoke
            | KnownCommand::Usage
            | KnownCommand::Voice
            | KnownCommand::Sessions
            | KnownCommand::Resume
            | KnownCommand::Title => Reply::command(super::team::NO_TEAMS_TEXT),
            KnownCommand::Undo => self.undo(ctx).await,
            // Answered in `dispatch`, which knows the sender; never here.
            KnownCommand::Jobs
            | KnownCommand::At
            | KnownCommand::In
            | KnownCommand::Every
            | KnownCommand::Cron
            | KnownCommand::Pause
            | KnownCommand::Unschedule
            | KnownCommand::Timezone => Reply::command(commands::unknown_command_text("jobs")),
            KnownCommand::Model => self.model_command(key, args).await,
            // Handled in `dispatch` (it runs a turn); never reached.
            KnownCommand::Retry => Reply::command(commands::BUSY_HISTORY_TEXT),
            KnownCommand::Stop => {
                let stopped = self.stop_and_deny(key, InvalidateReason::Stop);
                Reply::command(stop_text(stopped, ctx.slot_busy, ctx.slot_sending))
            }
            KnownCommand::New | KnownCommand::Reset => self.rotate_reply(command, ctx).await,
        }
    }

    /// /status: the slot's session, history, run, queue, processes,
    /// usage, model and next job.
    async fn status_reply(
        &self,
        ctx: &DispatchContext,
        source: &crate::vocab::SessionSource,
    ) -> Reply {
        let key = &ctx.key;
        let session_id = match self.resolve_session(key).await {
            Ok(id) => id,
            Err(_) => return Reply::error(STORE_DOWN_TEXT),
        };
        let history_len = match &self.inner.store {
            Some(store) => store
                .transcripts
                .transcript_len(session_id.as_str())
                .await
                .ok(),
            None => None,
        };
        let agent_usage = self.agent_usage_line(&session_id).await;
        let model = self.session_model(key, &session_id).await;
        let next_job = match &self.inner.config.jobs {
            Some(jobs) => jobs.next_line(source.chat_id).await,
            None => None,
        };
        let state = self.state();
        let view = StatusView {
            session_id: session_id.to_string(),
            history_len,
            history_trimmed: state.trimmed.get(key).copied().unwrap_or(0),
            running_for: state.slots.running_since(key).map(|t| t.elapsed()),
            starting: matches!(state.slots.running_agent(key), Some(RunningAgent::Pending)),
            queue_depth: ctx.queue_depth,
            backend: self.backend_name().to_string(),
            processes: self.running_process_lines(key),
            agent_usage,
            model,
            next_job,
        };
        Reply::command(status_text(&view))
    }

    /// /new or /reset: the turn stopped, a fresh session in place of the
    /// slot's (recorded in the store).
    async fn rotate_reply(&self, command: KnownCommand, ctx: &DispatchContext) -> Reply {
        let key = &ctx.key;
        let reason = if command == KnownCommand::New {
            InvalidateReason::New
        } else {
            InvalidateReason::Reset
        };
        let stopped = self.stop_and_deny(key, reason);
        let (old, new) = {
            let mut state = self.state();
            state.trimmed.remove(key);
            state.sessions.rotate(key)
        };
        tracing::info!(session_key = %key, old = ?old, new = %new, ?reason, "session rotated");
        if let Some(store) = &self.inner.store {
            if let Err(error) = store
                .sessions
                .rotate_session(key.as_str(), new.to_string())
                .await
            {
                tracing::error!(session_key = %key, %error, "could not record the new session");
            }
        }
        let stopped_task = stopped != StopOutcome::NothingRunning || ctx.slot_busy;
        Reply::command(rotated_text(
            command == KnownCommand::New,
            &new.to_string(),
            stopped_task,
            ctx.slot_sending,
        ))
    }

    /// The CLI agent's usage for /status, once any is recorded.
    pub(super) async fn agent_usage_line(&self, session_id: &SessionId) -> Option<String> {
        let store = self.inner.store.as_ref()?;
        let total = store.agent.sessions.agent_usage_total().await.ok()?;
        if total.turns == 0 {
            return None;
        }
        let session = store
            .agent
            .sessions
            .agent_usage(session_id.as_str())
            .await
            .ok()
            .flatten();
        Some(commands::usage_text(session.as_ref(), &total))
    }

    /// /ps: the chat's background processes.
    pub(super) fn ps(&self, key: &SessionKey) -> String {
        let Some(tools) = self.tools() else {
            return commands::NO_TOOLS_TEXT.to_string();
        };
        let lines: Vec<String> = tools
            .registry()
            .list(Scope::Chat(key))
            .iter()
            .filter(|r| matches!(r.mode, ProcessMode::Background { .. }) || r.is_running())
            .map(line_of)
            .collect();
        ps_text(&lines)
    }

    /// The chat's running processes for /status (`None` without tools).
    pub(super) fn running_process_lines(&self, key: &SessionKey) -> Option<Vec<String>> {
        let tools = self.tools()?;
        Some(
            tools
                .registry()
                .list(Scope::Chat(key))
                .iter()
                .filter(|r| r.is_running())
                .map(line_of)
                .collect(),
        )
    }

    /// /kill ID: stop one of the chat's processes and its whole group.
    pub(super) async fn kill(&self, key: &SessionKey, args: &str) -> String {
        let Some(tools) = self.tools() else {
            return commands::NO_TOOLS_TEXT.to_string();
        };
        let Some(id) = args.split_whitespace().next().map(ProcessId::new) else {
            return "Which one? Send /kill ID; /ps lists the ids.".to_string();
        };
        let Some(before) = tools.registry().get(&id, Scope::Chat(key)) else {
            return format!("There is no process {id} in this chat. /ps lists them.");
        };
        if !before.is_running() {
            return format!("{id} is not running ({}).", before.state_text());
        }
        match tools.registry().kill(&id, Scope::Chat(key)).await {
            Some(after) if !after.is_running() => {
                format!("🛑 Killed {id} ({}).", after.state_text())
            }
            _ => format!("🛑 Sent {id} the stop signal; it has not ended yet."),
        }
    }

    /// /approve, /deny (with an optional one-time id in `args`), or a bare
    /// yes/no (`None`: not an answer after all), sent by `actor` in `slot`.
    /// Only the user who started the waiting turn, or an approver, decides.
    pub(super) fn answer_approval(
        &self,
        slot: &SessionKey,
        actor: &crate::vocab::SessionSource,
        approve: Option<bool>,
        args: &str,
    ) -> Reply {
        let Some(approvals) = self.approvals() else {
            return Reply::command(commands::NO_TOOLS_TEXT);
        };
        let Some(approve) = approve else {
            return Reply::command("Reply /approve or /deny to the pending command.");
        };
        let ticket = args.split_whitespace().next();
        let pending = match approvals.lookup(slot, actor.chat_id, ticket) {
            Lookup::Found(pending) => pending,
            Lookup::Nothing => return Reply::command("Nothing is waiting for your approval."),
            Lookup::NoSuchTicket => {
                return Reply::command(format!(
                    "Approval {} is not waiting (it was answered, timed out or replaced); nothing was run.",
                    ticket.unwrap_or_default()
                ))
            }
            Lookup::Several(tickets) => {
                return Reply::command(format!(
                    "Several commands wait for approval here; name one: {}.",
                    tickets
                        .iter()
                        .map(|t| format!("/approve {t}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        };
        if !may_decide(
            pending.started_by,
            actor.user_id,
            actor.chat_id,
            self.deciders(),
        ) {
            tracing::info!(session_key = %pending.key, ticket = pending.ticket, actor = ?actor.user_id, "approval answer refused: not the turn's user nor an approver");
            return Reply::command(format!(
                "🔒 You cannot answer approval {}. {}",
                pending.ticket,
                who_may_decide(pending.started_by_name.as_deref(), pending.started_by)
            ));
        }
        let decided = approvals.decide(
            &pending.key,
            Some(&pending.ticket),
            &Choice::of(approve),
            &Answerer::of(actor),
        );
        Reply::command(commands::decided_text(&pending.ticket, &decided))
    }

    /// /retry: take the last exchange out of the history and run its user
    /// message again as this command's turn (so its answer replaces the
    /// old one). While a task runs it only says so; over budget it is
    /// refused before the history is touched.
    pub(super) async fn retry(self, event: MessageEvent, ctx: DispatchContext) -> Option<Outgoing> {
        let message_id = event.message_id;
        let refuse = |text: &str| Some(Reply::command(text).in_reply_to(message_id).into());
        if ctx.slot_busy {
            return refuse(commands::BUSY_HISTORY_TEXT);
        }
        let Some(store) = self.inner.store.clone() else {
            return refuse("Nothing to retry: this chat keeps no history.");
        };
        let Ok(session_id) = self.resolve_session(&ctx.key).await else {
            return Some(Reply::error(STORE_DOWN_TEXT).in_reply_to(message_id).into());
        };
        // Decided before anything changes: a /retry by someone who may no
        // longer use the bot, or over budget, keeps the history as it was
        // (the turn's budget is booked here, for the run).
        if let Err(refusal) = self.still_allowed(&event) {
            return Some(refusal);
        }
        let budget = match self.budget_for(&event).await {
            Ok(meter) => meter,
            Err(refusal) => {
                tracing::info!(session_key = %ctx.key, user = ?event.source.user_id, "retry refused: over budget");
                return Some(refusal.in_reply_to(message_id).into());
            }
        };
        let undone = match store
            .transcripts
            .undo_last_exchange(session_id.as_str())
            .await
        {
            Ok(Some(undone)) => undone,
            Ok(None) => return refuse("Nothing to retry yet: send a message first."),
            Err(error) => {
                tracing::error!(session_key = %ctx.key, %error, "could not take the last exchange out for /retry");
                return refuse("⚠️ The history could not be read; nothing was retried.");
            }
        };
        tracing::info!(session_key = %ctx.key, entries = undone.entries, "retrying the last message");
        let mut again = MessageEvent::text(event.source, undone.user_text);
        again.kind = MessageKind::Text;
        again.message_id = message_id;
        let span = tracing::info_span!(
            "turn",
            session_key = %ctx.key,
            session_id = tracing::field::Empty,
            generation = tracing::field::Empty,
        );
        self.turn_admitted(again, ctx, Some(budget))
            .instrument(span)
            .await
    }

    /// /undo: take the last exchange out of the history (kept in the
    /// transcript, marked) and say what it was.
    pub(super) async fn undo(&self, ctx: &DispatchContext) -> Reply {
        if ctx.slot_busy {
            return Reply::command(commands::BUSY_HISTORY_TEXT);
        }
        let Some(store) = &self.inner.store else {
            return Reply::command("Nothing to undo: this chat keeps no history.");
        };
        let Ok(session_id) = self.resolve_session(&ctx.key).await else {
            return Reply::error(STORE_DOWN_TEXT);
        };
        match store
            .transcripts
            .undo_last_exchange(session_id.as_str())
            .await
        {
            Ok(Some(undone)) => {
                tracing::info!(session_key = %ctx.key, entries = undone.entries, "last exchange undone");
                Reply::command(commands::undone_text(&undone.user_text, undone.entries))
            }
            Ok(None) => Reply::command("Nothing to undo."),
            Err(error) => {
                tracing::error!(session_key = %ctx.key, %error, "could not undo the last exchange");
                Reply::command("⚠️ The history could not be changed; nothing was undone.")
            }
        }
    }

    /// The model `session_id` uses: its /model choice (if still offered),
    /// else the configured one; `None` when the backend has no choice.
    pub(super) async fn session_model(
        &self,
        key: &SessionKey,
        session_id: &SessionId,
    ) -> Option<String> {
        let config = &self.inner.config;
        let default = config.default_model.clone()?;
        let offered = |name: &String| config.models.contains(name);
        if let Some(chosen) = self.state().models.get(session_id).cloned() {
            return Some(if offered(&chosen) { chosen } else { default });
        }
        let store = self.inner.store.as_ref()?;
        let current = self.current_session(key);
        if current.as_ref() != Some(session_id) {
            return Some(default);
        }
        let stored = store
            .sessions
            .overrides(key.as_str())
            .await
            .ok()
            .and_then(|o| o.get("model").and_then(|m| m.as_str().map(str::to_string)))
            .filter(offered);
        if let Some(chosen) = &stored {
            self.state()
                .models
                .insert(session_id.clone(), chosen.clone());
        }
        Some(stored.unwrap_or(default))
    }

    /// /model: show the choices (as buttons), or switch to NAME.
    pub(super) async fn model_command(&self, key: &SessionKey, args: &str) -> Reply {
        let config = &self.inner.config;
        let Some(default) = &config.default_model else {
            return Reply::command(format!(
                "The {} backend has no choice of model; /model works with the openai backend.",
                self.backend_name()
            ));
        };
        let Ok(session_id) = self.resolve_session(key).await else {
            return Reply::error(STORE_DOWN_TEXT);
        };
        let wanted = args.split_whitespace().next();
        let Some(name) = wanted else {
            let current = self
                .session_model(key, &session_id)
                .await
                .unwrap_or_else(|| default.clone());
            let buttons = config
                .models
                .iter()
                .map(|m| {
                    let label = if *m == current {
                        format!("✓ {m}")
                    } else {
                        m.clone()
                    };
                    Button::new(label, ButtonAction::Model { name: m.clone() })
                })
                .collect();
            return Reply::command(commands::models_text(&current, &config.models))
                .with_buttons(buttons);
        };
        if !config.models.iter().any(|m| m == name) {
            let choices = if config.models.is_empty() {
                format!("only {default} is configured")
            } else {
                format!("choose one of: {}", config.models.join(", "))
            };
            return Reply::command(format!("Unknown model \"{name}\"; {choices}."));
        }
        self.state()
            .models
            .insert(session_id.clone(), name.to_string());
        if let Some(store) = &self.inner.store {
            if let Err(error) = store
                .sessions
                .set_override(key.as_str(), "model", serde_json::json!(name))
                .await
            {
                tracing::error!(session_key = %key, %error, "could not record the model choice");
            }
        }
        tracing::info!(session_key = %key, model = name, "model switched");
        Reply::command(format!(
            "🧠 Model: {name} (for this session; /new goes back to {default})."
        ))
    }

    /// An Approve or Deny button of the request with one-time id `ticket`
    /// was pressed by `actor`: exactly what `/approve <ticket>` (or
    /// `/deny <ticket>`) from `actor` in that chat does, under the same
    /// rule ([`may_decide`]: the turn's starter or an approver).
    pub fn press_approval(
        &self,
        actor: &crate::vocab::SessionSource,
        ticket: &str,
        approve: bool,
    ) -> ApprovalPress {
        self.press_choice(actor, ticket, &Choice::of(approve))
    }

    /// The button of option `option` of the request `ticket` was pressed
    /// by `actor`: like [`Runner::press_approval`], choosing that option.
    pub fn press_option(
        &self,
        actor: &crate::vocab::SessionSource,
        ticket: &str,
        option: &str,
    ) -> ApprovalPress {
        self.press_choice(actor, ticket, &Choice::Option(option.to_string()))
    }

    fn press_choice(
        &self,
        actor: &crate::vocab::SessionSource,
        ticket: &str,
        choice: &Choice,
    ) -> ApprovalPress {
        let Some(approvals) = self.approvals() else {
            return ApprovalPress::NotWaiting;
        };
        let slot = SessionKey::from_raw("");
        let pending = match approvals.lookup(&slot, actor.chat_id, Some(ticket)) {
            Lookup::Found(pending) => pending,
            _ => return ApprovalPress::NotWaiting,
        };
        if !may_decide(
            pending.started_by,
            actor.user_id,
            actor.chat_id,
            self.deciders(),
        ) {
            tracing::info!(session_key = %pending.key, ticket = pending.ticket, actor = ?actor.user_id, "approval button refused: not the turn's user nor an approver");
            return ApprovalPress::NotAllowed(who_may_decide(
                pending.started_by_name.as_deref(),
                pending.started_by,
            ));
        }
        match approvals.decide(
            &pending.key,
            Some(&pending.ticket),
            choice,
            &Answerer::pressing(actor),
        ) {
            Ok(decided) => ApprovalPress::Decided(decided),
            Err(_) => ApprovalPress::NotWaiting,
        }
    }

    /// /stop, /new and /reset: the running turn is cancelled first, then
    /// whatever waits for approval is refused. In this order a tool woken
    /// by the refusal finds its turn already cancelled; the other way round
    /// it could carry the refusal to the model (one more LLM request from a
    /// stopped turn) before the cancel arrived.
    fn stop_and_deny(&self, key: &SessionKey, reason: InvalidateReason) -> StopOutcome {
        let stopped = self.stop_running(key, reason);
        self.deny_pending_approvals(key);
        stopped
    }

    /// Refuse whatever waits for approval in `key`'s slot.
    fn deny_pending_approvals(&self, key: &SessionKey) {
        if let Some(approvals) = self.approvals() {
            if approvals.deny_all(key, Denial::Stopped) > 0 {
                tracing::info!(session_key = %key, "pending approval denied by a control command");
            }
        }
    }

    pub(super) fn stop_running(&self, key: &SessionKey, reason: InvalidateReason) -> StopOutcome {
        let mut state = self.state();
        let outcome = match state.slots.running_agent(key) {
            Some(RunningAgent::Live(handle)) => {
                let gate = CancellationToken::new();
                handle.progress.mark_ended(TurnEnd::Stopped, gate.clone());
                handle.cancel.cancel();
                if let Some(earlier) = state.reply_gates.insert(key.clone(), gate) {
                    earlier.cancel();
                }
                StopOutcome::StoppedLive
            }
            Some(RunningAgent::Pending) => StopOutcome::ForceUnlocked,
            None => StopOutcome::NothingRunning,
        };
        state.slots.invalidate_generation(key, reason);
        state.slots.release(key, None);
        drop(state);
        self.keep_generations_reserved();
        outcome
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopOutcome {
    StoppedLive,
    ForceUnlocked,
    NothingRunning,
}

/// A process as one /ps or /status line.
pub(super) fn line_of(record: &ProcessRecord) -> String {
    let state = if record.is_running() {
        match record.mode {
            ProcessMode::Foreground => "running (foreground)".to_string(),
            ProcessMode::Background { .. } => "running".to_string(),
        }
    } else {
        record.state_text()
    };
    process_line(record.id.as_str(), &state, record.runtime, &record.command)
}

/// A command reply that stopped a turn: delivered like any reply, then opens
/// the gate the stopped turn's preview waits on for its marker (also if it
/// is dropped unsent, so the marker is never held forever).
pub(super) struct OpenGateAfterSending {
    pub(super) outbound: Arc<dyn Outbound>,
    pub(super) to: crate::vocab::SessionSource,
    pub(super) gate: CancellationToken,
}

impl LiveReply for OpenGateAfterSending {
    fn finish(self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        Box::pin(async move {
            let result = self.outbound.deliver(&self.to, reply).await;
            self.gate.cancel();
            result
        })
    }
}

impl Drop for OpenGateAfterSending {
    fn drop(&mut self) {
        self.gate.cancel();
    }
}

/// The answer to /stop: what it stopped (`stopped`), given whether the
/// slot was busy and whether its turn was only sending its answer.
fn stop_text(stopped: StopOutcome, slot_busy: bool, slot_sending: bool) -> &'static str {
    match stopped {
        StopOutcome::StoppedLive => "⏹ Stopped.",
        StopOutcome::ForceUnlocked => "⏹ Stopped (the task was still starting).",
        StopOutcome::NothingRunning if slot_busy => "⏹ Stopped.",
        // The turn is done and only its answer is going out:
        // the rest of it (parts, files) is not sent.
        StopOutcome::NothingRunning if slot_sending => commands::STOPPED_SENDING_TEXT,
        StopOutcome::NothingRunning => "Nothing to stop.",
    }
}

/// The answer to /new (`new_session`) or /reset, with the fresh session's
/// id, and what became of the running task or the answer being sent.
fn rotated_text(new_session: bool, new: &str, stopped_task: bool, slot_sending: bool) -> String {
    let mut text = if new_session {
        format!("✨ Started a fresh session ({new}).")
    } else {
        format!("♻️ Session reset; a fresh session started ({new}).")
    };
    if stopped_task {
        text.push_str(" The running task was stopped.");
    } else if slot_sending {
        text.push_str(" The rest of the last answer is not sent.");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Platform, SessionSource};

    #[test]
    fn stop_says_stopped_for_a_busy_slot_and_stopped_sending_for_an_answer_going_out() {
        use StopOutcome::{ForceUnlocked, NothingRunning, StoppedLive};
        assert_eq!(stop_text(StoppedLive, false, false), "⏹ Stopped.");
        assert_eq!(
            stop_text(ForceUnlocked, false, false),
            "⏹ Stopped (the task was still starting)."
        );
        assert_eq!(stop_text(NothingRunning, true, true), "⏹ Stopped.");
        assert_eq!(
            stop_text(NothingRunning, false, true),
            commands::STOPPED_SENDING_TEXT
        );
        assert_eq!(stop_text(NothingRunning, false, false), "Nothing to stop.");
    }

    #[test]
    fn new_and_reset_say_what_became_of_the_task() {
        assert_eq!(
            rotated_text(true, "s1", true, true),
            "✨ Started a fresh session (s1). The running task was stopped."
        );
        assert_eq!(
            rotated_text(false, "s1", false, true),
            "♻️ Session reset; a fresh session started (s1). The rest of the last answer is not sent."
        );
        assert_eq!(
            rotated_text(true, "s1", false, false),
            "✨ Started a fresh session (s1)."
        );
    }

    /// Delivers nothing, successfully.
    struct Nowhere;

    impl Outbound for Nowhere {
        fn deliver<'a>(
            &'a self,
            _to: &'a SessionSource,
            _reply: Reply,
        ) -> BoxFuture<'a, Result<(), DeliveryError>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn stopping_reply(gate: &CancellationToken) -> OpenGateAfterSending {
        OpenGateAfterSending {
            outbound: Arc::new(Nowhere),
            to: SessionSource::dm(Platform::Telegram, 1),
            gate: gate.clone(),
        }
    }

    #[tokio::test]
    async fn the_stopped_previews_gate_opens_once_the_reply_is_sent() {
        let gate = CancellationToken::new();
        let reply = Box::new(stopping_reply(&gate));
        assert!(!gate.is_cancelled());
        reply.finish(Reply::command("⏹ Stopped.")).await.unwrap();
        assert!(gate.is_cancelled());
    }

    #[test]
    fn the_stopped_previews_gate_opens_when_the_reply_is_dropped_unsent() {
        let gate = CancellationToken::new();
        drop(stopping_reply(&gate));
        assert!(gate.is_cancelled(), "the marker would wait for ever");
    }
}
