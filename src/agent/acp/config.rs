//! `[agent.acp]`: which Agent Client Protocol agent to run, and how; the
//! presets for the common agents; validation. Pure: reads the file system
//! only to check `workdir`.
//!
//! A preset is only a program and its arguments (both can be overridden):
//!
//! | preset       | program            | args    | install                                   |
//! |--------------|--------------------|---------|-------------------------------------------|
//! | `gemini`     | `gemini`           | `--acp` | `npm i -g @google/gemini-cli`             |
//! | `opencode`   | `opencode`         | `acp`   | `npm i -g opencode-ai`                    |
//! | `claude-acp` | `claude-agent-acp` |         | `npm i -g @agentclientprotocol/claude-agent-acp` |
//! | `codex-acp`  | `codex-acp`        |         | `npm i -g @agentclientprotocol/codex-acp` |

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::agent::command::workdir;

/// `[agent.acp] preset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AcpPreset {
    /// Gemini CLI in ACP mode (`gemini --acp`).
    Gemini,
    /// OpenCode (`opencode acp`).
    Opencode,
    /// Claude Code through its ACP adapter (`claude-agent-acp`).
    ClaudeAcp,
    /// Codex through its ACP adapter (`codex-acp`).
    CodexAcp,
}

impl AcpPreset {
    /// The name in the config, in /status and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            AcpPreset::Gemini => "gemini",
            AcpPreset::Opencode => "opencode",
            AcpPreset::ClaudeAcp => "claude-acp",
            AcpPreset::CodexAcp => "codex-acp",
        }
    }

    /// The executable run unless `program` says otherwise.
    pub fn program(self) -> &'static str {
        match self {
            AcpPreset::Gemini => "gemini",
            AcpPreset::Opencode => "opencode",
            AcpPreset::ClaudeAcp => "claude-agent-acp",
            AcpPreset::CodexAcp => "codex-acp",
        }
    }

    /// Its arguments unless `args` says otherwise.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            AcpPreset::Gemini => &["--acp"],
            AcpPreset::Opencode => &["acp"],
            AcpPreset::ClaudeAcp | AcpPreset::CodexAcp => &[],
        }
    }
}

/// `[agent.acp]`: the agent program, its environment and its limits.
///
/// ```toml
/// [agent.acp]
/// preset = "gemini"
/// workdir = "/srv/agents/{chat_id}"
/// pass_env = ["GEMINI_API_KEY"]
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpConfig {
    /// A common agent: `gemini`, `opencode`, `claude-acp`, `codex-acp`.
    #[serde(default)]
    pub preset: Option<AcpPreset>,
    /// The executable (a path, or a name looked up in `PATH`); with a
    /// preset, instead of the preset's.
    #[serde(default)]
    pub program: Option<String>,
    /// Its arguments; with a preset, instead of the preset's.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// The agent's working directory and its sessions' `cwd` (default:
    /// telegate's own). May contain `{chat_id}` or `{session_key}`: a
    /// directory per chat, created on first use with mode 0700. The
    /// agent's file reads and writes through telegate stay inside it.
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// A git worktree per conversation (`{ repo, base, root, keep_days }`),
    /// the agent's working directory (and file-access root) instead of
    /// `workdir`.
    #[serde(default)]
    pub worktree: Option<crate::worktree::WorktreeConfig>,
    /// Variables set for the agent.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables passed from telegate's environment besides PATH, HOME,
    /// USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TERM, TZ and TMPDIR
    /// (an API key the agent needs, say; telegate's secrets never pass).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Offer the agent file reads and writes through telegate
    /// (`fs/read_text_file`, `fs/write_text_file`), confined to `workdir`.
    /// Never offered without a `workdir`.
    #[serde(default = "default_true")]
    pub file_access: bool,
    /// End a chat's agent process after this many seconds without a turn
    /// (the next message starts it again and continues its session).
    #[serde(default = "default_idle_secs")]
    pub idle_secs: u64,
    /// The longest starting the agent may take (`initialize`, and
    /// `session/new` or `session/load`) before it is stopped and the
    /// failure reported.
    #[serde(default = "default_start_timeout_secs")]
    pub start_timeout_secs: u64,
    /// After /stop: how long the agent has to end its turn after
    /// `session/cancel` before its process group is killed.
    #[serde(default = "default_cancel_grace_ms")]
    pub cancel_grace_ms: u64,
    /// Milliseconds between SIGTERM and SIGKILL when the agent must end.
    #[serde(default = "default_kill_grace_ms")]
    pub kill_grace_ms: u64,
    /// Seconds a permission request waits for an answer in the chat
    /// before it counts as rejected.
    #[serde(default = "default_permission_timeout_secs")]
    pub permission_timeout_secs: u64,
    /// Keep at most this many bytes of one turn's answer.
    #[serde(default = "default_output_cap_bytes")]
    pub output_cap_bytes: usize,
}

fn default_true() -> bool {
    true
}
fn default_idle_secs() -> u64 {
    600
}
fn default_start_timeout_secs() -> u64 {
    60
}
fn default_cancel_grace_ms() -> u64 {
    3000
}
fn default_kill_grace_ms() -> u64 {
    1000
}
fn default_permission_timeout_secs() -> u64 {
    300
}
fn default_output_cap_bytes() -> usize {
    256 * 1024
}

impl Default for AcpConfig {
    fn default() -> Self {
        AcpConfig {
            preset: None,
            program: None,
            args: None,
            workdir: None,
            worktree: None,
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            file_access: true,
            idle_secs: default_idle_secs(),
            start_timeout_secs: default_start_timeout_secs(),
            cancel_grace_ms: default_cancel_grace_ms(),
            kill_grace_ms: default_kill_grace_ms(),
            permission_timeout_secs: default_permission_timeout_secs(),
            output_cap_bytes: default_output_cap_bytes(),
        }
    }
}

impl AcpConfig {
    /// The program to run.
    pub fn program(&self) -> &str {
        self.program
            .as_deref()
            .or(self.preset.map(AcpPreset::program))
            .unwrap_or("")
    }

    /// Its arguments.
    pub fn args(&self) -> Vec<String> {
        match (&self.args, self.preset) {
            (Some(args), _) => args.clone(),
            (None, Some(preset)) => preset.args().iter().map(|a| a.to_string()).collect(),
            (None, None) => Vec::new(),
        }
    }

    /// The name shown in /status and logs and kept with the agent's
    /// sessions: the preset's, else `acp`.
    pub fn name(&self) -> &'static str {
        self.preset.map_or("acp", AcpPreset::as_str)
    }

    /// Check the settings; the error is one line naming the key
    /// (`agent.acp.…`) and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        self.check_values()?;
        if let Some(worktree) = &self.worktree {
            worktree.validate("agent.acp")?;
        }
        if let Some(dir) = self.workdir.as_ref().filter(|d| !workdir::is_template(d)) {
            if !dir.is_dir() {
                return Err(format!(
                    "agent.acp.workdir {} is not a directory",
                    dir.display()
                ));
            }
        }
        Ok(())
    }

    /// Everything [`AcpConfig::validate`] checks except the file system.
    pub fn check_values(&self) -> Result<(), String> {
        if self.program().is_empty() {
            return Err(
                "agent.acp needs a program: set preset (\"gemini\", \"opencode\", \"claude-acp\" or \"codex-acp\") or program"
                    .to_string(),
            );
        }
        if self.program().contains('\0') {
            return Err("agent.acp.program contains a NUL byte".to_string());
        }
        if self.args().iter().any(|a| a.contains('\0')) {
            return Err("agent.acp.args contains a NUL byte".to_string());
        }
        if let Some(dir) = &self.workdir {
            workdir::check_template(dir)
                .map_err(|e| e.replace("agent.command.workdir", "agent.acp.workdir"))?;
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(format!(
                    "agent.acp.env: {name:?} is not a valid variable name (empty, or contains '=' or a NUL byte)"
                ));
            }
            if value.contains('\0') {
                return Err(format!(
                    "agent.acp.env: the value of {name} contains a NUL byte"
                ));
            }
        }
        for (key, value, at_least) in [
            ("idle_secs", self.idle_secs, 1),
            ("start_timeout_secs", self.start_timeout_secs, 1),
            ("permission_timeout_secs", self.permission_timeout_secs, 1),
            ("cancel_grace_ms", self.cancel_grace_ms / 1000, 0),
            ("kill_grace_ms", self.kill_grace_ms / 1000, 0),
        ] {
            if value < at_least {
                return Err(format!("agent.acp.{key} must be at least {at_least}"));
            }
        }
        if self.output_cap_bytes == 0 {
            return Err("agent.acp.output_cap_bytes must be at least 1".to_string());
        }
        Ok(())
    }

    pub(super) fn idle(&self) -> Duration {
        Duration::from_secs(self.idle_secs)
    }

    pub(super) fn start_timeout(&self) -> Duration {
        Duration::from_secs(self.start_timeout_secs)
    }

    pub(super) fn cancel_grace(&self) -> Duration {
        Duration::from_millis(self.cancel_grace_ms)
    }

    pub(super) fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_name_their_program_and_can_be_overridden() {
        let c: AcpConfig = toml::from_str("preset = \"gemini\"").unwrap();
        c.validate().unwrap();
        assert_eq!(
            (c.program(), c.args()),
            ("gemini", vec!["--acp".to_string()])
        );
        assert_eq!(c.name(), "gemini");
        let c: AcpConfig = toml::from_str(
            "preset = \"opencode\"\nprogram = \"/opt/oc\"\nargs = [\"acp\", \"--print-logs\"]",
        )
        .unwrap();
        assert_eq!(c.program(), "/opt/oc");
        assert_eq!(c.args(), vec!["acp", "--print-logs"]);
        for (preset, program) in [
            ("claude-acp", "claude-agent-acp"),
            ("codex-acp", "codex-acp"),
        ] {
            let c: AcpConfig = toml::from_str(&format!("preset = \"{preset}\"")).unwrap();
            assert_eq!((c.program(), c.args().len()), (program, 0));
            assert_eq!(c.name(), preset);
        }
        let c: AcpConfig = toml::from_str("program = \"my-agent\"").unwrap();
        assert_eq!((c.program(), c.name()), ("my-agent", "acp"));
        assert_eq!(c.idle_secs, 600);
        assert!(c.file_access);
    }

    #[test]
    fn validation_names_the_key() {
        let bad = [
            ("", "needs a program"),
            (
                "program = \"x\"\nworkdir = \"/tmp/{user}\"",
                "agent.acp.workdir",
            ),
            (
                "program = \"x\"\nworkdir = \"/w/{chat_id}/..\"",
                "agent.acp.workdir",
            ),
            ("program = \"x\"\nidle_secs = 0", "agent.acp.idle_secs"),
            ("program = \"x\"\noutput_cap_bytes = 0", "output_cap_bytes"),
            (
                "program = \"x\"\nenv = { \"A=B\" = \"1\" }",
                "agent.acp.env",
            ),
            (
                "program = \"x\"\nworkdir = \"/definitely/not/here\"",
                "not a directory",
            ),
        ];
        for (text, needle) in bad {
            let c: AcpConfig = toml::from_str(text).unwrap();
            let err = c.validate().unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert!(toml::from_str::<AcpConfig>("preset = \"copilot\"").is_err());
        assert!(toml::from_str::<AcpConfig>("program = \"x\"\nargv = []").is_err());
        let c: AcpConfig =
            toml::from_str("program = \"x\"\nworkdir = \"/nonexistent/{chat_id}\"").unwrap();
        c.validate().unwrap();
    }
}
