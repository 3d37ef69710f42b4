//! The session engine from the configuration: the configured store, agent
//! backend and terminal tool (see `crate::engine` for how they are put
//! together).

use std::sync::Arc;
use std::time::Duration;

use crate::agent::{AcpAgent, Agent, CommandAgent, EchoAgent, OpenAiAgent};
use crate::config::{
    AgentBackend, AgentConfig, Backend, Config, StoreSettings, TOKEN_ENV, WEBHOOK_SECRET_ENV,
};
use crate::engine::{AgentSetup, ApprovalsSetup, Engine, EngineParts, TerminalSetup};
use crate::media::handle::Reader;
use crate::media::outbox::Workspace;
use crate::reply::Outbound;
use crate::schedule::WithSchedule;
use crate::store::{Store, StoreError};
use crate::tools::approval::ApprovalGate;
use crate::tools::mcp::WithMcp;
use crate::tools::permission::PermissionPrompts;
use crate::tools::runas::RunAs;
use crate::tools::send_file::WithSendFile;
use crate::tools::{tool_events, NoTools, TerminalTool, ToolRegistry};

/// The engine as the configuration describes it (the engine itself knows
/// nothing of the configuration): the configured store and settings,
/// answering with `setup`, prepared for this run (see
/// [`Engine::prepare_run`]). The console's engine; the Telegram bot builds
/// its own with the same [`Engine::new`] in `wiring::telegram`.
pub async fn open_engine(
    config: &Config,
    setup: AgentSetup,
    outbound: Arc<dyn Outbound>,
) -> Result<Engine, StoreError> {
    let store = open_store(&config.store).await?;
    let engine = Engine::new(EngineParts {
        setup,
        outbound,
        store: Some(crate::wiring::tables::runner(&store)),
        outcomes: None,
        adapter: config.adapter_config(),
        runner: config.runner_config(),
    });
    engine.prepare_run().await?;
    Ok(engine)
}

/// Open the configured store (creating its directory on first run).
pub async fn open_store(settings: &StoreSettings) -> Result<Store, StoreError> {
    if settings.in_memory {
        Store::open_in_memory()
    } else {
        Store::open_with(settings.database_path(), settings.synchronous).await
    }
}

/// Environment variables holding secrets that no child process may inherit.
fn secret_env_names(config: &AgentConfig) -> Vec<String> {
    let mut secrets = vec![TOKEN_ENV.to_string(), WEBHOOK_SECRET_ENV.to_string()];
    secrets.extend(config.secret_env_names().map(str::to_string));
    secrets
}

/// The configured agent backend with its tools: the openai backend gets the
/// terminal tool when `[tools.terminal] enabled = true`, the tools of
/// the `[[tools.mcp]]` servers and the `schedule` tool while `[schedule]
/// enabled` (the default), and no tools otherwise; the claude preset
/// with `permission_prompt = true` asks its permission prompts on the
/// approval card. Fails only for a configuration that [`Config`]
/// validation would have refused.
pub fn build_agent_setup(config: &Config) -> Result<AgentSetup, String> {
    if let AgentBackend::Acp(acp) = &config.agent.backend {
        return Ok(build_acp_setup(acp, &config.agent));
    }
    let terminal = &config.tools.terminal;
    let data_dir = (!config.store.in_memory).then_some(config.store.data_dir.as_path());
    let scheduling = config.schedule.enabled && config.agent.kind() == Backend::Openai;
    if !terminal.enabled && config.tools.mcp.is_empty() && !scheduling {
        if let Some(setup) = claude_with_permission_prompts(config, data_dir)? {
            return Ok(setup);
        }
        return Ok(AgentSetup::without_tools(build_agent_in(
            &config.agent,
            data_dir,
        )?));
    }
    let openai = match &config.agent.backend {
        AgentBackend::Openai(openai) => openai.clone(),
        _ => return Err(
            "tools.terminal.enabled = true and [[tools.mcp]] need agent.backend = \"openai\" with [agent.openai]"
                .to_string(),
        ),
    };
    let (sender, events) = tool_events();
    let tool = if terminal.enabled {
        Some(Arc::new(TerminalTool::new(
            terminal,
            secret_env_names(&config.agent),
            sender.clone(),
        )?))
    } else {
        None
    };
    // One gate for every tool: the terminal tool's, else one of its own
    // with the same timeout.
    let gate = tool.as_ref().map_or_else(
        || ApprovalGate::new(Duration::from_secs(terminal.approval_timeout_secs), sender),
        |tool| tool.approvals().clone(),
    );
    let key = openai.api_key();
    let mut tools: Arc<dyn ToolRegistry> = match &tool {
        Some(tool) => with_send_file(tool.clone(), config)?,
        None => Arc::new(NoTools),
    };
    if !config.tools.mcp.is_empty() {
        tools = Arc::new(WithMcp::new(
            tools,
            &config.tools.mcp,
            gate.clone(),
            config.secret_env_names().into_iter().collect(),
        ));
    }
    if config.schedule.enabled {
        tools = Arc::new(WithSchedule::new(tools));
    }
    let agent = OpenAiAgent::new(openai, key, tools)?;
    Ok(match tool {
        Some(tool) => AgentSetup {
            agent: Arc::new(agent),
            terminal: Some(TerminalSetup { tool, events }),
            approvals: None,
        },
        None => AgentSetup {
            agent: Arc::new(agent),
            terminal: None,
            approvals: Some(ApprovalsSetup { gate, events }),
        },
    })
}

/// The terminal tool plus `send_file`, which sends from the workdir only,
/// on behalf of the `run_as` user if there is one; without a workdir it is
/// not offered (never telegate's own directory, which holds its config and
/// database).
fn with_send_file(
    tool: Arc<TerminalTool>,
    config: &Config,
) -> Result<Arc<dyn ToolRegistry>, String> {
    let terminal = &config.tools.terminal;
    Ok(match &terminal.workdir {
        Some(workdir) => {
            let reader = terminal
                .run_as
                .as_deref()
                .map(RunAs::resolve)
                .transpose()?
                .map(|user| Reader {
                    uid: user.uid,
                    gid: user.gid,
                });
            let workspace = Workspace::new(workdir, reader);
            Arc::new(WithSendFile::new(tool, workspace))
        }
        None => {
            tracing::info!("send_file is not offered: it needs [tools.terminal] workdir");
            tool
        }
    })
}

/// The ACP backend with the approval gate its permission requests wait in
/// (answered in the chat like the terminal tool's).
fn build_acp_setup(acp: &crate::agent::AcpConfig, config: &AgentConfig) -> AgentSetup {
    let acp = acp.clone();
    let (sender, events) = tool_events();
    let gate = ApprovalGate::new(Duration::from_secs(acp.permission_timeout_secs), sender);
    let agent = AcpAgent::new(acp, gate.clone(), secret_env_names(config));
    AgentSetup {
        agent: Arc::new(agent),
        terminal: None,
        approvals: Some(ApprovalsSetup { gate, events }),
    }
}

/// The claude preset with `permission_prompt = true`: the command backend
/// asking through a gate of its own (`permission_timeout_secs`), its
/// socket in `<data_dir>/permission-prompts` (a private temporary
/// directory without a data directory). `None` for any other backend.
fn claude_with_permission_prompts(
    config: &Config,
    data_dir: Option<&std::path::Path>,
) -> Result<Option<AgentSetup>, String> {
    let Some(command) = config.agent.command().filter(|c| c.permission_prompt) else {
        return Ok(None);
    };
    let program = match &command.permission_helper {
        Some(program) => program.clone(),
        None => std::env::current_exe().map_err(|e| {
            format!("cannot find telegate's own binary for the permission helper: {e}")
        })?,
    };
    let dir = match data_dir {
        Some(dir) => dir.join("permission-prompts"),
        None => std::env::temp_dir().join(format!(
            "telegate-permission-{}",
            uuid::Uuid::new_v4().simple()
        )),
    };
    let (sender, events) = tool_events();
    let gate = ApprovalGate::new(command.permission_timeout(), sender);
    let prompts = PermissionPrompts::new(dir, gate.clone(), command.permission_timeout(), program);
    let agent = CommandAgent::new(command.clone(), secret_env_names(&config.agent));
    let agent = match data_dir {
        Some(dir) => agent.with_history_dir(dir),
        None => agent,
    }
    .with_permission_prompts(prompts);
    Ok(Some(AgentSetup {
        agent: Arc::new(agent),
        terminal: None,
        approvals: Some(ApprovalsSetup { gate, events }),
    }))
}

/// The configured agent backend, without tools. Fails only for a
/// configuration that [`Config`] validation would have refused.
pub fn build_agent(config: &AgentConfig) -> Result<Arc<dyn Agent>, String> {
    build_agent_in(config, None)
}

/// [`build_agent`] for a store in `data_dir`: the command backend keeps
/// its history files there (clearing what a killed run left), not in the
/// shared temporary directory. Call it at start, holding the data
/// directory's lock.
pub fn build_agent_in(
    config: &AgentConfig,
    data_dir: Option<&std::path::Path>,
) -> Result<Arc<dyn Agent>, String> {
    let secrets = secret_env_names(config);
    Ok(match &config.backend {
        AgentBackend::Echo(echo) => Arc::new(EchoAgent {
            delay: Duration::from_millis(echo.delay_ms),
        }),
        AgentBackend::Command(command) => {
            let agent = CommandAgent::new(command.clone(), secrets);
            Arc::new(match data_dir {
                Some(dir) => agent.with_history_dir(dir),
                None => agent,
            })
        }
        AgentBackend::Openai(openai) => {
            let openai = openai.clone();
            let key = openai.api_key();
            Arc::new(OpenAiAgent::new(openai, key, Arc::new(NoTools))?)
        }
        // Its permission requests need the chat: only with its gate.
        AgentBackend::Acp(_) => return Err(
            "agent.backend = \"acp\" asks permissions in the chat: build it with build_agent_setup"
                .to_string(),
        ),
    })
}
