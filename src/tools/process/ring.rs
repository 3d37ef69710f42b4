//! `OutputRing`: the last `cap` bytes of a process's output; memory never
//! exceeds the cap, and reads start at a character boundary.

use crate::tools::process::OutputStats;
use std::collections::VecDeque;

/// The last `cap` bytes of a process's output. Older bytes fall out; memory
/// never exceeds the cap.
#[derive(Debug)]
pub struct OutputRing {
    pub(super) buf: VecDeque<u8>,
    pub(super) cap: usize,
    pub(super) total: u64,
    /// `total` at the last [`OutputRing::take_new`].
    pub(super) read_mark: u64,
}

impl OutputRing {
    /// An empty ring holding at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> OutputRing {
        OutputRing {
            buf: VecDeque::new(),
            cap: cap.max(1),
            total: 0,
            read_mark: 0,
        }
    }

    /// Append `bytes`, dropping the oldest bytes beyond the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        if self.buf.capacity() < self.cap && !bytes.is_empty() {
            // One allocation of exactly the cap: the ring never holds more,
            // so it never grows again.
            self.buf.reserve_exact(self.cap - self.buf.len());
        }
        self.buf.extend(bytes);
    }

    /// Sizes: held, cap, allocated, total.
    pub fn stats(&self) -> OutputStats {
        OutputStats {
            held: self.buf.len(),
            cap: self.cap,
            allocated: self.buf.capacity(),
            total: self.total,
        }
    }

    /// Everything held, as text (a character cut by the ring is dropped;
    /// invalid UTF-8 becomes U+FFFD).
    pub fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        lossy_from_char_start(&bytes)
    }

    /// The output produced since the last call, as text, and how many of
    /// those bytes already fell out of the ring.
    pub fn take_new(&mut self) -> (String, u64) {
        let oldest_held = self.total - self.buf.len() as u64;
        let dropped = oldest_held.saturating_sub(self.read_mark);
        let start = self.read_mark.max(oldest_held) - oldest_held;
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        let bytes: Vec<u8> = self.buf.iter().skip(start).copied().collect();
        self.read_mark = self.total;
        (lossy_from_char_start(&bytes), dropped)
    }
}

/// Bytes as text, skipping UTF-8 continuation bytes at the start (the ring
/// may have cut a character in half there).
pub(super) fn lossy_from_char_start(bytes: &[u8]) -> String {
    let start = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}
