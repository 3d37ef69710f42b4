//! Conversations a chat can return to (issue 26, item 4), end to end on
//! the real bot and an on-disk store: `/sessions` lists this chat's
//! conversations (first message or title, number of exchanges) with a
//! button each, `/resume ID` or the button makes one current again. For
//! the openai backend the next request carries exactly the resumed
//! conversation's history; for the Claude preset the fake `claude` is
//! called with the resumed conversation's `--resume` id. Both hold after a
//! restart of the bot on the same data directory.
//!
//! Waits are on what the fakes recorded, never on timing.

use crate::cli_agents_e2e::{invocations, resumed_id};
use crate::media_e2e::{openai, test_bot, USER, WAIT};
use crate::support;

use serde_json::Value;
use support::fake_bot::FakeBotApi;
use support::fake_openai::{last_user_contains, FakeOpenAi, Script};
use telegate::transport::telegram::TelegramBot;

/// Once no turn runs, `user` sends `text`; wait until one more sent text contains `needle`,
/// and return it.
async fn says(bot: &TelegramBot, fake: &FakeBotApi, text: &str, needle: &str) -> String {
    // The previous turn is over (answered, charged, recorded).
    let idle = support::recorder::eventually(WAIT, || bot.engine.adapter.busy_count() == 0).await;
    assert!(idle, "a turn is still running");
    let seen = |fake: &FakeBotApi| {
        fake.sent_texts(USER)
            .into_iter()
            .filter(|t| t.contains(needle))
            .collect::<Vec<_>>()
    };
    let before = seen(fake).len();
    fake.push_text(USER, USER, text);
    let ok = fake.wait_for(|_| seen(fake).len() > before, WAIT).await;
    assert!(
        ok,
        "no {needle:?} after {text:?}: {:?}",
        fake.sent_texts(USER)
    );
    seen(fake).pop().unwrap()
}

/// The short id /sessions shows for the conversation named `name`.
fn listed_id(listing: &str, name: &str) -> String {
    let line = listing
        .lines()
        .find(|l| l.contains(&format!("\"{name}\"")))
        .unwrap_or_else(|| panic!("{name:?} not listed: {listing}"));
    line.trim_start_matches("• ")
        .split(' ')
        .next()
        .unwrap()
        .to_string()
}

/// (role, content) of every message of a chat completions request.
fn roles_and_contents(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn last_request_with(llm: &FakeOpenAi, needle: &str) -> Vec<(String, String)> {
    let requests = llm.requests_matching(&last_user_contains(needle));
    roles_and_contents(requests.last().expect("a request for it"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_history_comes_back_exactly_on_resume_also_after_a_restart() {
    let (fake, llm) = (FakeBotApi::start().await, FakeOpenAi::start().await);
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, data.path(), &openai(&llm, false));
    let bot = settings.start().await.unwrap();

    llm.push_when(last_user_contains("taxes"), Script::text("File by April."));
    says(&bot, &fake, "about my taxes", "File by April.").await;
    llm.push_when(last_user_contains("deduct"), Script::text("Yes, some."));
    says(&bot, &fake, "can I deduct it", "Yes, some.").await;
    says(&bot, &fake, "/title Taxes", "is called \"Taxes\" now").await;
    let taxes = last_request_with(&llm, "deduct");

    says(&bot, &fake, "/new", "Started a fresh session").await;
    llm.push_when(last_user_contains("garden"), Script::text("Water it."));
    says(&bot, &fake, "my garden", "Water it.").await;
    let listing = says(&bot, &fake, "/sessions", "Conversations in this chat").await;
    assert!(listing.contains("\"Taxes\""), "{listing}");
    assert!(listing.contains("2 exchanges"), "{listing}");
    assert!(listing.contains("\"my garden\""), "{listing}");
    assert!(listing.contains("1 exchange (current)"), "{listing}");
    let garden_id = listed_id(&listing, "my garden");
    let taxes_id = listed_id(&listing, "Taxes");

    let back = says(&bot, &fake, &format!("/resume {taxes_id}"), "Back to").await;
    assert!(back.contains("\"Taxes\" (2 exchanges)"), "{back}");
    llm.push_when(last_user_contains("and next year"), Script::text("Same."));
    says(&bot, &fake, "and next year", "Same.").await;
    let mut expected = taxes.clone();
    expected.push(("assistant".into(), "Yes, some.".into()));
    expected.push(("user".into(), "and next year".into()));
    assert_eq!(last_request_with(&llm, "and next year"), expected);

    // A restart keeps the resumed conversation current, and the other one
    // comes back by its id too.
    bot.shutdown().await;
    let bot = settings.start().await.unwrap();
    llm.push_when(last_user_contains("one more"), Script::text("Done."));
    says(&bot, &fake, "one more", "Done.").await;
    let after = last_request_with(&llm, "one more");
    let mut expected_after = expected.clone();
    expected_after.push(("assistant".into(), "Same.".into()));
    expected_after.push(("user".into(), "one more".into()));
    assert_eq!(after, expected_after);

    says(
        &bot,
        &fake,
        &format!("/resume {garden_id}"),
        "Back to \"my garden\"",
    )
    .await;
    llm.push_when(last_user_contains("roses"), Script::text("Prune them."));
    says(&bot, &fake, "and roses", "Prune them.").await;
    let garden = last_request_with(&llm, "roses");
    let tail: Vec<_> = garden
        .iter()
        .filter(|(r, _)| r != "system")
        .cloned()
        .collect();
    assert_eq!(
        tail,
        [
            ("user".to_string(), "my garden".to_string()),
            ("assistant".to_string(), "Water it.".to_string()),
            ("user".to_string(), "and roses".to_string()),
        ]
    );
    says(&bot, &fake, "/resume zzzz", "no conversation zzzz").await;
    bot.shutdown().await;
}

/// The callback data of the button whose text contains `needle`, and the
/// message it is under.
fn button(fake: &FakeBotApi, needle: &str) -> Option<(i64, String)> {
    for message in fake.message_history(USER) {
        let Some(markup) = &message.current().reply_markup else {
            continue;
        };
        let markup = match markup {
            Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
            other => other.clone(),
        };
        for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
            for key in row.as_array().into_iter().flatten() {
                if key["text"].as_str().unwrap_or_default().contains(needle) {
                    let data = key["callback_data"].as_str().unwrap_or_default();
                    return Some((message.message_id, data.to_string()));
                }
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_conversation_resumes_its_session_id_by_button_also_after_a_restart() {
    let fake = FakeBotApi::start().await;
    let agent_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let settings =
        crate::cli_agents_e2e::test_bot(&fake, "claude", agent_dir.path(), data.path(), "");
    let bot = settings.start().await.unwrap();
    says(&bot, &fake, "first topic", "in claude-session-1").await;
    says(&bot, &fake, "/new", "Started a fresh session").await;
    says(&bot, &fake, "second topic", "in claude-session-2").await;

    says(&bot, &fake, "/sessions", "Conversations in this chat").await;
    let (message, data_) = button(&fake, "first topic").expect("a resume button");
    fake.push_callback_query(USER, USER, message, &data_);
    let ok = fake
        .wait_for(
            |_| {
                fake.sent_texts(USER)
                    .iter()
                    .any(|t| t.contains("Back to \"first topic\""))
            },
            WAIT,
        )
        .await;
    assert!(ok, "{:?}", fake.sent_texts(USER));
    says(&bot, &fake, "back to it", "in claude-session-1").await;
    let calls = invocations(agent_dir.path());
    assert_eq!(
        resumed_id(&calls[2], "--resume").as_deref(),
        Some("claude-session-1")
    );

    bot.shutdown().await;
    let bot = settings.start().await.unwrap();
    says(&bot, &fake, "after the restart", "in claude-session-1").await;
    let listing = says(&bot, &fake, "/sessions", "Conversations in this chat").await;
    let second = listed_id(&listing, "second topic");
    says(
        &bot,
        &fake,
        &format!("/resume {second}"),
        "Back to \"second topic\"",
    )
    .await;
    says(&bot, &fake, "the other one", "in claude-session-2").await;
    let calls = invocations(agent_dir.path());
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert_eq!(
        resumed_id(&calls[3], "--resume").as_deref(),
        Some("claude-session-1")
    );
    assert_eq!(
        resumed_id(&calls[4], "--resume").as_deref(),
        Some("claude-session-2")
    );
    bot.shutdown().await;
}
