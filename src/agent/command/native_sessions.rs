//! The agent's own session per telegate session: what the next turn
//! resumes, and what each turn cost.
//!
//! Kept in memory and, once the runner attaches one, in the store (so a
//! restart continues). A session id read from the agent's output is
//! remembered at once, before the turn ends: a turn stopped with /stop
//! leaves its agent session continuable. This module never runs anything.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::store::AgentSessions as AgentSessionTable;
use crate::store::AgentUsage;

/// Resume ids and usage, by telegate session id.
#[derive(Debug, Default)]
pub(crate) struct AgentSessions {
    store: OnceLock<AgentSessionTable>,
    memory: Mutex<HashMap<String, String>>,
}

impl AgentSessions {
    /// Keep everything in `store` from now on (the first store wins).
    pub(crate) fn attach(&self, store: &AgentSessionTable) {
        let _ = self.store.set(store.clone());
    }

    /// The agent session `session` resumes, if any.
    pub(crate) async fn resume_id(&self, session: &str) -> Option<String> {
        if let Some(id) = self.memory().get(session) {
            return Some(id.clone());
        }
        let store = self.store.get()?;
        match store.agent_resume_id(session).await {
            Ok(found) => found,
            Err(error) => {
                tracing::error!(session_id = session, %error, "could not read the agent session; starting a fresh one");
                None
            }
        }
    }

    /// `session`'s agent session is `id` (from now on, also after a restart).
    /// Callable from synchronous code: the store write runs on its own.
    pub(crate) fn remember(&self, session: &str, backend: &'static str, id: &str) {
        self.memory().insert(session.to_string(), id.to_string());
        if let (Some(store), Ok(runtime)) = (
            self.store.get().cloned(),
            tokio::runtime::Handle::try_current(),
        ) {
            let (session, id) = (session.to_string(), id.to_string());
            runtime.spawn(async move {
                if let Err(error) = store.set_agent_resume_id(&session, backend, Some(id)).await {
                    tracing::error!(session_id = session, %error, "could not record the agent session");
                }
            });
        }
    }

    /// `session` starts its agent afresh next time.
    pub(crate) async fn forget(&self, session: &str, backend: &'static str) {
        self.memory().remove(session);
        if let Some(store) = self.store.get() {
            if let Err(error) = store.set_agent_resume_id(session, backend, None).await {
                tracing::error!(session_id = session, %error, "could not forget the agent session");
            }
        }
    }

    /// Add one turn's usage (also to the turn's meter: budgets, /usage).
    pub(crate) async fn record_usage(
        &self,
        session: &str,
        backend: &'static str,
        usage: AgentUsage,
    ) {
        crate::limits::meter::record(&usage);
        if let Some(store) = self.store.get() {
            if let Err(error) = store.add_agent_usage(session, backend, usage).await {
                tracing::error!(session_id = session, %error, "could not record the agent's usage");
            }
        }
    }

    /// Add one turn's usage when the agent reported its thread's running
    /// total (Codex after a resume): the difference to the thread's last
    /// report is the turn's.
    pub(crate) async fn record_thread_usage(
        &self,
        session: &str,
        backend: &'static str,
        thread: &str,
        total: AgentUsage,
    ) {
        if let Some(store) = self.store.get() {
            if let Err(error) = store
                .add_agent_thread_usage(session, backend, thread, total)
                .await
            {
                tracing::error!(session_id = session, %error, "could not record the agent's usage");
            }
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
