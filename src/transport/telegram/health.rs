//! What `/healthz` reports for a running bot: are updates arriving (the
//! last `getUpdates` succeeded, or the webhook server runs), does the
//! store answer, and do its writes work (every kind of write the store
//! saw fail since it last worked: [`crate::store::WriteHealth`]), and does
//! the scheduler keep up with its jobs ([`crate::schedule::SchedulerHealth`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::http::{HealthCheck, HealthReport};
use crate::store::{StoreHealth, WriteKind};

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
    pub store: StoreHealth,
    /// The scheduler, when jobs are on.
    pub scheduler: Option<crate::schedule::SchedulerHealth>,
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
            let report = match self.store.ping().await {
                Ok(()) => match failing_writes(&self.store.write_health().failures()) {
                    None => report.ok("store"),
                    Some(reason) => report.failing("store", reason),
                },
                Err(error) => report.failing("store", error.to_string()),
            };
            match &self.scheduler {
                None => report,
                Some(scheduler) => match scheduler.failing(crate::store::now_ms()) {
                    None => report.ok("scheduler"),
                    Some(reason) => report.failing("scheduler", reason),
                },
            }
        })
    }
}

/// `"<kinds> writes are failing: <first error>"`, kinds first (the reason
/// shown is cut to a line), or `None` when every write works.
fn failing_writes(failures: &[(WriteKind, String)]) -> Option<String> {
    let (_, first_error) = failures.first()?;
    let kinds: Vec<&str> = failures.iter().map(|(kind, _)| kind.as_str()).collect();
    Some(format!(
        "{} writes are failing: {first_error}",
        kinds.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_writes_name_every_kind_before_the_error() {
        assert_eq!(failing_writes(&[]), None);
        let failures = [
            (WriteKind::Inbox, "disk full".to_string()),
            (WriteKind::Transcript, "read-only".to_string()),
        ];
        assert_eq!(
            failing_writes(&failures).as_deref(),
            Some("inbox, transcripts writes are failing: disk full")
        );
    }
}
