//! Budgets and usage (issue 26, item 3), on the engine with the real
//! openai backend against the fake LLM, which reports usage the way
//! OpenAI does (`stream_options.include_usage`): a turn over the daily
//! tokens is refused before anything is sent or charged; a tool loop ends
//! at the limit with a note; the day resets at local midnight in the
//! bot's zone (New York here, on a manual clock); turns per hour.
//!
//! Waits are on what the recorder and the fakes saw, never on timing.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::json;
use support::fake_openai::{FakeOpenAi, Script};
use support::recorder::Recorder;
use telegate::agent::{OpenAiAgent, OpenAiConfig};
use telegate::clock::Clock;
use telegate::engine::{Engine, EngineParts};
use telegate::limits::{Limits, LimitsConfig};
use telegate::runner::RunnerConfig;
use telegate::store::Store;
use telegate::tools::{ToolContext, ToolDefinition, ToolError, ToolRegistry};
use telegate::vocab::{MessageEvent, Platform, SessionSource};

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;

/// New York's rules, without a time zone database.
fn new_york() -> jiff::tz::TimeZone {
    jiff::tz::TimeZone::posix("EST5EDT,M3.2.0,M11.1.0").unwrap()
}

fn ms(text: &str) -> i64 {
    text.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

/// A tool that counts its calls.
#[derive(Default)]
struct Counted(AtomicUsize);

impl ToolRegistry for Counted {
    fn prepare<'a>(&'a self, _ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn attach_store(&self, _child_groups: &telegate::store::ChildGroups) {}

    fn definitions(&self) -> Vec<ToolDefinition> {
        vec![ToolDefinition {
            name: "look".into(),
            description: "Looks something up.".into(),
            parameters: json!({"type": "object"}),
        }]
    }

    fn call<'a>(
        &'a self,
        _name: &'a str,
        _arguments: &'a str,
        _ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok("found it".to_string()) })
    }
}

struct Bench {
    llm: FakeOpenAi,
    store: Store,
    sent: Arc<Recorder>,
    engine: Engine,
    clock: Clock,
    tools: Arc<Counted>,
}

async fn bench(limits: &str, now: &str) -> Bench {
    let llm = FakeOpenAi::start().await;
    let store = Store::open_in_memory().unwrap();
    let sent = Recorder::new();
    let clock = Clock::manual(ms(now));
    let tools = Arc::new(Counted::default());
    let agent = OpenAiAgent::new(
        OpenAiConfig::new(llm.base_url(), "fake"),
        None,
        tools.clone(),
    )
    .unwrap();
    let limits: LimitsConfig = toml::from_str(limits).unwrap();
    let engine = Engine::new(EngineParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        runner: RunnerConfig {
            limits: Limits::new(limits, clock.clone()).with_zone(new_york()),
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
        tools,
    }
}

impl Bench {
    /// The user sends `text`; wait for a reply containing `needle`.
    async fn says(&self, text: &str, needle: &str) -> String {
        // The previous turn is over (its answer out, its slot free).
        let idle =
            support::recorder::eventually(WAIT, || self.engine.adapter.busy_count() == 0).await;
        assert!(idle, "a turn is still running");
        let before = self.sent.len();
        let source = SessionSource {
            user_id: Some(USER as u64),
            ..SessionSource::dm(Platform::Telegram, USER)
        };
        self.engine
            .adapter
            .handle_message(MessageEvent::text(source, text))
            .await;
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

    /// (turns, tokens) charged to the user so far.
    async fn charged(&self) -> (u64, u64) {
        let usage = self
            .store
            .usage()
            .usage_between(Some(USER as u64), 0, i64::MAX)
            .await
            .unwrap()
            .remove(&(USER as u64))
            .unwrap_or_default();
        (
            usage.turns,
            usage.input_tokens + usage.cached_input_tokens + usage.output_tokens,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_over_the_daily_tokens_is_refused_uncharged_until_local_midnight() {
    // 23:30 on June 4th in New York (03:30 UTC on the 5th).
    let b = bench("daily_tokens = 100", "2024-06-05T03:30:00Z").await;
    b.llm.push(Script::text("first answer").with_usage(80, 30));
    b.says("first", "first answer").await;
    assert_eq!(b.charged().await, (1, 110));

    let refusal = b.says("second", "You have reached").await;
    assert!(refusal.contains("daily budget of 100 tokens"), "{refusal}");
    assert!(refusal.contains("resets at 00:00"), "{refusal}");
    assert_eq!(b.llm.requests().len(), 1, "the refused turn sent nothing");
    assert_eq!(
        b.charged().await,
        (1, 110),
        "the refused turn was not charged"
    );
    let session = b
        .engine
        .runner
        .current_session(&support::recorder::session_key(USER));
    let transcript = b
        .store
        .transcripts()
        .load_history(session.unwrap().as_str(), None)
        .await
        .unwrap();
    assert!(
        !transcript.iter().any(|e| e.content.contains("second")),
        "the refused message is not in the conversation"
    );
    assert!(b
        .says("/usage", "Today: 1 turn, 110 tokens")
        .await
        .contains("100 tokens a day"));

    // 23:59:59 is still the same day; local midnight is a new one (UTC
    // midnight came hours ago and changed nothing).
    b.clock.set_ms(ms("2024-06-05T03:59:59Z"));
    b.says("third", "You have reached").await;
    b.clock.set_ms(ms("2024-06-05T04:00:00Z"));
    b.llm.push(Script::text("a new day").with_usage(5, 5));
    b.says("fourth", "a new day").await;
    assert_eq!(b.charged().await, (2, 120));
    let usage = b.says("/usage", "Today:").await;
    assert!(usage.contains("Today: 1 turn, 10 tokens"), "{usage}");
    assert!(usage.contains("This month: 2 turns, 120 tokens"), "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_loop_ends_at_the_limit_with_a_note() {
    let b = bench("daily_tokens = 100", "2024-06-05T15:00:00Z").await;
    b.llm
        .push(Script::tool_call("look", "{}", "call-1").with_usage(90, 20));
    let answer = b.says("look it up", "Stopped: your daily budget").await;
    assert!(answer.contains("100 tokens"), "{answer}");
    assert_eq!(b.tools.0.load(Ordering::SeqCst), 0, "the tool did not run");
    assert_eq!(b.llm.requests().len(), 1, "no further round");
    assert_eq!(b.charged().await, (1, 110));
    // The conversation stays valid: the next turn's history has no tool
    // call without its result.
    b.clock.set_ms(ms("2024-06-06T04:00:00Z"));
    b.llm.push(Script::text("fine"));
    b.says("again", "fine").await;
    let history = &b.llm.requests()[1]["messages"];
    let roles: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(!roles.contains(&"tool"), "{roles:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_per_hour_free_up_an_hour_after_the_oldest() {
    let b = bench("turns_per_hour = 2", "2024-06-05T15:00:00Z").await;
    b.says("one", "ok").await;
    b.clock.advance_ms(60_000);
    b.says("two", "ok").await;
    let refusal = b.says("three", "You have reached").await;
    assert!(
        refusal.contains("limit of 2 messages per hour"),
        "{refusal}"
    );
    // Free again an hour after the first turn (11:00 local).
    assert!(refusal.contains("resets at 12:00"), "{refusal}");
    b.clock.advance_ms(3_600_000 - 60_000);
    b.says("four", "ok").await;
    assert_eq!(b.charged().await.0, 3);
}

/// The Claude preset's usage comes from its `result` event (tokens and
/// `total_cost_usd`): a daily dollar budget below one turn's cost lets
/// the first turn run and refuses the second, uncharged; /usage shows the
/// reported numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_agents_reported_cost_counts_against_the_daily_dollars() {
    use support::fake_bot::FakeBotApi;
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let bot = crate::cli_agents_e2e::test_bot(&fake, "claude", agent_dir.path(), data.path(), "")
        .adjust(|config| config.limits = toml::from_str("daily_cost_usd = 0.01").unwrap())
        .start()
        .await
        .unwrap();
    let says = |text: &str, needle: &str| {
        let needle = needle.to_string();
        let text = text.to_string();
        let bot = &bot;
        let before = fake
            .sent_texts(USER)
            .iter()
            .filter(|t| t.contains(&needle))
            .count();
        let fake = &fake;
        async move {
            // The previous turn is over (answered and charged).
            let idle =
                support::recorder::eventually(WAIT, || bot.engine.adapter.busy_count() == 0).await;
            assert!(idle, "a turn is still running");
            fake.push_text(USER, USER, &text);
            let count = || {
                fake.sent_texts(USER)
                    .iter()
                    .filter(|t| t.contains(&needle))
                    .count()
            };
            let seen = fake.wait_for(|_| count() > before, WAIT).await;
            assert!(seen, "no {needle:?}: {:?}", fake.sent_texts(USER));
            fake.sent_texts(USER)
                .into_iter()
                .rev()
                .find(|t| t.contains(&needle))
                .unwrap()
        }
    };
    says("first", "in claude-session-1").await;
    let refusal = says("second", "You have reached").await;
    assert!(refusal.contains("daily budget of $0.01"), "{refusal}");
    assert_eq!(
        crate::cli_agents_e2e::invocations(agent_dir.path()).len(),
        1,
        "the refused turn did not run the agent"
    );
    let usage = says("/usage", "Today:").await;
    // The fake reports 100 input, 50 cached, 20 output tokens, $0.0125.
    assert!(usage.contains("Today: 1 turn, 170 tokens"), "{usage}");
    assert!(usage.contains("$0.01"), "{usage}");
    bot.shutdown().await;
}

/// A chat's `/timezone` (the scheduler's) is the zone its times (a
/// budget's reset) are shown in; a chat without one follows the default,
/// and so does one whose stored name this build cannot read. (The budget
/// day itself is the bot's: `budget_spends.rs`.)
#[tokio::test]
async fn budget_days_follow_the_chats_own_time_zone() {
    use telegate::limits::zone::{chat_time_zone, day_range};
    let store = Store::open_in_memory().unwrap();
    let default = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    store
        .jobs()
        .set_chat_timezone(7, "Asia/Tokyo".into(), Vec::new())
        .await
        .unwrap();
    store
        .jobs()
        .set_chat_timezone(8, "Not/AZone".into(), Vec::new())
        .await
        .unwrap();
    let now: jiff::Timestamp = "2026-05-01T20:00:00Z".parse().unwrap();
    let tokyo = chat_time_zone(&store.jobs(), 7, &default).await;
    // 20:00 UTC is 05:00 the next day in Tokyo: that day starts at
    // 15:00 UTC.
    let start: jiff::Timestamp = "2026-05-01T15:00:00Z".parse().unwrap();
    assert_eq!(day_range(&tokyo, now).0, start.as_millisecond());
    for chat in [9, 8] {
        let zone = chat_time_zone(&store.jobs(), chat, &default).await;
        let berlin_start: jiff::Timestamp = "2026-04-30T22:00:00Z".parse().unwrap();
        assert_eq!(
            day_range(&zone, now).0,
            berlin_start.as_millisecond(),
            "chat {chat} follows the default zone"
        );
    }
}
