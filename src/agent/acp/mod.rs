//! The `acp` backend: any Agent Client Protocol agent (Gemini CLI,
//! OpenCode, Claude Code and Codex through their ACP adapters, …) run as
//! a child, spoken to in JSON-RPC over its stdio with the official SDK
//! (`agent-client-protocol`, client side).
//!
//! Why it looks the way it does:
//!
//! * **One process per active chat slot.** Started on demand by the
//!   slot's first turn, kept for the next ones, ended after `idle_secs`
//!   without a turn and at shutdown. A process that dies is reported to
//!   the turn it served; the next message starts a new one. Each process
//!   is its own group, started through `spawn_leader` and recorded in the
//!   store while it runs ([`process`]).
//! * **The agent keeps the conversation.** A telegate session is one ACP
//!   session (`session/new`), whose id is kept per telegate session in the
//!   store ([`AgentSessions`], as the claude and codex presets keep
//!   theirs), so /new starts a fresh one by construction. After a restart
//!   or an idle exit the session is continued with `session/resume`, or
//!   `session/load` (its replayed history is not shown), when the agent
//!   supports one; otherwise, or if that fails, a fresh session starts
//!   once and the answer says so.
//! * **A turn is one `session/prompt`**: the text, and the files as
//!   content blocks ([`prompt`]). Its updates stream into the preview and
//!   become the answer ([`view`]). Permission requests wait in the
//!   approval gate like every agent's ([`permission`]).
//! * **/stop is instant.** The turn returns at once; a guard then sends
//!   `session/cancel`, which also answers the turn's pending permission
//!   requests `cancelled`, and kills the process group if the agent has
//!   not ended the prompt within `cancel_grace_ms`. That runs in a task of
//!   its own, so it happens even when the runner drops the turn's future.
//! * **Bounded.** Start (`initialize`, `session/new|load|resume`) within
//!   `start_timeout_secs` (then the process is killed and the failure
//!   said), one message at most 16 MiB, the answer up to
//!   `output_cap_bytes`, a bounded number of tool lines.
//! * **Only what telegate implements is offered**: file reads and writes
//!   confined to the chat's workdir ([`fs`]), or nothing; no terminal.
//!
//! This module owns the backend and `[agent.acp]`. It must never run the
//! agent through a shell, reach another chat's process, or signal a group
//! it did not start.

mod config;
mod fs;
mod permission;
mod process;
mod prompt;
mod view;

pub use config::{AcpConfig, AcpPreset};

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, LoadSessionRequest, NewSessionRequest, PromptRequest,
    PromptResponse, ResumeSessionRequest, StopReason,
};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::command::native_sessions::AgentSessions;
use super::command::{workdir, RESUME_LOST_NOTICE};
use super::{Agent, AgentError, AgentReply, TurnRequest};
use crate::agent::AgentTables;
use crate::store::AgentUsage;
use crate::tools::approval::ApprovalGate;
use crate::tools::childgroups::GroupLedger;
use crate::vocab::SessionKey;
use crate::vocab::ALWAYS_STRIPPED_ENV;
use process::{ended_error, protocol_error, within, AgentProcess, Launch, Route};
use view::TurnView;

/// Said once when a session cannot be continued because the agent
/// supports neither `session/resume` nor `session/load`.
pub const NO_LOAD_NOTICE: &str = "ℹ️ This agent cannot continue a conversation after a restart or a pause (it supports neither session/load nor session/resume), so this answer starts a fresh one.";

/// Runs an ACP agent per chat slot. See the module documentation.
pub struct AcpAgent {
    config: AcpConfig,
    gate: ApprovalGate,
    blocked_env: BTreeSet<String>,
    sessions: Arc<AgentSessions>,
    groups: OnceLock<GroupLedger>,
    slots: Mutex<HashMap<SessionKey, Arc<Slot>>>,
    /// Every process started (pruned as they end), for shutdown.
    live: Mutex<Vec<Weak<AgentProcess>>>,
    /// A git worktree per conversation (`worktree`), the agent's workdir.
    worktrees: Option<Arc<crate::worktree::Worktrees>>,
}

/// One chat slot's agent: turns take it one at a time.
#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    process: Option<Arc<AgentProcess>>,
    /// Fires when the slot's last prompt ended (it may outlive its turn
    /// by up to the cancel grace).
    in_flight: Option<CancellationToken>,
}

impl AcpAgent {
    /// An agent running `config`, asking permissions through `gate`.
    /// `secrets_to_strip` names variables the agent must not inherit
    /// (besides [`ALWAYS_STRIPPED_ENV`]).
    pub fn new(config: AcpConfig, gate: ApprovalGate, secrets_to_strip: Vec<String>) -> Self {
        let blocked_env = ALWAYS_STRIPPED_ENV
            .iter()
            .map(|name| name.to_string())
            .chain(secrets_to_strip)
            .filter(|name| !name.is_empty())
            .collect();
        AcpAgent {
            worktrees: config.worktree.clone().map(crate::worktree::Worktrees::new),
            config,
            gate,
            blocked_env,
            sessions: Arc::new(AgentSessions::default()),
            groups: OnceLock::new(),
            slots: Mutex::new(HashMap::new()),
            live: Mutex::new(Vec::new()),
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<SessionKey, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, key: &SessionKey) -> Arc<Slot> {
        self.slots().entry(key.clone()).or_default().clone()
    }

    fn program(&self) -> &str {
        self.config.program()
    }

    /// The sessions' directory (absolute) and, when configured, the
    /// workdir file access is confined to.
    fn workdir_for(&self, turn: &TurnRequest) -> Result<(PathBuf, Option<PathBuf>), AgentError> {
        let Some(dir) = &self.config.workdir else {
            let cwd = std::env::current_dir().map_err(|error| AgentError::Backend {
                user_message: "Could not find telegate's working directory for the agent; set agent.acp.workdir."
                    .to_string(),
                detail: format!("current_dir failed: {error}"),
            })?;
            return Ok((cwd, None));
        };
        let resolved = workdir::resolve(dir, turn.source.chat_id, turn.session_key.as_str())
            .map_err(|error| AgentError::Backend {
                user_message:
                    "Could not create this chat's working directory. Check agent.acp.workdir."
                        .to_string(),
                detail: format!(
                    "creating the workdir from {} failed: {error}",
                    dir.display()
                ),
            })?;
        let absolute = std::path::absolute(&resolved).unwrap_or(resolved);
        if !absolute.is_dir() {
            return Err(AgentError::backend(format!(
                "The agent's working directory does not exist. Check agent.acp.workdir ({}).",
                absolute.display()
            )));
        }
        Ok((absolute.clone(), Some(absolute)))
    }

    /// The slot's running process, or a new one (after the previous
    /// prompt, if it still runs, ended or was killed).
    async fn ready_process(
        &self,
        state: &mut SlotState,
        cwd: PathBuf,
        workdir: Option<PathBuf>,
    ) -> Result<Arc<AgentProcess>, AgentError> {
        if let (Some(previous), Some(process)) = (state.in_flight.take(), &state.process) {
            // The last turn was stopped: its prompt ends, or its process is
            // killed, within the cancel grace.
            let wait = self.config.cancel_grace() + Duration::from_secs(2);
            let ended = process.ended();
            tokio::select! {
                () = previous.cancelled() => {}
                () = ended.cancelled() => {}
                () = tokio::time::sleep(wait) => process.kill(),
            }
        }
        if let Some(process) = state.process.take() {
            if process.is_usable() && process.cwd == cwd {
                state.process = Some(process.clone());
                return Ok(process);
            }
            // Ending (or its workdir changed): the new one starts once it
            // is gone, so two never serve one chat.
            process.stop();
            let ended = process.ended();
            let wait = self.config.kill_grace() + Duration::from_secs(3);
            if tokio::time::timeout(wait, ended.cancelled()).await.is_err() {
                process.kill();
            }
        }
        let process = Launch {
            config: &self.config,
            cwd,
            workdir,
            blocked_env: &self.blocked_env,
            groups: self.groups.get(),
            gate: &self.gate,
        }
        .start()
        .await?;
        process.exit_when_idle(self.config.idle());
        {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            live.retain(|p| p.upgrade().is_some_and(|p| !p.is_ended()));
            live.push(Arc::downgrade(&process));
        }
        state.process = Some(process.clone());
        Ok(process)
    }

    /// The ACP session of the turn's telegate session in `process`:
    /// known there, continued (`session/resume`, `session/load`), or new;
    /// with the notice to show when a session could not be continued.
    async fn session_for(
        &self,
        process: &AgentProcess,
        turn: &TurnRequest,
    ) -> Result<(String, Option<&'static str>), AgentError> {
        let telegate = turn.session_id.as_str();
        if let Some(id) = process.session_of(telegate) {
            return Ok((id, None));
        }
        let backend = self.config.name();
        let program = self.program();
        let limit = self.config.start_timeout();
        let cwd = process.cwd.clone();
        let mut notice = None;
        if let Some(id) = self.sessions.resume_id(telegate).await {
            let caps = &process.caps;
            let continued = if caps.session_capabilities.resume.is_some() {
                let request = ResumeSessionRequest::new(id.clone(), cwd.clone());
                let answer = process.cx.send_request(request).block_task();
                Some(
                    within(process, limit, "session/resume", program, answer)
                        .await
                        .map(drop),
                )
            } else if caps.load_session {
                let request = LoadSessionRequest::new(id.clone(), cwd.clone());
                let answer = process.cx.send_request(request).block_task();
                Some(
                    within(process, limit, "session/load", program, answer)
                        .await
                        .map(drop),
                )
            } else {
                None
            };
            match continued {
                Some(Ok(())) => {
                    tracing::info!(
                        session_id = telegate,
                        agent_session = id,
                        "agent session continued"
                    );
                    process.set_session(telegate, &id);
                    return Ok((id, None));
                }
                Some(Err(error)) if process.is_ended() => return Err(error),
                Some(Err(error)) => {
                    tracing::warn!(
                        session_id = telegate,
                        agent_session = id,
                        ?error,
                        "the agent could not continue its session; starting a fresh one"
                    );
                    notice = Some(RESUME_LOST_NOTICE);
                }
                None => notice = Some(NO_LOAD_NOTICE),
            }
            self.sessions.forget(telegate, backend).await;
        }
        let answer = process
            .cx
            .send_request(NewSessionRequest::new(cwd))
            .block_task();
        let created = within(process, limit, "session/new", program, answer).await?;
        let id = created.session_id.0.to_string();
        process.set_session(telegate, &id);
        process.fresh_session(&id);
        self.sessions.remember(telegate, backend, &id);
        Ok((id, notice))
    }

    async fn run_turn(&self, turn: TurnRequest) -> Result<AgentReply, AgentError> {
        if turn.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        self.config.check_values().map_err(|problem| {
            AgentError::backend(format!("The acp backend is misconfigured: {problem}"))
        })?;
        let (cwd, workdir) = match &self.worktrees {
            Some(worktrees) => {
                let dir = crate::agent::worktree_for(worktrees, &turn, "agent.acp").await?;
                (dir.clone(), Some(dir))
            }
            None => self.workdir_for(&turn)?,
        };
        let slot = self.slot(&turn.session_key);
        let cancel = turn.cancel.clone();
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(AgentError::Cancelled),
            reply = self.turn_in_slot(&slot, &turn, cwd, workdir) => reply,
        }
    }

    async fn turn_in_slot(
        &self,
        slot: &Slot,
        turn: &TurnRequest,
        cwd: PathBuf,
        workdir: Option<PathBuf>,
    ) -> Result<AgentReply, AgentError> {
        let mut state = slot.state.lock().await;
        let process = self.ready_process(&mut state, cwd, workdir).await?;
        process.enter();
        let _leave = Leave(process.clone());
        let (session, notice) = self.session_for(&process, turn).await?;
        let blocks = prompt::blocks(
            &turn.text,
            &crate::media::turn_files().attachments,
            &process.caps.prompt_capabilities,
        )
        .await;
        let route = self.route_for(turn, notice);
        process.routes.insert(&session, route.clone());
        let response = self
            .prompt(&mut state, &process, &session, blocks, &route)
            .await?;
        let (answer, truncated, cost) = {
            let view = route.view();
            (view.answer().to_string(), view.truncated(), view.cost_usd)
        };
        self.record_usage(&process, turn, &session, &response, cost)
            .await;
        Ok(AgentReply::new(reply_text(
            notice, &answer, truncated, &response,
        )))
    }

    /// Where the turn's updates go: its view (showing `notice` at once, so
    /// a turn that is interrupted still said it) and its preview.
    fn route_for(&self, turn: &TurnRequest, notice: Option<&str>) -> Arc<Route> {
        let mut view = TurnView::new(self.config.output_cap_bytes);
        if let Some(notice) = notice {
            view.set_notice(notice);
            turn.progress.set_text(&view.render());
        }
        Arc::new(Route {
            view: Mutex::new(view),
            progress: turn.progress.clone(),
            key: turn.session_key.clone(),
            source: turn.source.clone(),
            ended: CancellationToken::new(),
        })
    }

    /// One `session/prompt` in `session`, awaited in a task of its own
    /// under a [`PromptGuard`] (a turn dropped before the answer cancels
    /// it); ends with the answer, or the protocol error or the process's
    /// end (once the process has settled).
    async fn prompt(
        &self,
        state: &mut SlotState,
        process: &Arc<AgentProcess>,
        session: &str,
        blocks: Vec<ContentBlock>,
        route: &Arc<Route>,
    ) -> Result<PromptResponse, AgentError> {
        let done = CancellationToken::new();
        state.in_flight = Some(done.clone());
        let mut guard = PromptGuard {
            process: process.clone(),
            session: session.to_string(),
            route: route.clone(),
            done: done.clone(),
            grace: self.config.cancel_grace(),
            finished: false,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = process
            .cx
            .send_request(PromptRequest::new(session.to_string(), blocks));
        tokio::spawn(async move {
            let answer = sent.block_task().await;
            done.cancel();
            let _ = tx.send(answer);
        });
        let ended = process.ended();
        let answer = tokio::select! {
            biased;
            answer = rx => answer.ok(),
            () = ended.cancelled() => None,
        };
        guard.finished = true;
        drop(guard);
        match answer {
            Some(Ok(response)) => Ok(response),
            Some(Err(error)) => {
                process.settle().await;
                Err(protocol_error(
                    process,
                    "session/prompt",
                    self.program(),
                    &error,
                ))
            }
            None => {
                process.settle().await;
                Err(ended_error(process, "session/prompt", self.program()))
            }
        }
    }

    async fn record_usage(
        &self,
        process: &AgentProcess,
        turn: &TurnRequest,
        session: &str,
        response: &PromptResponse,
        cost: Option<f64>,
    ) {
        let mut usage = AgentUsage {
            turns: 1,
            cost_usd: cost.map_or(0.0, |total| process.cost_delta(session, total)),
            ..AgentUsage::default()
        };
        if let Some(reported) = &response.usage {
            usage.input_tokens = reported.input_tokens;
            usage.output_tokens = reported.output_tokens;
            usage.cached_input_tokens = reported.cached_read_tokens.unwrap_or(0);
        }
        self.sessions
            .record_usage(turn.session_id.as_str(), self.config.name(), usage)
            .await;
    }

    /// End the processes of the slots `ended` names (their conversation is
    /// over): each slot is taken out, its process stopped (SIGTERM, then
    /// SIGKILL after the kill grace). A slot whose turn still holds it
    /// (being stopped) is waited for within the cancel and kill graces.
    async fn end_matching(&self, ended: &crate::agent::SlotFilter) -> usize {
        let slots: Vec<Arc<Slot>> = {
            let mut slots = self.slots();
            let keys: Vec<SessionKey> = slots.keys().filter(|k| ended(k)).cloned().collect();
            keys.iter().filter_map(|k| slots.remove(k)).collect()
        };
        let wait = self.config.cancel_grace() + self.config.kill_grace();
        let mut stopped = 0;
        for slot in slots {
            let Ok(mut state) = tokio::time::timeout(wait, slot.state.lock()).await else {
                tracing::warn!("an ended slot's agent is still busy; it ends at its idle timeout");
                continue;
            };
            if let Some(process) = state.process.take() {
                process.stop();
                stopped += 1;
            }
        }
        stopped
    }

    async fn stop_all(&self) {
        let processes: Vec<Arc<AgentProcess>> = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .filter_map(|p| p.upgrade())
            .collect();
        for process in &processes {
            process.stop();
        }
        let wait = self.config.kill_grace() + Duration::from_secs(3);
        for process in processes {
            let ended = process.ended();
            if tokio::time::timeout(wait, ended.cancelled()).await.is_err() {
                process.kill();
            }
        }
    }
}

/// The answer: the notice (a session that could not be continued), the
/// agent's text, and why it stopped when that was not the end of its turn.
fn reply_text(
    notice: Option<&str>,
    answer: &str,
    truncated: bool,
    response: &PromptResponse,
) -> String {
    let mut text = String::new();
    if let Some(notice) = notice {
        text.push_str(notice);
        text.push_str("\n\n");
    }
    let answer = answer.trim();
    text.push_str(if answer.is_empty() {
        "(the agent gave no answer)"
    } else {
        answer
    });
    if truncated {
        text.push_str(
            "\n\n(The answer was longer than agent.acp.output_cap_bytes; the rest was left out.)",
        );
    }
    let why = match response.stop_reason {
        StopReason::MaxTokens => {
            Some("⚠️ The answer was cut off: the model reached its output limit.")
        }
        StopReason::MaxTurnRequests => {
            Some("⚠️ The agent stopped: it made too many model requests in one turn.")
        }
        StopReason::Refusal => Some("⚠️ The agent refused to go on."),
        StopReason::Cancelled => Some("⏹ The agent cancelled this turn."),
        _ => None,
    };
    if let Some(why) = why {
        text.push_str("\n\n");
        text.push_str(why);
    }
    text
}

/// Marks the process unused again when the turn ends.
struct Leave(Arc<AgentProcess>);

impl Drop for Leave {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// Ends a turn's prompt however the turn ends: the route goes; a prompt
/// still running is cancelled (`session/cancel`, its permission requests
/// `cancelled`), and its process killed if it has not ended the prompt
/// within the grace. Runs in `Drop`, so a dropped turn is covered too.
struct PromptGuard {
    process: Arc<AgentProcess>,
    session: String,
    route: Arc<Route>,
    done: CancellationToken,
    grace: Duration,
    finished: bool,
}

impl Drop for PromptGuard {
    fn drop(&mut self) {
        self.process.routes.remove(&self.session, &self.route);
        if self.finished || self.done.is_cancelled() || self.process.is_ended() {
            self.route.ended.cancel();
            return;
        }
        tracing::info!(
            pid = self.process.pid,
            session = self.session,
            "cancelling the agent's turn"
        );
        if let Err(error) = self
            .process
            .cx
            .send_notification(CancelNotification::new(self.session.clone()))
        {
            tracing::info!(%error, "session/cancel could not be sent");
        }
        self.route.ended.cancel();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.process.kill();
            return;
        };
        let (process, done, grace) = (self.process.clone(), self.done.clone(), self.grace);
        runtime.spawn(async move {
            let ended = process.ended();
            tokio::select! {
                () = done.cancelled() => {}
                () = ended.cancelled() => {}
                () = tokio::time::sleep(grace) => {
                    tracing::warn!(pid = process.pid, "the agent did not end its turn after session/cancel; killing its process group");
                    process.kill();
                }
            }
        });
    }
}

impl Agent for AcpAgent {
    fn name(&self) -> &str {
        self.config.name()
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(self.run_turn(turn))
    }

    fn worktrees(&self) -> Option<Arc<crate::worktree::Worktrees>> {
        self.worktrees.clone()
    }

    /// The agent keeps the conversation in its own session.
    fn reads_history(&self) -> bool {
        false
    }

    fn attach_store(&self, tables: &AgentTables) {
        self.sessions.attach(&tables.sessions);
        let _ = self
            .groups
            .set(GroupLedger::new(tables.child_groups.clone()));
    }

    fn end_slots<'a>(&'a self, ended: &'a crate::agent::SlotFilter) -> BoxFuture<'a, usize> {
        Box::pin(self.end_matching(ended))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.stop_all())
    }
}

impl Drop for AcpAgent {
    fn drop(&mut self) {
        for process in self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .filter_map(|p| p.upgrade())
        {
            process.kill();
        }
    }
}
