//! The session engine: one adapter in front of one runner, assembled from
//! an agent (with its tools), an outbound and a store.
//!
//! Every transport (Telegram, webhook, console) and every test assembles
//! the session engine through its one constructor, [`Engine::new`] with
//! the [`EngineParts`], so they all run the very same code path; what the configuration says goes in through `crate::wiring`.
//!
//! With the terminal tool enabled, three parts meet here that must not know
//! each other: the tool (inside the agent) produces [`ToolEvent`]s, the
//! adapter takes wakeups as internal events, and the outbound shows approval
//! requests. A forwarder task drains the tool event channel into those two,
//! resolving each wakeup's session with the runner first. It holds the
//! adapter and the runner only weakly, so an engine that is dropped is not
//! kept alive by its own forwarder.

use std::sync::Arc;

use crate::adapter::{Adapter, AdapterConfig, AdapterParts, OutcomeSink, WeakAdapter};
use crate::agent::Agent;
use crate::reply::{Outbound, Reply};
use crate::runner::RunnerTables;
use crate::runner::{Runner, RunnerConfig, RunnerParts, WeakRunner};
use crate::store::{Processes, RunningProcess, StoreError};
use crate::tools::approval::ApprovalGate;
use crate::tools::approval_options::ApprovalOption;
use crate::tools::childgroups::{kill_previous_run, GroupLedger};
use crate::tools::wakeup::{OwnerHistory, Wakeup};
use crate::tools::{TerminalTool, ToolEvent, ToolEventReceiver};
use crate::vocab::{Button, ChatType, Platform, SessionId, SessionSource};

/// The session engine: the adapter that transports feed, and the runner
/// behind it.
#[derive(Clone)]
pub struct Engine {
    /// Where transports hand their events.
    pub adapter: Adapter,
    /// The runner (exposed for diagnostics and tests).
    pub runner: Runner,
}

/// What an [`Engine`] is assembled from: parts already built.
pub struct EngineParts {
    /// The agent with its tools (see
    /// [`build_agent_setup`](crate::wiring::engine::build_agent_setup)).
    pub setup: AgentSetup,
    /// Where replies, notices and approval prompts go.
    pub outbound: Arc<dyn Outbound>,
    /// Sessions, transcripts and the rest of the runner's tables (`None`:
    /// memory only).
    pub store: Option<RunnerTables>,
    /// Where every message's outcome is reported (`None`: nowhere).
    pub outcomes: Option<Arc<dyn OutcomeSink>>,
    /// The adapter's settings.
    pub adapter: AdapterConfig,
    /// The runner's settings.
    pub runner: RunnerConfig,
}

impl EngineParts {
    /// `agent` without tools replying through `outbound`; no store, no
    /// outcome sink, default settings (the rest of a struct literal:
    /// `..EngineParts::new(agent, outbound)`).
    pub fn new(agent: Arc<dyn Agent>, outbound: Arc<dyn Outbound>) -> Self {
        EngineParts {
            setup: AgentSetup::without_tools(agent),
            outbound,
            store: None,
            outcomes: None,
            adapter: AdapterConfig::default(),
            runner: RunnerConfig::default(),
        }
    }
}

impl Engine {
    /// The engine from its parts: the one way to build one. With a terminal
    /// tool or an approval gate in the setup, the runner answers /ps,
    /// /kill, /approve and /deny, and a forwarder task brings wakeups and
    /// approval requests to the chats (so this must then be called inside a
    /// tokio runtime).
    pub fn new(parts: EngineParts) -> Engine {
        let EngineParts {
            setup,
            outbound,
            store,
            outcomes,
            adapter,
            runner,
        } = parts;
        let AgentSetup {
            agent,
            terminal,
            approvals,
        } = setup;
        let mut runner_parts = RunnerParts {
            store: store.clone(),
            config: runner,
            ..RunnerParts::new(agent, outbound.clone())
        };
        let events = match (terminal, approvals) {
            (Some(TerminalSetup { tool, events }), _) => {
                if let Some(store) = &store {
                    tool.registry()
                        .record_groups(GroupLedger::new(store.agent.child_groups.clone()));
                }
                runner_parts.tools = Some(tool);
                Some(events)
            }
            (None, Some(ApprovalsSetup { gate, events })) => {
                runner_parts.approvals = Some(gate);
                Some(events)
            }
            (None, None) => None,
        };
        let runner = Runner::new(runner_parts);
        let adapter = Adapter::new(AdapterParts {
            outcomes,
            config: adapter,
            ..AdapterParts::new(Arc::new(runner.clone()), outbound.clone())
        });
        runner.attach_adapter(adapter.downgrade());
        if let Some(events) = events {
            tokio::spawn(forward_tool_events(
                events,
                adapter.downgrade(),
                runner.downgrade(),
                outbound,
            ));
        }
        Engine { adapter, runner }
    }

    /// At start, before anything runs again (recovery included): kill what
    /// the previous run of this store left running
    /// ([`kill_previous_run`]) and reserve this run's turn generations
    /// ([`Runner::reserve_generations`]). Both promises of a restart: a
    /// program never runs twice, a button from before never stops a turn
    /// of this run.
    pub async fn prepare_run(&self) -> Result<(), StoreError> {
        let Some(store) = self.runner.store() else {
            return Ok(());
        };
        let killed = kill_previous_run(&store.agent.child_groups).await?;
        if killed > 0 {
            tracing::info!(killed, "killed the programs the previous run left running");
        }
        self.runner.reserve_generations().await
    }
}

/// An agent and, when it has one, its terminal tool with the channel of the
/// tool's events, or the approval gate it asks the chat through.
pub struct AgentSetup {
    /// The agent backend.
    pub agent: Arc<dyn Agent>,
    /// The terminal tool the agent calls, if enabled (its approval gate
    /// is the runner's).
    pub terminal: Option<TerminalSetup>,
    /// Without a terminal tool: the approval gate the agent or its other
    /// tools ask through (an ACP agent's permission requests, MCP tools,
    /// Claude Code's permission prompts), if any.
    pub approvals: Option<ApprovalsSetup>,
}

/// An approval gate without a terminal tool, and its events.
pub struct ApprovalsSetup {
    /// The gate (shared with the tools that ask through it).
    pub gate: ApprovalGate,
    /// Its approval requests and notices.
    pub events: ToolEventReceiver,
}

/// The terminal tool and the receiving end of its events.
pub struct TerminalSetup {
    /// The tool (shared with the agent, which calls it).
    pub tool: Arc<TerminalTool>,
    /// Wakeups and approval notices from the tool.
    pub events: ToolEventReceiver,
}

impl AgentSetup {
    /// An agent without a terminal tool.
    pub fn without_tools(agent: Arc<dyn Agent>) -> AgentSetup {
        AgentSetup {
            agent,
            terminal: None,
            approvals: None,
        }
    }
}

/// Drain the tool events: wakeups become internal events for their owner's
/// chat (running against the session [`crate::tools::wakeup::resolve_wakeup_target`]
/// picks), notices go out through the outbound. Ends when every sender is
/// gone or the engine was dropped.
async fn forward_tool_events(
    mut events: ToolEventReceiver,
    adapter: WeakAdapter,
    runner: WeakRunner,
    outbound: Arc<dyn Outbound>,
) {
    while let Some(event) = events.recv().await {
        match event {
            ToolEvent::Notice { to, text } => {
                if let Err(error) = outbound.deliver(&to, Reply::notice(text)).await {
                    tracing::warn!(chat_id = to.chat_id, %error, "a tool notice could not be delivered");
                }
            }
            ToolEvent::Approval {
                to,
                ticket,
                text,
                options,
            } => {
                let prompt = approval_prompt(text, &ticket, &options);
                if let Err(error) = outbound.deliver(&to, prompt).await {
                    tracing::warn!(chat_id = to.chat_id, %error, "an approval prompt could not be delivered");
                }
            }
            ToolEvent::Settled { to, ticket, line } => {
                if let Err(error) = outbound.settle_prompt(&to, &ticket, &line).await {
                    tracing::debug!(chat_id = to.chat_id, %error, "an approval prompt could not be edited");
                }
            }
            ToolEvent::BackgroundStarted { id, owner, command } => {
                if let Some(store) = runner.upgrade().and_then(|r| r.store().cloned()) {
                    let process = RunningProcess {
                        process_id: id,
                        chat_id: owner.chat_id,
                        thread_id: owner.thread_id,
                        command,
                    };
                    if let Err(error) = store.processes.process_started(process).await {
                        tracing::warn!(%error, "could not record a background process");
                    }
                }
            }
            ToolEvent::BackgroundEnded { id } => {
                if let Some(store) = runner.upgrade().and_then(|r| r.store().cloned()) {
                    if let Err(error) = store.processes.process_ended(id).await {
                        tracing::warn!(%error, "could not record the end of a background process");
                    }
                }
            }
            ToolEvent::Wakeup(wakeup) => {
                let (Some(adapter), Some(runner)) = (adapter.upgrade(), runner.upgrade()) else {
                    tracing::warn!(process = %wakeup.process.id, "wakeup dropped: the engine is gone");
                    return;
                };
                wake_owner(&adapter, &runner, wakeup).await;
            }
        }
    }
}

/// An approval request as a notice with a button per option (its emoji
/// and label; whether it allows).
fn approval_prompt(text: String, ticket: &str, options: &[ApprovalOption]) -> Reply {
    let choices: Vec<(String, String, bool)> = options
        .iter()
        .map(|o| {
            (
                o.id.clone(),
                format!("{} {}", o.kind.emoji(), o.label),
                o.kind.allows(),
            )
        })
        .collect();
    Reply::notice(text).with_buttons(Button::approval_choices(ticket, &choices))
}

/// A wakeup as an internal event for its owner's chat, running against the
/// chat's current session (or, with the store failing, the session that
/// started the process); dropped, and logged, when it has no owner.
async fn wake_owner(adapter: &Adapter, runner: &Runner, wakeup: Box<Wakeup>) {
    let Some(owner) = wakeup.owner() else {
        tracing::error!(process = %wakeup.process.id, "wakeup without an owner; nobody to wake");
        return;
    };
    let resolved = match runner.resolve_session(&owner.session_key).await {
        Ok(resolved) => resolved,
        // The store is failing: the wakeup still runs, against
        // the session that started the process if known.
        Err(error) => match owner.known_spawn_session() {
            Some(spawned) => spawned.clone(),
            None => {
                tracing::error!(process = %wakeup.process.id, %error, "wakeup dropped: its chat has no session and the store is failing");
                return;
            }
        },
    };
    let history = owner_history(runner, &wakeup, &resolved).await;
    let process = wakeup.process.id.clone();
    match wakeup.into_event_checked(resolved, history) {
        Some(event) => {
            tracing::info!(%process, session = ?event.session_override, "waking the owner chat");
            adapter.wake(event).await;
        }
        None => tracing::error!(%process, "wakeup without an owner; nobody to wake"),
    }
}

/// What the store's session history says about a wakeup's recorded owner
/// session, when it differs from the chat's current session `resolved`.
async fn owner_history(runner: &Runner, wakeup: &Wakeup, resolved: &SessionId) -> OwnerHistory {
    let (Some(owner), Some(store)) = (wakeup.owner(), runner.store()) else {
        return OwnerHistory::Unchecked;
    };
    let Some(spawned) = wakeup.process.spawn_session_id() else {
        return OwnerHistory::Unchecked;
    };
    if spawned == resolved {
        return OwnerHistory::Unchecked;
    }
    match store.sessions.session_owner_key(spawned.as_str()).await {
        Ok(Some(key)) if key == owner.session_key.as_str() => OwnerHistory::EarlierSessionOfTheChat,
        Ok(Some(key)) => OwnerHistory::OtherChat(key),
        Ok(None) => OwnerHistory::NeverIssued,
        Err(error) => {
            tracing::warn!(%error, "could not read the session history for a wakeup");
            OwnerHistory::Unchecked
        }
    }
}

/// At start: tell the owners of background processes that were still
/// running when telegate last stopped that those processes are gone (they
/// do not survive a restart). Returns how many were reported.
pub async fn report_lost_processes(processes: &Processes, outbound: &dyn Outbound) -> usize {
    let lost = match processes.take_lost_processes().await {
        Ok(lost) => lost,
        Err(error) => {
            tracing::warn!(%error, "could not read the background processes of the last run");
            return 0;
        }
    };
    for process in &lost {
        let to = SessionSource {
            chat_type: if process.chat_id < 0 {
                ChatType::Group
            } else {
                ChatType::Dm
            },
            thread_id: process.thread_id,
            ..SessionSource::dm(Platform::Telegram, process.chat_id)
        };
        let text = format!(
            "⚠️ telegate restarted while the background process {} (`{}`) was running: \
             it was stopped with telegate and its result will not be reported. Start it \
             again if you still need it.",
            process.process_id, process.command
        );
        if let Err(error) = outbound.deliver(&to, Reply::notice(text)).await {
            tracing::warn!(chat_id = process.chat_id, %error, "could not report a lost background process");
        }
    }
    lost.len()
}
