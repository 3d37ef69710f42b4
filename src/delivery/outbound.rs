//! The [`Outbound`] for Telegram: how the engine's replies and turns reach
//! a chat through [`Delivery`] (live views, drafts, reactions, buttons);
//! final answers go out through [`super::answer`] (at most once, in at most
//! `max_answer_parts` messages, stopped by /stop).

use futures::future::BoxFuture;

use super::final_answer::deliver_answer_once;
use super::reply_record::ReplyRecord;
use super::telegram::{ChatTarget, Delivery};
use super::DeliveryTables;
use crate::reply::{DeliveryError, LiveReply, Outbound, Reply, ReplyKind};
use crate::vocab::{ProgressWatch, SessionSource};

/// The [`Outbound`] for Telegram: deliveries go through the engine; turns
/// get a live view (typing, streamed preview); answers are recorded in the
/// outbox when a store is given.
#[derive(Clone)]
pub struct TelegramOutbound {
    delivery: Delivery,
    tables: Option<DeliveryTables>,
    reactions: Option<super::reaction::Reactions>,
    drafts: super::draft::Drafts,
}

impl TelegramOutbound {
    /// An outbound on top of `delivery`, recording answers and buttons in
    /// `tables`.
    pub fn new(delivery: Delivery, tables: Option<DeliveryTables>) -> Self {
        TelegramOutbound {
            delivery,
            tables,
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
            self.tables.as_ref()?.outbox.clone(),
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
            self.tables.as_ref()?.outbox.clone(),
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
                let tables = self.tables.as_ref();
                return super::keyboard::deliver_with_buttons(&self.delivery, tables, to, &reply)
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

    fn settle_prompt<'a>(
        &'a self,
        to: &'a SessionSource,
        ticket: &'a str,
        line: &'a str,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(super::keyboard::settle_prompt(
            &self.delivery,
            self.tables.as_ref().map(|t| &t.approvals),
            to,
            ticket,
            line,
        ))
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
        let stop = self.tables.as_ref().map(|t| {
            super::live::StopButton::new(t.buttons.clone(), turn.to.clone(), turn.generation)
        });
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
