//! The store's tables each layer gets.
//!
//! Outside `store/` and the wiring, no file names [`Store`]: each layer
//! holds only the handles of the tables it touches (its imports say which
//! they are; `tests/it/tidy.rs` holds this). This module is where the one
//! store becomes those narrow handles, one function per layer that needs
//! more than one table.

use crate::agent::AgentTables;
use crate::delivery::DeliveryTables;
use crate::runner::RunnerTables;
use crate::store::Store;
use crate::transport::telegram::TransportTables;

/// What delivery writes: the outbox, inline buttons, approval prompts.
pub fn delivery(store: &Store) -> DeliveryTables {
    DeliveryTables {
        outbox: store.outbox(),
        buttons: store.buttons(),
        approvals: store.approvals(),
    }
}

/// What the runner and the engine around it touch.
pub fn runner(store: &Store) -> RunnerTables {
    RunnerTables {
        sessions: store.sessions(),
        transcripts: store.transcripts(),
        generations: store.generations(),
        usage: store.usage(),
        jobs: store.jobs(),
        approvals: store.approvals(),
        agent: agent(store),
        processes: store.processes(),
    }
}

/// What an agent keeps: its own session ids, its child process groups.
pub fn agent(store: &Store) -> AgentTables {
    AgentTables {
        sessions: store.agent_sessions(),
        child_groups: store.child_groups(),
    }
}

/// What the Telegram transport touches: inbox, outbox, buttons, files
/// sent, sessions.
pub fn transport(store: &Store) -> TransportTables {
    TransportTables {
        inbox: store.inbox(),
        outbox: store.outbox(),
        buttons: store.buttons(),
        file_sends: store.file_sends(),
        sessions: store.sessions(),
    }
}
