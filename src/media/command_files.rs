//! The command backend's view of a turn's files, from the task-local
//! [`super::TurnFiles`]:
//!
//! * `{files}` as a whole argv element becomes one argument per inbound
//!   file (none without files); inside a longer element it becomes the
//!   paths joined by newlines;
//! * `TELEGATE_FILES`: the inbound paths, newline-separated (empty without
//!   files);
//! * `TELEGATE_OUTBOX`: a fresh directory; files the program writes there
//!   are sent to the chat after the answer.
//!
//! The paths are absolute, and so are those named in the message text
//! (`[photo saved at /…]`): the program runs on this machine as telegate's
//! user and can open them (the model sees a server path only where a tool
//! of its can open it, [`super::FileAccess::Paths`]).
//!
//! Kept apart from `agent/command` so that backend only needs a few hook
//! lines. It must never expose a path other than the turn's own files.

use tokio::process::Command;

use super::turn_files;

/// The variable listing the inbound files.
pub const FILES_ENV: &str = "TELEGATE_FILES";
/// The variable naming the outbox directory.
pub const OUTBOX_ENV: &str = "TELEGATE_OUTBOX";
/// The argv element replaced by one argument per file.
pub const FILES_PLACEHOLDER: &str = "{files}";

/// The inbound file paths of the current turn.
pub fn file_paths() -> Vec<String> {
    turn_files()
        .attachments
        .iter()
        .map(|a| a.path.display().to_string())
        .collect()
}

/// The paths joined by newlines (for `TELEGATE_FILES` and `{files}` inside
/// a longer element).
pub fn joined_paths() -> String {
    file_paths().join("\n")
}

/// Set `TELEGATE_FILES` and `TELEGATE_OUTBOX` on `command`.
pub fn apply_env(command: &mut Command) {
    let files = turn_files();
    command.env(FILES_ENV, joined_paths());
    match files.outbox {
        Some(dir) => command.env(OUTBOX_ENV, dir),
        None => command.env_remove(OUTBOX_ENV),
    };
}
