//! The file system capability telegate offers an ACP agent
//! (`fs/read_text_file`, `fs/write_text_file`), confined to the session's
//! working directory.
//!
//! Every path is resolved below the workdir's own handle and through no
//! symbolic link, exactly as files to send are ([`crate::media::handle`]:
//! `openat2` `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or an `O_NOFOLLOW`
//! walk): a path outside the workdir, one with `..`, or one through a link
//! is refused, and so is a file with more than one hard link (writing
//! through it would change a file elsewhere). Missing directories on the
//! way of a write are created (0700), one component at a time from the
//! previous one's handle. Reads are capped at [`MAX_READ_BYTES`]. No
//! write goes to a `.git` file or directory, at any depth and in any letter
//! case ([`names_git_dir`]): it would choose what telegate's git runs.
//!
//! Every open is non-blocking (a FIFO never holds a thread) and the handle's
//! type is checked before anything is read or written. Blocking otherwise
//! (file I/O); call it from `spawn_blocking`. This module never opens a
//! path by name after resolving it, and never follows a link.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::media::handle::{beneath, open_file_beneath, open_root, OpenError, PathProblem};
use crate::worktree::plan::names_git_dir;

/// The most a read returns, before `line` / `limit`.
pub(super) const MAX_READ_BYTES: u64 = 8 * 1024 * 1024;

/// Why a file operation was refused (the text goes back to the agent).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum FsRefusal {
    /// Outside the workdir, through `..`, or naming nothing.
    #[error("{0} is outside the session's working directory")]
    Outside(String),
    /// A symbolic link on the way.
    #[error("{0}: symbolic links are not followed")]
    Link(String),
    /// It does not exist.
    #[error("{0} does not exist")]
    Missing(String),
    /// Not a regular file, or a file with other hard links.
    #[error("{0} is not a plain file (a directory, a device, or a file with several links)")]
    NotPlain(String),
    /// A `.git` file or directory (or a path through one).
    #[error("{0}: files of git (.git) are not written")]
    Git(String),
    /// Too big to read.
    #[error("{0} is larger than {MAX_READ_BYTES} bytes")]
    TooLarge(String),
    /// Not UTF-8 text.
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    /// Anything else.
    #[error("{0}: {1}")]
    Io(String, String),
}

fn refusal(shown: &str, error: OpenError) -> FsRefusal {
    match error {
        OpenError::Link => FsRefusal::Link(shown.to_string()),
        OpenError::Missing => FsRefusal::Missing(shown.to_string()),
        OpenError::Denied => FsRefusal::Io(shown.to_string(), "permission denied".to_string()),
        OpenError::Io(error) => FsRefusal::Io(shown.to_string(), error.to_string()),
    }
}

fn io(shown: &str) -> impl Fn(std::io::Error) -> FsRefusal + '_ {
    move |error| FsRefusal::Io(shown.to_string(), error.to_string())
}

fn relative(root: &Path, path: &Path) -> Result<std::path::PathBuf, FsRefusal> {
    let shown = path.display().to_string();
    beneath(root, path).map_err(|problem| match problem {
        PathProblem::Climbs | PathProblem::Outside | PathProblem::Nothing => {
            FsRefusal::Outside(shown)
        }
    })
}

/// A regular file with one link at most (none: removed meanwhile).
fn check_plain(fd: BorrowedFd<'_>, shown: &str) -> Result<u64, FsRefusal> {
    let stat = rustix::fs::fstat(fd).map_err(|e| io(shown)(e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink > 1 {
        return Err(FsRefusal::NotPlain(shown.to_string()));
    }
    Ok(u64::try_from(stat.st_size).unwrap_or(0))
}

/// The text of `path` (absolute, below `root`, or relative to it), from
/// 1-based `line` on, at most `limit` lines.
pub(super) fn read_text(
    root: &Path,
    path: &Path,
    line: Option<u32>,
    limit: Option<u32>,
) -> Result<String, FsRefusal> {
    let shown = path.display().to_string();
    let rel = relative(root, path)?;
    let root_fd = open_root(root).map_err(|e| refusal(&root.display().to_string(), e))?;
    let fd = open_file_beneath(root_fd.as_fd(), &rel, None).map_err(|e| refusal(&shown, e))?;
    let size = check_plain(fd.as_fd(), &shown)?;
    if size > MAX_READ_BYTES {
        return Err(FsRefusal::TooLarge(shown));
    }
    // The handle was opened non-blocking (a FIFO must not hang the open);
    // a regular file reads the same either way.
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    std::fs::File::from(fd)
        .take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io(&shown))?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(FsRefusal::TooLarge(shown));
    }
    let text = String::from_utf8(bytes).map_err(|_| FsRefusal::NotText(shown))?;
    Ok(select_lines(&text, line, limit))
}

/// Lines `line..line + limit` (1-based) of `text`, with their endings.
fn select_lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_string();
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// Write `content` to `path` (below `root`), creating it or replacing
/// what it held, and the directories on its way.
pub(super) fn write_text(root: &Path, path: &Path, content: &str) -> Result<(), FsRefusal> {
    let shown = path.display().to_string();
    let rel = relative(root, path)?;
    if names_git_dir(&rel) {
        return Err(FsRefusal::Git(shown));
    }
    let parts: Vec<&std::ffi::OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Err(FsRefusal::Outside(shown));
    };
    let root_fd = open_root(root).map_err(|e| refusal(&root.display().to_string(), e))?;
    let mut current: Option<OwnedFd> = None;
    for dir in dirs {
        let at = current.as_ref().map_or(root_fd.as_fd(), AsFd::as_fd);
        match rustix::fs::mkdirat(at, *dir, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(errno) => return Err(io(&shown)(errno.into())),
        }
        let flags = OFlags::RDONLY
            | OFlags::DIRECTORY
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC
            | OFlags::NONBLOCK;
        let next = rustix::fs::openat(at, *dir, flags, Mode::empty()).map_err(|errno| {
            if errno == Errno::NOTDIR || errno == Errno::LOOP {
                // A link (or a file) where a directory must be.
                FsRefusal::Link(shown.clone())
            } else {
                io(&shown)(errno.into())
            }
        })?;
        current = Some(next);
    }
    let at = current.as_ref().map_or(root_fd.as_fd(), AsFd::as_fd);
    // Non-blocking: opening a FIFO to write waits for a reader otherwise
    // (a blocking-pool thread held for as long as none comes); without one
    // the open fails (ENXIO), with one the handle is refused below.
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NOCTTY
        | OFlags::NONBLOCK;
    let fd = rustix::fs::openat(at, *name, flags, Mode::from_raw_mode(0o644)).map_err(|errno| {
        match errno {
            Errno::LOOP => FsRefusal::Link(shown.clone()),
            Errno::NXIO => FsRefusal::NotPlain(shown.clone()),
            _ => io(&shown)(errno.into()),
        }
    })?;
    // Checked on the handle before anything is changed: a hard link to a
    // file elsewhere, or a FIFO, is left alone.
    check_plain(fd.as_fd(), &shown)?;
    rustix::fs::ftruncate(&fd, 0).map_err(|e| io(&shown)(e.into()))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(content.as_bytes()).map_err(io(&shown))?;
    file.flush().map_err(io(&shown))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// `f` on a thread of its own, waited for at most 20 s (`None`: it
    /// still blocks).
    fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(20)).ok()
    }

    #[test]
    fn a_fifo_is_neither_read_nor_written_and_holds_no_thread() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let fifo = root.join("pipe");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // No reader: the write is refused at once instead of waiting for one.
        let at = root.clone();
        let written = bounded(move || write_text(&at, Path::new("pipe"), "x"));
        assert!(
            matches!(written, Some(Err(FsRefusal::NotPlain(_)))),
            "{written:?}"
        );
        let at = root.clone();
        let read = bounded(move || read_text(&at, Path::new("pipe"), None, None));
        assert!(
            matches!(read, Some(Err(FsRefusal::NotPlain(_)))),
            "{read:?}"
        );
        // A reader waiting: the handle is refused before anything is written.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let at = root.clone();
        let written = bounded(move || write_text(&at, Path::new("pipe"), "x"));
        assert!(
            matches!(written, Some(Err(FsRefusal::NotPlain(_)))),
            "{written:?}"
        );
        let mut got = Vec::new();
        let _ = (&reader).read_to_end(&mut got);
        assert!(got.is_empty(), "nothing reached the reader");
    }

    #[test]
    fn reads_and_writes_stay_inside_the_workdir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_text(root, &root.join("a/b/notes.txt"), "one\ntwo\nthree\n").unwrap();
        assert_eq!(
            read_text(root, &root.join("a/b/notes.txt"), None, None).unwrap(),
            "one\ntwo\nthree\n"
        );
        assert_eq!(
            read_text(root, Path::new("a/b/notes.txt"), Some(2), Some(1)).unwrap(),
            "two\n"
        );
        write_text(root, &root.join("a/b/notes.txt"), "short").unwrap();
        assert_eq!(
            read_text(root, Path::new("a/b/notes.txt"), None, None).unwrap(),
            "short"
        );

        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "top secret").unwrap();
        assert!(matches!(
            read_text(root, &secret, None, None),
            Err(FsRefusal::Outside(_))
        ));
        assert!(matches!(
            read_text(root, &root.join("../x"), None, None),
            Err(FsRefusal::Outside(_))
        ));
        assert!(matches!(
            write_text(root, &secret, "x"),
            Err(FsRefusal::Outside(_))
        ));

        // Links are never followed, whether the file or a directory is one.
        std::os::unix::fs::symlink(&secret, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("dirlink")).unwrap();
        assert!(matches!(
            read_text(root, Path::new("link"), None, None),
            Err(FsRefusal::Link(_))
        ));
        assert!(matches!(
            write_text(root, Path::new("link"), "x"),
            Err(FsRefusal::Link(_))
        ));
        assert!(write_text(root, Path::new("dirlink/secret"), "x").is_err());
        assert!(read_text(root, Path::new("dirlink/secret"), None, None).is_err());
        // A hard link to a file elsewhere is not written through.
        let shared = root.join("hard");
        std::fs::hard_link(&secret, &shared).unwrap();
        assert!(matches!(
            write_text(root, &shared, "x"),
            Err(FsRefusal::NotPlain(_))
        ));
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret");

        // Nothing of git's, at any depth, in any letter case.
        for git in [".git", "a/.git/config", "sub/.GIT", "d/.Git/HEAD"] {
            assert!(
                matches!(
                    write_text(root, Path::new(git), "x"),
                    Err(FsRefusal::Git(_))
                ),
                "{git}"
            );
            assert!(
                matches!(
                    write_text(root, &root.join(git), "x"),
                    Err(FsRefusal::Git(_))
                ),
                "{git}"
            );
            assert!(!root.join(git).exists(), "{git}");
        }
        write_text(root, Path::new("a/.gitignore"), "x").unwrap();

        assert!(matches!(
            read_text(root, Path::new("missing"), None, None),
            Err(FsRefusal::Missing(_))
        ));
        std::fs::write(root.join("bin"), [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_text(root, Path::new("bin"), None, None),
            Err(FsRefusal::NotText(_))
        ));
    }
}
