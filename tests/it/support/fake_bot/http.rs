//! The HTTP layer: routing `/bot{token}/{method}`, JSON and multipart bodies.

use super::super::fake_files::{download_path, file_part};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

use super::conn::ConnHandle;
use super::state::{ApiFailure, Reply, Shared};
use super::telegram::MAX_BODY_BYTES;
use super::types::Outcome;
use super::updates::canonical_method;

/// The only handler: routes `/bot{token}/{method}` for any token. Written
/// as a fallback with manual path parsing so every malformed request still
/// gets a Telegram-shaped JSON error instead of an axum rejection.
pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(conn): ConnectInfo<ConnHandle>,
    request: Request,
) -> Response {
    if let Some(path) = download_path(request.uri().path()) {
        let path = path.to_owned();
        return shared.files.download(&path).await;
    }
    let Some(method) = method_from_path(request.uri().path()) else {
        return ApiFailure::new(404, "Not Found").to_response();
    };
    let method = canonical_method(&method);
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let multipart_boundary = content_type.and_then(multipart_boundary);
    let body = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await;
    let parsed = match (body, multipart_boundary) {
        (Err(_), _) => Err(ApiFailure::new(413, "Request Entity Too Large")),
        (Ok(bytes), Some(boundary)) => parse_multipart(&bytes, &boundary, &method),
        (Ok(bytes), None) => parse_body(&bytes),
    };
    let recorded_body = parsed.as_ref().map_or(Value::Null, Clone::clone);
    let guard = shared.begin_call(&method, recorded_body);
    let reply = match parsed {
        Ok(body) => shared.serve_call(guard.seq, &method, body).await,
        Err(failure) => Reply::Answer(Err(failure)),
    };
    match reply {
        Reply::Answer(Ok(result)) => {
            guard.finish(Outcome::Ok(result.clone()));
            (
                StatusCode::OK,
                Json(json!({ "ok": true, "result": result })),
            )
                .into_response()
        }
        Reply::Answer(Err(failure)) => {
            guard.finish(Outcome::Error {
                code: failure.code,
                description: failure.description.clone(),
            });
            failure.to_response()
        }
        Reply::Hang => {
            // Until hyper drops this handler (the client hung up or the
            // fake shut down); the guard then records `Cancelled`.
            std::future::pending::<()>().await;
            StatusCode::NO_CONTENT.into_response()
        }
        Reply::Garbage(result) => {
            guard.finish(match result {
                Ok(value) => Outcome::Garbled(value),
                Err(failure) => Outcome::Error {
                    code: failure.code,
                    description: failure.description,
                },
            });
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body>upstream hiccup</body></html>",
            )
                .into_response()
        }
        Reply::Drop => {
            guard.finish(Outcome::Dropped);
            // Killing the connection makes hyper's write of this response
            // fail, so the client gets EOF instead of an answer.
            conn.0.kill();
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// `/bot<token>/<method>` → `method`.
pub(super) fn method_from_path(path: &str) -> Option<String> {
    let mut segments = path.trim_start_matches('/').split('/');
    let token = segments.next()?;
    let method = segments.next()?;
    let well_formed = token.starts_with("bot") && !method.is_empty() && segments.next().is_none();
    well_formed.then(|| method.to_owned())
}

/// The boundary of a `multipart/form-data` body; an empty string if the
/// header is multipart but names no boundary (parsing then fails with 400).
pub(super) fn multipart_boundary(content_type: &str) -> Option<String> {
    let mut params = content_type.split(';').map(str::trim);
    let mime = params.next()?;
    if !mime.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    let boundary = params
        .find_map(|p| p.strip_prefix("boundary="))
        .unwrap_or("");
    Some(boundary.trim_matches('"').to_owned())
}

/// Fields teloxide serialises as JSON text inside multipart bodies.
pub(super) const MULTIPART_JSON_FIELDS: &[&str] = &[
    "allowed_updates",
    "caption_entities",
    "commands",
    "entities",
    "link_preview_options",
    "media",
    "reply_markup",
    "reply_parameters",
    "scope",
];

/// teloxide uses multipart for every request that *may* carry a file (e.g.
/// `setWebhook` with its optional certificate), so text-only multipart
/// bodies are accepted as parameters. Actual file parts are refused.
pub(super) fn parse_multipart(
    bytes: &[u8],
    boundary: &str,
    method: &str,
) -> Result<Value, ApiFailure> {
    let malformed = || ApiFailure::bad_request("Bad Request: can't parse multipart/form-data body");
    if boundary.is_empty() {
        return Err(malformed());
    }
    let delimiter = format!("--{boundary}");
    let mut fields = Map::new();
    for part in split_bytes(bytes, delimiter.as_bytes()).skip(1) {
        if part.starts_with(b"--") {
            break; // closing delimiter
        }
        let part = part.strip_prefix(b"\r\n").ok_or_else(malformed)?;
        let part = part.strip_suffix(b"\r\n").ok_or_else(malformed)?;
        let split = find_bytes(part, b"\r\n\r\n").ok_or_else(malformed)?;
        let headers = std::str::from_utf8(&part[..split]).map_err(|_| malformed())?;
        let content = &part[split + 4..];
        let (name, is_file) = disposition(headers).ok_or_else(malformed)?;
        if is_file && matches!(method, "sendPhoto" | "sendDocument" | "sendVoice") {
            let filename = headers
                .split(';')
                .find_map(|p| p.trim().strip_prefix("filename="))
                .map(|f| f.lines().next().unwrap_or("").trim_matches('"').to_owned())
                .unwrap_or_default();
            fields.insert(name, file_part(&filename, content));
            continue;
        }
        if is_file {
            return Err(ApiFailure::bad_request(
                "Bad Request: file uploads are not supported by fake",
            ));
        }
        let text = std::str::from_utf8(content).map_err(|_| malformed())?;
        let value = match serde_json::from_str(text) {
            Ok(json) if MULTIPART_JSON_FIELDS.contains(&name.as_str()) => json,
            _ => Value::String(text.to_owned()),
        };
        fields.insert(name, value);
    }
    Ok(Value::Object(fields))
}

/// `(field name, has filename)` from a part's headers.
pub(super) fn disposition(headers: &str) -> Option<(String, bool)> {
    let line = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    let mut name = None;
    let mut is_file = false;
    for param in line.split(';').map(str::trim) {
        if let Some(value) = param.strip_prefix("name=") {
            name = Some(value.trim_matches('"').to_owned());
        } else if param.starts_with("filename") {
            is_file = true;
        }
    }
    Some((name?, is_file))
}

pub(super) fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Splits on every occurrence of `delimiter` (like `str::split`).
pub(super) fn split_bytes<'a>(
    mut bytes: &'a [u8],
    delimiter: &'a [u8],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        match find_bytes(bytes, delimiter) {
            Some(at) => {
                let (head, tail) = bytes.split_at(at);
                bytes = &tail[delimiter.len()..];
                Some(head)
            }
            None => {
                done = true;
                Some(bytes)
            }
        }
    })
}

/// An empty body means no parameters; anything else must be a JSON object.
pub(super) fn parse_body(bytes: &[u8]) -> Result<Value, ApiFailure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(ApiFailure::bad_request(
            "Bad Request: request body must be a JSON object",
        )),
        Err(e) => Err(ApiFailure::bad_request(format!(
            "Bad Request: can't parse JSON: {e}"
        ))),
    }
}

// ---------------------------------------------------------------------------
