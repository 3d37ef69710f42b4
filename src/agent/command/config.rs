//! `[agent.command]`: the settings of the command backend and their
//! validation. Pure: reads the file system only to check `workdir`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::argv::{message_in_shell_script, tokenize, Field, Token, RESUME_PLACEHOLDER};
use super::protocol::Protocol;
use super::workdir;

/// `[agent.command] preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// Claude Code (`claude -p`).
    Claude,
    /// OpenAI Codex (`codex exec`).
    Codex,
}

impl Preset {
    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Claude => "claude",
            Preset::Codex => "codex",
        }
    }

    /// The protocol the preset's program speaks.
    pub fn protocol(self) -> Protocol {
        match self {
            Preset::Claude => Protocol::ClaudeStreamJson,
            Preset::Codex => Protocol::CodexJson,
        }
    }

    /// The executable run unless `program` says otherwise.
    pub fn default_program(self) -> &'static str {
        self.as_str()
    }
}

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
    ///
    /// Leave it out when `preset` is set: the preset builds the argv.
    #[serde(default)]
    pub argv: Vec<String>,
    /// `"claude"` or `"codex"`: run Claude Code or Codex with their JSONL
    /// output, continuing the agent's own session from turn to turn. The
    /// keys below (`program`, `model`, `permission_mode`, `allowed_tools`,
    /// `extra_args`, `protocol`, `workdir`) adjust what the preset sets.
    #[serde(default)]
    pub preset: Option<Preset>,
    /// What the program prints: `"text"` (stdout is the answer; the
    /// default without a preset), `"claude-stream-json"` or `"codex-json"`
    /// (the presets' JSONL events).
    #[serde(default)]
    pub protocol: Option<Protocol>,
    /// With a preset: the executable to run instead of `claude` / `codex`
    /// (a path, or a name looked up in `PATH`).
    #[serde(default)]
    pub program: Option<String>,
    /// With a preset: the model (`--model`).
    #[serde(default)]
    pub model: Option<String>,
    /// With a preset: Claude's `--permission-mode` (e.g. `"acceptEdits"`),
    /// or Codex's `--sandbox` (e.g. `"workspace-write"`).
    #[serde(default)]
    pub permission_mode: Option<String>,
    /// With the claude preset: tools allowed without asking
    /// (`--allowedTools`, e.g. `["Read", "Bash(git diff:*)"]`).
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// With the claude preset: ask the chat before Claude Code uses a tool
    /// it was not allowed in advance (`allowed_tools`), on telegate's
    /// approval card (`--permission-prompt-tool` backed by telegate's own
    /// MCP helper), instead of needing `permission_mode =
    /// "bypassPermissions"` (which Claude Code refuses as root).
    #[serde(default)]
    pub permission_prompt: bool,
    /// With `permission_prompt`: seconds a card waits before it counts as
    /// denied.
    #[serde(default = "default_permission_timeout_secs")]
    pub permission_timeout_secs: u64,
    /// With `permission_prompt`: the telegate binary Claude Code starts as
    /// the permission-prompt MCP server (`<it> permission-helper`); default:
    /// the binary running now.
    #[serde(default)]
    pub permission_helper: Option<PathBuf>,
    /// With a preset: more arguments, passed before the resume arguments.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Without a preset, with `protocol = "claude-stream-json"` or
    /// `"codex-json"`: the arguments that continue the agent's own session,
    /// `{resume_id}` standing for its session id (read from the output,
    /// kept across restarts), e.g. `["--resume", "{resume_id}"]` or
    /// `["resume", "{resume_id}"]`. On a turn that continues a session they
    /// go where `argv` has the element `{resume}` (at the end if it has
    /// none); a fresh turn (the first, or after /new) gets nothing there.
    #[serde(default)]
    pub resume_args: Vec<String>,
    /// For programs without sessions of their own: `"none"` (default),
    /// `"env-file"` (a JSON file of the session's earlier messages, its
    /// path in `TELEGATE_HISTORY_FILE`) or `"stdin-json"` (the message and
    /// the history as one JSON document on stdin).
    #[serde(default)]
    pub history: HistoryMode,
    /// Write the message to the program's stdin (then close it) instead of,
    /// or as well as, passing it in `argv`. Off: stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// The working directory (default: the bot's own). May contain
    /// `{chat_id}` or `{session_key}`: a directory per chat, created on
    /// first use with mode 0700.
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// A git worktree per conversation (`{ repo, base, root, keep_days }`),
    /// the program's working directory instead of `workdir`.
    #[serde(default)]
    pub worktree: Option<crate::worktree::WorktreeConfig>,
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

/// `[agent.command] history`: how a program without sessions of its own
/// gets the conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryMode {
    /// Only the message.
    #[default]
    None,
    /// A JSON file of the earlier messages; its path in
    /// `TELEGATE_HISTORY_FILE`.
    EnvFile,
    /// `{"message": …, "history": […]}` on stdin.
    StdinJson,
}

fn default_output_cap_bytes() -> usize {
    64 * 1024
}

fn default_kill_grace_ms() -> u64 {
    2000
}

fn default_permission_timeout_secs() -> u64 {
    300
}

impl CommandConfig {
    /// How long a permission card waits.
    pub fn permission_timeout(&self) -> Duration {
        Duration::from_secs(self.permission_timeout_secs)
    }

    /// A configuration running `argv` with every other setting at its
    /// default.
    pub fn new(argv: Vec<String>) -> Self {
        CommandConfig {
            argv,
            preset: None,
            protocol: None,
            program: None,
            model: None,
            permission_mode: None,
            allowed_tools: Vec::new(),
            permission_prompt: false,
            permission_timeout_secs: default_permission_timeout_secs(),
            permission_helper: None,
            extra_args: Vec::new(),
            resume_args: Vec::new(),
            history: HistoryMode::None,
            stdin: false,
            workdir: None,
            worktree: None,
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
        if let Some(dir) = self.workdir.as_ref().filter(|d| !workdir::is_template(d)) {
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
    pub(super) fn check_values(&self) -> Result<(), String> {
        if let Some(dir) = &self.workdir {
            workdir::check_template(dir)?;
        }
        if let Some(worktree) = &self.worktree {
            worktree.validate("agent.command")?;
        }
        self.check_history()?;
        self.check_no_nul()?;
        if let Some(preset) = self.preset {
            if !self.resume_args.is_empty() {
                return Err(format!(
                    "agent.command.resume_args is for argv with a JSON protocol; preset = \"{}\" resumes its sessions itself",
                    preset.as_str()
                ));
            }
            return self.check_preset(preset);
        }
        self.check_resume_args()?;
        if self.permission_prompt {
            return Err(
                "agent.command.permission_prompt only applies with preset = \"claude\"".to_string(),
            );
        }
        self.check_no_preset_settings()?;
        self.check_argv()?;
        self.check_env()?;
        if self.output_cap_bytes == 0 {
            return Err("agent.command.output_cap_bytes must be at least 1".to_string());
        }
        Ok(())
    }

    /// `history`: only for programs without sessions of their own, and not
    /// with `stdin` when it already writes the message there.
    fn check_history(&self) -> Result<(), String> {
        if self.history != HistoryMode::None && self.protocol() != Protocol::Text {
            return Err(
                "agent.command.history is for programs without sessions of their own (protocol = \"text\"); \
                 the claude and codex presets continue their own sessions"
                    .to_string(),
            );
        }
        if self.history == HistoryMode::StdinJson && self.stdin {
            return Err(
                "agent.command: history = \"stdin-json\" already writes the message to stdin; leave stdin out"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// The preset settings and lists: no empty value, no NUL byte.
    fn check_no_nul(&self) -> Result<(), String> {
        for (name, value) in [
            ("program", &self.program),
            ("model", &self.model),
            ("permission_mode", &self.permission_mode),
        ] {
            if value
                .as_deref()
                .is_some_and(|v| v.is_empty() || v.contains('\0'))
            {
                return Err(format!(
                    "agent.command.{name} is empty or contains a NUL byte"
                ));
            }
        }
        for (name, list) in [
            ("allowed_tools", &self.allowed_tools),
            ("extra_args", &self.extra_args),
        ] {
            if list.iter().any(|v| v.contains('\0')) {
                return Err(format!("agent.command.{name} contains a NUL byte"));
            }
        }
        Ok(())
    }

    /// Without a preset, none of the preset's settings may be set.
    fn check_no_preset_settings(&self) -> Result<(), String> {
        let preset_only = [
            ("program", self.program.is_some()),
            ("model", self.model.is_some()),
            ("permission_mode", self.permission_mode.is_some()),
            ("allowed_tools", !self.allowed_tools.is_empty()),
            ("extra_args", !self.extra_args.is_empty()),
        ];
        if let Some((name, _)) = preset_only.iter().find(|(_, set)| *set) {
            return Err(format!(
                "agent.command.{name} only applies with a preset (preset = \"claude\" or \"codex\"); \
                 without one, put it in argv"
            ));
        }
        Ok(())
    }

    /// `argv`: a program first (no placeholders in it), no NUL byte,
    /// `{resume}` a whole element with `resume_args`, `{resume_id}` only in
    /// `resume_args`, no `{message}` inside a shell's script.
    fn check_argv(&self) -> Result<(), String> {
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
            if tokens.contains(&Token::Field(Field::ResumeId)) {
                return Err(format!(
                    "agent.command.argv[{i}]: {{resume_id}} belongs in resume_args; put the element \"{{resume}}\" in argv where they go"
                ));
            }
            if tokens.contains(&Token::Field(Field::Resume))
                && (element != RESUME_PLACEHOLDER || self.resume_args.is_empty())
            {
                return Err(format!(
                    "agent.command.argv[{i}]: {{resume}} must be a whole element, and needs resume_args (what to put there)"
                ));
            }
            if i == 0 && tokens.iter().any(|t| matches!(t, Token::Field(_))) {
                return Err(
                    "agent.command.argv[0] (the program) may not contain placeholders: \
                     a message must never choose what runs"
                        .to_string(),
                );
            }
        }
        if let Some(i) = message_in_shell_script(&self.argv) {
            return Err(format!(
                "agent.command.argv[{i}]: {{message}} inside a shell's -c script lets a message \
                 inject shell syntax; pass it as an argument and use \"$1\" in the script, \
                 e.g. [\"sh\", \"-c\", \"llm -- \\\"$1\\\"\", \"sh\", \"{{message}}\"]"
            ));
        }
        Ok(())
    }

    /// `env` and `remove_env`: valid names, no NUL byte in a value.
    fn check_env(&self) -> Result<(), String> {
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
        Ok(())
    }

    /// `resume_args`: only with a JSON protocol (it is what carries the
    /// session id), must contain `{resume_id}`, nothing of the message.
    fn check_resume_args(&self) -> Result<(), String> {
        if self.resume_args.is_empty() {
            return Ok(());
        }
        if self.protocol() == Protocol::Text {
            return Err(
                "agent.command.resume_args needs protocol = \"claude-stream-json\" or \"codex-json\": \
                 the session id to resume is read from those events"
                    .to_string(),
            );
        }
        let mut has_id = false;
        for (i, element) in self.resume_args.iter().enumerate() {
            let tokens =
                tokenize(element).map_err(|e| format!("agent.command.resume_args[{i}]: {e}"))?;
            if element.contains('\0') {
                return Err(format!(
                    "agent.command.resume_args[{i}] contains a NUL byte"
                ));
            }
            for token in tokens {
                match token {
                    Token::Field(Field::ResumeId) => has_id = true,
                    Token::Field(Field::Message | Field::Files | Field::Resume) => {
                        return Err(format!(
                            "agent.command.resume_args[{i}]: only {{resume_id}}, {{session_id}} and {{chat_id}} may be used here"
                        ))
                    }
                    _ => {}
                }
            }
        }
        if !has_id {
            return Err(
                "agent.command.resume_args must contain {resume_id} (the agent's session id), e.g. [\"--resume\", \"{resume_id}\"]"
                    .to_string(),
            );
        }
        Ok(())
    }

    fn check_preset(&self, preset: Preset) -> Result<(), String> {
        if !self.argv.is_empty() {
            return Err(format!(
                "agent.command: set either preset = \"{}\" or argv, not both \
                 (use program, extra_args and the other preset keys to adjust the preset)",
                preset.as_str()
            ));
        }
        if self.stdin {
            return Err(
                "agent.command.stdin: the presets always write the message to stdin; leave it out"
                    .to_string(),
            );
        }
        if preset == Preset::Codex && self.permission_prompt {
            return Err(
                "agent.command.permission_prompt only applies to preset = \"claude\" (Codex asks nobody in exec mode; use permission_mode for its sandbox)"
                    .to_string(),
            );
        }
        if !(1..=86_400).contains(&self.permission_timeout_secs) {
            return Err(
                "agent.command.permission_timeout_secs must be between 1 and 86400".to_string(),
            );
        }
        if preset == Preset::Codex && !self.allowed_tools.is_empty() {
            return Err(
                "agent.command.allowed_tools only applies to preset = \"claude\" (Codex has no such flag; use permission_mode for its sandbox)"
                    .to_string(),
            );
        }
        if self.output_cap_bytes == 0 {
            return Err("agent.command.output_cap_bytes must be at least 1".to_string());
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
        Ok(())
    }

    /// The output protocol: as configured, else the preset's, else text.
    pub fn protocol(&self) -> Protocol {
        self.protocol
            .or(self.preset.map(Preset::protocol))
            .unwrap_or_default()
    }

    pub(super) fn timeout(&self) -> Option<Duration> {
        (self.timeout_secs > 0).then(|| Duration::from_secs(self.timeout_secs))
    }

    pub(super) fn kill_grace(&self) -> Duration {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(argv: &[&str]) -> CommandConfig {
        CommandConfig::new(argv.iter().map(|s| s.to_string()).collect())
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
    fn presets_and_their_overrides_are_checked() {
        let c: CommandConfig =
            toml::from_str("preset = \"claude\"\nmodel = \"opus\"\nallowed_tools = [\"Read\"]")
                .unwrap();
        c.validate().unwrap();
        assert_eq!(c.protocol(), Protocol::ClaudeStreamJson);
        let c: CommandConfig = toml::from_str("preset = \"codex\"\nprotocol = \"text\"").unwrap();
        assert_eq!(c.protocol(), Protocol::Text);
        let bad = [
            ("preset = \"claude\"\nargv = [\"x\"]", "not both"),
            (
                "preset = \"codex\"\nallowed_tools = [\"Read\"]",
                "allowed_tools",
            ),
            (
                "argv = [\"x\"]\nmodel = \"m\"",
                "only applies with a preset",
            ),
            ("preset = \"claude\"\nhistory = \"env-file\"", "history"),
            (
                "argv = [\"x\"]\nhistory = \"stdin-json\"\nstdin = true",
                "stdin",
            ),
            ("argv = [\"x\"]\nworkdir = \"/tmp/{user}\"", "workdir"),
        ];
        for (text, needle) in bad {
            let c: CommandConfig = toml::from_str(text).unwrap();
            let err = c.validate().unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(toml::from_str::<CommandConfig>("preset = \"gemini\"").is_err());
        // A workdir template is not checked for existence.
        let c: CommandConfig =
            toml::from_str("argv = [\"x\"]\nworkdir = \"/nonexistent/{chat_id}\"").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn resume_args_are_checked() {
        let ok = [
            "argv = [\"a\", \"{resume}\", \"-\"]\nprotocol = \"codex-json\"\nresume_args = [\"resume\", \"{resume_id}\"]",
            "argv = [\"a\"]\nprotocol = \"claude-stream-json\"\nresume_args = [\"--resume={resume_id}\"]",
        ];
        for text in ok {
            let c: CommandConfig = toml::from_str(text).unwrap();
            c.validate().unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        let bad = [
            ("argv = [\"a\"]\nresume_args = [\"{resume_id}\"]", "needs protocol"),
            (
                "argv = [\"a\"]\nprotocol = \"codex-json\"\nresume_args = [\"--resume\"]",
                "must contain {resume_id}",
            ),
            (
                "argv = [\"a\"]\nprotocol = \"codex-json\"\nresume_args = [\"{message}\", \"{resume_id}\"]",
                "only {resume_id}",
            ),
            (
                "argv = [\"a\", \"{resume_id}\"]\nprotocol = \"codex-json\"",
                "belongs in resume_args",
            ),
            (
                "argv = [\"a\", \"{resume}\"]\nprotocol = \"codex-json\"",
                "needs resume_args",
            ),
            (
                "argv = [\"a\", \"x{resume}\"]\nprotocol = \"codex-json\"\nresume_args = [\"{resume_id}\"]",
                "whole element",
            ),
            (
                "preset = \"claude\"\nresume_args = [\"{resume_id}\"]",
                "resumes its sessions itself",
            ),
        ];
        for (text, needle) in bad {
            let c: CommandConfig = toml::from_str(text).unwrap();
            let err = c.validate().unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn toml_defaults_and_unknown_keys() {
        let c: CommandConfig = toml::from_str("argv = [\"llm\", \"{message}\"]").unwrap();
        assert_eq!(c, config(&["llm", "{message}"]));
        assert_eq!(c.output_cap_bytes, 65536);
        assert_eq!(c.kill_grace_ms, 2000);
        assert!(toml::from_str::<CommandConfig>("argv = [\"x\"]\ntimeout = 3").is_err());
        let c: CommandConfig = toml::from_str("stdin = true").unwrap();
        assert!(c.validate().unwrap_err().contains("argv is empty"));
    }
}
