//! Secrets: where they come from, and keeping them out of every child's
//! reach once telegate runs.
//!
//! **Sources.** The bot token, the LLM API key, the transcription API key
//! and the webhook secret may be written inline in the config file (not
//! the API keys), read from a file named in it (`token_file`,
//! `api_key_file`, `secret_token_file`; at most [`MAX_SECRET_FILE_BYTES`]),
//! read from a systemd credential (`$CREDENTIALS_DIRECTORY/<name>`, see
//! [`TOKEN_CREDENTIAL`] and friends), or taken from an environment
//! variable, in that order. Inline and file together are an error (which
//! one was meant?). Every secret is resolved when the configuration is
//! loaded, before hardening scrubs the environment: nothing may read a
//! secret variable later (it is gone by then).
//!
//! **Hardening** ([`harden_process`]), run by `main` once the configuration
//! is loaded and before any thread starts:
//!
//! 1. the secret environment variables are copied out (the config already
//!    holds them), their bytes in the original environment block are
//!    overwritten with zeros, and the variables are removed. Removing alone
//!    would not do: `/proc/<pid>/environ` reads that original block;
//! 2. `PR_SET_DUMPABLE` is cleared, so `/proc/<pid>/{environ,mem,maps,fd}`
//!    and `ptrace` need `CAP_SYS_PTRACE`, even for a process of the same user;
//! 3. capabilities that reach into another process's memory
//!    ([`DROPPED_CAPABILITIES`]: ptrace, raw I/O, kernel modules, BPF, perf,
//!    admin) are dropped from the bounding, inheritable, ambient, permitted
//!    and effective sets. Every child inherits the bounding set and can never
//!    regain them, so even a child running as root (telegate started as
//!    root) cannot read telegate's memory or environment.
//!
//! What this does *not* cover (see SECURITY.md): a child running as the same
//! user can read any file that user can read, secret files and the config
//! file included; `run_as` or a sandbox prefix in `[tools.terminal]` is the
//! answer to that.
//!
//! This module must never log or display a secret value, and
//! [`harden_process`] must never run once other threads exist (environment
//! and capability changes are not thread-safe, and capabilities are
//! per-thread).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A secret string. `Debug` prints `Secret(***)`; there is no `Display`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Environment variable systemd sets to the service's credentials directory.
pub const CREDENTIALS_DIR_ENV: &str = "CREDENTIALS_DIRECTORY";
/// systemd credential name for the bot token (`LoadCredential=telegram_bot_token:…`).
pub const TOKEN_CREDENTIAL: &str = "telegram_bot_token";
/// systemd credential name for the webhook secret.
pub const WEBHOOK_SECRET_CREDENTIAL: &str = "telegram_webhook_secret";
/// systemd credential name for the LLM API key.
pub const API_KEY_CREDENTIAL: &str = "openai_api_key";
/// systemd credential name for the transcription endpoint's API key.
pub const TRANSCRIPTION_KEY_CREDENTIAL: &str = "transcription_api_key";
/// The credential name of the speech (voice answers) API key.
pub const SPEECH_KEY_CREDENTIAL: &str = "speech_api_key";

/// The largest secret file read (bytes). Tokens and keys are well under
/// 1 KiB; a bigger file is a mistake (`token_file = "/dev/zero"`, a
/// config file named by accident) and is refused without reading on.
pub const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// Where to look for one secret.
#[derive(Debug)]
pub struct SecretSources<'a> {
    /// The config key of the inline value, e.g. `telegram.token`.
    pub key: &'a str,
    /// The inline value from the file.
    pub inline: Option<Secret>,
    /// The config key naming a file, e.g. `telegram.token_file`.
    pub file_key: &'a str,
    /// The file it names.
    pub file: Option<&'a Path>,
    /// The systemd credential name.
    pub credential: &'a str,
    /// The environment variable (none: the secret has no variable).
    pub env_var: Option<&'a str>,
}

impl SecretSources<'_> {
    /// The secret from the first source that has one (inline or file, then
    /// the systemd credential, then the environment); `None` when no source
    /// has one. `env` looks up environment variables. The error is one line
    /// naming the key and the file, never the value.
    pub fn resolve(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Secret>, String> {
        match (self.inline, self.file) {
            (Some(_), Some(_)) => Err(format!(
                "{} and {} are both set: keep one",
                self.key, self.file_key
            )),
            (Some(inline), None) => Ok(Some(inline)),
            (None, Some(path)) => read_secret_file(self.file_key, path).map(Some),
            (None, None) => {
                if let Some(dir) = env(CREDENTIALS_DIR_ENV).filter(|d| !d.trim().is_empty()) {
                    let path = PathBuf::from(dir).join(self.credential);
                    if path.is_file() {
                        let key = format!("the systemd credential {}", self.credential);
                        return read_secret_file(&key, &path).map(Some);
                    }
                }
                Ok(self
                    .env_var
                    .and_then(env)
                    .filter(|value| !value.trim().is_empty())
                    .map(Secret::new))
            }
        }
    }
}

/// Read a secret from `path`: the whole file without surrounding whitespace
/// (a trailing newline is usual). Empty counts as an error, and so does a
/// file larger than [`MAX_SECRET_FILE_BYTES`] (read no further than that,
/// so `/dev/zero` or any endless stream cannot exhaust memory).
pub fn read_secret_file(key: &str, path: &Path) -> Result<Secret, String> {
    use std::io::Read as _;
    let cannot_read = |e: std::io::Error| format!("{key}: cannot read {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot_read)?;
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot_read)?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "{key}: {} is too large for a secret (more than {MAX_SECRET_FILE_BYTES} bytes): \
             name the file holding only the token or key",
            path.display()
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{key}: {} is not UTF-8 text", path.display()))?;
    let value = text.trim();
    if value.is_empty() {
        return Err(format!("{key}: {} is empty", path.display()));
    }
    Ok(Secret::new(value))
}

/// Replace every occurrence of a known secret, and anything that looks like
/// an API key, a bot token or a bearer token, with `***`: for provider
/// error bodies, configuration errors and other text that is shown or
/// logged.
pub fn redact(text: &str, known: &[&str]) -> String {
    let mut out = hide_bot_tokens(text);
    for secret in known.iter().filter(|s| s.len() >= 4) {
        out = out.replace(secret, "***");
    }
    let mut redacted = String::with_capacity(out.len());
    let mut hide_next = false;
    for (i, piece) in out
        .split_inclusive(|c: char| c.is_whitespace() || c == '"')
        .enumerate()
    {
        let word = piece.trim_end_matches(|c: char| c.is_whitespace() || c == '"');
        let tail = &piece[word.len()..];
        let looks_like_key = ["sk-", "sk_", "xoxb-", "ghp_", "AIza"]
            .iter()
            .any(|prefix| word.starts_with(prefix) && word.len() >= prefix.len() + 8);
        if (hide_next && !word.is_empty()) || looks_like_key {
            redacted.push_str("***");
            redacted.push_str(tail);
        } else {
            redacted.push_str(piece);
        }
        if !word.is_empty() || i == 0 {
            hide_next = word.eq_ignore_ascii_case("bearer");
        }
    }
    redacted
}

/// The shortest key part (after the colon) of what counts as a bot token:
/// BotFather's keys are 35 characters.
const BOT_TOKEN_MIN_KEY: usize = 30;

/// `text` with every bot token in it (digits, `:`, at least
/// [`BOT_TOKEN_MIN_KEY`] characters of `A-Z a-z 0-9 _ -`), wherever it
/// stands (alone, inside a URL's `/bot<token>/`), replaced by `***`.
pub fn hide_bot_tokens(text: &str) -> String {
    let bytes = text.as_bytes();
    let is_key = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b':' {
            i += 1;
            continue;
        }
        let id_start = bytes[..i]
            .iter()
            .rposition(|b| !b.is_ascii_digit())
            .map_or(0, |p| p + 1);
        let key_end = bytes[i + 1..]
            .iter()
            .position(|&b| !is_key(b))
            .map_or(bytes.len(), |p| i + 1 + p);
        if id_start < i && key_end - (i + 1) >= BOT_TOKEN_MIN_KEY {
            out.push_str(&text[copied..id_start]);
            out.push_str("***");
            copied = key_end;
            i = key_end;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// Capabilities no child of telegate may have: each one is a way into
/// another process's memory (`ptrace`, `/proc/<pid>/mem`, `/dev/mem`,
/// kernel modules, BPF and perf probes, `CAP_SYS_ADMIN`'s many doors).
#[cfg(target_os = "linux")]
pub const DROPPED_CAPABILITIES: &[caps::Capability] = &[
    caps::Capability::CAP_SYS_PTRACE,
    caps::Capability::CAP_SYS_RAWIO,
    caps::Capability::CAP_SYS_MODULE,
    caps::Capability::CAP_SYS_ADMIN,
    caps::Capability::CAP_BPF,
    caps::Capability::CAP_PERFMON,
    caps::Capability::CAP_CHECKPOINT_RESTORE,
];

/// What [`harden_process`] did, for the log.
#[derive(Debug, Default)]
pub struct Hardening {
    /// Names of secret variables that were present and scrubbed.
    pub scrubbed: Vec<String>,
    /// `PR_SET_DUMPABLE` is now 0.
    pub undumpable: bool,
    /// Capabilities that could not be dropped (and why); empty when all
    /// were dropped or never held.
    pub problems: Vec<String>,
}

/// Make the secrets unreachable for children: scrub `secret_env` from the
/// environment block, turn off dumpability, drop [`DROPPED_CAPABILITIES`].
///
/// # Safety contract
/// Call only while the process has a single thread (before the async
/// runtime starts): it writes the process environment in place and changes
/// the calling thread's capabilities, which later threads inherit.
pub fn harden_process(secret_env: &[String]) -> Hardening {
    let mut report = Hardening {
        scrubbed: scrub_environment(secret_env),
        ..Hardening::default()
    };
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments only.
        report.undumpable = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == 0;
        report.problems = drop_capabilities();
    }
    report
}

/// Overwrite the values of `names` in the original environment block with
/// zero bytes, then remove the variables. Returns the names found.
fn scrub_environment(names: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    #[cfg(unix)]
    {
        extern "C" {
            static mut environ: *mut *mut libc::c_char;
        }
        // SAFETY: single-threaded (see `harden_process`), so nothing changes
        // the environment meanwhile. Each entry is a NUL-terminated
        // "NAME=value" string that the C runtime placed in writable memory
        // (the initial block on the stack, or setenv's heap copies); we
        // write only within the value, before its NUL terminator.
        unsafe {
            let mut entry = environ;
            while !entry.is_null() && !(*entry).is_null() {
                let start = *entry;
                let len = libc::strlen(start);
                let bytes = std::slice::from_raw_parts_mut(start.cast::<u8>(), len);
                if let Some(eq) = bytes.iter().position(|&b| b == b'=') {
                    let name = &bytes[..eq];
                    if names.iter().any(|n| n.as_bytes() == name) {
                        found.push(String::from_utf8_lossy(name).into_owned());
                        bytes[eq + 1..].fill(0);
                    }
                }
                entry = entry.add(1);
            }
        }
    }
    for name in &found {
        // Single-threaded here (see `harden_process`).
        std::env::remove_var(name);
    }
    found.sort();
    found.dedup();
    found
}

/// Drop [`DROPPED_CAPABILITIES`] from every set of this thread. Dropping
/// from the bounding set needs `CAP_SETPCAP` (held by root); without it the
/// bounding set is left alone, which is fine: a process without the
/// capabilities cannot pass them on, only a setuid-root program could grant
/// them (see SECURITY.md).
#[cfg(target_os = "linux")]
fn drop_capabilities() -> Vec<String> {
    use caps::CapSet;
    let mut problems = Vec::new();
    let can_shrink_bounding =
        caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP).unwrap_or(false);
    for &cap in DROPPED_CAPABILITIES {
        let mut sets = vec![CapSet::Ambient, CapSet::Inheritable];
        if can_shrink_bounding {
            sets.push(CapSet::Bounding);
        }
        sets.extend([CapSet::Effective, CapSet::Permitted]);
        for set in sets {
            // A capability the running kernel does not know is fine.
            if !caps::has_cap(None, set, cap).unwrap_or(false) {
                continue;
            }
            if let Err(error) = caps::drop(None, set, cap) {
                problems.push(format!("{cap} from {set:?}: {error}"));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources<'a>(inline: Option<&str>, file: Option<&'a Path>) -> SecretSources<'a> {
        SecretSources {
            key: "telegram.token",
            inline: inline.map(Secret::new),
            file_key: "telegram.token_file",
            file,
            credential: TOKEN_CREDENTIAL,
            env_var: Some("TOKEN_VAR"),
        }
    }

    #[test]
    fn a_file_is_read_without_its_newline_and_never_shown_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "1:FROMFILE\n").unwrap();
        let secret = sources(None, Some(&path)).resolve(&|_| None).unwrap();
        assert_eq!(secret.unwrap().expose(), "1:FROMFILE");
        let error = sources(Some("1:X"), Some(&path))
            .resolve(&|_| None)
            .unwrap_err();
        assert!(error.contains("both set"), "{error}");
        std::fs::write(&path, " \n").unwrap();
        let error = sources(None, Some(&path)).resolve(&|_| None).unwrap_err();
        assert!(error.contains("is empty"), "{error}");
        std::fs::write(&path, "1:".to_string() + &"x".repeat(5000)).unwrap();
        let error = sources(None, Some(&path)).resolve(&|_| None).unwrap_err();
        assert!(error.contains("too large"), "{error}");
        assert!(!error.contains("xxxx"), "{error}");
        let error = sources(None, Some(Path::new("/dev/zero")))
            .resolve(&|_| None)
            .unwrap_err();
        assert!(error.contains("too large"), "{error}");
        let missing = dir.path().join("nope");
        let error = sources(None, Some(&missing))
            .resolve(&|_| None)
            .unwrap_err();
        assert!(
            error.contains("telegram.token_file: cannot read"),
            "{error}"
        );
    }

    #[test]
    fn a_systemd_credential_wins_over_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TOKEN_CREDENTIAL), "1:CRED").unwrap();
        let credentials = dir.path().display().to_string();
        let env = move |name: &str| match name {
            CREDENTIALS_DIR_ENV => Some(credentials.clone()),
            "TOKEN_VAR" => Some("1:ENV".to_string()),
            _ => None,
        };
        let secret = sources(None, None).resolve(&env).unwrap();
        assert_eq!(secret.unwrap().expose(), "1:CRED");
        let env_only = |name: &str| (name == "TOKEN_VAR").then(|| "1:ENV".to_string());
        let secret = sources(None, None).resolve(&env_only).unwrap();
        assert_eq!(secret.unwrap().expose(), "1:ENV");
        let inline = sources(Some("1:IN"), None).resolve(&env).unwrap();
        assert_eq!(inline.unwrap().expose(), "1:IN");
    }

    #[test]
    fn bot_tokens_are_hidden_wherever_they_stand() {
        let token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";
        let text = format!("a {token} b https://api.telegram.org/bot{token}/getMe \"{token}\"");
        let out = hide_bot_tokens(&text);
        assert!(!out.contains("AAHdqTcv"), "{out}");
        assert_eq!(out.matches("***").count(), 3, "{out}");
        assert_eq!(hide_bot_tokens("12:30 and 1:abc"), "12:30 and 1:abc");
        assert!(!redact(&text, &[]).contains("AAHdqTcv"));
    }

    #[test]
    fn redaction_hides_known_secrets_keys_and_bearer_tokens() {
        let text = r#"{"error":"Incorrect API key provided: sk-abcdefghijklmnop. Header was Bearer abc123xyz, key MYSECRETVALUE"}"#;
        let out = redact(text, &["MYSECRETVALUE"]);
        assert!(!out.contains("sk-abcdefghijklmnop"), "{out}");
        assert!(!out.contains("abc123xyz"), "{out}");
        assert!(!out.contains("MYSECRETVALUE"), "{out}");
        assert!(out.contains("Incorrect API key provided"), "{out}");
    }
}
