//! What a turn spent so far, as its meter counts it and the ledger reads
//! it: reported usage, estimates of requests that reported none, and the
//! request under way; and [`Amount`], what a turn reserves or spends.
//!
//! Shared by [`super::meter`] and [`super::ledger`]; uses neither. Never
//! touches the store.

use std::sync::{Arc, Mutex, PoisonError};

use super::tokens_of;
use crate::store::AgentUsage;

/// Tokens, dollars and turns: what a turn reserves or spends.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Amount {
    /// Tokens (input, cached input and output).
    pub tokens: u64,
    /// US dollars.
    pub cost: f64,
    /// Turns.
    pub turns: u64,
}

impl Amount {
    pub(super) fn plus(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens.saturating_add(other.tokens),
            cost: self.cost + other.cost,
            turns: self.turns.saturating_add(other.turns),
        }
    }

    /// What `self` grew by since `before` (never below zero).
    pub(super) fn since(self, before: Amount) -> Amount {
        Amount {
            tokens: self.tokens.saturating_sub(before.tokens),
            cost: (self.cost - before.cost).max(0.0),
            turns: self.turns.saturating_sub(before.turns),
        }
    }

    /// The larger of each part.
    pub(super) fn max(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens.max(other.tokens),
            cost: self.cost.max(other.cost),
            turns: self.turns.max(other.turns),
        }
    }
}

/// How many characters sent or received count as one token where no usage
/// was reported (the usual rule of thumb for English text and code).
pub const CHARS_PER_TOKEN: usize = 4;

/// A meter's counts, shared with the ledger's entry of its turn.
pub(super) type Shared = Arc<Mutex<State>>;

#[derive(Debug, Default)]
pub(super) struct State {
    /// What backends reported.
    pub(super) reported: AgentUsage,
    /// Estimates of requests that ended without a report.
    pub(super) estimated: AgentUsage,
    /// The request under way that has not reported yet.
    pub(super) open: Option<Exchange>,
}

/// Characters of one request: sent, and received so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Exchange {
    pub(super) sent: usize,
    pub(super) received: usize,
}

/// The estimate of an exchange without usage (pure).
pub(super) fn estimate(exchange: Exchange) -> AgentUsage {
    let tokens = |chars: usize| u64::try_from(chars.div_ceil(CHARS_PER_TOKEN)).unwrap_or(u64::MAX);
    AgentUsage {
        turns: 0,
        input_tokens: tokens(exchange.sent),
        cached_input_tokens: 0,
        output_tokens: tokens(exchange.received),
        cost_usd: 0.0,
    }
}

impl State {
    pub(super) fn total(&self) -> AgentUsage {
        let mut total = self.reported;
        total.add(&self.estimated);
        if let Some(open) = self.open {
            total.add(&estimate(open));
        }
        total
    }

    pub(super) fn silent(&self) -> bool {
        self.reported == AgentUsage::default()
            && self.estimated == AgentUsage::default()
            && self.open.is_none()
    }
}

pub(super) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a meter's turn spent so far (reported and estimated).
pub(super) fn spent_of(shared: &Shared) -> Amount {
    let total = lock(shared).total();
    Amount {
        tokens: tokens_of(&total),
        cost: total.cost_usd,
        turns: 0,
    }
}

/// Add a report to a meter's counts: it covers the request under way.
pub(super) fn add_to(shared: &Shared, usage: &AgentUsage) {
    let mut state = lock(shared);
    state.reported.add(usage);
    state.open = None;
}
