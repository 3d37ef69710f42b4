//! The Telegram transport: updates in (long polling or webhook, inbox
//! first), teloxide's dispatcher feeding the adapter, button presses, and
//! the bot's start-up pieces and shutdown.
//!
//! The way in, step by step:
//!
//! * [`polling`] (raw `getUpdates`) or [`webhook`] hands each raw update to
//!   the [`intake`], which classifies it ([`inbound::classify`]), records it
//!   in the inbox and, only if its row is new, feeds it to the
//!   [`inbox_listener`]; the offset moves (or the webhook answers 200) only
//!   after that. Restart recovery feeds the unfinished rows first.
//! * teloxide's `Dispatcher` takes the recorded updates from that listener
//!   (telegate's own `UpdateListener`) and runs the [`dispatch`] handler
//!   tree: one chat's messages in order, chats concurrently, button presses
//!   at once ([`callback`]). An accepted message goes to the chat's
//!   preparation stage (`chat_stages`, media prepared in tasks of their
//!   own) or straight to the adapter.
//! * Each handler returns once the adapter routed the event: the adapter
//!   spawns the turn, so a slow turn never blocks the chat's update stream
//!   and `/stop` reaches the adapter while the turn it stops is still
//!   running. (teloxide runs one chat's handlers one at a time; a handler
//!   that awaited the turn would make `/stop` wait behind it.)
//! * Telegram's draft stop, which teloxide cannot carry, is recorded and
//!   carried out by the intake itself.
//!
//! This module owns talking to Telegram for updates. It must never make
//! session decisions (that is the adapter's job) or await an agent turn.

pub mod callback;
pub mod chat_stages;
pub mod dispatch;
pub mod health;
pub mod inbound;
pub mod inbox_listener;
pub mod inbox_writer;
pub mod intake;
pub mod media;
mod parse;
pub mod polling;
pub mod raw;
pub mod redact;
pub mod registration;
pub mod strangers;
pub mod topic_quota;
pub mod topics;
pub mod webhook;

pub use self::parse::{Head, RawUpdate};

use std::net::SocketAddr;
use std::time::Duration;

use teloxide::requests::Requester;
use teloxide::types::BotCommand;
use teloxide::Bot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::dispatch::Dispatching;
use self::inbox_writer::InboxWriter;
use crate::delivery::Delivery;
use crate::engine::Engine;
use crate::metrics::{InboxCounts, Metrics};
use crate::store::{Buttons, FileSends, Inbox, Outbox, Sessions, Store};
use crate::vocab::{InboxState, COMMANDS};

/// Why the bot could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Configuration problem found at start.
    #[error("{0}")]
    Config(String),
    /// Telegram (or the configured API URL) refused or could not be reached.
    #[error("cannot talk to the Telegram Bot API: {0}")]
    Api(#[from] teloxide::RequestError),
    /// The webhook listener could not start.
    #[error("cannot start the webhook: {0}")]
    Webhook(String),
    /// Registering (or, for polling, removing) the webhook at Telegram failed.
    #[error("{0}")]
    Registration(#[from] registration::RegistrationError),
    /// The session store could not be opened.
    #[error("cannot open the session store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// One of several bots could not start.
    #[error("bot {name}: {source}")]
    Bot {
        /// The bot's name.
        name: String,
        /// Why.
        source: Box<StartError>,
    },
}

/// A running bot: its engine, and how to stop it.
pub struct TelegramBot {
    /// Its name (logs, `/metrics`, `/healthz`).
    pub name: String,
    /// Its id (`getMe`'s): the key of its rows in the store.
    pub id: crate::vocab::BotId,
    /// What `/healthz` reports for it.
    pub health: std::sync::Arc<health::BotHealth>,
    /// Whether the store is this bot's own (closed at its shutdown) or the
    /// fleet's (closed by the fleet once every bot stopped).
    pub(crate) owns_store: bool,
    /// The session engine behind the bot.
    pub engine: Engine,
    /// The delivery engine (stats).
    pub delivery: Delivery,
    /// The store (sessions, transcripts, inbox, outbox).
    pub store: Store,
    /// Where the webhook listens, in webhook mode.
    pub webhook_addr: Option<SocketAddr>,
    /// The counters behind `/metrics`.
    pub metrics: Metrics,
    /// Where `/healthz` and `/metrics` are served, if configured.
    pub metrics_addr: Option<SocketAddr>,
    pub(crate) inbox_writer: InboxWriter,
    pub(crate) stop_intake: CancellationToken,
    pub(crate) intake_task: JoinHandle<()>,
    pub(crate) dispatching: Option<Dispatching>,
    pub(crate) shutdown_grace: Duration,
    /// Cancelled when Telegram keeps refusing the token (polling): the bot
    /// cannot work and `run` exits with an error.
    pub token_rejected: CancellationToken,
    /// The media directory of an in-memory store, removed with the bot
    /// (dropped last in `shutdown`, after the preparations that write to it).
    pub(crate) _scratch_media: Option<media::ScratchMediaDir>,
}

/// Register the command menu, only when it differs from what Telegram has.
pub(crate) async fn sync_commands(bot: &Bot) {
    let wanted: Vec<BotCommand> = COMMANDS
        .iter()
        .map(|(name, description)| BotCommand::new(*name, *description))
        .collect();
    match bot.get_my_commands().await {
        Ok(current) if current == wanted => {
            tracing::debug!("command menu already up to date");
        }
        Ok(_) | Err(_) => {
            if let Err(error) = bot.set_my_commands(wanted).await {
                tracing::warn!(%error, "could not register the command menu");
            }
        }
    }
}

impl TelegramBot {
    /// Stop taking updates (the polling loop or webhook, then the
    /// dispatcher through its `ShutdownToken`, its handlers and the chats'
    /// preparations waited for up to the grace), let running turns finish
    /// (up to the configured grace), cancel the rest (their messages are resumed on the next
    /// start), write every record, close the store.
    pub async fn shutdown(self) {
        self.stop_intake.cancel();
        let _ = self.intake_task.await;
        // The dispatcher's handlers and the chats' preparations finish the
        // step they are in (a download is cut short by the token; a refusal
        // closes its inbox row) before the engine and the store go away.
        // Messages they did not get to stay in the inbox for the next start.
        if let Some(dispatching) = self.dispatching {
            dispatching.shutdown(self.shutdown_grace).await;
        }
        let cancelled = self.engine.adapter.shutdown(self.shutdown_grace).await;
        if cancelled > 0 {
            tracing::info!(
                cancelled,
                "turns cut short by the shutdown will be resumed on the next start"
            );
        }
        self.inbox_writer.flush().await;
        self.engine.runner.shutdown_agent().await;
        drop(self.engine);
        if self.owns_store {
            if let Err(error) = self.store.close().await {
                tracing::warn!(%error, "the store did not close cleanly");
            }
        }
    }
}

/// Gauges and mirrored counters are read from their owners at each scrape.
pub(crate) fn collect_gauges(metrics: &Metrics, engine: &Engine, delivery: &Delivery) {
    let adapter = engine.adapter.clone();
    let delivery = delivery.clone();
    metrics.add_collector(move |registry| {
        registry.busy_sessions.set(adapter.busy_count() as u64);
        registry.queue_depth.set(adapter.pending_total() as u64);
        registry.record_delivery(&delivery.stats());
    });
}

/// The store tables the Telegram transport touches: the inbox (updates by
/// update id and each message's state), the outbox (for recovery), inline
/// buttons (a press), the files sent from a turn's outbox, and sessions
/// (topics and worktree sweeps). Built from the one store by the wiring.
#[derive(Clone, Debug)]
pub struct TransportTables {
    /// Updates by update id and each message's state.
    pub inbox: Inbox,
    /// Each final reply's send intent.
    pub outbox: Outbox,
    /// Inline buttons.
    pub buttons: Buttons,
    /// Files sent from a turn's outbox.
    pub file_sends: FileSends,
    /// The current session per chat key.
    pub sessions: Sessions,
}

/// The inbox gauges need the store (async), so a small task refreshes them.
pub(crate) fn refresh_inbox_gauges(metrics: Metrics, store: Inbox, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            if let Ok(counts) = store.inbox_counts().await {
                let get = |state: InboxState| {
                    counts
                        .iter()
                        .find(|(s, _)| *s == state)
                        .map_or(0, |(_, n)| *n)
                };
                metrics.set_inbox(InboxCounts {
                    received: get(InboxState::Received),
                    running: get(InboxState::Running),
                    answered: get(InboxState::Answered),
                    failed: get(InboxState::Failed),
                    dropped: get(InboxState::Dropped),
                });
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    });
}

/// Prune finished inbox rows older than `days` at start, then hourly.
pub(crate) fn prune_inbox_regularly(store: Inbox, days: u64, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            match store.prune_inbox(days).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, days, "pruned finished inbox rows"),
                Err(error) => tracing::warn!(%error, "could not prune the inbox"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    });
}

/// Sweep the conversations' worktrees at start, then hourly: those of
/// ended sessions go after `keep_days`; one kept for its unmerged work is
/// told to the bot's owner (`tell`), once.
pub(crate) fn sweep_worktrees_regularly(
    worktrees: std::sync::Arc<crate::worktree::Worktrees>,
    store: Sessions,
    delivery: Delivery,
    tell: Option<i64>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        loop {
            sweep_worktrees(&worktrees, &store, &delivery, tell).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    });
}

async fn sweep_worktrees(
    worktrees: &crate::worktree::Worktrees,
    store: &Sessions,
    delivery: &Delivery,
    tell: Option<i64>,
) {
    use crate::vocab::{SessionId, SessionKey};
    use crate::worktree::plan::worktree_name;
    let sessions = match store.list_sessions().await {
        Ok(sessions) => sessions,
        Err(error) => {
            tracing::warn!(%error, "worktree cleanup skipped: the sessions could not be read");
            return;
        }
    };
    let live: std::collections::HashSet<String> = sessions
        .iter()
        .map(|s| {
            let key = SessionKey::from_raw(&s.session_key);
            worktree_name(&key, &SessionId::new(&s.session_id))
        })
        .collect();
    let sweep = match worktrees.sweep(&|name| live.contains(name)).await {
        Ok(sweep) => sweep,
        Err(error) => {
            tracing::warn!(%error, "the worktree cleanup failed");
            return;
        }
    };
    if !sweep.removed.is_empty() {
        tracing::info!(
            removed = sweep.removed.len(),
            "removed the worktrees of ended conversations"
        );
    }
    for kept in sweep.tell {
        tracing::warn!(worktree = %kept.name, unmerged = kept.unmerged_commits, "kept a worktree with unmerged work");
        let Some(chat_id) = tell else {
            continue;
        };
        let text = format!(
            "🌳 The worktree {} of an ended conversation has {} commit(s) not merged into {}; \
             it is kept. Merge or remove it in {}.",
            kept.name,
            kept.unmerged_commits,
            worktrees.config().base,
            worktrees.config().root.display()
        );
        let target = crate::delivery::ChatTarget {
            chat_id,
            thread_id: None,
            is_group: false,
            user: None,
        };
        let notice = crate::reply::Reply::notice(text);
        if let Err(error) = delivery.deliver_reply(target, &notice, None).await {
            tracing::warn!(%error, "could not tell the owner about a kept worktree");
        }
    }
}
