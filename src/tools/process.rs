//! The process registry: every program the terminal tool runs, foreground
//! or background, with its owner, its bounded output and its fate.
//!
//! Why it exists: a background process outlives the turn that started it,
//! so something has to keep its output, let the agent (or the user, with
//! `/ps` and `/kill`) look at it and stop it, and wake the chat that started
//! it when it ends. The chat to wake is the process's **owner**, captured
//! from the task-local turn identity at spawn time ([`ProcessOwner::capture`])
//! and never from process-global state: two chats spawning at the same
//! moment each record their own session (the Python system this design
//! learns from read a process-global variable there and woke the wrong
//! chat).
//!
//! What it guarantees:
//! * **Whole groups.** Each program is `sh -c <command>` in its own process
//!   group, in the configured working directory, with secrets (bot token,
//!   API keys) removed from its environment. Stopping it stops its group;
//!   what the leader leaves running when it exits is stopped too.
//! * **Bounded memory.** Output (stdout and stderr, interleaved as it
//!   arrives) goes into an [`OutputRing`] of `output_cap_bytes`: the oldest
//!   bytes fall out, so a process printing forever never grows memory. At
//!   most `max_background_per_chat` background processes run per chat and
//!   `max_background_total` overall; finished records are kept for a while
//!   (`keep_finished`) and then forgotten.
//! * **Wakeups exactly once.** A background process with
//!   `notify_on_complete` produces one [`Wakeup`] when it ends, unless the
//!   agent already saw the exit through `process wait` or the process was
//!   killed on request (then whoever asked already knows). A waiter that is
//!   cancelled before it could report the exit hands the wakeup back, so it
//!   is never lost.
//!
//! This module must never read the owner from anything but the turn
//! identity, never signal a group whose process it does not hold as running,
//! and never hold its locks across an `.await`.

use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::events::{ToolEvent, ToolEventSender};
use super::procgroup::{signal_name, GroupId, ProcessGroup};
use super::wakeup::Wakeup;
use crate::agent::command::{CHAT_ID_ENV, SESSION_ID_ENV};
use crate::agent::Progress;
use crate::event::{SessionKey, SessionSource};
use crate::identity::{current_identity, SessionId};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 16 * 1024;
/// How long to keep reading pipes after the whole group is gone. Only a
/// process that left the group (`setsid`) can hold them open longer.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);
/// How often a waiting tool tells the stall watchdog it is still alive.
const ALIVE_PING: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// Identity of a process and of its owner
// ---------------------------------------------------------------------------

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
    fn random(hex_digits: usize) -> ProcessId {
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
    fn admits(&self, owner: Option<&ProcessOwner>) -> bool {
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
    fn from_status(status: &io::Result<ExitStatus>, killed: bool, runtime: Duration) -> ExitInfo {
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

// ---------------------------------------------------------------------------
// The output ring
// ---------------------------------------------------------------------------

/// The last `cap` bytes of a process's output. Older bytes fall out; memory
/// never exceeds the cap.
#[derive(Debug)]
pub struct OutputRing {
    buf: VecDeque<u8>,
    cap: usize,
    total: u64,
    /// `total` at the last [`OutputRing::take_new`].
    read_mark: u64,
}

impl OutputRing {
    /// An empty ring holding at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> OutputRing {
        OutputRing {
            buf: VecDeque::new(),
            cap: cap.max(1),
            total: 0,
            read_mark: 0,
        }
    }

    /// Append `bytes`, dropping the oldest bytes beyond the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        if self.buf.capacity() < self.cap && !bytes.is_empty() {
            // One allocation of exactly the cap: the ring never holds more,
            // so it never grows again.
            self.buf.reserve_exact(self.cap - self.buf.len());
        }
        self.buf.extend(bytes);
    }

    /// Sizes: held, cap, allocated, total.
    pub fn stats(&self) -> OutputStats {
        OutputStats {
            held: self.buf.len(),
            cap: self.cap,
            allocated: self.buf.capacity(),
            total: self.total,
        }
    }

    /// Everything held, as text (a character cut by the ring is dropped;
    /// invalid UTF-8 becomes U+FFFD).
    pub fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        lossy_from_char_start(&bytes)
    }

    /// The output produced since the last call, as text, and how many of
    /// those bytes already fell out of the ring.
    pub fn take_new(&mut self) -> (String, u64) {
        let oldest_held = self.total - self.buf.len() as u64;
        let dropped = oldest_held.saturating_sub(self.read_mark);
        let start = self.read_mark.max(oldest_held) - oldest_held;
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        let bytes: Vec<u8> = self.buf.iter().skip(start).copied().collect();
        self.read_mark = self.total;
        (lossy_from_char_start(&bytes), dropped)
    }
}

/// Bytes as text, skipping UTF-8 continuation bytes at the start (the ring
/// may have cut a character in half there).
fn lossy_from_char_start(bytes: &[u8]) -> String {
    let start = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

// ---------------------------------------------------------------------------
// Configuration and errors
// ---------------------------------------------------------------------------

/// How the registry runs processes and what it allows.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// The working directory of every process (`None`: the bot's own).
    pub workdir: Option<PathBuf>,
    /// Environment variables removed for every process (secrets).
    pub stripped_env: BTreeSet<String>,
    /// The rest of the environment: what passes besides the default
    /// allowlist, and what is set (see [`super::childenv`]).
    pub child_env: super::childenv::ChildEnv,
    /// Run every process as this user (telegate is root).
    pub run_as: Option<super::runas::RunAs>,
    /// Output bytes kept per process.
    pub output_cap_bytes: usize,
    /// Background processes that may run per chat.
    pub max_background_per_chat: usize,
    /// Background processes that may run overall.
    pub max_background_total: usize,
    /// Finished background records kept for `/ps` and `process poll`.
    pub keep_finished: usize,
    /// Between SIGTERM and SIGKILL when a process must stop.
    pub kill_grace: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            workdir: None,
            stripped_env: crate::agent::command::ALWAYS_STRIPPED_ENV
                .iter()
                .map(|name| name.to_string())
                .collect(),
            child_env: super::childenv::ChildEnv::default(),
            run_as: None,
            output_cap_bytes: 64 * 1024,
            max_background_per_chat: 4,
            max_background_total: 16,
            keep_finished: 32,
            kill_grace: Duration::from_secs(2),
        }
    }
}

/// Why a process was not started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The per-chat limit is reached.
    #[error(
        "{limit} background processes already run in this chat (the limit, \
         tools.terminal.max_background); wait for one to finish or kill one first"
    )]
    ChatLimit {
        /// The limit.
        limit: usize,
    },
    /// The overall limit is reached.
    #[error(
        "{limit} background processes already run in total (the limit, \
         tools.terminal.max_background_total); wait for one to finish or kill one first"
    )]
    TotalLimit {
        /// The limit.
        limit: usize,
    },
    /// A wakeup was asked for but there is no chat to wake.
    #[error(
        "notify_on_complete needs a chat to report to, and this call runs outside any chat turn"
    )]
    NoOwnerToNotify,
    /// The command contains a NUL byte.
    #[error("the command contains a NUL character")]
    NulByte,
    /// The working directory is missing.
    #[error("the working directory {0} does not exist (tools.terminal.workdir)")]
    NoWorkdir(String),
    /// The shell could not be started.
    #[error("could not start the shell: {0}")]
    Spawn(String),
}

/// What to start.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    /// The shell command (run with `sh -c`).
    pub command: String,
    /// Who starts it (see [`ProcessOwner::capture`]).
    pub owner: Option<ProcessOwner>,
    /// Foreground or background.
    pub mode: ProcessMode,
}

/// How a wait for a process ended.
#[derive(Clone, Debug)]
pub enum WaitOutcome {
    /// It ended; the record says how.
    Exited(ProcessRecord),
    /// It still runs after the wait's limit.
    StillRunning(ProcessRecord),
    /// The turn was cancelled while waiting.
    Cancelled,
}

// ---------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------

/// Whether the owner still has to be told that a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WakeupState {
    /// No wakeup was asked for.
    NotWanted,
    /// A wakeup is due when the process ends (unless someone sees the exit).
    Pending,
    /// The agent saw the exit (or asked for the kill): no wakeup.
    Consumed,
    /// The wakeup went out.
    Sent,
}

#[derive(Debug)]
struct EntryState {
    exit: Option<ExitInfo>,
    wakeup: WakeupState,
    /// `process wait` calls currently waiting for this process.
    waiters: usize,
    kill_requested: bool,
}

/// One process in the registry. The watcher task and the registry share it.
#[derive(Debug)]
struct Entry {
    id: ProcessId,
    command: String,
    owner: Option<ProcessOwner>,
    mode: ProcessMode,
    group: GroupId,
    started: Instant,
    started_at: SystemTime,
    state: Mutex<EntryState>,
    output: Mutex<OutputRing>,
    exited: watch::Sender<bool>,
}

impl Entry {
    fn state(&self) -> MutexGuard<'_, EntryState> {
        // Every update is a few field writes: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn output(&self) -> MutexGuard<'_, OutputRing> {
        self.output.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_running(&self) -> bool {
        self.state().exit.is_none()
    }

    fn is_background(&self) -> bool {
        matches!(self.mode, ProcessMode::Background { .. })
    }

    fn record(&self) -> ProcessRecord {
        let exit = self.state().exit;
        ProcessRecord {
            id: self.id.clone(),
            command: self.command.clone(),
            owner: self.owner.clone(),
            mode: self.mode,
            pgid: Some(self.group.raw()),
            started_at: self.started_at,
            runtime: exit.map_or_else(|| self.started.elapsed(), |e| e.runtime),
            state: exit.map_or(ProcessState::Running, ProcessState::Exited),
            output: self.output().stats(),
        }
    }

    /// The wakeup for this (ended) process.
    fn wakeup(&self) -> Option<Wakeup> {
        let record = self.record();
        let ProcessState::Exited(exit) = record.state else {
            return None;
        };
        let output = self.output().text();
        Some(Wakeup::new(record, exit, &output))
    }

    /// The process ended: record it and decide about the wakeup. Returns the
    /// wakeup to send, if one is due now.
    fn finish(&self, status: io::Result<ExitStatus>) -> Option<Wakeup> {
        let send = {
            let mut state = self.state();
            let exit = ExitInfo::from_status(&status, state.kill_requested, self.started.elapsed());
            state.exit = Some(exit);
            if state.wakeup == WakeupState::Pending {
                if state.kill_requested {
                    state.wakeup = WakeupState::Consumed;
                } else if state.waiters == 0 {
                    state.wakeup = WakeupState::Sent;
                }
            }
            state.wakeup == WakeupState::Sent
        };
        self.exited.send_replace(true);
        if send {
            self.wakeup()
        } else {
            None
        }
    }
}

struct RegistryInner {
    config: RegistryConfig,
    entries: Mutex<Vec<Arc<Entry>>>,
    events: ToolEventSender,
}

impl Drop for RegistryInner {
    fn drop(&mut self) {
        // Nobody can reach these processes any more: stop them.
        let entries = self
            .entries
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for entry in entries.iter().filter(|e| e.is_running()) {
            entry.state().kill_requested = true;
            entry.group.send(libc::SIGKILL);
        }
    }
}

/// The shared registry of processes. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct ProcessRegistry {
    inner: Arc<RegistryInner>,
}

impl fmt::Debug for ProcessRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessRegistry")
            .field("config", &self.inner.config)
            .field("processes", &self.entries().len())
            .finish()
    }
}

impl ProcessRegistry {
    /// A registry running processes as `config` says and sending wakeups to
    /// `events`.
    pub fn new(config: RegistryConfig, events: ToolEventSender) -> ProcessRegistry {
        ProcessRegistry {
            inner: Arc::new(RegistryInner {
                config,
                entries: Mutex::new(Vec::new()),
                events,
            }),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &RegistryConfig {
        &self.inner.config
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Arc<Entry>>> {
        // Inserts and removes only: a poisoned lock is consistent.
        self.inner
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Start a background process. Refused beyond the limits, and when a
    /// wakeup is asked for without an owner to wake.
    pub fn spawn_background(&self, spec: SpawnSpec) -> Result<ProcessRecord, SpawnError> {
        let entry = self.spawn(spec)?;
        Ok(entry.record())
    }

    /// Start a foreground process. The returned [`ForegroundRun`] kills
    /// its group when dropped before the process ended.
    pub fn spawn_foreground(
        &self,
        command: String,
        owner: Option<ProcessOwner>,
    ) -> Result<ForegroundRun, SpawnError> {
        let entry = self.spawn(SpawnSpec {
            command,
            owner,
            mode: ProcessMode::Foreground,
        })?;
        Ok(ForegroundRun {
            registry: self.clone(),
            entry,
        })
    }

    fn spawn(&self, spec: SpawnSpec) -> Result<Arc<Entry>, SpawnError> {
        let notify = matches!(
            spec.mode,
            ProcessMode::Background {
                notify_on_complete: true
            }
        );
        if notify && spec.owner.is_none() {
            return Err(SpawnError::NoOwnerToNotify);
        }
        if spec.command.contains('\0') {
            return Err(SpawnError::NulByte);
        }
        if let Some(dir) = &self.inner.config.workdir {
            if !dir.is_dir() {
                return Err(SpawnError::NoWorkdir(dir.display().to_string()));
            }
        }
        // The limit check and the insert happen under one lock, so two
        // concurrent spawns cannot both take the last place. Spawning is a
        // synchronous fork/exec, no await.
        let mut entries = self.entries();
        if matches!(spec.mode, ProcessMode::Background { .. }) {
            self.check_limits(&entries, spec.owner.as_ref())?;
        }
        let mut child = self
            .command(&spec)
            .spawn()
            .map_err(|e| SpawnError::Spawn(e.to_string()))?;
        let Some(group) = child.id().and_then(ProcessGroup::of_leader) else {
            return Err(SpawnError::Spawn("the shell has no process id".to_string()));
        };
        let id = unique_id(&entries);
        let (exited, _) = watch::channel(false);
        let entry = Arc::new(Entry {
            id,
            command: spec.command,
            owner: spec.owner,
            mode: spec.mode,
            group: group.id(),
            started: Instant::now(),
            started_at: SystemTime::now(),
            state: Mutex::new(EntryState {
                exit: None,
                wakeup: if notify {
                    WakeupState::Pending
                } else {
                    WakeupState::NotWanted
                },
                waiters: 0,
                kill_requested: false,
            }),
            output: Mutex::new(OutputRing::new(self.inner.config.output_cap_bytes)),
            exited,
        });
        entries.push(entry.clone());
        forget_old_finished(&mut entries, self.inner.config.keep_finished);
        drop(entries);
        tracing::info!(
            process = %entry.id,
            pgid = entry.group.raw(),
            mode = ?entry.mode,
            owner = ?entry.owner.as_ref().map(|o| o.session_key.as_str()),
            "process started"
        );
        if let (true, Some(owner)) = (entry.is_background(), &entry.owner) {
            self.inner.events.send(ToolEvent::BackgroundStarted {
                id: entry.id.to_string(),
                owner: owner.source.clone(),
                command: entry.command.clone(),
            });
        }
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        tokio::spawn(supervise(
            entry.clone(),
            child,
            group,
            stdout,
            stderr,
            self.inner.events.clone(),
            self.inner.config.kill_grace,
        ));
        Ok(entry)
    }

    fn check_limits(
        &self,
        entries: &[Arc<Entry>],
        owner: Option<&ProcessOwner>,
    ) -> Result<(), SpawnError> {
        let running: Vec<&Arc<Entry>> = entries
            .iter()
            .filter(|e| e.is_background() && e.is_running())
            .collect();
        if running.len() >= self.inner.config.max_background_total {
            return Err(SpawnError::TotalLimit {
                limit: self.inner.config.max_background_total,
            });
        }
        let scope = owner.map_or(Scope::Unowned, |o| Scope::Chat(&o.session_key));
        let in_chat = running
            .iter()
            .filter(|e| scope.admits(e.owner.as_ref()))
            .count();
        if in_chat >= self.inner.config.max_background_per_chat {
            return Err(SpawnError::ChatLimit {
                limit: self.inner.config.max_background_per_chat,
            });
        }
        Ok(())
    }

    /// `sh -c <command>`: own group, configured directory, minimal
    /// environment without secrets.
    fn command(&self, spec: &SpawnSpec) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&spec.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.inner.config.workdir {
            command.current_dir(dir);
        }
        let mut env = self.inner.config.child_env.clone();
        env.blocked
            .extend(self.inner.config.stripped_env.iter().cloned());
        env.apply(&mut command);
        if let Some(user) = &self.inner.config.run_as {
            command
                .uid(user.uid)
                .gid(user.gid)
                .env("HOME", &user.home)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
        }
        if let Some(owner) = &spec.owner {
            if let Some(session) = owner.known_spawn_session() {
                command.env(SESSION_ID_ENV, session.as_str());
            }
            command.env(CHAT_ID_ENV, owner.source.chat_id.to_string());
        }
        command
    }

    fn find(&self, id: &ProcessId, scope: Scope<'_>) -> Option<Arc<Entry>> {
        self.entries()
            .iter()
            .find(|e| e.id == *id && scope.admits(e.owner.as_ref()))
            .cloned()
    }

    /// The processes `scope` may see, oldest first.
    pub fn list(&self, scope: Scope<'_>) -> Vec<ProcessRecord> {
        let entries: Vec<Arc<Entry>> = self
            .entries()
            .iter()
            .filter(|e| scope.admits(e.owner.as_ref()))
            .cloned()
            .collect();
        entries.iter().map(|e| e.record()).collect()
    }

    /// Every process, whatever its owner (diagnostics and tests).
    pub fn list_all(&self) -> Vec<ProcessRecord> {
        let entries: Vec<Arc<Entry>> = self.entries().clone();
        entries.iter().map(|e| e.record()).collect()
    }

    /// One process, if `scope` may see it.
    pub fn get(&self, id: &ProcessId, scope: Scope<'_>) -> Option<ProcessRecord> {
        self.find(id, scope).map(|e| e.record())
    }

    /// Running processes `scope` may see.
    pub fn running_count(&self, scope: Scope<'_>) -> usize {
        self.entries()
            .iter()
            .filter(|e| scope.admits(e.owner.as_ref()) && e.is_running())
            .count()
    }

    /// The record and the output produced since the last poll (with the
    /// number of bytes that fell out of the ring before they were read).
    pub fn poll(&self, id: &ProcessId, scope: Scope<'_>) -> Option<(ProcessRecord, String, u64)> {
        let entry = self.find(id, scope)?;
        let (text, dropped) = entry.output().take_new();
        Some((entry.record(), text, dropped))
    }

    /// Everything the ring holds of a process's output.
    pub fn output(&self, id: &ProcessId, scope: Scope<'_>) -> Option<String> {
        self.find(id, scope).map(|e| e.output().text())
    }

    /// Wait until the process ends, at most `limit`, or until `cancel`
    /// fires. Seeing the exit here consumes its wakeup: the agent learns the
    /// result from this call instead. `progress` is pinged while waiting.
    pub async fn wait(
        &self,
        id: &ProcessId,
        scope: Scope<'_>,
        limit: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Option<WaitOutcome> {
        let entry = self.find(id, scope)?;
        let waiter = Waiter::register(entry.clone(), self.inner.events.clone());
        let ended = wait_for_exit(&entry, limit, cancel, progress).await;
        Some(match ended {
            Waited::Exited => {
                waiter.consume();
                WaitOutcome::Exited(entry.record())
            }
            Waited::TimedOut => WaitOutcome::StillRunning(entry.record()),
            Waited::Cancelled => WaitOutcome::Cancelled,
        })
    }

    /// Stop a process and its group (SIGTERM, SIGKILL after the grace) and
    /// return its final record. No wakeup follows a kill on request. `None`
    /// if `scope` has no such process.
    pub async fn kill(&self, id: &ProcessId, scope: Scope<'_>) -> Option<ProcessRecord> {
        let entry = self.find(id, scope)?;
        kill_entry(&entry, self.inner.config.kill_grace).await;
        Some(entry.record())
    }
}

/// A process id not used by any record in `entries`.
fn unique_id(entries: &[Arc<Entry>]) -> ProcessId {
    let taken = |id: &ProcessId| entries.iter().any(|e| e.id == *id);
    for digits in [4, 4, 4, 6, 6, 8, 12, 16] {
        let id = ProcessId::random(digits);
        if !taken(&id) {
            return id;
        }
    }
    // 16 random hex digits colliding with a handful of records: not in
    // this universe, but the id must still be unique.
    let mut n = entries.len();
    loop {
        let id = ProcessId::new(format!("p{n:x}"));
        if !taken(&id) {
            return id;
        }
        n += 1;
    }
}

/// Keep at most `keep` finished records (the oldest go first). Running
/// processes are never forgotten; foreground records leave with their run.
fn forget_old_finished(entries: &mut Vec<Arc<Entry>>, keep: usize) {
    let finished = entries.iter().filter(|e| !e.is_running()).count();
    let mut excess = finished.saturating_sub(keep);
    entries.retain(|e| {
        if excess > 0 && !e.is_running() {
            excess -= 1;
            false
        } else {
            true
        }
    });
}

/// Ask a running entry to stop and wait until it has.
async fn kill_entry(entry: &Entry, grace: Duration) {
    {
        let mut state = entry.state();
        if state.exit.is_some() {
            return;
        }
        state.kill_requested = true;
    }
    tracing::info!(process = %entry.id, pgid = entry.group.raw(), "killing a process on request");
    entry.group.terminate(grace).await;
    // The watcher records the exit right after the group is gone.
    let mut exited = entry.exited.subscribe();
    let _ = tokio::time::timeout(DRAIN_LIMIT + grace, exited.wait_for(|done| *done)).await;
}

/// How a wait ended.
enum Waited {
    Exited,
    TimedOut,
    Cancelled,
}

async fn wait_for_exit(
    entry: &Entry,
    limit: Duration,
    cancel: &CancellationToken,
    progress: Option<&Progress>,
) -> Waited {
    let mut exited = entry.exited.subscribe();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if *exited.borrow_and_update() {
            return Waited::Exited;
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Waited::Cancelled,
            changed = exited.changed() => {
                if changed.is_err() {
                    // The entry is gone with its sender: treat as ended.
                    return Waited::Exited;
                }
            }
            () = tokio::time::sleep_until(deadline) => return Waited::TimedOut,
            () = tokio::time::sleep(ALIVE_PING) => {
                if let Some(progress) = progress {
                    progress.still_working();
                }
            }
        }
    }
}

/// A `process wait` in progress. If it is dropped after the process ended
/// but before it reported the exit (the turn was cancelled), and nobody else
/// waits, it sends the wakeup the exit was holding back.
struct Waiter {
    entry: Arc<Entry>,
    events: ToolEventSender,
}

impl Waiter {
    fn register(entry: Arc<Entry>, events: ToolEventSender) -> Waiter {
        entry.state().waiters += 1;
        Waiter { entry, events }
    }

    /// The exit reaches the agent through this wait: no wakeup.
    fn consume(&self) {
        let mut state = self.entry.state();
        if state.wakeup == WakeupState::Pending {
            state.wakeup = WakeupState::Consumed;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let send = {
            let mut state = self.entry.state();
            state.waiters = state.waiters.saturating_sub(1);
            let due =
                state.waiters == 0 && state.exit.is_some() && state.wakeup == WakeupState::Pending;
            if due {
                state.wakeup = WakeupState::Sent;
            }
            due
        };
        if send {
            if let Some(wakeup) = self.entry.wakeup() {
                self.events.send(ToolEvent::Wakeup(Box::new(wakeup)));
            }
        }
    }
}

/// A foreground process and the tool call waiting for it. Dropping it (the
/// call returned, or its future was dropped mid-wait) kills the process
/// group if it still runs and removes the record.
pub struct ForegroundRun {
    registry: ProcessRegistry,
    entry: Arc<Entry>,
}

impl fmt::Debug for ForegroundRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForegroundRun")
            .field("id", &self.entry.id)
            .finish()
    }
}

impl ForegroundRun {
    /// The process's id.
    pub fn id(&self) -> &ProcessId {
        &self.entry.id
    }

    /// Wait for the process to end, at most `limit`, pinging `progress`.
    /// On timeout or cancellation the group is stopped before returning.
    pub async fn wait(
        &self,
        limit: Duration,
        cancel: &CancellationToken,
        progress: &Progress,
    ) -> WaitOutcome {
        match wait_for_exit(&self.entry, limit, cancel, Some(progress)).await {
            Waited::Exited => WaitOutcome::Exited(self.entry.record()),
            Waited::TimedOut => {
                kill_entry(&self.entry, self.registry.inner.config.kill_grace).await;
                WaitOutcome::StillRunning(self.entry.record())
            }
            Waited::Cancelled => {
                self.kill_now();
                WaitOutcome::Cancelled
            }
        }
    }

    /// Everything the ring holds of the output.
    pub fn output(&self) -> String {
        self.entry.output().text()
    }

    fn kill_now(&self) {
        let mut state = self.entry.state();
        if state.exit.is_none() {
            state.kill_requested = true;
            self.entry.group.send(libc::SIGKILL);
        }
    }
}

impl Drop for ForegroundRun {
    fn drop(&mut self) {
        self.kill_now();
        let id = self.entry.id.clone();
        self.registry.entries().retain(|e| e.id != id);
    }
}

// ---------------------------------------------------------------------------
// The watcher
// ---------------------------------------------------------------------------

/// Pump the process's output into its ring, wait for it, stop what it left
/// in its group, record the exit and send the wakeup if one is due.
async fn supervise(
    entry: Arc<Entry>,
    mut child: Child,
    mut group: ProcessGroup,
    stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
    stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    events: ToolEventSender,
    grace: Duration,
) {
    let readers = [
        stdout.map(|pipe| tokio::spawn(read_into(pipe, entry.clone()))),
        stderr.map(|pipe| tokio::spawn(read_into(pipe, entry.clone()))),
    ];
    let status = child.wait().await;
    // Whatever the leader left in its group may hold the pipes open.
    group.terminate_leftovers(grace).await;
    for reader in readers.into_iter().flatten() {
        let abort = reader.abort_handle();
        if tokio::time::timeout(DRAIN_LIMIT, reader).await.is_err() {
            tracing::warn!(process = %entry.id, "a process that left its group keeps the output open; not reading on");
            abort.abort();
        }
    }
    group.disarm();
    if let Some(wakeup) = entry.finish(status) {
        events.send(ToolEvent::Wakeup(Box::new(wakeup)));
    }
    if entry.is_background() && entry.owner.is_some() {
        events.send(ToolEvent::BackgroundEnded {
            id: entry.id.to_string(),
        });
    }
    tracing::info!(process = %entry.id, state = %entry.record().state_text(), "process ended");
}

async fn read_into(mut pipe: impl AsyncRead + Unpin, entry: Arc<Entry>) {
    let mut buf = vec![0; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => entry.output().push(&buf[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(process = %entry.id, %error, "reading output failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_within_its_cap() {
        let mut ring = OutputRing::new(8);
        ring.push(b"abc");
        ring.push(b"defghij");
        assert_eq!(ring.text(), "cdefghij");
        ring.push(b"0123456789abcdef");
        assert_eq!(ring.text(), "89abcdef");
        let stats = ring.stats();
        assert_eq!((stats.held, stats.cap, stats.total), (8, 8, 26));
        assert_eq!(stats.allocated, 8);
    }

    #[test]
    fn new_output_is_read_once_and_drops_are_counted() {
        let mut ring = OutputRing::new(4);
        ring.push(b"ab");
        assert_eq!(ring.take_new(), ("ab".to_string(), 0));
        assert_eq!(ring.take_new(), (String::new(), 0));
        ring.push(b"cdefgh");
        // "cd" fell out before it was read.
        assert_eq!(ring.take_new(), ("efgh".to_string(), 2));
    }

    #[test]
    fn a_character_cut_by_the_ring_is_dropped() {
        let mut ring = OutputRing::new(4);
        ring.push("xé€".as_bytes()); // x, é (2 bytes), € (3 bytes)
        assert_eq!(ring.text(), "€");
    }

    #[test]
    fn exit_descriptions_read_well() {
        let exit = ExitInfo {
            code: Some(2),
            signal: None,
            killed_on_request: false,
            runtime: Duration::ZERO,
        };
        assert_eq!(exit.describe(), "exit code 2");
        let killed = ExitInfo {
            code: None,
            signal: Some(libc::SIGTERM),
            killed_on_request: true,
            ..exit
        };
        assert_eq!(
            killed.describe(),
            "killed by signal 15 (SIGTERM), killed on request"
        );
    }

    #[test]
    fn ids_are_short_and_unique() {
        let id = unique_id(&[]);
        assert!(id.as_str().starts_with('p'));
        assert_eq!(id.as_str().len(), 5);
    }

    #[test]
    fn scopes_separate_chats_and_unowned_processes() {
        let key = SessionKey::from_raw("a");
        let other = SessionKey::from_raw("b");
        let owner = ProcessOwner {
            session_key: key.clone(),
            source: SessionSource::dm(crate::event::Platform::Console, 1),
            spawn_session_id: None,
        };
        assert!(Scope::Chat(&key).admits(Some(&owner)));
        assert!(!Scope::Chat(&other).admits(Some(&owner)));
        assert!(!Scope::Unowned.admits(Some(&owner)));
        assert!(Scope::Unowned.admits(None));
        assert!(!Scope::Chat(&key).admits(None));
    }
}
