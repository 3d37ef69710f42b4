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
    pub listen: String,
    /// The public HTTPS URL Telegram posts to (ends with the path).
    pub public_url: String,
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
    /// The bot token (or `token_file`, the systemd credential
    /// `telegram_bot_token`, or `TELEGRAM_BOT_TOKEN`).
    pub token: Option<Secret>,
    /// A file holding the bot token (instead of `token`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The Bot API root URL.
    #[serde(default = "default_api_url")]
    pub api_url: String,
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
    pub mode: UpdateMode,
    /// `[telegram.webhook]`, for `mode = "webhook"`.
    pub webhook: Option<WebhookConfig>,
    /// What forum topics are: `off`, `per-topic` (each its own session,
    /// the default) or `auto` (also /new and the General topic create one).
    #[serde(default)]
    pub topics: crate::vocab::TopicsMode,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        TelegramConfig {
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
            topics: crate::vocab::TopicsMode::default(),
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

/// `[agent]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The backend.
    #[serde(default)]
    pub backend: Backend,
    /// `[agent.echo]`.
    #[serde(default)]
    pub echo: EchoConfig,
    /// `[agent.command]`, for `backend = "command"`.
    pub command: Option<crate::agent::CommandConfig>,
    /// `[agent.openai]`, for `backend = "openai"`.
    pub openai: Option<crate::agent::OpenAiConfig>,
    /// `[agent.acp]`, for `backend = "acp"`.
    pub acp: Option<crate::agent::AcpConfig>,
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
pub(super) fn default_api_url() -> String {
    "https://api.telegram.org".to_string()
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
