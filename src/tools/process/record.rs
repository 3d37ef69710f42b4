//! Who a process is and what is known of it: `ProcessId`, its owner
//! (captured from the turn identity, never from global state), its mode,
//! state, exit and output statistics, and the `ProcessRecord` snapshot.

use crate::tools::procgroup::signal_name;
use crate::vocab::current_identity;
use crate::vocab::SessionId;
use crate::vocab::SessionKey;
use crate::vocab::SessionSource;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;
use std::time::SystemTime;

/// A process's short id, e.g. `p1a2b`. Unique among the records a registry
/// holds.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(Arc<str>);

impl ProcessId {
    /// Wrap an id (as the user or the model typed it).
    pub fn new(id: impl AsRef<str>) -> ProcessId {
        ProcessId(Arc::from(id.as_ref().trim()))
    }

    /// A random id of `p` followed by `hex_digits` hex digits.
    pub(super) fn random(hex_digits: usize) -> ProcessId {
        use std::hash::{BuildHasher, Hasher};
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let hex = format!("{:016x}", hasher.finish());
        ProcessId::new(format!("p{}", &hex[..hex_digits.min(16)]))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProcessId({})", &self.0)
    }
}

/// Who started a process, and where to report about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessOwner {
    /// The chat slot that started it.
    pub session_key: SessionKey,
    /// The chat to notify.
    pub source: SessionSource,
    /// The session of the turn that spawned it: the one its wakeup belongs
    /// to. `None` (or empty) means unknown.
    pub spawn_session_id: Option<SessionId>,
}

impl ProcessOwner {
    /// The owner of a process spawned *now*, from the task-local turn
    /// identity: this is the one capture path the terminal tool uses.
    /// `None` outside a turn; the caller decides explicitly what to do then.
    pub fn capture() -> Option<ProcessOwner> {
        current_identity().map(|turn| ProcessOwner {
            session_key: turn.session_key,
            source: turn.source,
            spawn_session_id: Some(turn.session_id),
        })
    }

    /// The spawn-time owner session, if it is known (not `None`, not empty).
    pub fn known_spawn_session(&self) -> Option<&SessionId> {
        self.spawn_session_id
            .as_ref()
            .filter(|id| !id.as_str().trim().is_empty())
    }
}

/// Which processes a caller may see: those of one chat, or (outside any
/// turn) only those without an owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The processes started from this chat slot.
    Chat(&'a SessionKey),
    /// Processes without an owner (started outside any turn).
    Unowned,
}

impl Scope<'_> {
    pub(super) fn admits(&self, owner: Option<&ProcessOwner>) -> bool {
        match (self, owner) {
            (Scope::Chat(key), Some(owner)) => owner.session_key == **key,
            (Scope::Unowned, None) => true,
            _ => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

/// How a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessMode {
    /// A tool call waits for it (and kills it on timeout or cancellation).
    Foreground,
    /// It runs on after the tool call returned.
    Background {
        /// Wake the owner's chat when it ends.
        notify_on_complete: bool,
    },
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, if it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Ended because someone asked (`/kill`, `process kill`, a timeout or a
    /// cancelled turn).
    pub killed_on_request: bool,
    /// How long it ran.
    pub runtime: Duration,
}

impl ExitInfo {
    pub(super) fn from_status(
        status: &io::Result<ExitStatus>,
        killed: bool,
        runtime: Duration,
    ) -> ExitInfo {
        let (code, signal) = match status {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        ExitInfo {
            code,
            signal,
            killed_on_request: killed,
            runtime,
        }
    }

    /// True for exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// "exit code 0", "killed by signal 15 (SIGTERM)", "killed on request".
    pub fn describe(&self) -> String {
        let how = match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("killed by signal {}", signal_name(signal)),
            (None, None) => "ended (status unknown)".to_string(),
        };
        if self.killed_on_request {
            format!("{how}, killed on request")
        } else {
            how
        }
    }
}

/// Whether a process still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    /// Running.
    Running,
    /// Ended.
    Exited(ExitInfo),
}

/// How much output a process produced and how much is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputStats {
    /// Bytes held in the ring (at most `cap`).
    pub held: usize,
    /// The ring's limit.
    pub cap: usize,
    /// Bytes the ring has allocated (does not grow past its first fill).
    pub allocated: usize,
    /// Every byte ever produced.
    pub total: u64,
}

/// A snapshot of one process.
#[derive(Clone, Debug)]
pub struct ProcessRecord {
    /// Its id.
    pub id: ProcessId,
    /// The shell command.
    pub command: String,
    /// Who started it (`None`: started outside any turn).
    pub owner: Option<ProcessOwner>,
    /// Foreground or background.
    pub mode: ProcessMode,
    /// Its process group id.
    pub pgid: Option<i32>,
    /// When it started (wall clock).
    pub started_at: SystemTime,
    /// How long it has run (or ran).
    pub runtime: Duration,
    /// Running or ended.
    pub state: ProcessState,
    /// Its output so far.
    pub output: OutputStats,
}

impl ProcessRecord {
    /// A record of a process that is not (or no longer) in any registry:
    /// for routing decisions about a known id and owner, and for tests.
    pub fn detached(
        id: ProcessId,
        command: impl Into<String>,
        owner: Option<ProcessOwner>,
    ) -> ProcessRecord {
        ProcessRecord {
            id,
            command: command.into(),
            owner,
            mode: ProcessMode::Background {
                notify_on_complete: true,
            },
            pgid: None,
            started_at: SystemTime::now(),
            runtime: Duration::ZERO,
            state: ProcessState::Running,
            output: OutputStats {
                held: 0,
                cap: 0,
                allocated: 0,
                total: 0,
            },
        }
    }

    /// The spawn-time owner session, if known.
    pub fn spawn_session_id(&self) -> Option<&SessionId> {
        self.owner
            .as_ref()
            .and_then(ProcessOwner::known_spawn_session)
    }

    /// True while it runs.
    pub fn is_running(&self) -> bool {
        self.state == ProcessState::Running
    }

    /// "running", "exit code 0", "killed by signal 9 (SIGKILL), killed on request".
    pub fn state_text(&self) -> String {
        match &self.state {
            ProcessState::Running => "running".to_string(),
            ProcessState::Exited(exit) => exit.describe(),
        }
    }
}
