//! Retention of saved files: everything under `<data_dir>/media` older than
//! `[media] keep_days` (by modification time) is removed, and directories
//! left empty with it. Runs at start and then hourly.
//!
//! It must never follow a symlink out of the media directory (entries are
//! examined with `symlink_metadata`, links are removed as links) and never
//! touch anything outside it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// Remove files under `root` last modified before `now - keep`. Returns how
/// many files were removed.
pub fn sweep(root: &Path, keep: Duration, now: SystemTime) -> usize {
    let Some(cutoff) = now.checked_sub(keep) else {
        return 0;
    };
    sweep_dir(root, cutoff, true)
}

fn sweep_dir(dir: &Path, cutoff: SystemTime, is_root: bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    let old_dir = std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .is_ok_and(|m| m < cutoff);
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            removed += sweep_dir(&path, cutoff, false);
        } else if meta.modified().is_ok_and(|m| m < cutoff) && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    // A directory is removed once empty, if this sweep emptied it or it is
    // old itself (a fresh empty one, such as a running turn's outbox, stays).
    if !is_root && (removed > 0 || old_dir) {
        // Fails (and is left) unless empty.
        let _ = std::fs::remove_dir(dir);
    }
    removed
}

/// Sweep `root` now and every hour until `stop` fires (`keep_days` 0:
/// never).
pub fn spawn_retention(root: std::path::PathBuf, keep_days: u64, stop: CancellationToken) {
    if keep_days == 0 {
        return;
    }
    let keep = Duration::from_secs(keep_days.saturating_mul(24 * 3600));
    tokio::spawn(async move {
        loop {
            let dir = root.clone();
            let removed = tokio::task::spawn_blocking(move || sweep(&dir, keep, SystemTime::now()))
                .await
                .unwrap_or(0);
            if removed > 0 {
                tracing::info!(removed, "removed media files past media.keep_days");
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_files_and_emptied_directories_go_and_new_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("media");
        std::fs::create_dir_all(root.join("s1")).unwrap();
        std::fs::create_dir_all(root.join("s2")).unwrap();
        std::fs::write(root.join("s1/old.jpg"), b"x").unwrap();
        std::fs::write(root.join("s2/new.jpg"), b"x").unwrap();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("s2/link")).unwrap();
        // "Now" is two days ahead: with keep = 1 day every file is old...
        let later = SystemTime::now() + Duration::from_secs(2 * 86_400);
        // ...but with keep = 3 days none is.
        assert_eq!(sweep(&root, Duration::from_secs(3 * 86_400), later), 0);
        assert_eq!(sweep(&root, Duration::from_secs(86_400), later), 3);
        assert!(!root.join("s1").exists());
        assert!(outside.exists(), "a symlink's target is never touched");
        assert!(root.exists());
    }
}
