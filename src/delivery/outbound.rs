//! The [`Outbound`] for Telegram: how the engine's replies and turns reach
//! a chat through [`Delivery`] (live views, drafts, reactions, buttons),
//! and the outbox record ([`ReplyRecord`]) that makes a final answer go
//! out at most once across restarts, in at most `max_answer_parts`
//! messages, and stop going out on /stop.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::future::BoxFuture;

use tokio_util::sync::CancellationToken;

use super::telegram::{ChatTarget, Delivery};
use crate::reply::{DeliveryError, LiveReply, Outbound, Reply, ReplyKind, SendingStop};
use crate::store::{OutboxEntry, Store};
use crate::vocab::{ProgressWatch, SessionSource};

/// The outbox record of one reply: which Telegram messages carry the answer
/// to a user message, so a restart neither sends a delivered answer again
/// nor abandons a half-streamed preview.
///
/// Clones share what this process knows of the row: once it was read, or
/// for a message this process recorded itself ([`ReplyRecord::fresh`]),
/// reads are answered from memory and only writes reach the store. Nobody
/// else writes a message's row while its turn runs (recovery, the only
/// other writer, runs before a replayed message's turn starts), so memory
/// and store agree; where a write fails, memory keeps what was attempted,
/// which is the safe side (an intent stays an intent).
#[derive(Clone)]
pub struct ReplyRecord {
    store: Store,
    chat_id: i64,
    message_id: i64,
    /// `None` until known; then the row (`None`: no row).
    known: Arc<Mutex<Option<Option<OutboxEntry>>>>,
}

impl ReplyRecord {
    /// The record for the answer to `message_id` in `chat_id`, read from
    /// the store when first needed.
    pub fn new(store: Store, chat_id: i64, message_id: i64) -> Self {
        ReplyRecord {
            store,
            chat_id,
            message_id,
            known: Arc::new(Mutex::new(None)),
        }
    }

    /// The record for the answer to a message this process recorded in the
    /// inbox itself (not replayed by recovery): it has no row yet, so the
    /// first read costs no store call.
    pub fn fresh(store: Store, chat_id: i64, message_id: i64) -> Self {
        let record = ReplyRecord::new(store, chat_id, message_id);
        *record.lock() = Some(None);
        record
    }

    fn lock(&self) -> MutexGuard<'_, Option<Option<OutboxEntry>>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What was recorded before (by this process or an earlier one).
    pub async fn recorded(&self) -> Option<OutboxEntry> {
        if let Some(known) = self.lock().clone() {
            return known;
        }
        match self.store.reply_of(self.chat_id, self.message_id).await {
            Ok(entry) => {
                let mut known = self.lock();
                // A write that landed meanwhile is newer than this read.
                known.get_or_insert(entry).clone()
            }
            Err(error) => {
                tracing::warn!(chat_id = self.chat_id, %error, "outbox unavailable");
                None
            }
        }
    }

    /// Record that the answer is about to be sent as new messages (`ids`:
    /// the messages carrying it so far). Written before the request; a
    /// store that refuses is logged and the answer still goes out.
    pub async fn intend(&self, ids: Vec<i32>) {
        {
            // As the store does: an answer delivered stays delivered.
            let mut known = self.lock();
            let delivered = matches!(&*known, Some(Some(entry)) if entry.delivered);
            if !delivered {
                *known = Some(Some(OutboxEntry {
                    reply_ids: ids.clone(),
                    delivered: false,
                    sending: true,
                }));
            }
        }
        if let Err(error) = self
            .store
            .record_send_intent(self.chat_id, self.message_id, ids)
            .await
        {
            tracing::warn!(chat_id = self.chat_id, %error, "could not record the intent to send an answer");
        }
    }

    /// Record the reply's messages (`delivered` once the final text is out).
    pub async fn save(&self, ids: Vec<i32>, delivered: bool) {
        *self.lock() = Some(Some(OutboxEntry {
            reply_ids: ids.clone(),
            delivered,
            sending: false,
        }));
        if let Err(error) = self
            .store
            .record_reply(self.chat_id, self.message_id, ids, delivered)
            .await
        {
            tracing::warn!(chat_id = self.chat_id, %error, "could not record a reply in the outbox");
        }
    }
}

/// What the chat is told about an answer whose send was cut short: it may
/// or may not have arrived, and it is not sent again.
pub const AMBIGUOUS_SEND: &str =
    "the answer's send was cut short; it may or may not have arrived, so it is not sent again";

/// What the sender of a message is told when its answer's send went
/// unconfirmed while telegate ran (Telegram hung, answered garbage, or
/// failed for longer than the retries last): it may not have arrived, and
/// it is not sent again.
pub const UNCONFIRMED_ANSWER_NOTICE: &str =
    "⚠️ Telegram did not confirm the answer to this message, so it may not have arrived. \
     If you don't see it, please send your message again.";

/// Deliver a final answer at most once: skipped if the outbox says it was
/// delivered already, refused (an ambiguous send, [`AMBIGUOUS_SEND`]) if it
/// records a send whose outcome is unknown; a recorded preview is finished
/// by editing it. Before a chunk goes out as a new message the intent is
/// recorded ([`ReplyRecord::intend`]).
///
/// An answer takes at most `max_answer_parts` messages ([`plan_answer`]);
/// a longer one's whole text follows them as `answer.md`. When the
/// sending is stopped ([`SendingStop`]: /stop while the answer goes out)
/// the parts not sent yet are left out and counted for the stop's report;
/// either way the answer is then recorded as delivered, so nothing of it
/// is sent later.
///
/// When the answer does not get through (no answer from Telegram, or
/// Telegram unavailable beyond the retries) it is not sent again: its
/// recorded intent stays, so the outbox keeps it as an ambiguous send, and
/// once Telegram answers again the sender gets
/// [`UNCONFIRMED_ANSWER_NOTICE`], once, before this returns the error. The
/// message's inbox row stays open meanwhile: a restart in between finds
/// the intent and tells the sender itself (the notice after a restart).
pub async fn deliver_answer_once(
    delivery: &Delivery,
    target: ChatTarget,
    reply: &Reply,
    preview: Option<i32>,
    record: Option<&ReplyRecord>,
) -> Result<(), DeliveryError> {
    let mut preview = preview;
    if let Some(record) = record {
        match record.recorded().await {
            Some(entry) if entry.delivered => {
                tracing::info!(
                    chat_id = target.chat_id,
                    "answer already delivered before; not sending it again"
                );
                return Ok(());
            }
            Some(entry) if entry.sending => {
                tracing::warn!(chat_id = target.chat_id, "{AMBIGUOUS_SEND}");
                return Err(DeliveryError::Unavailable(AMBIGUOUS_SEND.into()));
            }
            Some(entry) if preview.is_none() => preview = entry.reply_ids.first().copied(),
            _ => {}
        }
    }
    let chunks = super::telegram::render_chunks(reply);
    let plan = plan_answer(chunks.len(), delivery.config().max_answer_parts);
    let sending = SendingStop::current();
    let stop = sending.as_ref().map(SendingStop::token);
    let ids = match delivery
        .deliver_chunks_recorded(
            target,
            reply,
            &chunks[..plan.messages],
            preview,
            record,
            stop,
        )
        .await
    {
        Ok(ids) => ids,
        Err(error) => {
            if matches!(
                error,
                DeliveryError::Ambiguous(_) | DeliveryError::Unavailable(_)
            ) {
                tell_unconfirmed(delivery, target, reply.reply_to, &error).await;
            }
            return Err(error);
        }
    };
    let mut unsent = plan.messages - ids.len();
    if plan.as_file {
        if unsent > 0 || stop.is_some_and(CancellationToken::is_cancelled) {
            unsent = chunks.len() - ids.len();
        } else {
            if let Some(record) = record {
                // The file is part of the answer: a restart that finds
                // this intent does not send it again.
                record.intend(ids.clone()).await;
            }
            send_as_file(delivery, target, reply, plan.messages).await;
        }
    }
    if let (Some(sending), true) = (&sending, unsent > 0) {
        sending.note_parts(unsent, chunks.len());
    }
    // Delivered as far as it will ever be: what a stop left out is not
    // sent later either.
    if let Some(record) = record {
        record.save(ids, true).await;
    }
    Ok(())
}

/// How an answer of some parts goes out (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerPlan {
    /// The parts sent as messages (the first ones).
    pub messages: usize,
    /// The whole answer follows as a file (it has more parts than that).
    pub as_file: bool,
}

/// An answer of `parts` parts with at most `max_parts` messages: all as
/// messages, or the first `max_parts` and then the whole text as a file.
pub fn plan_answer(parts: usize, max_parts: usize) -> AnswerPlan {
    let max_parts = max_parts.max(1);
    AnswerPlan {
        messages: parts.min(max_parts),
        as_file: parts > max_parts,
    }
}

/// The name of the file an answer too long for messages comes in.
pub const ANSWER_FILE_NAME: &str = "answer.md";

/// Send the whole of `reply`'s text as a Markdown document after its
/// first `messages` parts; a failure is said in the chat.
async fn send_as_file(delivery: &Delivery, target: ChatTarget, reply: &Reply, messages: usize) {
    let file = crate::media::outbox::OutgoingFile {
        name: ANSWER_FILE_NAME.to_string(),
        body: crate::media::outbox::FileBody::Bytes(bytes::Bytes::from(reply.text.clone())),
        as_photo: false,
        caption: Some(format!(
            "📄 The whole answer: it is longer than {messages} messages."
        )),
        reply_to: reply.reply_to,
    };
    let sender = super::files::TelegramFileSender::new(delivery.clone());
    if let Err(error) = sender.upload(target, &file).await {
        tracing::warn!(chat_id = target.chat_id, %error, "could not send a long answer as a file");
        let notice = Reply::notice(format!(
            "⚠️ The rest of this answer (too long for {messages} messages) could not be sent as a file."
        ))
        .in_reply_to(reply.reply_to);
        if let Err(error) = delivery.deliver_reply(target, &notice, None).await {
            tracing::warn!(chat_id = target.chat_id, %error, "could not say a long answer was cut");
        }
    }
}

/// Tell the sender of message `reply_to` that its answer may not have
/// arrived, as soon as Telegram answers again. Sent once: an unanswered
/// notice is not repeated either.
async fn tell_unconfirmed(
    delivery: &Delivery,
    target: ChatTarget,
    reply_to: Option<i64>,
    error: &DeliveryError,
) {
    tracing::warn!(
        chat_id = target.chat_id,
        %error,
        "the answer's send went unconfirmed; it is not sent again, and its sender is told once Telegram answers"
    );
    delivery.wait_until_answering().await;
    let notice = Reply::notice(UNCONFIRMED_ANSWER_NOTICE).in_reply_to(reply_to);
    if let Err(error) = delivery.deliver_reply(target, &notice, None).await {
        tracing::warn!(chat_id = target.chat_id, %error, "could not tell a user that an answer may not have arrived");
    }
}

/// The [`Outbound`] for Telegram: deliveries go through the engine; turns
/// get a live view (typing, streamed preview); answers are recorded in the
/// outbox when a store is given.
#[derive(Clone)]
pub struct TelegramOutbound {
    delivery: Delivery,
    store: Option<Store>,
    reactions: Option<super::reaction::Reactions>,
    drafts: super::draft::Drafts,
}

impl TelegramOutbound {
    /// An outbound on top of `delivery`, recording answers in `store`.
    pub fn new(delivery: Delivery, store: Option<Store>) -> Self {
        TelegramOutbound {
            delivery,
            store,
            reactions: None,
            drafts: super::draft::Drafts::new(super::draft::StreamingMode::Edit),
        }
    }

    /// Stream turns as drafts where `mode` says so (`[delivery] streaming`).
    pub fn with_streaming(mut self, mode: super::draft::StreamingMode) -> Self {
        self.drafts = super::draft::Drafts::new(mode);
        self
    }

    /// Show each message's status as a reaction (`[delivery] reactions`).
    /// Must be called inside the runtime.
    pub fn with_reactions(mut self, on: bool) -> Self {
        self.reactions = on.then(|| super::reaction::Reactions::spawn(self.delivery.clone()));
        self
    }

    /// The engine (for stats).
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    fn record_for(&self, to: &SessionSource, answering: Option<i64>) -> Option<ReplyRecord> {
        Some(ReplyRecord::new(
            self.store.clone()?,
            to.chat_id,
            answering?,
        ))
    }

    /// The record of a turn's answer: read from the store only for a
    /// message replayed by recovery (see [`ReplyRecord::fresh`]).
    fn record_for_turn(&self, turn: &crate::reply::TurnStart<'_>) -> Option<ReplyRecord> {
        if turn.replayed {
            return self.record_for(turn.to, turn.answering);
        }
        Some(ReplyRecord::fresh(
            self.store.clone()?,
            turn.to.chat_id,
            turn.answering?,
        ))
    }
}

impl Outbound for TelegramOutbound {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let target = ChatTarget::of(to);
            if !reply.buttons.is_empty() {
                let store = self.store.as_ref();
                return super::buttons::deliver_with_buttons(&self.delivery, store, to, &reply)
                    .await;
            }
            if reply.kind == ReplyKind::Answer {
                let record = self.record_for(to, reply.reply_to);
                deliver_answer_once(&self.delivery, target, &reply, None, record.as_ref()).await
            } else {
                self.delivery
                    .deliver_reply(target, &reply, None)
                    .await
                    .map(|_| ())
            }
        })
    }

    fn turn_started(
        &self,
        to: &SessionSource,
        answering: Option<i64>,
        progress: ProgressWatch,
    ) -> Option<Box<dyn LiveReply>> {
        Some(Box::new(super::live::LiveView::start(
            self.delivery.clone(),
            ChatTarget::of(to),
            progress,
            self.record_for(to, answering),
        )))
    }

    fn turn_started_with(
        &self,
        turn: &crate::reply::TurnStart<'_>,
        progress: ProgressWatch,
    ) -> Option<Box<dyn LiveReply>> {
        let stop = self
            .store
            .clone()
            .map(|store| super::live::StopButton::new(store, turn.to.clone(), turn.generation));
        // The draft id is the turn's generation (never 0): Telegram's stop
        // control on the draft names it, and only that turn stops.
        let draft = i64::try_from(turn.generation)
            .ok()
            .filter(|id| *id != 0 && self.drafts.for_chat(turn.to))
            .map(|id| super::draft::DraftStream {
                drafts: self.drafts.clone(),
                id,
            });
        let live: Box<dyn LiveReply> = Box::new(super::live::LiveView::start_with_stop(
            self.delivery.clone(),
            ChatTarget::of(turn.to),
            progress,
            self.record_for_turn(turn),
            stop,
            draft,
        ));
        let Some(reactions) = &self.reactions else {
            return Some(live);
        };
        let target = ChatTarget::of(turn.to);
        reactions.set(target, turn.answering, super::reaction::Status::Working);
        Some(Box::new(super::reaction::ReactingLive::new(
            live,
            reactions.clone(),
            target,
            turn.answering,
        )))
    }

    fn queued(&self, to: &SessionSource, message_id: Option<i64>) {
        if let Some(reactions) = &self.reactions {
            reactions.set(
                ChatTarget::of(to),
                message_id,
                super::reaction::Status::Queued,
            );
        }
    }
}
