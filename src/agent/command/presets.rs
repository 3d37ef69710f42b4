//! Presets: the argv and protocol for Claude Code and Codex, and how each
//! resumes its own session.
//!
//! * claude: `claude -p --output-format stream-json --verbose
//!   [--resume ID] [--model M] [--permission-mode P] [extra_args…]
//!   [--allowedTools T…]`, the message on stdin.
//! * codex: `codex exec --json --skip-git-repo-check [--model M]
//!   [--sandbox P] [extra_args…] [resume ID] -`, the message on stdin
//!   (`-`).
//!
//! The message is never an argument, so nothing a user writes can be read
//! as an option. `--allowedTools` takes several values, so it goes last.

use serde::Deserialize;

use super::config::CommandConfig;
use super::protocol::Protocol;

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

    /// The argv for one turn, resuming `resume` if given.
    pub fn argv(self, config: &CommandConfig, resume: Option<&str>) -> Vec<String> {
        let program = config
            .program
            .clone()
            .unwrap_or_else(|| self.default_program().to_string());
        let mut argv = vec![program];
        let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| s.to_string()));
        match self {
            Preset::Claude => {
                push(&["-p", "--output-format", "stream-json", "--verbose"]);
                if let Some(id) = resume {
                    push(&["--resume", id]);
                }
                if let Some(model) = &config.model {
                    push(&["--model", model]);
                }
                if let Some(mode) = &config.permission_mode {
                    push(&["--permission-mode", mode]);
                }
                argv.extend(config.extra_args.iter().cloned());
                if !config.allowed_tools.is_empty() {
                    argv.push("--allowedTools".to_string());
                    argv.extend(config.allowed_tools.iter().cloned());
                }
            }
            Preset::Codex => {
                push(&["exec", "--json", "--skip-git-repo-check"]);
                if let Some(model) = &config.model {
                    push(&["--model", model]);
                }
                if let Some(mode) = &config.permission_mode {
                    push(&["--sandbox", mode]);
                }
                argv.extend(config.extra_args.iter().cloned());
                if let Some(id) = resume {
                    argv.push("resume".to_string());
                    argv.push(id.to_string());
                }
                argv.push("-".to_string());
            }
        }
        argv
    }
}

/// Does this failure text say the resumed session does not exist (any
/// more)? Claude Code: `No conversation found with session ID: …`; Codex:
/// `ERROR: No saved session found with ID …` or `no rollout found for
/// thread id …`.
pub fn says_session_is_unknown(text: &str) -> bool {
    let text = text.to_lowercase();
    [
        "no conversation found",
        "no saved session found",
        "no rollout found",
        "session not found",
        "thread not found",
        "unknown session",
        "session expired",
        "session has expired",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> CommandConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn claude_argv_fresh_and_resumed() {
        let c = config("preset = \"claude\"\nmodel = \"opus\"\npermission_mode = \"acceptEdits\"\nallowed_tools = [\"Read\", \"Bash(git diff:*)\"]\nextra_args = [\"--max-turns\", \"5\"]");
        assert_eq!(
            Preset::Claude.argv(&c, None).join(" "),
            "claude -p --output-format stream-json --verbose --model opus --permission-mode acceptEdits --max-turns 5 --allowedTools Read Bash(git diff:*)"
        );
        let resumed = Preset::Claude.argv(&c, Some("abc"));
        assert_eq!(&resumed[5..7], ["--resume", "abc"]);
    }

    #[test]
    fn codex_argv_fresh_and_resumed() {
        let c = config(
            "preset = \"codex\"\nprogram = \"/opt/codex\"\npermission_mode = \"workspace-write\"",
        );
        assert_eq!(
            Preset::Codex.argv(&c, None).join(" "),
            "/opt/codex exec --json --skip-git-repo-check --sandbox workspace-write -"
        );
        assert_eq!(
            Preset::Codex.argv(&c, Some("t-1")).join(" "),
            "/opt/codex exec --json --skip-git-repo-check --sandbox workspace-write resume t-1 -"
        );
    }

    #[test]
    fn unknown_session_messages_are_recognised() {
        assert!(says_session_is_unknown(
            "No conversation found with session ID: 123"
        ));
        assert!(says_session_is_unknown(
            "ERROR: No saved session found with ID 0199. Run `codex resume`"
        ));
        assert!(!says_session_is_unknown("rate limit exceeded"));
    }
}
