//! Scheduled jobs through Telegram, end to end (the real bot against the
//! fake Bot API; the real openai backend against the fake LLM, or the
//! command backend running a shell script):
//!
//! * the model's `schedule` tool: a tool call makes a job (the result
//!   states the resolved time in the chat's zone, the user sees one
//!   confirmation line), the run comes back to the model in the same chat
//!   and session (or in a fresh session when asked), and its answer
//!   reaches that chat only;
//! * a command-backend program makes a job by writing a request file into
//!   `$TELEGATE_SCHEDULE`;
//! * a job's buttons in a group: another member's press is refused before
//!   it uses anything up, the creator's press pauses the job; the command
//!   menu registered at start lists the job commands.
//!
//! Jobs are scheduled a couple of seconds ahead in real time; every wait
//! is on a condition and bounded.

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use support::fake_bot::{ChatType, FakeBotApi};
use support::fake_openai::{last_user_contains, messages, tool_result_after, FakeOpenAi, Script};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::store::JobState;

const WAIT: Duration = Duration::from_secs(15);
const CHAT_A: i64 = 42;
const CHAT_B: i64 = 43;
const GROUP: i64 = -100;
const RUN: &str = "[telegate] Scheduled job";

fn test_bot(fake: &FakeBotApi, agent: &str, store: &str) -> TestBot {
    TestBot::new(fake)
        .users(&[CHAT_A, CHAT_B])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [schedule]\ntimezone = \"UTC\"\n\n\
             {store}\n\n{agent}\n"
        ))
}

fn openai(llm: &FakeOpenAi) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"fake\"\n\
         api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n",
        llm.base_url()
    )
}

async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str) -> bool {
    fake.wait_for(
        |_| fake.sent_texts(chat).iter().any(|t| t.contains(needle)),
        WAIT,
    )
    .await
}

fn count_text(fake: &FakeBotApi, chat: i64, needle: &str) -> usize {
    fake.sent_texts(chat)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

fn schedule_call(arguments: Value) -> Script {
    Script::tool_call("schedule", &arguments.to_string(), "call-1")
}

fn mentions(request: &Value, needle: &str) -> bool {
    messages(request)
        .iter()
        .any(|(_, text)| text.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_schedule_tool_makes_a_job_that_runs_in_the_same_chat_and_session() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    llm.push_when(
        last_user_contains("A: remind me in a moment"),
        schedule_call(json!({"action": "create", "when": "in 2s", "prompt": "tell me to stretch"})),
    );
    llm.push_when(
        tool_result_after("A: remind me in a moment"),
        Script::text("A: I will."),
    );
    llm.push_when(last_user_contains(RUN), Script::text("A: time to stretch!"));
    let bot = test_bot(&fake, &openai(&llm), "[store]\nin_memory = true")
        .start()
        .await
        .expect("bot starts against the fakes");

    // Chat B talks too; the run must not go there.
    llm.push_when(last_user_contains("B: hello"), Script::text("B: hi"));
    fake.push_text(CHAT_B, CHAT_B, "B: hello");
    fake.push_text(CHAT_A, CHAT_A, "A: remind me in a moment");
    // (The preview shows the streamed answer first; the final edit adds
    // the confirmation.)
    assert!(
        wait_text(&fake, CHAT_A, "⏰ Job 1:").await,
        "{:?}",
        fake.sent_texts(CHAT_A)
    );
    // The answer carries one confirmation line, in the chat's zone.
    let answer = fake
        .sent_texts(CHAT_A)
        .into_iter()
        .find(|t| t.contains("A: I will."))
        .unwrap();
    assert!(answer.contains("⏰ Job 1: today "), "{answer}");
    assert!(answer.contains(" UTC — tell me to stretch"), "{answer}");
    assert_eq!(answer.matches("⏰ Job").count(), 1, "{answer}");
    // The tool was offered, and its result stated the resolved time.
    let first = &llm.requests_matching(&last_user_contains("A: remind me"))[0];
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(tools.contains(&"schedule"), "{tools:?}");
    let result = support::fake_openai::last_tool_result(
        &llm.requests_matching(&tool_result_after("A: remind me"))[0],
    )
    .unwrap();
    assert!(
        result.starts_with("Created job 1 (time zone UTC): next run 20"),
        "{result}"
    );

    // The run: chat A, chat A's conversation, answered once.
    assert!(
        wait_text(&fake, CHAT_A, "A: time to stretch!").await,
        "{:?}",
        fake.sent_texts(CHAT_A)
    );
    let runs = llm.requests_matching(&last_user_contains(RUN));
    assert_eq!(runs.len(), 1);
    assert!(
        mentions(&runs[0], "A: remind me in a moment"),
        "the same session"
    );
    assert!(!mentions(&runs[0], "B: hello"));
    let (_, text) = messages(&runs[0]).pop().unwrap();
    assert!(text.ends_with("tell me to stretch"), "{text}");
    assert!(!fake
        .sent_texts(CHAT_B)
        .iter()
        .any(|t| t.contains("stretch")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count_text(&fake, CHAT_A, "A: time to stretch!"), 1);
    let store = bot.store.clone();
    assert_eq!(
        store.jobs().job(1).await.unwrap().unwrap().state,
        JobState::Done
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_session_job_from_the_tool_runs_without_the_chats_history() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    llm.push_when(
        last_user_contains("A: brief me soon"),
        schedule_call(json!({
            "action": "create", "when": "in 2s", "prompt": "the briefing", "session": "fresh"
        })),
    );
    llm.push_when(tool_result_after("A: brief me soon"), Script::text("A: ok"));
    llm.push_when(
        last_user_contains(RUN),
        Script::text("A: here is the briefing"),
    );
    let bot = test_bot(&fake, &openai(&llm), "[store]\nin_memory = true")
        .start()
        .await
        .unwrap();
    fake.push_text(CHAT_A, CHAT_A, "A: brief me soon");
    assert!(wait_text(&fake, CHAT_A, "A: here is the briefing").await);
    let runs = llm.requests_matching(&last_user_contains(RUN));
    assert_eq!(runs.len(), 1);
    assert!(!mentions(&runs[0], "A: brief me soon"), "a fresh session");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_backend_program_makes_a_job_with_a_request_file() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let script = "printf '{\"when\": \"in 2s\", \"remind\": \"from the program\"}' \
                  > \"$TELEGATE_SCHEDULE/a.json\"; \
                  printf 'not json' > \"$TELEGATE_SCHEDULE/b.json\"; echo answered";
    let agent = format!(
        "[agent]\nbackend = \"command\"\n\n[agent.command]\nargv = [\"sh\", \"-c\", {}]\n",
        toml::Value::String(script.to_string())
    );
    let store = format!(
        "[store]\ndata_dir = {}",
        toml::Value::String(data.path().display().to_string())
    );
    let bot = test_bot(&fake, &agent, &store).start().await.unwrap();
    fake.push_text(CHAT_A, CHAT_A, "schedule something");
    assert!(
        wait_text(&fake, CHAT_A, "Schedule request b.json").await,
        "{:?}",
        fake.sent_texts(CHAT_A)
    );
    let answer = fake
        .sent_texts(CHAT_A)
        .into_iter()
        .find(|t| t.contains("answered"))
        .unwrap();
    assert!(answer.contains("⏰ Job 1: today "), "{answer}");
    assert!(answer.contains("— remind: from the program"), "{answer}");
    assert!(
        answer.contains("⚠️ Schedule request b.json: it is not a request"),
        "{answer}"
    );
    assert!(
        wait_text(&fake, CHAT_A, "⏰ from the program").await,
        "{:?}",
        fake.sent_texts(CHAT_A)
    );
    // The request directory is gone after the turn.
    let requests = data.path().join("schedule/requests");
    let left: Vec<_> = walk(&requests);
    assert!(left.iter().all(|p| !p.ends_with(".json")), "{left:?}");
    bot.shutdown().await;
}

fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            found.push(path.display().to_string());
            if path.is_dir() {
                found.extend(walk(&path));
            }
        }
    }
    found
}

/// (message id, label, callback data) of every button under the bot's
/// messages in `chat`.
fn buttons(fake: &FakeBotApi, chat: i64) -> Vec<(i64, String, String)> {
    let mut found = Vec::new();
    for message in fake.message_history(chat) {
        let Some(markup) = &message.current().reply_markup else {
            continue;
        };
        let markup = match markup {
            Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
            other => other.clone(),
        };
        for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
            for key in row.as_array().into_iter().flatten() {
                found.push((
                    message.message_id,
                    key["text"].as_str().unwrap_or_default().to_string(),
                    key["callback_data"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
        }
    }
    found
}

fn toasts(fake: &FakeBotApi) -> Vec<String> {
    fake.calls_to("answerCallbackQuery")
        .iter()
        .map(|c| c.text().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_buttons_answer_to_its_creator_only() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let bot = test_bot(
        &fake,
        "[agent]\nbackend = \"echo\"\n",
        "[store]\nin_memory = true",
    )
    .start()
    .await
    .unwrap();
    assert!(
        fake.wait_for(
            |_| fake.my_commands().iter().any(|(n, _)| n == "jobs"),
            WAIT
        )
        .await,
        "the menu lists /jobs: {:?}",
        fake.my_commands()
    );
    fake.push_group_text(GROUP, CHAT_A, "/every day 08:00 remind: stand-up", true);
    assert!(wait_text(&fake, GROUP, "⏰ Job 1: every day at 08:00 (UTC)").await);
    fake.push_group_text(GROUP, CHAT_B, "/jobs", true);
    assert!(wait_text(&fake, GROUP, "Jobs in this chat (1)").await);
    let listed = fake
        .message_history(GROUP)
        .into_iter()
        .find(|m| m.text().starts_with("Jobs in this chat"))
        .unwrap()
        .message_id;
    let pause = buttons(&fake, GROUP)
        .into_iter()
        .find(|(id, label, _)| *id == listed && label.contains("Pause 1"))
        .expect("a Pause button under the list");
    // Bob (who asked for the list) may not pause Ann's job.
    fake.push_callback_query(GROUP, CHAT_B, listed, &pause.2);
    assert!(
        fake.wait_for(|_| toasts(&fake).iter().any(|t| t.contains("Only")), WAIT)
            .await,
        "{:?}",
        toasts(&fake)
    );
    let store = bot.store.clone();
    assert_eq!(
        store.jobs().job(1).await.unwrap().unwrap().state,
        JobState::Active
    );
    // Ann may, with the very same button (it was not used up).
    fake.push_callback_query(GROUP, CHAT_A, listed, &pause.2);
    assert!(
        wait_text(&fake, GROUP, "⏸ Job 1 paused").await,
        "{:?}",
        toasts(&fake)
    );
    assert_eq!(
        store.jobs().job(1).await.unwrap().unwrap().state,
        JobState::Paused
    );
    // A second press of a used button does nothing more.
    fake.push_callback_query(GROUP, CHAT_A, listed, &pause.2);
    assert!(
        fake.wait_for(|_| toasts(&fake).iter().any(|t| t == "Already done."), WAIT)
            .await,
        "{:?}",
        toasts(&fake)
    );
    assert_eq!(count_text(&fake, GROUP, "⏸ Job 1 paused"), 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_is_sent_as_written_not_read_as_markdown() {
    let fake = FakeBotApi::start().await;
    let bot = test_bot(
        &fake,
        "[agent]\nbackend = \"echo\"\n",
        "[store]\nin_memory = true",
    )
    .start()
    .await
    .unwrap();
    let words = "pay 2*3*4 to snake_case_name_ [now](x) `tick`";
    fake.push_text(CHAT_A, CHAT_A, &format!("/in 1s remind: {words}"));
    assert!(
        wait_text(&fake, CHAT_A, &format!("⏰ {words}")).await,
        "the reminder arrives with every character the user wrote: {:?}",
        fake.sent_texts(CHAT_A)
    );
    let reminder = fake
        .message_history(CHAT_A)
        .into_iter()
        .find(|m| m.current().text.contains(&format!("⏰ {words}")))
        .unwrap();
    assert!(
        reminder.current().entities.is_empty(),
        "no formatting read into the user's words: {:?}",
        reminder.current().entities
    );
    bot.shutdown().await;
}
