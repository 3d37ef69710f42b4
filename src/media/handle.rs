//! Opening a file to send: once, by handle, beneath its directory, never
//! through a link.
//!
//! A path checked first and opened later can be swapped in between (the
//! agent's user renames a symbolic link or a hard link to a root-only file
//! over the checked file). So a file to send is opened exactly once, and
//! every check is made on that open handle, which is also what the upload
//! reads from:
//!
//! 1. the directory it must stay in is opened by handle
//!    ([`open_root`]: `O_DIRECTORY | O_NOFOLLOW`, so a directory replaced by
//!    a link is refused);
//! 2. the path below it ([`beneath`]: relative, no `..`) is resolved from
//!    that handle without following any link: `openat2` with
//!    `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, or,
//!    where `openat2` is missing (Linux before 5.6, seccomp filters) or
//!    the directories must be checked for a [`Reader`], a walk that opens
//!    one component at a time with `O_NOFOLLOW` from the previous handle;
//! 3. the open handle must be a regular file with at most one link (a
//!    hard link to someone else's file has two; none means it was removed
//!    after the open, which changes nothing that was read), not empty and
//!    within the limit, and — when files are sent on behalf of a
//!    [`Reader`] (`run_as`) — readable by that user, as must be every
//!    directory on the way ([`check_file`], [`may_search`]: pure).
//!
//! What each check holds against. A symbolic link, anywhere, is refused
//! outright, however it is raced. The link count is a snapshot: someone
//! who can hard-link a file and remove the link again at will can make
//! the handle show one link, so it only catches a hard link left in
//! place. Against a racing `run_as` user the owner and mode check is what
//! holds: a file that user could not read is refused whatever its links
//! (and Linux's `fs.protected_hardlinks`, on by default, keeps that user
//! from linking such files in the first place).
//!
//! This module owns those rules. It must never open a path by name after
//! its checks, and never follow a link.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

/// The user on whose behalf files are sent (`[tools.terminal] run_as`):
/// a file goes only if this user could read it. Its supplementary groups
/// do not count (its commands run without them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reader {
    /// The user's uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

/// What kind of thing a handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// Anything else (FIFO, socket, device, link).
    Other,
}

/// What `fstat` says about an open handle, as far as the rules need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Its kind.
    pub kind: Kind,
    /// Its number of hard links.
    pub links: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its owner.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Its permission bits (`0o7777` part of `st_mode`).
    pub mode: u32,
}

impl Facts {
    /// The facts of an open handle.
    pub fn of(fd: BorrowedFd<'_>) -> std::io::Result<Facts> {
        let stat = rustix::fs::fstat(fd)?;
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Kind::Regular,
            FileType::Directory => Kind::Directory,
            _ => Kind::Other,
        };
        // `st_nlink` is 64 bits on x86_64 and 32 on others (aarch64).
        #[allow(clippy::useless_conversion)]
        let links = u64::from(stat.st_nlink);
        Ok(Facts {
            kind,
            links,
            size: u64::try_from(stat.st_size).unwrap_or(0),
            uid: stat.st_uid,
            gid: stat.st_gid,
            mode: stat.st_mode & 0o7777,
        })
    }
}

/// Why an open handle may not be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfit {
    /// Not a regular file (a directory, FIFO, device...).
    NotAFile,
    /// It has more than one hard link: it may be someone else's file.
    Linked,
    /// Empty (Telegram sends no empty files).
    Empty,
    /// Above the limit (its size).
    TooBig(u64),
    /// The [`Reader`] could not read it.
    Unreadable,
}

/// The permission bits (`rwx`, 0..=7) that apply to `reader` for a file
/// with `facts`: the owner's, else the group's, else the others'.
fn class_bits(facts: &Facts, reader: Reader) -> u32 {
    if facts.uid == reader.uid {
        (facts.mode >> 6) & 0o7
    } else if facts.gid == reader.gid {
        (facts.mode >> 3) & 0o7
    } else {
        facts.mode & 0o7
    }
}

/// Whether `reader` may read a file with `facts` (always, without one).
pub fn may_read(facts: &Facts, reader: Option<Reader>) -> bool {
    reader.is_none_or(|reader| class_bits(facts, reader) & 0o4 != 0)
}

/// Whether `reader` may pass through a directory with `facts` (always,
/// without one).
pub fn may_search(facts: &Facts, reader: Option<Reader>) -> bool {
    facts.kind == Kind::Directory
        && reader.is_none_or(|reader| class_bits(facts, reader) & 0o1 != 0)
}

/// Whether an open handle with `facts` may be sent: a regular file with no
/// other hard link, not empty, at most `limit` bytes, readable by
/// `reader`.
pub fn check_file(facts: &Facts, limit: u64, reader: Option<Reader>) -> Result<(), Unfit> {
    if facts.kind != Kind::Regular {
        return Err(Unfit::NotAFile);
    }
    if facts.links > 1 {
        return Err(Unfit::Linked);
    }
    if !may_read(facts, reader) {
        return Err(Unfit::Unreadable);
    }
    if facts.size == 0 {
        return Err(Unfit::Empty);
    }
    if facts.size > limit {
        return Err(Unfit::TooBig(facts.size));
    }
    Ok(())
}

/// Why a requested path names nothing below the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathProblem {
    /// It contains `..`.
    Climbs,
    /// It is absolute and not below the root.
    Outside,
    /// It names the root itself (or nothing).
    Nothing,
}

/// The path below `root` that `requested` names: `requested` itself when
/// relative, its part below `root` when absolute (compared as written: a
/// path reaching the root through a link is outside). `.` components are
/// dropped; `..` is refused.
pub fn beneath(root: &Path, requested: &Path) -> Result<PathBuf, PathProblem> {
    if requested
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(PathProblem::Climbs);
    }
    let relative = if requested.is_absolute() {
        requested
            .strip_prefix(root)
            .map_err(|_| PathProblem::Outside)?
    } else {
        requested
    };
    let parts: Vec<OsString> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_os_string()),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        return Err(PathProblem::Nothing);
    }
    Ok(parts.iter().collect())
}

/// Why a path could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// It, or a directory on its way, is a symbolic link.
    Link,
    /// It does not exist (or a directory on its way is no directory).
    Missing,
    /// The [`Reader`] may not pass through a directory on its way.
    Denied,
    /// Anything else.
    Io(std::io::Error),
}

impl From<Errno> for OpenError {
    fn from(errno: Errno) -> Self {
        match errno {
            // ELOOP: a link where none may be; EXDEV: resolution tried to
            // leave the root (only through a link, `..` never gets here).
            Errno::LOOP | Errno::XDEV => OpenError::Link,
            Errno::NOENT | Errno::NOTDIR => OpenError::Missing,
            Errno::ACCESS => OpenError::Denied,
            other => OpenError::Io(other.into()),
        }
    }
}

/// Open the directory `path` (the admin's or telegate's own path: links
/// before its last component are followed, the last one must not be one).
pub fn open_root(path: &Path) -> Result<OwnedFd, OpenError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::open(path, flags, Mode::empty())
        .map_err(|errno| link_or(rustix::fs::CWD, path.as_os_str(), errno))
}

/// Flags for the last component: a file to read (a FIFO must not block
/// the open), or a directory to list.
fn last_flags(directory: bool) -> OFlags {
    let base = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    if directory {
        base | OFlags::DIRECTORY
    } else {
        base | OFlags::NONBLOCK
    }
}

/// Open the file `relative` (from [`beneath`]) below the directory `root`
/// without following any link. With a `reader`, every directory on the
/// way (the root included) must let that user through.
pub fn open_file_beneath(
    root: BorrowedFd<'_>,
    relative: &Path,
    reader: Option<Reader>,
) -> Result<OwnedFd, OpenError> {
    open_beneath(root, relative, false, reader)
}

/// Open the directory `relative` below `root` the same way (to list it).
pub fn open_dir_beneath(
    root: BorrowedFd<'_>,
    relative: &Path,
    reader: Option<Reader>,
) -> Result<OwnedFd, OpenError> {
    open_beneath(root, relative, true, reader)
}

fn open_beneath(
    root: BorrowedFd<'_>,
    relative: &Path,
    directory: bool,
    reader: Option<Reader>,
) -> Result<OwnedFd, OpenError> {
    if reader.is_none() {
        match resolve_beneath(root, relative, directory) {
            Err(Errno::NOSYS) | Err(Errno::PERM) => {}
            Err(errno) => return Err(link_or(root, relative.as_os_str(), errno)),
            Ok(fd) => return Ok(fd),
        }
    }
    walk(root, relative, directory, reader)
}

/// One `openat2` call resolving `relative` strictly below `root`, through
/// no link at all.
#[cfg(target_os = "linux")]
fn resolve_beneath(
    root: BorrowedFd<'_>,
    relative: &Path,
    directory: bool,
) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    rustix::fs::openat2(
        root,
        relative,
        last_flags(directory),
        Mode::empty(),
        resolve,
    )
}

#[cfg(not(target_os = "linux"))]
fn resolve_beneath(
    _root: BorrowedFd<'_>,
    _relative: &Path,
    _directory: bool,
) -> Result<OwnedFd, Errno> {
    Err(Errno::NOSYS)
}

/// The portable way: one component at a time, each opened with
/// `O_NOFOLLOW` from the handle of the one before (the directories as
/// `O_PATH`, which needs no read permission), so nothing on the way can
/// be swapped for a link.
fn walk(
    root: BorrowedFd<'_>,
    relative: &Path,
    directory: bool,
    reader: Option<Reader>,
) -> Result<OwnedFd, OpenError> {
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Err(OpenError::Missing);
    };
    let pass = |fd: BorrowedFd<'_>| -> Result<(), OpenError> {
        let facts = Facts::of(fd).map_err(OpenError::Io)?;
        if may_search(&facts, reader) {
            Ok(())
        } else {
            Err(OpenError::Denied)
        }
    };
    pass(root)?;
    let mut current: Option<OwnedFd> = None;
    for part in dirs {
        let at = current.as_ref().map_or(root, AsFd::as_fd);
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let next = rustix::fs::openat(at, *part, flags, Mode::empty())
            .map_err(|errno| link_or(at, part, errno))?;
        pass(next.as_fd())?;
        current = Some(next);
    }
    let at = current.as_ref().map_or(root, AsFd::as_fd);
    rustix::fs::openat(at, *last, last_flags(directory), Mode::empty())
        .map_err(|errno| link_or(at, last, errno))
}

/// `O_DIRECTORY | O_NOFOLLOW` on a link says "not a directory": tell a
/// link apart (for the message only; nothing is opened through it).
fn link_or(at: BorrowedFd<'_>, part: &std::ffi::OsStr, errno: Errno) -> OpenError {
    if errno == Errno::NOTDIR {
        let is_link = rustix::fs::statat(at, part, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
        if is_link {
            return OpenError::Link;
        }
    }
    errno.into()
}

/// The names in the open directory `dir`, sorted ("." and ".." left out).
pub fn list(dir: BorrowedFd<'_>) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(uid: u32, gid: u32, mode: u32) -> Facts {
        Facts {
            kind: Kind::Regular,
            links: 1,
            size: 10,
            uid,
            gid,
            mode,
        }
    }

    const USER: Reader = Reader {
        uid: 1000,
        gid: 100,
    };

    #[test]
    fn a_reader_reads_by_its_class_only() {
        // The owner's bits decide for the owner, even when others may.
        assert!(!may_read(&file(1000, 5, 0o044), Some(USER)));
        assert!(may_read(&file(1000, 5, 0o400), Some(USER)));
        // The group's bits for the group.
        assert!(may_read(&file(0, 100, 0o040), Some(USER)));
        assert!(!may_read(&file(0, 100, 0o404), Some(USER)));
        // The others' bits for everyone else.
        assert!(may_read(&file(0, 0, 0o604), Some(USER)));
        assert!(!may_read(&file(0, 0, 0o600), Some(USER)));
        // Without a reader, telegate reads for itself.
        assert!(may_read(&file(0, 0, 0o000), None));
    }

    #[test]
    fn directories_need_search_permission_for_the_reader() {
        let dir = |uid, mode| Facts {
            kind: Kind::Directory,
            ..file(uid, 0, mode)
        };
        assert!(may_search(&dir(1000, 0o700), Some(USER)));
        assert!(!may_search(&dir(0, 0o700), Some(USER)));
        assert!(may_search(&dir(0, 0o711), Some(USER)));
        assert!(!may_search(&dir(0, 0o774), Some(USER)));
        assert!(may_search(&dir(0, 0o700), None));
        assert!(!may_search(&file(0, 0, 0o777), None), "a file is no way");
    }

    #[test]
    fn only_a_single_linked_regular_file_within_the_limit_is_fit() {
        let ok = file(1000, 100, 0o600);
        assert_eq!(check_file(&ok, 10, Some(USER)), Ok(()));
        assert_eq!(check_file(&ok, 9, None), Err(Unfit::TooBig(10)));
        let linked = Facts { links: 2, ..ok };
        assert_eq!(check_file(&linked, 10, None), Err(Unfit::Linked));
        // Removed after it was opened: what is read is what was checked.
        let removed = Facts { links: 0, ..ok };
        assert_eq!(check_file(&removed, 10, None), Ok(()));
        let empty = Facts { size: 0, ..ok };
        assert_eq!(check_file(&empty, 10, None), Err(Unfit::Empty));
        for kind in [Kind::Directory, Kind::Other] {
            let odd = Facts { kind, ..ok };
            assert_eq!(check_file(&odd, 10, None), Err(Unfit::NotAFile));
        }
        let roots = file(0, 0, 0o600);
        assert_eq!(check_file(&roots, 10, Some(USER)), Err(Unfit::Unreadable));
        assert_eq!(check_file(&roots, 10, None), Ok(()));
    }

    #[test]
    fn requested_paths_become_paths_below_the_root() {
        let root = Path::new("/srv/work");
        let ok = |p: &str| beneath(root, Path::new(p));
        assert_eq!(ok("a/b.txt"), Ok(PathBuf::from("a/b.txt")));
        assert_eq!(ok("./a/./b.txt"), Ok(PathBuf::from("a/b.txt")));
        assert_eq!(ok("/srv/work/a.txt"), Ok(PathBuf::from("a.txt")));
        assert_eq!(ok("/srv/workshop/a.txt"), Err(PathProblem::Outside));
        assert_eq!(ok("/etc/passwd"), Err(PathProblem::Outside));
        assert_eq!(ok("a/../../x"), Err(PathProblem::Climbs));
        assert_eq!(ok("."), Err(PathProblem::Nothing));
        assert_eq!(ok("/srv/work"), Err(PathProblem::Nothing));
    }

    /// Both ways of opening (openat2 and the walk) refuse the same things.
    fn each_way(root: BorrowedFd<'_>, relative: &str) -> [Result<OwnedFd, OpenError>; 2] {
        let relative = Path::new(relative);
        [
            open_file_beneath(root, relative, None),
            walk(root, relative, false, None),
        ]
    }

    #[test]
    fn links_anywhere_on_the_way_are_refused_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let root_path = dir.path().join("ws");
        std::fs::create_dir_all(root_path.join("sub")).unwrap();
        std::fs::write(root_path.join("sub/ok.txt"), b"ok").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root_path.join("file-link")).unwrap();
        std::os::unix::fs::symlink(root_path.join("sub"), root_path.join("dir-link")).unwrap();
        std::os::unix::fs::symlink("ok.txt", root_path.join("sub/inner-link")).unwrap();
        let root = open_root(&root_path).unwrap();
        for opened in each_way(root.as_fd(), "sub/ok.txt") {
            let fd = opened.unwrap();
            assert_eq!(Facts::of(fd.as_fd()).unwrap().kind, Kind::Regular);
        }
        for path in ["file-link", "dir-link/ok.txt", "sub/inner-link"] {
            for opened in each_way(root.as_fd(), path) {
                assert!(matches!(opened, Err(OpenError::Link)), "{path}: {opened:?}");
            }
        }
        for opened in each_way(root.as_fd(), "sub/nope.txt") {
            assert!(matches!(opened, Err(OpenError::Missing)), "{opened:?}");
        }
        // A root that is itself a link is refused.
        std::os::unix::fs::symlink(&root_path, dir.path().join("ws-link")).unwrap();
        assert!(matches!(
            open_root(&dir.path().join("ws-link")),
            Err(OpenError::Link)
        ));
    }

    #[test]
    fn a_fifo_does_not_block_the_open_and_is_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let root = open_root(dir.path()).unwrap();
        for opened in each_way(root.as_fd(), "pipe") {
            let facts = Facts::of(opened.unwrap().as_fd()).unwrap();
            assert_eq!(check_file(&facts, 100, None), Err(Unfit::NotAFile));
        }
    }

    #[test]
    fn a_hard_link_shows_two_links_on_the_handle() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"x").unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        let root = open_root(dir.path()).unwrap();
        let fd = open_file_beneath(root.as_fd(), Path::new("b"), None).unwrap();
        let facts = Facts::of(fd.as_fd()).unwrap();
        assert_eq!(check_file(&facts, 100, None), Err(Unfit::Linked));
    }

    #[test]
    fn the_walk_checks_each_directory_for_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("closed")).unwrap();
        std::fs::write(dir.path().join("closed/f"), b"x").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let closed = std::fs::Permissions::from_mode(0o700);
        std::fs::set_permissions(dir.path().join("closed"), closed).unwrap();
        let root = open_root(dir.path()).unwrap();
        // SAFETY: no preconditions.
        let me = unsafe { libc::geteuid() };
        let stranger = Reader {
            uid: me.wrapping_add(4242),
            gid: 4242,
        };
        assert!(matches!(
            open_file_beneath(root.as_fd(), Path::new("closed/f"), Some(stranger)),
            Err(OpenError::Denied)
        ));
        assert!(open_file_beneath(root.as_fd(), Path::new("closed/f"), None).is_ok());
    }

    #[test]
    fn a_directory_is_listed_from_its_handle() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b", "a", "c"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let root = open_root(dir.path()).unwrap();
        assert_eq!(list(root.as_fd()).unwrap(), ["a", "b", "c"]);
    }
}
