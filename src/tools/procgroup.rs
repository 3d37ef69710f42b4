//! Process groups: how telegate stops a program *and everything it started*.
//!
//! Programs telegate runs (the command backend's CLI per turn, the terminal
//! tool's shell commands) start children of their own: `sh -c "a | b"`,
//! build tools, servers. Killing only the process we spawned would orphan
//! those, and an orphan that keeps our output pipe open would also keep us
//! from ever seeing end-of-file. So every program is spawned as the leader of
//! a new process group (`Command::process_group(0)`), and every stop signal
//! goes to the whole group (`killpg`): SIGTERM first, SIGKILL after a grace
//! period.
//!
//! [`ProcessGroup`] is the *owning* handle: while armed, dropping it
//! SIGKILLs the group. That is what cleans up when a turn's future is dropped
//! at an await point (/stop, an interrupting message, the watchdog): code
//! after the `.await` never runs then, a `Drop` always does. [`GroupId`] is
//! the plain, copyable id used to signal a group someone else owns (a
//! background process that a user asks to /kill).
//!
//! This module must never signal a group it was not given, and never
//! signal group 0 or 1 (ourselves, or init): [`GroupId::of_leader`] refuses
//! those ids.

use std::io;
use std::time::Duration;

use tokio::process::Child;
use tokio::time::Instant;

/// How often a dying process group is checked.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long to wait for processes after SIGKILL (the kernel needs a moment).
const AFTER_KILL_WAIT: Duration = Duration::from_secs(1);

/// The id of a process group telegate created (the pid of its leader).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupId(libc::pid_t);

impl GroupId {
    /// The group led by `pid` (spawned with `process_group(0)`, so its group
    /// id is its pid). `None` for ids that cannot name a group we created:
    /// 0 and 1 would signal ourselves or init.
    pub fn of_leader(pid: u32) -> Option<GroupId> {
        libc::pid_t::try_from(pid)
            .ok()
            .filter(|&p| p > 1)
            .map(GroupId)
    }

    /// The numeric group id.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// Send `signal` to every process in the group.
    pub fn signal(self, signal: libc::c_int) -> io::Result<()> {
        // SAFETY: killpg takes two integers and touches no memory of ours.
        // The id is > 1 (checked in `of_leader`), so this never signals our
        // own group or init.
        let result = unsafe { libc::killpg(self.0, signal) };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// [`GroupId::signal`], logging failures other than "nobody left".
    pub fn send(self, signal: libc::c_int) {
        if let Err(error) = self.signal(signal) {
            if error.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(pgid = self.0, signal, %error, "signalling a process group failed");
            }
        }
    }

    /// Whether any process of the group can still run. Zombies do not count:
    /// where PID 1 never reaps orphans (some containers), a dead grandchild
    /// stays a zombie in the group forever.
    pub fn alive(self) -> bool {
        match self.signal(0) {
            Err(error) if error.raw_os_error() == Some(libc::ESRCH) => false,
            _ => has_running_member(self.0),
        }
    }

    /// Wait until the group is gone; `false` if it is still there at
    /// `deadline`.
    pub async fn gone_by(self, deadline: Instant) -> bool {
        loop {
            if !self.alive() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
    }

    /// Stop every process of the group: SIGTERM, then SIGKILL after `grace`
    /// if anything still runs. Returns whether the group is gone. Works
    /// whether or not the leader has been reaped (a zombie leader does not
    /// count as running).
    pub async fn terminate(self, grace: Duration) -> bool {
        if !self.alive() {
            return true;
        }
        self.send(libc::SIGTERM);
        if self.gone_by(Instant::now() + grace).await {
            return true;
        }
        self.send(libc::SIGKILL);
        self.gone_by(Instant::now() + AFTER_KILL_WAIT).await
    }
}

/// The owning handle of a spawned program's process group. While armed,
/// dropping it SIGKILLs the whole group.
#[derive(Debug)]
pub struct ProcessGroup {
    id: GroupId,
    armed: bool,
}

impl ProcessGroup {
    /// Own the group led by `pid` (see [`GroupId::of_leader`]).
    pub fn of_leader(pid: u32) -> Option<ProcessGroup> {
        GroupId::of_leader(pid).map(|id| ProcessGroup { id, armed: true })
    }

    /// The group's id.
    pub fn id(&self) -> GroupId {
        self.id
    }

    /// Send `signal` to the group, logging failures other than "nobody
    /// left".
    pub fn send(&self, signal: libc::c_int) {
        self.id.send(signal);
    }

    /// Stop a running program: SIGTERM to the group, SIGKILL after `grace`
    /// if anything is still there, then reap the leader.
    pub async fn stop(&self, leader: &mut Child, grace: Duration) {
        let deadline = Instant::now() + grace;
        self.send(libc::SIGTERM);
        let leader_exited = tokio::time::timeout_at(deadline, leader.wait())
            .await
            .is_ok();
        // Checking the group only after the leader is reaped is safe: its
        // id stays reserved while any member lives.
        if leader_exited && self.id.gone_by(deadline).await {
            return;
        }
        self.send(libc::SIGKILL);
        if tokio::time::timeout(AFTER_KILL_WAIT, leader.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pgid = self.id.0,
                "a process survived SIGKILL; left to the reaper"
            );
        }
        self.id.gone_by(Instant::now() + AFTER_KILL_WAIT).await;
    }

    /// After the leader exited (and was reaped): stop anything it left in
    /// the group, SIGTERM first, SIGKILL after `grace`.
    pub async fn terminate_leftovers(&self, grace: Duration) {
        if !self.id.alive() {
            return;
        }
        tracing::debug!(
            pgid = self.id.0,
            "the program left processes running; stopping them"
        );
        self.id.terminate(grace).await;
    }

    /// The owner cleaned up after the group itself: dropping no longer
    /// kills it.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(
                pgid = self.id.0,
                "owner dropped mid-run; killing the process group"
            );
            self.send(libc::SIGKILL);
        }
    }
}

/// Whether some process in group `pgid` is not a zombie, per `/proc`. If
/// `/proc` cannot be read, assume yes.
pub fn has_running_member(pgid: libc::pid_t) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .is_some_and(|(state, group)| group == pgid && !matches!(state, 'Z' | 'X' | 'x'))
    })
}

/// `(state, process group)` from a `/proc/<pid>/stat` line. The command
/// name may contain spaces and parentheses, so parsing starts after the last
/// `)`.
fn parse_stat(stat: &str) -> Option<(char, libc::pid_t)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// A signal number with its name where it is a common one: `15 (SIGTERM)`.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return signal.to_string(),
    };
    format!("{signal} ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_odd_names() {
        let stat = "1234 (we(ird) name) S 1 777 777 0 -1";
        assert_eq!(parse_stat(stat), Some(('S', 777)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn groups_never_target_ourselves_or_init() {
        assert!(ProcessGroup::of_leader(0).is_none());
        assert!(ProcessGroup::of_leader(1).is_none());
        assert!(ProcessGroup::of_leader(u32::MAX).is_none());
        assert_eq!(GroupId::of_leader(4242).map(GroupId::raw), Some(4242));
    }

    #[test]
    fn signal_names_read_well() {
        assert_eq!(signal_name(libc::SIGTERM), "15 (SIGTERM)");
        assert_eq!(signal_name(64), "64");
    }
}
