//! A bot with the terminal tool, end to end: the real teloxide dispatcher
//! against the fake Bot API, the real openai backend against the fake
//! OpenAI server (scripted per request with `push_when`), the real adapter,
//! runner, process registry and approval gate.

use std::path::PathBuf;
use std::time::Duration;

use telegate::store::TranscriptEntry;
use telegate::tools::process::{ProcessRecord, ProcessRegistry, Scope};
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::{KeyPolicy, Platform, SessionId, SessionKey, SessionSource};
use tempfile::TempDir;

use super::fake_bot::FakeBotApi;
use super::fake_openai::FakeOpenAi;
use super::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};

/// How long any expected thing may take.
pub const WAIT: Duration = Duration::from_secs(10);
/// The two private chats (chat id = user id).
pub const CHAT_A: i64 = 42;
pub const CHAT_B: i64 = 43;

pub struct ToolsBot {
    pub fake: FakeBotApi,
    pub llm: FakeOpenAi,
    pub bot: TelegramBot,
    pub workdir: TempDir,
}

impl ToolsBot {
    /// Start with `[tools.terminal] enabled = true`, the workdir a fresh
    /// temporary directory, and `terminal_extra` added to that table.
    pub async fn start(terminal_extra: &str) -> ToolsBot {
        ToolsBot::start_with("", "", terminal_extra).await
    }

    /// Like [`ToolsBot::start`], with `telegram_extra` added to `[telegram]`
    /// and `sessions_extra` as the `[sessions]` table.
    pub async fn start_with(
        telegram_extra: &str,
        sessions_extra: &str,
        terminal_extra: &str,
    ) -> ToolsBot {
        let fake = FakeBotApi::start().await;
        let llm = FakeOpenAi::start().await;
        let workdir = tempfile::tempdir().expect("temporary workdir");
        let bot = TestBot::new(&fake)
            .users(&[CHAT_A, CHAT_B])
            .toml(format!("[telegram]\n{telegram_extra}"))
            .toml(format!("[sessions]\n{sessions_extra}"))
            .toml(FAST_DELIVERY)
            .toml(FAST_GROUPS)
            .toml(format!(
                "[store]\nin_memory = true\n\n\
                 [agent]\nbackend = \"openai\"\n\n\
                 [agent.openai]\nbase_url = \"{llm}\"\nmodel = \"fake\"\napi_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n\n\
                 [tools.terminal]\nenabled = true\nworkdir = \"{workdir}\"\n{terminal_extra}\n",
                llm = llm.base_url(),
                workdir = workdir.path().display(),
            ))
            .start()
            .await
            .expect("bot starts against the fakes");
        ToolsBot {
            fake,
            llm,
            bot,
            workdir,
        }
    }

    /// A user writes `text` in private chat `chat`.
    pub fn send(&self, chat: i64, text: &str) {
        self.fake.push_text(chat, chat, text);
    }

    /// The visible texts of the bot's messages in `chat`, oldest first.
    pub fn texts(&self, chat: i64) -> Vec<String> {
        self.fake.sent_texts(chat)
    }

    /// Wait until a bot message in `chat` contains `needle`.
    pub async fn wait_text(&self, chat: i64, needle: &str) -> bool {
        self.fake
            .wait_for(
                |_| self.texts(chat).iter().any(|t| t.contains(needle)),
                WAIT,
            )
            .await
    }

    /// Index of the first bot message in `chat` containing `needle`.
    pub fn position(&self, chat: i64, needle: &str) -> Option<usize> {
        self.texts(chat).iter().position(|t| t.contains(needle))
    }

    pub fn key(chat: i64) -> SessionKey {
        SessionKey::for_source(
            &SessionSource::dm(Platform::Telegram, chat),
            KeyPolicy::default(),
        )
    }

    pub fn registry(&self) -> &ProcessRegistry {
        self.bot
            .engine
            .runner
            .tools()
            .expect("the terminal tool is enabled")
            .registry()
    }

    /// The processes of `chat`.
    pub fn processes(&self, chat: i64) -> Vec<ProcessRecord> {
        self.registry().list(Scope::Chat(&Self::key(chat)))
    }

    pub fn session(&self, chat: i64) -> Option<SessionId> {
        self.bot.engine.runner.current_session(&Self::key(chat))
    }

    /// The stored transcript of `session`.
    pub async fn transcript(&self, session: &SessionId) -> Vec<TranscriptEntry> {
        self.bot
            .engine
            .runner
            .store()
            .expect("a store")
            .transcripts
            .load_history(session.as_str(), None)
            .await
            .expect("the store answers")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.workdir.path().join(name)
    }

    /// Wait until `cond` holds (polling; for state outside the fakes).
    pub async fn until(&self, cond: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            if cond() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cond()
    }

    /// Wait until the chat's slot is idle with nothing queued.
    pub async fn settled(&self, chat: i64) -> bool {
        let key = Self::key(chat);
        let adapter = &self.bot.engine.adapter;
        self.until(|| !adapter.is_active(&key) && adapter.pending_len(&key) == 0)
            .await
    }

    pub async fn shutdown(self) {
        self.bot.shutdown().await;
    }
}

/// Pids in process group `pgid` that are not zombies, read from /proc
/// independently of the code under test.
pub fn live_group_members(pgid: i32) -> Vec<u32> {
    let mut members = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return members;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(after_name) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let (state, group) = (fields.first().copied(), fields.get(2).copied());
        if group == Some(pgid.to_string().as_str()) && !matches!(state, Some("Z" | "X")) {
            members.push(pid);
        }
    }
    members
}
