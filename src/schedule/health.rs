//! Whether the scheduler keeps up: the earliest due instant it has not
//! fired yet, for `/healthz` (a scheduler that fell behind) and the
//! `schedule_behind_seconds` gauge.
//!
//! The scheduler records, each time it looks, the earliest next run of any
//! active job. While it works (or if it is stuck, or its writes fail) that
//! instant stays where it was, so "now minus the recorded instant" is how
//! far behind it is, whatever stopped it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Behind by more than this (ms) is unhealthy.
pub const BEHIND_LIMIT_MS: i64 = 60_000;

/// Shared by the scheduler and the health check.
#[derive(Clone, Debug)]
pub struct SchedulerHealth {
    next_due_ms: Arc<AtomicI64>,
}

impl Default for SchedulerHealth {
    fn default() -> Self {
        SchedulerHealth {
            next_due_ms: Arc::new(AtomicI64::new(i64::MAX)),
        }
    }
}

impl SchedulerHealth {
    /// The earliest next run (unix ms), or `None` with no active job.
    pub fn set_next_due(&self, next: Option<i64>) {
        self.next_due_ms
            .store(next.unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    /// How far behind the scheduler is at `now_ms` (0 when on time).
    pub fn behind_ms(&self, now_ms: i64) -> i64 {
        let due = self.next_due_ms.load(Ordering::Relaxed);
        if due == i64::MAX {
            return 0;
        }
        now_ms.saturating_sub(due).max(0)
    }

    /// `Some(reason)` when it is behind by more than [`BEHIND_LIMIT_MS`].
    pub fn failing(&self, now_ms: i64) -> Option<String> {
        let behind = self.behind_ms(now_ms);
        (behind > BEHIND_LIMIT_MS).then(|| {
            format!(
                "the scheduler is {}s behind: a job due then has not run yet",
                behind / 1000
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behind_counts_from_the_earliest_unfired_instant() {
        let health = SchedulerHealth::default();
        assert_eq!(health.behind_ms(1_000_000), 0);
        health.set_next_due(Some(1_000_000));
        assert_eq!(health.behind_ms(999_000), 0);
        assert_eq!(health.failing(1_000_000 + BEHIND_LIMIT_MS), None);
        let reason = health.failing(1_000_000 + 90_000).unwrap();
        assert!(reason.contains("90s behind"), "{reason}");
        health.set_next_due(None);
        assert_eq!(health.failing(i64::MAX), None);
    }
}
