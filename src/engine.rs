//! Wiring: one adapter in front of one runner, built from the configuration.
//!
//! Every transport (Telegram, webhook, console) and every test builds the
//! session engine through here, so they all run the very same code path.

use std::sync::Arc;
use std::time::Duration;

use crate::adapter::{Adapter, AdapterConfig};
use crate::agent::{Agent, EchoAgent};
use crate::config::{AgentConfig, Backend, Config};
use crate::reply::Outbound;
use crate::runner::{Runner, RunnerConfig};

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

    /// Build an engine from the configuration file's settings.
    pub fn from_config(config: &Config, outbound: Arc<dyn Outbound>) -> Engine {
        Engine::new(
            build_agent(&config.agent),
            outbound,
            config.adapter_config(),
            config.runner_config(),
        )
    }
}

/// The configured agent backend.
pub fn build_agent(config: &AgentConfig) -> Arc<dyn Agent> {
    match config.backend {
        Backend::Echo => Arc::new(EchoAgent {
            delay: Duration::from_millis(config.echo.delay_ms),
        }),
    }
}
