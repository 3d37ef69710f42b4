//! A git worktree per conversation (`[agent.command] worktree`, the same
//! for `[agent.acp]`).
//!
//! Each telegate session gets its own `git worktree` of `repo` on a branch
//! named after the session (`telegate/<slot>-<session>`, see [`plan`]),
//! made from `base` on first use below `root`, and the agent works there:
//! two conversations never edit the same checkout, and `/new` (a new
//! session) starts a new one. [`Worktrees::ensure`] holds a lock per
//! worktree, so two first messages at once make one worktree. `/diff`
//! reads the session's changes against the base ([`Worktrees::diff`]);
//! `/merge` and `/discard` end them ([`Worktrees::merge`],
//! [`Worktrees::discard`]); [`Worktrees::sweep`] removes the worktrees of
//! ended sessions after `keep_days`, unless they hold work not merged (then
//! their owner is told once).
//!
//! git runs as a child process with its arguments as a list (never a shell
//! string), in its own process group (`spawn_leader`, killed with
//! telegate and when dropped), bounded by [`GIT_TIMEOUT`]. This module owns
//! the worktrees below `root` and the `telegate/` branches; it must never
//! touch another branch except the one merge into `base` that `/merge`
//! asks for, and never run a shell.

pub mod plan;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use tokio::process::Command;

use crate::tools::procgroup::{spawn_leader, ProcessGroup};
use crate::vocab::{SessionId, SessionKey};
use plan::{branch_name, cleanup, worktree_name, Cleanup, WorktreeState, BRANCH_PREFIX};

/// The longest one git command may take.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The most of a diff kept in memory (a larger one is cut, and says so).
pub const MAX_DIFF_BYTES: usize = 20 * 1024 * 1024;

/// `worktree = { repo, base, root, keep_days }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorktreeConfig {
    /// The repository the worktrees are made from.
    pub repo: PathBuf,
    /// The branch each worktree starts from and is diffed and merged against.
    #[serde(default = "default_base")]
    pub base: String,
    /// Where the worktrees go (one directory per session).
    pub root: PathBuf,
    /// Days an ended session's worktree is kept before it is removed.
    #[serde(default = "default_keep_days")]
    pub keep_days: u64,
}

fn default_base() -> String {
    "main".to_string()
}

fn default_keep_days() -> u64 {
    7
}

impl WorktreeConfig {
    /// Value rules (pure): absolute paths, a base that is a branch name.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if !self.repo.is_absolute() || !self.root.is_absolute() {
            return Err(format!(
                "{at}.worktree: repo and root must be absolute paths"
            ));
        }
        let bad = self.base.is_empty()
            || self.base.starts_with('-')
            || self.base.contains("..")
            || self
                .base
                .chars()
                .any(|c| c.is_whitespace() || "~^:?*[\\".contains(c));
        if bad {
            return Err(format!(
                "{at}.worktree.base {:?} is not a branch name",
                self.base
            ));
        }
        Ok(())
    }
}

/// What went wrong with git.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    /// git could not be started or its output read.
    #[error("could not run git: {0}")]
    Io(#[from] std::io::Error),
    /// git took longer than [`GIT_TIMEOUT`] (its group was killed).
    #[error("git {0} took too long and was stopped")]
    Timeout(String),
    /// git said no.
    #[error("git {command} failed: {stderr}")]
    Git {
        /// The subcommand.
        command: String,
        /// What git printed (trimmed).
        stderr: String,
    },
    /// The session has no worktree (none made yet, or removed).
    #[error("this conversation has no worktree")]
    Missing,
    /// `/merge` needs `base` checked out in `repo`.
    #[error("the repository has {0} checked out, not the base branch")]
    NotOnBase(String),
}

/// A session's changes against its base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionDiff {
    /// The patch (`git diff` of everything the session changed).
    pub patch: String,
    /// `git diff --stat`.
    pub stat: String,
}

/// One worktree the sweep kept and whose owner is to be told, once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptWorktree {
    /// Its directory name below `root`.
    pub name: String,
    /// Commits not merged into the base.
    pub unmerged_commits: usize,
}

/// What one sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Directory names removed.
    pub removed: Vec<String>,
    /// Kept with unmerged work, owner to be told (now, once).
    pub tell: Vec<KeptWorktree>,
}

/// The worktrees of one repository.
#[derive(Debug)]
pub struct Worktrees {
    config: WorktreeConfig,
    /// One lock per worktree name: its creation happens once.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Worktrees {
    /// Worktrees as configured.
    pub fn new(config: WorktreeConfig) -> Arc<Worktrees> {
        Arc::new(Worktrees {
            config,
            locks: Mutex::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &WorktreeConfig {
        &self.config
    }

    /// Where the worktree of `session` of `key` is (made or not).
    pub fn path_of(&self, key: &SessionKey, session: &SessionId) -> PathBuf {
        self.config.root.join(worktree_name(key, session))
    }

    fn lock_of(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        locks.entry(name.to_string()).or_default().clone()
    }

    /// The session's worktree, made from the base on first use (under
    /// its lock: concurrent first uses make one).
    pub async fn ensure(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<PathBuf, WorktreeError> {
        let name = worktree_name(key, session);
        let dir = self.config.root.join(&name);
        let lock = self.lock_of(&name);
        let _held = lock.lock().await;
        if dir.join(".git").exists() {
            return Ok(dir);
        }
        std::fs::create_dir_all(&self.config.root)?;
        let branch = branch_name(key, session);
        let repo = self.config.repo.clone();
        let exists = git(
            &repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ],
        )
        .await
        .is_ok();
        let target = dir.to_string_lossy().to_string();
        if exists {
            git(&repo, &["worktree", "add", "--", &target, &branch]).await?;
        } else {
            let base = self.config.base.clone();
            git(
                &repo,
                &["worktree", "add", "-b", &branch, "--", &target, &base],
            )
            .await?;
        }
        tracing::info!(%branch, dir = %dir.display(), "made a worktree for a conversation");
        Ok(dir)
    }

    fn existing(&self, key: &SessionKey, session: &SessionId) -> Result<PathBuf, WorktreeError> {
        let dir = self.path_of(key, session);
        if dir.join(".git").exists() {
            Ok(dir)
        } else {
            Err(WorktreeError::Missing)
        }
    }

    /// Everything the session changed against its base (commits, staged,
    /// unstaged and new files), as a patch and a `--stat`.
    pub async fn diff(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<SessionDiff, WorktreeError> {
        let dir = self.existing(key, session)?;
        // New files count: recorded as intended (no content staged).
        git(&dir, &["add", "--all", "--intent-to-add"]).await?;
        let base = self.merge_base(&dir).await?;
        let patch = git(&dir, &["diff", "--no-color", "--no-ext-diff", &base]).await?;
        let stat = git(&dir, &["diff", "--no-color", "--stat", &base]).await?;
        Ok(SessionDiff {
            patch,
            stat: stat.trim_end().to_string(),
        })
    }

    async fn merge_base(&self, dir: &Path) -> Result<String, WorktreeError> {
        let base = git(dir, &["merge-base", "HEAD", &self.config.base]).await?;
        Ok(base.trim().to_string())
    }

    /// Commit what the session left uncommitted (if anything), then merge
    /// its branch into the base in `repo` (which must have the base
    /// checked out), then remove the worktree and the branch. Returns the
    /// `--stat` of what was merged.
    pub async fn merge(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<String, WorktreeError> {
        let dir = self.existing(key, session)?;
        let branch = branch_name(key, session);
        let repo = self.config.repo.clone();
        let head = git(&repo, &["symbolic-ref", "--short", "HEAD"]).await?;
        if head.trim() != self.config.base {
            return Err(WorktreeError::NotOnBase(head.trim().to_string()));
        }
        commit_all(&dir, &format!("telegate: the work of {branch}")).await?;
        let stat = git(
            &repo,
            &[
                "diff",
                "--stat",
                &format!("{}...{branch}", self.config.base),
            ],
        )
        .await?;
        git(
            &repo,
            &[
                // Like the commit above: a machine without a git identity
                // of its own can still merge.
                "-c",
                "user.name=telegate",
                "-c",
                "user.email=telegate@localhost",
                "merge",
                "--no-ff",
                "--no-edit",
                "-m",
                &format!("Merge {branch}"),
                &branch,
            ],
        )
        .await?;
        self.remove(&dir, &branch).await?;
        Ok(stat.trim_end().to_string())
    }

    /// Remove the session's worktree and its branch, changes and all.
    pub async fn discard(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<(), WorktreeError> {
        let dir = self.existing(key, session)?;
        self.remove(&dir, &branch_name(key, session)).await
    }

    async fn remove(&self, dir: &Path, branch: &str) -> Result<(), WorktreeError> {
        let repo = self.config.repo.clone();
        let target = dir.to_string_lossy().to_string();
        git(&repo, &["worktree", "remove", "--force", "--", &target]).await?;
        git(&repo, &["branch", "-D", "--", branch]).await?;
        Ok(())
    }

    /// Commits on `branch` that the base does not have.
    async fn unmerged(&self, branch: &str) -> Result<usize, WorktreeError> {
        let range = format!("{}..{branch}", self.config.base);
        let count = git(&self.config.repo, &["rev-list", "--count", &range]).await?;
        Ok(count.trim().parse().unwrap_or(0))
    }

    /// Look at every worktree below `root`: `live` says which names belong
    /// to a current session; the others go after `keep_days` unless they
    /// hold unmerged work (reported in [`Sweep::tell`] once: a marker in
    /// `root/.told` remembers it).
    pub async fn sweep(
        &self,
        live: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Sweep, WorktreeError> {
        let mut sweep = Sweep::default();
        let Ok(entries) = std::fs::read_dir(&self.config.root) else {
            return Ok(sweep);
        };
        let told_dir = self.config.root.join(".told");
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let dir = entry.path();
            if name.starts_with('.') || !dir.join(".git").exists() {
                continue;
            }
            let lock = self.lock_of(&name);
            let _held = lock.lock().await;
            let branch = format!("{BRANCH_PREFIX}{name}");
            let idle = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or(0, |d| d.as_secs() / 86_400);
            let uncommitted = !git(&dir, &["status", "--porcelain"])
                .await?
                .trim()
                .is_empty();
            let unmerged_commits = self.unmerged(&branch).await?;
            let state = WorktreeState {
                live: live(&name),
                idle_days: idle,
                unmerged_commits,
                uncommitted,
                owner_told: told_dir.join(&name).exists(),
            };
            match cleanup(state, self.config.keep_days) {
                Cleanup::Keep => {}
                Cleanup::Remove => {
                    self.remove(&dir, &branch).await?;
                    let _ = std::fs::remove_file(told_dir.join(&name));
                    sweep.removed.push(name);
                }
                Cleanup::TellOwner => {
                    std::fs::create_dir_all(&told_dir)?;
                    std::fs::write(told_dir.join(&name), b"")?;
                    sweep.tell.push(KeptWorktree {
                        name,
                        unmerged_commits,
                    });
                }
            }
        }
        Ok(sweep)
    }
}

/// `git add --all` and a commit, if anything changed.
async fn commit_all(dir: &Path, message: &str) -> Result<(), WorktreeError> {
    git(dir, &["add", "--all"]).await?;
    if git(dir, &["diff", "--cached", "--quiet"]).await.is_ok() {
        return Ok(());
    }
    git(
        dir,
        &[
            "-c",
            "user.name=telegate",
            "-c",
            "user.email=telegate@localhost",
            "commit",
            "--no-verify",
            "-q",
            "-m",
            message,
        ],
    )
    .await?;
    Ok(())
}

/// Run `git -C dir args…` in its own process group, bounded by
/// [`GIT_TIMEOUT`]: its stdout, or its stderr as the error.
pub async fn git(dir: &Path, args: &[&str]) -> Result<String, WorktreeError> {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let name = args
        .iter()
        .find(|a| !a.starts_with('-') && !a.contains('='))
        .copied()
        .unwrap_or("");
    let child = spawn_leader(command)?;
    // Dropped (a timeout, a cancelled caller): the whole group is killed.
    let mut group = child.id().and_then(ProcessGroup::of_leader);
    let output = tokio::time::timeout(GIT_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| WorktreeError::Timeout(name.to_string()))??;
    // The leader is reaped: its group id may be reused, never signal it.
    if let Some(group) = group.as_mut() {
        group.disarm();
    }
    if !output.status.success() {
        return Err(WorktreeError::Git {
            command: name.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let mut stdout = output.stdout;
    stdout.truncate(MAX_DIFF_BYTES);
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}
