//! The tables of the configuration file (`[telegram]`, `[sessions]`,
//! `[delivery]`, `[store]`, `[agent]`, `[log]`, …) and their defaults: the
//! schema only. Loading, environment overrides and validation live in the
//! parent module.

use crate::adapter::BusyMode;
use crate::secrets::Secret;
use serde::Deserialize;
use std::path::PathBuf;

/// `[tools]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsConfig {
    /// `[tools.terminal]`: shell commands and background processes.
    #[serde(default)]
    pub terminal: crate::tools::TerminalConfig,
    /// `[[tools.mcp]]`: MCP servers whose tools the model may call.
    #[serde(default)]
    pub mcp: Vec<crate::tools::mcp::McpServerConfig>,
}

/// `[store]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// Directory of the SQLite database (created on first run).
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Keep everything in memory only (lost on restart): for trials and tests.
    #[serde(default)]
    pub in_memory: bool,
    /// Days a finished inbox row (answered, failed, dropped) is kept before
    /// it is pruned (transcripts are never pruned).
    #[serde(default = "default_inbox_retention_days")]
    pub inbox_retention_days: u64,
    /// `normal` (survives a crash of telegate) or `full` (also a power loss).
    #[serde(default)]
    pub synchronous: crate::store::Synchronous,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            data_dir: default_data_dir(),
            in_memory: false,
            inbox_retention_days: default_inbox_retention_days(),
            synchronous: crate::store::Synchronous::default(),
        }
    }
}

impl StoreSettings {
    /// The database file.
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("telegate.db")
    }
}

pub(super) fn default_inbox_retention_days() -> u64 {
    7
}

/// The longest `inbox_retention_days` accepted (ten years).
pub(super) const MAX_INBOX_RETENTION_DAYS: u64 = 3650;

pub(super) fn default_data_dir() -> PathBuf {
    PathBuf::from("telegate-data")
}

/// `[delivery]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliverySettings {
    /// Minimum milliseconds between two messages (or edits) in one chat.
    #[serde(default = "default_per_chat_interval_ms")]
    pub per_chat_interval_ms: u64,
    /// Messages per minute allowed in one group.
    #[serde(default = "default_group_per_minute")]
    pub group_messages_per_minute: u32,
    /// Requests per second allowed across all chats.
    #[serde(default = "default_global_per_second")]
    pub global_messages_per_second: u32,
    /// Milliseconds between two streaming edits of a reply.
    #[serde(default = "default_edit_interval_ms")]
    pub edit_interval_ms: u64,
    /// Milliseconds between two "typing…" refreshes.
    #[serde(default = "default_typing_interval_ms")]
    pub typing_interval_ms: u64,
    /// Milliseconds a task runs before "typing…" is first shown (a task
    /// answered sooner shows none and costs no chat action).
    #[serde(default = "default_typing_delay_ms")]
    pub typing_delay_ms: u64,
    /// A `retry_after` longer than this many seconds is logged as a warning
    /// (the message is still delivered after the wait).
    #[serde(default = "default_max_retry_wait_secs")]
    pub max_retry_wait_secs: u64,
    /// Show each message's status as a reaction on it (👌 queued, 👀
    /// working, 👍 answered, 👎 failed).
    #[serde(default)]
    pub reactions: bool,
    /// How a running turn's partial answer is shown: `auto` (default:
    /// drafts in private chats, edits elsewhere or where drafts are
    /// refused), `draft`, or `edit` (a preview message edited in place).
    #[serde(default)]
    pub streaming: crate::delivery::draft::StreamingMode,
    /// Messages one answer may take (each up to 4096 characters); a
    /// longer answer's whole text follows them as a file, `answer.md`.
    #[serde(default = "default_max_answer_parts")]
    pub max_answer_parts: usize,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        DeliverySettings {
            per_chat_interval_ms: default_per_chat_interval_ms(),
            group_messages_per_minute: default_group_per_minute(),
            global_messages_per_second: default_global_per_second(),
            edit_interval_ms: default_edit_interval_ms(),
            typing_interval_ms: default_typing_interval_ms(),
            typing_delay_ms: default_typing_delay_ms(),
            max_retry_wait_secs: default_max_retry_wait_secs(),
            reactions: false,
            streaming: crate::delivery::draft::StreamingMode::default(),
            max_answer_parts: default_max_answer_parts(),
        }
    }
}

pub(super) fn default_per_chat_interval_ms() -> u64 {
    1000
}
pub(super) fn default_group_per_minute() -> u32 {
    20
}
pub(super) fn default_global_per_second() -> u32 {
    30
}
pub(super) fn default_edit_interval_ms() -> u64 {
    1000
}
pub(super) fn default_typing_interval_ms() -> u64 {
    4000
}
pub(super) fn default_typing_delay_ms() -> u64 {
    300
}
pub(super) fn default_max_retry_wait_secs() -> u64 {
    60
}
/// The most messages an answer may be configured to take: at Telegram's
/// pace of about one message a second per chat, more would hold the chat
/// for minutes.
pub(super) const MAX_ANSWER_PARTS: usize = 100;
pub(super) fn default_max_answer_parts() -> usize {
    crate::delivery::telegram::DEFAULT_MAX_ANSWER_PARTS
}

/// `[telegram.webhook]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Address the webhook server listens on, e.g. `0.0.0.0:8443`.
    #[serde(deserialize_with = "listen_address")]
    pub listen: std::net::SocketAddr,
    /// The public HTTPS URL Telegram posts to (ends with the path).
    #[serde(deserialize_with = "public_url")]
    pub public_url: url::Url,
    /// The secret Telegram sends in `X-Telegram-Bot-Api-Secret-Token`.
    /// Required (or `secret_token_file`, the systemd credential
    /// `telegram_webhook_secret`, or `TELEGRAM_WEBHOOK_SECRET`).
    pub secret_token: Option<Secret>,
    /// A file holding the webhook secret (instead of `secret_token`).
    #[serde(default)]
    pub secret_token_file: Option<PathBuf>,
    /// Simultaneous HTTPS connections Telegram may open (1-100).
    #[serde(default = "default_webhook_max_connections")]
    pub max_connections: u8,
    /// Connections the listener serves at once (at least
    /// `max_connections`); more are closed at once.
    #[serde(default = "default_webhook_connection_limit")]
    pub connection_limit: usize,
    /// Seconds a request's head may take to arrive.
    #[serde(default = "default_listener_timeout_secs")]
    pub header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive.
    #[serde(default = "default_listener_timeout_secs")]
    pub body_timeout_secs: u64,
}

impl WebhookConfig {
    /// The listener's connection cap and read deadlines, as written.
    pub fn limit_settings(&self) -> crate::listener::LimitSettings {
        crate::listener::LimitSettings {
            connection_limit: self.connection_limit,
            header_timeout_secs: self.header_timeout_secs,
            body_timeout_secs: self.body_timeout_secs,
        }
    }

    /// The listener's connection cap and read deadlines.
    pub fn limits(&self) -> crate::listener::ListenerLimits {
        crate::listener::ListenerLimits::from_settings(&self.limit_settings())
    }
}

pub(super) fn default_webhook_connection_limit() -> usize {
    256
}
pub(super) fn default_listener_timeout_secs() -> u64 {
    10
}

pub(super) fn default_webhook_max_connections() -> u8 {
    40
}

/// How updates arrive from Telegram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateMode {
    /// Long polling (`getUpdates`).
    #[default]
    Polling,
    /// Telegram POSTs updates to a webhook.
    Webhook,
}

/// `[telegram]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramConfig {
    /// The bot's name: its label in logs, `/metrics` and `/healthz`, and
    /// (`[[bots]]` in webhook mode) its webhook path `/<name>`. Required
    /// in `[[bots]]`; optional in `[telegram]`.
    #[serde(default)]
    pub name: Option<String>,
    /// Which agent answers this bot: `"NAME"` for `[agents.NAME]`, or its
    /// own `[bots.agent]` table; absent, `[agent]`.
    #[serde(default)]
    pub(crate) agent: Option<AgentChoice>,
    /// The bot token (or `token_file`, the systemd credential
    /// `telegram_bot_token`, or `TELEGRAM_BOT_TOKEN`).
    pub token: Option<Secret>,
    /// A file holding the bot token (instead of `token`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The Bot API root URL (http or https, checked when the file is read).
    #[serde(default = "default_api_url", deserialize_with = "api_url")]
    pub api_url: url::Url,
    /// The Bot API server at `api_url` runs on this machine with
    /// `--local`: files it names by an absolute path are read from disk.
    /// Off, such a path is refused.
    #[serde(default)]
    pub local_bot_api: bool,
    /// User ids allowed to talk to the bot.
    #[serde(default)]
    pub allowed_users: Vec<u64>,
    /// Chat ids where anyone may talk to the bot (optional).
    #[serde(default)]
    pub allowed_chats: Vec<i64>,
    /// Users who may approve or deny any turn's dangerous command and press
    /// any Stop button (besides the user whose message started the turn).
    #[serde(default)]
    pub approvers: Vec<u64>,
    /// Let everyone use the bot. Required when both allowlists are empty.
    #[serde(default)]
    pub allow_all_users: bool,
    /// In groups, answer only when mentioned, replied to, or commanded.
    #[serde(default = "yes")]
    pub require_mention: bool,
    /// `polling` or `webhook`.
    #[serde(default)]
    pub(crate) mode: UpdateMode,
    /// `[telegram.webhook]`, for `mode = "webhook"`.
    pub(crate) webhook: Option<WebhookConfig>,
    /// What forum topics are: `off`, `per-topic` (each its own session,
    /// the default) or `auto` (also /new and the General topic create one).
    #[serde(default)]
    pub topics: crate::vocab::TopicsMode,
    /// Under `topics = "auto"`: topics one user may have made in any
    /// minute; a message over it runs where it was written (0: no cap).
    #[serde(default = "default_topics_per_user")]
    pub topics_per_user_per_minute: u32,
    /// Under `topics = "auto"`: topics one group may have made in any
    /// minute (0: no cap).
    #[serde(default = "default_topics_per_group")]
    pub topics_per_group_per_minute: u32,
    /// How updates arrive, built from `mode` and `[telegram.webhook]` once
    /// secrets are resolved and checked (what everything after loading
    /// reads: never `mode` and `webhook` themselves).
    #[serde(skip)]
    pub updates: Updates,
}

/// How updates arrive from Telegram, as loaded: polling, or a webhook with
/// everything it needs already parsed.
#[derive(Clone, Debug, Default)]
pub enum Updates {
    /// Long polling (`getUpdates`).
    #[default]
    Polling,
    /// Telegram posts updates to our listener.
    Webhook(Box<Webhook>),
}

/// A webhook as loaded: address, public URL, path and secret parsed and
/// present, limits checked.
#[derive(Clone, Debug)]
pub struct Webhook {
    /// Where the listener binds.
    pub listen: std::net::SocketAddr,
    /// The public URL Telegram posts to.
    pub public_url: url::Url,
    /// The path of `public_url` (`/` when it has none): the only one served.
    pub path: String,
    /// The secret Telegram sends with every post.
    pub secret: Secret,
    /// Simultaneous connections Telegram may open (1-100).
    pub max_connections: u8,
    /// The listener's connection cap and read deadlines.
    pub limits: crate::listener::ListenerLimits,
}

/// `telegram.api_url`: an http(s) URL with a host.
fn api_url<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<url::Url, D::Error> {
    let text = String::deserialize(deserializer)?;
    crate::vocab::check_http_url("telegram.api_url", &text).map_err(serde::de::Error::custom)?;
    url::Url::parse(&text).map_err(serde::de::Error::custom)
}

/// `telegram.webhook.listen`: an address to bind.
fn listen_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<std::net::SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "telegram.webhook.listen {text:?} is not an address like 0.0.0.0:8443"
        ))
    })
}

/// `telegram.webhook.public_url`: a URL.
fn public_url<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<url::Url, D::Error> {
    let text = String::deserialize(deserializer)?;
    url::Url::parse(&text).map_err(|_| {
        serde::de::Error::custom(format!("telegram.webhook.public_url {text:?} is not a URL"))
    })
}

impl Default for TelegramConfig {
    fn default() -> Self {
        TelegramConfig {
            name: None,
            agent: None,
            token: None,
            token_file: None,
            api_url: default_api_url(),
            local_bot_api: false,
            allowed_users: Vec::new(),
            allowed_chats: Vec::new(),
            approvers: Vec::new(),
            allow_all_users: false,
            require_mention: true,
            mode: UpdateMode::Polling,
            webhook: None,
            updates: Updates::Polling,
            topics: crate::vocab::TopicsMode::default(),
            topics_per_user_per_minute: default_topics_per_user(),
            topics_per_group_per_minute: default_topics_per_group(),
        }
    }
}

fn default_topics_per_user() -> u32 {
    crate::transport::telegram::topic_quota::DEFAULT_TOPICS_PER_USER_PER_MINUTE
}

fn default_topics_per_group() -> u32 {
    crate::transport::telegram::topic_quota::DEFAULT_TOPICS_PER_GROUP_PER_MINUTE
}

impl TelegramConfig {
    /// The caps on topics made per minute (`topics = "auto"`).
    pub fn topic_caps(&self) -> crate::transport::telegram::topic_quota::TopicCaps {
        crate::transport::telegram::topic_quota::TopicCaps {
            per_user: self.topics_per_user_per_minute,
            per_group: self.topics_per_group_per_minute,
        }
    }
}

/// `[sessions]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsConfig {
    /// `interrupt` or `queue`.
    #[serde(default)]
    pub busy_mode: BusyMode,
    /// Follow-ups that may wait per chat.
    #[serde(default = "default_max_pending")]
    pub max_pending: usize,
    /// Seconds between two "Queued…"/"Interrupting…" notices in one chat.
    #[serde(default = "default_ack_interval_secs")]
    pub ack_interval_secs: u64,
    /// Seconds without progress after which a turn is cancelled (0: never).
    #[serde(default = "default_stall_timeout_secs")]
    pub stall_timeout_secs: u64,
    /// Milliseconds /stop waits for a cancelled task before aborting it.
    #[serde(default = "default_cancel_wait_ms")]
    pub cancel_wait_ms: u64,
    /// Separate sessions per user in groups.
    #[serde(default = "yes")]
    pub group_sessions_per_user: bool,
    /// Earlier transcript entries given to each turn (the backend may trim
    /// further to its own budget).
    #[serde(default = "default_history_max_messages")]
    pub history_max_messages: usize,
    /// After a restart, run again a message whose turn was cut short by the
    /// restart (otherwise its sender is asked to resend it).
    #[serde(default = "yes")]
    pub resume_interrupted: bool,
    /// Seconds running turns get to finish on SIGINT/SIGTERM before they are
    /// cancelled (and resumed on the next start).
    #[serde(default = "default_shutdown_grace_secs")]
    pub shutdown_grace_secs: u64,
}

pub(super) fn default_shutdown_grace_secs() -> u64 {
    10
}

pub(super) fn default_history_max_messages() -> usize {
    200
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            busy_mode: BusyMode::Interrupt,
            max_pending: default_max_pending(),
            ack_interval_secs: default_ack_interval_secs(),
            stall_timeout_secs: default_stall_timeout_secs(),
            cancel_wait_ms: default_cancel_wait_ms(),
            group_sessions_per_user: true,
            history_max_messages: default_history_max_messages(),
            resume_interrupted: true,
            shutdown_grace_secs: default_shutdown_grace_secs(),
        }
    }
}

/// Which agent backend answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Echoes messages back (for trying telegate out).
    #[default]
    Echo,
    /// Runs a command-line program per turn (`[agent.command]`).
    Command,
    /// Any OpenAI-compatible chat-completions server (`[agent.openai]`).
    Openai,
    /// An Agent Client Protocol agent kept running per chat (`[agent.acp]`).
    Acp,
}

impl Backend {
    /// The backend's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Echo => "echo",
            Backend::Command => "command",
            Backend::Openai => "openai",
            Backend::Acp => "acp",
        }
    }
}

/// `[agent]` as loaded: the backend together with its own table, so a
/// backend without its settings cannot be represented (checked once, when
/// the file is read, with the file's line and column).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(try_from = "AgentTable")]
pub struct AgentConfig {
    /// The backend and its settings.
    pub backend: AgentBackend,
    /// The tables of the backends not chosen: never used, but checked like
    /// the chosen one (so switching backends never reveals an old typo),
    /// and an API key variable they name stays a secret no child inherits.
    pub(crate) inactive: Vec<AgentBackend>,
}

/// Which agent backend answers, with its settings.
#[derive(Clone, Debug)]
pub enum AgentBackend {
    /// Echoes messages back (`[agent.echo]`).
    Echo(EchoConfig),
    /// A command-line program per turn (`[agent.command]`).
    Command(crate::agent::CommandConfig),
    /// An OpenAI-compatible server (`[agent.openai]`).
    Openai(crate::agent::OpenAiConfig),
    /// An Agent Client Protocol agent (`[agent.acp]`).
    Acp(crate::agent::AcpConfig),
}

impl Default for AgentBackend {
    fn default() -> Self {
        AgentBackend::Echo(EchoConfig::default())
    }
}

impl AgentBackend {
    /// Which backend this is.
    pub fn kind(&self) -> Backend {
        match self {
            AgentBackend::Echo(_) => Backend::Echo,
            AgentBackend::Command(_) => Backend::Command,
            AgentBackend::Openai(_) => Backend::Openai,
            AgentBackend::Acp(_) => Backend::Acp,
        }
    }
}

impl AgentConfig {
    /// Which backend this is.
    pub fn kind(&self) -> Backend {
        self.backend.kind()
    }

    /// The chosen backend's table, then the others the file has (for the
    /// checks that hold for every table written).
    pub(crate) fn tables(&self) -> impl Iterator<Item = &AgentBackend> {
        std::iter::once(&self.backend).chain(&self.inactive)
    }

    /// The environment variables that hold the agent's secrets (the API
    /// key an `[agent.openai]` table names, chosen or not), which no child
    /// may inherit.
    pub fn secret_env_names(&self) -> impl Iterator<Item = &str> {
        self.tables().filter_map(|table| match table {
            AgentBackend::Openai(openai) => Some(openai.api_key_env.as_str()),
            _ => None,
        })
    }

    /// `[agent.command]`, when that is the backend.
    pub fn command(&self) -> Option<&crate::agent::CommandConfig> {
        match &self.backend {
            AgentBackend::Command(command) => Some(command),
            _ => None,
        }
    }

    /// `[agent.command]` to change, when that is the backend.
    pub fn command_mut(&mut self) -> Option<&mut crate::agent::CommandConfig> {
        match &mut self.backend {
            AgentBackend::Command(command) => Some(command),
            _ => None,
        }
    }

    /// `[agent.openai]`, when that is the backend.
    pub fn openai(&self) -> Option<&crate::agent::OpenAiConfig> {
        match &self.backend {
            AgentBackend::Openai(openai) => Some(openai),
            _ => None,
        }
    }

    /// `[agent.openai]` to change, when that is the backend.
    pub fn openai_mut(&mut self) -> Option<&mut crate::agent::OpenAiConfig> {
        match &mut self.backend {
            AgentBackend::Openai(openai) => Some(openai),
            _ => None,
        }
    }

    /// `[agent.acp]`, when that is the backend.
    pub fn acp(&self) -> Option<&crate::agent::AcpConfig> {
        match &self.backend {
            AgentBackend::Acp(acp) => Some(acp),
            _ => None,
        }
    }

    /// `[agent.acp]` to change, when that is the backend.
    pub fn acp_mut(&mut self) -> Option<&mut crate::agent::AcpConfig> {
        match &mut self.backend {
            AgentBackend::Acp(acp) => Some(acp),
            _ => None,
        }
    }
}

/// `[agent]` as written: the backend's name and any of the tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentTable {
    #[serde(default)]
    backend: Backend,
    #[serde(default)]
    echo: EchoConfig,
    command: Option<crate::agent::CommandConfig>,
    openai: Option<crate::agent::OpenAiConfig>,
    acp: Option<crate::agent::AcpConfig>,
}

impl TryFrom<AgentTable> for AgentConfig {
    type Error = String;

    fn try_from(table: AgentTable) -> Result<AgentConfig, String> {
        let AgentTable {
            backend,
            echo,
            command,
            openai,
            acp,
        } = table;
        let mut tables: Vec<AgentBackend> = [
            Some(AgentBackend::Echo(echo)),
            command.map(AgentBackend::Command),
            openai.map(AgentBackend::Openai),
            acp.map(AgentBackend::Acp),
        ]
        .into_iter()
        .flatten()
        .collect();
        let chosen = tables
            .iter()
            .position(|table| table.kind() == backend)
            .ok_or(match backend {
                Backend::Echo => "agent.backend = \"echo\" needs no table",
                Backend::Command => {
                    "agent.backend = \"command\" needs an [agent.command] table with argv"
                }
                Backend::Openai => {
                    "agent.backend = \"openai\" needs an [agent.openai] table with at least model"
                }
                Backend::Acp => {
                    "agent.backend = \"acp\" needs an [agent.acp] table with preset or program"
                }
            })?;
        let backend = tables.remove(chosen);
        Ok(AgentConfig {
            backend,
            inactive: tables,
        })
    }
}

/// `[agent.echo]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EchoConfig {
    /// Milliseconds an echo takes (streamed word by word).
    #[serde(default)]
    pub delay_ms: u64,
}

/// `[console]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// The chat id the console pretends to be.
    #[serde(default = "default_console_chat")]
    pub chat_id: i64,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            chat_id: default_console_chat(),
        }
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. `info` or `telegate=debug,info`.
    #[serde(default = "default_log_level")]
    pub level: String,
    /// `text` or `json`.
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: default_log_level(),
            format: LogFormat::Text,
        }
    }
}

pub(super) fn yes() -> bool {
    true
}
pub(super) fn default_api_url() -> url::Url {
    url::Url::parse("https://api.telegram.org").expect("a constant URL")
}
pub(super) fn default_max_pending() -> usize {
    20
}
pub(super) fn default_ack_interval_secs() -> u64 {
    3
}
pub(super) fn default_stall_timeout_secs() -> u64 {
    300
}
pub(super) fn default_cancel_wait_ms() -> u64 {
    2000
}
pub(super) fn default_console_chat() -> i64 {
    1
}
pub(super) fn default_log_level() -> String {
    "info".to_string()
}

/// Which agent a bot uses: one of `[agents.NAME]`, or its own table.
#[derive(Clone, Debug)]
pub enum AgentChoice {
    /// `agent = "NAME"`: the shared `[agents.NAME]`.
    Shared(String),
    /// `[bots.agent]`: the bot's own agent table.
    Own(Box<AgentConfig>),
}

impl<'de> Deserialize<'de> for AgentChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoiceVisitor;
        impl<'de> serde::de::Visitor<'de> for ChoiceVisitor {
            type Value = AgentChoice;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the name of an [agents.NAME] table, or an agent table")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<AgentChoice, E> {
                Ok(AgentChoice::Shared(name.to_string()))
            }

            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                map: M,
            ) -> Result<AgentChoice, M::Error> {
                let table =
                    AgentConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(AgentChoice::Own(Box::new(table)))
            }
        }
        deserializer.deserialize_any(ChoiceVisitor)
    }
}
