//! The adapter alone, around bare handlers (no runner): its shutdown, the
//! claim path, its counts, the outcomes it reports to the ledger, and how
//! its notices (acknowledgements, coalesced refusals) go out and are
//! forgotten. Several tests pause tokio's clock to step through the
//! acknowledgement interval.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::recorder::{eventually, make_event, Recorder};
use telegate::adapter::{AdapterConfig, BusyMode};
use telegate::vocab::{MessageEvent, Platform, SessionSource};

const WAIT: Duration = Duration::from_secs(5);

/// An adapter around a bare handler (no runner): `slow` takes 100 ms to
/// answer, anything else answers at once.
fn adapter_with_slow_handler(
    outbound: Arc<dyn telegate::reply::Outbound>,
    cancel_wait: Duration,
) -> telegate::adapter::Adapter {
    let handler = move |event: MessageEvent, _ctx: telegate::adapter::DispatchContext| {
        Box::pin(async move {
            if event.text == "slow" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(telegate::reply::Reply::answer(format!("done:{}", event.text)).into())
        }) as futures::future::BoxFuture<'static, Option<telegate::reply::Outgoing>>
    };
    telegate::adapter::Adapter::new(telegate::adapter::AdapterParts {
        config: AdapterConfig {
            cancel_wait,
            ..AdapterConfig::default()
        },
        ..telegate::adapter::AdapterParts::new(Arc::new(handler), outbound)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_turn_finish_within_the_grace_and_cancels_none() {
    let recorder = Recorder::new();
    let adapter = adapter_with_slow_handler(recorder.clone(), Duration::from_secs(2));
    adapter.handle_message(make_event("slow", 1)).await;
    assert_eq!(adapter.shutdown(Duration::from_secs(30)).await, 0);
    assert!(
        recorder.any_contains("done:slow"),
        "the turn was cut short although the grace allowed it to finish"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_of_an_idle_adapter_does_not_wait_out_its_grace() {
    let adapter = adapter_with_slow_handler(Recorder::new(), Duration::from_secs(2));
    let cancelled = tokio::time::timeout(WAIT, adapter.shutdown(Duration::from_secs(3600)))
        .await
        .expect("an idle adapter waited for its grace");
    assert_eq!(cancelled, 0);
}

/// An outbound whose delivery never completes: the owner task is stuck
/// where no cancel request reaches it. Says when a delivery started and when
/// its future was dropped.
#[derive(Default)]
struct HangingOutbound {
    started: std::sync::atomic::AtomicBool,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

impl telegate::reply::Outbound for HangingOutbound {
    fn deliver<'a>(
        &'a self,
        _to: &'a SessionSource,
        _reply: telegate::reply::Reply,
    ) -> futures::future::BoxFuture<'a, Result<(), telegate::reply::DeliveryError>> {
        use std::sync::atomic::Ordering;
        struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for SetOnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let on_drop = SetOnDrop(self.dropped.clone());
        self.started.store(true, Ordering::SeqCst);
        Box::pin(async move {
            let _on_drop = on_drop;
            std::future::pending().await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_aborts_a_turn_stuck_where_its_cancel_request_cannot_reach() {
    use std::sync::atomic::Ordering;
    let outbound = Arc::new(HangingOutbound::default());
    let adapter = adapter_with_slow_handler(outbound.clone(), Duration::from_millis(50));
    adapter.handle_message(make_event("hello", 1)).await;
    assert!(eventually(WAIT, || outbound.started.load(Ordering::SeqCst)).await);
    assert_eq!(adapter.shutdown(Duration::ZERO).await, 1);
    assert!(
        eventually(WAIT, || outbound.dropped.load(Ordering::SeqCst)).await,
        "a turn deaf to its cancel request outlived the shutdown"
    );
}

/// A handler that claims a bare "yes" while the slot is busy (as the
/// runner does for an approval answer) and holds "slow" until released.
/// Records each message with whether it came in claimed.
struct ClaimingHandler {
    release: Arc<tokio::sync::Notify>,
    seen: std::sync::Mutex<Vec<(String, bool)>>,
}

impl telegate::adapter::MessageHandler for ClaimingHandler {
    fn handle(
        &self,
        event: MessageEvent,
        ctx: telegate::adapter::DispatchContext,
    ) -> futures::future::BoxFuture<'static, Option<telegate::reply::Outgoing>> {
        self.seen
            .lock()
            .unwrap()
            .push((event.text.clone(), ctx.claimed_while_busy));
        let release = self.release.clone();
        Box::pin(async move {
            if event.text == "slow" {
                release.notified().await;
            }
            Some(telegate::reply::Reply::answer(format!("done:{}", event.text)).into())
        })
    }

    fn claims_while_busy(&self, _key: &telegate::vocab::SessionKey, event: &MessageEvent) -> bool {
        event.text == "yes"
    }
}

/// An adapter in queue mode around a [`ClaimingHandler`].
fn claiming_adapter() -> (
    telegate::adapter::Adapter,
    Arc<ClaimingHandler>,
    Arc<Recorder>,
) {
    claiming_adapter_with(AdapterConfig {
        busy_mode: BusyMode::Queue,
        ..AdapterConfig::default()
    })
}

fn claiming_adapter_with(
    config: AdapterConfig,
) -> (
    telegate::adapter::Adapter,
    Arc<ClaimingHandler>,
    Arc<Recorder>,
) {
    let recorder = Recorder::new();
    let (adapter, handler) = claiming_adapter_around(config, recorder.clone());
    (adapter, handler, recorder)
}

/// A [`ClaimingHandler`]'s adapter delivering through `outbound`.
fn claiming_adapter_around(
    config: AdapterConfig,
    outbound: Arc<dyn telegate::reply::Outbound>,
) -> (telegate::adapter::Adapter, Arc<ClaimingHandler>) {
    let handler = Arc::new(ClaimingHandler {
        release: Arc::new(tokio::sync::Notify::new()),
        seen: std::sync::Mutex::new(Vec::new()),
    });
    let adapter = telegate::adapter::Adapter::new(telegate::adapter::AdapterParts {
        config,
        ..telegate::adapter::AdapterParts::new(handler.clone(), outbound)
    });
    (adapter, handler)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_handler_claims_is_answered_mid_turn_but_never_an_internal_one() {
    let (adapter, handler, recorder) = claiming_adapter();
    adapter.handle_message(make_event("slow", 1)).await;
    assert!(eventually(WAIT, || !handler.seen.lock().unwrap().is_empty()).await);

    // The user's "yes" is claimed: answered while the turn still runs.
    adapter.handle_message(make_event("yes", 1)).await;
    assert!(
        recorder.wait_for_text("done:yes", WAIT).await,
        "a claimed message waited behind the turn"
    );
    assert!(!recorder.any_contains("done:slow"));
    // An internal event with the same text is never claimed: it waits.
    let internal = MessageEvent::internal(SessionSource::dm(Platform::Telegram, 1), "yes");
    adapter.handle_message(internal).await;
    assert_eq!(adapter.pending_total(), 1, "the internal event is queued");

    handler.release.notify_one();
    assert!(
        recorder
            .wait_until(WAIT, |d| d
                .iter()
                .filter(|d| d.reply.text == "done:yes")
                .count()
                == 2)
            .await
    );
    assert_eq!(
        recorder.texts(),
        ["done:yes", "done:slow", "done:yes"],
        "the internal event ran after the turn"
    );
    assert_eq!(
        *handler.seen.lock().unwrap(),
        [
            ("slow".to_string(), false),
            ("yes".to_string(), true),
            ("yes".to_string(), false)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_slots_and_queued_follow_ups_are_counted_and_forgotten_when_idle() {
    // busy_count and pending_total feed telegate_busy_sessions and
    // telegate_queue_depth; map_sizes is what the engine bench watches for
    // leaks.
    let (adapter, handler, recorder) = claiming_adapter();
    assert_eq!((adapter.busy_count(), adapter.pending_total()), (0, 0));
    adapter.handle_message(make_event("slow", 1)).await;
    adapter.handle_message(make_event("slow", 2)).await;
    assert!(eventually(WAIT, || handler.seen.lock().unwrap().len() == 2).await);
    for text in ["a", "b", "c"] {
        adapter.handle_message(make_event(text, 1)).await;
    }
    assert_eq!((adapter.busy_count(), adapter.pending_total()), (2, 3));
    let sizes = adapter.map_sizes();
    assert_eq!(
        (sizes.guards, sizes.owners, sizes.queues, sizes.acks),
        (2, 2, 1, 1),
        "{sizes:?}"
    );
    handler.release.notify_waiters();
    assert!(recorder.wait_for_text("done:c", WAIT).await);
    assert!(
        eventually(WAIT, || adapter.busy_count() == 0
            && adapter.pending_total() == 0)
        .await
    );
    assert!(
        eventually(WAIT, || adapter.map_sizes().is_empty()).await,
        "the adapter's maps kept entries of idle slots: {:?}",
        adapter.map_sizes()
    );
}

/// Records every outcome the adapter reports, by message id.
#[derive(Default)]
struct OutcomeLog(std::sync::Mutex<Vec<(i64, telegate::adapter::EventOutcome)>>);

impl telegate::adapter::OutcomeSink for OutcomeLog {
    fn record(
        &self,
        _source: &SessionSource,
        message_id: i64,
        outcome: telegate::adapter::EventOutcome,
    ) {
        self.0.lock().unwrap().push((message_id, outcome));
    }
}

/// Delivers everything but replies whose text starts with "undeliverable".
struct PickyOutbound(Arc<Recorder>);

impl telegate::reply::Outbound for PickyOutbound {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: telegate::reply::Reply,
    ) -> futures::future::BoxFuture<'a, Result<(), telegate::reply::DeliveryError>> {
        if reply.text.starts_with("undeliverable") {
            return Box::pin(async {
                Err(telegate::reply::DeliveryError::Rejected(
                    "chat not found".into(),
                ))
            });
        }
        self.0.deliver(to, reply)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_is_recorded_answered_failed_or_dropped_as_it_ended() {
    use telegate::adapter::EventOutcome;
    use telegate::reply::Reply;
    let handler = |event: MessageEvent, _ctx: telegate::adapter::DispatchContext| async move {
        match event.text.as_str() {
            "ok" => Some(Reply::answer("fine").into()),
            "error" => Some(Reply::error("⚠️ it broke").into()),
            "undeliverable" => Some(Reply::answer("undeliverable answer").into()),
            _ => None,
        }
    };
    let recorder = Recorder::new();
    let ledger = Arc::new(OutcomeLog::default());
    let adapter = telegate::adapter::Adapter::new(telegate::adapter::AdapterParts {
        outcomes: Some(ledger.clone()),
        ..telegate::adapter::AdapterParts::new(
            Arc::new(handler),
            Arc::new(PickyOutbound(recorder.clone())),
        )
    });
    for (chat, text) in [(1, "ok"), (2, "error"), (3, "undeliverable"), (4, "silent")] {
        let mut event = make_event(text, chat);
        event.message_id = Some(100 + chat);
        adapter.handle_message(event).await;
    }
    assert!(eventually(WAIT, || adapter.is_idle()).await);
    let finals = |id: i64| -> Vec<EventOutcome> {
        ledger
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, o)| *m == id && *o != EventOutcome::Running)
            .map(|(_, o)| *o)
            .collect()
    };
    assert!(
        eventually(WAIT, || (101..=104).all(|id| finals(id).len() == 1)).await,
        "{:?}",
        ledger.0.lock().unwrap()
    );
    assert_eq!(finals(101), [EventOutcome::Answered]);
    assert_eq!(
        finals(102),
        [EventOutcome::Failed],
        "an error reply is a failure"
    );
    assert_eq!(
        finals(103),
        [EventOutcome::Failed],
        "an undelivered answer is a failure"
    );
    assert_eq!(finals(104), [EventOutcome::Dropped("no reply")]);
}

/// Lets every task that can run, run (the clock is paused: nothing else
/// moves it).
async fn run_ready_tasks() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_are_reported_once_per_interval_and_the_notifier_then_goes_quiet() {
    let (adapter, handler, recorder) = claiming_adapter_with(AdapterConfig {
        busy_mode: BusyMode::Queue,
        max_pending: 2,
        ack_interval: Duration::from_secs(2),
        ..AdapterConfig::default()
    });
    let refusals = || -> Vec<String> {
        recorder
            .texts()
            .into_iter()
            .filter(|t| t.contains("not queued"))
            .collect()
    };
    adapter.handle_message(make_event("slow", 1)).await;
    run_ready_tasks().await;
    // Two fit in the queue, three are refused: one notice for the three.
    for i in 0..5 {
        adapter
            .handle_message(make_event(&format!("m{i}"), 1))
            .await;
    }
    run_ready_tasks().await;
    assert_eq!(refusals().len(), 1, "{:?}", recorder.texts());
    assert!(
        refusals()[0].contains("3 messages were not queued"),
        "{:?}",
        refusals()
    );

    // Two more refused within the interval: reported only when it ends.
    for i in 5..7 {
        adapter
            .handle_message(make_event(&format!("m{i}"), 1))
            .await;
    }
    run_ready_tasks().await;
    tokio::time::advance(Duration::from_millis(1500)).await;
    run_ready_tasks().await;
    assert_eq!(refusals().len(), 1, "a second notice within the interval");
    tokio::time::advance(Duration::from_millis(600)).await;
    run_ready_tasks().await;
    assert_eq!(refusals().len(), 2, "{:?}", recorder.texts());
    assert!(
        refusals()[1].contains("2 messages were not queued"),
        "{:?}",
        refusals()
    );

    // Nothing refused since: no more notices, however long it stays busy.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(2)).await;
        run_ready_tasks().await;
    }
    assert_eq!(refusals().len(), 2, "an empty notice: {:?}", refusals());
    handler.release.notify_one();
    run_ready_tasks().await;
}

#[tokio::test(start_paused = true)]
async fn a_notice_that_goes_out_after_the_slot_fell_idle_leaves_no_entry_behind() {
    let (adapter, handler, recorder) = claiming_adapter_with(AdapterConfig {
        busy_mode: BusyMode::Queue,
        max_pending: 1,
        ack_interval: Duration::from_secs(2),
        ..AdapterConfig::default()
    });
    adapter.handle_message(make_event("slow", 1)).await;
    run_ready_tasks().await;
    for text in ["a", "b"] {
        adapter.handle_message(make_event(text, 1)).await;
    }
    run_ready_tasks().await;
    // Refused within the first notice's interval: reported when it ends.
    adapter.handle_message(make_event("c", 1)).await;
    handler.release.notify_one();
    run_ready_tasks().await;
    assert!(recorder.any_contains("done:a"), "{:?}", recorder.texts());
    assert!(adapter.is_idle(), "the slot fell idle before the notice");
    tokio::time::advance(Duration::from_millis(2100)).await;
    run_ready_tasks().await;
    let notices = recorder
        .texts()
        .into_iter()
        .filter(|t| t.contains("not queued"))
        .count();
    assert_eq!(notices, 2, "{:?}", recorder.texts());
    tokio::time::advance(Duration::from_secs(3)).await;
    run_ready_tasks().await;
    assert!(
        adapter.map_sizes().is_empty(),
        "an idle slot kept entries: {:?}",
        adapter.map_sizes()
    );
}

/// Records like [`Recorder`], but holds each reply whose text contains a
/// gate's needle until the gate has a permit: a notice stays "on its way"
/// for as long as the test likes.
struct HoldingOutbound {
    recorder: Arc<Recorder>,
    gates: Vec<(&'static str, Arc<tokio::sync::Semaphore>)>,
}

impl telegate::reply::Outbound for HoldingOutbound {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: telegate::reply::Reply,
    ) -> futures::future::BoxFuture<'a, Result<(), telegate::reply::DeliveryError>> {
        let gate = self
            .gates
            .iter()
            .find(|(needle, _)| reply.text.contains(needle))
            .map(|(_, gate)| gate.clone());
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.acquire().await.expect("gates stay open").forget();
            }
            telegate::reply::Outbound::deliver(&*self.recorder, to, reply).await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_waits_for_the_newest_notice_even_when_an_older_one_lands_meanwhile() {
    // The first "Queued" acknowledgement is held until released; the first
    // refusal notice passes, the second is held.
    let acks = Arc::new(tokio::sync::Semaphore::new(0));
    let refusals = Arc::new(tokio::sync::Semaphore::new(1));
    let recorder = Recorder::new();
    let outbound = Arc::new(HoldingOutbound {
        recorder: recorder.clone(),
        gates: vec![("Queued", acks.clone()), ("not queued", refusals.clone())],
    });
    let (adapter, handler) = claiming_adapter_around(
        AdapterConfig {
            busy_mode: BusyMode::Queue,
            max_pending: 1,
            ack_interval: Duration::from_secs(2),
            ..AdapterConfig::default()
        },
        outbound,
    );
    adapter.handle_message(make_event("slow", 1)).await;
    run_ready_tasks().await;
    // "a" is queued (its acknowledgement held); "b" is refused and told
    // at once; "c" is refused within that notice's interval.
    for text in ["a", "b", "c"] {
        adapter.handle_message(make_event(text, 1)).await;
        run_ready_tasks().await;
    }
    handler.release.notify_one();
    run_ready_tasks().await;
    assert!(recorder.any_contains("done:a"), "{:?}", recorder.texts());
    assert!(adapter.is_idle());
    // The interval ends: the refusal of "c" is reported (and held) while
    // the slot is idle; then the older acknowledgement lands.
    tokio::time::advance(Duration::from_millis(2100)).await;
    run_ready_tasks().await;
    acks.add_permits(1);
    run_ready_tasks().await;
    assert!(recorder.any_contains("Queued"), "{:?}", recorder.texts());
    // A new message: its answer must not overtake the refusal notice that
    // is still on its way.
    adapter.handle_message(make_event("d", 1)).await;
    run_ready_tasks().await;
    assert!(
        !recorder.any_contains("done:d"),
        "the answer overtook a notice still on its way: {:?}",
        recorder.texts()
    );
    refusals.add_permits(1);
    run_ready_tasks().await;
    let texts = recorder.texts();
    let refusal = texts.iter().rposition(|t| t.contains("not queued"));
    let answer = texts.iter().position(|t| t == "done:d");
    assert!(
        matches!((refusal, answer), (Some(r), Some(a)) if r < a),
        "{texts:?}"
    );
}

/// Holds an answer as if it waited in the chat's lane: once the sending is
/// stopped it keeps back all its 2 parts (as delivery does), and tells the
/// test when the answer reached it.
struct LaneOutbound {
    recorder: Arc<Recorder>,
    reached: Arc<tokio::sync::Notify>,
}

impl telegate::reply::Outbound for LaneOutbound {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: telegate::reply::Reply,
    ) -> futures::future::BoxFuture<'a, Result<(), telegate::reply::DeliveryError>> {
        if reply.text != "a long answer" {
            return self.recorder.deliver(to, reply);
        }
        let sending = telegate::reply::SendingStop::current();
        let reached = self.reached.clone();
        Box::pin(async move {
            let sending = sending.expect("an answer is delivered inside its sending");
            reached.notify_one();
            sending.token().cancelled().await;
            sending.note_parts(2, 2);
            Ok(())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_a_stop_kept_back_entirely_is_dropped_as_stopped_not_answered() {
    use telegate::adapter::EventOutcome;
    use telegate::reply::Reply;
    let handler = |event: MessageEvent, _ctx: telegate::adapter::DispatchContext| async move {
        match event.text.as_str() {
            "write" => Some(Reply::answer("a long answer").into()),
            _ => None,
        }
    };
    let recorder = Recorder::new();
    let reached = Arc::new(tokio::sync::Notify::new());
    let ledger = Arc::new(OutcomeLog::default());
    let adapter = telegate::adapter::Adapter::new(telegate::adapter::AdapterParts {
        outcomes: Some(ledger.clone()),
        ..telegate::adapter::AdapterParts::new(
            Arc::new(handler),
            Arc::new(LaneOutbound {
                recorder: recorder.clone(),
                reached: reached.clone(),
            }),
        )
    });
    let mut event = make_event("write", 1);
    event.message_id = Some(7);
    adapter.handle_message(event).await;
    tokio::time::timeout(WAIT, reached.notified())
        .await
        .expect("the answer reached delivery");
    adapter.handle_message(make_event("/stop", 1)).await;
    let finals = || -> Vec<EventOutcome> {
        ledger
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, o)| *m == 7 && *o != EventOutcome::Running)
            .map(|(_, o)| *o)
            .collect()
    };
    assert!(eventually(WAIT, || !finals().is_empty()).await);
    assert_eq!(finals(), [EventOutcome::Dropped("stopped")]);
    assert!(
        eventually(WAIT, || recorder
            .texts()
            .iter()
            .any(|t| t.contains("2 of 2 parts")))
        .await,
        "the sender is told what was kept back: {:?}",
        recorder.texts()
    );
}
