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
use crate::reply::Reply;
use crate::vocab::MessageEvent;
use crate::vocab::SessionKey;
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
        let ctx = DispatchContext {
            key: key.clone(),
            interrupt: guard.interrupt().clone(),
            slot_busy: false,
            slot_sending: false,
            queue_depth: inner.state().pending_len(&key),
            claimed_while_busy: false,
        };
        let handled = AssertUnwindSafe(inner.handler.handle(event, ctx)).catch_unwind();
        let outgoing = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            handled = handled => match handled {
                Ok(outgoing) => outgoing,
                Err(_) => {
                    tracing::error!(session_key = %key, "message handler panicked");
                    Some(internal_error().into())
                }
            },
        };
        guard.mark_finishing();
        // A reply is only sent while this task still owns the slot: once a
        // command swapped its guard, whatever the turn produced is stale.
        let owns = !cancel.is_cancelled() && inner.state().owns(&key, &guard);
        if owns {
            // The slot's acknowledgement goes out first (it is already on
            // its way; this only keeps the order).
            let notice = inner.state().last_notice.get(&key).cloned();
            if let Some(notice) = notice {
                notice.cancelled().await;
            }
            // /stop, /new or /reset may end the sending (see
            // `SessionGuard::stop_sending`); what it left unsent is said
            // in one line (even though the guard is gone by then) before
            // the message's outcome is recorded.
            let sending = guard.sending().clone();
            let outcome = sending
                .clone()
                .scope(inner.deliver(&source, outgoing))
                .await;
            sending.finished();
            let unsent = sending.unsent();
            // A stop that kept back every part of the answer left it
            // unanswered, not answered.
            let outcome = match outcome {
                EventOutcome::Answered if unsent.parts > 0 && unsent.parts == unsent.of_parts => {
                    EventOutcome::Dropped("stopped")
                }
                other => other,
            };
            if let Some(line) = unsent_line(unsent) {
                inner
                    .send(&source, Reply::notice(line).in_reply_to(message_id).into())
                    .await;
            }
            inner.note(&source, message_id, outcome);
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
