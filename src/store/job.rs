//! The unit of work the store thread runs: a call's closure with its
//! answer ([`super::batch::Call`]) or a deferred write
//! ([`super::carried::Deferred`]). Its own file so that the batch loop and
//! the carried list, which both hold jobs, need not name each other's
//! files.
//!
//! This module owns only the trait. It must never run SQL itself.

use rusqlite::Connection;

/// One unit of work, run on the store thread, answered after its commit.
pub(super) trait Job: Send {
    /// Runs the work; true if its writes are to be kept (it succeeded).
    fn run(&mut self, conn: &mut Connection) -> bool;
    /// Tells the caller how the work ended. `lost` says why its writes are
    /// not durable (the batch did not commit, or it never ran); `None`
    /// means they are committed (or the work failed on its own and its own
    /// error is reported).
    fn answer(self: Box<Self>, lost: Option<&rusqlite::Error>);
    /// Whether it runs inside a savepoint of its own (false for work that
    /// changes the database with one statement at most, and for work that
    /// can run again).
    fn needs_savepoint(&self) -> bool;
    /// Whether it can run again in a new transaction after another job
    /// rolled back the batch it ran in (its work is kept, not consumed).
    fn can_run_again(&self) -> bool {
        false
    }
}
