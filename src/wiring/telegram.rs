//! The Telegram bot from the configuration, built one way:
//! [`TelegramBot::start_bot`] = `connect` (who we are, the store, a
//! leftover webhook removed, side by side) → `wire` (access, delivery, the
//! inbox writer, media, jobs, topics, the engine, the intake and its
//! callbacks) → `serve` (gone topics, recovery, the scheduler, `/healthz`
//! and `/metrics`, the sweeps, then updates), alone or as one of a
//! fleet's bots ([`Shared`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use teloxide::requests::Requester;
use teloxide::types::Me;
use teloxide::Bot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::access::{Access, AccessSetup};
use crate::adapter::AdapterConfig;
use crate::config::{AgentBackend, BotConfig, Config, Updates};
use crate::delivery::{Delivery, TelegramOutbound};
use crate::engine::{report_lost_processes, AgentSetup, Engine, EngineParts};
use crate::media::album::AlbumAliases;
use crate::media::{MediaStage, OutboxFiles};
use crate::metrics::Metrics;
use crate::reply::Outbound;
use crate::runner::RunnerConfig;
use crate::store::Store;
use crate::transport::telegram::dispatch::Dispatching;
use crate::transport::telegram::health::{BotHealth, UpdatesHealth};
use crate::transport::telegram::inbound::InboundPolicy;
use crate::transport::telegram::inbox_writer::InboxWriter;
use crate::transport::telegram::intake::Intake;
use crate::transport::telegram::media::{IntakeMedia, ScratchMediaDir};
use crate::transport::telegram::topics::{end_gone_topics, TopicOutcomes, Topics};
use crate::transport::telegram::webhook::WebhookHub;
use crate::transport::telegram::{
    callback, collect_gauges, polling, prune_inbox_regularly, refresh_inbox_gauges, registration,
    sync_commands, webhook, StartError, TelegramBot,
};
use crate::vocab::BotId;
use crate::wiring::engine::{build_agent_setup, open_store};
use crate::wiring::tables;

/// Starting the bot the configuration describes (the bot itself knows
/// nothing of the configuration).
impl TelegramBot {
    /// The file's one bot, alone in its process (tests and benches; `telegate
    /// run` starts a [`crate::wiring::Fleet`], which does this for one bot).
    pub async fn start(
        config: &Config,
        setup: Option<AgentSetup>,
    ) -> Result<TelegramBot, StartError> {
        let [bot] = config.bots.as_slice() else {
            return Err(StartError::Config(format!(
                "TelegramBot::start runs one bot; the file has {} (a Fleet runs several)",
                config.bots.len()
            )));
        };
        TelegramBot::start_bot(config, bot, setup, &Shared::Alone).await
    }

    /// The one way a Telegram bot starts: `connect`, `wire`, `serve`, with
    /// what it shares with the other bots of its process. It answers with
    /// `setup`, or with the configured agent backend and its tools when
    /// `None` ([`build_agent_setup`]).
    pub async fn start_bot(
        file: &Config,
        bot: &BotConfig,
        setup: Option<AgentSetup>,
        shared: &Shared,
    ) -> Result<TelegramBot, StartError> {
        let config = bot.config(file);
        let setup = match setup {
            Some(setup) => setup,
            None => build_agent_setup(config).map_err(StartError::Config)?,
        };
        let connected = connect(config, bot, shared).await?;
        let wired = wire(config, connected, setup).await?;
        serve(config, wired, bot, shared).await
    }
}

/// What a bot shares with the other bots of its process.
#[derive(Clone, Debug)]
pub enum Shared {
    /// Nothing: the bot opens (and closes) its own store, and serves its
    /// own webhook and `/healthz` + `/metrics` listeners.
    Alone,
    /// One of several bots ([`crate::wiring::Fleet`]): the process's store
    /// (the bot takes its own rows), the webhook listeners (the bot adds
    /// its path), and one `/healthz` + `/metrics` listener the fleet serves.
    InFleet {
        /// The store, opened once for every bot.
        store: Store,
        /// The webhook listeners, bound once per address.
        webhooks: WebhookHub,
        /// Whether this bot takes the rows of a database from before
        /// several bots (the first configured bot does).
        first: bool,
    },
}

/// What start-up learns from outside before anything is built: the bot
/// (who we are) and the open store, its handles on this bot's rows.
struct Connected {
    bot: Bot,
    me: Me,
    store: Store,
}

/// Ask Telegram who we are, open the store and (polling) remove a webhook
/// left behind, which would make getUpdates fail with 409. The three are
/// independent and overlap; the first error in that order is the one
/// reported.
async fn connect(
    config: &Config,
    identity: &BotConfig,
    shared: &Shared,
) -> Result<Connected, StartError> {
    let telegram = &config.telegram;
    let bot = Bot::new(identity.token.expose()).set_api_url(telegram.api_url.clone());
    let leftover_webhook = async {
        match telegram.updates {
            Updates::Polling => registration::remove_leftover_webhook(&bot)
                .await
                .map(|_| ()),
            Updates::Webhook(_) => Ok(()),
        }
    };
    let store = async {
        match shared {
            Shared::Alone => open_store(&config.store).await,
            Shared::InFleet { store, .. } => Ok(store.clone()),
        }
    };
    let (me, store, leftover_webhook) =
        tokio::join!(async { bot.get_me().await }, store, leftover_webhook);
    let me = me?;
    tracing::info!(bot = %identity.name, username = %me.username(), "connected to Telegram");
    let store = store?;
    leftover_webhook?;
    let store = store.for_bot(own_id(identity, &me));
    if matches!(shared, Shared::Alone | Shared::InFleet { first: true, .. }) {
        let adopted = store.adopt_unclaimed_rows(store.bot()).await?;
        if adopted > 0 {
            tracing::info!(bot = %identity.name, adopted, "the rows kept before several bots are this bot's");
        }
    }
    // `telegate pair --bot NAME` finds the bot by this.
    store.record_bot(&identity.name, me.username()).await?;
    Ok(Connected { bot, me, store })
}

/// The id the bot's rows are kept under: `getMe`'s (which Telegram makes
/// the token's number; a Bot API that says otherwise is believed, and
/// logged).
fn own_id(identity: &BotConfig, me: &Me) -> BotId {
    let id = i64::try_from(me.id.0).map_or(identity.id, BotId);
    if id != identity.id {
        tracing::warn!(bot = %identity.name, token_id = %identity.id, get_me_id = %id, "getMe answers another id than the token's");
    }
    id
}

/// Every component of the bot, built from the configuration, waiting for
/// [`serve`] to start taking updates.
struct Wired {
    bot: Bot,
    store: Store,
    engine: Engine,
    intake: Intake,
    dispatching: Option<Dispatching>,
    services: Services,
}

/// What the engine, the intake and the running bot share.
struct Services {
    access: Access,
    /// The team's owner at start (told about the worktrees the sweep keeps).
    owner: Option<u64>,
    delivery: Delivery,
    inbox_writer: InboxWriter,
    metrics: Metrics,
    stop_intake: CancellationToken,
    files: Arc<OutboxFiles>,
    scratch_media: Option<ScratchMediaDir>,
    jobs: Option<crate::schedule::Jobs>,
    topics: Arc<Topics>,
}

/// Build every component from the configuration: the services (team
/// access, delivery, the inbox writer, media, jobs, topics), the engine
/// (prepared for this run) and the intake in front of it with its
/// callbacks and dispatcher.
async fn wire(
    config: &Config,
    connected: Connected,
    setup: AgentSetup,
) -> Result<Wired, StartError> {
    let Connected { bot, me, store } = connected;
    let (services, media) = build_services(config, &bot, &me, &store).await?;
    let engine = build_engine(config, setup, &store, &services);
    // Before recovery runs anything again: what the previous run left
    // running is killed, and this run's generations are reserved.
    engine.prepare_run().await?;
    collect_gauges(&services.metrics, &engine, &services.delivery);
    let delivery = &services.delivery;
    let intake = Intake::new(
        engine.clone(),
        delivery.clone(),
        tables::transport(&store),
        inbound_policy(config, &me, services.access.clone()),
        config.sessions.resume_interrupted,
        services.metrics.clone(),
    )
    .with_stop(services.stop_intake.clone())
    .with_topics(services.topics.clone())
    .with_media(media)
    .with_callbacks(Arc::new(callback::CallbackHandler::new(
        engine.clone(),
        delivery.clone(),
        tables::transport(&store),
        config.telegram.approvers.clone(),
    )));
    let dispatching = intake.dispatching().await;
    Ok(Wired {
        bot,
        store,
        engine,
        intake,
        dispatching,
        services,
    })
}

/// The services, in the order they were always built (the command menu's
/// sync started among them), and the media step the intake takes.
async fn build_services(
    config: &Config,
    bot: &Bot,
    me: &Me,
    store: &Store,
) -> Result<(Services, IntakeMedia), StartError> {
    let access = build_access(config, store, &format!("@{}", me.username())).await?;
    let owner = access.owner();
    let delivery = Delivery::new(bot.clone(), config.delivery_config());
    let (inbox_writer, _writer) = InboxWriter::spawn(store.inbox());
    let metrics = Metrics::new();
    let stop_intake = CancellationToken::new();
    spawn_command_menu(bot, stop_intake.clone());
    let (media, files, scratch_media) = build_media(
        config,
        bot,
        store,
        &delivery,
        inbox_writer.album_aliases(),
        stop_intake.clone(),
    )
    .map_err(StartError::Config)?;
    let jobs = build_jobs(config, store, &metrics, Arc::new(access.clone()))?;
    let topics = Topics::new(
        store.bot(),
        config.adapter_config().key_policy,
        config.telegram.topic_caps(),
        delivery.clone(),
        Arc::new(TelegramOutbound::new(
            delivery.clone(),
            Some(tables::delivery(store)),
        )),
        store.topic_creations(),
    );
    let services = Services {
        access,
        owner,
        delivery,
        inbox_writer,
        metrics,
        stop_intake,
        files,
        scratch_media,
        jobs,
        topics,
    };
    Ok((services, media))
}

/// The session engine: `setup` answering through [`answers_outbound`],
/// every message's outcome to the inbox writer (and the topics, renamed
/// after a first answer), counted in the bot's metrics, with the bot's
/// files, jobs and team.
fn build_engine(config: &Config, setup: AgentSetup, store: &Store, services: &Services) -> Engine {
    let outcomes = TopicOutcomes {
        inner: Arc::new(services.inbox_writer.clone()),
        topics: services.topics.clone(),
    };
    Engine::new(EngineParts {
        setup,
        outbound: answers_outbound(config, &services.delivery, store),
        store: Some(tables::runner(store)),
        outcomes: Some(Arc::new(outcomes)),
        adapter: AdapterConfig {
            metrics: services.metrics.clone(),
            ..config.adapter_config()
        },
        runner: RunnerConfig {
            metrics: services.metrics.clone(),
            files: Some(services.files.clone()),
            jobs: services.jobs.clone(),
            access: Some(services.access.clone()),
            ..config.runner_config()
        },
    })
}

/// The outbound the engine answers through: delivery with the outbox
/// record, reactions and streaming as configured.
fn answers_outbound(config: &Config, delivery: &Delivery, store: &Store) -> Arc<dyn Outbound> {
    Arc::new(
        TelegramOutbound::new(delivery.clone(), Some(tables::delivery(store)))
            .with_reactions(config.delivery.reactions)
            .with_streaming(config.delivery.streaming),
    )
}

/// Who may use the bot: the config's allowlist and the team in the store.
/// Nobody yet: a pairing code is shown (stderr and the log), naming the
/// bot (`bot`).
async fn build_access(config: &Config, store: &Store, bot: &str) -> Result<Access, StartError> {
    let telegram = &config.telegram;
    let access = Access::new(
        AccessSetup {
            settings: config.access.clone(),
            allowed_users: telegram.allowed_users.clone(),
            approvers: telegram.approvers.clone(),
            allowed_chats: telegram.allowed_chats.clone(),
            allow_all_users: telegram.allow_all_users,
            clock: config.clock.clone(),
        },
        Some(store.users()),
    );
    access.load().await?;
    if let Err(error) = crate::access::pairing::announce_at_start(&access, bot).await {
        tracing::error!(%error, "could not make a pairing code; `telegate pair` makes one");
    }
    Ok(access)
}

/// The command menu is a convenience: updates need not wait for it.
fn spawn_command_menu(bot: &Bot, stop: CancellationToken) {
    let bot = bot.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = sync_commands(&bot) => {}
            () = stop.cancelled() => {}
        }
    });
}

/// Which updates the intake takes: `[telegram]`'s users and chats, the
/// mention rule, the team.
fn inbound_policy(config: &Config, me: &Me, access: Access) -> InboundPolicy {
    let telegram = &config.telegram;
    InboundPolicy {
        bot_id: me.id.0,
        bot_username: Arc::from(me.username()),
        allowed_users: telegram.allowed_users.clone(),
        allowed_chats: telegram.allowed_chats.clone(),
        allow_all_users: telegram.allow_all_users,
        require_mention: telegram.require_mention,
        access: Some(access),
    }
}

/// Run what [`wire`] built: the gone-topics watch, recovery of what the
/// last run left unfinished, then the scheduler, `/healthz` and
/// `/metrics`, the sweeps, and updates taken.
async fn serve(
    config: &Config,
    wired: Wired,
    identity: &BotConfig,
    shared: &Shared,
) -> Result<TelegramBot, StartError> {
    let Wired {
        bot,
        store,
        engine,
        intake,
        dispatching,
        services,
    } = wired;
    let Services {
        owner,
        delivery,
        inbox_writer,
        metrics,
        stop_intake,
        scratch_media,
        jobs,
        topics,
        ..
    } = services;
    end_gone_topics(topics, engine.clone(), &delivery, stop_intake.clone());
    recover(&intake, &store, &delivery).await?;
    // Runs are started only after recovery replayed the journal: a run
    // journaled before the restart is resumed by recovery, never fired
    // a second time.
    if let Some(jobs) = &jobs {
        start_scheduler(jobs.clone(), &engine, &metrics, stop_intake.clone());
    }
    let (updates_health, health) = bot_health(&store, jobs.as_ref());
    let metrics_addr = match shared {
        Shared::Alone => serve_metrics(config, &metrics, health.clone(), &stop_intake).await?,
        // The fleet serves every bot's on one listener.
        Shared::InFleet { .. } => None,
    };
    start_upkeep(
        config,
        &engine,
        &store,
        &delivery,
        &metrics,
        owner,
        &stop_intake,
    );
    let token_rejected = CancellationToken::new();
    let updates = TakeUpdates {
        bot: &bot,
        intake,
        health: updates_health,
        stop: &stop_intake,
        token_rejected: &token_rejected,
        shared,
    };
    let (intake_task, webhook_addr) = take_updates(config, updates).await?;
    Ok(TelegramBot {
        name: identity.name.clone(),
        id: store.bot(),
        health,
        owns_store: matches!(shared, Shared::Alone),
        engine,
        delivery,
        store,
        webhook_addr,
        metrics,
        metrics_addr,
        inbox_writer,
        stop_intake,
        intake_task,
        dispatching,
        shutdown_grace: Duration::from_secs(config.sessions.shutdown_grace_secs),
        token_rejected,
        _scratch_media: scratch_media,
    })
}

/// What `/healthz` reports for the bot, and the update source's part of
/// it (set by polling).
fn bot_health(
    store: &Store,
    jobs: Option<&crate::schedule::Jobs>,
) -> (UpdatesHealth, Arc<BotHealth>) {
    let updates = UpdatesHealth::default();
    let health = Arc::new(BotHealth {
        updates: updates.clone(),
        store: store.health(),
        scheduler: jobs.map(crate::schedule::Jobs::health),
    });
    (updates, health)
}

/// The bot's regular upkeep until `stop`: the inbox gauges, the
/// worktree sweep (its owner told of kept work) and inbox pruning.
fn start_upkeep(
    config: &Config,
    engine: &Engine,
    store: &Store,
    delivery: &Delivery,
    metrics: &Metrics,
    owner: Option<u64>,
    stop: &CancellationToken,
) {
    refresh_inbox_gauges(metrics.clone(), store.inbox(), stop.clone());
    if let Some(worktrees) = engine.runner.worktrees() {
        crate::transport::telegram::sweep_worktrees_regularly(
            worktrees,
            store.sessions(),
            delivery.clone(),
            owner.and_then(|o| i64::try_from(o).ok()),
            stop.clone(),
        );
    }
    prune_inbox_regularly(
        store.inbox(),
        config.store.inbox_retention_days,
        stop.clone(),
    );
}

/// Resume the messages the last run left unfinished, and tell the owners
/// of background processes lost in the restart.
async fn recover(intake: &Intake, store: &Store, delivery: &Delivery) -> Result<(), StartError> {
    let resumed = intake.recover().await?;
    let outbound = TelegramOutbound::new(delivery.clone(), None);
    let lost = report_lost_processes(&store.processes(), &outbound).await;
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
    Ok(())
}

/// The `/healthz` and `/metrics` listener, when `[metrics]` asks for one:
/// where it listens.
async fn serve_metrics(
    config: &Config,
    metrics: &Metrics,
    health: Arc<BotHealth>,
    stop: &CancellationToken,
) -> Result<Option<SocketAddr>, StartError> {
    let Some(listen) = config.metrics.listen else {
        return Ok(None);
    };
    let server = crate::http::HealthServer::new(metrics.clone(), health);
    let limits = config.metrics.limits();
    let (bound, _task) = crate::http::serve(listen, limits, server, stop.clone())
        .await
        .map_err(|e| StartError::Webhook(format!("metrics listener: {e}")))?;
    tracing::info!(%bound, "serving /healthz and /metrics");
    Ok(Some(bound))
}

/// What taking updates needs, either way.
struct TakeUpdates<'a> {
    bot: &'a Bot,
    intake: Intake,
    health: UpdatesHealth,
    stop: &'a CancellationToken,
    token_rejected: &'a CancellationToken,
    /// A fleet's bot takes a path on the fleet's webhook listeners; one
    /// alone, a listener of its own.
    shared: &'a Shared,
}

/// Take updates by polling or through the webhook (registered with
/// Telegram): the intake's task, and where the webhook listens.
async fn take_updates(
    config: &Config,
    updates: TakeUpdates<'_>,
) -> Result<(JoinHandle<()>, Option<SocketAddr>), StartError> {
    let TakeUpdates {
        bot,
        intake,
        health,
        stop,
        token_rejected,
        shared,
    } = updates;
    // One list for both ways of receiving updates (and for "the webhook is
    // already registered").
    let allowed_updates = registration::handled_updates(config.delivery.streaming);
    match &config.telegram.updates {
        Updates::Polling => {
            // A leftover webhook was removed by `connect`, keeping its
            // pending updates.
            let task = tokio::spawn(polling::poll(
                bot.clone(),
                allowed_updates,
                intake,
                health,
                stop.clone(),
                token_rejected.clone(),
            ));
            Ok((task, None))
        }
        Updates::Webhook(webhook) => {
            let at = webhook::WebhookListen {
                listen: webhook.listen,
                path: &webhook.path,
                limits: webhook.limits,
            };
            let (bound, task) = match shared {
                Shared::Alone => webhook::serve(at, webhook.secret.clone(), intake, stop.clone())
                    .await
                    .map_err(|e| StartError::Webhook(e.to_string()))?,
                Shared::InFleet { webhooks: hub, .. } => hub
                    .route(at, webhook.secret.clone(), intake, stop.clone())
                    .map_err(StartError::Webhook)?,
            };
            let wanted = registration::WantedWebhook {
                url: &webhook.public_url,
                secret: &webhook.secret,
                max_connections: webhook.max_connections,
                allowed_updates: &allowed_updates,
                state_dir: (!config.store.in_memory).then_some(config.store.data_dir.as_path()),
            };
            if let Err(error) = registration::ensure_webhook(bot, &wanted).await {
                stop.cancel();
                let _ = task.await;
                return Err(error.into());
            }
            Ok((task, Some(bound)))
        }
    }
}

/// The jobs service from `[schedule]` (`None` when it is off).
fn build_jobs(
    config: &Config,
    store: &Store,
    metrics: &Metrics,
    deciders: Arc<dyn crate::tools::authority::Deciders + Send + Sync>,
) -> Result<Option<crate::schedule::Jobs>, StartError> {
    if !config.schedule.enabled {
        return Ok(None);
    }
    let jobs = crate::schedule::Jobs::new(
        store.jobs(),
        config.schedule.clone(),
        Arc::new(crate::schedule::SystemClock),
        metrics.clone(),
    )
    .map_err(StartError::Config)?
    .with_deciders(deciders);
    Ok(Some(if config.store.in_memory {
        jobs
    } else {
        jobs.with_requests_dir(config.store.data_dir.join("schedule").join("requests"))
    }))
}

/// Start the scheduler, handing its runs to the engine's adapter; and
/// mirror how far behind it is into `/metrics`.
fn start_scheduler(
    jobs: crate::schedule::Jobs,
    engine: &Engine,
    metrics: &Metrics,
    stop: CancellationToken,
) {
    let adapter = engine.adapter.downgrade();
    let sink: crate::schedule::RunSink = Arc::new(move |event| {
        let adapter = adapter.clone();
        Box::pin(async move {
            match adapter.upgrade() {
                Some(adapter) => adapter.handle_message(event).await,
                // Journaled already: the next start runs it.
                None => tracing::info!("scheduled run left for the next start: the engine is gone"),
            }
        })
    });
    let health = jobs.health();
    metrics.add_collector(move |registry| {
        let behind = health.behind_ms(crate::store::now_ms());
        registry
            .schedule_behind_seconds
            .set(u64::try_from(behind / 1000).unwrap_or(0));
    });
    crate::schedule::spawn(jobs, sink, stop);
}

/// The media step and the file output of a Telegram bot, from the config.
/// Saved files go to `<data_dir>/media`; with an in-memory store, to a
/// [`ScratchMediaDir`] returned for the bot to keep.
fn build_media(
    config: &Config,
    bot: &Bot,
    store: &Store,
    delivery: &Delivery,
    aliases: AlbumAliases,
    stop: CancellationToken,
) -> Result<(IntakeMedia, Arc<OutboxFiles>, Option<ScratchMediaDir>), String> {
    use crate::media::prepare::ImageMode;
    let images = match &config.agent.backend {
        AgentBackend::Openai(openai) if openai.vision => ImageMode::Vision,
        AgentBackend::Openai(_) => ImageMode::Refuse,
        _ => ImageMode::Path,
    };
    let scratch = if config.store.in_memory {
        Some(
            ScratchMediaDir::create()
                .map_err(|error| format!("could not create a media directory: {error}"))?,
        )
    } else {
        None
    };
    let root = match &scratch {
        Some(scratch) => scratch.path().to_path_buf(),
        None => crate::media::media_root(&config.store.data_dir),
    };
    let time = crate::media::download::DownloadTime::capped(Duration::from_secs(
        config.media.download_timeout_secs,
    ));
    let downloader = crate::media::download::Downloader::new(
        bot.clone(),
        &bot.api_url(),
        bot.token(),
        config.telegram.local_bot_api,
        time,
    )?;
    let stage = MediaStage::new(config.media.clone(), root.clone(), downloader, images)?
        .with_file_access(config.file_access());
    crate::media::retention::spawn_retention(root.clone(), config.media.keep_days, stop.clone());
    let sender = Arc::new(crate::delivery::files::TelegramFileSender::new(
        delivery.clone(),
    ));
    let files = Arc::new(
        OutboxFiles::new(sender, Some(store.file_sends()), root)
            .with_max_files(config.media.max_files_per_answer),
    );
    let media = IntakeMedia {
        stage,
        aliases,
        stop,
        delivery: delivery.clone(),
        store: tables::transport(store),
        files: files.clone(),
    };
    Ok((media, files, scratch))
}
