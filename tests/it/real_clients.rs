//! The real clients, by script (`scripts/real-mcp.sh`, never in CI: they
//! need the npm packages it installs). Each test is `#[ignore]`d and reads
//! `TELEGATE_REAL_BIN`, the `node_modules/.bin` directory holding
//! `mcp-server-filesystem`, `mcp-server-everything`, `claude` and `codex`.
//! Everything else is fake and on 127.0.0.1: the Bot API, the LLM of the
//! openai backend, the Anthropic Messages API Claude Code talks to, the
//! Responses API Codex talks to.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use telegate::transport::telegram::TelegramBot;

use crate::mcp_tools_e2e::{script, start, tool_names, tool_result};
use crate::support;
use support::buttons::{message_text, wait_button};
use support::fake_agent_apis::{FakeAgentApis, PER_RESPONSE_INPUT};
use support::fake_bot::FakeBotApi;
use support::test_bot::TestBot;
use support::tools_bot::{ToolsBot, CHAT_A};

const WAIT: Duration = Duration::from_secs(90);
const USER: i64 = 42;

fn bin(name: &str) -> PathBuf {
    let dir = std::env::var("TELEGATE_REAL_BIN")
        .expect("TELEGATE_REAL_BIN names node_modules/.bin (run scripts/real-mcp.sh)");
    Path::new(&dir).join(name)
}

async fn wait_text(t: &ToolsBot, needle: &str) -> bool {
    t.fake
        .wait_for(|_| t.texts(CHAT_A).iter().any(|m| m.contains(needle)), WAIT)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-mcp.sh"]
async fn real_filesystem_server_reads_and_writes_behind_the_card() {
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("hello.txt"), "hello from the real server").unwrap();
    let mcp = format!(
        "[[tools.mcp]]\nname = \"fs\"\ncommand = \"{}\"\nargs = [\"{}\"]\nstartup_timeout_secs = 60\n",
        bin("mcp-server-filesystem").display(),
        files.path().display()
    );
    let (t, _dir) = start(&mcp, "").await;
    let file = files.path().join("hello.txt").display().to_string();
    script(
        &t,
        "A: read",
        "fs__read_text_file",
        json!({"path": file}),
        "A: read it",
    );
    t.send(CHAT_A, "A: read");
    assert!(wait_text(&t, "A: read it").await, "{:?}", t.texts(CHAT_A));
    assert!(tool_names(&t.llm.requests()[0]).contains(&"fs__write_file".to_string()));
    assert!(tool_result(&t, "A: read").contains("hello from the real server"));
    // write_file is marked destructive: the card asks, the press allows.
    let target = files.path().join("new.txt").display().to_string();
    script(
        &t,
        "A: write",
        "fs__write_file",
        json!({"path": target, "content": "written"}),
        "A: wrote",
    );
    t.send(CHAT_A, "A: write");
    let (card, _, approve) = wait_button(&t.fake, CHAT_A, "Approve").await;
    assert!(message_text(&t.fake, CHAT_A, card).contains("MCP tool write_file of server fs"));
    assert!(!files.path().join("new.txt").exists());
    t.fake.push_callback_query(CHAT_A, CHAT_A, card, &approve);
    assert!(wait_text(&t, "A: wrote").await);
    assert_eq!(
        std::fs::read_to_string(files.path().join("new.txt")).unwrap(),
        "written"
    );
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-mcp.sh"]
async fn real_everything_server_over_stdio_and_streamable_http() {
    // The HTTP one listens on PORT.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut http = std::process::Command::new(bin("mcp-server-everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mcp = format!(
        "[[tools.mcp]]\nname = \"everything\"\ncommand = \"{}\"\nargs = [\"stdio\"]\nstartup_timeout_secs = 60\nresult_cap_bytes = 4096\n\
         [[tools.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nallowed_tools = [\"echo\"]\n",
        bin("mcp-server-everything").display()
    );
    let (t, _dir) = start(&mcp, "").await;
    script(
        &t,
        "A: echo",
        "everything__echo",
        json!({"message": "hi"}),
        "A: echoed",
    );
    t.send(CHAT_A, "A: echo");
    assert!(wait_text(&t, "A: echoed").await, "{:?}", t.texts(CHAT_A));
    assert!(tool_result(&t, "A: echo").contains("hi"));
    script(
        &t,
        "A: image",
        "everything__get-tiny-image",
        json!({}),
        "A: saw",
    );
    t.send(CHAT_A, "A: image");
    assert!(wait_text(&t, "A: saw").await);
    let image = tool_result(&t, "A: image");
    assert!(
        image.contains("[image (image/png"),
        "described, not dumped: {image}"
    );
    script(
        &t,
        "A: env",
        "everything__get-env",
        json!({}),
        "A: env seen",
    );
    t.send(CHAT_A, "A: env");
    assert!(wait_text(&t, "A: env seen").await);
    let env = tool_result(&t, "A: env");
    assert!(
        env.contains("PATH") && !env.contains("CARGO_MANIFEST_DIR"),
        "minimal environment: {env}"
    );
    script(
        &t,
        "A: web",
        "web__echo",
        json!({"message": "over http"}),
        "A: web done",
    );
    t.send(CHAT_A, "A: web");
    assert!(wait_text(&t, "A: web done").await);
    assert!(tool_result(&t, "A: web").contains("over http"));
    let names = tool_names(&t.llm.requests().last().cloned().unwrap_or(Value::Null));
    assert!(
        !names.iter().any(|n| n == "web__get-env"),
        "allowed_tools: {names:?}"
    );
    t.shutdown().await;
    let _ = http.kill();
    let _ = http.wait();
}

/// A bot on `preset` running the real CLI with `extra` in `[agent.command]`.
fn test_bot(fake: &FakeBotApi, preset: &str, data: &Path, extra: &str) -> TestBot {
    TestBot::new(fake).users(&[USER]).toml(format!(
        "[delivery]\nper_chat_interval_ms = 1\nedit_interval_ms = 50\nglobal_messages_per_second = 100000\nstreaming = \"edit\"\n\n\
         [sessions]\nstall_timeout_secs = 120\n\n\
         [agent]\nbackend = \"command\"\n\n\
         [agent.command]\npreset = \"{preset}\"\ntimeout_secs = 120\n{extra}\n\n\
         [store]\ndata_dir = \"{}\"\n",
        data.display()
    ))
}

/// Wait until the chat's task is over (the CLI exited) and nothing waits.
async fn settled(bot: &TelegramBot) -> bool {
    let key = ToolsBot::key(USER);
    let adapter = &bot.engine.adapter;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if !adapter.is_active(&key) && adapter.pending_len(&key) == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn wait_answer(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(
        |_| fake.sent_texts(USER).iter().any(|t| t.contains(needle)),
        WAIT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-mcp.sh"]
async fn real_claude_code_asks_its_permission_prompt_on_the_card() {
    let fake = FakeBotApi::start().await;
    let api = FakeAgentApis::start().await;
    let data = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("permitted");
    let extra = format!(
        "program = \"{}\"\npermission_prompt = true\npermission_helper = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ ANTHROPIC_BASE_URL = \"{}\", ANTHROPIC_API_KEY = \"sk-ant-fake\", HOME = \"{}\", \
         DISABLE_AUTOUPDATER = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", DISABLE_TELEMETRY = \"1\" }}",
        bin("claude").display(),
        env!("CARGO_BIN_EXE_telegate"),
        work.path().display(),
        api.url(),
        home.path().display(),
    );
    let bot = test_bot(&fake, "claude", data.path(), &extra)
        .start()
        .await
        .unwrap();
    fake.push_text(
        USER,
        USER,
        &format!("REAL-PERMISSION touch {}", marker.display()),
    );
    let (card, _, approve) = wait_button(&fake, USER, "Approve").await;
    let text = message_text(&fake, USER, card);
    assert!(
        text.contains("Claude Code wants to use the tool Bash"),
        "{text}"
    );
    assert!(!marker.exists(), "nothing ran before the answer");
    fake.push_callback_query(USER, USER, card, &approve);
    assert!(
        wait_answer(&fake, "Claude finished.").await,
        "{:?} / API paths: {:?}",
        fake.sent_texts(USER),
        api.requests()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
    assert!(marker.exists(), "Claude Code ran the allowed command");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-mcp.sh"]
async fn real_codex_usage_after_resume_is_counted_per_turn() {
    let fake = FakeBotApi::start().await;
    let api = FakeAgentApis::start().await;
    let data = tempfile::tempdir().unwrap();
    let codex_home = tempfile::tempdir().unwrap();
    std::fs::write(
        codex_home.path().join("config.toml"),
        format!(
            "model = \"fake-model\"\nmodel_provider = \"fake\"\n\n\
             [model_providers.fake]\nname = \"fake\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\nenv_key = \"CODEX_API_KEY\"\n",
            api.url()
        ),
    )
    .unwrap();
    let extra = format!(
        "program = \"{}\"\npass_env = [\"CODEX_API_KEY\"]\n\
         env = {{ CODEX_HOME = \"{}\", CODEX_API_KEY = \"sk-codex-fake\" }}",
        bin("codex").display(),
        codex_home.path().display()
    );
    let bot = test_bot(&fake, "codex", data.path(), &extra)
        .start()
        .await
        .unwrap();
    for (n, message) in ["one", "two", "three"].iter().enumerate() {
        fake.push_text(USER, USER, message);
        let answer = format!("Codex answer {}", n + 1);
        assert!(
            wait_answer(&fake, &answer).await,
            "{:?} / API: {:?}",
            fake.sent_texts(USER),
            api.requests()
                .iter()
                .map(|r| r.path.clone())
                .collect::<Vec<_>>()
        );
        assert!(settled(&bot).await, "codex exited after turn {}", n + 1);
    }
    let served = api.responses_served();
    assert!(
        served
            .iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer sk-codex-fake")),
        "Codex sends CODEX_API_KEY"
    );
    let served_input = served.len() as u64 * PER_RESPONSE_INPUT;
    fake.push_text(USER, USER, "/status");
    assert!(
        wait_answer(&fake, "Agent usage").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let status = fake
        .sent_texts(USER)
        .into_iter()
        .rfind(|t| t.contains("Agent usage"))
        .unwrap();
    let expected = format!(
        "this session 3 turns, {:.1}k tokens in",
        served_input as f64 / 1000.0
    );
    assert!(
        status.contains(&expected),
        "served {served_input} input tokens; {status}"
    );
    bot.shutdown().await;
}
