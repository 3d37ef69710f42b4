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
//! * exact accounting, no slack: every message has exactly one final
//!   outcome in the adapter's ledger, and that outcome is visible to the
//!   user in exactly one way: answered once (answer or error), or refused
//!   with its own notice, or dropped by a later /new or /reset whose reply
//!   counts it, or cut short by a later command whose reply says it stopped
//!   a task (one such reply per cut-short message, per chat), or (interrupt
//!   mode only) interrupted by a later message of the same chat. Every
//!   command gets exactly one reply.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use proptest::prelude::*;
use support::recorder::Recorder;
use telegate::adapter::{Adapter, AdapterConfig, BusyMode, EventLedger, EventOutcome};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::Engine;
use telegate::event::{MessageEvent, Platform, SessionSource};
use telegate::reply::ReplyKind;
use telegate::runner::{Runner, RunnerConfig};
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

/// Every outcome the adapter reported, per message id, in order.
#[derive(Default)]
struct Outcomes(Mutex<HashMap<i64, Vec<EventOutcome>>>);

impl EventLedger for Outcomes {
    fn record(&self, _source: &SessionSource, message_id: i64, outcome: EventOutcome) {
        self.0
            .lock()
            .unwrap()
            .entry(message_id)
            .or_default()
            .push(outcome);
    }
}

fn source(chat: i64) -> SessionSource {
    SessionSource::dm(Platform::Telegram, chat)
}

struct World {
    engine: Engine,
    busy_mode: BusyMode,
    outcomes: Arc<Outcomes>,
    agent: GatedAgent,
    sent: Arc<Recorder>,
    next_id: i64,
    /// Ids of accepted messages and wakeups, per chat, in arrival order.
    accepted: HashMap<i64, Vec<i64>>,
    wakeups: HashSet<i64>,
    commands: Vec<(i64, i64)>,
}

impl World {
    fn new(busy_mode: BusyMode) -> World {
        let agent = GatedAgent::default();
        let sent = Recorder::new();
        let outcomes = Arc::new(Outcomes::default());
        let runner = Runner::new(
            Arc::new(agent.clone()),
            sent.clone(),
            RunnerConfig {
                stall_timeout: Duration::ZERO,
                ..RunnerConfig::default()
            },
        );
        let adapter = Adapter::with_ledger(
            Arc::new(runner.clone()),
            sent.clone(),
            AdapterConfig {
                busy_mode,
                max_pending: 3,
                ack_interval: Duration::from_secs(3600),
                cancel_wait: Duration::from_millis(50),
                ..AdapterConfig::default()
            },
            Some(outcomes.clone()),
        );
        let engine = Engine { adapter, runner };
        World {
            engine,
            busy_mode,
            outcomes,
            agent,
            sent,
            next_id: 1,
            accepted: HashMap::new(),
            wakeups: HashSet::new(),
            commands: Vec::new(),
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
                self.commands.push((i64::from(chat), id));
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
        let ledger = self.agent.ledger.lock().unwrap();
        let outcomes = self.outcomes.0.lock().unwrap();
        let delivered = self.sent.all();
        let mut replies: HashMap<i64, Vec<(ReplyKind, String)>> = HashMap::new();
        for d in &delivered {
            if let Some(id) = d.reply.reply_to {
                replies
                    .entry(id)
                    .or_default()
                    .push((d.reply.kind, d.reply.text.clone()));
            }
        }
        // What the commands told each chat: how many queued messages /new
        // or /reset dropped, and how many replies said a task was stopped.
        let mut reported_dropped: HashMap<i64, usize> = HashMap::new();
        let mut reported_stopped: HashMap<i64, usize> = HashMap::new();
        for &(chat, id) in &self.commands {
            let got = replies.get(&id).cloned().unwrap_or_default();
            prop_assert_eq!(got.len(), 1, "command {} got replies {:?}", id, got);
            prop_assert_eq!(got[0].0, ReplyKind::Command);
            let text = &got[0].1;
            if let Some(pos) = text.find(" queued message") {
                let count: usize = text[..pos]
                    .rsplit(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                prop_assert!(count > 0, "unparsable drop note: {}", text);
                *reported_dropped.entry(chat).or_default() += count;
            }
            if text.contains("⏹ Stopped") || text.contains("task was stopped") {
                *reported_stopped.entry(chat).or_default() += 1;
            }
            let finals: Vec<EventOutcome> = outcomes
                .get(&id)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|o| *o != EventOutcome::Running)
                .collect();
            prop_assert_eq!(
                finals,
                vec![EventOutcome::Answered],
                "command {} outcomes",
                id
            );
        }
        let started: HashSet<i64> = ledger.started.iter().map(|&(_, id)| id).collect();
        let mut dropped: HashMap<i64, usize> = HashMap::new();
        let mut stopped: HashMap<i64, usize> = HashMap::new();
        for (&chat, ids) in &self.accepted {
            for &id in ids {
                let recorded = outcomes.get(&id).cloned().unwrap_or_default();
                let finals: Vec<_> = recorded
                    .iter()
                    .filter(|o| **o != EventOutcome::Running)
                    .collect();
                prop_assert_eq!(
                    finals.len(),
                    1,
                    "message {} in chat {}: outcomes {:?}",
                    id,
                    chat,
                    recorded
                );
                let got = replies.get(&id).cloned().unwrap_or_default();
                let answers: Vec<_> = got
                    .iter()
                    .filter(|(k, _)| matches!(k, ReplyKind::Answer | ReplyKind::Error))
                    .collect();
                let wakeup = self.wakeups.contains(&id);
                let later_command = self.commands.iter().any(|&(c, cmd)| c == chat && cmd > id);
                match *finals[0] {
                    EventOutcome::Answered => {
                        prop_assert_eq!(answers.len(), 1, "message {} replies {:?}", id, got);
                        prop_assert_eq!(answers[0].0, ReplyKind::Answer);
                        prop_assert_eq!(&answers[0].1, &format!("answer:{id}"));
                        prop_assert!(ledger.finished.contains(&id));
                        prop_assert!(!ledger.cancelled.contains(&id));
                    }
                    EventOutcome::Failed => {
                        prop_assert_eq!(answers.len(), 1, "message {} replies {:?}", id, got);
                        prop_assert_eq!(answers[0].0, ReplyKind::Error);
                        prop_assert!(ledger.finished.contains(&id));
                    }
                    EventOutcome::Dropped("queue full") => {
                        prop_assert!(!wakeup, "wakeup {} refused", id);
                        prop_assert!(!started.contains(&id));
                        prop_assert!(answers.is_empty());
                        prop_assert!(
                            got.iter()
                                .any(|(k, t)| *k == ReplyKind::Notice && t.contains("not queued")),
                            "message {} refused without a notice: {:?}",
                            id,
                            got
                        );
                    }
                    EventOutcome::Dropped("a new session started") => {
                        prop_assert!(!wakeup, "wakeup {} dropped by /new", id);
                        prop_assert!(!started.contains(&id));
                        prop_assert!(answers.is_empty());
                        prop_assert!(later_command);
                        *dropped.entry(chat).or_default() += 1;
                    }
                    EventOutcome::Dropped("stopped") => {
                        prop_assert!(answers.is_empty(), "stopped {} answered", id);
                        prop_assert!(later_command, "message {} stopped without a command", id);
                        *stopped.entry(chat).or_default() += 1;
                    }
                    EventOutcome::Dropped("no reply") => {
                        // Interrupted by a later message of the same chat.
                        prop_assert_eq!(self.busy_mode, BusyMode::Interrupt);
                        prop_assert!(answers.is_empty());
                        prop_assert!(
                            !ledger.finished.contains(&id) || ledger.cancelled.contains(&id)
                        );
                        prop_assert!(
                            ids.iter()
                                .any(|&later| later > id && !self.wakeups.contains(&later)),
                            "message {} got no reply and nothing interrupted it",
                            id
                        );
                    }
                    other => {
                        prop_assert!(false, "message {} ended as {:?}", id, other);
                    }
                }
            }
        }
        for chat in 0..i64::from(CHATS) {
            let get = |m: &HashMap<i64, usize>| m.get(&chat).copied().unwrap_or(0);
            prop_assert_eq!(
                get(&dropped),
                get(&reported_dropped),
                "chat {}: messages dropped by /new vs. reported",
                chat
            );
            prop_assert_eq!(
                get(&stopped),
                get(&reported_stopped),
                "chat {}: turns cut short vs. replies saying so",
                chat
            );
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
