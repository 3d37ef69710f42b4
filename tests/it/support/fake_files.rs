//! Files for the fake Bot API: `getFile`, the file download URL
//! (`/file/bot<token>/<file_path>`) and the uploads of `sendPhoto` /
//! `sendDocument` / `sendVoice`, kept apart from `fake_bot/` which only routes to it.
//!
//! Behaves like Telegram where telegate can tell: `getFile` answers
//! `file_id`, `file_unique_id`, `file_size` and a relative `file_path`;
//! an unknown id is `400 Bad Request: invalid file_id`; files above 20 MB
//! are `400 Bad Request: file is too big`; the download URL serves the
//! bytes and 404 for anything else. Downloads can be held before their
//! headers (to stop a bot mid-download) or stalled after them (headers
//! and a first byte, then nothing: a hung transfer), and are counted. A
//! file can also be "on the Bot API server's disk": getFile then answers
//! its absolute path, as a local server (`--local`) does.
//! [`minimal_pdf`] writes real PDF files for tests to send.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::watch;

/// Telegram's cloud download limit.
pub const DOWNLOAD_LIMIT: usize = 20 * 1024 * 1024;

/// One file a test made available.
#[derive(Clone, Debug)]
struct StoredFile {
    unique_id: String,
    /// Relative (served at the download URL), or absolute (on disk).
    path: String,
    bytes: Arc<Vec<u8>>,
    /// The size getFile reports (the real size unless overridden).
    size: usize,
}

/// One upload the bot made.
#[derive(Clone, Debug, PartialEq)]
pub struct Upload {
    /// `sendPhoto`, `sendDocument` or `sendVoice`.
    pub method: String,
    /// The chat.
    pub chat_id: i64,
    /// The uploaded file's name.
    pub file_name: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The caption, if any.
    pub caption: Option<String>,
    /// The message it replies to, if any.
    pub reply_to: Option<i64>,
}

#[derive(Default)]
struct State {
    files: HashMap<String, StoredFile>,
    next: u64,
    uploads: Vec<Upload>,
    downloads: usize,
    /// Bodies stalled right now (headers sent, the rest held).
    stalled_now: usize,
    /// Stalled bodies the client hung up on before they were finished.
    abandoned: usize,
}

/// The fake's file store (cheap to clone).
#[derive(Clone)]
pub struct FakeFiles {
    state: Arc<Mutex<State>>,
    /// `true` while downloads are held.
    hold: Arc<watch::Sender<bool>>,
    /// `true` while bodies stall after their first byte.
    stall: Arc<watch::Sender<bool>>,
}

impl Default for FakeFiles {
    fn default() -> Self {
        FakeFiles {
            state: Arc::default(),
            hold: Arc::new(watch::channel(false).0),
            stall: Arc::new(watch::channel(false).0),
        }
    }
}

/// A stalled body's bookkeeping: counted while it stalls; dropped before
/// it finished, it counts as abandoned by the client.
struct StallGuard {
    files: FakeFiles,
    finished: bool,
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        let mut state = self.files.lock();
        state.stalled_now -= 1;
        if !self.finished {
            state.abandoned += 1;
        }
    }
}

impl FakeFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make `bytes` downloadable; returns the file id. `ext` names the
    /// file path's extension (`oga`, `jpg`, `txt`...).
    pub fn add(&self, bytes: Vec<u8>, ext: &str) -> String {
        let size = bytes.len();
        self.add_with_size(bytes, ext, size)
    }

    /// Like [`FakeFiles::add`], but getFile reports `size` (to fake big
    /// files without allocating them).
    pub fn add_with_size(&self, bytes: Vec<u8>, ext: &str, size: usize) -> String {
        let mut state = self.lock();
        state.next += 1;
        let n = state.next;
        let id = format!("fakefile-{n}");
        state.files.insert(
            id.clone(),
            StoredFile {
                unique_id: format!("uniq{n}"),
                path: format!("files/file_{n}.{ext}"),
                bytes: Arc::new(bytes),
                size,
            },
        );
        id
    }

    /// A file "on the Bot API server's disk" at `path` (absolute): getFile
    /// answers that path, as a local Bot API server does. Returns the id.
    pub fn add_on_disk(&self, path: &std::path::Path, size: usize) -> String {
        let mut state = self.lock();
        state.next += 1;
        let n = state.next;
        let id = format!("fakefile-{n}");
        state.files.insert(
            id.clone(),
            StoredFile {
                unique_id: format!("uniq{n}"),
                path: path.display().to_string(),
                bytes: Arc::new(Vec::new()),
                size,
            },
        );
        id
    }

    /// The unique id of `file_id`.
    pub fn unique_id(&self, file_id: &str) -> String {
        self.lock().files[file_id].unique_id.clone()
    }

    /// Hold every download until [`FakeFiles::release_downloads`].
    pub fn hold_downloads(&self) {
        self.hold.send_replace(true);
    }

    /// Let held and later downloads through.
    pub fn release_downloads(&self) {
        self.hold.send_replace(false);
    }

    /// From now on every download answers its headers and first byte,
    /// then sends nothing until [`FakeFiles::release_stalls`].
    pub fn stall_bodies(&self) {
        self.stall.send_replace(true);
    }

    /// Let stalled bodies finish (and later ones through whole).
    pub fn release_stalls(&self) {
        self.stall.send_replace(false);
    }

    /// Bodies stalled right now.
    pub fn stalled_now(&self) -> usize {
        self.lock().stalled_now
    }

    /// Stalled bodies the client hung up on.
    pub fn abandoned(&self) -> usize {
        self.lock().abandoned
    }

    /// How many downloads were answered with the file.
    pub fn downloads(&self) -> usize {
        self.lock().downloads
    }

    /// Every upload so far, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.lock().uploads.clone()
    }

    /// `getFile`.
    pub fn get_file(&self, body: &Value) -> Result<Value, (u16, String)> {
        let id = body
            .get("file_id")
            .and_then(Value::as_str)
            .ok_or((400, "Bad Request: file_id is empty".to_string()))?;
        let state = self.lock();
        let file = state
            .files
            .get(id)
            .ok_or((400, "Bad Request: invalid file_id".to_string()))?;
        if file.size > DOWNLOAD_LIMIT {
            return Err((400, "Bad Request: file is too big".to_string()));
        }
        Ok(json!({
            "file_id": id,
            "file_unique_id": file.unique_id,
            "file_size": file.size,
            "file_path": file.path,
        }))
    }

    /// `GET /file/bot<token>/<path>`.
    pub async fn download(&self, path: &str) -> Response {
        let mut hold = self.hold.subscribe();
        // Held: wait (the client may give up, which drops this future).
        while *hold.borrow_and_update() {
            if hold.changed().await.is_err() {
                break;
            }
        }
        let mut state = self.lock();
        let found = state
            .files
            .values()
            .find(|f| f.path == path)
            .map(|f| f.bytes.clone());
        match found {
            Some(bytes) if *self.stall.borrow() && !bytes.is_empty() => {
                state.downloads += 1;
                state.stalled_now += 1;
                drop(state);
                self.stalled_body(bytes)
            }
            Some(bytes) => {
                state.downloads += 1;
                (StatusCode::OK, bytes.as_ref().clone()).into_response()
            }
            None => (
                StatusCode::NOT_FOUND,
                axum::Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
            )
                .into_response(),
        }
    }

    /// Headers (with the whole length) and the first byte now, the rest
    /// once stalls are released.
    fn stalled_body(&self, bytes: Arc<Vec<u8>>) -> Response {
        let guard = StallGuard {
            files: self.clone(),
            finished: false,
        };
        let stall = self.stall.subscribe();
        let length = bytes.len();
        let body = futures::stream::unfold(
            (0u8, guard, stall, bytes),
            |(step, mut guard, mut stall, bytes)| async move {
                match step {
                    0 => {
                        let first = axum::body::Bytes::copy_from_slice(&bytes[..1]);
                        Some((Ok::<_, std::io::Error>(first), (1, guard, stall, bytes)))
                    }
                    1 => {
                        while *stall.borrow_and_update() {
                            if stall.changed().await.is_err() {
                                break;
                            }
                        }
                        guard.finished = true;
                        let rest = axum::body::Bytes::copy_from_slice(&bytes[1..]);
                        Some((Ok(rest), (2, guard, stall, bytes)))
                    }
                    _ => None,
                }
            },
        );
        Response::builder()
            .status(StatusCode::OK)
            .header(axum::http::header::CONTENT_LENGTH, length)
            .body(axum::body::Body::from_stream(body))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
    }

    /// `sendPhoto` / `sendDocument` / `sendVoice`: record the upload and
    /// answer with the sent message (`base` carries message_id, from, chat,
    /// date). A caption longer than Telegram's 1024 characters is refused.
    pub fn upload(
        &self,
        method: &str,
        body: &Value,
        mut base: Value,
    ) -> Result<Value, (u16, String)> {
        let field = match method {
            "sendPhoto" => "photo",
            "sendVoice" => "voice",
            _ => "document",
        };
        let part = body.get(field).ok_or((
            400,
            format!("Bad Request: there is no {field} in the request"),
        ))?;
        // `attach://<name>`: the file is the multipart part of that name.
        let part = match part.as_str().and_then(|p| p.strip_prefix("attach://")) {
            Some(name) => body
                .get(name)
                .ok_or((400, format!("Bad Request: wrong {field} file")))?,
            None => part,
        };
        let bytes = part
            .get("data_b64")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .ok_or((400, format!("Bad Request: wrong {field} file")))?;
        if bytes.is_empty() {
            return Err((400, "Bad Request: file must be non-empty".to_string()));
        }
        let chat_id = match body.get("chat_id") {
            Some(Value::String(s)) => s.parse().unwrap_or_default(),
            Some(v) => v.as_i64().unwrap_or_default(),
            None => 0,
        };
        let caption = body
            .get("caption")
            .and_then(Value::as_str)
            .map(str::to_string);
        if caption
            .as_ref()
            .is_some_and(|c| c.encode_utf16().count() > 1024)
        {
            return Err((400, "Bad Request: message caption is too long".to_string()));
        }
        let reply_to = body
            .get("reply_parameters")
            .and_then(|r| r.get("message_id"))
            .and_then(Value::as_i64);
        let file_name = part
            .get("filename")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut state = self.lock();
        state.next += 1;
        let n = state.next;
        let size = bytes.len();
        state.uploads.push(Upload {
            method: method.to_string(),
            chat_id,
            file_name: file_name.clone(),
            bytes,
            caption: caption.clone(),
            reply_to,
        });
        let meta = json!({"file_id": format!("sent-{n}"), "file_unique_id": format!("sentu{n}"), "file_size": size});
        if method == "sendPhoto" {
            let mut photo = meta;
            photo["width"] = json!(100);
            photo["height"] = json!(100);
            base["photo"] = json!([photo]);
        } else if method == "sendVoice" {
            let mut voice = meta;
            voice["duration"] = json!(1);
            voice["mime_type"] = json!("audio/ogg");
            base["voice"] = voice;
        } else {
            let mut document = meta;
            document["file_name"] = json!(file_name);
            base["document"] = document;
        }
        if let Some(caption) = caption {
            base["caption"] = json!(caption);
        }
        Ok(base)
    }
}

/// `/file/bot<token>/<path>` → `<path>`.
pub fn download_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/file/bot")?;
    let (_token, file) = rest.split_once('/')?;
    (!file.is_empty()).then_some(file)
}

/// The JSON of a file part in a recorded multipart body.
pub fn file_part(filename: &str, bytes: &[u8]) -> Value {
    json!({
        "filename": filename,
        "data_b64": base64::engine::general_purpose::STANDARD.encode(bytes),
    })
}

/// A voice note (`voice` field of a message).
pub fn voice_json(file_id: &str, unique_id: &str, size: usize) -> Value {
    json!({"voice": {"file_id": file_id, "file_unique_id": unique_id, "duration": 2,
        "mime_type": "audio/ogg", "file_size": size}})
}

/// A document.
pub fn document_json(file_id: &str, unique_id: &str, name: &str, mime: &str, size: usize) -> Value {
    json!({"document": {"file_id": file_id, "file_unique_id": unique_id, "file_name": name,
        "mime_type": mime, "file_size": size}})
}

/// A photo with one size.
pub fn photo_json(file_id: &str, unique_id: &str, size: usize) -> Value {
    json!({"photo": [{"file_id": file_id, "file_unique_id": unique_id, "width": 64,
        "height": 64, "file_size": size}]})
}

/// A minimal valid PDF written by hand: one page showing `lines` in
/// Helvetica, or, without lines, a page that only shows an image (like a
/// scanned page with no text layer). Offsets are computed, so the
/// cross-reference table is right.
pub fn minimal_pdf(lines: &[&str]) -> Vec<u8> {
    let content = if lines.is_empty() {
        "q 200 0 0 200 72 500 cm /Im1 Do Q".to_string()
    } else {
        let mut text = String::from("BT /F1 12 Tf 72 720 Td 14 TL\n");
        for line in lines {
            text.push_str(&format!("({line}) Tj T*\n"));
        }
        text + "ET"
    };
    // The start of a JPEG: pixels, no text.
    let pixels: &[u8] = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00";
    let mut image = format!(
        "<< /Type /XObject /Subtype /Image /Width 2 /Height 2 /ColorSpace /DeviceGray \
         /BitsPerComponent 8 /Filter /DCTDecode /Length {} >>\nstream\n",
        pixels.len()
    )
    .into_bytes();
    image.extend_from_slice(pixels);
    image.extend_from_slice(b"\nendstream");
    let objects: Vec<Vec<u8>> = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>".to_vec(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_vec(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] \
          /Resources << /Font << /F1 3 0 R >> /XObject << /Im1 6 0 R >> >> /Contents 5 0 R >>"
            .to_vec(),
        format!(
            "<< /Length {} >>\nstream\n{content}\nendstream",
            content.len() + 1
        )
        .into_bytes(),
        image,
    ];
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(object);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for offset in offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}
