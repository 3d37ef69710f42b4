//! Children never outlive telegate: the process groups it started are
//! recorded while they may run, and the next start kills those a crash
//! left behind, before recovery runs any message again.
//!
//! Why both halves: the kernel kills a group's *leader* when telegate dies
//! (`PR_SET_PDEATHSIG`, see [`super::procgroup`]), but not what the leader
//! started in its group (`sh -c "(sleep 60; touch x) &"`). Those would go on
//! after a `kill -9` while recovery starts the same message again: a side
//! effect twice. So every group is recorded ([`GroupLedger::record`]) with
//! what identifies it beyond its reusable id, and [`kill_previous_run`]
//! kills at start every recorded group that is verifiably still the one
//! recorded ([`verdict`]):
//!
//! * the boot must be the same (start times count from the boot);
//! * a process that has the group's id as its pid is the group's leader for
//!   as long as the group exists (the kernel never hands out a pid still
//!   used as a group id): it must have the recorded start time, or the id
//!   was reused and the group is someone else's;
//! * without a leader, every member must be in the recorded session and
//!   have started after the recorded leader. A group id whose group died
//!   can be reused by a new leader in another session (never killed) or in
//!   telegate's old session; under systemd that session is telegate's own
//!   (only its descendants are in it), started from a shell it is the
//!   shell's, where an unrelated job would have to get exactly that id and
//!   lose its leader in the moments of the restart.
//!
//! Recording goes through one writer task (in order, batched): a group
//! started in the last moment before a crash may be missing, its leader
//! still dies with telegate. A process that leaves its group (`setsid`) is
//! not followed.
//!
//! This module must never signal a group it did not verify, nor telegate's
//! own group.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::procgroup::{all_processes, boot_id, proc_stat, GroupId, ProcStat};
use crate::store::{ChildGroup, ChildGroupChange, ChildGroups, StoreError};

/// How long the start waits for killed groups to be gone.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Records the process groups telegate starts in the store (cheap to
/// clone; clones share one writer task).
#[derive(Clone)]
pub struct GroupLedger {
    inner: Arc<LedgerInner>,
}

struct LedgerInner {
    store: ChildGroups,
    tx: mpsc::UnboundedSender<ChildGroupChange>,
    /// Taken by the writer task, started with the first change (inside
    /// the runtime that spawns programs).
    rx: Mutex<Option<mpsc::UnboundedReceiver<ChildGroupChange>>>,
}

impl std::fmt::Debug for GroupLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupLedger").finish_non_exhaustive()
    }
}

impl GroupLedger {
    /// A ledger writing to `store`.
    pub fn new(store: ChildGroups) -> GroupLedger {
        let (tx, rx) = mpsc::unbounded_channel();
        GroupLedger {
            inner: Arc::new(LedgerInner {
                store,
                tx,
                rx: Mutex::new(Some(rx)),
            }),
        }
    }

    /// Record the group of a program just spawned (its leader not reaped
    /// yet); `what` names it in the log. The group is forgotten when the
    /// returned guard is dropped: keep it until the group is gone.
    pub fn record(&self, group: GroupId, what: &'static str) -> RecordedGroup {
        let stamp = proc_stat(group.raw()).zip(this_boot());
        let Some((leader, boot)) = stamp else {
            tracing::debug!(
                pgid = group.raw(),
                "cannot identify a new process group; not recorded"
            );
            return RecordedGroup::none();
        };
        self.send(ChildGroupChange::Started(ChildGroup {
            pgid: group.raw(),
            leader_start: leader.start,
            session_id: leader.session,
            boot_id: boot.to_string(),
            what: what.to_string(),
        }));
        RecordedGroup {
            ledger: Some(self.clone()),
            pgid: group.raw(),
        }
    }

    fn send(&self, change: ChildGroupChange) {
        self.start_writer();
        // Fails only when the writer is gone (its runtime ended).
        let _ = self.inner.tx.send(change);
    }

    fn start_writer(&self) {
        let mut rx = self.inner.rx.lock().unwrap_or_else(PoisonError::into_inner);
        if rx.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(rx) = rx.take() {
            runtime.spawn(write_changes(self.inner.store.clone(), rx));
        }
    }
}

/// The writer: every change in order, those waiting together in one call.
async fn write_changes(store: ChildGroups, mut rx: mpsc::UnboundedReceiver<ChildGroupChange>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(next) = rx.try_recv() {
            batch.push(next);
        }
        if let Err(error) = store.record_child_groups(batch).await {
            tracing::warn!(%error, "could not record started or ended process groups");
        }
    }
}

/// A recorded group: dropping it records that the group is gone.
#[derive(Debug)]
pub struct RecordedGroup {
    ledger: Option<GroupLedger>,
    pgid: i32,
}

impl RecordedGroup {
    /// Nothing recorded (no store).
    pub fn none() -> RecordedGroup {
        RecordedGroup {
            ledger: None,
            pgid: 0,
        }
    }
}

impl Drop for RecordedGroup {
    fn drop(&mut self) {
        if let Some(ledger) = self.ledger.take() {
            ledger.send(ChildGroupChange::Ended(self.pgid));
        }
    }
}

/// This boot's id, read once.
fn this_boot() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(boot_id).as_deref()
}

/// What the start does with a recorded group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing of it runs any more.
    Gone,
    /// It is still the group recorded: kill it.
    Ours,
    /// Its id belongs to somebody else now (or cannot be checked): leave it.
    NotOurs(&'static str),
}

/// Decide about `recorded`, given this boot's id and every process now
/// (pure; see the module docs for why these checks suffice).
pub fn verdict(recorded: &ChildGroup, boot: Option<&str>, processes: &[ProcStat]) -> Verdict {
    let (Some(boot), false) = (boot, recorded.boot_id.is_empty()) else {
        return Verdict::NotOurs("the boot cannot be told");
    };
    if boot != recorded.boot_id {
        return Verdict::Gone;
    }
    let members: Vec<&ProcStat> = processes
        .iter()
        .filter(|p| p.pgrp == recorded.pgid && !p.is_zombie())
        .collect();
    if members.is_empty() {
        return Verdict::Gone;
    }
    if let Some(leader) = processes.iter().find(|p| p.pid == recorded.pgid) {
        return if leader.start == recorded.leader_start {
            Verdict::Ours
        } else {
            Verdict::NotOurs("its id belongs to another process now")
        };
    }
    let ours = members
        .iter()
        .all(|m| m.session == recorded.session_id && m.start >= recorded.leader_start);
    if ours {
        Verdict::Ours
    } else {
        Verdict::NotOurs("its id was reused outside telegate's session")
    }
}

/// At start, before anything runs again: kill every process group the
/// previous run recorded that still runs and is verifiably its own, and
/// forget them all. Returns how many groups were killed.
pub async fn kill_previous_run(store: &ChildGroups) -> Result<usize, StoreError> {
    let recorded = store.take_child_groups().await?;
    if recorded.is_empty() {
        return Ok(0);
    }
    let processes = all_processes();
    // SAFETY: getpgrp has no preconditions.
    let own_group = unsafe { libc::getpgrp() };
    let mut killed = Vec::new();
    for group in &recorded {
        let id = match GroupId::of_leader(u32::try_from(group.pgid).unwrap_or(0)) {
            Some(id) if group.pgid != own_group => id,
            _ => continue,
        };
        match verdict(group, this_boot(), &processes) {
            Verdict::Gone => {}
            Verdict::Ours => {
                tracing::warn!(
                    pgid = group.pgid,
                    what = %group.what,
                    "a program of the previous run was still running; killing its process group"
                );
                id.send(libc::SIGKILL);
                killed.push(id);
            }
            Verdict::NotOurs(why) => {
                tracing::info!(
                    pgid = group.pgid,
                    why,
                    "a recorded process group is not ours any more; left alone"
                );
            }
        }
    }
    let deadline = Instant::now() + KILL_WAIT;
    for id in &killed {
        if !id.gone_by(deadline).await {
            tracing::warn!(
                pgid = id.raw(),
                "a killed process group of the previous run is still there"
            );
        }
    }
    Ok(killed.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    const BOOT: &str = "b-1";

    fn recorded() -> ChildGroup {
        ChildGroup {
            pgid: 500,
            leader_start: 1000,
            session_id: 40,
            boot_id: BOOT.into(),
            what: "command".into(),
        }
    }

    fn process(pid: i32, pgrp: i32, session: i32, start: u64) -> ProcStat {
        ProcStat {
            pid,
            state: 'S',
            pgrp,
            session,
            start,
        }
    }

    #[test]
    fn the_recorded_leader_or_its_orphans_are_ours() {
        let g = recorded();
        let leader = process(500, 500, 40, 1000);
        let child = process(501, 500, 40, 1010);
        assert_eq!(verdict(&g, Some(BOOT), &[leader, child]), Verdict::Ours);
        // The leader died with telegate; what it started runs on.
        assert_eq!(verdict(&g, Some(BOOT), &[child]), Verdict::Ours);
        // A zombie leader is still the recorded one.
        let zombie = ProcStat {
            state: 'Z',
            ..leader
        };
        assert_eq!(verdict(&g, Some(BOOT), &[zombie, child]), Verdict::Ours);
    }

    #[test]
    fn a_reused_id_another_boot_or_nothing_left_is_never_killed() {
        let g = recorded();
        let child = process(501, 500, 40, 1010);
        // Another process got the id and leads a group of its own.
        let stranger = process(500, 500, 40, 5000);
        assert!(matches!(
            verdict(&g, Some(BOOT), &[stranger, child]),
            Verdict::NotOurs(_)
        ));
        // A leaderless group in another session, or older than our leader.
        let elsewhere = process(502, 500, 41, 1010);
        assert!(matches!(
            verdict(&g, Some(BOOT), &[elsewhere]),
            Verdict::NotOurs(_)
        ));
        let older = process(503, 500, 40, 999);
        assert!(matches!(
            verdict(&g, Some(BOOT), &[older]),
            Verdict::NotOurs(_)
        ));
        assert_eq!(verdict(&g, Some("b-2"), &[child]), Verdict::Gone);
        assert_eq!(verdict(&g, Some(BOOT), &[]), Verdict::Gone);
        let zombie = ProcStat {
            state: 'Z',
            ..child
        };
        assert_eq!(verdict(&g, Some(BOOT), &[zombie]), Verdict::Gone);
        assert!(matches!(verdict(&g, None, &[child]), Verdict::NotOurs(_)));
    }

    #[tokio::test]
    async fn the_start_kills_a_recorded_group_that_still_runs_and_forgets_it() {
        use super::super::procgroup::spawn_leader;
        let store = Store::open_in_memory().unwrap();
        let ledger = GroupLedger::new(store.child_groups());
        let mut command = tokio::process::Command::new("sh");
        // The leader exits at once; its child stays in the group.
        command.arg("-c").arg("sleep 30 & exit 0");
        let mut child = spawn_leader(command).unwrap();
        let id = GroupId::of_leader(child.id().unwrap()).unwrap();
        let recorded = ledger.record(id, "test");
        std::mem::forget(recorded); // as a crash would: never forgotten
        child.wait().await.unwrap();
        assert!(id.alive(), "the leader's child still runs");
        // The record reaches the store through the writer task.
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorded_rows(&store, None).await == 0 {
            assert!(Instant::now() < deadline, "never recorded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kill_previous_run(&store.child_groups()).await.unwrap(), 1);
        assert!(!id.alive(), "the group is gone");
        assert_eq!(
            kill_previous_run(&store.child_groups()).await.unwrap(),
            0,
            "and forgotten"
        );
    }

    /// How many rows name group `pgid` (any group: `None`).
    async fn recorded_rows(store: &Store, pgid: Option<i32>) -> i64 {
        store
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM child_groups WHERE ?1 IS NULL OR pgid = ?1",
                    [pgid],
                    |r| r.get::<_, i64>(0),
                )?)
            })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_group_that_ended_is_forgotten_in_order() {
        use super::super::procgroup::spawn_leader;
        let store = Store::open_in_memory().unwrap();
        let ledger = GroupLedger::new(store.child_groups());
        let spawn = || {
            let mut command = tokio::process::Command::new("sleep");
            command.arg("30").kill_on_drop(true);
            let child = spawn_leader(command).unwrap();
            let id = GroupId::of_leader(child.id().unwrap()).unwrap();
            (child, id)
        };
        let (mut ended, ended_id) = spawn();
        let recorded = ledger.record(ended_id, "test");
        ended.kill().await.unwrap();
        drop(recorded);
        let (_running, running_id) = spawn();
        let _kept = ledger.record(running_id, "test");
        // The second group's row shows the writer got past the first's end.
        let deadline = Instant::now() + Duration::from_secs(10);
        while recorded_rows(&store, Some(running_id.raw())).await == 0 {
            assert!(Instant::now() < deadline, "never recorded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left: Vec<i32> = store
            .child_groups()
            .take_child_groups()
            .await
            .unwrap()
            .iter()
            .map(|g| g.pgid)
            .collect();
        assert_eq!(left, vec![running_id.raw()]);
    }
}
