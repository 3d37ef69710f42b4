//! Splits a byte stream into lines, whatever the chunking: a line split
//! across two reads is joined, and a line longer than the limit is skipped
//! whole instead of growing memory without bound.

/// Joins chunks into complete lines.
#[derive(Debug)]
pub struct LineSplitter {
    buf: Vec<u8>,
    max: usize,
    /// The current line passed the limit: drop bytes until its newline.
    discarding: bool,
}

impl LineSplitter {
    /// A splitter keeping lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        LineSplitter {
            buf: Vec::new(),
            max,
            discarding: false,
        }
    }

    /// Feed `bytes`; `line` gets every completed line (without its `\n`).
    /// Returns how many over-long lines were dropped.
    pub fn push(&mut self, mut bytes: &[u8], mut line: impl FnMut(Vec<u8>)) -> usize {
        let mut dropped = 0;
        while !bytes.is_empty() {
            let end = bytes.iter().position(|&b| b == b'\n');
            let (piece, rest, complete) = match end {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            bytes = rest;
            if !self.discarding {
                if self.buf.len() + piece.len() > self.max {
                    self.buf.clear();
                    self.discarding = true;
                    dropped += 1;
                } else {
                    self.buf.extend_from_slice(piece);
                }
            }
            if complete {
                if !self.discarding {
                    line(std::mem::take(&mut self.buf));
                }
                self.discarding = false;
            }
        }
        dropped
    }

    /// End of stream: the unterminated last line, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        let discarding = std::mem::replace(&mut self.discarding, false);
        let rest = std::mem::take(&mut self.buf);
        (!discarding && !rest.is_empty()).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], max: usize) -> (Vec<String>, usize) {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        let mut dropped = 0;
        for chunk in chunks {
            dropped += s.push(chunk, |l| out.push(String::from_utf8(l).unwrap()));
        }
        out.extend(s.finish().map(|l| String::from_utf8(l).unwrap()));
        (out, dropped)
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let (lines, dropped) = split(&[b"{\"a\":", b"1}\n{\"b\"", b":2}\n", b"tail"], 100);
        assert_eq!(lines, ["{\"a\":1}", "{\"b\":2}", "tail"]);
        assert_eq!(dropped, 0);
        // Byte by byte, a multi-byte character split too.
        let text = "{\"t\":\"héllo 🎉\"}\nnext\n";
        let chunks: Vec<&[u8]> = text.as_bytes().chunks(1).collect();
        let (lines, _) = split(&chunks, 100);
        assert_eq!(lines, ["{\"t\":\"héllo 🎉\"}", "next"]);
    }

    #[test]
    fn an_over_long_line_is_skipped_whole() {
        let (lines, dropped) = split(&[b"short\n0123456789", b"0123456789\nafter\n"], 12);
        assert_eq!(lines, ["short", "after"]);
        assert_eq!(dropped, 1);
        let (lines, dropped) = split(&[b"0123456789abcdef"], 12);
        assert!(lines.is_empty());
        assert_eq!(dropped, 1);
    }
}
