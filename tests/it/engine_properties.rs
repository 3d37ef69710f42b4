//! Property test of the whole session engine (real adapter + real runner):
//! thousands of random interleavings of messages, /stop, /new, /reset,
//! wakeups, turn completions, turn panics and failures, and scheduler steps,
//! across several chats and both busy modes.
//!
//! Checked after every step:
//! * no slot is busy without a live owner (no stale lock survives a step);
//! * no turn runs twice, and turns of a slot start in arrival order;
//! * no cancelled (stale) turn ever delivers an answer.
//!
//! Checked at quiescence (every gate opened, everything settled):
//! * every slot is idle, nothing queued, no running agent, no generation
//!   entry left behind;
//! * exact accounting, message by message, from the adapter's outcome
//!   ledger: every accepted message reaches exactly one final outcome, and
//!   that outcome is what the user saw — answered or failed with exactly one
//!   final reply; refused with the queue full, counted exactly by the
//!   coalesced "N messages were not queued" notices; dropped by /new or
//!   /reset, counted exactly by their "N queued messages … dropped" notes;
//!   or cancelled, each by its own later "Stopped" / "stopped" /
//!   "Interrupting" reply in its chat. Wakeups are never refused or dropped
//!   by a new session.

use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use proptest::prelude::*;
use support::recorder::Recorder;
use telegate::adapter::{
    Adapter, AdapterConfig, AdapterParts, BusyMode, EventOutcome, OutcomeSink,
};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::Engine;
use telegate::reply::ReplyKind;
use telegate::runner::{Runner, RunnerConfig, RunnerParts};
use telegate::vocab::{MessageEvent, Platform, SessionSource};
use tokio::sync::oneshot;

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Answer,
    Fail,
    Panic,
}

#[derive(Clone, Debug)]
enum Op {
    Message(u8),
    Wakeup(u8),
    Stop(u8),
    New(u8),
    Reset(u8),
    Complete(u8, Outcome),
    Yield(u8),
}

const CHATS: u8 = 3;

fn op() -> impl Strategy<Value = Op> {
    let chat = 0..CHATS;
    let outcome = prop_oneof![
        6 => Just(Outcome::Answer),
        1 => Just(Outcome::Fail),
        1 => Just(Outcome::Panic),
    ];
    prop_oneof![
        8 => chat.clone().prop_map(Op::Message),
        1 => chat.clone().prop_map(Op::Wakeup),
        2 => chat.clone().prop_map(Op::Stop),
        1 => chat.clone().prop_map(Op::New),
        1 => chat.clone().prop_map(Op::Reset),
        7 => (chat, outcome).prop_map(|(c, o)| Op::Complete(c, o)),
        4 => (1u8..6).prop_map(Op::Yield),
    ]
}

/// What the agent saw, per message id.
#[derive(Default)]
struct Ledger {
    /// Start order of turns: (chat, id).
    started: Vec<(i64, i64)>,
    /// Gates of turns that are waiting for the test to finish them.
    gates: BTreeMap<i64, (i64, oneshot::Sender<Outcome>)>,
    /// Turns that ended without finishing (token or drop).
    cancelled: HashSet<i64>,
    /// Turns the test finished (with any outcome).
    finished: HashSet<i64>,
}

#[derive(Clone, Default)]
struct GatedAgent {
    ledger: Arc<Mutex<Ledger>>,
}

struct MarkCancelled {
    ledger: Arc<Mutex<Ledger>>,
    id: i64,
    armed: bool,
}

impl Drop for MarkCancelled {
    fn drop(&mut self) {
        let mut ledger = self.ledger.lock().unwrap();
        ledger.gates.remove(&self.id);
        if self.armed {
            ledger.cancelled.insert(self.id);
        }
    }
}

impl Agent for GatedAgent {
    fn name(&self) -> &str {
        "gated"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let id: i64 = turn.text[1..].parse().expect("test message ids");
            let (tx, rx) = oneshot::channel();
            {
                let mut ledger = self.ledger.lock().unwrap();
                ledger.started.push((turn.source.chat_id, id));
                ledger.gates.insert(id, (turn.source.chat_id, tx));
            }
            let mut mark = MarkCancelled {
                ledger: self.ledger.clone(),
                id,
                armed: true,
            };
            let outcome = tokio::select! {
                biased;
                _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
                outcome = rx => outcome,
            };
            if turn.cancel.is_cancelled() {
                // Finished, but interrupted first: the runner discards it.
                return Err(AgentError::Cancelled);
            }
            mark.armed = false;
            self.ledger.lock().unwrap().finished.insert(id);
            match outcome {
                Ok(Outcome::Answer) => Ok(AgentReply::new(format!("answer:{id}"))),
                Ok(Outcome::Fail) => Err(AgentError::backend("scripted failure")),
                Ok(Outcome::Panic) => panic!("scripted panic"),
                Err(_) => Err(AgentError::Cancelled),
            }
        })
    }
}

/// Every outcome the adapter reports, per message id, in order.
#[derive(Default)]
struct RecordingLedger {
    outcomes: Mutex<HashMap<i64, Vec<EventOutcome>>>,
}

impl OutcomeSink for RecordingLedger {
    fn record(&self, _source: &SessionSource, message_id: i64, outcome: EventOutcome) {
        self.outcomes
            .lock()
            .unwrap()
            .entry(message_id)
            .or_default()
            .push(outcome);
    }
}

/// The count a notice reports before `marker` ("3 messages were not
/// queued", "2 queued messages from the previous session were dropped"),
/// or 1 for the singular wording.
fn reported_count(text: &str, marker: &str, singular: &str) -> usize {
    if text.contains(singular) {
        return 1;
    }
    let Some(pos) = text.find(marker) else {
        return 0;
    };
    text[..pos]
        .trim_end()
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn source(chat: i64) -> SessionSource {
    SessionSource::dm(Platform::Telegram, chat)
}

struct World {
    engine: Engine,
    agent: GatedAgent,
    sent: Arc<Recorder>,
    ledger: Arc<RecordingLedger>,
    next_id: i64,
    /// Ids of accepted messages and wakeups, per chat, in arrival order.
    accepted: HashMap<i64, Vec<i64>>,
    wakeups: HashSet<i64>,
}

impl World {
    fn new(busy_mode: BusyMode) -> World {
        let agent = GatedAgent::default();
        let sent = Recorder::new();
        let ledger = Arc::new(RecordingLedger::default());
        let runner = Runner::new(RunnerParts {
            config: RunnerConfig {
                stall_timeout: Duration::ZERO,
                ..RunnerConfig::default()
            },
            ..RunnerParts::new(Arc::new(agent.clone()), sent.clone())
        });
        let adapter = Adapter::new(AdapterParts {
            outcomes: Some(ledger.clone() as Arc<dyn OutcomeSink>),
            config: AdapterConfig {
                busy_mode,
                max_pending: 3,
                // Refusals are still coalesced (one notice for every
                // refusal made while the previous notice was on its way),
                // and every one is reported by the time the world is
                // quiet, so the count can be exact.
                ack_interval: Duration::ZERO,
                cancel_wait: Duration::from_millis(50),
                ..AdapterConfig::default()
            },
            ..AdapterParts::new(Arc::new(runner.clone()), sent.clone())
        });
        World {
            engine: Engine { adapter, runner },
            agent,
            sent,
            ledger,
            next_id: 1,
            accepted: HashMap::new(),
            wakeups: HashSet::new(),
        }
    }

    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    async fn apply(&mut self, op: &Op) {
        match *op {
            Op::Message(chat) => {
                let chat = i64::from(chat);
                let id = self.id();
                self.accepted.entry(chat).or_default().push(id);
                let event = MessageEvent::text(source(chat), format!("m{id}")).with_message_id(id);
                self.engine.adapter.handle_message(event).await;
            }
            Op::Wakeup(chat) => {
                let chat = i64::from(chat);
                let id = self.id();
                self.accepted.entry(chat).or_default().push(id);
                self.wakeups.insert(id);
                let event =
                    MessageEvent::internal(source(chat), format!("w{id}")).with_message_id(id);
                self.engine.adapter.handle_message(event).await;
            }
            Op::Stop(chat) | Op::New(chat) | Op::Reset(chat) => {
                let name = match op {
                    Op::Stop(_) => "/stop",
                    Op::New(_) => "/new",
                    _ => "/reset",
                };
                let id = self.id();
                let event = MessageEvent::text(source(i64::from(chat)), name).with_message_id(id);
                self.engine.adapter.handle_message(event).await;
            }
            Op::Complete(chat, outcome) => {
                let gate = {
                    let mut ledger = self.agent.ledger.lock().unwrap();
                    let id = ledger
                        .gates
                        .iter()
                        .find(|(_, (c, _))| *c == i64::from(chat))
                        .map(|(id, _)| *id);
                    id.and_then(|id| ledger.gates.remove(&id))
                };
                if let Some((_, tx)) = gate {
                    let _ = tx.send(outcome);
                }
            }
            Op::Yield(n) => {
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    fn check_step(&self) -> Result<(), TestCaseError> {
        for chat in 0..i64::from(CHATS) {
            let key = self.engine.adapter.session_key(&source(chat));
            prop_assert!(
                !self.engine.adapter.session_task_is_stale(&key),
                "chat {chat} is busy with a finished owner"
            );
            if self.engine.adapter.is_active(&key) {
                prop_assert!(
                    self.engine.adapter.has_owner_task(&key),
                    "chat {chat} busy without owner"
                );
            }
        }
        let ledger = self.agent.ledger.lock().unwrap();
        let mut seen = HashSet::new();
        let mut last_per_chat: HashMap<i64, i64> = HashMap::new();
        for &(chat, id) in &ledger.started {
            prop_assert!(seen.insert(id), "turn {id} started twice");
            if let Some(last) = last_per_chat.insert(chat, id) {
                prop_assert!(last < id, "chat {chat}: turn {id} started after {last}");
            }
        }
        for delivered in self.sent.all() {
            if delivered.reply.kind == ReplyKind::Answer {
                let id = delivered.reply.reply_to.unwrap_or_default();
                prop_assert!(
                    !ledger.cancelled.contains(&id),
                    "cancelled turn {id} answered"
                );
            }
        }
        Ok(())
    }

    async fn quiesce(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            let gates: Vec<_> = {
                let mut ledger = self.agent.ledger.lock().unwrap();
                std::mem::take(&mut ledger.gates).into_values().collect()
            };
            for (_, tx) in gates {
                let _ = tx.send(Outcome::Answer);
            }
            tokio::task::yield_now().await;
            if self.engine.adapter.is_idle() && self.agent.ledger.lock().unwrap().gates.is_empty() {
                break;
            }
        }
        // The coalesced refusal notices come from their own tasks: let
        // them report what is left (the acknowledgement interval is zero).
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        prop_assert!(
            self.engine.adapter.is_idle(),
            "adapter not idle: {:?}",
            self.engine.adapter.map_sizes()
        );
        prop_assert_eq!(self.engine.runner.running_count(), 0);
        prop_assert_eq!(self.engine.runner.generation_entries(), 0);
        self.check_accounting()
    }

    fn check_accounting(&self) -> Result<(), TestCaseError> {
        let agent = self.agent.ledger.lock().unwrap();
        let outcomes = self.ledger.outcomes.lock().unwrap();
        let delivered = self.sent.all();
        let mut finals: HashMap<i64, usize> = HashMap::new();
        // Per chat, in delivery order: what the user was told.
        let mut refusals_reported: HashMap<i64, usize> = HashMap::new();
        let mut drops_reported: HashMap<i64, usize> = HashMap::new();
        // Replies announcing that a running turn was stopped, with the id
        // of the command or interrupting message they answer.
        let mut stop_replies: HashMap<i64, Vec<i64>> = HashMap::new();
        for d in &delivered {
            let text = &d.reply.text;
            if let Some(id) = d.reply.reply_to {
                if matches!(d.reply.kind, ReplyKind::Answer | ReplyKind::Error) {
                    *finals.entry(id).or_default() += 1;
                }
                if text.contains("Stopped")
                    || text.contains("task was stopped")
                    || text.contains("Interrupting the current task")
                {
                    stop_replies.entry(d.chat_id).or_default().push(id);
                }
            }
            *refusals_reported.entry(d.chat_id).or_default() +=
                reported_count(text, " messages were not queued", "this one was not queued");
            *drops_reported.entry(d.chat_id).or_default() += reported_count(
                text,
                " queued messages from the previous session",
                "1 queued message from the previous session was dropped",
            );
        }
        let started: HashSet<i64> = agent.started.iter().map(|&(_, id)| id).collect();
        for (&chat, ids) in &self.accepted {
            let mut refused = 0;
            let mut dropped_by_new = 0;
            let mut cancelled = Vec::new();
            for &id in ids {
                let recorded = outcomes.get(&id).cloned().unwrap_or_default();
                let terminal: Vec<&EventOutcome> = recorded
                    .iter()
                    .filter(|o| !matches!(o, EventOutcome::Running))
                    .collect();
                prop_assert_eq!(
                    terminal.len(),
                    1,
                    "chat {}: message {} has outcomes {:?}",
                    chat,
                    id,
                    recorded
                );
                let answers = finals.get(&id).copied().unwrap_or(0);
                let wakeup = self.wakeups.contains(&id);
                match terminal[0] {
                    EventOutcome::Answered | EventOutcome::Failed => {
                        prop_assert!(started.contains(&id), "message {} answered unstarted", id);
                        prop_assert!(
                            !agent.cancelled.contains(&id),
                            "cancelled turn {} answered",
                            id
                        );
                        prop_assert_eq!(answers, 1, "message {} got {} final replies", id, answers);
                    }
                    EventOutcome::Dropped("queue full") => {
                        prop_assert!(!wakeup, "wakeup {} refused", id);
                        prop_assert!(!started.contains(&id));
                        prop_assert_eq!(answers, 0);
                        refused += 1;
                    }
                    EventOutcome::Dropped("a new session started") => {
                        prop_assert!(!wakeup, "wakeup {} dropped by a new session", id);
                        prop_assert!(!started.contains(&id));
                        prop_assert_eq!(answers, 0);
                        dropped_by_new += 1;
                    }
                    // Cancelled: by a command, or (interrupt mode) by the
                    // next message, while it ran ("no reply": the runner
                    // gave nothing for a turn that was no longer current).
                    EventOutcome::Dropped("stopped") | EventOutcome::Dropped("no reply") => {
                        prop_assert_eq!(answers, 0, "stopped message {} answered", id);
                        cancelled.push(id);
                    }
                    other => {
                        return Err(TestCaseError::fail(format!(
                            "chat {chat}: message {id} ended as {other:?}"
                        )))
                    }
                }
            }
            prop_assert_eq!(
                refusals_reported.get(&chat).copied().unwrap_or(0),
                refused,
                "chat {}: refusals reported vs made",
                chat
            );
            prop_assert_eq!(
                drops_reported.get(&chat).copied().unwrap_or(0),
                dropped_by_new,
                "chat {}: drops reported by /new or /reset vs made",
                chat
            );
            // Each cancelled message has its own later reply saying a
            // running task was stopped (matched in order, one reply each).
            let mut replies = stop_replies.get(&chat).cloned().unwrap_or_default();
            replies.sort_unstable();
            let mut next = 0;
            for id in cancelled {
                while next < replies.len() && replies[next] < id {
                    next += 1;
                }
                prop_assert!(
                    next < replies.len(),
                    "chat {}: message {} was cancelled without a reply saying so (stop replies: {:?})",
                    chat,
                    id,
                    stop_replies.get(&chat)
                );
                next += 1;
            }
        }
        Ok(())
    }
}

fn run_case(busy_mode: BusyMode, ops: &[Op]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut world = World::new(busy_mode);
        for op in ops {
            world.apply(op).await;
            world.check_step()?;
        }
        world.quiesce().await?;
        world.check_step()
    })
}

/// Cases per property: 1,000 in CI; `PROPTEST_CASES` overrides it (the long
/// run in `scripts/proptest-long.sh` uses at least 10,000).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn interrupt_mode_never_sticks_and_never_loses(ops in proptest::collection::vec(op(), 1..60)) {
        run_case(BusyMode::Interrupt, &ops)?;
    }

    #[test]
    fn queue_mode_never_sticks_and_never_loses(ops in proptest::collection::vec(op(), 1..60)) {
        run_case(BusyMode::Queue, &ops)?;
    }
}
