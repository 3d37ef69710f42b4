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
//! git runs through [`git`]: never code of the repository's or a
//! worktree's (a fixed, checked `GIT_DIR`; no hooks, fsmonitor, filters,
//! drivers or pager; the minimal environment), as a child process with
//! its arguments as a list (never a shell string), in its own process
//! group (`spawn_leader`, killed with telegate and when dropped), bounded
//! by [`GIT_TIMEOUT`]. This module owns the worktrees below `root` and the
//! `telegate/` branches; it must never touch another branch except the
//! one merge into `base` that `/merge` asks for, and never run a shell.

pub mod git;
pub mod plan;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::vocab::{SessionId, SessionKey, WorktreeButton};
pub use git::GIT_TIMEOUT;
use git::{run as git, Place, Repo, NO_COLOR, NO_EXT_DIFF, NO_TEXTCONV};
use plan::{branch_name, cleanup, worktree_name, Cleanup, WorktreeState, BRANCH_PREFIX};

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
    /// The session's work and the base changed the same lines: nothing
    /// was merged.
    #[error("this conversation's work conflicts with {base} in {}; nothing was merged", files.join(", "))]
    Conflict {
        /// The base branch.
        base: String,
        /// The files in conflict.
        files: Vec<String>,
    },
}

/// A session's changes against its base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionDiff {
    /// The patch (`git diff` of everything the session changed).
    pub patch: String,
    /// `git diff --stat`.
    pub stat: String,
    /// The patch was longer than [`MAX_DIFF_BYTES`]: this is its start.
    pub cut: bool,
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
    /// The repository, found on first use.
    repo: tokio::sync::OnceCell<Repo>,
    /// One lock per worktree name: its creation happens once.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The key of the confirmation buttons' tokens (made at start; none
    /// if the system gave no random bytes: then nothing confirms).
    confirm_key: Option<ring::hmac::Key>,
}

impl Worktrees {
    /// Worktrees as configured.
    pub fn new(config: WorktreeConfig) -> Arc<Worktrees> {
        Arc::new(Worktrees {
            config,
            repo: tokio::sync::OnceCell::new(),
            locks: Mutex::default(),
            confirm_key: ring::hmac::Key::generate(
                ring::hmac::HMAC_SHA256,
                &ring::rand::SystemRandom::new(),
            )
            .ok(),
        })
    }

    /// The token a confirmation button for `change` of `session` carries:
    /// only a press of a button telegate showed confirms (`/merge confirm
    /// ID` typed by hand has none, and is asked first, like `/merge`).
    /// Valid while this process runs.
    pub fn confirmation(&self, change: WorktreeButton, session: &SessionId) -> Option<String> {
        let key = self.confirm_key.as_ref()?;
        let what = format!("{}\0{}", change.command(), session.as_str());
        let tag = ring::hmac::sign(key, what.as_bytes());
        Some(
            tag.as_ref()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    /// Whether `token` is the confirmation of `change` of `session`.
    pub fn confirms(&self, change: WorktreeButton, session: &SessionId, token: &str) -> bool {
        self.confirmation(change, session)
            .is_some_and(|wanted| bool::from(wanted.as_bytes().ct_eq(token.as_bytes())))
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

    async fn repo(&self) -> Result<&Repo, WorktreeError> {
        self.repo
            .get_or_try_init(|| Repo::resolve(&self.config.repo, &self.config.root))
            .await
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
        let repo = self.repo().await?;
        if repo.worktree(&self.config.root, &name)?.is_some() {
            return Ok(dir);
        }
        std::fs::create_dir_all(&self.config.root)?;
        let branch = branch_name(key, session);
        let _repo_held = repo.lock.lock().await;
        let at = &repo.place;
        let exists = git(
            at,
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
            git(at, &["worktree", "add", "--", &target, &branch]).await?;
        } else {
            let base = self.config.base.clone();
            git(
                at,
                &["worktree", "add", "-b", &branch, "--", &target, &base],
            )
            .await?;
        }
        tracing::info!(%branch, dir = %dir.display(), "made a worktree for a conversation");
        Ok(dir)
    }

    /// The session's worktree, as git must see it (its checked place).
    async fn existing(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<Place, WorktreeError> {
        let name = worktree_name(key, session);
        self.repo()
            .await?
            .worktree(&self.config.root, &name)?
            .ok_or(WorktreeError::Missing)
    }

    /// Everything the session changed against its base (commits, staged,
    /// unstaged and new files), as a patch and a `--stat`.
    pub async fn diff(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<SessionDiff, WorktreeError> {
        let at = self.existing(key, session).await?;
        // New files count: recorded as intended (no content staged).
        git(&at, &["add", "--all", "--intent-to-add"]).await?;
        let base = self.merge_base(&at).await?;
        let (patch, cut) = diff_capped(&at, &[NO_COLOR, &base]).await?;
        let (stat, _) = diff_capped(&at, &["--stat", &base]).await?;
        Ok(SessionDiff {
            patch,
            stat: stat.trim_end().to_string(),
            cut,
        })
    }

    async fn merge_base(&self, at: &Place) -> Result<String, WorktreeError> {
        let base = git(at, &["merge-base", "HEAD", &self.config.base]).await?;
        Ok(base.trim().to_string())
    }

    /// Commit what the session left uncommitted (if anything), then merge
    /// its branch into the base in `repo` (which must have the base
    /// checked out), then remove the worktree and the branch. Returns the
    /// `--stat` of what was merged.
    ///
    /// The repository's checkout is never left mid-merge: a merge that
    /// would conflict is found first (`merge-tree`, which touches no
    /// checkout) and not started, and a merge that fails anyway is
    /// aborted. Under the worktree's lock, then the repository's.
    pub async fn merge(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<String, WorktreeError> {
        let name = worktree_name(key, session);
        let lock = self.lock_of(&name);
        let _held = lock.lock().await;
        let tree = self.existing(key, session).await?;
        let branch = branch_name(key, session);
        let repo = self.repo().await?;
        let _repo_held = repo.lock.lock().await;
        let at = &repo.place;
        let head = git(at, &["symbolic-ref", "--short", "HEAD"]).await?;
        if head.trim() != self.config.base {
            return Err(WorktreeError::NotOnBase(head.trim().to_string()));
        }
        commit_all(&tree, &format!("telegate: the work of {branch}")).await?;
        self.check_merges(at, &branch).await?;
        let stat = git(
            at,
            &[
                "diff",
                NO_EXT_DIFF,
                NO_TEXTCONV,
                "--stat",
                &format!("{}...{branch}", self.config.base),
            ],
        )
        .await?;
        let merged = git(
            at,
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
                "--no-verify",
                "-m",
                &format!("Merge {branch}"),
                &branch,
            ],
        )
        .await;
        if let Err(error) = merged {
            abort_merge(at).await;
            return Err(error);
        }
        self.remove_locked(&tree, &branch, at).await?;
        Ok(stat.trim_end().to_string())
    }

    /// `Err(Conflict)` if merging `branch` into the base would conflict
    /// (found without touching any checkout).
    async fn check_merges(&self, at: &Place, branch: &str) -> Result<(), WorktreeError> {
        let base = &self.config.base;
        let args = [
            "merge-tree",
            "--write-tree",
            "--name-only",
            "--no-messages",
            base.as_str(),
            branch,
        ];
        let ran = git::run_capped(at, &args, git::OUTPUT_BYTES).await?;
        if ran.success {
            return Ok(());
        }
        // Exit 1 with the tree and the conflicted files; anything else is
        // an error of git's.
        let lines = ran.stdout.lines().skip(1).filter(|l| !l.is_empty());
        let files: Vec<String> = lines.take(10).map(str::to_string).collect();
        if files.is_empty() {
            return Err(WorktreeError::Git {
                command: "merge-tree".to_string(),
                stderr: ran.stderr,
            });
        }
        Err(WorktreeError::Conflict {
            base: base.clone(),
            files,
        })
    }

    /// Remove the session's worktree and its branch, changes and all.
    pub async fn discard(
        &self,
        key: &SessionKey,
        session: &SessionId,
    ) -> Result<(), WorktreeError> {
        let name = worktree_name(key, session);
        let lock = self.lock_of(&name);
        let _held = lock.lock().await;
        let tree = self.existing(key, session).await?;
        self.remove(&tree, &branch_name(key, session)).await
    }

    /// Remove a worktree and its branch, under the repository's lock.
    async fn remove(&self, tree: &Place, branch: &str) -> Result<(), WorktreeError> {
        let repo = self.repo().await?;
        let _repo_held = repo.lock.lock().await;
        self.remove_locked(tree, branch, &repo.place).await
    }

    /// Remove a worktree and its branch (the caller holds the repository's
    /// lock). Its `.git` file is written again first (what it held is the
    /// agent's; `git worktree remove` refuses a worktree whose `.git` does
    /// not lead back to it).
    async fn remove_locked(
        &self,
        tree: &Place,
        branch: &str,
        repo: &Place,
    ) -> Result<(), WorktreeError> {
        restore_git_file(tree)?;
        let target = tree.work_tree.to_string_lossy().to_string();
        git(repo, &["worktree", "remove", "--force", "--", &target]).await?;
        git(repo, &["branch", "-D", "--", branch]).await?;
        Ok(())
    }

    /// Commits on `branch` that the base does not have.
    async fn unmerged(&self, branch: &str) -> Result<usize, WorktreeError> {
        let range = format!("{}..{branch}", self.config.base);
        let repo = &self.repo().await?.place;
        let count = git(repo, &["rev-list", "--count", &range]).await?;
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
        let repo = self.repo().await?;
        let told_dir = self.config.root.join(".told");
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            let lock = self.lock_of(&name);
            let _held = lock.lock().await;
            let Some(tree) = repo.worktree(&self.config.root, &name)? else {
                continue;
            };
            let branch = format!("{BRANCH_PREFIX}{name}");
            let idle = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .map_or(0, |d| d.as_secs() / 86_400);
            let status = ["status", "--porcelain", "--ignore-submodules=all"];
            let uncommitted = !git(&tree, &status).await?.trim().is_empty();
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
                    self.remove(&tree, &branch).await?;
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

/// After a failed merge: if it stopped midway (`MERGE_HEAD`), abort it, so
/// the checkout is as it was and the next merge can run.
async fn abort_merge(repo: &Place) {
    let midway = git(repo, &["rev-parse", "--quiet", "--verify", "MERGE_HEAD"])
        .await
        .is_ok();
    if midway {
        if let Err(error) = git(repo, &["merge", "--abort"]).await {
            tracing::error!(%error, repo = %repo.work_tree.display(), "could not abort a failed merge");
        }
    }
}

/// Put back the worktree's `.git` file as git made it (whatever is at
/// `.git` now goes: a file, a link, a directory the agent made).
fn restore_git_file(tree: &Place) -> Result<(), WorktreeError> {
    let dot_git = tree.work_tree.join(".git");
    match std::fs::symlink_metadata(&dot_git) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&dot_git)?,
        Ok(_) => std::fs::remove_file(&dot_git)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error.into()),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&dot_git)?;
    std::io::Write::write_all(
        &mut file,
        format!("gitdir: {}\n", tree.git_dir.display()).as_bytes(),
    )?;
    Ok(())
}

/// `git diff args…` (no external diff, no textconv), read up to
/// [`MAX_DIFF_BYTES`] as it streams: the text and whether it was cut.
async fn diff_capped(at: &Place, args: &[&str]) -> Result<(String, bool), WorktreeError> {
    let args = [&["diff", NO_EXT_DIFF, NO_TEXTCONV][..], args].concat();
    let ran = git::run_capped(at, &args, MAX_DIFF_BYTES).await?;
    if !ran.success && !ran.cut {
        return Err(WorktreeError::Git {
            command: "diff".to_string(),
            stderr: ran.stderr,
        });
    }
    Ok((ran.stdout, ran.cut))
}

/// `git add --all` and a commit, if anything changed.
async fn commit_all(at: &Place, message: &str) -> Result<(), WorktreeError> {
    git(at, &["add", "--all"]).await?;
    if git(at, &["diff", "--cached", "--quiet", NO_EXT_DIFF])
        .await
        .is_ok()
    {
        return Ok(());
    }
    git(
        at,
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
