//! Which way a final answer goes out: spoken (a voice note carrying the
//! text, [`super::voice`]) or as text ([`super::answer`]), each at most
//! once. This file only chooses; it must never send anything itself.

use super::answer::deliver_text_answer_once;
use super::reply_record::ReplyRecord;
use super::telegram::{ChatTarget, Delivery};
use super::voice::deliver_voice_answer_once;
use crate::reply::{DeliveryError, Reply};

/// Deliver a final answer at most once: a reply with `voice` as a voice
/// note ([`deliver_voice_answer_once`]), any other as text
/// ([`deliver_text_answer_once`], which says what "at most once" means).
pub async fn deliver_answer_once(
    delivery: &Delivery,
    target: ChatTarget,
    reply: &Reply,
    preview: Option<i32>,
    record: Option<&ReplyRecord>,
) -> Result<(), DeliveryError> {
    if reply.voice.is_some() {
        // A spoken answer: a voice note carrying the text (delivery::voice).
        return Box::pin(deliver_voice_answer_once(
            delivery, target, reply, preview, record,
        ))
        .await;
    }
    deliver_text_answer_once(delivery, target, reply, preview, record).await
}
