//! The tasks the adapter spawns: a slot's owner task (runs the event, sends
//! its reply while it still owns the slot, then takes the next follow-up or
//! releases), and a slot's refusal notifier (coalesced "not queued" notices,
//! never awaited by anyone routing a message). A reply being sent can be
//! stopped (/stop, /new, /reset: [`crate::reply::SendingStop`]); the owner task then says
//! in one line what was left unsent.

use crate::adapter::AdapterInner;
use crate::adapter::DispatchContext;
use crate::adapter::EventOutcome;
use crate::adapter::SessionGuard;
use crate::memory::shrink_when_sparse;
use crate::reply::unsent_line;
use crate::reply::Outgoing;
use crate::reply::Reply;
use crate::reply::Unsent;
use crate::vocab::MessageEvent;
use crate::vocab::SessionKey;
use crate::vocab::SessionSource;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The body of a slot's owner task: run the event, send its reply if the
/// task still owns the slot, then take the next follow-up or release.
pub(super) async fn owner_task(
    inner: Arc<AdapterInner>,
    key: SessionKey,
    mut guard: SessionGuard,
    mut event: MessageEvent,
    cancel: CancellationToken,
    done: CancellationToken,
) {
    // Signals "finished" however the task ends: returned, panicked, aborted.
    let _finished = done.drop_guard();
    loop {
        let source = event.source.clone();
        let message_id = event.message_id;
        inner.note(&source, message_id, EventOutcome::Running);
        let outgoing = handle_unless_cancelled(&inner, &key, &guard, event, &cancel).await;
        guard.mark_finishing();
        // A reply is only sent while this task still owns the slot: once a
        // command swapped its guard, whatever the turn produced is stale.
        let owns = !cancel.is_cancelled() && inner.state().owns(&key, &guard);
        if owns {
            reply_as_owner(&inner, &key, &guard, &source, message_id, outgoing).await;
        } else if !inner.shutting_down() {
            inner.note(&source, message_id, EventOutcome::Dropped("stopped"));
        }
        if cancel.is_cancelled() {
            return;
        }
        match inner.next_or_release(&key, &guard) {
            Some((next, next_guard)) => {
                event = next;
                guard = next_guard;
            }
            None => return,
        }
    }
}

/// Runs the handler on `event` unless `cancel` fires first (then `None`);
/// a handler that panicked answers with the internal-error reply.
async fn handle_unless_cancelled(
    inner: &AdapterInner,
    key: &SessionKey,
    guard: &SessionGuard,
    event: MessageEvent,
    cancel: &CancellationToken,
) -> Option<Outgoing> {
    let ctx = DispatchContext {
        key: key.clone(),
        interrupt: guard.interrupt().clone(),
        slot_busy: false,
        slot_sending: false,
        queue_depth: inner.state().pending_len(key),
        claimed_while_busy: false,
    };
    let handled = AssertUnwindSafe(inner.handler.handle(event, ctx)).catch_unwind();
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        handled = handled => match handled {
            Ok(outgoing) => outgoing,
            Err(_) => {
                tracing::error!(session_key = %key, "message handler panicked");
                Some(internal_error().into())
            }
        },
    }
}

/// Sends the reply of the task that still owns the slot: after the slot's
/// acknowledgement, under the guard's sending stop; says in one line what a
/// stop left unsent, then records the message's outcome.
async fn reply_as_owner(
    inner: &AdapterInner,
    key: &SessionKey,
    guard: &SessionGuard,
    source: &SessionSource,
    message_id: Option<i64>,
    outgoing: Option<Outgoing>,
) {
    // The slot's acknowledgement goes out first (it is already on
    // its way; this only keeps the order).
    let notice = inner.state().last_notice.get(key).cloned();
    if let Some(notice) = notice {
        notice.cancelled().await;
    }
    // /stop, /new or /reset may end the sending (see
    // `SessionGuard::stop_sending`); what it left unsent is said
    // in one line (even though the guard is gone by then) before
    // the message's outcome is recorded.
    let sending = guard.sending().clone();
    let outcome = sending.clone().scope(inner.deliver(source, outgoing)).await;
    sending.finished();
    let unsent = sending.unsent();
    let outcome = outcome_after_stop(outcome, unsent);
    if let Some(line) = unsent_line(unsent) {
        inner
            .send(source, Reply::notice(line).in_reply_to(message_id).into())
            .await;
    }
    inner.note(source, message_id, outcome);
}

/// A delivered message's outcome given what a stop left unsent: a stop
/// that kept back every part of the answer left it unanswered, not
/// answered.
fn outcome_after_stop(outcome: EventOutcome, unsent: Unsent) -> EventOutcome {
    match outcome {
        EventOutcome::Answered if unsent.parts > 0 && unsent.parts == unsent.of_parts => {
            EventOutcome::Dropped("stopped")
        }
        other => other,
    }
}

/// The notifier of one slot's refusals: reports what was refused so far,
/// then waits out the acknowledgement interval and reports what was refused
/// meanwhile, until an interval passes without a refusal. Runs in its own
/// task: nobody routing a message ever waits for it.
pub(super) async fn report_refusals(inner: Arc<AdapterInner>, key: SessionKey) {
    let capacity = inner.config.max_pending;
    loop {
        let taken = {
            let mut state = inner.state();
            match state.refusals.get_mut(&key) {
                Some(refusals) if refusals.count > 0 => Some((
                    std::mem::take(&mut refusals.count),
                    refusals.first.take(),
                    refusals.source.clone(),
                )),
                _ => {
                    state.refusals.remove(&key);
                    shrink_when_sparse(&mut state.refusals);
                    None
                }
            }
        };
        let Some((count, first, source)) = taken else {
            return;
        };
        let sent = CancellationToken::new();
        inner.state().last_notice.insert(key.clone(), sent.clone());
        let sent_guard = sent.drop_guard();
        let next = Instant::now() + inner.config.ack_interval;
        let notice = refusal_notice(capacity, count).in_reply_to(first);
        inner.send(&source, notice.into()).await;
        drop(sent_guard);
        inner.state().forget_sent_notice(&key);
        tokio::time::sleep_until(next).await;
    }
}

/// "N messages were not queued", for `count` refusals of a slot whose
/// queue holds `capacity`.
pub(super) fn refusal_notice(capacity: usize, count: usize) -> Reply {
    Reply::notice(if count == 1 {
        format!(
            "⚠️ {capacity} messages are already waiting, so this one was not queued. \
             Send it again when the current task is done, or /stop it."
        )
    } else {
        format!(
            "⚠️ {capacity} messages are already waiting, so {count} messages were not queued. \
             Send them again when the current task is done, or /stop it."
        )
    })
}

pub(super) fn internal_error() -> Reply {
    Reply::error(format!(
        "⚠️ Something went wrong while handling your message.\n{}",
        crate::vocab::RESET_HINT
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_that_kept_back_every_part_leaves_the_answer_unanswered() {
        let unsent = |parts, of_parts| Unsent {
            parts,
            of_parts,
            files: 0,
        };
        let answered = EventOutcome::Answered;
        assert_eq!(
            outcome_after_stop(answered, unsent(3, 3)),
            EventOutcome::Dropped("stopped")
        );
        assert_eq!(outcome_after_stop(answered, unsent(2, 3)), answered);
        assert_eq!(outcome_after_stop(answered, unsent(0, 0)), answered);
        assert_eq!(
            outcome_after_stop(EventOutcome::Failed, unsent(3, 3)),
            EventOutcome::Failed
        );
    }
}
