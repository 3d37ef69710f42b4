//! Intake: every update is written to the inbox, then fed to the
//! dispatcher.
//!
//! The one rule that makes restarts safe: an update is recorded in the store
//! *before* it is confirmed to Telegram (the next `getUpdates` offset, or the
//! webhook's 200). A crash after that point loses nothing: the restart finds
//! the row and resumes it. A redelivered update finds its row and is ignored
//! here, so it never reaches the dispatcher and can never start a second
//! turn.
//!
//! The polling loop ([`super::polling`]) and the webhook ([`super::webhook`])
//! hand each raw update to [`Intake::take_batch`] / [`Intake::take`]: it is
//! read and classified ([`super::inbound::classify`]), recorded (a polled
//! batch's messages in one store call), and only a new row is fed to the
//! inbox listener ([`super::inbox_listener`]) that teloxide's dispatcher
//! takes its updates from ([`super::dispatch`]: one chat's updates in
//! order, chats concurrently, presses at once). Button presses are
//! recorded by the callback handler and fed the same way. Telegram's draft
//! stop, which teloxide cannot carry, is recorded and carried out here,
//! off every chat's queue.
//!
//! After a restart, [`Intake::recover`] goes through the unfinished rows
//! in order before the first live update: what needs no turn is finished
//! here (an answer already sent, an ambiguous send, a message the restart
//! interrupted), the rest is fed to the same listener, first in line.
//!
//! This module owns recording, classification and recovery. It must never
//! confirm an update it could not record, and never await a turn.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use teloxide::types::{CallbackQuery, Update, UpdateId, UpdateKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::callback::{CallbackHandler, DraftStop};
use super::chat_stages::ChatStages;
use super::dispatch::{self, Dispatching, Routes};
use super::inbound::{classify, Inbound, InboundPolicy};
use super::inbox_listener::Feed;
use super::inbox_writer::wakeup_from_payload;
use super::media::IntakeMedia;
use super::parse::{parse_guarded, parse_update, parse_update_text, RawUpdate};
use super::redact::{redact, Redacted};
use super::strangers::Strangers;
use super::topics::Topics;
use super::TransportTables;
use crate::delivery::answer::{deliver_notice_until_confirmed, AMBIGUOUS_SEND};
use crate::delivery::{ChatTarget, Delivery};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::reply::Reply;
use crate::store::InboxEntry;
use crate::store::{NewUpdate, StoreError};
use crate::vocab::{InboxState, MessageEvent, Origin, SessionSource};

/// What the sender of a message is told when the answer's send was cut
/// off by a restart (it may or may not have arrived; it is not sent again).
pub const AMBIGUOUS_SEND_NOTICE: &str =
    "⚠️ telegate restarted while sending the answer to this message, \
     so it may not have arrived. If you don't see it, please send your message again.";

/// How often one stranger is told their id at most.
const STRANGER_INTERVAL: Duration = Duration::from_secs(600);

/// What happened to one update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intook {
    /// Recorded and handed on (to the dispatcher).
    Accepted,
    /// Recorded as not for us (ignored, stranger, malformed).
    Ignored,
    /// Already recorded before: a redelivery, ignored.
    Duplicate,
}

/// An update read and classified, not recorded yet.
enum Sorted {
    /// No integer `update_id`: ignored (nothing to record it under).
    Unkeyed,
    /// A button press or a draft stop (its update id): the callback handler
    /// records it.
    Control(i64),
    /// Anything else: one inbox row, then the verdict is acted on.
    Plain(Box<PlainUpdate>),
}

/// A message (or an update recorded only to be dropped) and what to do
/// with it once recorded.
struct PlainUpdate {
    row: NewUpdate,
    /// The update as teloxide reads it (none: malformed).
    update: Option<Update>,
    verdict: Inbound,
    /// A pairing or invite code seen outside a private chat: void before
    /// the update is recorded (anyone in the chat could use it).
    exposed: Option<String>,
}

/// The dispatcher of an intake, started on first use.
struct Started {
    feed: Feed,
    dispatching: Mutex<Option<Dispatching>>,
}

/// Records updates and feeds them to its dispatcher.
#[derive(Clone)]
pub struct Intake {
    engine: Engine,
    delivery: Delivery,
    store: TransportTables,
    policy: Arc<InboundPolicy>,
    strangers: Arc<Strangers>,
    resume_interrupted: bool,
    metrics: Metrics,
    media: Option<Arc<IntakeMedia>>,
    callbacks: Option<Arc<CallbackHandler>>,
    topics: Option<Arc<Topics>>,
    stop: CancellationToken,
    /// Shared by the clones of one intake: one dispatcher for all of them.
    started: Arc<OnceLock<Started>>,
}

impl Intake {
    /// An intake feeding `engine`.
    pub fn new(
        engine: Engine,
        delivery: Delivery,
        store: TransportTables,
        policy: InboundPolicy,
        resume_interrupted: bool,
        metrics: Metrics,
    ) -> Self {
        Intake {
            engine,
            strangers: Arc::new(Strangers::new(delivery.clone(), STRANGER_INTERVAL)),
            delivery,
            store,
            policy: Arc::new(policy),
            resume_interrupted,
            metrics,
            media: None,
            callbacks: None,
            topics: None,
            stop: CancellationToken::new(),
            started: Arc::default(),
        }
    }

    /// Place messages in forum topics (`[telegram] topics`: `auto` creates
    /// them; a closed topic ends its sessions).
    pub fn with_topics(mut self, topics: Arc<Topics>) -> Self {
        self.topics = Some(topics);
        self
    }

    /// The counters this intake records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Prepare photos, voice and documents before they reach the adapter.
    /// (Like the other settings: before the intake takes its first update,
    /// which starts its dispatcher.)
    pub fn with_media(mut self, media: IntakeMedia) -> Self {
        self.media = Some(Arc::new(media));
        self.started = Arc::default();
        self
    }

    /// Let `handler` carry out button presses (without one they are
    /// recorded as not handled).
    pub fn with_callbacks(mut self, handler: Arc<CallbackHandler>) -> Self {
        self.callbacks = Some(handler);
        self.started = Arc::default();
        self
    }

    /// Stop handing anything on once `stop` fires (the bot's shutdown):
    /// what is left stays unfinished in the inbox for the next start.
    pub fn with_stop(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self.started = Arc::default();
        self
    }

    /// Start this intake's dispatcher (if taking an update has not
    /// already) and, once it listens, hand over what shuts it down; `None`
    /// once handed over.
    pub async fn dispatching(&self) -> Option<Dispatching> {
        let started = self.started();
        started.feed.listening().await;
        started
            .dispatching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn started(&self) -> &Started {
        self.started.get_or_init(|| self.start())
    }

    /// The feed, its listener and teloxide's dispatcher over it.
    fn start(&self) -> Started {
        let (feed, listener) = Feed::new(self.stop.clone());
        let tasks = TaskTracker::new();
        let stages = self.media.as_ref().map(|media| {
            Arc::new(ChatStages::new(
                self.engine.clone(),
                media.clone(),
                tasks.clone(),
                self.stop.clone(),
            ))
        });
        let routes = Routes {
            engine: self.engine.clone(),
            policy: self.policy.clone(),
            strangers: self.strangers.clone(),
            callbacks: self.callbacks.clone(),
            topics: self.topics.clone(),
            tasks: tasks.clone(),
            stages,
            verdicts: feed.verdicts(),
            progress: feed.progress(),
            stop: self.stop.clone(),
        };
        let bot = self.delivery.bot().clone();
        let dispatching = dispatch::spawn(bot, Arc::new(routes), listener, tasks);
        Started {
            feed,
            dispatching: Mutex::new(Some(dispatching)),
        }
    }

    fn feed(&self) -> &Feed {
        &self.started().feed
    }

    /// Record one raw update and hand it on. An error means the update was
    /// NOT recorded and must not be confirmed to Telegram.
    pub async fn take(&self, raw: impl Into<RawUpdate>) -> Result<Intook, StoreError> {
        let raw = raw.into();
        match self.sort(&raw) {
            Sorted::Unkeyed => Ok(Intook::Ignored),
            Sorted::Control(update_id) => self.take_control(update_id, &raw).await,
            Sorted::Plain(plain) => Ok(self
                .record_plain(vec![*plain])
                .await?
                .pop()
                .unwrap_or(Intook::Ignored)),
        }
    }

    /// Record a whole batch of raw updates and hand each on, in order: the
    /// messages between two button presses (or draft stops) share one
    /// store call. An error means some of them may not be recorded: none
    /// of the batch may be confirmed to Telegram, and taking the batch
    /// again is safe (what was recorded is then a duplicate, not handed on
    /// twice).
    pub async fn take_batch(&self, raws: &[RawUpdate]) -> Result<(), StoreError> {
        let mut plain = Vec::new();
        for raw in raws {
            match self.sort(raw) {
                Sorted::Unkeyed => {}
                Sorted::Plain(update) => plain.push(*update),
                Sorted::Control(update_id) => {
                    // Keep the batch's order: what came before it first.
                    self.record_plain(std::mem::take(&mut plain)).await?;
                    self.take_control(update_id, raw).await?;
                }
            }
        }
        self.record_plain(plain).await?;
        Ok(())
    }

    /// Read and classify one raw update (no I/O).
    fn sort(&self, raw: &RawUpdate) -> Sorted {
        let head = raw.head();
        let Some(update_id) = head.id else {
            tracing::warn!("an update without update_id was ignored");
            return Sorted::Unkeyed;
        };
        if self.callbacks.is_some()
            && (head.callback_query
                || (head.draft_stop && DraftStop::parse(&raw.to_value()).is_some()))
        {
            return Sorted::Control(update_id);
        }
        let update = parse_update_text(raw.text());
        // A code is cut out of what is recorded (see `redact`).
        let (payload, code) = match update.as_ref().and_then(|u| redact(raw.text(), u)) {
            Some(Redacted { payload, code }) => (payload, Some(code)),
            None => (raw.text().to_owned(), None),
        };
        let exposed = code.filter(|_| {
            update
                .as_ref()
                .and_then(Update::chat)
                .is_some_and(|chat| !chat.is_private())
        });
        let message = update.as_ref().and_then(|u| match &u.kind {
            UpdateKind::Message(message) => Some(message),
            _ => None,
        });
        let chat_id = update
            .as_ref()
            .and_then(Update::chat)
            .map_or(0, |chat| chat.id.0);
        let message_id = message.map(|m| i64::from(m.id.0));
        let verdict = match message {
            Some(message) => classify(message, &self.policy),
            None => Inbound::Ignore(match update.as_ref().map(|u| &u.kind) {
                None | Some(UpdateKind::Error(_)) => "malformed or unknown update",
                Some(_) => "update kind not handled",
            }),
        };
        let (state, reason) = match &verdict {
            Inbound::Accept(_) => (InboxState::Received, None),
            Inbound::Stranger { .. } => (InboxState::Dropped, Some("sender not allowed")),
            Inbound::Redeem { .. } => (InboxState::Dropped, Some("access code")),
            Inbound::TopicClosed { .. } => (InboxState::Dropped, Some("forum topic closed")),
            Inbound::Ignore(reason) => (InboxState::Dropped, Some(*reason)),
        };
        Sorted::Plain(Box::new(PlainUpdate {
            row: NewUpdate {
                update_id,
                chat_id,
                message_id,
                payload,
                state,
                reason: reason.map(str::to_string),
            },
            update,
            verdict,
            exposed,
        }))
    }

    /// A button press or a draft stop: recorded by the callback handler;
    /// a press is then fed to the dispatcher, a draft stop carried out
    /// here (teloxide cannot carry it).
    async fn take_control(&self, update_id: i64, update: &RawUpdate) -> Result<Intook, StoreError> {
        let Some(handler) = &self.callbacks else {
            return Ok(Intook::Ignored);
        };
        // Read whole: the handler records (and reads) it as a tree.
        let raw = update.to_value();
        // Telegram's stop control on a streamed draft: a control like a
        // button press (teloxide-core 0.13 does not know this update).
        let new = if let Some(stop) = DraftStop::parse(&raw) {
            handler.take_draft_stop(update_id, raw, stop).await?
        } else {
            // Read on its own (as recovery reads it from the row), then
            // the update made around it for the dispatcher.
            let press = raw
                .get("callback_query")
                .and_then(parse_guarded::<CallbackQuery>)
                .and_then(|query| Some((as_update_id(update_id)?, query)));
            match press {
                Some((id, query)) => {
                    let chat_id = query.message.as_ref().map_or(0, |m| m.chat().id.0);
                    let new = handler.record(update_id, chat_id, raw).await?;
                    if new {
                        let kind = UpdateKind::CallbackQuery(query);
                        self.feed().send(Update { id, kind }, None);
                    }
                    new
                }
                // Not a button press teloxide can read: recorded as one.
                None => {
                    let row = NewUpdate {
                        update_id,
                        chat_id: 0,
                        message_id: None,
                        payload: update.text().to_owned(),
                        state: InboxState::Dropped,
                        reason: Some("malformed or unknown update".to_string()),
                    };
                    let verdict = Inbound::Ignore("malformed or unknown update");
                    let plain = PlainUpdate {
                        row,
                        update: None,
                        verdict,
                        exposed: None,
                    };
                    return Ok(self
                        .record_plain(vec![plain])
                        .await?
                        .pop()
                        .unwrap_or(Intook::Ignored));
                }
            }
        };
        if !new {
            self.metrics.updates_duplicate.inc();
            return Ok(Intook::Duplicate);
        }
        self.metrics.updates_received.inc();
        Ok(Intook::Accepted)
    }

    /// Record `updates` in one store call, then feed each new one on, in
    /// order.
    async fn record_plain(&self, updates: Vec<PlainUpdate>) -> Result<Vec<Intook>, StoreError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = Vec::with_capacity(updates.len());
        let mut rest = Vec::with_capacity(updates.len());
        for PlainUpdate {
            row,
            update,
            verdict,
            exposed,
        } in updates
        {
            if let Some(code) = exposed {
                self.void_exposed(&code).await;
            }
            rows.push(row);
            rest.push((update, verdict));
        }
        let ids: Vec<i64> = rows.iter().map(|row| row.update_id).collect();
        let fresh = self.store.inbox.record_updates(rows).await?;
        let mut taken = Vec::with_capacity(rest.len());
        for (((update, verdict), new), update_id) in rest.into_iter().zip(fresh).zip(ids) {
            if !new {
                tracing::info!(
                    update_id,
                    "update delivered again; already recorded, ignored"
                );
                self.metrics.updates_duplicate.inc();
                taken.push(Intook::Duplicate);
                continue;
            }
            self.metrics.updates_received.inc();
            taken.push(self.hand_on(update, verdict));
        }
        Ok(taken)
    }

    /// A code posted where others read it (a group) works no more: voided
    /// before its update is recorded, so a crash in between leaves it
    /// void (a redelivery voids it again, harmlessly). A store that fails
    /// leaves it working (logged).
    async fn void_exposed(&self, code: &str) {
        let Some(access) = &self.policy.access else {
            return;
        };
        match access.void_code(code).await {
            Ok(true) => {
                tracing::warn!("a pairing or invite code was posted in a group; it is void now")
            }
            Ok(false) => {}
            Err(error) => {
                tracing::error!(%error, "could not void a code posted in a group");
            }
        }
    }

    /// Feed a new message's update on with its verdict (an ignored one
    /// has nothing left to do).
    fn hand_on(&self, update: Option<Update>, verdict: Inbound) -> Intook {
        let intook = match &verdict {
            Inbound::Accept(_) => Intook::Accepted,
            Inbound::Ignore(reason) => {
                tracing::debug!(reason, "update ignored");
                return Intook::Ignored;
            }
            Inbound::Stranger { .. } | Inbound::Redeem { .. } | Inbound::TopicClosed { .. } => {
                Intook::Ignored
            }
        };
        // Accepted, stranger, code or a closed topic: always a message
        // teloxide read.
        if let Some(update) = update {
            self.feed().send(update, Some(verdict));
        }
        intook
    }

    /// After a restart: resume every recorded message that was not finished,
    /// in its original order (fed to the dispatcher before any live
    /// update; wakeups handed on after what was fed before them). A message whose turn was running when the
    /// process died is run again (`resume_interrupted`) or its sender is
    /// told to resend it; one whose answer already went out is only marked,
    /// and one whose answer was being sent when the process died (an
    /// ambiguous send) is marked failed and not sent again.
    pub async fn recover(&self) -> Result<usize, StoreError> {
        let open = self.store.inbox.open_inbox().await?;
        let mut resumed = 0;
        for entry in open {
            if self.recover_control(&entry).await {
                continue;
            }
            let handed_on = match wakeup_from_payload(&entry.payload) {
                Some(wakeup) => self.recover_wakeup(&entry, wakeup).await,
                None => self.recover_message(&entry).await,
            };
            resumed += usize::from(handed_on);
        }
        Ok(resumed)
    }

    /// A recorded draft stop or button press, carried out as a live one
    /// would be: whether the row was one.
    async fn recover_control(&self, entry: &InboxEntry) -> bool {
        let Some(handler) = &self.callbacks else {
            return false;
        };
        if let Some(stop) = DraftStop::parse(&entry.payload) {
            handler.handle_draft_stop(entry.update_id, stop).await;
            return true;
        }
        if entry.payload.get("callback_query").is_some() {
            // Carried out by the dispatcher, like a live press.
            let press = entry
                .payload
                .get("callback_query")
                .and_then(parse_guarded::<CallbackQuery>)
                .zip(as_update_id(entry.update_id));
            match press {
                Some((query, id)) => {
                    tracing::info!(
                        update_id = entry.update_id,
                        "carrying out a button press recorded before the restart"
                    );
                    let kind = UpdateKind::CallbackQuery(query);
                    self.feed().send(Update { id, kind }, None);
                }
                None => self.mark_update(entry.update_id, "not resumable").await,
            }
            return true;
        }
        false
    }

    /// A background job's result recorded before the restart: always
    /// delivered (nobody could "send it again"), exactly once thanks to the
    /// outbox. Whether it was handed on.
    async fn recover_wakeup(&self, entry: &InboxEntry, mut wakeup: MessageEvent) -> bool {
        let message_id = entry.message_id.unwrap_or(entry.update_id);
        if let Ok(Some(reply)) = self.store.outbox.reply_of(entry.chat_id, message_id).await {
            if reply.sending {
                self.ambiguous(&wakeup.source, message_id).await;
                return false;
            }
            if reply.delivered {
                if let Some(media) = &self.media {
                    media.send_leftover_files(&wakeup.source, message_id).await;
                }
                self.mark(entry.chat_id, message_id, InboxState::Answered, "")
                    .await;
                return false;
            }
        }
        wakeup.message_id = Some(message_id);
        wakeup.origin = Origin::Recovered {
            was_running: entry.state == InboxState::Running,
        };
        tracing::info!(
            update_id = entry.update_id,
            "delivering a wakeup recorded before the restart"
        );
        // After what was fed before it (a wakeup has no update to
        // feed): a chat's events reach the adapter in their order.
        self.feed().settled().await;
        self.engine.adapter.handle_message(wakeup).await;
        true
    }

    /// A user's message recorded before the restart: fed again, only
    /// marked (answered, or interrupted when not resumed), or finished as
    /// an ambiguous send. Whether it was fed again.
    async fn recover_message(&self, entry: &InboxEntry) -> bool {
        let update = parse_update(&entry.payload);
        let verdict = update.as_ref().and_then(|u| match &u.kind {
            UpdateKind::Message(message) => Some(classify(message, &self.policy)),
            _ => None,
        });
        let (Some(update), Some(Inbound::Accept(mut event))) = (update, verdict) else {
            if let Some(id) = entry.message_id {
                self.mark(entry.chat_id, id, InboxState::Dropped, "not resumable")
                    .await;
            }
            return false;
        };
        let message_id = entry.message_id.unwrap_or_default();
        let recorded = self
            .store
            .outbox
            .reply_of(entry.chat_id, message_id)
            .await
            .ok()
            .flatten();
        if recorded.as_ref().is_some_and(|reply| reply.delivered) {
            // Files the turn left to follow its answer may not have gone
            // out before the restart.
            if let Some(media) = &self.media {
                media.send_leftover_files(&event.source, message_id).await;
            }
            self.mark(entry.chat_id, message_id, InboxState::Answered, "")
                .await;
            return false;
        }
        if recorded.as_ref().is_some_and(|reply| reply.sending) {
            self.ambiguous(&event.source, message_id).await;
            return false;
        }
        if entry.state == InboxState::Running && !self.resume_interrupted {
            let notice = Reply::notice(
                "⚠️ telegate restarted while working on this message; please send it again.",
            )
            .in_reply_to(entry.message_id);
            let target = ChatTarget::of(&event.source);
            // A half-streamed preview must not stay behind looking like
            // the answer: the notice replaces it in place.
            let preview = recorded.and_then(|reply| reply.reply_ids.first().copied());
            if let Err(error) = self.delivery.deliver_reply(target, &notice, preview).await {
                tracing::warn!(%error, "could not tell a user about a restart");
            }
            self.mark(
                entry.chat_id,
                message_id,
                InboxState::Dropped,
                "interrupted by a restart",
            )
            .await;
            return false;
        }
        tracing::info!(
            update_id = entry.update_id,
            state = entry.state.as_str(),
            "resuming a message after a restart"
        );
        event.origin = Origin::Recovered {
            was_running: entry.state == InboxState::Running,
        };
        // Through the dispatcher like a live message, ahead of every
        // live one.
        self.feed().send(update, Some(Inbound::Accept(event)));
        true
    }

    /// An answer whose send the previous process started without
    /// recording its outcome: it may be in the chat already, and Telegram
    /// has no idempotent send, so it is not sent again. Like an ambiguous
    /// failure at run time (the request got no answer), the message is
    /// finished as failed; its sender is told, so nothing is lost
    /// silently when the answer did not arrive.
    async fn ambiguous(&self, source: &SessionSource, message_id: i64) {
        let chat_id = source.chat_id;
        tracing::warn!(
            chat_id,
            message_id,
            "{AMBIGUOUS_SEND} (the previous process stopped mid-send)"
        );
        self.metrics.ambiguous_sends.inc();
        let notice = Reply::notice(AMBIGUOUS_SEND_NOTICE).in_reply_to(Some(message_id));
        // Retried until Telegram confirms it, in a task of its own so the
        // rest of recovery does not wait for it; the row is closed only
        // after, so a restart meanwhile tells the sender again (a
        // recorded intent). Shutdown ends the task, the row still open.
        let target = ChatTarget::of(source);
        let intake = self.clone();
        tokio::spawn(async move {
            let told = tokio::select! {
                () = intake.stop.cancelled() => return,
                told = deliver_notice_until_confirmed(&intake.delivery, target, &notice) => told,
            };
            if let Err(error) = told {
                tracing::warn!(%error, "could not tell a user about an answer cut off by a restart");
            }
            intake
                .mark(chat_id, message_id, InboxState::Failed, AMBIGUOUS_SEND)
                .await;
        });
    }

    async fn mark_update(&self, update_id: i64, reason: &str) {
        let result = self
            .store
            .inbox
            .set_update_state(update_id, InboxState::Dropped, Some(reason.to_string()))
            .await;
        if let Err(error) = result {
            tracing::error!(%error, "could not record an update state");
        }
    }

    async fn mark(&self, chat_id: i64, message_id: i64, state: InboxState, reason: &str) {
        let reason = (!reason.is_empty()).then(|| reason.to_string());
        if let Err(error) = self
            .store
            .inbox
            .set_message_state(chat_id, message_id, state, reason)
            .await
        {
            tracing::error!(%error, "could not record a message state");
        }
    }
}

/// A recorded update id as teloxide's (Telegram's are below 2^31; others
/// cannot be a teloxide `Update`).
fn as_update_id(update_id: i64) -> Option<UpdateId> {
    u32::try_from(update_id).ok().map(UpdateId)
}
