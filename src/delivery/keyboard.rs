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

use teloxide::requests::{Request, Requester};
use teloxide::types::{ChatId, InlineKeyboardButton, InlineKeyboardMarkup, MessageId};

use super::telegram::{render_chunks, ChatTarget, Delivery, Idempotence, Priority};
use super::DeliveryTables;
use crate::delivery::FormattedText;
use crate::reply::{DeliveryError, Reply, ReplyKind};
use crate::store::{now_ms, ApprovalPrompt, Approvals, Buttons, NewButton};
use crate::vocab::{callback_data, new_button_id, Button, ButtonAction, SessionSource};

/// Store `buttons` as one row bound to the user of `to`, and lay them out
/// as an inline keyboard. `None` (no keyboard) without a store or when the
/// store refuses: the reply still goes out.
pub async fn register(
    table: Option<&Buttons>,
    to: &SessionSource,
    buttons: &[Button],
) -> Option<InlineKeyboardMarkup> {
    let table = table?;
    if buttons.is_empty() {
        return None;
    }
    let row_id = new_button_id();
    let now = now_ms();
    let mut rows = Vec::with_capacity(buttons.len());
    let mut keys = Vec::with_capacity(buttons.len());
    // A job's buttons are used up apart from another job's (their own row).
    let mut groups: Vec<(i64, String)> = Vec::new();
    for button in buttons {
        let row_id = match button.action.row_group() {
            None => row_id.clone(),
            Some(group) => match groups.iter().find(|(g, _)| *g == group) {
                Some((_, row)) => row.clone(),
                None => {
                    let row = new_button_id();
                    groups.push((group, row.clone()));
                    row
                }
            },
        };
        let id = new_button_id();
        let lifetime = i64::try_from(button.action.lifetime().as_millis()).unwrap_or(i64::MAX);
        rows.push(NewButton {
            id: id.clone(),
            row_id,
            chat_id: to.chat_id,
            chat_type: to.chat_type.as_str().to_string(),
            thread_id: to.thread_id,
            owner_id: to.user_id,
            owner_name: to.user_name.clone(),
            action: serde_json::to_value(&button.action).ok()?,
            expires_at: now.saturating_add(lifetime),
        });
        keys.push((
            button.action.row_group(),
            InlineKeyboardButton::callback(button.label.clone(), callback_data(&id)),
        ));
    }
    if let Err(error) = table.create_buttons(rows).await {
        tracing::warn!(chat_id = to.chat_id, %error, "could not store buttons; sent without them");
        return None;
    }
    // A list of choices reads best one per line; a few actions side by side.
    let one_per_line = buttons.iter().any(|b| {
        matches!(
            b.action,
            ButtonAction::Model { .. } | ButtonAction::Choose { .. } | ButtonAction::Resume { .. }
        )
    });
    let layout: Vec<Vec<InlineKeyboardButton>> = if one_per_line {
        keys.into_iter().map(|(_, k)| vec![k]).collect()
    } else {
        // One line per group (a job's buttons), in order.
        let mut lines: Vec<(Option<i64>, Vec<InlineKeyboardButton>)> = Vec::new();
        for (group, key) in keys {
            match lines.last_mut() {
                Some((g, line)) if *g == group => line.push(key),
                _ => lines.push((group, vec![key])),
            }
        }
        lines.into_iter().map(|(_, line)| line).collect()
    };
    Some(InlineKeyboardMarkup::new(layout))
}

/// Deliver a reply whose last message carries its buttons.
pub async fn deliver_with_buttons(
    delivery: &Delivery,
    tables: Option<&DeliveryTables>,
    to: &SessionSource,
    reply: &Reply,
) -> Result<(), DeliveryError> {
    let target = ChatTarget::of(to);
    let Some(markup) = register(tables.map(|t| &t.buttons), to, &reply.buttons).await else {
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
            let id = delivery
                .send_chunk_unless_withdrawn(target, chunk, reply_to, priority, None, Some(&markup))
                .await?;
            remember_prompt(tables.map(|t| &t.approvals), to, reply, id, &chunk.text).await;
        } else {
            delivery
                .send_chunk_with(target, chunk, reply_to, priority)
                .await?;
        }
        reply_to = None;
    }
    Ok(())
}

/// An approval prompt's message is kept by its ticket, so the request's
/// ending can be shown there whatever ends it (a typed answer, a timeout).
async fn remember_prompt(
    approvals: Option<&Approvals>,
    to: &SessionSource,
    reply: &Reply,
    message_id: i32,
    text: &str,
) {
    let (Some(approvals), Some(ticket)) = (
        approvals,
        reply.buttons.iter().find_map(|b| b.action.ticket()),
    ) else {
        return;
    };
    let prompt = ApprovalPrompt {
        chat_id: to.chat_id,
        thread_id: to.thread_id,
        message_id,
        text: text.to_string(),
    };
    if let Err(error) = approvals.record_approval_prompt(ticket, prompt).await {
        tracing::warn!(chat_id = to.chat_id, %error, "could not remember an approval prompt");
    }
}

/// Show how request `ticket` ended under its prompt: the prompt's text
/// plus `line`, without its buttons. Nothing to do when the prompt is not
/// known (no store, or it was never sent).
pub async fn settle_prompt(
    delivery: &Delivery,
    approvals: Option<&Approvals>,
    to: &SessionSource,
    ticket: &str,
    line: &str,
) -> Result<(), DeliveryError> {
    let Some(approvals) = approvals else {
        return Ok(());
    };
    let prompt = match approvals.take_approval_prompt(ticket).await {
        Ok(Some(prompt)) => prompt,
        Ok(None) => return Ok(()),
        Err(error) => {
            tracing::warn!(%error, "could not look an approval prompt up");
            return Ok(());
        }
    };
    let target = ChatTarget {
        chat_id: prompt.chat_id,
        thread_id: prompt.thread_id,
        ..ChatTarget::of(to)
    };
    let text = FormattedText::plain(format!("{}\n\n{line}", prompt.text));
    if delivery
        .edit_chunk(target, prompt.message_id, &text)
        .await
        .is_err()
    {
        // Too long with the line, say: at least the buttons go.
        return clear_markup(delivery, target, prompt.message_id).await;
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
