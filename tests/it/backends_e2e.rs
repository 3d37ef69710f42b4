//! The agent backends through the whole engine: the `openai` backend against
//! the fake OpenAI server (behind the fake Telegram Bot API), persistence
//! across restarts, the `command` backend's /stop, and many chats sharing
//! one store.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use support::fake_bot::FakeBotApi;
use support::fake_openai::{FakeOpenAi, Script};
use support::recorder::{eventually, make_event, Recorder};
use support::test_bot::{TestBot, FAST_DELIVERY};
use telegate::adapter::{AdapterConfig, BusyMode};
use telegate::agent::EchoAgent;
use telegate::config::{Config, Purpose};
use telegate::engine::{AgentSetup, Engine, EngineParts};
use telegate::store::Store;
use telegate::vocab::Role;
use telegate::wiring::engine::{build_agent, open_engine, open_store};

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;

/// USER's bot on the openai backend against `llm`, storing in `data_dir`.
fn test_bot(fake: &FakeBotApi, llm: &FakeOpenAi, data_dir: &Path) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"test-model\"\n\
             api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\nsystem_prompt = \"You are a test.\"\n\n\
             [store]\ndata_dir = \"{}\"\n",
            llm.base_url(),
            data_dir.display()
        ))
}

fn sent_ok(fake: &FakeBotApi, chat: i64, needle: &str) -> bool {
    fake.calls().iter().any(|c| {
        c.method == "sendMessage"
            && c.chat_id() == Some(chat)
            && c.outcome.is_ok()
            && c.text().is_some_and(|t| t.contains(needle))
    })
}

/// A message of the bot in `chat` reads with `needle` now (sent so, or
/// edited into it).
fn shown(fake: &FakeBotApi, chat: i64, needle: &str) -> bool {
    fake.sent_texts(chat).iter().any(|t| t.contains(needle))
}

/// The `messages` array of the n-th request the fake LLM received.
fn request_messages(llm: &FakeOpenAi, n: usize) -> Vec<(String, String)> {
    llm.requests()[n]["messages"]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_reply_streams_into_edits_and_ends_as_the_final_text() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    llm.push(Script::stream(
        &["The ", "answer ", "is ", "**forty-two**", "."],
        Duration::from_millis(80),
    ));
    let bot = test_bot(&fake, &llm, data.path()).start().await.unwrap();
    fake.push_text(USER, USER, "what is the answer?");
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER) == vec!["The answer is forty-two.".to_string()],
            WAIT
        )
        .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let history = fake.message_history(USER);
    assert_eq!(history.len(), 1, "one message, edited in place");
    assert!(history[0].versions.len() >= 2, "the preview was edited");
    let last = history[0].current();
    assert!(
        last.entities.iter().any(|e| e["type"] == "bold"),
        "Markdown became entities"
    );
    let messages = request_messages(&llm, 0);
    assert_eq!(messages[0], ("system".into(), "You are a test.".into()));
    assert_eq!(
        messages.last().unwrap(),
        &("user".into(), "what is the answer?".into())
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_mid_stream_closes_the_llm_connection_and_nothing_more_is_sent() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let chunks: Vec<String> = (0..200).map(|i| format!("t{i} ")).collect();
    let chunk_refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    llm.push(Script::stream(&chunk_refs, Duration::from_millis(50)));
    let bot = test_bot(&fake, &llm, data.path()).start().await.unwrap();
    fake.push_text(USER, USER, "talk for a long time");
    assert!(fake.wait_for(|_| sent_ok(&fake, USER, "t0"), WAIT).await);
    fake.push_text(USER, USER, "/stop");
    assert!(
        llm.wait_for_disconnect(WAIT).await,
        "the LLM stream was closed"
    );
    assert!(
        fake.wait_for(|_| sent_ok(&fake, USER, "⏹ Stopped"), WAIT)
            .await
    );
    assert!(!fake.sent_texts(USER).iter().any(|t| t.contains("t199")));
    // The transcript records the interrupted turn.
    let store = bot.store.clone();
    let key = bot
        .engine
        .adapter
        .session_key(&make_event("x", USER).source);
    let session = store
        .sessions()
        .current_session(key.as_str())
        .await
        .unwrap()
        .unwrap();
    assert!(
        wait_for_interrupted(&store, &session.session_id).await,
        "interrupted turn recorded"
    );
    bot.shutdown().await;
}

async fn wait_for_interrupted(store: &Store, session_id: &str) -> bool {
    for _ in 0..200 {
        let history = store
            .transcripts()
            .load_history(session_id, None)
            .await
            .unwrap();
        if history
            .iter()
            .any(|e| e.role == Role::Assistant && e.interrupted)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_the_conversation_and_new_starts_empty() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, &llm, data.path());

    llm.push(Script::text("Nice to meet you, Ann."));
    let bot = settings.start().await.unwrap();
    fake.push_text(USER, USER, "my name is Ann");
    assert!(
        fake.wait_for(|_| sent_ok(&fake, USER, "Nice to meet you"), WAIT)
            .await
    );
    bot.shutdown().await;

    // A new process on the same data directory.
    llm.push(Script::text("You are Ann."));
    let bot = settings.start().await.unwrap();
    fake.push_text(USER, USER, "who am I?");
    assert!(
        fake.wait_for(|_| sent_ok(&fake, USER, "You are Ann."), WAIT)
            .await
    );
    let messages = request_messages(&llm, 1);
    assert_eq!(
        messages,
        vec![
            ("system".into(), "You are a test.".into()),
            ("user".into(), "my name is Ann".into()),
            ("assistant".into(), "Nice to meet you, Ann.".into()),
            ("user".into(), "who am I?".into()),
        ]
    );

    fake.push_text(USER, USER, "/new");
    assert!(fake.wait_for(|_| sent_ok(&fake, USER, "✨"), WAIT).await);
    llm.push(Script::text("I don't know you yet."));
    fake.push_text(USER, USER, "who am I now?");
    assert!(
        fake.wait_for(|_| sent_ok(&fake, USER, "I don't know you yet."), WAIT)
            .await
    );
    let messages = request_messages(&llm, 2);
    assert_eq!(
        messages,
        vec![
            ("system".into(), "You are a test.".into()),
            ("user".into(), "who am I now?".into()),
        ]
    );
    // The old transcript stays readable.
    let store = bot.store.clone();
    let key = bot
        .engine
        .adapter
        .session_key(&make_event("x", USER).source);
    let sessions = store
        .sessions()
        .session_history(key.as_str())
        .await
        .unwrap();
    assert_eq!(sessions.len(), 2);
    let old = store
        .transcripts()
        .load_history(&sessions[0].session_id, None)
        .await
        .unwrap();
    assert_eq!(old.len(), 4);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_failures_reach_the_user_as_one_clear_message() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, &llm, data.path()).start().await.unwrap();
    llm.push(Script::Http(
        401,
        "{\"error\":{\"message\":\"bad key sk-123\"}}".into(),
    ));
    fake.push_text(USER, USER, "one");
    assert!(
        fake.wait_for(|_| shown(&fake, USER, "rejected this bot's API key"), WAIT)
            .await
    );
    assert!(
        fake.sent_texts(USER)
            .iter()
            .filter(|t| t.contains("rejected this bot's API key"))
            .all(|t| !t.contains("/reset")),
        "a refused key is the owner's to fix, not the user's to reset: {:?}",
        fake.sent_texts(USER)
    );
    llm.push(Script::ErrorEvent(
        "model overloaded (request by acct-7731)".into(),
    ));
    fake.push_text(USER, USER, "two");
    // Shown as a new message or, when the turn's preview was already up
    // (a slower machine), as the preview's last edit.
    assert!(
        fake.wait_for(|_| shown(&fake, USER, "overloaded right now"), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let texts = fake.sent_texts(USER);
    assert!(
        texts
            .iter()
            .all(|t| !t.contains("sk-123") && !t.contains("acct-7731")),
        "no secret echoed: {texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("overloaded right now") && t.contains("/reset")),
        "a passing failure keeps the hint to start over: {texts:?}"
    );
    // The chat still works afterwards.
    llm.push(Script::text("fine now"));
    fake.push_text(USER, USER, "three");
    assert!(
        fake.wait_for(|_| shown(&fake, USER, "fine now"), WAIT)
            .await
    );
    bot.shutdown().await;
}

fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A zombie (state Z) is dead for our purposes.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_kills_a_command_backend_script_and_its_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n(sleep 300; echo never) &\necho $! > {pids}\necho $$ >> {pids}\necho working\nsleep 300\n",
            pids = pids.display()
        ),
    )
    .unwrap();
    let text = format!(
        "[agent]\nbackend = \"command\"\n\n[agent.command]\nargv = [\"sh\", \"{}\", \"{{message}}\"]\nkill_grace_ms = 300\n\n[store]\nin_memory = true\n",
        script.display()
    );
    let config = Config::parse(Path::new("cmd.toml"), &text, Purpose::Console, |_| None).unwrap();
    let sent = Recorder::new();
    let engine = open_engine(
        &config,
        AgentSetup::without_tools(build_agent(&config.agent).unwrap()),
        sent.clone(),
    )
    .await
    .unwrap();
    engine.adapter.handle_message(make_event("go", 1)).await;
    let read_pids = || {
        std::fs::read_to_string(&pids)
            .ok()
            .map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .filter(|p| p.len() == 2)
    };
    assert!(eventually(WAIT, || read_pids().is_some()).await);
    let pids = read_pids().unwrap();
    assert!(pids.iter().all(|&p| pid_alive(p)));
    engine.adapter.handle_message(make_event("/stop", 1)).await;
    assert!(sent.any_contains("⏹ Stopped"));
    assert!(
        eventually(WAIT, || pids.iter().all(|&p| !pid_alive(p))).await,
        "processes left: {pids:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_chats_share_one_store_and_every_transcript_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(&telegate::config::StoreSettings {
        data_dir: dir.path().to_path_buf(),
        in_memory: false,
        ..Default::default()
    })
    .await
    .unwrap();
    let sent = Recorder::new();
    let engine = Engine::new(EngineParts {
        store: Some(telegate::wiring::tables::runner(&store)),
        adapter: AdapterConfig {
            busy_mode: BusyMode::Queue,
            max_pending: 100,
            ..AdapterConfig::default()
        },
        ..EngineParts::new(Arc::new(EchoAgent::default()), sent.clone())
    });
    // A ticker shows the runtime stays responsive while the store works.
    let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_millis(2));
            loop {
                interval.tick().await;
                ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
    };
    let chats: Vec<i64> = (1..=200).collect();
    let mut senders = Vec::new();
    for &chat in &chats {
        let adapter = engine.adapter.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..5 {
                adapter
                    .handle_message(make_event(&format!("m{i}"), chat))
                    .await;
            }
        }));
    }
    for sender in senders {
        sender.await.unwrap();
    }
    assert!(
        sent.wait_until(Duration::from_secs(60), |d| {
            d.iter()
                .filter(|d| d.reply.text.starts_with("echo:"))
                .count()
                == 1000
        })
        .await
    );
    assert!(eventually(WAIT, || engine.adapter.is_idle()).await);
    ticker.abort();
    assert!(ticks.load(std::sync::atomic::Ordering::Relaxed) >= 3);
    for &chat in &chats {
        let key = engine.adapter.session_key(&make_event("x", chat).source);
        let session = store
            .sessions()
            .current_session(key.as_str())
            .await
            .unwrap()
            .unwrap();
        let history = store
            .transcripts()
            .load_history(&session.session_id, None)
            .await
            .unwrap();
        let contents: Vec<(Role, String)> =
            history.into_iter().map(|e| (e.role, e.content)).collect();
        let expected: Vec<(Role, String)> = (0..5)
            .flat_map(|i| {
                [
                    (Role::User, format!("m{i}")),
                    (Role::Assistant, format!("echo: m{i}")),
                ]
            })
            .collect();
        assert_eq!(contents, expected, "chat {chat}");
    }
}
