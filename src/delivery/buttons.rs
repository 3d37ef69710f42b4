//! Inline keyboards on Telegram: registering a reply's buttons in the store
//! and sending or editing messages that carry them.
//!
//! Every button gets a short random id stored server-side together with
//! what it does, the user it is bound to and when it expires
//! ([`crate::store::NewButton`]); the `callback_data` carries only that id.
//! Without a store there is nowhere to keep them, so replies go out without
//! buttons (the typed commands still work).
//!
//! Requests go through [`Delivery::call`] like every other request (pacing,
//! `retry_after`, retries, plain-text fallback). This module must never
//! decide what a press does (that is `transport::telegram::callback`).

use teloxide::payloads::{EditMessageTextSetters, SendMessageSetters};
use teloxide::requests::{Request, Requester};
use teloxide::types::{
    ChatId, InlineKeyboardButton, InlineKeyboardMarkup, MessageId, ReplyParameters, ThreadId,
};

use tokio_util::sync::CancellationToken;

use super::entity::{to_telegram, FormattedText};
use super::telegram::{render_chunks, ChatTarget, Delivery, Idempotence, Priority};
use crate::buttons::{callback_data, new_button_id, Button, ButtonAction};
use crate::event::SessionSource;
use crate::reply::{DeliveryError, Reply, ReplyKind};
use crate::store::{now_ms, NewButton, Store};

/// Store `buttons` as one row bound to the user of `to`, and lay them out
/// as an inline keyboard. `None` (no keyboard) without a store or when the
/// store refuses: the reply still goes out.
pub async fn register(
    store: Option<&Store>,
    to: &SessionSource,
    buttons: &[Button],
) -> Option<InlineKeyboardMarkup> {
    let store = store?;
    if buttons.is_empty() {
        return None;
    }
    let row_id = new_button_id();
    let now = now_ms();
    let mut rows = Vec::with_capacity(buttons.len());
    let mut keys = Vec::with_capacity(buttons.len());
    for button in buttons {
        let id = new_button_id();
        let lifetime = i64::try_from(button.action.lifetime().as_millis()).unwrap_or(i64::MAX);
        rows.push(NewButton {
            id: id.clone(),
            row_id: row_id.clone(),
            chat_id: to.chat_id,
            chat_type: to.chat_type.as_str().to_string(),
            thread_id: to.thread_id,
            owner_id: to.user_id,
            owner_name: to.user_name.clone(),
            action: serde_json::to_value(&button.action).ok()?,
            expires_at: now.saturating_add(lifetime),
        });
        keys.push(InlineKeyboardButton::callback(
            button.label.clone(),
            callback_data(&id),
        ));
    }
    if let Err(error) = store.create_buttons(rows).await {
        tracing::warn!(chat_id = to.chat_id, %error, "could not store buttons; sent without them");
        return None;
    }
    // A list of choices reads best one per line; a few actions side by side.
    let one_per_line = buttons
        .iter()
        .any(|b| matches!(b.action, ButtonAction::Model { .. }));
    let layout: Vec<Vec<InlineKeyboardButton>> = if one_per_line {
        keys.into_iter().map(|k| vec![k]).collect()
    } else {
        vec![keys]
    };
    Some(InlineKeyboardMarkup::new(layout))
}

/// Send one chunk as a new message carrying `markup`, in `priority`'s
/// lane. Returns its id. `withdraw` gives it up while it still waits (see
/// [`Delivery::call_unless_withdrawn`]).
pub async fn send_chunk_with_markup(
    delivery: &Delivery,
    target: ChatTarget,
    chunk: &FormattedText,
    reply_to: Option<i64>,
    markup: &InlineKeyboardMarkup,
    priority: Priority,
    withdraw: Option<&CancellationToken>,
) -> Result<i32, DeliveryError> {
    let entities = to_telegram(&chunk.entities);
    let sent = delivery
        .call_unless_withdrawn(target, Idempotence::Unsafe, priority, withdraw, |plain| {
            let mut request = delivery
                .bot()
                .send_message(ChatId(target.chat_id), chunk.text.clone())
                .reply_markup(markup.clone());
            if !plain && !entities.is_empty() {
                request = request.entities(entities.clone());
            }
            if let Some(thread) = target.thread_id {
                request = request.message_thread_id(ThreadId(MessageId(thread)));
            }
            if let Some(id) = reply_to
                .filter(|id| *id > 0)
                .and_then(|id| i32::try_from(id).ok())
            {
                request = request.reply_parameters(
                    ReplyParameters::new(MessageId(id)).allow_sending_without_reply(),
                );
            }
            request.send()
        })
        .await?;
    sent.map(|m| m.id.0)
        .ok_or_else(|| DeliveryError::Rejected("unexpected 'not modified' on send".into()))
}

/// Replace the text of message `id` and keep `markup` under it (an edit
/// without a keyboard removes it). "Not modified" is success.
pub async fn edit_chunk_with_markup(
    delivery: &Delivery,
    target: ChatTarget,
    id: i32,
    chunk: &FormattedText,
    markup: &InlineKeyboardMarkup,
    withdraw: Option<&CancellationToken>,
) -> Result<(), DeliveryError> {
    let entities = to_telegram(&chunk.entities);
    delivery
        .call_unless_withdrawn(
            target,
            Idempotence::Safe,
            Priority::Normal,
            withdraw,
            |plain| {
                let mut request = delivery
                    .bot()
                    .edit_message_text(ChatId(target.chat_id), MessageId(id), chunk.text.clone())
                    .reply_markup(markup.clone());
                if !plain && !entities.is_empty() {
                    request = request.entities(entities.clone());
                }
                request.send()
            },
        )
        .await
        .map(|_| ())
}

/// Deliver a reply whose last message carries its buttons.
pub async fn deliver_with_buttons(
    delivery: &Delivery,
    store: Option<&Store>,
    to: &SessionSource,
    reply: &Reply,
) -> Result<(), DeliveryError> {
    let target = ChatTarget::of(to);
    let Some(markup) = register(store, to, &reply.buttons).await else {
        return delivery
            .deliver_reply(target, reply, None)
            .await
            .map(|_| ());
    };
    let chunks = render_chunks(reply);
    // A command's reply (/model's choices) takes the control lane.
    let priority = match reply.kind {
        ReplyKind::Command => Priority::Control,
        _ => Priority::Normal,
    };
    let mut reply_to = reply.reply_to;
    let last = chunks.len().saturating_sub(1);
    for (index, chunk) in chunks.iter().enumerate() {
        if index == last {
            send_chunk_with_markup(delivery, target, chunk, reply_to, &markup, priority, None)
                .await?;
        } else {
            delivery
                .send_chunk_with(target, chunk, reply_to, priority)
                .await?;
        }
        reply_to = None;
    }
    Ok(())
}

/// Take the keyboard away from message `id`, leaving its text as it is.
/// "Not modified" (no keyboard) is success.
pub async fn clear_markup(
    delivery: &Delivery,
    target: ChatTarget,
    id: i32,
) -> Result<(), DeliveryError> {
    delivery
        .call(target, Idempotence::Safe, |_| {
            delivery
                .bot()
                .edit_message_reply_markup(ChatId(target.chat_id), MessageId(id))
                .send()
        })
        .await
        .map(|_| ())
}
