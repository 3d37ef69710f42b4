//! Outbound delivery: turning an agent's reply into Telegram messages.
//!
//! The agent speaks Markdown; Telegram wants plain text plus a list of
//! formatting entities measured in UTF-16 code units, at most 4096 of them
//! per message, sent no faster than Telegram's flood limits allow. This
//! layer owns exactly those three translations:
//!
//! * [`markdown`] converts agent Markdown into a [`FormattedText`]
//!   (text + [`TextEntity`] list). Sending entities instead of
//!   `parse_mode` means a stray `*` or `_` from the agent can never make
//!   Telegram reject the message with "can't parse entities".
//! * [`split`](mod@split) cuts a [`FormattedText`] into chunks that each fit one
//!   message, at the most readable boundary available, carrying the
//!   formatting over the cut.
//! * [`ratelimit`] computes *when* each request may go out, so the sender
//!   paces itself instead of collecting 429s.
//!
//! The I/O edge sits in files of its own: [`telegram`] (the engine that
//! sends, edits and shows "typing", pacing every request with the limiter,
//! honouring `retry_after` and retrying only what is safe to repeat; whose
//! turn it is to send to a chat is kept by `lanes`), [`api`] (one Bot API
//! request with its HTTP status kept, for sends and edits), [`bot_api`]
//! (the HTTP client those requests travel by) and [`live`] (a
//! running turn's typing indicator and streamed preview).
//!
//! What it never does: it never decides *whether* a reply should be sent
//! (that is the runner's job; by the time text reaches this layer the
//! decision is made), and the modules here are pure — no network, no
//! clock reads, no sleeping. The code that actually calls the Bot API
//! feeds them input and acts on their answers, which keeps all of this
//! deterministic and testable with property tests.

pub mod answer;
pub mod api;
pub mod bot_api;
pub mod draft;
pub mod entity;
pub mod files;
pub mod final_answer;
mod global_window;
pub mod keyboard;
mod lanes;
pub mod live;
pub mod markdown;
pub mod outbound;
pub mod ratelimit;
pub mod reaction;
pub mod reply_record;
pub mod split;
pub mod telegram;
pub mod voice;

use crate::store::{Approvals, Buttons, Outbox};

pub use entity::{to_telegram, utf16_len, EntityKind, FormattedText, TextEntity};
pub use markdown::render;
pub use outbound::TelegramOutbound;
pub use ratelimit::{RateLimiter, RateLimits};
pub use split::{split, TELEGRAM_LIMIT};
pub use telegram::{ChatTarget, Delivery, DeliveryConfig};

/// The store tables delivery writes: each final answer's send intent and
/// messages (the outbox), inline buttons, and approval prompts (so a
/// request's ending shows under its prompt). Without them (no store)
/// answers go out unrecorded and without buttons.
#[derive(Clone, Debug)]
pub struct DeliveryTables {
    /// Each final answer's send intent and messages.
    pub outbox: Outbox,
    /// Inline buttons, kept server-side.
    pub buttons: Buttons,
    /// Approval prompts by ticket.
    pub approvals: Approvals,
}
