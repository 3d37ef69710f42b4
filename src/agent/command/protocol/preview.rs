//! The live preview of a JSONL turn: the agent's text and one short line
//! per tool it starts, newest last, bounded so an agent that runs a
//! thousand tools still fits one Telegram message. The preview only feeds
//! [`crate::vocab::Progress`]; edit pacing stays with delivery.

use std::collections::VecDeque;

/// At most this many entries (texts and tool lines) are shown.
const MAX_ENTRIES: usize = 12;
/// About this many characters are shown (the oldest entries go first).
const MAX_CHARS: usize = 3000;

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Text(String),
    /// Text streamed in deltas, not yet confirmed by its whole message.
    Streamed(String),
    Tool(String),
}

/// The entries shown while a turn runs.
#[derive(Debug, Default)]
pub struct Preview {
    entries: VecDeque<Entry>,
    hidden: usize,
    /// The last entry is a [`Entry::Streamed`] still being written.
    streaming: bool,
}

impl Preview {
    /// The agent said something (whole). It replaces the oldest text
    /// streamed before it, if any (the same text, now complete).
    pub fn text(&mut self, text: &str) {
        let text = text.trim().to_string();
        if let Some(streamed) = self
            .entries
            .iter_mut()
            .find(|e| matches!(e, Entry::Streamed(_)))
        {
            *streamed = Entry::Text(text);
            self.streaming = self.streaming
                && self
                    .entries
                    .back()
                    .is_some_and(|e| matches!(e, Entry::Streamed(_)));
            return;
        }
        self.push(Entry::Text(text));
    }

    /// A piece of text still being written.
    pub fn delta(&mut self, delta: &str) {
        if self.streaming {
            if let Some(Entry::Streamed(text)) = self.entries.back_mut() {
                text.push_str(delta);
                self.trim();
                return;
            }
        }
        self.push(Entry::Streamed(delta.to_string()));
        self.streaming = true;
    }

    /// The text being streamed is complete.
    pub fn end_block(&mut self) {
        self.streaming = false;
    }

    /// A tool started.
    pub fn tool(&mut self, line: &str) {
        self.streaming = false;
        self.push(Entry::Tool(line.to_string()));
    }

    fn push(&mut self, entry: Entry) {
        self.entries.push_back(entry);
        self.trim();
    }

    fn trim(&mut self) {
        while self.entries.len() > MAX_ENTRIES
            || (self.entries.len() > 1 && self.chars() > MAX_CHARS)
        {
            self.entries.pop_front();
            self.hidden += 1;
        }
    }

    fn chars(&self) -> usize {
        self.entries
            .iter()
            .map(|e| match e {
                Entry::Text(t) | Entry::Streamed(t) | Entry::Tool(t) => t.chars().count() + 2,
            })
            .sum()
    }

    /// The preview text: tool lines one per line, texts as paragraphs.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.hidden > 0 {
            out.push_str(&format!("… ({} earlier steps)\n", self.hidden));
        }
        let mut previous: Option<&Entry> = None;
        for entry in &self.entries {
            match (previous, entry) {
                (None, _) => {}
                (Some(Entry::Tool(_)), Entry::Tool(_)) => out.push('\n'),
                _ => out.push_str("\n\n"),
            }
            match entry {
                Entry::Text(t) | Entry::Tool(t) => out.push_str(t),
                Entry::Streamed(t) => out.push_str(t.trim()),
            }
            previous = Some(entry);
        }
        // A single entry longer than the budget keeps its end.
        let count = out.chars().count();
        if count > MAX_CHARS {
            let tail: String = out.chars().skip(count - MAX_CHARS).collect();
            return format!("…{tail}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_lines_and_texts_paragraphs() {
        let mut p = Preview::default();
        p.text("Let me look.");
        p.tool("🔧 Bash: ls");
        p.tool("✏️ Edit src/main.rs");
        p.text("Done.");
        assert_eq!(
            p.render(),
            "Let me look.\n\n🔧 Bash: ls\n✏️ Edit src/main.rs\n\nDone."
        );
    }

    #[test]
    fn the_preview_stays_bounded() {
        let mut p = Preview::default();
        for i in 0..1000 {
            p.tool(&format!("🔧 Bash: step {i}"));
        }
        let text = p.render();
        assert!(text.starts_with("… (988 earlier steps)"));
        assert!(text.ends_with("step 999"));
        p.text(&"x".repeat(10_000));
        assert!(p.render().chars().count() <= MAX_CHARS + 1);
    }
}
