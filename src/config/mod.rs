//! Configuration: one TOML file, validated before anything connects.
//!
//! Every table denies unknown keys, so a typo is an error with the file,
//! line and column instead of a silently ignored setting. Secrets (the bot
//! token, API keys) may come from environment variables instead of the file;
//! they are wrapped in [`Secret`], whose `Debug` never shows them and which
//! has no `Display` at all.
//!
//! This module owns the schema, loading and validation. It must never
//! connect to anything or log a secret.

use crate::secrets::Secret;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::adapter::AdapterConfig;
use crate::runner::RunnerConfig;
use crate::vocab::KeyPolicy;

mod bots;
mod checks;
mod locate;
mod sections;
pub mod zero_config;

use crate::config::sections::MAX_ANSWER_PARTS;
use crate::config::sections::MAX_INBOX_RETENTION_DAYS;
pub use bots::BotConfig;
pub use sections::{
    AgentBackend, AgentChoice, AgentConfig, Backend, ConsoleConfig, DeliverySettings, EchoConfig,
    LogConfig, LogFormat, SessionsConfig, StoreSettings, TelegramConfig, ToolsConfig, UpdateMode,
    Updates, Webhook, WebhookConfig,
};

/// Environment variable read for the bot token when the file has none.
pub const TOKEN_ENV: &str = "TELEGRAM_BOT_TOKEN";
/// Environment variable read for the webhook secret when the file has none.
pub const WEBHOOK_SECRET_ENV: &str = "TELEGRAM_WEBHOOK_SECRET";

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[telegram]`: the bot and who may use it.
    #[serde(default)]
    pub telegram: TelegramConfig,
    /// `[[bots]]` as written: several bots in one process, each a table
    /// with `[telegram]`'s keys (then `[telegram]` holds no bot).
    #[serde(default, rename = "bots")]
    pub(crate) bot_tables: Vec<TelegramConfig>,
    /// `[agents.NAME]`: agents a bot names with `agent = "NAME"`.
    #[serde(default)]
    pub(crate) agents: std::collections::BTreeMap<String, AgentConfig>,
    /// The bots to run, as loaded for `telegate run` (empty for the
    /// console): `[telegram]` as one bot, or each of `[[bots]]`, each with
    /// its token and the configuration it runs with ([`BotConfig`]).
    #[serde(skip)]
    pub bots: Vec<BotConfig>,
    /// `[sessions]`: busy handling, queues, watchdog.
    #[serde(default)]
    pub sessions: SessionsConfig,
    /// `[agent]`: which backend answers.
    #[serde(default)]
    pub agent: AgentConfig,
    /// `[console]`: the local chat of `telegate console`.
    #[serde(default)]
    pub console: ConsoleConfig,
    /// `[log]`: logging.
    #[serde(default)]
    pub log: LogConfig,
    /// `[delivery]`: pacing and streaming of replies to Telegram.
    #[serde(default)]
    pub delivery: DeliverySettings,
    /// `[store]`: where sessions and transcripts are kept.
    #[serde(default)]
    pub store: StoreSettings,
    /// `[tools]`: what the model may use (openai backend).
    #[serde(default)]
    pub tools: ToolsConfig,
    /// `[metrics]`: the optional /healthz and /metrics listener.
    #[serde(default)]
    pub metrics: crate::metrics::MetricsConfig,
    /// Where this configuration came from (not a key of the file).
    #[serde(skip)]
    pub source: crate::config::zero_config::ConfigSource,
    /// `[media]`: photos, voice, documents in; files out.
    #[serde(default)]
    pub media: crate::media::MediaConfig,
    /// `[schedule]`: scheduled jobs and reminders.
    #[serde(default)]
    pub schedule: crate::schedule::ScheduleConfig,
    /// `[access]`: pairing codes, invites, guessing limits.
    #[serde(default)]
    pub access: crate::access::AccessConfig,
    /// `[limits]`: per-user budgets.
    #[serde(default)]
    pub limits: crate::limits::LimitsConfig,
    /// Where "now" comes from for codes and budgets (not a key of the
    /// file; tests set a manual clock).
    #[serde(skip)]
    pub clock: crate::clock::Clock,
}

/// What the configuration will be used for (what must be present).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `telegate run`: a Telegram bot; needs a token and an access policy.
    Telegram,
    /// `telegate console`: a local chat; needs neither.
    Console,
}

/// A configuration problem, always one line naming the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: cannot read the config file: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path}: the config file is empty; start from config.example.toml")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The TOML is invalid or does not fit the schema.
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The values are inconsistent or something required is missing.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl Config {
    /// Read, parse and validate `path` for `purpose`, filling secrets from the
    /// environment where the file has none.
    pub fn load(path: &Path, purpose: Purpose) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text, purpose, |name| std::env::var(name).ok())
    }

    /// Parse and validate `text` (named `path` in errors); `env` looks up
    /// environment variables.
    pub fn parse(
        path: &Path,
        text: &str,
        purpose: Purpose,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        if text.trim().is_empty() {
            return Err(ConfigError::Empty {
                path: path.to_path_buf(),
            });
        }
        let mut config: Config = toml::from_str(text).map_err(|error| {
            let span = error.span();
            let (line, column) = span
                .clone()
                .map(|span| line_column(text, span.start))
                .unwrap_or((1, 1));
            let mut message = one_line(error.message());
            if let Some(span) = span {
                // A token pasted into the wrong key must not be printed.
                message = locate::hide_string_value(&message, text, span);
            }
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: crate::secrets::hide_bot_tokens(&message),
            }
        })?;
        let located = |message: String, known: &[&str]| {
            located_error(path, text, &crate::secrets::redact(&message, known))
        };
        config
            .check_bots_alone()
            .and_then(|()| config.choose_single_agent())
            .map_err(|message| located(message, &[]))?;
        config
            .resolve_secrets(&env)
            .map_err(|message| located(message, &[]))?;
        config.source = crate::config::zero_config::ConfigSource::File(path.to_path_buf());
        // With [[bots]], each bot's table is checked as its own
        // `[telegram]` (`expand_bots`); the file's `[telegram]` holds none.
        let checked = config.validate(path, config.shared_purpose(purpose));
        checked.map_err(|error| match error {
            ConfigError::Invalid { message, .. } => located(message, &config.secret_values()),
            other => other,
        })?;
        if purpose == Purpose::Telegram {
            config.bots = if config.bot_tables.is_empty() {
                vec![config
                    .single_bot()
                    .map_err(|message| located(message, &config.secret_values()))?]
            } else {
                config.expand_bots(path, &env)?
            };
        }
        Ok(config)
    }

    /// What the file's own tables are checked for: a Telegram run's
    /// `[telegram]` only when it is the bot.
    fn shared_purpose(&self, purpose: Purpose) -> Purpose {
        if self.bot_tables.is_empty() {
            purpose
        } else {
            Purpose::Console
        }
    }

    /// Validate a configuration built without a file (zero-config): its
    /// one bot is `[telegram]`.
    pub(crate) fn validate_as(&mut self, path: &Path, purpose: Purpose) -> Result<(), ConfigError> {
        self.validate(path, purpose)?;
        if purpose == Purpose::Telegram {
            let bot = self.single_bot().map_err(|message| ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            })?;
            self.bots = vec![bot];
        }
        Ok(())
    }

    /// Check every value and build what is derived from several
    /// (`telegram.updates`): after this nothing re-checks the config.
    fn validate(&mut self, path: &Path, purpose: Purpose) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        crate::config::checks::check_durations(self).map_err(invalid)?;
        self.check_secret_formats().map_err(invalid)?;
        self.check_agent().map_err(invalid)?;
        self.check_sections().map_err(invalid)?;
        self.check_tools().map_err(invalid)?;
        self.telegram.updates = match purpose {
            Purpose::Telegram => {
                crate::config::checks::telegram_updates(&self.telegram).map_err(invalid)?
            }
            Purpose::Console => Updates::Polling,
        };
        Ok(())
    }

    /// The agent's table (and the tables of the backends not chosen):
    /// their values and the environment they pass on.
    fn check_agent(&self) -> Result<(), String> {
        let secret_names = self.secret_env_names();
        for table in self.agent.tables() {
            match table {
                AgentBackend::Command(command) => crate::config::checks::check_pass_env(
                    "agent.command.pass_env",
                    &command.pass_env,
                    &secret_names,
                )?,
                AgentBackend::Acp(acp) => crate::config::checks::check_pass_env(
                    "agent.acp.pass_env",
                    &acp.pass_env,
                    &secret_names,
                )?,
                AgentBackend::Echo(_) | AgentBackend::Openai(_) => {}
            }
        }
        match &self.agent.backend {
            AgentBackend::Echo(_) => Ok(()),
            AgentBackend::Command(command) => command.validate(),
            AgentBackend::Openai(openai) => openai.validate(),
            AgentBackend::Acp(acp) => acp.validate(),
        }
    }

    /// Delivery, sessions, metrics, store, media, access, limits, schedule
    /// and log: each table's own values.
    fn check_sections(&self) -> Result<(), String> {
        if !(1..=MAX_ANSWER_PARTS).contains(&self.delivery.max_answer_parts) {
            return Err(format!(
                "delivery.max_answer_parts must be between 1 and {MAX_ANSWER_PARTS} (it is {})",
                self.delivery.max_answer_parts
            ));
        }
        if self.sessions.max_pending == 0 {
            return Err("sessions.max_pending must be at least 1".to_string());
        }
        self.metrics.validate()?;
        if !(1..=MAX_INBOX_RETENTION_DAYS).contains(&self.store.inbox_retention_days) {
            // Telegram redelivers an unconfirmed update for up to a day; a
            // row pruned sooner could let a redelivery run twice.
            return Err(format!(
                "store.inbox_retention_days must be between 1 and {MAX_INBOX_RETENTION_DAYS} (it is {})",
                self.store.inbox_retention_days
            ));
        }
        self.media.validate()?;
        self.access.validate()?;
        self.limits.validate()?;
        crate::config::checks::check_data_dir("store.data_dir", &self.store.data_dir)?;
        self.schedule.validate()?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(format!(
                "log.level {:?} is not a valid filter: {e}",
                self.log.level
            ));
        }
        Ok(())
    }

    /// The terminal tool and MCP servers: their values, and that the
    /// backend can call tools at all.
    fn check_tools(&self) -> Result<(), String> {
        let secret_names = self.secret_env_names();
        crate::config::checks::check_pass_env(
            "tools.terminal.pass_env",
            &self.tools.terminal.pass_env,
            &secret_names,
        )?;
        if self.tools.terminal.enabled && self.agent.kind() != Backend::Openai {
            return Err(format!(
                "tools.terminal.enabled = true needs agent.backend = \"openai\" (the {} backend calls no tools)",
                self.agent.kind().as_str()
            ));
        }
        // Checked even while disabled, so turning it on never reveals an
        // old typo.
        self.tools.terminal.validate()?;
        crate::tools::mcp::config::validate_all(&self.tools.mcp)?;
        if !self.tools.mcp.is_empty() && self.agent.kind() != Backend::Openai {
            return Err(format!(
                "[[tools.mcp]] needs agent.backend = \"openai\" (the {} backend calls no tools; \
                 Claude Code and Codex take MCP servers in their own configuration)",
                self.agent.kind().as_str()
            ));
        }
        for (index, server) in self.tools.mcp.iter().enumerate() {
            crate::config::checks::check_pass_env(
                &format!("tools.mcp[{index}].pass_env"),
                &server.pass_env,
                &secret_names,
            )?;
        }
        Ok(())
    }

    /// The adapter settings.
    pub fn adapter_config(&self) -> AdapterConfig {
        AdapterConfig {
            busy_mode: self.sessions.busy_mode,
            max_pending: self.sessions.max_pending,
            ack_interval: Duration::from_secs(self.sessions.ack_interval_secs),
            cancel_wait: Duration::from_millis(self.sessions.cancel_wait_ms),
            key_policy: KeyPolicy {
                group_sessions_per_user: self.sessions.group_sessions_per_user,
                topics: self.telegram.topics,
            },
            metrics: crate::metrics::Metrics::default(),
        }
    }

    /// Whether the model is shown saved files' paths: what the configured
    /// backend and tools can open.
    pub fn file_access(&self) -> crate::media::FileAccess {
        use crate::media::FileAccess;
        let terminal = &self.tools.terminal;
        match self.agent.kind() {
            Backend::Command => FileAccess::Paths { workdir: None },
            Backend::Openai if terminal.enabled && terminal.run_as.is_none() => FileAccess::Paths {
                workdir: terminal.workdir.clone(),
            },
            _ => FileAccess::Names,
        }
    }

    /// The runner settings.
    pub fn runner_config(&self) -> RunnerConfig {
        RunnerConfig {
            stall_timeout: Duration::from_secs(self.sessions.stall_timeout_secs),
            history_max_messages: self.sessions.history_max_messages,
            metrics: crate::metrics::Metrics::default(),
            approvers: self.telegram.approvers.clone(),
            files: None,
            jobs: None,
            default_model: self.agent.openai().map(|o| o.model.clone()),
            models: self
                .agent
                .openai()
                .map(|o| o.models.clone())
                .unwrap_or_default(),
            access: None,
            limits: crate::limits::Limits::new(self.limits.clone(), self.clock.clone())
                .with_default_zone(self.schedule.default_zone().1),
            speech: self.media.speech.clone().and_then(|speech| {
                crate::media::speech::Speaker::new(speech)
                    .map_err(|error| tracing::error!(%error, "voice answers are off"))
                    .ok()
                    .map(std::sync::Arc::new)
            }),
        }
    }

    /// The delivery engine settings.
    pub fn delivery_config(&self) -> crate::delivery::DeliveryConfig {
        let d = &self.delivery;
        crate::delivery::DeliveryConfig {
            limits: crate::delivery::RateLimits {
                per_chat_interval: Duration::from_millis(d.per_chat_interval_ms),
                group_per_minute: d.group_messages_per_minute.max(1),
                global_per_second: d.global_messages_per_second.max(1),
            },
            edit_interval: Duration::from_millis(d.edit_interval_ms),
            typing_interval: Duration::from_millis(d.typing_interval_ms.max(100)),
            typing_delay: Duration::from_millis(d.typing_delay_ms),
            max_retry_wait: Duration::from_secs(d.max_retry_wait_secs),
            max_attempts: crate::delivery::DeliveryConfig::default().max_attempts,
            max_answer_parts: d.max_answer_parts,
        }
    }

    /// A short human summary for `check-config` (never shows secrets).
    pub fn summary(&self) -> String {
        if self.bot_tables.is_empty() {
            return self.bot_summary();
        }
        let bots: Vec<String> = self
            .bots
            .iter()
            .map(|bot| {
                let config = bot.config(self);
                let updates = match &config.telegram.updates {
                    Updates::Polling => "polling".to_string(),
                    Updates::Webhook(webhook) => format!("webhook {}", webhook.path),
                };
                format!(
                    "  {} (bot {}, {updates}, agent {})",
                    bot.name,
                    bot.id,
                    config.agent.kind().as_str()
                )
            })
            .collect();
        format!("bots: {}\n{}", bots.len(), bots.join("\n"))
    }

    /// One bot's summary.
    fn bot_summary(&self) -> String {
        let t = &self.telegram;
        let access = if t.allow_all_users {
            "everyone".to_string()
        } else if t.allowed_users.is_empty() && t.allowed_chats.is_empty() {
            "the team paired and invited from the chat (with no owner yet, a start shows a pairing code)".to_string()
        } else {
            format!(
                "{} user(s), {} chat(s)",
                t.allowed_users.len(),
                t.allowed_chats.len()
            )
        };
        format!(
            "telegram: token {}, api {}, {:?} mode, access: {}, require_mention {}, {} approver(s)\n\
             sessions: busy_mode {:?}, max_pending {}, stall_timeout {}s\n\
             agent: {}\n\
             tools: {}\n\
             store: {}",
            if t.token.is_some() { "set" } else { "not set" },
            t.api_url,
            t.mode,
            access,
            t.require_mention,
            t.approvers.len(),
            self.sessions.busy_mode,
            self.sessions.max_pending,
            self.sessions.stall_timeout_secs,
            self.agent.kind().as_str(),
            self.tools_summary(),
            if self.store.in_memory {
                "in memory (nothing kept across restarts)".to_string()
            } else {
                self.store.database_path().display().to_string()
            },
        )
    }
}

impl Config {
    fn tools_summary(&self) -> String {
        let terminal = &self.tools.terminal;
        let mcp = if self.tools.mcp.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = self.tools.mcp.iter().map(|s| s.name.as_str()).collect();
            format!(", MCP servers: {}", names.join(", "))
        };
        if !terminal.enabled {
            return format!("terminal off{mcp}");
        }
        format!(
            "terminal on (approval {:?}, workdir {}, at most {} background per chat)",
            terminal.approval,
            terminal
                .workdir
                .as_ref()
                .map_or_else(|| "the bot's own".to_string(), |d| d.display().to_string()),
            terminal.max_background
        ) + &mcp
    }
}

/// A validation problem as an error: at the line and column of the key
/// it names when the file sets that key, else for the whole file.
fn located_error(path: &Path, text: &str, message: &str) -> ConfigError {
    match locate::leading_key(message).and_then(|key| locate::value_offset(text, key)) {
        Some(offset) => {
            let (line, column) = line_column(text, offset);
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: message.to_string(),
            }
        }
        None => ConfigError::Invalid {
            path: path.to_path_buf(),
            message: message.to_string(),
        },
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Config {
    /// Fill the bot token, the webhook secret, the LLM API key and the
    /// transcription API key from their sources (see
    /// [`crate::secrets::SecretSources`]). This runs at load, before `main`
    /// scrubs the secret variables from the environment: whatever needs a
    /// key later takes it from here.
    fn resolve_secrets(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        use crate::secrets::{
            SecretSources, SPEECH_KEY_CREDENTIAL, TOKEN_CREDENTIAL, TRANSCRIPTION_KEY_CREDENTIAL,
            WEBHOOK_SECRET_CREDENTIAL,
        };
        let telegram = &mut self.telegram;
        // With [[bots]] the bots' tables hold the tokens
        // (`resolve_bot_secrets`); TELEGRAM_BOT_TOKEN names no bot there.
        let token_env = self.bot_tables.is_empty().then_some(TOKEN_ENV);
        telegram.token = SecretSources {
            key: "telegram.token",
            inline: telegram.token.take(),
            file_key: "telegram.token_file",
            file: telegram.token_file.as_deref(),
            credential: TOKEN_CREDENTIAL,
            env_var: token_env,
        }
        .resolve(env)?;
        if let Some(webhook) = telegram.webhook.as_mut() {
            webhook.secret_token = SecretSources {
                key: "telegram.webhook.secret_token",
                inline: webhook.secret_token.take(),
                file_key: "telegram.webhook.secret_token_file",
                file: webhook.secret_token_file.as_deref(),
                credential: WEBHOOK_SECRET_CREDENTIAL,
                env_var: Some(WEBHOOK_SECRET_ENV),
            }
            .resolve(env)?;
        }
        self.resolve_agent_secrets(env)?;
        if let Some(transcription) = self.media.transcription.as_mut() {
            transcription.resolved_api_key = SecretSources {
                key: "media.transcription.api_key_env",
                inline: None,
                file_key: "media.transcription.api_key_file",
                file: transcription.api_key_file.as_deref(),
                credential: TRANSCRIPTION_KEY_CREDENTIAL,
                env_var: transcription.api_key_env.as_deref(),
            }
            .resolve(env)?;
        }
        for (index, server) in self.tools.mcp.iter_mut().enumerate() {
            server.resolve_headers(index)?;
        }
        if let Some(speech) = self.media.speech.as_mut() {
            speech.resolved_api_key = SecretSources {
                key: "media.speech.api_key_env",
                inline: None,
                file_key: "media.speech.api_key_file",
                file: speech.api_key_file.as_deref(),
                credential: SPEECH_KEY_CREDENTIAL,
                env_var: speech.api_key_env.as_deref(),
            }
            .resolve(env)?;
        }
        Ok(())
    }

    /// The agent's API key (`[agent.openai]`), from its sources.
    fn resolve_agent_secrets(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        use crate::secrets::{SecretSources, API_KEY_CREDENTIAL};
        if let Some(openai) = self.agent.openai_mut() {
            let key = SecretSources {
                key: "agent.openai.api_key_env",
                inline: None,
                file_key: "agent.openai.api_key_file",
                file: openai.api_key_file.as_deref(),
                credential: API_KEY_CREDENTIAL,
                env_var: Some(&openai.api_key_env),
            }
            .resolve(env)?;
            openai.set_api_key(key);
        }
        Ok(())
    }

    /// Secrets that are present must be well formed, whatever the purpose.
    fn check_secret_formats(&self) -> Result<(), String> {
        if let Some(token) = &self.telegram.token {
            crate::config::checks::check_token("telegram.token", token)?;
        }
        if let Some(secret) = self
            .telegram
            .webhook
            .as_ref()
            .and_then(|w| w.secret_token.as_ref())
        {
            crate::config::checks::check_webhook_secret("telegram.webhook.secret_token", secret)?;
        }
        Ok(())
    }

    /// The secrets resolved so far, to keep them out of error texts.
    fn secret_values(&self) -> Vec<&str> {
        let webhook = self.telegram.webhook.as_ref();
        [
            self.telegram.token.as_ref(),
            webhook.and_then(|w| w.secret_token.as_ref()),
            self.agent
                .openai()
                .and_then(|o| o.resolved_api_key.as_ref()),
            self.media
                .transcription
                .as_ref()
                .and_then(|t| t.resolved_api_key.as_ref()),
            self.media
                .speech
                .as_ref()
                .and_then(|s| s.resolved_api_key.as_ref()),
        ]
        .into_iter()
        .flatten()
        .chain(
            self.tools
                .mcp
                .iter()
                .flat_map(|server| server.resolved_headers.iter().map(|(_, value)| value)),
        )
        .map(Secret::expose)
        .collect()
    }

    /// Every environment variable that may hold one of telegate's secrets:
    /// scrubbed from telegate's own environment at start and never passed
    /// to a child.
    pub fn secret_env_names(&self) -> Vec<String> {
        let mut names: Vec<String> = [TOKEN_ENV, WEBHOOK_SECRET_ENV]
            .iter()
            .chain(crate::vocab::ALWAYS_STRIPPED_ENV)
            .map(|name| name.to_string())
            .collect();
        // Every agent table's: `[agent]`, `[agents.*]` and the bots' own.
        let own_agents = self.bot_tables.iter().filter_map(|bot| match &bot.agent {
            Some(AgentChoice::Own(agent)) => Some(&**agent),
            _ => None,
        });
        for agent in std::iter::once(&self.agent)
            .chain(self.agents.values())
            .chain(own_agents)
        {
            names.extend(agent.secret_env_names().map(str::to_string));
        }
        if let Some(name) = self
            .media
            .transcription
            .as_ref()
            .and_then(|t| t.api_key_env.clone())
        {
            names.push(name);
        }
        if let Some(name) = self
            .media
            .speech
            .as_ref()
            .and_then(|s| s.api_key_env.clone())
        {
            names.push(name);
        }
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests;
