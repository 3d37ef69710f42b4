//! A git worktree per conversation, against a real git repository made by
//! each test in a temporary directory: two sessions edit the same file in
//! their own worktrees without conflict; `/diff` returns exactly the
//! session's change (as a file through the fake Bot API, with a stat in the
//! chat); a concurrent first use makes one worktree; the cleanup removes
//! an ended session's merged worktree and keeps (and tells once about) one
//! with unmerged commits; `/merge` with its confirmation button (typed by
//! hand, asked again). And what an agent writes never makes telegate's git
//! run anything (a planted git directory, attributes, hooks); a merge
//! that would conflict leaves the checkout as it was; merges at once all
//! succeed; a huge diff is cut; the diff file is never written through a
//! link.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY};
use telegate::vocab::{SessionId, SessionKey};
use telegate::worktree::{WorktreeConfig, WorktreeError, Worktrees, MAX_DIFF_BYTES};

const WAIT: Duration = Duration::from_secs(20);
const USER: i64 = 42;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository with one commit on `main`: `notes.txt` holding one line.
fn repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("notes.txt"), "first line\n").unwrap();
    git(&repo, &["add", "notes.txt"]);
    git(&repo, &["commit", "-q", "-m", "start"]);
    repo
}

fn worktrees(dir: &Path, keep_days: u64) -> Arc<Worktrees> {
    Worktrees::new(WorktreeConfig {
        repo: repo(dir),
        base: "main".into(),
        root: dir.join("worktrees"),
        keep_days,
    })
}

fn key(n: u32) -> SessionKey {
    SessionKey::from_raw(format!("agent:main:telegram:dm:{n}"))
}

fn session(n: u32) -> SessionId {
    SessionId::new(format!("{n:08x}-0000-4000-8000-000000000000"))
}

#[tokio::test]
async fn two_sessions_edit_the_same_file_apart_and_each_diff_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let a = trees.ensure(&key(1), &session(1)).await.unwrap();
    let b = trees.ensure(&key(2), &session(2)).await.unwrap();
    assert_ne!(a, b);
    std::fs::write(a.join("notes.txt"), "first line\nfrom A\n").unwrap();
    std::fs::write(b.join("notes.txt"), "changed by B\n").unwrap();
    std::fs::write(b.join("new.txt"), "a new file\n").unwrap();

    let diff_a = trees.diff(&key(1), &session(1)).await.unwrap();
    assert!(diff_a.patch.contains("+from A"), "{}", diff_a.patch);
    assert!(
        !diff_a.patch.contains("B"),
        "A's diff holds only A's change: {}",
        diff_a.patch
    );
    assert!(diff_a.stat.contains("notes.txt"), "{}", diff_a.stat);
    let diff_b = trees.diff(&key(2), &session(2)).await.unwrap();
    assert!(diff_b.patch.contains("+changed by B") && diff_b.patch.contains("-first line"));
    assert!(
        diff_b.patch.contains("+a new file"),
        "new files count: {}",
        diff_b.patch
    );
    assert!(!diff_b.patch.contains("from A"));

    // Each on its own branch; the repository's checkout is untouched.
    let branches = git(&trees.config().repo, &["branch", "--list", "telegate/*"]);
    assert_eq!(branches.lines().count(), 2, "{branches}");
    let main = std::fs::read_to_string(trees.config().repo.join("notes.txt")).unwrap();
    assert_eq!(main, "first line\n");
    // The same session finds its worktree again; a new session gets a new one.
    assert_eq!(trees.ensure(&key(1), &session(1)).await.unwrap(), a);
    assert_ne!(trees.ensure(&key(1), &session(3)).await.unwrap(), a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_first_use_makes_one_worktree() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let uses: Vec<_> = (0..8)
        .map(|_| {
            let trees = trees.clone();
            tokio::spawn(async move { trees.ensure(&key(1), &session(1)).await })
        })
        .collect();
    let mut paths = Vec::new();
    for joined in uses {
        paths.push(joined.await.unwrap().expect("every first use succeeds"));
    }
    paths.dedup();
    assert_eq!(paths.len(), 1);
    let list = git(&trees.config().repo, &["worktree", "list", "--porcelain"]);
    let count = list.lines().filter(|l| l.starts_with("worktree ")).count();
    assert_eq!(count, 2, "the repository and one worktree: {list}");
}

#[tokio::test]
async fn the_cleanup_keeps_unmerged_work_and_tells_once() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 0);
    let kept = trees.ensure(&key(1), &session(1)).await.unwrap();
    let merged = trees.ensure(&key(2), &session(2)).await.unwrap();
    let live = trees.ensure(&key(3), &session(3)).await.unwrap();
    std::fs::write(kept.join("notes.txt"), "work\n").unwrap();
    git(&kept, &["commit", "-q", "-am", "unmerged work"]);
    let live_name = live.file_name().unwrap().to_string_lossy().to_string();

    let sweep = trees.sweep(&|name| name == live_name).await.unwrap();
    let merged_name = merged.file_name().unwrap().to_string_lossy().to_string();
    assert_eq!(sweep.removed, vec![merged_name]);
    assert_eq!(sweep.tell.len(), 1);
    assert_eq!(sweep.tell[0].unmerged_commits, 1);
    assert!(kept.exists() && live.exists() && !merged.exists());
    // Its owner is told once.
    let again = trees.sweep(&|name| name == live_name).await.unwrap();
    assert!(
        again.removed.is_empty() && again.tell.is_empty(),
        "{again:?}"
    );
    assert!(kept.exists());
    let branches = git(&trees.config().repo, &["branch", "--list", "telegate/*"]);
    assert_eq!(
        branches.lines().count(),
        2,
        "the removed one's branch is gone: {branches}"
    );
}

fn test_bot(fake: &FakeBotApi, dir: &Path, repo: &Path) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [store]\ndata_dir = \"{}\"\n\n[agent]\nbackend = \"command\"\n\n\
             [agent.command]\nargv = [\"sh\", \"-c\", \"printf '%s\\\\n' \\\"$1\\\" >> notes.txt; echo edited $TELEGATE_SESSION_ID\", \"sh\", \"{{message}}\"]\n\
             worktree = {{ repo = \"{}\", base = \"main\", root = \"{}\", keep_days = 7 }}\n",
            dir.join("data").display(),
            repo.display(),
            dir.join("worktrees").display(),
        ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_sends_the_conversations_change_and_merge_asks_first() {
    let dir = tempfile::tempdir().unwrap();
    let repo = repo(dir.path());
    let fake = FakeBotApi::start().await;
    let bot = test_bot(&fake, dir.path(), &repo)
        .start()
        .await
        .expect("bot starts");
    fake.push_text(USER, USER, "a line from the chat");
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER).iter().any(|t| t.contains("edited")),
            WAIT
        )
        .await
    );
    // The program ran in the conversation's worktree, not in the repository.
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "first line\n"
    );
    let texts = fake.sent_texts(USER);
    let session_id = texts
        .iter()
        .find_map(|t| t.trim().strip_prefix("edited "))
        .expect("the program said its session")
        .trim()
        .to_string();
    // A link planted where the diff file goes is not written through.
    let name = std::fs::read_dir(dir.path().join("worktrees"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| !n.starts_with('.'))
        .expect("the conversation's worktree");
    let diffs = dir.path().join("worktrees/.diffs");
    std::fs::create_dir_all(&diffs).unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "victim\n").unwrap();
    std::os::unix::fs::symlink(&victim, diffs.join(format!("{name}.diff"))).unwrap();

    fake.push_text(USER, USER, "/diff");
    assert!(
        fake.wait_for(|_| !fake.files().uploads().is_empty(), WAIT)
            .await,
        "the diff is sent as a file"
    );
    let upload = fake.files().uploads().remove(0);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim\n");
    assert_eq!(upload.method, "sendDocument");
    assert!(upload.file_name.ends_with(".diff"), "{}", upload.file_name);
    let patch = String::from_utf8_lossy(&upload.bytes).to_string();
    assert!(patch.contains("+a line from the chat"), "{patch}");
    assert_eq!(
        patch
            .lines()
            .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            .count(),
        1,
        "exactly the session's change: {patch}"
    );
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("1 file changed")),
            WAIT
        )
        .await
    );

    // /merge asks with a button; nothing is merged before the press.
    fake.push_text(USER, USER, "/merge");
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("Merge this conversation")),
            WAIT
        )
        .await
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "first line\n"
    );
    // Typed by hand with the session's id, it asks the same way: only the
    // button confirms.
    let asked = |fake: &FakeBotApi| {
        fake.sent_texts(USER)
            .iter()
            .filter(|t| t.contains("Merge this conversation"))
            .count()
    };
    fake.push_text(USER, USER, &format!("/merge confirm {session_id}"));
    assert!(fake.wait_for(|_| asked(&fake) == 2, WAIT).await);
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "first line\n",
        "typed, nothing was merged"
    );
    let (message, _, data) = support::buttons::wait_button(&fake, USER, "Merge into main").await;
    fake.push_callback_query(USER, USER, message, &data);
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("Merged into main")),
            WAIT
        )
        .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "first line\na line from the chat\n"
    );
    bot.shutdown().await;
}

/// The attack of issue 57: files written in the worktree (a planted git
/// directory whose config runs a command through `core.fsmonitor`, and
/// `.git` rewritten to name it) must not make telegate's own git run that
/// command.
#[tokio::test]
async fn a_planted_git_directory_runs_nothing_when_diffed() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let tree = trees.ensure(&key(1), &session(1)).await.unwrap();
    std::fs::write(tree.join("notes.txt"), "first line\nmore\n").unwrap();
    let marker = dir.path().join("MARKER");
    let evil = tree.join("evil");
    std::fs::create_dir_all(evil.join("objects")).unwrap();
    std::fs::create_dir_all(evil.join("refs")).unwrap();
    std::fs::write(evil.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(
        evil.join("config"),
        format!(
            "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = \"touch {}; false\"\n",
            marker.display()
        ),
    )
    .unwrap();
    std::fs::write(tree.join(".git"), "gitdir: evil\n").unwrap();
    // Attributes written in the worktree select no program either, not
    // even one the repository's config defines.
    std::fs::write(tree.join(".gitattributes"), "*.txt filter=evil diff=evil\n").unwrap();
    git(
        &trees.config().repo,
        &[
            "config",
            "filter.evil.clean",
            &format!("touch {}.filter; cat", marker.display()),
        ],
    );
    git(
        &trees.config().repo,
        &[
            "config",
            "diff.evil.textconv",
            &format!("touch {}.textconv; cat", marker.display()),
        ],
    );

    let diff = trees.diff(&key(1), &session(1)).await.unwrap();
    assert!(diff.patch.contains("+more"), "{}", diff.patch);
    for made in ["MARKER", "MARKER.filter", "MARKER.textconv"] {
        assert!(
            !dir.path().join(made).exists(),
            "{made}: telegate's git ran a command the worktree chose"
        );
    }
    // The worktree still merges and goes, its `.git` put back first.
    trees.merge(&key(1), &session(1)).await.unwrap();
    assert!(!tree.exists());
    assert!(!marker.exists());
}

/// The repository's hooks never run for telegate's git (`--no-verify`
/// alone leaves post-checkout, post-commit and post-merge).
#[tokio::test]
async fn repository_hooks_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let hooks = trees.config().repo.join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    for hook in [
        "post-checkout",
        "pre-commit",
        "post-commit",
        "pre-merge-commit",
        "post-merge",
        "reference-transaction",
    ] {
        let path = hooks.join(hook);
        let marker = dir.path().join(format!("ran-{hook}"));
        std::fs::write(&path, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let tree = trees.ensure(&key(1), &session(1)).await.unwrap();
    std::fs::write(tree.join("notes.txt"), "first line\nhooked\n").unwrap();
    trees.merge(&key(1), &session(1)).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(trees.config().repo.join("notes.txt")).unwrap(),
        "first line\nhooked\n"
    );
    let ran: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ran-"))
        .collect();
    assert!(ran.is_empty(), "hooks ran: {ran:?}");
}

/// A merge that would conflict is refused before it starts, and leaves the
/// repository's checkout as it was (no MERGE_HEAD, no conflict markers):
/// the next merge runs.
#[tokio::test]
async fn a_conflicting_merge_leaves_the_checkout_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let repo = trees.config().repo.clone();
    let a = trees.ensure(&key(1), &session(1)).await.unwrap();
    let b = trees.ensure(&key(2), &session(2)).await.unwrap();
    let c = trees.ensure(&key(3), &session(3)).await.unwrap();
    std::fs::write(a.join("notes.txt"), "A's first line\n").unwrap();
    std::fs::write(b.join("notes.txt"), "B's first line\n").unwrap();
    std::fs::write(c.join("other.txt"), "C's own file\n").unwrap();
    trees.merge(&key(1), &session(1)).await.unwrap();

    let refused = trees.merge(&key(2), &session(2)).await;
    let Err(WorktreeError::Conflict { files, .. }) = &refused else {
        panic!("a conflict: {refused:?}");
    };
    assert_eq!(files, &["notes.txt"]);
    let merge_head = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["rev-parse", "--quiet", "--verify", "MERGE_HEAD"])
        .output()
        .unwrap();
    assert!(!merge_head.status.success(), "no merge left midway");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "A's first line\n"
    );
    // B's work is still there, and the next merge runs.
    assert!(b.exists());
    trees.merge(&key(3), &session(3)).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(repo.join("other.txt")).unwrap(),
        "C's own file\n"
    );
}

/// Merges at once into one repository run one at a time (one lock per
/// repository, shared by every `Worktrees` of it): none fails for
/// another's lock file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merges_at_once_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let first = worktrees(dir.path(), 7);
    // Each merge through worktrees of its own (as several bots of one
    // repository would have), all started at once.
    let mut all = Vec::new();
    for n in 1..=8u32 {
        let trees = Worktrees::new(first.config().clone());
        let tree = trees.ensure(&key(n), &session(n)).await.unwrap();
        std::fs::write(tree.join(format!("file{n}.txt")), format!("{n}\n")).unwrap();
        all.push((n, trees));
    }
    let merges: Vec<_> = all
        .into_iter()
        .map(|(n, trees)| tokio::spawn(async move { trees.merge(&key(n), &session(n)).await }))
        .collect();
    for merge in merges {
        merge.await.unwrap().expect("every merge succeeds");
    }
    for n in 1..=8u32 {
        assert!(first.config().repo.join(format!("file{n}.txt")).exists());
    }
}

/// A diff larger than `MAX_DIFF_BYTES` is read only that far (git is
/// stopped there) and says it was cut.
#[tokio::test]
async fn a_huge_diff_is_cut_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let trees = worktrees(dir.path(), 7);
    let tree = trees.ensure(&key(1), &session(1)).await.unwrap();
    let line = "a line of a very large file\n";
    let big = line.repeat(MAX_DIFF_BYTES / line.len() + 100_000);
    std::fs::write(tree.join("big.txt"), big).unwrap();
    let diff = trees.diff(&key(1), &session(1)).await.unwrap();
    assert!(diff.cut);
    assert_eq!(diff.patch.len(), MAX_DIFF_BYTES);
    assert!(diff.stat.contains("big.txt"), "{}", diff.stat);
}
