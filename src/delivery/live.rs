//! A running turn's live view in the chat: the typing indicator and the
//! streamed preview.
//!
//! One small task per turn refreshes "typing…" every few seconds and shows
//! the agent's partial output by editing a single preview message, at most
//! once per `edit_interval`, only when the text changed, always with the
//! newest text (intermediate states are skipped, not queued). When the turn
//! finishes, the task is stopped *before* the final text is delivered, and
//! the final text replaces the preview in place: one message, never a
//! preview followed by a duplicate. A turn that ends without an answer
//! simply stops the task.

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::entity::FormattedText;
use super::markdown::render;
use super::split::{split, TELEGRAM_LIMIT};
use super::telegram::{deliver_answer_once, ChatTarget, Delivery, ReplyRecord};
use crate::agent::ProgressWatch;
use crate::reply::{DeliveryError, LiveReply, Reply};

/// The live view of one turn.
pub struct LiveView {
    delivery: Delivery,
    target: ChatTarget,
    record: Option<ReplyRecord>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Option<i32>>>,
}

impl LiveView {
    /// Start showing a turn in `target`.
    pub fn start(
        delivery: Delivery,
        target: ChatTarget,
        progress: ProgressWatch,
        record: Option<ReplyRecord>,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(show_progress(
            delivery.clone(),
            target,
            progress,
            stopped,
            record.clone(),
        ));
        LiveView {
            delivery,
            target,
            record,
            stop: Some(stop),
            task: Some(task),
        }
    }
}

/// The preview of partial output: rendered, cut to one message.
fn preview_of(text: &str) -> Option<FormattedText> {
    if text.trim().is_empty() {
        return None;
    }
    let rendered = render(text);
    let mut chunks = split(&rendered, TELEGRAM_LIMIT - 2);
    if chunks.is_empty() {
        return None;
    }
    let mut first = chunks.swap_remove(0);
    if !chunks.is_empty() {
        first.text.push_str(" …");
    }
    Some(first)
}

async fn show_progress(
    delivery: Delivery,
    target: ChatTarget,
    mut progress: ProgressWatch,
    mut stopped: oneshot::Receiver<()>,
    record: Option<ReplyRecord>,
) -> Option<i32> {
    let typing_every = delivery.config().typing_interval;
    let edit_every = delivery.config().edit_interval;
    // A turn resumed after a restart continues the preview it had.
    let mut preview: Option<i32> = match &record {
        Some(record) => record
            .recorded()
            .await
            .filter(|entry| !entry.delivered)
            .and_then(|entry| entry.reply_ids.first().copied()),
        None => None,
    };
    let mut shown = String::new();
    let mut next_typing = Instant::now();
    let mut next_edit = Instant::now() + edit_every;
    let mut pending_change = false;
    let mut writer_alive = true;
    loop {
        let wake_edit = pending_change.then_some(next_edit);
        tokio::select! {
            biased;
            _ = &mut stopped => return preview,
            _ = tokio::time::sleep_until(next_typing) => {
                next_typing = Instant::now() + typing_every;
                // Telegram hides "typing" once a message is sent; keep it
                // only until the preview exists.
                if preview.is_none() {
                    delivery.typing(target).await;
                }
            }
            changed = progress.changed(), if writer_alive && !pending_change => {
                writer_alive = changed;
                pending_change = changed;
            }
            _ = sleep_until_opt(wake_edit) => {
                pending_change = false;
                next_edit = Instant::now() + edit_every;
                let latest = progress.latest();
                if latest == shown {
                    continue;
                }
                let Some(formatted) = preview_of(&latest) else { continue };
                let result = match preview {
                    None => delivery.send_chunk(target, &formatted, None).await.map(Some),
                    Some(id) => delivery.edit_chunk(target, id, &formatted).await.map(|()| None),
                };
                match result {
                    Ok(Some(id)) => {
                        preview = Some(id);
                        if let Some(record) = &record {
                            record.save(vec![id], false).await;
                        }
                    }
                    Ok(None) => {}
                    Err(error) => tracing::debug!(chat_id = target.chat_id, %error, "preview update failed"),
                }
                shown = latest;
            }
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl LiveView {
    async fn stop_and_join(&mut self) -> Option<i32> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.ok().flatten(),
            None => None,
        }
    }
}

impl LiveReply for LiveView {
    fn finish(mut self: Box<Self>, reply: Reply) -> BoxFuture<'static, Result<(), DeliveryError>> {
        Box::pin(async move {
            // Stop the preview first, so no edit can race the final text.
            let preview = self.stop_and_join().await;
            deliver_answer_once(
                &self.delivery,
                self.target,
                &reply,
                preview,
                self.record.as_ref(),
            )
            .await
        })
    }
}

impl Drop for LiveView {
    fn drop(&mut self) {
        // The turn ended without an answer: stop showing it.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
