//! The text of a PDF, read without letting a hostile file hang, crash or
//! exhaust telegate.
//!
//! [`pdf-extract`](pdf_extract) does the reading; around it:
//! * a size bound on the input ([`MAX_PDF_BYTES`]);
//! * encrypted files are not opened (their streams cannot be checked
//!   before decryption, see [`is_encrypted`]);
//! * a decompression budget ([`INFLATE_BUDGET`]): every stream is decoded
//!   first with bounded readers (each of Flate, LZW and ASCII85 whose
//!   filter name appears in the file, tried on every stream whatever its
//!   dictionary claims, and on what they produce), and a file whose
//!   streams would inflate past the budget is refused before the parser,
//!   which decodes without bounds, sees it ([`inflates_within`]);
//! * the parser runs under `catch_unwind` (it panics on malformed input)
//!   on a thread of its own with a large stack, bounded in time
//!   ([`extract_bounded`]); one extraction runs at a time, and a thread
//!   still stuck past its time keeps that one place, so hostile files
//!   cannot pile up threads.
//!
//! Pure apart from [`extract_bounded`]'s thread. It must never read a
//! file itself or decide what the user is told (see
//! [`super::document`]).

use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

/// PDFs larger than this are not read (bytes).
pub const MAX_PDF_BYTES: u64 = 32 * 1024 * 1024;
/// The most a PDF's streams may inflate to, all together (bytes).
pub const INFLATE_BUDGET: u64 = 128 * 1024 * 1024;
/// How long one extraction may take.
pub const EXTRACT_TIME: Duration = Duration::from_secs(30);
/// The extraction thread's stack: deep nesting in a hostile file must
/// fail inside the parser's own limits, not overflow the stack.
const STACK_BYTES: usize = 64 * 1024 * 1024;
/// How many decoding layers (a filter chain) are followed.
const MAX_LAYERS: usize = 8;
/// Decoders write in chunks of this size.
const CHUNK: usize = 16 * 1024;

/// Why a PDF's text could not be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PdfError {
    /// Above [`MAX_PDF_BYTES`] or [`INFLATE_BUDGET`].
    #[error("the file is too large to read")]
    TooLarge,
    /// Encrypted (even with an empty password).
    #[error("the file is encrypted")]
    Encrypted,
    /// Not readable as a PDF (the parser's error or panic).
    #[error("the file could not be parsed: {0}")]
    Unreadable(String),
    /// Took longer than allowed.
    #[error("reading the file took too long")]
    TimedOut,
}

/// One extraction at a time, process-wide.
static EXTRACTING: Semaphore = Semaphore::const_new(1);

/// The text of `bytes`, checked ([`check`]) and extracted on a thread of
/// its own within `limit`.
pub async fn extract_bounded(bytes: Vec<u8>, limit: Duration) -> Result<String, PdfError> {
    run_bounded(move || check(&bytes).and_then(|()| extract(&bytes)), limit).await
}

/// Run `job` on a thread of its own (large stack, panics caught), at most
/// one at a time, and give up on it after `limit` (the thread is left to
/// finish and keeps its place until then).
pub async fn run_bounded<F>(job: F, limit: Duration) -> Result<String, PdfError>
where
    F: FnOnce() -> Result<String, PdfError> + Send + 'static,
{
    run_bounded_on(&EXTRACTING, job, limit).await
}

async fn run_bounded_on<F>(
    slots: &'static Semaphore,
    job: F,
    limit: Duration,
) -> Result<String, PdfError>
where
    F: FnOnce() -> Result<String, PdfError> + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + limit;
    let permit = tokio::time::timeout_at(deadline, slots.acquire())
        .await
        .map_err(|_| PdfError::TimedOut)?
        .map_err(|_| PdfError::TimedOut)?;
    let (send, receive) = tokio::sync::oneshot::channel();
    let held = Arc::new(permit);
    let kept = held.clone();
    let spawned = std::thread::Builder::new()
        .name("telegate-pdf".to_string())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".to_string());
                Err(PdfError::Unreadable(format!("the parser panicked: {what}")))
            });
            let _ = send.send(outcome);
            drop(kept);
        });
    if let Err(error) = spawned {
        return Err(PdfError::Unreadable(format!(
            "no thread to read it: {error}"
        )));
    }
    drop(held);
    match tokio::time::timeout_at(deadline, receive).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(PdfError::Unreadable("the reading thread ended".into())),
        Err(_) => Err(PdfError::TimedOut),
    }
}

/// The checks made before the parser sees `bytes`.
pub fn check(bytes: &[u8]) -> Result<(), PdfError> {
    check_within(bytes, INFLATE_BUDGET)
}

fn check_within(bytes: &[u8], budget: u64) -> Result<(), PdfError> {
    if bytes.len() as u64 > MAX_PDF_BYTES {
        return Err(PdfError::TooLarge);
    }
    if is_encrypted(bytes) {
        return Err(PdfError::Encrypted);
    }
    if !inflates_within(bytes, budget) {
        return Err(PdfError::TooLarge);
    }
    Ok(())
}

/// The parser itself (may panic: call it through [`run_bounded`]).
pub fn extract(bytes: &[u8]) -> Result<String, PdfError> {
    pdf_extract::extract_text_from_mem(bytes).map_err(|e| PdfError::Unreadable(e.to_string()))
}

/// True if `bytes` starts like a PDF (`%PDF-` within its first KB, as
/// readers accept).
pub fn looks_like_pdf(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(1024)];
    head.windows(5).any(|w| w == b"%PDF-")
}

/// True if any name in `bytes` is `/Encrypt` (with `#xx` escapes
/// decoded, as the parser reads names).
pub fn is_encrypted(bytes: &[u8]) -> bool {
    let mut found = false;
    for_each_name(bytes, |name| found |= name == b"Encrypt");
    found
}

/// Call `f` with every name in `bytes` (`/Name`, escapes decoded), up to
/// 64 bytes of each.
fn for_each_name(bytes: &[u8], mut f: impl FnMut(&[u8])) {
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'/') {
        let start = i + offset + 1;
        let mut end = start;
        while end < bytes.len() && is_name_byte(bytes[end]) && end - start < 64 {
            end += 1;
        }
        f(&decode_name(&bytes[start..end]));
        i = end.max(start);
    }
}

fn is_name_byte(b: u8) -> bool {
    !b.is_ascii_whitespace()
        && !matches!(
            b,
            b'/' | b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'{' | b'}' | b'%' | 0
        )
}

fn decode_name(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = raw
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (raw[i], hex) {
            (b'#', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// True if the streams of `bytes`, decoded as the parser might decode
/// them, inflate to at most `budget` bytes in all. The parser applies a
/// filter only when the stream's dictionary names it directly, and stream
/// dictionaries are never compressed, so the decoders to try are those
/// whose filter names appear anywhere in the file ([`declared`]). Every
/// `stream` keyword starts a body that is tried with each of them,
/// whatever that stream's dictionary says (a hostile file can disguise
/// it), and what a decoder produces is tried again, [`MAX_LAYERS`] deep. A stream costs the
/// largest output on any such chain (the parser keeps about one layer of
/// a stream at a time); the trying itself may produce at most eight times
/// the budget, and hold at most the budget at once.
pub fn inflates_within(bytes: &[u8], budget: u64) -> bool {
    let decoders = declared(bytes);
    if decoders.is_empty() {
        return true;
    }
    let mut work = budget.saturating_mul(8);
    let mut total: u64 = 0;
    let mut from = 0;
    while let Some(at) = find(&bytes[from..], b"stream") {
        let keyword = from + at;
        from = keyword + b"stream".len();
        let Some(body) = body_start(bytes, from) else {
            continue;
        };
        let mut effort = Effort {
            work: &mut work,
            cap: budget - total,
            held: 0,
            hold_limit: budget,
        };
        match layers(&bytes[body..], 0, &decoders, &mut effort) {
            Ok(largest) => total += largest,
            Err(Spent) => return false,
        }
    }
    true
}

/// The budget ran out.
struct Spent;

/// What decoding may still produce: `work` in all, `cap` in one output;
/// outputs kept to try again (`held`) stay within `hold_limit`.
struct Effort<'a> {
    work: &'a mut u64,
    cap: u64,
    held: u64,
    hold_limit: u64,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A stream body starts after `stream` and its end of line.
fn body_start(bytes: &[u8], after: usize) -> Option<usize> {
    match bytes.get(after..after + 2) {
        Some(b"\r\n") => Some(after + 2),
        Some([b'\n' | b'\r', _]) => Some(after + 1),
        _ if bytes.get(after) == Some(&b'\n') => Some(after + 1),
        _ => None,
    }
}

/// The decoders the parser could apply to some stream of `bytes`: those
/// whose filter name (`/FlateDecode`, `/LZWDecode`, `/ASCII85Decode`, the
/// only ones it decodes) appears.
fn declared(bytes: &[u8]) -> Vec<Decoder> {
    let mut found = [false; 3];
    for_each_name(bytes, |name| match name {
        b"FlateDecode" => found[0] = true,
        b"LZWDecode" => found[1] = true,
        b"ASCII85Decode" => found[2] = true,
        _ => {}
    });
    [Decoder::Zlib, Decoder::Lzw, Decoder::Ascii85]
        .into_iter()
        .zip(found)
        .filter_map(|(decoder, found)| found.then_some(decoder))
        .collect()
}

/// Try every decoder on `data`, and again on what each produces; the
/// largest output seen on any chain.
fn layers(
    data: &[u8],
    depth: usize,
    decoders: &[Decoder],
    effort: &mut Effort<'_>,
) -> Result<u64, Spent> {
    let mut largest = 0;
    if depth >= MAX_LAYERS || data.is_empty() {
        return Ok(largest);
    }
    for decoder in decoders {
        let (produced, kept) = decoder.decode(data, effort)?;
        largest = largest.max(produced);
        if kept.len() > 1 {
            largest = largest.max(layers(&kept, depth + 1, decoders, effort)?);
        }
        effort.held -= kept.len() as u64;
    }
    Ok(largest)
}

#[derive(Clone, Copy)]
enum Decoder {
    Zlib,
    Lzw,
    Ascii85,
}

impl Decoder {
    /// Decode `data` within `effort`: how much it produced, and the
    /// output itself if it might be encoded again.
    fn decode(self, data: &[u8], effort: &mut Effort<'_>) -> Result<(u64, Vec<u8>), Spent> {
        let mut sink = Counted::new(effort);
        match self {
            Decoder::Zlib => {
                let wrote = sink.pour(flate2::read::ZlibDecoder::new(data))?;
                // The parser retries a failed zlib stream as raw deflate.
                if wrote == 0 && data.len() > 2 {
                    sink.pour(flate2::read::DeflateDecoder::new(&data[2..]))?;
                }
            }
            Decoder::Lzw => lzw(data, &mut sink)?,
            Decoder::Ascii85 => ascii85(data, &mut sink)?,
        }
        Ok((sink.produced, sink.kept))
    }
}

/// Counts output against the effort; keeps it while it may be another
/// layer (its first bytes look like zlib, LZW or ASCII85).
struct Counted<'a, 'b> {
    effort: &'a mut Effort<'b>,
    produced: u64,
    kept: Vec<u8>,
    keeping: Option<bool>,
}

/// How many first bytes decide whether output is kept.
const SNIFF: usize = 16;

impl<'a, 'b> Counted<'a, 'b> {
    fn new(effort: &'a mut Effort<'b>) -> Counted<'a, 'b> {
        Counted {
            effort,
            produced: 0,
            kept: Vec::new(),
            keeping: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) -> Result<(), Spent> {
        let n = chunk.len() as u64;
        if n > *self.effort.work || self.produced + n > self.effort.cap {
            return Err(Spent);
        }
        *self.effort.work -= n;
        self.produced += n;
        if self.keeping != Some(false) {
            if self.effort.held + n > self.effort.hold_limit {
                return Err(Spent);
            }
            self.effort.held += n;
            self.kept.extend_from_slice(chunk);
        }
        if self.keeping.is_none() && self.kept.len() >= SNIFF {
            let keep = may_be_encoded(&self.kept[..SNIFF]);
            self.keeping = Some(keep);
            if !keep {
                self.effort.held -= self.kept.len() as u64;
                self.kept = Vec::new();
            }
        }
        Ok(())
    }

    /// Read `reader` to its end or first error; returns the bytes read.
    fn pour(&mut self, mut reader: impl Read) -> Result<u64, Spent> {
        let mut buffer = vec![0u8; CHUNK];
        let mut total = 0;
        loop {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => return Ok(total),
                Ok(n) => {
                    self.push(&buffer[..n])?;
                    total += n as u64;
                }
            }
        }
    }
}

/// Output that another decoder might take: a zlib header, LZW's first
/// code (a clear code or a literal: the first byte's top bit clear or
/// `0x80` exactly), or ASCII85 characters.
fn may_be_encoded(head: &[u8]) -> bool {
    let zlib = head.len() >= 2
        && head[0] & 0x0f == 8
        && (u16::from(head[0]) << 8 | u16::from(head[1])) % 31 == 0;
    let lzw = head.first().is_some_and(|&b| b <= 0x80);
    let a85 = head
        .iter()
        .take(16)
        .all(|&b| b.is_ascii_whitespace() || (b'!'..=b'u').contains(&b) || b == b'z');
    zlib || lzw || a85
}

fn lzw(data: &[u8], sink: &mut Counted<'_, '_>) -> Result<(), Spent> {
    let mut decoder = weezl::decode::Decoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8);
    let mut buffer = vec![0u8; CHUNK];
    let mut input = data;
    loop {
        let result = decoder.decode_bytes(input, &mut buffer);
        sink.push(&buffer[..result.consumed_out])?;
        input = &input[result.consumed_in..];
        match result.status {
            Ok(weezl::LzwStatus::Ok) => {}
            Ok(weezl::LzwStatus::Done | weezl::LzwStatus::NoProgress) | Err(_) => return Ok(()),
        }
    }
}

/// ASCII85 as the parser reads it: up to the first byte outside the
/// alphabet, `z` for four zeros.
fn ascii85(data: &[u8], sink: &mut Counted<'_, '_>) -> Result<(), Spent> {
    let mut out = Vec::new();
    let mut group: u64 = 0;
    let mut count = 0;
    for &b in data {
        if b.is_ascii_whitespace() {
            continue;
        }
        if b == b'z' && count == 0 {
            out.extend_from_slice(&[0; 4]);
        } else if (b'!'..=b'u').contains(&b) {
            group = group * 85 + u64::from(b - b'!');
            count += 1;
            if count == 5 {
                out.extend_from_slice(&(group as u32).to_be_bytes());
                group = 0;
                count = 0;
            }
        } else {
            break;
        }
        if out.len() >= CHUNK {
            sink.push(&out)?;
            out.clear();
        }
    }
    sink.push(&out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    /// A minimal valid PDF: one page per entry of `pages`, each showing its
    /// lines in Helvetica (offsets computed, so the cross-reference table
    /// is right); a page without lines shows an image instead, like a
    /// scanned page.
    pub(crate) fn minimal_pdf(pages: &[&[&str]]) -> Vec<u8> {
        let mut objects: Vec<String> = Vec::new();
        let kids: Vec<String> = (0..pages.len())
            .map(|i| format!("{} 0 R", 4 + 2 * i))
            .collect();
        objects.push("<< /Type /Catalog /Pages 2 0 R >>".into());
        objects.push(format!(
            "<< /Type /Pages /Kids [{}] /Count {} >>",
            kids.join(" "),
            pages.len()
        ));
        objects.push("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".into());
        let image = 4 + 2 * pages.len();
        for (i, lines) in pages.iter().enumerate() {
            let mut content = String::from("BT /F1 12 Tf 72 720 Td 14 TL\n");
            for line in *lines {
                content.push_str(&format!("({line}) Tj T*\n"));
            }
            content.push_str("ET");
            if lines.is_empty() {
                content = "q 200 0 0 200 72 500 cm /Im1 Do Q".to_string();
            }
            objects.push(format!(
                "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] \
                 /Resources << /Font << /F1 3 0 R >> /XObject << /Im1 {image} 0 R >> >> \
                 /Contents {} 0 R >>",
                5 + 2 * i
            ));
            objects.push(format!(
                "<< /Length {} >>\nstream\n{content}\nendstream",
                content.len() + 1
            ));
        }
        // Pixels (the start of a JPEG), which are no page content.
        let pixels: &[u8] = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\
            \xff\xdb\x00C\x00\x08\x06\x06\x07\x06\x05\x08\x07\x07\x07\t\t\x08\n\x0c\x14(7),01444";
        let mut objects: Vec<Vec<u8>> = objects.into_iter().map(String::into_bytes).collect();
        let mut image_object = format!(
            "<< /Type /XObject /Subtype /Image /Width 2 /Height 2 /ColorSpace /DeviceGray \
             /BitsPerComponent 8 /Filter /DCTDecode /Length {} >>\nstream\n",
            pixels.len()
        )
        .into_bytes();
        image_object.extend_from_slice(pixels);
        image_object.extend_from_slice(b"\nendstream");
        objects.push(image_object);
        assemble(&objects)
    }

    /// A PDF file of `objects` (numbered from 1) with a correct xref.
    pub(crate) fn assemble(objects: &[Vec<u8>]) -> Vec<u8> {
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

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// A page whose content stream is `data` under `filter`.
    fn pdf_with_stream(filter: &str, data: &[u8]) -> Vec<u8> {
        let mut out = minimal_pdf(&[&["cover"]]);
        out.extend_from_slice(
            format!("9 0 obj\n<< /Length {} {filter} >>\nstream\n", data.len()).as_bytes(),
        );
        out.extend_from_slice(data);
        out.extend_from_slice(b"\nendstream\nendobj\n");
        out
    }

    #[test]
    fn the_text_of_a_minimal_pdf_is_extracted() {
        let pdf = minimal_pdf(&[&["Hello from page one", "second line"], &["Page two here"]]);
        assert!(looks_like_pdf(&pdf));
        check(&pdf).unwrap();
        let text = extract(&pdf).unwrap();
        assert!(text.contains("Hello from page one"), "{text:?}");
        assert!(text.contains("second line"), "{text:?}");
        assert!(text.contains("Page two here"), "{text:?}");
    }

    #[test]
    fn garbage_is_an_error_not_a_crash() {
        for garbage in [
            b"%PDF-1.7\nnot really".to_vec(),
            b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 1 0 R >> endobj\ntrailer << /Root 1 0 R >>"
                .to_vec(),
            (0..=255u8).cycle().take(5000).collect(),
        ] {
            let outcome = std::panic::catch_unwind(|| extract(&garbage));
            if let Ok(Ok(text)) = outcome {
                assert!(text.trim().is_empty(), "{text:?}");
            }
        }
    }

    #[test]
    fn a_decompression_bomb_is_refused_before_the_parser() {
        const MB: u64 = 1024 * 1024;
        let bomb = zlib(&vec![0u8; 2 * MB as usize]);
        let pdf = pdf_with_stream("/Filter /FlateDecode", &bomb);
        assert!(!inflates_within(&pdf, MB));
        assert!(inflates_within(&pdf, 4 * MB), "what it inflates to fits");
        // Disguised: this stream names no filter (another one does), the
        // name is escaped, a chain of two, ASCII85 outside.
        let mut undeclared = pdf_with_stream("", &bomb);
        undeclared.extend_from_slice(
            b"10 0 obj << /Filter /FlateDecode /Length 0 >> stream\n\nendstream endobj\n",
        );
        assert!(!inflates_within(&undeclared, MB));
        let escaped = pdf_with_stream("/Filter /Fl#61teDecode", &bomb);
        assert!(!inflates_within(&escaped, MB));
        let inner = zlib(&vec![b'a'; 2 * MB as usize]);
        let chained = pdf_with_stream("/Filter [/FlateDecode /FlateDecode]", &zlib(&inner));
        assert!(!inflates_within(&chained, MB));
        let a85 = ascii85_encode(&bomb);
        let wrapped = pdf_with_stream("/Filter [/ASCII85Decode /FlateDecode]", &a85);
        assert!(!inflates_within(&wrapped, MB));
        assert_eq!(check_within(&pdf, MB), Err(PdfError::TooLarge));
        assert_eq!(check_within(&pdf, 4 * MB), Ok(()));
        // Filters the parser does not decode are not followed; nor are
        // names it would not apply.
        assert!(inflates_within(&pdf_with_stream("/Filter /Fl", &bomb), MB));
        // An ordinary file is well within.
        assert!(inflates_within(&minimal_pdf(&[&["x"]]), 64 * 1024));
    }

    #[test]
    fn what_is_held_to_try_again_stays_within_the_budget() {
        // Flate around ASCII85 around noise: each layer alone fits, but
        // the parser would hold two of them at once (and so would the
        // check).
        let mut seed: u32 = 7;
        let mut noise: Vec<u8> = (0..480 * 1024)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                (seed >> 16) as u8
            })
            .collect();
        noise[0] = 0x10;
        let pdf = pdf_with_stream(
            "/Filter [/FlateDecode /ASCII85Decode]",
            &zlib(&ascii85_encode(&noise)),
        );
        assert!(!inflates_within(&pdf, 1024 * 1024));
        assert!(inflates_within(&pdf, 2 * 1024 * 1024));
    }

    #[test]
    fn an_lzw_bomb_is_refused() {
        let data = vec![b'x'; 2 * 1024 * 1024];
        let mut encoded = Vec::new();
        let mut encoder = weezl::encode::Encoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8);
        let result = encoder.into_vec(&mut encoded).encode_all(&data);
        result.status.unwrap();
        let pdf = pdf_with_stream("/Filter /LZWDecode", &encoded);
        assert!(!inflates_within(&pdf, 1024 * 1024));
    }

    fn ascii85_encode(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in data.chunks(4) {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            let mut n = u32::from_be_bytes(word);
            if n == 0 && chunk.len() == 4 {
                out.push(b'z');
                continue;
            }
            let mut digits = [0u8; 5];
            for d in digits.iter_mut().rev() {
                *d = (n % 85) as u8 + b'!';
                n /= 85;
            }
            out.extend_from_slice(&digits[..chunk.len() + 1]);
        }
        out.extend_from_slice(b"~>");
        out
    }

    #[test]
    fn encryption_is_seen_even_behind_name_escapes() {
        assert!(is_encrypted(b"trailer << /Root 1 0 R /Encrypt 5 0 R >>"));
        assert!(is_encrypted(b"<< /Encr#79pt 5 0 R >>"));
        assert!(is_encrypted(b"<</#45#6e#63#72#79#70#74 5 0 R>>"));
        assert!(!is_encrypted(b"<< /EncryptMetadata false >> (Encrypt)"));
        assert!(!is_encrypted(&minimal_pdf(&[&["Encrypt"]])));
        assert_eq!(
            check(b"%PDF-1.4 << /Encrypt 2 0 R >>"),
            Err(PdfError::Encrypted)
        );
    }

    #[tokio::test]
    async fn a_panicking_parser_is_an_error() {
        static SLOTS: Semaphore = Semaphore::const_new(1);
        let outcome = run_bounded_on(&SLOTS, || panic!("bad xref"), EXTRACT_TIME).await;
        assert!(
            matches!(&outcome, Err(PdfError::Unreadable(why)) if why.contains("bad xref")),
            "{outcome:?}"
        );
        // The place is free again.
        let outcome = run_bounded_on(&SLOTS, || Ok("fine".into()), EXTRACT_TIME).await;
        assert_eq!(outcome, Ok("fine".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_parser_that_hangs_is_given_up_and_holds_no_more_than_its_place() {
        static SLOTS: Semaphore = Semaphore::const_new(1);
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let hung = run_bounded_on(
            &SLOTS,
            move || {
                let _ = wait.recv();
                Ok("late".into())
            },
            EXTRACT_TIME,
        )
        .await;
        assert_eq!(hung, Err(PdfError::TimedOut));
        // While the stuck thread runs, the next file waits for its place
        // within its own time and is given up too: no second thread.
        let queued = run_bounded_on(&SLOTS, || Ok("second".into()), EXTRACT_TIME).await;
        assert_eq!(queued, Err(PdfError::TimedOut));
        release.send(()).unwrap();
        // The stuck thread finishes and gives its place back.
        let mut freed = false;
        for _ in 0..2000 {
            freed = SLOTS.available_permits() == 1;
            if freed {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(freed, "the finished thread keeps its place");
    }
}
