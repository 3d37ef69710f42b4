//! Whether the store's writes currently work, as seen by the code that
//! writes (sessions, transcripts).
//!
//! A read (`SELECT 1`) can succeed while every write fails (disk full, a
//! read-only file system, a damaged page), so `/healthz` cannot learn about
//! failing writes by probing. Writers report their outcome here instead:
//! a failure is remembered until the next successful write.
//!
//! This module owns that one flag and its last error text. It must never
//! decide what a writer does about a failure (retry, tell the user): that
//! stays with the writer.

use std::sync::{Arc, Mutex, PoisonError};

/// Shared by every clone of a [`super::Store`].
#[derive(Clone, Debug, Default)]
pub struct WriteHealth {
    last_error: Arc<Mutex<Option<String>>>,
}

impl WriteHealth {
    /// A write failed with `error`.
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        *self.lock() = Some(error.to_string());
    }

    /// A write succeeded: earlier failures are over.
    pub fn succeeded(&self) {
        let mut last = self.lock();
        if last.is_some() {
            tracing::info!("store writes work again");
            *last = None;
        }
    }

    /// The error of the last write, if it failed.
    pub fn failure(&self) -> Option<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A plain value swap: a poisoned lock is consistent.
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_lasts_until_the_next_success() {
        let health = WriteHealth::default();
        assert_eq!(health.failure(), None);
        health.clone().failed(&"disk full");
        assert_eq!(health.failure().as_deref(), Some("disk full"));
        health.succeeded();
        assert_eq!(health.failure(), None);
    }
}
