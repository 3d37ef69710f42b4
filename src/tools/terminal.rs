//! The terminal tool: shell commands for the model, in the foreground or in
//! the background, behind an approval gate.
//!
//! Two tools are advertised:
//! * `terminal` runs `sh -c <command>`. In the foreground the call waits
//!   (at most `timeout_secs`, output capped) and returns the exit status and
//!   output; on timeout, or when the turn is cancelled, the command's whole
//!   process group is killed (a drop guard does it even when the call's
//!   future is simply dropped). With `background = true` it returns at once
//!   with a process id; with `notify_on_complete` the chat is woken when the
//!   process ends (see [`super::wakeup`]).
//! * `process` lists the chat's processes, polls new output, waits for one
//!   (seeing the exit there means no wakeup follows) or kills one.
//!
//! **Whose chat.** The owner of everything started here is read from the
//! task-local turn identity ([`ProcessOwner::capture`]), never from global
//! state. Outside a turn there is no owner, and the tool says what it does
//! then: foreground commands run, background processes and approvals are
//! refused (there is no chat to report to or ask), and `process` sees only
//! processes without an owner.
//!
//! This module owns the tool definitions, argument parsing and result
//! texts, and the `[tools.terminal]` settings. It must never send anything
//! to a chat except through the approval gate, and never let a model reach
//! another chat's processes.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use super::approval::{
    ApprovalGate, ApprovalMode, ApprovalPolicy, DangerPatterns, Denial, Verdict,
};
use super::events::ToolEventSender;
use super::process::{
    ProcessId, ProcessMode, ProcessOwner, ProcessRecord, ProcessRegistry, ProcessState,
    RegistryConfig, Scope, SpawnSpec, WaitOutcome,
};
use super::{ToolContext, ToolDefinition, ToolError, ToolRegistry};
use crate::vocab::current_identity;

/// The name of the shell tool.
pub const TERMINAL_TOOL: &str = "terminal";
/// The name of the process tool.
pub const PROCESS_TOOL: &str = "process";

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// `[tools.terminal]`: whether the model may run shell commands, and how.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalConfig {
    /// Offer the terminal and process tools to the model (openai backend).
    #[serde(default)]
    pub enabled: bool,
    /// Which commands need the user's approval: `dangerous` (default),
    /// `always` or `never`.
    #[serde(default)]
    pub approval: ApprovalMode,
    /// More dangerous patterns (see [`super::approval`] for the language).
    #[serde(default)]
    pub dangerous_patterns: Vec<String>,
    /// Use only `dangerous_patterns`, without the built-in ones.
    #[serde(default)]
    pub replace_default_patterns: bool,
    /// The working directory of every command (default: the bot's own),
    /// and the only directory `send_file` sends from (without it, the
    /// tool is not offered). Required with `run_as`.
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// The longest a foreground command may run, in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// Output kept per command (the newest bytes).
    #[serde(default = "default_output_cap_bytes")]
    pub output_cap_bytes: usize,
    /// Background processes that may run per chat.
    #[serde(default = "default_max_background")]
    pub max_background: usize,
    /// Background processes that may run overall.
    #[serde(default = "default_max_background_total")]
    pub max_background_total: usize,
    /// Seconds an approval request waits before it counts as denied.
    #[serde(default = "default_approval_timeout_secs")]
    pub approval_timeout_secs: u64,
    /// More variables passed from telegate's environment to commands,
    /// besides PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*,
    /// TERM, TZ and TMPDIR (secrets never pass).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Variables set for every command.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Run every command as this user (name or uid); telegate must start
    /// as root. See SECURITY.md.
    #[serde(default)]
    pub run_as: Option<String>,
}

fn default_timeout_secs() -> u64 {
    120
}
fn default_output_cap_bytes() -> usize {
    64 * 1024
}
fn default_max_background() -> usize {
    4
}
fn default_max_background_total() -> usize {
    16
}
fn default_approval_timeout_secs() -> u64 {
    300
}

impl Default for TerminalConfig {
    fn default() -> Self {
        TerminalConfig {
            enabled: false,
            approval: ApprovalMode::Dangerous,
            dangerous_patterns: Vec::new(),
            replace_default_patterns: false,
            workdir: None,
            timeout_secs: default_timeout_secs(),
            output_cap_bytes: default_output_cap_bytes(),
            max_background: default_max_background(),
            max_background_total: default_max_background_total(),
            approval_timeout_secs: default_approval_timeout_secs(),
            pass_env: Vec::new(),
            env: std::collections::BTreeMap::new(),
            run_as: None,
        }
    }
}

impl TerminalConfig {
    /// Check the values; the error is one line naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let at_least_one = [
            ("timeout_secs", self.timeout_secs),
            ("output_cap_bytes", self.output_cap_bytes as u64),
            ("max_background", self.max_background as u64),
            ("max_background_total", self.max_background_total as u64),
            ("approval_timeout_secs", self.approval_timeout_secs),
        ];
        for (key, value) in at_least_one {
            if value == 0 {
                return Err(format!("tools.terminal.{key} must be at least 1"));
            }
        }
        if self.max_background_total < self.max_background {
            return Err(format!(
                "tools.terminal.max_background_total ({}) is smaller than max_background ({})",
                self.max_background_total, self.max_background
            ));
        }
        DangerPatterns::build(&self.dangerous_patterns, self.replace_default_patterns)
            .map_err(|e| format!("tools.terminal.dangerous_patterns: {e}"))?;
        if self.replace_default_patterns
            && self.dangerous_patterns.is_empty()
            && self.approval == ApprovalMode::Dangerous
        {
            return Err(
                "tools.terminal.replace_default_patterns is set but dangerous_patterns is empty: \
                 nothing would ask for approval (say approval = \"never\" if that is meant)"
                    .to_string(),
            );
        }
        if let Some(dir) = &self.workdir {
            if !dir.is_dir() {
                return Err(format!(
                    "tools.terminal.workdir {} is not a directory",
                    dir.display()
                ));
            }
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(format!(
                    "tools.terminal.env: {name:?} is not a valid variable (empty, '=' or a NUL byte)"
                ));
            }
        }
        if let Some(user) = &self.run_as {
            // Without a workdir the commands (and `send_file`) would work
            // in telegate's own directory, next to its config and database.
            if self.workdir.is_none() {
                return Err(format!(
                    "tools.terminal.run_as = {user:?} needs tools.terminal.workdir: a directory \
                     owned by that user for its commands and the files it may send"
                ));
            }
            super::runas::RunAs::resolve(user)?;
        }
        Ok(())
    }

    fn foreground_timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

// ---------------------------------------------------------------------------
// The tool
// ---------------------------------------------------------------------------

/// The `terminal` and `process` tools over one process registry and one
/// approval gate.
#[derive(Debug)]
pub struct TerminalTool {
    registry: ProcessRegistry,
    approvals: ApprovalGate,
    policy: ApprovalPolicy,
    foreground_timeout: Duration,
}

impl TerminalTool {
    /// The tool for `config`. `secrets_to_strip` names environment
    /// variables no command may see (the bot token, the API key's
    /// variable); the command backend's always-stripped names are added.
    /// Wakeups and approval notices go to `events`.
    pub fn new(
        config: &TerminalConfig,
        secrets_to_strip: Vec<String>,
        events: ToolEventSender,
    ) -> Result<TerminalTool, String> {
        config.validate()?;
        let patterns =
            DangerPatterns::build(&config.dangerous_patterns, config.replace_default_patterns)?;
        let mut stripped_env: BTreeSet<String> = RegistryConfig::default().stripped_env;
        stripped_env.extend(secrets_to_strip.into_iter().filter(|n| !n.is_empty()));
        let registry = ProcessRegistry::new(
            RegistryConfig {
                workdir: config.workdir.clone(),
                child_env: super::childenv::ChildEnv {
                    pass: config.pass_env.iter().cloned().collect(),
                    set: config.env.clone(),
                    blocked: stripped_env.clone(),
                },
                stripped_env,
                run_as: config
                    .run_as
                    .as_deref()
                    .map(super::runas::RunAs::resolve)
                    .transpose()?,
                output_cap_bytes: config.output_cap_bytes,
                max_background_per_chat: config.max_background,
                max_background_total: config.max_background_total,
                ..RegistryConfig::default()
            },
            events.clone(),
        );
        Ok(TerminalTool {
            registry,
            approvals: ApprovalGate::new(Duration::from_secs(config.approval_timeout_secs), events),
            policy: ApprovalPolicy {
                mode: config.approval,
                patterns,
            },
            foreground_timeout: config.foreground_timeout(),
        })
    }

    /// The process registry (for /ps, /kill and /status).
    pub fn registry(&self) -> &ProcessRegistry {
        &self.registry
    }

    /// The approval gate (for /approve, /deny, /stop and /new).
    pub fn approvals(&self) -> &ApprovalGate {
        &self.approvals
    }

    async fn terminal(&self, arguments: &str, ctx: ToolContext) -> Result<String, ToolError> {
        let args: TerminalArgs = parse_arguments(arguments)?;
        let command = args.command.trim().to_string();
        if command.is_empty() {
            return Err(ToolError::BadArguments("command is empty".to_string()));
        }
        // The one place the owner is read: the task-local turn identity.
        let owner = ProcessOwner::capture();
        self.approve(&command, owner.as_ref(), &ctx).await?;
        if args.background {
            return self.start_background(command, owner, args.notify_on_complete);
        }
        let limit = args
            .timeout
            .map_or(self.foreground_timeout, Duration::from_secs)
            .min(self.foreground_timeout);
        self.run_foreground(command, owner, limit, &ctx).await
    }

    /// Ask for approval if the policy wants it. `Ok` means: run it.
    async fn approve(
        &self,
        command: &str,
        owner: Option<&ProcessOwner>,
        ctx: &ToolContext,
    ) -> Result<(), ToolError> {
        let Some(reason) = self.policy.reason_to_ask(command) else {
            return Ok(());
        };
        // Outside a turn there is nobody to ask: refused, explicitly.
        let Some(owner) = owner else {
            return Err(ToolError::Failed(Denial::NoChat.to_string()));
        };
        match self
            .approvals
            .ask(owner, command, &reason, &ctx.cancel, &ctx.progress)
            .await
        {
            Verdict::Approved => Ok(()),
            Verdict::Denied(denial) => Err(ToolError::Failed(denial.to_string())),
        }
    }

    fn start_background(
        &self,
        command: String,
        owner: Option<ProcessOwner>,
        notify_on_complete: bool,
    ) -> Result<String, ToolError> {
        if owner.is_none() {
            return Err(ToolError::Failed(
                "background processes can only be started from a chat turn".to_string(),
            ));
        }
        let record = self
            .registry
            .spawn_background(SpawnSpec {
                command,
                owner,
                mode: ProcessMode::Background { notify_on_complete },
            })
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        let follow_up = if notify_on_complete {
            "You will be woken with its result when it finishes; there is no need to wait for it."
        } else {
            "Use the process tool to poll its output, wait for it or kill it."
        };
        Ok(format!(
            "Started background process {} (process group {}). {follow_up}",
            record.id,
            record.pgid.unwrap_or_default()
        ))
    }

    async fn run_foreground(
        &self,
        command: String,
        owner: Option<ProcessOwner>,
        limit: Duration,
        ctx: &ToolContext,
    ) -> Result<String, ToolError> {
        // Dropping `run` (this future dropped mid-wait) kills the group.
        let run = self
            .registry
            .spawn_foreground(command, owner)
            .map_err(|e| ToolError::Failed(e.to_string()))?;
        match run.wait(limit, &ctx.cancel, &ctx.progress).await {
            WaitOutcome::Exited(record) => Ok(result_text(&record, &run.output())),
            WaitOutcome::StillRunning(record) => Err(ToolError::Failed(format!(
                "the command did not finish within {} s and was killed (use background = true \
                 for longer work). {}",
                limit.as_secs(),
                result_text(&record, &run.output())
            ))),
            WaitOutcome::Cancelled => Err(ToolError::Failed(
                "the turn was cancelled; the command was killed".to_string(),
            )),
        }
    }

    async fn process(&self, arguments: &str, ctx: ToolContext) -> Result<String, ToolError> {
        let args: ProcessArgs = parse_arguments(arguments)?;
        // Outside a turn only processes without an owner are visible.
        let identity = current_identity();
        let scope = identity
            .as_ref()
            .map_or(Scope::Unowned, |turn| Scope::Chat(&turn.session_key));
        let required_id = || {
            args.id.as_deref().map(ProcessId::new).ok_or_else(|| {
                ToolError::BadArguments(format!(
                    "action {:?} needs the process id",
                    args.action.as_str()
                ))
            })
        };
        let unknown =
            |id: &ProcessId| ToolError::Failed(format!("there is no process {id} in this chat"));
        match args.action {
            ProcessAction::List => Ok(list_text(&self.registry.list(scope))),
            ProcessAction::Poll => {
                let id = required_id()?;
                let (record, new_output, dropped) =
                    self.registry.poll(&id, scope).ok_or_else(|| unknown(&id))?;
                Ok(poll_text(&record, &new_output, dropped))
            }
            ProcessAction::Wait => {
                let id = required_id()?;
                let limit = args
                    .timeout
                    .map_or(self.foreground_timeout, Duration::from_secs)
                    .min(self.foreground_timeout);
                let outcome = self
                    .registry
                    .wait(&id, scope, limit, &ctx.cancel, Some(&ctx.progress))
                    .await
                    .ok_or_else(|| unknown(&id))?;
                match outcome {
                    WaitOutcome::Exited(record) => {
                        let output = self.registry.output(&id, scope).unwrap_or_default();
                        Ok(result_text(&record, &output))
                    }
                    WaitOutcome::StillRunning(record) => Ok(format!(
                        "{} is still running after {} s of waiting (it runs on).",
                        record.id,
                        limit.as_secs()
                    )),
                    WaitOutcome::Cancelled => Err(ToolError::Failed(
                        "the turn was cancelled while waiting".to_string(),
                    )),
                }
            }
            ProcessAction::Kill => {
                let id = required_id()?;
                let record = self
                    .registry
                    .kill(&id, scope)
                    .await
                    .ok_or_else(|| unknown(&id))?;
                Ok(format!("{}: {}.", record.id, record.state_text()))
            }
        }
    }
}

impl ToolRegistry for TerminalTool {
    /// Nothing to start: commands run when called.
    fn prepare<'a>(&'a self, _ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Its process groups are recorded through the ledger it was built
    /// with (see `engine`), not through this store.
    fn attach_store(&self, _child_groups: &crate::store::ChildGroups) {}

    fn definitions(&self) -> Vec<ToolDefinition> {
        vec![terminal_definition(), process_definition()]
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            match name {
                TERMINAL_TOOL => self.terminal(arguments, ctx).await,
                PROCESS_TOOL => self.process(arguments, ctx).await,
                other => Err(ToolError::UnknownTool(other.to_string())),
            }
        })
    }
}

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct TerminalArgs {
    command: String,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    notify_on_complete: bool,
    #[serde(default)]
    timeout: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ProcessAction {
    List,
    Poll,
    Wait,
    Kill,
}

impl ProcessAction {
    fn as_str(self) -> &'static str {
        match self {
            ProcessAction::List => "list",
            ProcessAction::Poll => "poll",
            ProcessAction::Wait => "wait",
            ProcessAction::Kill => "kill",
        }
    }
}

#[derive(Debug, Deserialize)]
struct ProcessArgs {
    action: ProcessAction,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
}

fn parse_arguments<T: serde::de::DeserializeOwned>(arguments: &str) -> Result<T, ToolError> {
    let text = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    serde_json::from_str(text).map_err(|e| ToolError::BadArguments(e.to_string()))
}

fn terminal_definition() -> ToolDefinition {
    ToolDefinition {
        name: TERMINAL_TOOL.to_string(),
        description: "Run a shell command (sh -c) on the bot's machine and return its exit \
            status and output (stdout and stderr together, the newest part if it is long). \
            Foreground commands are killed after a timeout; for long work set background = true \
            and, to be told when it ends, notify_on_complete = true. Some commands need the \
            user's approval first; a refusal comes back as an error."
            .to_string(),
        parameters: json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command."},
                "background": {
                    "type": "boolean",
                    "description": "Run it in the background and return its process id at once."
                },
                "notify_on_complete": {
                    "type": "boolean",
                    "description": "With background: wake this chat with the result when it ends."
                },
                "timeout": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Foreground only: seconds before it is killed (capped by the bot's limit)."
                }
            },
            "required": ["command"]
        }),
    }
}

fn process_definition() -> ToolDefinition {
    ToolDefinition {
        name: PROCESS_TOOL.to_string(),
        description: "Manage this chat's background processes: list them, poll one for new \
            output, wait for one to finish (with a timeout), or kill one (and everything it \
            started)."
            .to_string(),
        parameters: json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["list", "poll", "wait", "kill"]},
                "id": {"type": "string", "description": "The process id, e.g. p1a2b (not for list)."},
                "timeout": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "wait only: the most seconds to wait."
                }
            },
            "required": ["action"]
        }),
    }
}

// ---------------------------------------------------------------------------
// Result texts
// ---------------------------------------------------------------------------

/// "exit code 0" and the output (with a note when the start fell out of the
/// buffer).
fn result_text(record: &ProcessRecord, output: &str) -> String {
    let mut text = format!("{}: {}", record.id, record.state_text());
    let dropped = record
        .output
        .total
        .saturating_sub(record.output.held as u64);
    if dropped > 0 {
        text.push_str(&format!(
            "\n[the first {dropped} bytes of output were dropped; the last {} follow]",
            record.output.held
        ));
    }
    if output.trim().is_empty() {
        text.push_str("\n(no output)");
    } else {
        text.push('\n');
        text.push_str(output.trim_end());
    }
    text
}

fn poll_text(record: &ProcessRecord, new_output: &str, dropped: u64) -> String {
    let mut text = format!(
        "{}: {} ({} s)",
        record.id,
        record.state_text(),
        record.runtime.as_secs()
    );
    if dropped > 0 {
        text.push_str(&format!(
            "\n[{dropped} bytes fell out of the buffer unread]"
        ));
    }
    if new_output.is_empty() {
        text.push_str("\n(no new output)");
    } else {
        text.push_str("\nNew output:\n");
        text.push_str(new_output.trim_end());
    }
    text
}

fn list_text(records: &[ProcessRecord]) -> String {
    let background: Vec<&ProcessRecord> = records
        .iter()
        .filter(|r| matches!(r.mode, ProcessMode::Background { .. }))
        .collect();
    if background.is_empty() {
        return "No background processes.".to_string();
    }
    background
        .iter()
        .map(|r| {
            let state = match r.state {
                ProcessState::Running => "running".to_string(),
                ProcessState::Exited(_) => r.state_text(),
            };
            format!(
                "{} [{state}, {} s] {}",
                r.id,
                r.runtime.as_secs(),
                r.command
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_validation() {
        let config: TerminalConfig = toml::from_str("").unwrap();
        assert_eq!(config, TerminalConfig::default());
        assert!(!config.enabled);
        assert_eq!(config.approval, ApprovalMode::Dangerous);
        assert_eq!(config.timeout_secs, 120);
        assert_eq!(config.approval_timeout_secs, 300);
        assert!(config.validate().is_ok());
        assert!(toml::from_str::<TerminalConfig>("enabld = true").is_err());
        assert!(toml::from_str::<TerminalConfig>("approval = \"sometimes\"").is_err());

        let bad = |edit: fn(&mut TerminalConfig)| {
            let mut config = TerminalConfig::default();
            edit(&mut config);
            config.validate().unwrap_err()
        };
        assert!(bad(|c| c.timeout_secs = 0).contains("timeout_secs"));
        assert!(bad(|c| c.max_background = 0).contains("max_background"));
        assert!(bad(|c| c.max_background_total = 1).contains("max_background_total"));
        assert!(bad(|c| c.dangerous_patterns = vec!["**".into()]).contains("dangerous_patterns"));
        assert!(bad(|c| c.replace_default_patterns = true).contains("replace_default_patterns"));
        assert!(bad(|c| c.workdir = Some("/definitely/not/here".into())).contains("workdir"));
    }

    #[test]
    fn run_as_without_a_workdir_is_refused_whoever_starts_telegate() {
        // Checked before the user lookup, so it holds as root and not.
        let mut config = TerminalConfig {
            run_as: Some("nobody".into()),
            ..TerminalConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert!(error.contains("needs tools.terminal.workdir"), "{error}");
        config.workdir = Some(std::env::temp_dir());
        let error = config.validate().err().unwrap_or_default();
        assert!(!error.contains("workdir"), "{error}");
    }

    #[test]
    fn definitions_are_valid_object_schemas() {
        for definition in [terminal_definition(), process_definition()] {
            assert_eq!(definition.parameters["type"], "object");
            assert!(definition.name.len() <= 64);
        }
    }
}
