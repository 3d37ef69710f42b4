//! The Telegram delivery engine: one per bot, shared by every chat.
//!
//! Every outbound request (send, edit, typing) goes through [`Delivery::call`],
//! which paces it with the shared [`RateLimiter`] (per chat and global limits,
//! also for edits and chat actions, which teloxide's `Throttle` does not
//! cover), honours `retry_after` (the request waits and is retried, however
//! long the wait: a reply is never dropped because Telegram asked us to slow
//! down), retries transient failures with backoff, and never blindly resends
//! a message whose request may already have reached Telegram.
//!
//! What is transient: an HTTP 5xx (Telegram did not carry the request out)
//! and a connection that could not be made (the request never left). They
//! are retried [`DeliveryConfig::max_attempts`] times in all, the waits
//! doubling from 400 ms up to [`MAX_BACKOFF`] (about a minute together).
//! What is unknown: no answer after the request was written (the client's
//! timeout, a connection closed mid-answer) or an answer that is not the
//! Bot API's JSON. An edit or a chat action is simply repeated; a send is
//! not (Telegram has no idempotent send): it fails with
//! [`DeliveryError::Ambiguous`], for the caller to tell the user once
//! [`Delivery::wait_until_answering`] says Telegram answers again. Sends
//! and edits go out through [`super::api::post`], which keeps the HTTP
//! status that teloxide's own request path turns into an API error (after
//! sleeping 10 s), and read only what is kept of the answer (a sent
//! message's id; nothing of an edit's), since a whole `Message` costs more
//! to read than the rest of a turn's JSON.
//!
//! Requests to one chat go out one at a time: a request waits until the
//! previous one to the same chat has its answer. Otherwise a notice sent
//! while a turn's edit is in flight could reach Telegram just after that
//! edit was answered with 429, i.e. inside the `retry_after` window the
//! bot had not heard of yet. For the same reason a request, once sent, runs
//! to its answer even if the turn that sent it is cancelled meanwhile.
//! Chats never wait for each other.
//!
//! Within a chat, control replies (the answers to /stop, /new, /reset,
//! /status, /approve, /deny and the other commands: [`ReplyKind::Command`])
//! jump the line: a chat's waiting requests are a two-lane queue and the
//! control lane is served first (the normal lane round-robin across the
//! users the requests are for, then their topics: [`super::lanes`]), and the rate limiter lets a control reply
//! use the burst token ordinary sends leave free ([`Priority`]). A typing
//! action is only sent when the chat's turn is free and the limits have
//! room right now; otherwise it is skipped, so it never delays a message.
//!
//! This module owns pacing and retries. It must never decide whether a reply
//! should be sent (the adapter and runner did that) and never log message
//! text above debug level.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::de::IgnoredAny;
use teloxide::payloads::{
    EditMessageText, EditMessageTextSetters, GetMe, SendMessage, SendMessageSetters,
};
use teloxide::requests::{Request, Requester};
use teloxide::types::{
    ChatAction, ChatId, InlineKeyboardMarkup, MessageId, ReplyParameters, ThreadId,
};
use teloxide::{ApiError, Bot, RequestError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::api::{AttemptError, ReadAs, SentMessage};
use super::bot_api::BotApi;
use super::entity::{to_telegram, FormattedText};
use super::lanes::{ChatLanes, ChatTurn, Party};
use super::markdown::render;
pub use super::ratelimit::Priority;
use super::ratelimit::{RateLimiter, RateLimits};
use super::reply_record::ReplyRecord;
use super::split::{split, TELEGRAM_LIMIT};
use crate::metrics::DeliveryStats;
use crate::reply::{DeliveryError, Reply, ReplyKind, TextFormat};
use crate::vocab::SessionSource;

/// Delivery settings.
#[derive(Clone, Debug)]
pub struct DeliveryConfig {
    /// Pacing limits.
    pub limits: RateLimits,
    /// At most one streaming edit per chat within this interval.
    pub edit_interval: Duration,
    /// How often the typing indicator is refreshed while a turn runs.
    pub typing_interval: Duration,
    /// How long a turn runs before "typing…" is first shown: a turn that
    /// answers sooner costs no chat action (no Bot API call, no token of
    /// the chat's flood budget), and a user cannot tell the difference.
    pub typing_delay: Duration,
    /// `retry_after` waits longer than this are logged as warnings (the
    /// request still waits and is delivered).
    pub max_retry_wait: Duration,
    /// Attempts for transient (5xx, no connection) failures, and for an
    /// unanswered edit, before giving up.
    pub max_attempts: u32,
    /// Messages one answer may take; a longer answer's whole text follows
    /// them as a Markdown file (`[delivery] max_answer_parts`).
    pub max_answer_parts: usize,
}

/// At most this many of a bot's normal requests are in flight at once
/// (control requests, one per chat at most, are not counted, so a /stop's
/// answer never waits behind them). Without a cap, a bot answering a burst
/// of chats with pacing turned off opened one connection per chat (80 per
/// bot, 8,000 descriptors for 50 bots in `cargo bench --bench bots`):
/// memory, descriptors and connection set-up grew with the burst, and
/// each in-flight request beyond a few dozen only waits at Telegram.
pub const MAX_IN_FLIGHT: usize = 16;

/// The longest wait between two attempts of a transient failure.
pub const MAX_BACKOFF: Duration = Duration::from_millis(200 * (1 << 7));

/// How long to wait after the `attempt`-th transient failure: 400 ms,
/// doubling, at most [`MAX_BACKOFF`].
pub fn transient_backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * 2u64.pow(attempt.clamp(1, 7)))
}

/// The longest wait between two probes of [`Delivery::wait_until_answering`].
const MAX_PROBE_WAIT: Duration = Duration::from_secs(30);

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            limits: RateLimits::default(),
            edit_interval: Duration::from_secs(1),
            typing_interval: Duration::from_secs(4),
            typing_delay: Duration::from_millis(300),
            max_retry_wait: Duration::from_secs(60),
            max_attempts: 8,
            max_answer_parts: DEFAULT_MAX_ANSWER_PARTS,
        }
    }
}

/// Messages an answer takes at most, unless configured.
pub const DEFAULT_MAX_ANSWER_PARTS: usize = 10;

/// Whether a request may be repeated when its outcome is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idempotence {
    /// Repeating it changes nothing (edits, chat actions).
    Safe,
    /// Repeating it could duplicate a message (sends).
    Unsafe,
}

struct DeliveryInner {
    /// The bot, and the client of the sends, edits and the probe (its
    /// own, or direct).
    api: BotApi,
    limiter: Mutex<RateLimiter>,
    stats: Mutex<DeliveryStats>,
    config: DeliveryConfig,
    /// Whose turn it is to send to each chat (see the module docs).
    chat_lanes: Arc<ChatLanes>,
    /// Told of every forum topic a request found closed or deleted
    /// ([`Delivery::watch_gone_topics`]).
    gone_topics: Mutex<Option<tokio::sync::mpsc::UnboundedSender<(i64, i32)>>>,
    /// [`MAX_IN_FLIGHT`] permits for normal requests.
    in_flight: Arc<Semaphore>,
}

/// The delivery engine (cheap to clone).
#[derive(Clone)]
pub struct Delivery {
    inner: Arc<DeliveryInner>,
}

/// Where in Telegram a reply goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatTarget {
    /// The chat.
    pub chat_id: i64,
    /// Forum topic, if any.
    pub thread_id: Option<i32>,
    /// Groups are paced more strictly.
    pub is_group: bool,
    /// The user the request is for (whose message it answers), if any: a
    /// chat's waiting requests are served round-robin across users, then
    /// topics, so one user's burst never holds up another's answer.
    pub user: Option<u64>,
}

impl ChatTarget {
    /// The target for a session source.
    pub fn of(source: &SessionSource) -> Self {
        ChatTarget {
            chat_id: source.chat_id,
            thread_id: source.thread_id,
            is_group: source.chat_type.is_group(),
            user: source.user_id,
        }
    }

    /// Whom a request to this target is for, within its chat.
    fn party(&self) -> Party {
        Party {
            user: self.user,
            thread: self.thread_id,
        }
    }
}

/// Telegram's refusal of a request into a forum topic that is closed or
/// deleted (pure).
pub fn is_gone_topic(why: &str) -> bool {
    why.contains("TOPIC_CLOSED")
        || why.contains("TOPIC_DELETED")
        || why.contains("message thread not found")
}

/// The outcome of one failed attempt, classified.
enum Failure {
    /// Wait, then try again (429).
    RetryAfter(Duration),
    /// Try again after a backoff.
    Transient(String),
    /// The request may have reached Telegram; repeating it could duplicate.
    Ambiguous(String),
    /// Telegram refused the entities; try again as plain text.
    Entities(String),
    /// Nothing changed (an edit to the same text): counts as success.
    NotModified,
    /// Refused for good.
    Permanent(String),
}

/// What a failed attempt leads to.
#[derive(Debug)]
enum NextStep {
    /// Nothing changed (an edit to the same text): done, with no value.
    NotModified,
    /// Telegram asked for this wait (429; the chat is held for it): try
    /// again, not counted as an attempt.
    RetryAfter(Duration),
    /// The entities were refused: send again as plain text, not counted.
    ResendPlain(String),
    /// Try again after this backoff.
    RetryTransient(String, Duration),
    /// An idempotent request got no answer: try again shortly.
    RetryAmbiguous(String),
    /// Stop trying.
    GiveUp(DeliveryError),
}

/// The step after `failure`, the `attempts`-th counted failure of a
/// request sent as plain text or not (pure).
fn next_step(
    failure: Failure,
    plain: bool,
    attempts: u32,
    idempotence: Idempotence,
    max_attempts: u32,
) -> NextStep {
    match failure {
        Failure::NotModified => NextStep::NotModified,
        Failure::RetryAfter(wait) => NextStep::RetryAfter(wait),
        Failure::Entities(why) if !plain => NextStep::ResendPlain(why),
        Failure::Transient(why) if attempts < max_attempts => {
            NextStep::RetryTransient(why, transient_backoff(attempts))
        }
        Failure::Ambiguous(why) if idempotence == Idempotence::Safe && attempts < max_attempts => {
            NextStep::RetryAmbiguous(why)
        }
        Failure::Ambiguous(why) => NextStep::GiveUp(DeliveryError::Ambiguous(why)),
        Failure::Entities(why) | Failure::Permanent(why) => {
            NextStep::GiveUp(DeliveryError::Rejected(why))
        }
        Failure::Transient(why) => NextStep::GiveUp(DeliveryError::Unavailable(why)),
    }
}

fn classify(error: AttemptError) -> Failure {
    let error = match error {
        AttemptError::Server(status) => {
            return Failure::Transient(format!("Telegram answered HTTP {status}"))
        }
        AttemptError::NotSent(why) => return Failure::Transient(why),
        AttemptError::Unanswered(why) => return Failure::Ambiguous(why),
        AttemptError::Request(error) => error,
    };
    match error {
        RequestError::RetryAfter(seconds) => Failure::RetryAfter(seconds.duration()),
        RequestError::Api(ApiError::MessageNotModified) => Failure::NotModified,
        RequestError::Api(ApiError::CantParseEntities(e)) => Failure::Entities(e),
        RequestError::Api(e) => Failure::Permanent(e.to_string()),
        RequestError::Network(e) if e.is_connect() => Failure::Transient(e.to_string()),
        RequestError::Network(e) => Failure::Ambiguous(e.to_string()),
        RequestError::InvalidJson { source, .. } => Failure::Ambiguous(source.to_string()),
        RequestError::Io(e) => Failure::Transient(e.to_string()),
        RequestError::MigrateToChatId(chat) => {
            Failure::Permanent(format!("the group moved to chat {}", chat.0))
        }
    }
}

impl Delivery {
    /// A delivery engine for `bot` ([`BotApi::new`]: its requests direct
    /// unless the environment names a proxy).
    pub fn new(bot: Bot, config: DeliveryConfig) -> Self {
        Delivery::with_api(BotApi::new(bot), config)
    }

    /// A delivery engine whose requests go through `api`.
    pub fn with_api(api: BotApi, config: DeliveryConfig) -> Self {
        Delivery {
            inner: Arc::new(DeliveryInner {
                api,
                limiter: Mutex::new(RateLimiter::new(config.limits)),
                stats: Mutex::new(DeliveryStats::default()),
                config,
                chat_lanes: Arc::default(),
                gone_topics: Mutex::new(None),
                in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            }),
        }
    }

    /// From now on, every request refused because its forum topic is
    /// closed or deleted (`TOPIC_CLOSED`, "message thread not found")
    /// sends its `(chat, topic)` here (the last watcher set wins).
    pub fn watch_gone_topics(&self) -> tokio::sync::mpsc::UnboundedReceiver<(i64, i32)> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self
            .inner
            .gone_topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tx);
        rx
    }

    fn note_refusal(&self, target: ChatTarget, why: &str) {
        let Some(thread) = target.thread_id.filter(|_| is_gone_topic(why)) else {
            return;
        };
        let watcher = self
            .inner
            .gone_topics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = watcher.as_ref() {
            let _ = tx.send((target.chat_id, thread));
        }
    }

    /// The bot.
    pub fn bot(&self) -> &Bot {
        self.inner.api.bot()
    }

    /// The settings.
    pub fn config(&self) -> &DeliveryConfig {
        &self.inner.config
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DeliveryStats {
        *self
            .inner
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, update: impl FnOnce(&mut DeliveryStats)) {
        update(
            &mut self
                .inner
                .stats
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
    }

    async fn pace(&self, target: ChatTarget, priority: Priority) {
        let at = {
            let mut limiter = self
                .inner
                .limiter
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            limiter.reserve_with(
                target.chat_id,
                target.is_group,
                Instant::now().into_std(),
                priority,
            )
        };
        tokio::time::sleep_until(Instant::from_std(at)).await;
    }

    fn hold_chat(&self, target: ChatTarget, wait: Duration) {
        let until = Instant::now().into_std() + wait;
        self.inner
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retry_after(Some(target.chat_id), until);
    }

    /// Run one request with pacing and retries. `op(plain)` builds the
    /// request; `plain` is true after Telegram refused the entities.
    /// Returns `Ok(None)` for "not modified".
    ///
    /// Once sent, a request runs to its answer even if this call is dropped
    /// (a turn cancelled mid-request): a 429 it gets is still booked before
    /// the chat's next request may go.
    pub async fn call<T, E, F, Fut>(
        &self,
        target: ChatTarget,
        idempotence: Idempotence,
        op: F,
    ) -> Result<Option<T>, DeliveryError>
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<AttemptError> + Send + 'static,
        T: Send + 'static,
    {
        self.call_with(target, idempotence, Priority::Normal, op)
            .await
    }

    /// [`Delivery::call`] in the given lane: a [`Priority::Control`]
    /// request goes before every normal request waiting for the chat.
    pub async fn call_with<T, E, F, Fut>(
        &self,
        target: ChatTarget,
        idempotence: Idempotence,
        priority: Priority,
        op: F,
    ) -> Result<Option<T>, DeliveryError>
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<AttemptError> + Send + 'static,
        T: Send + 'static,
    {
        self.call_unless_withdrawn(target, idempotence, priority, None, op)
            .await
    }

    /// [`Delivery::call_with`] that gives up with
    /// [`DeliveryError::Withdrawn`] if `withdraw` fires while the request
    /// still waits for its turn or its pacing. Once sent, the request runs
    /// to its answer whatever happens to `withdraw`, so the caller learns
    /// what Telegram did (a preview's message id must never be lost: the
    /// message exists in the chat).
    pub async fn call_unless_withdrawn<T, E, F, Fut>(
        &self,
        target: ChatTarget,
        idempotence: Idempotence,
        priority: Priority,
        withdraw: Option<&CancellationToken>,
        op: F,
    ) -> Result<Option<T>, DeliveryError>
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<AttemptError> + Send + 'static,
        T: Send + 'static,
    {
        let nothing: Option<std::future::Ready<()>> = None;
        self.call_recorded(target, idempotence, priority, withdraw, nothing, op)
            .await
    }

    /// [`Delivery::call_unless_withdrawn`] that awaits `before_send` once,
    /// after the request has the chat's turn and its pacing and right
    /// before its first attempt is handed to the HTTP client: where a
    /// send's intent is made durable (invariant 9). A request withdrawn or
    /// cut off (the process killed) while it waits never ran it, so a
    /// restart knows that send never left; one that ran it is "may have
    /// arrived". The write costs what it cost before the wait: it only
    /// moved past it.
    pub(super) async fn call_recorded<T, E, F, Fut, B>(
        &self,
        target: ChatTarget,
        idempotence: Idempotence,
        priority: Priority,
        withdraw: Option<&CancellationToken>,
        before_send: Option<B>,
        op: F,
    ) -> Result<Option<T>, DeliveryError>
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<AttemptError> + Send + 'static,
        T: Send + 'static,
        B: Future<Output = ()>,
    {
        let mut before_send = before_send;
        let withdrawn = async {
            match withdraw {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(withdrawn);
        let mut plain = false;
        let mut attempts = 0u32;
        loop {
            let turn = self
                .turn_and_pace(target, priority, withdrawn.as_mut())
                .await?;
            if let Some(before_send) = before_send.take() {
                before_send.await;
            }
            let request = op(plain);
            let error = match self.attempt(target, turn, request).await? {
                Ok(value) => return Ok(Some(value)),
                Err(error) => error,
            };
            attempts += 1;
            let max_attempts = self.inner.config.max_attempts;
            match next_step(classify(error), plain, attempts, idempotence, max_attempts) {
                NextStep::NotModified => return Ok(None),
                NextStep::RetryAfter(wait) => {
                    self.note_retry_after(target, wait);
                    // 429s never count as attempts: the message waits, it is
                    // not dropped.
                    attempts -= 1;
                }
                NextStep::ResendPlain(why) => {
                    tracing::warn!(chat_id = target.chat_id, %why, "entities refused; resending as plain text");
                    self.note(|s| s.plain_fallbacks += 1);
                    plain = true;
                    attempts -= 1;
                }
                NextStep::RetryTransient(why, backoff) => {
                    tracing::debug!(chat_id = target.chat_id, %why, ?backoff, "transient failure; retrying");
                    tokio::time::sleep(backoff).await;
                }
                NextStep::RetryAmbiguous(why) => {
                    tracing::debug!(chat_id = target.chat_id, %why, "no answer to an idempotent request; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                NextStep::GiveUp(error) => return Err(self.give_up(target, error)),
            }
        }
    }

    /// The chat's turn, then its pacing, unless `withdrawn` fires first
    /// (then [`DeliveryError::Withdrawn`]); a control request's waits are
    /// counted.
    async fn turn_and_pace(
        &self,
        target: ChatTarget,
        priority: Priority,
        mut withdrawn: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(ChatTurn, Option<OwnedSemaphorePermit>), DeliveryError> {
        let waited = Instant::now();
        let turn = tokio::select! {
            biased;
            _ = withdrawn.as_mut() => return Err(DeliveryError::Withdrawn),
            turn = self.inner.chat_lanes.turn(target.chat_id, priority, target.party()) => turn,
        };
        let paced = Instant::now();
        tokio::select! {
            biased;
            _ = withdrawn.as_mut() => return Err(DeliveryError::Withdrawn),
            _ = self.pace(target, priority) => {}
        }
        let permit = match priority {
            Priority::Control => None,
            Priority::Normal | Priority::FirstText => tokio::select! {
                biased;
                _ = withdrawn.as_mut() => return Err(DeliveryError::Withdrawn),
                permit = Arc::clone(&self.inner.in_flight).acquire_owned() => permit.ok(),
            },
        };
        if priority == Priority::Control {
            let sent = Instant::now();
            let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            self.note(|s| {
                s.control_sends += 1;
                s.control_turn_wait_us += micros(paced - waited);
                s.control_pace_wait_us += micros(sent - paced);
            });
        }
        Ok((turn, permit))
    }

    /// One attempt of `request`, in a task of its own (it runs to its
    /// answer even if the caller goes away) holding the chat's `turn` and
    /// its in-flight permit; a 429 holds the chat for the wait Telegram
    /// asked. A panic in it is
    /// the caller's; a runtime shutting down is `Unavailable`.
    async fn attempt<T, E, Fut>(
        &self,
        target: ChatTarget,
        turn: (ChatTurn, Option<OwnedSemaphorePermit>),
        request: Fut,
    ) -> Result<Result<T, AttemptError>, DeliveryError>
    where
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Into<AttemptError> + Send + 'static,
        T: Send + 'static,
    {
        let delivery = self.clone();
        let attempt = tokio::spawn(async move {
            let result = request.await.map_err(Into::into);
            if let Err(AttemptError::Request(RequestError::RetryAfter(seconds))) = &result {
                delivery.hold_chat(target, seconds.duration());
            }
            drop(turn);
            result
        });
        match attempt.await {
            Ok(result) => Ok(result),
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => Err(DeliveryError::Unavailable(
                "the runtime is shutting down".into(),
            )),
        }
    }

    /// Counts a 429's wait; a wait beyond `max_retry_wait` is logged.
    fn note_retry_after(&self, target: ChatTarget, wait: Duration) {
        self.note(|s| {
            s.retry_after_hits += 1;
            s.retry_after_wait_ms += wait.as_millis() as u64;
        });
        if wait > self.inner.config.max_retry_wait {
            tracing::warn!(
                chat_id = target.chat_id,
                wait_secs = wait.as_secs(),
                "Telegram asked for a long pause; the message will be sent after it"
            );
        }
    }

    /// Counts a request given up; a refusal that says the topic is gone is
    /// reported to the topic watcher.
    fn give_up(&self, target: ChatTarget, error: DeliveryError) -> DeliveryError {
        self.note(|s| s.failures += 1);
        if let DeliveryError::Rejected(why) = &error {
            self.note_refusal(target, why);
        }
        error
    }

    /// Send one chunk as a new message in the given lane. Returns its
    /// message id.
    pub async fn send_chunk_with(
        &self,
        target: ChatTarget,
        chunk: &FormattedText,
        reply_to: Option<i64>,
        priority: Priority,
    ) -> Result<i32, DeliveryError> {
        self.send_chunk_unless_withdrawn(target, chunk, reply_to, priority, None, None)
            .await
    }

    /// [`Delivery::send_chunk_with`], carrying `markup` (buttons) when
    /// given, and given up if `withdraw` fires before the request is sent
    /// (see [`Delivery::call_unless_withdrawn`]).
    pub async fn send_chunk_unless_withdrawn(
        &self,
        target: ChatTarget,
        chunk: &FormattedText,
        reply_to: Option<i64>,
        priority: Priority,
        withdraw: Option<&CancellationToken>,
        markup: Option<&InlineKeyboardMarkup>,
    ) -> Result<i32, DeliveryError> {
        let nothing: Option<std::future::Ready<()>> = None;
        let chunk = ChunkSend {
            target,
            chunk,
            reply_to,
            priority,
        };
        self.send_chunk_recorded(chunk, withdraw, || markup, nothing)
            .await
    }

    /// Send one chunk as a new message, `before_send` (its intent) awaited
    /// after its turn and pacing, right before the request goes
    /// ([`Delivery::call_recorded`]); `markup()` is read when the request
    /// is built, after `before_send` (which may register the buttons).
    pub(super) async fn send_chunk_recorded<'m, B>(
        &self,
        send: ChunkSend<'_>,
        withdraw: Option<&CancellationToken>,
        markup: impl Fn() -> Option<&'m InlineKeyboardMarkup>,
        before_send: Option<B>,
    ) -> Result<i32, DeliveryError>
    where
        B: Future<Output = ()>,
    {
        let ChunkSend {
            target,
            chunk,
            reply_to,
            priority,
        } = send;
        let entities = to_telegram(&chunk.entities);
        let op = |plain: bool| {
            let mut request = SendMessage::new(ChatId(target.chat_id), chunk.text.clone());
            if let Some(markup) = markup() {
                request = request.reply_markup(markup.clone());
            }
            if !plain && !entities.is_empty() {
                request = request.entities(entities.clone());
            }
            if let Some(thread) = target.thread_id {
                request = request.message_thread_id(ThreadId(MessageId(thread)));
            }
            // Journaled internal events carry negative ids: nothing to quote.
            if let Some(id) = reply_to
                .filter(|id| *id > 0)
                .and_then(|id| i32::try_from(id).ok())
            {
                request = request.reply_parameters(
                    ReplyParameters::new(MessageId(id)).allow_sending_without_reply(),
                );
            }
            self.inner
                .api
                .clone()
                .post(ReadAs::<_, SentMessage>::new(request))
        };
        let sent = self
            .call_recorded(
                target,
                Idempotence::Unsafe,
                priority,
                withdraw,
                before_send,
                op,
            )
            .await?;
        sent.map(|m| m.message_id)
            .ok_or_else(|| DeliveryError::Rejected("unexpected 'not modified' on send".into()))
    }

    /// Replace the text of message `id`. "Not modified" is success.
    pub async fn edit_chunk(
        &self,
        target: ChatTarget,
        id: i32,
        chunk: &FormattedText,
    ) -> Result<(), DeliveryError> {
        self.edit_chunk_unless_withdrawn(target, id, chunk, None, None)
            .await
    }

    /// [`Delivery::edit_chunk`], keeping `markup` (buttons) under the
    /// message when given (an edit without one removes a keyboard), and
    /// given up if `withdraw` fires before the request is sent (see
    /// [`Delivery::call_unless_withdrawn`]).
    pub async fn edit_chunk_unless_withdrawn(
        &self,
        target: ChatTarget,
        id: i32,
        chunk: &FormattedText,
        withdraw: Option<&CancellationToken>,
        markup: Option<&InlineKeyboardMarkup>,
    ) -> Result<(), DeliveryError> {
        let entities = to_telegram(&chunk.entities);
        self.call_unless_withdrawn(
            target,
            Idempotence::Safe,
            Priority::Normal,
            withdraw,
            |plain| {
                let mut request =
                    EditMessageText::new(ChatId(target.chat_id), MessageId(id), chunk.text.clone());
                if let Some(markup) = markup {
                    request = request.reply_markup(markup.clone());
                }
                if !plain && !entities.is_empty() {
                    request = request.entities(entities.clone());
                }
                self.inner
                    .api
                    .clone()
                    .post(ReadAs::<_, IgnoredAny>::new(request))
            },
        )
        .await
        .map(|_| ())
    }

    /// Return once Telegram answers a request again: `getMe` is asked
    /// until it gets an answer of the Bot API (a success or an API error;
    /// not a 5xx, a failed connection, a timeout or a garbled body),
    /// waiting 1 s, doubling, at most 30 s in between. For an answer whose
    /// outcome is unknown: its sender is told once Telegram is back.
    pub async fn wait_until_answering(&self) {
        let mut wait = Duration::from_secs(1);
        loop {
            match self.inner.api.clone().post(GetMe::new()).await {
                Ok(_) => return,
                Err(AttemptError::Request(
                    RequestError::Api(_)
                    | RequestError::RetryAfter(_)
                    | RequestError::MigrateToChatId(_),
                )) => return,
                Err(error) => {
                    tracing::debug!(%error, ?wait, "Telegram does not answer yet");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_PROBE_WAIT);
        }
    }

    /// Show "typing…" in the chat (best effort): sent only if the chat's
    /// turn is free and the limits have room right now, once, without
    /// retries; otherwise skipped. It never delays a message. Returns
    /// whether it was sent.
    pub async fn typing(&self, target: ChatTarget) -> bool {
        let Some(turn) = self.inner.chat_lanes.turn_now(target.chat_id) else {
            return false;
        };
        let booked = self
            .inner
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .try_reserve_now(target.chat_id, target.is_group, Instant::now().into_std());
        if !booked {
            return false;
        }
        let mut request = self
            .bot()
            .send_chat_action(ChatId(target.chat_id), ChatAction::Typing);
        if let Some(thread) = target.thread_id {
            request = teloxide::payloads::SendChatActionSetters::message_thread_id(
                request,
                ThreadId(MessageId(thread)),
            );
        }
        let request = request.send();
        let delivery = self.clone();
        // Like every request: once sent, it runs to its answer and a 429
        // is booked before the chat's next request goes.
        let attempt = tokio::spawn(async move {
            let result = request.await;
            if let Err(RequestError::RetryAfter(seconds)) = &result {
                delivery.hold_chat(target, seconds.duration());
            }
            drop(turn);
            result
        });
        match attempt.await {
            Ok(Ok(_)) => true,
            Ok(Err(error)) => {
                if let RequestError::RetryAfter(seconds) = &error {
                    let wait = seconds.duration();
                    self.note(|s| {
                        s.retry_after_hits += 1;
                        s.retry_after_wait_ms += wait.as_millis() as u64;
                    });
                }
                tracing::debug!(chat_id = target.chat_id, %error, "typing indicator failed");
                self.note_refusal(target, &error.to_string());
                false
            }
            Err(_) => false,
        }
    }

    /// Deliver a whole reply: render (Markdown for answers), split, send
    /// every chunk in order. `first_in_place` edits that message with the
    /// first chunk instead of sending it (a streamed preview).
    pub async fn deliver_reply(
        &self,
        target: ChatTarget,
        reply: &Reply,
        first_in_place: Option<i32>,
    ) -> Result<Vec<i32>, DeliveryError> {
        let chunks = render_chunks(reply);
        self.deliver_chunks_recorded(target, reply, &chunks, first_in_place, None, None)
            .await
    }

    /// Deliver `chunks` (rendered from `reply`) like
    /// [`Delivery::deliver_reply`]; when the first chunk to go out as a
    /// new message (not for an edit of the preview: edits are idempotent)
    /// has its turn and pacing, right before its request, records in
    /// `intent` that the send is under way. Once `stop` fires,
    /// no further chunk is sent (one waiting for its turn is withdrawn):
    /// the ids returned are then fewer than the chunks.
    pub(super) async fn deliver_chunks_recorded(
        &self,
        target: ChatTarget,
        reply: &Reply,
        chunks: &[FormattedText],
        first_in_place: Option<i32>,
        intent: Option<&ReplyRecord>,
        stop: Option<&CancellationToken>,
    ) -> Result<Vec<i32>, DeliveryError> {
        let mut intent = intent;
        let mut target = target;
        // A command's answer (/stop's "Stopped", /status…) jumps the line.
        let priority = match reply.kind {
            ReplyKind::Command => Priority::Control,
            _ => Priority::Normal,
        };
        let mut reply_to = reply.reply_to;
        let mut ids = Vec::with_capacity(chunks.len());
        for (index, chunk) in chunks.iter().enumerate() {
            if stop.is_some_and(CancellationToken::is_cancelled) {
                break;
            }
            let edited = match (index, first_in_place) {
                (0, Some(preview)) => match self.edit_chunk(target, preview, chunk).await {
                    Ok(()) => {
                        ids.push(preview);
                        true
                    }
                    // The preview is gone (deleted by the user, too old):
                    // the final text still arrives, as a new message.
                    Err(DeliveryError::Rejected(why)) => {
                        tracing::debug!(chat_id = target.chat_id, %why, "preview not editable; sending the final text anew");
                        false
                    }
                    Err(other) => return Err(other),
                },
                _ => false,
            };
            if !edited {
                // Durable before the request leaves, and only then (after
                // its turn and pacing): if the process dies before the
                // outcome is recorded, the restart knows this send is
                // ambiguous and does not repeat it; if it dies while the
                // send still waits, there is no intent and the answer is
                // sent after the restart.
                let before_send = intent.take().map(|record| record.intend(ids.clone()));
                let send = ChunkSend {
                    target,
                    chunk,
                    reply_to,
                    priority,
                };
                let sent = match self
                    .send_chunk_recorded(send, stop, || None, before_send)
                    .await
                {
                    Err(DeliveryError::Rejected(why))
                        if is_gone_topic(&why) && target.thread_id.is_some() =>
                    {
                        // Its topic was closed or deleted: nothing went
                        // out, so this and the rest go to the General
                        // topic, a line first saying why.
                        target = self.moved_to_general(target, priority).await;
                        self.send_chunk_with(target, chunk, None, priority).await
                    }
                    sent => sent,
                };
                match sent {
                    Ok(id) => ids.push(id),
                    Err(DeliveryError::Withdrawn) => break,
                    Err(other) => return Err(other),
                }
            }
            // Only the first chunk quotes the user's message.
            reply_to = None;
        }
        Ok(ids)
    }
}

/// Said in a forum's General topic before a reply whose topic was closed or
/// deleted (the reply follows it there).
pub const MOVED_TO_GENERAL: &str =
    "⚠️ The topic this reply was for is closed or deleted, so it follows here.";

impl Delivery {
    /// `target` in its forum's General topic, after telling the chat there
    /// that a reply for a closed or deleted topic follows
    /// ([`MOVED_TO_GENERAL`]; a failure of that line is only logged).
    async fn moved_to_general(&self, target: ChatTarget, priority: Priority) -> ChatTarget {
        let general = ChatTarget {
            thread_id: None,
            ..target
        };
        tracing::info!(
            chat_id = target.chat_id,
            thread = target.thread_id,
            "a reply's topic is closed or gone; it goes to the General topic"
        );
        let line = FormattedText::plain(MOVED_TO_GENERAL);
        if let Err(error) = self.send_chunk_with(general, &line, None, priority).await {
            tracing::info!(chat_id = target.chat_id, %error, "could not say where a reply went");
        }
        general
    }
}

/// One chunk to send as a new message: where, what, quoting which
/// message, in which lane.
#[derive(Clone, Copy)]
pub(super) struct ChunkSend<'a> {
    /// Where it goes.
    pub(super) target: ChatTarget,
    /// The text.
    pub(super) chunk: &'a FormattedText,
    /// The message it quotes.
    pub(super) reply_to: Option<i64>,
    /// Its lane.
    pub(super) priority: Priority,
}

/// Render a reply to Telegram chunks: Markdown (answers, unless sent as
/// written) or plain text as its format says; never an empty message.
pub fn render_chunks(reply: &Reply) -> Vec<FormattedText> {
    let formatted = match reply.format {
        TextFormat::Markdown => render(&reply.text),
        TextFormat::Plain => FormattedText::plain(reply.text.trim_end()),
    };
    let chunks = split(&formatted, TELEGRAM_LIMIT);
    if chunks.is_empty() {
        vec![FormattedText::plain("(empty reply)")]
    } else {
        chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_leads_to_its_step() {
        use Idempotence::{Safe, Unsafe};
        let why = || "why".to_string();
        let step = |failure, plain, attempts, idempotence| {
            next_step(failure, plain, attempts, idempotence, 3)
        };
        assert!(matches!(
            step(Failure::NotModified, false, 1, Unsafe),
            NextStep::NotModified
        ));
        assert!(matches!(
            step(Failure::RetryAfter(Duration::from_secs(9)), false, 5, Unsafe),
            NextStep::RetryAfter(wait) if wait == Duration::from_secs(9)
        ));
        assert!(matches!(
            step(Failure::Entities(why()), false, 1, Unsafe),
            NextStep::ResendPlain(_)
        ));
        assert!(matches!(
            step(Failure::Entities(why()), true, 1, Unsafe),
            NextStep::GiveUp(DeliveryError::Rejected(_))
        ));
        assert!(matches!(
            step(Failure::Transient(why()), false, 2, Unsafe),
            NextStep::RetryTransient(_, backoff) if backoff == transient_backoff(2)
        ));
        assert!(matches!(
            step(Failure::Transient(why()), false, 3, Unsafe),
            NextStep::GiveUp(DeliveryError::Unavailable(_))
        ));
        assert!(matches!(
            step(Failure::Ambiguous(why()), false, 2, Safe),
            NextStep::RetryAmbiguous(_)
        ));
        assert!(matches!(
            step(Failure::Ambiguous(why()), false, 1, Unsafe),
            NextStep::GiveUp(DeliveryError::Ambiguous(_))
        ));
        assert!(matches!(
            step(Failure::Ambiguous(why()), false, 3, Safe),
            NextStep::GiveUp(DeliveryError::Ambiguous(_))
        ));
        assert!(matches!(
            step(Failure::Permanent(why()), false, 1, Safe),
            NextStep::GiveUp(DeliveryError::Rejected(_))
        ));
    }
}
