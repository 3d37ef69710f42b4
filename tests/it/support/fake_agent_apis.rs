//! Fakes of the APIs the real coding CLIs talk to, on 127.0.0.1, for
//! `scripts/real-mcp.sh` (the `real_clients` tests): the Anthropic
//! Messages API Claude Code uses (`ANTHROPIC_BASE_URL`) and the OpenAI
//! Responses API Codex uses (a `model_providers` entry).
//!
//! * `POST /v1/messages`: a user message containing `REAL-PERMISSION
//!   <command>` (with a `Bash` tool offered) is answered with a `tool_use`
//!   of Bash running `<command>`; a conversation ending in a `tool_result`
//!   with "Claude finished."; anything else (Claude Code's own side
//!   requests) with "ok". Streamed (SSE) when asked, else one JSON body.
//! * `POST /v1/responses`: a streamed answer "Codex answer N" whose
//!   `usage` is this request's own: [`PER_RESPONSE_INPUT`] input tokens.
//! * Anything else: 404.
//! * A request whose last item is a user message containing `REAL-SLOW`
//!   (either API) is answered only after a minute: a turn to /stop.
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

/// The last item of the conversation (`messages` of the Messages API,
/// `input` of the Responses API) is the user's and its text has `needle`.
fn last_user_says(body: &Value, needle: &str) -> bool {
    let last = body["messages"]
        .as_array()
        .or_else(|| body["input"].as_array())
        .and_then(|items| items.last());
    let Some(last) = last else {
        return false;
    };
    last["role"] == "user" && last["content"].to_string().contains(needle)
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
    let command = user_texts(body).iter().find_map(|t| {
        t.find("REAL-PERMISSION ").map(|i| {
            t[i + "REAL-PERMISSION ".len()..]
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
    });
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
