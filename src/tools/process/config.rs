//! What the registry allows (`RegistryConfig`), what a spawn asks for
//! (`SpawnSpec`), and how spawning and waiting can end.

use crate::tools::process::ProcessMode;
use crate::tools::process::ProcessOwner;
use crate::tools::process::ProcessRecord;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// How the registry runs processes and what it allows.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// The working directory of every process (`None`: the bot's own).
    pub workdir: Option<PathBuf>,
    /// Environment variables removed for every process (secrets).
    pub stripped_env: BTreeSet<String>,
    /// The rest of the environment: what passes besides the default
    /// allowlist, and what is set (see [`super::childenv`]).
    pub child_env: crate::tools::childenv::ChildEnv,
    /// Run every process as this user (telegate is root).
    pub run_as: Option<crate::tools::runas::RunAs>,
    /// Output bytes kept per process.
    pub output_cap_bytes: usize,
    /// Background processes that may run per chat.
    pub max_background_per_chat: usize,
    /// Background processes that may run overall.
    pub max_background_total: usize,
    /// Finished background records kept for `/ps` and `process poll`.
    pub keep_finished: usize,
    /// Between SIGTERM and SIGKILL when a process must stop.
    pub kill_grace: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            workdir: None,
            stripped_env: crate::vocab::ALWAYS_STRIPPED_ENV
                .iter()
                .map(|name| name.to_string())
                .collect(),
            child_env: crate::tools::childenv::ChildEnv::default(),
            run_as: None,
            output_cap_bytes: 64 * 1024,
            max_background_per_chat: 4,
            max_background_total: 16,
            keep_finished: 32,
            kill_grace: Duration::from_secs(2),
        }
    }
}

/// Why a process was not started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The per-chat limit is reached.
    #[error(
        "{limit} background processes already run in this chat (the limit, \
         tools.terminal.max_background); wait for one to finish or kill one first"
    )]
    ChatLimit {
        /// The limit.
        limit: usize,
    },
    /// The overall limit is reached.
    #[error(
        "{limit} background processes already run in total (the limit, \
         tools.terminal.max_background_total); wait for one to finish or kill one first"
    )]
    TotalLimit {
        /// The limit.
        limit: usize,
    },
    /// A wakeup was asked for but there is no chat to wake.
    #[error(
        "notify_on_complete needs a chat to report to, and this call runs outside any chat turn"
    )]
    NoOwnerToNotify,
    /// The command contains a NUL byte.
    #[error("the command contains a NUL character")]
    NulByte,
    /// The working directory is missing.
    #[error("the working directory {0} does not exist (tools.terminal.workdir)")]
    NoWorkdir(String),
    /// The shell could not be started.
    #[error("could not start the shell: {0}")]
    Spawn(String),
}

/// What to start.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    /// The shell command (run with `sh -c`).
    pub command: String,
    /// Who starts it (see [`ProcessOwner::capture`]).
    pub owner: Option<ProcessOwner>,
    /// Foreground or background.
    pub mode: ProcessMode,
}

/// How a wait for a process ended.
#[derive(Clone, Debug)]
pub enum WaitOutcome {
    /// It ended; the record says how.
    Exited(ProcessRecord),
    /// It still runs after the wait's limit.
    StillRunning(ProcessRecord),
    /// The turn was cancelled while waiting.
    Cancelled,
}
