//! Agent backends: what actually answers a message: `echo`, `openai`,
//! `command` (a CLI run per turn), `acp` (an Agent Client Protocol agent
//! kept running per chat).
//!
//! The runner hands an agent one [`TurnRequest`] per turn and awaits its
//! [`AgentReply`]. The agent reports partial output through the turn's
//! [`Progress`] (which feeds streaming edits and the stall watchdog) and must
//! stop promptly when the turn's [`CancellationToken`] fires: /stop, /new,
//! /reset, an interrupting message and the watchdog all end a turn that way.
//!
//! This module owns the [`Agent`] trait and the per-turn types. An agent must
//! never decide whether its output is delivered (a stale turn's reply is
//! discarded by the runner), never touch another session, and never read the
//! current session from anywhere but its [`TurnRequest`] or the task-local
//! turn identity.

pub mod acp;
pub mod command;
mod echo;
pub mod openai;

pub use acp::{AcpAgent, AcpConfig, AcpPreset};
pub use command::{CommandAgent, CommandConfig, HistoryMode, Preset, Protocol};
pub use echo::EchoAgent;
pub use openai::{OpenAiAgent, OpenAiConfig};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::store::{AgentSessions, ChildGroups};
use crate::vocab::{ChatMessage, Progress, SessionId, SessionKey, SessionSource, TurnGeneration};

/// One turn's input.
#[derive(Debug)]
pub struct TurnRequest {
    /// The chat slot.
    pub session_key: SessionKey,
    /// The conversation this turn belongs to.
    pub session_id: SessionId,
    /// This turn's generation.
    pub generation: TurnGeneration,
    /// Where the message came from.
    pub source: SessionSource,
    /// The user's text (or the wakeup's description for internal turns).
    pub text: String,
    /// The session's earlier conversation, oldest first (without the system
    /// prompt and without `text`), as far as the runner keeps it.
    pub history: Vec<ChatMessage>,
    /// True for internal turns (background-process wakeups).
    pub internal: bool,
    /// Fires when the turn must stop. Agents must return promptly after it.
    pub cancel: CancellationToken,
    /// Where partial output and liveness go.
    pub progress: Progress,
    /// The model the session chose with /model (`None`: the configured
    /// one). Backends without a choice of model ignore it.
    pub model: Option<String>,
}

/// A finished turn's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentReply {
    /// The final text (Markdown), delivered exactly once if the turn is still
    /// current.
    pub text: String,
    /// What the turn adds to the transcript after the user's message: tool
    /// calls and results, then the final assistant message. Empty means
    /// "just the final text as an assistant message".
    pub transcript: Vec<ChatMessage>,
    /// How many of the oldest history messages the backend left out to fit
    /// its budget (shown by /status).
    pub history_trimmed: usize,
}

impl AgentReply {
    /// A reply with the given text.
    pub fn new(text: impl Into<String>) -> Self {
        AgentReply {
            text: text.into(),
            transcript: Vec::new(),
            history_trimmed: 0,
        }
    }
}

/// Why a turn produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The turn's token fired and the agent stopped.
    #[error("the turn was cancelled")]
    Cancelled,
    /// The backend failed. `user_message` is short and safe to show in the
    /// chat (what is wrong, what to check); `detail` goes to the log only.
    #[error("{user_message}")]
    Backend {
        /// Shown to the user.
        user_message: String,
        /// Logged, never shown (may contain response bodies).
        detail: String,
    },
    /// The backend cannot answer until its owner changes how it is set up
    /// (not logged in, a key refused, a model that does not exist):
    /// starting over (/reset) cannot help, so the user is not told to.
    #[error("{user_message}")]
    Setup {
        /// Shown to the user: what is wrong, and that the owner fixes it.
        user_message: String,
        /// Logged, never shown.
        detail: String,
    },
}

impl AgentError {
    /// A backend failure whose message is fine to show as is.
    pub fn backend(user_message: impl Into<String>) -> Self {
        let user_message = user_message.into();
        AgentError::Backend {
            detail: user_message.clone(),
            user_message,
        }
    }
}

/// The store tables an agent keeps: its own session ids and usage per
/// telegate session, and the child process groups it starts (so a
/// restart kills what a crash left running).
#[derive(Clone, Debug)]
pub struct AgentTables {
    /// The agent's own session id and usage per telegate session.
    pub sessions: AgentSessions,
    /// Every child process group started.
    pub child_groups: ChildGroups,
}

/// Something that answers turns: an LLM with tools, a CLI run per turn, or a
/// test double.
pub trait Agent: Send + Sync + 'static {
    /// A short name for /status and logs (`openai`, `command`, `echo`).
    fn name(&self) -> &str;

    /// Run one turn. Must return soon after `turn.cancel` fires (returning
    /// [`AgentError::Cancelled`] or anything else: a cancelled turn's result
    /// is discarded either way). The future may also simply be dropped at
    /// any await point (that is how /stop usually ends a turn), so anything
    /// the turn owns outside its future (child processes, connections) must
    /// be released by a drop guard, not by code after an `.await`.
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>>;

    /// The store the runner keeps sessions in, handed over once when the
    /// runner is built. A backend that remembers something per session
    /// (a CLI agent's own session id, its usage) keeps it there, keyed by
    /// the turn's session id. Default: not needed.
    fn attach_store(&self, _tables: &AgentTables) {}

    /// True if the backend answers from the history the runner hands it
    /// ([`TurnRequest::history`]: an LLM API, a program fed the
    /// transcript). A backend that keeps its conversation itself (a CLI
    /// agent resuming its own session, an ACP agent) says no: its turns
    /// skip reading the transcript, and the user's message is recorded
    /// without a store call of its own (carried by the store's next
    /// batch). Default: yes.
    fn reads_history(&self) -> bool {
        true
    }

    /// True if the backend's program may leave files to send in the turn's
    /// outbox directory (`TELEGATE_OUTBOX`, the command backend). The
    /// runner makes that directory only for such backends: a fresh
    /// directory per turn is two filesystem round trips every other backend
    /// would pay for nothing. Default: no.
    fn leaves_files(&self) -> bool {
        false
    }

    /// The git worktrees of its conversations (`worktree = {…}`), for
    /// `/diff`, `/merge` and `/discard`. Default: none.
    fn worktrees(&self) -> Option<std::sync::Arc<crate::worktree::Worktrees>> {
        None
    }

    /// The conversations of the slots `ended` names are over (their forum
    /// topic was closed): a backend that keeps a process per slot between
    /// turns (an ACP agent) ends theirs now rather than at its idle
    /// timeout. Returns how many it ended. Default: nothing kept.
    fn end_slots<'a>(&'a self, _ended: &'a SlotFilter) -> BoxFuture<'a, usize> {
        Box::pin(async { 0 })
    }

    /// telegate is shutting down: end whatever the backend keeps running
    /// between turns (an ACP agent's processes), within a bounded time.
    /// Default: nothing to end.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Which slots [`Agent::end_slots`] ends.
pub type SlotFilter = dyn Fn(&SessionKey) -> bool + Send + Sync;

/// The session's worktree (made on first use) as a turn's working
/// directory; a failure as a message naming the settings table `at`.
pub async fn worktree_for(
    worktrees: &crate::worktree::Worktrees,
    turn: &TurnRequest,
    at: &str,
) -> Result<std::path::PathBuf, AgentError> {
    worktrees
        .ensure(&turn.session_key, &turn.session_id)
        .await
        .map_err(|error| AgentError::Backend {
            user_message: format!(
                "Could not make this conversation's git worktree. Check {at}.worktree (repo, base, root)."
            ),
            detail: format!("worktree: {error}"),
        })
}
