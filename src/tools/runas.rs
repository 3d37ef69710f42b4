//! `run_as`: the terminal tool's commands run as another user.
//!
//! When telegate starts as root, `[tools.terminal] run_as = "name"` makes
//! every command run as that user and its primary group, without
//! supplementary groups (std's `Command::uid` clears them when the parent
//! is root). The command then cannot read root's files (secret files, the
//! config, the database) nor telegate's `/proc` entries. See SECURITY.md.
//!
//! This module owns resolving the user. It must never switch telegate's own
//! user, and never accept `run_as` when telegate is not root (the switch
//! would fail on every command).

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The user commands run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The user name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home directory (the commands' `HOME`).
    pub home: PathBuf,
}

impl RunAs {
    /// Look up `spec` (a user name or a numeric uid) in the user database,
    /// and check that telegate can switch to it (runs as root).
    pub fn resolve(spec: &str) -> Result<RunAs, String> {
        let key = "tools.terminal.run_as";
        let user = lookup(spec).ok_or_else(|| format!("{key}: no user {spec:?} on this system"))?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(format!(
                "{key} = {spec:?} needs telegate to start as root (it switches each command to that user)"
            ));
        }
        if user.uid == 0 {
            return Err(format!(
                "{key} = {spec:?} is root: name an unprivileged user"
            ));
        }
        Ok(user)
    }
}

/// The passwd entry of `spec` (name or uid).
fn lookup(spec: &str) -> Option<RunAs> {
    let spec = spec.trim();
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: the buffers outlive the calls; getpw*_r write only into
    // `entry` and `buffer` (of the given length) and set `result`.
    let status = unsafe {
        if let Ok(uid) = spec.parse::<libc::uid_t>() {
            libc::getpwuid_r(
                uid,
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        } else {
            let name = CString::new(spec).ok()?;
            libc::getpwnam_r(
                name.as_ptr(),
                &mut entry,
                buffer.as_mut_ptr(),
                buffer.len(),
                &mut result,
            )
        }
    };
    if status != 0 || result.is_null() {
        return None;
    }
    // SAFETY: on success the strings point into `buffer`, NUL-terminated.
    let (name, home) = unsafe {
        (
            CStr::from_ptr(entry.pw_name).to_string_lossy().into_owned(),
            CStr::from_ptr(entry.pw_dir).to_string_lossy().into_owned(),
        )
    };
    Some(RunAs {
        name,
        uid: entry.pw_uid,
        gid: entry.pw_gid,
        home: PathBuf::from(home),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_found_by_name_and_uid() {
        let root = lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(lookup("0").unwrap().name, "root");
        assert!(lookup("telegate-no-such-user").is_none());
        assert!(RunAs::resolve("root").is_err());
        assert!(RunAs::resolve("telegate-no-such-user")
            .unwrap_err()
            .contains("no user"));
    }
}
