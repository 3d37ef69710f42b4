//! Files and directories only telegate's own user may read: the data
//! directory, the database (with its `-wal`, `-shm` and marker files), the
//! lock file, saved media, outboxes and the command backend's history
//! files.
//!
//! They are created 0700 (directories) and 0600 (files) whatever the umask
//! (an explicit mode at creation can only lose bits to the umask, never
//! gain them), and an existing one that group or others may read is
//! tightened at start, with a warning that says so. A directory that is
//! plainly shared (world-writable or sticky, like `/tmp`) is never
//! changed: the warning asks for a directory of telegate's own instead.
//!
//! This module owns those rules. It must never widen a mode, and never
//! change a path telegate's user does not own.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Directories: the owner only.
pub const DIR_MODE: u32 = 0o700;
/// Files: the owner only, no execute.
pub const FILE_MODE: u32 = 0o600;

/// Create `dir` (and missing parents) 0700 if it does not exist; tighten
/// it if it does and group or others may use it (see the module docs).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    if !dir.is_dir() {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)?;
    }
    tighten(dir, DIR_MODE)
}

/// Create `dir` (and missing parents) 0700 if it does not exist, from
/// async code (saved media, outboxes: directories telegate makes itself
/// inside the data directory).
pub async fn create_private_dir(dir: &Path) -> io::Result<()> {
    tokio::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .await
}

/// Create `file` empty, 0600, if it does not exist (its contents are never
/// touched); tighten it if it exists and group or others may read it.
pub fn private_file(file: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(file)
    {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => tighten(file, FILE_MODE),
        Err(error) => Err(error),
    }
}

/// Tighten `path` to at most `allowed` if it exists (`-wal`, `-shm` files
/// that may or may not be there).
pub fn tighten_if_present(path: &Path, allowed: u32) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => tighten(path, allowed),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// What to do about an existing path's mode (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeFix {
    /// Nobody else may use it.
    Fine,
    /// Set this mode (the old one without group and other bits).
    Tighten(u32),
    /// Leave it: shared (sticky or world-writable) or not ours.
    Leave,
}

/// Decide about a path of mode `mode` owned by `owner`, looked at by
/// `uid`, that should allow no more than `allowed`.
pub fn mode_fix(mode: u32, owner: u32, uid: u32, allowed: u32) -> ModeFix {
    let perms = mode & 0o7777;
    let shared = perms & 0o1000 != 0 || perms & 0o002 != 0;
    if perms & !allowed & 0o777 == 0 {
        ModeFix::Fine
    } else if shared || owner != uid {
        ModeFix::Leave
    } else {
        ModeFix::Tighten(perms & allowed)
    }
}

fn tighten(path: &Path, allowed: u32) -> io::Result<()> {
    let meta = std::fs::metadata(path)?;
    // SAFETY: geteuid has no preconditions and touches no memory.
    let uid = unsafe { libc::geteuid() };
    match mode_fix(meta.mode(), meta.uid(), uid, allowed) {
        ModeFix::Fine => Ok(()),
        ModeFix::Tighten(mode) => {
            std::fs::set_permissions(path, Permissions::from_mode(mode))?;
            tracing::warn!(
                path = %path.display(),
                was = format!("{:o}", meta.mode() & 0o7777),
                now = format!("{mode:o}"),
                "others could read telegate's data here; tightened its permissions"
            );
            Ok(())
        }
        ModeFix::Leave => {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{:o}", meta.mode() & 0o7777),
                "telegate's data is readable by others here and this path is shared or not \
                 owned by telegate's user, so it is left as it is: give telegate a directory \
                 of its own"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn only_looser_paths_of_our_own_are_tightened() {
        assert_eq!(mode_fix(0o40700, 5, 5, 0o700), ModeFix::Fine);
        assert_eq!(mode_fix(0o40500, 5, 5, 0o700), ModeFix::Fine);
        assert_eq!(mode_fix(0o40755, 5, 5, 0o700), ModeFix::Tighten(0o700));
        assert_eq!(mode_fix(0o100644, 5, 5, 0o600), ModeFix::Tighten(0o600));
        assert_eq!(
            mode_fix(0o100755, 5, 5, 0o600),
            ModeFix::Tighten(0o700 & 0o600)
        );
        // /tmp, or somebody else's directory: left alone.
        assert_eq!(mode_fix(0o41777, 0, 0, 0o700), ModeFix::Leave);
        assert_eq!(mode_fix(0o40777, 5, 5, 0o700), ModeFix::Leave);
        assert_eq!(mode_fix(0o40755, 0, 5, 0o700), ModeFix::Leave);
    }

    #[test]
    fn directories_and_files_are_private_and_looser_ones_are_tightened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let file = dir.join("f");
        private_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        std::fs::write(&file, "kept").unwrap();
        std::fs::set_permissions(&file, Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir).unwrap();
        private_file(&file).unwrap();
        assert_eq!((mode(&dir), mode(&file)), (0o700, 0o600));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept");
        tighten_if_present(&dir.join("absent"), FILE_MODE).unwrap();
    }
}
