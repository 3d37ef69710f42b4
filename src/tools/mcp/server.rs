//! One configured MCP server: starting it (a stdio program, or a
//! streamable HTTP endpoint), listing its tools, calling one, and
//! starting it again when it died.
//!
//! A stdio server is started by [`spawn_leader`] like every other child:
//! its own process group, killed when telegate dies, recorded in the store
//! while it runs (so a crash's leftovers die at the next start), with the
//! minimal child environment (secrets never). Its stderr goes to the log,
//! line by line, each line cut at [`STDERR_LINE_BYTES`]. The connection
//! owns the group: dropping it (a restart, telegate's shutdown) kills
//! everything the server started.
//!
//! A server that died is noticed at the next use (the turn's preparation or
//! a call) and started again then; a start that failed is not tried again
//! for [`RETRY_AFTER_FAILURE`], so a broken server does not hold up every
//! turn by its start timeout.
//!
//! This module owns the connections. It never decides about approval and
//! never shows anything in a chat.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient, RunningService, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::config::McpServerConfig;
use crate::tools::childenv::ChildEnv;
use crate::tools::childgroups::{GroupLedger, RecordedGroup};
use crate::tools::procgroup::{spawn_leader, ProcessGroup};
use crate::vocab::Progress;

/// A start that failed is tried again after this long at the earliest.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
/// A line of a server's stderr is logged up to this many bytes.
pub const STDERR_LINE_BYTES: usize = 2000;
/// How often a waiting call tells the stall watchdog it is alive.
const ALIVE_PING: Duration = Duration::from_secs(2);

/// A tool as the server lists it (the MCP `Tool` as JSON).
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteTool {
    /// Its name on the server.
    pub name: String,
    /// Its description (may be empty).
    pub description: String,
    /// Its input schema (an object schema).
    pub schema: Value,
    /// Its annotations (`readOnlyHint`, `destructiveHint`, …), or null.
    pub annotations: Value,
}

/// Why a call produced no result.
#[derive(Debug, PartialEq, Eq)]
pub enum CallFailure {
    /// The turn was cancelled (the call was withdrawn).
    Cancelled,
    /// It took longer than the server's `timeout_secs`.
    TimedOut(Duration),
    /// The server could not be reached or started, or broke the protocol.
    Unavailable(String),
}

/// A running connection.
struct Connection {
    service: RunningService<RoleClient, ()>,
    /// A stdio server's process and group (killed on drop).
    process: Option<StdioProcess>,
}

struct StdioProcess {
    child: Child,
    _group: ProcessGroup,
    _recorded: RecordedGroup,
}

impl Connection {
    fn alive(&mut self) -> bool {
        if self.service.is_closed() || self.service.peer().is_transport_closed() {
            return false;
        }
        match &mut self.process {
            Some(process) => matches!(process.child.try_wait(), Ok(None)),
            None => true,
        }
    }
}

/// One server. Cheap to share; calls of one server may run at once.
pub struct McpServer {
    config: McpServerConfig,
    blocked_env: BTreeSet<String>,
    groups: Arc<OnceLock<GroupLedger>>,
    /// Held while a start runs, so concurrent users wait for one start.
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// The tools of the last successful listing (what the model is offered).
    tools: Mutex<Vec<RemoteTool>>,
    failed_at: Mutex<Option<Instant>>,
    /// How many times it was started (for the log and tests).
    starts: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server for `config`; `blocked_env` names the variables it must
    /// never inherit (telegate's secrets). Nothing starts yet.
    pub fn new(
        config: McpServerConfig,
        blocked_env: BTreeSet<String>,
        groups: Arc<OnceLock<GroupLedger>>,
    ) -> McpServer {
        McpServer {
            config,
            blocked_env,
            groups,
            connection: tokio::sync::Mutex::new(None),
            tools: Mutex::new(Vec::new()),
            failed_at: Mutex::new(None),
            starts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &McpServerConfig {
        &self.config
    }

    /// The tools offered from it, as last listed.
    pub fn tools(&self) -> Vec<RemoteTool> {
        self.tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Make sure it runs (start it if it does not, unless a start failed
    /// moments ago). `Err` says why it cannot be used now.
    pub async fn ensure(
        &self,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Result<Peer<RoleClient>, String> {
        self.ensure_inner(cancel, progress, true).await
    }

    async fn ensure_inner(
        &self,
        cancel: &CancellationToken,
        progress: &Progress,
        respect_backoff: bool,
    ) -> Result<Peer<RoleClient>, String> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_mut() {
            if connection.alive() {
                return Ok(connection.service.peer().clone());
            }
            tracing::warn!(server = %self.config.name, "the MCP server stopped; starting it again");
            *slot = None;
        }
        if respect_backoff {
            let failed_at = *self
                .failed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER_FAILURE) {
                return Err(format!(
                    "the MCP server {} could not be started a moment ago",
                    self.config.name
                ));
            }
        }
        let start = tokio::time::timeout(self.config.startup_timeout(), self.start());
        tokio::pin!(start);
        let started = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err("the turn was cancelled".to_string()),
                started = &mut start => break started,
                // A slow start is work, not a stall.
                () = tokio::time::sleep(ALIVE_PING) => progress.still_working(),
            }
        };
        let result = match started {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(format!(
                "it did not answer within {} s",
                self.config.startup_timeout_secs
            )),
        };
        match result {
            Ok(connection) => {
                *self
                    .failed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                let peer = connection.service.peer().clone();
                *slot = Some(connection);
                Ok(peer)
            }
            Err(error) => {
                tracing::warn!(server = %self.config.name, %error, "could not start the MCP server");
                *self
                    .failed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                Err(format!(
                    "the MCP server {} could not be started",
                    self.config.name
                ))
            }
        }
    }

    /// Start (or connect) and list the tools.
    async fn start(&self) -> Result<Connection, String> {
        let n = self
            .starts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let (service, process) = match (&self.config.command, &self.config.url) {
            (Some(program), _) => {
                let (service, process) = self.start_stdio(program).await?;
                (service, Some(process))
            }
            (None, Some(url)) => (self.connect_http(url).await?, None),
            (None, None) => return Err("neither command nor url is set".to_string()),
        };
        let listed = list_tool_values(service.peer())
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        let tools = self.offered(listed);
        tracing::info!(
            server = %self.config.name,
            start = n,
            tools = ?tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            "MCP server ready"
        );
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) = tools;
        Ok(Connection { service, process })
    }

    /// The listed tools that `allowed_tools` lets through. A tool whose
    /// listing is malformed is left out alone (the owner is told in the
    /// log); the server's other tools are still offered.
    fn offered(&self, listed: Vec<Value>) -> Vec<RemoteTool> {
        let allowed = &self.config.allowed_tools;
        let tools: Vec<RemoteTool> = listed
            .into_iter()
            .filter_map(|value| match remote_tool(value) {
                Ok(tool) => Some(tool),
                Err(Malformed { name, why }) => {
                    tracing::warn!(
                        server = %self.config.name,
                        tool = %name.as_deref().unwrap_or("(no name)"),
                        "the MCP server lists a tool that cannot be offered ({why}); it is left out, the server's other tools are offered"
                    );
                    None
                }
            })
            .filter(|tool| allowed.is_empty() || allowed.contains(&tool.name))
            .collect();
        for name in allowed {
            if !tools.iter().any(|t| &t.name == name) {
                tracing::warn!(server = %self.config.name, tool = %name, "allowed_tools names a tool the server does not offer");
            }
        }
        tools
    }

    async fn start_stdio(
        &self,
        program: &str,
    ) -> Result<(RunningService<RoleClient, ()>, StdioProcess), String> {
        let mut command = Command::new(program);
        command
            .args(&self.config.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &self.config.workdir {
            command.current_dir(dir);
        }
        ChildEnv {
            pass: self.config.pass_env.iter().cloned().collect(),
            set: self.config.env.clone(),
            blocked: self.blocked_env.clone(),
        }
        .apply(&mut command);
        let mut child =
            spawn_leader(command).map_err(|e| format!("cannot start {program:?}: {e}"))?;
        let group = child
            .id()
            .and_then(ProcessGroup::of_leader)
            .ok_or_else(|| format!("{program:?} exited at once"))?;
        let recorded = self
            .groups
            .get()
            .map_or_else(RecordedGroup::none, |ledger| {
                ledger.record(group.id(), "mcp")
            });
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(log_stderr(self.config.name.clone(), stderr));
        }
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err("its pipes could not be opened".to_string());
        };
        let service =
            ().serve((stdout, stdin))
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))?;
        Ok((
            service,
            StdioProcess {
                child,
                _group: group,
                _recorded: recorded,
            },
        ))
    }

    async fn connect_http(&self, url: &str) -> Result<RunningService<RoleClient, ()>, String> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        super::install_tls_provider();
        let mut headers = HashMap::new();
        let plain = self
            .config
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str(), false));
        let secret = self
            .config
            .resolved_headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.expose(), true));
        for (name, value, sensitive) in plain.chain(secret) {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a header name"))?;
            let mut value = http::HeaderValue::from_str(value)
                .map_err(|_| format!("the value of {name} is not a header value"))?;
            value.set_sensitive(sensitive);
            headers.insert(name, value);
        }
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers),
        );
        ().serve(transport)
            .await
            .map_err(|e| format!("connecting to {url} failed: {e}"))
    }

    /// Call `tool` with `arguments`, bounded by the server's timeout and
    /// the turn's `cancel`; `progress` is pinged while it runs. The result
    /// is the MCP `CallToolResult` as JSON. A server that is not running is
    /// started first (at once, even after a failed start: the model asked).
    pub async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> Result<Value, CallFailure> {
        let peer = self
            .ensure_inner(cancel, progress, false)
            .await
            .map_err(CallFailure::Unavailable)?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(arguments);
        // Dropping this future withdraws the request (rmcp sends the
        // server `notifications/cancelled`).
        let call = peer.call_tool(params);
        tokio::pin!(call);
        let deadline = tokio::time::Instant::now() + self.config.timeout();
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(CallFailure::Cancelled),
                result = &mut call => {
                    return match result {
                        Ok(result) => serde_json::to_value(result)
                            .map_err(|e| CallFailure::Unavailable(format!("its result could not be read: {e}"))),
                        Err(error) => {
                            tracing::warn!(server = %self.config.name, tool, %error, "MCP call failed");
                            Err(CallFailure::Unavailable(self.failure_text(&error)))
                        }
                    };
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(CallFailure::TimedOut(self.config.timeout()));
                }
                () = tokio::time::sleep(ALIVE_PING) => progress.still_working(),
            }
        }
    }

    fn failure_text(&self, error: &rmcp::ServiceError) -> String {
        match error {
            rmcp::ServiceError::McpError(data) => {
                format!("the server refused the call: {}", data.message)
            }
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => format!(
                "the MCP server {} stopped during the call (it is started again at the next call)",
                self.config.name
            ),
            other => format!("the call failed: {other}"),
        }
    }

    /// How many times it was started.
    pub fn starts(&self) -> u64 {
        self.starts.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The most pages of `tools/list` followed (a server whose cursor never
/// ends is cut off there).
const MAX_TOOL_PAGES: usize = 64;

/// Every tool a server lists, each as its own JSON value: read tool by
/// tool, so one malformed tool (rmcp's typed list refuses the whole page
/// for it) does not take the server's other tools with it.
async fn list_tool_values(peer: &Peer<RoleClient>) -> Result<Vec<Value>, rmcp::ServiceError> {
    use rmcp::model::{
        ClientRequest, CustomResult, ListToolsRequest, PaginatedRequestParams, ServerResult,
    };
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_TOOL_PAGES {
        let params = cursor.take().map(|cursor| {
            let mut params = PaginatedRequestParams::default();
            params.cursor = Some(cursor);
            params
        });
        let answer = peer
            .send_request(ClientRequest::ListToolsRequest(ListToolsRequest {
                method: Default::default(),
                params,
                extensions: Default::default(),
            }))
            .await?;
        let page = match answer {
            ServerResult::ListToolsResult(page) => {
                serde_json::to_value(page).map_err(|_| rmcp::ServiceError::UnexpectedResponse)?
            }
            // A page rmcp could not read as a tool list: read it here.
            ServerResult::CustomResult(CustomResult(page)) => page,
            _ => return Err(rmcp::ServiceError::UnexpectedResponse),
        };
        let (page_tools, next) = tool_page(page).ok_or(rmcp::ServiceError::UnexpectedResponse)?;
        tools.extend(page_tools);
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Ok(tools)
}

/// A `tools/list` page's tools and next cursor; `None`: not a tool list.
fn tool_page(mut page: Value) -> Option<(Vec<Value>, Option<String>)> {
    let next = page
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|cursor| !cursor.is_empty())
        .map(str::to_string);
    match page.get_mut("tools")?.take() {
        Value::Array(tools) => Some((tools, next)),
        _ => None,
    }
}

/// Why a listed tool is not offered.
#[derive(Debug, PartialEq, Eq)]
struct Malformed {
    /// Its name, when it has one.
    name: Option<String>,
    /// What is wrong with it.
    why: &'static str,
}

/// A listed tool, read from its JSON: a name, and an input schema that is
/// an object (none is taken as an object schema without properties).
fn remote_tool(value: Value) -> Result<RemoteTool, Malformed> {
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(name) = name.filter(|name| !name.is_empty()) else {
        return Err(Malformed {
            name: None,
            why: "it has no name",
        });
    };
    let description = value
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut schema = match value.get("inputSchema") {
        None | Some(Value::Null) => serde_json::json!({}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(Malformed {
                name: Some(name),
                why: "its inputSchema is not a JSON object",
            })
        }
    };
    match schema.get("type") {
        None => schema["type"] = Value::from("object"),
        Some(Value::String(kind)) if kind == "object" => {}
        Some(_) => {
            return Err(Malformed {
                name: Some(name),
                why: "its inputSchema is not an object schema",
            })
        }
    }
    Ok(RemoteTool {
        name,
        description,
        schema,
        annotations: value.get("annotations").cloned().unwrap_or(Value::Null),
    })
}

/// Log a server's stderr line by line (each cut), until it closes.
async fn log_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    let mut line: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    let emit = |line: &mut Vec<u8>| {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end();
        if !text.is_empty() {
            tracing::info!(server = %server, "MCP server stderr: {text}");
        }
        line.clear();
    };
    loop {
        let read = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        for &byte in &chunk[..read] {
            if byte == b'\n' {
                emit(&mut line);
            } else if line.len() < STDERR_LINE_BYTES {
                line.push(byte);
            }
        }
    }
    emit(&mut line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn an_https_transport_can_be_built_with_telegates_tls_provider() {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        // reqwest 0.13 inside rmcp has no TLS provider of its own: building
        // its client without the process default would panic.
        super::super::install_tls_provider();
        let _transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri("https://127.0.0.1:9/mcp"),
        );
    }

    #[test]
    fn listed_tools_get_an_object_schema() {
        let tool = remote_tool(json!({"name": "t", "inputSchema": {"properties": {}}})).unwrap();
        assert_eq!(tool.schema["type"], "object");
        assert_eq!(tool.annotations, Value::Null);
        let bare = remote_tool(json!({"name": "bare"})).unwrap();
        assert_eq!(bare.schema, json!({"type": "object"}));
    }

    #[test]
    fn a_malformed_tool_is_refused_alone_with_why() {
        assert_eq!(
            remote_tool(json!({"description": "no name"})),
            Err(Malformed {
                name: None,
                why: "it has no name"
            })
        );
        for schema in [json!("a string"), json!([1, 2]), json!(7)] {
            let refused = remote_tool(json!({"name": "t", "inputSchema": schema})).unwrap_err();
            assert_eq!(refused.name.as_deref(), Some("t"));
        }
        let refused =
            remote_tool(json!({"name": "t", "inputSchema": {"type": "array"}})).unwrap_err();
        assert_eq!(refused.why, "its inputSchema is not an object schema");
    }

    #[test]
    fn a_tool_page_gives_its_tools_and_next_cursor() {
        let (tools, next) = tool_page(json!({
            "tools": [{"name": "a"}, {"name": "b", "inputSchema": "bad"}],
            "nextCursor": "p2"
        }))
        .unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(next.as_deref(), Some("p2"));
        let (_, last) = tool_page(json!({"tools": [], "nextCursor": ""})).unwrap();
        assert_eq!(last, None);
        assert!(tool_page(json!({"content": []})).is_none());
        assert!(tool_page(json!({"tools": {}})).is_none());
    }
}
