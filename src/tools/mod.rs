//! Tools an LLM agent may call during a turn.
//!
//! An LLM backend (such as [`crate::agent::OpenAiAgent`]) asks a
//! [`ToolRegistry`] for the [`ToolDefinition`]s it advertises to the model,
//! and calls [`ToolRegistry::call`] with the raw JSON arguments the model
//! produced. The backend owns the conversation (which messages go where, how
//! many tool rounds may run); the registry only executes one call at a time
//! and says what came of it.
//!
//! Why the contract is this small: tools are written by other people, run
//! arbitrary work (shell commands, HTTP calls) and must not be able to break a
//! turn. So a tool reports every failure as a [`ToolError`], which the backend
//! turns into an `"error: …"` tool result the model can read and react to; a
//! tool failure never ends the turn.
//!
//! A tool must:
//! * stop promptly when [`ToolContext::cancel`] fires (the backend also drops
//!   the call's future then, so cleanup belongs in `Drop` or must not be
//!   needed);
//! * call [`Progress::still_working`] on [`ToolContext::progress`] while it
//!   works for long, so the stall watchdog does not cancel the turn;
//! * return short results: the backend sends them to the model verbatim.
//!
//! A tool must never send anything to the chat itself (the exceptions: an
//! approval request, which goes out as a [`ToolEvent`] through the approval
//! gate, and the file `send_file` was asked to send), touch another session, or push text into the turn's progress
//! (that text is the model's answer, not the tool's). A tool that needs to
//! know whose turn it serves reads the task-local turn identity
//! ([`crate::vocab::current_identity`]), never global state.
//!
//! The modules:
//! * [`terminal`]: the `terminal` and `process` tools and `[tools.terminal]`;
//! * [`process`]: the process registry (owners, bounded output, limits);
//! * [`wakeup`]: wakeups for finished background processes and their routing;
//! * [`approval`]: dangerous-command patterns and the approval policy;
//! * [`approval_gate`]: pending approvals with their options, for every agent;
//! * [`approval_options`]: a request's options, answers and endings (plain data);
//! * [`approval_prompt`]: the request's wording (the whole command, every match);
//! * [`authority`]: who may approve, deny or stop somebody's turn;
//! * [`events`]: the channel through which wakeups and notices leave the tools;
//! * [`procgroup`]: process groups, shared with the command backend;
//! * [`child_output`]: a child's output read bounded, as it streams;
//! * [`send_file`]: the `send_file` tool (files to the chat);
//! * [`mcp`]: the tools of MCP servers (`[[tools.mcp]]`);
//! * [`permission`]: Claude Code's permission prompts on the approval card.

pub mod approval;
pub mod approval_gate;
pub mod approval_options;
pub mod approval_prompt;
pub mod authority;
pub mod child_output;
pub mod childenv;
pub mod childgroups;
pub mod events;
pub mod mcp;
pub mod permission;
pub mod process;
pub mod procgroup;
pub mod runas;
pub mod send_file;
pub mod terminal;
pub mod wakeup;

pub use events::{tool_events, ToolEvent, ToolEventReceiver, ToolEventSender};
pub use terminal::{TerminalConfig, TerminalTool};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::store::ChildGroups;
use crate::vocab::Progress;

/// A tool as advertised to the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// The name the model calls it by (`[a-zA-Z0-9_-]`, at most 64 chars for
    /// OpenAI).
    pub name: String,
    /// What it does and when to use it, for the model.
    pub description: String,
    /// The JSON schema of its arguments (an `"object"` schema).
    pub parameters: serde_json::Value,
}

/// What a tool call gets besides its arguments.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// Fires when the turn must stop; the tool must return promptly.
    pub cancel: CancellationToken,
    /// The turn's progress: call [`Progress::still_working`] while working.
    pub progress: Progress,
}

/// Why a tool call produced no result. The backend shows the model
/// `error: <Display>`, so each message should tell the model what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No tool has this name.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// The arguments are not valid JSON or do not fit the schema.
    #[error("bad arguments: {0}")]
    BadArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
}

/// The set of tools a backend may offer the model.
pub trait ToolRegistry: Send + Sync {
    /// The tools to advertise, in a stable order. Empty means the backend
    /// sends no tools at all.
    fn definitions(&self) -> Vec<ToolDefinition>;

    /// Run the tool `name` with `arguments` (the model's raw JSON text, `{}`
    /// when the model sent none) and return the result text for the model.
    fn call<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>>;

    /// Called once at the start of each turn, before [`Self::definitions`]:
    /// a registry whose tools come from elsewhere (MCP servers) starts or
    /// restarts them here, bounded by its own timeouts and `ctx.cancel`.
    /// A registry that wraps another calls the inner one's too. Required
    /// (no default), as is [`Self::attach_store`]: a wrapper that forgot to
    /// pass them on would silently turn off the tools it wraps.
    fn prepare<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, ()>;

    /// The runner's store, once (child process groups are recorded there).
    /// A registry that wraps another passes it on.
    fn attach_store(&self, child_groups: &ChildGroups);
}

/// A registry without tools: the model only talks. The default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTools;

impl ToolRegistry for NoTools {
    fn prepare<'a>(&'a self, _ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn attach_store(&self, _child_groups: &ChildGroups) {}

    fn definitions(&self) -> Vec<ToolDefinition> {
        Vec::new()
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        _arguments: &'a str,
        _ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { Err(ToolError::UnknownTool(name.to_string())) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_tools_advertises_nothing_and_rejects_every_call() {
        let ctx = ToolContext {
            cancel: CancellationToken::new(),
            progress: Progress::new(),
        };
        assert!(NoTools.definitions().is_empty());
        let error = NoTools.call("shell", "{}", ctx).await.unwrap_err();
        assert_eq!(error.to_string(), "unknown tool \"shell\"");
    }
}
