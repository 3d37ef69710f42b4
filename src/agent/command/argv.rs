//! Argv placeholders: `{message}`, `{session_id}`, `{chat_id}`, `{files}`
//! (see [`crate::media::command_files`]) substituted inside single argv
//! elements, never parsed by a shell. A substituted value
//! is never scanned again. `{resume}` (a whole element: where
//! `resume_args` go) and `{resume_id}` (inside `resume_args`: the agent's
//! session id) continue the agent's own session.

/// The placeholders `argv` elements may contain.
pub(super) const PLACEHOLDERS: &str =
    "{message}, {session_id}, {chat_id}, {files}, {resume}, {resume_id}";

/// The argv element replaced by `resume_args` on a resumed turn (by
/// nothing on a fresh one).
pub(super) const RESUME_PLACEHOLDER: &str = "{resume}";

/// A placeholder in an argv element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Field {
    Message,
    SessionId,
    ChatId,
    /// The turn's inbound files (see [`crate::media::command_files`]).
    Files,
    /// Where `resume_args` go (a whole argv element).
    Resume,
    /// The agent's session id (inside `resume_args`).
    ResumeId,
}

/// A piece of an argv element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Token<'a> {
    Text(&'a str),
    Field(Field),
}

/// Split an argv element into text and placeholders.
///
/// `{name}` (an ASCII identifier in braces) is a placeholder and must be a
/// known one; `{{name}}` is the literal text `{name}`; every other brace is
/// plain text, so JSON or `awk '{print $1}'` need no escaping.
pub(super) fn tokenize(element: &str) -> Result<Vec<Token<'_>>, String> {
    let bytes = element.as_bytes();
    let mut tokens = Vec::new();
    let mut text_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'{' {
            i += 1;
            continue;
        }
        // `{{name}}`: a literal `{name}`.
        if bytes.get(i + 1) == Some(&b'{') {
            if let Some(end) = identifier_end(bytes, i + 2) {
                if bytes.get(end) == Some(&b'}') && bytes.get(end + 1) == Some(&b'}') {
                    push_text(&mut tokens, &element[text_start..i]);
                    push_text(&mut tokens, &element[i + 1..end + 1]);
                    i = end + 2;
                    text_start = i;
                    continue;
                }
            }
        }
        // `{name}`: a placeholder.
        if let Some(end) = identifier_end(bytes, i + 1) {
            if bytes.get(end) == Some(&b'}') {
                let field = match &element[i + 1..end] {
                    "message" => Field::Message,
                    "session_id" => Field::SessionId,
                    "chat_id" => Field::ChatId,
                    "files" => Field::Files,
                    "resume" => Field::Resume,
                    "resume_id" => Field::ResumeId,
                    other => {
                        return Err(format!(
                            "unknown placeholder {{{other}}} (known: {PLACEHOLDERS}; \
                             write {{{{{other}}}}} for the literal text)"
                        ))
                    }
                };
                push_text(&mut tokens, &element[text_start..i]);
                tokens.push(Token::Field(field));
                i = end + 1;
                text_start = i;
                continue;
            }
        }
        i += 1;
    }
    push_text(&mut tokens, &element[text_start..]);
    Ok(tokens)
}

fn push_text<'a>(tokens: &mut Vec<Token<'a>>, text: &'a str) {
    if !text.is_empty() {
        tokens.push(Token::Text(text));
    }
}

/// Where the ASCII identifier starting at `start` ends, if there is one.
fn identifier_end(bytes: &[u8], start: usize) -> Option<usize> {
    let first = *bytes.get(start)?;
    if !(first.is_ascii_alphabetic() || first == b'_') {
        return None;
    }
    let len = bytes[start..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    Some(start + len)
}

/// Shells whose `-c` takes a script: a `{message}` inside that script is
/// parsed by the shell, so a message could inject shell syntax.
const SHELLS: &[&str] = &[
    "sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "yash", "fish", "rbash",
];

/// Shell options that take the next argument as their value.
const SHELL_OPTIONS_WITH_VALUE: &[&str] = &["-o", "+o", "-O", "+O", "--rcfile", "--init-file"];

/// The index of an argv element that is the script of a shell's `-c`
/// (`sh -c SCRIPT`, `bash -lc SCRIPT`, `env -i sh -c SCRIPT`,
/// `timeout 60 bash -c SCRIPT`…) and contains `{message}`. Arguments after
/// the script are the shell's `$0`, `$1`… and are safe: the shell never
/// parses them (`["sh", "-c", "llm -- \"$1\"", "sh", "{message}"]`).
pub(super) fn message_in_shell_script(argv: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < argv.len() {
        let name = argv[i].rsplit('/').next().unwrap_or_default();
        if !SHELLS.contains(&name) {
            i += 1;
            continue;
        }
        let mut command_mode = false;
        let mut j = i + 1;
        while let Some(arg) = argv.get(j) {
            if arg == "--" || arg == "-" {
                j += 1;
                break;
            }
            if SHELL_OPTIONS_WITH_VALUE.contains(&arg.as_str()) {
                j += 2;
                continue;
            }
            let cluster = arg
                .strip_prefix('-')
                .or_else(|| arg.strip_prefix('+'))
                .filter(|rest| !rest.is_empty());
            match cluster {
                Some(rest) if !rest.starts_with('-') => {
                    command_mode |= arg.starts_with('-') && rest.contains('c');
                    j += 1;
                }
                Some(_) => j += 1,
                None => break,
            }
        }
        if command_mode {
            if let Some(script) = argv.get(j) {
                let tokens = tokenize(script).unwrap_or_default();
                if tokens.contains(&Token::Field(Field::Message)) {
                    return Some(j);
                }
            }
        }
        i = j.max(i + 1);
    }
    None
}

/// The values placeholders are replaced with.
pub(super) struct Substitutions<'a> {
    pub(super) message: &'a str,
    pub(super) session_id: &'a str,
    pub(super) chat_id: String,
    pub(super) files: String,
    /// The agent session being resumed (empty on a fresh turn).
    pub(super) resume_id: &'a str,
}

impl Substitutions<'_> {
    fn value(&self, field: Field) -> &str {
        match field {
            Field::Message => self.message,
            Field::SessionId => self.session_id,
            Field::ChatId => &self.chat_id,
            Field::Files => &self.files,
            Field::ResumeId => self.resume_id,
            Field::Resume => "",
        }
    }

    /// Expand one argv element. Substituted values are never scanned again,
    /// so a message containing `{session_id}` stays as it is.
    pub(super) fn expand(&self, element: &str) -> Result<String, String> {
        let mut out = String::with_capacity(element.len());
        for token in tokenize(element)? {
            match token {
                Token::Text(text) => out.push_str(text),
                Token::Field(field) => out.push_str(self.value(field)),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Substitutions<'static> {
        Substitutions {
            message: "hi {session_id}",
            session_id: "s1",
            chat_id: "-42".to_string(),
            files: String::new(),
            resume_id: "r-1",
        }
    }

    #[test]
    fn a_message_inside_a_shell_script_is_found_one_passed_as_an_argument_is_not() {
        let find = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
            message_in_shell_script(&argv)
        };
        assert_eq!(find(&["sh", "-c", "llm {message}"]), Some(2));
        assert_eq!(find(&["/bin/bash", "-lc", "echo '{message}'"]), Some(2));
        assert_eq!(find(&["zsh", "-e", "-c", "x={message}"]), Some(3));
        assert_eq!(find(&["dash", "-o", "errexit", "-c", "{message}"]), Some(4));
        assert_eq!(find(&["/usr/bin/env", "sh", "-c", "a {message}"]), Some(3));
        assert_eq!(
            find(&["env", "-i", "A=1", "bash", "-c", "{message}"]),
            Some(5)
        );
        assert_eq!(find(&["timeout", "60", "sh", "-c", "{message}"]), Some(4));
        // Safe: the message is $1, never parsed by the shell.
        assert_eq!(
            find(&["sh", "-c", "llm -- \"$1\"", "sh", "{message}"]),
            None
        );
        assert_eq!(find(&["sh", "script.sh", "{message}"]), None);
        assert_eq!(find(&["bash", "-e", "run.sh", "{message}"]), None);
        assert_eq!(find(&["llm", "-c", "{message}"]), None);
        assert_eq!(find(&["sh", "-c", "{{message}}"]), None);
    }

    #[test]
    fn placeholders_are_substituted_inside_elements_only() {
        let v = values();
        assert_eq!(v.expand("{message}").unwrap(), "hi {session_id}");
        assert_eq!(
            v.expand("--prompt={message}@{chat_id}/{session_id}")
                .unwrap(),
            "--prompt=hi {session_id}@-42/s1"
        );
        assert_eq!(v.expand("{{message}}").unwrap(), "{message}");
        assert_eq!(v.expand("{\"a\":{\"b\":1}}").unwrap(), "{\"a\":{\"b\":1}}");
        assert_eq!(v.expand("{print $1}").unwrap(), "{print $1}");
        assert_eq!(v.expand("{{.Name}}").unwrap(), "{{.Name}}");
        assert_eq!(v.expand("{ message }").unwrap(), "{ message }");
        assert_eq!(v.expand("é{chat_id}é{").unwrap(), "é-42é{");
        assert_eq!(v.expand("--resume={resume_id}").unwrap(), "--resume=r-1");
        assert!(v.expand("{foo}").unwrap_err().contains("{foo}"));
    }
}
