//! Answers as Telegram voice notes (`sendVoice`, Ogg/Opus), at most once
//! like every answer ([`super::answer::deliver_text_answer_once`], whose
//! outbox record this shares).
//!
//! * No preview in the chat (drafts, or nothing streamed): the voice note
//!   carries the text as its caption when it fits (1024 characters);
//!   otherwise the text follows as messages (at most `max_answer_parts`,
//!   then the whole text as `answer.md`, as for any answer).
//! * A preview message shows the text already: it becomes the final text
//!   as usual, and the voice note follows it without a caption.
//! * Telegram refusing the voice note (a user who does not accept voice
//!   messages, say): the answer goes out as text with one line saying so.
//!
//! The intent is recorded before the voice note's request, so a restart
//! never sends it twice. This module must never decide whether an answer
//! is spoken (the runner and [`crate::media::speech`] do).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use teloxide::payloads::SendVoiceSetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, InputFile, Message, MessageId, ReplyParameters, ThreadId};
use teloxide::{Bot, RequestError};

use super::answer::{deliver_text_answer_once, plan_answer, send_as_file, tell_unconfirmed};
use super::entity::{to_telegram, FormattedText};
use super::files::upload_timeout;
use super::markdown::render;
use super::reply_record::ReplyRecord;
use super::telegram::{render_chunks, ChatTarget, Delivery, Idempotence};
use crate::reply::{DeliveryError, Reply, SendingStop};

/// Telegram's caption limit (UTF-16 units).
pub const CAPTION_LIMIT: usize = 1024;

/// The line a text answer gets when its voice note was refused.
pub const VOICE_REFUSED_LINE: &str =
    "🔇 (Telegram did not take the voice note, so here is the answer as text.)";

/// The caption for `text` (Markdown), if it fits in one.
pub fn caption_of(text: &str) -> Option<FormattedText> {
    let formatted = render(text);
    (!formatted.text.trim().is_empty() && formatted.utf16_len() <= CAPTION_LIMIT)
        .then_some(formatted)
}

/// `reply` with one more paragraph at its end.
pub fn with_line(reply: &Reply, line: &str) -> Reply {
    let mut text = reply.clone();
    text.voice = None;
    text.text = format!("{}\n\n{line}", reply.text.trim_end());
    text
}

/// Deliver `reply` (whose `voice` is the audio) at most once.
pub async fn deliver_voice_answer_once(
    delivery: &Delivery,
    target: ChatTarget,
    reply: &Reply,
    preview: Option<i32>,
    record: Option<&ReplyRecord>,
) -> Result<(), DeliveryError> {
    let Some(audio) = reply.voice.clone() else {
        return deliver_text_answer_once(delivery, target, reply, preview, record).await;
    };
    let mut text_only = reply.clone();
    text_only.voice = None;
    let mut preview = preview;
    if let Some(record) = record {
        if let Some(entry) = record.recorded().await {
            if entry.delivered || entry.sending {
                // Delivered, or an ambiguous send: the text path says so.
                return deliver_text_answer_once(
                    delivery,
                    target,
                    &text_only,
                    preview,
                    Some(record),
                )
                .await;
            }
            preview = preview.or(entry.reply_ids.first().copied());
        }
    }
    if let Some(preview) = preview {
        return voice_after_shown_text(delivery, target, &text_only, &audio, preview, record).await;
    }
    let sending = SendingStop::current();
    if sending.as_ref().is_some_and(|s| s.token().is_cancelled()) {
        if let Some(sending) = &sending {
            sending.note_parts(1, 1);
        }
        if let Some(record) = record {
            record.save(Vec::new(), true);
        }
        return Ok(());
    }
    let caption = caption_of(&reply.text);
    // The intent is durable right before the upload leaves (after its
    // turn and pacing), not before it waits for them.
    let intent = record.map(|record| record.intend(Vec::new()));
    let voice_id = match send_voice_recorded(
        delivery,
        target,
        &audio,
        caption.as_ref(),
        reply.reply_to,
        intent,
    )
    .await
    {
        Ok(id) => id,
        Err(DeliveryError::Rejected(why)) => {
            // Nothing went out: the answer is sent as text instead.
            tracing::info!(chat_id = target.chat_id, %why, "Telegram refused the voice note; answering in text");
            if let Some(record) = record {
                record.save(Vec::new(), false);
            }
            let fallback = with_line(reply, VOICE_REFUSED_LINE);
            return deliver_text_answer_once(delivery, target, &fallback, None, record).await;
        }
        Err(error) => return Err(told_if_unconfirmed(delivery, target, reply, error).await),
    };
    let mut ids = vec![voice_id];
    if caption.is_none() {
        // The text follows the voice note, as any answer would go out.
        ids.extend(text_after_voice(delivery, target, &text_only, sending.as_ref()).await?);
    }
    if let Some(record) = record {
        record.save(ids, true);
    }
    Ok(())
}

/// The chat shows the text already (preview message `preview`): it
/// becomes the answer, the voice note follows it (a voice note not sent
/// is only logged).
async fn voice_after_shown_text(
    delivery: &Delivery,
    target: ChatTarget,
    text_only: &Reply,
    audio: &Bytes,
    preview: i32,
    record: Option<&ReplyRecord>,
) -> Result<(), DeliveryError> {
    deliver_text_answer_once(delivery, target, text_only, Some(preview), record).await?;
    if let Err(error) = send_voice(delivery, target, audio, None, Some(i64::from(preview))).await {
        tracing::info!(chat_id = target.chat_id, %error, "the voice note after a shown answer was not sent");
    }
    Ok(())
}

/// The answer's text after its voice note (which had no room for it as a
/// caption), as any answer's: at most `max_answer_parts` messages, then
/// `answer.md`; parts a stop kept back are noted. The ids of the messages
/// sent; a failure the user could not be sure of is told.
async fn text_after_voice(
    delivery: &Delivery,
    target: ChatTarget,
    text_only: &Reply,
    sending: Option<&SendingStop>,
) -> Result<Vec<i32>, DeliveryError> {
    let chunks = render_chunks(text_only);
    let plan = plan_answer(chunks.len(), delivery.config().max_answer_parts);
    let stop = sending.map(SendingStop::token);
    let follow = Reply {
        reply_to: None,
        ..text_only.clone()
    };
    let sent = delivery
        .deliver_chunks_recorded(target, &follow, &chunks[..plan.messages], None, None, stop)
        .await;
    match sent {
        Ok(text_ids) => {
            let unsent = plan.messages - text_ids.len();
            if plan.as_file && unsent == 0 && !stop.is_some_and(|s| s.is_cancelled()) {
                send_as_file(delivery, target, &follow, plan.messages).await;
            }
            if let (Some(sending), true) = (sending, unsent > 0) {
                sending.note_parts(unsent, chunks.len());
            }
            Ok(text_ids)
        }
        Err(error) => Err(told_if_unconfirmed(delivery, target, text_only, error).await),
    }
}

/// `error`, after telling the chat (in reply to `reply`'s message) when
/// it leaves the answer's arrival unknown or it was not sent.
async fn told_if_unconfirmed(
    delivery: &Delivery,
    target: ChatTarget,
    reply: &Reply,
    error: DeliveryError,
) -> DeliveryError {
    if matches!(
        error,
        DeliveryError::Ambiguous(_) | DeliveryError::Unavailable(_)
    ) {
        tell_unconfirmed(delivery, target, reply.reply_to, &error).await;
    }
    error
}

/// The bot for one upload of `size` bytes: the delivery's token and API,
/// a client whose timeout fits the upload.
fn upload_bot(delivery: &Delivery, size: u64) -> Result<Bot, DeliveryError> {
    let bot = delivery.bot();
    let client = teloxide::net::default_reqwest_settings()
        .timeout(upload_timeout(size))
        .build()
        .map_err(|e| DeliveryError::Unavailable(format!("no HTTP client for the upload: {e}")))?;
    Ok(Bot::with_client(bot.token(), client).set_api_url(bot.api_url()))
}

/// `sendVoice` of `audio` (Ogg/Opus) with `caption`, replying to
/// `reply_to`. Not repeated when its outcome is unknown (an upload is not
/// idempotent).
pub async fn send_voice(
    delivery: &Delivery,
    target: ChatTarget,
    audio: &Bytes,
    caption: Option<&FormattedText>,
    reply_to: Option<i64>,
) -> Result<i32, DeliveryError> {
    let nothing: Option<std::future::Ready<()>> = None;
    send_voice_recorded(delivery, target, audio, caption, reply_to, nothing).await
}

/// [`send_voice`], `before_send` (its intent) awaited right before the
/// upload leaves ([`Delivery::call_recorded`]).
async fn send_voice_recorded<B: std::future::Future<Output = ()>>(
    delivery: &Delivery,
    target: ChatTarget,
    audio: &Bytes,
    caption: Option<&FormattedText>,
    reply_to: Option<i64>,
    before_send: Option<B>,
) -> Result<i32, DeliveryError> {
    let size = u64::try_from(audio.len()).unwrap_or(u64::MAX);
    let bot = upload_bot(delivery, size)?;
    let audio = Arc::new(audio.clone());
    let caption = caption.cloned();
    let entities = caption.as_ref().map(|c| to_telegram(&c.entities));
    let reply = reply_to
        .filter(|id| *id > 0)
        .and_then(|id| i32::try_from(id).ok())
        .map(|id| ReplyParameters::new(MessageId(id)).allow_sending_without_reply());
    let lane = super::telegram::Priority::Normal;
    let sent = delivery
        .call_recorded(
            target,
            Idempotence::Unsafe,
            lane,
            None,
            before_send,
            |plain| {
                let input = InputFile::memory((*audio).clone()).file_name("answer.ogg");
                let mut request = bot.send_voice(ChatId(target.chat_id), input);
                if let Some(caption) = &caption {
                    request = request.caption(caption.text.clone());
                    if let Some(entities) = entities.as_ref().filter(|e| !plain && !e.is_empty()) {
                        request = request.caption_entities(entities.clone());
                    }
                }
                if let Some(thread) = target.thread_id {
                    request = request.message_thread_id(ThreadId(MessageId(thread)));
                }
                if let Some(reply) = &reply {
                    request = request.reply_parameters(reply.clone());
                }
                let future: BoxFuture<'static, Result<Message, RequestError>> =
                    Box::pin(request.send());
                future
            },
        )
        .await?;
    sent.map(|m| m.id.0)
        .ok_or_else(|| DeliveryError::Rejected("unexpected 'not modified' on send".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caption_is_the_rendered_text_when_it_fits() {
        let caption = caption_of("**Hi** there").unwrap();
        assert_eq!(caption.text, "Hi there");
        assert!(!caption.entities.is_empty());
        assert!(caption_of(&"x".repeat(1024)).is_some());
        assert!(caption_of(&"x".repeat(1025)).is_none());
        // 512 emoji are 1024 UTF-16 units; one more does not fit.
        assert!(caption_of(&"😀".repeat(512)).is_some());
        assert!(caption_of(&"😀".repeat(513)).is_none());
        assert!(caption_of("  ").is_none());
    }

    #[test]
    fn the_fallback_keeps_the_text_and_adds_one_line() {
        let reply = Reply::answer("The answer.\n").with_voice(Bytes::from_static(b"OggS"));
        let text = with_line(&reply, VOICE_REFUSED_LINE);
        assert_eq!(text.text, format!("The answer.\n\n{VOICE_REFUSED_LINE}"));
        assert!(text.voice.is_none());
    }
}
