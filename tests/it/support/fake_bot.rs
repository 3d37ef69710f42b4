//! A fake Telegram Bot API server for integration tests.
//!
//! [`FakeBotApi::start`] binds `127.0.0.1:0` and serves the subset of the Bot
//! API that telegate uses, answering the way Telegram does (same JSON shapes,
//! same error descriptions, so teloxide maps them to the same `ApiError`
//! variants). Every request is recorded, updates can be injected for long
//! polling, and failures (429, 400, 5xx, delays, dropped connections,
//! hangs, garbled answers) can be scripted per method.
//!
//! Point a real teloxide `Bot` at it with [`FakeBotApi::bot`] or
//! `Bot::new("123:TEST").set_api_url(fake.url())`. The URL is the server
//! root: teloxide appends `bot{token}/{method}` itself, and a base URL that
//! already ends in a path with a trailing slash would produce `//bot...`.
//!
//! HTTP 5xx ([`Failure::ServerError`]) is meant for the requests telegate
//! sends itself (`sendMessage`, `editMessageText`, `getMe` through its own
//! request path): teloxide's request path sleeps 10 s after any server
//! error before it even reads the body, so scripting one for a request
//! teloxide sends (`getUpdates`, uploads, chat actions) makes a test slow.
//!
//! Flood limits: with [`FakeBotApi::enforce_flood_limits`] the fake answers
//! 429 (with a `retry_after`) to a chat-scoped call (send, edit, chat
//! action) that exceeds Telegram's limits: a per-chat token bucket (small
//! burst, about one per second), 20 per minute per group, 30 per second
//! overall. Off by default, so tests that pace fast for speed still run;
//! [`FakeBotApi::flood_refusals`] counts the 429s it gave.
//!
//! Deliberate simplifications (documented so tests don't rely on them):
//! * `parse_mode` is recorded but not interpreted; text is stored verbatim
//!   (Telegram would strip markup and trim whitespace), so length limits
//!   and entity bounds are checked against the raw text.
//! * Webhooks are bookkeeping: nothing is delivered on its own, and any URL
//!   (including plain `http://`) is accepted. A test hands the queued
//!   updates to the bot's listener with [`FakeBotApi::deliver_to_webhook`],
//!   filtered by the webhook's `allowed_updates` like Telegram does.
//! * Multipart requests are accepted for their text fields (teloxide uses
//!   multipart for `setWebhook`); file parts are answered with 400, except
//!   for `sendPhoto`/`sendDocument`/`sendVoice`, whose uploads are recorded
//!   (see `fake_files.rs`, which also serves `getFile` and file downloads);
//!   a caption past Telegram's 1024 characters is refused as Telegram does.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::{IncomingStream, Listener};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::fake_files::{download_path, file_part, FakeFiles};

/// Telegram's limit on message text, counted in UTF-16 code units.
const MAX_TEXT_UTF16: usize = 4096;
/// Telegram never holds a long poll longer than this, whatever `timeout` says.
const MAX_POLL_SECS: u64 = 50;
/// Bodies are small JSON documents; this only guards against nonsense.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Canonical spelling of every method the fake implements. Telegram matches
/// method names case-insensitively; recording the canonical form lets tests
/// filter on one spelling.
const KNOWN_METHODS: &[&str] = &[
    "getMe",
    "getUpdates",
    "getWebhookInfo",
    "setWebhook",
    "deleteWebhook",
    "sendMessage",
    "editMessageText",
    "sendChatAction",
    "setMyCommands",
    "getMyCommands",
    "deleteMyCommands",
    "deleteMessage",
    "answerCallbackQuery",
    "getFile",
    "sendPhoto",
    "sendDocument",
    "sendVoice",
    "editMessageReplyMarkup",
    "setMessageReaction",
    "sendMessageDraft",
];

/// The emoji Telegram accepts as reactions (`ReactionTypeEmoji`); anything
/// else is refused with `REACTION_INVALID`.
const REACTION_EMOJI: &[&str] = &[
    "👍",
    "👎",
    "❤",
    "🔥",
    "🥰",
    "👏",
    "😁",
    "🤔",
    "🤯",
    "😱",
    "🤬",
    "😢",
    "🎉",
    "🤩",
    "🤮",
    "💩",
    "🙏",
    "👌",
    "🕊",
    "🤡",
    "🥱",
    "🥴",
    "😍",
    "🐳",
    "❤\u{200d}🔥",
    "🌚",
    "🌭",
    "💯",
    "🤣",
    "⚡",
    "🍌",
    "🏆",
    "💔",
    "🤨",
    "😐",
    "🍓",
    "🍾",
    "💋",
    "🖕",
    "😈",
    "😴",
    "😭",
    "🤓",
    "👻",
    "👨\u{200d}💻",
    "👀",
    "🎃",
    "🙈",
    "😇",
    "😨",
    "🤝",
    "✍",
    "🤗",
    "🫡",
    "🎅",
    "🎄",
    "☃",
    "💅",
    "🤪",
    "🗿",
    "🆒",
    "💘",
    "🙉",
    "🦄",
    "😘",
    "💊",
    "🙊",
    "😎",
    "👾",
    "🤷\u{200d}♂",
    "🤷",
    "🤷\u{200d}♀",
    "😡",
];

/// Methods whose flood limits Telegram applies per chat; a 429 on one of
/// them forbids all of them for that chat until `retry_after` expires.
const CHAT_SCOPED_METHODS: &[&str] = &["sendMessage", "editMessageText", "sendChatAction"];

/// Update kinds Telegram delivers when `allowed_updates` is empty or unset.
const NOT_DELIVERED_BY_DEFAULT: &[&str] =
    &["chat_member", "message_reaction", "message_reaction_count"];

const KNOWN_UPDATE_KINDS: &[&str] = &[
    "message",
    "stopped_message_generation",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_connection",
    "business_message",
    "edited_business_message",
    "deleted_business_messages",
    "message_reaction",
    "message_reaction_count",
    "inline_query",
    "chosen_inline_result",
    "callback_query",
    "shipping_query",
    "pre_checkout_query",
    "purchased_paid_media",
    "poll",
    "poll_answer",
    "my_chat_member",
    "chat_member",
    "chat_join_request",
    "chat_boost",
    "removed_chat_boost",
];

const CHAT_ACTIONS: &[&str] = &[
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

const NOT_MODIFIED: &str =
    "Bad Request: message is not modified: specified new message content and \
     reply markup are exactly the same as a current content and reply markup of the message";
const TERMINATED_BY_OTHER_POLL: &str = "Conflict: terminated by other getUpdates request; \
     make sure that only one bot instance is running";
const WEBHOOK_ACTIVE: &str = "Conflict: can't use getUpdates method while webhook is active; \
     use deleteWebhook to delete the webhook first";

// ---------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------

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
    fn default_for(chat_id: i64) -> Self {
        if chat_id > 0 {
            ChatType::Private
        } else if chat_id < -1_000_000_000_000 {
            ChatType::Supergroup
        } else {
            ChatType::Group
        }
    }

    fn as_str(self) -> &'static str {
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

/// Telegram's flood limits as the fake enforces them (see
/// [`FakeBotApi::enforce_flood_limits`]).
#[derive(Clone, Copy, Debug)]
pub struct FloodLimits {
    /// Calls one chat may burst.
    pub per_chat_burst: f64,
    /// Calls per second one chat sustains (the bucket's refill rate).
    pub per_chat_per_second: f64,
    /// Calls to one group in any minute.
    pub group_per_minute: usize,
    /// Calls overall in any second.
    pub global_per_second: usize,
    /// Network jitter tolerated on the group and global windows: calls are
    /// counted in windows this much shorter than a minute / a second (a
    /// client pacing exactly at the limit sees its requests arrive a little
    /// bunched by scheduling, which Telegram tolerates too).
    pub window_grace: Duration,
}

impl FloodLimits {
    /// Telegram's documented limits, with a burst of 3 per chat.
    pub fn telegram() -> Self {
        FloodLimits {
            per_chat_burst: 3.0,
            per_chat_per_second: 1.0,
            group_per_minute: 20,
            global_per_second: 30,
            window_grace: Duration::from_millis(100),
        }
    }
}

#[derive(Default)]
struct Flood {
    limits: Option<FloodLimits>,
    /// Per chat: tokens left after the last accepted call, and when.
    buckets: HashMap<i64, (f64, Instant)>,
    group_calls: HashMap<i64, VecDeque<Instant>>,
    global_calls: VecDeque<Instant>,
    refusals: u64,
}

impl Flood {
    /// `Some(retry_after secs)` if a call to `chat_id` at `at` breaks a
    /// limit; otherwise books it.
    fn check(&mut self, chat_id: i64, is_group: bool, at: Instant) -> Option<u32> {
        let limits = self.limits?;
        let minute = Duration::from_secs(60).saturating_sub(limits.window_grace);
        let second = Duration::from_secs(1).saturating_sub(limits.window_grace);
        while self
            .global_calls
            .front()
            .is_some_and(|t| at.duration_since(*t) >= second)
        {
            self.global_calls.pop_front();
        }
        if self.global_calls.len() >= limits.global_per_second {
            self.refusals += 1;
            return Some(1);
        }
        let tokens = match self.buckets.get(&chat_id) {
            None => limits.per_chat_burst,
            Some((tokens, since)) => (tokens
                + at.duration_since(*since).as_secs_f64() * limits.per_chat_per_second)
                .min(limits.per_chat_burst),
        };
        if tokens < 1.0 {
            self.refusals += 1;
            return Some(1);
        }
        if is_group {
            let calls = self.group_calls.entry(chat_id).or_default();
            while calls
                .front()
                .is_some_and(|t| at.duration_since(*t) >= minute)
            {
                calls.pop_front();
            }
            if calls.len() >= limits.group_per_minute {
                let wait = calls.front().map_or(Duration::ZERO, |t| {
                    minute.saturating_sub(at.duration_since(*t))
                });
                self.refusals += 1;
                return Some(wait.as_secs().max(1) as u32);
            }
            calls.push_back(at);
        }
        self.buckets.insert(chat_id, (tokens - 1.0, at));
        self.global_calls.push_back(at);
        None
    }
}

/// What a 429 forbade: one chat (for per-chat methods) or one method.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RetryScope {
    Chat(i64),
    Method(String),
}

/// A call that arrived while a previously announced `retry_after` was
/// still running for its scope.
#[derive(Clone, Debug)]
pub struct RetryAfterViolation {
    pub scope: RetryScope,
    /// `seq` of the call that was answered with the 429.
    pub announced_by: u64,
    /// Instant until which the client was told to wait.
    pub retry_until: Instant,
    /// The offending call.
    pub seq: u64,
    pub method: String,
    pub at: Instant,
}

impl RetryAfterViolation {
    /// How much too early the offending call arrived.
    pub fn early_by(&self) -> Duration {
        self.retry_until.saturating_duration_since(self.at)
    }
}

// ---------------------------------------------------------------------------
// The handle
// ---------------------------------------------------------------------------

/// A running fake Bot API server. Dropping it stops the server.
pub struct FakeBotApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for FakeBotApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeBotApi")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FakeBotApi {
    /// Starts a fake with the default bot identity (`@telegate_test_bot`).
    pub async fn start() -> Self {
        Self::start_with(FakeConfig::default()).await
    }

    /// Starts a fake with a custom bot identity.
    ///
    /// Panics if 127.0.0.1 can't be bound: without a server no test can run.
    pub async fn start_with(config: FakeConfig) -> Self {
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("fake Bot API: bind 127.0.0.1:0");
        let addr = tcp.local_addr().expect("fake Bot API: local_addr");
        let shared = Arc::new(Shared::new(config));
        let listener = KillableListener {
            inner: tcp,
            shared: Arc::downgrade(&shared),
        };
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            let make = app.into_make_service_with_connect_info::<ConnHandle>();
            // An accept loop error can't happen with our listener; the result
            // carries nothing a test could act on.
            let _ = axum::serve(listener, make).await;
        });
        Self {
            shared,
            addr,
            server: Mutex::new(Some(server)),
        }
    }

    /// Root URL of the server, for `Bot::set_api_url`.
    pub fn url(&self) -> reqwest::Url {
        let url = format!("http://{}/", self.addr);
        reqwest::Url::parse(&url).expect("a socket address always forms a valid URL")
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token [`FakeBotApi::bot`] uses (`{bot_id}:TEST`). Any token works.
    pub fn token(&self) -> String {
        format!("{}:TEST", self.shared.config.bot_id)
    }

    /// Full URL of a method, for raw `reqwest` calls in tests.
    pub fn method_url(&self, method: &str) -> reqwest::Url {
        let url = format!("http://{}/bot{}/{}", self.addr, self.token(), method);
        reqwest::Url::parse(&url).expect("method names form valid URLs")
    }

    /// A teloxide bot talking to this fake.
    pub fn bot(&self) -> teloxide::Bot {
        teloxide::Bot::new(self.token()).set_api_url(self.url())
    }

    pub fn config(&self) -> &FakeConfig {
        &self.shared.config
    }

    /// The bot as a `User` JSON object (the `from` of its messages).
    pub fn bot_user(&self) -> Value {
        self.shared.bot_user()
    }

    /// Overrides the type reported for a chat (see [`ChatType`] defaults).
    pub fn register_chat(&self, chat_id: i64, chat_type: ChatType) {
        self.shared.lock().chat_types.insert(chat_id, chat_type);
    }

    /// Stops serving: held long polls return `[]`, open connections are
    /// closed and new connections are refused. Idempotent; recorded state
    /// stays readable.
    pub fn shutdown(&self) {
        self.shared.shut_down.store(true, Ordering::SeqCst);
        self.shared.updates_tx.send_modify(bump);
        self.shared.kill_all_connections();
        let server = self
            .server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(server) = server {
            server.abort();
        }
    }

    // -- recorded calls ----------------------------------------------------

    /// All recorded calls, in arrival order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.shared.lock().calls.clone()
    }

    /// Recorded calls to one method (name matched case-insensitively).
    pub fn calls_to(&self, method: &str) -> Vec<RecordedCall> {
        let method = canonical_method(method);
        let inner = self.shared.lock();
        inner
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    pub fn clear_calls(&self) {
        self.shared.lock().calls.clear();
        self.shared.calls_tx.send_modify(bump);
    }

    /// Waits until `pred(calls)` holds or `timeout` passes; returns whether
    /// it held. Re-evaluated whenever a call is recorded or finishes (no
    /// polling), on a snapshot so `pred` may freely call back into the fake.
    pub async fn wait_for<F>(&self, pred: F, timeout: Duration) -> bool
    where
        F: Fn(&[RecordedCall]) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.calls_tx.subscribe();
        loop {
            if pred(&self.calls()) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return pred(&self.calls()),
            }
        }
    }

    /// How many recorded calls satisfy `pred`, counted in place (no copy
    /// of the record: cheap enough to ask after every call).
    pub fn count_calls<F>(&self, pred: F) -> usize
    where
        F: Fn(&RecordedCall) -> bool,
    {
        self.shared.lock().calls.iter().filter(|c| pred(c)).count()
    }

    /// Counts answered calls matching `pred` incrementally (a waiter then
    /// does not scan every call again after each new one): the calls at the
    /// indices in `pending` (still unanswered at the last look) and those
    /// recorded from index `from` on. Calls still unanswered are not
    /// judged: their indices are left in `pending` for the next look.
    /// Returns the matches and the index to continue from.
    pub fn count_answered_calls_since<F>(
        &self,
        from: usize,
        pending: &mut Vec<usize>,
        pred: F,
    ) -> (usize, usize)
    where
        F: Fn(&RecordedCall) -> bool,
    {
        let inner = self.shared.lock();
        let mut matched = 0;
        let mut unanswered = Vec::new();
        for index in pending.drain(..).chain(from..inner.calls.len()) {
            let Some(call) = inner.calls.get(index) else {
                continue;
            };
            if matches!(call.outcome, Outcome::Pending) {
                unanswered.push(index);
            } else if pred(call) {
                matched += 1;
            }
        }
        *pending = unanswered;
        (matched, inner.calls.len())
    }

    /// Like [`FakeBotApi::wait_for`] for a condition that reads the fake
    /// itself (e.g. through [`FakeBotApi::count_calls`]) instead of a copy
    /// of every call: a benchmark's wait then costs next to nothing.
    pub async fn wait_until<F>(&self, cond: F, timeout: Duration) -> bool
    where
        F: Fn(&Self) -> bool,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.calls_tx.subscribe();
        loop {
            if cond(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return cond(self),
            }
        }
    }

    /// Waits until at least `n` calls to `method` have been answered
    /// successfully.
    pub async fn wait_for_ok_calls(&self, method: &str, n: usize, timeout: Duration) -> bool {
        let method = canonical_method(method);
        let pred = |calls: &[RecordedCall]| {
            calls
                .iter()
                .filter(|c| c.method == method && c.outcome.is_ok())
                .count()
                >= n
        };
        self.wait_for(pred, timeout).await
    }

    // -- sent messages -----------------------------------------------------

    /// Visible text of each (not deleted) bot message in the chat, in
    /// message-id order, after edits.
    pub fn sent_texts(&self, chat_id: i64) -> Vec<String> {
        let inner = self.shared.lock();
        let Some(chat) = inner.chats.get(&chat_id) else {
            return Vec::new();
        };
        let visible = chat.bot_messages.values().filter(|m| !m.deleted);
        visible.map(|m| m.text().to_owned()).collect()
    }

    /// Every bot message in the chat (including deleted ones) with all its
    /// versions, in message-id order.
    pub fn message_history(&self, chat_id: i64) -> Vec<SentMessage> {
        let inner = self.shared.lock();
        let Some(chat) = inner.chats.get(&chat_id) else {
            return Vec::new();
        };
        chat.bot_messages.values().cloned().collect()
    }

    // -- webhook and commands ---------------------------------------------

    /// URL set by the last `setWebhook`, `None` when no webhook is active.
    pub fn webhook_url(&self) -> Option<String> {
        self.shared.lock().webhook_url.clone()
    }

    /// What the last `setWebhook` asked for besides its URL.
    pub fn webhook_settings(&self) -> WebhookSettings {
        self.shared.lock().webhook_settings.clone()
    }

    /// The `drop_pending_updates` flag of every `deleteWebhook` call.
    pub fn delete_webhook_requests(&self) -> Vec<bool> {
        self.shared.lock().delete_webhook_drops.clone()
    }

    /// Commands set for the default scope and no language, as
    /// `(command, description)` pairs.
    pub fn my_commands(&self) -> Vec<(String, String)> {
        let inner = self.shared.lock();
        let key = commands_key(&Value::Null, &Value::Null);
        let Some(Value::Array(list)) = inner.commands.get(&key) else {
            return Vec::new();
        };
        let str_of = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        list.iter()
            .map(|c| (str_of(c, "command"), str_of(c, "description")))
            .collect()
    }

    // -- updates -----------------------------------------------------------

    /// Queues a raw update, as-is except that `update_id` is assigned when
    /// missing. Returns the update id. Messages in it (with a chat id and a
    /// message id) are remembered so later ids don't collide with them.
    pub fn push_update(&self, update: Value) -> i64 {
        let id = self.shared.lock().enqueue_update(update);
        self.shared.updates_tx.send_modify(bump);
        id
    }

    /// Queues a text message from `user_id` in `chat_id`.
    pub fn push_text(&self, chat_id: i64, user_id: i64, text: &str) -> i64 {
        let message = self.shared.lock().incoming_message(chat_id, user_id, text);
        self.push_update(json!({ "message": message }))
    }

    /// Queues many text messages `(chat_id, user_id, text)` at once, as a
    /// backlog Telegram already holds: one lock and one wake-up of a waiting
    /// getUpdates for the lot. Returns their update ids.
    pub fn push_texts(&self, messages: &[(i64, i64, String)]) -> Vec<i64> {
        let ids = {
            let mut inner = self.shared.lock();
            messages
                .iter()
                .map(|(chat_id, user_id, text)| {
                    let message = inner.incoming_message(*chat_id, *user_id, text);
                    inner.enqueue_update(json!({ "message": message }))
                })
                .collect()
        };
        self.shared.updates_tx.send_modify(bump);
        ids
    }

    /// Queues a text message in a group; with `reply_to_bot` it replies to
    /// the bot's latest message in that chat (or to a stand-in bot message
    /// if the bot hasn't sent any).
    pub fn push_group_text(
        &self,
        chat_id: i64,
        user_id: i64,
        text: &str,
        reply_to_bot: bool,
    ) -> i64 {
        let message = {
            let mut inner = self.shared.lock();
            let mut message = inner.incoming_message(chat_id, user_id, text);
            if reply_to_bot {
                let replied = inner.latest_bot_message_json(&self.shared, chat_id);
                message["reply_to_message"] = replied;
            }
            message
        };
        self.push_update(json!({ "message": message }))
    }

    /// Queues an `edited_message` update: the user edited `message_id`.
    pub fn push_edited_message(
        &self,
        chat_id: i64,
        user_id: i64,
        message_id: i64,
        text: &str,
    ) -> i64 {
        let message = {
            let inner = self.shared.lock();
            let mut message = inner.user_message_base(chat_id, user_id, message_id);
            set_text(&mut message, "text", "entities", text);
            message["edit_date"] = json!(unix_now());
            message
        };
        self.push_update(json!({ "edited_message": message }))
    }

    /// Queues a photo message (two sizes, fake file ids), with an optional
    /// caption.
    pub fn push_photo(&self, chat_id: i64, user_id: i64, caption: Option<&str>) -> i64 {
        let message = {
            let mut inner = self.shared.lock();
            let message_id = inner.allocate_message_id(chat_id);
            let mut message = inner.user_message_base(chat_id, user_id, message_id);
            message["photo"] = fake_photo_sizes(message_id);
            if let Some(caption) = caption {
                set_text(&mut message, "caption", "caption_entities", caption);
            }
            message
        };
        self.push_update(json!({ "message": message }))
    }

    /// The fake's files: make files downloadable, hold downloads, read
    /// uploads (see `fake_files.rs`).
    pub fn files(&self) -> &FakeFiles {
        &self.shared.files
    }

    /// Queues a message from `user_id` in `chat_id` carrying `media` (the
    /// message fields, e.g. `fake_files::voice_json(..)`, plus `caption` or
    /// `media_group_id`). Returns `(update id, message id)`.
    pub fn push_media(&self, chat_id: i64, user_id: i64, media: Value) -> (i64, i64) {
        let (message, message_id) = {
            let mut inner = self.shared.lock();
            let message_id = inner.allocate_message_id(chat_id);
            let mut message = inner.user_message_base(chat_id, user_id, message_id);
            if let (Some(message), Some(media)) = (message.as_object_mut(), media.as_object()) {
                for (k, v) in media {
                    message.insert(k.clone(), v.clone());
                }
            }
            (message, message_id)
        };
        (self.push_update(json!({ "message": message })), message_id)
    }

    /// Queues a `callback_query` from pressing a button with `data` on the
    /// bot message `message_id` (reported as inaccessible if the fake
    /// doesn't know that message).
    pub fn push_callback_query(
        &self,
        chat_id: i64,
        user_id: i64,
        message_id: i64,
        data: &str,
    ) -> i64 {
        let query = {
            let mut inner = self.shared.lock();
            inner.next_callback_id += 1;
            let message = inner.bot_message_json_or_inaccessible(&self.shared, chat_id, message_id);
            json!({
                "id": format!("cbq-{}", inner.next_callback_id),
                "from": user_json(user_id),
                "message": message,
                "chat_instance": format!("instance{chat_id}"),
                "data": data,
            })
        };
        self.push_update(json!({ "callback_query": query }))
    }

    /// Every accepted `sendMessageDraft` to `chat_id`, in order: (draft id,
    /// text, can_stop).
    pub fn drafts(&self, chat_id: i64) -> Vec<(i64, String, bool)> {
        self.shared
            .lock()
            .drafts
            .iter()
            .filter(|(chat, ..)| *chat == chat_id)
            .map(|(_, id, text, stop)| (*id, text.clone(), *stop))
            .collect()
    }

    /// Answer `sendMessageDraft` with 404 "method not found" (`true`), as a
    /// Bot API server older than 9.3 does.
    pub fn refuse_drafts(&self, refuse: bool) {
        self.shared.lock().refuse_drafts = refuse;
    }

    /// The user pressed Telegram's stop control on draft `draft_id` in the
    /// private chat `chat_id`: queue a `stopped_message_generation` update.
    pub fn push_draft_stop(&self, chat_id: i64, draft_id: i64) -> i64 {
        let chat = self.shared.lock().chat_json(chat_id);
        self.push_update(json!({
            "stopped_message_generation": { "chat": chat, "draft_id": draft_id }
        }))
    }

    /// Every accepted `setMessageReaction`, in order: (chat id, message id,
    /// emoji set; empty = reaction removed).
    pub fn reactions(&self) -> Vec<(i64, i64, Vec<String>)> {
        self.shared.lock().reactions.clone()
    }

    /// The reaction the bot currently shows on `message_id` in `chat_id`.
    pub fn reaction_on(&self, chat_id: i64, message_id: i64) -> Option<Vec<String>> {
        self.shared
            .lock()
            .reactions
            .iter()
            .rev()
            .find(|(c, m, _)| *c == chat_id && *m == message_id)
            .map(|(_, _, emoji)| emoji.clone())
    }

    /// Updates queued and not yet confirmed by a `getUpdates` offset.
    pub fn pending_updates_len(&self) -> usize {
        self.shared.lock().updates.len()
    }

    /// Like Telegram with a webhook set: POST each queued update to the
    /// listener at `listen` (the path of the registered URL, its secret in
    /// `X-Telegram-Bot-Api-Secret-Token`), in order. Updates of kinds the
    /// webhook's `allowed_updates` exclude are discarded, never sent, as
    /// Telegram never stores them. An update answered 200 is removed; one
    /// refused stays queued (Telegram retries it later). Returns how many
    /// were accepted.
    pub async fn deliver_to_webhook(&self, listen: SocketAddr) -> usize {
        let (url, secret, updates) = {
            let mut inner = self.shared.lock();
            let url = inner
                .webhook_url
                .clone()
                .expect("deliver_to_webhook: no webhook is set");
            let secret = inner.webhook_settings.secret_token.clone();
            let updates: Vec<(i64, Value)> = {
                let allowed = inner.allowed_updates.clone();
                inner
                    .updates
                    .retain(|u| is_allowed(&u.value, allowed.as_deref()));
                inner
                    .updates
                    .iter()
                    .map(|u| (u.id, u.value.clone()))
                    .collect()
            };
            (url, secret, updates)
        };
        let path = reqwest::Url::parse(&url)
            .map(|u| u.path().to_string())
            .unwrap_or_else(|_| "/".to_string());
        let client = reqwest::Client::new();
        let mut accepted = 0;
        for (id, update) in updates {
            let mut request = client.post(format!("http://{listen}{path}")).json(&update);
            if let Some(secret) = &secret {
                request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
            }
            let ok = request
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if ok {
                accepted += 1;
                self.shared.lock().updates.retain(|u| u.id != id);
            }
        }
        accepted
    }

    // -- failure injection -------------------------------------------------

    /// Makes the next `n` calls to `method` fail with `failure`. Scripts
    /// queue up: later `fail_next` calls apply after earlier ones run out.
    pub fn fail_next(&self, method: &str, n: usize, failure: Failure) {
        assert_valid(&failure);
        if n == 0 {
            return;
        }
        let method = canonical_method(method);
        let mut inner = self.shared.lock();
        inner
            .scripted
            .entry(method)
            .or_default()
            .push_back((n, failure));
    }

    /// Makes a deterministic fraction `probability` of the calls to `method`
    /// fail: call number `k` (1-based, counted from now) fails exactly when
    /// `floor(k * p) > floor((k - 1) * p)`, e.g. every 2nd call for 0.5,
    /// every 3rd for 1/3. No RNG, so chaos tests are reproducible.
    /// `probability <= 0` removes the rule. Scripted `fail_next` failures
    /// take precedence and don't advance the counter.
    pub fn set_failure_rate(&self, method: &str, probability: f64, failure: Failure) {
        assert_valid(&failure);
        let method = canonical_method(method);
        let mut inner = self.shared.lock();
        if probability <= 0.0 || probability.is_nan() {
            inner.rates.remove(&method);
            return;
        }
        let rule = RateRule {
            probability: probability.min(1.0),
            failure,
            calls: 0,
        };
        inner.rates.insert(method, rule);
    }

    /// Removes all scripted failures and failure rates.
    pub fn clear_failures(&self) {
        let mut inner = self.shared.lock();
        inner.scripted.clear();
        inner.rates.clear();
    }

    /// From now on, answer calls that exceed `limits` with 429.
    pub fn enforce_flood_limits(&self, limits: FloodLimits) {
        self.shared.lock().flood.limits = Some(limits);
    }

    /// How many calls the flood limits refused (429) so far.
    pub fn flood_refusals(&self) -> u64 {
        self.shared.lock().flood.refusals
    }

    /// Calls that arrived while a `retry_after` the fake announced for the
    /// same scope was still running. Per-chat methods (`sendMessage`,
    /// `editMessageText`, `sendChatAction`) share one window per `chat_id`;
    /// other methods have one window per method. Tests assert it's empty.
    pub fn violations_of_retry_after(&self) -> Vec<RetryAfterViolation> {
        self.shared.lock().violations.clone()
    }
}

impl Drop for FakeBotApi {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Test-setup guard: 5xx answers are scripted as [`Failure::ServerError`].
fn assert_valid(failure: &Failure) {
    match failure {
        Failure::Api { code, .. } => assert!(*code < 500, "script 5xx as Failure::ServerError"),
        Failure::ServerError(code) => assert!((500..600).contains(code), "{code} is not a 5xx"),
        _ => {}
    }
}

// ---------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------

/// State shared between the handle and the request handlers.
struct Shared {
    config: FakeConfig,
    inner: Mutex<Inner>,
    /// Bumped whenever a call is recorded or finishes; drives `wait_for`.
    calls_tx: watch::Sender<u64>,
    /// Bumped when updates are queued, a new poll starts, or on shutdown;
    /// wakes held long polls.
    updates_tx: watch::Sender<u64>,
    shut_down: AtomicBool,
    connections: Mutex<Vec<Weak<KillSwitch>>>,
    /// getFile, downloads and uploads (see `fake_files.rs`).
    files: FakeFiles,
}

fn bump(version: &mut u64) {
    *version = version.wrapping_add(1);
}

#[derive(Default)]
struct Inner {
    next_seq: u64,
    calls: Vec<RecordedCall>,
    chat_types: HashMap<i64, ChatType>,
    chats: HashMap<i64, ChatState>,
    updates: VecDeque<QueuedUpdate>,
    next_update_id: i64,
    /// Persisted like Telegram does: a `getUpdates` without the parameter
    /// keeps the previous setting. `None` = Telegram's default set.
    allowed_updates: Option<Vec<String>>,
    /// Incremented by every `getUpdates`; a held poll whose generation is
    /// outdated was superseded and answers 409, like Telegram.
    poll_generation: u64,
    webhook_url: Option<String>,
    delete_webhook_drops: Vec<bool>,
    /// What the last `setWebhook` asked for besides the URL.
    webhook_settings: WebhookSettings,
    commands: HashMap<String, Value>,
    scripted: HashMap<String, VecDeque<(usize, Failure)>>,
    rates: HashMap<String, RateRule>,
    retry_windows: HashMap<RetryScope, RetryWindow>,
    violations: Vec<RetryAfterViolation>,
    next_callback_id: u64,
    flood: Flood,
    /// Every accepted `setMessageReaction`: (chat, message, emoji).
    reactions: Vec<(i64, i64, Vec<String>)>,
    /// Every accepted `sendMessageDraft`: (chat, draft id, text, can_stop).
    drafts: Vec<(i64, i64, String, bool)>,
    /// Answer `sendMessageDraft` like a Bot API server that predates it.
    refuse_drafts: bool,
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

#[derive(Default)]
struct ChatState {
    /// Message ids are shared by the bot's and the users' messages, as in
    /// a real chat.
    last_message_id: i64,
    bot_messages: BTreeMap<i64, SentMessage>,
    user_messages: HashSet<i64>,
}

struct QueuedUpdate {
    id: i64,
    value: Value,
}

struct RateRule {
    probability: f64,
    failure: Failure,
    calls: u64,
}

struct RetryWindow {
    until: Instant,
    announced_by: u64,
}

/// An API error answer.
#[derive(Debug)]
struct ApiFailure {
    code: u16,
    description: String,
    retry_after: Option<u32>,
}

impl ApiFailure {
    fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
            retry_after: None,
        }
    }

    fn bad_request(description: impl Into<String>) -> Self {
        Self::new(400, description)
    }

    fn to_json(&self) -> Value {
        let mut body =
            json!({ "ok": false, "error_code": self.code, "description": self.description });
        if let Some(secs) = self.retry_after {
            body["parameters"] = json!({ "retry_after": secs });
        }
        body
    }

    fn to_response(&self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.to_json())).into_response()
    }
}

/// How the handler ends a call.
enum Reply {
    Answer(Result<Value, ApiFailure>),
    Drop,
    Hang,
    Garbage(Result<Value, ApiFailure>),
}

impl Shared {
    fn new(config: FakeConfig) -> Self {
        let inner = Inner {
            next_update_id: 1,
            ..Inner::default()
        };
        Self {
            config,
            inner: Mutex::new(inner),
            calls_tx: watch::channel(0).0,
            updates_tx: watch::channel(0).0,
            shut_down: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
            files: FakeFiles::default(),
        }
    }

    /// Locks the state. A panicking test thread can't leave it half-updated
    /// in a way that matters here, so poisoning is ignored rather than
    /// propagated into every later request.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    fn bot_user(&self) -> Value {
        json!({
            "id": self.config.bot_id,
            "is_bot": true,
            "first_name": self.config.first_name,
            "username": self.config.username,
        })
    }

    /// `getMe`: every field teloxide's `Me` requires, or the dispatcher
    /// fails at startup.
    fn me(&self) -> Value {
        let mut me = self.bot_user();
        me["can_join_groups"] = json!(self.config.can_join_groups);
        me["can_read_all_group_messages"] = json!(self.config.can_read_all_group_messages);
        me["supports_inline_queries"] = json!(self.config.supports_inline_queries);
        me["can_connect_to_business"] = json!(false);
        me["has_main_web_app"] = json!(false);
        me
    }

    fn register_connection(&self, switch: &Arc<KillSwitch>) {
        let mut conns = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(switch));
    }

    fn kill_all_connections(&self) {
        let conns = std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for switch in conns.iter().filter_map(Weak::upgrade) {
            switch.kill();
        }
    }

    /// Records an arriving call (outcome `Pending`) and checks it against
    /// running retry-after windows.
    fn begin_call(self: &Arc<Self>, method: &str, body: Value) -> CallGuard {
        let at = Instant::now();
        let seq = {
            let mut inner = self.lock();
            let seq = inner.next_seq;
            inner.next_seq += 1;
            inner.check_retry_window(seq, method, &body, at);
            let call = RecordedCall {
                seq,
                method: method.to_owned(),
                body,
                at,
                outcome: Outcome::Pending,
            };
            inner.calls.push(call);
            seq
        };
        self.calls_tx.send_modify(bump);
        CallGuard {
            shared: Arc::clone(self),
            seq,
            finished: false,
        }
    }

    fn finish_call(&self, seq: u64, outcome: Outcome) {
        {
            let mut inner = self.lock();
            // Searching from the end: the call is almost always recent.
            if let Some(call) = inner.calls.iter_mut().rev().find(|c| c.seq == seq) {
                call.outcome = outcome;
            }
        }
        self.calls_tx.send_modify(bump);
    }

    /// Runs a call: scripted failure first, then the method itself.
    async fn serve_call(&self, seq: u64, method: &str, body: Value) -> Reply {
        if let Some(secs) = self.flood_check(method, &body) {
            return Reply::Answer(Err(self.announce_retry_after(seq, method, &body, secs)));
        }
        let failure = self.lock().take_failure(method);
        match failure {
            None => Reply::Answer(self.dispatch(method, &body).await),
            Some(Failure::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                Reply::Answer(self.dispatch(method, &body).await)
            }
            Some(Failure::Drop) => Reply::Drop,
            Some(Failure::BadRequest(description)) => {
                Reply::Answer(Err(ApiFailure::bad_request(description)))
            }
            Some(Failure::Api { code, description }) => {
                Reply::Answer(Err(ApiFailure::new(code, description)))
            }
            Some(Failure::RetryAfter(secs)) => {
                Reply::Answer(Err(self.announce_retry_after(seq, method, &body, secs)))
            }
            Some(Failure::ServerError(code)) => Reply::Answer(Err(ApiFailure::new(
                code,
                match code {
                    502 => "Bad Gateway",
                    503 => "Service Unavailable",
                    504 => "Gateway Timeout",
                    _ => "Internal Server Error",
                },
            ))),
            Some(Failure::Hang) => Reply::Hang,
            Some(Failure::Garbage) => Reply::Garbage(self.dispatch(method, &body).await),
        }
    }

    /// The flood limits' verdict on a chat-scoped call arriving now.
    fn flood_check(&self, method: &str, body: &Value) -> Option<u32> {
        let RetryScope::Chat(chat_id) = retry_scope(method, body) else {
            return None;
        };
        let mut inner = self.lock();
        let is_group = matches!(
            inner.chat_type(chat_id),
            ChatType::Group | ChatType::Supergroup
        );
        inner.flood.check(chat_id, is_group, Instant::now())
    }

    /// Builds a 429 and remembers until when the client must stay quiet.
    /// The window starts now (when the answer is produced), so a client that
    /// sleeps `secs` after receiving it can never be flagged by mistake.
    fn announce_retry_after(&self, seq: u64, method: &str, body: &Value, secs: u32) -> ApiFailure {
        let scope = retry_scope(method, body);
        let until = Instant::now() + Duration::from_secs(u64::from(secs));
        let mut inner = self.lock();
        let window = inner.retry_windows.entry(scope).or_insert(RetryWindow {
            until,
            announced_by: seq,
        });
        if window.until <= until {
            *window = RetryWindow {
                until,
                announced_by: seq,
            };
        }
        let mut failure = ApiFailure::new(429, format!("Too Many Requests: retry after {secs}"));
        failure.retry_after = Some(secs);
        failure
    }

    async fn dispatch(&self, method: &str, body: &Value) -> Result<Value, ApiFailure> {
        match method {
            "getMe" => Ok(self.me()),
            "getUpdates" => self.get_updates(body).await,
            "getWebhookInfo" => Ok(self.lock().webhook_info()),
            "setWebhook" => self.lock().set_webhook(body),
            "deleteWebhook" => self.lock().delete_webhook(body),
            "sendMessage" => self.lock().send_message(self, body),
            "editMessageText" => self.lock().edit_message_text(self, body),
            "sendChatAction" => send_chat_action(body),
            "setMyCommands" => self.lock().set_my_commands(body),
            "getMyCommands" => Ok(self.lock().get_my_commands(body)),
            "deleteMyCommands" => Ok(self.lock().delete_my_commands(body)),
            "deleteMessage" => self.lock().delete_message(body),
            "answerCallbackQuery" => answer_callback_query(body),
            "getFile" => self
                .files
                .get_file(body)
                .map_err(|(code, d)| ApiFailure::new(code, d)),
            "sendPhoto" | "sendDocument" | "sendVoice" => {
                let base = {
                    let mut inner = self.lock();
                    let chat_id = chat_id_param(body)?;
                    let message_id = inner.allocate_message_id(chat_id);
                    json!({"message_id": message_id, "from": self.bot_user(),
                        "chat": inner.chat_json(chat_id), "date": unix_now()})
                };
                self.files
                    .upload(method, body, base)
                    .map_err(|(code, d)| ApiFailure::new(code, d))
            }
            "editMessageReplyMarkup" => self.lock().edit_message_reply_markup(self, body),
            "setMessageReaction" => self.lock().set_message_reaction(body),
            "sendMessageDraft" => self.lock().send_message_draft(body),
            _ => Err(ApiFailure::new(404, "Not Found: method not found")),
        }
    }

    /// Long polling: confirm by offset, then hold until updates exist, the
    /// timeout passes, another poll supersedes this one, or shutdown.
    async fn get_updates(&self, body: &Value) -> Result<Value, ApiFailure> {
        let params = PollParams::parse(body)?;
        // Subscribe before looking at the queue so no push can slip between
        // the check and the wait.
        let mut changes = self.updates_tx.subscribe();
        let generation = self.lock().begin_poll(&params)?;
        self.updates_tx.send_modify(bump);
        let deadline = tokio::time::Instant::now() + params.hold;
        loop {
            {
                let mut inner = self.lock();
                if inner.poll_generation != generation {
                    return Err(ApiFailure::new(409, TERMINATED_BY_OTHER_POLL));
                }
                let batch = inner.deliverable(params.limit);
                if !batch.is_empty() || self.is_shut_down() {
                    return Ok(Value::Array(batch));
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Ok(Value::Array(self.lock().deliverable(params.limit))),
            }
        }
    }
}

/// Marks a call `Cancelled` if its handler future is dropped before it
/// finished (hyper does that when the client disconnects).
struct CallGuard {
    shared: Arc<Shared>,
    seq: u64,
    finished: bool,
}

impl CallGuard {
    fn finish(mut self, outcome: Outcome) {
        self.finished = true;
        self.shared.finish_call(self.seq, outcome);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.finish_call(self.seq, Outcome::Cancelled);
        }
    }
}

// ---------------------------------------------------------------------------
// Inner: the Bot API state machine (always called with the lock held)
// ---------------------------------------------------------------------------

impl Inner {
    fn check_retry_window(&mut self, seq: u64, method: &str, body: &Value, at: Instant) {
        let scope = retry_scope(method, body);
        let Some(window) = self.retry_windows.get(&scope) else {
            return;
        };
        if at < window.until {
            let violation = RetryAfterViolation {
                scope,
                announced_by: window.announced_by,
                retry_until: window.until,
                seq,
                method: method.to_owned(),
                at,
            };
            self.violations.push(violation);
        }
    }

    fn take_failure(&mut self, method: &str) -> Option<Failure> {
        if let Some(queue) = self.scripted.get_mut(method) {
            if let Some((remaining, failure)) = queue.front_mut() {
                let failure = failure.clone();
                *remaining -= 1;
                if *remaining == 0 {
                    queue.pop_front();
                }
                return Some(failure);
            }
        }
        let rule = self.rates.get_mut(method)?;
        rule.calls += 1;
        let k = rule.calls as f64;
        let due = (k * rule.probability).floor() > ((k - 1.0) * rule.probability).floor();
        due.then(|| rule.failure.clone())
    }

    fn chat_type(&self, chat_id: i64) -> ChatType {
        self.chat_types
            .get(&chat_id)
            .copied()
            .unwrap_or_else(|| ChatType::default_for(chat_id))
    }

    fn chat_json(&self, chat_id: i64) -> Value {
        let chat_type = self.chat_type(chat_id);
        let mut chat = json!({ "id": chat_id, "type": chat_type.as_str() });
        if chat_type == ChatType::Private {
            chat["first_name"] = json!(format!("User{chat_id}"));
            chat["username"] = json!(format!("user{chat_id}"));
        } else {
            chat["title"] = json!(format!("Chat {chat_id}"));
        }
        chat
    }

    fn allocate_message_id(&mut self, chat_id: i64) -> i64 {
        let chat = self.chats.entry(chat_id).or_default();
        chat.last_message_id = chat.last_message_id.saturating_add(1);
        chat.last_message_id
    }

    // -- updates -----------------------------------------------------------

    fn enqueue_update(&mut self, mut update: Value) -> i64 {
        let explicit = update.get("update_id").and_then(Value::as_i64);
        let id = explicit.unwrap_or(self.next_update_id);
        if explicit.is_none() {
            if let Some(object) = update.as_object_mut() {
                object.insert("update_id".to_owned(), json!(id));
            }
        }
        self.next_update_id = self.next_update_id.max(id.saturating_add(1));
        self.note_incoming_message(&update);
        self.updates.push_back(QueuedUpdate { id, value: update });
        id
    }

    /// Remembers user messages from raw updates so that message ids the bot
    /// gets later don't collide and `deleteMessage` finds them.
    fn note_incoming_message(&mut self, update: &Value) {
        let Some(message) = update
            .get("message")
            .or_else(|| update.get("edited_message"))
        else {
            return;
        };
        let chat_id = message
            .get("chat")
            .and_then(|c| c.get("id"))
            .and_then(Value::as_i64);
        let message_id = message.get("message_id").and_then(Value::as_i64);
        if let (Some(chat_id), Some(message_id)) = (chat_id, message_id) {
            let chat = self.chats.entry(chat_id).or_default();
            chat.last_message_id = chat.last_message_id.max(message_id);
            chat.user_messages.insert(message_id);
        }
    }

    fn user_message_base(&self, chat_id: i64, user_id: i64, message_id: i64) -> Value {
        json!({
            "message_id": message_id,
            "from": user_json(user_id),
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
        })
    }

    fn incoming_message(&mut self, chat_id: i64, user_id: i64, text: &str) -> Value {
        let message_id = self.allocate_message_id(chat_id);
        let mut message = self.user_message_base(chat_id, user_id, message_id);
        set_text(&mut message, "text", "entities", text);
        message
    }

    fn latest_bot_message_json(&mut self, shared: &Shared, chat_id: i64) -> Value {
        let latest = self
            .chats
            .get(&chat_id)
            .and_then(|c| c.bot_messages.values().rev().find(|m| !m.deleted));
        if let Some(message) = latest {
            return self.bot_message_json(shared, message, message.current(), false);
        }
        let message_id = self.allocate_message_id(chat_id);
        json!({
            "message_id": message_id,
            "from": shared.bot_user(),
            "chat": self.chat_json(chat_id),
            "date": unix_now(),
            "text": "(earlier bot message)",
        })
    }

    fn bot_message_json_or_inaccessible(
        &self,
        shared: &Shared,
        chat_id: i64,
        message_id: i64,
    ) -> Value {
        let known = self
            .chats
            .get(&chat_id)
            .and_then(|c| c.bot_messages.get(&message_id));
        match known {
            Some(message) if !message.deleted => {
                let edited = message.versions.len() > 1;
                self.bot_message_json(shared, message, message.current(), edited)
            }
            // Telegram's `InaccessibleMessage`: date 0.
            _ => json!({ "chat": self.chat_json(chat_id), "message_id": message_id, "date": 0 }),
        }
    }

    fn begin_poll(&mut self, params: &PollParams) -> Result<u64, ApiFailure> {
        if self.webhook_url.is_some() {
            return Err(ApiFailure::new(409, WEBHOOK_ACTIVE));
        }
        if let Some(allowed) = &params.allowed_updates {
            self.allowed_updates = Some(allowed.clone());
        }
        self.confirm(params.offset);
        self.poll_generation += 1;
        Ok(self.poll_generation)
    }

    /// Telegram semantics: a positive offset confirms (forgets) all updates
    /// with a smaller id; a negative offset `-k` keeps only the last `k`.
    fn confirm(&mut self, offset: i64) {
        if offset > 0 {
            self.updates.retain(|u| u.id >= offset);
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            let excess = self.updates.len().saturating_sub(keep);
            self.updates.drain(..excess);
        }
    }

    /// Up to `limit` queued updates. Updates of kinds excluded by
    /// `allowed_updates` are discarded, as Telegram never stores them.
    fn deliverable(&mut self, limit: usize) -> Vec<Value> {
        let allowed = self.allowed_updates.clone();
        self.updates
            .retain(|u| is_allowed(&u.value, allowed.as_deref()));
        self.updates
            .iter()
            .take(limit)
            .map(|u| u.value.clone())
            .collect()
    }

    // -- webhook -----------------------------------------------------------

    fn webhook_info(&self) -> Value {
        let mut info = json!({
            "url": self.webhook_url.clone().unwrap_or_default(),
            "has_custom_certificate": false,
            "pending_update_count": self.updates.len(),
        });
        // Like Telegram: the settings are shown while a webhook is set; the
        // secret token never is.
        if self.webhook_url.is_some() {
            info["max_connections"] = json!(self.webhook_settings.max_connections.unwrap_or(40));
            if let Some(allowed) = &self.webhook_settings.allowed_updates {
                info["allowed_updates"] = json!(allowed);
            }
        }
        info
    }

    fn set_webhook(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let url = str_param(body, "url")?.unwrap_or_default();
        if bool_param(body, "drop_pending_updates")? {
            self.updates.clear();
        }
        let max_connections = int_param(body, "max_connections")?;
        if let Some(n) = max_connections {
            if !(1..=100).contains(&n) {
                return Err(ApiFailure::bad_request(
                    "Bad Request: bad webhook: max_connections must be between 1 and 100",
                ));
            }
        }
        let allowed_updates = match body.get("allowed_updates") {
            None | Some(Value::Null) => None,
            Some(Value::Array(kinds)) => Some(
                kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            ),
            Some(_) => {
                return Err(ApiFailure::bad_request(
                    "Bad Request: can't parse allowed updates",
                ))
            }
        };
        // Telegram keeps one allowed_updates setting for both ways.
        if allowed_updates.is_some() {
            self.allowed_updates = allowed_updates.clone();
        }
        self.webhook_settings = WebhookSettings {
            allowed_updates,
            max_connections,
            secret_token: str_param(body, "secret_token")?,
        };
        // An empty URL removes the webhook, as in the real API.
        // A poll already being held runs to its timeout; the next one gets 409.
        self.webhook_url = (!url.is_empty()).then_some(url);
        Ok(json!(true))
    }

    fn delete_webhook(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let drop_pending = bool_param(body, "drop_pending_updates")?;
        if drop_pending {
            self.updates.clear();
        }
        self.delete_webhook_drops.push(drop_pending);
        self.webhook_url = None;
        Ok(json!(true))
    }

    // -- messages ----------------------------------------------------------

    fn send_message(&mut self, shared: &Shared, body: &Value) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let version = parse_version(body, TooLong::Send)?;
        let thread_id = int_param(body, "message_thread_id")?;
        let message_id = self.allocate_message_id(chat_id);
        let message = SentMessage {
            chat_id,
            message_id,
            thread_id,
            versions: vec![version],
            deleted: false,
        };
        let json = self.bot_message_json(shared, &message, message.current(), false);
        self.chats
            .entry(chat_id)
            .or_default()
            .bot_messages
            .insert(message_id, message);
        Ok(json)
    }

    fn edit_message_text(&mut self, shared: &Shared, body: &Value) -> Result<Value, ApiFailure> {
        let version = parse_version(body, TooLong::Edit)?;
        if str_param(body, "inline_message_id")?.is_some() {
            // Inline messages aren't tracked; Telegram answers `true` for them.
            return Ok(json!(true));
        }
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let chat = self.chats.get_mut(&chat_id);
        let message = match chat {
            Some(chat) if chat.user_messages.contains(&message_id) => {
                return Err(ApiFailure::bad_request(
                    "Bad Request: message can't be edited",
                ));
            }
            Some(chat) => chat
                .bot_messages
                .get_mut(&message_id)
                .filter(|m| !m.deleted),
            None => None,
        };
        let message = message
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: message to edit not found"))?;
        let current = message.current();
        let same = current.text == version.text
            && current.entities == version.entities
            && current.reply_markup == version.reply_markup;
        if same {
            return Err(ApiFailure::bad_request(NOT_MODIFIED));
        }
        message.versions.push(version);
        let message = message.clone();
        Ok(self.bot_message_json(shared, &message, message.current(), true))
    }

    /// `editMessageReplyMarkup`: a new version with the same text and the
    /// given keyboard (none: the keyboard is removed).
    fn edit_message_reply_markup(
        &mut self,
        shared: &Shared,
        body: &Value,
    ) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let markup = inline_markup(body.get("reply_markup"));
        let message = self
            .chats
            .get_mut(&chat_id)
            .and_then(|chat| chat.bot_messages.get_mut(&message_id))
            .filter(|m| !m.deleted)
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: message to edit not found"))?;
        if message.current().reply_markup == markup {
            return Err(ApiFailure::bad_request(NOT_MODIFIED));
        }
        let mut version = message.current().clone();
        version.reply_markup = markup;
        version.date = unix_now();
        message.versions.push(version);
        let message = message.clone();
        Ok(self.bot_message_json(shared, &message, message.current(), true))
    }

    /// `setMessageReaction` on a user's message: records the emoji list
    /// (an empty list removes the bot's reaction).
    /// `sendMessageDraft` (Bot API 9.3+): private chats only, a non-zero
    /// draft id, at most 4096 characters; an old server does not know it.
    fn send_message_draft(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        if self.refuse_drafts {
            return Err(ApiFailure::new(404, "Not Found: method not found"));
        }
        let chat_id = chat_id_param(body)?;
        if self.chat_type(chat_id) != ChatType::Private {
            return Err(ApiFailure::bad_request(
                "Bad Request: TEXTDRAFT_PEER_INVALID",
            ));
        }
        let draft_id = int_param(body, "draft_id")?.unwrap_or(0);
        if draft_id == 0 {
            return Err(ApiFailure::bad_request(
                "Bad Request: draft_id must be non-zero",
            ));
        }
        let text = body
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if utf16_len(&text) > MAX_TEXT_UTF16 {
            return Err(ApiFailure::bad_request("Bad Request: text is too long"));
        }
        let can_stop = body
            .get("can_stop")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        self.drafts.push((chat_id, draft_id, text, can_stop));
        Ok(json!(true))
    }

    fn set_message_reaction(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let known = self
            .chats
            .get(&chat_id)
            .is_some_and(|chat| chat.user_messages.contains(&message_id));
        if !known {
            return Err(ApiFailure::bad_request(
                "Bad Request: message to react not found",
            ));
        }
        let reaction = match body.get("reaction") {
            None | Some(Value::Null) => Value::Array(Vec::new()),
            Some(Value::String(raw)) => serde_json::from_str(raw).unwrap_or(Value::Null),
            Some(value) => value.clone(),
        };
        let Value::Array(kinds) = reaction else {
            return Err(ApiFailure::bad_request(
                "Bad Request: can't parse reaction types JSON object",
            ));
        };
        let mut emoji = Vec::new();
        for kind in kinds {
            match (kind.get("type").and_then(Value::as_str), kind.get("emoji")) {
                (Some("emoji"), Some(Value::String(e))) if REACTION_EMOJI.contains(&e.as_str()) => {
                    emoji.push(e.clone())
                }
                _ => return Err(ApiFailure::bad_request("Bad Request: REACTION_INVALID")),
            }
        }
        self.reactions.push((chat_id, message_id, emoji));
        Ok(json!(true))
    }

    fn bot_message_json(
        &self,
        shared: &Shared,
        message: &SentMessage,
        version: &MessageVersion,
        edited: bool,
    ) -> Value {
        let mut json = json!({
            "message_id": message.message_id,
            "from": shared.bot_user(),
            "chat": self.chat_json(message.chat_id),
            "date": message.versions.first().map_or(version.date, |v| v.date),
            "text": version.text,
        });
        if !version.entities.is_empty() {
            json["entities"] = Value::Array(version.entities.clone());
        }
        if let Some(thread_id) = message.thread_id {
            json["message_thread_id"] = json!(thread_id);
        }
        if let Some(markup) = &version.reply_markup {
            json["reply_markup"] = markup.clone();
        }
        if edited {
            json["edit_date"] = json!(version.date);
        }
        json
    }

    fn delete_message(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let chat_id = chat_id_param(body)?;
        let message_id = int_param(body, "message_id")?.ok_or_else(|| {
            ApiFailure::bad_request("Bad Request: message identifier is not specified")
        })?;
        let not_found = || ApiFailure::bad_request("Bad Request: message to delete not found");
        let chat = self.chats.get_mut(&chat_id).ok_or_else(not_found)?;
        if chat.user_messages.remove(&message_id) {
            return Ok(json!(true));
        }
        let message = chat
            .bot_messages
            .get_mut(&message_id)
            .filter(|m| !m.deleted)
            .ok_or_else(not_found)?;
        message.deleted = true;
        Ok(json!(true))
    }

    // -- commands ----------------------------------------------------------

    fn set_my_commands(&mut self, body: &Value) -> Result<Value, ApiFailure> {
        let commands = match body.get("commands") {
            Some(Value::String(raw)) => serde_json::from_str(raw).unwrap_or(Value::Null),
            Some(value) => value.clone(),
            None => Value::Null,
        };
        let Value::Array(list) = &commands else {
            return Err(ApiFailure::bad_request(
                "Bad Request: parameter \"commands\" is required",
            ));
        };
        if list.len() > 100 || !list.iter().all(is_valid_command) {
            return Err(ApiFailure::bad_request("Bad Request: BOT_COMMAND_INVALID"));
        }
        let key = commands_key(scope_of(body), language_of(body));
        self.commands.insert(key, commands);
        Ok(json!(true))
    }

    fn get_my_commands(&self, body: &Value) -> Value {
        let key = commands_key(scope_of(body), language_of(body));
        self.commands
            .get(&key)
            .cloned()
            .unwrap_or_else(|| json!([]))
    }

    fn delete_my_commands(&mut self, body: &Value) -> Value {
        let key = commands_key(scope_of(body), language_of(body));
        self.commands.remove(&key);
        json!(true)
    }
}

fn send_chat_action(body: &Value) -> Result<Value, ApiFailure> {
    chat_id_param(body)?;
    match str_param(body, "action")? {
        Some(action) if CHAT_ACTIONS.contains(&action.as_str()) => Ok(json!(true)),
        _ => Err(ApiFailure::bad_request(
            "Bad Request: wrong parameter action in request",
        )),
    }
}

fn answer_callback_query(body: &Value) -> Result<Value, ApiFailure> {
    match str_param(body, "callback_query_id")? {
        Some(id) if !id.is_empty() => Ok(json!(true)),
        _ => Err(ApiFailure::bad_request(
            "Bad Request: query is too old and response timeout expired or query id is invalid",
        )),
    }
}

// ---------------------------------------------------------------------------
// Parameter parsing and validation
// ---------------------------------------------------------------------------

struct PollParams {
    offset: i64,
    limit: usize,
    hold: Duration,
    allowed_updates: Option<Vec<String>>,
}

impl PollParams {
    fn parse(body: &Value) -> Result<Self, ApiFailure> {
        let offset = int_param(body, "offset")?.unwrap_or(0);
        let limit = int_param(body, "limit")?.unwrap_or(100).clamp(1, 100);
        let timeout = int_param(body, "timeout")?
            .unwrap_or(0)
            .clamp(0, MAX_POLL_SECS as i64);
        let allowed_updates = match body.get("allowed_updates") {
            None | Some(Value::Null) => None,
            Some(Value::Array(kinds)) => Some(
                kinds
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            ),
            Some(_) => {
                return Err(ApiFailure::bad_request(
                    "Bad Request: can't parse allowed updates",
                ))
            }
        };
        Ok(Self {
            offset,
            // Both clamped to small positive ranges above, so the casts are lossless.
            limit: limit as usize,
            hold: Duration::from_secs(timeout as u64),
            allowed_updates,
        })
    }
}

/// Which limit applies to an over-long text: Telegram words it differently
/// for sends and edits (teloxide: `MessageIsTooLong` vs `EditedMessageIsTooLong`).
#[derive(Clone, Copy)]
enum TooLong {
    Send,
    Edit,
}

/// Validates `text`, `entities` and `reply_markup` the way Telegram does
/// and turns them into a message version.
fn parse_version(body: &Value, too_long: TooLong) -> Result<MessageVersion, ApiFailure> {
    let text = str_param(body, "text")?.unwrap_or_default();
    if text.trim().is_empty() {
        return Err(ApiFailure::bad_request(
            "Bad Request: message text is empty",
        ));
    }
    if utf16_len(&text) > MAX_TEXT_UTF16 {
        let description = match too_long {
            TooLong::Send => "Bad Request: message is too long",
            TooLong::Edit => "Bad Request: MESSAGE_TOO_LONG",
        };
        return Err(ApiFailure::bad_request(description));
    }
    let entities = parse_entities(&text, body.get("entities"))?;
    Ok(MessageVersion {
        text,
        entities,
        reply_markup: inline_markup(body.get("reply_markup")),
        parse_mode: str_param(body, "parse_mode")?,
        date: unix_now(),
    })
}

/// Checks every entity lies within the text (offsets are UTF-16 units).
fn parse_entities(text: &str, raw: Option<&Value>) -> Result<Vec<Value>, ApiFailure> {
    let cant_parse =
        |why: String| ApiFailure::bad_request(format!("Bad Request: can't parse entities: {why}"));
    let parsed;
    let list = match raw {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => {
            parsed = serde_json::from_str::<Value>(s).map_err(|e| cant_parse(e.to_string()))?;
            &parsed
        }
        Some(value) => value,
    };
    let Value::Array(entities) = list else {
        return Err(cant_parse("entities must be an array".to_owned()));
    };
    let text_len = utf16_len(text) as u64;
    for (i, entity) in entities.iter().enumerate() {
        let offset = entity.get("offset").and_then(Value::as_u64);
        let length = entity.get("length").and_then(Value::as_u64);
        let kind = entity.get("type").and_then(Value::as_str);
        let (Some(offset), Some(length), Some(_)) = (offset, length, kind) else {
            return Err(cant_parse(format!(
                "entity {i} needs a type, an offset and a length"
            )));
        };
        if offset.saturating_add(length) > text_len {
            return Err(cant_parse(format!(
                "entity {i} (offset {offset}, length {length}) ends beyond the text ({text_len} UTF-16 code units)"
            )));
        }
    }
    Ok(entities.clone())
}

/// Messages only carry inline keyboards; reply keyboards aren't echoed
/// (and would break teloxide's `Message` parsing if they were).
fn inline_markup(raw: Option<&Value>) -> Option<Value> {
    let markup = match raw? {
        Value::String(s) => serde_json::from_str(s).ok()?,
        value => value.clone(),
    };
    markup.get("inline_keyboard").is_some().then_some(markup)
}

fn is_valid_command(entry: &Value) -> bool {
    let command = entry.get("command").and_then(Value::as_str).unwrap_or("");
    let description = entry
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let command_ok = (1..=32).contains(&command.len())
        && command
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let description_ok = (1..=256).contains(&description.chars().count());
    command_ok && description_ok
}

fn scope_of(body: &Value) -> &Value {
    body.get("scope").unwrap_or(&Value::Null)
}

fn language_of(body: &Value) -> &Value {
    body.get("language_code").unwrap_or(&Value::Null)
}

/// Commands are stored per (scope, language); a missing scope means the
/// default scope.
fn commands_key(scope: &Value, language: &Value) -> String {
    let scope = match scope {
        Value::Null => json!({ "type": "default" }),
        other => other.clone(),
    };
    format!("{scope}|{}", language.as_str().unwrap_or(""))
}

fn retry_scope(method: &str, body: &Value) -> RetryScope {
    let chat_id = body.get("chat_id").and_then(value_as_i64);
    match chat_id {
        Some(chat_id) if CHAT_SCOPED_METHODS.contains(&method) => RetryScope::Chat(chat_id),
        _ => RetryScope::Method(method.to_owned()),
    }
}

fn is_allowed(update: &Value, allowed: Option<&[String]>) -> bool {
    let Some(kind) = update_kind(update) else {
        // Odd test updates with no known kind are always delivered.
        return true;
    };
    match allowed {
        Some(list) if !list.is_empty() => list.iter().any(|a| a == kind),
        _ => !NOT_DELIVERED_BY_DEFAULT.contains(&kind),
    }
}

fn update_kind(update: &Value) -> Option<&'static str> {
    let object = update.as_object()?;
    KNOWN_UPDATE_KINDS
        .iter()
        .copied()
        .find(|kind| object.contains_key(*kind))
}

fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn int_param(body: &Value, key: &str) -> Result<Option<i64>, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value_as_i64(value).map(Some).ok_or_else(|| {
            ApiFailure::bad_request(format!("Bad Request: field \"{key}\" must be an Integer"))
        }),
    }
}

fn str_param(body: &Value, key: &str) -> Result<Option<String>, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => Err(ApiFailure::bad_request(format!(
            "Bad Request: field \"{key}\" must be a String"
        ))),
    }
}

fn bool_param(body: &Value, key: &str) -> Result<bool, ApiFailure> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
        Some(_) => Err(ApiFailure::bad_request(format!(
            "Bad Request: field \"{key}\" must be a Boolean"
        ))),
    }
}

/// `chat_id` is required; `@username` strings can't be resolved by the fake.
fn chat_id_param(body: &Value) -> Result<i64, ApiFailure> {
    match body.get("chat_id") {
        None | Some(Value::Null) => Err(ApiFailure::bad_request("Bad Request: chat_id is empty")),
        Some(value) => value_as_i64(value)
            .ok_or_else(|| ApiFailure::bad_request("Bad Request: chat not found")),
    }
}

// ---------------------------------------------------------------------------
// Update builders
// ---------------------------------------------------------------------------

fn user_json(user_id: i64) -> Value {
    json!({
        "id": user_id,
        "is_bot": false,
        "first_name": format!("User{user_id}"),
        "username": format!("user{user_id}"),
        "language_code": "en",
    })
}

fn fake_photo_sizes(message_id: i64) -> Value {
    let size = |suffix: &str, side: u32, bytes: u32| {
        json!({
            "file_id": format!("fake-photo-{message_id}-{suffix}"),
            "file_unique_id": format!("fakeuniq{message_id}{suffix}"),
            "width": side,
            "height": side,
            "file_size": bytes,
        })
    };
    json!([size("s", 90, 1_200), size("m", 800, 64_000)])
}

/// Sets `text_key` and, if any are found, the entities Telegram would add.
fn set_text(message: &mut Value, text_key: &str, entities_key: &str, text: &str) {
    message[text_key] = json!(text);
    let entities = detect_entities(text);
    if !entities.is_empty() {
        message[entities_key] = Value::Array(entities);
    }
}

/// `bot_command` for a leading `/command[@bot]` and `mention` for each
/// `@name`, with offsets and lengths in UTF-16 units as Telegram sends them.
fn detect_entities(text: &str) -> Vec<Value> {
    let mut entities = Vec::new();
    let mut skip_until = 0; // byte index: mentions inside the command are part of it
    if let Some(end) = command_end(text) {
        entities.push(entity("bot_command", 0, utf16_len(&text[..end])));
        skip_until = end;
    }
    let mut previous: Option<char> = None;
    for (index, c) in text.char_indices() {
        let at_word_start = previous.is_none_or(|p| !is_word_char(p));
        previous = Some(c);
        if c != '@' || index < skip_until || !at_word_start {
            continue;
        }
        let name_len: usize = text[index + 1..]
            .chars()
            .take_while(|c| is_word_char(*c))
            .map(char::len_utf8)
            .sum();
        if name_len > 0 {
            let offset = utf16_len(&text[..index]);
            entities.push(entity(
                "mention",
                offset,
                1 + utf16_len(&text[index + 1..index + 1 + name_len]),
            ));
        }
    }
    entities
}

/// Byte length of a leading `/command` (with optional `@bot`), if any.
fn command_end(text: &str) -> Option<usize> {
    let rest = text.strip_prefix('/')?;
    let name: usize = rest
        .chars()
        .take_while(|c| is_word_char(*c))
        .map(char::len_utf8)
        .sum();
    if name == 0 {
        return None;
    }
    let mut end = 1 + name;
    if let Some(after) = text[end..].strip_prefix('@') {
        let bot: usize = after
            .chars()
            .take_while(|c| is_word_char(*c))
            .map(char::len_utf8)
            .sum();
        if bot > 0 {
            end += 1 + bot;
        }
    }
    Some(end)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn entity(kind: &str, offset: usize, length: usize) -> Value {
    json!({ "type": kind, "offset": offset, "length": length })
}

fn utf16_len(text: &str) -> usize {
    text.encode_utf16().count()
}

fn unix_now() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// Telegram matches method names case-insensitively.
fn canonical_method(name: &str) -> String {
    let known = KNOWN_METHODS.iter().find(|m| m.eq_ignore_ascii_case(name));
    known.map_or_else(|| name.to_owned(), |m| (*m).to_owned())
}

// ---------------------------------------------------------------------------
// HTTP layer
// ---------------------------------------------------------------------------

/// The only handler: routes `/bot{token}/{method}` for any token. Written
/// as a fallback with manual path parsing so every malformed request still
/// gets a Telegram-shaped JSON error instead of an axum rejection.
async fn handle(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    request: Request,
) -> Response {
    if let Some(path) = download_path(request.uri().path()) {
        let path = path.to_owned();
        return shared.files.download(&path).await;
    }
    let Some(method) = method_from_path(request.uri().path()) else {
        return ApiFailure::new(404, "Not Found").to_response();
    };
    let method = canonical_method(&method);
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let multipart_boundary = content_type.and_then(multipart_boundary);
    let body = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await;
    let parsed = match (body, multipart_boundary) {
        (Err(_), _) => Err(ApiFailure::new(413, "Request Entity Too Large")),
        (Ok(bytes), Some(boundary)) => parse_multipart(&bytes, &boundary, &method),
        (Ok(bytes), None) => parse_body(&bytes),
    };
    let recorded_body = parsed.as_ref().map_or(Value::Null, Clone::clone);
    let guard = shared.begin_call(&method, recorded_body);
    let reply = match parsed {
        Ok(body) => shared.serve_call(guard.seq, &method, body).await,
        Err(failure) => Reply::Answer(Err(failure)),
    };
    match reply {
        Reply::Answer(Ok(result)) => {
            guard.finish(Outcome::Ok(result.clone()));
            (
                StatusCode::OK,
                Json(json!({ "ok": true, "result": result })),
            )
                .into_response()
        }
        Reply::Answer(Err(failure)) => {
            guard.finish(Outcome::Error {
                code: failure.code,
                description: failure.description.clone(),
            });
            failure.to_response()
        }
        Reply::Hang => {
            // Until hyper drops this handler (the client hung up or the
            // fake shut down); the guard then records `Cancelled`.
            std::future::pending::<()>().await;
            StatusCode::NO_CONTENT.into_response()
        }
        Reply::Garbage(result) => {
            guard.finish(match result {
                Ok(value) => Outcome::Garbled(value),
                Err(failure) => Outcome::Error {
                    code: failure.code,
                    description: failure.description,
                },
            });
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body>upstream hiccup</body></html>",
            )
                .into_response()
        }
        Reply::Drop => {
            guard.finish(Outcome::Dropped);
            // Killing the connection makes hyper's write of this response
            // fail, so the client gets EOF instead of an answer.
            conn.0.kill();
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// `/bot<token>/<method>` → `method`.
fn method_from_path(path: &str) -> Option<String> {
    let mut segments = path.trim_start_matches('/').split('/');
    let token = segments.next()?;
    let method = segments.next()?;
    let well_formed = token.starts_with("bot") && !method.is_empty() && segments.next().is_none();
    well_formed.then(|| method.to_owned())
}

/// The boundary of a `multipart/form-data` body; an empty string if the
/// header is multipart but names no boundary (parsing then fails with 400).
fn multipart_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';').map(str::trim);
    let mime = params.next()?;
    if !mime.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    let boundary = params
        .find_map(|p| p.strip_prefix("boundary="))
        .unwrap_or("");
    Some(boundary.trim_matches('"').to_owned())
}

/// Fields teloxide serialises as JSON text inside multipart bodies.
const MULTIPART_JSON_FIELDS: &[&str] = &[
    "allowed_updates",
    "caption_entities",
    "commands",
    "entities",
    "link_preview_options",
    "media",
    "reply_markup",
    "reply_parameters",
    "scope",
];

/// teloxide uses multipart for every request that *may* carry a file (e.g.
/// `setWebhook` with its optional certificate), so text-only multipart
/// bodies are accepted as parameters. Actual file parts are refused.
fn parse_multipart(bytes: &[u8], boundary: &str, method: &str) -> Result<Value, ApiFailure> {
    let malformed = || ApiFailure::bad_request("Bad Request: can't parse multipart/form-data body");
    if boundary.is_empty() {
        return Err(malformed());
    }
    let delimiter = format!("--{boundary}");
    let mut fields = Map::new();
    for part in split_bytes(bytes, delimiter.as_bytes()).skip(1) {
        if part.starts_with(b"--") {
            break; // closing delimiter
        }
        let part = part.strip_prefix(b"\r\n").ok_or_else(malformed)?;
        let part = part.strip_suffix(b"\r\n").ok_or_else(malformed)?;
        let split = find_bytes(part, b"\r\n\r\n").ok_or_else(malformed)?;
        let headers = std::str::from_utf8(&part[..split]).map_err(|_| malformed())?;
        let content = &part[split + 4..];
        let (name, is_file) = disposition(headers).ok_or_else(malformed)?;
        if is_file && matches!(method, "sendPhoto" | "sendDocument" | "sendVoice") {
            let filename = headers
                .split(';')
                .find_map(|p| p.trim().strip_prefix("filename="))
                .map(|f| f.lines().next().unwrap_or("").trim_matches('"').to_owned())
                .unwrap_or_default();
            fields.insert(name, file_part(&filename, content));
            continue;
        }
        if is_file {
            return Err(ApiFailure::bad_request(
                "Bad Request: file uploads are not supported by fake",
            ));
        }
        let text = std::str::from_utf8(content).map_err(|_| malformed())?;
        let value = match serde_json::from_str(text) {
            Ok(json) if MULTIPART_JSON_FIELDS.contains(&name.as_str()) => json,
            _ => Value::String(text.to_owned()),
        };
        fields.insert(name, value);
    }
    Ok(Value::Object(fields))
}

/// `(field name, has filename)` from a part's headers.
fn disposition(headers: &str) -> Option<(String, bool)> {
    let line = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    let mut name = None;
    let mut is_file = false;
    for param in line.split(';').map(str::trim) {
        if let Some(value) = param.strip_prefix("name=") {
            name = Some(value.trim_matches('"').to_owned());
        } else if param.starts_with("filename") {
            is_file = true;
        }
    }
    Some((name?, is_file))
}

fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Splits on every occurrence of `delimiter` (like `str::split`).
fn split_bytes<'a>(
    mut bytes: &'a [u8],
    delimiter: &'a [u8],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        match find_bytes(bytes, delimiter) {
            Some(at) => {
                let (head, tail) = bytes.split_at(at);
                bytes = &tail[delimiter.len()..];
                Some(head)
            }
            None => {
                done = true;
                Some(bytes)
            }
        }
    })
}

/// An empty body means no parameters; anything else must be a JSON object.
fn parse_body(bytes: &[u8]) -> Result<Value, ApiFailure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(ApiFailure::bad_request(
            "Bad Request: request body must be a JSON object",
        )),
        Err(e) => Err(ApiFailure::bad_request(format!(
            "Bad Request: can't parse JSON: {e}"
        ))),
    }
}

// ---------------------------------------------------------------------------
// Killable connections (for Failure::Drop and shutdown)
// ---------------------------------------------------------------------------

/// Lets the fake close a connection from inside a handler. Once killed,
/// every read and write on the connection fails, so hyper gives up on it
/// without sending anything; a parked read is woken so idle keep-alive
/// connections close too.
#[derive(Default)]
struct KillSwitch {
    killed: AtomicBool,
    read_waker: Mutex<Option<Waker>>,
}

impl KillSwitch {
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        let waker = self
            .read_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    fn check(&self) -> io::Result<()> {
        if self.is_killed() {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "killed by the fake Bot API",
            ))
        } else {
            Ok(())
        }
    }
}

/// Per-connection info handed to the handler via `ConnectInfo`.
#[derive(Clone)]
struct ConnHandle(Arc<KillSwitch>);

impl fmt::Debug for ConnHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnHandle")
            .field("killed", &self.0.is_killed())
            .finish()
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.remote_addr().clone()
    }
}

struct KillableListener {
    inner: TcpListener,
    /// Weak so the server task doesn't keep the state alive after the
    /// handle is gone.
    shared: Weak<Shared>,
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = ConnHandle;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, _)) = self.inner.accept().await else {
                // Transient (e.g. too many open files): back off briefly.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let switch = Arc::new(KillSwitch::default());
            if let Some(shared) = self.shared.upgrade() {
                shared.register_connection(&switch);
            }
            let io = KillableStream {
                inner: stream,
                switch: Arc::clone(&switch),
            };
            return (io, ConnHandle(switch));
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(ConnHandle(Arc::new(KillSwitch::default())))
    }
}

struct KillableStream {
    inner: TcpStream,
    switch: Arc<KillSwitch>,
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Register before checking, so a kill in between still wakes us.
        *self
            .switch
            .read_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
