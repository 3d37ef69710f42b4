//! The live preview of a JSONL turn: the agent's text and one short line
//! per tool it starts, newest last, bounded so an agent that runs a
//! thousand tools still fits one Telegram message. The preview only feeds
//! [`crate::agent::Progress`]; edit pacing stays with delivery.

use std::collections::VecDeque;

/// At most this many entries (texts and tool lines) are shown.
const MAX_ENTRIES: usize = 12;
/// About this many characters are shown (the oldest entries go first).
const MAX_CHARS: usize = 3000;

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Text(String),
    Tool(String),
}

/// The entries shown while a turn runs.
#[derive(Debug, Default)]
pub struct Preview {
    entries: VecDeque<Entry>,
    hidden: usize,
}

impl Preview {
    /// The agent said something.
    pub fn text(&mut self, text: &str) {
        self.push(Entry::Text(text.trim().to_string()));
    }

    /// A tool started.
    pub fn tool(&mut self, line: &str) {
        self.push(Entry::Tool(line.to_string()));
    }

    fn push(&mut self, entry: Entry) {
        self.entries.push_back(entry);
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
                Entry::Text(t) | Entry::Tool(t) => t.chars().count() + 2,
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
