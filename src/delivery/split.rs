//! Splitting formatted text into messages that fit Telegram's size limit.
//!
//! Telegram refuses messages longer than 4096 UTF-16 code units, and agent
//! replies are often longer. A cut in the wrong place makes the reply hard
//! to read (half a word, half a flag emoji, a code block whose second half
//! lost its formatting), so the splitter looks for the most natural
//! boundary that still fills a reasonable part of the message: a blank
//! line, else a line break, else a space, and only then a hard cut, which
//! still avoids landing inside a character or a visible symbol made of
//! several code points (emoji ZWJ sequences, flags, skin tones, accents).
//!
//! Formatting is carried across the cut: an entity that spans two chunks is
//! clipped into both, so a code block cut in two is a code block (with its
//! language) in both messages. Whitespace at a cut is dropped, since a
//! message starting with blank lines looks broken, except the indentation
//! of a code line, which is content.

use unicode_segmentation::GraphemeCursor;

use super::entity::{utf16_len, EntityKind, FormattedText, TextEntity};

/// Maximum length of a Telegram text message, in UTF-16 code units.
pub const TELEGRAM_LIMIT: usize = 4096;

/// Smallest usable limit: one character may need two UTF-16 units.
const MIN_LIMIT: usize = 2;

/// Splits `text` into chunks of at most `limit` UTF-16 code units each.
///
/// Text that fits is returned as a single, unchanged chunk; empty text gives
/// no chunks. Otherwise each cut is made at the last paragraph break, else
/// line break, else space in the second half of the allowed window, else at
/// the last grapheme boundary that fits (or, if a single grapheme is longer
/// than the window, the last character boundary). Whitespace around cuts is
/// dropped, except the indentation at the start of a chunk that begins
/// inside a code block. Entities are clipped to each chunk and rebased to
/// its start; no chunk is empty and no entity is empty.
///
/// `limit` is raised to 2 if smaller, since one character can take two
/// units. Entities are expected to lie on character boundaries, as
/// [`render`](super::markdown::render) produces them.
pub fn split(text: &FormattedText, limit: usize) -> Vec<FormattedText> {
    let limit = limit.max(MIN_LIMIT);
    let source = text.text.as_str();
    let code_blocks = code_block_ranges(&text.entities);
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut start_units = 0;
    while start < source.len() {
        let (window_end, window_units) = fit_window(source, start, limit);
        let (cut, chunk_end) = if window_end == source.len() {
            (window_end, window_end)
        } else {
            let cut = choose_cut(source, start, window_end);
            (cut, start + source[start..cut].trim_end().len())
        };
        let chunk_units = if chunk_end == window_end {
            window_units
        } else {
            utf16_len(&source[start..chunk_end])
        };
        // A later chunk that would be only whitespace (indentation kept at the
        // start of a code block's tail) is not sent: Telegram refuses a
        // message with nothing visible in it.
        let visible = start == 0 || !source[start..chunk_end].trim().is_empty();
        if chunk_end > start && visible {
            chunks.push(FormattedText {
                text: source[start..chunk_end].to_string(),
                entities: clip_entities(&text.entities, start_units, start_units + chunk_units),
            });
        }
        let cut_units = start_units + utf16_len(&source[start..cut]);
        (start, start_units) = skip_leading_whitespace(source, cut, cut_units, &code_blocks);
    }
    chunks
}

/// The longest prefix of `source[start..]` that fits in `limit` units:
/// its end (a byte index on a character boundary) and its length in units.
fn fit_window(source: &str, start: usize, limit: usize) -> (usize, usize) {
    let mut end = start;
    let mut units = 0;
    for character in source[start..].chars() {
        let width = character.len_utf16();
        if units + width > limit {
            break;
        }
        units += width;
        end += character.len_utf8();
    }
    (end, units)
}

/// Where to cut `source` so the chunk starting at `start` ends within
/// `window_end`. Always returns a character boundary in
/// `start + 1 ..= window_end`, so every chunk makes progress.
fn choose_cut(source: &str, start: usize, window_end: usize) -> usize {
    // Natural boundaries only count in the second half of the window:
    // a blank line near the start would leave a tiny message followed by
    // a still-oversized rest.
    let earliest = (start + (window_end - start) / 2).max(start + 1);
    let is_paragraph_break =
        |at: usize| source.as_bytes().get(at..at + 2) == Some(b"\n\n".as_slice());
    let is_line_break = |at: usize| source.as_bytes().get(at) == Some(&b'\n');
    let is_space = |at: usize| source.as_bytes().get(at) == Some(&b' ');
    let natural_cut = last_position(source, earliest, window_end, is_paragraph_break)
        .or_else(|| last_position(source, earliest, window_end, is_line_break))
        .or_else(|| last_position(source, earliest, window_end, is_space));
    natural_cut.unwrap_or_else(|| hard_cut(source, start, window_end))
}

/// The last byte position in `from..=to` that satisfies `is_boundary` and
/// is a grapheme boundary. Only ASCII is matched, so byte positions found
/// are always character boundaries.
fn last_position(
    source: &str,
    from: usize,
    to: usize,
    is_boundary: impl Fn(usize) -> bool,
) -> Option<usize> {
    (from..=to)
        .rev()
        .find(|&at| is_boundary(at) && is_grapheme_boundary(source, at))
}

/// The last grapheme boundary after `start` and at or before `window_end`,
/// or `window_end` itself (a character boundary) if there is none.
fn hard_cut(source: &str, start: usize, window_end: usize) -> usize {
    let inner_boundaries = source[start..window_end]
        .char_indices()
        .map(|(index, _)| start + index)
        .filter(|&at| at > start)
        .rev();
    std::iter::once(window_end)
        .chain(inner_boundaries)
        .find(|&at| is_grapheme_boundary(source, at))
        .unwrap_or(window_end)
}

/// Whether cutting `text` at byte `index` keeps every user-perceived
/// character whole: an extended grapheme cluster boundary of Unicode's
/// UAX #29 (CR LF, emoji ZWJ sequences, variation selectors, combining
/// marks, skin tones, tag sequences, flag pairs, Hangul syllables, Indic
/// conjuncts...), as computed by `unicode-segmentation`. Returns false for
/// an index that is not even a character boundary.
fn is_grapheme_boundary(text: &str, index: usize) -> bool {
    if !text.is_char_boundary(index) {
        return false;
    }
    // The whole text is one chunk starting at 0, so the cursor never asks
    // for more context; if it ever did, "not a boundary" is the safe answer
    // (hard_cut then falls back to a character boundary).
    GraphemeCursor::new(index, text.len(), true)
        .is_boundary(text, 0)
        .unwrap_or(false)
}

/// UTF-16 ranges covered by code blocks, whose indentation must survive.
fn code_block_ranges(entities: &[TextEntity]) -> Vec<(usize, usize)> {
    entities
        .iter()
        .filter(|entity| matches!(entity.kind, EntityKind::Pre { .. }))
        .map(|entity| (entity.offset, entity.end()))
        .collect()
}

/// Moves past whitespace at the start of the next chunk: all of it, except
/// spaces and tabs inside a code block, which are indentation. Returns the
/// new byte position and its UTF-16 offset.
fn skip_leading_whitespace(
    source: &str,
    mut position: usize,
    mut units: usize,
    code_blocks: &[(usize, usize)],
) -> (usize, usize) {
    for character in source[position..].chars() {
        let is_line_end = character == '\n' || character == '\r';
        let in_code = code_blocks
            .iter()
            .any(|&(start, end)| start <= units && units < end);
        let skippable = is_line_end || (character.is_whitespace() && !in_code);
        if !skippable {
            break;
        }
        position += character.len_utf8();
        units += character.len_utf16();
    }
    (position, units)
}

/// The parts of `entities` inside the UTF-16 range `start..end`, rebased to
/// `start`. Entities that do not reach into the range are left out.
fn clip_entities(entities: &[TextEntity], start: usize, end: usize) -> Vec<TextEntity> {
    entities
        .iter()
        .filter_map(|entity| {
            let clipped_start = entity.offset.max(start);
            let clipped_end = entity.end().min(end);
            (clipped_start < clipped_end).then(|| {
                TextEntity::new(
                    entity.kind.clone(),
                    clipped_start - start,
                    clipped_end - clipped_start,
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::entity::checks::{assert_entities_valid, covered};
    use crate::delivery::markdown::render;
    use proptest::prelude::*;

    const FAMILY: &str = "👨\u{200D}👩\u{200D}👧";
    const THUMB_MEDIUM: &str = "👍🏽";
    const FLAG_DE: &str = "🇩🇪";
    const ACCENTED_E: &str = "e\u{301}";

    fn texts(chunks: &[FormattedText]) -> Vec<&str> {
        chunks.iter().map(|chunk| chunk.text.as_str()).collect()
    }

    /// Byte offset in `original` where each chunk's text was taken from,
    /// checking that only whitespace was dropped between chunks.
    fn chunk_origins(original: &str, chunks: &[FormattedText]) -> Vec<usize> {
        let mut position = 0;
        let mut origins = Vec::new();
        for chunk in chunks {
            let rest = &original[position..];
            let skipped = rest
                .char_indices()
                .map(|(index, _)| index)
                .chain(std::iter::once(rest.len()))
                .find(|&skip| rest[skip..].starts_with(&chunk.text))
                .unwrap_or_else(|| panic!("chunk {:?} not found after {position}", chunk.text));
            assert!(
                rest[..skipped].trim().is_empty(),
                "non-whitespace {:?} dropped before chunk {:?}",
                &rest[..skipped],
                chunk.text
            );
            origins.push(position + skipped);
            position += skipped + chunk.text.len();
        }
        assert!(
            original[position..].trim().is_empty(),
            "text lost at the end: {:?}",
            &original[position..]
        );
        origins
    }

    /// For every UTF-16 unit of a text `units` long, how many entities of
    /// each kind in `kinds` cover it (kinds not listed are added to it).
    fn coverage(
        entities: &[TextEntity],
        units: usize,
        kinds: &mut Vec<EntityKind>,
    ) -> Vec<Vec<i32>> {
        let mut steps: Vec<Vec<i32>> = vec![Vec::new(); units + 1];
        for entity in entities {
            let kind = match kinds.iter().position(|known| *known == entity.kind) {
                Some(index) => index,
                None => {
                    kinds.push(entity.kind.clone());
                    kinds.len() - 1
                }
            };
            for (at, step) in [(entity.offset, 1), (entity.end(), -1)] {
                let row = &mut steps[at];
                row.resize(row.len().max(kind + 1), 0);
                row[kind] += step;
            }
        }
        let mut running: Vec<i32> = Vec::new();
        let mut covered = Vec::with_capacity(units);
        for row in steps.into_iter().take(units) {
            running.resize(running.len().max(row.len()), 0);
            for (count, step) in running.iter_mut().zip(row) {
                *count += step;
            }
            covered.push(running.clone());
        }
        covered
    }

    /// `counts` without trailing zeros, so that rows built with different
    /// numbers of known kinds compare equal.
    fn normalized(counts: &[i32]) -> &[i32] {
        let used = counts
            .iter()
            .rposition(|&count| count != 0)
            .map_or(0, |last| last + 1);
        &counts[..used]
    }

    /// Checks every promise `split` makes about `chunks`.
    fn assert_valid_split(original: &FormattedText, chunks: &[FormattedText], limit: usize) {
        if original.text.is_empty() {
            assert!(chunks.is_empty());
        }
        if original.utf16_len() <= limit && !original.text.is_empty() {
            assert_eq!(texts(chunks), vec![original.text.as_str()]);
        }
        let origins = chunk_origins(&original.text, chunks);
        let mut kinds = Vec::new();
        let original_coverage = coverage(&original.entities, original.utf16_len(), &mut kinds);
        for (chunk, origin) in chunks.iter().zip(origins) {
            assert!(!chunk.text.is_empty());
            assert!(
                chunk.utf16_len() <= limit.max(MIN_LIMIT),
                "chunk of {} units over limit {limit}",
                chunk.utf16_len()
            );
            assert_entities_valid(chunk);
            // Formatting is preserved unit by unit.
            let origin_units = utf16_len(&original.text[..origin]);
            let chunk_coverage = coverage(&chunk.entities, chunk.utf16_len(), &mut kinds);
            for (unit, counts) in chunk_coverage.iter().enumerate() {
                assert_eq!(
                    normalized(counts),
                    normalized(&original_coverage[origin_units + unit]),
                    "formatting differs at unit {unit} of chunk {:?} ({kinds:?})",
                    chunk.text
                );
            }
        }
    }

    #[test]
    fn empty_text_gives_no_chunks() {
        assert!(split(&FormattedText::plain(""), 10).is_empty());
    }

    #[test]
    fn text_that_fits_is_unchanged() {
        let text = FormattedText {
            text: "  hi 😀  ".into(),
            entities: vec![TextEntity::new(EntityKind::Bold, 2, 2)],
        };
        assert_eq!(split(&text, 10), vec![text.clone()]);
        assert_eq!(split(&text, TELEGRAM_LIMIT), vec![text]);
    }

    #[test]
    fn prefers_paragraph_then_line_then_space() {
        let text = FormattedText::plain("aaaa bbbb\ncccc\n\ndddd eeee");
        assert_eq!(
            texts(&split(&text, 18)),
            vec!["aaaa bbbb\ncccc", "dddd eeee"]
        );
        // A blank line wins over a later single line break in the window.
        let text = FormattedText::plain("aaaaaaaa\n\nbb\ncccc dddd");
        assert_eq!(texts(&split(&text, 16)), vec!["aaaaaaaa", "bb\ncccc dddd"]);
        let text = FormattedText::plain("aaaa bbbb\ncccc dddd");
        assert_eq!(texts(&split(&text, 16)), vec!["aaaa bbbb", "cccc dddd"]);
        let text = FormattedText::plain("aaaa bbbb cccc");
        assert_eq!(texts(&split(&text, 12)), vec!["aaaa bbbb", "cccc"]);
    }

    #[test]
    fn boundary_in_the_first_half_loses_to_a_later_one() {
        let text = FormattedText::plain("ab\n\ncdefgh ijklmnop");
        assert_eq!(texts(&split(&text, 14)), vec!["ab\n\ncdefgh", "ijklmnop"]);
    }

    #[test]
    fn hard_cut_when_there_is_no_boundary() {
        let text = FormattedText::plain("abcdefghij");
        assert_eq!(texts(&split(&text, 4)), vec!["abcd", "efgh", "ij"]);
    }

    #[test]
    fn limit_is_measured_in_utf16_units() {
        let text = FormattedText::plain("😀".repeat(5));
        assert_eq!(texts(&split(&text, 5)), vec!["😀😀", "😀😀", "😀"]);
        let text = FormattedText::plain("日".repeat(5));
        assert_eq!(texts(&split(&text, 5)), vec!["日日日日日"]);
    }

    #[test]
    fn tiny_limits_still_make_progress() {
        let text = FormattedText::plain("😀a");
        assert_eq!(texts(&split(&text, 0)), vec!["😀", "a"]);
        assert_eq!(texts(&split(&text, 1)), vec!["😀", "a"]);
    }

    #[test]
    fn emoji_sequences_are_not_cut() {
        for (symbol, limit) in [
            (FAMILY, 12),
            (THUMB_MEDIUM, 6),
            (FLAG_DE, 6),
            (ACCENTED_E, 3),
            ("1\u{FE0F}\u{20E3}", 4),
            (
                "🏴\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}",
                16,
            ),
            // Beyond the old hand-written rules (UAX #29 via
            // unicode-segmentation): a Hangul syllable from conjoining
            // jamo, a Devanagari conjunct, a ZWJ sequence with a skin tone.
            ("\u{1100}\u{1161}\u{11A8}", 4),
            ("\u{0915}\u{094D}\u{0937}\u{093F}", 6),
            ("👩🏽\u{200D}💻", 8),
        ] {
            let text = FormattedText::plain(symbol.repeat(7));
            let chunks = split(&text, limit);
            assert!(chunks.len() > 1);
            for chunk in &chunks {
                assert!(
                    chunk.text.replace(symbol, "").is_empty(),
                    "{symbol:?} cut at limit {limit}: {chunk:?}"
                );
            }
        }
    }

    #[test]
    fn flags_pair_from_the_start_of_the_run() {
        // Five indicators: two flags and a lone one. Cuts land on pairs.
        let text = FormattedText::plain("x🇩🇪🇫🇷🇩");
        let chunks = split(&text, 9);
        assert_eq!(texts(&chunks), vec!["x🇩🇪🇫🇷", "🇩"]);
    }

    #[test]
    fn an_oversized_grapheme_falls_back_to_a_character_boundary() {
        let text = FormattedText::plain(format!("a{}", "\u{301}".repeat(9)));
        let chunks = split(&text, 4);
        assert!(chunks.iter().all(|chunk| chunk.utf16_len() <= 4));
        assert_eq!(chunks.concat_text(), text.text);
    }

    trait ConcatText {
        fn concat_text(&self) -> String;
    }

    impl ConcatText for Vec<FormattedText> {
        fn concat_text(&self) -> String {
            self.iter().map(|chunk| chunk.text.as_str()).collect()
        }
    }

    #[test]
    fn entities_spanning_a_cut_appear_in_both_chunks() {
        let text = FormattedText {
            text: "aaaa bbbb cccc".into(),
            entities: vec![
                TextEntity::new(EntityKind::Bold, 2, 10),
                TextEntity::new(EntityKind::Italic, 10, 4),
            ],
        };
        let chunks = split(&text, 10);
        assert_eq!(texts(&chunks), vec!["aaaa bbbb", "cccc"]);
        assert_eq!(
            chunks[0].entities,
            vec![TextEntity::new(EntityKind::Bold, 2, 7)]
        );
        assert_eq!(
            chunks[1].entities,
            vec![
                TextEntity::new(EntityKind::Bold, 0, 2),
                TextEntity::new(EntityKind::Italic, 0, 4),
            ]
        );
    }

    #[test]
    fn code_block_cut_in_two_is_reopened_with_its_language() {
        let code = (1..=12)
            .map(|n| format!("    line {n:02};"))
            .collect::<Vec<_>>();
        let rendered = render(&format!("Intro\n\n```rust\n{}\n```", code.join("\n")));
        let chunks = split(&rendered, 50);
        assert_eq!(
            chunks[0].text,
            "Intro\n\n    line 01;\n    line 02;\n    line 03;"
        );
        assert!(chunks.len() >= 4);
        let rust = EntityKind::Pre {
            language: Some("rust".into()),
        };
        assert_eq!(chunks[0].entities.len(), 1);
        assert_eq!(chunks[0].entities[0].kind, rust);
        for chunk in &chunks[1..] {
            assert_eq!(chunk.entities.len(), 1, "{chunk:?}");
            assert_eq!(chunk.entities[0].kind, rust);
            // The code line's indentation is kept at the chunk start.
            assert!(chunk.text.starts_with("    line"), "{chunk:?}");
            assert_eq!(covered(chunk, &chunk.entities[0]), chunk.text);
        }
        assert_valid_split(&rendered, &chunks, 50);
    }

    #[test]
    fn whitespace_at_cuts_is_dropped_and_entities_rebased() {
        let text = FormattedText {
            text: "first part\n\n   \n  second".into(),
            entities: vec![TextEntity::new(EntityKind::Italic, 18, 6)],
        };
        let chunks = split(&text, 12);
        assert_eq!(texts(&chunks), vec!["first part", "second"]);
        assert_eq!(
            chunks[1].entities,
            vec![TextEntity::new(EntityKind::Italic, 0, 6)]
        );
    }

    #[test]
    fn whitespace_after_a_cut_is_dropped_outside_code_blocks_and_after_their_end() {
        let pre =
            |offset, length| TextEntity::new(EntityKind::Pre { language: None }, offset, length);
        // Prose cut at its spaces, with a code block elsewhere in the text.
        let text = FormattedText {
            text: "alpha beta   gamma delta\nx".into(),
            entities: vec![pre(25, 1)],
        };
        let chunks = split(&text, 12);
        assert_eq!(texts(&chunks), vec!["alpha beta", "gamma delta", "x"]);
        assert_valid_split(&text, &chunks, 12);
        // A cut right where a code block ends: the spaces after it are not
        // its indentation.
        let text = FormattedText {
            text: "code  ok".into(),
            entities: vec![pre(0, 4)],
        };
        let chunks = split(&text, 4);
        assert_eq!(texts(&chunks), vec!["code", "ok"]);
        assert_valid_split(&text, &chunks, 4);
    }

    #[test]
    fn whitespace_only_stretches_produce_no_chunks() {
        let text = FormattedText::plain(format!("a{}b", " ".repeat(30)));
        assert_eq!(texts(&split(&text, 8)), vec!["a", "b"]);
        assert!(split(&FormattedText::plain("\t".repeat(20)), 8).is_empty());
    }

    #[test]
    fn a_code_block_tail_of_only_indentation_is_not_a_chunk() {
        // The cut lands before the last line, which is only indentation
        // inside the code block: Telegram would refuse it as empty.
        let text = FormattedText {
            text: "abcd\n    ".to_string(),
            entities: vec![TextEntity::new(
                EntityKind::Pre {
                    language: Some("rust".into()),
                },
                0,
                9,
            )],
        };
        let chunks = split(&text, 5);
        assert_eq!(texts(&chunks), vec!["abcd"]);
        assert_valid_split(&text, &chunks, 5);
    }

    /// A long agent reply: prose with emoji, lists and several code blocks.
    fn long_reply() -> String {
        let mut reply = String::from("# Report 📋\n\n");
        for section in 0..43 {
            reply.push_str(&format!(
                "## Section {section} 🚀\n\nThe **build** for `crate_{section}` finished; \
                 see [the log](https://example.com/log/{section}) for details. 👨‍👩‍👧 🇩🇪\n\n\
                 - first point with *emphasis*\n- second point\n  - nested 😀\n\n\
                 ```rust\nfn section_{section}() {{\n    let emoji = \"😀👍🏽\";\n    \
                 println!(\"{{emoji}}\");\n}}\n```\n\n"
            ));
        }
        reply
    }

    #[test]
    fn a_long_reply_splits_into_valid_telegram_messages() {
        let rendered = render(&long_reply());
        let length = rendered.text.chars().count();
        assert!((8500..10_000).contains(&length), "{length}");
        let chunks = split(&rendered, TELEGRAM_LIMIT);
        assert!(chunks.len() >= 3);
        assert_valid_split(&rendered, &chunks, TELEGRAM_LIMIT);
        for chunk in &chunks {
            let pre_blocks = chunk
                .entities
                .iter()
                .filter(|entity| matches!(entity.kind, EntityKind::Pre { .. }));
            for block in pre_blocks {
                assert!(!covered(chunk, block).trim().is_empty());
            }
        }
    }

    /// Pieces of text that stress the splitter.
    const PIECES: &[&str] = &[
        "word",
        "longerword",
        " ",
        " ",
        " ",
        "\n",
        "\n\n",
        "\t",
        "  ",
        "😀",
        FAMILY,
        THUMB_MEDIUM,
        FLAG_DE,
        "🇫🇷",
        "🇩",
        ACCENTED_E,
        "\u{301}",
        "日本語",
        "中文",
        "\u{200D}",
        "\u{FE0F}",
        "\r\n",
        "ß",
        "𝕏",
    ];

    fn unicode_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            5 => prop::sample::select(PIECES).prop_map(str::to_string),
            1 => any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..80).prop_map(|pieces| pieces.concat())
    }

    /// Text with random entities on character boundaries.
    fn formatted_text() -> impl Strategy<Value = FormattedText> {
        unicode_text()
            .prop_flat_map(|text| {
                let units = utf16_len(&text);
                let entity = (0..=units, 0..=units, 0..3usize).prop_map(|(a, b, kind)| {
                    let kind = match kind {
                        0 => EntityKind::Bold,
                        1 => EntityKind::Pre {
                            language: Some("rust".into()),
                        },
                        _ => EntityKind::TextLink {
                            url: "https://example.com".into(),
                        },
                    };
                    (kind, a.min(b), a.max(b))
                });
                (Just(text), prop::collection::vec(entity, 0..5))
            })
            .prop_map(|(text, raw_entities)| {
                let boundaries: Vec<usize> = boundaries_in_units(&text);
                let snap = |unit: usize| {
                    boundaries
                        .iter()
                        .copied()
                        .filter(|&boundary| boundary <= unit)
                        .max()
                        .unwrap_or(0)
                };
                let entities = raw_entities
                    .into_iter()
                    .map(|(kind, start, end)| (kind, snap(start), snap(end)))
                    .filter(|(_, start, end)| start < end)
                    .map(|(kind, start, end)| TextEntity::new(kind, start, end - start))
                    .collect();
                FormattedText { text, entities }
            })
    }

    /// UTF-16 offsets of every character boundary in `text`.
    fn boundaries_in_units(text: &str) -> Vec<usize> {
        let mut offsets = vec![0];
        let mut units = 0;
        for character in text.chars() {
            units += character.len_utf16();
            offsets.push(units);
        }
        offsets
    }

    const MARKDOWN_PIECES: &[&str] = &[
        "**",
        "*",
        "_",
        "`",
        "\n```rust\n",
        "\n```\n",
        "~~",
        "[link](https://a.b)",
        "# ",
        "\n- ",
        "\n  - ",
        "\n1. ",
        "\n> ",
        "\n\n",
        "\n",
        " ",
        "word",
        "😀",
        FAMILY,
        FLAG_DE,
        ACCENTED_E,
        "日本語",
        "\n| a | b |\n|---|---|\n| 1 | 2 |\n",
        "    indented",
    ];

    fn markdown_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            6 => prop::sample::select(MARKDOWN_PIECES).prop_map(str::to_string),
            1 => any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(piece, 0..120).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #[test]
        fn random_unicode_splits_validly(text in formatted_text(), limit in 0usize..40) {
            let chunks = split(&text, limit);
            assert_valid_split(&text, &chunks, limit);
        }

        #[test]
        fn random_unicode_fits_the_real_limit(text in formatted_text()) {
            let chunks = split(&text, TELEGRAM_LIMIT);
            assert_valid_split(&text, &chunks, TELEGRAM_LIMIT);
        }

        #[test]
        fn rendered_markdown_splits_validly(markdown in markdown_text(), limit in 2usize..120) {
            let rendered = render(&markdown);
            let chunks = split(&rendered, limit);
            assert_valid_split(&rendered, &chunks, limit);
        }

    }

    proptest! {
        // Inputs here run to tens of thousands of units; fewer cases keep
        // the suite fast in debug builds.
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn long_rendered_markdown_fits_the_real_limit(
            markdown in markdown_text(),
            copies in 1usize..40,
        ) {
            let rendered = render(&markdown.repeat(copies));
            let chunks = split(&rendered, TELEGRAM_LIMIT);
            assert_valid_split(&rendered, &chunks, TELEGRAM_LIMIT);
        }
    }
}
