//! The `openai` backend against a fake OpenAI-compatible server: streaming,
//! the request shape, the tool loop, every error class, cancellation and
//! lenient parsing. Each test drives [`OpenAiAgent`] directly with a
//! hand-made [`TurnRequest`].

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use support::fake_openai::{FakeOpenAi, Script, COMMENTS_TEXT, DEFAULT_TEXT};
use telegate::agent::{Agent, AgentError, AgentReply, OpenAiAgent, OpenAiConfig, TurnRequest};
use telegate::secrets::Secret;
use telegate::tools::{NoTools, ToolContext, ToolDefinition, ToolError, ToolRegistry};
use telegate::vocab::{
    ChatMessage, Platform, Progress, Role, SessionId, SessionKey, SessionSource, TurnGeneration,
};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(2);

fn turn(text: &str, history: Vec<ChatMessage>) -> TurnRequest {
    TurnRequest {
        session_key: SessionKey::from_raw("agent:main:console:dm:1"),
        session_id: SessionId::new("s"),
        generation: TurnGeneration(1),
        source: SessionSource::dm(Platform::Console, 1),
        text: text.to_string(),
        history,
        internal: false,
        cancel: CancellationToken::new(),
        progress: Progress::new(),
        model: None,
    }
}

fn config(fake: &FakeOpenAi) -> OpenAiConfig {
    OpenAiConfig::new(fake.base_url(), "fake-model")
}

fn agent_with(
    config: OpenAiConfig,
    tools: Arc<dyn ToolRegistry>,
    key: Option<&str>,
) -> Arc<OpenAiAgent> {
    Arc::new(OpenAiAgent::new(config, key.map(Secret::new), tools).unwrap())
}

fn agent(fake: &FakeOpenAi) -> Arc<OpenAiAgent> {
    agent_with(config(fake), Arc::new(NoTools), Some("sk-test"))
}

async fn run(agent: &OpenAiAgent, turn: TurnRequest) -> Result<AgentReply, AgentError> {
    tokio::time::timeout(WAIT, agent.run(turn))
        .await
        .expect("the turn did not finish in time")
}

fn user_message(result: Result<AgentReply, AgentError>) -> String {
    match result {
        Err(AgentError::Backend { user_message, .. } | AgentError::Setup { user_message, .. }) => {
            user_message
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

fn messages(request: &Value) -> Vec<Value> {
    request["messages"].as_array().unwrap().clone()
}

fn roles(request: &Value) -> Vec<String> {
    messages(request)
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_string())
        .collect()
}

/// Tools for the tests: `add` sums, `boom` panics, `wait` runs until
/// cancelled.
struct TestTools;

impl ToolRegistry for TestTools {
    fn prepare<'a>(&'a self, _ctx: &'a ToolContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    fn attach_store(&self, _child_groups: &telegate::store::ChildGroups) {}

    fn definitions(&self) -> Vec<ToolDefinition> {
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        });
        vec![
            ToolDefinition {
                name: "add".into(),
                description: "Adds two numbers.".into(),
                parameters: schema,
            },
            ToolDefinition {
                name: "boom".into(),
                description: "Always crashes.".into(),
                parameters: json!({"type": "object"}),
            },
            ToolDefinition {
                name: "wait".into(),
                description: "Runs until the turn is cancelled.".into(),
                parameters: json!({"type": "object"}),
            },
        ]
    }

    fn call<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            match name {
                "add" => {
                    let args: Value = serde_json::from_str(arguments)
                        .map_err(|e| ToolError::BadArguments(e.to_string()))?;
                    let (Some(a), Some(b)) = (args["a"].as_f64(), args["b"].as_f64()) else {
                        return Err(ToolError::BadArguments("a and b must be numbers".into()));
                    };
                    Ok((a + b).to_string())
                }
                "boom" => panic!("kaboom"),
                "wait" => {
                    WAIT_TOOL_ENTERED.store(true, std::sync::atomic::Ordering::SeqCst);
                    ctx.cancel.cancelled().await;
                    Err(ToolError::Failed("cancelled".into()))
                }
                _ => Err(ToolError::UnknownTool(name.to_string())),
            }
        })
    }
}

/// Set once the `wait` tool runs (only one test calls it).
static WAIT_TOOL_ENTERED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Generous bound for conditions on a loaded machine.
const SETTLE: Duration = Duration::from_secs(10);

/// Wait (polling) until `cond` holds, at most [`SETTLE`]: the condition, not
/// a guessed delay, says when the test may go on.
async fn until(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

fn tools_agent(fake: &FakeOpenAi) -> Arc<OpenAiAgent> {
    agent_with(config(fake), Arc::new(TestTools), None)
}

// --- streaming and the request ---

#[tokio::test]
async fn streamed_deltas_show_before_the_reply_and_add_up_to_it() {
    let fake = FakeOpenAi::start().await;
    let chunks = ["Hel", "lo, ", "wor", "ld"];
    fake.push(Script::stream(&chunks, Duration::from_millis(60)));
    let agent = agent(&fake);
    let turn = turn("hi", Vec::new());
    let mut watch = turn.progress.watch();
    let running = tokio::spawn(async move { agent.run(turn).await });

    assert!(tokio::time::timeout(WAIT, watch.changed()).await.unwrap());
    let partial = watch.latest();
    assert!(!running.is_finished(), "progress came only with the reply");
    assert!(
        !partial.is_empty() && "Hello, world".starts_with(&partial) && partial != "Hello, world"
    );

    let reply = tokio::time::timeout(WAIT, running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply.text, chunks.concat());
    assert_eq!(
        reply.transcript,
        [ChatMessage::new(Role::Assistant, "Hello, world")]
    );
    assert_eq!(fake.disconnects(), 0);
}

#[tokio::test]
async fn the_request_has_the_system_prompt_then_history_then_the_message() {
    let fake = FakeOpenAi::start().await;
    let config = OpenAiConfig {
        system_prompt: Some("You are terse.".into()),
        temperature: Some(0.5),
        max_tokens: Some(100),
        ..config(&fake)
    };
    let agent = agent_with(config, Arc::new(NoTools), Some("sk-test"));
    let history = vec![
        ChatMessage::new(Role::User, "first"),
        ChatMessage::new(Role::Assistant, "answer"),
    ];
    let reply = run(&agent, turn("second", history)).await.unwrap();
    assert_eq!(reply.text, DEFAULT_TEXT);

    let request = &fake.requests()[0];
    assert_eq!(roles(request), ["system", "user", "assistant", "user"]);
    let contents: Vec<&str> = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["You are terse.", "first", "answer", "second"]);
    assert_eq!(request["model"], "fake-model");
    assert_eq!(request["stream"], true);
    assert_eq!(request["temperature"], 0.5);
    assert_eq!(request["max_tokens"], 100);
    assert!(
        request.get("tools").is_none(),
        "no tools means no tools key"
    );
    assert_eq!(fake.authorizations(), [Some("Bearer sk-test".to_string())]);
}

#[tokio::test]
async fn without_a_key_no_authorization_is_sent() {
    let fake = FakeOpenAi::start().await;
    let agent = agent_with(config(&fake), Arc::new(NoTools), None);
    run(&agent, turn("hi", Vec::new())).await.unwrap();
    assert_eq!(fake.authorizations(), [None]);
}

#[tokio::test]
async fn a_long_history_is_trimmed_to_the_budget_with_the_system_prompt_first() {
    let fake = FakeOpenAi::start().await;
    let budget = 2_000;
    let config = OpenAiConfig {
        system_prompt: Some("System.".into()),
        history_budget_chars: budget,
        ..config(&fake)
    };
    let agent = agent_with(config, Arc::new(NoTools), None);
    let history: Vec<ChatMessage> = (0..100)
        .map(|i| {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            ChatMessage::new(role, format!("message {i}: {}", "x".repeat(90)))
        })
        .collect();
    run(&agent, turn("latest", history)).await.unwrap();

    let request = &fake.requests()[0];
    let sent = messages(request);
    let total: usize = sent
        .iter()
        .map(|m| m["content"].as_str().unwrap().chars().count())
        .sum();
    assert!(
        total <= budget,
        "sent {total} chars for a budget of {budget}"
    );
    assert!(sent.len() > 3, "some history still fits");
    assert_eq!(sent[0]["role"], "system");
    assert_eq!(sent[0]["content"], "System.");
    assert_eq!(sent[sent.len() - 1]["content"], "latest");
    assert!(sent[sent.len() - 2]["content"]
        .as_str()
        .unwrap()
        .starts_with("message 99:"));
}

// --- the tool loop ---

#[tokio::test]
async fn a_tool_call_round_trips() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::tool_call("add", r#"{"a": 2, "b": 3}"#, "call_1"));
    fake.push(Script::text("The sum is 5."));
    let reply = run(&tools_agent(&fake), turn("what is 2+3?", Vec::new()))
        .await
        .unwrap();
    assert_eq!(reply.text, "The sum is 5.");

    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let names: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["add", "boom", "wait"]);
    assert_eq!(requests[0]["tools"][0]["type"], "function");

    let second = messages(&requests[1]);
    assert_eq!(roles(&requests[1]), ["user", "assistant", "tool"]);
    let call = &second[1]["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "add");
    assert_eq!(call["function"]["arguments"], r#"{"a": 2, "b": 3}"#);
    assert_eq!(second[2]["tool_call_id"], "call_1");
    assert_eq!(second[2]["content"], "5");

    let transcript: Vec<Role> = reply.transcript.iter().map(|m| m.role).collect();
    assert_eq!(transcript, [Role::Assistant, Role::Tool, Role::Assistant]);
    assert!(reply.transcript[0].tool_calls.is_some());
    assert_eq!(reply.transcript[1].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(reply.transcript[1].content, "5");
    assert_eq!(reply.transcript[2].content, "The sum is 5.");
}

#[tokio::test]
async fn an_unknown_tool_becomes_an_error_result_and_the_loop_goes_on() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::tool_call("nope", "{}", "call_x"));
    fake.push(Script::text("recovered"));
    let reply = run(&tools_agent(&fake), turn("go", Vec::new()))
        .await
        .unwrap();
    assert_eq!(reply.text, "recovered");
    let result = &messages(&fake.requests()[1])[2];
    let content = result["content"].as_str().unwrap();
    assert!(content.starts_with("error: "), "{content}");
    assert!(
        content.contains("nope") && content.contains("add"),
        "{content}"
    );
}

#[tokio::test]
async fn bad_arguments_and_a_panicking_tool_become_error_results() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::tool_call("add", r#"{"a": "#, "c1"));
    fake.push(Script::tool_call("boom", "{}", "c2"));
    fake.push(Script::text("still here"));
    let reply = run(&tools_agent(&fake), turn("go", Vec::new()))
        .await
        .unwrap();
    assert_eq!(reply.text, "still here");
    let last = messages(&fake.requests()[2]);
    assert!(last[2]["content"]
        .as_str()
        .unwrap()
        .starts_with("error: bad arguments"));
    let crashed = last[4]["content"].as_str().unwrap();
    assert!(
        crashed.starts_with("error: ") && crashed.contains("kaboom"),
        "{crashed}"
    );
}

#[tokio::test]
async fn the_tool_budget_ends_the_loop_with_a_clear_message() {
    let fake = FakeOpenAi::start().await;
    let config = OpenAiConfig {
        max_tool_rounds: 2,
        ..config(&fake)
    };
    let agent = agent_with(config, Arc::new(TestTools), None);
    for id in ["c1", "c2", "c3"] {
        fake.push(Script::tool_call("add", r#"{"a":1,"b":1}"#, id));
    }
    let reply = run(&agent, turn("loop", Vec::new())).await.unwrap();
    assert_eq!(fake.requests().len(), 3);
    assert!(reply.text.contains("max_tool_rounds"), "{}", reply.text);
    assert!(reply.text.contains("2 rounds"), "{}", reply.text);
    let transcript: Vec<Role> = reply.transcript.iter().map(|m| m.role).collect();
    assert_eq!(
        transcript,
        [
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool,
            Role::Assistant
        ],
        "the unanswered third call stays out"
    );
    assert!(reply.transcript[4].tool_calls.is_none());
}

#[tokio::test]
async fn cancelling_during_a_tool_returns_promptly() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::tool_call("wait", "{}", "c1"));
    let agent = tools_agent(&fake);
    let turn = turn("go", Vec::new());
    let cancel = turn.cancel.clone();
    let running = tokio::spawn(async move { agent.run(turn).await });
    assert!(
        until(|| WAIT_TOOL_ENTERED.load(std::sync::atomic::Ordering::SeqCst)).await,
        "the tool never started"
    );
    assert_eq!(fake.requests().len(), 1);
    cancel.cancel();
    let result = tokio::time::timeout(SETTLE, running)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
    assert_eq!(fake.requests().len(), 1);
}

// --- errors ---

#[tokio::test]
async fn an_error_event_mid_stream_is_a_classified_backend_error_without_the_providers_words() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::ErrorEvent(
        "Server overloaded for org-Secret123 (key sk-abcdefghijkl)".into(),
    ));
    let message = user_message(run(&agent(&fake), turn("hi", Vec::new())).await);
    assert!(message.contains("overloaded right now"), "{message}");
    assert!(!message.contains("org-Secret123"), "{message}");
    assert!(!message.contains("sk-abcdefghijkl"), "{message}");
}

#[tokio::test]
async fn http_errors_have_one_clear_message_each() {
    let fake = FakeOpenAi::start().await;
    let config = OpenAiConfig {
        api_key_env: "MY_LLM_KEY".into(),
        ..config(&fake)
    };
    let agent = agent_with(config, Arc::new(NoTools), Some("sk-wrong"));
    let error_body = |message: &str| json!({"error": {"message": message}}).to_string();
    let cases = [
        (
            401,
            "The LLM provider rejected this bot's API key (HTTP 401). The bot's owner needs to check it.",
        ),
        (404, "fake-model"),
        (429, "rate limiting"),
        (500, "internal error (HTTP 500)"),
    ];
    for (status, expected) in cases {
        fake.push(Script::Http(status, error_body("provider words")));
        let message = user_message(run(&agent, turn("hi", Vec::new())).await);
        assert!(message.contains(expected), "HTTP {status}: {message}");
    }
    fake.push(Script::Http(404, error_body("no such model")));
    let not_found = user_message(run(&agent, turn("hi", Vec::new())).await);
    assert!(not_found.contains(&fake.base_url()), "{not_found}");
    fake.push(Script::Http(
        429,
        error_body("You exceeded your current quota"),
    ));
    let limited = user_message(run(&agent, turn("hi", Vec::new())).await);
    assert!(
        limited.contains("Try again later") && limited.contains("quota"),
        "{limited}"
    );
}

#[tokio::test]
async fn a_refused_connection_says_the_llm_could_not_be_reached() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let agent = agent_with(
        OpenAiConfig::new(base_url.clone(), "m"),
        Arc::new(NoTools),
        None,
    );
    let message = user_message(run(&agent, turn("hi", Vec::new())).await);
    assert!(
        message.starts_with(&format!("Could not reach the LLM at {base_url}: ")),
        "{message}"
    );
    assert!(message.contains("connection refused"), "{message}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_with_a_clear_message() {
    // Accepts connections and reads nothing, answers nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let config = OpenAiConfig {
        request_timeout_secs: 1,
        ..OpenAiConfig::new(base_url.clone(), "m")
    };
    let agent = agent_with(config, Arc::new(NoTools), None);
    let message = user_message(run(&agent, turn("hi", Vec::new())).await);
    assert!(
        message.starts_with(&format!("Could not reach the LLM at {base_url}: ")),
        "{message}"
    );
    assert!(message.contains("request_timeout_secs"), "{message}");
    silent.abort();
}

// --- cancellation ---

#[tokio::test]
async fn cancelling_a_hanging_stream_returns_promptly_and_disconnects() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::Hang);
    let agent = agent(&fake);
    let turn = turn("hi", Vec::new());
    let cancel = turn.cancel.clone();
    let running = tokio::spawn(async move { agent.run(turn).await });
    assert!(
        until(|| fake.requests().len() == 1).await,
        "the request never arrived"
    );
    assert_eq!(fake.disconnects(), 0, "still connected while waiting");
    assert!(!running.is_finished());
    cancel.cancel();
    let result = tokio::time::timeout(SETTLE, running)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
    assert!(
        fake.wait_for_disconnect(WAIT).await,
        "the server never saw the client go away"
    );
    assert_eq!(fake.disconnects(), 1);
}

// --- lenient reading ---

#[tokio::test]
async fn a_json_answer_to_a_streaming_request_is_read_as_a_completion() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::json_text("not streamed"));
    let agent = agent(&fake);
    let turn = turn("hi", Vec::new());
    let progress = turn.progress.clone();
    let reply = run(&agent, turn).await.unwrap();
    assert_eq!(reply.text, "not streamed");
    assert_eq!(progress.snapshot(), "not streamed");
    assert_eq!(fake.requests()[0]["stream"], true);
}

#[tokio::test]
async fn with_streaming_off_the_request_says_so_and_the_json_is_read() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::json_text("plain"));
    let config = OpenAiConfig {
        stream: false,
        ..config(&fake)
    };
    let agent = agent_with(config, Arc::new(NoTools), None);
    let reply = run(&agent, turn("hi", Vec::new())).await.unwrap();
    assert_eq!(reply.text, "plain");
    assert_eq!(fake.requests()[0]["stream"], false);
}

#[tokio::test]
async fn a_non_streamed_tool_call_round_trips() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::Json(json!({
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "j1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":4,\"b\":5}"}}
            ]},
            "finish_reason": "tool_calls",
        }],
    })));
    fake.push(Script::json_text("nine"));
    let reply = run(&tools_agent(&fake), turn("4+5", Vec::new()))
        .await
        .unwrap();
    assert_eq!(reply.text, "nine");
    let second = messages(&fake.requests()[1]);
    assert_eq!(second[1]["content"], Value::Null);
    assert_eq!(second[2]["content"], "9");
}

#[tokio::test]
async fn sse_comments_and_chunks_missing_fields_are_tolerated() {
    let fake = FakeOpenAi::start().await;
    fake.push(Script::Comments);
    let reply = run(&agent(&fake), turn("hi", Vec::new())).await.unwrap();
    assert_eq!(reply.text, COMMENTS_TEXT);
}
