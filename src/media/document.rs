//! A document for the model: what kind it is, its text in whatever
//! common encoding it came in (or a PDF's text, see [`super::pdf`]), cut
//! to the inline budget with a marker saying how much was cut — and what
//! the user is told about whatever the model cannot see.
//!
//! * Kind: `%PDF-` content, a PDF type or name; image types; text types
//!   or names (`text/*`, JSON, XML, YAML, `.log`, `.md`…); a file with no
//!   type (`application/octet-stream`) is sniffed: text if it decodes as
//!   text. Anything else is a file the model cannot read.
//! * Text: a byte-order mark decides (UTF-8, UTF-16LE/BE); then UTF-16
//!   without a mark by its zero bytes; then valid UTF-8; otherwise
//!   [`chardetng`] guesses the legacy encoding and [`encoding_rs`]
//!   decodes. Zero bytes or many control or undecodable characters mean
//!   binary data, which is never inlined as garbage.
//! * Budget: at most `max_inline_bytes` of text, cut at a line (or at
//!   least a character) boundary, then `[… cut: showing the first 48 KB of
//!   1.2 MB]`. Only as much of a file is read as the budget can use.
//! * Telling: [`tell`] makes the model's note and, where the model has no
//!   tool that could open the saved file, one plain sentence for the user
//!   about what it could not see (a cut text, an unreadable file).
//!
//! Everything here is pure except [`read`], which reads the saved file.
//! It must never download, send anything, or show the model a server path
//! that [`super::FileAccess`] did not hand it.

use std::path::Path;

use chardetng::{EncodingDetector, Iso2022JpDetection, Utf8Detection};
use encoding_rs::{Encoding, UTF_16BE, UTF_16LE, UTF_8};
use tokio::io::AsyncReadExt;

use super::pdf::{self, PdfError};
use super::{human_size, is_image_mime};

mod tell;

pub use tell::{fenced, tell, Shown, Told};

/// How many first bytes decide what a file is.
const SNIFF_BYTES: usize = 8 * 1024;

/// What a document is, for reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A PDF.
    Pdf,
    /// Said to be text (by type or name).
    Text,
    /// Unnamed bytes that look like text.
    SniffedText,
    /// An image.
    Image,
    /// Anything else.
    Other,
}

/// What a document is, from its type, name and first bytes.
pub fn kind(mime: &str, name: &str, head: &[u8]) -> Kind {
    let essence = essence(mime);
    if pdf::looks_like_pdf(head) || essence == "application/pdf" || extension(name) == "pdf" {
        Kind::Pdf
    } else if is_image_mime(&essence) {
        Kind::Image
    } else if is_text_mime(&essence) || is_text_name(name) {
        Kind::Text
    } else if (essence.is_empty() || essence == "application/octet-stream")
        && decode_text(&head[..head.len().min(SNIFF_BYTES)], false).is_some()
    {
        Kind::SniffedText
    } else {
        Kind::Other
    }
}

fn essence(mime: &str) -> String {
    mime.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn extension(name: &str) -> String {
    name.rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default()
}

/// Text types, by MIME.
pub fn is_text_mime(mime: &str) -> bool {
    let essence = essence(mime);
    essence.starts_with("text/")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/x-sh"
                | "application/x-shellscript"
                | "application/sql"
                | "application/csv"
                | "application/x-subrip"
                | "application/x-ndjson"
        )
        || essence.ends_with("+json")
        || essence.ends_with("+xml")
}

/// Text files by name, whatever type the sender's app gave them.
fn is_text_name(name: &str) -> bool {
    matches!(
        extension(name).as_str(),
        "txt"
            | "text"
            | "log"
            | "md"
            | "markdown"
            | "rst"
            | "csv"
            | "tsv"
            | "json"
            | "jsonl"
            | "ndjson"
            | "yaml"
            | "yml"
            | "toml"
            | "ini"
            | "cfg"
            | "conf"
            | "xml"
            | "html"
            | "htm"
            | "srt"
            | "vtt"
            | "sql"
            | "sh"
            | "bash"
            | "py"
            | "rs"
            | "go"
            | "js"
            | "ts"
            | "c"
            | "h"
            | "cpp"
            | "hpp"
            | "java"
            | "kt"
            | "rb"
            | "php"
            | "pl"
            | "lua"
            | "swift"
            | "diff"
            | "patch"
            | "tex"
            | "env"
            | "properties"
    )
}

/// Decoded text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The text.
    pub text: String,
    /// The encoding it was read in.
    pub encoding: &'static Encoding,
}

/// The text of `bytes` (`whole`: the entire file, else a prefix whose
/// last character may be incomplete), or `None` for binary data.
pub fn decode_text(bytes: &[u8], whole: bool) -> Option<Decoded> {
    let (encoding, skip) = match Encoding::for_bom(bytes) {
        Some(found) => found,
        None => (
            utf16_without_bom(bytes).or_else(|| legacy(bytes, whole))?,
            0,
        ),
    };
    let body = &bytes[skip..];
    let mut decoder = encoding.new_decoder_without_bom_handling();
    let mut text = String::with_capacity(decoder.max_utf8_buffer_length(body.len())?);
    let (_, read, _) = decoder.decode_to_string(body, &mut text, whole);
    if read != body.len() || looks_binary(&text) {
        return None;
    }
    Some(Decoded { text, encoding })
}

/// UTF-16 without a byte-order mark: one byte of most pairs is zero.
fn utf16_without_bom(bytes: &[u8]) -> Option<&'static Encoding> {
    let pairs: Vec<&[u8]> = bytes[..bytes.len().min(SNIFF_BYTES)]
        .chunks_exact(2)
        .collect();
    if pairs.len() < 4 {
        return None;
    }
    let zero_high = pairs.iter().filter(|p| p[1] == 0 && p[0] != 0).count();
    let zero_low = pairs.iter().filter(|p| p[0] == 0 && p[1] != 0).count();
    let mostly = |n: usize| n * 10 >= pairs.len() * 4;
    let rarely = |n: usize| n * 20 <= pairs.len();
    if mostly(zero_high) && rarely(zero_low) {
        Some(UTF_16LE)
    } else if mostly(zero_low) && rarely(zero_high) {
        Some(UTF_16BE)
    } else {
        None
    }
}

/// UTF-8 if it is, else the detector's guess; `None` for zero bytes.
fn legacy(bytes: &[u8], whole: bool) -> Option<&'static Encoding> {
    if bytes[..bytes.len().min(SNIFF_BYTES)].contains(&0) {
        return None;
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => return Some(UTF_8),
        // Only the last character is cut off by the prefix.
        Err(e) if !whole && e.error_len().is_none() => return Some(UTF_8),
        Err(_) => {}
    }
    let mut detector = EncodingDetector::new(Iso2022JpDetection::Allow);
    let sample = &bytes[..bytes.len().min(64 * 1024)];
    detector.feed(sample, whole && sample.len() == bytes.len());
    Some(detector.guess(None, Utf8Detection::Deny))
}

/// More than 2% control or undecodable characters: binary data.
fn looks_binary(text: &str) -> bool {
    let mut total = 0usize;
    let mut odd = 0usize;
    for c in text.chars().take(SNIFF_BYTES) {
        total += 1;
        let control = c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c' | '\x1b');
        if control || c == char::REPLACEMENT_CHARACTER {
            odd += 1;
        }
    }
    odd * 50 > total
}

/// The part of `text` shown within `budget` bytes: all of it if it fits
/// and is `complete`; otherwise cut at the last line break in the second
/// half of the budget, or else at the last character boundary.
pub fn cut(text: &str, budget: usize, complete: bool) -> &str {
    if complete && text.len() <= budget {
        return text;
    }
    let mut end = budget.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind('\n') {
        Some(line) if line + 1 >= end / 2 => &text[..line + 1],
        _ => &text[..end],
    }
}

/// The line after a cut text.
pub fn cut_marker(shown: u64, total: u64) -> String {
    format!(
        "[… cut: showing the first {} of {}]",
        human_size(shown),
        human_size(total)
    )
}

/// Why the model cannot read a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// Said to be text, but binary data.
    NotText,
    /// A kind of file that is not read (archives, office files…).
    Binary,
    /// A PDF without a text layer (scanned pages, images).
    PdfNoText,
    /// An encrypted PDF.
    PdfEncrypted,
    /// A PDF too large (or inflating too far) to read.
    PdfTooLarge,
    /// A PDF that could not be parsed, or took too long.
    PdfFailed,
    /// Inlining is off (`max_inline_bytes = 0`).
    NotInlined,
    /// The saved file could not be read back.
    Failed,
}

impl Unreadable {
    fn from_pdf(error: &PdfError) -> Unreadable {
        match error {
            PdfError::TooLarge => Unreadable::PdfTooLarge,
            PdfError::Encrypted => Unreadable::PdfEncrypted,
            PdfError::Unreadable(_) | PdfError::TimedOut => Unreadable::PdfFailed,
        }
    }
}

/// What reading a document gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Text for the model; `cut` is `(shown, total)` bytes when only part
    /// of it is shown.
    Text {
        /// The text shown.
        text: String,
        /// How much was shown of how much, when cut.
        cut: Option<(u64, u64)>,
    },
    /// An image (the model may see it as one).
    Image,
    /// Nothing the model can read.
    Unreadable(Unreadable),
}

/// Read the saved document at `path` (`size` bytes) for a text budget of
/// `budget` bytes.
pub async fn read(path: &Path, mime: &str, name: &str, size: u64, budget: u64) -> Reading {
    // Text needs at most two bytes per byte of budget (UTF-16); a few
    // more bytes finish the last character.
    let wanted = budget
        .saturating_mul(2)
        .saturating_add(8)
        .max(SNIFF_BYTES as u64);
    let head = match read_prefix(path, wanted.min(size)).await {
        Ok(head) => head,
        Err(error) => {
            tracing::warn!(file = name, %error, "a saved document could not be read");
            return Reading::Unreadable(Unreadable::Failed);
        }
    };
    let kind = kind(mime, name, &head);
    if budget == 0 && matches!(kind, Kind::Pdf | Kind::Text | Kind::SniffedText) {
        return Reading::Unreadable(Unreadable::NotInlined);
    }
    match kind {
        Kind::Image => Reading::Image,
        Kind::Other => Reading::Unreadable(Unreadable::Binary),
        Kind::Text | Kind::SniffedText => {
            let whole = head.len() as u64 >= size;
            match decode_text(&head, whole) {
                Some(decoded) => shown(decoded.text, budget, whole, size),
                None if kind == Kind::Text => Reading::Unreadable(Unreadable::NotText),
                None => Reading::Unreadable(Unreadable::Binary),
            }
        }
        Kind::Pdf => read_pdf(path, name, size, budget).await,
    }
}

async fn read_pdf(path: &Path, name: &str, size: u64, budget: u64) -> Reading {
    if size > pdf::MAX_PDF_BYTES {
        return Reading::Unreadable(Unreadable::PdfTooLarge);
    }
    let bytes = match tokio::fs::read(path).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!(file = name, %error, "a saved PDF could not be read");
            return Reading::Unreadable(Unreadable::PdfFailed);
        }
    };
    match pdf::extract_bounded(bytes, pdf::EXTRACT_TIME).await {
        Ok(text) => {
            let text = tidy(&text);
            if text.is_empty() {
                tracing::info!(file = name, "a PDF has no text layer");
                return Reading::Unreadable(Unreadable::PdfNoText);
            }
            let total = text.len() as u64;
            shown(text, budget, true, total)
        }
        Err(error) => {
            tracing::warn!(file = name, %error, "a PDF's text could not be read");
            Reading::Unreadable(Unreadable::from_pdf(&error))
        }
    }
}

/// `text` within `budget`; `total` is what a cut is measured against.
fn shown(text: String, budget: u64, complete: bool, total: u64) -> Reading {
    let limit = usize::try_from(budget).unwrap_or(usize::MAX);
    let part = cut(&text, limit, complete);
    if part.len() == text.len() && complete {
        return Reading::Text { text, cut: None };
    }
    let shown = part.len() as u64;
    Reading::Text {
        text: part.to_string(),
        cut: Some((shown, total.max(shown))),
    }
}

/// Extracted text without trailing spaces on lines and without runs of
/// blank lines.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 || out.is_empty() {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_end().to_string()
}

async fn read_prefix(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = tokio::fs::File::open(path).await?;
    let mut head = Vec::new();
    file.take(limit).read_to_end(&mut head).await?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn text_types_are_recognised_by_mime_and_name() {
        assert!(is_text_mime("text/plain; charset=utf-8"));
        assert!(is_text_mime("application/json"));
        assert!(is_text_mime("application/vnd.api+json"));
        assert!(!is_text_mime("application/pdf"));
        assert!(!is_text_mime("image/png"));
        assert_eq!(
            kind("application/octet-stream", "run.LOG", b"x"),
            Kind::Text
        );
        assert_eq!(kind("", "notes", b"plain words\n"), Kind::SniffedText);
        assert_eq!(
            kind("application/octet-stream", "blob", &[0, 1, 2, 255]),
            Kind::Other
        );
        assert_eq!(kind("application/zip", "a.zip", b"PK\x03\x04"), Kind::Other);
        assert_eq!(kind("image/png", "a.png", b"\x89PNG"), Kind::Image);
        assert_eq!(kind("application/pdf", "a", b""), Kind::Pdf);
        assert_eq!(
            kind("application/octet-stream", "scan", b"%PDF-1.7\n"),
            Kind::Pdf
        );
    }

    #[test]
    fn legacy_and_utf16_texts_are_decoded() {
        // Latin-1 (windows-1252 is its superset as the web reads it).
        let latin1 = b"Caf\xe9 cr\xe8me br\xfbl\xe9e, na\xefve fa\xe7ade \xe0 la fran\xe7aise\n";
        let decoded = decode_text(latin1, true).unwrap();
        assert_eq!(
            decoded.text,
            "Café crème brûlée, naïve façade à la française\n"
        );
        let text = "Grüße aus Köln, 1 € — ok\n";
        let mut utf16le = vec![0xff, 0xfe];
        utf16le.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        assert_eq!(decode_text(&utf16le, true).unwrap().text, text);
        let mut utf16be = vec![0xfe, 0xff];
        utf16be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        assert_eq!(decode_text(&utf16be, true).unwrap().text, text);
        let bare: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(decode_text(&bare, true).unwrap().text, text);
        let utf8 = "déjà vu — 日本語\n";
        let decoded = decode_text(utf8.as_bytes(), true).unwrap();
        assert_eq!((decoded.text.as_str(), decoded.encoding), (utf8, UTF_8));
        // A prefix that ends inside a character is still UTF-8.
        let bytes = utf8.as_bytes();
        let decoded = decode_text(&bytes[..bytes.len() - 2], false).unwrap();
        assert_eq!(decoded.encoding, UTF_8);
        assert!(utf8.starts_with(&decoded.text));
    }

    #[test]
    fn binary_data_is_not_text() {
        let png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00";
        assert!(decode_text(png, true).is_none());
        let controls: Vec<u8> = b"ab\x01\x02\x03\x04cd".repeat(100);
        assert!(decode_text(&controls, true).is_none());
    }

    #[test]
    fn a_cut_prefers_a_line_break_and_says_how_much_was_shown() {
        let text = "first line\nsecond line\nthird line\n";
        assert_eq!(cut(text, 100, true), text);
        assert_eq!(cut(text, 30, true), "first line\nsecond line\n");
        assert_eq!(cut("no breaks at all here", 10, true), "no breaks ");
        assert_eq!(cut("ééé", 3, true), "é");
        assert_eq!(cut("short", 100, false), "short");
        assert_eq!(
            cut_marker(48 * 1024, 1_258_291),
            "[… cut: showing the first 48 KB of 1.2 MB]"
        );
    }

    #[tokio::test]
    async fn a_saved_file_is_read_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut text = String::new();
        for n in 0..2000 {
            text.push_str(&format!("line {n}: caf\u{e9}\n"));
        }
        let latin1: Vec<u8> = text.chars().map(|c| c as u8).collect();
        std::fs::write(&path, &latin1).unwrap();
        let size = latin1.len() as u64;
        let Reading::Text { text: shown, cut } =
            read(&path, "text/plain", "f.txt", size, 1000).await
        else {
            panic!("not text")
        };
        assert!(
            shown.len() <= 1000 && shown.ends_with("café\n"),
            "{shown:?}"
        );
        assert!(text.starts_with(&shown));
        assert_eq!(cut, Some((shown.len() as u64, size)));
        let all = read(&path, "text/plain", "f.txt", size, 1 << 20).await;
        assert_eq!(all, Reading::Text { text, cut: None });
        std::fs::write(&path, [0u8, 1, 2, 3, 0, 9]).unwrap();
        assert_eq!(
            read(&path, "text/plain", "f.txt", 6, 1000).await,
            Reading::Unreadable(Unreadable::NotText)
        );
        assert_eq!(
            read(&path, "application/octet-stream", "f.bin", 6, 1000).await,
            Reading::Unreadable(Unreadable::Binary)
        );
    }

    #[tokio::test]
    async fn pdfs_are_read_and_empty_or_broken_ones_are_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("doc.pdf");
        let pdf = super::super::pdf::tests::minimal_pdf(&[&["Quarterly revenue rose"]]);
        std::fs::write(&path, &pdf).unwrap();
        let size = pdf.len() as u64;
        let reading = read(&path, "application/pdf", "doc.pdf", size, 4096).await;
        assert!(
            matches!(&reading, Reading::Text { text, cut: None } if text.contains("Quarterly revenue rose")),
            "{reading:?}"
        );
        let blank = super::super::pdf::tests::minimal_pdf(&[&[]]);
        std::fs::write(&path, &blank).unwrap();
        let reading = read(
            &path,
            "application/pdf",
            "doc.pdf",
            blank.len() as u64,
            4096,
        )
        .await;
        assert_eq!(reading, Reading::Unreadable(Unreadable::PdfNoText));
        std::fs::write(&path, b"%PDF-1.4\ngarbage").unwrap();
        let reading = read(&path, "application/pdf", "doc.pdf", 16, 4096).await;
        assert_eq!(reading, Reading::Unreadable(Unreadable::PdfFailed));
    }

    proptest! {
        #[test]
        fn a_cut_is_a_prefix_within_budget_that_keeps_at_least_half(
            text in "(\\PC{0,12}\n?){0,40}",
            budget in 0usize..300,
            complete: bool,
        ) {
            let part = cut(&text, budget, complete);
            prop_assert!(text.starts_with(part));
            if complete && text.len() <= budget {
                prop_assert_eq!(part, text.as_str());
            } else {
                prop_assert!(part.len() <= budget);
                // At least half of what could be shown is, less at most
                // one character.
                let limit = budget.min(text.len());
                prop_assert!(part.len() * 2 + 8 >= limit, "{} of {}", part.len(), limit);
            }
        }

        #[test]
        fn utf8_and_utf16_texts_decode_to_themselves(text in "[^\u{0}-\u{8}\u{b}\u{e}-\u{1f}\u{7f}-\u{9f}\u{feff}\u{fffd}]{0,200}") {
            let decoded = decode_text(text.as_bytes(), true);
            prop_assert_eq!(decoded.map(|d| d.text), Some(text.clone()));
            let mut utf16 = vec![0xff, 0xfe];
            utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
            let decoded = decode_text(&utf16, true);
            prop_assert_eq!(decoded.map(|d| d.text), Some(text));
        }

        #[test]
        fn decoding_never_panics_and_text_has_no_nul(bytes in proptest::collection::vec(any::<u8>(), 0..512), whole: bool) {
            if let Some(decoded) = decode_text(&bytes, whole) {
                prop_assert!(!decoded.text.contains('\0'));
            }
        }
    }
}
