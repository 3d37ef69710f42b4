//! Intake: every update is written to the inbox, then handed on.
//!
//! The one rule that makes restarts safe: an update is recorded in the store
//! *before* it is confirmed to Telegram (the next `getUpdates` offset, or the
//! webhook's 200). A crash after that point loses nothing: the restart finds
//! the row and resumes it. A redelivered update finds its row and is ignored,
//! so it can never start a second turn.
//!
//! Recorded messages are handed to the adapter by one small worker per chat:
//! in arrival order within a chat, concurrently across chats. The adapter
//! may have to deliver something before it returns (a "Queued" notice, a
//! command's reply, which can wait out a `retry_after`); one chat's wait
//! must never hold up the updates of every other chat. With media, the
//! worker feeds the chat's preparation stage ([`crate::media::stage`]):
//! downloads and transcriptions run in tasks of their own, so the chat's
//! commands and button presses never wait behind them, and a message
//! waits only for the preparations before it in its slot.
//!
//! This module owns recording, classification and recovery. It must never
//! confirm an update it could not record, and never await a turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use teloxide::types::{CallbackQuery, Update, UpdateKind};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::callback::{CallbackHandler, DraftStop};
use super::inbound::{classify, Inbound, InboundPolicy};
use super::inbox_writer::wakeup_from_payload;
use super::media::{has_media, ChatStage, IntakeMedia};
use super::parse::{parse_guarded, parse_update};
use super::topics::Topics;
use crate::delivery::answer::AMBIGUOUS_SEND;
use crate::delivery::{ChatTarget, Delivery};
use crate::engine::Engine;
use crate::media::stage::{PreparationStage, Wake};
use crate::metrics::Metrics;
use crate::reply::Reply;
use crate::store::{NewUpdate, Store, StoreError};
use crate::vocab::{InboxState, MessageEvent, SessionSource};

/// What the sender of a message is told when the answer's send was cut
/// off by a restart (it may or may not have arrived; it is not sent again).
pub const AMBIGUOUS_SEND_NOTICE: &str =
    "⚠️ telegate restarted while sending the answer to this message, \
     so it may not have arrived. If you don't see it, please send your message again.";

/// Hand one chat's messages to the adapter, in order; leave when none is
/// waiting. With media, they go through the chat's preparation stage
/// ([`crate::media::stage`]): media is prepared off this queue, so the
/// chat's commands never wait for a download.
async fn chat_worker(
    engine: Engine,
    workers: ChatWorkers,
    chat_id: i64,
    mut queue: mpsc::UnboundedReceiver<MessageEvent>,
    media: Option<Arc<IntakeMedia>>,
    tasks: TaskTracker,
    topics: Option<Arc<Topics>>,
) {
    // Placed in its topic first (topics `auto` may create one), in the
    // chat's order.
    let place = |event: MessageEvent| {
        let topics = topics.clone();
        async move {
            match topics {
                Some(topics) => topics.place(event).await,
                None => event,
            }
        }
    };
    let Some(media) = media else {
        while let Some(event) = next_or_leave(&workers, chat_id, &mut queue) {
            engine.adapter.handle_message(place(event).await).await;
        }
        return;
    };
    let stop = media.stop.clone();
    let mut stage = PreparationStage::new(Arc::new(ChatStage::new(engine, media)), tasks);
    let mut open = true;
    loop {
        // A stopping intake hands nothing more on: what is left stays
        // unfinished in the inbox for the next start.
        if stop.is_cancelled() {
            return;
        }
        if stage.is_idle() {
            match next_or_leave(&workers, chat_id, &mut queue) {
                Some(event) => stage.take(place(event).await).await,
                None => return,
            }
            continue;
        }
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            event = queue.recv(), if open => Next::Event(event),
            wake = stage.wait() => Next::Wake(wake),
        };
        match next {
            Next::Event(Some(event)) => stage.take(place(event).await).await,
            Next::Event(None) => open = false,
            Next::Wake(wake) => stage.wake(wake).await,
        }
    }
}

/// What a chat worker with preparations under way saw first.
enum Next {
    Event(Option<MessageEvent>),
    Wake(Wake),
}

/// The queue's next event; without one the worker leaves the map, under
/// its lock (a send that succeeded there is always handled).
fn next_or_leave(
    workers: &ChatWorkers,
    chat_id: i64,
    queue: &mut mpsc::UnboundedReceiver<MessageEvent>,
) -> Option<MessageEvent> {
    let mut workers = workers.lock().unwrap_or_else(PoisonError::into_inner);
    let next = queue.try_recv().ok();
    if next.is_none() {
        workers.remove(&chat_id);
    }
    next
}

/// Answers strangers (once per user per interval) with their user id.
struct StrangerReplies {
    last: Mutex<HashMap<u64, Instant>>,
    interval: Duration,
}

/// Past this many strangers remembered, those whose interval has passed
/// are forgotten: a flood of strangers cannot grow the map without bound.
const STRANGERS_KEPT: usize = 10_000;

impl StrangerReplies {
    fn new(interval: Duration) -> Self {
        StrangerReplies {
            last: Mutex::new(HashMap::new()),
            interval,
        }
    }

    /// Whether `user`, a stranger, is to be told their id now (and if so,
    /// not again within the interval).
    fn due(&self, user: u64) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.len() > STRANGERS_KEPT {
            last.retain(|_, t| now.duration_since(*t) < self.interval);
        }
        match last.get(&user) {
            Some(t) if now.duration_since(*t) < self.interval => false,
            _ => {
                last.insert(user, now);
                true
            }
        }
    }
}

/// What happened to one update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intook {
    /// Recorded and handed to the adapter.
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
    /// records and carries it out.
    Control(i64),
    /// Anything else: one inbox row, then the verdict is acted on.
    Plain(Box<PlainUpdate>),
}

/// A message (or an update recorded only to be dropped) and what to do
/// with it once recorded.
struct PlainUpdate {
    row: NewUpdate,
    verdict: Inbound,
}

/// The per-chat workers handing recorded messages to the adapter.
type ChatWorkers = Arc<Mutex<HashMap<i64, mpsc::UnboundedSender<MessageEvent>>>>;

/// Records updates and hands them to the engine.
#[derive(Clone)]
pub struct Intake {
    engine: Engine,
    delivery: Delivery,
    store: Store,
    policy: Arc<InboundPolicy>,
    strangers: Arc<StrangerReplies>,
    resume_interrupted: bool,
    metrics: Metrics,
    workers: ChatWorkers,
    /// Every chat worker ever started, and every preparation they started,
    /// so a shutdown can wait for them to finish what they began (a
    /// refusal's inbox row, a stopped message's report).
    worker_tasks: TaskTracker,
    media: Option<Arc<IntakeMedia>>,
    callbacks: Option<Arc<CallbackHandler>>,
    topics: Option<Arc<Topics>>,
}

impl Intake {
    /// An intake feeding `engine`.
    pub fn new(
        engine: Engine,
        delivery: Delivery,
        store: Store,
        policy: InboundPolicy,
        resume_interrupted: bool,
        metrics: Metrics,
    ) -> Self {
        Intake {
            engine,
            delivery,
            store,
            policy: Arc::new(policy),
            strangers: Arc::new(StrangerReplies::new(Duration::from_secs(600))),
            resume_interrupted,
            metrics,
            workers: Arc::default(),
            worker_tasks: TaskTracker::new(),
            media: None,
            callbacks: None,
            topics: None,
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

    /// The chat workers' tracker: a shutdown closes it and waits (bounded)
    /// so no worker writes into a closed store or hands a message to a
    /// stopped engine.
    pub fn worker_tasks(&self) -> TaskTracker {
        self.worker_tasks.clone()
    }

    /// Prepare photos, voice and documents before they reach the adapter.
    pub fn with_media(mut self, media: IntakeMedia) -> Self {
        self.media = Some(Arc::new(media));
        self
    }

    /// Let `handler` carry out button presses (without one they are
    /// recorded as not handled).
    pub fn with_callbacks(mut self, handler: Arc<CallbackHandler>) -> Self {
        self.callbacks = Some(handler);
        self
    }

    /// Record one raw update and hand it on. An error means the update was
    /// NOT recorded and must not be confirmed to Telegram.
    pub async fn take(&self, raw: Value) -> Result<Intook, StoreError> {
        match self.sort(&raw) {
            Sorted::Unkeyed => Ok(Intook::Ignored),
            Sorted::Control(update_id) => self.take_control(update_id, raw).await,
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
    pub async fn take_batch(&self, raws: &[Value]) -> Result<(), StoreError> {
        let mut plain = Vec::new();
        for raw in raws {
            match self.sort(raw) {
                Sorted::Unkeyed => {}
                Sorted::Plain(update) => plain.push(*update),
                Sorted::Control(update_id) => {
                    // Keep the batch's order: what came before it first.
                    self.record_plain(std::mem::take(&mut plain)).await?;
                    self.take_control(update_id, raw.clone()).await?;
                }
            }
        }
        self.record_plain(plain).await?;
        Ok(())
    }

    /// Read and classify one raw update (no I/O).
    fn sort(&self, raw: &Value) -> Sorted {
        let Some(update_id) = raw.get("update_id").and_then(Value::as_i64) else {
            tracing::warn!("an update without update_id was ignored");
            return Sorted::Unkeyed;
        };
        if self.callbacks.is_some()
            && (DraftStop::parse(raw).is_some() || raw.get("callback_query").is_some())
        {
            return Sorted::Control(update_id);
        }
        let update = parse_update(raw);
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
                payload: raw.to_string(),
                state,
                reason: reason.map(str::to_string),
            },
            verdict,
        }))
    }

    /// A button press or a draft stop: recorded and carried out by the
    /// callback handler.
    async fn take_control(&self, update_id: i64, raw: Value) -> Result<Intook, StoreError> {
        let Some(handler) = &self.callbacks else {
            return Ok(Intook::Ignored);
        };
        // Telegram's stop control on a streamed draft: a control like a
        // button press (teloxide-core 0.13 does not know this update).
        let new = if let Some(stop) = DraftStop::parse(&raw) {
            handler.take_draft_stop(update_id, raw, stop).await?
        } else {
            // teloxide's `Update` cannot parse callback queries: read it directly.
            match raw
                .get("callback_query")
                .and_then(parse_guarded::<CallbackQuery>)
            {
                Some(query) => {
                    let chat_id = query.message.as_ref().map_or(0, |m| m.chat().id.0);
                    handler.take(update_id, chat_id, raw, query).await?
                }
                // Not a button press teloxide can read: recorded as one.
                None => {
                    let row = NewUpdate {
                        update_id,
                        chat_id: 0,
                        message_id: None,
                        payload: raw.to_string(),
                        state: InboxState::Dropped,
                        reason: Some("malformed or unknown update".to_string()),
                    };
                    let verdict = Inbound::Ignore("malformed or unknown update");
                    let plain = PlainUpdate { row, verdict };
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

    /// Record `updates` in one store call, then act on each new one in
    /// order.
    async fn record_plain(&self, updates: Vec<PlainUpdate>) -> Result<Vec<Intook>, StoreError> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let (rows, verdicts): (Vec<NewUpdate>, Vec<Inbound>) =
            updates.into_iter().map(|u| (u.row, u.verdict)).unzip();
        let ids: Vec<i64> = rows.iter().map(|row| row.update_id).collect();
        let fresh = self.store.record_updates(rows).await?;
        let mut taken = Vec::with_capacity(verdicts.len());
        for ((verdict, new), update_id) in verdicts.into_iter().zip(fresh).zip(ids) {
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
            taken.push(self.act(verdict).await);
        }
        Ok(taken)
    }

    async fn act(&self, verdict: Inbound) -> Intook {
        match verdict {
            Inbound::Accept(event) => {
                self.hand_on(event);
                Intook::Accepted
            }
            Inbound::Stranger { chat_id, user_id } => {
                tracing::info!(
                    user_id,
                    "message from a user who is not allowed (invite them with /invite, \
                     or add the id to telegram.allowed_users)"
                );
                if self.strangers.due(user_id) {
                    // The setting is the owner's business: the log names it.
                    let reply = Reply::notice(format!(
                        "Sorry, this bot is private. Your user id is {user_id}; \
                         send it to the bot's owner if you should have access, \
                         or send /start CODE with an invite code."
                    ));
                    self.tell_stranger(chat_id, reply);
                }
                Intook::Ignored
            }
            Inbound::Redeem {
                chat_id,
                user_id,
                name,
                code,
            } => {
                if let Some(access) = self.policy.access.clone() {
                    // One store call, in update order (a code and what the
                    // same user sends next are seen in the order sent); the
                    // answer is sent on its own.
                    self.redeem(&access, chat_id, user_id, name, &code).await;
                }
                Intook::Ignored
            }
            Inbound::TopicClosed { chat_id, thread_id } => {
                if let Some(topics) = self.topics.clone() {
                    let engine = self.engine.clone();
                    self.worker_tasks.spawn(async move {
                        topics.end(&engine, chat_id, thread_id).await;
                    });
                }
                Intook::Ignored
            }
            Inbound::Ignore(reason) => {
                tracing::debug!(reason, "update ignored");
                Intook::Ignored
            }
        }
    }

    /// Send `reply` to a stranger's private chat: best effort, and never
    /// in the way of the next update.
    fn tell_stranger(&self, chat_id: i64, reply: Reply) {
        let target = ChatTarget {
            chat_id,
            thread_id: None,
            is_group: false,
        };
        let delivery = self.delivery.clone();
        tokio::spawn(async move {
            if let Err(error) = delivery.deliver_reply(target, &reply, None).await {
                tracing::debug!(%error, "could not answer a stranger");
            }
        });
    }

    /// A stranger sent a code (see [`crate::access`]): redeem it and
    /// answer (nothing once they used up their wrong tries).
    async fn redeem(
        &self,
        access: &crate::access::Access,
        chat_id: i64,
        user_id: u64,
        name: String,
        code: &str,
    ) {
        use crate::store::Redeemed;
        let name = Some(name).filter(|n| !n.trim().is_empty());
        let redeemed = match access.redeem(user_id, name, code).await {
            Ok(redeemed) => redeemed,
            Err(error) => {
                tracing::error!(user_id, %error, "could not check an access code");
                self.tell_stranger(
                    chat_id,
                    Reply::notice(
                        "⚠️ I could not check that code right now; please try again later.",
                    ),
                );
                return;
            }
        };
        let text = match redeemed {
            Redeemed::Joined(role, crate::store::CodeKind::Pairing) => {
                tracing::info!(
                    user_id,
                    role = role.as_str(),
                    "paired: the bot has its owner"
                );
                "✅ You are the owner of this bot now. Send me a message to start; \
                 /invite adds people, /help lists the commands."
                    .to_string()
            }
            Redeemed::Joined(role, _) => {
                tracing::info!(user_id, role = role.as_str(), "joined by invite");
                format!(
                    "✅ Welcome! You have access to this bot now (as {}). Send me a message \
                     to start; /help lists the commands.",
                    role.as_str()
                )
            }
            Redeemed::AlreadyMember(role) => {
                format!(
                    "You already have access to this bot (as {}).",
                    role.as_str()
                )
            }
            Redeemed::Wrong { tries_left } => {
                tracing::info!(user_id, tries_left, "a wrong access code was sent");
                match tries_left {
                    0 => "That code is not valid. You cannot try another one this hour.".to_string(),
                    1 => "That code is not valid (it may have expired or been used). You can try once more this hour.".to_string(),
                    n => format!("That code is not valid (it may have expired or been used). You can try {n} more times this hour."),
                }
            }
            Redeemed::Silenced => {
                tracing::info!(
                    user_id,
                    "an access code from a user out of tries was ignored"
                );
                return;
            }
            Redeemed::Busy => {
                tracing::warn!(
                    user_id,
                    "access code not checked: too many wrong codes were sent in the last hour"
                );
                if !self.strangers.due(user_id) {
                    return;
                }
                "Too many wrong codes were sent to this bot recently; please try again in an hour."
                    .to_string()
            }
        };
        self.tell_stranger(chat_id, Reply::notice(text));
    }

    /// Queue `event` on its chat's worker, starting one if the chat has none.
    fn hand_on(&self, event: MessageEvent) {
        let chat_id = event.source.chat_id;
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        // A worker in the map takes its queue under this lock before it
        // leaves, so a send that succeeds here is always handled.
        let event = match workers.get(&chat_id) {
            Some(worker) => match worker.send(event) {
                Ok(()) => return,
                // The worker died (a panic); a new one takes over.
                Err(mpsc::error::SendError(event)) => event,
            },
            None => event,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(event);
        workers.insert(chat_id, tx);
        self.worker_tasks.spawn(chat_worker(
            self.engine.clone(),
            self.workers.clone(),
            chat_id,
            rx,
            self.media.clone(),
            self.worker_tasks.clone(),
            self.topics.clone(),
        ));
    }

    /// After a restart: resume every recorded message that was not finished,
    /// in its original order. A message whose turn was running when the
    /// process died is run again (`resume_interrupted`) or its sender is
    /// told to resend it; one whose answer already went out is only marked,
    /// and one whose answer was being sent when the process died (an
    /// ambiguous send) is marked failed and not sent again.
    pub async fn recover(&self) -> Result<usize, StoreError> {
        let open = self.store.open_inbox().await?;
        let mut resumed = 0;
        // Chats whose resumed messages go through their chat worker (media
        // is prepared there): their later messages follow the same way, so
        // a chat's order is kept.
        let mut via_worker = std::collections::HashSet::new();
        for entry in open {
            if let Some(handler) = &self.callbacks {
                if let Some(stop) = DraftStop::parse(&entry.payload) {
                    handler.handle_draft_stop(entry.update_id, stop).await;
                    continue;
                }
                if entry.payload.get("callback_query").is_some() {
                    if !handler.resume(entry.update_id, &entry.payload).await {
                        self.mark_update(entry.update_id, "not resumable").await;
                    }
                    continue;
                }
            }
            if let Some(mut wakeup) = wakeup_from_payload(&entry.payload) {
                // A background job's result: always delivered (nobody could
                // "send it again"), exactly once thanks to the outbox.
                let message_id = entry.message_id.unwrap_or(entry.update_id);
                if let Ok(Some(reply)) = self.store.reply_of(entry.chat_id, message_id).await {
                    if reply.sending {
                        self.ambiguous(&wakeup.source, message_id).await;
                        continue;
                    }
                    if reply.delivered {
                        if let Some(media) = &self.media {
                            media.send_leftover_files(&wakeup.source, message_id).await;
                        }
                        self.mark(entry.chat_id, message_id, InboxState::Answered, "")
                            .await;
                        continue;
                    }
                }
                wakeup.message_id = Some(message_id);
                wakeup.resumed = entry.state == InboxState::Running;
                wakeup.replayed = true;
                tracing::info!(
                    update_id = entry.update_id,
                    "delivering a wakeup recorded before the restart"
                );
                resumed += 1;
                self.engine.adapter.handle_message(wakeup).await;
                continue;
            }
            let message = parse_update(&entry.payload).and_then(|u| match u.kind {
                UpdateKind::Message(message) => Some(message),
                _ => None,
            });
            let verdict = message.as_ref().map(|m| classify(m, &self.policy));
            let Some(Inbound::Accept(mut event)) = verdict else {
                if let Some(id) = entry.message_id {
                    self.mark(entry.chat_id, id, InboxState::Dropped, "not resumable")
                        .await;
                }
                continue;
            };
            let message_id = entry.message_id.unwrap_or_default();
            let recorded = self
                .store
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
                continue;
            }
            if recorded.as_ref().is_some_and(|reply| reply.sending) {
                self.ambiguous(&event.source, message_id).await;
                continue;
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
                continue;
            }
            tracing::info!(
                update_id = entry.update_id,
                state = entry.state.as_str(),
                "resuming a message after a restart"
            );
            resumed += 1;
            event.resumed = entry.state == InboxState::Running;
            event.replayed = true;
            if self.media.is_some() && (has_media(&event) || via_worker.contains(&entry.chat_id)) {
                via_worker.insert(entry.chat_id);
                self.hand_on(event);
                continue;
            }
            self.engine.adapter.handle_message(event).await;
        }
        Ok(resumed)
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
        if let Err(error) = self
            .delivery
            .deliver_reply(ChatTarget::of(source), &notice, None)
            .await
        {
            tracing::warn!(%error, "could not tell a user about an answer cut off by a restart");
        }
        self.mark(chat_id, message_id, InboxState::Failed, AMBIGUOUS_SEND)
            .await;
    }

    async fn mark_update(&self, update_id: i64, reason: &str) {
        let result = self
            .store
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
            .set_message_state(chat_id, message_id, state, reason)
            .await
        {
            tracing::error!(%error, "could not record a message state");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stranger_is_told_once_per_interval() {
        let replies = StrangerReplies::new(Duration::from_secs(60));
        assert!(replies.due(1));
        assert!(!replies.due(1), "told twice within the interval");
        assert!(replies.due(2), "one stranger silenced another");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!replies.due(1), "told again within the interval");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(replies.due(1), "not told again once the interval passed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_strangers_is_forgotten_once_their_interval_passed() {
        let replies = StrangerReplies::new(Duration::from_secs(60));
        let kept = || replies.last.lock().unwrap().len();
        let limit = STRANGERS_KEPT as u64;
        for user in 0..limit {
            assert!(replies.due(user));
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        // Up to the limit, nobody is forgotten (no pruning on every call).
        assert!(replies.due(limit));
        assert_eq!(kept(), STRANGERS_KEPT + 1);
        // Past it, the expired are forgotten, and only they: the stranger
        // just told is still within their interval.
        assert!(replies.due(limit + 1));
        assert_eq!(kept(), 2, "expired strangers were kept");
        assert!(
            !replies.due(limit),
            "a stranger within their interval was forgotten"
        );
    }
}
