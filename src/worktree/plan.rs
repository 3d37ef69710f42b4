//! The pure half of the worktrees: names from sessions, what the cleanup
//! does with one worktree, which paths an agent may not write. No I/O.

use std::path::{Component, Path};

use crate::vocab::{SessionId, SessionKey};

/// The prefix of every branch telegate makes.
pub const BRANCH_PREFIX: &str = "telegate/";

/// A session's worktree directory name (below `root`) and branch tail:
/// the slot key without its fixed prefix, then the session id's first
/// eight characters, made of `[A-Za-z0-9._-]` only (a valid git ref
/// component, a valid file name, never `.`/`..`, never ending in `.lock`).
pub fn worktree_name(key: &SessionKey, session: &SessionId) -> String {
    let slot = key
        .as_str()
        .strip_prefix("agent:main:")
        .unwrap_or(key.as_str());
    let mut name: String = slot
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
            ':' => '.',
            _ => '_',
        })
        .collect();
    // No two dots in a row (a git ref may not hold `..`), none at the ends.
    while name.contains("..") {
        name = name.replace("..", ".");
    }
    let name = name.trim_matches('.');
    let id: String = session
        .as_str()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    format!("{name}-{id}")
}

/// The branch of a session's worktree.
pub fn branch_name(key: &SessionKey, session: &SessionId) -> String {
    format!("{BRANCH_PREFIX}{}", worktree_name(key, session))
}

/// Whether `path` goes through or names a `.git` (any component, in any
/// letter case: a case-folding file system takes `.GIT` for `.git`). A
/// `.git` file or directory decides which git directory, config and so
/// programs git uses, so no agent may write one, at any depth (a nested
/// one is a repository git looks into).
pub fn names_git_dir(path: &Path) -> bool {
    path.components().any(|c| match c {
        Component::Normal(part) => part.as_encoded_bytes().eq_ignore_ascii_case(b".git"),
        _ => false,
    })
}

/// What is known of one worktree when the cleanup looks at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorktreeState {
    /// Its session is still the current one of some slot.
    pub live: bool,
    /// Days since it was last changed.
    pub idle_days: u64,
    /// Commits on its branch that its base does not have.
    pub unmerged_commits: usize,
    /// Changed files not committed yet.
    pub uncommitted: bool,
    /// Its owner was already told it is kept.
    pub owner_told: bool,
}

/// What the cleanup does with one worktree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Leave it (live, recent, or kept and already told).
    Keep,
    /// Remove the worktree and its branch.
    Remove,
    /// Keep it (work not merged) and tell its owner, once.
    TellOwner,
}

/// The cleanup's decision (pure): worktrees of ended sessions go after
/// `keep_days`, unless they hold work not merged into the base.
pub fn cleanup(state: WorktreeState, keep_days: u64) -> Cleanup {
    if state.live || state.idle_days < keep_days {
        return Cleanup::Keep;
    }
    if state.unmerged_commits > 0 || state.uncommitted {
        return if state.owner_told {
            Cleanup::Keep
        } else {
            Cleanup::TellOwner
        };
    }
    Cleanup::Remove
}

#[cfg(test)]
mod tests {
    use super::{branch_name, cleanup, names_git_dir, worktree_name, Cleanup, WorktreeState};
    use crate::vocab::{SessionId, SessionKey};
    use std::path::Path;

    #[test]
    fn a_git_component_at_any_depth_in_any_case_is_named() {
        for path in [
            ".git",
            "a/.git/config",
            "sub/.GIT",
            "x/.Git/hooks/post",
            "/w/.git",
        ] {
            assert!(names_git_dir(Path::new(path)), "{path}");
        }
        for path in [
            ".gitignore",
            "a/.gitattributes",
            "git",
            "a/b.git",
            ".git.bak/x",
        ] {
            assert!(!names_git_dir(Path::new(path)), "{path}");
        }
    }

    fn id() -> SessionId {
        SessionId::new("3f2a9c1b-0000-4000-8000-000000000000")
    }

    #[test]
    fn names_come_from_the_slot_and_the_session() {
        let key = SessionKey::from_raw("agent:main:telegram:supergroup:-1001:7:42");
        assert_eq!(
            worktree_name(&key, &id()),
            "telegram.supergroup.-1001.7.42-3f2a9c1b"
        );
        assert_eq!(
            branch_name(&key, &id()),
            "telegate/telegram.supergroup.-1001.7.42-3f2a9c1b"
        );
        // Whatever a key holds, the name stays one safe component.
        let odd = SessionKey::from_raw("agent:main:x/../y::z .lock");
        let name = worktree_name(&odd, &id());
        assert!(!name.contains(".."), "{name}");
        assert!(!name.contains('/') && !name.contains(' '), "{name}");
        assert!(!name.ends_with(".lock"), "{name}");
        // A new session of the same slot gets a new worktree.
        let other = SessionId::new("77777777-0000-4000-8000-000000000000");
        assert_ne!(worktree_name(&key, &id()), worktree_name(&key, &other));
    }

    #[test]
    fn the_cleanup_table() {
        let ended = WorktreeState {
            live: false,
            idle_days: 30,
            unmerged_commits: 0,
            uncommitted: false,
            owner_told: false,
        };
        let cases = [
            ("ended, old, merged", ended, Cleanup::Remove),
            (
                "live",
                WorktreeState {
                    live: true,
                    ..ended
                },
                Cleanup::Keep,
            ),
            (
                "ended, recent",
                WorktreeState {
                    idle_days: 2,
                    ..ended
                },
                Cleanup::Keep,
            ),
            (
                "unmerged commits",
                WorktreeState {
                    unmerged_commits: 3,
                    ..ended
                },
                Cleanup::TellOwner,
            ),
            (
                "uncommitted changes",
                WorktreeState {
                    uncommitted: true,
                    ..ended
                },
                Cleanup::TellOwner,
            ),
            (
                "unmerged, told",
                WorktreeState {
                    unmerged_commits: 1,
                    owner_told: true,
                    ..ended
                },
                Cleanup::Keep,
            ),
            (
                "exactly keep_days",
                WorktreeState {
                    idle_days: 7,
                    ..ended
                },
                Cleanup::Remove,
            ),
        ];
        for (what, state, expected) in cases {
            assert_eq!(cleanup(state, 7), expected, "{what}");
        }
    }
}
