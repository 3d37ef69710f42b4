//! teloxide's `Dispatcher` over the inbox listener: the dptree handler
//! tree that routes recorded updates into the adapter.
//!
//! The dispatcher takes updates from [`InboxListener`] (recorded already,
//! redeliveries dropped) and runs one chat's handlers one at a time, in
//! arrival order, and different chats concurrently: its distribution
//! function keys a message by its chat. A button press has no key, so it
//! runs at once, never behind its chat's messages (nor a download). The
//! tree:
//!
//! * not while the intake stops: what is left stays unfinished in the
//!   inbox for the next start;
//! * a button press ([`CallbackHandler::handle`]: checked against the
//!   stored button, carried out through its command, answered);
//! * a message, by the verdict the intake recorded it with: accepted, to
//!   the chat's preparation stage ([`ChatStages`]) with media on, else to
//!   the adapter; a stranger told their id; an access code redeemed.
//!
//! Each handler returns once the adapter has routed the event: the adapter
//! spawns the turn, so a running turn never holds up its chat's next
//! update (`/stop` reaches the adapter while the turn it stops runs), and
//! a preparation runs in a task of its own. A handler that panics is
//! caught here: teloxide's chat worker would die with it, and the
//! dispatcher with the next update for that chat.
//!
//! Telegram's draft stop (`stopped_message_generation`) is the one update
//! that does not come this way: teloxide-core has no `UpdateKind` for it,
//! so it could only arrive as `UpdateKind::Error`, which the dispatcher
//! drops before any handler (`Dispatcher::process_update`). The intake
//! records and carries it out itself, off every chat's queue, as it does
//! for a press.
//!
//! This module owns the handler tree and the dispatcher's life. It must
//! never record an update, decide a session's fate, or await a turn.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use teloxide::dispatching::{Dispatcher, ShutdownToken, UpdateHandler};
use teloxide::dptree;
use teloxide::error_handlers::LoggingErrorHandler;
use teloxide::types::{CallbackQuery, ChatId, Update, UpdateId, UpdateKind};
use teloxide::Bot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::callback::CallbackHandler;
use super::chat_stages::ChatStages;
use super::inbound::{Inbound, InboundPolicy};
use super::inbox_listener::{InboxListener, Progress, Verdicts};
use super::strangers::Strangers;
use super::topics::Topics;
use crate::engine::Engine;
use crate::vocab::MessageEvent;

/// How many updates may wait for one chat's handler. teloxide's default
/// (64) would make the dispatcher itself wait once one chat has that many
/// queued, and with it every other chat; this is as good as unbounded (the
/// queue takes no memory until used).
const CHAT_QUEUE: usize = 1 << 20;

/// What the handlers need: the dispatcher's one dependency.
pub struct Routes {
    /// Where accepted messages go.
    pub engine: Engine,
    /// Who may use the bot (the team redeems codes).
    pub policy: Arc<InboundPolicy>,
    /// Answers strangers.
    pub strangers: Arc<Strangers>,
    /// Carries out button presses (none: presses are recorded as not
    /// handled and never fed).
    pub callbacks: Option<Arc<CallbackHandler>>,
    /// Forum topics as conversations (`[telegram] topics`): messages are
    /// placed in their topic first, closed topics end their sessions.
    pub topics: Option<Arc<Topics>>,
    /// Work a handler starts but must not wait for (a closed topic's
    /// sessions ending), awaited at shutdown with the stages'.
    pub tasks: TaskTracker,
    /// The chats' preparation stages, with media on.
    pub stages: Option<Arc<ChatStages>>,
    /// The verdicts recorded with the messages.
    pub verdicts: Arc<Verdicts>,
    /// Counts each update the tree is done with.
    pub progress: Arc<Progress>,
    /// The intake stops: nothing more is handed on.
    pub stop: CancellationToken,
}

impl Routes {
    /// Run one handler's work: a panic is logged (and the update finished
    /// as far as the dispatcher is concerned), the update counted.
    async fn settle(&self, work: impl std::future::Future<Output = ()>) -> Result<(), Infallible> {
        if AssertUnwindSafe(work).catch_unwind().await.is_err() {
            tracing::error!("handling an update panicked");
        }
        self.progress.finished_one();
        Ok(())
    }
}

/// The handler tree (see the module documentation): one endpoint that
/// routes by what the update is and the verdict it was recorded with.
///
/// One endpoint, not a branch per kind: dptree hands each handler its own
/// clone of what it asks for, so a branch per kind cloned the update twice
/// (teloxide's callback filter, the verdict's lookup) and the accepted
/// event twice more, about a tenth of the runtime's allocations per
/// update; here the update is cloned once and taken apart by value.
pub fn tree() -> UpdateHandler<Infallible> {
    dptree::entry()
        .filter(|routes: Arc<Routes>| !routes.stop.is_cancelled())
        .endpoint(route)
}

/// Carry out `update`: a press, or a message by its verdict; anything
/// else is passed over (and counted, as the dispatcher's default handler
/// counts what no handler takes).
async fn route(update: Update, routes: Arc<Routes>) -> Result<(), Infallible> {
    let id = update.id;
    if let UpdateKind::CallbackQuery(query) = update.kind {
        return press(id, query, &routes).await;
    }
    match routes.verdicts.take(id) {
        Some(Inbound::Accept(event)) => accept(event, &routes).await,
        Some(Inbound::Stranger { chat_id, user_id }) => stranger(chat_id, user_id, &routes).await,
        Some(Inbound::Redeem {
            chat_id,
            user_id,
            name,
            code,
        }) => redeem(chat_id, user_id, name, code, &routes).await,
        Some(Inbound::TopicClosed { chat_id, thread_id }) => {
            topic_closed(chat_id, thread_id, &routes).await
        }
        Some(Inbound::Ignore(_)) | None => {
            passed_over(id, &routes.progress);
            Ok(())
        }
    }
}

/// An update no handler carries out (or none runs for: the intake
/// stopping) still counts as finished, so recovery's wait ends.
fn passed_over(id: UpdateId, progress: &Progress) {
    tracing::debug!(update_id = id.0, "update passed over");
    progress.finished_one();
}

/// A message goes to its chat's handler; a press (and anything else) to
/// none, so it is never behind a chat's messages.
fn chat_of(update: &Update) -> Option<ChatId> {
    match &update.kind {
        UpdateKind::Message(message) => Some(message.chat.id),
        _ => None,
    }
}

async fn press(id: UpdateId, query: CallbackQuery, routes: &Routes) -> Result<(), Infallible> {
    let work = async {
        if let Some(handler) = &routes.callbacks {
            handler.handle(i64::from(id.0), query).await;
        }
    };
    routes.settle(work).await
}

async fn accept(event: MessageEvent, routes: &Routes) -> Result<(), Infallible> {
    let work = async {
        // Placed in its topic first (topics `auto` may create one), in the
        // chat's order.
        let event = match &routes.topics {
            Some(topics) => topics.place(event).await,
            None => event,
        };
        match &routes.stages {
            Some(stages) => stages.take(event).await,
            None => routes.engine.adapter.handle_message(event).await,
        }
    };
    routes.settle(work).await
}

/// A closed topic ends its sessions, off the chat's queue (a /stop per busy
/// slot may wait for its reply).
async fn topic_closed(chat_id: i64, thread_id: i32, routes: &Routes) -> Result<(), Infallible> {
    let work = async {
        if let Some(topics) = routes.topics.clone() {
            let engine = routes.engine.clone();
            routes.tasks.spawn(async move {
                topics.end(&engine, chat_id, thread_id).await;
            });
        }
    };
    routes.settle(work).await
}

async fn stranger(chat_id: i64, user_id: u64, routes: &Routes) -> Result<(), Infallible> {
    let work = async { routes.strangers.refuse(chat_id, user_id) };
    routes.settle(work).await
}

async fn redeem(
    chat_id: i64,
    user_id: u64,
    name: String,
    code: String,
    routes: &Routes,
) -> Result<(), Infallible> {
    let work = async {
        if let Some(access) = &routes.policy.access {
            // In the chat's order: a code and what the same user sends
            // next are seen in the order sent. The answer goes on its own.
            routes
                .strangers
                .redeem(access, chat_id, user_id, name, &code)
                .await;
        }
    };
    routes.settle(work).await
}

/// A running dispatcher and how to stop it.
pub struct Dispatching {
    shutdown: ShutdownToken,
    task: JoinHandle<()>,
    /// The stages' pumps and preparations.
    tasks: TaskTracker,
}

/// Start teloxide's dispatcher on `listener`, with `routes` as its
/// dependency and `tasks` the stages' tracker; it runs until the
/// listener ends (`stop`, or [`Dispatching::shutdown`]).
pub fn spawn(
    bot: Bot,
    routes: Arc<Routes>,
    listener: InboxListener,
    tasks: TaskTracker,
) -> Dispatching {
    let stop = routes.stop.clone();
    let progress = routes.progress.clone();
    let mut dispatcher = Dispatcher::builder(bot, tree())
        .dependencies(dptree::deps![routes])
        .distribution_function(chat_of)
        .worker_queue_size(CHAT_QUEUE)
        .default_handler(move |update| {
            let progress = progress.clone();
            async move {
                passed_over(update.id, &progress);
            }
        })
        .build();
    let shutdown = dispatcher.shutdown_token();
    let task = tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let errors = LoggingErrorHandler::with_custom_text("the inbox listener failed");
            // teloxide asks `getMe` first; until it answers, the updates
            // fed meanwhile wait in the listener.
            match dispatcher
                .try_dispatch_with_listener(listener.again(), errors)
                .await
            {
                Ok(()) => return,
                Err(error) => {
                    failures += 1;
                    let wait = Duration::from_millis(500 * 2u64.pow(failures.min(6)))
                        .min(Duration::from_secs(30));
                    tracing::warn!(%error, ?wait, "the dispatcher could not start; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    });
    Dispatching {
        shutdown,
        task,
        tasks,
    }
}

impl Dispatching {
    /// Stop dispatching (after the intake's stop fired: no handler hands
    /// anything more on) and wait up to `grace` for the handlers under way
    /// and what the chats' stages began (a refusal's inbox row, a stopped
    /// message's report). What they did not get to stays in the inbox for
    /// the next start.
    pub async fn shutdown(self, grace: Duration) {
        // Idle (never started: `getMe` kept failing): the listener ends
        // on the intake's stop all the same.
        if let Ok(stopping) = self.shutdown.shutdown() {
            drop(stopping);
        }
        self.tasks.close();
        let tasks = self.tasks;
        let finished = async move {
            let _ = self.task.await;
            tasks.wait().await;
        };
        if tokio::time::timeout(grace, finished).await.is_err() {
            tracing::warn!("update handlers still busy after the shutdown grace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tree;
    use std::sync::Arc;
    use teloxide::dptree;
    use teloxide::types::{Me, Update};

    #[test]
    fn the_tree_asks_only_for_what_the_dispatcher_provides() {
        // `Dispatcher::build` panics on a handler asking for a type no
        // one provides; this is its check, without a bot.
        dptree::type_check(
            tree().sig(),
            &dptree::di::DependencyMap::new(),
            &[
                dptree::Type::of::<Arc<super::Routes>>(),
                dptree::Type::of::<Update>(),
                dptree::Type::of::<Me>(),
                dptree::Type::of::<teloxide::Bot>(),
            ],
        );
    }
}
