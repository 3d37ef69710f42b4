//! What the model and the user are told about a document that was read
//! ([`super::read`]): the model's note (its name, type, size, its text in
//! a code fence with the cut marker, or why it cannot be shown; the saved
//! path only where a tool of its can open it) and, where the model could
//! not see something and has no tool to open the file, one plain sentence
//! for the user, in their words (no paths, no config keys).
//!
//! Pure. It must never read files or decide what is readable.

use super::{cut_marker, Reading, Unreadable};
use crate::media::human_size;

impl Unreadable {
    /// For the model, after the file's name and size.
    fn for_model(self) -> &'static str {
        match self {
            Unreadable::NotText => "binary data, not text; its content is not shown",
            Unreadable::Binary => "a kind of file whose content cannot be shown here",
            Unreadable::PdfNoText => "a PDF with no text layer (perhaps scanned pages)",
            Unreadable::PdfEncrypted => "an encrypted PDF; its text could not be read",
            Unreadable::PdfTooLarge => "a PDF too large to read",
            Unreadable::PdfFailed => "a PDF whose text could not be read",
            Unreadable::NotInlined => "its content is not shown",
            Unreadable::Failed => "a file that could not be read",
        }
    }

    /// One plain sentence for the user.
    fn for_user(self, name: &str) -> String {
        match self {
            Unreadable::NotText => {
                format!("📎 I could not read {name}: it does not look like text.")
            }
            Unreadable::Binary => format!(
                "📎 I could not read {name}: I can read text files and PDFs, not this kind of file."
            ),
            Unreadable::PdfNoText => format!(
                "📎 I found no text in {name} (perhaps it is scanned pages), so I could not read it."
            ),
            Unreadable::PdfEncrypted => format!("📎 {name} is encrypted, so I could not read it."),
            Unreadable::PdfTooLarge => format!("📎 {name} is too large for me to read."),
            Unreadable::PdfFailed => format!("📎 I could not read any text in {name}."),
            Unreadable::NotInlined => {
                format!("📎 I did not read {name}: reading files is turned off here.")
            }
            Unreadable::Failed => format!("📎 I could not read {name}."),
        }
    }
}

/// A document as named to the model.
#[derive(Clone, Copy, Debug)]
pub struct Shown<'a> {
    /// Its name (the sender's, or the saved one).
    pub name: &'a str,
    /// Its type.
    pub mime: &'a str,
    /// Its size in bytes.
    pub size: u64,
    /// Where a tool of the model's can open it (none: no tool can).
    pub location: Option<&'a str>,
    /// The model sees images attached to the message.
    pub sees_images: bool,
}

/// What the model and the user are told about a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    /// The note in the model's message.
    pub note: String,
    /// One sentence for the user about what the model could not see.
    pub notice: Option<String>,
    /// The saved file goes with the turn (`{files}`, images).
    pub attach: bool,
}

/// The note and notice for `reading` of `doc`.
pub fn tell(doc: &Shown<'_>, reading: &Reading) -> Told {
    let Shown { name, mime, .. } = *doc;
    let size = human_size(doc.size);
    let saved = doc
        .location
        .map(|at| format!(" saved at {at}"))
        .unwrap_or_default();
    match reading {
        Reading::Text { text, cut: None } => Told {
            note: format!("[file {name} ({mime})]\n{}", fenced(text)),
            notice: None,
            attach: false,
        },
        Reading::Text {
            text,
            cut: Some((shown, total)),
        } => Told {
            note: format!(
                "[file {name} ({mime}, {size}){saved}]\n{}\n{}",
                fenced(text),
                cut_marker(*shown, *total)
            ),
            notice: doc.location.is_none().then(|| {
                format!(
                    "📎 {name} is long, so I read only its first {} of {}.",
                    human_size(*shown),
                    human_size(*total)
                )
            }),
            attach: true,
        },
        Reading::Image if doc.sees_images || doc.location.is_some() => Told {
            note: format!("[file {name} ({mime}, {size}){saved}]"),
            notice: None,
            attach: true,
        },
        Reading::Image => Told {
            note: format!("[file {name} ({mime}, {size}): an image you cannot see]"),
            notice: Some(format!(
                "📎 I cannot see images, so I did not look at {name}."
            )),
            attach: true,
        },
        Reading::Unreadable(why) => match doc.location {
            Some(_) if *why == Unreadable::Binary => Told {
                note: format!("[file {name} ({mime}, {size}){saved}]"),
                notice: None,
                attach: true,
            },
            Some(_) => Told {
                note: format!("[file {name} ({mime}, {size}){saved}: {}]", why.for_model()),
                notice: None,
                attach: true,
            },
            None => Told {
                note: format!("[file {name} ({mime}, {size}): {}]", why.for_model()),
                notice: Some(why.for_user(name)),
                attach: true,
            },
        },
    }
}

/// A code fence that the content cannot close.
pub fn fenced(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}\n{}\n{fence}", text.trim_end_matches('\n'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_longer_than_any_backtick_run_inside() {
        assert_eq!(fenced("a"), "```\na\n```");
        assert_eq!(fenced("x ```` y"), "`````\nx ```` y\n`````");
    }

    fn shown_doc(location: Option<&str>) -> Shown<'_> {
        Shown {
            name: "big.log",
            mime: "text/plain",
            size: 2 * 1024 * 1024,
            location,
            sees_images: false,
        }
    }

    #[test]
    fn a_cut_text_is_marked_and_told_once_unless_a_tool_can_read_the_rest() {
        let reading = Reading::Text {
            text: "a\nb\n".into(),
            cut: Some((4, 2 * 1024 * 1024)),
        };
        let told = tell(&shown_doc(None), &reading);
        assert_eq!(
            told.note,
            "[file big.log (text/plain, 2.0 MB)]\n```\na\nb\n```\n[… cut: showing the first 4 bytes of 2.0 MB]"
        );
        assert_eq!(
            told.notice.as_deref(),
            Some("📎 big.log is long, so I read only its first 4 bytes of 2.0 MB.")
        );
        let told = tell(&shown_doc(Some("/srv/m/big.log")), &reading);
        assert!(told
            .note
            .starts_with("[file big.log (text/plain, 2.0 MB) saved at /srv/m/big.log]"));
        assert_eq!(told.notice, None);
        assert!(told.attach);
    }

    #[test]
    fn what_the_model_cannot_see_is_told_in_one_sentence_without_paths_or_keys() {
        for why in [
            Unreadable::NotText,
            Unreadable::Binary,
            Unreadable::PdfNoText,
            Unreadable::PdfEncrypted,
            Unreadable::PdfTooLarge,
            Unreadable::PdfFailed,
            Unreadable::NotInlined,
            Unreadable::Failed,
        ] {
            let told = tell(&shown_doc(None), &Reading::Unreadable(why));
            let notice = told.notice.unwrap();
            assert!(notice.contains("big.log"), "{notice}");
            assert_eq!(notice.matches(". ").count(), 0, "one sentence: {notice}");
            assert!(!notice.contains('_') && !notice.contains('/'), "{notice}");
            assert!(!told.note.contains("saved at"), "{}", told.note);
            // With a tool that opens it, the model gets the path instead.
            let told = tell(&shown_doc(Some("media/x")), &Reading::Unreadable(why));
            assert_eq!(told.notice, None);
            assert!(told.note.contains("saved at media/x"), "{}", told.note);
        }
        let image = tell(&shown_doc(None), &Reading::Image);
        assert!(image.notice.unwrap().contains("cannot see images"));
        let seen = tell(
            &Shown {
                sees_images: true,
                ..shown_doc(None)
            },
            &Reading::Image,
        );
        assert_eq!(seen.notice, None);
    }
}
