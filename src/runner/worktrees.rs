//! `/diff`, `/merge` and `/discard`: the conversation's git worktree (see
//! [`crate::worktree`]). `/diff` sends the patch as a file through the
//! outbox (`diff` plus a short `--stat` in the chat); `/merge` and
//! `/discard` show the stat with a confirmation button, and act only when
//! confirmed (`/merge confirm <session>`, what the button sends) for the
//! conversation that is still the slot's.

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

    /// `/diff`, `/merge [confirm ID]`, `/discard [confirm ID]`.
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
        let confirmed = args.strip_prefix("confirm").map(str::trim);
        match confirmed {
            None => self.ask_to_confirm(&worktrees, change, key, &session).await,
            Some(id) if id != session.as_str() => Reply::command(
                "That button belongs to an earlier conversation of this chat; nothing was changed.",
            ),
            Some(_) => match change {
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
        Reply::command(format!("{question}\n{stat}")).with_buttons(vec![Button::new(
            label,
            ButtonAction::Worktree {
                change,
                session: session.as_str().to_string(),
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
        let stat = short_stat(&diff.stat);
        let Some(files) = &self.inner.config.files else {
            return Reply::command(stat);
        };
        let dir = worktrees.config().root.join(".diffs");
        let name = format!(
            "{}.diff",
            crate::worktree::plan::worktree_name(key, session)
        );
        let written = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .and_then(|()| std::fs::write(dir.join(&name), diff.patch.as_bytes()));
        if let Err(error) = written {
            tracing::warn!(%error, "could not write a diff to send");
            return Reply::error("⚠️ Could not write the diff to send.");
        }
        let workspace = crate::media::outbox::Workspace::new(&dir, None);
        let sent = files
            .send(source, None, &workspace, Path::new(&name), None, "diff:")
            .await;
        let _ = std::fs::remove_file(dir.join(&name));
        match sent {
            Ok(_) => Reply::command(stat),
            Err(refusal) => Reply::error(format!("⚠️ {refusal}\n{stat}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::short_stat;

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
