//! Session engine benchmark: the real adapter + runner ([`Engine::new`]) with
//! stub agents and stub transports, measured on the three workloads the
//! Python system we replace was measured on (same machine), so the figures
//! can be put side by side:
//!
//! * **W1 throughput.** 1,000 private chats × 100 messages, sent round-robin
//!   from one task, each `handle_message` awaited before the next, to a no-op
//!   agent that answers "ok" at once. Wall time runs from the first send to
//!   the moment the transport stub recorded the 100,000th *answer*; we also
//!   report the acknowledgements ("⏳ Queued…") it recorded, the allocations
//!   per message and the peak RSS. Busy mode is `queue`: a no-op turn may
//!   still be running when the next message for its chat arrives, and only
//!   queue mode keeps every message as its own answered turn (interrupt mode
//!   would cancel the running turn and discard its answer).
//! * **W2 /stop latency.** 1,000 chats each with a turn that only ends when
//!   its cancellation token fires; once all have started, `/stop` is sent to
//!   each in order. Per chat we record (a) the time from calling
//!   `handle_message` until the transport stub recorded the "Stopped" reply
//!   and (b) the time until `handle_message` returned (the turn cancelled and
//!   awaited, the guard released). We check that every turn saw its
//!   cancellation, no stale answer went out, and every map is empty after.
//!   "Saw its cancellation" is recorded by a drop probe inside the agent's
//!   future: the adapter may drop the turn right after its token fired
//!   instead of letting the agent resume, and both are counted.
//! * **W3 memory.** After a warm-up, one message to each of 10,000 new chats;
//!   once all are idle again, the live heap (from the counting global
//!   allocator below) minus the live heap before, divided by 10,000: what an
//!   idle chat costs to remember. The W3 transport stub only counts replies,
//!   so its storage is not in the figure. VmRSS before/after (each after
//!   `malloc_trim`) is shown too. A diagnostic rerun sends the 10,000
//!   messages one at a time (each answer awaited): its figure is per-session
//!   state alone, and the difference is map capacity kept after the burst
//!   (hash maps do not shrink when their entries are removed).
//!
//! Each workload runs on a fresh engine on a tokio runtime built here, once
//! with `current_thread` and once with a 2-worker `multi_thread` runtime.
//! The headline is `multi_thread`: `telegate run` uses `Runtime::new()`, one
//! worker per core, which is 2 workers on this machine. The workload itself
//! runs as a spawned task, so both flavours run it on a runtime worker.
//!
//! Timing figures are printed with their targets and PASS/MISS, never
//! asserted (the machine is shared and noisy). Correctness checks are
//! printed as ok/FAILED and make the process exit non-zero.
//!
//! Arguments (after `cargo bench --bench engine --`): `w1`, `w2`, `w3`,
//! `ct`, `mt` pick workloads/runtimes; `BENCH_REPS` (default 3) sets the
//! repetitions of W1 and W2 (the median repetition is reported).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "support/figures.rs"]
mod figures;

use figures::{figure, Better};
use futures::future::BoxFuture;
use telegate::adapter::{AdapterConfig, BusyMode};
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::engine::{Engine, EngineParts};
use telegate::reply::{DeliveryError, Outbound, Reply, ReplyKind};
use telegate::vocab::{MessageEvent, Platform, SessionSource};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------
// Counting allocator: live heap bytes and allocation calls, process-wide.
// ---------------------------------------------------------------------------

struct CountingAlloc;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static ALLOC_CALLS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counters are
// plain atomics and never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOC_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc_zeroed(layout);
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOC_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = System.realloc(ptr, layout, new_size);
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
            ALLOC_CALLS.fetch_add(1, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn alloc_calls() -> u64 {
    ALLOC_CALLS.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// Process memory from /proc/self.
// ---------------------------------------------------------------------------

/// A `kB` field of `/proc/self/status`, in bytes.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn vm_hwm() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

fn vm_rss() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

/// Hand freed heap back to the OS (glibc keeps it otherwise), so that RSS
/// readings reflect what is live rather than what earlier workloads freed.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; no pointers change.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Reset VmHWM to the current RSS (Linux `clear_refs` value 5), so each W1
/// run reports its own peak rather than the process's.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

// ---------------------------------------------------------------------------
// Stub agents.
// ---------------------------------------------------------------------------

/// Answers "ok" at once (W1, W3).
struct NoopAgent;

impl Agent for NoopAgent {
    fn name(&self) -> &str {
        "noop"
    }

    fn run(&self, _turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async { Ok(AgentReply::new("ok")) })
    }
}

/// A turn that only cancellation ends (W2). Counts how turns start and end.
struct BlockingAgent {
    expected: usize,
    started: AtomicUsize,
    all_started: Notify,
    /// Turns whose token had fired when they ended (returned or dropped).
    saw_cancel: AtomicUsize,
    /// ... of which the agent itself resumed and returned `Cancelled`.
    returned_cancelled: AtomicUsize,
    /// Turns that ended (were dropped) without their token having fired.
    ended_uncancelled: AtomicUsize,
}

impl BlockingAgent {
    fn new(expected: usize) -> Self {
        BlockingAgent {
            expected,
            started: AtomicUsize::new(0),
            all_started: Notify::new(),
            saw_cancel: AtomicUsize::new(0),
            returned_cancelled: AtomicUsize::new(0),
            ended_uncancelled: AtomicUsize::new(0),
        }
    }
}

/// Lives inside a W2 turn; on drop records whether the turn was cancelled.
struct CancelProbe<'a> {
    agent: &'a BlockingAgent,
    token: CancellationToken,
    returned: bool,
}

impl Drop for CancelProbe<'_> {
    fn drop(&mut self) {
        if self.token.is_cancelled() {
            self.agent.saw_cancel.fetch_add(1, Ordering::Relaxed);
            if self.returned {
                self.agent
                    .returned_cancelled
                    .fetch_add(1, Ordering::Relaxed);
            }
        } else {
            self.agent.ended_uncancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Agent for BlockingAgent {
    fn name(&self) -> &str {
        "blocking"
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let mut probe = CancelProbe {
                agent: self,
                token: turn.cancel.clone(),
                returned: false,
            };
            if self.started.fetch_add(1, Ordering::SeqCst) + 1 == self.expected {
                self.all_started.notify_one();
            }
            turn.cancel.cancelled().await;
            probe.returned = true;
            Err(AgentError::Cancelled)
        })
    }
}

// ---------------------------------------------------------------------------
// Stub transports.
// ---------------------------------------------------------------------------

/// One recorded reply.
struct Delivered {
    chat_id: i64,
    reply: Reply,
    at: Instant,
}

/// Appends every reply, with the time it was delivered, to a `Vec` (W1, W2).
/// Wakes `answered` when the expected number of answers has arrived.
struct RecordingOutbound {
    delivered: Mutex<Vec<Delivered>>,
    answers: AtomicUsize,
    expected_answers: AtomicUsize,
    answered: Notify,
}

impl RecordingOutbound {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(RecordingOutbound {
            delivered: Mutex::new(Vec::with_capacity(capacity)),
            answers: AtomicUsize::new(0),
            expected_answers: AtomicUsize::new(usize::MAX),
            answered: Notify::new(),
        })
    }

    /// Forget what was recorded and wait for `answers` new answers.
    fn reset(&self, answers: usize) {
        self.delivered.lock().unwrap().clear();
        self.answers.store(0, Ordering::SeqCst);
        self.expected_answers.store(answers, Ordering::SeqCst);
    }

    fn take(&self) -> Vec<Delivered> {
        std::mem::take(&mut *self.delivered.lock().unwrap())
    }
}

impl Outbound for RecordingOutbound {
    fn deliver<'a>(
        &'a self,
        to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        let is_answer = reply.kind == ReplyKind::Answer;
        self.delivered.lock().unwrap().push(Delivered {
            chat_id: to.chat_id,
            reply,
            at: Instant::now(),
        });
        if is_answer
            && self.answers.fetch_add(1, Ordering::SeqCst) + 1
                == self.expected_answers.load(Ordering::SeqCst)
        {
            self.answered.notify_one();
        }
        Box::pin(async { Ok(()) })
    }
}

/// Counts replies by kind and stores nothing (W3).
#[derive(Default)]
struct CountingOutbound {
    answers: AtomicUsize,
    others: AtomicUsize,
}

impl Outbound for CountingOutbound {
    fn deliver<'a>(
        &'a self,
        _to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        let counter = match reply.kind {
            ReplyKind::Answer => &self.answers,
            _ => &self.others,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

// ---------------------------------------------------------------------------
// Shared helpers.
// ---------------------------------------------------------------------------

const W1_WARMUP_SESSIONS: i64 = 100;
const W1_SESSIONS: i64 = 1_000;
const W1_ROUNDS: usize = 100;
const W1_FIRST_CHAT: i64 = 100_000;
const W2_SESSIONS: i64 = 1_000;
const W2_FIRST_CHAT: i64 = 200_000;
const W3_WARMUP_SESSIONS: i64 = 100;
const W3_SESSIONS: i64 = 10_000;
const W3_FIRST_CHAT: i64 = 300_000;
const MAX_PENDING: usize = 1_000_000;
const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// W1 target: messages per second.
const TARGET_W1_MSG_S: f64 = 150_000.0;
/// W2 target: p99 of both latencies.
const TARGET_W2_P99: Duration = Duration::from_micros(50);
/// W3 target: heap bytes per idle session.
const TARGET_W3_BYTES: f64 = 100.0;

fn adapter_config() -> AdapterConfig {
    AdapterConfig {
        busy_mode: BusyMode::Queue,
        max_pending: MAX_PENDING,
        ..AdapterConfig::default()
    }
}

fn message(chat_id: i64, text: impl Into<String>) -> MessageEvent {
    MessageEvent::text(SessionSource::dm(Platform::Telegram, chat_id), text)
}

/// True when nothing is left anywhere in the engine.
fn engine_is_empty(engine: &Engine) -> bool {
    engine.adapter.is_idle()
        && engine.adapter.map_sizes().is_empty()
        && engine.runner.running_count() == 0
        && engine.runner.generation_entries() == 0
}

/// Spawned tasks still alive on the current runtime (the workload's own task
/// is one of them).
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Poll `cond` every millisecond until it holds, at most `limit`.
async fn wait_until(limit: Duration, cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Wait until the engine is empty and every owner task has exited.
async fn wait_engine_settled(engine: &Engine) -> bool {
    wait_until(WAIT_LIMIT, || engine_is_empty(engine) && alive_tasks() == 1).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

impl Flavor {
    fn label(self) -> &'static str {
        match self {
            Flavor::CurrentThread => "current_thread",
            Flavor::MultiThread => "multi_thread(2)",
        }
    }
}

/// Run `work` as a task on a fresh runtime of the given flavour.
fn run_on<F>(flavor: Flavor, work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = match flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("build the tokio runtime");
    let task = runtime.spawn(work);
    runtime.block_on(task).expect("the workload task panicked")
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The element at the median position after sorting by `key`.
fn median_by<T: Clone, K: PartialOrd>(items: &[T], key: impl Fn(&T) -> K) -> T {
    let mut sorted: Vec<T> = items.to_vec();
    sorted.sort_by(|a, b| key(a).partial_cmp(&key(b)).unwrap());
    sorted[sorted.len() / 2].clone()
}

/// Correctness checks, printed as they are made.
#[derive(Default)]
struct Checks {
    failed: usize,
}

impl Checks {
    fn check(&mut self, ok: bool, what: impl AsRef<str>) {
        if !ok {
            self.failed += 1;
        }
        println!(
            "    [{}] {}",
            if ok { "ok" } else { "FAILED" },
            what.as_ref()
        );
    }
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

/// 1234567 -> "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
}

// ---------------------------------------------------------------------------
// W1: throughput.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct W1Result {
    /// First send until the last answer was recorded.
    wall: Duration,
    /// First send until the last `handle_message` returned.
    sent_in: Duration,
    answers: usize,
    acks: usize,
    other_replies: usize,
    chats_with_all_answers: usize,
    allocs_per_msg: f64,
    peak_rss: Option<u64>,
    peak_reset: bool,
    settled: bool,
}

impl W1Result {
    fn msg_per_s(&self) -> f64 {
        (W1_SESSIONS as f64 * W1_ROUNDS as f64) / self.wall.as_secs_f64()
    }
}

async fn w1_throughput() -> W1Result {
    let total = W1_SESSIONS as usize * W1_ROUNDS;
    let outbound = RecordingOutbound::new(total + 10 * W1_SESSIONS as usize);
    let engine = Engine::new(EngineParts {
        adapter: adapter_config(),
        ..EngineParts::new(Arc::new(NoopAgent), outbound.clone())
    });

    // Warm-up: other sessions, so the measured ones are all new.
    outbound.reset(W1_WARMUP_SESSIONS as usize);
    for chat in 1..=W1_WARMUP_SESSIONS {
        engine
            .adapter
            .handle_message(message(chat, "warm-up"))
            .await;
    }
    let _ = tokio::time::timeout(WAIT_LIMIT, outbound.answered.notified()).await;
    wait_engine_settled(&engine).await;

    outbound.reset(total);
    trim_heap();
    let peak_reset = reset_peak_rss();
    let allocs_before = alloc_calls();
    let start = Instant::now();
    for k in 0..W1_ROUNDS {
        for s in 0..W1_SESSIONS {
            engine
                .adapter
                .handle_message(message(W1_FIRST_CHAT + s, format!("msg-{k}")))
                .await;
        }
    }
    let sent_in = start.elapsed();
    let _ = tokio::time::timeout(WAIT_LIMIT, outbound.answered.notified()).await;
    let allocs = alloc_calls() - allocs_before;
    let peak_rss = vm_hwm();

    let delivered = outbound.take();
    let mut per_chat: HashMap<i64, usize> = HashMap::new();
    let (mut answers, mut acks, mut other_replies) = (0, 0, 0);
    let mut last_answer = start;
    for d in &delivered {
        match d.reply.kind {
            ReplyKind::Answer => {
                answers += 1;
                last_answer = last_answer.max(d.at);
                *per_chat.entry(d.chat_id).or_default() += 1;
            }
            ReplyKind::Notice => acks += 1,
            _ => other_replies += 1,
        }
    }
    let chats_with_all_answers = (W1_FIRST_CHAT..W1_FIRST_CHAT + W1_SESSIONS)
        .filter(|chat| per_chat.get(chat) == Some(&W1_ROUNDS))
        .count();
    drop(delivered);
    let settled = wait_engine_settled(&engine).await;
    W1Result {
        wall: last_answer - start,
        sent_in,
        answers,
        acks,
        other_replies,
        chats_with_all_answers,
        allocs_per_msg: allocs as f64 / total as f64,
        peak_rss,
        peak_reset,
        settled,
    }
}

fn report_w1(flavor: Flavor, runs: &[W1Result], checks: &mut Checks) -> W1Result {
    println!("  {}", flavor.label());
    println!(
        "    {:>4} {:>10} {:>12} {:>10} {:>7} {:>11} {:>10}",
        "rep", "wall", "msg/s", "sent in", "acks", "allocs/msg", "peak RSS"
    );
    for (i, r) in runs.iter().enumerate() {
        println!(
            "    {:>4} {:>7.1} ms {:>12} {:>7.1} ms {:>7} {:>11.1} {:>10}",
            i + 1,
            r.wall.as_secs_f64() * 1e3,
            thousands(r.msg_per_s() as u64),
            r.sent_in.as_secs_f64() * 1e3,
            r.acks,
            r.allocs_per_msg,
            mib(r.peak_rss),
        );
    }
    let median = median_by(runs, W1Result::msg_per_s);
    let total = W1_SESSIONS as usize * W1_ROUNDS;
    checks.check(
        runs.iter().all(|r| r.answers == total),
        format!(
            "all {} answers arrived in every rep ({})",
            thousands(total as u64),
            runs.iter()
                .map(|r| thousands(r.answers as u64))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    checks.check(
        runs.iter()
            .all(|r| r.chats_with_all_answers == W1_SESSIONS as usize),
        format!("every one of the {W1_SESSIONS} chats got exactly {W1_ROUNDS} answers"),
    );
    checks.check(
        runs.iter().all(|r| r.other_replies == 0),
        "no replies other than answers and acknowledgements",
    );
    checks.check(
        runs.iter().all(|r| r.settled),
        "engine empty afterwards (adapter maps, runner slots, generations)",
    );
    if !median.peak_reset {
        println!("    (note: VmHWM could not be reset; peak RSS is the process's)");
    }
    median
}

// ---------------------------------------------------------------------------
// W2: /stop latency.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct W2Result {
    /// Sorted samples.
    to_reply: Vec<Duration>,
    to_return: Vec<Duration>,
    /// Position (in /stop order) of the slowest return.
    slowest_at: usize,
    stop_replies: usize,
    stop_replies_ok: usize,
    chats_with_one_stop_reply: usize,
    answers: usize,
    other_replies: usize,
    saw_cancel: usize,
    returned_cancelled: usize,
    ended_uncancelled: usize,
    empty_right_after: bool,
    settled: bool,
    settle_time: Duration,
    map_sizes: telegate::adapter::MapSizes,
    running: usize,
}

async fn w2_stop_latency() -> W2Result {
    let n = W2_SESSIONS as usize;
    let agent = Arc::new(BlockingAgent::new(n));
    let outbound = RecordingOutbound::new(2 * n);
    let engine = Engine::new(EngineParts {
        adapter: adapter_config(),
        ..EngineParts::new(agent.clone(), outbound.clone())
    });

    for s in 0..W2_SESSIONS {
        engine
            .adapter
            .handle_message(message(W2_FIRST_CHAT + s, "work until stopped"))
            .await;
    }
    let _ = tokio::time::timeout(WAIT_LIMIT, agent.all_started.notified()).await;

    let mut calls = Vec::with_capacity(n);
    for s in 0..W2_SESSIONS {
        let chat = W2_FIRST_CHAT + s;
        let called = Instant::now();
        engine.adapter.handle_message(message(chat, "/stop")).await;
        calls.push((chat, called, Instant::now()));
    }
    let empty_right_after = engine_is_empty(&engine);
    let settle_start = Instant::now();
    let settled = wait_engine_settled(&engine).await;
    let settle_time = settle_start.elapsed();

    let delivered = outbound.take();
    let mut stop_reply_at: HashMap<i64, Vec<Instant>> = HashMap::new();
    let (mut stop_replies, mut stop_replies_ok, mut answers, mut other_replies) = (0, 0, 0, 0);
    for d in &delivered {
        match d.reply.kind {
            ReplyKind::Command => {
                stop_replies += 1;
                if d.reply.text == "⏹ Stopped." {
                    stop_replies_ok += 1;
                }
                stop_reply_at.entry(d.chat_id).or_default().push(d.at);
            }
            ReplyKind::Answer => answers += 1,
            _ => other_replies += 1,
        }
    }
    let mut to_reply = Vec::with_capacity(n);
    let mut to_return = Vec::with_capacity(n);
    for (chat, called, returned) in &calls {
        to_return.push(*returned - *called);
        if let Some(at) = stop_reply_at.get(chat).and_then(|v| v.first()) {
            to_reply.push(*at - *called);
        }
    }
    let slowest_at = (0..to_return.len())
        .max_by_key(|&i| to_return[i])
        .unwrap_or(0);
    to_reply.sort();
    to_return.sort();
    W2Result {
        to_reply,
        to_return,
        slowest_at,
        stop_replies,
        stop_replies_ok,
        chats_with_one_stop_reply: stop_reply_at.values().filter(|v| v.len() == 1).count(),
        answers,
        other_replies,
        saw_cancel: agent.saw_cancel.load(Ordering::SeqCst),
        returned_cancelled: agent.returned_cancelled.load(Ordering::SeqCst),
        ended_uncancelled: agent.ended_uncancelled.load(Ordering::SeqCst),
        empty_right_after,
        settled,
        settle_time,
        map_sizes: engine.adapter.map_sizes(),
        running: engine.runner.running_count(),
    }
}

fn report_w2(flavor: Flavor, runs: &[W2Result], checks: &mut Checks) -> W2Result {
    println!("  {}", flavor.label());
    println!(
        "    {:>4} | {:>28} | {:>28}",
        "rep", "call -> reply recorded", "call -> handle_message returned"
    );
    println!(
        "    {:>4} | {:>8} {:>9} {:>9} | {:>8} {:>9} {:>9} | slowest: /stop #",
        "", "p50", "p99", "max", "p50", "p99", "max"
    );
    for (i, r) in runs.iter().enumerate() {
        println!(
            "    {:>4} | {:>8} {:>9} {:>9} | {:>8} {:>9} {:>9} | {}",
            i + 1,
            micros(percentile(&r.to_reply, 50.0)),
            micros(percentile(&r.to_reply, 99.0)),
            micros(percentile(&r.to_reply, 100.0)),
            micros(percentile(&r.to_return, 50.0)),
            micros(percentile(&r.to_return, 99.0)),
            micros(percentile(&r.to_return, 100.0)),
            r.slowest_at + 1,
        );
    }
    let median = median_by(runs, |r| percentile(&r.to_return, 99.0));
    let n = W2_SESSIONS as usize;
    for (i, r) in runs.iter().enumerate() {
        let rep = i + 1;
        checks.check(
            r.stop_replies == n && r.stop_replies_ok == n && r.chats_with_one_stop_reply == n,
            format!(
                "rep {rep}: {} /stop replies, {} read \"⏹ Stopped.\", {} chats got exactly one",
                r.stop_replies, r.stop_replies_ok, r.chats_with_one_stop_reply
            ),
        );
        checks.check(
            r.saw_cancel == n && r.ended_uncancelled == 0,
            format!(
                "rep {rep}: {} turns cancelled ({} resumed and returned Cancelled, {} were \
                 dropped by the adapter after their token fired), {} ended uncancelled",
                r.saw_cancel,
                r.returned_cancelled,
                r.saw_cancel - r.returned_cancelled,
                r.ended_uncancelled
            ),
        );
        checks.check(
            r.answers == 0 && r.other_replies == 0,
            format!(
                "rep {rep}: no stale answer ({} answers, {} other replies)",
                r.answers, r.other_replies
            ),
        );
        checks.check(
            r.settled && r.map_sizes.is_empty() && r.running == 0,
            format!(
                "rep {rep}: all maps empty afterwards: adapter {:?}, runner running {} \
                 (empty right after the last /stop returned: {}; settled after {:.1} ms)",
                r.map_sizes,
                r.running,
                r.empty_right_after,
                r.settle_time.as_secs_f64() * 1e3
            ),
        );
    }
    median
}

// ---------------------------------------------------------------------------
// W3: memory per idle session.
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct W3Result {
    /// Most slots busy at once during the burst (sampled after each send).
    peak_busy: usize,
    live_before: i64,
    live_after: i64,
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    answers: usize,
    other_replies: usize,
    settled: bool,
}

impl W3Result {
    fn heap_per_session(&self) -> f64 {
        (self.live_after - self.live_before) as f64 / W3_SESSIONS as f64
    }

    fn rss_per_session(&self) -> Option<f64> {
        let (before, after) = (self.rss_before?, self.rss_after?);
        Some((after as f64 - before as f64) / W3_SESSIONS as f64)
    }
}

/// W3. With `one_at_a_time` (a diagnostic, not the target figure) each
/// session's answer is awaited before the next message is sent, so at most
/// one slot is busy at a time: what remains then is per-session state alone,
/// without the capacity the maps kept from holding 10,000 busy slots at once.
async fn w3_memory(one_at_a_time: bool) -> W3Result {
    let outbound = Arc::new(CountingOutbound::default());
    let engine = Engine::new(EngineParts {
        adapter: adapter_config(),
        ..EngineParts::new(Arc::new(NoopAgent), outbound.clone())
    });
    let answered = |n: usize| {
        let outbound = outbound.clone();
        move || outbound.answers.load(Ordering::SeqCst) >= n
    };

    for chat in 1..=W3_WARMUP_SESSIONS {
        engine
            .adapter
            .handle_message(message(chat, "warm-up"))
            .await;
    }
    wait_until(WAIT_LIMIT, answered(W3_WARMUP_SESSIONS as usize)).await;
    wait_engine_settled(&engine).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let live_before = live_bytes();
    trim_heap();
    let rss_before = vm_rss();

    let mut peak_busy = 0;
    for s in 0..W3_SESSIONS {
        engine
            .adapter
            .handle_message(message(W3_FIRST_CHAT + s, "hello"))
            .await;
        // Sampled sparsely: locking the adapter after every send would slow
        // the sender and so change how many slots are busy at once.
        if s % 64 == 63 {
            peak_busy = peak_busy.max(engine.adapter.busy_count());
        }
        if one_at_a_time {
            let done = answered((W3_WARMUP_SESSIONS + s + 1) as usize);
            while !done() {
                tokio::task::yield_now().await;
            }
        }
    }
    wait_until(
        WAIT_LIMIT,
        answered((W3_WARMUP_SESSIONS + W3_SESSIONS) as usize),
    )
    .await;
    let settled = wait_engine_settled(&engine).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let live_after = live_bytes();
    trim_heap();
    let rss_after = vm_rss();
    W3Result {
        peak_busy,
        live_before,
        live_after,
        rss_before,
        rss_after,
        answers: outbound.answers.load(Ordering::SeqCst) - W3_WARMUP_SESSIONS as usize,
        other_replies: outbound.others.load(Ordering::SeqCst),
        settled,
    }
}

fn report_w3(flavor: Flavor, r: &W3Result, serial: &W3Result, checks: &mut Checks) {
    println!("  {}", flavor.label());
    println!(
        "    live heap {} -> {} bytes: {:+} bytes = {:.1} B per idle session \
         (~{} slots were busy at once, sampled)",
        thousands(r.live_before.max(0) as u64),
        thousands(r.live_after.max(0) as u64),
        r.live_after - r.live_before,
        r.heap_per_session(),
        thousands(r.peak_busy as u64),
    );
    println!(
        "    VmRSS (after malloc_trim) {} -> {}: {} per session",
        mib(r.rss_before),
        mib(r.rss_after),
        r.rss_per_session()
            .map_or("n/a".into(), |b| format!("{b:.0} B"))
    );
    checks.check(
        r.answers == W3_SESSIONS as usize && r.other_replies == 0,
        format!(
            "{} answers for {} sessions, {} other replies",
            thousands(r.answers as u64),
            thousands(W3_SESSIONS as u64),
            r.other_replies
        ),
    );
    checks.check(r.settled, "every session idle and every map empty");
    println!(
        "    diagnostic, one session at a time (~{} busy at once): {:+} bytes = {:.1} B \
         per idle session;\n    so ~{:.0} B/session of the figure above is capacity kept \
         after the burst, not per-session state",
        serial.peak_busy,
        serial.live_after - serial.live_before,
        serial.heap_per_session(),
        r.heap_per_session() - serial.heap_per_session()
    );
    checks.check(
        serial.answers == W3_SESSIONS as usize && serial.other_replies == 0 && serial.settled,
        "diagnostic run: every answer arrived, every session idle, every map empty",
    );
}

// ---------------------------------------------------------------------------
// Driver.
// ---------------------------------------------------------------------------

struct FlavorSummary {
    flavor: Flavor,
    w1: Option<W1Result>,
    w2: Option<W2Result>,
    w3: Option<W3Result>,
}

fn main() {
    // `cargo bench` passes `--bench`; anything else is a filter word.
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let picked = |word: &str, group: &[&str]| {
        words.iter().any(|w| w == word) || !words.iter().any(|w| group.contains(&w.as_str()))
    };
    let workloads = ["w1", "w2", "w3"];
    let flavors = ["ct", "mt"];
    let reps: usize = std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    let bench_start = Instant::now();

    println!("telegate session engine benchmark (benches/engine.rs)");
    println!(
        "  {} CPUs (shared), release profile, real adapter + runner via Engine::new; \
         W1/W2 repetitions: {reps} (median shown in the summary)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "  adapter: busy_mode=queue, max_pending={}, other settings default; runner: default \
         (stall watchdog 300 s, so every turn arms a timer)",
        thousands(MAX_PENDING as u64)
    );
    println!(
        "  queue mode because a no-op turn may still be running when its chat's next message \
         arrives;\n  queue keeps every message its own answered turn (interrupt would cancel it \
         and drop its answer)."
    );

    let mut checks = Checks::default();
    let mut summaries = Vec::new();
    for (flavor, word) in [(Flavor::CurrentThread, "ct"), (Flavor::MultiThread, "mt")] {
        if !picked(word, &flavors) {
            continue;
        }
        let mut summary = FlavorSummary {
            flavor,
            w1: None,
            w2: None,
            w3: None,
        };
        println!("\n=== runtime: {} ===", flavor.label());
        if picked("w1", &workloads) {
            println!(
                "W1 throughput: {} sessions x {} messages round-robin, one sender, no-op agent",
                thousands(W1_SESSIONS as u64),
                W1_ROUNDS
            );
            let runs: Vec<W1Result> = (0..reps).map(|_| run_on(flavor, w1_throughput())).collect();
            summary.w1 = Some(report_w1(flavor, &runs, &mut checks));
        }
        if picked("w2", &workloads) {
            println!(
                "W2 /stop latency: {} sessions with a turn blocked until cancelled, /stop to each in order",
                thousands(W2_SESSIONS as u64)
            );
            let runs: Vec<W2Result> = (0..reps)
                .map(|_| run_on(flavor, w2_stop_latency()))
                .collect();
            summary.w2 = Some(report_w2(flavor, &runs, &mut checks));
        }
        if picked("w3", &workloads) {
            println!(
                "W3 memory: one message to each of {} new sessions, measured once all are idle",
                thousands(W3_SESSIONS as u64)
            );
            let r = run_on(flavor, w3_memory(false));
            let serial = run_on(flavor, w3_memory(true));
            report_w3(flavor, &r, &serial, &mut checks);
            summary.w3 = Some(r);
        }
        summaries.push(summary);
    }

    print_summary(&summaries);
    println!(
        "\ncorrectness checks: {}; total bench time {:.1} s",
        if checks.failed == 0 {
            "all ok".to_string()
        } else {
            format!("{} FAILED", checks.failed)
        },
        bench_start.elapsed().as_secs_f64()
    );
    if checks.failed > 0 {
        std::process::exit(1);
    }
}

fn print_summary(summaries: &[FlavorSummary]) {
    println!("\n=== summary (headline runtime: multi_thread(2), what `telegate run` uses) ===");
    let mut header = format!("  {:<32} {:>10} {:>11}", "figure", "python", "target");
    for s in summaries {
        let star = if s.flavor == Flavor::MultiThread {
            "*"
        } else {
            ""
        };
        header.push_str(&format!(" {:>22}", format!("{}{star}", s.flavor.label())));
    }
    println!("{header}");

    type Cell = Box<dyn Fn(&FlavorSummary) -> Option<(String, bool)>>;
    let rows: Vec<(&str, &str, &str, Cell)> = vec![
        (
            "W1 messages/s (median rep)",
            "2,880",
            ">= 150,000",
            Box::new(|s| {
                let r = s.w1.as_ref()?;
                let v = r.msg_per_s();
                Some((thousands(v as u64), v >= TARGET_W1_MSG_S))
            }),
        ),
        (
            "W1 peak RSS",
            "-",
            "-",
            Box::new(|s| Some((mib(s.w1.as_ref()?.peak_rss), true))),
        ),
        (
            "W2 call -> reply p50",
            "165 µs",
            "-",
            Box::new(|s| {
                let r = s.w2.as_ref()?;
                Some((micros(percentile(&r.to_reply, 50.0)), true))
            }),
        ),
        (
            "W2 call -> reply p99",
            "450 µs",
            "< 50 µs",
            Box::new(|s| {
                let r = s.w2.as_ref()?;
                let v = percentile(&r.to_reply, 99.0);
                Some((micros(v), v < TARGET_W2_P99))
            }),
        ),
        (
            "W2 call -> return p50",
            "-",
            "-",
            Box::new(|s| {
                let r = s.w2.as_ref()?;
                Some((micros(percentile(&r.to_return, 50.0)), true))
            }),
        ),
        (
            "W2 call -> return p99",
            "-",
            "< 50 µs",
            Box::new(|s| {
                let r = s.w2.as_ref()?;
                let v = percentile(&r.to_return, 99.0);
                Some((micros(v), v < TARGET_W2_P99))
            }),
        ),
        (
            "W2 max (reply / return)",
            "-",
            "-",
            Box::new(|s| {
                let r = s.w2.as_ref()?;
                Some((
                    format!(
                        "{:.0}/{:.0} µs",
                        percentile(&r.to_reply, 100.0).as_secs_f64() * 1e6,
                        percentile(&r.to_return, 100.0).as_secs_f64() * 1e6
                    ),
                    true,
                ))
            }),
        ),
        (
            "W3 heap bytes per idle session",
            "~100",
            "<= 100",
            Box::new(|s| {
                let r = s.w3.as_ref()?;
                let v = r.heap_per_session();
                Some((format!("{v:.1} B"), v < TARGET_W3_BYTES))
            }),
        ),
        (
            "W3 RSS delta per session",
            "-",
            "-",
            Box::new(|s| {
                let v = s.w3.as_ref()?.rss_per_session()?;
                Some((format!("{v:.0} B"), true))
            }),
        ),
    ];
    for (name, python, target, cell) in &rows {
        let mut line = format!("  {name:<32} {python:>10} {target:>11}");
        for s in summaries {
            let text = match cell(s) {
                Some((value, pass)) if *target != "-" => format!("{value} {}", verdict(pass)),
                Some((value, _)) => value,
                None => "-".to_string(),
            };
            line.push_str(&format!(" {text:>22}"));
        }
        println!("{line}");
    }
    println!("  (* headline; PASS/MISS compares against the target, timing is never asserted)");
    for s in summaries {
        let flavor = match s.flavor {
            Flavor::CurrentThread => "ct",
            Flavor::MultiThread => "mt",
        };
        let name = |n: &str| format!("engine/{flavor}/{n}");
        if let Some(r) = &s.w1 {
            figure(
                &name("w1_msg_per_s"),
                r.msg_per_s(),
                "1/s",
                Better::Higher,
                Some(TARGET_W1_MSG_S),
            );
        }
        if let Some(r) = &s.w2 {
            let p99 = |v: &[Duration]| percentile(v, 99.0).as_secs_f64() * 1e6;
            let target = Some(TARGET_W2_P99.as_secs_f64() * 1e6);
            figure(
                &name("w2_reply_p99"),
                p99(&r.to_reply),
                "us",
                Better::Lower,
                target,
            );
            figure(
                &name("w2_return_p99"),
                p99(&r.to_return),
                "us",
                Better::Lower,
                target,
            );
        }
        if let Some(r) = &s.w3 {
            figure(
                &name("w3_heap_per_session"),
                r.heap_per_session(),
                "B",
                Better::Lower,
                Some(TARGET_W3_BYTES),
            );
        }
    }
}
