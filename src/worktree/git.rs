//! How telegate runs git: never anything of a repository's or a
//! worktree's own.
//!
//! A worktree is written by an agent, and git reads a great deal from
//! where it runs: the `.git` file names the git directory (and with it the
//! config: `core.fsmonitor`, hooks, filters, drivers are commands), and
//! `.gitattributes` picks filters and diff and merge drivers. So every git
//! command telegate runs ([`run`]):
//!
//! * gets a fixed `GIT_DIR` and `GIT_WORK_TREE` that telegate found itself
//!   ([`Repo::resolve`] for the repository; [`Repo::worktree`] for a
//!   worktree: the entry of the repository's `worktrees/` whose `gitdir`
//!   names that worktree), never the worktree's `.git` file;
//! * runs with [`NO_PROGRAMS`] (`-c` settings: no fsmonitor, hooks from
//!   `/dev/null`, no pager, editor, external diff, signing, transport,
//!   submodule recursion) and `--attr-source` the empty tree, so no
//!   `.gitattributes` of the worktree selects a filter or driver;
//! * gets the minimal child environment ([`ChildEnv`]) with
//!   `GIT_CONFIG_NOSYSTEM`, so nothing of telegate's environment
//!   (`GIT_CONFIG_PARAMETERS`, `GIT_EXTERNAL_DIFF`, secrets) reaches it;
//! * runs as the leader of its own process group (`spawn_leader`), its
//!   arguments as a list (never a shell string), bounded by
//!   [`GIT_TIMEOUT`].
//!
//! What is still read: the repository's own config (and `config.worktree`)
//! and `info/attributes`, the operator's global config: the operator's
//! files, out of an agent's file access. This module must never let a
//! path below a worktree decide which git directory, config or program
//! git uses.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use tokio::process::Command;

use super::WorktreeError;
use crate::tools::child_output::{discard, read_capped};
use crate::tools::childenv::ChildEnv;
use crate::tools::procgroup::{spawn_leader, ProcessGroup};

/// The longest one git command may take.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings given to every git command (`-c`, which wins over every
/// config file), each turning off something that would run a program.
pub const NO_PROGRAMS: &[&str] = &[
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.editor=false",
    "sequence.editor=false",
    "diff.external=",
    "core.sshCommand=false",
    "protocol.allow=never",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "merge.verifySignatures=false",
    "submodule.recurse=false",
    "diff.ignoreSubmodules=all",
    "status.submoduleSummary=false",
];

/// Every `git diff`: plain text, no external diff program, no textconv
/// program (whatever the config says).
pub const NO_COLOR: &str = "--no-color";
/// See [`NO_COLOR`].
pub const NO_EXT_DIFF: &str = "--no-ext-diff";
/// See [`NO_COLOR`].
pub const NO_TEXTCONV: &str = "--no-textconv";

/// The most of an ordinary command's stdout kept (a diff asks for more).
pub const OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// The most of a command's stderr kept.
pub const STDERR_BYTES: usize = 64 * 1024;

/// The most of a `gitdir` file read (a path).
const GITDIR_FILE_BYTES: u64 = 4096;

/// Where one git command works: a git directory telegate found itself,
/// and its work tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// `GIT_DIR`.
    pub git_dir: PathBuf,
    /// `GIT_WORK_TREE` (and the command's directory).
    pub work_tree: PathBuf,
    /// The repository's empty tree (`--attr-source`: no attributes from
    /// the work tree).
    empty_tree: String,
}

/// The repository the worktrees are made from, as found once.
#[derive(Clone, Debug)]
pub struct Repo {
    /// The repository's own checkout.
    pub place: Place,
    /// Its common git directory (`worktrees/` is in it).
    common_dir: PathBuf,
    /// The repository's one lock (see [`repo_lock`]).
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

/// One lock per repository for the whole process (two bots may share a
/// repository): what changes the repository (worktrees made and removed,
/// a merge into the base, branches deleted) happens one at a time.
fn repo_lock(common_dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: LazyLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
        LazyLock::new(Mutex::default);
    let mut locks = LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    locks.entry(common_dir.to_path_buf()).or_default().clone()
}

impl Repo {
    /// Find `repo`'s git directory (the operator's checkout, whose
    /// top level must be `repo` itself, and whose git directory must not
    /// lie below `root`, where agents write).
    pub async fn resolve(repo: &Path, root: &Path) -> Result<Repo, WorktreeError> {
        let mut command = base_command(repo);
        command.args([
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-dir",
            "--git-common-dir",
        ]);
        let out = output(command, "rev-parse").await?;
        let lines: Vec<&str> = out.lines().collect();
        let [top, git_dir, common_dir] = lines[..] else {
            return Err(not_a_repo(repo, "git rev-parse said something else"));
        };
        let wanted = std::fs::canonicalize(repo)?;
        if Path::new(top) != wanted {
            return Err(not_a_repo(repo, "it is inside another repository"));
        }
        let (git_dir, common_dir) = (PathBuf::from(git_dir), PathBuf::from(common_dir));
        if let Ok(root) = std::fs::canonicalize(root) {
            if git_dir.starts_with(&root) || common_dir.starts_with(&root) {
                return Err(not_a_repo(
                    repo,
                    "its git directory is below the worktree root",
                ));
            }
        }
        let mut place = Place {
            git_dir,
            work_tree: wanted,
            empty_tree: String::new(),
        };
        let tree = run(&place, &["hash-object", "-t", "tree", "/dev/null"]).await?;
        place.empty_tree = tree.trim().to_string();
        Ok(Repo {
            place,
            lock: repo_lock(&common_dir),
            common_dir,
        })
    }

    /// The checked place of the worktree `root/name`: the entry of the
    /// repository's `worktrees/` whose `gitdir` file names
    /// `root/name/.git` (`None`: no such worktree). What the worktree's
    /// own `.git` says is never read.
    pub fn worktree(&self, root: &Path, name: &str) -> Result<Option<Place>, WorktreeError> {
        let Ok(root) = std::fs::canonicalize(root) else {
            return Ok(None);
        };
        let work_tree = root.join(name);
        let wanted = work_tree.join(".git");
        let Ok(entries) = std::fs::read_dir(self.common_dir.join("worktrees")) else {
            return Ok(None);
        };
        for entry in entries.flatten() {
            let admin = entry.path();
            let Some(named) = read_small(&admin.join("gitdir")) else {
                continue;
            };
            if Path::new(named.trim_end_matches(['\n', '\r'])) == wanted {
                return Ok(Some(Place {
                    git_dir: admin,
                    work_tree,
                    empty_tree: self.place.empty_tree.clone(),
                }));
            }
        }
        Ok(None)
    }
}

fn not_a_repo(repo: &Path, why: &str) -> WorktreeError {
    WorktreeError::Git {
        command: "rev-parse".to_string(),
        stderr: format!("{} is not a repository to use: {why}", repo.display()),
    }
}

/// A small file of the repository's git directory, as text.
fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(GITDIR_FILE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// git in `dir` with telegate's settings and the minimal environment, no
/// repository chosen yet.
fn base_command(dir: &Path) -> Command {
    let mut command = Command::new("git");
    ChildEnv::default().apply(&mut command);
    command
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .arg("--no-pager");
    for setting in NO_PROGRAMS {
        command.arg("-c").arg(setting);
    }
    command
}

/// The whole command for `args` at `place`.
fn command(place: &Place, args: &[&str]) -> Command {
    let mut command = base_command(&place.work_tree);
    command
        .env("GIT_DIR", &place.git_dir)
        .env("GIT_WORK_TREE", &place.work_tree);
    if !place.empty_tree.is_empty() {
        command.arg(format!("--attr-source={}", place.empty_tree));
    }
    command.args(args);
    command
}

/// The subcommand of `args`, for messages.
fn subcommand<'a>(args: &[&'a str]) -> &'a str {
    args.iter()
        .find(|a| !a.starts_with('-') && !a.contains('='))
        .copied()
        .unwrap_or("")
}

/// What one git command printed and how it ended.
#[derive(Debug)]
pub struct Ran {
    /// Its stdout, at most the cap asked for.
    pub stdout: String,
    /// It printed more than the cap (and was stopped there).
    pub cut: bool,
    /// It exited with 0 (not known when cut: it was stopped).
    pub success: bool,
    /// Its stderr, trimmed, at most [`STDERR_BYTES`].
    pub stderr: String,
}

/// Run `git args…` at `place` (see the module docs): its stdout, or its
/// stderr as the error (also when it printed more than [`OUTPUT_BYTES`]).
pub async fn run(place: &Place, args: &[&str]) -> Result<String, WorktreeError> {
    let name = subcommand(args);
    let ran = run_capped(place, args, OUTPUT_BYTES).await?;
    if ran.cut {
        return Err(WorktreeError::Git {
            command: name.to_string(),
            stderr: format!("it printed more than {OUTPUT_BYTES} bytes"),
        });
    }
    checked(ran, name)
}

fn checked(ran: Ran, name: &str) -> Result<String, WorktreeError> {
    if ran.success {
        Ok(ran.stdout)
    } else {
        Err(WorktreeError::Git {
            command: name.to_string(),
            stderr: ran.stderr,
        })
    }
}

/// Run `git args…` at `place`, its stdout read up to `cap` bytes as it
/// streams: past that, git is stopped and what came is kept.
pub async fn run_capped(place: &Place, args: &[&str], cap: usize) -> Result<Ran, WorktreeError> {
    ran(command(place, args), subcommand(args), cap).await
}

async fn output(command: Command, name: &str) -> Result<String, WorktreeError> {
    checked(ran(command, name, OUTPUT_BYTES).await?, name)
}

async fn ran(mut command: Command, name: &str, cap: usize) -> Result<Ran, WorktreeError> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = spawn_leader(command)?;
    // Dropped (a timeout, a cancelled caller): the whole group is killed.
    let mut group = child.id().and_then(ProcessGroup::of_leader);
    let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("git's pipes are missing").into());
    };
    let stopper = group.as_ref().map(ProcessGroup::id);
    let work = async {
        let out = async {
            let out = read_capped(&mut stdout, cap).await;
            if out.as_ref().is_ok_and(|out| out.cut) {
                // Enough: the rest is not read, and git not left blocked.
                if let Some(id) = stopper {
                    id.send(libc::SIGKILL);
                }
            }
            out
        };
        let err = async {
            let err = read_capped(&mut stderr, STDERR_BYTES).await;
            // Past the cap, read into nothing: git must not block on it.
            let _ = discard(&mut stderr).await;
            err
        };
        let (out, err) = tokio::join!(out, err);
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((out?, err?, status))
    };
    let (out, err, status) = tokio::time::timeout(GIT_TIMEOUT, work)
        .await
        .map_err(|_| WorktreeError::Timeout(name.to_string()))??;
    // The leader is reaped: its group id may be reused, never signal it.
    if let Some(group) = group.as_mut() {
        group.disarm();
    }
    Ok(Ran {
        cut: out.cut,
        success: status.success() && !out.cut,
        stdout: out.into_text(),
        stderr: err.into_text().trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::{command, subcommand, Place, NO_PROGRAMS};
    use std::ffi::OsStr;
    use std::path::PathBuf;

    #[test]
    fn every_command_has_a_fixed_git_dir_and_runs_no_programs() {
        let place = Place {
            git_dir: PathBuf::from("/srv/repo/.git/worktrees/w"),
            work_tree: PathBuf::from("/srv/trees/w"),
            empty_tree: "4b825dc642cb6eb9a060e54bf8d69288fbee4904".to_string(),
        };
        let built = command(&place, &["diff", "HEAD"]);
        let std = built.as_std();
        let args: Vec<&OsStr> = std.get_args().collect();
        for setting in NO_PROGRAMS {
            let at = args.iter().position(|a| *a == OsStr::new(setting));
            assert!(
                at.is_some_and(|i| args[i - 1] == "-c"),
                "{setting}: {args:?}"
            );
        }
        assert!(args.contains(&OsStr::new(
            "--attr-source=4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        )));
        assert_eq!(&args[args.len() - 2..], ["diff", "HEAD"]);
        let envs: Vec<(&OsStr, Option<&OsStr>)> = std.get_envs().collect();
        let env = |name: &str| {
            envs.iter()
                .find(|(n, _)| *n == OsStr::new(name))
                .and_then(|(_, v)| *v)
        };
        assert_eq!(
            env("GIT_DIR"),
            Some(OsStr::new("/srv/repo/.git/worktrees/w"))
        );
        assert_eq!(env("GIT_WORK_TREE"), Some(OsStr::new("/srv/trees/w")));
        assert_eq!(env("GIT_CONFIG_NOSYSTEM"), Some(OsStr::new("1")));
        assert_eq!(std.get_current_dir(), Some(place.work_tree.as_path()));
        assert_eq!(subcommand(&["-c", "a=b", "merge", "x"]), "merge");
    }
}
