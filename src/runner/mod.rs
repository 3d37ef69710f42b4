//! The runner: turns messages into agent turns and answers the commands.
//!
//! It owns `running_agents` (a pending sentinel while a turn is set up, then
//! the live agent's handle), the start time of each run, the per-slot turn
//! generation and the session table. Each turn:
//!
//! 1. begins a new generation and installs the pending sentinel;
//! 2. promotes itself to a live agent *only if its generation is still
//!    current* (a /stop during set-up wins);
//! 3. runs the agent under its task-local [`TurnIdentity`] and the stall
//!    watchdog;
//! 4. releases the slot only if its generation is still current, and returns
//!    its answer only then. A stale or cancelled turn returns nothing.
//!
//! /stop, /new and /reset cancel the live agent and bump the generation, so a
//! turn that is still unwinding can never write into a newer one.
//! They also deny whatever command waits for the chat's approval.
//!
//! A turn runs against the slot's current session, except an internal event
//! carrying a session override (a background-process wakeup): it runs, with
//! its history and transcript, against the session that started the
//! process. /ps, /kill, /approve and /deny act on the terminal tool's
//! process registry and approval gate; like /status they never touch the
//! running turn, which is exactly what lets /approve reach a turn that waits
//! for it. A bare "yes"/"no" is claimed for a pending approval the same way
//! ([`MessageHandler::claims_while_busy`]).
//!
//! The runner must never send anything itself (it returns replies to the
//! adapter, which owns delivery order) and never hold its lock across an
//! `.await`.

mod commands;
mod sessions;
mod slots;
mod watchdog;

pub use commands::{
    help_text, process_line, ps_text, status_text, KnownCommand, StatusView, COMMANDS,
};
pub use sessions::SessionTable;
pub use slots::{AgentHandle, AgentSlots, InvalidateReason, RunningAgent};
pub use watchdog::{watch_for_stall, Watched};

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::adapter::{DispatchContext, MessageHandler};
use crate::agent::{Agent, AgentError, ChatMessage, Progress, Role, TurnEnd, TurnRequest};
use crate::buttons::{Button, ButtonAction};
use crate::event::{MessageEvent, MessageKind, SessionKey};
use crate::identity::{bind_turn_identity, SessionId, TurnGeneration, TurnIdentity};
use crate::metrics::Metrics;
use crate::reply::{DeliveryError, LiveReply, Outbound, Outgoing, Reply, TurnStart};
use crate::store::{Store, TranscriptEntry};
use crate::tools::approval::{approval_reply, Denial, Lookup};
use crate::tools::approval_prompt::preview;
use crate::tools::authority::{may_decide, who_may_decide};
use crate::tools::process::{ProcessId, ProcessMode, ProcessRecord, Scope};
use crate::tools::TerminalTool;
use futures::future::BoxFuture;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Runner settings.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Cancel a turn that shows no progress for this long (zero: never).
    pub stall_timeout: Duration,
    /// How many earlier transcript entries a turn is given (the backend may
    /// trim further to its budget).
    pub history_max_messages: usize,
    /// Where turns are counted and timed.
    pub metrics: Metrics,
    /// Users who may approve or deny any turn's command (besides the user
    /// whose message started the turn): `[telegram] approvers`.
    pub approvers: Vec<u64>,
    /// Sends the files turns produce (Telegram); `None`: no file output.
    pub files: Option<Arc<crate::media::OutboxFiles>>,
    /// The model the backend uses unless a session chose another (shown
    /// by /model and /status; `None`: the backend has no choice of model).
    pub default_model: Option<String>,
    /// The models /model may switch a session to.
    pub models: Vec<String>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            stall_timeout: Duration::from_secs(300),
            history_max_messages: 200,
            metrics: Metrics::default(),
            approvers: Vec::new(),
            files: None,
            default_model: None,
            models: Vec::new(),
        }
    }
}

/// What an Approve or Deny button press did ([`Runner::press_approval`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalPress {
    /// The request was answered; this is its command.
    Decided(String),
    /// The presser may not decide; the text says who may.
    NotAllowed(String),
    /// That request no longer waits (answered, timed out, replaced).
    NotWaiting,
}

#[derive(Default)]
struct RunnerState {
    slots: AgentSlots,
    sessions: SessionTable,
    /// Slots whose last turn left history out to fit the backend's budget.
    trimmed: HashMap<SessionKey, usize>,
    /// Turns stopped by a command still being answered: the token fires
    /// once the command's reply is out (then the stopped turn's preview
    /// gets its marker).
    reply_gates: HashMap<SessionKey, CancellationToken>,
    /// Sessions that chose a model with /model (also in the store).
    models: HashMap<SessionId, String>,
}

struct RunnerInner {
    state: Mutex<RunnerState>,
    agent: Arc<dyn Agent>,
    outbound: Arc<dyn Outbound>,
    store: Option<Store>,
    /// The terminal tool's processes and approvals, when it is enabled.
    tools: Option<Arc<TerminalTool>>,
    config: RunnerConfig,
}

/// The runner. Cheap to clone; all clones share state.
#[derive(Clone)]
pub struct Runner {
    inner: Arc<RunnerInner>,
}

/// A [`Runner`] that may be gone (see [`Runner::downgrade`]).
#[derive(Clone)]
pub struct WeakRunner {
    inner: std::sync::Weak<RunnerInner>,
}

impl WeakRunner {
    /// The runner, if it still exists.
    pub fn upgrade(&self) -> Option<Runner> {
        self.inner.upgrade().map(|inner| Runner { inner })
    }
}

/// How often a session is tried in the store before the turn gives up.
const SESSION_WRITE_ATTEMPTS: u32 = 3;
/// The pause before the n-th retry is n times this.
const SESSION_RETRY_DELAY: Duration = Duration::from_millis(250);

/// The store could not create or load a chat's session (after retries).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the session store is failing: {0}")]
pub struct SessionUnavailable(pub String);

/// What the chat is told when its session cannot be stored.
pub const STORE_DOWN_TEXT: &str = "⚠️ I cannot save this conversation right now: the session store is failing \
     (the operator sees this in the logs and on /healthz). Your message was not run; please send it again later.";

/// The hint appended to every failure message.
pub const RESET_HINT: &str = "If this keeps happening, send /reset to start a fresh session.";

impl Runner {
    /// A runner answering with `agent` and showing progress through
    /// `outbound`.
    pub fn new(agent: Arc<dyn Agent>, outbound: Arc<dyn Outbound>, config: RunnerConfig) -> Self {
        Runner::build(agent, outbound, None, None, config)
    }

    /// A runner that keeps sessions and transcripts in `store`, so a restart
    /// continues every chat's conversation.
    pub fn with_store(
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
        store: Store,
        config: RunnerConfig,
    ) -> Self {
        Runner::build(agent, outbound, Some(store), None, config)
    }

    /// A runner whose agent uses the terminal tool `tools`: /ps, /kill,
    /// /approve and /deny work on its processes and approvals, and /stop,
    /// /new and /reset deny the chat's pending approvals.
    pub fn with_tools(
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
        store: Option<Store>,
        tools: Arc<TerminalTool>,
        config: RunnerConfig,
    ) -> Self {
        Runner::build(agent, outbound, store, Some(tools), config)
    }

    fn build(
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
        store: Option<Store>,
        tools: Option<Arc<TerminalTool>>,
        config: RunnerConfig,
    ) -> Self {
        if let Some(store) = &store {
            agent.attach_store(store);
        }
        Runner {
            inner: Arc::new(RunnerInner {
                state: Mutex::new(RunnerState::default()),
                agent,
                outbound,
                store,
                tools,
                config,
            }),
        }
    }

    /// A handle that does not keep the runner alive (for parts of the
    /// engine the runner itself owns, such as the tool event forwarder).
    pub fn downgrade(&self) -> WeakRunner {
        WeakRunner {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The terminal tool, when it is enabled.
    pub fn tools(&self) -> Option<&Arc<TerminalTool>> {
        self.inner.tools.as_ref()
    }

    /// The store, if one is configured.
    pub fn store(&self) -> Option<&Store> {
        self.inner.store.as_ref()
    }

    /// The current session of `key`: from memory, else from the store, else
    /// a new one (recorded in the store).
    pub async fn resolve_session(&self, key: &SessionKey) -> Result<SessionId, SessionUnavailable> {
        if let Some(id) = self.state().sessions.get(key) {
            return Ok(id.clone());
        }
        let Some(store) = &self.inner.store else {
            // No store configured: sessions are memory-only by design.
            return Ok(self.state().sessions.get_or_create(key).0);
        };
        // A session that exists only in memory would lose its history at
        // the next restart without anyone noticing: retry, then give up
        // loudly instead (the caller tells the user; /healthz shows it).
        let mut attempt = 0;
        let id = loop {
            match store
                .get_or_create_session(key.as_str(), SessionId::generate().to_string())
                .await
            {
                Ok(record) => {
                    store.write_health().succeeded();
                    break SessionId::new(record.session_id);
                }
                Err(error) => {
                    store.write_health().failed(&error);
                    attempt += 1;
                    if attempt >= SESSION_WRITE_ATTEMPTS {
                        tracing::error!(session_key = %key, %error, attempts = attempt, "cannot create or load the session: the store is failing");
                        return Err(SessionUnavailable(error.to_string()));
                    }
                    tracing::warn!(session_key = %key, %error, attempt, "could not create or load the session; retrying");
                    tokio::time::sleep(SESSION_RETRY_DELAY * attempt).await;
                }
            }
        };
        let mut state = self.state();
        // Whoever filled the table first (a concurrent /new) wins.
        Ok(state.sessions.get(key).cloned().unwrap_or_else(|| {
            state.sessions.set(key, id.clone());
            id
        }))
    }

    fn state(&self) -> MutexGuard<'_, RunnerState> {
        // A panic while holding the lock cannot leave the maps half-updated
        // (every update is a single insert/remove), so poison is ignored.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Start a new generation for `key` (see [`AgentSlots::begin_generation`]).
    pub fn begin_generation(&self, key: &SessionKey) -> TurnGeneration {
        self.state().slots.begin_generation(key)
    }

    /// Make all of `key`'s generations so far stale.
    pub fn invalidate_generation(&self, key: &SessionKey, reason: InvalidateReason) {
        self.state().slots.invalidate_generation(key, reason)
    }

    /// Whether `generation` is current for `key`.
    pub fn is_current(&self, key: &SessionKey, generation: TurnGeneration) -> bool {
        self.state().slots.is_current(key, generation)
    }

    /// Clear `key`'s slot: only if `generation` is current, or always with
    /// `None`. Returns whether it was cleared.
    pub fn release(&self, key: &SessionKey, generation: Option<TurnGeneration>) -> bool {
        self.state().slots.release(key, generation)
    }

    /// Put anything in `key`'s slot (tests and diagnostics).
    pub fn install_running_agent(&self, key: &SessionKey, agent: RunningAgent, since: Instant) {
        self.state().slots.install(key, agent, since)
    }

    /// What runs in `key`'s slot.
    pub fn running_agent(&self, key: &SessionKey) -> Option<RunningAgent> {
        self.state().slots.running_agent(key).cloned()
    }

    /// When `key`'s run started.
    pub fn running_since(&self, key: &SessionKey) -> Option<Instant> {
        self.state().slots.running_since(key)
    }

    /// Occupied slots.
    pub fn running_count(&self) -> usize {
        self.state().slots.running_count()
    }

    /// Slots holding a generation entry (0 when all are idle).
    pub fn generation_entries(&self) -> usize {
        self.state().slots.generation_entries()
    }

    /// The current session id of `key`, if any.
    pub fn current_session(&self, key: &SessionKey) -> Option<SessionId> {
        self.state().sessions.get(key).cloned()
    }

    /// The agent backend's name.
    pub fn backend_name(&self) -> &str {
        self.inner.agent.name()
    }

    async fn dispatch(self, event: MessageEvent, ctx: DispatchContext) -> Option<Outgoing> {
        // Media that was never prepared (no media step in this transport)
        // cannot be read either.
        if event.kind == MessageKind::Unsupported || event.media.needs_preparing() {
            return Some(
                Reply::notice(
                    "Sorry, I can only read text for now; this kind of message is not supported yet.",
                )
                .in_reply_to(event.message_id)
                .into(),
            );
        }
        if ctx.claimed_while_busy {
            // A bare "yes"/"no" claimed for a pending approval: answered
            // here, never started as a turn (the slot is busy).
            let reply =
                self.answer_approval(&ctx.key, &event.source, approval_reply(&event.text), "");
            return Some(reply.in_reply_to(event.message_id).into());
        }
        let retry = event
            .command()
            .is_some_and(|c| KnownCommand::parse(c.name) == Some(KnownCommand::Retry));
        if retry {
            return self.retry(event, ctx).await;
        }
        if let Some(command) = event.command() {
            let reply = match KnownCommand::parse(command.name) {
                // Answers need to know who sends them (see `authority`).
                Some(known @ (KnownCommand::Approve | KnownCommand::Deny)) => self.answer_approval(
                    &ctx.key,
                    &event.source,
                    Some(known == KnownCommand::Approve),
                    command.args,
                ),
                Some(known) => self.command(known, command.args, &ctx).await,
                None => Reply::command(commands::unknown_command_text(command.name)),
            };
            let reply = reply.in_reply_to(event.message_id);
            // A turn this command stopped shows its marker after the reply.
            let gate = self.state().reply_gates.remove(&ctx.key);
            return Some(match gate {
                Some(gate) => Outgoing {
                    reply,
                    live: Some(Box::new(OpenGateAfterSending {
                        outbound: self.inner.outbound.clone(),
                        to: event.source.clone(),
                        gate,
                    })),
                },
                None => reply.into(),
            });
        }
        // One span per turn: every log line of the turn (and of the agent and
        // tools below it) carries the slot, the session and the generation.
        let span = tracing::info_span!(
            "turn",
            session_key = %ctx.key,
            session_id = tracing::field::Empty,
            generation = tracing::field::Empty,
        );
        self.turn(event, ctx).instrument(span).await
    }

    async fn command(&self, command: KnownCommand, args: &str, ctx: &DispatchContext) -> Reply {
        let key = &ctx.key;
        match command {
            KnownCommand::Start => Reply::command(commands::start_text(self.backend_name())),
            KnownCommand::Help => Reply::command(help_text()),
            KnownCommand::Status => {
                let session_id = match self.resolve_session(key).await {
                    Ok(id) => id,
                    Err(_) => return Reply::error(STORE_DOWN_TEXT),
                };
                let history_len = match &self.inner.store {
                    Some(store) => store.transcript_len(session_id.as_str()).await.ok(),
                    None => None,
                };
                let agent_usage = self.agent_usage_line(&session_id).await;
                let model = self.session_model(key, &session_id).await;
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
                };
                Reply::command(status_text(&view))
            }
            KnownCommand::Ps => Reply::command(self.ps(key)),
            KnownCommand::Kill => Reply::command(self.kill(key, args).await),
            // Answered in `dispatch`, which knows the sender; never here.
            KnownCommand::Approve | KnownCommand::Deny => {
                Reply::command("Reply /approve or /deny in the chat that asked.")
            }
            KnownCommand::Undo => self.undo(ctx).await,
            KnownCommand::Model => self.model_command(key, args).await,
            // Handled in `dispatch` (it runs a turn); never reached.
            KnownCommand::Retry => Reply::command(commands::BUSY_HISTORY_TEXT),
            KnownCommand::Stop => {
                self.deny_pending_approvals(key);
                let stopped = self.stop_running(key, InvalidateReason::Stop);
                match stopped {
                    StopOutcome::StoppedLive => Reply::command("⏹ Stopped."),
                    StopOutcome::ForceUnlocked => {
                        Reply::command("⏹ Stopped (the task was still starting).")
                    }
                    StopOutcome::NothingRunning if ctx.slot_busy => Reply::command("⏹ Stopped."),
                    StopOutcome::NothingRunning => Reply::command("Nothing to stop."),
                }
            }
            KnownCommand::New | KnownCommand::Reset => {
                let reason = if command == KnownCommand::New {
                    InvalidateReason::New
                } else {
                    InvalidateReason::Reset
                };
                self.deny_pending_approvals(key);
                let stopped = self.stop_running(key, reason);
                let (old, new) = {
                    let mut state = self.state();
                    state.trimmed.remove(key);
                    state.sessions.rotate(key)
                };
                tracing::info!(session_key = %key, old = ?old, new = %new, ?reason, "session rotated");
                if let Some(store) = &self.inner.store {
                    if let Err(error) = store.rotate_session(key.as_str(), new.to_string()).await {
                        tracing::error!(session_key = %key, %error, "could not record the new session");
                    }
                }
                let mut text = if command == KnownCommand::New {
                    format!("✨ Started a fresh session ({new}).")
                } else {
                    format!("♻️ Session reset; a fresh session started ({new}).")
                };
                if stopped != StopOutcome::NothingRunning || ctx.slot_busy {
                    text.push_str(" The running task was stopped.");
                }
                Reply::command(text)
            }
        }
    }

    /// The CLI agent's usage for /status, once any is recorded.
    async fn agent_usage_line(&self, session_id: &SessionId) -> Option<String> {
        let store = self.inner.store.as_ref()?;
        let total = store.agent_usage_total().await.ok()?;
        if total.turns == 0 {
            return None;
        }
        let session = store.agent_usage(session_id.as_str()).await.ok().flatten();
        Some(commands::usage_text(session.as_ref(), &total))
    }

    /// /ps: the chat's background processes.
    fn ps(&self, key: &SessionKey) -> String {
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
    fn running_process_lines(&self, key: &SessionKey) -> Option<Vec<String>> {
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
    async fn kill(&self, key: &SessionKey, args: &str) -> String {
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
    fn answer_approval(
        &self,
        slot: &SessionKey,
        actor: &crate::event::SessionSource,
        approve: Option<bool>,
        args: &str,
    ) -> Reply {
        let Some(tools) = self.tools() else {
            return Reply::command(commands::NO_TOOLS_TEXT);
        };
        let Some(approve) = approve else {
            return Reply::command("Reply /approve or /deny to the pending command.");
        };
        let ticket = args.split_whitespace().next();
        let pending = match tools.approvals().lookup(slot, actor.chat_id, ticket) {
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
            &self.inner.config.approvers,
        ) {
            tracing::info!(session_key = %pending.key, ticket = pending.ticket, actor = ?actor.user_id, "approval answer refused: not the turn's user nor an approver");
            return Reply::command(format!(
                "🔒 You cannot answer approval {}. {}",
                pending.ticket,
                who_may_decide(pending.started_by_name.as_deref(), pending.started_by)
            ));
        }
        match tools
            .approvals()
            .answer_ticket(&pending.key, &pending.ticket, approve)
        {
            Some(command) if approve => Reply::command(format!(
                "✅ Approved {}, running:\n{}",
                pending.ticket,
                preview(&command)
            )),
            Some(command) => Reply::command(format!(
                "🚫 Denied {}, not running:\n{}",
                pending.ticket,
                preview(&command)
            )),
            None => Reply::command(format!(
                "Approval {} is not waiting any more; nothing was run.",
                pending.ticket
            )),
        }
    }

    /// /retry: take the last exchange out of the history and run its user
    /// message again as this command's turn (so its answer replaces the
    /// old one). While a task runs it only says so.
    async fn retry(self, event: MessageEvent, ctx: DispatchContext) -> Option<Outgoing> {
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
        let undone = match store.undo_last_exchange(session_id.as_str()).await {
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
        self.turn(again, ctx).instrument(span).await
    }

    /// /undo: take the last exchange out of the history (kept in the
    /// transcript, marked) and say what it was.
    async fn undo(&self, ctx: &DispatchContext) -> Reply {
        if ctx.slot_busy {
            return Reply::command(commands::BUSY_HISTORY_TEXT);
        }
        let Some(store) = &self.inner.store else {
            return Reply::command("Nothing to undo: this chat keeps no history.");
        };
        let Ok(session_id) = self.resolve_session(&ctx.key).await else {
            return Reply::error(STORE_DOWN_TEXT);
        };
        match store.undo_last_exchange(session_id.as_str()).await {
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
    async fn session_model(&self, key: &SessionKey, session_id: &SessionId) -> Option<String> {
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
    async fn model_command(&self, key: &SessionKey, args: &str) -> Reply {
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
        actor: &crate::event::SessionSource,
        ticket: &str,
        approve: bool,
    ) -> ApprovalPress {
        let Some(tools) = self.tools() else {
            return ApprovalPress::NotWaiting;
        };
        let slot = SessionKey::from_raw("");
        let pending = match tools.approvals().lookup(&slot, actor.chat_id, Some(ticket)) {
            Lookup::Found(pending) => pending,
            _ => return ApprovalPress::NotWaiting,
        };
        if !may_decide(
            pending.started_by,
            actor.user_id,
            &self.inner.config.approvers,
        ) {
            tracing::info!(session_key = %pending.key, ticket = pending.ticket, actor = ?actor.user_id, "approval button refused: not the turn's user nor an approver");
            return ApprovalPress::NotAllowed(who_may_decide(
                pending.started_by_name.as_deref(),
                pending.started_by,
            ));
        }
        match tools
            .approvals()
            .answer_ticket(&pending.key, &pending.ticket, approve)
        {
            Some(command) => ApprovalPress::Decided(command),
            None => ApprovalPress::NotWaiting,
        }
    }

    /// /stop, /new and /reset refuse whatever waits for approval.
    fn deny_pending_approvals(&self, key: &SessionKey) {
        if let Some(tools) = self.tools() {
            if tools.approvals().deny_all(key, Denial::Stopped) > 0 {
                tracing::info!(session_key = %key, "pending approval denied by a control command");
            }
        }
    }

    fn stop_running(&self, key: &SessionKey, reason: InvalidateReason) -> StopOutcome {
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
        outcome
    }

    async fn turn(self, event: MessageEvent, ctx: DispatchContext) -> Option<Outgoing> {
        let key = ctx.key.clone();
        let generation = {
            let mut state = self.state();
            let generation = state.slots.begin_generation(&key);
            state.slots.install_pending(&key, Instant::now());
            generation
        };
        tracing::Span::current().record("generation", tracing::field::display(generation));
        // Set-up may await the store; whatever happens, the pending sentinel
        // must not outlive this future.
        let mut slot = SlotRelease {
            runner: &self,
            key: &key,
            generation,
            armed: true,
            interrupted: None,
        };
        // A wakeup runs against the session that started its process, even
        // if the chat has moved on (/new) since; everything else runs
        // against the slot's current session.
        let session_id = match event.override_session() {
            Some(session) => session.clone(),
            None => match self.resolve_session(&key).await {
                Ok(id) => id,
                Err(_) => {
                    return Some(
                        Reply::error(STORE_DOWN_TEXT)
                            .in_reply_to(event.message_id)
                            .into(),
                    )
                }
            },
        };
        tracing::Span::current().record("session_id", tracing::field::display(&session_id));
        let mut history = self.load_history(&session_id).await;
        // A message replayed after a crash may already be the transcript's
        // last entry: keep it once, and not also in the history.
        let already_recorded = event.resumed
            && history
                .last()
                .is_some_and(|m| m.role == Role::User && m.content == event.text);
        if already_recorded {
            history.pop();
        } else {
            self.record(&session_id, vec![user_entry(&event)]).await;
        }

        let cancel = ctx.interrupt.child_token();
        let progress = Progress::new();
        let handle = AgentHandle {
            generation,
            cancel: cancel.clone(),
            progress: progress.clone(),
        };
        if !self.state().slots.promote(&key, handle) {
            tracing::debug!(session_key = %key, %generation, "turn went stale during set-up");
            return None;
        }
        slot.interrupted = Some((session_id.clone(), progress.clone()));
        let metrics = &self.inner.config.metrics;
        metrics.turns_started.inc();
        let started = Instant::now();

        let mut live = self.inner.outbound.turn_started_with(
            &TurnStart {
                to: &event.source,
                answering: event.message_id,
                generation: generation.0,
            },
            progress.watch(),
        );
        let model = self.session_model(&key, &session_id).await;
        let identity = TurnIdentity {
            session_key: key.clone(),
            session_id: session_id.clone(),
            generation,
            source: event.source.clone(),
        };
        let message_id = event.message_id;
        let turn_files = self.turn_files(&event).await;
        let reply_source = event.source.clone();
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
        let run = AssertUnwindSafe(self.inner.agent.run(request)).catch_unwind();
        let watched = bind_turn_identity(
            identity,
            crate::media::with_turn_files(
                turn_files.clone(),
                watch_for_stall(run, &progress, &cancel, self.inner.config.stall_timeout),
            ),
        )
        .await;

        if ctx.interrupt.is_cancelled() {
            // A newer message interrupted it (a /stop before wins).
            let now = CancellationToken::new();
            now.cancel();
            progress.mark_ended(TurnEnd::Interrupted, now);
        }
        // Only a turn that is still current may release the slot and answer.
        slot.armed = false;
        let current = self.state().slots.release(&key, Some(generation));
        let finished_cleanly =
            matches!(&watched, Watched::Finished(Ok(Ok(_)))) && !cancel.is_cancelled();
        if !current || !finished_cleanly {
            // Stopped, interrupted, stalled, failed or stale: the transcript
            // keeps what the user saw so far, marked as interrupted.
            let partial = progress.snapshot();
            if !partial.is_empty() || !current {
                self.record(&session_id, vec![interrupted_entry(partial)])
                    .await;
            }
        }
        metrics.turn_duration.observe(started.elapsed());
        if !current {
            tracing::debug!(session_key = %key, %generation, "stale turn result discarded");
            metrics.generation_discards.inc();
            metrics.turns_cancelled.inc();
            return None;
        }
        let reply = match watched {
            Watched::Stalled => {
                tracing::warn!(session_key = %key, "turn stalled; cancelled by the watchdog");
                metrics.watchdog_cancels.inc();
                metrics.turns_cancelled.inc();
                Reply::error(format!(
                    "⏱ The task showed no progress for {} and was stopped. Send your message again, or /reset to start fresh.",
                    commands::human_duration(self.inner.config.stall_timeout)
                ))
            }
            Watched::Finished(_) if cancel.is_cancelled() => {
                // Interrupted (a newer message) or stopped: never answered.
                metrics.turns_cancelled.inc();
                return None;
            }
            Watched::Finished(Ok(Ok(answer))) => {
                metrics.turns_finished.inc();
                {
                    let mut state = self.state();
                    if answer.history_trimmed > 0 {
                        state.trimmed.insert(key.clone(), answer.history_trimmed);
                    } else {
                        state.trimmed.remove(&key);
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
                self.record(&session_id, entries).await;
                // Files the program left in its outbox follow the answer.
                live = crate::media::outbox::files_after_answer(
                    live,
                    &turn_files,
                    self.inner.outbound.clone(),
                    reply_source,
                );
                Reply::answer(answer.text)
            }
            Watched::Finished(Ok(Err(AgentError::Cancelled))) => {
                metrics.turns_cancelled.inc();
                return None;
            }
            Watched::Finished(Ok(Err(AgentError::Backend {
                user_message,
                detail,
            }))) => {
                metrics.turns_failed.inc();
                tracing::warn!(session_key = %key, %detail, "turn failed");
                Reply::error(format!("⚠️ {user_message}\n{RESET_HINT}"))
            }
            Watched::Finished(Err(panic)) => {
                metrics.turns_failed.inc();
                tracing::error!(session_key = %key, panic = %panic_message(&panic), "agent panicked");
                Reply::error(format!(
                    "⚠️ Something went wrong inside the agent.\n{RESET_HINT}"
                ))
            }
        };
        Some(Outgoing {
            reply: reply.in_reply_to(message_id),
            live,
        })
    }

    /// The files bound around a turn: the event's attachments and, with
    /// file output, a fresh outbox directory and the sender.
    async fn turn_files(&self, event: &MessageEvent) -> crate::media::TurnFiles {
        let mut files = crate::media::TurnFiles {
            attachments: event.media.attachments.clone(),
            answering: event.message_id,
            ..Default::default()
        };
        if let Some(sender) = &self.inner.config.files {
            files.outbox = sender
                .outbox_dir(event.source.chat_id, event.message_id)
                .await;
            files.sender = Some(sender.clone());
        }
        files
    }

    async fn load_history(&self, session_id: &SessionId) -> Vec<ChatMessage> {
        let Some(store) = &self.inner.store else {
            return Vec::new();
        };
        let limit = self.inner.config.history_max_messages;
        match store.load_history(session_id.as_str(), Some(limit)).await {
            Ok(entries) => entries.iter().map(TranscriptEntry::to_message).collect(),
            Err(error) => {
                tracing::error!(%session_id, %error, "could not load the history; the turn runs without it");
                Vec::new()
            }
        }
    }

    async fn record(&self, session_id: &SessionId, entries: Vec<TranscriptEntry>) {
        if let Some(store) = &self.inner.store {
            match store.append_many(session_id.as_str(), entries).await {
                Ok(_) => store.write_health().succeeded(),
                Err(error) => {
                    store.write_health().failed(&error);
                    tracing::error!(%session_id, %error, "could not record the transcript");
                }
            }
        }
    }
}

/// A command reply that stopped a turn: delivered like any reply, then opens
/// the gate the stopped turn's preview waits on for its marker (also if it
/// is dropped unsent, so the marker is never held forever).
struct OpenGateAfterSending {
    outbound: Arc<dyn Outbound>,
    to: crate::event::SessionSource,
    gate: CancellationToken,
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

fn user_entry(event: &MessageEvent) -> TranscriptEntry {
    let mut entry = TranscriptEntry::user(event.text.clone());
    if event.internal {
        entry.name = Some("telegate".to_string());
    }
    entry
}

fn interrupted_entry(partial: String) -> TranscriptEntry {
    let mut entry = TranscriptEntry::assistant(partial);
    entry.interrupted = true;
    entry
}

/// Releases a turn's slot (generation-checked) if the turn's future is
/// dropped before it could do so itself, and records the interruption in the
/// transcript.
struct SlotRelease<'a> {
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
                    if let Err(error) = store.append(session_id.as_str(), entry).await {
                        tracing::error!(%session_id, %error, "could not record an interrupted turn");
                    }
                });
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopOutcome {
    StoppedLive,
    ForceUnlocked,
    NothingRunning,
}

/// The text of a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

impl MessageHandler for Runner {
    fn handle(
        &self,
        event: MessageEvent,
        ctx: DispatchContext,
    ) -> BoxFuture<'static, Option<Outgoing>> {
        Box::pin(self.clone().dispatch(event, ctx))
    }

    /// A bare yes/no while the chat's turn waits for an approval answers it.
    /// Only from a user who may answer it: anyone else's "yes" is an
    /// ordinary message.
    fn claims_while_busy(&self, key: &SessionKey, event: &MessageEvent) -> bool {
        self.tools().is_some_and(|tools| {
            approval_reply(&event.text).is_some()
                && tools.approvals().pending_view(key).is_some_and(|pending| {
                    may_decide(
                        pending.started_by,
                        event.source.user_id,
                        &self.inner.config.approvers,
                    )
                })
        })
    }
}

/// A process as one /ps or /status line.
fn line_of(record: &ProcessRecord) -> String {
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
