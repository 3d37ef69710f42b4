//! `/diff`, `/merge` and `/discard`: the conversation's git worktree (see
//! [`crate::worktree`]). `/diff` sends the patch as a file through the
//! outbox (`diff` plus a short `--stat` in the chat); `/merge` and
//! `/discard` show the stat with a confirmation button, and act only when
//! confirmed (`/merge confirm <session> <token>`, what the button sends)
//! for the conversation that is still the slot's. The token is the
//! button's own, so `/merge confirm <session>` typed by hand asks first,
//! like `/merge`. The diff file is written by handle in `root/.diffs` (created
//! new, never through a link).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;

use super::Runner;
use crate::reply::Reply;
use crate::vocab::{Button, ButtonAction, SessionId, SessionKey, SessionSource, WorktreeButton};
use crate::worktree::{WorktreeError, Worktrees};

/// The answer when the backend has no `worktree` setting.
pub(super) const NO_WORKTREES_TEXT: &str =
    "This bot gives conversations no git worktree (set worktree = { repo, base, root } under [agent.command] or [agent.acp]).";
/// The stat shown in the chat is cut here.
const STAT_LINES: usize = 15;

fn short_stat(stat: &str) -> String {
    let lines: Vec<&str> = stat.lines().collect();
    if lines.len() <= STAT_LINES {
        return stat.to_string();
    }
    // The last line is the summary ("3 files changed, …").
    let mut kept = lines[..STAT_LINES - 1].join("\n");
    kept.push_str(&format!("\n… {} more\n", lines.len() - STAT_LINES));
    kept.push_str(lines[lines.len() - 1]);
    kept
}

fn failure(error: &WorktreeError) -> Reply {
    match error {
        WorktreeError::Missing => Reply::command(
            "This conversation has no worktree yet (it is made with its first task).",
        ),
        other => {
            tracing::warn!(%other, "a worktree command failed");
            Reply::error(format!("⚠️ {other}"))
        }
    }
}

impl Runner {
    /// The backend's worktrees (`worktree = {…}`), if it has them.
    pub fn worktrees(&self) -> Option<Arc<Worktrees>> {
        self.inner.agent.worktrees()
    }

    /// `/diff`, `/merge [confirm ID TOKEN]`, `/discard [confirm ID TOKEN]`.
    pub(super) async fn worktree_command(
        &self,
        change: Option<WorktreeButton>,
        args: &str,
        key: &SessionKey,
        source: &SessionSource,
    ) -> Reply {
        let Some(worktrees) = self.worktrees() else {
            return Reply::command(NO_WORKTREES_TEXT);
        };
        let Ok(session) = self.resolve_session(key).await else {
            return Reply::error(super::STORE_DOWN_TEXT);
        };
        let Some(change) = change else {
            return self.send_diff(&worktrees, key, &session, source).await;
        };
        let Some(confirmed) = args.strip_prefix("confirm") else {
            return self.ask_to_confirm(&worktrees, change, key, &session).await;
        };
        let mut words = confirmed.split_whitespace();
        let (id, token) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if id != session.as_str() {
            return Reply::command(
                "That button belongs to an earlier conversation of this chat; nothing was changed.",
            );
        }
        if !worktrees.confirms(change, &session, token) {
            // Typed by hand (or a button from before a restart): the same
            // question and button as `/merge`; only a press confirms.
            return self.ask_to_confirm(&worktrees, change, key, &session).await;
        }
        match change {
            WorktreeButton::Merge => match worktrees.merge(key, &session).await {
                Ok(stat) => Reply::command(format!(
                    "✅ Merged into {}.\n{}",
                    worktrees.config().base,
                    short_stat(&stat)
                )),
                Err(error) => failure(&error),
            },
            WorktreeButton::Discard => match worktrees.discard(key, &session).await {
                Ok(()) => Reply::command("🗑 The worktree and its branch are gone."),
                Err(error) => failure(&error),
            },
        }
    }

    async fn ask_to_confirm(
        &self,
        worktrees: &Worktrees,
        change: WorktreeButton,
        key: &SessionKey,
        session: &SessionId,
    ) -> Reply {
        let diff = match worktrees.diff(key, session).await {
            Ok(diff) => diff,
            Err(error) => return failure(&error),
        };
        let base = &worktrees.config().base;
        let (question, label) = match change {
            WorktreeButton::Merge => (
                format!("Merge this conversation's work into {base}?"),
                format!("✅ Merge into {base}"),
            ),
            WorktreeButton::Discard => (
                "Throw this conversation's work away?".to_string(),
                "🗑 Discard".to_string(),
            ),
        };
        let stat = if diff.stat.is_empty() {
            "(no changes)".to_string()
        } else {
            short_stat(&diff.stat)
        };
        let Some(token) = worktrees.confirmation(change, session) else {
            tracing::error!("no random bytes for a confirmation button");
            return Reply::error("⚠️ Could not make a confirmation button; nothing was changed.");
        };
        Reply::command(format!("{question}\n{stat}")).with_buttons(vec![Button::new(
            label,
            ButtonAction::Worktree {
                change,
                session: session.as_str().to_string(),
                token,
            },
        )])
    }

    async fn send_diff(
        &self,
        worktrees: &Worktrees,
        key: &SessionKey,
        session: &SessionId,
        source: &SessionSource,
    ) -> Reply {
        let diff = match worktrees.diff(key, session).await {
            Ok(diff) => diff,
            Err(error) => return failure(&error),
        };
        if diff.patch.is_empty() {
            return Reply::command(format!("No changes against {}.", worktrees.config().base));
        }
        let mut stat = short_stat(&diff.stat);
        if diff.cut {
            stat.push_str(&format!(
                "\n(The diff is larger than {} MB; the file holds its start.)",
                crate::worktree::MAX_DIFF_BYTES / (1024 * 1024)
            ));
        }
        let Some(files) = &self.inner.config.files else {
            return Reply::command(stat);
        };
        let dir = worktrees.config().root.join(".diffs");
        let name = format!(
            "{}.diff",
            crate::worktree::plan::worktree_name(key, session)
        );
        let written = write_diff_file(&dir, &name, diff.patch.as_bytes());
        let dir_fd = match written {
            Ok(fd) => fd,
            Err(error) => {
                tracing::warn!(%error, "could not write a diff to send");
                return Reply::error("⚠️ Could not write the diff to send.");
            }
        };
        let workspace = crate::media::outbox::Workspace::new(&dir, None);
        let sent = files
            .send(source, None, &workspace, Path::new(&name), None, "diff:")
            .await;
        let _ = rustix::fs::unlinkat(&dir_fd, name.as_str(), rustix::fs::AtFlags::empty());
        match sent {
            Ok(_) => Reply::command(stat),
            Err(refusal) => Reply::error(format!("⚠️ {refusal}\n{stat}")),
        }
    }
}

/// Write `bytes` to a new file `name` in the directory `dir` (made 0700),
/// by handle: the directory opened through no link, whatever was at `name`
/// removed (a link itself, never what it points to), the file created new
/// (`O_EXCL`, never through a link, non-blocking), 0600. Returns the
/// directory's handle (the file is removed through it after the send).
fn write_diff_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let dir_fd = crate::media::handle::open_root(dir).map_err(|error| match error {
        crate::media::handle::OpenError::Io(error) => error,
        other => std::io::Error::other(format!("{}: {other:?}", dir.display())),
    })?;
    match rustix::fs::unlinkat(&dir_fd, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        // A directory where the file goes.
        Err(errno) => return Err(errno.into()),
    }
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::EXCL
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&dir_fd, name, flags, Mode::from_raw_mode(0o600))?;
    std::fs::File::from(fd).write_all(bytes)?;
    Ok(dir_fd)
}

#[cfg(test)]
mod tests {
    use super::{short_stat, write_diff_file};

    #[test]
    fn the_diff_file_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let diffs = dir.path().join(".diffs");
        std::fs::create_dir_all(&diffs).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "victim").unwrap();
        std::os::unix::fs::symlink(&victim, diffs.join("w.diff")).unwrap();
        write_diff_file(&diffs, "w.diff", b"+patch\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim");
        let meta = std::fs::symlink_metadata(diffs.join("w.diff")).unwrap();
        assert!(meta.is_file(), "a new plain file");
        assert_eq!(std::fs::read(diffs.join("w.diff")).unwrap(), b"+patch\n");
        // The directory itself replaced by a link: nothing is written.
        std::fs::remove_dir_all(&diffs).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &diffs).unwrap();
        assert!(write_diff_file(&diffs, "w.diff", b"x").is_err());
        assert!(!elsewhere.join("w.diff").exists());
    }

    #[test]
    fn a_long_stat_keeps_its_summary() {
        let mut stat: Vec<String> = (0..30).map(|i| format!(" f{i} | 1 +")).collect();
        stat.push(" 30 files changed, 30 insertions(+)".into());
        let short = short_stat(&stat.join("\n"));
        assert_eq!(short.lines().count(), 16);
        assert!(short.ends_with("30 files changed, 30 insertions(+)"));
        assert_eq!(
            short_stat(" a | 1 +\n 1 file changed"),
            " a | 1 +\n 1 file changed"
        );
    }
}
