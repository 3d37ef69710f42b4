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
//! **Children die with telegate.** [`spawn_leader`] is the one way a
//! program is started: in its own group, with `PR_SET_PDEATHSIG(SIGKILL)`
//! set between fork and exec, so the leader is killed by the kernel when
//! telegate dies, even by `kill -9`. The kernel sends that signal when the
//! *thread* that forked the child exits, not the process; tokio may run a
//! turn on a thread that later ends (the blocking pool), so every fork
//! happens on one thread that lives as long as the process. A leader whose
//! parent died between the fork and the `prctl` would never get the
//! signal: the child checks `getppid()` and refuses to run then. Only the
//! leader gets the signal; what it started in its group is killed at the
//! next start (`tools::childgroups`). The signal is cleared by exec of a
//! set-user-ID program and lost by a process that leaves the group
//! (`setsid`); those can outlive telegate.
//!
//! This module must never signal a group it was not given, and never
//! signal group 0 or 1 (ourselves, or init): [`GroupId::of_leader`] refuses
//! those ids.

use std::io;
use std::time::Duration;

use tokio::process::{Child, Command};
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

/// Start `command` as the leader of a new process group that the kernel
/// kills when telegate dies (see the module docs). Use it for every
/// program telegate runs.
pub fn spawn_leader(mut command: Command) -> io::Result<Child> {
    command.process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec; it calls
    // only async-signal-safe functions (prctl, getppid) and allocates
    // nothing, not even for its error.
    unsafe {
        command.pre_exec(move || die_with_parent(parent));
    }
    spawner::spawn(command)
}

/// In the child: be killed when the parent dies, and refuse to run if it
/// already has.
fn die_with_parent(parent: u32) -> io::Result<()> {
    let signal = libc::SIGKILL as libc::c_ulong;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid has no preconditions.
    let now = unsafe { libc::getppid() };
    if u32::try_from(now).ok() != Some(parent) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// The one thread every child is forked from: it lives as long as the
/// process, so the parent-death signal fires only when telegate dies.
mod spawner {
    use std::io;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::mpsc;
    use std::sync::OnceLock;

    use tokio::process::{Child, Command};
    use tokio::runtime::Handle;

    struct Job {
        command: Command,
        /// The caller's runtime: the child is reaped by it.
        runtime: Option<Handle>,
        reply: mpsc::SyncSender<io::Result<Child>>,
    }

    /// Never dropped, so the thread never ends.
    static JOBS: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

    fn jobs() -> Option<&'static mpsc::Sender<Job>> {
        JOBS.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let started = std::thread::Builder::new()
                .name("telegate-spawner".into())
                .spawn(move || {
                    for job in rx {
                        run(job);
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(error) => {
                    tracing::error!(%error, "cannot start the thread that starts programs");
                    None
                }
            }
        })
        .as_ref()
    }

    fn run(job: Job) {
        let Job {
            mut command,
            runtime,
            reply,
        } = job;
        // A panic must not end this thread: its children would die with it.
        let result = catch_unwind(AssertUnwindSafe(|| {
            let _entered = runtime.as_ref().map(Handle::enter);
            command.spawn()
        }))
        .unwrap_or_else(|_| Err(io::Error::other("starting the program panicked")));
        let _ = reply.send(result);
    }

    /// Fork `command` on the spawner thread and wait for the result.
    pub(super) fn spawn(command: Command) -> io::Result<Child> {
        let gone = || io::Error::other("the thread that starts programs is not running");
        let jobs = jobs().ok_or_else(gone)?;
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            command,
            runtime: Handle::try_current().ok(),
            reply,
        };
        jobs.send(job).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Its pid.
    pub pid: libc::pid_t,
    /// `R`, `S`, `Z`…
    pub state: char,
    /// Its process group.
    pub pgrp: libc::pid_t,
    /// Its session.
    pub session: libc::pid_t,
    /// When it started, in clock ticks since boot.
    pub start: u64,
}

impl ProcStat {
    /// Dead, only not reaped yet.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// The process `pid`, if it exists (a zombie too).
pub fn proc_stat(pid: libc::pid_t) -> Option<ProcStat> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| parse_stat(&stat))
}

/// Every process `/proc` shows (empty if it cannot be read).
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse().ok()?;
            proc_stat(pid)
        })
        .collect()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): start times count
/// from the boot.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
}

/// Whether some process in group `pgid` is not a zombie, per `/proc`. If
/// `/proc` cannot be read, assume yes.
pub fn has_running_member(pgid: libc::pid_t) -> bool {
    if std::fs::read_dir("/proc").is_err() {
        return true;
    }
    all_processes()
        .iter()
        .any(|p| p.pgrp == pgid && !p.is_zombie())
}

/// A `/proc/<pid>/stat` line. The command name may contain spaces and
/// parentheses, so the fields are counted from after the last `)`.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 3 (state), 5 (pgrp), 6 (session) and 22 (starttime) of proc(5).
    Some(ProcStat {
        pid,
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
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
        let stat =
            "1234 (we(ird) name) S 1 777 778 0 -1 4194560 130 0 0 0 0 0 0 0 20 0 1 0 987654 1 2";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                pid: 1234,
                state: 'S',
                pgrp: 777,
                session: 778,
                start: 987654
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (short) S 1 777 777 0"), None);
    }

    #[test]
    fn our_own_stat_is_read() {
        let me = proc_stat(std::process::id() as libc::pid_t).expect("our /proc entry");
        // SAFETY: getpgrp and getsid have no preconditions.
        let (pgrp, sid) = unsafe { (libc::getpgrp(), libc::getsid(0)) };
        assert_eq!((me.pgrp, me.session), (pgrp, sid));
        assert!(me.start > 0 && !me.is_zombie());
        assert!(boot_id().is_some());
    }

    /// A child that prints its own parent-death signal (PR_GET_PDEATHSIG).
    fn pdeathsig_probe() -> Command {
        let mut command = Command::new("python3");
        command
            .arg("-c")
            .arg(
                "import ctypes; s = ctypes.c_int(); \
                 ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); print(s.value)",
            )
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        command
    }

    #[tokio::test]
    async fn a_spawned_leader_leads_its_own_group_and_dies_with_telegate() {
        let child = spawn_leader(pdeathsig_probe()).unwrap();
        let pid = child.id().unwrap() as libc::pid_t;
        let stat = proc_stat(pid).unwrap();
        assert_eq!(stat.pgrp, pid, "leader of its own group");
        let output = child.wait_with_output().await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            libc::SIGKILL.to_string()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_child_outlives_the_thread_that_asked_for_it() {
        // The parent-death signal follows the forking thread: a program
        // started from a thread that ends must not die with that thread.
        let runtime = tokio::runtime::Handle::current();
        let mut child = std::thread::spawn(move || {
            let _entered = runtime.enter();
            let mut command = Command::new("sleep");
            command.arg("30").kill_on_drop(true);
            spawn_leader(command).unwrap()
        })
        .join()
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child died with the thread that asked for it"
        );
        child.kill().await.unwrap();
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
