//! Zero-config start and `telegate init`.
//!
//! With no config file, telegate runs from built-in defaults plus a handful
//! of environment variables, so a fresh clone (or a container) needs nothing
//! but a token. `telegate init` writes the commented example as a starting
//! file, never over an existing one.
//!
//! This module owns which environment variables a file-less start reads and
//! where the config comes from ([`ConfigSource`]). It must never read a
//! variable that is not listed in [`ENV_VARS`] (what a start reads must be
//! documentable in one line) and never overwrite a user's file.

use std::path::{Path, PathBuf};

use crate::agent::OpenAiConfig;
use crate::config::{AgentBackend, Config, ConfigError, Purpose, TOKEN_ENV};
use crate::secrets::Secret;

/// The commented example configuration, as `telegate init` writes it.
pub const EXAMPLE_CONFIG: &str = include_str!("../../config.example.toml");

/// The config file looked for when `--config` is not given.
pub const DEFAULT_CONFIG_FILE: &str = "telegate.toml";

/// The Bot API root URL (zero-config; a local Bot API server, or tests).
pub const API_URL_ENV: &str = "TELEGATE_API_URL";
/// Set by systemd when the unit has `LoadCredential=`.
pub const CREDENTIALS_DIRECTORY_ENV: &str = "CREDENTIALS_DIRECTORY";
/// The credential name of the bot token (`LoadCredential=telegram_bot_token:…`).
pub const TOKEN_CREDENTIAL: &str = "telegram_bot_token";
/// Comma-separated user ids allowed to talk to the bot (zero-config).
pub const ALLOWED_USERS_ENV: &str = "TELEGATE_ALLOWED_USERS";
/// Where the database lives (zero-config); systemd's `STATE_DIRECTORY` is
/// used when this is not set.
pub const DATA_DIR_ENV: &str = "TELEGATE_DATA_DIR";
/// Set by systemd for `StateDirectory=`.
pub const STATE_DIRECTORY_ENV: &str = "STATE_DIRECTORY";
/// Address of the `/healthz` + `/metrics` listener (zero-config).
pub const METRICS_LISTEN_ENV: &str = "TELEGATE_METRICS_LISTEN";
/// The OpenAI-compatible server (selects the openai backend).
pub const OPENAI_BASE_URL_ENV: &str = "OPENAI_BASE_URL";
/// The OpenAI API key (selects the openai backend).
pub const OPENAI_API_KEY_ENV: &str = "OPENAI_API_KEY";
/// The model for the openai backend (default [`DEFAULT_OPENAI_MODEL`]).
pub const OPENAI_MODEL_ENV: &str = "OPENAI_MODEL";
/// The model used when `OPENAI_MODEL` is not set.
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4o-mini";

/// Every variable a file-less start reads.
pub const ENV_VARS: &[&str] = &[
    TOKEN_ENV,
    CREDENTIALS_DIRECTORY_ENV,
    API_URL_ENV,
    ALLOWED_USERS_ENV,
    DATA_DIR_ENV,
    STATE_DIRECTORY_ENV,
    METRICS_LISTEN_ENV,
    OPENAI_BASE_URL_ENV,
    OPENAI_API_KEY_ENV,
    OPENAI_MODEL_ENV,
];

/// Where the running configuration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// A TOML file.
    File(PathBuf),
    /// No file: built-in defaults plus the environment. Only this source may
    /// start with an empty allowlist (locked: every sender is told their id).
    Environment,
}

impl Default for ConfigSource {
    /// A file: the strict rules apply unless the environment was chosen.
    fn default() -> Self {
        ConfigSource::File(PathBuf::new())
    }
}

impl ConfigSource {
    /// The one log line saying which configuration is in use.
    pub fn describe(&self, config: &Config) -> String {
        match self {
            ConfigSource::File(path) => format!("using config file {}", path.display()),
            ConfigSource::Environment => format!(
                "no config file: using built-in defaults and the environment \
                 ({TOKEN_ENV}, {ALLOWED_USERS_ENV}, OPENAI_*…); backend {}, {} allowed user(s), data in {}",
                config.agent.kind().as_str(),
                config.telegram.allowed_users.len(),
                config.store.data_dir.display()
            ),
        }
    }
}

/// Load the configuration: from `explicit` if given (it must exist), else
/// from `telegate.toml` if present, else from the environment alone.
pub fn load(explicit: Option<&Path>, purpose: Purpose) -> Result<Config, ConfigError> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => {
            let default = PathBuf::from(DEFAULT_CONFIG_FILE);
            if !default.exists() {
                return from_environment(purpose, |name| std::env::var(name).ok());
            }
            default
        }
    };
    let mut config = Config::load(&path, purpose)?;
    config.source = ConfigSource::File(path);
    Ok(config)
}

/// Built-in defaults plus the variables in [`ENV_VARS`], looked up with `env`.
pub fn from_environment(
    purpose: Purpose,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let get = |name: &str| env(name).filter(|value| !value.trim().is_empty());
    let mut config = Config {
        source: ConfigSource::Environment,
        ..Config::default()
    };
    config.telegram.token = match get(TOKEN_ENV) {
        Some(token) => Some(Secret::new(token)),
        None => credential_token(get(CREDENTIALS_DIRECTORY_ENV)).map_err(env_error)?,
    };
    if let Some(url) = get(API_URL_ENV) {
        crate::vocab::check_http_url(API_URL_ENV, &url).map_err(env_error)?;
        config.telegram.api_url =
            url::Url::parse(&url).map_err(|e| env_error(format!("{API_URL_ENV}: {e}")))?;
    }
    if let Some(list) = get(ALLOWED_USERS_ENV) {
        config.telegram.allowed_users = parse_user_list(&list)?;
    }
    if let Some(dir) = get(DATA_DIR_ENV).or_else(|| get(STATE_DIRECTORY_ENV)) {
        // systemd may list several state directories, colon-separated.
        let first = dir.split(':').next().unwrap_or(&dir).to_string();
        config.store.data_dir = PathBuf::from(first);
    }
    if let Some(listen) = get(METRICS_LISTEN_ENV) {
        config.metrics = toml::from_str(&format!("listen = {}", toml_string(&listen)))
            .map_err(|e| env_error(format!("{METRICS_LISTEN_ENV}: {}", e.message())))?;
    }
    let base_url = get(OPENAI_BASE_URL_ENV);
    if base_url.is_some() || get(OPENAI_API_KEY_ENV).is_some() {
        let mut openai = OpenAiConfig::new(
            "https://api.openai.com/v1",
            get(OPENAI_MODEL_ENV).unwrap_or_else(|| DEFAULT_OPENAI_MODEL.to_string()),
        );
        if let Some(base_url) = base_url {
            openai.base_url = base_url;
        }
        openai.api_key_env = OPENAI_API_KEY_ENV.to_string();
        config.agent.backend = AgentBackend::Openai(openai);
    }
    config.validate_as(Path::new("(environment)"), purpose)?;
    Ok(config)
}

/// The bot token systemd passed with `LoadCredential=telegram_bot_token:…`
/// (in `$CREDENTIALS_DIRECTORY`), trimmed; `None` if there is none. A
/// credential that cannot be read, is empty or too large is an error
/// naming it (never its content).
pub fn credential_token(credentials_directory: Option<String>) -> Result<Option<Secret>, String> {
    let Some(dir) = credentials_directory else {
        return Ok(None);
    };
    let path = Path::new(&dir).join(TOKEN_CREDENTIAL);
    if !path.is_file() {
        return Ok(None);
    }
    let key = format!("the systemd credential {TOKEN_CREDENTIAL}");
    crate::secrets::read_secret_file(&key, &path).map(Some)
}

/// Parse `TELEGATE_ALLOWED_USERS`: numeric ids separated by commas (spaces
/// allowed). A bad entry is named by its position, never shown: it may be
/// a token pasted into the wrong variable.
pub fn parse_user_list(list: &str) -> Result<Vec<u64>, ConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .enumerate()
        .map(|(index, item)| {
            item.parse::<u64>().map_err(|_| {
                env_error(format!(
                    "{ALLOWED_USERS_ENV}: entry {} is not a numeric user id (use a comma list like 123,456)",
                    index + 1
                ))
            })
        })
        .collect()
}

fn env_error(message: String) -> ConfigError {
    ConfigError::Invalid {
        path: PathBuf::from("(environment)"),
        message,
    }
}

fn toml_string(value: &str) -> String {
    toml::Value::String(value.to_string()).to_string()
}

/// What `telegate init` did.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The file exists; it was left alone.
    #[error("{0} already exists; it was left unchanged (remove it first to start over)")]
    Exists(PathBuf),
    /// The file could not be written.
    #[error("{path}: cannot write: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Write the commented example to `path`, never over an existing file.
/// The file is its owner's alone (0600): it is where the token goes.
pub fn init(path: &Path) -> Result<(), InitError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(InitError::Exists(path.to_path_buf()))
        }
        Err(source) => {
            return Err(InitError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    file.write_all(EXAMPLE_CONFIG.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| InitError::Io {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Backend;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn a_token_alone_starts_an_echo_bot_locked_to_nobody() {
        let config = from_environment(Purpose::Telegram, env_of(&[(TOKEN_ENV, "1:abc")])).unwrap();
        assert_eq!(config.agent.kind(), Backend::Echo);
        assert!(config.telegram.allowed_users.is_empty());
        assert!(!config.telegram.allow_all_users);
        assert_eq!(config.source, ConfigSource::Environment);
    }

    #[test]
    fn users_and_openai_come_from_the_environment() {
        let config = from_environment(
            Purpose::Telegram,
            env_of(&[
                (TOKEN_ENV, "1:abc"),
                (ALLOWED_USERS_ENV, " 12, 34 ,"),
                (OPENAI_BASE_URL_ENV, "http://127.0.0.1:11434/v1"),
                (OPENAI_MODEL_ENV, "llama3"),
                (STATE_DIRECTORY_ENV, "/var/lib/telegate"),
            ]),
        )
        .unwrap();
        assert_eq!(config.telegram.allowed_users, vec![12, 34]);
        assert_eq!(config.agent.kind(), Backend::Openai);
        let openai = config.agent.openai().unwrap();
        assert_eq!(openai.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(openai.model, "llama3");
        assert_eq!(config.store.data_dir, PathBuf::from("/var/lib/telegate"));
    }

    #[test]
    fn the_token_may_come_from_a_systemd_credential() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TOKEN_CREDENTIAL), "9:fromcred\n").unwrap();
        let config = from_environment(
            Purpose::Telegram,
            env_of(&[(CREDENTIALS_DIRECTORY_ENV, dir.path().to_str().unwrap())]),
        )
        .unwrap();
        assert_eq!(config.telegram.token.unwrap().expose(), "9:fromcred");
    }

    #[test]
    fn a_bad_user_id_is_one_clear_error() {
        let error = from_environment(
            Purpose::Telegram,
            env_of(&[(TOKEN_ENV, "1:abc"), (ALLOWED_USERS_ENV, "12,@me")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(ALLOWED_USERS_ENV) && error.contains("entry 2"),
            "{error}"
        );
        assert!(!error.contains("@me"), "{error}");
    }

    #[test]
    fn no_token_is_an_error_for_run_but_not_for_console() {
        let error = from_environment(Purpose::Telegram, env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(error.contains(TOKEN_ENV), "{error}");
        assert!(from_environment(Purpose::Console, env_of(&[])).is_ok());
    }

    #[test]
    fn the_example_written_by_init_is_valid() {
        let config = Config::parse(
            Path::new("example"),
            EXAMPLE_CONFIG,
            Purpose::Console,
            |_| None,
        );
        assert!(config.is_ok(), "{config:?}");
    }
}
