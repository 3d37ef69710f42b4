//! A running turn's live view in the chat: the typing indicator and the
//! streamed preview.
//!
//! One small task per turn refreshes "typing…" every few seconds (first
//! once the turn has run for `typing_delay`: an instant answer shows none)
//! and shows the agent's partial output by editing a single preview
//! message: the first text after 25 ms, then at most once per
//! `edit_interval`, only when the text changed, always with the newest
//! text (intermediate states are skipped, not queued). When the turn
//! finishes, the task is stopped *before* the final text is delivered, and
//! the final text replaces the preview in place: one message, never a
//! preview followed by a duplicate.
//!
//! A turn stopped (/stop, /new, /reset) or interrupted stops showing itself
//! at once: an edit or typing action not yet sent is dropped, never sent
//! late. Its preview keeps the text it had and gets one final edit with a
//! marker (`⏹ stopped` / `⚡ interrupted`), sent only after the command's
//! reply is out. Nothing else of the cancelled turn is sent. A turn that
//! ends without an answer for another reason (shutdown: a restart resumes
//! it) simply stops the task.
//!
//! In private chats the partial answer may stream as a Telegram draft
//! instead (`[delivery] streaming`, see [`super::draft`]): no preview
//! message exists then, the final answer is sent as a new message through
//! the outbox, and a refused draft falls back to the edited preview.
//!
//! With a store, the preview carries a Stop button bound to the turn's
//! generation ([`StopButton`]); every preview edit keeps it, and every last
//! edit takes it away (an edit without a keyboard removes it): the final
//! text, the stop marker, or, for a turn that ended without either, an edit
//! of the keyboard alone.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use teloxide::types::InlineKeyboardMarkup;

use super::draft::{is_refusal, send_draft, DraftStream};
use super::entity::FormattedText;
use super::final_answer::deliver_answer_once;
use super::keyboard::{clear_markup, register};
use super::markdown::render;
use super::reply_record::ReplyRecord;
use super::split::{split, TELEGRAM_LIMIT};
use super::telegram::{ChatTarget, ChunkSend, Delivery, Priority};
use crate::reply::{DeliveryError, LiveReply, Reply};
use crate::store::Buttons;
use crate::vocab::{Button, ProgressWatch, SessionSource, TurnEnd};

/// The Stop button a preview offers: /stop for the turn of `generation`,
/// bound to the user of `to`.
#[derive(Clone)]
pub struct StopButton {
    buttons: Buttons,
    to: SessionSource,
    generation: u64,
}

impl StopButton {
    /// The Stop button of the turn of `generation` in the chat of `to`.
    pub fn new(buttons: Buttons, to: SessionSource, generation: u64) -> Self {
        StopButton {
            buttons,
            to,
            generation,
        }
    }

    async fn markup(&self) -> Option<InlineKeyboardMarkup> {
        register(
            Some(&self.buttons),
            &self.to,
            &[Button::stop(self.generation)],
        )
        .await
    }
}

/// How long a turn's first text waits before it shows as a draft or a
/// preview: long enough for an instant answer (or failure) to arrive as
/// one message, short enough to stay within the first-token target
/// (`benches/first_token.rs`, p99 ≤ 50 ms).
pub const FIRST_PREVIEW_DELAY: std::time::Duration = std::time::Duration::from_millis(25);

/// The live view of one turn.
pub struct LiveView {
    delivery: Delivery,
    target: ChatTarget,
    record: Option<ReplyRecord>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Option<i32>>>,
    /// How the turn ends, read when it is dropped unanswered.
    progress: ProgressWatch,
    /// What the chat shows of the turn so far.
    shown: Arc<Mutex<Shown>>,
    /// Withdraws preview updates not yet sent: fires when the turn ends
    /// unanswered (a child of its `ending`) or the view is dropped.
    halt: CancellationToken,
}

/// The preview as the chat has it (or is about to: an edit in flight).
#[derive(Default)]
struct Shown {
    preview: Option<i32>,
    text: String,
    /// The preview carries a Stop button.
    button: bool,
}

impl LiveView {
    /// Start showing a turn in `target`.
    pub fn start(
        delivery: Delivery,
        target: ChatTarget,
        progress: ProgressWatch,
        record: Option<ReplyRecord>,
    ) -> Self {
        LiveView::start_with_stop(delivery, target, progress, record, None, None)
    }

    /// Like [`LiveView::start`], with a Stop button on the preview.
    pub fn start_with_stop(
        delivery: Delivery,
        target: ChatTarget,
        progress: ProgressWatch,
        record: Option<ReplyRecord>,
        button: Option<StopButton>,
        draft: Option<DraftStream>,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        let shown = Arc::new(Mutex::new(Shown::default()));
        let watch = progress.clone();
        let halt = progress.ending().child_token();
        let task = tokio::spawn(show_progress(PreviewTask {
            delivery: delivery.clone(),
            target,
            progress,
            stopped,
            halt: halt.clone(),
            record: record.clone(),
            shown_in_chat: shown.clone(),
            button,
            draft,
        }));
        LiveView {
            delivery,
            target,
            record,
            stop: Some(stop),
            task: Some(task),
            progress: watch,
            shown,
            halt,
        }
    }
}

/// The preview of partial output: rendered, cut to one message.
fn preview_of(text: &str) -> Option<FormattedText> {
    preview_within(text, TELEGRAM_LIMIT - 2)
}

/// The final look of a stopped or interrupted turn's preview: the text it
/// had, then the marker, within one message.
fn marked_preview(text: &str, end: TurnEnd) -> Option<FormattedText> {
    let marker = format!("\n\n{}", end.marker());
    let units = marker.encode_utf16().count();
    let mut preview = preview_within(text, TELEGRAM_LIMIT - 2 - units)?;
    preview.text.push_str(&marker);
    Some(preview)
}

fn preview_within(text: &str, limit: usize) -> Option<FormattedText> {
    if text.trim().is_empty() {
        return None;
    }
    let rendered = render(text);
    let mut chunks = split(&rendered, limit);
    if chunks.is_empty() {
        return None;
    }
    let mut first = chunks.swap_remove(0);
    if !chunks.is_empty() {
        first.text.push_str(" …");
    }
    Some(first)
}

/// Everything the preview task of one turn owns.
struct PreviewTask {
    delivery: Delivery,
    target: ChatTarget,
    progress: ProgressWatch,
    /// Fires when the view stops the task (the answer is about to go out).
    stopped: oneshot::Receiver<()>,
    /// Withdraws preview updates not yet sent.
    halt: CancellationToken,
    record: Option<ReplyRecord>,
    shown_in_chat: Arc<Mutex<Shown>>,
    button: Option<StopButton>,
    draft: Option<DraftStream>,
}

/// The preview loop: waits for the turn's events (stopped, ended, typing
/// due, progress, edit due) and handles each with one method. Returns the
/// preview's message id, if one was sent.
async fn show_progress(task: PreviewTask) -> Option<i32> {
    let PreviewTask {
        delivery,
        target,
        mut progress,
        mut stopped,
        halt,
        record,
        shown_in_chat,
        button,
        draft,
    } = task;
    let ending = progress.ending();
    let mut view =
        PreviewLoop::resume(delivery, target, halt, record, shown_in_chat, button, draft).await;
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            // Stopped or interrupted: nothing more of this turn is sent
            // (the marker is the view's last word, see `Drop`).
            _ = ending.cancelled() => break,
            _ = tokio::time::sleep_until(view.next_typing) => view.typing_due().await,
            changed = progress.changed(), if view.wants_progress() => view.progressed(changed),
            _ = sleep_until_opt(view.edit_due_at()) => {
                if view.edit_due(progress.latest()).await.is_break() {
                    break;
                }
            }
        }
    }
    view.preview
}

/// The preview loop's state between events.
struct PreviewLoop {
    delivery: Delivery,
    target: ChatTarget,
    halt: CancellationToken,
    record: Option<ReplyRecord>,
    shown_in_chat: Arc<Mutex<Shown>>,
    button: Option<StopButton>,
    /// The draft this turn streams into, while drafts work.
    draft: Option<DraftStream>,
    /// The preview message, once sent (or resumed).
    preview: Option<i32>,
    /// The text last shown (or attempted).
    shown: String,
    /// The Stop button's keyboard, once registered.
    markup: Option<InlineKeyboardMarkup>,
    /// A draft has shown text.
    drafted: bool,
    typing_every: std::time::Duration,
    edit_every: std::time::Duration,
    next_typing: Instant,
    next_edit: Instant,
    /// The text changed since it was last shown.
    pending_change: bool,
    /// The turn may still report progress.
    writer_alive: bool,
}

impl PreviewLoop {
    /// The loop's first state; a turn resumed after a restart continues
    /// the preview it had.
    async fn resume(
        delivery: Delivery,
        target: ChatTarget,
        halt: CancellationToken,
        record: Option<ReplyRecord>,
        shown_in_chat: Arc<Mutex<Shown>>,
        button: Option<StopButton>,
        mut draft: Option<DraftStream>,
    ) -> PreviewLoop {
        let typing_every = delivery.config().typing_interval;
        let edit_every = delivery.config().edit_interval;
        let preview: Option<i32> = match &record {
            Some(record) => record
                .recorded()
                .await
                .filter(|entry| !entry.delivered)
                .and_then(|entry| entry.reply_ids.first().copied()),
            None => None,
        };
        // A resumed turn whose preview exists keeps editing it.
        if preview.is_some() {
            draft = None;
        }
        // A turn that answers at once never shows "typing…".
        let next_typing = Instant::now() + delivery.config().typing_delay;
        // The first text shows almost at once (what a user feels first is how
        // soon the answer starts moving): after [`FIRST_PREVIEW_DELAY`], so a
        // turn that ends that soon answers in one message, no preview first;
        // `edit_interval` paces the updates after it.
        let next_edit = Instant::now() + edit_every.min(FIRST_PREVIEW_DELAY);
        shown_in_chat
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .preview = preview;
        PreviewLoop {
            delivery,
            target,
            halt,
            record,
            shown_in_chat,
            button,
            draft,
            preview,
            shown: String::new(),
            markup: None,
            drafted: false,
            typing_every,
            edit_every,
            next_typing,
            next_edit,
            pending_change: false,
            writer_alive: true,
        }
    }

    /// Typing is due: shown only until the preview exists (Telegram hides
    /// "typing" once a message is sent).
    async fn typing_due(&mut self) {
        self.next_typing = Instant::now() + self.typing_every;
        if self.preview.is_none() && !self.drafted {
            self.delivery.typing(self.target).await;
        }
    }

    /// Waits for progress only while the turn may report some and no
    /// change is waiting to be shown.
    fn wants_progress(&self) -> bool {
        self.writer_alive && !self.pending_change
    }

    /// The turn reported progress (`changed`), or its writer is gone.
    fn progressed(&mut self, changed: bool) {
        self.writer_alive = changed;
        self.pending_change = changed;
    }

    /// When the next edit is due: only with a change waiting.
    fn edit_due_at(&self) -> Option<Instant> {
        self.pending_change.then_some(self.next_edit)
    }

    /// An edit is due: show `latest` as a draft or in the preview.
    /// `Break` ends the loop (the turn was stopped meanwhile).
    async fn edit_due(&mut self, latest: String) -> ControlFlow<()> {
        self.pending_change = false;
        self.next_edit = Instant::now() + self.edit_every;
        if latest == self.shown {
            return ControlFlow::Continue(());
        }
        let Some(formatted) = preview_of(&latest) else {
            return ControlFlow::Continue(());
        };
        if self.draft.is_some() {
            return self.show_draft(latest, &formatted).await;
        }
        self.show_preview(latest, &formatted).await
    }

    /// Streams `latest` into the draft; a refused draft turns this turn
    /// into an edited preview, now.
    async fn show_draft(&mut self, latest: String, formatted: &FormattedText) -> ControlFlow<()> {
        let Some(stream) = &self.draft else {
            return ControlFlow::Continue(());
        };
        let target = self.target;
        let priority = if self.drafted {
            Priority::Normal
        } else {
            Priority::FirstText
        };
        // A draft waiting for its turn when the turn is stopped
        // is dropped, like an edit.
        let result = tokio::select! {
            biased;
            _ = self.halt.cancelled() => return ControlFlow::Break(()),
            result = send_draft(&self.delivery, target, stream.id, formatted, priority) => result,
        };
        match result {
            Ok(()) => {
                self.drafted = true;
                self.shown = latest;
            }
            Err(error) if is_refusal(&error) => {
                // Refused (old server, not a private chat):
                // this turn goes on as an edited preview, now.
                stream.drafts.refused(target.chat_id, &error);
                self.draft = None;
                self.pending_change = true;
                self.next_edit = Instant::now();
            }
            Err(error) => {
                tracing::debug!(chat_id = target.chat_id, %error, "draft update failed")
            }
        }
        ControlFlow::Continue(())
    }

    /// Sends the preview with `latest` (its intent recorded right before
    /// its request) or edits it.
    async fn show_preview(&mut self, latest: String, formatted: &FormattedText) -> ControlFlow<()> {
        let target = self.target;
        // An update still waiting for its turn when the turn is
        // stopped is withdrawn; one already sent runs to its answer,
        // so a preview that reached the chat is always known (and
        // gets its marker).
        let sending_preview = self.preview.is_none();
        let withdraw = Some(&self.halt);
        let result = match self.preview {
            None => {
                let registered = OnceLock::new();
                let before_send = self.prepare_send(&registered);
                let markup = || {
                    self.markup
                        .as_ref()
                        .or_else(|| registered.get().and_then(Option::as_ref))
                };
                let send = ChunkSend {
                    target,
                    chunk: formatted,
                    reply_to: None,
                    priority: Priority::FirstText,
                };
                let sent = self
                    .delivery
                    .send_chunk_recorded(send, withdraw, markup, Some(before_send))
                    .await;
                if self.markup.is_none() {
                    self.markup = registered.into_inner().flatten();
                }
                sent.map(Some)
            }
            Some(id) => {
                if let (None, Some(button)) = (&self.markup, &self.button) {
                    self.markup = button.markup().await;
                }
                let markup = self.markup.as_ref();
                self.delivery
                    .edit_chunk_unless_withdrawn(target, id, formatted, withdraw, markup)
                    .await
                    .map(|()| None)
            }
        };
        let flow = self.preview_sent(result, &latest, sending_preview).await;
        if flow.is_continue() {
            self.shown = latest;
        }
        flow
    }

    /// Right before a new preview message's request (after its turn and
    /// pacing): its intent is made durable and the Stop button registered
    /// (into `registered`).
    ///
    /// A new preview message is a send like the answer's: its
    /// intent is durable before the request, so a restart that finds the
    /// intent without an outcome knows the text may be in the
    /// chat and does not send it again (an ambiguous send); one that
    /// finds none knows it never left. The Stop button is registered
    /// meanwhile: both calls wait for one commit of the store, not one
    /// each.
    async fn prepare_send(&self, registered: &OnceLock<Option<InlineKeyboardMarkup>>) {
        let record = &self.record;
        let intend = async {
            if let Some(record) = record {
                record.intend(Vec::new()).await;
            }
        };
        let (markup, button) = (&self.markup, &self.button);
        let register = async {
            match (markup, button) {
                (None, Some(button)) => button.markup().await,
                _ => None,
            }
        };
        let ((), markup) = tokio::join!(intend, register);
        let _ = registered.set(markup);
    }

    /// The preview's send or edit answered: what the chat shows now is
    /// recorded. `Break` when it was withdrawn (the turn was stopped).
    async fn preview_sent(
        &mut self,
        result: Result<Option<i32>, DeliveryError>,
        latest: &str,
        sending_preview: bool,
    ) -> ControlFlow<()> {
        match result {
            Ok(Some(id)) => {
                self.preview = Some(id);
                {
                    let mut shown = self
                        .shown_in_chat
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    shown.preview = Some(id);
                    shown.text = latest.to_string();
                    shown.button = self.markup.is_some();
                }
                if let Some(record) = &self.record {
                    record.save(vec![id], false);
                }
            }
            Ok(None) => {
                let mut shown = self
                    .shown_in_chat
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                shown.text = latest.to_string();
                shown.button = self.markup.is_some();
            }
            Err(error) => {
                // The preview did not go out (withdrawn, refused) or
                // its outcome is unknown: either way the answer
                // still goes out as a new message, so the intent
                // is cleared (a partial preview may stay behind).
                if let (true, Some(record)) = (sending_preview, &self.record) {
                    record.save(Vec::new(), false);
                }
                if matches!(error, DeliveryError::Withdrawn) {
                    return ControlFlow::Break(());
                }
                tracing::debug!(chat_id = self.target.chat_id, %error, "preview update failed");
            }
        }
        ControlFlow::Continue(())
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl LiveView {
    /// The preview the chat shows, if any.
    fn shown_preview(&self) -> Option<i32> {
        self.shown
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .preview
    }

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
            // The final text replaces the preview (and its Stop button):
            // nothing is left for `Drop` to tidy.
            self.shown
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .preview = None;
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
        // The turn ended without an answer: stop showing it. Updates still
        // waiting are withdrawn; the task is not aborted, so a preview
        // request already sent runs to its answer and the preview's id is
        // known when the marker goes out.
        self.halt.cancel();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take();
        // The preview task was joined (the answer went out: `finish`), so
        // what the chat shows is final: without a preview there is nothing
        // to tidy, and no task to start for it (one per answered turn).
        if task.is_none() && self.shown_preview().is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let delivery = self.delivery.clone();
        let target = self.target;
        let shown = self.shown.clone();
        let ended = self.progress.ended();
        runtime.spawn(async move {
            if let Some(task) = task {
                let _ = task.await;
            }
            let (preview, text, button) = {
                let shown = shown.lock().unwrap_or_else(PoisonError::into_inner);
                (shown.preview, shown.text.clone(), shown.button)
            };
            let Some(preview) = preview else { return };
            match ended {
                // Stopped or interrupted: the preview keeps its text and
                // gets its marker, once the command's reply is out. The
                // marker edit carries no keyboard, so it also takes the
                // Stop button away.
                Some((end, after)) => {
                    let Some(marked) = marked_preview(&text, end) else {
                        return;
                    };
                    after.cancelled().await;
                    if let Err(error) = delivery.edit_chunk(target, preview, &marked).await {
                        tracing::debug!(chat_id = target.chat_id, %error, "could not mark a stopped preview");
                    }
                }
                // Ended without an answer otherwise (shutdown, failure
                // without a reply): the text stays, the Stop button goes.
                None if button => {
                    if let Err(error) = clear_markup(&delivery, target, preview).await {
                        tracing::debug!(chat_id = target.chat_id, %error, "could not take the Stop button away");
                    }
                }
                None => {}
            }
        });
    }
}
