//! Files to Telegram: `sendPhoto` / `sendDocument` (multipart uploads)
//! through the delivery engine's pacing, per-chat ordering and retries.
//!
//! The upload reads the handle [`crate::media::outbox`] opened and checked
//! (from its start on every attempt), never the path again. Its timeout is
//! sized by the file ([`upload_timeout`]): teloxide's client gives every
//! request 17 s, which a large file on a slow uplink needs more than, so
//! each upload goes through a client of its own with a timeout of a floor
//! plus the time the file takes at a low throughput.
//!
//! Uploads are not idempotent (a repeated send posts the file twice), so
//! an ambiguous failure is not retried. A photo Telegram refuses (bad
//! dimensions, say) is sent once more as a document. This module must
//! never decide which files may be sent: that is [`crate::media::outbox`].

use std::io::{Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use teloxide::payloads::{SendDocumentSetters, SendPhotoSetters};
use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, InputFile, Message, MessageId, ReplyParameters, ThreadId};
use teloxide::{Bot, RequestError};

use super::telegram::{ChatTarget, Delivery, Idempotence};
use crate::media::outbox::{FileBody, FileSender, OutgoingFile};
use crate::reply::DeliveryError;
use crate::vocab::SessionSource;

/// Telegram's caption limit (characters).
const CAPTION_LIMIT: usize = 1024;

/// Every upload may take at least this long (Telegram's answer included).
pub const UPLOAD_TIMEOUT_FLOOR: Duration = Duration::from_secs(30);

/// The slowest upload throughput allowed for (bytes per second): 50 MB
/// then take about 13 minutes.
pub const UPLOAD_MIN_BYTES_PER_SEC: u64 = 64 * 1024;

/// How long an upload of `size` bytes may take before it counts as failed:
/// the floor plus the time `size` takes at the lowest throughput.
pub fn upload_timeout(size: u64) -> Duration {
    UPLOAD_TIMEOUT_FLOOR + Duration::from_secs(size.div_ceil(UPLOAD_MIN_BYTES_PER_SEC))
}

/// Sends files through a [`Delivery`].
#[derive(Clone)]
pub struct TelegramFileSender {
    delivery: Delivery,
}

/// One attempt's file part, read from the start of `body`.
fn input_file(body: &FileBody, name: &str) -> std::io::Result<InputFile> {
    let input = match body {
        FileBody::Opened { file, .. } => {
            // A duplicate shares the offset; attempts run one after the
            // other, and each starts at the beginning.
            let mut dup = file.try_clone()?;
            dup.seek(SeekFrom::Start(0))?;
            InputFile::read(tokio::fs::File::from_std(dup))
        }
        FileBody::Bytes(bytes) => InputFile::memory(bytes.clone()),
    };
    Ok(input.file_name(name.to_string()))
}

impl TelegramFileSender {
    /// A sender using `delivery`.
    pub fn new(delivery: Delivery) -> Self {
        TelegramFileSender { delivery }
    }

    /// The bot for one upload: the delivery's token and API, a client
    /// whose timeout fits `size`.
    fn upload_bot(&self, size: u64) -> Result<Bot, DeliveryError> {
        let bot = self.delivery.bot();
        let client = teloxide::net::default_reqwest_settings()
            .timeout(upload_timeout(size))
            .build()
            .map_err(|e| {
                DeliveryError::Unavailable(format!("no HTTP client for the upload: {e}"))
            })?;
        Ok(Bot::with_client(bot.token(), client).set_api_url(bot.api_url()))
    }

    /// Send `file` to `target` (photo refused → document once more).
    pub async fn upload(
        &self,
        target: ChatTarget,
        file: &OutgoingFile,
    ) -> Result<i64, DeliveryError> {
        let bot = self.upload_bot(file.body.size())?;
        match self.send(&bot, target, file, file.as_photo).await {
            Err(DeliveryError::Rejected(why)) if file.as_photo => {
                tracing::info!(%why, "Telegram refused the photo; sending it as a document");
                self.send(&bot, target, file, false).await
            }
            other => other,
        }
    }

    async fn send(
        &self,
        bot: &Bot,
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
        let body = Arc::new(file.body.clone());
        let sent = self
            .delivery
            .call(target, Idempotence::Unsafe, |_plain| {
                let chat = ChatId(target.chat_id);
                let thread = target.thread_id.map(|t| ThreadId(MessageId(t)));
                let input = match input_file(&body, &file.name) {
                    Ok(input) => input,
                    Err(error) => {
                        let failed: BoxFuture<'static, Result<Message, RequestError>> = Box::pin(
                            futures::future::ready(Err(RequestError::Io(Arc::new(error)))),
                        );
                        return failed;
                    }
                };
                let request: BoxFuture<'static, Result<Message, RequestError>> = if as_photo {
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
                    Box::pin(request.send())
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
                    Box::pin(request.send())
                };
                request
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
        Box::pin(self.upload(ChatTarget::of(to), file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upload_timeout_grows_with_the_file() {
        assert_eq!(upload_timeout(0), UPLOAD_TIMEOUT_FLOOR);
        assert_eq!(
            upload_timeout(1),
            UPLOAD_TIMEOUT_FLOOR + Duration::from_secs(1)
        );
        let fifty_mb = upload_timeout(crate::media::UPLOAD_LIMIT);
        assert_eq!(fifty_mb, UPLOAD_TIMEOUT_FLOOR + Duration::from_secs(800));
        // Always more than teloxide's fixed 17 s.
        assert!(upload_timeout(0) > Duration::from_secs(17));
        assert!(upload_timeout(10 << 20) > upload_timeout(1 << 20));
    }

    #[test]
    fn every_attempt_reads_the_file_from_its_start() {
        use std::io::{Read, Write};
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"content").unwrap();
        let body = FileBody::Opened {
            file: Arc::new(file),
            size: 7,
        };
        for _ in 0..2 {
            let _ = input_file(&body, "a.txt").unwrap();
            let FileBody::Opened { file, .. } = &body else {
                unreachable!()
            };
            let mut read = String::new();
            (&**file).read_to_string(&mut read).unwrap();
            assert_eq!(read, "content", "the attempt's reader starts at 0");
            // Leave the offset at the end, as a finished upload would.
        }
    }
}
