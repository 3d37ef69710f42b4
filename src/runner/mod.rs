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
//! process. /ps and /kill act on the terminal tool's process registry,
//! /approve and /deny on the approval gate (the terminal tool's, or the
//! one an agent backend asks through); like /status they never touch the
//! running turn, which is exactly what lets /approve reach a turn that waits
//! for it. A bare "yes"/"no" is claimed for a pending approval the same way
//! ([`MessageHandler::claims_while_busy`]).
//!
//! The job commands (/jobs, /at, /in, /every, /cron, /pause, /resume,
//! /unschedule, /timezone) are answered the same way, mid-turn too
//! ([`crate::schedule::Jobs`]); a scheduled run arrives as an internal
//! event whose message id is a run id: a reminder is answered with its
//! text, a prompt runs as a turn and its outcome is recorded on the job.
//!
//! The runner must never send anything itself (it returns replies to the
//! adapter, which owns delivery order) and never hold its lock across an
//! `.await`.

mod budget;
mod commands;
mod controls;
mod conversations;
pub mod generations;

mod jobs;
mod outcome;
mod session_table;
mod slots;
mod team;
mod turn;
mod voice;
mod watchdog;
mod worktrees;

pub use commands::{help_text, process_line, ps_text, status_text, StatusView};
pub use session_table::SessionTable;
pub use slots::{AgentHandle, AgentSlots, InvalidateReason, RunningAgent};
pub use watchdog::{watch_for_stall, Watched};

use controls::OpenGateAfterSending;
use generations::GenerationLease;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::adapter::{DispatchContext, MessageHandler};
use crate::agent::Agent;
use crate::agent::AgentTables;
use crate::metrics::Metrics;
use crate::reply::{Outbound, Outgoing, Reply};
use crate::store::{Approvals, Generations, Jobs, Processes, Sessions, Transcripts, Usage};
use crate::tools::approval::{approval_reply, ApprovalGate, Decided};
use crate::tools::authority::may_decide;
use crate::tools::TerminalTool;
use crate::vocab::KnownCommand;
use crate::vocab::{MessageEvent, MessageKind, SessionId, SessionKey, TurnGeneration};
use futures::future::BoxFuture;
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
    /// Scheduled jobs (`/jobs`, `/at`…, scheduled runs); `None`: the
    /// commands say scheduling is not available here.
    pub jobs: Option<crate::schedule::Jobs>,
    /// Who may use the bot and as what (Telegram): the team commands, and
    /// the owner and admins deciding about anyone's turns. `None`: only
    /// `approvers` decide for others.
    pub access: Option<crate::access::Access>,
    /// Per-user budgets, checked before each turn (with a store).
    pub limits: crate::limits::Limits,
    /// Answers spoken as voice notes (`[media.speech]`), per `/voice`.
    pub speech: Option<Arc<crate::media::speech::Speaker>>,
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
            jobs: None,
            access: None,
            limits: crate::limits::Limits::default(),
            speech: None,
        }
    }
}

/// What an approval button press did ([`Runner::press_approval`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalPress {
    /// The request was answered: what it asked, what was chosen.
    Decided(Decided),
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
    store: Option<RunnerTables>,
    /// The block of generations reserved in the store (with a store).
    generations: Option<Arc<GenerationLease>>,
    /// The terminal tool's processes, when it is enabled.
    tools: Option<Arc<TerminalTool>>,
    /// The approval gate every tool and agent asks through (the terminal
    /// tool's, or the one of MCP tools, Claude Code's permission prompts
    /// or an ACP agent's permission requests).
    approvals: Option<ApprovalGate>,
    config: RunnerConfig,
    /// The adapter in front of this runner (set once by the engine), for
    /// what reaches past the slot a command came from: /revoke drops the
    /// revoked user's waiting messages everywhere.
    adapter: std::sync::OnceLock<crate::adapter::WeakAdapter>,
}

/// What a [`Runner`] is built from.
pub struct RunnerParts {
    /// The agent answering the turns.
    pub agent: Arc<dyn Agent>,
    /// Where progress and replies go.
    pub outbound: Arc<dyn Outbound>,
    /// Sessions and transcripts, so a restart continues every chat's
    /// conversation (`None`: memory only).
    pub store: Option<RunnerTables>,
    /// The terminal tool the agent calls: /ps, /kill, /approve and /deny
    /// work on its processes and approvals, and /stop, /new and /reset
    /// deny the chat's pending approvals (its gate is the runner's).
    pub tools: Option<Arc<TerminalTool>>,
    /// Without a terminal tool: the gate the agent asks approvals through
    /// (an ACP agent's permission requests, MCP tools alone, Claude Code's
    /// permission prompts); /approve, /deny and the buttons answer them,
    /// /stop, /new and /reset deny them.
    pub approvals: Option<ApprovalGate>,
    /// The runner's settings.
    pub config: RunnerConfig,
}

impl RunnerParts {
    /// An agent and an outbound; no store, no tools, default settings (the
    /// rest of a struct literal: `..RunnerParts::new(agent, outbound)`).
    pub fn new(agent: Arc<dyn Agent>, outbound: Arc<dyn Outbound>) -> Self {
        RunnerParts {
            agent,
            outbound,
            store: None,
            tools: None,
            approvals: None,
            config: RunnerConfig::default(),
        }
    }
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

impl crate::schedule::SpendGate for WeakRunner {
    fn refusal<'a>(
        &'a self,
        owner: &'a crate::vocab::SessionSource,
    ) -> futures::future::BoxFuture<'a, Option<String>> {
        Box::pin(async move { self.upgrade()?.over_budget(owner).await })
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

/// The store tables the runner touches (and the engine around it): chats'
/// sessions and transcripts, turn generations, per-user usage, jobs and
/// the chats' time zones, approvals, the agent's own tables and the
/// terminal's running processes. Built from the one store by the wiring.
#[derive(Clone, Debug)]
pub struct RunnerTables {
    /// The current session per chat key.
    pub sessions: Sessions,
    /// Every session's messages.
    pub transcripts: Transcripts,
    /// Turn generations reserved in blocks.
    pub generations: Generations,
    /// Per-user turn usage and settings.
    pub usage: Usage,
    /// Scheduled jobs and the chats' time zones.
    pub jobs: Jobs,
    /// Approval requests and who decided.
    pub approvals: Approvals,
    /// What the agent keeps: its own session ids, its child groups.
    pub agent: AgentTables,
    /// The terminal's running processes, so a restart tells whose were lost.
    pub processes: Processes,
}

impl Runner {
    /// The runner from its parts (see [`RunnerParts`]): the one way to
    /// build one.
    pub fn new(parts: RunnerParts) -> Self {
        let RunnerParts {
            agent,
            outbound,
            store,
            tools,
            approvals,
            config,
        } = parts;
        // A terminal tool brings its own gate; every other tool asks
        // through the one given.
        let approvals = match &tools {
            Some(tools) => Some(tools.approvals().clone()),
            None => approvals,
        };
        if let (Some(store), Some(gate)) = (&store, &approvals) {
            gate.record_in(&store.approvals);
        }
        if let Some(store) = &store {
            agent.attach_store(&store.agent);
        }
        let runner = Runner {
            inner: Arc::new(RunnerInner {
                state: Mutex::new(RunnerState::default()),
                agent,
                outbound,
                generations: store
                    .as_ref()
                    .map(|s| GenerationLease::new(s.generations.clone())),
                store,
                tools,
                approvals,
                config,
                adapter: std::sync::OnceLock::new(),
            }),
        };
        // A prompt job spends its creator's budget: not made over it.
        if let Some(jobs) = runner.jobs() {
            jobs.set_spend_gate(Arc::new(runner.downgrade()));
        }
        runner
    }

    /// Let this runner reach the adapter in front of it (the engine calls
    /// this once, right after building both; later calls change nothing).
    pub fn attach_adapter(&self, adapter: crate::adapter::WeakAdapter) {
        let _ = self.inner.adapter.set(adapter);
    }

    /// The adapter in front of this runner, if attached and alive.
    pub(super) fn adapter(&self) -> Option<crate::adapter::Adapter> {
        self.inner.adapter.get().and_then(|a| a.upgrade())
    }

    /// A handle that does not keep the runner alive (for parts of the
    /// engine the runner itself owns, such as the tool event forwarder).
    pub fn downgrade(&self) -> WeakRunner {
        WeakRunner {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The conversations of the slots `ended` names are over: the agent
    /// ends what it keeps running for them ([`Agent::end_slots`]).
    pub async fn end_agent_slots(&self, ended: &crate::agent::SlotFilter) -> usize {
        self.inner.agent.end_slots(ended).await
    }

    /// The terminal tool, when it is enabled.
    pub fn tools(&self) -> Option<&Arc<TerminalTool>> {
        self.inner.tools.as_ref()
    }

    /// The approval gate, when some tool asks through one.
    pub fn approvals(&self) -> Option<&ApprovalGate> {
        self.inner.approvals.as_ref()
    }

    /// The store's tables, if a store is configured.
    pub fn store(&self) -> Option<&RunnerTables> {
        self.inner.store.as_ref()
    }

    /// The current session of `key`: from memory, else from the store, else
    /// a new one (recorded in the store).
    pub async fn resolve_session(&self, key: &SessionKey) -> Result<SessionId, SessionUnavailable> {
        if let Some(id) = self.state().sessions.get(key) {
            return Ok(id);
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
                .sessions
                .get_or_create_session(key.as_str(), SessionId::generate().to_string())
                .await
            {
                Ok(record) => break SessionId::new(record.session_id),
                // The store reports the failure to /healthz itself.
                Err(error) => {
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
        Ok(state.sessions.get(key).unwrap_or_else(|| {
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
        let generation = self.state().slots.begin_generation(key);
        self.keep_generations_reserved();
        generation
    }

    /// Make all of `key`'s generations so far stale.
    pub fn invalidate_generation(&self, key: &SessionKey, reason: InvalidateReason) {
        self.state().slots.invalidate_generation(key, reason);
        self.keep_generations_reserved();
    }

    /// At start, before any turn: reserve this process's generations in
    /// the store, above every earlier process's, so a Stop button or a
    /// draft from before a restart names no turn of this one (see
    /// [`generations`]). Without a store there is nothing to do.
    pub async fn reserve_generations(&self) -> Result<(), crate::store::StoreError> {
        match &self.inner.generations {
            Some(lease) => lease.reserve().await,
            None => Ok(()),
        }
    }

    /// After handing out generations: keep the reservation ahead of them.
    fn keep_generations_reserved(&self) {
        if let Some(lease) = &self.inner.generations {
            lease.keep_ahead();
        }
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
        self.state().sessions.get(key)
    }

    /// At shutdown, after the turns: let the backend end what it keeps
    /// running between turns (bounded by the backend).
    pub async fn shutdown_agent(&self) {
        self.inner.agent.shutdown().await;
    }

    /// The agent backend's name.
    pub fn backend_name(&self) -> &str {
        self.inner.agent.name()
    }

    /// Who may use the bot and as what, when teams are on (Telegram).
    pub fn access(&self) -> Option<&crate::access::Access> {
        self.inner.config.access.as_ref()
    }

    /// Who decides about anyone's turn: the owner and admins (with teams,
    /// the config's approvers among them), else the configured approvers.
    pub fn deciders(&self) -> &dyn crate::tools::authority::Deciders {
        match &self.inner.config.access {
            Some(access) => access,
            None => &self.inner.config.approvers,
        }
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
        if let Some((job, _due)) = event
            .message_id
            .filter(|_| event.internal)
            .and_then(crate::schedule::run_of)
        {
            return self.scheduled_run(event, ctx, job).await;
        }
        let retry = event.command().is_some_and(|c| c.is(KnownCommand::Retry));
        if retry {
            return self.retry(event, ctx).await;
        }
        if let Some(command) = event.command() {
            let reply = self.command_reply(command, &event, &ctx).await;
            return Some(self.after_reply_gate(reply.in_reply_to(event.message_id), &event, &ctx));
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

    /// The answer to a slash command.
    async fn command_reply(
        &self,
        command: crate::vocab::Command<'_>,
        event: &MessageEvent,
        ctx: &DispatchContext,
    ) -> Reply {
        match command.known {
            // Answers need to know who sends them (see `authority`).
            Some(known @ (KnownCommand::Approve | KnownCommand::Deny)) => self.answer_approval(
                &ctx.key,
                &event.source,
                Some(known == KnownCommand::Approve),
                command.args,
            ),
            // /resume ID names a job of this chat or, failing that,
            // a conversation (`resumes_job`).
            Some(KnownCommand::Resume) if self.resumes_job(command.args, event).await => {
                self.job_command(KnownCommand::Resume, command.args, &event.source, &ctx.key)
                    .await
            }
            Some(known) if known.is_job_command() && known != KnownCommand::Resume => {
                self.job_command(known, command.args, &event.source, &ctx.key)
                    .await
            }
            // So do the team commands, /voice and /resume.
            Some(known) if team::answers(known) => {
                self.team_command(known, command.args, event, ctx).await
            }
            Some(known) => {
                // A message still being prepared that this command
                // stopped kept the slot busy, as far as its user can tell.
                let ctx = DispatchContext {
                    slot_busy: ctx.slot_busy || event.media.stopped > 0,
                    ..ctx.clone()
                };
                self.command(known, command.args, &ctx, &event.source).await
            }
            None => Reply::command(commands::unknown_command_text(command.name)),
        }
    }

    /// A command's reply; a turn this command stopped shows its marker
    /// after it.
    fn after_reply_gate(
        &self,
        reply: Reply,
        event: &MessageEvent,
        ctx: &DispatchContext,
    ) -> Outgoing {
        let gate = self.state().reply_gates.remove(&ctx.key);
        match gate {
            Some(gate) => Outgoing {
                reply,
                live: Some(Box::new(OpenGateAfterSending {
                    outbound: self.inner.outbound.clone(),
                    to: event.source.clone(),
                    gate,
                })),
            },
            None => reply.into(),
        }
    }
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
        self.approvals().is_some_and(|approvals| {
            approval_reply(&event.text).is_some()
                && approvals.pending_view(key).is_some_and(|pending| {
                    may_decide(
                        pending.started_by,
                        event.source.user_id,
                        event.source.chat_id,
                        self.deciders(),
                    )
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn a_panic_reads_as_its_message() {
        let text = std::panic::catch_unwind(|| panic!("the agent exploded")).unwrap_err();
        assert_eq!(panic_message(&*text), "the agent exploded");
        let formatted = std::panic::catch_unwind(|| panic!("failed at step {}", 3)).unwrap_err();
        assert_eq!(panic_message(&*formatted), "failed at step 3");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(&*other), "unknown panic");
    }
}
