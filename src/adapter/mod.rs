//! The adapter: the platform-neutral heart of session control.
//!
//! Every inbound [`MessageEvent`] goes through [`Adapter::handle_message`],
//! which decides, without ever awaiting a turn, what happens to it:
//!
//! * **idle slot**: a guard and an owner task are installed *in the same
//!   critical section* that saw the slot idle (no await in between, so a
//!   second message cannot start a parallel turn), and the task runs the
//!   turn, sends its reply, then drains the slot's queue in arrival order;
//! * **busy slot, /stop /new /reset**: the *command path* swaps in a command
//!   guard, lets the handler (the runner) act, sends the command's reply
//!   first, then cancels the old task (bounded wait; one only delivering
//!   its answer is not aborted, its sending is stopped instead), then
//!   releases the command guard and starts the oldest follow-up exactly
//!   once;
//! * **busy slot, other commands**: answered at once, the turn untouched;
//!   so is an ordinary message the handler claims as an answer the running
//!   turn waits for (a "yes" to a pending approval, see
//!   [`MessageHandler::claims_while_busy`]);
//! * **busy slot, ordinary message**: queued, and in `interrupt` mode the
//!   running turn is interrupted; one rate-limited acknowledgement;
//! * **busy slot, internal event** (wakeup): queued silently.
//!
//! A guard whose owner task has finished (done, panicked, aborted) is a stale
//! lock: the next message heals it instead of being trapped behind it. A
//! task drops its owner entry only if it actually released the guard, so a
//! lock can never be left without an owner that would let it heal.
//!
//! The adapter owns `active_sessions`, `session_tasks`, the pending queues
//! and acknowledgement pacing. It must never run agent work inline, never
//! hold its lock across an `.await`, and never know which platform it serves.

mod guard;
mod handler;
mod outcome;
mod owner;
mod pending;
mod state;

use owner::{internal_error, owner_task, report_refusals};
use state::{AdapterState, Refusals};

pub use guard::{CommandLease, GuardKind, OwnerTask, SessionGuard};
pub use handler::{DispatchContext, MessageHandler};
pub use outcome::{EventOutcome, OutcomeSink};
pub use pending::PendingQueue;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::reply::{Outbound, Outgoing, Reply, ReplyKind};
use crate::vocab::{KeyPolicy, MessageEvent, MessageKind, SessionKey, SessionSource};

/// What an ordinary message does to a busy slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusyMode {
    /// Interrupt the running turn; the message becomes the next turn and the
    /// interrupted turn's output is discarded.
    #[default]
    Interrupt,
    /// Wait for the running turn to finish.
    Queue,
}

/// Adapter settings.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// What an ordinary message does to a busy slot.
    pub busy_mode: BusyMode,
    /// How many follow-ups may wait per slot.
    pub max_pending: usize,
    /// At most one acknowledgement per slot within this interval.
    pub ack_interval: Duration,
    /// How long the command path waits for a cancelled task to finish
    /// before aborting it.
    pub cancel_wait: Duration,
    /// How session keys are built.
    pub key_policy: KeyPolicy,
    /// Where stale-lock heals and refusals are counted.
    pub metrics: Metrics,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig {
            busy_mode: BusyMode::Interrupt,
            max_pending: 20,
            ack_interval: Duration::from_secs(3),
            cancel_wait: Duration::from_secs(2),
            key_policy: KeyPolicy::default(),
            metrics: Metrics::default(),
        }
    }
}

struct AdapterInner {
    state: Mutex<AdapterState>,
    handler: Arc<dyn MessageHandler>,
    outbound: Arc<dyn Outbound>,
    outcomes: Option<Arc<dyn OutcomeSink>>,
    config: AdapterConfig,
    /// Set by [`Adapter::shutdown`]: cancelled turns keep their "running"
    /// record, so a restart resumes them.
    shutting_down: AtomicBool,
}

/// What an [`Adapter`] is built from.
pub struct AdapterParts {
    /// Where events are dispatched (the runner, or a closure in tests).
    pub handler: Arc<dyn MessageHandler>,
    /// Where acknowledgements and replies go.
    pub outbound: Arc<dyn Outbound>,
    /// Where every message's outcome is reported (`None`: nowhere).
    pub outcomes: Option<Arc<dyn OutcomeSink>>,
    /// The adapter's settings.
    pub config: AdapterConfig,
}

impl AdapterParts {
    /// A handler and an outbound; no outcome sink, default settings (the
    /// rest of a struct literal: `..AdapterParts::new(handler, outbound)`).
    pub fn new(handler: Arc<dyn MessageHandler>, outbound: Arc<dyn Outbound>) -> Self {
        AdapterParts {
            handler,
            outbound,
            outcomes: None,
            config: AdapterConfig::default(),
        }
    }
}

/// The adapter. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Adapter {
    inner: Arc<AdapterInner>,
}

/// An [`Adapter`] that may be gone (see [`Adapter::downgrade`]).
#[derive(Clone)]
pub struct WeakAdapter {
    inner: std::sync::Weak<AdapterInner>,
}

impl WeakAdapter {
    /// The adapter, if it still exists.
    pub fn upgrade(&self) -> Option<Adapter> {
        self.inner.upgrade().map(|inner| Adapter { inner })
    }
}

/// What `handle_message` decided under the lock, carried out after it.
enum Route {
    Done,
    /// An acknowledgement: sent from its own task, never awaited here; the
    /// token fires once it is out.
    Notice(SessionKey, SessionSource, Reply, CancellationToken),
    /// The first refusal since the slot's last "not queued" notice: start
    /// the slot's notifier.
    Refused(SessionKey),
    Bypass(MessageEvent, DispatchContext),
    Command(CommandPath),
}

struct CommandPath {
    key: SessionKey,
    event: MessageEvent,
    previous: Option<SessionGuard>,
    guard: SessionGuard,
    lease: CommandLease,
    old_owner: Option<OwnerTask>,
    discarded: Vec<MessageEvent>,
    queue_depth: usize,
}

impl Adapter {
    /// The adapter from its parts (see [`AdapterParts`]): the one way to
    /// build one.
    pub fn new(parts: AdapterParts) -> Self {
        let AdapterParts {
            handler,
            outbound,
            outcomes,
            config,
        } = parts;
        Adapter {
            inner: Arc::new(AdapterInner {
                state: Mutex::new(AdapterState::default()),
                handler,
                outbound,
                outcomes,
                config,
                shutting_down: AtomicBool::new(false),
            }),
        }
    }

    /// Stop: wait up to `grace` for running and queued turns to finish, then
    /// cancel what still runs. Messages cut short this way keep their
    /// "running" (or "received") record, so a restart resumes them. Returns
    /// how many turns had to be cancelled.
    pub async fn shutdown(&self, grace: Duration) -> usize {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        while !self.is_idle() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let owners: Vec<OwnerTask> = self.state().session_tasks.values().cloned().collect();
        let mut cancelled = 0;
        for owner in owners {
            if owner.is_finished() {
                continue;
            }
            cancelled += 1;
            owner.request_cancel();
            if !owner.finished_within(self.inner.config.cancel_wait).await {
                owner.abort();
                owner.finished_within(Duration::from_millis(100)).await;
            }
        }
        cancelled
    }

    fn state(&self) -> MutexGuard<'_, AdapterState> {
        self.inner.state()
    }

    /// A handle that does not keep the adapter alive (for parts of the
    /// engine the adapter itself owns, such as the tool event forwarder).
    pub fn downgrade(&self) -> WeakAdapter {
        WeakAdapter {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Drop every message `user` has waiting, in every slot (their access
    /// was taken away, so none of them may run): each gets its outcome
    /// ("access revoked"), and each chat they waited in one notice, from
    /// its own task. Returns how many were dropped. Internal events stay;
    /// their turns check access when they start.
    pub fn drop_queued_of(&self, user: u64) -> usize {
        let dropped: Vec<Vec<MessageEvent>> = {
            let mut state = self.state();
            let dropped = state
                .pending
                .values_mut()
                .map(|queue| queue.take_messages_of(user))
                .filter(|taken| !taken.is_empty())
                .collect();
            state.pending.retain(|_, queue| !queue.is_empty());
            dropped
        };
        let mut count = 0;
        for slot in dropped {
            let Some(first) = slot.first() else { continue };
            let (inner, source) = (self.inner.clone(), first.source.clone());
            for event in &slot {
                self.inner.note(
                    &event.source,
                    event.message_id,
                    EventOutcome::Dropped("access revoked"),
                );
            }
            count += slot.len();
            let notice = Reply::notice(revoked_note(slot.len()));
            tokio::spawn(async move { inner.send(&source, notice.into()).await });
        }
        count
    }

    /// The slot key of `source` under this adapter's key policy.
    pub fn session_key(&self, source: &SessionSource) -> SessionKey {
        SessionKey::for_source(source, self.inner.config.key_policy)
    }

    /// Hand on an internal event (a background-process wakeup): journaled
    /// first when the adapter has an outcome sink, so a restart between now and
    /// its turn still delivers it; then routed like any event (queued
    /// silently behind a busy slot).
    pub async fn wake(&self, mut event: MessageEvent) {
        if let Some(outcomes) = &self.inner.outcomes {
            if let Some(id) = outcomes.journal(&event).await {
                event.message_id = Some(id);
            }
        }
        self.handle_message(event).await;
    }

    /// Take one inbound event. Returns as soon as the event is routed; it
    /// never awaits a turn. On the command path it returns once the command
    /// has been answered, the old turn cancelled and the slot handed on.
    pub async fn handle_message(&self, event: MessageEvent) {
        if self.inner.shutting_down() {
            // Nothing new starts once the shutdown began: the message stays
            // unfinished in the outcome sink (the inbox), and the next start
            // resumes it.
            tracing::info!(
                message_id = ?event.message_id,
                "message arrived during shutdown; left for the next start"
            );
            return;
        }
        let key = self.session_key(&event.source);
        let route = {
            let mut state = self.state();
            self.route(&mut state, key, event)
        };
        match route {
            Route::Done => {}
            Route::Notice(key, source, reply, sent) => {
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    let sent_guard = sent.drop_guard();
                    inner.send(&source, reply.into()).await;
                    drop(sent_guard);
                    inner.state().forget_sent_notice(&key);
                });
            }
            Route::Refused(key) => {
                tokio::spawn(report_refusals(self.inner.clone(), key));
            }
            Route::Bypass(event, ctx) => {
                let source = event.source.clone();
                let message_id = event.message_id;
                let out = match self.handle_caught(event, ctx).await {
                    Ok(out) => out,
                    Err(_) => Some(internal_error().into()),
                };
                self.inner.answer(&source, message_id, out).await;
            }
            Route::Command(path) => self.command_path(path).await,
        }
    }

    /// Run the handler on `event`; `Err` when it panicked.
    async fn handle_caught(
        &self,
        event: MessageEvent,
        ctx: DispatchContext,
    ) -> std::thread::Result<Option<Outgoing>> {
        AssertUnwindSafe(self.inner.handler.handle(event, ctx))
            .catch_unwind()
            .await
    }

    /// Where `event` goes: decided under the state lock, acted on after it.
    fn route(&self, state: &mut AdapterState, key: SessionKey, event: MessageEvent) -> Route {
        if state.heal(&key) {
            self.inner.config.metrics.stale_lock_heals.inc();
        }
        if !state.active_sessions.contains_key(&key) {
            return self.route_idle(state, key, event);
        }
        let queue_depth = state.pending_len(&key);
        let command = event.command().map(|c| (c.is_control(), c.rotates()));
        if let Some((true, rotates)) = command {
            return route_control(state, key, event, rotates, queue_depth);
        }
        let claimed = command.is_none()
            && !event.internal
            && self.inner.handler.claims_while_busy(&key, &event);
        if command.is_some() || event.kind == MessageKind::Unsupported || claimed {
            let ctx = DispatchContext {
                key,
                interrupt: CancellationToken::new(),
                slot_busy: true,
                slot_sending: false,
                queue_depth,
                claimed_while_busy: claimed,
            };
            return Route::Bypass(event, ctx);
        }
        self.route_follow_up(state, key, event)
    }

    /// An idle slot: `event` starts its owner task, behind the follow-ups
    /// already queued (kept across a heal).
    fn route_idle(&self, state: &mut AdapterState, key: SessionKey, event: MessageEvent) -> Route {
        let event = match state.pending.get_mut(&key) {
            Some(queue) if !queue.is_empty() => {
                let _ = queue.push(event, usize::MAX);
                match state.pop_pending(&key) {
                    Some(first) => first,
                    None => return Route::Done,
                }
            }
            _ => event,
        };
        self.start_owner_task(state, key, event);
        Route::Done
    }

    /// An ordinary message or an internal event for a busy slot: queued,
    /// the turn interrupted in `interrupt` mode, acknowledged at most once
    /// per interval; refused when the queue is full.
    fn route_follow_up(
        &self,
        state: &mut AdapterState,
        key: SessionKey,
        event: MessageEvent,
    ) -> Route {
        let current = state.active_sessions.get(&key).cloned();
        let internal = event.internal;
        let source = event.source.clone();
        let message_id = event.message_id;
        let capacity = self.inner.config.max_pending;
        let position = match state
            .pending
            .entry(key.clone())
            .or_default()
            .push(event, capacity)
        {
            Ok(position) => position,
            Err(refused) => {
                tracing::debug!(session_key = %key, capacity, "queue full; message refused");
                return self.refuse(state, key, source, refused.message_id);
            }
        };
        if internal {
            return Route::Done;
        }
        self.inner.outbound.queued(&source, message_id);
        let interrupting = self.inner.config.busy_mode == BusyMode::Interrupt
            && current
                .as_ref()
                .is_some_and(|g| g.kind() == GuardKind::Turn);
        if interrupting {
            if let Some(guard) = &current {
                guard.interrupt().cancel();
            }
        }
        let now = Instant::now();
        if !ack_due(
            state.last_ack.get(&key).copied(),
            now,
            self.inner.config.ack_interval,
        ) {
            return Route::Done;
        }
        state.last_ack.insert(key.clone(), now);
        let text = follow_up_notice(interrupting, position);
        let sent = CancellationToken::new();
        state.last_notice.insert(key.clone(), sent.clone());
        Route::Notice(
            key,
            source,
            Reply::notice(text).in_reply_to(message_id),
            sent,
        )
    }

    /// A message the full queue refused: its outcome noted, counted into
    /// the slot's refusals; the first refusal of an interval starts the
    /// notifier.
    fn refuse(
        &self,
        state: &mut AdapterState,
        key: SessionKey,
        source: SessionSource,
        refused_id: Option<i64>,
    ) -> Route {
        self.inner.config.metrics.messages_refused.inc();
        self.inner
            .note(&source, refused_id, EventOutcome::Dropped("queue full"));
        // One notice per interval however many are refused: a
        // burst must not turn into a burst of notices that holds
        // up the chat (and every command behind it).
        let refusals = state.refusals.entry(key.clone()).or_insert(Refusals {
            count: 0,
            first: None,
            source,
            notifier: false,
        });
        refusals.count += 1;
        if refusals.first.is_none() {
            refusals.first = refused_id;
        }
        if refusals.notifier {
            return Route::Done;
        }
        refusals.notifier = true;
        Route::Refused(key)
    }

    /// Install a guard and an owner task for `key` and start `event` in it.
    /// Must be called with the state lock held: the guard and the owner are
    /// in place before anyone else can look at the slot.
    fn start_owner_task(&self, state: &mut AdapterState, key: SessionKey, event: MessageEvent) {
        let guard = SessionGuard::new();
        let cancel = CancellationToken::new();
        let done = CancellationToken::new();
        let task = tokio::spawn(owner_task(
            self.inner.clone(),
            key.clone(),
            guard.clone(),
            event,
            cancel.clone(),
            done.clone(),
        ));
        state.active_sessions.insert(key.clone(), guard);
        state
            .session_tasks
            .insert(key, OwnerTask::new(task.abort_handle(), cancel, done));
    }

    /// The command path (invariant 4): the command's reply first, then the
    /// old task cancelled, then the slot handed on.
    async fn command_path(&self, path: CommandPath) {
        let CommandPath {
            key,
            event,
            previous,
            guard,
            lease,
            old_owner,
            mut discarded,
            queue_depth,
        } = path;
        // Until the end of this function the command guard is never stale.
        let _lease = lease;
        let source = event.source.clone();
        let message_id = event.message_id;
        // A turn that already has its answer and is only delivering it is
        // not "running" any more: /stop then has nothing to stop.
        let slot_busy = previous.as_ref().is_some_and(|g| !g.is_finishing());
        let slot_sending = previous.as_ref().is_some_and(SessionGuard::is_sending);
        let ctx = DispatchContext {
            key: key.clone(),
            interrupt: guard.interrupt().clone(),
            slot_busy,
            slot_sending,
            queue_depth,
            claimed_while_busy: false,
        };
        let mut outgoing = match self.handle_caught(event, ctx).await {
            Ok(outgoing) => outgoing,
            Err(_) => {
                // The command failed: put everything back as it was.
                self.restore_slot(&key, &guard, previous, &mut discarded);
                tracing::error!(session_key = %key, "command handler panicked; previous guard restored");
                self.inner
                    .answer(&source, message_id, Some(internal_error().into()))
                    .await;
                return;
            }
        };
        self.report_discarded(&discarded, &mut outgoing);
        // 1. The command's reply goes out first.
        self.inner.answer(&source, message_id, outgoing).await;
        // 2a. A turn delivering its answer sends no more of it (that task
        //     records and reports what it left out).
        if let Some(previous) = &previous {
            previous.stop_sending();
        }
        if let Some(owner) = &old_owner {
            self.cancel_old_owner(&key, previous.as_ref(), owner).await;
        }
        self.hand_on(key, &guard, old_owner.as_ref());
    }

    /// After a command handler panicked: the slot's previous guard back in
    /// place (if the command still owns the slot), the discarded follow-ups
    /// back in the queue.
    fn restore_slot(
        &self,
        key: &SessionKey,
        guard: &SessionGuard,
        previous: Option<SessionGuard>,
        discarded: &mut Vec<MessageEvent>,
    ) {
        let mut state = self.state();
        if state.owns(key, guard) {
            match previous {
                Some(previous) => {
                    state.active_sessions.insert(key.clone(), previous);
                }
                None => {
                    state.active_sessions.remove(key);
                }
            }
        }
        let queue = state.pending.entry(key.clone()).or_default();
        for event in discarded.drain(..).rev() {
            queue.push_front(event);
        }
        state.forget_idle(key);
    }

    /// Each follow-up a rotating command dropped gets its outcome, and the
    /// command's reply a line about them.
    fn report_discarded(&self, discarded: &[MessageEvent], outgoing: &mut Option<Outgoing>) {
        for dropped in discarded {
            self.inner.note(
                &dropped.source,
                dropped.message_id,
                EventOutcome::Dropped("a new session started"),
            );
        }
        let Some(note) = discarded_note(discarded.len()) else {
            return;
        };
        match outgoing {
            Some(out) => {
                out.reply.text.push('\n');
                out.reply.text.push_str(&note);
            }
            None => *outgoing = Some(Reply::notice(note).into()),
        }
    }

    /// 2. The old task is cancelled, with a bounded wait. A task that is
    ///    only delivering its finished answer is not aborted: cutting a
    ///    delivery short would leave the answer half sent and its message
    ///    without an outcome. It ends on its own and never touches the slot
    ///    again (its guard is gone).
    async fn cancel_old_owner(
        &self,
        key: &SessionKey,
        previous: Option<&SessionGuard>,
        owner: &OwnerTask,
    ) {
        owner.request_cancel();
        if owner.finished_within(self.inner.config.cancel_wait).await {
            return;
        }
        if previous.is_some_and(SessionGuard::is_finishing) {
            tracing::debug!(session_key = %key, "old task is delivering its answer; left to finish");
        } else {
            tracing::warn!(session_key = %key, "old task ignored cancellation; aborting it");
            owner.abort();
            owner.finished_within(Duration::from_millis(100)).await;
        }
    }

    /// 3. The command guard is released and the oldest follow-up starts,
    ///    exactly once (unless a newer command took over the slot: it hands
    ///    the slot on).
    fn hand_on(&self, key: SessionKey, guard: &SessionGuard, old_owner: Option<&OwnerTask>) {
        let mut state = self.state();
        if !state.owns(&key, guard) {
            return;
        }
        state.active_sessions.remove(&key);
        if let Some(owner) = old_owner {
            if state
                .session_tasks
                .get(&key)
                .is_some_and(|o| o.id() == owner.id())
            {
                state.session_tasks.remove(&key);
            }
        }
        match state.pop_pending(&key) {
            Some(next) => self.start_owner_task(&mut state, key, next),
            None => state.forget_idle(&key),
        }
    }

    // ----- observation and direct manipulation (tests, diagnostics) -----

    /// True while `key` has a guard installed.
    pub fn is_active(&self, key: &SessionKey) -> bool {
        self.state().active_sessions.contains_key(key)
    }

    /// True while `key` has an owner task recorded.
    pub fn has_owner_task(&self, key: &SessionKey) -> bool {
        self.state().session_tasks.contains_key(key)
    }

    /// Follow-ups waiting for `key`.
    pub fn pending_len(&self, key: &SessionKey) -> usize {
        self.state().pending_len(key)
    }

    /// True if `key` has a queue entry at all.
    pub fn has_pending(&self, key: &SessionKey) -> bool {
        self.state().pending.contains_key(key)
    }

    /// True if `key`'s guard is held by an owner task that has finished.
    /// A guard without an owner, or with a live owner, is not stale; nor is
    /// a command guard while its command runs.
    pub fn session_task_is_stale(&self, key: &SessionKey) -> bool {
        self.state().is_stale(key)
    }

    /// True if `key` has an owner task recorded and it has finished
    /// (whether or not that makes the slot's guard stale).
    pub fn owner_task_finished(&self, key: &SessionKey) -> bool {
        self.state()
            .session_tasks
            .get(key)
            .is_some_and(OwnerTask::is_finished)
    }

    /// Clear `key`'s lock if it is stale. Returns whether it healed.
    pub fn heal_stale_session_lock(&self, key: &SessionKey) -> bool {
        self.state().heal(key)
    }

    /// Install a lock directly: a guard and optionally an owner task.
    pub fn install_lock(&self, key: &SessionKey, guard: SessionGuard, owner: Option<OwnerTask>) {
        let mut state = self.state();
        state.active_sessions.insert(key.clone(), guard);
        match owner {
            Some(owner) => state.session_tasks.insert(key.clone(), owner),
            None => state.session_tasks.remove(key),
        };
    }

    /// Replace only the guard of `key` (as the command path does), returning
    /// the previous one.
    pub fn swap_guard(&self, key: &SessionKey, guard: SessionGuard) -> Option<SessionGuard> {
        self.state().active_sessions.insert(key.clone(), guard)
    }

    /// The guard installed for `key`.
    pub fn active_guard(&self, key: &SessionKey) -> Option<SessionGuard> {
        self.state().active_sessions.get(key).cloned()
    }

    /// Release `key`'s guard: only if it is `guard` when one is given, or
    /// whatever is there with `None`. Returns whether a guard was removed.
    pub fn release_session_guard(&self, key: &SessionKey, guard: Option<&SessionGuard>) -> bool {
        self.state().release_guard(key, guard)
    }

    /// Slots with a guard installed.
    pub fn busy_count(&self) -> usize {
        self.state().active_sessions.len()
    }

    /// Follow-ups waiting, over all slots.
    pub fn pending_total(&self) -> usize {
        self.state().pending.values().map(PendingQueue::len).sum()
    }

    /// True when no slot is busy and nothing is queued or recorded.
    pub fn is_idle(&self) -> bool {
        let state = self.state();
        state.active_sessions.is_empty()
            && state.session_tasks.is_empty()
            && state.pending.is_empty()
    }

    /// The slots that are busy now (a guard installed), for a transport
    /// ending every session of a place (a closed forum topic).
    pub fn busy_keys(&self) -> Vec<SessionKey> {
        self.state().active_sessions.keys().cloned().collect()
    }

    /// How many slots each of the adapter's maps holds (all zero once every
    /// slot is idle and its notices are out: anything else is a leak).
    pub fn map_sizes(&self) -> MapSizes {
        let state = self.state();
        MapSizes {
            guards: state.active_sessions.len(),
            owners: state.session_tasks.len(),
            queues: state.pending.len(),
            acks: state.last_ack.len(),
            notices: state.last_notice.len(),
            refusals: state.refusals.len(),
        }
    }
}

/// Entries of the adapter's per-slot maps ([`Adapter::map_sizes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSizes {
    /// `active_sessions`: slots with a guard.
    pub guards: usize,
    /// `session_tasks`: slots with an owner task recorded.
    pub owners: usize,
    /// Slots with a follow-up queue.
    pub queues: usize,
    /// Slots with a recent acknowledgement.
    pub acks: usize,
    /// Slots with a notice on its way (replies wait for it, to keep order).
    pub notices: usize,
    /// Slots with refusals to report.
    pub refusals: usize,
}

impl MapSizes {
    /// True when every map is empty.
    pub fn is_empty(&self) -> bool {
        *self == MapSizes::default()
    }
}

impl AdapterInner {
    fn state(&self) -> MutexGuard<'_, AdapterState> {
        // Every state change is a handful of inserts/removes done without
        // calling out, so a poisoned lock still holds consistent maps.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deliver `outgoing`. Returns whether it arrived.
    async fn send(&self, to: &SessionSource, outgoing: Outgoing) -> bool {
        let Outgoing { reply, live } = outgoing;
        let result = match live {
            Some(live) => live.finish(reply).await,
            None => self.outbound.deliver(to, reply).await,
        };
        match result {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(chat_id = to.chat_id, %error, "reply could not be delivered");
                false
            }
        }
    }

    /// Deliver the reply to message `message_id` (if any) and record the
    /// message's outcome.
    async fn answer(
        &self,
        to: &SessionSource,
        message_id: Option<i64>,
        outgoing: Option<Outgoing>,
    ) {
        let outcome = self.deliver(to, outgoing).await;
        self.note(to, message_id, outcome);
    }

    /// Deliver `outgoing` (if any); the message's outcome, to be noted.
    async fn deliver(&self, to: &SessionSource, outgoing: Option<Outgoing>) -> EventOutcome {
        match outgoing {
            None => EventOutcome::Dropped("no reply"),
            Some(out) => {
                let failed = out.reply.kind == ReplyKind::Error;
                match (self.send(to, out).await, failed) {
                    (true, false) => EventOutcome::Answered,
                    _ => EventOutcome::Failed,
                }
            }
        }
    }

    fn note(&self, to: &SessionSource, message_id: Option<i64>, outcome: EventOutcome) {
        if let (Some(outcomes), Some(id)) = (&self.outcomes, message_id) {
            outcomes.record(to, id, outcome);
        }
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// After a turn: hand the slot to the next follow-up (with a fresh
    /// guard), or release it. Does nothing if `guard` no longer owns the slot
    /// (a command took over): then the owner entry stays, so that if nobody
    /// else cleans up, the next message sees a stale lock and heals it.
    fn next_or_release(
        &self,
        key: &SessionKey,
        guard: &SessionGuard,
    ) -> Option<(MessageEvent, SessionGuard)> {
        let mut state = self.state();
        if !state.owns(key, guard) {
            return None;
        }
        if let Some(event) = state.pop_pending(key) {
            let next_guard = SessionGuard::new();
            state
                .active_sessions
                .insert(key.clone(), next_guard.clone());
            return Some((event, next_guard));
        }
        state.active_sessions.remove(key);
        let me = tokio::task::try_id();
        if state
            .session_tasks
            .get(key)
            .is_some_and(|owner| Some(owner.id()) == me)
        {
            state.session_tasks.remove(key);
        }
        state.forget_idle(key);
        None
    }
}

/// /stop, /new, /reset for a busy slot: the command guard swaps in (the
/// turn's guard kept to restore or stop); a rotating command takes the
/// queued user messages with it.
fn route_control(
    state: &mut AdapterState,
    key: SessionKey,
    event: MessageEvent,
    rotates: bool,
    queue_depth: usize,
) -> Route {
    let (guard, lease) = SessionGuard::command();
    let previous = state.active_sessions.insert(key.clone(), guard.clone());
    let old_owner = state.session_tasks.get(&key).cloned();
    let discarded = if rotates {
        let taken = state
            .pending
            .get_mut(&key)
            .map(PendingQueue::take_user_messages)
            .unwrap_or_default();
        state.forget_idle(&key);
        taken
    } else {
        Vec::new()
    };
    Route::Command(CommandPath {
        key,
        event,
        previous,
        guard,
        lease,
        old_owner,
        discarded,
        queue_depth,
    })
}

/// Is an acknowledgement due, the last one sent at `last`?
fn ack_due(last: Option<Instant>, now: Instant, interval: Duration) -> bool {
    last.is_none_or(|last| now.duration_since(last) >= interval)
}

/// The acknowledgement of a queued follow-up.
fn follow_up_notice(interrupting: bool, position: usize) -> String {
    if interrupting {
        "⚡ Interrupting the current task…".to_string()
    } else {
        format!("⏳ Queued (position {position})…")
    }
}

/// The line a rotating command adds for the `count` queued messages it
/// dropped; none for none.
/// Said to a user whose waiting messages were dropped with their access.
fn revoked_note(count: usize) -> String {
    let one = count == 1;
    format!(
        "🔒 {count} waiting message{} of yours {} not run: you no longer have access to this bot.",
        if one { "" } else { "s" },
        if one { "was" } else { "were" },
    )
}

fn discarded_note(count: usize) -> Option<String> {
    (count > 0).then(|| {
        let one = count == 1;
        format!(
            "{count} queued message{} from the previous session {} dropped; send {} again if still needed.",
            if one { "" } else { "s" },
            if one { "was" } else { "were" },
            if one { "it" } else { "them" },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{ack_due, discarded_note, follow_up_notice};
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn an_acknowledgement_is_due_first_and_then_once_per_interval() {
        let now = Instant::now();
        let interval = Duration::from_secs(3);
        assert!(ack_due(None, now, interval));
        assert!(!ack_due(Some(now), now + Duration::from_secs(2), interval));
        assert!(ack_due(Some(now), now + interval, interval));
    }

    #[test]
    fn the_follow_up_notice_says_interrupting_or_the_position() {
        assert_eq!(
            follow_up_notice(true, 2),
            "⚡ Interrupting the current task…"
        );
        assert_eq!(follow_up_notice(false, 2), "⏳ Queued (position 2)…");
    }

    #[test]
    fn the_discarded_note_counts_in_singular_and_plural() {
        assert_eq!(discarded_note(0), None);
        assert_eq!(
            discarded_note(1).as_deref(),
            Some("1 queued message from the previous session was dropped; send it again if still needed.")
        );
        assert_eq!(
            discarded_note(3).as_deref(),
            Some("3 queued messages from the previous session were dropped; send them again if still needed.")
        );
    }
}
