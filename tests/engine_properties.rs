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
//! * every accepted message was either answered (exactly once), or its turn
//!   was cancelled by the user (/stop, /new, /reset, an interrupting message),
//!   or it was refused / dropped with a message telling the user so.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use proptest::prelude::*;
use support::recorder::Recorder;
use telegate::adapter::{AdapterConfig, BusyMode};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::Engine;
use telegate::event::{MessageEvent, Platform, SessionSource};
use telegate::reply::ReplyKind;
use telegate::runner::RunnerConfig;
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

fn source(chat: i64) -> SessionSource {
    SessionSource::dm(Platform::Telegram, chat)
}

struct World {
    engine: Engine,
    agent: GatedAgent,
    sent: Arc<Recorder>,
    next_id: i64,
    /// Ids of accepted messages and wakeups, per chat, in arrival order.
    accepted: HashMap<i64, Vec<i64>>,
    wakeups: HashSet<i64>,
    commands: Vec<(i64, i64)>,
    /// Messages sent to a full queue (refusals are reported by one
    /// coalesced notice per acknowledgement interval, not one each).
    refused: HashSet<i64>,
}

impl World {
    fn new(busy_mode: BusyMode) -> World {
        let agent = GatedAgent::default();
        let sent = Recorder::new();
        let engine = Engine::new(
            Arc::new(agent.clone()),
            sent.clone(),
            AdapterConfig {
                busy_mode,
                max_pending: 3,
                ack_interval: Duration::from_secs(3600),
                cancel_wait: Duration::from_millis(50),
                ..AdapterConfig::default()
            },
            RunnerConfig {
                stall_timeout: Duration::ZERO,
                ..RunnerConfig::default()
            },
        );
        World {
            engine,
            agent,
            sent,
            next_id: 1,
            accepted: HashMap::new(),
            wakeups: HashSet::new(),
            commands: Vec::new(),
            refused: HashSet::new(),
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
                let key = self.engine.adapter.session_key(&source(chat));
                let adapter = &self.engine.adapter;
                // Routing happens before the first await: nothing changes
                // the slot between this look and the routing.
                if adapter.is_active(&key)
                    && !adapter.session_task_is_stale(&key)
                    && adapter.pending_len(&key) >= 3
                {
                    self.refused.insert(id);
                }
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
        let delivered = self.sent.all();
        let mut replies: HashMap<i64, Vec<ReplyKind>> = HashMap::new();
        // Per chat: messages /new or /reset said they dropped, and replies
        // saying a running task was stopped (each covers one turn that was
        // cancelled before its agent even started).
        let mut dropped_by_new: HashMap<i64, usize> = HashMap::new();
        let mut stops: HashMap<i64, usize> = HashMap::new();
        for d in &delivered {
            if let Some(id) = d.reply.reply_to {
                replies.entry(id).or_default().push(d.reply.kind);
            }
            if let Some(pos) = d.reply.text.find(" queued message") {
                let count: usize = d.reply.text[..pos]
                    .rsplit(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                *dropped_by_new.entry(d.chat_id).or_default() += count;
            }
            if d.reply.text.contains("Stopped") || d.reply.text.contains("task was stopped") {
                *stops.entry(d.chat_id).or_default() += 1;
            }
        }
        let started: HashSet<i64> = ledger.started.iter().map(|&(_, id)| id).collect();
        // Chats told that messages were not queued.
        let refusal_noticed: HashSet<i64> = delivered
            .iter()
            .filter(|d| d.reply.text.contains("not queued"))
            .map(|d| d.chat_id)
            .collect();
        for (&chat, ids) in &self.accepted {
            let mut unaccounted = Vec::new();
            for &id in ids {
                let kinds = replies.get(&id).cloned().unwrap_or_default();
                let finals = kinds
                    .iter()
                    .filter(|k| matches!(k, ReplyKind::Answer | ReplyKind::Error))
                    .count();
                prop_assert!(
                    finals <= 1,
                    "message {id} in chat {chat} answered {finals} times"
                );
                let refused = (kinds.contains(&ReplyKind::Notice)
                    || (self.refused.contains(&id) && refusal_noticed.contains(&chat)))
                    && !started.contains(&id);
                if ledger.cancelled.contains(&id) {
                    prop_assert_eq!(finals, 0, "cancelled turn {} answered", id);
                } else if started.contains(&id) {
                    prop_assert!(ledger.finished.contains(&id));
                    prop_assert_eq!(finals, 1, "finished turn {} got {} answers", id, finals);
                } else if !refused {
                    unaccounted.push(id);
                }
            }
            // Every message that never ran and got no notice of its own was
            // dropped by a later command in its chat, which said so.
            let wakeups_lost = unaccounted
                .iter()
                .filter(|id| self.wakeups.contains(id))
                .count();
            let drops = dropped_by_new.get(&chat).copied().unwrap_or(0);
            let stopped = stops.get(&chat).copied().unwrap_or(0);
            prop_assert!(
                wakeups_lost <= stopped,
                "chat {chat}: wakeups lost: {unaccounted:?}"
            );
            prop_assert!(
                unaccounted.len() <= drops + stopped,
                "chat {chat}: unreported drops {unaccounted:?} (dropped by /new: {drops}, stops: {stopped})"
            );
            for id in &unaccounted {
                prop_assert!(
                    self.commands.iter().any(|&(c, cmd)| c == chat && cmd > *id),
                    "chat {chat}: message {id} vanished without a later command"
                );
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
