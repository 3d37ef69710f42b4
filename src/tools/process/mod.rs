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
//!   what the leader leaves running when it exits is stopped too. The group
//!   dies with telegate, even by `kill -9`: the leader at once
//!   (parent-death signal), the rest at the next start (every group is
//!   recorded while it runs, [`crate::tools::childgroups`]).
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

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use std::{fmt, io};

use tokio::process::Command;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::tools::childgroups::{GroupLedger, RecordedGroup};
use crate::tools::events::{ToolEvent, ToolEventSender};
use crate::tools::procgroup::{spawn_leader, GroupId, ProcessGroup};
use crate::tools::wakeup::Wakeup;
use crate::vocab::{Progress, CHAT_ID_ENV, SESSION_ID_ENV};

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 16 * 1024;
/// How long to keep reading pipes after the whole group is gone. Only a
/// process that left the group (`setsid`) can hold them open longer.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);
/// How often a waiting tool tells the stall watchdog it is still alive.
const ALIVE_PING: Duration = Duration::from_secs(2);

mod config;
mod foreground;
mod record;
mod ring;
#[cfg(test)]
mod tests;
mod watcher;

use crate::tools::process::foreground::wait_for_exit;
use crate::tools::process::foreground::Waited;
use crate::tools::process::foreground::Waiter;
use crate::tools::process::watcher::supervise;
pub use config::{RegistryConfig, SpawnError, SpawnSpec, WaitOutcome};
pub use foreground::ForegroundRun;
pub use record::{
    ExitInfo, OutputStats, ProcessId, ProcessMode, ProcessOwner, ProcessRecord, ProcessState, Scope,
};
pub use ring::OutputRing;

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
    /// Where each process group is recorded (with a store).
    groups: OnceLock<GroupLedger>,
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
                groups: OnceLock::new(),
            }),
        }
    }

    /// Record every process group from now on in `ledger`, so the next
    /// start kills what a crash left running (`tools::childgroups`).
    pub fn record_groups(&self, ledger: GroupLedger) {
        let _ = self.inner.groups.set(ledger);
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
        self.check_spec(&spec, notify)?;
        // The limit check and the insert happen under one lock, so two
        // concurrent spawns cannot both take the last place. Spawning is a
        // synchronous fork/exec, no await.
        let mut entries = self.entries();
        if matches!(spec.mode, ProcessMode::Background { .. }) {
            self.check_limits(&entries, spec.owner.as_ref())?;
        }
        let mut child =
            spawn_leader(self.command(&spec)).map_err(|e| SpawnError::Spawn(e.to_string()))?;
        let Some(group) = child.id().and_then(ProcessGroup::of_leader) else {
            return Err(SpawnError::Spawn("the shell has no process id".to_string()));
        };
        let recorded = self
            .inner
            .groups
            .get()
            .map_or_else(RecordedGroup::none, |ledger| {
                ledger.record(group.id(), "terminal")
            });
        let entry = self.new_entry(unique_id(&entries), spec, group.id(), notify);
        entries.push(entry.clone());
        forget_old_finished(&mut entries, self.inner.config.keep_finished);
        drop(entries);
        self.announce(&entry);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        tokio::spawn(supervise(
            entry.clone(),
            child,
            (group, recorded),
            stdout,
            stderr,
            self.inner.events.clone(),
            self.inner.config.kill_grace,
        ));
        Ok(entry)
    }

    /// Refuses a spec before anything starts: a wakeup with nobody to
    /// wake, a NUL byte in the command, a configured workdir that is not a
    /// directory.
    fn check_spec(&self, spec: &SpawnSpec, notify: bool) -> Result<(), SpawnError> {
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
        Ok(())
    }

    /// The registry's entry of a process just started as the leader of
    /// `group`: running, its wakeup pending when `notify`.
    fn new_entry(
        &self,
        id: ProcessId,
        spec: SpawnSpec,
        group: GroupId,
        notify: bool,
    ) -> Arc<Entry> {
        let (exited, _) = watch::channel(false);
        Arc::new(Entry {
            id,
            command: spec.command,
            owner: spec.owner,
            mode: spec.mode,
            group,
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
        })
    }

    /// Logs a started process; a background one with an owner is also
    /// reported (to be recorded in the store).
    fn announce(&self, entry: &Entry) {
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

    /// `sh -c <command>`: configured directory, minimal environment
    /// without secrets (its own group comes with [`spawn_leader`]).
    fn command(&self, spec: &SpawnSpec) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&spec.command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
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
