//! A workspace per chat: `workdir` may contain `{chat_id}` or
//! `{session_key}`; the directory is created on first use, mode 0700, so
//! one chat's agent cannot read another's files through loose permissions.
//! Values are made safe for one path component (no `/`, no `..`).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

const FIELDS: [&str; 2] = ["{chat_id}", "{session_key}"];

/// Does `dir` contain a placeholder?
pub(crate) fn is_template(dir: &Path) -> bool {
    let text = dir.to_string_lossy();
    FIELDS.iter().any(|f| text.contains(f))
}

/// Only `{chat_id}` and `{session_key}` are known, and a template has no
/// `..` component: `/w/{chat_id}/..` would be every chat's shared parent,
/// not a directory of its own.
pub(crate) fn check_template(dir: &Path) -> Result<(), String> {
    let text = dir.to_string_lossy();
    if is_template(dir)
        && dir
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(format!(
            "agent.command.workdir {text} contains '..': a per-chat directory must stay inside the \
             directory that holds the others; write the path without '..'"
        ));
    }
    let mut rest: &str = &text;
    while let Some(start) = rest.find('{') {
        let tail = &rest[start..];
        match tail.find('}') {
            Some(end) if FIELDS.contains(&&tail[..=end]) => rest = &tail[end + 1..],
            Some(end) if tail[1..end].chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                return Err(format!(
                    "agent.command.workdir: unknown placeholder {} (known: {{chat_id}}, {{session_key}})",
                    &tail[..=end]
                ))
            }
            _ => rest = &tail[1..],
        }
    }
    Ok(())
}

/// One path component from a value: anything but `[A-Za-z0-9._:-]`
/// becomes `_`, and `.`/`..` cannot result.
fn component(value: &str) -> String {
    let safe: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        format!("_{safe}")
    } else {
        safe
    }
}

/// The directory for this chat, created (0700) if it is a template.
pub(crate) fn resolve(dir: &Path, chat_id: i64, session_key: &str) -> std::io::Result<PathBuf> {
    if !is_template(dir) {
        return Ok(dir.to_path_buf());
    }
    let text = dir
        .to_string_lossy()
        .replace("{chat_id}", &component(&chat_id.to_string()))
        .replace("{session_key}", &component(session_key));
    let path = PathBuf::from(text);
    if !path.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&path)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn templates_are_checked_and_created_private() {
        assert!(check_template(Path::new("/w/{chat_id}/{session_key}")).is_ok());
        assert!(check_template(Path::new("/w/{user}")).is_err());
        assert!(check_template(Path::new("/w/{weird name}")).is_ok());
        assert!(check_template(Path::new("/w/{chat_id}/../shared"))
            .unwrap_err()
            .contains(".."));
        assert!(check_template(Path::new("/w/../{chat_id}")).is_err());
        assert!(check_template(Path::new("/w/x/../fixed")).is_ok());
        let root = tempfile::tempdir().unwrap();
        let template = root.path().join("chats/{chat_id}/{session_key}");
        let dir = resolve(&template, -42, "agent:main:telegram:dm:42/../x").unwrap();
        assert_eq!(
            dir,
            root.path().join("chats/-42/agent:main:telegram:dm:42_.._x")
        );
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(component(".."), "_..");
    }
}
