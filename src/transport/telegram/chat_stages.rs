//! Each chat's preparation stage ([`crate::media::stage`]) between the
//! dispatcher's handler and the adapter, when media is on.
//!
//! teloxide's dispatcher runs one chat's handlers one at a time, in
//! arrival order; the handler hands each accepted event to
//! [`ChatStages::take`] and returns once the stage took it. A stage whose
//! media is still being prepared (or whose album is still being gathered)
//! has to act when a preparation ends, also while no update comes: a
//! small pump task of the chat, alive only while its stage is busy, waits
//! for that and hands the released events on. Handler and pump take turns
//! at the stage ([`Turns`]: one lock per chat; the pump gives it up as
//! soon as the handler asks and takes it back only once no handler wants
//! it), so the chat's events still reach the stage in order and a control
//! command never waits for a download, only for the step the stage is in.
//!
//! A chat with nothing being prepared has no stage: its events without
//! media go straight to the adapter (what an idle stage would do).
//!
//! This module owns the chats' stages and their pumps. It must never
//! prepare, send or record anything itself (the stage's [`ChatStage`]
//! does), nor await a turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{MutexGuard, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::media::{has_media, ChatStage, IntakeMedia};
use crate::engine::Engine;
use crate::media::stage::PreparationStage;
use crate::vocab::MessageEvent;

/// One chat's stage and the turn-taking around it.
struct Slot {
    stage: Turns<PreparationStage<ChatStage>>,
    /// A pump runs for this stage (changed only under the stage's lock,
    /// or by a pump ending because the intake stops).
    pumping: AtomicBool,
}

/// A value two kinds of task take turns at: handlers, which must get it
/// soon, and a pump, which holds it while it waits for something that may
/// take long and lets go as soon as a handler wants it.
///
/// A handler says it wants the value before it queues for the lock, and
/// the pump takes the lock again only once no handler wants it: a pump
/// woken by a handler that has not queued yet (its thread was descheduled
/// between the two steps) would otherwise win the lock back and wait on
/// with it while the handler waits for it.
struct Turns<T> {
    value: tokio::sync::Mutex<T>,
    /// Handlers between saying they want the value and holding it.
    wanting: AtomicUsize,
    /// Fires whenever `wanting` changes.
    changed: Notify,
}

/// A handler's claim on a [`Turns`], counted until dropped.
struct Wanting<'a, T>(&'a Turns<T>);

impl<T> Drop for Wanting<'_, T> {
    fn drop(&mut self) {
        self.0.wanting.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl<T> Turns<T> {
    fn new(value: T) -> Self {
        Turns {
            value: tokio::sync::Mutex::new(value),
            wanting: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    /// Say a handler wants the value (a pump holding it lets go).
    fn want(&self) -> Wanting<'_, T> {
        self.wanting.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Wanting(self)
    }

    /// The value for a handler: ahead of any pump.
    async fn for_handler(&self) -> MutexGuard<'_, T> {
        let wanting = self.want();
        let guard = self.value.lock().await;
        drop(wanting);
        guard
    }

    /// The value for the pump, once no handler wants it; `None` if `stop`
    /// fires first.
    async fn for_pump(&self, stop: &CancellationToken) -> Option<MutexGuard<'_, T>> {
        loop {
            self.unwanted(stop).await?;
            let guard = tokio::select! {
                guard = self.value.lock() => guard,
                () = stop.cancelled() => return None,
            };
            // A handler may have said so while the pump queued.
            if self.wanting.load(Ordering::SeqCst) == 0 {
                return Some(guard);
            }
        }
    }

    /// Returns once no handler wants the value; `None` if `stop` fires.
    async fn unwanted(&self, stop: &CancellationToken) -> Option<()> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.wanting.load(Ordering::SeqCst) == 0 {
                return Some(());
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = changed => {}
            }
        }
    }

    /// Returns once a handler wants the value (at once if one does).
    async fn wanted(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.wanting.load(Ordering::SeqCst) > 0 {
                return;
            }
            changed.await;
        }
    }
}

/// The stages of the chats with media under way.
pub struct ChatStages {
    engine: Engine,
    io: Arc<ChatStage>,
    slots: Mutex<HashMap<i64, Arc<Slot>>>,
    /// Pumps and the preparations and reports their stages start, so a
    /// shutdown can wait for what they began.
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl ChatStages {
    /// Stages preparing media with `media`, handing events to `engine`;
    /// their tasks run on `tasks`; nothing more is handed on once `stop`
    /// fires.
    pub fn new(
        engine: Engine,
        media: Arc<IntakeMedia>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        ChatStages {
            io: Arc::new(ChatStage::new(engine.clone(), media)),
            engine,
            slots: Mutex::default(),
            tasks,
            stop,
        }
    }

    /// Hand `event` (the next event of its chat, in order) to its chat's
    /// stage; returns once the stage took it.
    pub async fn take(self: &Arc<Self>, event: MessageEvent) {
        let chat = event.source.chat_id;
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            match slots.get(&chat) {
                Some(slot) => Some(slot.clone()),
                // An idle stage hands such an event on at once.
                None if !has_media(&event) => None,
                None => Some(
                    slots
                        .entry(chat)
                        .or_insert_with(|| Arc::new(self.slot()))
                        .clone(),
                ),
            }
        };
        let Some(slot) = slot else {
            self.engine.adapter.handle_message(event).await;
            return;
        };
        {
            let mut stage = slot.stage.for_handler().await;
            stage.take(event).await;
            if !stage.is_idle() && !slot.pumping.swap(true, Ordering::AcqRel) {
                self.tasks.spawn(pump(self.clone(), chat, slot.clone()));
            }
        }
        self.forget_if_idle(chat, slot);
    }

    fn slot(&self) -> Slot {
        Slot {
            stage: Turns::new(PreparationStage::new(self.io.clone(), self.tasks.clone())),
            pumping: AtomicBool::new(false),
        }
    }

    /// Drop the chat's stage if it is idle and nobody else holds it (only
    /// the map does: whoever wants it next must come through the map).
    fn forget_if_idle(&self, chat: i64, slot: Arc<Slot>) {
        drop(slot);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = slots.get(&chat).is_some_and(|slot| {
            Arc::strong_count(slot) == 1 && slot.stage.value.try_lock().is_ok_and(|s| s.is_idle())
        });
        if idle {
            slots.remove(&chat);
            crate::memory::shrink_when_sparse(&mut slots);
        }
    }
}

/// Act for a busy stage while no update comes: a preparation ended, an
/// album is complete. Ends once the stage is idle (or the intake stops).
async fn pump(stages: Arc<ChatStages>, chat: i64, slot: Arc<Slot>) {
    loop {
        let Some(mut stage) = slot.stage.for_pump(&stages.stop).await else {
            slot.pumping.store(false, Ordering::Release);
            break;
        };
        if stage.is_idle() || stages.stop.is_cancelled() {
            slot.pumping.store(false, Ordering::Release);
            break;
        }
        tokio::select! {
            biased;
            () = stages.stop.cancelled() => {
                slot.pumping.store(false, Ordering::Release);
                break;
            }
            // Let the handler have the stage, then come back for it once
            // no handler wants it.
            () = slot.stage.wanted() => {}
            wake = stage.wait() => stage.wake(wake).await,
        }
    }
    stages.forget_if_idle(chat, slot);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::Turns;

    const WAIT: Duration = Duration::from_secs(5);

    /// A pump as `pump` runs one: holds the value, counting its turns,
    /// until a handler wants it (what it waits for otherwise never comes).
    fn spawn_pump(
        turns: &Arc<Turns<u32>>,
        stop: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (turns, stop) = (turns.clone(), stop.clone());
        tokio::spawn(async move {
            while let Some(mut value) = turns.for_pump(&stop).await {
                *value += 1;
                tokio::select! {
                    () = turns.wanted() => {}
                    () = stop.cancelled() => {}
                }
            }
        })
    }

    async fn pump_holds_it(turns: &Turns<u32>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while turns.value.try_lock().is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the pump never took it"
            );
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_handler_descheduled_between_asking_and_queueing_still_gets_the_value() {
        let turns = Arc::new(Turns::new(0));
        let stop = CancellationToken::new();
        let pump = spawn_pump(&turns, &stop);
        pump_holds_it(&turns).await;
        let wanting = turns.want();
        // The handler's thread stops here: the pump, woken, runs again and
        // again before the handler queues for the lock.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        let value = tokio::time::timeout(WAIT, turns.value.lock())
            .await
            .expect("the pump took the value back and kept it");
        drop(wanting);
        assert_eq!(*value, 1, "the pump held it once before the handler");
        drop(value);
        // Once the handler is done, the pump has it again.
        pump_holds_it(&turns).await;
        let value = tokio::time::timeout(WAIT, turns.for_handler())
            .await
            .expect("the pump kept the value from the next handler");
        assert_eq!(*value, 2, "the pump came back for it once");
        drop(value);
        stop.cancel();
        tokio::time::timeout(WAIT, pump).await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handlers_always_get_the_value_from_a_pump_that_waits_with_it() {
        let turns = Arc::new(Turns::new(0));
        let stop = CancellationToken::new();
        let pump = spawn_pump(&turns, &stop);
        for round in 0..500 {
            let handler = async {
                let _value = turns.for_handler().await;
            };
            tokio::time::timeout(WAIT, handler)
                .await
                .unwrap_or_else(|_| panic!("round {round}: the handler never got the value"));
        }
        stop.cancel();
        tokio::time::timeout(WAIT, pump).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_handler_that_gives_up_waiting_lets_the_pump_go_on() {
        let turns = Arc::new(Turns::new(0));
        let stop = CancellationToken::new();
        let held = turns.value.lock().await;
        let pump = spawn_pump(&turns, &stop);
        // A handler asks, then is dropped while it waits for the lock.
        let given_up = tokio::time::timeout(Duration::from_millis(10), turns.for_handler()).await;
        assert!(given_up.is_err());
        drop(held);
        pump_holds_it(&turns).await;
        stop.cancel();
        tokio::time::timeout(WAIT, pump).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn stop_ends_a_pump_waiting_for_a_handler_to_finish() {
        let turns = Arc::new(Turns::new(0));
        let stop = CancellationToken::new();
        let held = turns.for_handler().await;
        let pump = spawn_pump(&turns, &stop);
        let _wanting = turns.want();
        stop.cancel();
        tokio::time::timeout(WAIT, pump).await.unwrap().unwrap();
        drop(held);
    }
}
