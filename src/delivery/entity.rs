//! Formatted text as Telegram understands it: plain text plus entities.
//!
//! Telegram measures entity offsets and lengths in UTF-16 code units, not
//! bytes and not `char`s, so an emoji such as 😀 counts 2. Everything in
//! the delivery layer speaks this unit; [`utf16_len`] is the one place that
//! converts. The types here are our own rather than teloxide's because
//! teloxide's `TextLink` demands an already-parsed URL, and the renderer
//! must be able to carry whatever the agent wrote until the last moment,
//! when [`to_telegram`] drops links Telegram would reject instead of
//! failing the whole message.

use teloxide::types::{MessageEntity, MessageEntityKind};

/// Text ready for Telegram: the exact characters to send and the
/// formatting spans over them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FormattedText {
    /// The message text, exactly as it will be sent.
    pub text: String,
    /// Formatting spans over `text`, in UTF-16 code units.
    pub entities: Vec<TextEntity>,
}

impl FormattedText {
    /// Text without any formatting.
    pub fn plain(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            entities: Vec::new(),
        }
    }

    /// Length of the text in UTF-16 code units, the unit of Telegram's
    /// message-size limit.
    pub fn utf16_len(&self) -> usize {
        utf16_len(&self.text)
    }

    /// Whether there is no text at all.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// One formatting span over a [`FormattedText`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextEntity {
    /// What the span does.
    pub kind: EntityKind,
    /// Start of the span, in UTF-16 code units from the start of the text.
    pub offset: usize,
    /// Length of the span in UTF-16 code units.
    pub length: usize,
}

impl TextEntity {
    /// A span of `length` UTF-16 units starting at `offset`.
    pub fn new(kind: EntityKind, offset: usize, length: usize) -> Self {
        Self {
            kind,
            offset,
            length,
        }
    }

    /// One past the last UTF-16 unit covered by the span.
    pub fn end(&self) -> usize {
        self.offset.saturating_add(self.length)
    }
}

/// The kinds of formatting the delivery layer produces; a subset of
/// Telegram's entity types (the ones a bot can set on its own text).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EntityKind {
    /// Bold text.
    Bold,
    /// Italic text.
    Italic,
    /// Underlined text.
    Underline,
    /// Struck-through text.
    Strikethrough,
    /// Text hidden until tapped.
    Spoiler,
    /// Inline monospace text.
    Code,
    /// A monospace block, optionally tagged with a programming language.
    Pre {
        /// Language for syntax highlighting, e.g. `rust`.
        language: Option<String>,
    },
    /// Text that opens `url` when tapped. The URL is kept unparsed here;
    /// [`to_telegram`] decides whether Telegram would accept it.
    TextLink {
        /// Link target as the agent wrote it.
        url: String,
    },
    /// A quoted block.
    Blockquote,
}

/// Length of `text` in UTF-16 code units (Telegram's unit for offsets,
/// lengths and the message-size limit).
pub fn utf16_len(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

/// URL schemes Telegram accepts in a `text_link` entity. Anything else
/// (relative links, `javascript:`, `file:`, `mailto:` …) makes the whole
/// `sendMessage` fail with "Bad Request", so such links are dropped.
const LINK_SCHEMES: [&str; 4] = ["http", "https", "tg", "ton"];

/// Converts entities to teloxide's type for `sendMessage`.
///
/// Links whose URL does not parse, or uses a scheme Telegram refuses, are
/// dropped (their text stays in the message, just not clickable): losing a
/// link is better than losing the message. Empty spans are dropped too,
/// since Telegram rejects them.
pub fn to_telegram(entities: &[TextEntity]) -> Vec<MessageEntity> {
    entities
        .iter()
        .filter(|entity| entity.length > 0)
        .filter_map(|entity| {
            let kind = telegram_kind(&entity.kind)?;
            Some(MessageEntity::new(kind, entity.offset, entity.length))
        })
        .collect()
}

/// teloxide's kind for `kind`, or `None` if Telegram would refuse it.
fn telegram_kind(kind: &EntityKind) -> Option<MessageEntityKind> {
    let converted = match kind {
        EntityKind::Bold => MessageEntityKind::Bold,
        EntityKind::Italic => MessageEntityKind::Italic,
        EntityKind::Underline => MessageEntityKind::Underline,
        EntityKind::Strikethrough => MessageEntityKind::Strikethrough,
        EntityKind::Spoiler => MessageEntityKind::Spoiler,
        EntityKind::Code => MessageEntityKind::Code,
        EntityKind::Pre { language } => MessageEntityKind::Pre {
            language: language.clone().filter(|lang| !lang.is_empty()),
        },
        EntityKind::TextLink { url } => MessageEntityKind::TextLink {
            url: acceptable_link(url)?,
        },
        EntityKind::Blockquote => MessageEntityKind::Blockquote,
    };
    Some(converted)
}

/// `url` parsed, if it is absolute and uses a scheme Telegram links to.
fn acceptable_link(url: &str) -> Option<url::Url> {
    let parsed = url::Url::parse(url.trim()).ok()?;
    LINK_SCHEMES.contains(&parsed.scheme()).then_some(parsed)
}

/// Invariant checks shared by the delivery tests.
#[cfg(test)]
pub(crate) mod checks {
    use super::{FormattedText, TextEntity};

    /// The text an entity covers.
    pub(crate) fn covered(text: &FormattedText, entity: &TextEntity) -> String {
        let units: Vec<u16> = text.text.encode_utf16().collect();
        String::from_utf16(&units[entity.offset..entity.end()])
            .expect("entity boundaries split a surrogate pair")
    }

    /// Panics unless every entity is non-empty, inside the text and on
    /// character boundaries.
    pub(crate) fn assert_entities_valid(text: &FormattedText) {
        let units: Vec<u16> = text.text.encode_utf16().collect();
        for entity in &text.entities {
            assert!(entity.length > 0, "empty entity {entity:?} in {text:?}");
            assert!(
                entity.end() <= units.len(),
                "entity {entity:?} past the end ({}) of {text:?}",
                units.len()
            );
            let is_low_surrogate = |unit: u16| (0xDC00..0xE000).contains(&unit);
            assert!(
                !is_low_surrogate(units[entity.offset]),
                "entity {entity:?} starts inside a character in {text:?}"
            );
            if let Some(&after) = units.get(entity.end()) {
                assert!(
                    !is_low_surrogate(after),
                    "entity {entity:?} ends inside a character in {text:?}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_len_counts_surrogate_pairs_as_two() {
        assert_eq!(utf16_len(""), 0);
        assert_eq!(utf16_len("abc"), 3);
        assert_eq!(utf16_len("é"), 1);
        assert_eq!(utf16_len("日本"), 2);
        assert_eq!(utf16_len("😀"), 2);
        assert_eq!(utf16_len("👍🏽"), 4);
        assert_eq!(utf16_len("🇩🇪"), 4);
    }

    #[test]
    fn plain_has_no_entities() {
        let text = FormattedText::plain("hi");
        assert_eq!(text.text, "hi");
        assert!(text.entities.is_empty());
        assert_eq!(text.utf16_len(), 2);
        assert!(!text.is_empty());
        assert!(FormattedText::plain("").is_empty());
    }

    #[test]
    fn converts_every_kind() {
        let entities = vec![
            TextEntity::new(EntityKind::Bold, 0, 1),
            TextEntity::new(EntityKind::Italic, 1, 1),
            TextEntity::new(EntityKind::Underline, 2, 1),
            TextEntity::new(EntityKind::Strikethrough, 3, 1),
            TextEntity::new(EntityKind::Spoiler, 4, 1),
            TextEntity::new(EntityKind::Code, 5, 1),
            TextEntity::new(
                EntityKind::Pre {
                    language: Some("rust".into()),
                },
                6,
                1,
            ),
            TextEntity::new(
                EntityKind::TextLink {
                    url: "https://example.com/a?b=c".into(),
                },
                7,
                1,
            ),
            TextEntity::new(EntityKind::Blockquote, 8, 1),
        ];
        let converted = to_telegram(&entities);
        assert_eq!(converted.len(), entities.len());
        assert_eq!(converted[0], MessageEntity::bold(0, 1));
        assert_eq!(
            converted[6].kind,
            MessageEntityKind::Pre {
                language: Some("rust".into())
            }
        );
        match &converted[7].kind {
            MessageEntityKind::TextLink { url } => {
                assert_eq!(url.as_str(), "https://example.com/a?b=c")
            }
            other => panic!("expected a link, got {other:?}"),
        }
        assert_eq!((converted[8].offset, converted[8].length), (8, 1));
    }

    #[test]
    fn bad_links_are_dropped_and_the_rest_kept() {
        let link = |url: &str| {
            TextEntity::new(
                EntityKind::TextLink {
                    url: url.to_string(),
                },
                0,
                3,
            )
        };
        let entities = vec![
            link("relative/path"),
            link("not a url"),
            link(""),
            link("javascript:alert(1)"),
            link("mailto:someone@example.com"),
            TextEntity::new(EntityKind::Bold, 0, 3),
            link("tg://user?id=1"),
        ];
        let converted = to_telegram(&entities);
        assert_eq!(converted.len(), 2);
        assert_eq!(converted[0], MessageEntity::bold(0, 3));
        assert!(matches!(
            converted[1].kind,
            MessageEntityKind::TextLink { .. }
        ));
    }

    #[test]
    fn empty_entities_and_empty_language_are_dropped() {
        let entities = vec![
            TextEntity::new(EntityKind::Bold, 0, 0),
            TextEntity::new(
                EntityKind::Pre {
                    language: Some(String::new()),
                },
                0,
                2,
            ),
        ];
        let converted = to_telegram(&entities);
        assert_eq!(converted.len(), 1);
        assert_eq!(converted[0].kind, MessageEntityKind::Pre { language: None });
    }
}
