//! Every spend is reserved before it runs, and decided before anything
//! changes (issue 57): on the engine with the real openai backend against
//! the fake LLM (which reports usage only when asked, as OpenAI does).
//!
//! * a scheduled prompt is its creator's turn: refused over budget (told
//!   in the chat, nothing sent to the model, nothing charged), and no
//!   prompt job is made over budget;
//! * the budget day is the bot's: a chat's `/timezone` does not move it;
//! * turns started together are booked against each other;
//! * a turn without usage (stopped mid-stream, no usage asked) is charged
//!   an estimate;
//! * a refused `/retry` leaves the history as it was.
//!
//! Waits are on what the recorder and the fakes saw, never on timing.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use support::fake_openai::{last_user_contains, FakeOpenAi, Gate, Script};
use support::recorder::{eventually, Recorder};
use telegate::agent::{OpenAiAgent, OpenAiConfig};
use telegate::clock::Clock;
use telegate::engine::{Engine, EngineParts};
use telegate::limits::{Limits, LimitsConfig};
use telegate::metrics::Metrics;
use telegate::runner::RunnerConfig;
use telegate::schedule::{Jobs, ScheduleConfig, SystemClock};
use telegate::store::Store;
use telegate::vocab::{ChatType, MessageEvent, Platform, SessionSource};

const WAIT: Duration = Duration::from_secs(10);
const USER: u64 = 42;

fn ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

struct Bench {
    llm: FakeOpenAi,
    store: Store,
    sent: Arc<Recorder>,
    engine: Engine,
    clock: Clock,
}

/// The engine with `limits`, the budget clock at `now`, the bot's zone
/// UTC, scheduling on; `stream_usage`: whether the backend asks for usage.
async fn bench(limits: &str, now: &str, stream_usage: bool) -> Bench {
    let llm = FakeOpenAi::start().await;
    let store = Store::open_in_memory().unwrap();
    let sent = Recorder::new();
    let clock = Clock::manual(ms(now));
    let mut openai = OpenAiConfig::new(llm.base_url(), "fake");
    openai.stream_usage = stream_usage;
    let agent = OpenAiAgent::new(openai, None, Arc::new(telegate::tools::NoTools)).unwrap();
    let jobs = Jobs::new(
        store.jobs(),
        ScheduleConfig {
            timezone: Some("UTC".into()),
            ..ScheduleConfig::default()
        },
        Arc::new(SystemClock),
        Metrics::new(),
    )
    .unwrap();
    let limits: LimitsConfig = toml::from_str(limits).unwrap();
    let engine = Engine::new(EngineParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        runner: RunnerConfig {
            limits: Limits::new(limits, clock.clone()).with_default_zone(jiff::tz::TimeZone::UTC),
            jobs: Some(jobs),
            ..RunnerConfig::default()
        },
        ..EngineParts::new(Arc::new(agent), sent.clone())
    });
    Bench {
        llm,
        store,
        sent,
        engine,
        clock,
    }
}

fn dm() -> SessionSource {
    SessionSource {
        user_id: Some(USER),
        ..SessionSource::dm(Platform::Telegram, USER as i64)
    }
}

impl Bench {
    /// `event` arrives; wait for a reply containing `needle`.
    async fn gets(&self, event: MessageEvent, needle: &str) -> String {
        let before = self.sent.len();
        let text = event.text.clone();
        self.engine.adapter.handle_message(event).await;
        let seen = self
            .sent
            .wait_until(WAIT, |d| {
                d[before..].iter().any(|d| d.reply.text.contains(needle))
            })
            .await;
        assert!(
            seen,
            "no {needle:?} after {text:?}: {:?}",
            self.sent.texts()
        );
        self.sent.texts()[before..]
            .iter()
            .find(|t| t.contains(needle))
            .cloned()
            .unwrap()
    }

    /// The user sends `text` in their private chat, once no turn runs.
    async fn says(&self, text: &str, needle: &str) -> String {
        let idle = eventually(WAIT, || self.engine.adapter.busy_count() == 0).await;
        assert!(idle, "a turn is still running");
        self.gets(MessageEvent::text(dm(), text), needle).await
    }

    /// (turns, input tokens, output tokens) charged to the user so far.
    async fn charged(&self) -> (u64, u64, u64) {
        let usage = self
            .store
            .usage()
            .usage_between(Some(USER), 0, i64::MAX)
            .await
            .unwrap()
            .remove(&USER)
            .unwrap_or_default();
        (
            usage.turns,
            usage.input_tokens + usage.cached_input_tokens,
            usage.output_tokens,
        )
    }

    /// Wait until `turns` turns are charged.
    async fn charged_turns(&self, turns: u64) -> (u64, u64, u64) {
        for _ in 0..200 {
            let charged = self.charged().await;
            if charged.0 >= turns {
                return charged;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("not {turns} turns charged: {:?}", self.charged().await);
    }
}

/// A job's run is its creator's turn: over the budget it is refused in
/// the chat (the model is not asked, nothing is charged), and a job that
/// would run prompts is not made (a reminder still is).
#[tokio::test]
async fn a_scheduled_prompt_over_the_budget_is_refused_and_none_is_made() {
    let b = bench("daily_tokens = 100", "2026-05-01T12:00:00Z", true).await;
    b.says("/in 5m tell me a joke", "Job 1").await;
    b.llm.push(Script::text("hello").with_usage(200, 10));
    b.says("hi", "hello").await;
    assert_eq!(b.charged_turns(1).await, (1, 200, 10));
    // The job's run arrives as the scheduler hands it on.
    let run = telegate::schedule::run_id(1, jiff::Timestamp::now()).unwrap();
    let event = MessageEvent::internal(dm(), "[telegate] Scheduled job 1: tell me a joke")
        .with_message_id(run);
    let refusal = b.gets(event, "⏰ Job 1").await;
    assert!(
        refusal.contains("daily budget of 100 tokens")
            && refusal.contains("this scheduled run was not run"),
        "{refusal}"
    );
    assert!(
        b.llm
            .requests_matching(&last_user_contains("tell me a joke"))
            .is_empty(),
        "the refused run reached the model"
    );
    assert_eq!(
        b.charged().await,
        (1, 200, 10),
        "the refused run was charged"
    );
    // No new prompt job over the budget, whatever its form.
    for command in ["/in 5m tell me another", "/every 1h tell me more"] {
        let refused = b.says(command, "not made").await;
        assert!(refused.contains("daily budget of 100 tokens"), "{refused}");
    }
    b.says("/in 5m remind: stretch", "Job 2").await;
}

/// The budget day is the bot's: a user over budget who moves their chat
/// to a zone whose midnight just passed is still refused, and the reset
/// reads in the chat's zone.
#[tokio::test]
async fn a_chats_time_zone_does_not_move_the_budget_day() {
    // 14:50 UTC: Tokyo's May 2nd starts at 15:00 UTC.
    let b = bench("daily_tokens = 100", "2026-05-01T14:50:00Z", true).await;
    b.llm.push(Script::text("hello").with_usage(200, 10));
    b.says("hi", "hello").await;
    b.charged_turns(1).await;
    b.clock.set_ms(ms("2026-05-01T15:10:00Z"));
    b.says("/timezone Asia/Tokyo", "Asia/Tokyo").await;
    let refusal = b.says("again", "You have reached").await;
    // UTC midnight is 09:00 in Tokyo.
    assert!(
        refusal.contains("resets at 09:00 (Asia/Tokyo)"),
        "{refusal}"
    );
    assert_eq!(
        b.llm.requests().len(),
        1,
        "the refused turn reached the model"
    );
    // The bot's next day serves the user again.
    b.clock.set_ms(ms("2026-05-02T00:00:01Z"));
    b.llm.push(Script::text("served again"));
    b.says("next day", "served again").await;
}

/// One user starts five turns at once (private chat, a group, three
/// forum topics): each that starts books its reservation, so the fifth
/// finds the budget reserved and is refused; the four pass the limit by
/// less than one reservation.
#[tokio::test]
async fn turns_started_together_are_booked_against_each_other() {
    let b = bench(
        "daily_tokens = 100000\nreserve_tokens = 30000",
        "2026-05-01T12:00:00Z",
        true,
    )
    .await;
    let gate = Gate::new();
    for _ in 0..5 {
        let answer = Script::text("done").with_usage(20_000, 10_000);
        b.llm.push(Script::Gated(gate.clone(), Box::new(answer)));
    }
    let group = |chat_id, chat_type, thread_id| SessionSource {
        platform: Platform::Telegram,
        chat_id,
        chat_type,
        thread_id,
        user_id: Some(USER),
        user_name: Some("ann".into()),
    };
    let sources = [
        dm(),
        group(-100, ChatType::Group, None),
        group(-200, ChatType::Supergroup, Some(11)),
        group(-200, ChatType::Supergroup, Some(12)),
        group(-200, ChatType::Supergroup, Some(13)),
    ];
    for (n, source) in sources.into_iter().enumerate() {
        let mut event = MessageEvent::text(source, format!("task {n}"));
        event.in_forum = event.source.thread_id.is_some();
        b.engine.adapter.handle_message(event).await;
    }
    let refused = b
        .sent
        .wait_until(WAIT, |d| {
            d.iter().any(|d| d.reply.text.contains("still running"))
        })
        .await;
    assert!(refused, "no turn refused: {:?}", b.sent.texts());
    assert!(
        eventually(WAIT, || b.llm.requests().len() == 4).await,
        "{} requests",
        b.llm.requests().len()
    );
    gate.open();
    let (turns, input, output) = b.charged_turns(4).await;
    assert_eq!(turns, 4);
    // 120k: over the 100k limit by less than one 30k reservation.
    assert_eq!(input + output, 120_000);
    assert!(eventually(WAIT, || b.engine.adapter.busy_count() == 0).await);
    assert_eq!(
        b.llm.requests().len(),
        4,
        "the refused turn reached the model"
    );
}

/// A streamed answer stopped before its last chunk reported no usage: the
/// turn is charged the estimate of what it sent.
#[tokio::test]
async fn a_stopped_turn_is_charged_an_estimate() {
    let b = bench("daily_tokens = 1000000", "2026-05-01T12:00:00Z", true).await;
    b.llm.push(Script::Hang);
    let long = "tell me everything ".repeat(40);
    b.engine
        .adapter
        .handle_message(MessageEvent::text(dm(), long.clone()))
        .await;
    assert!(eventually(WAIT, || b.llm.requests().len() == 1).await);
    b.engine
        .adapter
        .handle_message(MessageEvent::text(dm(), "/stop"))
        .await;
    let (turns, input, output) = b.charged_turns(1).await;
    assert_eq!(turns, 1);
    // At least the message itself, four characters a token.
    assert!(input >= (long.len() / 4) as u64, "{input} tokens in");
    assert_eq!(output, 0);
}

/// Usage is asked for in the stream; a server that then sends none (here:
/// the backend told not to ask, so the fake, like OpenAI, sends none) is
/// charged the estimate of what was sent and received.
#[tokio::test]
async fn usage_comes_only_when_asked_and_else_is_estimated() {
    let asked = bench("daily_tokens = 1000000", "2026-05-01T12:00:00Z", true).await;
    asked.llm.push(Script::text("hello").with_usage(700, 30));
    asked.says("hi", "hello").await;
    assert_eq!(asked.charged_turns(1).await, (1, 700, 30));
    assert_eq!(
        asked.llm.requests()[0]["stream_options"]["include_usage"],
        serde_json::json!(true)
    );
    let silent = bench("daily_tokens = 1000000", "2026-05-01T12:00:00Z", false).await;
    let answer = "an answer of forty characters, exactly..";
    silent.llm.push(Script::text(answer).with_usage(700, 30));
    silent.says("hi", answer).await;
    let (_, input, output) = silent.charged_turns(1).await;
    assert_eq!(output, 10, "forty characters received");
    assert!(input > 0 && input != 700, "{input} tokens in");
}

/// A `/retry` over budget is refused before the history is touched: the
/// next day, `/retry` still finds the message to run again.
#[tokio::test]
async fn a_refused_retry_leaves_the_history_as_it_was() {
    let b = bench("daily_tokens = 100", "2026-05-01T12:00:00Z", true).await;
    b.llm.push(Script::text("first answer").with_usage(200, 10));
    b.says("the question", "first answer").await;
    b.charged_turns(1).await;
    b.says("/retry", "You have reached").await;
    b.clock.set_ms(ms("2026-05-02T12:00:00Z"));
    b.llm.push_when(
        last_user_contains("the question"),
        Script::text("second answer"),
    );
    b.says("/retry", "second answer").await;
}
