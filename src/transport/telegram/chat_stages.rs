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
//! at the stage (one lock per chat; the pump gives it up as soon as the
//! handler asks), so the chat's events still reach the stage in order and
//! a control command never waits for a download, only for the step the
//! stage is in.
//!
//! A chat with nothing being prepared has no stage: its events without
//! media go straight to the adapter (what an idle stage would do).
//!
//! This module owns the chats' stages and their pumps. It must never
//! prepare, send or record anything itself (the stage's [`ChatStage`]
//! does), nor await a turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::media::{has_media, ChatStage, IntakeMedia};
use crate::engine::Engine;
use crate::media::stage::PreparationStage;
use crate::vocab::MessageEvent;

/// One chat's stage and the turn-taking around it.
struct Slot {
    stage: tokio::sync::Mutex<PreparationStage<ChatStage>>,
    /// The handler wants the stage: a waiting pump lets go of it.
    wanted: Notify,
    /// A pump runs for this stage (changed only under the stage's lock).
    pumping: AtomicBool,
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
        slot.wanted.notify_one();
        {
            let mut stage = slot.stage.lock().await;
            stage.take(event).await;
            if !stage.is_idle() && !slot.pumping.swap(true, Ordering::AcqRel) {
                self.tasks.spawn(pump(self.clone(), chat, slot.clone()));
            }
        }
        self.forget_if_idle(chat, slot);
    }

    fn slot(&self) -> Slot {
        Slot {
            stage: tokio::sync::Mutex::new(PreparationStage::new(
                self.io.clone(),
                self.tasks.clone(),
            )),
            wanted: Notify::new(),
            pumping: AtomicBool::new(false),
        }
    }

    /// Drop the chat's stage if it is idle and nobody else holds it (only
    /// the map does: whoever wants it next must come through the map).
    fn forget_if_idle(&self, chat: i64, slot: Arc<Slot>) {
        drop(slot);
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let idle = slots.get(&chat).is_some_and(|slot| {
            Arc::strong_count(slot) == 1 && slot.stage.try_lock().is_ok_and(|s| s.is_idle())
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
        let mut stage = slot.stage.lock().await;
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
            // Let the handler have the stage (the lock is fair: it is
            // next), then come back for it.
            () = slot.wanted.notified() => {}
            wake = stage.wait() => stage.wake(wake).await,
        }
    }
    stages.forget_if_idle(chat, slot);
}
