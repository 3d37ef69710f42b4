//! The conversation for programs without sessions of their own
//! (`history = "env-file" | "stdin-json"`).
//!
//! Both give the session's earlier messages, oldest first, as the runner
//! handed them to the turn: `[{"role": "user", "content": "…"}, …]`
//! (assistant tool calls and tool results keep their `tool_calls`,
//! `tool_call_id` and `name` fields).
//!
//! * env-file: that array in a private file (0600, removed when the turn
//!   ends) whose path is in `TELEGATE_HISTORY_FILE`. It lives in
//!   `<data_dir>/command-history/` (0700), not in the shared temporary
//!   directory, and what a killed process left there is removed at the
//!   next start ([`clear_leftovers`]);
//! * stdin-json: `{"message": "…", "history": […]}` on stdin.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::vocab::ChatMessage;

/// Set for the program with `history = "env-file"`.
pub const HISTORY_FILE_ENV: &str = "TELEGATE_HISTORY_FILE";

/// The stdin document of `history = "stdin-json"`.
#[derive(Serialize)]
struct StdinDocument<'a> {
    message: &'a str,
    history: &'a [ChatMessage],
}

/// `{"message": …, "history": […]}`.
pub(super) fn stdin_json(message: &str, history: &[ChatMessage]) -> String {
    serde_json::to_string(&StdinDocument { message, history }).unwrap_or_else(|_| "{}".to_string())
}

/// The directory of the history files under `data_dir`.
pub(super) fn history_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("command-history")
}

/// The name every history file has: `telegate-history-….json`.
fn is_history_file(name: &str) -> bool {
    name.starts_with("telegate-history-") && name.ends_with(".json")
}

/// Create `dir` (0700) and remove the history files left in it (by a
/// process that was killed mid-turn). Call it at start, before any turn.
/// Returns how many were removed.
pub(super) fn clear_leftovers(dir: &Path) -> std::io::Result<usize> {
    crate::private_fs::private_dir(dir)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(is_history_file) && entry.path().is_file() {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A history file that is removed when dropped.
#[derive(Debug)]
pub(super) struct HistoryFile {
    path: PathBuf,
}

impl HistoryFile {
    /// Write `history` to a new private file in `dir`.
    pub(super) fn write(dir: &Path, history: &[ChatMessage]) -> std::io::Result<HistoryFile> {
        let json = serde_json::to_vec(history).map_err(std::io::Error::other)?;
        let mut attempt = 0u32;
        loop {
            let name = format!(
                "telegate-history-{}-{}-{attempt}.json",
                std::process::id(),
                unique()
            );
            let path = dir.join(name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(mut file) => {
                    let file_guard = HistoryFile { path };
                    file.write_all(&json)?;
                    return Ok(file_guard);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < 5 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Where it is.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HistoryFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    (NEXT.fetch_add(1, Ordering::Relaxed) << 32) | nanos
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Role;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_is_private_json_and_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let history = vec![
            ChatMessage::new(Role::User, "hi"),
            ChatMessage::new(Role::Assistant, "hello"),
        ];
        let file = HistoryFile::write(dir.path(), &history).unwrap();
        let path = file.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let read: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            read,
            serde_json::json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
        );
        drop(file);
        assert!(!path.exists());
        assert!(is_history_file(
            path.file_name().and_then(|n| n.to_str()).unwrap()
        ));
        assert_eq!(
            stdin_json("now", &history[..1]),
            r#"{"message":"now","history":[{"role":"user","content":"hi"}]}"#
        );
    }

    #[test]
    fn leftovers_of_a_killed_process_are_cleared_and_nothing_else() {
        let data = tempfile::tempdir().unwrap();
        let dir = history_dir(data.path());
        assert_eq!(clear_leftovers(&dir).unwrap(), 0);
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let left = HistoryFile::write(&dir, &[]).unwrap();
        let left_path = left.path().to_path_buf();
        std::mem::forget(left); // as a kill -9 would
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        assert_eq!(clear_leftovers(&dir).unwrap(), 1);
        assert!(!left_path.exists());
        assert!(dir.join("notes.txt").exists());
    }
}
