//! Fakes of the APIs the real coding agents talk to, on 127.0.0.1, for
//! `scripts/real-agents.sh` (the `real_clients` and `real_agents` tests):
//! the Anthropic Messages API Claude Code uses (`ANTHROPIC_BASE_URL`), the
//! OpenAI Responses API Codex uses (a `model_providers` entry), the OpenAI
//! chat completions API OpenCode uses (a provider with a `baseURL`) and
//! the Gemini API Gemini CLI uses (`GOOGLE_GEMINI_BASE_URL`).
//!
//! * `POST /v1/messages`: a user message containing `REAL-PERMISSION
//!   <command>` (with a `Bash` tool offered) is answered with a `tool_use`
//!   of Bash running `<command>`; a conversation ending in a `tool_result`
//!   with "Claude finished."; anything else (Claude Code's own side
//!   requests) with "ok". Streamed (SSE) when asked, else one JSON body.
//! * `POST /v1/responses`: a streamed answer "Codex answer N" whose
//!   `usage` is this request's own: [`PER_RESPONSE_INPUT`] input tokens.
//! * `POST /v1/chat/completions`: "OpenCode answer N" (N counts the
//!   requests whose last message is the user's), streamed as
//!   `chat.completion.chunk`s with the usage chunk asked by
//!   `stream_options.include_usage`, then `[DONE]`; with a `bash` tool
//!   offered, `REAL-PERMISSION <command>` is answered with a `bash` tool
//!   call, and a conversation ending in its `tool` result with "OpenCode
//!   finished.".
//! * `POST /v1beta/models/M:generateContent` and `:streamGenerateContent`
//!   (`?alt=sse`): "Gemini answer N" as a candidate; a request asking for
//!   JSON (`responseMimeType` / `responseJsonSchema`: Gemini CLI's model
//!   router and next-speaker checks) gets a JSON object with the fields
//!   those read; `REAL-PERMISSION <command>` with `run_shell_command`
//!   offered becomes its `functionCall`, a conversation ending in its
//!   `functionResponse` "Gemini finished.". `:countTokens` counts 10.
//! * Anything else: 404.
//! * A request whose last item is a user message containing `REAL-SLOW`
//!   (any API) is answered only after a minute: a turn to /stop.
//!
//! Every request is recorded (path, authorization, body).

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

/// The input tokens each fake Responses answer reports.
pub const PER_RESPONSE_INPUT: u64 = 1000;

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Recorded>>,
}

pub struct FakeAgentApis {
    pub port: u16,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl Drop for FakeAgentApis {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeAgentApis {
    pub async fn start() -> FakeAgentApis {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeAgentApis {
            port,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// The Responses requests answered so far.
    pub fn responses_served(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/responses"))
            .collect()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = uri.path().to_string();
    let authorization = headers
        .get(header::AUTHORIZATION)
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let served = {
        let mut requests = shared.requests.lock().unwrap();
        requests.push(Recorded {
            path: path.clone(),
            authorization,
            body: body.clone(),
        });
        requests.iter().filter(|r| r.path == path).count()
    };
    if last_user_says(&body, "REAL-SLOW") {
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    }
    if path.ends_with("/v1/messages") {
        messages(&body)
    } else if path.ends_with("/chat/completions") {
        chat_completions(&body, served_where(&shared, &path, last_is_user))
    } else if path.contains(":generateContent") || path.contains(":streamGenerateContent") {
        let n = served_where(&shared, "Content", |b| last_is_user(b) && !wants_json(b));
        gemini(&body, path.contains(":stream"), n)
    } else if path.contains(":countTokens") {
        json_response(json!({"totalTokens": 10}))
    } else if path.ends_with("/v1/messages/count_tokens") {
        json_response(json!({"input_tokens": 10}))
    } else if path.ends_with("/responses") {
        responses(served)
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                r#"{"error":{"type":"not_found","message":"not here"}}"#,
            ))
            .unwrap()
    }
}

/// The last item of the conversation (`messages` of the Messages and
/// chat completions APIs, `input` of the Responses API, `contents` of
/// the Gemini API).
fn last_item(body: &Value) -> Option<&Value> {
    body["messages"]
        .as_array()
        .or_else(|| body["input"].as_array())
        .or_else(|| body["contents"].as_array())
        .and_then(|items| items.last())
}

/// The last item is the user's and the last text in it has `needle`
/// (the last one: Claude Code folds the user messages after an
/// interrupted turn into one, the stopped message first).
fn last_user_says(body: &Value, needle: &str) -> bool {
    let Some(last) = last_item(body).filter(|last| last["role"] == "user") else {
        return false;
    };
    let content = if last["parts"].is_null() {
        &last["content"]
    } else {
        &last["parts"]
    };
    let text = match content {
        Value::Array(blocks) => blocks
            .iter()
            .rev()
            .find_map(|b| b["text"].as_str())
            .unwrap_or_default()
            .to_string(),
        other => other.to_string(),
    };
    text.contains(needle)
}

/// The last item is a user message with text (not a tool result).
fn last_is_user(body: &Value) -> bool {
    last_item(body).is_some_and(|last| {
        last["role"] == "user"
            && !last.to_string().contains("\"functionResponse\"")
            && !last.to_string().contains("\"tool_result\"")
    })
}

/// How many recorded requests to a path containing `path` (this one
/// included) `which` picks.
fn served_where(shared: &Shared, path: &str, which: impl Fn(&Value) -> bool) -> usize {
    let requests = shared.requests.lock().unwrap();
    requests
        .iter()
        .filter(|r| r.path.contains(path) && which(&r.body))
        .count()
        .max(1)
}

/// `command` of the first user text `REAL-PERMISSION <command>`.
fn permission_command(texts: &[String]) -> Option<String> {
    texts.iter().find_map(|t| {
        t.find("REAL-PERMISSION ").map(|i| {
            t[i + "REAL-PERMISSION ".len()..]
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
    })
}

fn json_response(value: Value) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(value.to_string()))
        .unwrap()
}

fn sse(events: Vec<(&str, Value)>) -> Response {
    let mut text = String::new();
    for (name, data) in events {
        text.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(text))
        .unwrap()
}

/// The text of every user message's content (strings and text blocks).
fn user_texts(body: &Value) -> Vec<String> {
    let mut texts = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        if message["role"] != "user" {
            continue;
        }
        match &message["content"] {
            Value::String(text) => texts.push(text.clone()),
            Value::Array(blocks) => {
                for block in blocks {
                    if let Some(text) = block["text"].as_str() {
                        texts.push(text.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    texts
}

fn ends_in_tool_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
}

fn offers_bash(body: &Value) -> bool {
    body["tools"]
        .as_array()
        .is_some_and(|tools| tools.iter().any(|t| t["name"] == "Bash"))
}

fn messages(body: &Value) -> Response {
    let command = permission_command(&user_texts(body));
    let block = match command {
        Some(_) if ends_in_tool_result(body) => json!({"type": "text", "text": "Claude finished."}),
        Some(command) if offers_bash(body) => json!({
            "type": "tool_use", "id": "toolu_real_1", "name": "Bash",
            "input": {"command": command, "description": "Run the requested command"}
        }),
        _ => json!({"type": "text", "text": "ok"}),
    };
    let stop = if block["type"] == "tool_use" {
        "tool_use"
    } else {
        "end_turn"
    };
    let model = body["model"].as_str().unwrap_or("claude-fake").to_string();
    let usage = json!({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
    if body["stream"] != true {
        return json_response(json!({
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": stop, "stop_sequence": null, "usage": usage
        }));
    }
    let (start, delta) = if block["type"] == "tool_use" {
        (
            json!({"type": "tool_use", "id": block["id"], "name": "Bash", "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        )
    } else {
        (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": block["text"]}),
        )
    };
    sse(vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": start}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ])
}

fn responses(n: usize) -> Response {
    let text = format!("Codex answer {n}");
    let id = format!("resp_{n}");
    let item = json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"),
        "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]});
    sse(vec![
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": id}}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "role": "assistant", "id": format!("msg_{n}"), "status": "in_progress", "content": []}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": format!("msg_{n}"),
            "output_index": 0, "content_index": 0, "delta": text}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "response": {"id": id, "status": "completed",
            "usage": {"input_tokens": PER_RESPONSE_INPUT, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": PER_RESPONSE_INPUT + 10}}}),
        ),
    ])
}

/// An OpenAI chat completions answer (OpenCode's provider API).
fn chat_completions(body: &Value, n: usize) -> Response {
    let model = body["model"].as_str().unwrap_or("fake-model").to_string();
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let texts: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .collect();
    let offers_tool = |name: &str| {
        body["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == name))
    };
    let after_tool = messages.last().is_some_and(|m| m["role"] == "tool");
    let delta = match permission_command(&texts) {
        Some(_) if after_tool => json!({"role": "assistant", "content": "OpenCode finished."}),
        Some(command) if offers_tool("bash") => json!({"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_real_1", "type": "function",
            "function": {"name": "bash", "arguments": json!({
                "command": command, "description": "Run the requested command"}).to_string()}
        }]}),
        _ => json!({"role": "assistant", "content": format!("OpenCode answer {n}")}),
    };
    let finish = if delta["tool_calls"].is_null() {
        "stop"
    } else {
        "tool_calls"
    };
    let usage = json!({"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105});
    let chunk = |choices: Value, usage: Value| {
        json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk", "created": 1,
               "model": model, "choices": choices, "usage": usage})
    };
    if body["stream"] != true {
        let mut message = delta.clone();
        if message["content"].is_null() {
            message["content"] = Value::Null;
        }
        return json_response(
            json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion",
            "created": 1, "model": model, "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}),
        );
    }
    let mut text = String::new();
    for data in [
        chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": finish}]),
            Value::Null,
        ),
        chunk(json!([]), usage),
    ] {
        text.push_str(&format!("data: {data}\n\n"));
    }
    text.push_str("data: [DONE]\n\n");
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(text))
        .unwrap()
}

/// The request asks for a JSON answer (Gemini CLI's side requests).
fn wants_json(body: &Value) -> bool {
    let config = &body["generationConfig"];
    config["responseMimeType"] == "application/json"
        || !config["responseJsonSchema"].is_null()
        || !config["responseSchema"].is_null()
}

/// A Gemini API answer (`generateContent`, or one SSE event of
/// `streamGenerateContent`).
fn gemini(body: &Value, stream: bool, n: usize) -> Response {
    let contents = body["contents"].as_array().cloned().unwrap_or_default();
    let texts: Vec<String> = contents
        .iter()
        .filter(|c| c["role"] == "user")
        .flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    let offers_shell = body["tools"].as_array().is_some_and(|tools| {
        tools.iter().any(|t| {
            t["functionDeclarations"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["name"] == "run_shell_command"))
        })
    });
    let after_tool = contents
        .last()
        .is_some_and(|c| c.to_string().contains("\"functionResponse\""));
    let part = if wants_json(body) {
        json!({"text": json!({"complexity_reasoning": "A simple request.", "complexity_score": 10,
            "reasoning": "The model answered.", "next_speaker": "user"}).to_string()})
    } else {
        match permission_command(&texts) {
            Some(_) if after_tool => json!({"text": "Gemini finished."}),
            Some(command) if offers_shell => json!({"functionCall": {"name": "run_shell_command",
                "args": {"command": command, "description": "Run the requested command"}}}),
            _ => json!({"text": format!("Gemini answer {n}")}),
        }
    };
    let answer = json!({
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 5, "totalTokenCount": 105},
        "modelVersion": body["model"].as_str().unwrap_or("gemini-fake"),
        "responseId": format!("gemini-{n}")
    });
    if !stream {
        return json_response(answer);
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(format!("data: {answer}\r\n\r\n")))
        .unwrap()
}
