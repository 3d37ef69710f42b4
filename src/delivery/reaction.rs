//! Reactions as status (opt-in, `[delivery] reactions = true`): the user's
//! message shows where its turn stands.
//!
//! * 👌 while it waits behind a running task (Telegram only accepts its own
//!   reaction set, which has no hourglass);
//! * 👀 when its turn starts;
//! * 👍 when the answer was delivered, 👎 when the turn failed;
//! * no reaction when the turn ended without an answer (stopped,
//!   interrupted).
//!
//! One worker sends them, in the order the turn's life produced them, and
//! only the newest status of a message still waiting to be sent goes out
//! (so a chat held by `retry_after` never builds a backlog). Every request
//! goes through [`Delivery::call`]. Reactions are best effort: a failure is
//! logged at debug level and never touches the turn or its reply.

use futures::future::BoxFuture;
use teloxide::payloads::SetMessageReactionSetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, MessageId, ReactionType};
use tokio::sync::mpsc;

use super::telegram::{ChatTarget, Delivery, Idempotence};
use crate::reply::{DeliveryError, LiveReply, Reply, ReplyKind};

/// Where a message's turn stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Waiting behind a running task.
    Queued,
    /// Its turn runs.
    Working,
    /// Answered.
    Answered,
    /// The turn failed.
    Failed,
    /// Ended without an answer: no reaction.
    Cleared,
}

impl Status {
    /// The emoji shown (`None`: the reaction is removed).
    pub fn emoji(self) -> Option<&'static str> {
        match self {
            Status::Queued => Some("👌"),
            Status::Working => Some("👀"),
            Status::Answered => Some("👍"),
            Status::Failed => Some("👎"),
            Status::Cleared => None,
        }
    }
}

type Job = (ChatTarget, i32, Status);

/// Sets reactions on users' messages. Cheap to clone.
#[derive(Clone)]
pub struct Reactions {
    tx: mpsc::UnboundedSender<Job>,
}

impl Reactions {
    /// Start the worker sending through `delivery`. Must be called inside
    /// the runtime.
    pub fn spawn(delivery: Delivery) -> Reactions {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(worker(delivery, rx));
        Reactions { tx }
    }

    /// Show `status` on message `message_id` of `target` (never blocks).
    /// Messages without a Telegram id (internal events) are skipped.
    pub fn set(&self, target: ChatTarget, message_id: Option<i64>, status: Status) {
        let Some(id) = message_id
            .filter(|id| *id > 0)
            .and_then(|id| i32::try_from(id).ok())
        else {
            return;
        };
        let _ = self.tx.send((target, id, status));
    }
}

async fn worker(delivery: Delivery, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = rx.recv().await {
        // Whatever else is waiting: keep each message's newest status, in
        // the order the messages first appeared.
        let mut batch = vec![first];
        while let Ok(job) = rx.try_recv() {
            match batch
                .iter_mut()
                .find(|(t, id, _)| t.chat_id == job.0.chat_id && *id == job.1)
            {
                Some(waiting) => waiting.2 = job.2,
                None => batch.push(job),
            }
        }
        for (target, id, status) in batch {
            if let Err(error) = send(&delivery, target, id, status).await {
                tracing::debug!(chat_id = target.chat_id, %error, "could not set a reaction");
            }
        }
    }
}

async fn send(
    delivery: &Delivery,
    target: ChatTarget,
    id: i32,
    status: Status,
) -> Result<(), DeliveryError> {
    let reaction: Vec<ReactionType> = status
        .emoji()
        .map(|emoji| ReactionType::Emoji {
            emoji: emoji.to_string(),
        })
        .into_iter()
        .collect();
    delivery
        .call(target, Idempotence::Safe, |_| {
            delivery
                .bot()
                .set_message_reaction(ChatId(target.chat_id), MessageId(id))
                .reaction(reaction.clone())
                .send()
        })
        .await
        .map(|_| ())
}

/// A turn's live view that also reacts: 👍/👎 once its reply is delivered
/// (or not), no reaction if the turn ends without one.
pub struct ReactingLive {
    inner: Option<Box<dyn LiveReply>>,
    reactions: Reactions,
    target: ChatTarget,
    message_id: Option<i64>,
}

impl ReactingLive {
    /// Wrap `inner`, the live view of the turn answering `message_id`.
    pub fn new(
        inner: Box<dyn LiveReply>,
        reactions: Reactions,
        target: ChatTarget,
        message_id: Option<i64>,
    ) -> Self {
        ReactingLive {
            inner: Some(inner),
            reactions,
            target,
            message_id,
        }
    }
}

impl LiveReply for ReactingLive {
    fn finish(mut self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        let inner = self.inner.take();
        let reactions = self.reactions.clone();
        let (target, message_id) = (self.target, self.message_id);
        Box::pin(async move {
            let failed = reply.kind == ReplyKind::Error;
            let result = match inner {
                Some(inner) => inner.finish(reply).await,
                None => Ok(()),
            };
            let status = if failed || result.is_err() {
                Status::Failed
            } else {
                Status::Answered
            };
            reactions.set(target, message_id, status);
            result
        })
    }
}

impl Drop for ReactingLive {
    fn drop(&mut self) {
        // Dropped before `finish`: the turn ended without an answer.
        if self.inner.is_some() {
            self.reactions
                .set(self.target, self.message_id, Status::Cleared);
        }
    }
}
