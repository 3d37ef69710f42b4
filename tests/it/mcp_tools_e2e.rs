//! MCP servers as tools of the openai backend, end to end: the real bot
//! against the fake Bot API and the fake LLM (which scripts the tool calls),
//! with the fake MCP server of `tests/fixtures/mcp_server.py` over stdio
//! and streamable HTTP. The model calls a tool and gets its result capped;
//! `allowed_tools` filters; `approval = "always"` shows the card, which the
//! starter's press or /approve answers and another user cannot, and which
//! a timeout denies; /stop withdraws a slow call; a server that died is
//! started again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::support;
use support::buttons::{message_text, toasts, wait_button, wait_message_text, wait_toast};
use support::fake_bot::FakeBotApi;
use support::fake_openai::{
    last_tool_result, last_user_contains, messages, FakeOpenAi, Matcher, Script,
};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use support::tools_bot::{ToolsBot, CHAT_A, CHAT_B, WAIT};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_server.py")
}

/// A bot with the openai backend and `mcp` as its `[[tools.mcp]]` tables
/// (`{fixture}` and `{dir}` replaced), no terminal tool; `terminal` is the
/// `[tools.terminal]` table's body (its approval timeout is the gate's).
pub(crate) async fn start(mcp: &str, terminal: &str) -> (ToolsBot, TempDir) {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let workdir = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mcp = mcp
        .replace("{fixture}", &fixture().display().to_string())
        .replace("{dir}", &dir.path().display().to_string());
    let bot = TestBot::new(&fake)
        .users(&[CHAT_A, CHAT_B])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[delivery]\nstreaming = \"edit\"\n\n\
             [store]\nin_memory = true\n\n\
             [agent]\nbackend = \"openai\"\n\n\
             [agent.openai]\nbase_url = \"{llm}\"\nmodel = \"fake\"\napi_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n\n\
             [tools.terminal]\n{terminal}\n\n{mcp}\n",
            llm = llm.base_url(),
        ))
        .start()
        .await
        .expect("bot starts");
    (
        ToolsBot {
            fake,
            llm,
            bot,
            workdir,
        },
        dir,
    )
}

const STDIO: &str = "[[tools.mcp]]\nname = \"fake\"\ncommand = \"{fixture}\"\nargs = [\"stdio\"]\nenv = { FAKE_MCP_DIR = \"{dir}\" }\n";

/// The last message is a tool result containing `needle`.
fn tool_result_contains(needle: &str) -> Matcher {
    let needle = needle.to_string();
    Arc::new(move |request: &Value| {
        messages(request)
            .last()
            .is_some_and(|(role, text)| role == "tool" && text.contains(&needle))
    })
}

/// The model calls `tool` with `arguments` on `trigger`, then says
/// `answer` after any tool result of that turn.
pub(crate) fn script(t: &ToolsBot, trigger: &str, tool: &str, arguments: Value, answer: &str) {
    t.llm.push_when(
        last_user_contains(trigger),
        Script::tool_call(tool, &arguments.to_string(), "call-1"),
    );
    t.llm.push_when(
        support::fake_openai::tool_result_after(trigger),
        Script::text(answer),
    );
}

pub(crate) fn tool_result(t: &ToolsBot, trigger: &str) -> String {
    let requests = t
        .llm
        .requests_matching(&support::fake_openai::tool_result_after(trigger));
    assert!(!requests.is_empty(), "a request with the tool result");
    last_tool_result(&requests[0]).unwrap()
}

pub(crate) fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            t["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_gets_filtered_tools_and_capped_results_from_a_stdio_server() {
    let mcp = format!(
        "{STDIO}allowed_tools = [\"echo\", \"big\", \"whoami\"]\nresult_cap_bytes = 2000\n"
    );
    let (t, dir) = start(&mcp, "").await;
    script(
        &t,
        "A: big",
        "fake__big",
        json!({"bytes": 50000}),
        "A: read it",
    );
    t.send(CHAT_A, "A: big");
    assert!(t.wait_text(CHAT_A, "A: read it").await);
    let first = &t.llm.requests_matching(&last_user_contains("A: big"))[0];
    // The server's tools as offered (telegate's own, e.g. `schedule`,
    // come beside them).
    let names: Vec<_> = tool_names(first)
        .into_iter()
        .filter(|name| name.starts_with("fake__"))
        .collect();
    assert_eq!(
        names,
        ["fake__echo", "fake__big", "fake__whoami"],
        "allowed_tools filters"
    );
    let result = tool_result(&t, "A: big");
    assert!(result.len() <= 2000, "capped: {} bytes", result.len());
    assert!(
        result.contains("more bytes of the result were left out"),
        "{result}"
    );
    assert!(result.starts_with("BBBB"));
    assert!(
        !t.texts(CHAT_A).iter().any(|m| m.contains("Approval")),
        "a read-only tool runs without asking under approval = \"dangerous\""
    );

    script(&t, "A: who", "fake__whoami", json!({}), "A: known");
    t.send(CHAT_A, "A: who");
    assert!(t.wait_text(CHAT_A, "A: known").await);
    let who: Value = serde_json::from_str(&tool_result(&t, "A: who")).unwrap();
    assert_eq!(
        who["pid"], who["pgid"],
        "the server leads its own process group"
    );
    assert_eq!(who["starts"], 1, "one server for both turns");
    // The hidden tool is not callable either.
    script(&t, "A: hidden", "fake__hidden", json!({}), "A: no such");
    t.send(CHAT_A, "A: hidden");
    assert!(t.wait_text(CHAT_A, "A: no such").await);
    assert!(tool_result(&t, "A: hidden").contains("unknown tool"));
    t.shutdown().await;
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_tool_is_left_out_and_the_servers_other_tools_still_work() {
    let mcp = STDIO.replace(
        "env = { FAKE_MCP_DIR = \"{dir}\" }",
        "env = { FAKE_MCP_DIR = \"{dir}\", FAKE_MCP_MALFORMED = \"1\" }",
    );
    assert_ne!(mcp, STDIO, "the server is asked to list malformed tools");
    let (t, dir) = start(&mcp, "").await;
    script(
        &t,
        "A: echo",
        "fake__echo",
        json!({"text": "still here"}),
        "A: echoed",
    );
    t.send(CHAT_A, "A: echo");
    assert!(t.wait_text(CHAT_A, "A: echoed").await);
    let first = &t.llm.requests_matching(&last_user_contains("A: echo"))[0];
    let names = tool_names(first);
    assert!(names.contains(&"fake__echo".to_string()), "{names:?}");
    assert!(names.contains(&"fake__write".to_string()), "{names:?}");
    for bad in ["fake__broken", "fake__listy"] {
        assert!(
            !names.contains(&bad.to_string()),
            "{bad} left out: {names:?}"
        );
    }
    assert!(tool_result(&t, "A: echo").contains("still here"));
    t.shutdown().await;
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_always_shows_the_card_and_only_the_starter_decides() {
    let (t, dir) = start(&format!("{STDIO}approval = \"always\"\n"), "").await;
    script(
        &t,
        "A: make",
        "fake__write",
        json!({"name": "made"}),
        "A: made it",
    );
    t.send(CHAT_A, "A: make");
    let (card, _, approve) = wait_button(&t.fake, CHAT_A, "Approve").await;
    let text = message_text(&t.fake, CHAT_A, card);
    assert!(
        text.contains("MCP tool write of server fake") && text.contains("\"name\": \"made\""),
        "{text}"
    );
    // Another member cannot answer it.
    t.fake.push_callback_query(CHAT_A, CHAT_B, card, &approve);
    assert!(wait_toast(&t.fake, "Only").await, "{:?}", toasts(&t.fake));
    assert!(!dir.path().join("made").exists(), "nothing ran");
    t.fake.push_callback_query(CHAT_A, CHAT_A, card, &approve);
    assert!(t.wait_text(CHAT_A, "A: made it").await);
    assert!(dir.path().join("made").exists(), "the approved call ran");
    assert!(tool_result(&t, "A: make").contains("wrote"));
    assert!(
        wait_message_text(&t.fake, CHAT_A, card, "✅ Approved by").await,
        "{}",
        message_text(&t.fake, CHAT_A, card)
    );

    // Typed answers work too: /deny refuses, /approve runs.
    script(
        &t,
        "A: again",
        "fake__write",
        json!({"name": "again"}),
        "A: refused",
    );
    t.send(CHAT_A, "A: again");
    assert!(
        t.until(|| t
            .bot
            .engine
            .runner
            .approvals()
            .unwrap()
            .is_pending(&ToolsBot::key(CHAT_A)))
            .await
    );
    t.send(CHAT_A, "/deny");
    assert!(t.wait_text(CHAT_A, "A: refused").await);
    assert!(tool_result(&t, "A: again").contains("denied by the user"));
    assert!(!dir.path().join("again").exists());
    assert!(t.settled(CHAT_A).await);
    script(
        &t,
        "A: third",
        "fake__write",
        json!({"name": "third"}),
        "A: third done",
    );
    t.send(CHAT_A, "A: third");
    assert!(
        t.until(|| t
            .bot
            .engine
            .runner
            .approvals()
            .unwrap()
            .is_pending(&ToolsBot::key(CHAT_A)))
            .await
    );
    t.send(CHAT_A, "/approve");
    assert!(t.wait_text(CHAT_A, "A: third done").await);
    assert!(dir.path().join("third").exists());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_card_is_denied_when_it_times_out() {
    let (t, dir) = start(STDIO, "approval_timeout_secs = 1").await;
    script(
        &t,
        "A: make",
        "fake__write",
        json!({"name": "late"}),
        "A: gave up",
    );
    t.send(CHAT_A, "A: make");
    assert!(t.wait_text(CHAT_A, "A: gave up").await);
    assert!(tool_result(&t, "A: make").contains("approval timed out"));
    assert!(t.wait_text(CHAT_A, "No answer in time").await);
    assert!(!dir.path().join("late").exists());
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_withdraws_a_slow_mcp_call() {
    let (t, dir) = start(STDIO, "").await;
    t.llm.push_when(
        last_user_contains("A: slow"),
        Script::tool_call("fake__slow", "{}", "call-1"),
    );
    t.send(CHAT_A, "A: slow");
    // The server has the call; the fake records the cancellation it gets.
    assert!(t.until(|| dir.path().join("slow-started").exists()).await);
    t.send(CHAT_A, "/stop");
    assert!(t.wait_text(CHAT_A, "Stopped").await);
    assert!(
        t.until(|| dir.path().join("cancelled").exists()).await,
        "the server was told the call is withdrawn"
    );
    assert_eq!(
        t.llm.requests().len(),
        1,
        "the stopped turn asked the model nothing more"
    );
    // The server still serves the next turn.
    script(
        &t,
        "A: echo",
        "fake__echo",
        json!({"text": "hi"}),
        "A: echoed",
    );
    t.send(CHAT_A, "A: echo");
    assert!(t.wait_text(CHAT_A, "A: echoed").await);
    assert_eq!(tool_result(&t, "A: echo"), "echo: hi");
    t.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_died_is_started_again() {
    let (t, dir) = start(STDIO, "").await;
    t.llm.push_when(
        last_user_contains("A: crash"),
        Script::tool_call("fake__crash", "{}", "call-1"),
    );
    t.llm.push_when(
        tool_result_contains("stopped"),
        Script::tool_call("fake__whoami", "{}", "call-2"),
    );
    t.llm
        .push_when(tool_result_contains("\"starts\""), Script::text("A: back"));
    t.send(CHAT_A, "A: crash");
    assert!(
        t.wait_text(CHAT_A, "A: back").await,
        "{:?}",
        t.texts(CHAT_A)
    );
    let requests = t.llm.requests();
    let crashed = last_tool_result(&requests[1]).unwrap();
    assert!(crashed.contains("stopped during the call"), "{crashed}");
    let who: Value = serde_json::from_str(&last_tool_result(&requests[2]).unwrap()).unwrap();
    assert_eq!(who["starts"], 2, "started again for the next call");
    let starts = std::fs::read_to_string(dir.path().join("starts")).unwrap();
    let first: i32 = starts.lines().next().unwrap().parse().unwrap();
    assert!(
        support::tools_bot::live_group_members(first).is_empty(),
        "nothing of the dead server is left"
    );
    t.shutdown().await;
}

/// The fake MCP server over streamable HTTP, wanting `auth`.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    fn start(dir: &Path, auth: &str) -> HttpServer {
        let portfile = dir.join("port");
        let child = std::process::Command::new(fixture())
            .arg("http")
            .arg(&portfile)
            .env("FAKE_MCP_DIR", dir)
            .env("FAKE_MCP_AUTH", auth)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + WAIT;
        while !portfile.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let port = std::fs::read_to_string(&portfile).unwrap().parse().unwrap();
        HttpServer { child, port }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamable_http_server_gets_its_secret_header() {
    let secrets = tempfile::tempdir().unwrap();
    let server = HttpServer::start(secrets.path(), "Bearer s3cret-token");
    let token_file = secrets.path().join("auth");
    std::fs::write(&token_file, "Bearer s3cret-token\n").unwrap();
    let mcp = format!(
        "[[tools.mcp]]\nname = \"web\"\nurl = \"http://127.0.0.1:{}/mcp\"\nheader_files = {{ Authorization = \"{}\" }}\n\
         [[tools.mcp]]\nname = \"locked\"\nurl = \"http://127.0.0.1:{}/mcp\"\n",
        server.port,
        token_file.display(),
        server.port,
    );
    let (t, _dir) = start(&mcp, "").await;
    script(
        &t,
        "A: echo",
        "web__echo",
        json!({"text": "over http"}),
        "A: done",
    );
    t.send(CHAT_A, "A: echo");
    assert!(t.wait_text(CHAT_A, "A: done").await);
    assert_eq!(tool_result(&t, "A: echo"), "echo: over http");
    let names = tool_names(&t.llm.requests()[0]);
    assert!(names.contains(&"web__echo".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("locked__")),
        "a server refusing telegate offers nothing: {names:?}"
    );
    t.shutdown().await;
}
