//! The `command` backend: runs a configured program once per turn.
//!
//! This is how Claude Code, Codex CLI, `llm` or a user's own script go behind
//! the bot. Each turn spawns `argv` with the message substituted into it (or
//! written to stdin), streams the program's stdout into the turn's
//! [`Progress`], and answers with that output once the program exits.
//!
//! Why it looks the way it does:
//!
//! * **No shell.** Placeholders (`{message}`, `{session_id}`, `{chat_id}`)
//!   are substituted *inside individual argv elements* and the program is
//!   executed directly. A message like `$(rm -rf ~)` arrives as one literal
//!   argument; it is never parsed by anything. Users who want a shell write
//!   `argv = ["sh", "-c", "...", "sh", "{message}"]` and take that
//!   responsibility (the message is then `$1`, still not shell syntax).
//!   The program itself (`argv[0]`) may not contain placeholders: a message
//!   must never choose what runs.
//! * **Its own process group.** CLIs such as Claude Code start children of
//!   their own (tools, MCP servers, shells). Killing only the process we
//!   spawned would orphan those, and an orphan that keeps our stdout pipe
//!   open would also keep the turn from ever seeing end-of-file. So the child
//!   is made leader of a new process group, and every stop signal goes to the
//!   whole group (`killpg`, see [`crate::tools::procgroup`], shared with the
//!   terminal tool): SIGTERM, then SIGKILL after `kill_grace_ms`.
//!   The same happens to anything the program leaves running after it exits
//!   normally, so turns never leak processes. A guard SIGKILLs the group if
//!   the turn's future is dropped mid-run (the runner aborts a turn that does
//!   not stop in time); `kill_on_drop` on the child is only a last resort,
//!   because it reaches the leader alone. A program that really wants to
//!   outlive the turn has to leave the group itself (`setsid`).
//! * **Bounded memory.** Stdout is kept up to `output_cap_bytes` (the rest is
//!   read and discarded, so the program never blocks on a full pipe) and
//!   stderr only as a small tail for error messages and the debug log.
//! * **Secrets stay home.** The child inherits the bot's environment minus
//!   the bot token and LLM keys, so a script (or whatever a coding agent
//!   decides to run) cannot read them.
//!
//! Output on stderr counts as a sign of life for the stall watchdog (some
//! CLIs report progress there); a program that is silent on both streams for
//! the stall timeout is treated as hung.
//!
//! This module owns the command backend and its `[agent.command]` settings.
//! It must never run anything through a shell, and never signal a process
//! group it did not create.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::{pin, Pin};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};

use super::{Agent, AgentError, AgentReply, Progress, TurnRequest};
use crate::tools::procgroup::{signal_name, ProcessGroup};

/// Environment variables never passed to the program, whatever the config
/// says in `remove_env`.
pub const ALWAYS_STRIPPED_ENV: &[&str] =
    &["TELEGRAM_BOT_TOKEN", "TELOXIDE_TOKEN", "OPENAI_API_KEY"];

/// Set for the program: the conversation's session id.
pub const SESSION_ID_ENV: &str = "TELEGATE_SESSION_ID";
/// Set for the program: the chat id the message came from.
pub const CHAT_ID_ENV: &str = "TELEGATE_CHAT_ID";

/// The placeholders `argv` elements may contain.
const PLACEHOLDERS: &str = "{message}, {session_id}, {chat_id}";
/// How much of stderr is kept (the tail).
const STDERR_TAIL_BYTES: usize = 4096;
/// How much of the stderr tail goes into a chat error message.
const STDERR_MESSAGE_CHARS: usize = 800;
/// At most this many stderr lines go into a chat error message.
const STDERR_MESSAGE_LINES: usize = 12;
/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 16 * 1024;
/// How long to keep reading pipes after the whole group is gone. Only a
/// process that left the group (`setsid`) can hold them open longer.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// `[agent.command]`: which program to run per turn, and how.
///
/// ```toml
/// [agent.command]
/// argv = ["claude", "-p", "--", "{message}"]
/// workdir = "/srv/bot-workspace"
/// timeout_secs = 600
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// The program and its arguments, run directly (never through a shell).
    /// Elements may contain `{message}` (the user's text), `{session_id}`
    /// and `{chat_id}`, substituted inside that element only; write
    /// `{{name}}` for a literal `{name}`. The program (the first element)
    /// may not contain placeholders. Put `--` before `{message}` if the
    /// program supports it, so a message starting with `-` is not taken for
    /// an option (or use `stdin = true`).
    pub argv: Vec<String>,
    /// Write the message to the program's stdin (then close it) instead of,
    /// or as well as, passing it in `argv`. Off: stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// The working directory (default: the bot's own).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// Extra environment variables for the program (these win over
    /// inherited ones, and over `remove_env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// More inherited variables to remove, besides the bot token and the LLM
    /// API keys, which are always removed.
    #[serde(default)]
    pub remove_env: Vec<String>,
    /// Variables passed from telegate's environment besides PATH, HOME,
    /// USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TERM, TZ and TMPDIR (the
    /// program gets nothing else; secrets never pass).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Stop the program after this many seconds (0: no limit; the stall
    /// watchdog still stops a program that shows no output for too long).
    #[serde(default)]
    pub timeout_secs: u64,
    /// Keep at most this many bytes of output; the rest is discarded and
    /// the reply says it was truncated.
    #[serde(default = "default_output_cap_bytes")]
    pub output_cap_bytes: usize,
    /// Milliseconds between SIGTERM and SIGKILL when the program (and
    /// anything it started) must stop.
    #[serde(default = "default_kill_grace_ms")]
    pub kill_grace_ms: u64,
}

fn default_output_cap_bytes() -> usize {
    64 * 1024
}

fn default_kill_grace_ms() -> u64 {
    2000
}

impl CommandConfig {
    /// A configuration running `argv` with every other setting at its
    /// default.
    pub fn new(argv: Vec<String>) -> Self {
        CommandConfig {
            argv,
            stdin: false,
            workdir: None,
            env: BTreeMap::new(),
            remove_env: Vec::new(),
            pass_env: Vec::new(),
            timeout_secs: 0,
            output_cap_bytes: default_output_cap_bytes(),
            kill_grace_ms: default_kill_grace_ms(),
        }
    }

    /// Check the settings; the error is one line naming the key
    /// (`agent.command.…`) and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        self.check_values()?;
        if let Some(dir) = &self.workdir {
            if !dir.is_dir() {
                return Err(format!(
                    "agent.command.workdir {} is not a directory",
                    dir.display()
                ));
            }
        }
        Ok(())
    }

    /// Everything [`CommandConfig::validate`] checks except the file system.
    fn check_values(&self) -> Result<(), String> {
        let Some(program) = self.argv.first() else {
            return Err(
                "agent.command.argv is empty: give the program to run, e.g. [\"llm\", \"{message}\"]"
                    .to_string(),
            );
        };
        if program.is_empty() {
            return Err("agent.command.argv[0] (the program) is empty".to_string());
        }
        for (i, element) in self.argv.iter().enumerate() {
            let tokens = tokenize(element).map_err(|e| format!("agent.command.argv[{i}]: {e}"))?;
            if element.contains('\0') {
                return Err(format!("agent.command.argv[{i}] contains a NUL byte"));
            }
            if i == 0 && tokens.iter().any(|t| matches!(t, Token::Field(_))) {
                return Err(
                    "agent.command.argv[0] (the program) may not contain placeholders: \
                     a message must never choose what runs"
                        .to_string(),
                );
            }
        }
        for (name, value) in &self.env {
            check_env_name("agent.command.env", name)?;
            if value.contains('\0') {
                return Err(format!(
                    "agent.command.env: the value of {name} contains a NUL byte"
                ));
            }
        }
        for name in &self.remove_env {
            check_env_name("agent.command.remove_env", name)?;
        }
        if self.output_cap_bytes == 0 {
            return Err("agent.command.output_cap_bytes must be at least 1".to_string());
        }
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        (self.timeout_secs > 0).then(|| Duration::from_secs(self.timeout_secs))
    }

    fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms)
    }
}

fn check_env_name(key: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "{key}: {name:?} is not a valid variable name (empty, or contains '=' or a NUL byte)"
        ));
    }
    Ok(())
}

/// A placeholder in an argv element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Message,
    SessionId,
    ChatId,
}

/// A piece of an argv element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'a> {
    Text(&'a str),
    Field(Field),
}

/// Split an argv element into text and placeholders.
///
/// `{name}` (an ASCII identifier in braces) is a placeholder and must be a
/// known one; `{{name}}` is the literal text `{name}`; every other brace is
/// plain text, so JSON or `awk '{print $1}'` need no escaping.
fn tokenize(element: &str) -> Result<Vec<Token<'_>>, String> {
    let bytes = element.as_bytes();
    let mut tokens = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        // `{{name}}`: a literal `{name}`.
        if bytes.get(i + 1) == Some(&b'{') {
            if let Some(end) = identifier_end(bytes, i + 2) {
                if bytes.get(end) == Some(&b'}') && bytes.get(end + 1) == Some(&b'}') {
                    push_text(&mut tokens, &element[text_start..i]);
                    push_text(&mut tokens, &element[i + 1..end + 1]);
                    i = end + 2;
                    text_start = i;
                    continue;
                }
            }
        }
        // `{name}`: a placeholder.
        if let Some(end) = identifier_end(bytes, i + 1) {
            if bytes.get(end) == Some(&b'}') {
                let field = match &element[i + 1..end] {
                    "message" => Field::Message,
                    "session_id" => Field::SessionId,
                    "chat_id" => Field::ChatId,
                    other => {
                        return Err(format!(
                            "unknown placeholder {{{other}}} (known: {PLACEHOLDERS}; \
                             write {{{{{other}}}}} for the literal text)"
                        ))
                    }
                };
                push_text(&mut tokens, &element[text_start..i]);
                tokens.push(Token::Field(field));
                i = end + 1;
                text_start = i;
                continue;
            }
        }
        i += 1;
    }
    push_text(&mut tokens, &element[text_start..]);
    Ok(tokens)
}

fn push_text<'a>(tokens: &mut Vec<Token<'a>>, text: &'a str) {
    if !text.is_empty() {
        tokens.push(Token::Text(text));
    }
}

/// Where the ASCII identifier starting at `start` ends, if there is one.
fn identifier_end(bytes: &[u8], start: usize) -> Option<usize> {
    let first = *bytes.get(start)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let len = bytes[start..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    Some(start + len)
}

/// The values placeholders are replaced with.
struct Substitutions<'a> {
    message: &'a str,
    session_id: &'a str,
    chat_id: String,
}

impl Substitutions<'_> {
    fn value(&self, field: Field) -> &str {
        match field {
            Field::Message => self.message,
            Field::SessionId => self.session_id,
            Field::ChatId => &self.chat_id,
        }
    }

    /// Expand one argv element. Substituted values are never scanned again,
    /// so a message containing `{session_id}` stays as it is.
    fn expand(&self, element: &str) -> Result<String, String> {
        let mut out = String::with_capacity(element.len());
        for token in tokenize(element)? {
            match token {
                Token::Text(text) => out.push_str(text),
                Token::Field(field) => out.push_str(self.value(field)),
            }
        }
        Ok(out)
    }
}

/// Runs a configured program once per turn. See the module documentation.
#[derive(Clone, Debug)]
pub struct CommandAgent {
    config: CommandConfig,
    /// Every variable name removed from the child's environment.
    stripped_env: BTreeSet<String>,
}

impl CommandAgent {
    /// An agent running `config`. `secrets_to_strip` names environment
    /// variables holding secrets the program must not see (the variable the
    /// LLM key came from, say); [`ALWAYS_STRIPPED_ENV`] and
    /// `config.remove_env` are removed as well.
    ///
    /// Call [`CommandConfig::validate`] first: an invalid configuration is
    /// reported as an error on every turn.
    pub fn new(config: CommandConfig, secrets_to_strip: Vec<String>) -> Self {
        let stripped_env = ALWAYS_STRIPPED_ENV
            .iter()
            .map(|name| name.to_string())
            .chain(secrets_to_strip)
            .chain(config.remove_env.iter().cloned())
            .filter(|name| !name.is_empty())
            .collect();
        CommandAgent {
            config,
            stripped_env,
        }
    }

    /// The program as configured, for messages.
    fn program(&self) -> &str {
        self.config.argv.first().map_or("", String::as_str)
    }

    /// The argv for this turn, placeholders substituted.
    fn argv_for(&self, turn: &TurnRequest) -> Result<Vec<String>, AgentError> {
        // The messages name config keys and placeholders, never values.
        self.config.check_values().map_err(|problem| {
            AgentError::backend(format!("The command backend is misconfigured: {problem}"))
        })?;
        let values = Substitutions {
            message: &turn.text,
            session_id: turn.session_id.as_str(),
            chat_id: turn.source.chat_id.to_string(),
        };
        let mut argv = Vec::with_capacity(self.config.argv.len());
        for element in &self.config.argv {
            let arg = values.expand(element).map_err(AgentError::backend)?;
            if arg.contains('\0') {
                return Err(AgentError::backend(
                    "The message contains a NUL character, which cannot be passed to a command.",
                ));
            }
            argv.push(arg);
        }
        Ok(argv)
    }

    /// The process to start: no shell, own process group, scrubbed
    /// environment.
    fn command(&self, argv: &[String], turn: &TurnRequest) -> Command {
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .stdin(if self.config.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.config.workdir {
            command.current_dir(dir);
        }
        crate::tools::childenv::ChildEnv {
            pass: self.config.pass_env.iter().cloned().collect(),
            set: self.config.env.clone(),
            blocked: self.stripped_env.clone(),
        }
        .apply(&mut command);
        command
            .env(SESSION_ID_ENV, turn.session_id.as_str())
            .env(CHAT_ID_ENV, turn.source.chat_id.to_string());
        command
    }

    /// Start the process, turning failures into messages that say what to
    /// fix.
    fn spawn(&self, command: &mut Command) -> Result<Child, AgentError> {
        if let Some(dir) = &self.config.workdir {
            // Checked here too: a missing directory and a missing program
            // both fail with ENOENT.
            if !dir.is_dir() {
                return Err(AgentError::Backend {
                    user_message: format!(
                        "The command's working directory does not exist. Check agent.command.workdir ({}).",
                        dir.display()
                    ),
                    detail: format!("workdir {} is not a directory", dir.display()),
                });
            }
        }
        command.spawn().map_err(|error| {
            let program = self.program();
            let user_message = match error.kind() {
                io::ErrorKind::NotFound => {
                    format!("Could not start `{program}`: not found. Check agent.command.argv.")
                }
                io::ErrorKind::PermissionDenied => format!(
                    "Could not start `{program}`: permission denied (is it executable?). Check agent.command.argv."
                ),
                _ => format!("Could not start `{program}`: {error}."),
            };
            AgentError::Backend {
                user_message,
                detail: format!("spawning {program:?} failed: {error:?}"),
            }
        })
    }

    async fn run_turn(&self, turn: TurnRequest) -> Result<AgentReply, AgentError> {
        if turn.cancel.is_cancelled() {
            return Err(AgentError::Cancelled);
        }
        let argv = self.argv_for(&turn)?;
        let mut command = self.command(&argv, &turn);
        let mut child = self.spawn(&mut command)?;
        let Some(group) = child.id().and_then(ProcessGroup::of_leader) else {
            return Err(AgentError::backend(format!(
                "Could not start `{}`: it has no process id.",
                self.program()
            )));
        };
        tracing::debug!(
            program = self.program(),
            pid = group.id().raw(),
            "command started"
        );

        let stdin = match (self.config.stdin, child.stdin.take()) {
            (true, Some(pipe)) => Some((pipe, turn.text.clone())),
            _ => None,
        };
        let mut stdout = StdoutCollector::new(turn.progress.clone(), self.config.output_cap_bytes);
        let mut stderr = StderrTail::new(turn.progress.clone());
        let io = pump(
            stdin,
            child.stdout.take(),
            child.stderr.take(),
            &mut stdout,
            &mut stderr,
        );
        let outcome = self.supervise(&mut child, group, io, &turn).await;
        stdout.finish();
        tracing::debug!(
            program = self.program(),
            stderr = %stderr.text(),
            "command stderr (tail)"
        );
        match outcome? {
            status if status.success() => Ok(stdout.into_reply()),
            status => Err(self.failure(status, &stderr)),
        }
    }

    /// Wait for the program while `io` pumps its pipes; stop its whole group
    /// on cancellation or timeout, and clean up what it leaves behind.
    async fn supervise(
        &self,
        child: &mut Child,
        mut group: ProcessGroup,
        io: impl Future<Output = ()>,
        turn: &TurnRequest,
    ) -> Result<ExitStatus, AgentError> {
        let mut io = Pumping::new(io);
        let timeout = self.config.timeout();
        let grace = self.config.kill_grace();

        let ended = io
            .alongside(async {
                tokio::select! {
                    status = child.wait() => Ended::Exited(status),
                    () = turn.cancel.cancelled() => Ended::Stopped,
                    () = sleep_for(timeout) => Ended::TimedOut,
                }
            })
            .await;
        let status = match ended {
            Ended::Exited(Ok(status)) => status,
            Ended::Exited(Err(error)) => {
                group.send(libc::SIGKILL);
                group.disarm();
                return Err(AgentError::Backend {
                    user_message: format!("Lost track of `{}` while it ran.", self.program()),
                    detail: format!("waiting for the command failed: {error:?}"),
                });
            }
            Ended::Stopped => {
                io.alongside(group.stop(child, grace)).await;
                group.disarm();
                return Err(AgentError::Cancelled);
            }
            Ended::TimedOut => {
                io.alongside(group.stop(child, grace)).await;
                group.disarm();
                return Err(self.timed_out());
            }
        };

        // The program exited: stop whatever it left running (which may hold
        // our pipes open), then read what is left in the pipes.
        let cancelled = {
            let tidy_up = async {
                io.alongside(group.terminate_leftovers(grace)).await;
                if tokio::time::timeout(DRAIN_LIMIT, io.finish())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        program = self.program(),
                        "a process that left the command's group keeps its output open; not waiting for it"
                    );
                }
            };
            tokio::select! {
                () = tidy_up => false,
                () = turn.cancel.cancelled() => true,
            }
        };
        if cancelled {
            // The program already exited; only leftovers can remain.
            group.send(libc::SIGKILL);
        }
        group.disarm();
        if cancelled {
            Err(AgentError::Cancelled)
        } else {
            Ok(status)
        }
    }

    fn timed_out(&self) -> AgentError {
        AgentError::Backend {
            user_message: format!(
                "`{}` did not finish within {} s and was stopped. Raise agent.command.timeout_secs if it needs longer.",
                self.program(),
                self.config.timeout_secs
            ),
            detail: format!("command timed out after {} s", self.config.timeout_secs),
        }
    }

    /// The error for a program that exited unsuccessfully.
    fn failure(&self, status: ExitStatus, stderr: &StderrTail) -> AgentError {
        let how = match (status.code(), status.signal()) {
            (Some(code), _) => format!("failed with exit code {code}"),
            (None, Some(signal)) => format!("was killed by signal {}", signal_name(signal)),
            (None, None) => format!("failed ({status})"),
        };
        let mut user_message = format!("`{}` {how}.", self.program());
        let tail = last_lines(&stderr.text(), STDERR_MESSAGE_LINES, STDERR_MESSAGE_CHARS);
        if !tail.is_empty() {
            let fence = code_fence_for(&tail);
            user_message.push_str(&format!("\n{fence}\n{tail}\n{fence}"));
        }
        AgentError::Backend {
            user_message,
            detail: format!(
                "command {:?} {how}; stderr tail: {:?}",
                self.program(),
                stderr.text()
            ),
        }
    }
}

impl Agent for CommandAgent {
    fn name(&self) -> &str {
        "command"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(self.run_turn(turn))
    }
}

/// How the first phase of a run ended.
enum Ended {
    Exited(io::Result<ExitStatus>),
    Stopped,
    TimedOut,
}

async fn sleep_for(limit: Option<Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// The pipe pump, polled alongside whatever the supervisor waits for, so
/// the program never blocks on a full pipe.
struct Pumping<F> {
    io: Pin<Box<F>>,
    done: bool,
}

impl<F: Future<Output = ()>> Pumping<F> {
    fn new(io: F) -> Self {
        Pumping {
            io: Box::pin(io),
            done: false,
        }
    }

    /// Run `work` to completion while pumping.
    async fn alongside<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = self.io.as_mut(), if !self.done => self.done = true,
            }
        }
    }

    /// Pump until both output pipes are closed.
    async fn finish(&mut self) {
        if !self.done {
            self.io.as_mut().await;
            self.done = true;
        }
    }
}

/// Feed stdin and read stdout and stderr until each is done.
async fn pump(
    stdin: Option<(ChildStdin, String)>,
    stdout: Option<impl AsyncRead + Unpin>,
    stderr: Option<impl AsyncRead + Unpin>,
    out: &mut StdoutCollector,
    err: &mut StderrTail,
) {
    tokio::join!(
        feed(stdin),
        read_all(stdout, |bytes| out.push(bytes)),
        read_all(stderr, |bytes| err.push(bytes)),
    );
}

/// Write the message to stdin and close it. A program that exits without
/// reading it all is not an error.
async fn feed(stdin: Option<(ChildStdin, String)>) {
    let Some((mut pipe, text)) = stdin else {
        return;
    };
    if let Err(error) = pipe.write_all(text.as_bytes()).await {
        tracing::debug!(%error, "the command did not read all of its stdin");
    }
    // Dropping the pipe closes it: the program sees end-of-file.
}

async fn read_all(reader: Option<impl AsyncRead + Unpin>, mut sink: impl FnMut(&[u8])) {
    let Some(mut reader) = reader else {
        return;
    };
    let mut buf = vec![0; READ_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => sink(&buf[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(%error, "reading the command's output failed");
                return;
            }
        }
    }
}

/// Decodes a byte stream as UTF-8 without ever splitting a character: an
/// incomplete sequence at the end of a chunk waits for the next one.
/// Invalid bytes become U+FFFD.
#[derive(Debug, Default)]
struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text of `bytes` (after any held-back bytes), minus an incomplete
    /// character at the end.
    fn decode(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.pending.len());
        let mut start = 0;
        while start < self.pending.len() {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(text) => {
                    out.push_str(text);
                    start = self.pending.len();
                }
                Err(error) => {
                    let valid_end = start + error.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match error.error_len() {
                        Some(invalid) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + invalid;
                        }
                        None => {
                            // Incomplete at the end: keep it for next time.
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Whatever is held back, at end of stream.
    fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Stdout: streamed into the turn's progress and kept for the reply, up to
/// the cap.
struct StdoutCollector {
    progress: Progress,
    cap: usize,
    accepted: usize,
    truncated: bool,
    decoder: Utf8Stream,
    text: String,
}

impl StdoutCollector {
    fn new(progress: Progress, cap: usize) -> Self {
        StdoutCollector {
            progress,
            cap,
            accepted: 0,
            truncated: false,
            decoder: Utf8Stream::default(),
            text: String::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let take = bytes.len().min(self.cap.saturating_sub(self.accepted));
        if take < bytes.len() {
            self.truncated = true;
        }
        if take == 0 {
            // Discarded, but still a sign of life.
            self.progress.still_working();
            return;
        }
        self.accepted += take;
        let text = self.decoder.decode(&bytes[..take]);
        self.emit(&text);
    }

    /// End of output: flush a held-back partial character (unless the cap
    /// cut it, in which case it is dropped with the rest).
    fn finish(&mut self) {
        let rest = self.decoder.finish();
        if !self.truncated {
            self.emit(&rest);
        }
    }

    fn emit(&mut self, text: &str) {
        if text.is_empty() {
            self.progress.still_working();
        } else {
            self.progress.push_text(text);
            self.text.push_str(text);
        }
    }

    fn into_reply(self) -> AgentReply {
        let text = self.text.trim_end();
        let mut reply = if text.is_empty() {
            "(the command printed nothing)".to_string()
        } else {
            text.to_string()
        };
        if self.truncated {
            reply.push_str(&format!(
                "\n\n[output truncated at {}]",
                human_bytes(self.cap)
            ));
        }
        AgentReply::new(reply)
    }
}

/// The last few KiB of stderr.
struct StderrTail {
    progress: Progress,
    buf: Vec<u8>,
}

impl StderrTail {
    fn new(progress: Progress) -> Self {
        StderrTail {
            progress,
            buf: Vec::new(),
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.progress.still_working();
        let bytes = &bytes[bytes.len().saturating_sub(STDERR_TAIL_BYTES)..];
        self.buf.extend_from_slice(bytes);
        let excess = self.buf.len().saturating_sub(STDERR_TAIL_BYTES);
        self.buf.drain(..excess);
    }

    /// The tail as text (it may start mid-character; that is replaced).
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf)
            .trim_start_matches(char::REPLACEMENT_CHARACTER)
            .trim_end()
            .to_string()
    }
}

/// The last non-empty lines of `text`, at most `max_lines` lines and about
/// `max_chars` characters (a longer last line keeps its end).
fn last_lines(text: &str, max_lines: usize, max_chars: usize) -> String {
    let mut picked: Vec<&str> = Vec::new();
    let mut chars = 0;
    for line in text.lines().rev().filter(|l| !l.trim().is_empty()) {
        let len = line.chars().count() + 1;
        if picked.len() == max_lines || (chars + len > max_chars && !picked.is_empty()) {
            break;
        }
        chars += len;
        picked.push(line);
    }
    picked.reverse();
    let joined = picked.join("\n");
    let count = joined.chars().count();
    if count <= max_chars {
        return joined;
    }
    let tail: String = joined.chars().skip(count - max_chars).collect();
    format!("…{tail}")
}

/// A Markdown code fence longer than any backtick run in `text`.
fn code_fence_for(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

fn human_bytes(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    match bytes {
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b / 1024),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(argv: &[&str]) -> CommandConfig {
        CommandConfig::new(argv.iter().map(|s| s.to_string()).collect())
    }

    fn values() -> Substitutions<'static> {
        Substitutions {
            message: "hi {session_id}",
            session_id: "s1",
            chat_id: "-42".to_string(),
        }
    }

    #[test]
    fn placeholders_are_substituted_inside_elements_only() {
        let v = values();
        assert_eq!(v.expand("{message}").unwrap(), "hi {session_id}");
        assert_eq!(
            v.expand("--prompt={message}@{chat_id}/{session_id}")
                .unwrap(),
            "--prompt=hi {session_id}@-42/s1"
        );
        assert_eq!(v.expand("{{message}}").unwrap(), "{message}");
        assert_eq!(v.expand("{\"a\":{\"b\":1}}").unwrap(), "{\"a\":{\"b\":1}}");
        assert_eq!(v.expand("{print $1}").unwrap(), "{print $1}");
        assert_eq!(v.expand("{{.Name}}").unwrap(), "{{.Name}}");
        assert_eq!(v.expand("{ message }").unwrap(), "{ message }");
        assert_eq!(v.expand("é{chat_id}é{").unwrap(), "é-42é{");
        assert!(v.expand("{foo}").unwrap_err().contains("{foo}"));
    }

    #[test]
    fn validation_names_the_problem() {
        assert!(config(&[]).validate().unwrap_err().contains("empty"));
        assert!(config(&["llm", "{model}"])
            .validate()
            .unwrap_err()
            .contains("argv[1]: unknown placeholder {model}"));
        assert!(config(&["{message}"])
            .validate()
            .unwrap_err()
            .contains("argv[0]"));
        assert!(config(&["llm", "{{model}}", "--", "{message}"])
            .validate()
            .is_ok());

        let mut c = config(&["llm"]);
        c.workdir = Some(PathBuf::from("/definitely/not/a/dir"));
        assert!(c.validate().unwrap_err().contains("workdir"));

        let mut c = config(&["llm"]);
        c.env.insert("A=B".to_string(), "x".to_string());
        assert!(c.validate().unwrap_err().contains("agent.command.env"));

        let mut c = config(&["llm"]);
        c.output_cap_bytes = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn toml_defaults_and_unknown_keys() {
        let c: CommandConfig = toml::from_str("argv = [\"llm\", \"{message}\"]").unwrap();
        assert_eq!(c, config(&["llm", "{message}"]));
        assert_eq!(c.output_cap_bytes, 65536);
        assert_eq!(c.kill_grace_ms, 2000);
        assert!(toml::from_str::<CommandConfig>("argv = [\"x\"]\ntimeout = 3").is_err());
        assert!(toml::from_str::<CommandConfig>("stdin = true").is_err());
    }

    #[test]
    fn utf8_stream_never_splits_a_character() {
        let text = "héllo 🎉 wörld";
        let mut decoder = Utf8Stream::default();
        let mut out = String::new();
        for byte in text.as_bytes() {
            let piece = decoder.decode(std::slice::from_ref(byte));
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
            out.push_str(&piece);
        }
        out.push_str(&decoder.finish());
        assert_eq!(out, text);

        let mut decoder = Utf8Stream::default();
        assert_eq!(decoder.decode(b"a\xffb\xf0\x9f"), "a\u{fffd}b");
        assert_eq!(decoder.finish(), "\u{fffd}");
    }

    #[test]
    fn stdout_cap_counts_bytes_and_drops_a_cut_character() {
        let mut out = StdoutCollector::new(Progress::new(), 4);
        out.push("ab".as_bytes());
        out.push("cé".as_bytes()); // the cap cuts é in half
        out.push(b"more");
        out.finish();
        assert_eq!(
            out.into_reply().text,
            "abc\n\n[output truncated at 4 bytes]"
        );
        assert_eq!(human_bytes(64 * 1024), "64 KiB");
        assert_eq!(human_bytes(2 * 1024 * 1024), "2 MiB");
    }

    #[test]
    fn stderr_keeps_a_bounded_tail() {
        let mut err = StderrTail::new(Progress::new());
        for i in 0..2000 {
            err.push(format!("line {i}\n").as_bytes());
        }
        assert!(err.buf.len() <= STDERR_TAIL_BYTES);
        assert!(err.text().ends_with("line 1999"));
        let tail = last_lines(&err.text(), 3, 800);
        assert_eq!(tail, "line 1997\nline 1998\nline 1999");
        let long = "x".repeat(2000);
        assert_eq!(last_lines(&long, 3, 10).chars().count(), 11);
    }

    #[test]
    fn code_fences_outgrow_backticks() {
        assert_eq!(code_fence_for("plain"), "```");
        assert_eq!(code_fence_for("a ```` b"), "`````");
    }
}
