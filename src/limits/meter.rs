//! A turn's usage meter: what the backend reported so far in this turn (or,
//! where it reported nothing, an estimate), and how much of its user's
//! budget is left, counting the user's other running turns.
//!
//! The runner binds a [`TurnMeter`] around each turn (a task-local, like
//! the turn's identity). Backends report each completion's or run's usage
//! with [`record`]; a backend that talks to a model request by request
//! also says what it sent and received ([`request_sent`], [`received`]),
//! so a request that ends without usage (stopped mid-stream, a server
//! that reports none) is charged an estimate of [`CHARS_PER_TOKEN`]
//! characters a token. The openai tool loop asks [`exhausted`] between
//! rounds and ends the loop at the limit; with a booking
//! ([`super::ledger`]) that limit counts the user's other running turns
//! too. After the turn the runner reads the total ([`TurnMeter::used`])
//! and charges it. Outside a turn all of these are no-ops.
//!
//! This module never touches the store.

use std::sync::Arc;

use super::counts::{add_to, estimate, lock, spent_of, Amount, Exchange, Shared};
use super::ledger::{Ledger, Reservation};
use super::{stopped_note, Allowance, LimitKind};
use crate::store::AgentUsage;

pub use super::counts::CHARS_PER_TOKEN;

/// One turn's meter. Cheap to clone; clones share the count (and the
/// booking, released when the last clone is dropped).
#[derive(Clone, Debug, Default)]
pub struct TurnMeter {
    shared: Shared,
    view: Arc<View>,
}

#[derive(Debug, Default)]
struct View {
    allowance: Allowance,
    /// The daily limits, for the note.
    limits: (Option<u64>, Option<f64>),
    booked: Option<Booked>,
}

/// Where the turn is booked, and what its user had settled when the store
/// was read for its check.
#[derive(Debug)]
struct Booked {
    ledger: Ledger,
    user: u64,
    settled_before: Amount,
    reservation: Reservation,
}

impl TurnMeter {
    /// A meter allowing `allowance` more; `limits` are the daily token and
    /// cost limits (for the note).
    pub fn new(allowance: Allowance, limits: (Option<u64>, Option<f64>)) -> TurnMeter {
        TurnMeter {
            shared: Shared::default(),
            view: Arc::new(View {
                allowance,
                limits,
                booked: None,
            }),
        }
    }

    /// A meter of a turn booked in `ledger` for `user` (see
    /// [`super::ledger`]): `shared` is what the booking reads.
    pub(super) fn booked(
        shared: Shared,
        (allowance, limits): (Allowance, (Option<u64>, Option<f64>)),
        (ledger, user, settled_before): (Ledger, u64, Amount),
        reservation: Reservation,
    ) -> TurnMeter {
        TurnMeter {
            shared,
            view: Arc::new(View {
                allowance,
                limits,
                booked: Some(Booked {
                    ledger,
                    user,
                    settled_before,
                    reservation,
                }),
            }),
        }
    }

    /// Add what a backend reported.
    pub fn add(&self, usage: &AgentUsage) {
        add_to(&self.shared, usage);
    }

    /// A request of `chars` characters was sent: the one before it, if it
    /// reported nothing, keeps its estimate.
    pub fn sent(&self, chars: usize) {
        let mut state = lock(&self.shared);
        if let Some(open) = state.open.take() {
            state.estimated.add(&estimate(open));
        }
        state.open = Some(Exchange {
            sent: chars,
            received: 0,
        });
    }

    /// `chars` more characters of the request under way arrived.
    pub fn got(&self, chars: usize) {
        let mut state = lock(&self.shared);
        let open = state.open.get_or_insert_with(Exchange::default);
        open.received = open.received.saturating_add(chars);
    }

    /// A turn whose backend reported nothing at all (no usage, no request
    /// counted) is charged the estimate of its `sent` and `received`
    /// characters; `false`: something was reported, nothing changed.
    pub fn estimate_if_silent(&self, sent: usize, received: usize) -> bool {
        let mut state = lock(&self.shared);
        if !state.silent() {
            return false;
        }
        state.estimated = estimate(Exchange { sent, received });
        true
    }

    /// Everything this turn used: reported, and estimated where nothing
    /// was.
    pub fn used(&self) -> AgentUsage {
        lock(&self.shared).total()
    }

    /// The note to end the turn with when its budget is used up: by this
    /// turn, and by its user's other running turns (their reservations or
    /// use, whichever is more) and those finished since its check.
    pub fn over_budget(&self) -> Option<String> {
        let own = spent_of(&self.shared);
        let view = &self.view;
        let others = view.booked.as_ref().map_or_else(Amount::default, |b| {
            b.ledger
                .in_flight(b.user, b.settled_before, Some(b.reservation.id()))
        });
        let tokens = own.tokens.saturating_add(others.tokens);
        let cost = own.cost + others.cost;
        let kind = match (view.allowance.tokens_left, view.allowance.cost_left) {
            (Some(left), _) if tokens >= left => {
                LimitKind::DailyTokens(view.limits.0.unwrap_or(left))
            }
            (_, Some(left)) if cost >= left => LimitKind::DailyCost(view.limits.1.unwrap_or(left)),
            _ => return None,
        };
        Some(stopped_note(kind, &view.allowance.resets))
    }
}

tokio::task_local! {
    static METER: TurnMeter;
}

/// Run `future` with `meter` as the current turn's meter.
pub async fn with_meter<F: std::future::Future>(meter: TurnMeter, future: F) -> F::Output {
    METER.scope(meter, future).await
}

/// A backend reports `usage` for the current turn (no-op outside a turn);
/// it covers the request under way.
pub fn record(usage: &AgentUsage) {
    let _ = METER.try_with(|meter| meter.add(usage));
}

/// A backend sent a request of `chars` characters for the current turn.
pub fn request_sent(chars: usize) {
    let _ = METER.try_with(|meter| meter.sent(chars));
}

/// `chars` more characters of the current request's answer arrived.
pub fn received(chars: usize) {
    let _ = METER.try_with(|meter| meter.got(chars));
}

/// The note to stop with if the current turn's user is over budget.
pub fn exhausted() -> Option<String> {
    METER.try_with(TurnMeter::over_budget).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::{exhausted, received, record, request_sent, with_meter, TurnMeter};
    use crate::limits::Allowance;
    use crate::store::AgentUsage;

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

    #[tokio::test]
    async fn a_request_without_usage_is_charged_its_characters() {
        let meter = TurnMeter::default();
        with_meter(meter.clone(), async {
            // Reported: the report covers its request, no estimate on top.
            request_sent(4000);
            received(400);
            record(&usage(900, 0.0));
            // Stopped mid-answer: 2000 sent, 41 received, nothing reported.
            request_sent(2000);
            received(40);
            received(1);
        })
        .await;
        let used = meter.used();
        assert_eq!((used.input_tokens, used.output_tokens), (900 + 500, 11));
        assert!(!meter.estimate_if_silent(10_000, 10_000), "it was counted");
        assert_eq!(meter.used(), used);
        // A request after one that never reported keeps both estimates.
        let meter = TurnMeter::default();
        meter.sent(400);
        meter.got(8);
        meter.sent(800);
        assert_eq!(
            (meter.used().input_tokens, meter.used().output_tokens),
            (300, 2)
        );
        // A backend that says nothing: the turn's own text is estimated.
        let silent = TurnMeter::default();
        assert!(silent.estimate_if_silent(41, 8));
        assert_eq!(
            (silent.used().input_tokens, silent.used().output_tokens),
            (11, 2)
        );
    }
}
