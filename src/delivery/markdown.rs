//! Agent Markdown → Telegram plain text plus entities.
//!
//! Agents write CommonMark-ish Markdown. Telegram's own `MarkdownV2` parse
//! mode rejects the whole message on any unescaped `_`, `*`, `.` or `!`,
//! which agent output is full of (`snake_case`, `2*3*4`, prices, URLs), and
//! escaping it correctly would mean parsing the Markdown anyway. So we parse
//! it once with pulldown-cmark (a real CommonMark parser that never fails)
//! and emit what Telegram renders natively: plain text plus entities.
//!
//! Chat is not a web page, so the mapping is chosen for reading on a phone:
//! headings become bold lines, list items get `• ` / `1. ` markers with
//! nested lists indented, tables become a monospace block with aligned
//! columns, images become their alt text and URL, raw HTML stays as the
//! text the agent wrote, and line breaks inside a paragraph stay line
//! breaks. Anything that produces no visible text produces no entity.

use pulldown_cmark::{Alignment, CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

use super::entity::{utf16_len, EntityKind, FormattedText, TextEntity};

/// Drawn for a thematic break (`---`).
const RULE: &str = "———";
/// Marker in front of a bullet-list item.
const BULLET: &str = "• ";

/// Renders agent Markdown into Telegram text and entities.
///
/// Never panics and never fails: any input is valid CommonMark. Entity
/// offsets are in UTF-16 code units, every entity is non-empty and inside
/// the text, and the text has no trailing whitespace. Text without
/// Markdown syntax comes out unchanged (apart from trailing whitespace).
/// Input that is not blank never renders to empty text: if the Markdown
/// has nothing visible (say, a lone "```"), the input is sent as plain
/// text rather than silently dropping the reply.
pub fn render(markdown: &str) -> FormattedText {
    let normalized = markdown.replace("\r\n", "\n");
    let mut renderer = Renderer::default();
    for event in Parser::new_ext(&normalized, parser_options()) {
        renderer.handle(event);
    }
    let rendered = renderer.finish();
    if rendered.text.is_empty() {
        return FormattedText::plain(normalized.trim_end());
    }
    rendered
}

/// CommonMark plus the two GitHub extensions agents use most.
fn parser_options() -> Options {
    Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES
}

/// Separation owed before the next text, written lazily so that nothing
/// trails the last block and nothing precedes the first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Separator {
    #[default]
    None,
    /// A single newline.
    Line,
    /// A blank line between blocks.
    Paragraph,
}

/// A formatting span whose end tag has not been seen yet.
struct OpenSpan {
    /// `None` for spans that produce no entity (inside tables, where
    /// everything is monospace anyway).
    kind: Option<EntityKind>,
    /// UTF-16 offset of its first character; `None` until text arrives, so
    /// that the separator written before that text is not included.
    start: Option<usize>,
}

/// One list being rendered.
struct ListState {
    /// Number of the next item, or `None` for a bullet list.
    next_number: Option<u64>,
    /// Width in characters of the open item's marker, so continuation lines
    /// and nested lists line up under the item's text. 0 between items.
    marker_width: usize,
}

/// Verbatim content collected until its block ends, then written at once
/// (code blocks need their trailing newline removed before measuring).
struct RawBlock {
    content: String,
    /// `Some(language)` for a code block, `None` for an HTML block.
    code_language: Option<Option<String>>,
}

/// A table being collected; rendered to aligned text when it ends.
#[derive(Default)]
struct TableState {
    alignments: Vec<Alignment>,
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
}

/// Event-driven writer that accumulates the output text and entities.
#[derive(Default)]
struct Renderer {
    text: String,
    /// `utf16_len(&self.text)`, kept incrementally.
    position: usize,
    entities: Vec<TextEntity>,
    open_spans: Vec<OpenSpan>,
    pending: Separator,
    lists: Vec<ListState>,
    /// True right after a list marker: a block starting here stays on the
    /// marker's line instead of leaving the bullet alone on its own line.
    after_marker: bool,
    raw_block: Option<RawBlock>,
    table: Option<TableState>,
    /// Open images: destination URL and `bytes_written` at their start.
    images: Vec<(String, usize)>,
    /// Bytes of text written anywhere (output, table cell, raw block), so
    /// that an image can tell whether it had alt text.
    bytes_written: usize,
}

impl Renderer {
    fn handle(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) => self.write(&text),
            Event::Code(code) => self.write_inline_code(&code),
            Event::InlineMath(math) | Event::DisplayMath(math) => self.write(&math),
            Event::Html(html) | Event::InlineHtml(html) => self.write(&html),
            Event::FootnoteReference(label) => self.write(&format!("[^{label}]")),
            Event::SoftBreak | Event::HardBreak => self.line_break(),
            Event::Rule => {
                self.separate(Separator::Line);
                self.write(RULE);
                self.separate(self.block_gap());
            }
            Event::TaskListMarker(done) => self.write(if done { "[x] " } else { "[ ] " }),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => {}
            Tag::Heading { .. } => {
                self.separate(Separator::Line);
                self.open_span(EntityKind::Bold);
            }
            Tag::BlockQuote(_) => {
                self.separate(Separator::Line);
                self.open_span(EntityKind::Blockquote);
            }
            Tag::CodeBlock(kind) => {
                self.separate(Separator::Line);
                self.raw_block = Some(RawBlock {
                    content: String::new(),
                    code_language: Some(code_language(&kind)),
                });
            }
            Tag::HtmlBlock => {
                self.separate(Separator::Line);
                self.raw_block = Some(RawBlock {
                    content: String::new(),
                    code_language: None,
                });
            }
            Tag::List(first_number) => self.lists.push(ListState {
                next_number: first_number,
                marker_width: 0,
            }),
            Tag::Item => self.start_item(),
            Tag::Table(alignments) => {
                self.separate(Separator::Line);
                self.table = Some(TableState {
                    alignments,
                    ..TableState::default()
                });
            }
            Tag::TableHead | Tag::TableRow | Tag::TableCell => {}
            Tag::Emphasis => self.open_span(EntityKind::Italic),
            Tag::Strong => self.open_span(EntityKind::Bold),
            Tag::Strikethrough => self.open_span(EntityKind::Strikethrough),
            Tag::Link { dest_url, .. } => self.open_span(EntityKind::TextLink {
                url: dest_url.to_string(),
            }),
            Tag::Image { dest_url, .. } => {
                self.images.push((dest_url.to_string(), self.bytes_written));
            }
            Tag::FootnoteDefinition(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::MetadataBlock(_) => self.separate(Separator::Line),
            Tag::Superscript | Tag::Subscript => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        // Whatever this closes, the next block no longer sits on a marker line.
        self.after_marker = false;
        match tag {
            TagEnd::Paragraph => self.separate(Separator::Paragraph),
            TagEnd::Heading(_) | TagEnd::BlockQuote(_) => {
                self.close_span();
                self.separate(self.block_gap());
            }
            TagEnd::CodeBlock | TagEnd::HtmlBlock => {
                self.finish_raw_block();
                self.separate(self.block_gap());
            }
            TagEnd::List(_) => {
                self.lists.pop();
                let separator = if self.lists.is_empty() {
                    Separator::Paragraph
                } else {
                    Separator::Line
                };
                self.separate(separator);
            }
            TagEnd::Item => {
                if let Some(list) = self.lists.last_mut() {
                    list.marker_width = 0;
                }
                self.separate(Separator::Line);
            }
            TagEnd::Table => {
                self.finish_table();
                self.separate(self.block_gap());
            }
            TagEnd::TableHead | TagEnd::TableRow => {
                if let Some(table) = self.table.as_mut() {
                    let row = std::mem::take(&mut table.row);
                    table.rows.push(row);
                }
            }
            TagEnd::TableCell => {
                if let Some(table) = self.table.as_mut() {
                    let cell = std::mem::take(&mut table.cell);
                    table.row.push(cell.trim().to_string());
                }
            }
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough | TagEnd::Link => {
                self.close_span();
            }
            TagEnd::Image => self.finish_image(),
            TagEnd::FootnoteDefinition
            | TagEnd::DefinitionList
            | TagEnd::DefinitionListTitle
            | TagEnd::DefinitionListDefinition
            | TagEnd::MetadataBlock(_) => self.separate(Separator::Line),
            TagEnd::Superscript | TagEnd::Subscript => {}
        }
    }

    /// Space after a block other than a paragraph: a blank line at the top
    /// level, a single newline inside a list so that a code block or quote
    /// does not tear a tight list apart. (Loose lists still get blank lines:
    /// their items are paragraphs.)
    fn block_gap(&self) -> Separator {
        if self.lists.is_empty() {
            Separator::Paragraph
        } else {
            Separator::Line
        }
    }

    /// Asks for at least `separator` before the next text. Ignored at the
    /// very start of the output and right after a list marker.
    fn separate(&mut self, separator: Separator) {
        if self.after_marker {
            return;
        }
        self.pending = self.pending.max(separator);
    }

    fn line_break(&mut self) {
        match self.table.as_mut() {
            Some(table) => table.cell.push(' '),
            None => self.separate(Separator::Line),
        }
    }

    /// Writes inline text wherever text currently goes.
    fn write(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.bytes_written += text.len();
        if let Some(raw) = self.raw_block.as_mut() {
            raw.content.push_str(text);
        } else if let Some(table) = self.table.as_mut() {
            table.cell.push_str(text);
        } else {
            self.flush_separator(true);
            self.begin_open_spans();
            self.push(text);
        }
    }

    fn write_inline_code(&mut self, code: &str) {
        if self.table.is_some() || self.raw_block.is_some() {
            self.write(code);
            return;
        }
        if code.is_empty() {
            return;
        }
        self.bytes_written += code.len();
        self.flush_separator(true);
        self.begin_open_spans();
        let start = self.position;
        self.push(code);
        self.add_entity(EntityKind::Code, start);
    }

    /// Writes a whole block (code, table) under one entity. Such blocks are
    /// not indented: Telegram draws them as their own box.
    fn write_block(&mut self, content: &str, kind: Option<EntityKind>) {
        if content.is_empty() {
            return;
        }
        self.bytes_written += content.len();
        self.flush_separator(false);
        self.begin_open_spans();
        let start = self.position;
        self.push(content);
        if let Some(kind) = kind {
            self.add_entity(kind, start);
        }
    }

    fn push(&mut self, text: &str) {
        self.text.push_str(text);
        self.position += utf16_len(text);
        self.after_marker = false;
    }

    /// Writes the separator owed, plus the list indentation if `indent`.
    fn flush_separator(&mut self, indent: bool) {
        let separator = std::mem::take(&mut self.pending);
        if self.text.is_empty() {
            return;
        }
        let newlines = match separator {
            Separator::None => return,
            Separator::Line => "\n",
            Separator::Paragraph => "\n\n",
        };
        self.push(newlines);
        if indent {
            let width: usize = self.lists.iter().map(|list| list.marker_width).sum();
            self.push(&" ".repeat(width));
        }
    }

    fn start_item(&mut self) {
        self.separate(Separator::Line);
        let Some(list) = self.lists.last_mut() else {
            return;
        };
        list.marker_width = 0;
        let marker = match list.next_number.as_mut() {
            Some(number) => {
                let marker = format!("{number}. ");
                *number = number.saturating_add(1);
                marker
            }
            None => BULLET.to_string(),
        };
        self.write(&marker);
        if let Some(list) = self.lists.last_mut() {
            list.marker_width = marker.chars().count();
        }
        self.after_marker = true;
    }

    fn open_span(&mut self, kind: EntityKind) {
        let kind = if self.table.is_some() {
            None
        } else {
            Some(kind)
        };
        self.open_spans.push(OpenSpan { kind, start: None });
    }

    /// Marks every span still waiting for text as starting here.
    fn begin_open_spans(&mut self) {
        for span in self.open_spans.iter_mut().rev() {
            if span.start.is_some() {
                break;
            }
            span.start = Some(self.position);
        }
    }

    fn close_span(&mut self) {
        let Some(span) = self.open_spans.pop() else {
            return;
        };
        let (Some(kind), Some(start)) = (span.kind, span.start) else {
            return;
        };
        // An enclosing span of the same kind already covers this one;
        // Telegram also refuses nested blockquotes.
        if self
            .open_spans
            .iter()
            .any(|outer| outer.kind.as_ref() == Some(&kind))
        {
            return;
        }
        self.add_entity(kind, start);
    }

    /// Records an entity from `start` to the current end of the text.
    fn add_entity(&mut self, kind: EntityKind, start: usize) {
        let length = self.position.saturating_sub(start);
        if length > 0 {
            self.entities.push(TextEntity::new(kind, start, length));
        }
    }

    fn finish_raw_block(&mut self) {
        let Some(raw) = self.raw_block.take() else {
            return;
        };
        let content = raw.content.trim_end_matches('\n');
        match raw.code_language {
            Some(language) => self.write_block(content, Some(EntityKind::Pre { language })),
            None => self.write(content),
        }
    }

    fn finish_table(&mut self) {
        let Some(table) = self.table.take() else {
            return;
        };
        let rendered = render_table(&table.alignments, &table.rows);
        self.write_block(&rendered, Some(EntityKind::Pre { language: None }));
    }

    fn finish_image(&mut self) {
        let Some((url, written_before)) = self.images.pop() else {
            return;
        };
        if url.is_empty() {
            return;
        }
        if self.bytes_written > written_before {
            self.write(&format!(" ({url})"));
        } else {
            self.write(&url);
        }
    }

    /// Trims trailing whitespace and returns the result with entities
    /// clipped to the trimmed text, ordered by position.
    fn finish(mut self) -> FormattedText {
        let kept = self.text.trim_end().len();
        self.text.truncate(kept);
        let text_length = utf16_len(&self.text);
        let mut entities: Vec<TextEntity> = self
            .entities
            .into_iter()
            .filter_map(|entity| {
                let end = entity.end().min(text_length);
                (entity.offset < end)
                    .then(|| TextEntity::new(entity.kind, entity.offset, end - entity.offset))
            })
            .collect();
        entities.sort_by_key(|entity| (entity.offset, std::cmp::Reverse(entity.length)));
        FormattedText {
            text: self.text,
            entities,
        }
    }
}

/// The language of a fenced block: the first word of its info string.
fn code_language(kind: &CodeBlockKind<'_>) -> Option<String> {
    match kind {
        CodeBlockKind::Fenced(info) => info.split_whitespace().next().map(str::to_string),
        CodeBlockKind::Indented => None,
    }
}

/// Lays out a table as monospace text: columns padded to their widest
/// cell (in characters; wide CJK/emoji glyphs are not measured specially),
/// separated by ` | `, with a rule under the header row.
fn render_table(alignments: &[Alignment], rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut lines = Vec::with_capacity(rows.len() + 1);
    for (index, row) in rows.iter().enumerate() {
        let cells: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(column, &width)| {
                let cell = row.get(column).map(String::as_str).unwrap_or("");
                let alignment = alignments.get(column).copied().unwrap_or(Alignment::None);
                pad_cell(cell, width, alignment)
            })
            .collect();
        lines.push(cells.join(" | ").trim_end().to_string());
        if index == 0 {
            let rule: Vec<String> = widths.iter().map(|&width| "-".repeat(width)).collect();
            lines.push(rule.join("-+-"));
        }
    }
    lines.join("\n")
}

/// `cell` padded with spaces to `width` characters according to `alignment`.
fn pad_cell(cell: &str, width: usize, alignment: Alignment) -> String {
    let padding = width.saturating_sub(cell.chars().count());
    let (left, right) = match alignment {
        Alignment::Right => (padding, 0),
        Alignment::Center => (padding / 2, padding - padding / 2),
        Alignment::Left | Alignment::None => (0, padding),
    };
    format!("{}{cell}{}", " ".repeat(left), " ".repeat(right))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::entity::checks::{assert_entities_valid, covered};
    use proptest::prelude::*;

    /// The kinds and covered texts of `rendered`'s entities, in order.
    fn spans(rendered: &FormattedText) -> Vec<(EntityKind, String)> {
        rendered
            .entities
            .iter()
            .map(|entity| (entity.kind.clone(), covered(rendered, entity)))
            .collect()
    }

    fn pre(language: Option<&str>) -> EntityKind {
        EntityKind::Pre {
            language: language.map(str::to_string),
        }
    }

    #[test]
    fn plain_text_is_unchanged() {
        for text in [
            "Hello, world",
            "snake_case_names and file_name_here.rs stay",
            "2 * 3 * 4 = 24, and a lone *star too",
            "~5 to ~10 minutes",
            "first line\nsecond line",
            "one paragraph\n\nanother one",
            "price: $5 (approx.) - ok?",
            "日本語のテキスト 😀 👨‍👩‍👧",
        ] {
            let rendered = render(text);
            assert_eq!(rendered.text, text);
            assert!(rendered.entities.is_empty(), "{text:?} -> {rendered:?}");
        }
    }

    #[test]
    fn markdown_with_nothing_visible_falls_back_to_the_input() {
        assert_eq!(render("```"), FormattedText::plain("```"));
        assert_eq!(render("``` \n\n"), FormattedText::plain("```"));
        assert_eq!(
            render("[](https://a.b)"),
            FormattedText::plain("[](https://a.b)")
        );
        assert_eq!(render("<!-- -->").text, "<!-- -->");
    }

    #[test]
    fn intraword_stars_follow_commonmark() {
        // CommonMark makes `*3*` inside a word emphasis; we follow the
        // parser rather than guess what the agent meant.
        let rendered = render("2*3*4");
        assert_eq!(rendered.text, "234");
        assert_eq!(spans(&rendered), vec![(EntityKind::Italic, "3".into())]);
    }

    #[test]
    fn trailing_whitespace_is_trimmed() {
        assert_eq!(render("text  \n\n\n").text, "text");
        assert_eq!(render("").text, "");
        assert_eq!(render("   \n\n").text, "");
    }

    #[test]
    fn inline_styles_become_entities() {
        let rendered = render("a **bold** _it_ `code` ~~gone~~");
        assert_eq!(rendered.text, "a bold it code gone");
        assert_eq!(
            spans(&rendered),
            vec![
                (EntityKind::Bold, "bold".into()),
                (EntityKind::Italic, "it".into()),
                (EntityKind::Code, "code".into()),
                (EntityKind::Strikethrough, "gone".into()),
            ]
        );
    }

    #[test]
    fn offsets_count_utf16_units() {
        let rendered = render("😀 **bold** 🇩🇪 *x*");
        assert_eq!(rendered.text, "😀 bold 🇩🇪 x");
        assert_eq!(
            rendered.entities[0],
            TextEntity::new(EntityKind::Bold, 3, 4)
        );
        assert_eq!(
            rendered.entities[1],
            TextEntity::new(EntityKind::Italic, 13, 1)
        );
    }

    #[test]
    fn nested_styles_overlap() {
        let rendered = render("***both*** and **bold *inner* bold**");
        assert_eq!(rendered.text, "both and bold inner bold");
        let found = spans(&rendered);
        assert!(found.contains(&(EntityKind::Bold, "both".into())));
        assert!(found.contains(&(EntityKind::Italic, "both".into())));
        assert!(found.contains(&(EntityKind::Bold, "bold inner bold".into())));
        assert!(found.contains(&(EntityKind::Italic, "inner".into())));
    }

    #[test]
    fn fenced_code_keeps_its_language_and_drops_the_final_newline() {
        let rendered = render("Look:\n\n```rust ignore\nfn main() {\n    x();\n}\n```\n\nDone.");
        assert_eq!(rendered.text, "Look:\n\nfn main() {\n    x();\n}\n\nDone.");
        assert_eq!(
            spans(&rendered),
            vec![(pre(Some("rust")), "fn main() {\n    x();\n}".into())]
        );
    }

    #[test]
    fn indented_and_unlabelled_code_have_no_language() {
        let rendered = render("text\n\n    let x = 1;\n\n```\nplain\n```");
        assert_eq!(rendered.text, "text\n\nlet x = 1;\n\nplain");
        assert_eq!(
            spans(&rendered),
            vec![
                (pre(None), "let x = 1;".into()),
                (pre(None), "plain".into())
            ]
        );
    }

    #[test]
    fn markdown_inside_code_is_literal() {
        let rendered = render("`**not bold**` and\n```\n# not a heading\n```");
        assert_eq!(rendered.text, "**not bold** and\n\n# not a heading");
        assert_eq!(rendered.entities.len(), 2);
    }

    #[test]
    fn links_keep_their_text() {
        let rendered = render("see [the docs](https://example.com/docs) or <https://x.org>");
        assert_eq!(rendered.text, "see the docs or https://x.org");
        assert_eq!(
            spans(&rendered),
            vec![
                (
                    EntityKind::TextLink {
                        url: "https://example.com/docs".into()
                    },
                    "the docs".into()
                ),
                (
                    EntityKind::TextLink {
                        url: "https://x.org".into()
                    },
                    "https://x.org".into()
                ),
            ]
        );
    }

    #[test]
    fn headings_are_bold_lines() {
        let rendered = render("# Title\nbody\n## Sub **x**\nmore");
        assert_eq!(rendered.text, "Title\n\nbody\n\nSub x\n\nmore");
        assert_eq!(
            spans(&rendered),
            vec![
                (EntityKind::Bold, "Title".into()),
                (EntityKind::Bold, "Sub x".into()),
            ]
        );
    }

    #[test]
    fn lists_get_markers_and_nested_lists_are_indented() {
        let rendered = render("Steps:\n\n- one\n- two\n  - deep\n    1. deeper\n- three\n\nafter");
        assert_eq!(
            rendered.text,
            "Steps:\n\n• one\n• two\n  • deep\n    1. deeper\n• three\n\nafter"
        );
    }

    #[test]
    fn ordered_lists_keep_their_start_number() {
        let rendered = render("3. c\n4. d\n\n1) x");
        assert_eq!(rendered.text, "3. c\n4. d\n\n1. x");
    }

    #[test]
    fn loose_list_items_are_separated_by_blank_lines() {
        let rendered = render("- a\n\n  continued\n\n- b");
        assert_eq!(rendered.text, "• a\n\n  continued\n\n• b");
    }

    #[test]
    fn empty_list_items_do_not_merge() {
        assert_eq!(render("-\n- b").text, "• \n• b");
        assert_eq!(render("- - a").text, "• • a");
    }

    #[test]
    fn code_block_in_a_list_item_is_a_pre_block() {
        let rendered = render("- run:\n  ```sh\n  make\n  ```\n- done");
        assert_eq!(rendered.text, "• run:\nmake\n• done");
        assert_eq!(spans(&rendered), vec![(pre(Some("sh")), "make".into())]);
    }

    #[test]
    fn tables_become_aligned_pre_blocks() {
        let rendered = render(
            "| Name | Qty | Note |\n|:---|---:|:---:|\n| apple | 3 | ok |\n| kiwi | 12 | `x` **y** |\n\nend",
        );
        let table = "Name  | Qty | Note\n\
                     ------+-----+-----\n\
                     apple |   3 |  ok\n\
                     kiwi  |  12 | x y";
        assert_eq!(rendered.text, format!("{table}\n\nend"));
        assert_eq!(spans(&rendered), vec![(pre(None), table.to_string())]);
    }

    #[test]
    fn blockquotes_are_one_entity_even_when_nested() {
        let rendered = render("intro\n\n> quoted\n> > deeper\n\nafter");
        assert_eq!(rendered.text, "intro\n\nquoted\n\ndeeper\n\nafter");
        assert_eq!(
            spans(&rendered),
            vec![(EntityKind::Blockquote, "quoted\n\ndeeper".into())]
        );
    }

    #[test]
    fn images_become_alt_text_and_url() {
        assert_eq!(
            render("![a cat](https://c.at/1.png)").text,
            "a cat (https://c.at/1.png)"
        );
        assert_eq!(render("![](https://c.at/1.png)").text, "https://c.at/1.png");
    }

    #[test]
    fn raw_html_is_kept_as_text() {
        assert_eq!(render("a <b>tag</b> here").text, "a <b>tag</b> here");
        assert_eq!(
            render("<div>\nblock\n</div>\n\nafter").text,
            "<div>\nblock\n</div>\n\nafter"
        );
    }

    #[test]
    fn rules_and_crlf() {
        assert_eq!(
            render("a\r\n\r\n---\r\nb").text,
            format!("a\n\n{RULE}\n\nb")
        );
    }

    #[test]
    fn escapes_and_entities_are_resolved() {
        assert_eq!(
            render(r"\*not italic\* &amp; AT&T").text,
            "*not italic* & AT&T"
        );
    }

    /// Pieces of Markdown syntax and awkward Unicode to build inputs from.
    const FRAGMENTS: &[&str] = &[
        "**",
        "*",
        "_",
        "__",
        "`",
        "``",
        "```",
        "```rust\n",
        "~~",
        "~",
        "[",
        "]",
        "](",
        ")",
        "(https://example.com)",
        "<https://a.b>",
        "<",
        ">",
        "# ",
        "## ",
        "- ",
        "* ",
        "+ ",
        "1. ",
        "2) ",
        "> ",
        "| a | b |\n|---|:-:|\n",
        "|",
        "\n",
        "\n\n",
        "  ",
        "    ",
        " ",
        "\t",
        "😀",
        "👨\u{200d}👩\u{200d}👧",
        "🇩🇪",
        "e\u{301}",
        "日本語",
        "<b>",
        "</b>",
        "<div>\n",
        "![",
        "word",
        "snake_case",
        "\\",
        "&amp;",
        "&#x1F600;",
        "---\n",
        "===\n",
        "\r\n",
        "\u{0}",
        "[^1]",
        "- [ ] ",
    ];

    fn markdownish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => prop::sample::select(FRAGMENTS).prop_map(str::to_string),
            1 => any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..60).prop_map(|pieces| pieces.concat())
    }

    fn assert_well_formed(input: &str, rendered: &FormattedText) {
        assert_entities_valid(rendered);
        assert_eq!(rendered.text.trim_end(), rendered.text);
        assert_eq!(rendered.text.is_empty(), input.trim_end().is_empty());
    }

    proptest! {
        #[test]
        fn any_input_renders_well_formed(input in any::<String>()) {
            assert_well_formed(&input, &render(&input));
        }

        #[test]
        fn markdown_soup_renders_well_formed(input in markdownish()) {
            assert_well_formed(&input, &render(&input));
        }

        #[test]
        fn plain_prose_is_unchanged(
            lines in prop::collection::vec(
                (
                    "[a-zA-Zа-яé日本😀]",
                    prop::collection::vec(
                        prop_oneof![
                            "[a-zA-Z0-9,;:'?()/.!$%=+-]{1,8}",
                            "[a-z0-9]{1,4}(_[a-z0-9]{1,4}){1,2}",
                        ],
                        0..6,
                    ),
                    prop::sample::select(vec!["\n", "\n\n"]),
                ),
                1..8,
            )
        ) {
            let mut text = String::new();
            for (index, (first, words, separator)) in lines.iter().enumerate() {
                if index > 0 {
                    text.push_str(separator);
                }
                text.push_str(first);
                for word in words {
                    text.push(' ');
                    text.push_str(word);
                }
            }
            let rendered = render(&text);
            prop_assert_eq!(&rendered.text, &text);
        }

        #[test]
        fn styled_word_after_emoji_is_covered_exactly(
            prefix in "([a-z😀🇩🇪👍🏽日][a-z 😀🇩🇪👍🏽日]{0,11})?",
            word in "[a-z😀]{1,6}",
            marker in prop::sample::select(vec!["**", "*", "`", "~~"]),
        ) {
            let rendered = render(&format!("{prefix} {marker}{word}{marker}"));
            prop_assert_eq!(rendered.entities.len(), 1);
            let entity = &rendered.entities[0];
            prop_assert_eq!(covered(&rendered, entity), word.clone());
            prop_assert_eq!(entity.offset + entity.length, utf16_len(&rendered.text));
        }
    }
}
