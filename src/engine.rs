//! Wiring: one adapter in front of one runner, built from the configuration.
//!
//! Every transport (Telegram, webhook, console) and every test builds the
//! session engine through here, so they all run the very same code path.

use std::sync::Arc;
use std::time::Duration;

use crate::adapter::{Adapter, AdapterConfig, EventLedger};
use crate::agent::{Agent, CommandAgent, EchoAgent, OpenAiAgent};
use crate::config::{AgentConfig, Backend, Config, StoreSettings, TOKEN_ENV, WEBHOOK_SECRET_ENV};
use crate::reply::Outbound;
use crate::runner::{Runner, RunnerConfig};
use crate::store::{Store, StoreError};
use crate::tools::NoTools;

/// The session engine: the adapter that transports feed, and the runner
/// behind it.
#[derive(Clone)]
pub struct Engine {
    /// Where transports hand their events.
    pub adapter: Adapter,
    /// The runner (exposed for diagnostics and tests).
    pub runner: Runner,
}

impl Engine {
    /// Build an engine answering with `agent` and replying through `outbound`.
    pub fn new(
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
        adapter_config: AdapterConfig,
        runner_config: RunnerConfig,
    ) -> Engine {
        let runner = Runner::new(agent, outbound.clone(), runner_config);
        let adapter = Adapter::new(Arc::new(runner.clone()), outbound, adapter_config);
        Engine { adapter, runner }
    }

    /// Build an engine that keeps sessions and transcripts in `store` and,
    /// with a ledger, reports every message's outcome to it.
    pub fn with_store(
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
        store: Store,
        ledger: Option<Arc<dyn EventLedger>>,
        adapter_config: AdapterConfig,
        runner_config: RunnerConfig,
    ) -> Engine {
        let runner = Runner::with_store(agent, outbound.clone(), store, runner_config);
        let adapter =
            Adapter::with_ledger(Arc::new(runner.clone()), outbound, adapter_config, ledger);
        Engine { adapter, runner }
    }

    /// Build an engine from the configuration: the configured store and
    /// settings, answering with `agent`.
    pub async fn open(
        config: &Config,
        agent: Arc<dyn Agent>,
        outbound: Arc<dyn Outbound>,
    ) -> Result<Engine, StoreError> {
        let store = open_store(&config.store).await?;
        Ok(Engine::with_store(
            agent,
            outbound,
            store,
            None,
            config.adapter_config(),
            config.runner_config(),
        ))
    }
}

/// Open the configured store (creating its directory on first run).
pub async fn open_store(settings: &StoreSettings) -> Result<Store, StoreError> {
    if settings.in_memory {
        Store::open_in_memory()
    } else {
        Store::open_async(settings.database_path()).await
    }
}

/// The configured agent backend. Fails only for a configuration that
/// [`Config`] validation would have refused.
pub fn build_agent(config: &AgentConfig) -> Result<Arc<dyn Agent>, String> {
    // Secrets that no child process may inherit.
    let mut secrets = vec![TOKEN_ENV.to_string(), WEBHOOK_SECRET_ENV.to_string()];
    if let Some(openai) = &config.openai {
        secrets.push(openai.api_key_env.clone());
    }
    Ok(match config.backend {
        Backend::Echo => Arc::new(EchoAgent {
            delay: Duration::from_millis(config.echo.delay_ms),
        }),
        Backend::Command => {
            let command = config
                .command
                .clone()
                .ok_or("agent.backend = \"command\" needs [agent.command]")?;
            Arc::new(CommandAgent::new(command, secrets))
        }
        Backend::Openai => {
            let openai = config
                .openai
                .clone()
                .ok_or("agent.backend = \"openai\" needs [agent.openai]")?;
            let key = openai.api_key_from_env();
            Arc::new(OpenAiAgent::new(openai, key, Arc::new(NoTools))?)
        }
    })
}
