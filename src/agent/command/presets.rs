//! Presets: the argv and protocol for Claude Code and Codex, and how each
//! resumes its own session.
//!
//! * claude: `claude -p --output-format stream-json --verbose
//!   --include-partial-messages [--resume ID] [--model M]
//!   [--permission-mode P] [--mcp-config FILE --permission-prompt-tool
//!   mcp__telegate__approve] [extra_args…] [--allowedTools T…]`, the
//!   message on stdin (the partial messages stream the answer's text into
//!   the preview; the permission prompt, with `permission_prompt = true`,
//!   see [`crate::tools::permission`]).
//! * codex: `codex exec --json --skip-git-repo-check [--model M]
//!   [--sandbox P] [extra_args…] [resume ID] -`, the message on stdin
//!   (`-`).
//!
//! The message is never an argument, so nothing a user writes can be read
//! as an option. `--allowedTools` takes several values, so it goes last.
//!
//! Files that came with the message (see [`crate::media`]) are named in the
//! message text (`[photo saved at /path]`); each CLI also gets them the way
//! it takes them:
//! * claude: Claude Code reads an image whose path is in the prompt with
//!   its Read tool; `--add-dir DIR` (right after `-p`, one per directory)
//!   lets it read the saved files outside its working directory.
//! * codex: `codex exec` attaches images with `-i/--image FILE`: one
//!   `--image` per image, before `--json` on a fresh run (the option is
//!   greedy there and would swallow what follows), after the id on
//!   `resume ID` (where it takes one value). Other files are only named in
//!   the prompt.

use super::config::{CommandConfig, Preset};
use crate::vocab::Attachment;

impl Preset {
    /// The argv for one turn, resuming `resume` if given, with the turn's
    /// inbound `files`; `prompt` are the claude preset's permission-prompt
    /// arguments (`--mcp-config … --permission-prompt-tool …`), if any.
    pub fn argv(
        self,
        config: &CommandConfig,
        resume: Option<&str>,
        files: &[Attachment],
        prompt: &[String],
    ) -> Vec<String> {
        let program = config
            .program
            .clone()
            .unwrap_or_else(|| self.default_program().to_string());
        let mut argv = vec![program];
        match self {
            Preset::Claude => claude_args(&mut argv, config, resume, files, prompt),
            Preset::Codex => codex_args(&mut argv, config, resume, files),
        }
        argv
    }
}

/// Claude Code's arguments after the program (see the module docs).
fn claude_args(
    argv: &mut Vec<String>,
    config: &CommandConfig,
    resume: Option<&str>,
    files: &[Attachment],
    prompt: &[String],
) {
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| s.to_string()));
    push(&["-p"]);
    for dir in &directories_of(files) {
        push(&["--add-dir", dir]);
    }
    push(&[
        "--output-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
    ]);
    if let Some(id) = resume {
        push(&["--resume", id]);
    }
    if let Some(model) = &config.model {
        push(&["--model", model]);
    }
    if let Some(mode) = &config.permission_mode {
        push(&["--permission-mode", mode]);
    }
    // `--mcp-config` takes several values: the
    // `--permission-prompt-tool` right after it ends them.
    argv.extend(prompt.iter().cloned());
    argv.extend(config.extra_args.iter().cloned());
    if !config.allowed_tools.is_empty() {
        argv.push("--allowedTools".to_string());
        argv.extend(config.allowed_tools.iter().cloned());
    }
}

/// The directories holding `files`, each once, in their order: what
/// Claude Code is let read with `--add-dir`.
fn directories_of(files: &[Attachment]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    for file in files {
        if let Some(dir) = file.path.parent().map(|d| d.display().to_string()) {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// Codex's arguments after the program (see the module docs).
fn codex_args(
    argv: &mut Vec<String>,
    config: &CommandConfig,
    resume: Option<&str>,
    files: &[Attachment],
) {
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| s.to_string()));
    let images: Vec<String> = files
        .iter()
        .filter(|f| f.is_image)
        .map(|f| f.path.display().to_string())
        .collect();
    push(&["exec"]);
    if resume.is_none() {
        for image in &images {
            push(&["--image", image]);
        }
    }
    push(&["--json", "--skip-git-repo-check"]);
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
        for image in &images {
            argv.push("--image".to_string());
            argv.push(image.clone());
        }
    }
    argv.push("-".to_string());
}

/// Does this failure text say the resumed session does not exist (any
/// more)? Claude Code: `No conversation found with session ID: …`; Codex:
/// `ERROR: No saved session found with ID …` or `no rollout found for
/// thread id …`.
pub(super) fn says_session_is_unknown(text: &str) -> bool {
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
            Preset::Claude.argv(&c, None, &[], &[]).join(" "),
            "claude -p --output-format stream-json --verbose --include-partial-messages --model opus --permission-mode acceptEdits --max-turns 5 --allowedTools Read Bash(git diff:*)"
        );
        let resumed = Preset::Claude.argv(&c, Some("abc"), &[], &[]);
        assert_eq!(&resumed[6..8], ["--resume", "abc"]);
        let prompt = [
            "--mcp-config".to_string(),
            "/d/m.json".to_string(),
            "--permission-prompt-tool".to_string(),
            "mcp__telegate__approve".to_string(),
        ];
        assert_eq!(
            Preset::Claude.argv(&c, None, &[], &prompt).join(" "),
            "claude -p --output-format stream-json --verbose --include-partial-messages --model opus --permission-mode acceptEdits --mcp-config /d/m.json --permission-prompt-tool mcp__telegate__approve --max-turns 5 --allowedTools Read Bash(git diff:*)"
        );
    }

    #[test]
    fn codex_argv_fresh_and_resumed() {
        let c = config(
            "preset = \"codex\"\nprogram = \"/opt/codex\"\npermission_mode = \"workspace-write\"",
        );
        assert_eq!(
            Preset::Codex.argv(&c, None, &[], &[]).join(" "),
            "/opt/codex exec --json --skip-git-repo-check --sandbox workspace-write -"
        );
        assert_eq!(
            Preset::Codex.argv(&c, Some("t-1"), &[], &[]).join(" "),
            "/opt/codex exec --json --skip-git-repo-check --sandbox workspace-write resume t-1 -"
        );
    }

    #[test]
    fn images_go_where_each_cli_takes_them() {
        let file = |path: &str, is_image| Attachment {
            path: path.into(),
            mime: if is_image { "image/jpeg" } else { "text/plain" }.into(),
            is_image,
        };
        let files = [
            file("/m/s/1-0-a.jpg", true),
            file("/m/s/1-1-b.txt", false),
            file("/m/t/2-0-c.png", true),
        ];
        let c = config("preset = \"claude\"");
        assert_eq!(
            Preset::Claude.argv(&c, Some("x"), &files, &[]).join(" "),
            "claude -p --add-dir /m/s --add-dir /m/t --output-format stream-json --verbose --include-partial-messages --resume x"
        );
        let c = config("preset = \"codex\"");
        assert_eq!(
            Preset::Codex.argv(&c, None, &files, &[]).join(" "),
            "codex exec --image /m/s/1-0-a.jpg --image /m/t/2-0-c.png --json --skip-git-repo-check -"
        );
        assert_eq!(
            Preset::Codex.argv(&c, Some("t-1"), &files, &[]).join(" "),
            "codex exec --json --skip-git-repo-check resume t-1 --image /m/s/1-0-a.jpg --image /m/t/2-0-c.png -"
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
