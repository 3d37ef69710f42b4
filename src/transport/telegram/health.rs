//! What `/healthz` reports for a running bot: are updates arriving (the
//! last `getUpdates` succeeded, or the webhook server runs) and does the
//! store answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::http::{HealthCheck, HealthReport};
use crate::store::Store;

/// Whether the update source works, updated by the polling loop.
#[derive(Clone, Debug)]
pub struct UpdatesHealth {
    ok: Arc<AtomicBool>,
}

impl Default for UpdatesHealth {
    fn default() -> Self {
        UpdatesHealth {
            ok: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl UpdatesHealth {
    /// Record the latest poll's outcome.
    pub fn set(&self, ok: bool) {
        self.ok.store(ok, Ordering::Relaxed);
    }

    /// The latest poll's outcome.
    pub fn is_ok(&self) -> bool {
        self.ok.load(Ordering::Relaxed)
    }
}

/// The bot's health: updates and store.
pub struct BotHealth {
    /// The update source.
    pub updates: UpdatesHealth,
    /// The store.
    pub store: Store,
}

impl HealthCheck for BotHealth {
    fn check(&self) -> BoxFuture<'_, HealthReport> {
        Box::pin(async move {
            let report = HealthReport::new();
            let report = if self.updates.is_ok() {
                report.ok("updates")
            } else {
                report.failing("updates", "the last getUpdates request failed")
            };
            match self
                .store
                .call(|conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
                .await
            {
                Ok(()) => match self.store.write_health().failure() {
                    None => report.ok("store"),
                    Some(error) => report.failing("store", format!("writes are failing: {error}")),
                },
                Err(error) => report.failing("store", error.to_string()),
            }
        })
    }
}
