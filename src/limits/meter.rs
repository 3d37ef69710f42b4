//! A turn's usage meter: what the backend reported so far in this turn,
//! and how much of its user's budget is left.
//!
//! The runner binds a [`TurnMeter`] around each turn (a task-local, like
//! the turn's identity). Backends report each completion's or run's usage
//! with [`record`]; the openai tool loop asks [`exhausted`] between rounds
//! and ends the loop at the limit. After the turn the runner reads the
//! total ([`TurnMeter::used`]) and charges it. Outside a turn both are
//! no-ops.
//!
//! This module never touches the store.

use std::sync::{Arc, Mutex, PoisonError};

use super::{stopped_note, tokens_of, Allowance, LimitKind};
use crate::store::AgentUsage;

/// One turn's meter. Cheap to clone; clones share the count.
#[derive(Clone, Debug, Default)]
pub struct TurnMeter {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    used: AgentUsage,
    allowance: Allowance,
    /// The daily limits, for the note.
    limits: (Option<u64>, Option<f64>),
}

impl TurnMeter {
    /// A meter allowing `allowance` more; `limits` are the daily token and
    /// cost limits (for the note).
    pub fn new(allowance: Allowance, limits: (Option<u64>, Option<f64>)) -> TurnMeter {
        TurnMeter {
            inner: Arc::new(Mutex::new(State {
                used: AgentUsage::default(),
                allowance,
                limits,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Add what a backend reported.
    pub fn add(&self, usage: &AgentUsage) {
        self.lock().used.add(usage);
    }

    /// Everything reported in this turn.
    pub fn used(&self) -> AgentUsage {
        self.lock().used
    }

    /// The note to end the turn with when its budget is used up.
    pub fn over_budget(&self) -> Option<String> {
        let state = self.lock();
        let tokens = tokens_of(&state.used);
        let kind = match (state.allowance.tokens_left, state.allowance.cost_left) {
            (Some(left), _) if tokens >= left => {
                LimitKind::DailyTokens(state.limits.0.unwrap_or(left))
            }
            (_, Some(left)) if state.used.cost_usd >= left => {
                LimitKind::DailyCost(state.limits.1.unwrap_or(left))
            }
            _ => return None,
        };
        Some(stopped_note(kind, &state.allowance.resets))
    }
}

tokio::task_local! {
    static METER: TurnMeter;
}

/// Run `future` with `meter` as the current turn's meter.
pub async fn with_meter<F: std::future::Future>(meter: TurnMeter, future: F) -> F::Output {
    METER.scope(meter, future).await
}

/// A backend reports `usage` for the current turn (no-op outside a turn).
pub fn record(usage: &AgentUsage) {
    let _ = METER.try_with(|meter| meter.add(usage));
}

/// The note to stop with if the current turn's user is over budget.
pub fn exhausted() -> Option<String> {
    METER.try_with(TurnMeter::over_budget).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64, cost: f64) -> AgentUsage {
        AgentUsage {
            turns: 1,
            input_tokens: tokens,
            cost_usd: cost,
            ..AgentUsage::default()
        }
    }

    #[tokio::test]
    async fn the_meter_counts_within_its_turn_and_says_when_the_budget_is_gone() {
        record(&usage(5, 0.0));
        assert_eq!(exhausted(), None, "outside a turn nothing counts");
        let allowance = Allowance {
            tokens_left: Some(100),
            cost_left: None,
            resets: "00:00 (UTC)".into(),
        };
        let meter = TurnMeter::new(allowance, (Some(1000), None));
        let seen = with_meter(meter.clone(), async {
            record(&usage(60, 0.01));
            let first = exhausted();
            record(&usage(40, 0.01));
            (first, exhausted())
        })
        .await;
        assert_eq!(seen.0, None);
        let note = seen.1.unwrap();
        assert!(
            note.contains("1.0k tokens") && note.contains("00:00 (UTC)"),
            "{note}"
        );
        assert_eq!(meter.used().input_tokens, 100);
        assert_eq!(meter.used().turns, 2);
        let unlimited = TurnMeter::default();
        unlimited.add(&usage(1_000_000, 50.0));
        assert_eq!(unlimited.over_budget(), None);
    }
}
