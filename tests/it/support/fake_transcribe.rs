//! A fake OpenAI-compatible transcription endpoint,
//! `POST /v1/audio/transcriptions`, mounted on the fake LLM server.
//!
//! Like OpenAI: the body must be `multipart/form-data` with a `file` part
//! and a `model` field (400 with an OpenAI-shaped error otherwise); the
//! answer is `{"text": …}`. The transcript is the one a test registered
//! for exactly these audio bytes; unknown audio is answered 400
//! ("Invalid file format"), so a test can only pass if the bot sent the
//! very bytes Telegram served. Every request is recorded, with its
//! `Authorization` header. A test can make requests hang (until released
//! or the client gives up) or answer with an error status, as a
//! misconfigured endpoint does.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

/// One recorded transcription request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TranscriptionRequest {
    pub model: Option<String>,
    pub language: Option<String>,
    pub file_name: Option<String>,
    pub file: Vec<u8>,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State_ {
    transcripts: HashMap<Vec<u8>, String>,
    requests: Vec<TranscriptionRequest>,
    /// Answer every request with this status and an error.
    fail_with: Option<u16>,
    /// Requests hanging right now.
    hanging_now: usize,
}

/// The endpoint's state (cheap to clone).
#[derive(Clone)]
pub struct FakeTranscriber(Arc<Mutex<State_>>, Arc<tokio::sync::watch::Sender<bool>>);

impl Default for FakeTranscriber {
    fn default() -> Self {
        FakeTranscriber(
            Arc::default(),
            Arc::new(tokio::sync::watch::channel(false).0),
        )
    }
}

/// Counts a hanging request while it hangs.
struct Hanging(FakeTranscriber);

impl Drop for Hanging {
    fn drop(&mut self) {
        self.0.lock().hanging_now -= 1;
    }
}

impl FakeTranscriber {
    fn lock(&self) -> std::sync::MutexGuard<'_, State_> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests from now on hang until [`FakeTranscriber::release`].
    pub fn hang(&self) {
        self.1.send_replace(true);
    }

    /// Let hanging and later requests be answered.
    pub fn release(&self) {
        self.1.send_replace(false);
    }

    /// Requests hanging right now.
    pub fn hanging_now(&self) -> usize {
        self.lock().hanging_now
    }

    /// Answer every request with `status` (an OpenAI-shaped error).
    pub fn fail_with(&self, status: u16) {
        self.lock().fail_with = Some(status);
    }

    /// Answer `text` for exactly these audio bytes.
    pub fn register(&self, audio: &[u8], text: &str) {
        self.lock()
            .transcripts
            .insert(audio.to_vec(), text.to_string());
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<TranscriptionRequest> {
        self.lock().requests.clone()
    }

    /// The router serving `/v1/audio/transcriptions`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/audio/transcriptions", post(handle))
            .with_state(self.clone())
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": "invalid_request_error"}})),
    )
        .into_response()
}

async fn handle(State(state): State<FakeTranscriber>, headers: HeaderMap, body: Bytes) -> Response {
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with("multipart/form-data"))
        .and_then(|v| v.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_string());
    let Some(boundary) = boundary else {
        return error(
            StatusCode::BAD_REQUEST,
            "Invalid Content-Type header; expected multipart/form-data",
        );
    };
    let mut request = parse(&body, &boundary);
    request.authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    state.lock().requests.push(request.clone());
    let mut hold = state.1.subscribe();
    if *hold.borrow_and_update() {
        state.lock().hanging_now += 1;
        let _hanging = Hanging(state.clone());
        while *hold.borrow_and_update() {
            if hold.changed().await.is_err() {
                break;
            }
        }
    }
    if let Some(status) = state.lock().fail_with {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::UNAUTHORIZED);
        return error(status, "Incorrect API key provided.");
    }
    if request.model.as_deref().unwrap_or("").is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "you must provide a model parameter",
        );
    }
    if request.file.is_empty() {
        return error(StatusCode::BAD_REQUEST, "you must provide a file");
    }
    let text = state.lock().transcripts.get(&request.file).cloned();
    match text {
        Some(text) => Json(json!({"text": text})).into_response(),
        None => error(StatusCode::BAD_REQUEST, "Invalid file format."),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn parse(body: &[u8], boundary: &str) -> TranscriptionRequest {
    let delimiter = format!("--{boundary}");
    let mut request = TranscriptionRequest::default();
    let mut rest = body;
    while let Some(at) = find(rest, delimiter.as_bytes()) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            break;
        }
        let Some(end) = find(rest, delimiter.as_bytes()) else {
            break;
        };
        let part = &rest[..end];
        let part = part.strip_prefix(b"\r\n").unwrap_or(part);
        let part = part.strip_suffix(b"\r\n").unwrap_or(part);
        let Some(split) = find(part, b"\r\n\r\n") else {
            continue;
        };
        let headers = String::from_utf8_lossy(&part[..split]).to_string();
        let content = &part[split + 4..];
        let name = headers
            .split(';')
            .find_map(|p| p.trim().strip_prefix("name="))
            .map(|n| n.lines().next().unwrap_or("").trim_matches('"').to_string());
        let file_name = headers
            .split(';')
            .find_map(|p| p.trim().strip_prefix("filename="))
            .map(|n| n.lines().next().unwrap_or("").trim_matches('"').to_string());
        let text = || String::from_utf8_lossy(content).to_string();
        match name.as_deref() {
            Some("file") => {
                request.file = content.to_vec();
                request.file_name = file_name;
            }
            Some("model") => request.model = Some(text()),
            Some("language") => request.language = Some(text()),
            _ => {}
        }
    }
    request
}
