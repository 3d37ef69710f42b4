//! MCP servers as tools of the openai backend (`[[tools.mcp]]`).
//!
//! [`WithMcp`] adds the tools of every configured MCP server to another
//! registry (the terminal tool's, or none), the way
//! [`super::send_file::WithSendFile`] adds `send_file`. Each tool reaches
//! the model as `<server>__<tool>` (see [`text::exposed_name`]), only if
//! the server's `allowed_tools` lets it through. The servers are started
//! at the first turn that needs them ([`ToolRegistry::prepare`]) and again
//! whenever one died ([`server`]).
//!
//! Every call goes, in this order, through:
//! * the approval policy of its server (`approval = "never" | "dangerous"
//!   | "always"`; "dangerous" trusts the server's own `readOnlyHint` /
//!   `destructiveHint`), asking the chat through the same
//!   [`ApprovalGate`] as the terminal tool, so the card, its one-time id,
//!   `may_decide`, the buttons and "no answer in time = denied" are the
//!   same; the card shows the server, the tool and the arguments in full;
//! * the server's `timeout_secs` and the turn's cancellation (/stop
//!   withdraws the call);
//! * the result cap (`result_cap_bytes`, with a note), non-text content
//!   described, not dumped.
//!
//! Like every tool, an MCP tool never fails the turn and never shows
//! anything in the chat itself: what reaches the chat goes through the
//! turn's progress (the model's text) and the approval gate. This module
//! owns the composition and the call path; it must never run a call the
//! policy holds back without the gate's approval.

pub mod config;
pub mod server;
pub mod text;

pub use config::{McpApproval, McpServerConfig};

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use serde_json::Value;

use super::approval::{ApprovalGate, Denial, Verdict};
use super::childgroups::GroupLedger;
use super::process::ProcessOwner;
use super::{ToolContext, ToolDefinition, ToolError, ToolRegistry};
use crate::store::ChildGroups;
use server::{CallFailure, McpServer, RemoteTool};

/// Install ring as the process's TLS provider (once; reqwest 0.13 inside
/// rmcp needs one, telegate's own clients bring theirs).
pub fn install_tls_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Another registry plus the tools of the configured MCP servers.
pub struct WithMcp {
    inner: Arc<dyn ToolRegistry>,
    servers: Vec<Arc<McpServer>>,
    approvals: ApprovalGate,
    groups: Arc<OnceLock<GroupLedger>>,
}

/// One offered tool: its name for the model, its server, its listing.
struct Offered {
    exposed: String,
    server: usize,
    tool: RemoteTool,
}

impl WithMcp {
    /// `inner`'s tools plus those of `servers` (validated configs), asking
    /// approvals through `approvals`. `blocked_env` names the variables no
    /// server may inherit. Nothing starts until the first turn.
    pub fn new(
        inner: Arc<dyn ToolRegistry>,
        servers: &[McpServerConfig],
        approvals: ApprovalGate,
        blocked_env: BTreeSet<String>,
    ) -> WithMcp {
        let groups = Arc::new(OnceLock::new());
        let servers = servers
            .iter()
            .map(|config| {
                Arc::new(McpServer::new(
                    config.clone(),
                    blocked_env.clone(),
                    groups.clone(),
                ))
            })
            .collect();
        WithMcp {
            inner,
            servers,
            approvals,
            groups,
        }
    }

    /// The servers (for diagnostics and tests).
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// Every offered tool, named in a stable order (servers as configured,
    /// tools as listed), never clashing with `inner`'s names.
    fn offered(&self) -> Vec<Offered> {
        let mut taken: Vec<String> = self
            .inner
            .definitions()
            .into_iter()
            .map(|d| d.name)
            .collect();
        let mut offered = Vec::new();
        for (index, server) in self.servers.iter().enumerate() {
            for tool in server.tools() {
                let exposed = text::exposed_name(&server.config().name, &tool.name, |n| {
                    taken.iter().any(|t| t == n)
                });
                taken.push(exposed.clone());
                offered.push(Offered {
                    exposed,
                    server: index,
                    tool,
                });
            }
        }
        offered
    }

    async fn call_mcp(
        &self,
        offered: Offered,
        arguments: &str,
        ctx: ToolContext,
    ) -> Result<String, ToolError> {
        let server = &self.servers[offered.server];
        let config = server.config();
        let arguments = parse_arguments(arguments)?;
        if let Some(reason) =
            text::reason_to_ask(config.approval, &config.name, &offered.tool.annotations)
        {
            let Some(owner) = ProcessOwner::capture() else {
                return Err(ToolError::Failed(Denial::NoChat.to_string()));
            };
            let subject = text::approval_subject(
                &config.name,
                &offered.tool.name,
                &Value::Object(arguments.clone()),
            );
            match self
                .approvals
                .ask(&owner, &subject, &reason, &ctx.cancel, &ctx.progress)
                .await
            {
                Verdict::Approved => {}
                Verdict::Denied(denial) => return Err(ToolError::Failed(denial.to_string())),
            }
        }
        tracing::info!(server = %config.name, tool = %offered.tool.name, "calling an MCP tool");
        match server
            .call(&offered.tool.name, arguments, &ctx.cancel, &ctx.progress)
            .await
        {
            Ok(result) => {
                let (text, is_error) = text::result_text(&result, config.result_cap_bytes);
                if is_error {
                    Err(ToolError::Failed(text))
                } else {
                    Ok(text)
                }
            }
            Err(CallFailure::Cancelled) => Err(ToolError::Failed(
                "the turn was cancelled; the MCP call was withdrawn".to_string(),
            )),
            Err(CallFailure::TimedOut(limit)) => Err(ToolError::Failed(format!(
                "the MCP tool did not answer within {} s; the call was withdrawn",
                limit.as_secs()
            ))),
            Err(CallFailure::Unavailable(why)) => Err(ToolError::Failed(why)),
        }
    }
}

/// The model's arguments as a JSON object (`{}` when it sent none).
fn parse_arguments(arguments: &str) -> Result<serde_json::Map<String, Value>, ToolError> {
    if arguments.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(Value::Null) => Ok(serde_json::Map::new()),
        Ok(_) => Err(ToolError::BadArguments(
            "the arguments must be a JSON object".to_string(),
        )),
        Err(e) => Err(ToolError::BadArguments(e.to_string())),
    }
}

impl ToolRegistry for WithMcp {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let mut definitions = self.inner.definitions();
        for offered in self.offered() {
            let server = &self.servers[offered.server].config().name;
            let description = if offered.tool.description.trim().is_empty() {
                format!("Tool {} of the MCP server {server}.", offered.tool.name)
            } else {
                format!("[MCP server {server}] {}", offered.tool.description)
            };
            definitions.push(ToolDefinition {
                name: offered.exposed,
                description,
                parameters: offered.tool.schema,
            });
        }
        definitions
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        match self.offered().into_iter().find(|o| o.exposed == name) {
            Some(offered) => Box::pin(async move {
                ctx.progress.still_working();
                self.call_mcp(offered, arguments, ctx).await
            }),
            None => self.inner.call(name, arguments, ctx),
        }
    }

    fn prepare<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.inner.prepare(ctx).await;
            let starts = self.servers.iter().map(|server| async {
                if let Err(error) = server.ensure(&ctx.cancel, &ctx.progress).await {
                    tracing::info!(server = %server.config().name, %error, "MCP server not available this turn");
                }
            });
            futures::future::join_all(starts).await;
        })
    }

    fn attach_store(&self, child_groups: &ChildGroups) {
        self.inner.attach_store(child_groups);
        let _ = self.groups.set(GroupLedger::new(child_groups.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_be_an_object() {
        assert!(parse_arguments("").unwrap().is_empty());
        assert!(parse_arguments("null").unwrap().is_empty());
        assert_eq!(parse_arguments(r#"{"a":1}"#).unwrap()["a"], 1);
        assert!(matches!(
            parse_arguments("[1]"),
            Err(ToolError::BadArguments(_))
        ));
        assert!(matches!(
            parse_arguments("{"),
            Err(ToolError::BadArguments(_))
        ));
    }
}
