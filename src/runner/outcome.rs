//! How a turn ended, decided from what happened.
//!
//! Three facts decide it: whether the turn's generation is still current
//! (a newer turn may own the slot), whether its cancel token fired (/stop,
//! /new, a newer message, the watchdog), and what the agent's future gave
//! back (an answer, an error, a panic, or nothing because the watchdog
//! gave up on it). [`turn_outcome`] is that decision and nothing else: the
//! turn ([`super::turn`]) counts, records and replies by the outcome.
//!
//! This module owns the decision. It must never do I/O or look at a clock.

use crate::agent::AgentError;
use crate::runner::panic_message;
use crate::runner::Watched;

/// What the agent's future produced, as the watchdog saw it: finished
/// (with the agent's result, or the payload of a panic), or stalled.
pub(crate) type TurnRun<A> = Watched<std::thread::Result<Result<A, AgentError>>>;

/// How a turn ended.
#[derive(Debug)]
pub(crate) enum TurnOutcome<A> {
    /// A newer generation owns the slot: nothing may be answered; what
    /// the user saw goes to the transcript as interrupted.
    Stale,
    /// The watchdog saw no progress for the stall timeout and cancelled it.
    Stalled,
    /// Cancelled by /stop, /new or a newer message (or the agent says it
    /// was cancelled): not answered.
    Stopped,
    /// The agent answered.
    Answered(A),
    /// The agent failed: `user_message` is for the chat, `detail` for the
    /// log.
    Failed {
        /// Told to the user.
        user_message: String,
        /// Logged for the owner.
        detail: String,
        /// Only the owner can fix it (the backend's setup): starting over
        /// cannot help.
        owner_must_fix: bool,
    },
    /// The agent panicked (the message goes to the log).
    Panicked(String),
}

impl<A> TurnOutcome<A> {
    /// Counted as a cancelled turn (a stale one also as a discard).
    pub(crate) fn counts_as_cancelled(&self) -> bool {
        matches!(self, TurnOutcome::Stale | TurnOutcome::Stopped)
    }

    /// The transcript keeps what the user saw so far, marked interrupted.
    pub(crate) fn keeps_partial(&self) -> bool {
        !matches!(self, TurnOutcome::Answered(_))
    }
}

/// The outcome of a turn that is (`current`) or is no longer the slot's
/// current generation, whose cancel token had (`cancelled`) or had not
/// fired, and whose run ended as `run`. Staleness wins over everything; a
/// stall over a cancel (the watchdog cancels the token itself); a cancel
/// over whatever the agent returned after it.
pub(crate) fn turn_outcome<A>(current: bool, cancelled: bool, run: TurnRun<A>) -> TurnOutcome<A> {
    if !current {
        return TurnOutcome::Stale;
    }
    match run {
        Watched::Stalled => TurnOutcome::Stalled,
        Watched::Finished(_) if cancelled => TurnOutcome::Stopped,
        Watched::Finished(Ok(Ok(answer))) => TurnOutcome::Answered(answer),
        Watched::Finished(Ok(Err(AgentError::Cancelled))) => TurnOutcome::Stopped,
        Watched::Finished(Ok(Err(AgentError::Backend {
            user_message,
            detail,
        }))) => TurnOutcome::Failed {
            user_message,
            detail,
            owner_must_fix: false,
        },
        Watched::Finished(Ok(Err(AgentError::Setup {
            user_message,
            detail,
        }))) => TurnOutcome::Failed {
            user_message,
            detail,
            owner_must_fix: true,
        },
        Watched::Finished(Err(panic)) => TurnOutcome::Panicked(panic_message(&*panic)),
    }
}

#[cfg(test)]
mod tests {
    use super::{turn_outcome, TurnRun};
    use crate::agent::AgentError;
    use crate::runner::Watched;

    /// The kinds of run, by name, so the table reads as one.
    fn run(kind: &str) -> TurnRun<&'static str> {
        match kind {
            "answer" => Watched::Finished(Ok(Ok("hi"))),
            "agent-cancelled" => Watched::Finished(Ok(Err(AgentError::Cancelled))),
            "failed" => Watched::Finished(Ok(Err(AgentError::Backend {
                user_message: "down".into(),
                detail: "503".into(),
            }))),
            "setup" => Watched::Finished(Ok(Err(AgentError::Setup {
                user_message: "log in".into(),
                detail: "auth".into(),
            }))),
            "panic" => Watched::Finished(Err(Box::new("boom"))),
            "stalled" => Watched::Stalled,
            other => unreachable!("{other}"),
        }
    }

    #[test]
    fn every_combination_has_the_outcome_the_turn_acts_on() {
        // (current, cancelled, run) → outcome, cancelled-count, keeps partial
        let table = [
            (true, false, "answer", "Answered(\"hi\")", false, false),
            (true, false, "agent-cancelled", "Stopped", true, true),
            (
                true,
                false,
                "failed",
                "Failed { user_message: \"down\", detail: \"503\", owner_must_fix: false }",
                false,
                true,
            ),
            (
                true,
                false,
                "setup",
                "Failed { user_message: \"log in\", detail: \"auth\", owner_must_fix: true }",
                false,
                true,
            ),
            (true, false, "panic", "Panicked(\"boom\")", false, true),
            (true, false, "stalled", "Stalled", false, true),
            (true, true, "answer", "Stopped", true, true),
            (true, true, "agent-cancelled", "Stopped", true, true),
            (true, true, "failed", "Stopped", true, true),
            (true, true, "panic", "Stopped", true, true),
            (true, true, "stalled", "Stalled", false, true),
        ];
        for (current, cancelled, kind, outcome, counted, partial) in table {
            let got = turn_outcome(current, cancelled, run(kind));
            assert_eq!(format!("{got:?}"), outcome, "{current} {cancelled} {kind}");
            assert_eq!(
                got.counts_as_cancelled(),
                counted,
                "{current} {cancelled} {kind}"
            );
            assert_eq!(got.keeps_partial(), partial, "{current} {cancelled} {kind}");
        }
        // A turn that is no longer current is stale however it ended.
        for kind in ["answer", "agent-cancelled", "failed", "panic", "stalled"] {
            for cancelled in [false, true] {
                let got = turn_outcome(false, cancelled, run(kind));
                assert_eq!(format!("{got:?}"), "Stale", "{cancelled} {kind}");
                assert!(got.counts_as_cancelled() && got.keeps_partial());
            }
        }
    }
}
