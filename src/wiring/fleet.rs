//! The bots of one process: `telegate run` starts a [`Fleet`] of the
//! file's bots (one for `[telegram]`, one per `[[bots]]` table).
//!
//! One bot runs alone, exactly as it always did ([`Shared::Alone`]: its own
//! store, webhook and `/healthz` + `/metrics` listeners). Several share
//! what Telegram does not make per bot ([`Shared::InFleet`]): the store is
//! opened once (each bot's handles on its own rows, the first bot taking
//! the rows of a database from before several bots), a webhook listener is
//! bound once per address (each bot on its own path with its own secret),
//! and one `/healthz` + `/metrics` listener shows every bot, labelled.
//! Everything Telegram limits per bot stays per bot: each polls, paces its
//! sends, keeps its command menu and recovers its own inbox.
//!
//! A bot whose token Telegram refuses stops alone: at start it is left out
//! (logged with its name), while running it is shut down; the others go
//! on, and the process ends with an error only when no bot is left.
//!
//! This module owns that sharing and the fleet's lifetime; it must never
//! make a decision that belongs to one bot.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::join_all;
use teloxide::{ApiError, RequestError};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{BotConfig, Config, Updates};
use crate::engine::AgentSetup;
use crate::http::{HealthCheck, HealthServer, NamedHealth};
use crate::listener::ListenerLimits;
use crate::store::{Store, StoreHealth};
use crate::transport::telegram::webhook::WebhookHub;
use crate::transport::telegram::{StartError, TelegramBot};
use crate::wiring::engine::open_store;
use crate::wiring::telegram::Shared;

/// The running bots of one process, and what they share.
pub struct Fleet {
    /// The bots still running, in the file's order.
    pub bots: Vec<TelegramBot>,
    /// Where the fleet's `/healthz` and `/metrics` are served (several
    /// bots; one bot serves its own: [`TelegramBot::metrics_addr`]).
    pub metrics_addr: Option<SocketAddr>,
    /// The store several bots share (`None`: one bot, which owns it).
    store: Option<Store>,
    /// Stops the shared listeners.
    stop: CancellationToken,
    /// The shared listeners' tasks.
    tasks: Vec<JoinHandle<()>>,
}

/// Why a running fleet ended on its own.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Telegram refused every bot's token.
    #[error(
        "the bot token{which} was rejected by Telegram (401 Unauthorized, {limit} times in a \
         row): it was revoked or is wrong; get the current one from @BotFather"
    )]
    TokensRejected {
        /// `""` for one bot, else ` of <name>` for the last one.
        which: String,
        /// How many refusals in a row count as rejected.
        limit: u32,
    },
}

impl Fleet {
    /// Start the file's bots, each answering with `setup_for(bot)` (or its
    /// configured agent when `None`). A bot whose token Telegram refuses
    /// is left out; any other failure stops the ones started and is the
    /// error.
    pub async fn start(
        config: &Config,
        mut setup_for: impl FnMut(&BotConfig) -> Option<AgentSetup>,
    ) -> Result<Fleet, StartError> {
        match config.bots.as_slice() {
            [] => Err(StartError::Config("the configuration has no bot".into())),
            [bot] => {
                let bot =
                    TelegramBot::start_bot(config, bot, setup_for(bot), &Shared::Alone).await?;
                Ok(Fleet {
                    metrics_addr: bot.metrics_addr,
                    bots: vec![bot],
                    store: None,
                    stop: CancellationToken::new(),
                    tasks: Vec::new(),
                })
            }
            several => Fleet::start_several(config, several, &mut setup_for).await,
        }
    }

    async fn start_several(
        config: &Config,
        bots: &[BotConfig],
        setup_for: &mut dyn FnMut(&BotConfig) -> Option<AgentSetup>,
    ) -> Result<Fleet, StartError> {
        let store = open_store(&config.store).await?;
        make_bot_directories(config, bots)?;
        let stop = CancellationToken::new();
        let (webhooks, tasks) = WebhookHub::bind(&webhook_addresses(config), stop.clone())
            .await
            .map_err(|error| StartError::Webhook(error.to_string()))?;
        let starts: Vec<_> = bots
            .iter()
            .enumerate()
            .map(|(index, bot)| {
                let shared = Shared::InFleet {
                    store: store.clone(),
                    webhooks: webhooks.clone(),
                    first: index == 0,
                };
                let setup = setup_for(bot);
                async move {
                    let started = TelegramBot::start_bot(config, bot, setup, &shared).await;
                    (bot.name.clone(), started)
                }
            })
            .collect();
        let mut fleet = Fleet {
            bots: Vec::new(),
            metrics_addr: None,
            store: Some(store),
            stop,
            tasks,
        };
        let mut failure = None;
        for (name, started) in join_all(starts).await {
            match started {
                Ok(bot) => fleet.bots.push(bot),
                Err(error) if token_refused(&error) => {
                    tracing::error!(bot = %name, %error, "Telegram refuses this bot's token (revoked or wrong): it is left out; the other bots run");
                }
                Err(error) => {
                    failure.get_or_insert(StartError::Bot {
                        name,
                        source: Box::new(error),
                    });
                }
            }
        }
        if failure.is_none() && fleet.bots.is_empty() {
            failure = Some(StartError::Config(
                "no bot could start: Telegram refused every token".into(),
            ));
        }
        if let Some(error) = failure {
            fleet.shutdown().await;
            return Err(error);
        }
        fleet.metrics_addr = fleet.serve_metrics(config).await?;
        Ok(fleet)
    }

    /// The fleet's `/healthz` and `/metrics`, when `[metrics]` asks.
    async fn serve_metrics(&mut self, config: &Config) -> Result<Option<SocketAddr>, StartError> {
        let Some(listen) = config.metrics.listen else {
            return Ok(None);
        };
        let metrics = self
            .bots
            .iter()
            .map(|bot| (bot.name.clone(), bot.metrics.clone()))
            .collect();
        let health = NamedHealth(
            self.bots
                .iter()
                .map(|bot| {
                    let check: Arc<dyn HealthCheck> = bot.health.clone();
                    (bot.name.clone(), check)
                })
                .collect(),
        );
        let server = HealthServer::per_bot(metrics, Arc::new(health));
        let (bound, task) =
            crate::http::serve(listen, config.metrics.limits(), server, self.stop.clone())
                .await
                .map_err(|e| StartError::Webhook(format!("metrics listener: {e}")))?;
        self.tasks.push(task);
        tracing::info!(%bound, bots = self.bots.len(), "serving /healthz and /metrics");
        Ok(Some(bound))
    }

    /// The store's health (the systemd watchdog asks it).
    pub fn store_health(&self) -> Option<StoreHealth> {
        match &self.store {
            Some(store) => Some(store.health()),
            None => self.bots.first().map(|bot| bot.store.health()),
        }
    }

    /// Serve until `stop`, shutting down each bot whose token Telegram
    /// comes to refuse; then shut the rest down. An error when no bot was
    /// left.
    pub async fn serve_until(mut self, stop: &CancellationToken) -> Result<(), FleetError> {
        let several = self.bots.len() > 1;
        loop {
            let rejected: Vec<_> = self
                .bots
                .iter()
                .map(|bot| Box::pin(bot.token_rejected.clone().cancelled_owned()))
                .collect();
            if rejected.is_empty() {
                return Ok(());
            }
            let index = tokio::select! {
                () = stop.cancelled() => break,
                ((), index, _) = futures::future::select_all(rejected) => index,
            };
            let bot = self.bots.remove(index);
            let name = bot.name.clone();
            tracing::error!(bot = %name, "Telegram refuses this bot's token (revoked or wrong): it stops; the other bots go on");
            bot.shutdown().await;
            if self.bots.is_empty() {
                self.shutdown().await;
                return Err(FleetError::TokensRejected {
                    which: if several {
                        format!(" of {name}")
                    } else {
                        String::new()
                    },
                    limit: crate::transport::telegram::polling::UNAUTHORIZED_LIMIT,
                });
            }
        }
        self.shutdown().await;
        Ok(())
    }

    /// Shut every bot down (side by side), then the shared listeners and
    /// the store.
    pub async fn shutdown(self) {
        join_all(self.bots.into_iter().map(TelegramBot::shutdown)).await;
        self.stop.cancel();
        join_all(self.tasks).await;
        if let Some(store) = self.store {
            if let Err(error) = store.close().await {
                tracing::warn!(%error, "the store did not close cleanly");
            }
        }
    }
}

/// Whether a bot could not start because Telegram refuses its token.
fn token_refused(error: &StartError) -> bool {
    matches!(
        error,
        StartError::Api(RequestError::Api(ApiError::InvalidToken))
    )
}

/// Every webhook address of the bots, with the limits of the first bot
/// on it.
fn webhook_addresses(config: &Config) -> Vec<(SocketAddr, ListenerLimits)> {
    config
        .bots
        .iter()
        .filter_map(|bot| match &bot.config(config).telegram.updates {
            Updates::Webhook(webhook) => Some((webhook.listen, webhook.limits)),
            Updates::Polling => None,
        })
        .collect()
}

/// Each bot's own directory (`<data_dir>/bots/<id>`), private.
fn make_bot_directories(config: &Config, bots: &[BotConfig]) -> Result<(), StartError> {
    if config.store.in_memory {
        return Ok(());
    }
    for bot in bots {
        let dir = &bot.config(config).store.data_dir;
        crate::private_fs::private_dir(dir).map_err(|error| {
            StartError::Config(format!(
                "bot {}: cannot create {}: {error}",
                bot.name,
                dir.display()
            ))
        })?;
    }
    Ok(())
}
