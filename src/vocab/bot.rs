//! Which bot a row, an update or a session belongs to.
//!
//! One telegate process may run several Telegram bots over one store
//! (`[[bots]]`); every stored row carries its bot's id, so two bots in the
//! same group (same chat id, same message ids, their own update ids) never
//! see each other's data, and a database shared by several machines later
//! needs no schema rewrite.

use std::fmt;

/// A bot's id as `getMe` reports it (the number before the colon of its
/// token), so a bot renamed in the config keeps its data. [`BotId::UNCLAIMED`]
/// (0) marks rows written before several bots existed: the first
/// configured bot adopts them at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BotId(pub i64);

impl BotId {
    /// Rows of a database from before several bots (and the store handles
    /// of tools and tests that run no bot).
    pub const UNCLAIMED: BotId = BotId(0);

    /// The id as stored.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for BotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
