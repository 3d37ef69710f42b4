//! A fake OpenAI-compatible speech endpoint, `POST /v1/audio/speech`,
//! mounted on the fake LLM server.
//!
//! Like OpenAI: the body is JSON with `model`, `voice` and `input` (400
//! with an OpenAI-shaped error when one is missing or empty); the answer
//! is the audio bytes. For `response_format: "opus"` these are an Ogg
//! container, `OggS` followed by the input text, so a test can tell which
//! text was spoken; any other format answers MP3-looking bytes (`ID3…`).
//! Every request is recorded with its `Authorization` header. A test can
//! make every request fail with a status, or answer MP3 whatever is asked
//! (a server that ignores `response_format`).
#![allow(dead_code)]

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

/// One recorded speech request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpeechRequest {
    /// The JSON body.
    pub body: Value,
    /// The `Authorization` header, as sent.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct Inner {
    requests: Vec<SpeechRequest>,
    fail_with: Option<u16>,
    always_mp3: bool,
}

/// The endpoint's state (cheap to clone).
#[derive(Clone, Default)]
pub struct FakeSpeaker(Arc<Mutex<Inner>>);

/// The audio the fake answers for `text` in Ogg/Opus.
pub fn ogg_of(text: &str) -> Vec<u8> {
    let mut audio = b"OggS".to_vec();
    audio.extend_from_slice(text.as_bytes());
    audio
}

impl FakeSpeaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Answer every request with `status` (an OpenAI-shaped error).
    pub fn fail_with(&self, status: Option<u16>) {
        self.lock().fail_with = status;
    }

    /// Answer MP3 bytes whatever format is asked for.
    pub fn always_mp3(&self, on: bool) {
        self.lock().always_mp3 = on;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<SpeechRequest> {
        self.lock().requests.clone()
    }

    /// The router serving `/v1/audio/speech`.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/audio/speech", post(handle))
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

async fn handle(State(state): State<FakeSpeaker>, headers: HeaderMap, body: String) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let Ok(body) = serde_json::from_str::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "We could not parse the JSON body.");
    };
    state.lock().requests.push(SpeechRequest {
        body: body.clone(),
        authorization,
    });
    let (fail_with, always_mp3) = {
        let inner = state.lock();
        (inner.fail_with, inner.always_mp3)
    };
    if let Some(status) = fail_with {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(
            status,
            "The server had an error while processing your request.",
        );
    }
    for field in ["model", "voice", "input"] {
        if body[field].as_str().unwrap_or("").is_empty() {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("you must provide a {field} parameter"),
            );
        }
    }
    let input = body["input"].as_str().unwrap_or_default();
    if body["response_format"] == "opus" && !always_mp3 {
        ([(header::CONTENT_TYPE, "audio/ogg")], ogg_of(input)).into_response()
    } else {
        let mut audio = b"ID3\x04".to_vec();
        audio.extend_from_slice(input.as_bytes());
        ([(header::CONTENT_TYPE, "audio/mpeg")], audio).into_response()
    }
}
