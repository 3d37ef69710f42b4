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

mod conn;
mod flood;
mod http;
mod methods;
mod params;
mod state;
mod telegram;
mod topics;
mod types;
mod updates;

use super::fake_files::FakeFiles;
use axum::Router;
use serde_json::{json, Value};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use conn::{ConnHandle, KillableListener};
// The facade tests import from; a bench uses part of it.
#[allow(unused_imports)]
pub use flood::{FloodLimits, RetryAfterViolation, RetryScope};
use http::handle;
use params::{commands_key, is_allowed};
use state::{bump, RateRule, Shared};
#[allow(unused_imports)]
pub use topics::Topic;
#[allow(unused_imports)]
pub use types::{
    ChatType, Failure, FakeConfig, Outcome, RecordedCall, SentMessage, WebhookSettings,
};
use updates::{canonical_method, fake_photo_sizes, set_text, unix_now, user_json};

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
        self.calls_where(|c| c.method == method)
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

    /// The recorded calls that satisfy `pred`, in arrival order: a copy of
    /// those only, not of the whole record.
    pub fn calls_where<F>(&self, pred: F) -> Vec<RecordedCall>
    where
        F: Fn(&RecordedCall) -> bool,
    {
        let inner = self.shared.lock();
        inner.calls.iter().filter(|c| pred(c)).cloned().collect()
    }

    /// How many recorded calls satisfy `pred`, counted in place (no copy
    /// of the record: cheap enough to ask after every call).
    pub fn count_calls<F>(&self, pred: F) -> usize
    where
        F: Fn(&RecordedCall) -> bool,
    {
        self.shared.lock().calls.iter().filter(|c| pred(c)).count()
    }

    /// How many calls were recorded so far (a mark for
    /// [`FakeBotApi::count_answered_calls_since`]), without copying them.
    pub fn calls_len(&self) -> usize {
        self.shared.lock().calls.len()
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

    /// When the update `update_id` was first handed out by a `getUpdates`
    /// answer (the moment telegate could first see it), if it was.
    pub fn handed_out_at(&self, update_id: i64) -> Option<std::time::Instant> {
        self.shared.lock().handed_out.get(&update_id).copied()
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
