//! The integration tests, as one binary (ripgrep's layout): a module per
//! area, sharing `support` (fakes of the Bot API, the LLM and the
//! transcription endpoint, test agents, a recording outbound).
//!
//! One binary links the crate once instead of once per file: touching a
//! source file relinks one test binary, not thirty-five. Tests that change
//! process-global state (the environment) live in `tests/process_env.rs`,
//! a binary of their own.
//!
//! The binary's allocator (`src/main.rs`, mimalloc under the `mimalloc`
//! feature, on by default) is this binary's too, so the engine is tested on
//! what that build ships.

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod support;

mod acp_e2e;
mod adapter_alone;
mod answer_sending;
mod approval_authority_e2e;
mod backends_e2e;
mod budget_spends;
mod chaos;
mod claude_permission_e2e;
mod cli;
mod cli_agents_e2e;
mod command_backend;
mod config_security_cli;
mod controls_e2e;
mod crash_recovery;
mod delivery_retries;
mod deploy_files;
mod documents_e2e;
mod drafts_e2e;
mod engine_behaviour;
mod engine_properties;
mod fake_bot_smoke;
mod file_handles;
mod http_endpoints;
mod inbound_fuzz;
mod instance_lock;
mod instant_control;
mod listener_limits;
mod mcp_tools_e2e;
mod media_e2e;
mod media_queue_e2e;
mod openai_backend;
mod outbox_once;
mod process_registry;
mod real_agents;
mod real_clients;
mod restarts;

mod schedule_crash;
mod schedule_e2e;
mod schedule_engine;
mod sd_notify;
mod secrets_e2e;
mod session_split_brain;
mod several_bots;
mod store_integrity;
mod teams_access;
mod teams_budgets;
mod teams_codes;
mod teams_pairing;
mod teams_revoke;
mod teams_sessions;
mod teams_voice;
mod telegram_e2e;
mod terminal_approval_e2e;
mod terminal_e2e;
mod terminal_isolation_e2e;
mod tidy;
mod topics_e2e;
mod webhook_lifecycle;
mod worktrees;
mod xsession_wakeup;
mod zero_config;
