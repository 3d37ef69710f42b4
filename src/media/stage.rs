//! The preparation stage: one chat's recorded events, in arrival order, on
//! their way to the session, with media prepared off the chat's queue.
//!
//! Whatever hands it one chat's events in order (today the Telegram
//! dispatcher's handler, with a pump for the wakes: `transport::telegram`'s
//! `chat_stages`) calls [`PreparationStage::take`] for each, and
//! [`PreparationStage::wait`] / [`PreparationStage::wake`] while it is not
//! idle. Each event goes one of the ways [`lane_of`] names:
//!
//! * **control** (/stop, /new, /reset) goes on at once, after cancelling
//!   the preparations of its slot (their messages are reported stopped);
//!   /new and /reset also take out the slot's events waiting behind them
//!   (reported dropped, like the adapter's queue);
//! * **immediate** (/status and the other commands answered mid-turn, an
//!   answer to a pending approval) goes on at once: control is never
//!   behind a preparation;
//! * **ordered** (an ordinary message, /retry, /undo) goes on once every
//!   preparation before it in its slot is finished
//!   ([`super::order::ReleaseOrder`]), so a slot's messages reach the
//!   session in arrival order;
//! * **prepare** (a message with media) is prepared in its own task, with
//!   its own cancellation; album parts are gathered first (up to the album
//!   window after each part; any other event ends the album).
//!
//! The stage never prepares, sends or records anything itself: its
//! [`StageIo`] does (and bounds the time a preparation takes). It never
//! awaits a preparation before taking the next event.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::album::{merge, same_album};
use super::order::{ReleaseOrder, Ticket};
use crate::vocab::{KnownCommand, MessageEvent, SessionKey};

/// How an event goes through the stage (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// /stop, /new, /reset: on at once, stopping the slot's preparations;
    /// `rotates` (/new, /reset) also drops what waits behind them.
    Control {
        /// A new session starts.
        rotates: bool,
    },
    /// On at once, never behind a preparation.
    Immediate,
    /// On after the slot's earlier preparations.
    Ordered,
    /// Prepared first.
    Prepare,
}

/// The lane of `event`. `needs_preparing`: it carries media; `claimed`:
/// asked only for a plain message, whether it answers a pending approval.
pub fn lane_of(
    event: &MessageEvent,
    needs_preparing: bool,
    claimed: impl FnOnce() -> bool,
) -> Lane {
    if needs_preparing {
        return Lane::Prepare;
    }
    if event.internal {
        return Lane::Ordered;
    }
    match event.command() {
        Some(command) if command.is_control() => Lane::Control {
            rotates: command.rotates(),
        },
        // They act on the conversation's last exchange: the messages sent
        // before them must be in it first.
        Some(command)
            if matches!(
                command.known,
                Some(KnownCommand::Retry | KnownCommand::Undo)
            ) =>
        {
            Lane::Ordered
        }
        Some(_) => Lane::Immediate,
        None if claimed() => Lane::Immediate,
        None => Lane::Ordered,
    }
}

/// How one preparation ended.
#[derive(Debug)]
pub enum Preparation {
    /// Prepared: hand it on (in order).
    Ready(MessageEvent),
    /// Nothing to hand on: refused or stopped, and reported (the user
    /// told, its inbox rows closed).
    Closed,
    /// Cut short by a shutdown: left unfinished for the next start, and
    /// nothing behind it may go on.
    Abandoned,
    /// The preparation panicked: nothing to hand on, and the message is
    /// still to be reported (its sender told, its rows closed), or it
    /// would be lost silently (or panic again after every restart).
    Failed(Box<MessageEvent>),
}

/// What the stage needs from its surroundings.
pub trait StageIo: Send + Sync + 'static {
    /// The slot `event` belongs to.
    fn slot(&self, event: &MessageEvent) -> SessionKey;
    /// Its lane ([`lane_of`]).
    fn lane(&self, event: &MessageEvent) -> Lane;
    /// How long to wait for an album's next part.
    fn album_window(&self) -> Duration;
    /// Prepare `event` (an album already gathered), within a bounded time.
    /// When `cancel` fires it ends soon, having reported the message as
    /// stopped ([`Preparation::Closed`]).
    fn prepare(
        self: Arc<Self>,
        event: MessageEvent,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Preparation>;
    /// `event` was stopped after its preparation finished: tell its sender
    /// and close its inbox rows.
    fn report_stopped(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()>;
    /// Preparing `event` failed unexpectedly (it panicked): tell its
    /// sender and close its inbox rows.
    fn report_failed(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()>;
    /// `events` waited behind a preparation when a new session started:
    /// tell their sender and close their inbox rows.
    fn report_dropped(self: Arc<Self>, events: Vec<MessageEvent>) -> BoxFuture<'static, ()>;
    /// Hand `event` to the session (the adapter). Returns once it is
    /// routed (a control command: once it is answered).
    fn hand_on(&self, event: MessageEvent) -> BoxFuture<'_, ()>;
}

/// What [`PreparationStage::wait`] saw.
#[derive(Debug)]
pub enum Wake {
    /// A preparation ended.
    Prepared(Ticket, Preparation),
    /// The album being gathered had no next part within the window.
    AlbumDue,
}

/// An album whose parts are still arriving.
struct Gathering {
    ticket: Ticket,
    album: MessageEvent,
    due: Instant,
}

/// One chat's preparation stage (see the module documentation).
pub struct PreparationStage<Io: StageIo> {
    io: Arc<Io>,
    order: ReleaseOrder<SessionKey, MessageEvent>,
    cancels: HashMap<Ticket, CancellationToken>,
    gathering: Option<Gathering>,
    done_tx: mpsc::UnboundedSender<(Ticket, Preparation)>,
    done_rx: mpsc::UnboundedReceiver<(Ticket, Preparation)>,
    tasks: TaskTracker,
}

impl<Io: StageIo> PreparationStage<Io> {
    /// A stage whose preparations and reports run on `tasks` (so a
    /// shutdown can wait for them).
    pub fn new(io: Arc<Io>, tasks: TaskTracker) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        PreparationStage {
            io,
            order: ReleaseOrder::default(),
            cancels: HashMap::new(),
            gathering: None,
            done_tx,
            done_rx,
            tasks,
        }
    }

    /// Nothing is being gathered, prepared or waiting.
    pub fn is_idle(&self) -> bool {
        self.gathering.is_none() && self.order.is_empty()
    }

    /// Take the chat's next event.
    pub async fn take(&mut self, mut event: MessageEvent) {
        let lane = self.io.lane(&event);
        if let Some(gathering) = &mut self.gathering {
            if lane == Lane::Prepare && same_album(&gathering.album, &event) {
                merge(&mut gathering.album, event);
                gathering.due = Instant::now() + self.io.album_window();
                return;
            }
        }
        // Anything else ends the album being gathered.
        self.close_album();
        let slot = self.io.slot(&event);
        match lane {
            Lane::Control { rotates } => {
                let stopped = self.order.stop(&slot);
                for ticket in &stopped {
                    if let Some(cancel) = self.cancels.get(ticket) {
                        cancel.cancel();
                    }
                }
                if rotates {
                    let dropped = self.order.take_waiting(&slot, |e| e.internal);
                    if !dropped.is_empty() {
                        self.tasks.spawn(self.io.clone().report_dropped(dropped));
                    }
                }
                event.media.stopped = stopped.len();
                self.io.hand_on(event).await;
            }
            Lane::Immediate => self.io.hand_on(event).await,
            Lane::Ordered => {
                if let Some(event) = self.order.ordered(slot, event) {
                    self.io.hand_on(event).await;
                }
            }
            Lane::Prepare => {
                let ticket = self.order.preparing(slot);
                if event.media.group.is_some() {
                    let due = Instant::now() + self.io.album_window();
                    self.gathering = Some(Gathering {
                        ticket,
                        album: event,
                        due,
                    });
                } else {
                    self.launch(ticket, event);
                }
            }
        }
    }

    /// The next thing to act on: a preparation ended, or an album is
    /// complete. Cancel-safe; never ready while the stage is idle.
    pub async fn wait(&mut self) -> Wake {
        let album_due = self.gathering.as_ref().map(|g| g.due);
        let album = async {
            match album_due {
                Some(due) => tokio::time::sleep_until(due).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = self.done_rx.recv() => match done {
                Some((ticket, prepared)) => Wake::Prepared(ticket, prepared),
                // The stage holds a sender: never closed.
                None => std::future::pending().await,
            },
            () = album => Wake::AlbumDue,
        }
    }

    /// Act on what [`PreparationStage::wait`] saw.
    pub async fn wake(&mut self, wake: Wake) {
        match wake {
            Wake::AlbumDue => self.close_album(),
            Wake::Prepared(_, Preparation::Abandoned) => {}
            Wake::Prepared(ticket, prepared) => {
                self.cancels.remove(&ticket);
                let event = match prepared {
                    Preparation::Ready(event) => Some(event),
                    Preparation::Failed(event) => {
                        self.tasks.spawn(self.io.clone().report_failed(*event));
                        None
                    }
                    Preparation::Closed | Preparation::Abandoned => None,
                };
                let finished = self.order.prepared(ticket, event);
                if let Some(stopped) = finished.stopped {
                    self.tasks.spawn(self.io.clone().report_stopped(stopped));
                }
                for event in finished.released {
                    self.io.hand_on(event).await;
                }
            }
        }
    }

    /// Start preparing the album being gathered, if any.
    fn close_album(&mut self) {
        if let Some(gathering) = self.gathering.take() {
            self.launch(gathering.ticket, gathering.album);
        }
    }

    fn launch(&mut self, ticket: Ticket, event: MessageEvent) {
        let cancel = CancellationToken::new();
        self.cancels.insert(ticket, cancel.clone());
        let io = self.io.clone();
        let done = self.done_tx.clone();
        // Kept to report the message should its preparation panic.
        let copy = event.clone();
        self.tasks.spawn(async move {
            let prepared = AssertUnwindSafe(io.prepare(event, cancel))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    // What waits behind it must not wait forever, and its
                    // sender is told (a replay would only panic again).
                    tracing::error!("preparing a message panicked");
                    Preparation::Failed(Box::new(copy))
                });
            // A stage dropped meanwhile (a shutdown) no longer listens.
            let _ = done.send((ticket, prepared));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{Platform, SessionSource};
    use std::sync::Mutex;
    use tokio::sync::Notify;

    /// Prepares by waiting for the test's go per message id; records what
    /// it was handed and what it reported.
    #[derive(Default)]
    struct FakeIo {
        handed: Mutex<Vec<String>>,
        stopped: Mutex<Vec<i64>>,
        dropped: Mutex<Vec<i64>>,
        failed: Mutex<Vec<i64>>,
        go: Mutex<HashMap<i64, Arc<Notify>>>,
        prepared: Mutex<Vec<Vec<i64>>>,
    }

    impl FakeIo {
        fn gate(&self, id: i64) -> Arc<Notify> {
            self.go.lock().unwrap().entry(id).or_default().clone()
        }
        fn handed(&self) -> Vec<String> {
            self.handed.lock().unwrap().clone()
        }
    }

    impl StageIo for FakeIo {
        fn slot(&self, event: &MessageEvent) -> SessionKey {
            SessionKey::from_raw(format!("user{}", event.source.user_id.unwrap_or(0)))
        }
        fn lane(&self, event: &MessageEvent) -> Lane {
            lane_of(event, event.text.starts_with("media"), || {
                event.text == "yes"
            })
        }
        fn album_window(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn prepare(
            self: Arc<Self>,
            event: MessageEvent,
            cancel: CancellationToken,
        ) -> BoxFuture<'static, Preparation> {
            Box::pin(async move {
                let id = event.message_id.unwrap_or_default();
                let mut ids = vec![id];
                ids.extend(event.media.merged.iter().copied());
                self.prepared.lock().unwrap().push(ids);
                if event.text.contains("panic") {
                    panic!("a broken preparation");
                }
                let gate = self.gate(id);
                tokio::select! {
                    () = gate.notified() => {}
                    () = cancel.cancelled() => {
                        self.stopped.lock().unwrap().push(id);
                        return Preparation::Closed;
                    }
                }
                let mut event = event;
                event.text = format!("prepared {}", event.text);
                Preparation::Ready(event)
            })
        }
        fn report_stopped(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                self.stopped.lock().unwrap().push(event.message_id.unwrap());
            })
        }
        fn report_failed(self: Arc<Self>, event: MessageEvent) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                let mut failed = self.failed.lock().unwrap();
                failed.extend(event.message_id);
            })
        }
        fn report_dropped(self: Arc<Self>, events: Vec<MessageEvent>) -> BoxFuture<'static, ()> {
            Box::pin(async move {
                let mut dropped = self.dropped.lock().unwrap();
                dropped.extend(events.iter().filter_map(|e| e.message_id));
            })
        }
        fn hand_on(&self, event: MessageEvent) -> BoxFuture<'_, ()> {
            let note = if event.media.stopped > 0 {
                format!("{} (stopped {})", event.text, event.media.stopped)
            } else {
                event.text.clone()
            };
            self.handed.lock().unwrap().push(note);
            Box::pin(async {})
        }
    }

    fn event(user: u64, id: i64, text: &str) -> MessageEvent {
        let mut source = SessionSource::dm(Platform::Telegram, 1);
        source.user_id = Some(user);
        MessageEvent::text(source, text).with_message_id(id)
    }

    fn album_part(id: i64) -> MessageEvent {
        let mut part = event(1, id, &format!("media part {id}"));
        part.media.group = Some("g".into());
        part
    }

    fn stage() -> (PreparationStage<FakeIo>, Arc<FakeIo>) {
        let io = Arc::new(FakeIo::default());
        (PreparationStage::new(io.clone(), TaskTracker::new()), io)
    }

    /// Let the stage act on everything due, until it is idle or `until`.
    async fn settle(stage: &mut PreparationStage<FakeIo>, until: impl Fn() -> bool) {
        while !stage.is_idle() && !until() {
            let wake = stage.wait().await;
            stage.wake(wake).await;
        }
    }

    #[tokio::test]
    async fn control_goes_on_while_a_preparation_hangs_and_messages_keep_their_order() {
        let (mut stage, io) = stage();
        stage.take(event(1, 1, "media voice")).await;
        stage.take(event(1, 2, "after the voice")).await;
        stage.take(event(1, 3, "/status")).await;
        stage.take(event(1, 4, "yes")).await;
        stage.take(event(2, 5, "another user")).await;
        // The preparation still hangs: only what may pass it went on.
        assert_eq!(io.handed(), ["/status", "yes", "another user"]);
        assert!(!stage.is_idle());
        io.gate(1).notify_one();
        settle(&mut stage, || false).await;
        assert_eq!(
            io.handed(),
            [
                "/status",
                "yes",
                "another user",
                "prepared media voice",
                "after the voice"
            ]
        );
    }

    #[tokio::test]
    async fn stop_cancels_the_preparation_and_what_waited_goes_on_after_the_stop() {
        let (mut stage, io) = stage();
        stage.take(event(1, 1, "media voice")).await;
        stage.take(event(1, 2, "queued")).await;
        stage.take(event(1, 3, "/stop")).await;
        assert_eq!(io.handed(), ["/stop (stopped 1)"]);
        settle(&mut stage, || false).await;
        assert_eq!(*io.stopped.lock().unwrap(), [1]);
        assert_eq!(io.handed(), ["/stop (stopped 1)", "queued"]);
    }

    #[tokio::test]
    async fn a_new_session_drops_what_waited_behind_the_stopped_preparation() {
        let (mut stage, io) = stage();
        stage.take(event(1, 1, "media voice")).await;
        stage.take(event(1, 2, "old session")).await;
        stage.take(event(1, 3, "/undo")).await;
        stage.take(event(1, 4, "/new")).await;
        stage.take(event(1, 5, "new session")).await;
        settle(&mut stage, || false).await;
        assert_eq!(*io.stopped.lock().unwrap(), [1]);
        // Reports run on the tracker; let them finish.
        stage.tasks.close();
        stage.tasks.wait().await;
        assert_eq!(*io.dropped.lock().unwrap(), [2, 3]);
        assert_eq!(io.handed(), ["/new (stopped 1)", "new session"]);
    }

    #[tokio::test]
    async fn a_stop_with_nothing_being_prepared_stops_nothing_here() {
        let (mut stage, io) = stage();
        stage.take(event(1, 1, "hello")).await;
        stage.take(event(1, 2, "/stop")).await;
        assert_eq!(io.handed(), ["hello", "/stop"]);
        assert!(stage.is_idle());
    }

    #[tokio::test]
    async fn a_stop_in_one_slot_leaves_another_slots_preparation_alone() {
        let (mut stage, io) = stage();
        stage.take(event(2, 1, "media of user 2")).await;
        stage.take(event(1, 2, "/stop")).await;
        assert_eq!(io.handed(), ["/stop"]);
        io.gate(1).notify_one();
        settle(&mut stage, || false).await;
        assert!(io.stopped.lock().unwrap().is_empty());
        assert_eq!(io.handed(), ["/stop", "prepared media of user 2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn album_parts_become_one_preparation_and_another_event_ends_the_album() {
        let (mut stage, io) = stage();
        stage.take(album_part(1)).await;
        tokio::time::advance(Duration::from_millis(60)).await;
        stage.take(album_part(2)).await;
        // Within the window of the last part, not of the first.
        tokio::time::advance(Duration::from_millis(60)).await;
        stage.take(album_part(3)).await;
        stage.take(event(1, 4, "after the album")).await;
        tokio::task::yield_now().await;
        assert_eq!(*io.prepared.lock().unwrap(), [vec![1, 2, 3]]);
        assert!(io.handed().is_empty());
        io.gate(1).notify_one();
        settle(&mut stage, || false).await;
        assert_eq!(
            io.handed(),
            [
                "prepared media part 1\n\nmedia part 2\n\nmedia part 3",
                "after the album"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_album_is_prepared_once_its_window_passes() {
        let (mut stage, io) = stage();
        stage.take(album_part(1)).await;
        let wake = stage.wait().await;
        assert!(matches!(wake, Wake::AlbumDue));
        stage.wake(wake).await;
        io.gate(1).notify_one();
        settle(&mut stage, || false).await;
        assert_eq!(io.handed(), ["prepared media part 1"]);
    }

    #[tokio::test]
    async fn a_panicking_preparation_does_not_hold_up_the_messages_behind_it() {
        let (mut stage, io) = stage();
        stage.take(event(1, 1, "media panic")).await;
        stage.take(event(1, 2, "still answered")).await;
        settle(&mut stage, || false).await;
        assert_eq!(io.handed(), ["still answered"]);
        // Its sender is told; it is neither lost silently nor handed on.
        stage.tasks.close();
        stage.tasks.wait().await;
        assert_eq!(*io.failed.lock().unwrap(), [1]);
    }

    #[test]
    fn lanes_follow_what_the_event_is() {
        let lane = |text: &str| lane_of(&event(1, 1, text), false, || text == "yes");
        assert_eq!(lane("/stop"), Lane::Control { rotates: false });
        assert_eq!(lane("/new"), Lane::Control { rotates: true });
        assert_eq!(lane("/RESET"), Lane::Control { rotates: true });
        for immediate in ["/status", "/help", "/approve", "/model x", "/nope", "yes"] {
            assert_eq!(lane(immediate), Lane::Immediate, "{immediate}");
        }
        for ordered in ["hello", "/retry", "/undo", "no"] {
            assert_eq!(lane(ordered), Lane::Ordered, "{ordered}");
        }
        assert_eq!(
            lane_of(&event(1, 1, "/stop"), true, || false),
            Lane::Prepare,
            "media with a caption is prepared like any media"
        );
        let wakeup = MessageEvent::internal(SessionSource::dm(Platform::Telegram, 1), "/stop");
        assert_eq!(lane_of(&wakeup, false, || true), Lane::Ordered);
    }
}
