//! Draft streaming: a running turn's partial answer shown with
//! `sendMessageDraft` (Bot API 9.3+, open to all bots since 9.5) instead of
//! a preview message edited in place.
//!
//! A draft is ephemeral: Telegram shows it in the private chat while it is
//! refreshed and drops it once the real message arrives. The final answer is
//! therefore always sent once with `sendMessage` through the outbox ledger
//! (`deliver_answer_once`), so a draft is never followed by a duplicate and a
//! restart never sends the answer twice. Drafts carry `can_stop`: the user's
//! native stop control sends a `stopped_message_generation` update with the
//! draft id, which is the turn's generation (see
//! `transport::telegram::callback`), and stops the turn like /stop.
//! Generations are unique across restarts (`runner::generations`), so the
//! stop of a draft shown before a restart names no turn after it. The Bot
//! API takes `draft_id` as a 64-bit integer, non-zero.
//!
//! `[delivery] streaming`: `edit` never uses drafts; `auto` (the default)
//! and `draft` use them in private chats only (Telegram refuses them elsewhere). When the Bot
//! API refuses the method (an older or self-hosted server answers 404
//! "method not found", or 400), the turn falls back to edits; a missing
//! method is remembered for the whole process, so later turns go straight to
//! edits.
//!
//! teloxide-core 0.13 has no such method: the request is a raw Bot API call
//! through teloxide's client, sent by [`Delivery::call`] like every other
//! request (pacing, `retry_after`, retries, error classes). This module owns
//! that request and the decision whether to draft; it must never send the
//! final answer (that is the outbox's job).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use teloxide::requests::{JsonRequest, Payload, Request};
use teloxide::types::{MessageEntity, True};

use super::entity::{to_telegram, FormattedText};
use super::ratelimit::Priority;
use super::telegram::{ChatTarget, Delivery, Idempotence};
use crate::reply::DeliveryError;
use crate::vocab::{ChatType, SessionSource};

/// `[delivery] streaming`: how a running turn's partial answer is shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamingMode {
    /// Drafts in private chats, edits elsewhere and wherever drafts are
    /// refused (the default, as issue 13 specifies).
    #[default]
    Auto,
    /// Like `auto`, but a refusal is logged as a warning (the operator
    /// asked for drafts).
    Draft,
    /// Always a preview message edited in place.
    Edit,
}

/// Whether turns stream as drafts: the configured mode plus what the Bot
/// API said so far. Cheap to clone; shared by every turn of a process.
#[derive(Clone, Debug)]
pub struct Drafts {
    mode: StreamingMode,
    /// The Bot API does not know `sendMessageDraft`.
    unsupported: Arc<AtomicBool>,
}

impl Drafts {
    /// Drafts as configured.
    pub fn new(mode: StreamingMode) -> Self {
        Drafts {
            mode,
            unsupported: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Should a turn in the chat of `to` stream as a draft?
    pub fn for_chat(&self, to: &SessionSource) -> bool {
        self.mode != StreamingMode::Edit
            && to.chat_type == ChatType::Dm
            && !self.unsupported.load(Ordering::Relaxed)
    }

    /// The Bot API refused a draft with `error`: this turn falls back to
    /// edits, and a missing method turns drafts off for the process.
    pub fn refused(&self, chat_id: i64, error: &DeliveryError) {
        let missing = is_method_missing(error);
        if missing && !self.unsupported.swap(true, Ordering::Relaxed) {
            let text =
                "the Bot API does not know sendMessageDraft (an older or self-hosted server): \
                        streaming falls back to editing a preview message";
            if self.mode == StreamingMode::Draft {
                tracing::warn!(%error, "{text}");
            } else {
                tracing::info!(%error, "{text}");
            }
        } else if !missing {
            tracing::debug!(chat_id, %error, "draft refused; this turn streams by edits");
        }
    }
}

/// One turn's draft: its id (the turn's generation, never 0) and the
/// process's [`Drafts`] to report a refusal to.
#[derive(Clone, Debug)]
pub struct DraftStream {
    /// What the Bot API said so far.
    pub drafts: Drafts,
    /// The draft id.
    pub id: i64,
}

/// Is `error` a refusal that edits can work around (the method is missing,
/// or Telegram refused a draft for this chat)? Transient failures are not.
pub fn is_refusal(error: &DeliveryError) -> bool {
    matches!(error, DeliveryError::Rejected(_))
}

fn is_method_missing(error: &DeliveryError) -> bool {
    match error {
        DeliveryError::Rejected(why) => why.to_ascii_lowercase().contains("method not found"),
        _ => false,
    }
}

/// `sendMessageDraft`, as the Bot API documents it.
#[derive(Clone, Debug, Serialize)]
struct SendMessageDraft {
    chat_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_thread_id: Option<i32>,
    draft_id: i64,
    text: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    entities: Vec<MessageEntity>,
    /// Show the user Telegram's own stop control.
    can_stop: bool,
}

impl Payload for SendMessageDraft {
    type Output = True;
    const NAME: &'static str = "sendMessageDraft";
}

/// Show `chunk` as draft `draft_id` (non-zero) in the chat of `target`
/// (`priority`: [`Priority::FirstText`] for a turn's first draft).
pub async fn send_draft(
    delivery: &Delivery,
    target: ChatTarget,
    draft_id: i64,
    chunk: &FormattedText,
    priority: Priority,
) -> Result<(), DeliveryError> {
    let entities = to_telegram(&chunk.entities);
    delivery
        .call_with(target, Idempotence::Safe, priority, |plain| {
            JsonRequest::new(
                delivery.bot().clone(),
                SendMessageDraft {
                    chat_id: target.chat_id,
                    message_thread_id: target.thread_id,
                    draft_id,
                    text: chunk.text.clone(),
                    entities: if plain { Vec::new() } else { entities.clone() },
                    can_stop: true,
                },
            )
            .send()
        })
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Platform;

    #[test]
    fn auto_is_the_default() {
        assert_eq!(StreamingMode::default(), StreamingMode::Auto);
    }

    #[test]
    fn drafts_only_in_private_chats_and_not_in_edit_mode() {
        let dm = SessionSource::dm(Platform::Telegram, 7);
        let mut group = dm.clone();
        group.chat_type = ChatType::Group;
        assert!(Drafts::new(StreamingMode::Auto).for_chat(&dm));
        assert!(Drafts::new(StreamingMode::Draft).for_chat(&dm));
        assert!(!Drafts::new(StreamingMode::Edit).for_chat(&dm));
        assert!(!Drafts::new(StreamingMode::Auto).for_chat(&group));
    }

    #[test]
    fn a_missing_method_turns_drafts_off_a_refusal_for_one_chat_does_not() {
        let drafts = Drafts::new(StreamingMode::Auto);
        let dm = SessionSource::dm(Platform::Telegram, 7);
        drafts.refused(
            7,
            &DeliveryError::Rejected("Bad Request: TEXTDRAFT_PEER_INVALID".into()),
        );
        assert!(drafts.for_chat(&dm));
        drafts.refused(
            7,
            &DeliveryError::Rejected("Not Found: method not found".into()),
        );
        assert!(!drafts.for_chat(&dm));
        assert!(is_refusal(&DeliveryError::Rejected("x".into())));
        assert!(!is_refusal(&DeliveryError::Unavailable("x".into())));
    }
}
