//! The `command` backend: runs a configured program once per turn.
//!
//! This is how Claude Code, Codex CLI, `llm` or a user's own script go behind
//! the bot. Each turn spawns `argv` with the message substituted into it (or
//! written to stdin), streams the program's stdout into the turn's
//! [`Progress`], and answers with that output once the program exits.
//!
//! Why it looks the way it does:
//!
//! * **No shell.** Placeholders (`{message}`, `{session_id}`, `{chat_id}`,
//!   `{files}`; `{resume}` / `{resume_id}` with `resume_args`)
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
//!   because it reaches the leader alone. The group also dies with
//!   telegate: the leader gets the parent-death signal, and a crash's
//!   leftovers in the group are killed at the next start, before recovery
//!   runs the message again (the group is recorded in the store while it
//!   runs, see [`crate::tools::childgroups`]). A program that really wants
//!   to outlive the turn has to leave the group itself (`setsid`).
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

mod argv;
mod config;
mod history;
pub(crate) mod native_sessions;
mod output;
mod presets;
mod process;
pub mod protocol;
pub(crate) mod workdir;

pub use config::{CommandConfig, HistoryMode, Preset};
pub use history::HISTORY_FILE_ENV;
pub use protocol::Protocol;

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};

use futures::future::BoxFuture;
use tokio::process::{Child, Command};

use super::{Agent, AgentError, AgentReply, TurnRequest};
use crate::agent::AgentTables;
use crate::store::AgentUsage;
use crate::tools::childgroups::{GroupLedger, RecordedGroup};
use crate::tools::permission::{PermissionPrompts, TurnPrompt};
use crate::tools::process::ProcessOwner;
use crate::tools::procgroup::{spawn_leader, ProcessGroup};
use crate::vocab::{ALWAYS_STRIPPED_ENV, CHAT_ID_ENV, SESSION_ID_ENV};
use argv::{Substitutions, RESUME_PLACEHOLDER};
use history::HistoryFile;
use native_sessions::AgentSessions;
use output::StdoutCollector;
use process::{pump, StderrTail};
use protocol::{JsonlCollector, JsonlOutcome, OutputCollector};

/// The one line a user sees when the agent's session could not be resumed.
pub const RESUME_LOST_NOTICE: &str =
    "ℹ️ The agent's previous session could not be resumed (unknown or expired), so this answer starts a fresh one.";

/// Runs a configured program once per turn. See the module documentation.
#[derive(Clone, Debug)]
pub struct CommandAgent {
    config: CommandConfig,
    /// Every variable name removed from the child's environment.
    stripped_env: BTreeSet<String>,
    /// The agent's own session per telegate session, and usage.
    sessions: Arc<AgentSessions>,
    /// `command`, or the preset's name.
    name: &'static str,
    /// Where each run's process group is recorded (with a store).
    groups: Arc<OnceLock<GroupLedger>>,
    /// Where `history = "env-file"` files go (the temporary directory
    /// without a data directory).
    history_dir: Option<PathBuf>,
    /// Claude Code's permission prompts on the approval card
    /// (`permission_prompt = true`).
    permissions: Option<PermissionPrompts>,
    /// A git worktree per conversation (`worktree`), the program's workdir.
    worktrees: Option<Arc<crate::worktree::Worktrees>>,
}

/// Why one run of the program gave no answer.
enum RunFailure {
    /// Anything that ends the turn.
    Agent(AgentError),
    /// The agent does not know the session it was asked to resume.
    ResumeRejected(String),
}

impl From<AgentError> for RunFailure {
    fn from(error: AgentError) -> Self {
        RunFailure::Agent(error)
    }
}

impl RunFailure {
    fn into_agent_error(self) -> AgentError {
        match self {
            RunFailure::Agent(error) => error,
            RunFailure::ResumeRejected(detail) => AgentError::Backend {
                user_message: "The agent could not start a session.".to_string(),
                detail,
            },
        }
    }
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
        let name = config.preset.map_or("command", Preset::as_str);
        let worktrees = config.worktree.clone().map(crate::worktree::Worktrees::new);
        CommandAgent {
            worktrees,
            config,
            stripped_env,
            sessions: Arc::new(AgentSessions::default()),
            name,
            groups: Arc::new(OnceLock::new()),
            history_dir: None,
            permissions: None,
        }
    }

    /// Ask Claude Code's permission prompts through `prompts` (the claude
    /// preset with `permission_prompt = true`).
    pub fn with_permission_prompts(mut self, prompts: PermissionPrompts) -> Self {
        self.permissions = Some(prompts);
        self
    }

    /// Keep `history = "env-file"` files in `<data_dir>/command-history`
    /// (0700) instead of the shared temporary directory, removing what a
    /// killed process left there. Call it at start, before any turn.
    pub fn with_history_dir(mut self, data_dir: &Path) -> Self {
        let dir = history::history_dir(data_dir);
        if self.config.history != HistoryMode::EnvFile && !dir.exists() {
            return self;
        }
        match history::clear_leftovers(&dir) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(removed, dir = %dir.display(), "removed history files a killed run left behind");
            }
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "could not clear the history directory");
            }
        }
        self.history_dir = Some(dir);
        self
    }

    /// The program as configured, for messages.
    fn program(&self) -> &str {
        match self.config.preset {
            Some(preset) => self
                .config
                .program
                .as_deref()
                .unwrap_or(preset.default_program()),
            None => self.config.argv.first().map_or("", String::as_str),
        }
    }

    /// The config key that names the program, for messages.
    fn program_key(&self) -> &'static str {
        if self.config.preset.is_some() {
            "agent.command.program (or PATH)"
        } else {
            "agent.command.argv"
        }
    }

    /// The argv for this turn, placeholders substituted; `resume_args` go
    /// where `{resume}` stands (or at the end) when `resume` is given.
    fn argv_for(
        &self,
        turn: &TurnRequest,
        resume: Option<&str>,
    ) -> Result<Vec<String>, AgentError> {
        let values = Substitutions {
            message: &turn.text,
            session_id: turn.session_id.as_str(),
            chat_id: turn.source.chat_id.to_string(),
            files: crate::media::command_files::joined_paths(),
            resume_id: resume.unwrap_or_default(),
        };
        let resume_args = |argv: &mut Vec<String>| -> Result<(), AgentError> {
            if resume.is_some() {
                for element in &self.config.resume_args {
                    argv.push(values.expand(element).map_err(AgentError::backend)?);
                }
            }
            Ok(())
        };
        let mut argv = Vec::with_capacity(self.config.argv.len());
        let mut placed = false;
        for element in &self.config.argv {
            if element == crate::media::command_files::FILES_PLACEHOLDER {
                argv.extend(crate::media::command_files::file_paths());
                continue;
            }
            if element == RESUME_PLACEHOLDER {
                resume_args(&mut argv)?;
                placed = true;
                continue;
            }
            let arg = values.expand(element).map_err(AgentError::backend)?;
            if arg.contains('\0') {
                return Err(AgentError::backend(
                    "The message contains a NUL character, which cannot be passed to a command.",
                ));
            }
            argv.push(arg);
        }
        if !placed {
            resume_args(&mut argv)?;
        }
        Ok(argv)
    }

    /// The name the agent's session is kept under, if this backend
    /// continues one: the preset, or the protocol of an argv with
    /// `resume_args`.
    fn resume_backend(&self) -> Option<&'static str> {
        match self.config.preset {
            Some(preset) => Some(preset.as_str()),
            None if !self.config.resume_args.is_empty() => Some(self.config.protocol().as_str()),
            None => None,
        }
    }

    /// The process to start: no shell, scrubbed environment (its own
    /// process group comes with [`spawn_leader`]).
    fn command(&self, argv: &[String], turn: &TurnRequest, launch: &Launch) -> Command {
        let mut command = Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .stdin(if launch.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(dir) = &launch.workdir {
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
        crate::media::command_files::apply_env(&mut command);
        crate::schedule::apply_env(&mut command);
        if let Some(file) = &launch.history_file {
            command.env(HISTORY_FILE_ENV, file.path());
        }
        command
    }

    /// The working directory for this turn (a per-chat one is created;
    /// with `worktree`, the session's worktree).
    async fn workdir_for(&self, turn: &TurnRequest) -> Result<Option<PathBuf>, AgentError> {
        if let Some(worktrees) = &self.worktrees {
            return crate::agent::worktree_for(worktrees, turn, "agent.command")
                .await
                .map(Some);
        }
        let Some(dir) = &self.config.workdir else {
            return Ok(None);
        };
        workdir::resolve(dir, turn.source.chat_id, turn.session_key.as_str())
            .map(Some)
            .map_err(|error| AgentError::Backend {
                user_message:
                    "Could not create this chat's working directory. Check agent.command.workdir."
                        .to_string(),
                detail: format!(
                    "creating the workdir from {} failed: {error}",
                    dir.display()
                ),
            })
    }

    /// Start the process, turning failures into messages that say what to
    /// fix.
    fn spawn(&self, command: Command, workdir: Option<&Path>) -> Result<Child, AgentError> {
        if let Some(dir) = workdir {
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
        spawn_leader(command).map_err(|error| {
            let program = self.program();
            let key = self.program_key();
            let user_message = match error.kind() {
                io::ErrorKind::NotFound => {
                    format!("Could not start `{program}`: not found. Check {key}.")
                }
                io::ErrorKind::PermissionDenied => format!(
                    "Could not start `{program}`: permission denied (is it executable?). Check {key}."
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
        // The messages name config keys and placeholders, never values.
        self.config.check_values().map_err(|problem| {
            AgentError::backend(format!("The command backend is misconfigured: {problem}"))
        })?;
        let workdir = self.workdir_for(&turn).await?;
        let Some(backend) = self.resume_backend() else {
            return self
                .run_once(&turn, None, workdir)
                .await
                .map_err(RunFailure::into_agent_error);
        };
        let session = turn.session_id.as_str();
        let resume = self.sessions.resume_id(session).await;
        match self
            .run_once(&turn, resume.as_deref(), workdir.clone())
            .await
        {
            Ok(reply) => Ok(reply),
            Err(RunFailure::ResumeRejected(detail)) => {
                tracing::warn!(
                    session_id = session,
                    agent_session = resume.as_deref().unwrap_or_default(),
                    %detail,
                    "the agent does not know the session to resume; starting a fresh one"
                );
                self.sessions.forget(session, backend).await;
                turn.progress.set_text("");
                let mut reply = self
                    .run_once(&turn, None, workdir)
                    .await
                    .map_err(RunFailure::into_agent_error)?;
                reply.text = format!("{RESUME_LOST_NOTICE}\n\n{}", reply.text);
                Ok(reply)
            }
            Err(failure) => Err(failure.into_agent_error()),
        }
    }

    /// What one run gets besides its argv.
    fn launch(&self, turn: &TurnRequest, workdir: Option<PathBuf>) -> Result<Launch, AgentError> {
        let stdin = if self.config.preset.is_some() || self.config.stdin {
            Some(turn.text.clone())
        } else if self.config.history == HistoryMode::StdinJson {
            Some(history::stdin_json(&turn.text, &turn.history))
        } else {
            None
        };
        let history_file = if self.config.history == HistoryMode::EnvFile {
            let dir = self.history_dir.clone().unwrap_or_else(std::env::temp_dir);
            let file =
                HistoryFile::write(&dir, &turn.history).map_err(|error| AgentError::Backend {
                    user_message: "Could not write the conversation history for the command."
                        .to_string(),
                    detail: format!("writing the history file failed: {error}"),
                })?;
            Some(file)
        } else {
            None
        };
        Ok(Launch {
            stdin,
            workdir,
            history_file,
        })
    }

    /// Run the program once: `resume` continues that agent session.
    async fn run_once(
        &self,
        turn: &TurnRequest,
        resume: Option<&str>,
        workdir: Option<PathBuf>,
    ) -> Result<AgentReply, RunFailure> {
        let preset = self.config.preset;
        // Held for the whole run: dropping it ends the turn's token.
        let prompt = self.open_prompt(turn).await?;
        let prompt_args = prompt.as_ref().map(TurnPrompt::args).unwrap_or_default();
        let argv = match preset {
            Some(preset) => preset.argv(
                &self.config,
                resume,
                &crate::media::turn_files().attachments,
                &prompt_args,
            ),
            None => self.argv_for(turn, resume)?,
        };
        let launch = self.launch(turn, workdir)?;
        let command = self.command(&argv, turn, &launch);
        let mut child = self.spawn(command, launch.workdir.as_deref())?;
        let Some(group) = child.id().and_then(ProcessGroup::of_leader) else {
            return Err(AgentError::backend(format!(
                "Could not start `{}`: it has no process id.",
                self.program()
            ))
            .into());
        };
        tracing::debug!(
            program = self.program(),
            pid = group.id().raw(),
            resume,
            "command started"
        );
        // Recorded until the run is over, so a crash's leftovers are killed
        // at the next start (`tools::childgroups`).
        let _recorded = self
            .groups
            .get()
            .map_or_else(RecordedGroup::none, |ledger| {
                ledger.record(group.id(), "command")
            });
        let (stdout, stderr, outcome) = self.collect(&mut child, group, launch, turn).await;
        let status = outcome?;
        let collector = match stdout {
            OutputCollector::Text(collector) => {
                return match status {
                    status if status.success() => Ok(collector.into_reply()),
                    status => Err(self.failure(status, &stderr).into()),
                };
            }
            OutputCollector::Jsonl(collector) => collector,
        };
        let outcome = collector.into_outcome();
        let backend = preset.map_or(self.config.protocol().as_str(), Preset::as_str);
        // Codex reports the thread's running total after a resume, not
        // the turn's: the difference to its last report is the turn's.
        let thread = outcome.session.as_deref().or(resume);
        self.record_usage(turn, backend, outcome.usage, thread)
            .await;
        if outcome.skipped > 0 {
            tracing::info!(skipped = outcome.skipped, "event lines skipped this turn");
        }
        self.jsonl_reply(outcome, status, &stderr, resume)
    }

    /// Feed the launch's stdin to the child and collect its stdout (as its
    /// protocol says) and stderr tail while it is supervised; the launch
    /// (its history file) is dropped once the child is done.
    async fn collect(
        &self,
        child: &mut Child,
        group: ProcessGroup,
        launch: Launch,
        turn: &TurnRequest,
    ) -> (OutputCollector, StderrTail, Result<ExitStatus, AgentError>) {
        let stdin = match (launch.stdin.clone(), child.stdin.take()) {
            (Some(text), Some(pipe)) => Some((pipe, text)),
            _ => None,
        };
        let protocol = self.config.protocol();
        let cap = self.config.output_cap_bytes;
        let mut stdout = match protocol {
            Protocol::Text => {
                OutputCollector::Text(StdoutCollector::new(turn.progress.clone(), cap))
            }
            _ => OutputCollector::Jsonl(Box::new(JsonlCollector::new(
                protocol,
                turn.progress.clone(),
                cap,
                self.session_sink(turn),
            ))),
        };
        let mut stderr = StderrTail::new(turn.progress.clone());
        let io = pump(
            stdin,
            child.stdout.take(),
            child.stderr.take(),
            &mut stdout,
            &mut stderr,
        );
        let outcome = self.supervise(child, group, io, turn).await;
        stdout.finish();
        drop(launch);
        tracing::debug!(
            program = self.program(),
            stderr = %stderr.text(),
            "command stderr (tail)"
        );
        (stdout, stderr, outcome)
    }

    /// Record a JSONL turn's usage, if it reported one: Codex's running
    /// thread total by its `thread`, any other's as the turn's.
    async fn record_usage(
        &self,
        turn: &TurnRequest,
        backend: &'static str,
        usage: Option<AgentUsage>,
        thread: Option<&str>,
    ) {
        match (usage, thread) {
            (Some(usage), Some(thread)) if self.config.protocol() == Protocol::CodexJson => {
                self.sessions
                    .record_thread_usage(turn.session_id.as_str(), backend, thread, usage)
                    .await;
            }
            (Some(usage), _) => {
                self.sessions
                    .record_usage(turn.session_id.as_str(), backend, usage)
                    .await;
            }
            (None, _) => {}
        }
    }

    /// A JSONL turn's reply: the failure the agent reported or its exit
    /// status said (a rejected resume when either says the session is
    /// unknown), else its answer.
    fn jsonl_reply(
        &self,
        outcome: JsonlOutcome,
        status: ExitStatus,
        stderr: &StderrTail,
        resume: Option<&str>,
    ) -> Result<AgentReply, RunFailure> {
        let rejected = |said: &str| resume.is_some() && presets::says_session_is_unknown(said);
        if let Some(message) = outcome.failure {
            if rejected(&message) || rejected(&stderr.text()) {
                return Err(RunFailure::ResumeRejected(message));
            }
            return Err(AgentError::Backend {
                user_message: format!(
                    "`{}` reported an error: {}",
                    self.program(),
                    protocol::one_line(&message, 600)
                ),
                detail: format!("agent error: {message:?}; stderr tail: {:?}", stderr.text()),
            }
            .into());
        }
        if !status.success() {
            if rejected(&stderr.text()) {
                return Err(RunFailure::ResumeRejected(stderr.text()));
            }
            return Err(self.failure(status, stderr).into());
        }
        let answer = outcome
            .answer
            .unwrap_or_else(|| "(the agent gave no answer)".to_string());
        Ok(AgentReply::new(answer))
    }

    /// This turn's permission prompts, when the claude preset asks the
    /// chat (outside a chat turn there is nobody to ask: Claude Code then
    /// refuses what it was not allowed in advance, as without a prompt).
    async fn open_prompt(&self, turn: &TurnRequest) -> Result<Option<TurnPrompt>, AgentError> {
        let (Some(prompts), Some(Preset::Claude), true) = (
            &self.permissions,
            self.config.preset,
            self.config.permission_prompt,
        ) else {
            return Ok(None);
        };
        let Some(owner) = ProcessOwner::capture() else {
            tracing::info!("no chat turn: Claude Code's permission prompts are off for this run");
            return Ok(None);
        };
        prompts
            .open_turn(owner, turn.cancel.clone(), turn.progress.clone())
            .await
            .map(Some)
            .map_err(|detail| AgentError::Backend {
                user_message:
                    "Could not set up the approval of Claude Code's tool uses; nothing was run."
                        .to_string(),
                detail,
            })
    }

    /// Where the agent session id read from the output goes: remembered at
    /// once when the backend resumes sessions (so even a stopped turn can
    /// be continued).
    fn session_sink(&self, turn: &TurnRequest) -> Box<dyn FnMut(&str) + Send> {
        let Some(backend) = self.resume_backend() else {
            return Box::new(|_| {});
        };
        let sessions = self.sessions.clone();
        let session = turn.session_id.as_str().to_string();
        Box::new(move |id| sessions.remember(&session, backend, id))
    }
}

/// What a run gets besides its argv; the history file lives as long as
/// this does.
struct Launch {
    stdin: Option<String>,
    workdir: Option<PathBuf>,
    history_file: Option<HistoryFile>,
}

impl Agent for CommandAgent {
    fn name(&self) -> &str {
        self.name
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(self.run_turn(turn))
    }

    fn leaves_files(&self) -> bool {
        true
    }

    /// Only a program told to take the history (`history = "stdin_json"`
    /// or `"env_file"`) reads it; the presets resume sessions of their own.
    fn reads_history(&self) -> bool {
        self.config.history != HistoryMode::None
    }

    fn worktrees(&self) -> Option<Arc<crate::worktree::Worktrees>> {
        self.worktrees.clone()
    }

    fn attach_store(&self, tables: &AgentTables) {
        self.sessions.attach(&tables.sessions);
        let _ = self
            .groups
            .set(GroupLedger::new(tables.child_groups.clone()));
    }
}
