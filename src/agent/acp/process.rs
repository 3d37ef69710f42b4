//! One ACP agent process: started through `spawn_leader` (its own process
//! group, killed with telegate, recorded in the store while it runs), a
//! JSON-RPC connection over its stdio with the official SDK, the client
//! side's handlers, and a supervisor task that owns the child.
//!
//! The handlers (the SDK runs them in its dispatch loop, in arrival
//! order):
//! * `session/update`: folded into the view of the turn whose session it
//!   is ([`Route`]), which feeds the turn's [`Progress`]; an update for no
//!   running turn (a `session/load` replaying history, a late one) is
//!   dropped;
//! * `session/request_permission`: asked in the chat through the approval
//!   gate (in a task of its own, so the loop goes on); without a running
//!   turn it is `cancelled`;
//! * `fs/read_text_file`, `fs/write_text_file`: only when offered (a
//!   workdir, `file_access`), confined to the workdir ([`super::fs`]).
//!
//! Everything is bounded: a line from the agent is at most
//! [`MAX_MESSAGE_BYTES`] (a longer one ends the connection), stderr is kept
//! as a short tail. The supervisor ends the process when asked (SIGTERM to
//! the group, SIGKILL after the grace), at once when killed, and notices
//! when it dies by itself; either way [`AgentProcess::ended`] fires and
//! whatever waited on the connection fails.
//!
//! This module never decides when to start or stop an agent (the backend
//! does) and never signals a group it did not create.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, ClientCapabilities, FileSystemCapabilities, Implementation,
    InitializeRequest, ReadTextFileRequest, ReadTextFileResponse, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SessionNotification, WriteTextFileRequest,
    WriteTextFileResponse,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent as AcpPeer, Client, Error as AcpError, ErrorCode, Lines};
use futures::{SinkExt, StreamExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec};
use tokio_util::sync::CancellationToken;

use super::config::AcpConfig;
use super::fs;
use super::permission;
use super::view::TurnView;
use crate::agent::AgentError;
use crate::tools::approval::ApprovalGate;
use crate::tools::childenv::ChildEnv;
use crate::tools::childgroups::{GroupLedger, RecordedGroup};
use crate::tools::procgroup::{spawn_leader, ProcessGroup};
use crate::vocab::{Progress, SessionKey, SessionSource};

/// The longest line (one JSON-RPC message) accepted from an agent.
pub(super) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// How much of the agent's stderr is kept for messages.
const STDERR_TAIL_BYTES: usize = 4096;
/// A stderr line longer than this is skipped.
const STDERR_LINE_BYTES: usize = 8192;
/// How long an ended agent's stderr may stay open (held by something
/// outside its group) before its end is announced without the rest.
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// Where one running turn's updates and permission requests go.
pub(super) struct Route {
    /// What the turn shows and answers.
    pub view: Mutex<TurnView>,
    /// The turn's progress (preview, watchdog).
    pub progress: Progress,
    /// The slot whose turn it is.
    pub key: SessionKey,
    /// Who started it, where (the approval's owner).
    pub source: SessionSource,
    /// Fires when the turn ends or is stopped: a permission request still
    /// waiting is then `cancelled`.
    pub ended: CancellationToken,
}

impl Route {
    /// The view, locked.
    pub(super) fn view(&self) -> MutexGuard<'_, TurnView> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The routes of one process, by ACP session id.
#[derive(Clone, Default)]
pub(super) struct Routes(Arc<Mutex<HashMap<String, Arc<Route>>>>);

impl Routes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Route>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send `session`'s updates to `route` from now on.
    pub(super) fn insert(&self, session: &str, route: Arc<Route>) {
        self.lock().insert(session.to_string(), route);
    }

    /// Stop routing `session` (only if it still goes to `route`).
    pub(super) fn remove(&self, session: &str, route: &Arc<Route>) {
        let mut routes = self.lock();
        if routes.get(session).is_some_and(|r| Arc::ptr_eq(r, route)) {
            routes.remove(session);
        }
    }

    fn get(&self, session: &str) -> Option<Arc<Route>> {
        self.lock().get(session).cloned()
    }
}

/// What the handlers need.
#[derive(Clone)]
struct Handlers {
    routes: Routes,
    gate: ApprovalGate,
    asker: &'static str,
    /// The workdir, when file access is offered.
    files: Option<PathBuf>,
}

/// A running agent process and its connection.
pub(super) struct AgentProcess {
    /// The connection.
    pub cx: ConnectionTo<AcpPeer>,
    /// What the agent said it can do.
    pub caps: AgentCapabilities,
    /// Where each session's updates go.
    pub routes: Routes,
    /// The sessions' working directory (absolute).
    pub cwd: PathBuf,
    /// Telegate session id → the ACP session created or loaded in this
    /// process.
    pub sessions: Mutex<HashMap<String, String>>,
    /// The leader's pid (logs, tests).
    pub pid: u32,
    stop: CancellationToken,
    kill: CancellationToken,
    /// Fires as soon as the leader is gone or its connection broke (the
    /// cleanup may still run).
    going: CancellationToken,
    ended: CancellationToken,
    exit: Arc<Mutex<Option<String>>>,
    stderr: Arc<Mutex<String>>,
    /// Turns using it now; the idle timer never ends a process in use.
    users: AtomicUsize,
    last_used: Mutex<Instant>,
    /// The cumulative cost last reported per ACP session (0 for one
    /// created here; a continued one's first report is only a baseline).
    costs: Mutex<HashMap<String, f64>>,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Nobody can reach it any more: it must not go on running.
        self.kill.cancel();
    }
}

impl AgentProcess {
    /// Fires once the process is gone (or its connection is).
    pub(super) fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// True once the process is gone.
    pub(super) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// True while it can take a turn: not ending, not told to end, its
    /// leader not gone.
    pub(super) fn is_usable(&self) -> bool {
        !(self.ended.is_cancelled()
            || self.stop.is_cancelled()
            || self.kill.is_cancelled()
            || self.going.is_cancelled())
    }

    /// If it is going (its connection failed), wait a little for it to be
    /// gone, so what is said about it knows how it ended.
    pub(super) async fn settle(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ended.cancelled()).await;
    }

    /// End it: SIGTERM to its group, SIGKILL after the kill grace.
    pub(super) fn stop(&self) {
        self.stop.cancel();
    }

    /// End it now: SIGKILL to its group.
    pub(super) fn kill(&self) {
        self.kill.cancel();
    }

    /// How it ended, for messages ("exit status 3", "killed by SIGKILL").
    pub(super) fn exit_text(&self) -> Option<String> {
        self.exit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The end of what it wrote on stderr.
    pub(super) fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The ACP session of telegate session `session` here, if any.
    pub(super) fn session_of(&self, session: &str) -> Option<String> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session)
            .cloned()
    }

    /// Telegate session `session` is ACP session `id` here.
    pub(super) fn set_session(&self, session: &str, id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(session.to_string(), id.to_string());
    }

    /// ACP session `id` was created in this process: its cost counts from 0.
    pub(super) fn fresh_session(&self, id: &str) {
        self.costs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_string(), 0.0);
    }

    /// What a turn of `session` cost, from the session's cumulative cost
    /// `total` now (0 the first time a continued session reports one).
    pub(super) fn cost_delta(&self, session: &str, total: f64) -> f64 {
        let mut costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
        let before = costs.insert(session.to_string(), total);
        before.map_or(0.0, |before| (total - before).max(0.0))
    }

    /// A turn starts using it.
    pub(super) fn enter(&self) {
        self.users.fetch_add(1, Ordering::SeqCst);
    }

    /// A turn stopped using it.
    pub(super) fn leave(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.users.fetch_sub(1, Ordering::SeqCst);
    }

    /// End it once it was not used for `idle` (checked until it ends).
    pub(super) fn exit_when_idle(self: &Arc<Self>, idle: Duration) {
        let process = Arc::downgrade(self);
        let ended = self.ended.clone();
        tokio::spawn(async move {
            let mut wait = idle;
            loop {
                tokio::select! {
                    () = ended.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                let Some(process) = process.upgrade() else {
                    return;
                };
                let since = process
                    .last_used
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .elapsed();
                if process.users.load(Ordering::SeqCst) == 0 && since >= idle {
                    tracing::info!(pid = process.pid, "ending an idle agent process");
                    process.stop();
                    return;
                }
                wait = idle.saturating_sub(since).max(Duration::from_millis(50));
            }
        });
    }
}

/// How to start one agent.
pub(super) struct Launch<'a> {
    /// The settings.
    pub config: &'a AcpConfig,
    /// The working directory, created (absolute).
    pub cwd: PathBuf,
    /// Set when it is the configured (per-chat) workdir: the directory
    /// file access is confined to.
    pub workdir: Option<PathBuf>,
    /// Names never passed to the child (secrets).
    pub blocked_env: &'a BTreeSet<String>,
    /// Where its group is recorded.
    pub groups: Option<&'a GroupLedger>,
    /// The gate its permission requests wait in.
    pub gate: &'a ApprovalGate,
}

fn start_error(program: &str, error: &io::Error) -> AgentError {
    let key = "agent.acp.program (or PATH)";
    let user_message = match error.kind() {
        io::ErrorKind::NotFound => format!("Could not start `{program}`: not found. Check {key}."),
        io::ErrorKind::PermissionDenied => format!(
            "Could not start `{program}`: permission denied (is it executable?). Check {key}."
        ),
        _ => format!("Could not start `{program}`: {error}."),
    };
    AgentError::Backend {
        user_message,
        detail: format!("spawning {program:?} failed: {error:?}"),
    }
}

impl Launch<'_> {
    fn command(&self) -> Command {
        let mut command = Command::new(self.config.program());
        command
            .args(self.config.args())
            .current_dir(&self.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        ChildEnv {
            pass: self.config.pass_env.iter().cloned().collect(),
            set: self.config.env.clone(),
            blocked: self.blocked_env.clone(),
        }
        .apply(&mut command);
        command
    }

    /// Start the agent and initialize the connection (within the start
    /// timeout; on failure the process is gone).
    pub(super) async fn start(self) -> Result<Arc<AgentProcess>, AgentError> {
        let program = self.config.program().to_string();
        let mut child = spawn_leader(self.command()).map_err(|e| start_error(&program, &e))?;
        let Some(group) = child.id().and_then(ProcessGroup::of_leader) else {
            return Err(AgentError::backend(format!(
                "Could not start `{program}`: it has no process id."
            )));
        };
        let pid = group.id().raw() as u32;
        let recorded = self.groups.map_or_else(RecordedGroup::none, |ledger| {
            ledger.record(group.id(), "acp agent")
        });
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(AgentError::backend(format!(
                "Could not start `{program}`: its pipes are missing."
            )));
        };
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let stderr_drain = tokio::spawn(drain_stderr(stderr, stderr_tail.clone(), pid));
        let spawned = Spawned {
            child,
            group,
            recorded,
            pid,
            stdin,
            stdout,
            stderr_tail,
            stderr_drain,
        };
        let process = self.connect(spawned, &program).await?;
        self.initialize(process, &program).await
    }

    /// The workdir file access is confined to, when it is offered.
    fn files(&self) -> Option<PathBuf> {
        self.workdir.clone().filter(|_| self.config.file_access)
    }

    /// The connection over the spawned agent's stdio (its handlers on
    /// this launch's routes and gate) and the supervisor owning the child;
    /// the process, not yet initialized.
    async fn connect(&self, spawned: Spawned, program: &str) -> Result<AgentProcess, AgentError> {
        let Spawned {
            child,
            group,
            recorded,
            pid,
            stdin,
            stdout,
            stderr_tail,
            stderr_drain,
        } = spawned;
        let routes = Routes::default();
        let handlers = Handlers {
            routes: routes.clone(),
            gate: self.gate.clone(),
            asker: self.config.name(),
            files: self.files(),
        };
        let conn_stop = CancellationToken::new();
        let (cx_tx, cx_rx) = tokio::sync::oneshot::channel();
        let outgoing =
            SinkExt::<String>::sink_map_err(FramedWrite::new(stdin, LinesCodec::new()), line_error);
        let incoming = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_MESSAGE_BYTES))
            .map(|line| line.map_err(line_error));
        let driver = tokio::spawn(connect(
            Lines::new(outgoing, incoming),
            handlers,
            conn_stop.clone(),
            cx_tx,
        ));

        let stop = CancellationToken::new();
        let kill = CancellationToken::new();
        let going = CancellationToken::new();
        let ended = CancellationToken::new();
        let exit = Arc::new(Mutex::new(None));
        tokio::spawn(supervise(Supervised {
            child,
            group,
            recorded,
            driver,
            conn_stop,
            stop: stop.clone(),
            kill: kill.clone(),
            going: going.clone(),
            ended: ended.clone(),
            exit: exit.clone(),
            stderr_drain,
            grace: self.config.kill_grace(),
        }));
        let cx = match cx_rx.await {
            Ok(cx) => cx,
            Err(_) => {
                kill.cancel();
                return Err(AgentError::backend(format!(
                    "Could not connect to `{program}`."
                )));
            }
        };
        Ok(AgentProcess {
            cx,
            caps: AgentCapabilities::default(),
            routes,
            cwd: self.cwd.clone(),
            sessions: Mutex::new(HashMap::new()),
            pid,
            stop,
            kill,
            going,
            ended,
            exit,
            stderr: stderr_tail,
            users: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            costs: Mutex::new(HashMap::new()),
        })
    }

    /// `initialize` within the start timeout, offering file access when
    /// there is a workdir for it; an agent that does not answer or speaks
    /// another ACP version is killed.
    async fn initialize(
        &self,
        mut process: AgentProcess,
        program: &str,
    ) -> Result<Arc<AgentProcess>, AgentError> {
        let files = self.files().is_some();
        let capabilities = ClientCapabilities::new().fs(FileSystemCapabilities::new()
            .read_text_file(files)
            .write_text_file(files));
        let request = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(capabilities)
            .client_info(Implementation::new("telegate", env!("CARGO_PKG_VERSION")));
        let answer = within(
            &process,
            self.config.start_timeout(),
            "initialize",
            program,
            process.cx.send_request(request).block_task(),
        )
        .await;
        let response = match answer {
            Ok(response) => response,
            Err(error) => {
                process.kill();
                return Err(error);
            }
        };
        if response.protocol_version != ProtocolVersion::V1 {
            process.kill();
            return Err(AgentError::Backend {
                user_message: format!(
                    "`{program}` speaks ACP version {}, telegate speaks version 1.",
                    response.protocol_version.as_u16()
                ),
                detail: format!("initialize answered {response:?}"),
            });
        }
        tracing::info!(
            pid = process.pid,
            agent = ?response.agent_info.as_ref().map(|i| (&i.name, &i.version)),
            load_session = response.agent_capabilities.load_session,
            resume = response.agent_capabilities.session_capabilities.resume.is_some(),
            images = response.agent_capabilities.prompt_capabilities.image,
            "acp agent started"
        );
        process.caps = response.agent_capabilities;
        Ok(Arc::new(process))
    }
}

/// A spawned agent whose connection is not made yet: its child (leader of
/// `group`, recorded), its pid and stdio (stderr already drained into
/// `stderr_tail`).
struct Spawned {
    child: Child,
    group: ProcessGroup,
    recorded: RecordedGroup,
    pid: u32,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    stderr_tail: Arc<Mutex<String>>,
    /// The task filling `stderr_tail`; it ends when the pipe closes.
    stderr_drain: tokio::task::JoinHandle<()>,
}

/// Await an answer of the agent within `limit` (else the process is
/// killed), failing if the process ends first: what went wrong is told in
/// the user's words.
pub(super) async fn within<T>(
    process: &AgentProcess,
    limit: Duration,
    what: &str,
    program: &str,
    answer: impl std::future::Future<Output = Result<T, AcpError>>,
) -> Result<T, AgentError> {
    tokio::select! {
        result = answer => result.map_err(|error| protocol_error(process, what, program, &error)),
        () = tokio::time::sleep(limit) => {
            process.kill();
            Err(AgentError::Backend {
            user_message: format!(
                "`{}` did not answer `{what}` within {} s, so it was stopped. Check that it \
                 speaks the Agent Client Protocol (agent.acp.program, agent.acp.args) and can start here.",
                short_name(program),
                limit.as_secs()
            ),
            detail: format!("{what} timed out; stderr tail: {:?}", process.stderr_tail()),
        })
        }
        () = process.ended.cancelled() => Err(ended_error(process, what, program)),
    }
}

/// The agent ended while telegate waited for `what`.
pub(super) fn ended_error(process: &AgentProcess, what: &str, program: &str) -> AgentError {
    let how = process
        .exit_text()
        .unwrap_or_else(|| "its connection closed".to_string());
    let said = last_line(&process.stderr_tail());
    let said = if said.is_empty() {
        String::new()
    } else {
        format!("; it said: {said}")
    };
    AgentError::Backend {
        user_message: format!(
            "The agent `{}` stopped unexpectedly ({how}){said}. Your next message starts it again.",
            short_name(program)
        ),
        detail: format!(
            "agent {program} ended during {what}: {how}; stderr tail: {:?}",
            process.stderr_tail()
        ),
    }
}

/// A program as the chat is told about it: its file name.
pub(super) fn short_name(program: &str) -> &str {
    std::path::Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(program)
}

/// The agent answered `what` with an error.
pub(super) fn protocol_error(
    process: &AgentProcess,
    what: &str,
    program: &str,
    error: &AcpError,
) -> AgentError {
    if process.is_ended() || agent_client_protocol::is_incoming_transport_closed(error) {
        return ended_error(process, what, program);
    }
    let detail = format!("{what} failed: {error:?}");
    if error.code == ErrorCode::AUTH_REQUIRED {
        return AgentError::Setup {
            user_message: format!(
                "`{}` is not logged in, so it cannot answer. The bot's owner needs to log it \
                 in on the server once, or give it an API key through agent.acp.env or \
                 agent.acp.pass_env.",
                short_name(program)
            ),
            detail,
        };
    }
    AgentError::Backend {
        user_message: format!(
            "`{}` refused `{what}`: {}",
            short_name(program),
            crate::agent::command::protocol::one_line(&error.message, 300)
        ),
        detail,
    }
}

fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    crate::agent::command::protocol::one_line(line, 300)
}

fn line_error(error: tokio_util::codec::LinesCodecError) -> io::Error {
    match error {
        tokio_util::codec::LinesCodecError::MaxLineLengthExceeded => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the agent sent a message longer than {MAX_MESSAGE_BYTES} bytes"),
        ),
        tokio_util::codec::LinesCodecError::Io(error) => error,
    }
}

/// Keep the end of the agent's stderr; log it at debug level.
async fn drain_stderr(stderr: tokio::process::ChildStderr, tail: Arc<Mutex<String>>, pid: u32) {
    let mut lines = FramedRead::new(stderr, LinesCodec::new_with_max_length(STDERR_LINE_BYTES));
    while let Some(line) = lines.next().await {
        let Ok(line) = line else {
            // Too long (skipped) or unreadable; go on until the end.
            continue;
        };
        tracing::debug!(pid, stderr = %line, "acp agent stderr");
        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
        tail.push_str(&line);
        tail.push('\n');
        if tail.len() > STDERR_TAIL_BYTES {
            let mut cut = tail.len() - STDERR_TAIL_BYTES;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

/// Run the connection until `stop` (or until it breaks), handing its
/// context out first.
async fn connect<O, I>(
    transport: Lines<O, I>,
    handlers: Handlers,
    stop: CancellationToken,
    cx_tx: tokio::sync::oneshot::Sender<ConnectionTo<AcpPeer>>,
) where
    O: futures::Sink<String, Error = io::Error> + Send + 'static,
    I: futures::Stream<Item = io::Result<String>> + Send + 'static,
{
    let updates = handlers.clone();
    let permissions = handlers.clone();
    let reads = handlers.clone();
    let writes = handlers;
    let result = Client
        .v1()
        .name("telegate")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                updates.session_update(&notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, cx| {
                let handlers = permissions.clone();
                cx.spawn(async move {
                    let outcome = handlers.permission(&request).await;
                    responder.respond(RequestPermissionResponse::new(outcome))
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ReadTextFileRequest, responder, cx| {
                let root = reads.files.clone();
                cx.spawn(async move {
                    let answer = read_file(root, request).await;
                    responder.respond_with_result(answer)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: WriteTextFileRequest, responder, cx| {
                let root = writes.files.clone();
                cx.spawn(async move {
                    let answer = write_file(root, request).await;
                    responder.respond_with_result(answer)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<AcpPeer>| {
            let _ = cx_tx.send(cx);
            stop.cancelled().await;
            Ok(())
        })
        .await;
    if let Err(error) = result {
        tracing::info!(%error, "the acp connection ended with an error");
    }
}

impl Handlers {
    fn session_update(&self, notification: &SessionNotification) {
        let Some(route) = self.routes.get(&notification.session_id.0) else {
            tracing::trace!(session = %notification.session_id.0, "update for no running turn; dropped");
            return;
        };
        let text = {
            let mut view = route.view();
            if !view.apply(&notification.update) {
                None
            } else {
                Some(view.render())
            }
        };
        match text {
            Some(text) => route.progress.set_text(&text),
            None => route.progress.still_working(),
        }
    }

    async fn permission(&self, request: &RequestPermissionRequest) -> RequestPermissionOutcome {
        let Some(route) = self.routes.get(&request.session_id.0) else {
            tracing::info!(session = %request.session_id.0, "a permission request for no running turn: cancelled");
            return RequestPermissionOutcome::Cancelled;
        };
        let Some((asked, prompt)) =
            permission::approval_request(request, self.asker, self.gate.timeout())
        else {
            tracing::warn!("a permission request without options: cancelled");
            return RequestPermissionOutcome::Cancelled;
        };
        let decision = self
            .gate
            .ask_request_with(
                &route.key,
                &route.source,
                asked,
                prompt,
                &route.ended,
                &route.progress,
            )
            .await;
        permission::outcome(request, &decision)
    }
}

fn not_offered() -> AcpError {
    AcpError::new(
        ErrorCode::METHOD_NOT_FOUND,
        "file access is not offered (telegate has no agent.acp.workdir, or file_access = false)",
    )
}

fn refused(refusal: fs::FsRefusal) -> AcpError {
    AcpError::new(ErrorCode::INVALID_PARAMS, refusal.to_string())
}

async fn read_file(
    root: Option<PathBuf>,
    request: ReadTextFileRequest,
) -> Result<ReadTextFileResponse, AcpError> {
    let root = root.ok_or_else(not_offered)?;
    let read = tokio::task::spawn_blocking(move || {
        fs::read_text(&root, &request.path, request.line, request.limit)
    })
    .await
    .map_err(AcpError::into_internal_error)?;
    read.map(ReadTextFileResponse::new).map_err(refused)
}

async fn write_file(
    root: Option<PathBuf>,
    request: WriteTextFileRequest,
) -> Result<WriteTextFileResponse, AcpError> {
    let root = root.ok_or_else(not_offered)?;
    let written =
        tokio::task::spawn_blocking(move || fs::write_text(&root, &request.path, &request.content))
            .await
            .map_err(AcpError::into_internal_error)?;
    written
        .map(|()| WriteTextFileResponse::new())
        .map_err(refused)
}

/// What the supervisor owns.
struct Supervised {
    child: Child,
    group: ProcessGroup,
    recorded: RecordedGroup,
    driver: tokio::task::JoinHandle<()>,
    conn_stop: CancellationToken,
    stop: CancellationToken,
    kill: CancellationToken,
    going: CancellationToken,
    ended: CancellationToken,
    exit: Arc<Mutex<Option<String>>>,
    /// Read to its end before `ended` fires, so what the chat is told
    /// about the end carries the agent's last words.
    stderr_drain: tokio::task::JoinHandle<()>,
    grace: Duration,
}

/// Own the child until it is gone: it exits, its connection ends, or it
/// is told to stop or killed. Then its group's leftovers are stopped, what
/// it wrote on stderr is read to the end (within a second: something
/// outside its group may hold the pipe) and [`AgentProcess::ended`] fires.
async fn supervise(mut s: Supervised) {
    let mut exited = None;
    let mut driver_done = false;
    tokio::select! {
        status = s.child.wait() => exited = Some(status),
        _ = &mut s.driver => driver_done = true,
        () = s.stop.cancelled() => {}
        () = s.kill.cancelled() => {}
    }
    s.going.cancel();
    let how = match exited {
        Some(status) => status_text(status),
        None => {
            s.conn_stop.cancel();
            if s.kill.is_cancelled() {
                s.group.send(libc::SIGKILL);
            } else {
                // The agent may end by itself once its stdin closes.
                let _ = tokio::time::timeout(Duration::from_millis(200), s.child.wait()).await;
                s.group.stop(&mut s.child, s.grace).await;
            }
            let status = tokio::time::timeout(Duration::from_secs(5), s.child.wait()).await;
            match status {
                Ok(status) if s.stop.is_cancelled() || s.kill.is_cancelled() => {
                    let stopped = status_text(status);
                    format!("stopped by telegate, {stopped}")
                }
                Ok(status) => status_text(status),
                Err(_) => "still running after SIGKILL".to_string(),
            }
        }
    };
    s.conn_stop.cancel();
    if !driver_done {
        // Its pending requests fail once the pipes are gone.
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut s.driver).await;
        s.driver.abort();
    }
    s.group.terminate_leftovers(s.grace).await;
    s.group.disarm();
    drop(s.recorded);
    // The exit can be seen before the drain has read the last lines
    // written just before it (a busy runtime): the crash notice would
    // lose "it said: ...".
    if tokio::time::timeout(STDERR_DRAIN, &mut s.stderr_drain)
        .await
        .is_err()
    {
        s.stderr_drain.abort();
    }
    tracing::info!(how, "acp agent process ended");
    *s.exit.lock().unwrap_or_else(PoisonError::into_inner) = Some(how);
    s.ended.cancel();
}

fn status_text(status: io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(signal)) => {
                format!("killed by {}", crate::tools::procgroup::signal_name(signal))
            }
            _ => "ended".to_string(),
        },
        Err(error) => format!("unknown exit ({error})"),
    }
}
