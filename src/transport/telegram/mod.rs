//! The Telegram transport: teloxide's dispatcher (long polling or webhook)
//! feeding the adapter, and the delivery engine for replies.
//!
//! The handler classifies each message ([`inbound::classify`]), hands the
//! event to the adapter and returns: the adapter spawns the turn, so a slow
//! turn never blocks the chat's update stream and `/stop` reaches the
//! adapter while the turn it stops is still running. (teloxide runs one
//! chat's updates one at a time; a handler that awaited the turn would make
//! `/stop` wait behind it.)
//!
//! This module owns talking to teloxide. It must never make session
//! decisions (that is the adapter's job) or await an agent turn.

pub mod callback;
pub mod health;
pub mod inbound;
pub mod intake;
pub mod ledger;
pub mod media;
pub mod polling;
pub mod raw;
pub mod registration;
pub mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use teloxide::requests::Requester;
use teloxide::types::BotCommand;
use teloxide::Bot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::health::{BotHealth, UpdatesHealth};
use self::inbound::InboundPolicy;
use self::intake::Intake;
use self::ledger::StoreLedger;
use crate::adapter::AdapterConfig;
use crate::agent::Agent;
use crate::config::{Config, UpdateMode};
use crate::delivery::{Delivery, TelegramOutbound};
use crate::engine::{build_agent_setup, open_store, report_lost_processes, AgentSetup, Engine};
use crate::metrics::{InboxCounts, Metrics};
use crate::runner::RunnerConfig;
use crate::store::Store;
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
}

/// A running bot: its engine, and how to stop it.
pub struct TelegramBot {
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
    ledger: StoreLedger,
    stop_intake: CancellationToken,
    intake_task: JoinHandle<()>,
    chat_workers: TaskTracker,
    shutdown_grace: Duration,
    /// Cancelled when Telegram keeps refusing the token (polling): the bot
    /// cannot work and `run` exits with an error.
    pub token_rejected: CancellationToken,
    /// The media directory of an in-memory store, removed with the bot
    /// (dropped last in `shutdown`, after the workers that write to it).
    _scratch_media: Option<media::ScratchMediaDir>,
}

/// Register the command menu, only when it differs from what Telegram has.
async fn sync_commands(bot: &Bot) {
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
    /// Connect, register commands, resume unfinished work and start
    /// receiving updates, answering with the configured agent backend.
    pub async fn start(config: &Config) -> Result<TelegramBot, StartError> {
        let setup = build_agent_setup(config).map_err(StartError::Config)?;
        TelegramBot::start_with_setup(config, setup).await
    }

    /// Like [`TelegramBot::start`], with a given agent (tests, embedding).
    pub async fn start_with_agent(
        config: &Config,
        agent: Arc<dyn Agent>,
    ) -> Result<TelegramBot, StartError> {
        TelegramBot::start_with_setup(config, AgentSetup::without_tools(agent)).await
    }

    /// Like [`TelegramBot::start`], with a given agent and its tools.
    pub async fn start_with_setup(
        config: &Config,
        setup: AgentSetup,
    ) -> Result<TelegramBot, StartError> {
        let telegram = &config.telegram;
        let token = telegram
            .token
            .as_ref()
            .ok_or_else(|| StartError::Config("telegram.token is missing".into()))?;
        let api_url = url::Url::parse(&telegram.api_url)
            .map_err(|e| StartError::Config(format!("telegram.api_url: {e}")))?;
        if telegram.allowed_users.is_empty()
            && telegram.allowed_chats.is_empty()
            && !telegram.allow_all_users
            && !config.may_start_locked()
        {
            return Err(StartError::Config(
                "nobody may use the bot: set telegram.allowed_users or telegram.allow_all_users = true".into(),
            ));
        }
        if telegram.allowed_users.is_empty()
            && telegram.allowed_chats.is_empty()
            && !telegram.allow_all_users
        {
            tracing::warn!(
                "nobody may use the bot yet: each sender is told their user id; \
                 put the ids in {} and restart",
                crate::config::zero_config::ALLOWED_USERS_ENV
            );
        }
        let bot = Bot::new(token.expose()).set_api_url(api_url.clone());
        // Start-up does three independent things before it can take updates:
        // ask Telegram who we are, open the store, and (polling) remove a
        // webhook left behind, which would make getUpdates fail with 409.
        // They overlap; the first error in that order is the one reported.
        let leftover_webhook = async {
            match telegram.mode {
                UpdateMode::Polling => registration::remove_leftover_webhook(&bot)
                    .await
                    .map(|_| ()),
                UpdateMode::Webhook => Ok(()),
            }
        };
        let (me, store, leftover_webhook) = tokio::join!(
            async { bot.get_me().await },
            open_store(&config.store),
            leftover_webhook
        );
        let me = me?;
        tracing::info!(username = %me.username(), "connected to Telegram");
        let store = store?;
        leftover_webhook?;
        let delivery = Delivery::new(bot.clone(), config.delivery_config());
        let (ledger, _writer) = StoreLedger::spawn(store.clone());
        let metrics = Metrics::new();
        let stop_intake = CancellationToken::new();
        // The command menu is a convenience: updates need not wait for it.
        tokio::spawn({
            let bot = bot.clone();
            let stop = stop_intake.clone();
            async move {
                tokio::select! {
                    () = sync_commands(&bot) => {}
                    () = stop.cancelled() => {}
                }
            }
        });
        let (intake_media, files, scratch_media) = media::build(
            config,
            &bot,
            &api_url,
            token.expose(),
            &store,
            &delivery,
            ledger.album_aliases(),
            stop_intake.clone(),
        )
        .map_err(StartError::Config)?;
        let engine = Engine::assemble(
            setup,
            Arc::new(
                TelegramOutbound::new(delivery.clone(), Some(store.clone()))
                    .with_reactions(config.delivery.reactions)
                    .with_streaming(config.delivery.streaming),
            ),
            store.clone(),
            Some(Arc::new(ledger.clone())),
            AdapterConfig {
                metrics: metrics.clone(),
                ..config.adapter_config()
            },
            RunnerConfig {
                metrics: metrics.clone(),
                files: Some(files),
                ..config.runner_config()
            },
        );
        // Before recovery runs anything again: what the previous run left
        // running is killed, and this run's generations are reserved.
        engine.prepare_run().await?;
        collect_gauges(&metrics, &engine, &delivery);
        let policy = InboundPolicy {
            bot_id: me.id.0,
            bot_username: Arc::from(me.username()),
            allowed_users: telegram.allowed_users.clone(),
            allowed_chats: telegram.allowed_chats.clone(),
            allow_all_users: telegram.allow_all_users,
            require_mention: telegram.require_mention,
        };
        let intake = Intake::new(
            engine.clone(),
            delivery.clone(),
            store.clone(),
            policy,
            config.sessions.resume_interrupted,
            metrics.clone(),
        )
        .with_media(intake_media)
        .with_callbacks(Arc::new(callback::CallbackHandler::new(
            engine.clone(),
            delivery.clone(),
            store.clone(),
            telegram.approvers.clone(),
        )));
        let chat_workers = intake.worker_tasks();
        let resumed = intake.recover().await?;
        let outbound = TelegramOutbound::new(delivery.clone(), None);
        let lost = report_lost_processes(&store, &outbound).await;
        if lost > 0 {
            tracing::info!(
                lost,
                "told the owners of background processes lost in the restart"
            );
        }
        if resumed > 0 {
            tracing::info!(
                resumed,
                "resumed unfinished messages from before the restart"
            );
        }

        // The same token the media step was built with: a shutdown must stop
        // a download in progress too.
        let token_rejected = CancellationToken::new();
        let updates_health = UpdatesHealth::default();
        let metrics_addr = match config.metrics.listen_addr().map_err(StartError::Config)? {
            Some(listen) => {
                let health = Arc::new(BotHealth {
                    updates: updates_health.clone(),
                    store: store.clone(),
                });
                let server = crate::http::HealthServer::new(metrics.clone(), health);
                let limits = config.metrics.limits();
                let (bound, _task) =
                    crate::http::serve(listen, limits, server, stop_intake.clone())
                        .await
                        .map_err(|e| StartError::Webhook(format!("metrics listener: {e}")))?;
                tracing::info!(%bound, "serving /healthz and /metrics");
                Some(bound)
            }
            None => None,
        };
        refresh_inbox_gauges(metrics.clone(), store.clone(), stop_intake.clone());
        prune_inbox_regularly(
            store.clone(),
            config.store.inbox_retention_days,
            stop_intake.clone(),
        );
        // One list for both ways of receiving updates (and for "the
        // webhook is already registered").
        let allowed_updates = registration::handled_updates(config.delivery.streaming);
        let (intake_task, webhook_addr) = match telegram.mode {
            UpdateMode::Polling => {
                // A leftover webhook was removed above, keeping its pending
                // updates.
                let task = tokio::spawn(polling::poll(
                    bot.clone(),
                    allowed_updates,
                    intake,
                    updates_health,
                    stop_intake.clone(),
                    token_rejected.clone(),
                ));
                (task, None)
            }
            UpdateMode::Webhook => {
                let webhook = telegram.webhook.as_ref().ok_or_else(|| {
                    StartError::Config(
                        "telegram.mode = \"webhook\" needs [telegram.webhook]".into(),
                    )
                })?;
                let listen: SocketAddr = webhook
                    .listen
                    .parse()
                    .map_err(|e| StartError::Config(format!("telegram.webhook.listen: {e}")))?;
                let url = url::Url::parse(&webhook.public_url)
                    .map_err(|e| StartError::Config(format!("telegram.webhook.public_url: {e}")))?;
                let secret = webhook.secret_token.clone().ok_or_else(|| {
                    StartError::Config("telegram.webhook.secret_token is required".into())
                })?;
                let path = match url.path() {
                    "" => "/".to_string(),
                    path => path.to_string(),
                };
                let at = webhook::WebhookListen {
                    listen,
                    path: &path,
                    limits: webhook.limits(),
                };
                let (bound, task) = webhook::serve(at, secret.clone(), intake, stop_intake.clone())
                    .await
                    .map_err(|e| StartError::Webhook(e.to_string()))?;
                let wanted = registration::WantedWebhook {
                    url: &url,
                    secret: &secret,
                    max_connections: webhook.max_connections,
                    allowed_updates: &allowed_updates,
                    state_dir: (!config.store.in_memory).then_some(config.store.data_dir.as_path()),
                };
                if let Err(error) = registration::ensure_webhook(&bot, &wanted).await {
                    stop_intake.cancel();
                    let _ = task.await;
                    return Err(error.into());
                }
                (task, Some(bound))
            }
        };
        Ok(TelegramBot {
            engine,
            delivery,
            store,
            webhook_addr,
            metrics,
            metrics_addr,
            ledger,
            stop_intake,
            intake_task,
            chat_workers,
            shutdown_grace: Duration::from_secs(config.sessions.shutdown_grace_secs),
            token_rejected,
            _scratch_media: scratch_media,
        })
    }

    /// Stop taking updates, let running turns finish (up to the configured
    /// grace), cancel the rest (their messages are resumed on the next
    /// start), write every record, close the store.
    pub async fn shutdown(self) {
        self.stop_intake.cancel();
        let _ = self.intake_task.await;
        // Chat workers and their preparations finish the step they are in
        // (a download is cut short by the token; a refusal closes its inbox
        // row) before the engine and the store go away. Messages they did
        // not get to stay in the inbox for the next start.
        self.chat_workers.close();
        if tokio::time::timeout(self.shutdown_grace, self.chat_workers.wait())
            .await
            .is_err()
        {
            tracing::warn!("chat workers still busy after the shutdown grace");
        }
        let cancelled = self.engine.adapter.shutdown(self.shutdown_grace).await;
        if cancelled > 0 {
            tracing::info!(
                cancelled,
                "turns cut short by the shutdown will be resumed on the next start"
            );
        }
        self.ledger.flush().await;
        drop(self.engine);
        if let Err(error) = self.store.close().await {
            tracing::warn!(%error, "the store did not close cleanly");
        }
    }
}

/// Gauges and mirrored counters are read from their owners at each scrape.
fn collect_gauges(metrics: &Metrics, engine: &Engine, delivery: &Delivery) {
    let adapter = engine.adapter.clone();
    let delivery = delivery.clone();
    metrics.add_collector(move |registry| {
        registry.busy_sessions.set(adapter.busy_count() as u64);
        registry.queue_depth.set(adapter.pending_total() as u64);
        registry.record_delivery(&delivery.stats());
    });
}

/// The inbox gauges need the store (async), so a small task refreshes them.
fn refresh_inbox_gauges(metrics: Metrics, store: Store, stop: CancellationToken) {
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
fn prune_inbox_regularly(store: Store, days: u64, stop: CancellationToken) {
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

/// `telegate run`: start the bot and serve until SIGINT or SIGTERM.
///
/// The signal handlers are installed before anything starts and stay
/// installed: a signal that arrives while the bot starts (recovery and
/// polling may already be running) leads to the same clean shutdown once
/// the start is done, instead of the default action killing the process;
/// and a second signal is never missed, whenever it comes.
pub async fn run(config: &Config) -> anyhow::Result<()> {
    run_with(config, false).await
}

/// `telegate run [--standby]`: like [`run`]; first takes the data
/// directory's lock ([`crate::instance_lock`]): fails at once naming the
/// holder, or with `standby` waits until the holder exits.
pub async fn run_with(config: &Config, standby: bool) -> anyhow::Result<()> {
    use crate::instance_lock::{InstanceLock, LockError};
    let stop = watch_signals();
    let _lock = if config.store.in_memory {
        None
    } else if standby {
        match InstanceLock::acquire_standby(&config.store.data_dir, &stop).await {
            Ok(lock) => Some(lock),
            Err(LockError::Cancelled) => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    } else {
        Some(InstanceLock::acquire(&config.store.data_dir)?)
    };
    let bot = TelegramBot::start(config)
        .await
        .context("the bot could not start")?;
    crate::systemd::ready();
    let watchdog = crate::systemd::spawn_watchdog(bot.store.clone(), stop.clone());
    let token_rejected = bot.token_rejected.clone();
    tokio::select! {
        () = stop.cancelled() => {}
        () = token_rejected.cancelled() => {}
    }
    crate::systemd::stopping();
    if let Some(watchdog) = watchdog {
        // It ends on `stop`; after a rejected token `stop` never comes.
        watchdog.abort();
    }
    bot.shutdown().await;
    if token_rejected.is_cancelled() {
        anyhow::bail!(
            "the bot token was rejected by Telegram (401 Unauthorized, {} times in a row): \
             it was revoked or is wrong; get the current one from @BotFather",
            polling::UNAUTHORIZED_LIMIT
        );
    }
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Listen for SIGINT and SIGTERM from now on: the first cancels the
/// returned token, a second exits the process at once (code 130).
fn watch_signals() -> CancellationToken {
    let stop = CancellationToken::new();
    let mut signals = Signals::listen();
    let first = stop.clone();
    tokio::spawn(async move {
        signals.recv().await;
        tracing::info!("shutting down (send the signal again to exit at once)");
        first.cancel();
        signals.recv().await;
        // SQLite's write-ahead log keeps the database consistent; what
        // was not finished is resumed on the next start.
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130)
    });
    stop
}

/// SIGINT and SIGTERM, registered once. (A listener registered anew after
/// each signal would miss a signal arriving in between.)
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            Signals {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(listener: &mut Option<tokio::signal::unix::Signal>) {
                let received = match listener {
                    Some(listener) => listener.recv().await.is_some(),
                    None => false,
                };
                if !received {
                    std::future::pending::<()>().await;
                }
            }
            tokio::select! {
                () = next(&mut self.interrupt) => {}
                () = next(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
