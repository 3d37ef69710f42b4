//! A final answer, at most once: the outbox record ([`ReplyRecord`]) says
//! what went out before (also before a restart), an answer goes out in at
//! most `max_answer_parts` messages (then as `answer.md`, [`plan_answer`],
//! pure), stops at a [`SendingStop`], and one whose send went unconfirmed
//! is never repeated blindly: its sender is told instead.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::reply_record::ReplyRecord;
use super::telegram::{ChatTarget, Delivery};
use crate::reply::{DeliveryError, Reply, SendingStop};

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

/// Deliver a final answer in text at most once (a spoken one goes through
/// [`super::final_answer::deliver_answer_once`]): skipped if the outbox says it was
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
pub async fn deliver_text_answer_once(
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
    if let Some(sending) = &sending {
        if unsent > 0 {
            sending.note_parts(unsent, chunks.len());
        }
        sending.answer_sent();
    }
    // Delivered as far as it will ever be: what a stop left out is not
    // sent later either.
    if let Some(record) = record {
        record.save(ids, true);
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
pub(super) async fn send_as_file(
    delivery: &Delivery,
    target: ChatTarget,
    reply: &Reply,
    messages: usize,
) {
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
/// arrived, as soon as Telegram answers again, retried until Telegram
/// confirms the notice ([`deliver_notice_until_confirmed`]). Meanwhile the
/// message's inbox row stays open and the answer's intent recorded, so a
/// restart in between tells the sender itself: the notice is a recorded
/// intent until it is confirmed.
pub(super) async fn tell_unconfirmed(
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
    let notice = Reply::notice(UNCONFIRMED_ANSWER_NOTICE).in_reply_to(reply_to);
    if let Err(error) = deliver_notice_until_confirmed(delivery, target, &notice).await {
        tracing::warn!(chat_id = target.chat_id, %error, "could not tell a user that an answer may not have arrived");
    }
}

/// The longest wait between two tries of a notice that went unconfirmed.
const MAX_NOTICE_WAIT: Duration = Duration::from_secs(60);

/// Send `notice` (a notice that something may be lost) until Telegram
/// confirms it: each try first waits until Telegram answers again
/// ([`Delivery::wait_until_answering`]); a try that goes unconfirmed (no
/// answer, garbage, unavailable beyond the retries) is tried again after a
/// wait (1 s, doubling, at most a minute). Only a refusal ends it unsent
/// (returned). An unconfirmed try may have arrived, so the user may see
/// the notice twice: better than a lost answer no word is said of.
pub async fn deliver_notice_until_confirmed(
    delivery: &Delivery,
    target: ChatTarget,
    notice: &Reply,
) -> Result<(), DeliveryError> {
    let mut wait = Duration::from_secs(1);
    loop {
        delivery.wait_until_answering().await;
        match delivery.deliver_reply(target, notice, None).await {
            Ok(_) => return Ok(()),
            Err(DeliveryError::Ambiguous(why) | DeliveryError::Unavailable(why)) => {
                tracing::info!(chat_id = target.chat_id, %why, ?wait, "a notice went unconfirmed; trying again");
            }
            Err(other) => return Err(other),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_NOTICE_WAIT);
    }
}
