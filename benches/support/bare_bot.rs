//! The floor under the pipeline bench's figures: a bare echo bot on the
//! same runtime, the same Bot API client (`BotApi`, hyper's pooled client)
//! and the same fake, doing the least any bot must do per update: read it
//! from `getUpdates`, pick out its chat and text, send one answer and read
//! the answer's message id. No dispatcher, no sessions, no turn, no
//! pacing.
//!
//! Its durable form adds the least a bot that never loses a message must
//! write, on a store thread of its own (SQLite in WAL mode, `synchronous =
//! normal`, as telegate's store): each batch's updates recorded (one row
//! each, no index but the key) and committed before the next `getUpdates`
//! confirms them, and each answer's message id written back to its row,
//! commits shared by whatever is queued together. telegate's store writes
//! more per turn (the message's state while it runs, the transcript, the
//! usage, the reply record, and the indexes that find them again).
//!
//! Its dispatched form ([`run_dispatched`]) is the durable one built the
//! way telegate must be: each update parsed into teloxide's `Update` and
//! handed through teloxide's `Dispatcher` (per-chat workers, a `dptree`
//! handler that hands the answer on), the least the teloxide stack itself
//! costs a bot that records what it receives. Dispatched with
//! [`Record::Telegate`], it keeps telegate's own record instead, through
//! telegate's store and the calls a plain turn makes (the update, its
//! states, the message and answer in the transcript, the send intent
//! before the answer and the reply after it): the least the mandated
//! stack and the promised record cost together, with none of telegate's
//! engine (sessions' locks, runner, live view, pacing) in between.
//!
//! So telegate's CPU per update over the durable floor's
//! (`…/cpu_over_durable_floor`) says how much of it is the work itself on
//! this machine and stack, and how much is telegate's own.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::stream::BoxStream;
use rusqlite::{params, Connection};
use serde::Deserialize;
use telegate::delivery::api::{ReadAs, SentMessage};
use telegate::delivery::bot_api::BotApi;
use telegate::store::{NewUpdate, Store as TelegateStore, TranscriptEntry};
use telegate::transport::telegram::raw;
use telegate::vocab::InboxState;
use teloxide::dispatching::{Dispatcher, UpdateFilterExt};
use teloxide::error_handlers::IgnoringErrorHandler;
use teloxide::payloads::SendMessage;
use teloxide::stop::{mk_stop_token, StopFlag, StopToken};
use teloxide::types::{ChatId, Message as TgMessage, Update as TgUpdate, UpdateKind};
use teloxide::update_listeners::{AsUpdateStream, UpdateListener};
use teloxide::Bot;
use tokio::sync::{mpsc, oneshot, Notify};

/// What the bare bot reads of an update.
#[derive(Deserialize)]
struct Update<'a> {
    #[serde(borrow)]
    message: Option<Message<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    chat: Chat,
    #[serde(borrow)]
    text: Option<&'a str>,
}

#[derive(Deserialize)]
struct Chat {
    id: i64,
}

/// A write for the durable bare bot's store thread.
enum Write {
    /// A batch of updates (id, chat, the update's text), acknowledged once
    /// committed.
    Received(Vec<(i64, i64, String)>, oneshot::Sender<()>),
    /// An update's answer went out as message `reply`.
    Answered { update_id: i64, reply: i32 },
}

/// The durable bare bot's store thread, kept until measured (a thread's
/// CPU is lost from `/proc` once it ends).
pub struct Store {
    writes: mpsc::UnboundedSender<Write>,
    thread: std::thread::JoinHandle<()>,
}

impl Store {
    /// Lets the store thread commit what is queued and end.
    pub fn finish(self) {
        drop(self.writes);
        self.thread.join().expect("store thread");
    }
}

/// Runs the bare bot until `total` answers were sent; `durable` adds the
/// store thread, handed back still running. Spawned on the caller's
/// runtime (its workers do the work).
pub async fn run(
    api_url: reqwest::Url,
    token: String,
    total: usize,
    durable: bool,
) -> Option<Store> {
    let api = BotApi::direct(Bot::new(token).set_api_url(api_url));
    let (store, store_thread) = if durable {
        let (tx, thread) = start_store();
        (Some(tx), Some(thread))
    } else {
        (None, None)
    };
    let mut answers = tokio::task::JoinSet::new();
    let mut offset = 0i32;
    let mut received = 0usize;
    while received < total {
        let mut rows = Vec::new();
        let batch = next_batch(&api, &mut offset, |id, text| {
            let message = serde_json::from_str::<Update>(text).ok()?.message?;
            if store.is_some() {
                rows.push((id, message.chat.id, text.to_owned()));
            }
            let answer = format!("ok {}", message.text.unwrap_or_default());
            Some((id, message.chat.id, answer))
        })
        .await;
        received += batch.len();
        if let Some(store) = &store {
            let (ack, recorded) = oneshot::channel();
            store
                .send(Write::Received(rows, ack))
                .expect("store thread");
            recorded.await.expect("recorded");
        }
        for (update_id, chat, answer) in batch {
            let api = api.clone();
            let store = store.clone();
            answers.spawn(async move {
                let request = ReadAs::<_, SentMessage>::new(SendMessage::new(ChatId(chat), answer));
                let reply = api.post(request).await.expect("sendMessage");
                if let Some(store) = store {
                    let _ = store.send(Write::Answered {
                        update_id,
                        reply: reply.message_id,
                    });
                }
            });
        }
        while answers.try_join_next().is_some() {}
    }
    while answers.join_next().await.is_some() {}
    Some(Store {
        writes: store?,
        thread: store_thread?,
    })
}

/// The next `getUpdates` batch after `offset` (moved past it), each
/// update with an id handed to `read` with its JSON text; what `read`
/// keeps, in order.
async fn next_batch<R>(
    api: &BotApi,
    offset: &mut i32,
    mut read: impl FnMut(i64, &str) -> Option<R>,
) -> Vec<R> {
    let updates = raw::get_updates(api, *offset, 1, &["message"])
        .await
        .unwrap_or_else(|error| panic!("getUpdates failed: {error}"));
    let mut batch = Vec::with_capacity(updates.len());
    for update in &updates {
        let Some(id) = update.head().id else { continue };
        *offset = (*offset).max(i32::try_from(id + 1).expect("update id fits"));
        batch.extend(read(id, update.text()));
    }
    batch
}

/// Starts the durable bare bot's store thread.
fn start_store() -> (mpsc::UnboundedSender<Write>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let dir = tempfile::tempdir().expect("tempdir");
    let thread = std::thread::Builder::new()
        .name("telegate-store".into())
        .spawn(move || store_thread(&dir, rx))
        .expect("store thread");
    (tx, thread)
}

/// Which record the dispatched bot keeps.
pub enum Record {
    /// The bare store thread's: one row per update, its answer's id.
    Bare,
    /// telegate's, through its store ([`Record::telegate`]).
    Telegate(TelegateStore),
}

impl Record {
    /// telegate's record in a store of its own in `dir`, opened (schema
    /// made, checks run) before the run is measured, as telegate's own
    /// store is opened before its run.
    pub async fn telegate(dir: &std::path::Path) -> Record {
        let store = TelegateStore::open_async(dir.join("telegate.db"))
            .await
            .expect("telegate's store");
        Record::Telegate(store)
    }
}

/// Where the dispatched bot records.
enum Recorder {
    Bare(mpsc::UnboundedSender<Write>),
    Telegate {
        store: TelegateStore,
        /// Each chat's session id, made at its first message.
        sessions: std::sync::Mutex<std::collections::HashMap<i64, String>>,
    },
}

impl Recorder {
    /// Records a `getUpdates` batch (update id, chat, message id, text)
    /// before it is fed on.
    async fn received(&self, rows: Vec<(i64, i64, i64, String)>) {
        match self {
            Recorder::Bare(store) => {
                let (ack, recorded) = oneshot::channel();
                let rows = rows.into_iter().map(|(id, chat, _, text)| (id, chat, text));
                store
                    .send(Write::Received(rows.collect(), ack))
                    .expect("store thread");
                recorded.await.expect("recorded");
            }
            Recorder::Telegate { store, .. } => {
                let rows = rows
                    .into_iter()
                    .map(|(update_id, chat_id, message_id, payload)| NewUpdate {
                        update_id,
                        chat_id,
                        message_id: Some(message_id),
                        payload,
                        state: InboxState::Received,
                        reason: None,
                    });
                store
                    .inbox()
                    .record_updates(rows.collect())
                    .await
                    .expect("recorded");
            }
        }
    }

    /// Answers `text` (message `message_id` of `chat`, update `update_id`)
    /// with `answer`, recording as the kind of record asks.
    async fn answer(
        &self,
        api: &BotApi,
        update_id: u32,
        chat: ChatId,
        message_id: i32,
        text: &str,
        answer: String,
    ) {
        let send = |answer: String| {
            let request = ReadAs::<_, SentMessage>::new(SendMessage::new(chat, answer));
            api.clone().post(request)
        };
        match self {
            Recorder::Bare(store) => {
                let reply = send(answer).await.expect("sendMessage");
                let _ = store.send(Write::Answered {
                    update_id: i64::from(update_id),
                    reply: reply.message_id,
                });
            }
            Recorder::Telegate { store, sessions } => {
                let (chat_id, message_id) = (chat.0, i64::from(message_id));
                let session = session_of(store, sessions, chat_id).await;
                let (inbox, transcripts, outbox) =
                    (store.inbox(), store.transcripts(), store.outbox());
                inbox.set_message_states_later(vec![(
                    chat_id,
                    message_id,
                    InboxState::Running,
                    None,
                )]);
                transcripts.append_many_charging_later(
                    &session,
                    vec![TranscriptEntry::user(text)],
                    None,
                );
                transcripts.append_many_charging_later(
                    &session,
                    vec![TranscriptEntry::assistant(answer.clone())],
                    None,
                );
                outbox
                    .record_send_intent(chat_id, message_id, Vec::new())
                    .await
                    .expect("send intent");
                let reply = send(answer).await.expect("sendMessage");
                outbox.record_reply_later(chat_id, message_id, vec![reply.message_id], true);
                inbox.set_message_states_later(vec![(
                    chat_id,
                    message_id,
                    InboxState::Answered,
                    None,
                )]);
            }
        }
    }
}

/// The session of `chat` in telegate's record, made at its first message.
async fn session_of(
    store: &TelegateStore,
    sessions: &std::sync::Mutex<std::collections::HashMap<i64, String>>,
    chat: i64,
) -> String {
    let known = sessions.lock().expect("sessions").get(&chat).cloned();
    if let Some(id) = known {
        return id;
    }
    let record = store
        .sessions()
        .get_or_create_session(
            &format!("telegram:{chat}"),
            uuid::Uuid::new_v4().to_string(),
        )
        .await
        .expect("a session");
    sessions
        .lock()
        .expect("sessions")
        .insert(chat, record.session_id.clone());
    record.session_id
}

/// What the dispatched bot's handler shares: where answers go, and how
/// many went.
struct Answering {
    api: BotApi,
    record: Recorder,
    sent: AtomicUsize,
    total: usize,
    all_sent: Notify,
}

impl Answering {
    /// Hands the answer to `message` (update `update_id`) on, as
    /// telegate's handler hands a message to its chat: the per-chat worker
    /// is free again at once.
    fn hand_on(self: Arc<Self>, update_id: u32, message: &TgMessage) {
        let (chat, message_id) = (message.chat.id, message.id.0);
        let text = message.text().unwrap_or_default().to_owned();
        tokio::spawn(async move {
            let answer = format!("ok {text}");
            self.record
                .answer(&self.api, update_id, chat, message_id, &text, answer)
                .await;
            if self.sent.fetch_add(1, Ordering::AcqRel) + 1 == self.total {
                self.all_sent.notify_one();
            }
        });
    }
}

/// The dispatched bot's update listener: the updates recorded, in the
/// order fed.
struct Fed {
    updates: mpsc::UnboundedReceiver<TgUpdate>,
    token: (StopToken, StopFlag),
}

impl<'a> AsUpdateStream<'a> for Fed {
    type StreamErr = Infallible;
    type Stream = BoxStream<'a, Result<TgUpdate, Infallible>>;

    fn as_stream(&'a mut self) -> Self::Stream {
        Box::pin(futures::stream::unfold(
            &mut self.updates,
            |updates| async move { updates.recv().await.map(|update| (Ok(update), updates)) },
        ))
    }
}

impl UpdateListener for Fed {
    type Err = Infallible;

    fn stop_token(&mut self) -> StopToken {
        self.token.0.clone()
    }
}

/// The dispatcher's distribution key: an update's chat, as telegate's.
fn chat_of(update: &TgUpdate) -> Option<ChatId> {
    match &update.kind {
        UpdateKind::Message(message) => Some(message.chat.id),
        _ => None,
    }
}

/// Runs the durable bare bot built on teloxide's dispatcher until `total`
/// answers were sent, keeping `record`; hands its store back still running.
pub async fn run_dispatched(
    api_url: reqwest::Url,
    token: String,
    total: usize,
    record: Record,
) -> Kept {
    let bot = Bot::new(token).set_api_url(api_url);
    let api = BotApi::direct(bot.clone());
    let (recorder, kept) = match record {
        Record::Bare => {
            let (store, thread) = start_store();
            (
                Recorder::Bare(store.clone()),
                Kept::Bare(Store {
                    writes: store,
                    thread,
                }),
            )
        }
        Record::Telegate(store) => (
            Recorder::Telegate {
                store: store.clone(),
                sessions: Default::default(),
            },
            Kept::Telegate(store),
        ),
    };
    let answering = Arc::new(Answering {
        api: api.clone(),
        record: recorder,
        sent: AtomicUsize::new(0),
        total,
        all_sent: Notify::new(),
    });
    let (feed, updates) = mpsc::unbounded_channel();
    let handler = TgUpdate::filter_message().endpoint(
        |update: TgUpdate, message: TgMessage, answering: Arc<Answering>| async move {
            answering.hand_on(update.id.0, &message);
            Ok::<(), Infallible>(())
        },
    );
    let mut dispatcher = Dispatcher::builder(bot, handler)
        .dependencies(teloxide::dptree::deps![answering.clone()])
        .distribution_function(chat_of)
        .build();
    let listener = Fed {
        updates,
        token: mk_stop_token(),
    };
    let dispatching = tokio::spawn(async move {
        dispatcher
            .dispatch_with_listener(listener, Arc::new(IgnoringErrorHandler))
            .await;
    });
    let all_sent = answering.all_sent.notified();
    tokio::pin!(all_sent);
    all_sent.as_mut().enable();
    let mut offset = 0i32;
    let mut received = 0usize;
    while received < total {
        let mut rows = Vec::new();
        let parsed = next_batch(&api, &mut offset, |id, text| {
            let read = serde_json::from_str::<TgUpdate>(text).ok()?;
            let UpdateKind::Message(message) = &read.kind else {
                return None;
            };
            let message_id = i64::from(message.id.0);
            rows.push((id, message.chat.id.0, message_id, text.to_owned()));
            Some(read)
        })
        .await;
        received += parsed.len();
        answering.record.received(rows).await;
        for update in parsed {
            feed.send(update).expect("the dispatcher listens");
        }
    }
    all_sent.await;
    drop(feed);
    dispatching.await.expect("the dispatcher ran");
    kept
}

/// The dispatched bot's store, kept until measured.
pub enum Kept {
    Bare(Store),
    Telegate(TelegateStore),
}

impl Kept {
    /// Lets the store commit what is queued and end.
    pub async fn finish(self) {
        match self {
            Kept::Bare(store) => store.finish(),
            Kept::Telegate(store) => store.close().await.expect("closed"),
        }
    }
}

/// The durable bare bot's store: one connection, one transaction per
/// drained queue.
fn store_thread(dir: &tempfile::TempDir, mut rx: mpsc::UnboundedReceiver<Write>) {
    let conn = Connection::open(dir.path().join("bare.db")).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "NORMAL")
        .expect("sync");
    conn.execute_batch(
        "CREATE TABLE inbox (
            update_id INTEGER PRIMARY KEY,
            chat_id   INTEGER NOT NULL,
            payload   TEXT NOT NULL,
            reply_id  INTEGER
        ) STRICT;",
    )
    .expect("schema");
    while let Some(first) = rx.blocking_recv() {
        let mut acks = Vec::new();
        let tx = conn.unchecked_transaction().expect("begin");
        let mut next = Some(first);
        while let Some(write) = next {
            match write {
                Write::Received(rows, ack) => {
                    let mut insert = tx
                        .prepare_cached(
                            "INSERT INTO inbox (update_id, chat_id, payload) VALUES (?1, ?2, ?3)",
                        )
                        .expect("prepare");
                    for (id, chat, payload) in rows {
                        insert.execute(params![id, chat, payload]).expect("insert");
                    }
                    acks.push(ack);
                }
                Write::Answered { update_id, reply } => {
                    tx.prepare_cached("UPDATE inbox SET reply_id = ?2 WHERE update_id = ?1")
                        .expect("prepare")
                        .execute(params![update_id, reply])
                        .expect("update");
                }
            }
            next = rx.try_recv().ok();
        }
        tx.commit().expect("commit");
        for ack in acks {
            let _ = ack.send(());
        }
    }
}
