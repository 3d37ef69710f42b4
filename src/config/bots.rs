//! Several bots in one process: `[[bots]]` tables, each with
//! `[telegram]`'s keys plus a `name` and the agent it uses (`agent =
//! "NAME"` for `[agents.NAME]`, its own `[bots.agent]` table, or none for
//! `[agent]`). Loading turns them, or the single `[telegram]` table, into
//! [`BotConfig`]s: a name, the bot's id and token, and the whole
//! configuration that bot runs with (the file's, with its own `[telegram]`
//! and `[agent]`), validated like a one-bot file. Nothing after loading
//! looks at `[[bots]]` again.
//!
//! With more than one bot, what each bot keeps in files (media, the
//! webhook's registration, command histories, permission sockets, schedule
//! request files) lives in `<data_dir>/bots/<id>`, and a worktree root is
//! split the same way, so two bots answering the same group never share a
//! path. The database is one, its rows keyed by the bot.
//!
//! This module owns the `[[bots]]` rules (names, one token per bot, one
//! webhook path per listener address); it must never connect to anything.

use std::collections::HashSet;
use std::path::Path;

use crate::config::sections::{AgentChoice, AgentConfig};
use crate::config::{Config, ConfigError, Purpose, TelegramConfig, Updates};
use crate::secrets::Secret;
use crate::vocab::BotId;

/// The most bots one process runs (each polls and paces on its own).
pub(super) const MAX_BOTS: usize = 100;

/// One bot this process runs, as loaded.
#[derive(Clone, Debug)]
pub struct BotConfig {
    /// Its name (`name`, or `"bot"` for a single `[telegram]` bot without
    /// one).
    pub name: String,
    /// Its id: the number before the token's colon, which is what
    /// `getMe` answers.
    pub id: BotId,
    /// Its token, present and well formed.
    pub token: Secret,
    /// A `[[bots]]` bot's configuration: the file's, with this bot's
    /// `[telegram]` and agent (and, among several bots, its own
    /// directories). `None` for the single `[telegram]` bot, which runs
    /// with the file's own ([`BotConfig::config`]).
    pub own: Option<Box<Config>>,
}

impl BotConfig {
    /// The configuration this bot runs with, `file` being the loaded file.
    pub fn config<'a>(&'a self, file: &'a Config) -> &'a Config {
        self.own.as_deref().unwrap_or(file)
    }
}

/// The name of a single bot that has none.
const DEFAULT_NAME: &str = "bot";

/// A bot's id from its (well-formed) token.
pub(crate) fn id_of_token(token: &Secret) -> Option<BotId> {
    let (id, _) = token.expose().split_once(':')?;
    id.parse().ok().map(BotId)
}

impl Config {
    /// `[telegram]` and `[[bots]]` are alternatives: with `[[bots]]`, the
    /// `[telegram]` table holds no bot (a token there would be a bot
    /// nobody named).
    pub(super) fn check_bots_alone(&self) -> Result<(), String> {
        if self.bot_tables.is_empty() {
            return Ok(());
        }
        let telegram = &self.telegram;
        if telegram.token.is_some()
            || telegram.token_file.is_some()
            || telegram.name.is_some()
            || !telegram.allowed_users.is_empty()
            || !telegram.allowed_chats.is_empty()
        {
            return Err("telegram: with [[bots]], every bot is a [[bots]] table; \
                 move the [telegram] bot into one (with a name)"
                .to_string());
        }
        if self.bot_tables.len() > MAX_BOTS {
            return Err(format!(
                "bots: at most {MAX_BOTS} [[bots]] tables (there are {})",
                self.bot_tables.len()
            ));
        }
        Ok(())
    }

    /// The single `[telegram]` bot, once validated for a Telegram run.
    pub(super) fn single_bot(&self) -> Result<BotConfig, String> {
        let token = self.telegram.token.clone().ok_or_else(|| {
            format!(
                "telegram.token is missing: set it in the file or in the {} environment variable",
                crate::config::TOKEN_ENV
            )
        })?;
        let id =
            id_of_token(&token).ok_or_else(|| "telegram.token is not a bot token".to_string())?;
        Ok(BotConfig {
            name: self
                .telegram
                .name
                .clone()
                .unwrap_or_else(|| DEFAULT_NAME.to_string()),
            id,
            token,
            own: None,
        })
    }

    /// The single `[telegram]` bot's `agent = "NAME"` (or own table)
    /// becomes the file's `[agent]`, before secrets and checks.
    pub(super) fn choose_single_agent(&mut self) -> Result<(), String> {
        if self.bot_tables.is_empty() && self.telegram.agent.is_some() {
            self.agent = self
                .chosen_agent(&self.telegram)
                .map_err(|message| format!("telegram.{message}"))?;
            self.telegram.agent = None;
        }
        Ok(())
    }

    /// The agent a bot's table chooses.
    fn chosen_agent(&self, telegram: &TelegramConfig) -> Result<AgentConfig, String> {
        match &telegram.agent {
            None => Ok(self.agent.clone()),
            Some(AgentChoice::Own(agent)) => Ok((**agent).clone()),
            Some(AgentChoice::Shared(name)) => self.agents.get(name).cloned().ok_or_else(|| {
                let known: Vec<&str> = self.agents.keys().map(String::as_str).collect();
                format!(
                    "agent = {name:?} names no [agents.{name}] table (there are: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            }),
        }
    }

    /// Every `[[bots]]` table as a [`BotConfig`]: its secrets resolved
    /// (inline, `token_file`, or the systemd credential
    /// `telegram_bot_token_<name>`; never `TELEGRAM_BOT_TOKEN`), its
    /// configuration validated like a one-bot file (errors name the bot),
    /// then the rules between bots.
    pub(super) fn expand_bots(
        &self,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<BotConfig>, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let several = self.bot_tables.len() > 1;
        let mut bots = Vec::with_capacity(self.bot_tables.len());
        for (index, table) in self.bot_tables.iter().enumerate() {
            let name = bot_name(index, table).map_err(invalid)?;
            let in_bot = |message: String| invalid(format!("[[bots]] {name:?}: {message}"));
            let mut view = self.clone();
            view.agent = self.chosen_agent(table).map_err(in_bot)?;
            view.telegram = table.clone();
            view.telegram.agent = None;
            default_webhook_path(&mut view.telegram, &name);
            view.resolve_bot_secrets(&name, env).map_err(in_bot)?;
            view.validate(path, Purpose::Telegram)
                .map_err(|error| match error {
                    ConfigError::Invalid { message, .. } => in_bot(message),
                    other => other,
                })?;
            let bot = view.single_bot().map_err(in_bot)?;
            if several {
                view.separate_directories(bot.id);
            }
            bots.push(BotConfig {
                name,
                own: Some(Box::new(view)),
                ..bot
            });
        }
        check_between_bots(&bots).map_err(invalid)?;
        Ok(bots)
    }

    /// A bot's token and webhook secret from its own table: inline, a
    /// file, or its systemd credential.
    fn resolve_bot_secrets(
        &mut self,
        name: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        use crate::secrets::SecretSources;
        let telegram = &mut self.telegram;
        let credential = format!("telegram_bot_token_{name}");
        telegram.token = SecretSources {
            key: "token",
            inline: telegram.token.take(),
            file_key: "token_file",
            file: telegram.token_file.as_deref(),
            credential: &credential,
            env_var: None,
        }
        .resolve(env)?;
        if let Some(webhook) = telegram.webhook.as_mut() {
            let credential = format!("telegram_webhook_secret_{name}");
            webhook.secret_token = SecretSources {
                key: "webhook.secret_token",
                inline: webhook.secret_token.take(),
                file_key: "webhook.secret_token_file",
                file: webhook.secret_token_file.as_deref(),
                credential: &credential,
                env_var: None,
            }
            .resolve(env)?;
        }
        // The bot's own agent table may name its own API key.
        self.resolve_agent_secrets(env)
    }

    /// Among several bots: what this bot keeps in files goes to
    /// `<data_dir>/bots/<id>` (the database stays in `data_dir`, opened
    /// once for all), and a worktree root gets a folder per bot.
    fn separate_directories(&mut self, id: BotId) {
        let own = self.store.data_dir.join("bots").join(id.to_string());
        self.store.data_dir = own;
        let folder = id.to_string();
        if let Some(worktree) = self
            .agent
            .command_mut()
            .and_then(|command| command.worktree.as_mut())
        {
            worktree.root = worktree.root.join(&folder);
        }
        if let Some(worktree) = self.agent.acp_mut().and_then(|acp| acp.worktree.as_mut()) {
            worktree.root = worktree.root.join(&folder);
        }
    }
}

/// A `[[bots]]` table's name: present, and usable as a path segment and a
/// label.
fn bot_name(index: usize, table: &TelegramConfig) -> Result<String, String> {
    let Some(name) = &table.name else {
        return Err(format!(
            "bots[{index}].name is missing: every [[bots]] table needs a name"
        ));
    };
    let fits = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !fits {
        return Err(format!(
            "bots[{index}].name {name:?} must be 1 to 32 characters of A-Z, a-z, 0-9, '_' and '-' \
             (it names the bot's webhook path and its metrics)"
        ));
    }
    Ok(name.clone())
}

/// A `[[bots]]` webhook without a path posts to `/<name>`.
fn default_webhook_path(telegram: &mut TelegramConfig, name: &str) {
    if let Some(webhook) = telegram.webhook.as_mut() {
        if matches!(webhook.public_url.path(), "" | "/") {
            webhook.public_url.set_path(&format!("/{name}"));
        }
    }
}

/// Names and tokens are one per bot; webhooks sharing a listener address
/// have paths of their own.
fn check_between_bots(bots: &[BotConfig]) -> Result<(), String> {
    let mut names = HashSet::new();
    let mut ids = HashSet::new();
    let mut routes = HashSet::new();
    for bot in bots {
        if !names.insert(bot.name.as_str()) {
            return Err(format!(
                "bots: two [[bots]] tables are named {:?}",
                bot.name
            ));
        }
        if !ids.insert(bot.id) {
            return Err(format!(
                "bots: {:?} has the token of another [[bots]] table (bot {}); \
                 one process runs a bot once",
                bot.name, bot.id
            ));
        }
        let Some(config) = &bot.own else { continue };
        if let Updates::Webhook(webhook) = &config.telegram.updates {
            if !routes.insert((webhook.listen, webhook.path.clone())) {
                return Err(format!(
                    "bots: {:?} posts to {} on {}, like another bot: give each bot its own path",
                    bot.name, webhook.path, webhook.listen
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
