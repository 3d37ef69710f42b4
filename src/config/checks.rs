//! Value checks the configuration schema cannot express: secret formats,
//! URL schemes, duration bounds, environment pass-through names.
//!
//! Every check returns one line naming the config key and the fix, and never
//! a secret's value. This module owns the rules; `config.rs` calls them from
//! `Config::validate`, so `check-config` and `run` refuse the same files.
//! It must never read files or the environment; [`check_data_dir`] only
//! looks at what exists on the path (metadata).

use std::path::Path;

use crate::config::{
    AgentBackend, Config, TelegramConfig, UpdateMode, Updates, Webhook, TOKEN_ENV,
    WEBHOOK_SECRET_ENV,
};
use crate::secrets::Secret;

/// The longest any duration setting may be: 7 days. Longer values are
/// certainly mistakes, and unbounded ones overflow `Instant` arithmetic
/// (a panic) or wait forever.
pub(super) const MAX_DURATION_SECS: u64 = 7 * 24 * 60 * 60;

/// A bot token looks like `123456:ABC-def_…`: a numeric bot id, a colon,
/// and a key of letters, digits, `_` and `-`.
pub(super) fn check_token(key: &str, token: &Secret) -> Result<(), String> {
    let value = token.expose();
    if value.trim().is_empty() {
        return Err(format!(
            "{key} is empty: paste the token from @BotFather (it looks like 123456:ABC-...)"
        ));
    }
    let well_formed = value.split_once(':').is_some_and(|(id, rest)| {
        !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_digit())
            && !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    });
    if !well_formed {
        return Err(format!(
            "{key} is not a bot token: it must look like 123456:ABC-... \
             (the bot id, ':', then letters, digits, '_' or '-')"
        ));
    }
    Ok(())
}

/// Telegram accepts 1 to 256 characters of `A-Z a-z 0-9 _ -` as a webhook
/// secret. An empty one would turn authentication off.
pub(super) fn check_webhook_secret(key: &str, secret: &Secret) -> Result<(), String> {
    let value = secret.expose();
    let allowed = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if value.is_empty() || value.len() > 256 || !allowed {
        return Err(format!(
            "{key} must be 1 to 256 characters of A-Z, a-z, 0-9, '_' and '-' \
             (it is {} characters{}); generate one with: openssl rand -hex 32",
            value.chars().count(),
            if allowed { "" } else { ", with others" }
        ));
    }
    Ok(())
}

/// Every duration key with its value in seconds or milliseconds.
fn durations(config: &Config) -> Vec<(&'static str, u64, Unit)> {
    let s = &config.sessions;
    let d = &config.delivery;
    let t = &config.tools.terminal;
    let mut all = vec![
        (
            "sessions.ack_interval_secs",
            s.ack_interval_secs,
            Unit::Secs,
        ),
        (
            "sessions.stall_timeout_secs",
            s.stall_timeout_secs,
            Unit::Secs,
        ),
        ("sessions.cancel_wait_ms", s.cancel_wait_ms, Unit::Millis),
        (
            "sessions.shutdown_grace_secs",
            s.shutdown_grace_secs,
            Unit::Secs,
        ),
        (
            "delivery.per_chat_interval_ms",
            d.per_chat_interval_ms,
            Unit::Millis,
        ),
        (
            "delivery.edit_interval_ms",
            d.edit_interval_ms,
            Unit::Millis,
        ),
        (
            "delivery.typing_interval_ms",
            d.typing_interval_ms,
            Unit::Millis,
        ),
        ("delivery.typing_delay_ms", d.typing_delay_ms, Unit::Millis),
        (
            "delivery.max_retry_wait_secs",
            d.max_retry_wait_secs,
            Unit::Secs,
        ),
        (
            "agent.echo.delay_ms",
            config
                .agent
                .tables()
                .find_map(|table| match table {
                    AgentBackend::Echo(echo) => Some(echo.delay_ms),
                    _ => None,
                })
                .unwrap_or(0),
            Unit::Millis,
        ),
        ("tools.terminal.timeout_secs", t.timeout_secs, Unit::Secs),
        (
            "tools.terminal.approval_timeout_secs",
            t.approval_timeout_secs,
            Unit::Secs,
        ),
    ];
    for command in config.agent.tables().filter_map(|table| match table {
        AgentBackend::Command(command) => Some(command),
        _ => None,
    }) {
        all.push((
            "agent.command.timeout_secs",
            command.timeout_secs,
            Unit::Secs,
        ));
        all.push((
            "agent.command.kill_grace_ms",
            command.kill_grace_ms,
            Unit::Millis,
        ));
    }
    for acp in config.agent.tables().filter_map(|table| match table {
        AgentBackend::Acp(acp) => Some(acp),
        _ => None,
    }) {
        all.extend([
            ("agent.acp.idle_secs", acp.idle_secs, Unit::Secs),
            (
                "agent.acp.start_timeout_secs",
                acp.start_timeout_secs,
                Unit::Secs,
            ),
            (
                "agent.acp.permission_timeout_secs",
                acp.permission_timeout_secs,
                Unit::Secs,
            ),
            (
                "agent.acp.cancel_grace_ms",
                acp.cancel_grace_ms,
                Unit::Millis,
            ),
            ("agent.acp.kill_grace_ms", acp.kill_grace_ms, Unit::Millis),
        ]);
    }
    for openai in config.agent.tables().filter_map(|table| match table {
        AgentBackend::Openai(openai) => Some(openai),
        _ => None,
    }) {
        all.push((
            "agent.openai.request_timeout_secs",
            openai.request_timeout_secs,
            Unit::Secs,
        ));
    }
    all
}

#[derive(Clone, Copy)]
enum Unit {
    Secs,
    Millis,
}

/// No duration key may exceed [`MAX_DURATION_SECS`].
pub(super) fn check_durations(config: &Config) -> Result<(), String> {
    for (key, value, unit) in durations(config) {
        let max = match unit {
            Unit::Secs => MAX_DURATION_SECS,
            Unit::Millis => MAX_DURATION_SECS * 1000,
        };
        if value > max {
            return Err(format!(
                "{key} = {value} is too large: at most {max} (7 days)"
            ));
        }
    }
    Ok(())
}

/// `pass_env` names must be variable names, and never a secret telegate
/// keeps from its children.
pub(super) fn check_pass_env(
    key: &str,
    names: &[String],
    secrets: &[String],
) -> Result<(), String> {
    for name in names {
        let valid = !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if !valid {
            return Err(format!(
                "{key}: {name:?} is not an environment variable name"
            ));
        }
        if secrets.iter().any(|secret| secret == name) {
            return Err(format!(
                "{key} lists {name}, which holds a secret telegate keeps from every child"
            ));
        }
    }
    Ok(())
}

/// `data_dir` must be a directory, or a path where one can be created: an
/// existing file (`/dev/null`, say) is refused, and so is a path below
/// one. Nothing is created here.
pub(super) fn check_data_dir(key: &str, dir: &Path) -> Result<(), String> {
    if dir.as_os_str().is_empty() {
        return Err(format!(
            "{key} is empty: name the directory for telegate's data"
        ));
    }
    if let Ok(meta) = std::fs::metadata(dir) {
        return if meta.is_dir() {
            Ok(())
        } else {
            Err(format!(
                "{key} {} exists and is not a directory: name a directory (it is created if missing)",
                dir.display()
            ))
        };
    }
    let existing = dir
        .ancestors()
        .skip(1)
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find_map(|a| std::fs::metadata(a).ok().map(|meta| (a, meta)));
    match existing {
        Some((ancestor, meta)) if !meta.is_dir() => Err(format!(
            "{key} {} cannot be created: {} is not a directory",
            dir.display(),
            ancestor.display()
        )),
        _ => Ok(()),
    }
}

/// A Telegram run's `[telegram]` (or one `[[bots]]` table): a token, a
/// webhook complete and within Telegram's limits, approvers who can reach
/// the bot; how updates arrive, built from `mode` and `[telegram.webhook]`.
pub(super) fn telegram_updates(telegram: &TelegramConfig) -> Result<Updates, String> {
    if telegram.token.is_none() {
        return Err(format!(
            "telegram.token is missing: set it in the file or in the {TOKEN_ENV} environment variable"
        ));
    }
    check_approvers(telegram)?;
    if telegram.mode == UpdateMode::Polling {
        return Ok(Updates::Polling);
    }
    let Some(webhook) = &telegram.webhook else {
        return Err(
            "telegram.mode = \"webhook\" needs a [telegram.webhook] table with listen and public_url"
                .to_string(),
        );
    };
    if !(1..=100).contains(&webhook.max_connections) {
        return Err(format!(
            "telegram.webhook.max_connections {} is out of range: use 1 to 100",
            webhook.max_connections
        ));
    }
    webhook.limit_settings().validate("telegram.webhook")?;
    if webhook.connection_limit < usize::from(webhook.max_connections) {
        return Err(format!(
            "telegram.webhook.connection_limit {} is below max_connections {}: \
             Telegram's own connections would be refused",
            webhook.connection_limit, webhook.max_connections
        ));
    }
    let Some(secret) = webhook.secret_token.clone() else {
        return Err(format!(
            "telegram.webhook.secret_token is missing: set it in the file or in {WEBHOOK_SECRET_ENV}"
        ));
    };
    Ok(Updates::Webhook(Box::new(Webhook {
        listen: webhook.listen,
        path: match webhook.public_url.path() {
            "" => "/".to_string(),
            path => path.to_string(),
        },
        public_url: webhook.public_url.clone(),
        secret,
        max_connections: webhook.max_connections,
        limits: webhook.limits(),
    })))
}

/// Approvers must be able to reach the bot (unless anyone may).
fn check_approvers(telegram: &TelegramConfig) -> Result<(), String> {
    if !telegram.allowed_chats.is_empty() || telegram.allow_all_users {
        return Ok(());
    }
    match telegram
        .approvers
        .iter()
        .find(|a| !telegram.allowed_users.contains(a))
    {
        Some(stranger) => Err(format!(
            "telegram.approvers lists {stranger}, who is not in telegram.allowed_users \
             and so could never reach the bot to approve anything"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::check_http_url;

    #[test]
    fn tokens_must_look_like_tokens() {
        let check = |t: &str| check_token("telegram.token", &Secret::new(t));
        assert!(check("123:abc-DEF_9").is_ok());
        assert!(check("").unwrap_err().contains("empty"));
        assert!(check("   ").unwrap_err().contains("empty"));
        assert!(check("abcdef").unwrap_err().contains("not a bot token"));
        assert!(check("12:").is_err());
        assert!(check(":abc").is_err());
        assert!(check("12:ab cd").is_err());
        assert!(check("x1:abc").is_err());
    }

    #[test]
    fn webhook_secrets_follow_telegrams_rules() {
        let check =
            |t: &str| check_webhook_secret("telegram.webhook.secret_token", &Secret::new(t));
        assert!(check("s3cret_-X").is_ok());
        assert!(check(&"a".repeat(256)).is_ok());
        assert!(check("").is_err());
        assert!(check("   ").is_err());
        assert!(check("has space").is_err());
        assert!(check("ümlaut").is_err());
        assert!(check(&"a".repeat(257)).is_err());
        assert!(!check("bad secret!").unwrap_err().contains("bad secret"));
    }

    #[test]
    fn data_dir_must_be_a_directory_or_creatable_as_one() {
        let check = |dir: &str| check_data_dir("store.data_dir", Path::new(dir));
        assert!(check("/dev/null").unwrap_err().contains("not a directory"));
        assert!(check("/dev/null/data")
            .unwrap_err()
            .contains("cannot be created"));
        assert!(check("").unwrap_err().contains("empty"));
        let root = tempfile::tempdir().unwrap();
        assert!(check(&root.path().display().to_string()).is_ok());
        assert!(check(&root.path().join("new/deeper").display().to_string()).is_ok());
        assert!(check("relative-data").is_ok());
    }

    #[test]
    fn urls_must_be_http() {
        assert!(check_http_url("telegram.api_url", "https://api.telegram.org").is_ok());
        assert!(check_http_url("telegram.api_url", "http://127.0.0.1:8081/").is_ok());
        assert!(check_http_url("telegram.api_url", "ftp://example.com")
            .unwrap_err()
            .contains("http"));
        assert!(check_http_url("telegram.api_url", "not a url").is_err());
    }
}
