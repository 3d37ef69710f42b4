//! One telegate per data directory.
//!
//! Two processes on one `data_dir` would both poll, both resume unfinished
//! messages and answer them twice. At start, `telegate run` (and `console`)
//! takes an exclusive `flock` on `<data_dir>/telegate.lock` and writes its
//! pid into it. A second process finds the lock held and exits with the
//! holder's pid, or, started with `--standby`, waits for the lock and takes
//! over when the holder exits (a hot standby on one host). The kernel drops
//! the lock when its holder exits in any way, `kill -9` included, so a stale
//! lock file never blocks a start.
//!
//! This module owns the lock file. It must never delete the file (a waiting
//! standby holds it open; deleting it would let a third process lock a new
//! file with the same name) nor take the lock for an in-memory store.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "telegate.lock";

/// How often a standby tries the lock again.
const STANDBY_POLL: Duration = Duration::from_millis(250);

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another telegate (pid {}) is already running on the data directory {}; stop it first, \
         or start this one with --standby to take over when it exits",
        holder.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        dir.display()
    )]
    Held {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// The lock file could not be created or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A standby was told to stop before it got the lock.
    #[error("stopped while waiting for the data directory lock")]
    Cancelled,
}

/// The held lock; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    path: PathBuf,
}

impl InstanceLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lock `dir` (creating it) or fail at once naming the holder.
    pub fn acquire(dir: &Path) -> Result<InstanceLock, LockError> {
        let (mut file, path) = open(dir)?;
        if try_lock(&file).map_err(|source| LockError::Io {
            path: path.clone(),
            source,
        })? {
            return claim(file, path);
        }
        Err(LockError::Held {
            dir: dir.to_path_buf(),
            holder: read_pid(&mut file),
        })
    }

    /// Lock `dir`, waiting while another process holds it, until `stop`.
    pub async fn acquire_standby(
        dir: &Path,
        stop: &CancellationToken,
    ) -> Result<InstanceLock, LockError> {
        let (mut file, path) = open(dir)?;
        let mut told = false;
        loop {
            if try_lock(&file).map_err(|source| LockError::Io {
                path: path.clone(),
                source,
            })? {
                if told {
                    tracing::info!(dir = %dir.display(), "the other instance is gone; taking over");
                }
                return claim(file, path);
            }
            if !told {
                let holder = read_pid(&mut file);
                tracing::info!(dir = %dir.display(), holder, "standby: another telegate holds the data directory; waiting for it to exit");
                told = true;
            }
            tokio::select! {
                _ = stop.cancelled() => return Err(LockError::Cancelled),
                _ = tokio::time::sleep(STANDBY_POLL) => {}
            }
        }
    }
}

fn open(dir: &Path) -> Result<(File, PathBuf), LockError> {
    let path = dir.join(LOCK_FILE);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    // The data directory is telegate's alone (0700, see `private_fs`).
    crate::private_fs::private_dir(dir).map_err(io)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(crate::private_fs::FILE_MODE)
        .open(&path)
        .map_err(io)?;
    Ok((file, path))
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when someone else holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(code) if code == libc::EWOULDBLOCK => Ok(false),
        _ => Err(error),
    }
}

/// Holding the lock: write our pid for the next one to read.
fn claim(mut file: File, path: PathBuf) -> Result<InstanceLock, LockError> {
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    file.flush().map_err(io)?;
    Ok(InstanceLock { _file: file, path })
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_lock_names_the_first_and_a_standby_takes_over() {
        let dir = tempfile::tempdir().unwrap();
        let first = InstanceLock::acquire(dir.path()).unwrap();
        let err = InstanceLock::acquire(dir.path()).unwrap_err();
        assert!(
            matches!(err, LockError::Held { holder: Some(pid), .. } if pid == std::process::id()),
            "{err:?}"
        );
        assert!(err.to_string().contains("--standby"), "{err}");
        let stop = CancellationToken::new();
        let standby = {
            let dir = dir.path().to_path_buf();
            let stop = stop.clone();
            tokio::spawn(async move { InstanceLock::acquire_standby(&dir, &stop).await })
        };
        drop(first);
        let second = standby.await.unwrap().unwrap();
        assert!(second.path().ends_with(LOCK_FILE));
        let cancelled = InstanceLock::acquire_standby(dir.path(), &{
            let t = CancellationToken::new();
            t.cancel();
            t
        })
        .await;
        assert!(matches!(cancelled, Err(LockError::Cancelled)));
    }
}
