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
//! So telegate's CPU per update over the durable floor's
//! (`…/cpu_over_durable_floor`) says how much of it is the work itself on
//! this machine and stack, and how much is telegate's own.

use rusqlite::{params, Connection};
use serde::Deserialize;
use telegate::delivery::api::{ReadAs, SentMessage};
use telegate::delivery::bot_api::BotApi;
use telegate::transport::telegram::raw;
use teloxide::payloads::SendMessage;
use teloxide::types::ChatId;
use teloxide::Bot;
use tokio::sync::{mpsc, oneshot};

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
        let (tx, rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().expect("tempdir");
        let thread = std::thread::Builder::new()
            .name("telegate-store".into())
            .spawn(move || store_thread(&dir, rx))
            .expect("store thread");
        (Some(tx), Some(thread))
    } else {
        (None, None)
    };
    let mut answers = tokio::task::JoinSet::new();
    let mut offset = 0i32;
    let mut received = 0usize;
    while received < total {
        let updates = match raw::get_updates(&api, offset, 1, &["message"]).await {
            Ok(updates) => updates,
            Err(error) => panic!("getUpdates failed: {error}"),
        };
        let mut batch = Vec::with_capacity(updates.len());
        let mut rows = Vec::with_capacity(updates.len());
        for update in &updates {
            let Some(id) = update.head().id else { continue };
            offset = offset.max(i32::try_from(id + 1).expect("update id fits"));
            let Ok(read) = serde_json::from_str::<Update>(update.text()) else {
                continue;
            };
            let Some(message) = read.message else {
                continue;
            };
            let text = message.text.unwrap_or_default();
            batch.push((id, message.chat.id, format!("ok {text}")));
            if store.is_some() {
                rows.push((id, message.chat.id, update.text().to_owned()));
            }
        }
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
