//! Files to Telegram: `sendPhoto` / `sendDocument` (multipart uploads)
//! through the delivery engine's pacing, per-chat ordering and retries.
//!
//! Uploads are not idempotent (a repeated send posts the file twice), so
//! an ambiguous failure is not retried. A photo Telegram refuses (bad
//! dimensions, say) is sent once more as a document. This module must
//! never decide which files may be sent: that is [`crate::media::outbox`].

use futures::future::BoxFuture;
use teloxide::payloads::{SendDocumentSetters, SendPhotoSetters};
use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, InputFile, MessageId, ReplyParameters, ThreadId};

use super::telegram::{ChatTarget, Delivery, Idempotence};
use crate::event::SessionSource;
use crate::media::outbox::{FileSender, OutgoingFile};
use crate::reply::DeliveryError;

/// Telegram's caption limit (characters).
const CAPTION_LIMIT: usize = 1024;

/// Sends files through a [`Delivery`].
#[derive(Clone)]
pub struct TelegramFileSender {
    delivery: Delivery,
}

impl TelegramFileSender {
    /// A sender using `delivery`.
    pub fn new(delivery: Delivery) -> Self {
        TelegramFileSender { delivery }
    }

    async fn send(
        &self,
        target: ChatTarget,
        file: &OutgoingFile,
        as_photo: bool,
    ) -> Result<i64, DeliveryError> {
        let caption: Option<String> = file
            .caption
            .as_ref()
            .map(|c| c.chars().take(CAPTION_LIMIT).collect());
        let reply = file
            .reply_to
            .filter(|id| *id > 0)
            .and_then(|id| i32::try_from(id).ok())
            .map(|id| ReplyParameters::new(MessageId(id)).allow_sending_without_reply());
        let bot = self.delivery.bot().clone();
        let path = file.path.clone();
        let sent = self
            .delivery
            .call(target, Idempotence::Unsafe, |_plain| {
                let chat = ChatId(target.chat_id);
                let thread = target.thread_id.map(|t| ThreadId(MessageId(t)));
                let input = InputFile::file(path.clone());
                if as_photo {
                    let mut request = bot.send_photo(chat, input);
                    if let Some(caption) = &caption {
                        request = request.caption(caption.clone());
                    }
                    if let Some(thread) = thread {
                        request = request.message_thread_id(thread);
                    }
                    if let Some(reply) = &reply {
                        request = request.reply_parameters(reply.clone());
                    }
                    futures::future::Either::Left(request.send())
                } else {
                    let mut request = bot.send_document(chat, input);
                    if let Some(caption) = &caption {
                        request = request.caption(caption.clone());
                    }
                    if let Some(thread) = thread {
                        request = request.message_thread_id(thread);
                    }
                    if let Some(reply) = &reply {
                        request = request.reply_parameters(reply.clone());
                    }
                    futures::future::Either::Right(request.send())
                }
            })
            .await?;
        sent.map(|m| i64::from(m.id.0))
            .ok_or_else(|| DeliveryError::Rejected("unexpected 'not modified' on send".into()))
    }
}

impl FileSender for TelegramFileSender {
    fn send_file<'a>(
        &'a self,
        to: &'a SessionSource,
        file: &'a OutgoingFile,
    ) -> BoxFuture<'a, Result<i64, DeliveryError>> {
        Box::pin(async move {
            let target = ChatTarget::of(to);
            match self.send(target, file, file.as_photo).await {
                Err(DeliveryError::Rejected(why)) if file.as_photo => {
                    tracing::info!(%why, "Telegram refused the photo; sending it as a document");
                    self.send(target, file, false).await
                }
                other => other,
            }
        })
    }
}
