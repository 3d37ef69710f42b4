//! The fake's public vocabulary: its identity, chat kinds, scripted
//! failures, and what it recorded (calls, messages and their versions).

use serde_json::Value;
use std::time::{Duration, Instant};

use super::params::value_as_i64;

/// Identity of the fake bot, as returned by `getMe` and used as `from` of
/// every message the bot sends.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// Bot user id; the default 123 matches the conventional token `123:TEST`.
    pub bot_id: i64,
    pub username: String,
    pub first_name: String,
    pub can_join_groups: bool,
    pub can_read_all_group_messages: bool,
    pub supports_inline_queries: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            bot_id: 123,
            username: "telegate_test_bot".to_owned(),
            first_name: "Telegate Test".to_owned(),
            can_join_groups: true,
            can_read_all_group_messages: false,
            supports_inline_queries: false,
        }
    }
}

/// Kind of a chat, which decides the `chat.type` the fake reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChatType {
    Private,
    Group,
    Supergroup,
    Channel,
}

impl ChatType {
    /// Telegram's id conventions: users are positive, supergroups and
    /// channels are `-100…` (below -10^12), basic groups are other negatives.
    /// Channels can't be told from supergroups by id, so they must be
    /// registered with [`FakeBotApi::register_chat`].
    pub(super) fn default_for(chat_id: i64) -> Self {
        if chat_id > 0 {
            ChatType::Private
        } else if chat_id < -1_000_000_000_000 {
            ChatType::Supergroup
        } else {
            ChatType::Group
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            ChatType::Private => "private",
            ChatType::Group => "group",
            ChatType::Supergroup => "supergroup",
            ChatType::Channel => "channel",
        }
    }
}

/// A scripted misbehaviour of the fake for one call.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// HTTP 429 with `parameters.retry_after = secs`, which teloxide turns
    /// into `RequestError::RetryAfter`. The fake remembers the window and
    /// reports calls that ignore it, see [`FakeBotApi::violations_of_retry_after`].
    RetryAfter(u32),
    /// HTTP 400 with exactly this description. Use Telegram's wording (e.g.
    /// `"Bad Request: chat not found"`) to get the matching `ApiError`.
    BadRequest(String),
    /// Any other non-5xx API error, e.g. `403` / `"Forbidden: bot was
    /// blocked by the user"`. Codes >= 500 are refused (see type docs).
    Api { code: u16, description: String },
    /// Answer normally, but only after this delay.
    Delay(Duration),
    /// Read the request, then close the connection without any answer; the
    /// client sees a network error.
    Drop,
    /// HTTP 5xx (this code, at least 500) with Telegram's JSON error body;
    /// the request is not carried out. See the module docs for teloxide's
    /// 10 s sleep.
    ServerError(u16),
    /// Read the request, then never answer (until the client gives up or
    /// the fake shuts down); the request is not carried out.
    Hang,
    /// Carry the request out, then answer HTTP 200 with a body that is not
    /// JSON (a proxy's error page): the client cannot tell it happened.
    Garbage,
}

/// What the fake did with a recorded call.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Still being processed (e.g. a long poll that is being held).
    Pending,
    /// Answered `{"ok":true,"result":...}`.
    Ok(Value),
    /// Answered with an API error.
    Error { code: u16, description: String },
    /// The connection was closed without answer ([`Failure::Drop`]).
    Dropped,
    /// The client went away before the fake answered (hyper cancelled the
    /// handler), e.g. teloxide dropping its in-flight `getUpdates` on shutdown.
    Cancelled,
    /// Carried out, answered with a body that is not JSON ([`Failure::Garbage`]).
    Garbled(Value),
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok(_))
    }

    /// The API error code, if this call was answered with an error.
    pub fn error_code(&self) -> Option<u16> {
        match self {
            Outcome::Error { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// One HTTP request to `/bot{token}/{method}`.
#[derive(Clone, Debug)]
pub struct RecordedCall {
    /// Arrival order, never reused (also not by [`FakeBotApi::clear_calls`]).
    pub seq: u64,
    /// Canonical camelCase name for known methods, else as in the URL.
    pub method: String,
    /// The JSON body (`{}` for an empty body, `null` if it wasn't JSON).
    pub body: Value,
    /// When the request arrived (after its body was read).
    pub at: Instant,
    /// When its answer was ready (`None` while it runs).
    pub done: Option<Instant>,
    pub outcome: Outcome,
}

impl RecordedCall {
    /// `chat_id` of the body, if it is an integer (or integer string).
    pub fn chat_id(&self) -> Option<i64> {
        self.body.get("chat_id").and_then(value_as_i64)
    }

    /// `text` of the body, if any.
    pub fn text(&self) -> Option<&str> {
        self.body.get("text").and_then(Value::as_str)
    }
}

/// One version of a bot message (the original send or an edit).
#[derive(Clone, Debug, PartialEq)]
pub struct MessageVersion {
    pub text: String,
    /// Entities as sent by the client (empty if none).
    pub entities: Vec<Value>,
    /// Inline keyboard, if one was attached.
    pub reply_markup: Option<Value>,
    /// Recorded only; the fake does not parse markup.
    pub parse_mode: Option<String>,
    /// Unix time of the send (first version) or edit.
    pub date: i64,
}

/// A message the bot sent, with its full edit history.
#[derive(Clone, Debug, PartialEq)]
pub struct SentMessage {
    pub chat_id: i64,
    pub message_id: i64,
    pub thread_id: Option<i64>,
    /// `versions[0]` is the original, later entries are edits.
    pub versions: Vec<MessageVersion>,
    pub deleted: bool,
}

impl SentMessage {
    /// The version currently visible in the chat.
    pub fn current(&self) -> &MessageVersion {
        // `versions` is never empty: a message is created with its first version.
        &self.versions[self.versions.len() - 1]
    }

    pub fn text(&self) -> &str {
        &self.current().text
    }
}

/// The parameters of the last `setWebhook`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WebhookSettings {
    /// `allowed_updates`, if given.
    pub allowed_updates: Option<Vec<String>>,
    /// `max_connections`, if given.
    pub max_connections: Option<i64>,
    /// `secret_token`, if given (never shown by `getWebhookInfo`).
    pub secret_token: Option<String>,
}
