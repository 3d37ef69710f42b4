//! State shared between the handle and the request handlers, and the
//! call bookkeeping around the Bot API state machine.

use super::super::fake_files::FakeFiles;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use super::conn::KillSwitch;
use super::flood::{Flood, RetryAfterViolation, RetryScope};
use super::methods::{answer_callback_query, send_chat_action};
use super::params::{chat_id_param, retry_scope, PollParams};
use super::telegram::TERMINATED_BY_OTHER_POLL;
use super::types::{
    ChatType, Failure, FakeConfig, Outcome, RecordedCall, SentMessage, WebhookSettings,
};
use super::updates::unix_now;

/// State shared between the handle and the request handlers.
pub(super) struct Shared {
    pub(super) config: FakeConfig,
    pub(super) inner: Mutex<Inner>,
    /// Bumped whenever a call is recorded or finishes; drives `wait_for`.
    pub(super) calls_tx: watch::Sender<u64>,
    /// Bumped when updates are queued, a new poll starts, or on shutdown;
    /// wakes held long polls.
    pub(super) updates_tx: watch::Sender<u64>,
    pub(super) shut_down: AtomicBool,
    pub(super) connections: Mutex<Vec<Weak<KillSwitch>>>,
    /// getFile, downloads and uploads (see `fake_files.rs`).
    pub(super) files: FakeFiles,
}

pub(super) fn bump(version: &mut u64) {
    *version = version.wrapping_add(1);
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) next_seq: u64,
    pub(super) calls: Vec<RecordedCall>,
    pub(super) chat_types: HashMap<i64, ChatType>,
    pub(super) chats: HashMap<i64, ChatState>,
    pub(super) updates: VecDeque<QueuedUpdate>,
    pub(super) next_update_id: i64,
    /// Persisted like Telegram does: a `getUpdates` without the parameter
    /// keeps the previous setting. `None` = Telegram's default set.
    pub(super) allowed_updates: Option<Vec<String>>,
    /// Incremented by every `getUpdates`; a held poll whose generation is
    /// outdated was superseded and answers 409, like Telegram.
    pub(super) poll_generation: u64,
    pub(super) webhook_url: Option<String>,
    pub(super) delete_webhook_drops: Vec<bool>,
    /// What the last `setWebhook` asked for besides the URL.
    pub(super) webhook_settings: WebhookSettings,
    pub(super) commands: HashMap<String, Value>,
    pub(super) scripted: HashMap<String, VecDeque<(usize, Failure)>>,
    pub(super) rates: HashMap<String, RateRule>,
    pub(super) retry_windows: HashMap<RetryScope, RetryWindow>,
    pub(super) violations: Vec<RetryAfterViolation>,
    pub(super) next_callback_id: u64,
    pub(super) flood: Flood,
    /// Every accepted `setMessageReaction`: (chat, message, emoji).
    pub(super) reactions: Vec<(i64, i64, Vec<String>)>,
    /// Every accepted `sendMessageDraft`: (chat, draft id, text, can_stop).
    pub(super) drafts: Vec<(i64, i64, String, bool)>,
    /// Answer `sendMessageDraft` like a Bot API server that predates it.
    pub(super) refuse_drafts: bool,
    /// Forum supergroups and their topics.
    pub(super) forums: super::topics::Forums,
    /// When each update was first handed out by a `getUpdates` answer.
    pub(super) handed_out: HashMap<i64, Instant>,
}

#[derive(Default)]
pub(super) struct ChatState {
    /// Message ids are shared by the bot's and the users' messages, as in
    /// a real chat.
    pub(super) last_message_id: i64,
    pub(super) bot_messages: BTreeMap<i64, SentMessage>,
    pub(super) user_messages: HashSet<i64>,
}

pub(super) struct QueuedUpdate {
    pub(super) id: i64,
    pub(super) value: Value,
}

pub(super) struct RateRule {
    pub(super) probability: f64,
    pub(super) failure: Failure,
    pub(super) calls: u64,
}

pub(super) struct RetryWindow {
    pub(super) until: Instant,
    pub(super) announced_by: u64,
}

/// An API error answer.
#[derive(Debug)]
pub(super) struct ApiFailure {
    pub(super) code: u16,
    pub(super) description: String,
    pub(super) retry_after: Option<u32>,
}

impl ApiFailure {
    pub(super) fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
            retry_after: None,
        }
    }

    pub(super) fn bad_request(description: impl Into<String>) -> Self {
        Self::new(400, description)
    }

    pub(super) fn to_json(&self) -> Value {
        let mut body =
            json!({ "ok": false, "error_code": self.code, "description": self.description });
        if let Some(secs) = self.retry_after {
            body["parameters"] = json!({ "retry_after": secs });
        }
        body
    }

    pub(super) fn to_response(&self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(self.to_json())).into_response()
    }
}

/// How the handler ends a call.
pub(super) enum Reply {
    Answer(Result<Value, ApiFailure>),
    Drop,
    Hang,
    Garbage(Result<Value, ApiFailure>),
}

impl Shared {
    pub(super) fn new(config: FakeConfig) -> Self {
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
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    pub(super) fn bot_user(&self) -> Value {
        json!({
            "id": self.config.bot_id,
            "is_bot": true,
            "first_name": self.config.first_name,
            "username": self.config.username,
        })
    }

    /// `getMe`: every field teloxide's `Me` requires, or the dispatcher
    /// fails at startup.
    pub(super) fn me(&self) -> Value {
        let mut me = self.bot_user();
        me["can_join_groups"] = json!(self.config.can_join_groups);
        me["can_read_all_group_messages"] = json!(self.config.can_read_all_group_messages);
        me["supports_inline_queries"] = json!(self.config.supports_inline_queries);
        me["can_connect_to_business"] = json!(false);
        me["has_main_web_app"] = json!(false);
        me
    }

    pub(super) fn register_connection(&self, switch: &Arc<KillSwitch>) {
        let mut conns = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        conns.retain(|c| c.strong_count() > 0);
        conns.push(Arc::downgrade(switch));
    }

    pub(super) fn kill_all_connections(&self) {
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
    pub(super) fn begin_call(self: &Arc<Self>, method: &str, body: Value) -> CallGuard {
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
                done: None,
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

    pub(super) fn finish_call(&self, seq: u64, outcome: Outcome) {
        {
            let mut inner = self.lock();
            // Searching from the end: the call is almost always recent.
            if let Some(call) = inner.calls.iter_mut().rev().find(|c| c.seq == seq) {
                call.outcome = outcome;
                call.done = Some(Instant::now());
            }
        }
        self.calls_tx.send_modify(bump);
    }

    /// Runs a call: scripted failure first, then the method itself.
    pub(super) async fn serve_call(&self, seq: u64, method: &str, body: Value) -> Reply {
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
    pub(super) fn flood_check(&self, method: &str, body: &Value) -> Option<u32> {
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
    pub(super) fn announce_retry_after(
        &self,
        seq: u64,
        method: &str,
        body: &Value,
        secs: u32,
    ) -> ApiFailure {
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

    pub(super) async fn dispatch(&self, method: &str, body: &Value) -> Result<Value, ApiFailure> {
        match method {
            "getMe" => Ok(self.me()),
            "getUpdates" => self.get_updates(body).await,
            "getWebhookInfo" => Ok(self.lock().webhook_info()),
            "setWebhook" => self.lock().set_webhook(body),
            "deleteWebhook" => self.lock().delete_webhook(body),
            "sendMessage" => {
                let mut inner = self.lock();
                inner.check_thread(body)?;
                inner.send_message(self, body)
            }
            "editMessageText" => self.lock().edit_message_text(self, body),
            "sendChatAction" => {
                self.lock().check_thread(body)?;
                send_chat_action(body)
            }
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
                    inner.check_thread(body)?;
                    let chat_id = chat_id_param(body)?;
                    let message_id = inner.allocate_message_id(chat_id);
                    let mut base = json!({"message_id": message_id, "from": self.bot_user(),
                        "chat": inner.chat_json(chat_id), "date": unix_now()});
                    if let Some(thread) = body.get("message_thread_id") {
                        base["message_thread_id"] = thread.clone();
                    }
                    base
                };
                self.files
                    .upload(method, body, base)
                    .map_err(|(code, d)| ApiFailure::new(code, d))
            }
            "editMessageReplyMarkup" => self.lock().edit_message_reply_markup(self, body),
            "setMessageReaction" => self.lock().set_message_reaction(body),
            "sendMessageDraft" => self.lock().send_message_draft(body),
            "createForumTopic" => {
                let created = self.lock().create_forum_topic(self.bot_user(), body);
                self.updates_tx.send_modify(bump);
                created
            }
            "editForumTopic" => self.lock().edit_forum_topic(body),
            "closeForumTopic" => {
                let closed = self.lock().close_forum_topic(self.bot_user(), body);
                self.updates_tx.send_modify(bump);
                closed
            }
            "deleteForumTopic" => self.lock().delete_forum_topic(body),
            _ => Err(ApiFailure::new(404, "Not Found: method not found")),
        }
    }

    /// Long polling: confirm by offset, then hold until updates exist, the
    /// timeout passes, another poll supersedes this one, or shutdown.
    pub(super) async fn get_updates(&self, body: &Value) -> Result<Value, ApiFailure> {
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
pub(super) struct CallGuard {
    pub(super) shared: Arc<Shared>,
    pub(super) seq: u64,
    pub(super) finished: bool,
}

impl CallGuard {
    pub(super) fn finish(mut self, outcome: Outcome) {
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
