//! Where a problem is in the config file, and what of it may be shown.
//!
//! * [`value_offset`] finds a key's value in the text (`store.data_dir`,
//!   `agent.command.argv[2]`), so a value the schema accepted but
//!   validation refused still gets a `file:line:col` error.
//! * [`hide_string_value`] takes the offending string out of a TOML
//!   error message: serde quotes the value it could not use ("invalid
//!   type: string \"123:ABC…\", expected u64"), and a token pasted into
//!   the wrong key must not be printed. The line and column say where it
//!   is. A short word without digits (a mistyped choice such as
//!   `"inerrupt"`) stays, so the error still shows the typo: tokens, API
//!   keys and generated secrets are long or carry digits.
//!
//! Pure text work: never reads a file, never logs.

use toml::de::{DeTable, DeValue};

/// Replaces a value that is not shown.
pub(super) const HIDDEN: &str = "(value not shown)";

/// One step of a key path: a table key or an array index.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `a.b[2].c` as steps; `None` if it is not such a path.
fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(at) => (&part[..at], &part[at..]),
            None => (part, ""),
        };
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return None;
        }
        out.push(Step::Key(name));
        while let Some(inner) = rest.strip_prefix('[') {
            let end = inner.find(']')?;
            out.push(Step::Index(inner[..end].parse().ok()?));
            rest = &inner[end + 1..];
        }
        if !rest.is_empty() {
            return None;
        }
    }
    Some(out)
}

/// The byte offset of the value of `path` (`a.b[2].c`) in `text`, if the
/// file sets it.
pub(super) fn value_offset(text: &str, path: &str) -> Option<usize> {
    let steps = steps(path)?;
    let document = DeTable::parse(text).ok()?;
    let mut table = document.get_ref();
    let mut found = None;
    let mut value: Option<&DeValue<'_>> = None;
    for step in steps {
        let next = match (step, value) {
            (Step::Key(key), None) => table.get(key)?,
            (Step::Key(key), Some(DeValue::Table(inner))) => {
                table = inner;
                table.get(key)?
            }
            (Step::Index(index), Some(DeValue::Array(array))) => array.get(index)?,
            _ => return None,
        };
        found = Some(next.span().start);
        value = Some(next.get_ref());
    }
    found
}

/// The key a validation message is about: its leading `a.b.c` (or
/// `a.b[2]`) word, if it has one.
pub(super) fn leading_key(message: &str) -> Option<&str> {
    let end = message
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '[' | ']')))
        .unwrap_or(message.len());
    let key = message[..end].trim_end_matches('.');
    key.contains('.').then_some(key)
}

/// `message` without the string value at `text[span]`: a TOML string there
/// (quoted in any of TOML's ways) is replaced by [`HIDDEN`] wherever the
/// message repeats it. Other values (numbers, booleans) cannot hold a
/// token and stay.
pub(super) fn hide_string_value(message: &str, text: &str, span: std::ops::Range<usize>) -> String {
    let Some(raw) = text.get(span) else {
        return message.to_string();
    };
    let raw = raw.trim();
    if !(raw.starts_with('"') || raw.starts_with('\'')) {
        return message.to_string();
    }
    let value = match DeValue::parse(raw) {
        Ok(parsed) => match parsed.get_ref() {
            DeValue::String(value) => value.to_string(),
            _ => return message.to_string(),
        },
        Err(_) => raw.trim_matches(|c| c == '"' || c == '\'').to_string(),
    };
    if !could_be_secret(&value) {
        return message.to_string();
    }
    message
        .replace(&format!("{value:?}"), HIDDEN)
        .replace(&format!("`{value}`"), HIDDEN)
        .replace(&value, HIDDEN)
}

/// Longer strings are never shown in an error.
const SHOWN_MAX_CHARS: usize = 32;

/// Whether a value in an error could be a secret: anything but a short
/// word without digits (bot tokens, API keys and generated secrets are
/// long or carry digits; the names of choices are neither).
fn could_be_secret(value: &str) -> bool {
    !value.is_empty()
        && (value.chars().count() > SHOWN_MAX_CHARS || value.bytes().any(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[telegram]\nallowed_users = [1, 2]\n\n[agent.command]\n\
                        argv = [\"sh\", \"-c\", \"x\"]\nworkdir = \"/w\"\n";

    fn line_col(offset: usize) -> (usize, usize) {
        let before = &TEXT[..offset];
        (
            before.matches('\n').count() + 1,
            before.rsplit('\n').next().unwrap().chars().count() + 1,
        )
    }

    #[test]
    fn values_are_found_by_key_path() {
        let at = |path| value_offset(TEXT, path).map(line_col);
        assert_eq!(at("agent.command.workdir"), Some((6, 11)));
        assert_eq!(at("agent.command.argv[2]"), Some((5, 21)));
        assert_eq!(at("telegram.allowed_users[1]"), Some((2, 21)));
        assert_eq!(at("agent.command.argv[9]"), None);
        assert_eq!(at("store.data_dir"), None);
        assert_eq!(at("not a path"), None);
    }

    #[test]
    fn the_leading_key_of_a_message() {
        assert_eq!(
            leading_key("agent.command.argv[2]: no shell"),
            Some("agent.command.argv[2]")
        );
        assert_eq!(
            leading_key("store.data_dir /dev/null is not"),
            Some("store.data_dir")
        );
        assert_eq!(leading_key("nobody may use the bot"), None);
    }

    #[test]
    fn string_values_are_hidden_numbers_are_not() {
        let text = "allowed_users = [\"123:SECRET\"]\nmax_pending = -1\n";
        let start = text.find('"').unwrap();
        let end = text[start + 1..].find('"').unwrap() + start + 2;
        let shown = hide_string_value(
            "invalid type: string \"123:SECRET\", expected u64",
            text,
            start..end,
        );
        assert_eq!(
            shown,
            format!("invalid type: string {HIDDEN}, expected u64")
        );
        let start = text.find("-1").unwrap();
        let message = "invalid value: integer `-1`, expected usize";
        assert_eq!(hide_string_value(message, text, start..start + 2), message);
        let literal = "busy_mode = 'sk-abc123'\n";
        let message = "unknown variant `sk-abc123`, expected `interrupt` or `queue`";
        assert_eq!(
            hide_string_value(message, literal, 12..23),
            format!("unknown variant {HIDDEN}, expected `interrupt` or `queue`")
        );
        // A mistyped choice is shown.
        let typo = "busy_mode = \"inerrupt\"\n";
        let message = "unknown variant `inerrupt`, expected `interrupt` or `queue`";
        assert_eq!(hide_string_value(message, typo, 12..22), message);
        let long = format!("busy_mode = \"{}\"\n", "a".repeat(40));
        let message = format!("unknown variant `{}`, expected", "a".repeat(40));
        assert_eq!(
            hide_string_value(&message, &long, 12..54),
            format!("unknown variant {HIDDEN}, expected")
        );
    }
}
