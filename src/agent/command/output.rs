//! The `text` protocol: stdout streamed as it comes (UTF-8 decoded without
//! splitting a character), kept up to the output cap, and answered as is.

use super::super::AgentReply;
use crate::vocab::Progress;

/// Decodes a byte stream as UTF-8 without ever splitting a character: an
/// incomplete sequence at the end of a chunk waits for the next one.
/// Invalid bytes become U+FFFD.
#[derive(Debug, Default)]
pub(super) struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text of `bytes` (after any held-back bytes), minus an incomplete
    /// character at the end.
    pub(super) fn decode(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.pending.len());
        let mut start = 0;
        while start < self.pending.len() {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(text) => {
                    out.push_str(text);
                    start = self.pending.len();
                }
                Err(error) => {
                    let valid_end = start + error.valid_up_to();
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid_end]));
                    match error.error_len() {
                        Some(invalid) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid_end + invalid;
                        }
                        None => {
                            // Incomplete at the end: keep it for next time.
                            start = valid_end;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Whatever is held back, at end of stream.
    pub(super) fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Stdout: streamed into the turn's progress and kept for the reply, up to
/// the cap.
pub(super) struct StdoutCollector {
    progress: Progress,
    cap: usize,
    accepted: usize,
    truncated: bool,
    decoder: Utf8Stream,
    text: String,
}

impl StdoutCollector {
    pub(super) fn new(progress: Progress, cap: usize) -> Self {
        StdoutCollector {
            progress,
            cap,
            accepted: 0,
            truncated: false,
            decoder: Utf8Stream::default(),
            text: String::new(),
        }
    }

    pub(super) fn push(&mut self, bytes: &[u8]) {
        let take = bytes.len().min(self.cap.saturating_sub(self.accepted));
        if take < bytes.len() {
            self.truncated = true;
        }
        if take == 0 {
            // Discarded, but still a sign of life.
            self.progress.still_working();
            return;
        }
        self.accepted += take;
        let text = self.decoder.decode(&bytes[..take]);
        self.emit(&text);
    }

    /// End of output: flush a held-back partial character (unless the cap
    /// cut it, in which case it is dropped with the rest).
    pub(super) fn finish(&mut self) {
        let rest = self.decoder.finish();
        if !self.truncated {
            self.emit(&rest);
        }
    }

    fn emit(&mut self, text: &str) {
        if text.is_empty() {
            self.progress.still_working();
        } else {
            self.progress.push_text(text);
            self.text.push_str(text);
        }
    }

    pub(super) fn into_reply(self) -> AgentReply {
        let text = self.text.trim_end();
        let mut reply = if text.is_empty() {
            "(the command printed nothing)".to_string()
        } else {
            text.to_string()
        };
        if self.truncated {
            reply.push_str(&format!(
                "\n\n[output truncated at {}]",
                human_bytes(self.cap)
            ));
        }
        AgentReply::new(reply)
    }
}

pub(super) fn human_bytes(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    match bytes {
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= 1024 && b % 1024 == 0 => format!("{} KiB", b / 1024),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_stream_never_splits_a_character() {
        let text = "héllo 🎉 wörld";
        let mut decoder = Utf8Stream::default();
        let mut out = String::new();
        for byte in text.as_bytes() {
            let piece = decoder.decode(std::slice::from_ref(byte));
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER));
            out.push_str(&piece);
        }
        out.push_str(&decoder.finish());
        assert_eq!(out, text);

        let mut decoder = Utf8Stream::default();
        assert_eq!(decoder.decode(b"a\xffb\xf0\x9f"), "a\u{fffd}b");
        assert_eq!(decoder.finish(), "\u{fffd}");
    }

    #[test]
    fn stdout_cap_counts_bytes_and_drops_a_cut_character() {
        let mut out = StdoutCollector::new(Progress::new(), 4);
        out.push("ab".as_bytes());
        out.push("cé".as_bytes()); // the cap cuts é in half
        out.push(b"more");
        out.finish();
        assert_eq!(
            out.into_reply().text,
            "abc\n\n[output truncated at 4 bytes]"
        );
        assert_eq!(human_bytes(64 * 1024), "64 KiB");
        assert_eq!(human_bytes(2 * 1024 * 1024), "2 MiB");
    }
}
