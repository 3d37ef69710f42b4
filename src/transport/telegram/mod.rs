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

pub mod inbound;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use teloxide::dispatching::{Dispatcher, ShutdownToken, UpdateFilterExt};
use teloxide::dptree;
use teloxide::error_handlers::LoggingErrorHandler;
use teloxide::requests::Requester;
use teloxide::types::{BotCommand, Message, Update};
use teloxide::update_listeners::webhooks;
use teloxide::Bot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::inbound::{classify, Inbound, InboundPolicy};
use crate::agent::Agent;
use crate::config::{Config, UpdateMode};
use crate::delivery::{ChatTarget, Delivery, TelegramOutbound};
use crate::engine::{build_agent_setup, AgentSetup, Engine};
use crate::reply::Reply;
use crate::runner::COMMANDS;

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
    shutdown: ShutdownToken,
    task: JoinHandle<()>,
}

/// Answers strangers (once per user per interval) with their user id.
struct StrangerReplies {
    last: Mutex<HashMap<u64, Instant>>,
    interval: Duration,
}

impl StrangerReplies {
    fn due(&self, user: u64) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.len() > 10_000 {
            last.retain(|_, t| now.duration_since(*t) < self.interval);
        }
        match last.get(&user) {
            Some(t) if now.duration_since(*t) < self.interval => false,
            _ => {
                last.insert(user, now);
                true
            }
        }
    }
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
    /// Connect, register commands and start receiving updates, answering
    /// with the configured agent backend.
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
        {
            return Err(StartError::Config(
                "nobody may use the bot: set telegram.allowed_users or telegram.allow_all_users = true".into(),
            ));
        }
        let bot = Bot::new(token.expose()).set_api_url(api_url);
        let me = bot.get_me().await?;
        tracing::info!(username = %me.username(), "connected to Telegram");
        sync_commands(&bot).await;

        let delivery = Delivery::new(bot.clone(), config.delivery_config());
        let engine = Engine::open_setup(
            config,
            setup,
            Arc::new(TelegramOutbound::new(delivery.clone())),
        )
        .await
        .map_err(StartError::Store)?;
        let policy = Arc::new(InboundPolicy {
            bot_id: me.id.0,
            bot_username: Arc::from(me.username()),
            allowed_users: telegram.allowed_users.clone(),
            allowed_chats: telegram.allowed_chats.clone(),
            allow_all_users: telegram.allow_all_users,
            require_mention: telegram.require_mention,
        });
        let strangers = Arc::new(StrangerReplies {
            last: Mutex::new(HashMap::new()),
            interval: Duration::from_secs(600),
        });

        let handler = Update::filter_message().endpoint({
            let engine = engine.clone();
            let delivery = delivery.clone();
            move |message: Message| {
                let (engine, delivery, policy, strangers) = (
                    engine.clone(),
                    delivery.clone(),
                    policy.clone(),
                    strangers.clone(),
                );
                async move {
                    on_message(&engine, &delivery, &policy, &strangers, message).await;
                    Ok::<(), std::convert::Infallible>(())
                }
            }
        });
        let mut dispatcher = Dispatcher::builder(bot.clone(), handler)
            .dependencies(dptree::deps![])
            .default_handler(|update| async move {
                tracing::debug!(update_id = update.id.0, "update ignored");
            })
            .error_handler(LoggingErrorHandler::with_custom_text(
                "update handler failed",
            ))
            .build();
        let shutdown = dispatcher.shutdown_token();

        let task = match telegram.mode {
            UpdateMode::Polling => {
                // Updates that arrived while the bot was down are kept: the
                // default polling listener does not drop pending updates.
                tokio::spawn(async move { dispatcher.dispatch().await })
            }
            UpdateMode::Webhook => {
                let webhook = telegram.webhook.as_ref().ok_or_else(|| {
                    StartError::Config(
                        "telegram.mode = \"webhook\" needs [telegram.webhook]".into(),
                    )
                })?;
                let address: SocketAddr = webhook
                    .listen
                    .parse()
                    .map_err(|e| StartError::Config(format!("telegram.webhook.listen: {e}")))?;
                let url = url::Url::parse(&webhook.public_url)
                    .map_err(|e| StartError::Config(format!("telegram.webhook.public_url: {e}")))?;
                let secret = webhook.secret_token.as_ref().ok_or_else(|| {
                    StartError::Config("telegram.webhook.secret_token is required".into())
                })?;
                let options =
                    webhooks::Options::new(address, url).secret_token(secret.expose().to_string());
                let listener = webhooks::axum(bot.clone(), options)
                    .await
                    .map_err(|e| StartError::Webhook(e.to_string()))?;
                tokio::spawn(async move {
                    dispatcher
                        .dispatch_with_listener(
                            listener,
                            LoggingErrorHandler::with_custom_text("webhook listener failed"),
                        )
                        .await
                })
            }
        };
        Ok(TelegramBot {
            engine,
            delivery,
            shutdown,
            task,
        })
    }

    /// Stop receiving updates and wait for the dispatcher to finish.
    ///
    /// The dispatcher task ending is the signal waited for, not the future
    /// `ShutdownToken::shutdown` returns: that one creates its `Notified`
    /// only when first polled, so if the dispatcher stops before that (it
    /// calls `notify_waiters`), the wakeup is lost and it never completes.
    /// A shutdown asked for before the dispatcher started is repeated until
    /// it takes.
    pub async fn shutdown(self) {
        while self.shutdown.shutdown().is_err() && !self.task.is_finished() {
            tracing::debug!("dispatcher not running yet; asking again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.task.await;
    }
}

async fn on_message(
    engine: &Engine,
    delivery: &Delivery,
    policy: &InboundPolicy,
    strangers: &StrangerReplies,
    message: Message,
) {
    match classify(&message, policy) {
        Inbound::Accept(event) => engine.adapter.handle_message(event).await,
        Inbound::Stranger { chat_id, user_id } => {
            tracing::info!(user_id, "message from a user who is not allowed");
            if strangers.due(user_id) {
                let reply = Reply::notice(format!(
                    "Sorry, this bot is private. Your user id is {user_id}; \
                     ask the owner to add it to telegram.allowed_users."
                ));
                let target = ChatTarget {
                    chat_id,
                    thread_id: None,
                    is_group: false,
                };
                if let Err(error) = delivery.deliver_reply(target, &reply, None).await {
                    tracing::debug!(%error, "could not answer a stranger");
                }
            }
        }
        Inbound::Ignore(reason) => {
            tracing::debug!(chat_id = message.chat.id.0, reason, "message ignored");
        }
    }
}

/// `telegate run`: start the bot and serve until SIGINT or SIGTERM.
pub async fn run(config: &Config) -> anyhow::Result<()> {
    let bot = TelegramBot::start(config)
        .await
        .context("the bot could not start")?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    bot.shutdown().await;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
