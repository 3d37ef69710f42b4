//! Whole-pipeline throughput: updates from the fake Telegram Bot API, through
//! the real intake (inbox write), adapter, runner and delivery engine, to the
//! reply recorded by the fake server. 500 chats, a no-op agent, the rate
//! limiter's limits raised so the figure measures telegate, not Telegram's
//! flood limits. Also: the rate limiter's own cost per reservation.
//!
//! Alongside the throughput it prints the Bot API calls per update and the
//! whole process's CPU time per update (telegate, the fake Bot API and both
//! sides of their HTTP): on a shared machine the wall-clock figure swings
//! with the other load, the CPU cost much less. The fake serves from a
//! runtime thread of its own and starts with the whole backlog queued (as
//! Telegram holds it), so the CPU is also printed per thread: telegate's
//! runtime and store thread, the fake, the bench's waiter. And the store's
//! cost per turn (from `Store::stats`): calls, commits (group commit shares
//! one commit among the calls queued together) and the store thread's busy
//! time. `PIPELINE_PER_CHAT` (default 4) sets the messages per chat: longer
//! runs weigh the first-contact work of 500 new sessions less, but each
//! turn loads a longer history.
//!
//! After an unmeasured warm-up (one message per chat: the process's first
//! page faults and allocator pages would otherwise weigh on whichever case
//! goes first), it measures two cases: `pipeline/…` with an agent that
//! keeps its conversations itself (the CLI and ACP presets: no history
//! read, the user's message carried by the store's next call),
//! `pipeline_history/…` with one fed the session's history (an
//! OpenAI-compatible backend: one more store call per turn, reading up to
//! `history_max_messages` rows).
//!
//! Then the floor under those figures, in the same process and sitting
//! (`support/bare_bot.rs`): a bare echo bot on the same runtime, Bot API
//! client and fake, recording nothing (`pipeline_floor/…`) and recording
//! each update and its answer (`pipeline_floor_durable/…`), the durable one
//! built on teloxide's update types and dispatcher as telegate is
//! (`pipeline_floor_teloxide/…`), that one keeping telegate's own record
//! through telegate's store with a plain turn's calls and none of the
//! engine (`pipeline_floor_record/…`), and telegate's CPU per update over
//! each recording floor's (`…/cpu_over_durable_floor`,
//! `…/cpu_over_teloxide_floor`, `…/cpu_over_record_floor`): ratios in
//! which the machine's speed of the day cancels out.
//!
//! Prints its figures and the targets (20,000 updates/s end to end on 2
//! cores, 60 µs of telegate's CPU per update, 2 store calls per turn, the
//! store thread under 50% busy at 10,000/s), each also as a `FIGURE` line
//! (`support/figures.rs`); asserts nothing about time (these machines are
//! noisy).

#[path = "support/allocator.rs"]
mod allocator;
#[path = "support/bare_bot.rs"]
mod bare_bot;
#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_bot::FakeBotApi;
use figures::{figure, load_average, process_cpu, us, Better, ThreadCpu};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::delivery::{RateLimiter, RateLimits};
use telegate::engine::AgentSetup;
use telegate::transport::telegram::TelegramBot;

const CHATS: i64 = 500;
/// Messages per chat unless `PIPELINE_PER_CHAT` says otherwise.
const PER_CHAT: usize = 4;
const TARGET_PER_SEC: f64 = 20_000.0;
/// telegate's own CPU per update (runtime + store threads), microseconds.
const TARGET_CPU_US: f64 = 60.0;
/// Store calls per plain turn (inbox write and close, transcript, outbox).
const TARGET_STORE_CALLS: f64 = 2.0;
/// The store thread's busy share at 10,000 updates/s, percent.
const TARGET_STORE_BUSY_AT_10K: f64 = 50.0;

/// Answers at once. `reads_history`: fed the session's history as an
/// OpenAI-compatible backend is, or not, as the CLI and ACP presets (which
/// keep their conversations themselves) are.
struct NoOp {
    reads_history: bool,
}

impl Agent for NoOp {
    fn name(&self) -> &str {
        "noop"
    }
    fn reads_history(&self) -> bool {
        self.reads_history
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move { Ok(AgentReply::new(format!("ok {}", turn.text))) })
    }
}

fn config(fake: &FakeBotApi, data_dir: &Path) -> Config {
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n\n\
         [sessions]\nbusy_mode = \"queue\"\nmax_pending = 1000\n\n\
         [delivery]\nper_chat_interval_ms = 0\ngroup_messages_per_minute = 1000000\n\
         global_messages_per_second = 1000000\n\n[store]\ndata_dir = \"{}\"\n\n[log]\nlevel = \"error\"\n",
        fake.token(),
        fake.url(),
        data_dir.display()
    );
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

/// `per_chat` messages from each chat, queued at `fake` in one go: Telegram
/// already holds the backlog, so the figures are not the fake's cost of
/// building thousands of updates one lock at a time.
fn queue_backlog(fake: &FakeBotApi, per_chat: usize) {
    let backlog: Vec<(i64, i64, String)> = (0..per_chat)
        .flat_map(|round| (1..=CHATS).map(move |chat| (chat, chat, format!("m{round}"))))
        .collect();
    fake.push_texts(&backlog);
}

/// One run: `agent` answers `per_chat` updates from each chat; figures
/// named `{name}/…`, or none when `name` is `None` (the warm-up). Gives
/// telegate's CPU per update in microseconds (none for the warm-up).
async fn pipeline(
    fake: FakeBotApi,
    name: Option<&str>,
    agent: NoOp,
    per_chat: usize,
) -> Option<f64> {
    let data = tempfile::tempdir().expect("tempdir");
    let what = if agent.reads_history {
        "an agent fed the history (OpenAI-compatible)"
    } else {
        "an agent with sessions of its own (the CLI and ACP presets)"
    };
    let bot = TelegramBot::start(
        &config(&fake, data.path()),
        Some(AgentSetup::without_tools(Arc::new(agent))),
    )
    .await
    .expect("bot starts");
    let total = CHATS as usize * per_chat;
    let store_before = bot.store.stats();
    let started = Instant::now();
    let cpu_before = process_cpu();
    let threads_before = ThreadCpu::now();
    queue_backlog(&fake, per_chat);
    let is_answer = |c: &fake_bot::RecordedCall| {
        c.method == "sendMessage"
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.starts_with("ok "))
    };
    // The wait counts the answers incrementally, every millisecond: a
    // scan of every call after each new one (what `wait_for` does) grows
    // with the square of the calls and cost more CPU than telegate itself.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut answered, mut seen, mut unanswered) = (0, 0, Vec::new());
    while answered < total && Instant::now() < deadline {
        let (new, next) = fake.count_answered_calls_since(seen, &mut unanswered, is_answer);
        answered += new;
        seen = next;
        if answered < total {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let done = answered >= total;
    let elapsed = started.elapsed();
    let Some(name) = name else {
        println!(
            "warm-up (not measured): {answered} of {total} answered in {:.2} s",
            elapsed.as_secs_f64()
        );
        bot.shutdown().await;
        return None;
    };
    let cpu = process_cpu().saturating_sub(cpu_before);
    let threads = ThreadCpu::now().since(&threads_before);
    let store = bot.store.stats().since(&store_before);
    let got = fake.count_calls(is_answer);
    // target/<profile>/deps/pipeline-…: `release` for `cargo bench`,
    // `dist` for `cargo bench --profile dist` (what ships).
    let profile = std::env::current_exe()
        .ok()
        .and_then(|exe| {
            Some(
                exe.parent()?
                    .parent()?
                    .file_name()?
                    .to_string_lossy()
                    .into_owned(),
            )
        })
        .unwrap_or_else(|| "?".into());
    println!(
        "{name} [profile {profile}]: {CHATS} chats x {per_chat} messages = {total} updates, {what}"
    );
    println!(
        "  {} answered in {:.2} s: {:.0} updates/s end to end (inbox write, turn, transcript, delivery){}  target >= {TARGET_PER_SEC:.0}",
        got,
        elapsed.as_secs_f64(),
        got as f64 / elapsed.as_secs_f64(),
        if done { "" } else { "  [INCOMPLETE]" }
    );
    let mut methods: Vec<(String, usize)> = Vec::new();
    for call in fake.calls() {
        match methods.iter_mut().find(|(m, _)| *m == call.method) {
            Some((_, n)) => *n += 1,
            None => methods.push((call.method.clone(), 1)),
        }
    }
    let per_update: Vec<String> = methods
        .iter()
        .filter(|(_, n)| *n * 100 >= total)
        .map(|(m, n)| format!("{m} {:.2}", *n as f64 / total as f64))
        .collect();
    println!(
        "  Bot API calls per update: {}; process CPU {:.2} s ({:.0} us per update, the fake \
         and both sides of HTTP included; {:.0}% of 2 cores)",
        per_update.join(", "),
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / total as f64,
        cpu.as_secs_f64() * 100.0 / (2.0 * elapsed.as_secs_f64())
    );
    let per_update = |d: Duration| d.as_secs_f64() * 1e6 / total as f64;
    println!(
        "  CPU per update by thread: telegate {:.0} us (runtime {:.0}, store {:.0}, other {:.0}), \
         fake Bot API {:.0} us, bench waiter {:.0} us; telegate alone on 2 cores: {:.0} updates/s",
        per_update(threads.telegate()),
        per_update(threads.runtime),
        per_update(threads.store),
        per_update(threads.other),
        per_update(threads.fake),
        per_update(threads.waiter),
        2.0 * total as f64 / threads.telegate().as_secs_f64().max(1e-9),
    );
    let turns = got.max(1) as f64;
    println!(
        "  store per turn: {:.1} calls (and {:.1} writes carried by them), {:.2} commits ({:.1} calls per commit), \
         {:.0} us of store-thread time; store thread busy {:.0}% of the run",
        store.calls as f64 / turns,
        store.carried as f64 / turns,
        store.commits as f64 / turns,
        store.calls as f64 / store.commits.max(1) as f64,
        store.busy.as_secs_f64() * 1e6 / turns,
        store.busy.as_secs_f64() * 100.0 / elapsed.as_secs_f64()
    );
    // What the run left on disk beside the database: the WAL's file, which
    // a sustained burst must not grow without bound.
    let wal_mb = std::fs::metadata(data.path().join("telegate.db-wal"))
        .map(|m| m.len() as f64 / 1e6)
        .unwrap_or(0.0);
    println!("  WAL file at the end of the run: {wal_mb:.1} MB");
    let n = total as f64;
    let per = |d: Duration| us(d) / n;
    figure(
        &format!("{name}/telegate_cpu_per_update"),
        per(threads.telegate()),
        "us",
        Better::Lower,
        Some(TARGET_CPU_US),
    );
    figure(
        &format!("{name}/runtime_cpu_per_update"),
        per(threads.runtime),
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/store_cpu_per_update"),
        per(threads.store),
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/fake_cpu_per_update"),
        per(threads.fake),
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/process_cpu_per_update"),
        per(cpu),
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/telegate_alone_updates_per_s"),
        2.0 * n / threads.telegate().as_secs_f64().max(1e-9),
        "1/s",
        Better::Higher,
        Some(TARGET_PER_SEC),
    );
    figure(
        &format!("{name}/store_calls_per_turn"),
        store.calls as f64 / turns,
        "calls",
        Better::Lower,
        Some(TARGET_STORE_CALLS),
    );
    figure(
        &format!("{name}/store_carried_writes_per_turn"),
        store.carried as f64 / turns,
        "writes",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/store_commits_per_turn"),
        store.commits as f64 / turns,
        "commits",
        Better::Lower,
        None,
    );
    // Busy microseconds per turn at 10,000 turns a second, as a share of
    // one second: the same number, read as percent.
    let busy_per_turn = store.busy.as_secs_f64() * 1e6 / turns;
    figure(
        &format!("{name}/store_busy_per_turn"),
        busy_per_turn,
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/store_busy_at_10k_per_s"),
        busy_per_turn,
        "%",
        Better::Lower,
        Some(TARGET_STORE_BUSY_AT_10K),
    );
    figure(
        &format!("{name}/wal_file_at_end"),
        wal_mb,
        "MB",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/updates_per_s_wall"),
        got as f64 / elapsed.as_secs_f64(),
        "1/s",
        Better::Higher,
        Some(TARGET_PER_SEC),
    );
    figure(
        &format!("{name}/load_average"),
        load_average(),
        "load",
        Better::Lower,
        None,
    );
    bot.shutdown().await;
    Some(per(threads.telegate()))
}

/// Which bare bot a floor run measures.
#[derive(Clone, Copy, PartialEq)]
enum Floor {
    /// Answers, records nothing.
    Bare,
    /// Records each update and its answer.
    Durable,
    /// Durable, through teloxide's update types and dispatcher.
    Teloxide,
    /// Through teloxide's dispatcher, keeping telegate's record in
    /// telegate's store (in `dir`).
    TelegateRecord,
}

/// The floor: [`bare_bot`] answering the same backlog as [`pipeline`] on
/// the same runtime, client and fake (`kind` says which bare bot). Figures
/// named `{name}/…`; gives the bare bot's CPU per update in microseconds.
async fn floor(fake: FakeBotApi, name: &str, kind: Floor, per_chat: usize) -> f64 {
    let total = CHATS as usize * per_chat;
    let dir = tempfile::tempdir().expect("tempdir");
    let record = match kind {
        Floor::TelegateRecord => Some(bare_bot::Record::telegate(dir.path()).await),
        Floor::Teloxide => Some(bare_bot::Record::Bare),
        Floor::Bare | Floor::Durable => None,
    };
    queue_backlog(&fake, per_chat);
    let started = Instant::now();
    let threads_before = ThreadCpu::now();
    let (store, kept) = match record {
        Some(record) => (
            None,
            Some(
                tokio::spawn(bare_bot::run_dispatched(
                    fake.url(),
                    fake.token(),
                    total,
                    record,
                ))
                .await
                .expect("the bare bot ran"),
            ),
        ),
        None => (
            tokio::spawn(bare_bot::run(
                fake.url(),
                fake.token(),
                total,
                kind == Floor::Durable,
            ))
            .await
            .expect("the bare bot ran"),
            None,
        ),
    };
    let elapsed = started.elapsed();
    let threads = ThreadCpu::now().since(&threads_before);
    if let Some(store) = store {
        store.finish();
    }
    if let Some(kept) = kept {
        kept.finish().await;
    }
    let per = |d: Duration| us(d) / total as f64;
    println!(
        "{name}: a bare echo bot{}, {total} updates answered in {:.2} s ({:.0} /s end to end); \
         CPU per update: {:.0} us (runtime {:.0}, store {:.0}, other {:.0}), fake Bot API {:.0} us",
        match kind {
            Floor::Bare => "",
            Floor::Durable => " recording each update and answer",
            Floor::Teloxide => " recording each update and answer, through teloxide's dispatcher",
            Floor::TelegateRecord => {
                " keeping telegate's record in telegate's store, through teloxide's dispatcher"
            }
        },
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        per(threads.telegate()),
        per(threads.runtime),
        per(threads.store),
        per(threads.other),
        per(threads.fake),
    );
    let cpu = [
        ("cpu_per_update", threads.telegate()),
        ("runtime_cpu_per_update", threads.runtime),
        ("store_cpu_per_update", threads.store),
    ];
    for (what, spent) in cpu {
        figure(
            &format!("{name}/{what}"),
            per(spent),
            "us",
            Better::Lower,
            None,
        );
    }
    figure(
        &format!("{name}/updates_per_s_wall"),
        total as f64 / elapsed.as_secs_f64(),
        "1/s",
        Better::Higher,
        None,
    );
    per(threads.telegate())
}

/// telegate's CPU per update over a floor's (`which`: `durable`,
/// `teloxide` or `record`), measured in the same process and sitting: the machine's
/// speed of the day cancels out, so this ratio compares across days where
/// the microseconds do not.
fn over_the_floor(telegate: &[(&str, f64)], which: &str, floor: f64) {
    for (name, cpu) in telegate {
        let ratio = cpu / floor.max(1e-9);
        println!(
            "{name}: telegate's CPU per update is {ratio:.2}x the {which} bare bot's \
             ({cpu:.0} vs {floor:.0} us; the target of {TARGET_CPU_US:.0} us is {:.2}x)",
            TARGET_CPU_US / floor.max(1e-9)
        );
        figure(
            &format!("{name}/cpu_over_{which}_floor"),
            ratio,
            "x",
            Better::Lower,
            None,
        );
    }
}

fn rate_limiter_overhead() {
    let mut limiter = RateLimiter::new(RateLimits::default());
    let n = 1_000_000u64;
    let start = std::time::Instant::now();
    let mut now = start;
    for i in 0..n {
        // 500 chats at the default limits, time advancing 40 ms per call
        // (about the global 30/s pace): steady-state bookkeeping.
        now += Duration::from_millis(40);
        std::hint::black_box(limiter.reserve((i % 500) as i64, i % 7 == 0, now));
    }
    let per_call = start.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "rate limiter: {per_call:.0} ns per reservation over {n} reservations across 500 chats"
    );
    figure(
        "pipeline/rate_limiter_per_reservation",
        per_call,
        "ns",
        Better::Lower,
        None,
    );
}

fn main() {
    // As the binary does (the figure is the binary's).
    telegate::memory::tune_allocator();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let fake_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fake-bot-api")
        .enable_all()
        .build()
        .expect("fake runtime");
    // The fake Bot API serves from its own runtime thread, so the CPU it
    // costs (Telegram's side, on another machine in production) is counted
    // apart from telegate's.
    let per_chat = std::env::var("PIPELINE_PER_CHAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PER_CHAT);
    // A first, unmeasured run pays the process's warm-up (page faults, the
    // allocator's first pages, lazily built statics), which otherwise lands
    // on whichever measured run goes first: the two cases measured one
    // after the other then compare like with like.
    let runs = [
        (None, false, 1),
        (Some("pipeline"), false, per_chat),
        (Some("pipeline_history"), true, per_chat),
    ];
    let mut telegate = Vec::new();
    for (name, reads_history, per_chat) in runs {
        let fake = fake_runtime.block_on(FakeBotApi::start());
        let cpu = runtime.block_on(pipeline(fake, name, NoOp { reads_history }, per_chat));
        telegate.extend(name.zip(cpu));
    }
    // The floor under those figures on this machine, this sitting.
    let floors = [
        ("pipeline_floor", Floor::Bare),
        ("pipeline_floor_durable", Floor::Durable),
        ("pipeline_floor_teloxide", Floor::Teloxide),
        ("pipeline_floor_record", Floor::TelegateRecord),
    ];
    for (name, kind) in floors {
        let fake = fake_runtime.block_on(FakeBotApi::start());
        let cpu = runtime.block_on(floor(fake, name, kind, per_chat));
        match kind {
            Floor::Bare => {}
            Floor::Durable => over_the_floor(&telegate, "durable", cpu),
            Floor::Teloxide => over_the_floor(&telegate, "teloxide", cpu),
            Floor::TelegateRecord => over_the_floor(&telegate, "record", cpu),
        }
    }
    rate_limiter_overhead();
}
