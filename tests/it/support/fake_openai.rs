//! A fake OpenAI-compatible server on 127.0.0.1 for backend tests.
//!
//! Each request to `POST /v1/chat/completions` takes the next [`Script`] from
//! a queue (a short stream "ok" when the queue is empty), and its JSON body is
//! recorded. Scripts queued with [`FakeOpenAi::push_when`] only answer a
//! request their predicate accepts (the first matching script wins), so
//! tests with several chats talking at once stay deterministic; a
//! [`Script::Gated`] answer waits until the test opens its [`Gate`]. Streamed responses are wrapped so that a client hanging up
//! before the end is counted as a disconnect: that is how tests check that a
//! cancelled turn really dropped the connection.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::fake_speech::FakeSpeaker;
use super::fake_transcribe::FakeTranscriber;

/// The text [`Script::Comments`] streams after its odd chunks.
pub const COMMENTS_TEXT: &str = "comments ok";
/// The text a response has when the script queue is empty.
pub const DEFAULT_TEXT: &str = "ok";
/// The text [`Script::ErrorEvent`] streams before its error.
pub const ERROR_EVENT_PREFIX: &str = "partial ";

/// What the fake does for one request.
#[derive(Clone, Debug)]
pub enum Script {
    /// Stream each chunk as a content delta, `delay` before each, then
    /// `finish_reason: "stop"` and `[DONE]`.
    Stream {
        chunks: Vec<String>,
        delay: Duration,
    },
    /// Stream one tool call, its arguments split across several deltas.
    ToolCall {
        name: String,
        arguments: String,
        id: String,
    },
    /// Stream a little text, then `data: {"error": {"message": …}}`.
    ErrorEvent(String),
    /// Answer with this status and (JSON) body.
    Http(u16, String),
    /// Send SSE headers, then nothing, forever.
    Hang,
    /// Answer with this non-streamed completion body (application/json).
    Json(Value),
    /// SSE comment lines and chunks missing fields, then [`COMMENTS_TEXT`].
    Comments,
    /// Wait until the gate opens, then answer like the inner script.
    Gated(Gate, Box<Script>),
    /// A streamed answer (`Stream` or `ToolCall`) whose last chunk before
    /// `[DONE]` reports this `usage` object, as OpenAI does: only when the
    /// request asks with `stream_options.include_usage`, as a final chunk
    /// with empty `choices`.
    WithUsage(Box<Script>, Value),
}

/// A gate a [`Script::Gated`] answer waits for. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(watch::Sender::new(false)))
    }

    /// Let every waiting (and future) answer through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Which requests a script may answer.
pub type Matcher = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// The text content of every message of a request, in order, with roles.
pub fn messages(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap_or_default().to_string(),
                        m["content"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The last message of a request is from the user and contains `needle`.
pub fn last_user_contains(needle: &str) -> Matcher {
    let needle = needle.to_string();
    Arc::new(move |request| {
        messages(request)
            .last()
            .is_some_and(|(role, text)| role == "user" && text.contains(&needle))
    })
}

/// The last message is a tool result and the conversation mentions `needle`
/// (in a user message).
pub fn tool_result_after(needle: &str) -> Matcher {
    let needle = needle.to_string();
    Arc::new(move |request| {
        let messages = messages(request);
        messages.last().is_some_and(|(role, _)| role == "tool")
            && messages
                .iter()
                .any(|(role, text)| role == "user" && text.contains(&needle))
    })
}

/// The last tool result of a request.
pub fn last_tool_result(request: &Value) -> Option<String> {
    messages(request)
        .into_iter()
        .rev()
        .find(|(role, _)| role == "tool")
        .map(|(_, text)| text)
}

impl Script {
    /// A quick stream of `text` in one chunk.
    pub fn text(text: &str) -> Script {
        Script::Stream {
            chunks: vec![text.to_string()],
            delay: Duration::ZERO,
        }
    }

    /// A stream of `chunks`, `delay` before each.
    pub fn stream(chunks: &[&str], delay: Duration) -> Script {
        Script::Stream {
            chunks: chunks.iter().map(|c| c.to_string()).collect(),
            delay,
        }
    }

    /// A streamed tool call.
    pub fn tool_call(name: &str, arguments: &str, id: &str) -> Script {
        Script::ToolCall {
            name: name.to_string(),
            arguments: arguments.to_string(),
            id: id.to_string(),
        }
    }

    /// This streamed answer, ending with a usage chunk of `prompt` and
    /// `completion` tokens.
    pub fn with_usage(self, prompt: u64, completion: u64) -> Script {
        Script::WithUsage(
            Box::new(self),
            json!({"prompt_tokens": prompt, "completion_tokens": completion,
                   "total_tokens": prompt + completion}),
        )
    }

    /// A non-streamed completion answering `text`.
    pub fn json_text(text: &str) -> Script {
        Script::Json(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": "fake",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
    }
}

struct Shared {
    scripts: Mutex<VecDeque<(Option<Matcher>, Script)>>,
    requests: Mutex<Vec<Value>>,
    authorizations: Mutex<Vec<Option<String>>>,
    disconnects: watch::Sender<usize>,
}

/// The running fake. Dropping it stops the server.
pub struct FakeOpenAi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
    /// `POST /v1/audio/transcriptions` (see `fake_transcribe.rs`).
    pub transcriber: FakeTranscriber,
    /// `POST /v1/audio/speech` (see `fake_speech.rs`).
    pub speaker: FakeSpeaker,
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeOpenAi {
    /// Start on a free port of 127.0.0.1.
    pub async fn start() -> FakeOpenAi {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            scripts: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
            authorizations: Mutex::new(Vec::new()),
            disconnects: watch::Sender::new(0),
        });
        let transcriber = FakeTranscriber::default();
        let speaker = FakeSpeaker::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(shared.clone())
            .merge(transcriber.router())
            .merge(speaker.router());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeOpenAi {
            addr,
            shared,
            server,
            transcriber,
            speaker,
        }
    }

    /// `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queue the answer to a coming request.
    pub fn push(&self, script: Script) {
        self.shared
            .scripts
            .lock()
            .unwrap()
            .push_back((None, script));
    }

    /// Queue the answer to a coming request that `matcher` accepts.
    pub fn push_when(&self, matcher: Matcher, script: Script) {
        self.shared
            .scripts
            .lock()
            .unwrap()
            .push_back((Some(matcher), script));
    }

    /// Every request body so far that `matcher` accepts.
    pub fn requests_matching(&self, matcher: &Matcher) -> Vec<Value> {
        self.requests().into_iter().filter(|r| matcher(r)).collect()
    }

    /// Scripts not used yet.
    pub fn scripts_left(&self) -> usize {
        self.shared.scripts.lock().unwrap().len()
    }

    /// Every request body so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Every request's `Authorization` header so far, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared.authorizations.lock().unwrap().clone()
    }

    /// How many streamed responses the client dropped before their end.
    pub fn disconnects(&self) -> usize {
        *self.shared.disconnects.borrow()
    }

    /// Wait until at least one disconnect was seen, at most `timeout`.
    pub async fn wait_for_disconnect(&self, timeout: Duration) -> bool {
        let mut rx = self.shared.disconnects.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|count| *count > 0))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    shared.requests.lock().unwrap().push(request.clone());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    shared.authorizations.lock().unwrap().push(authorization);
    let script = take_script(&shared, &request);
    let mut script = script.unwrap_or_else(|| Script::text(DEFAULT_TEXT));
    while let Script::Gated(gate, inner) = script {
        gate.opened().await;
        script = *inner;
    }
    // Like OpenAI: a stream reports usage only when asked.
    let include_usage = request["stream_options"]["include_usage"] == json!(true);
    respond(script, shared, include_usage)
}

/// The first queued script whose matcher accepts `request`.
fn take_script(shared: &Shared, request: &Value) -> Option<Script> {
    let mut scripts = shared.scripts.lock().unwrap();
    let index = scripts
        .iter()
        .position(|(matcher, _)| matcher.as_ref().is_none_or(|m| m(request)))?;
    scripts.remove(index).map(|(_, script)| script)
}

fn respond(script: Script, shared: Arc<Shared>, include_usage: bool) -> Response {
    match script {
        Script::Http(status, body) => json_response(status, body),
        Script::Json(body) => json_response(200, body.to_string()),
        Script::Hang => sse_response(Box::pin(futures::stream::pending()), shared),
        Script::Stream { chunks, delay } => {
            let mut frames: Vec<(Duration, String)> = vec![(Duration::ZERO, role_chunk())];
            frames.extend(chunks.iter().map(|c| (delay, data(&content_delta(c)))));
            frames.push((Duration::ZERO, data(&finish("stop"))));
            sse_response(timed_frames(frames), shared)
        }
        Script::ToolCall {
            name,
            arguments,
            id,
        } => sse_response(
            timed_frames(tool_call_frames(&name, &arguments, &id)),
            shared,
        ),
        Script::ErrorEvent(message) => {
            let frames = vec![
                (Duration::ZERO, data(&content_delta(ERROR_EVENT_PREFIX))),
                (
                    Duration::ZERO,
                    data(
                        &json!({"error": {"message": message, "type": "server_error", "code": null}}),
                    ),
                ),
            ];
            sse_response(timed_frames_without_done(frames), shared)
        }
        Script::Comments => sse_response(timed_frames(comment_frames()), shared),
        Script::Gated(_, inner) => respond(*inner, shared, include_usage),
        Script::WithUsage(inner, usage) => {
            let mut frames = match *inner {
                Script::Stream { chunks, delay } => {
                    let mut frames: Vec<(Duration, String)> = vec![(Duration::ZERO, role_chunk())];
                    frames.extend(chunks.iter().map(|c| (delay, data(&content_delta(c)))));
                    frames.push((Duration::ZERO, data(&finish("stop"))));
                    frames
                }
                Script::ToolCall {
                    name,
                    arguments,
                    id,
                } => tool_call_frames(&name, &arguments, &id),
                other => panic!("usage is only added to streams and tool calls, not {other:?}"),
            };
            if include_usage {
                frames.push((
                    Duration::ZERO,
                    data(
                        &json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                 "model": "fake", "choices": [], "usage": usage}),
                    ),
                ));
            }
            sse_response(timed_frames(frames), shared)
        }
    }
}

fn json_response(status: u16, body: String) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap()
}

fn sse_response(frames: FrameStream, shared: Arc<Shared>) -> Response {
    let body = Tracked {
        frames,
        shared,
        completed: false,
    };
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap()
}

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

fn role_chunk() -> String {
    data(&chunk(json!({"role": "assistant", "content": ""}), None))
}

fn content_delta(text: &str) -> Value {
    chunk(json!({"content": text}), None)
}

fn finish(reason: &str) -> Value {
    chunk(json!({}), Some(reason))
}

fn tool_call_frames(name: &str, arguments: &str, id: &str) -> Vec<(Duration, String)> {
    let step = Duration::from_millis(5);
    let mut frames = vec![
        (Duration::ZERO, role_chunk()),
        (
            step,
            data(&chunk(
                json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                None,
            )),
        ),
    ];
    for piece in split_in_three(arguments) {
        frames.push((
            step,
            data(&chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                None,
            )),
        ));
    }
    frames.push((Duration::ZERO, data(&finish("tool_calls"))));
    frames
}

fn split_in_three(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(3).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

fn comment_frames() -> Vec<(Duration, String)> {
    let raw = [
        ": keep-alive\n\n".to_string(),
        ": OPENROUTER PROCESSING\n\n".to_string(),
        "data: {\"id\":\"chatcmpl-fake\"}\n\n".to_string(),
        "data: {\"choices\":[]}\n\n".to_string(),
        "data: {\"choices\":[{\"index\":0}]}\n\n".to_string(),
        ": a comment inside\n".to_string()
            + "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"logprobs\":null,\"x_unknown\":{\"a\":1}}],\"usage\":null}\n\n",
        data(&content_delta("comments ")),
        "\n".to_string(),
        data(&json!({"choices": [{"index": 0, "delta": {"content": "ok", "reasoning": null}}], "system_fingerprint": "fp"})),
        data(&finish("stop")),
    ];
    raw.into_iter()
        .map(|frame| (Duration::ZERO, frame))
        .collect()
}

type FrameStream = Pin<Box<dyn Stream<Item = Frame> + Send>>;

/// One piece of a streamed body; `last` marks the end of the script.
struct Frame {
    bytes: Bytes,
    last: bool,
}

/// `frames` then `[DONE]`.
fn timed_frames(mut frames: Vec<(Duration, String)>) -> FrameStream {
    frames.push((Duration::ZERO, "data: [DONE]\n\n".to_string()));
    timed_frames_without_done(frames)
}

fn timed_frames_without_done(frames: Vec<(Duration, String)>) -> FrameStream {
    let count = frames.len();
    Box::pin(futures::stream::iter(frames.into_iter().enumerate()).then(
        move |(i, (delay, text))| async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Frame {
                bytes: Bytes::from(text),
                last: i + 1 == count,
            }
        },
    ))
}

/// A response body that counts a disconnect when it is dropped before its
/// last frame was sent (hyper drops the body when the client goes away).
struct Tracked {
    frames: FrameStream,
    shared: Arc<Shared>,
    completed: bool,
}

impl Stream for Tracked {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.frames.poll_next_unpin(cx) {
            Poll::Ready(Some(frame)) => {
                if frame.last {
                    self.completed = true;
                }
                Poll::Ready(Some(Ok(frame.bytes)))
            }
            Poll::Ready(None) => {
                self.completed = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.completed {
            self.shared.disconnects.send_modify(|count| *count += 1);
        }
    }
}
