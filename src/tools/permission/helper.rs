//! The helper mode: `telegate permission-helper --socket PATH`, the stdio
//! MCP server Claude Code starts from the turn's `--mcp-config`.
//!
//! It offers one tool, `approve`, taking what Claude Code sends a
//! `--permission-prompt-tool` (`tool_name`, `input`, `tool_use_id`), and
//! answers with Claude Code's JSON decision as text. It decides nothing
//! itself: each call is one request over the private socket to the running
//! telegate (with the turn's token from [`super::TOKEN_ENV`]), bounded in
//! time by [`super::WAIT_ENV`]; anything that goes wrong is a denial
//! saying what went wrong. It reads no configuration and holds no secret.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::wire::{self, Decision};
use super::{read_line, TOKEN_ENV, TOOL_NAME, WAIT_ENV};

/// The helper's MCP server.
#[derive(Clone)]
struct Helper {
    socket: PathBuf,
    token: Arc<str>,
    wait: Duration,
}

impl Helper {
    /// One permission request, answered by telegate (or refused here).
    async fn ask(&self, arguments: &serde_json::Map<String, serde_json::Value>) -> Decision {
        let request = match wire::request_from_arguments(&self.token, arguments) {
            Ok(request) => request,
            Err(why) => return Decision::deny(why),
        };
        match tokio::time::timeout(self.wait, self.forward(&request)).await {
            Ok(Ok(decision)) => decision,
            Ok(Err(why)) => Decision::deny(format!("telegate could not be asked: {why}")),
            Err(_) => Decision::deny("telegate did not answer in time"),
        }
    }

    async fn forward(&self, request: &wire::Request) -> Result<Decision, String> {
        let mut stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| format!("cannot reach {}: {e}", self.socket.display()))?;
        let mut line = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        if line.len() > wire::MAX_REQUEST_BYTES {
            return Ok(Decision::deny(
                "the tool's input is too large to show for approval",
            ));
        }
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| format!("sending failed: {e}"))?;
        let answer = read_line(&mut stream, wire::MAX_REPLY_BYTES).await?;
        serde_json::from_slice(&answer).map_err(|_| "its answer could not be read".to_string())
    }
}

fn approve_tool() -> Tool {
    let schema = json!({
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "description": "The tool that asks for permission."},
            "input": {"type": "object", "description": "The tool's input."},
            "tool_use_id": {"type": "string"}
        },
        "required": ["tool_name", "input"]
    });
    let schema = match schema {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    Tool::new(
        TOOL_NAME,
        "Ask the user in the Telegram chat whether a tool may be used.",
        schema,
    )
}

impl ServerHandler for Helper {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("telegate-permission-prompt", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![approve_tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != TOOL_NAME {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        let arguments = request.arguments.unwrap_or_default();
        let decision = self.ask(&arguments).await;
        Ok(CallToolResult::success(vec![ContentBlock::text(decision.to_text())]).into())
    }
}

/// Run the helper on stdin/stdout until Claude Code closes it.
pub async fn run(socket: PathBuf) -> Result<(), String> {
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            format!("{TOKEN_ENV} is not set: this mode is started by telegate's Claude Code turns")
        })?;
    let wait = std::env::var(WAIT_ENV)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(330), Duration::from_secs);
    let helper = Helper {
        socket,
        token: token.into(),
        wait,
    };
    let service = helper
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .map_err(|e| format!("the MCP handshake failed: {e}"))?;
    service
        .waiting()
        .await
        .map_err(|e| format!("the helper stopped: {e}"))?;
    Ok(())
}
