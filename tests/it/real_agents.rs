//! The real agents, by script (`scripts/real-agents.sh`, never in CI: they
//! need the npm packages it installs). Each test is `#[ignore]`d and reads
//! `TELEGATE_REAL_BIN`, the `node_modules/.bin` directory of the script's
//! cache. Everything else is fake and on 127.0.0.1: the Bot API and the
//! model APIs behind each agent ([`FakeAgentApis`]: Anthropic Messages
//! for Claude Code, Responses for Codex, chat completions for OpenCode,
//! the Gemini API for Gemini CLI).
//!
//! Each test runs one agent as a user would, through the `acp` backend
//! (the ACP adapters of Claude Code and Codex, `gemini --acp`,
//! `opencode acp`) or the `command` backend's presets (the `claude` and
//! `codex` CLIs): an answer; a restart of telegate that continues the
//! conversation (the model is sent the first message again) or says it
//! starts fresh; /stop while the model is slow, told at once, with the
//! turn's processes gone within 5 s; the next answer; /new, after which
//! the model no longer sees the conversation; and, where the agent asks
//! permissions, a permission request answered by button.
//!
//! Every agent runs with `TELEGATE_REAL_ROW=<mark>` in its environment,
//! so its whole process tree (whatever it forks, daemons included) is
//! found by scanning `/proc/*/environ` ([`tree`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use telegate::transport::telegram::TelegramBot;

use crate::support;
use support::buttons::{buttons, message_text};
use support::fake_agent_apis::FakeAgentApis;
use support::fake_bot::FakeBotApi;
use support::test_bot::TestBot;

const WAIT: Duration = Duration::from_secs(120);
/// How long the turn's processes may outlive a /stop.
const STOP_LIMIT: Duration = Duration::from_secs(5);
const USER: i64 = 42;

fn bin(name: &str) -> PathBuf {
    let dir = std::env::var("TELEGATE_REAL_BIN")
        .or_else(|_| std::env::var("TELEGATE_REAL_ACP_BIN"))
        .expect("TELEGATE_REAL_BIN names node_modules/.bin (run scripts/real-agents.sh)");
    Path::new(&dir).join(name)
}

/// The pids and command lines of every process whose environment has
/// `TELEGATE_REAL_ROW=mark` (zombies have none).
fn tree(mark: &str) -> Vec<(i32, String)> {
    let needle = format!("TELEGATE_REAL_ROW={mark}");
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline.trim().chars().take(80).collect()));
        }
    }
    found
}

fn pids(processes: &[(i32, String)]) -> BTreeSet<i32> {
    processes.iter().map(|(pid, _)| *pid).collect()
}

/// Wait up to `limit` until none of `pids` is in the tree; how long it took.
async fn gone(mark: &str, pids_: &BTreeSet<i32>, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    loop {
        let left = pids(&tree(mark));
        if left.is_disjoint(pids_) {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            eprintln!("still running: {:?}", tree(mark));
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a row runs its agent.
enum Backend {
    /// `[agent] backend = "acp"`, this body in `[agent.acp]`.
    Acp(String),
    /// `[agent] backend = "command"`, this body in `[agent.command]`.
    Cli(String),
}

/// One agent under test.
struct Row {
    backend: Backend,
    /// What each of its answers contains.
    answer: &'static str,
    /// Its processes' `TELEGATE_REAL_ROW`.
    mark: String,
}

impl Row {
    fn new(backend: Backend, answer: &'static str, mark: &str) -> Row {
        Row {
            backend,
            answer,
            mark: mark.to_string(),
        }
    }

    fn test_bot(&self, fake: &FakeBotApi, data: &Path) -> TestBot {
        let agent = match &self.backend {
            Backend::Acp(body) => format!(
                "[agent]\nbackend = \"acp\"\n\n[agent.acp]\nstart_timeout_secs = 90\n{body}\n"
            ),
            Backend::Cli(body) => format!(
                "[agent]\nbackend = \"command\"\n\n[agent.command]\ntimeout_secs = 150\n{body}\n"
            ),
        };
        TestBot::new(fake).users(&[USER]).toml(format!(
            "[delivery]\nper_chat_interval_ms = 1\nedit_interval_ms = 50\nglobal_messages_per_second = 100000\nstreaming = \"edit\"\n\n\
             [sessions]\nstall_timeout_secs = 150\nshutdown_grace_secs = 2\n\n\
             {agent}\n\
             [store]\ndata_dir = \"{}\"\n",
            data.display()
        ))
    }

    fn is_acp(&self) -> bool {
        matches!(self.backend, Backend::Acp(_))
    }
}

/// A unique mark for this test's processes.
fn mark(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// Finished messages (no buttons left) containing `needle`.
fn answers(fake: &FakeBotApi, needle: &str) -> usize {
    fake.message_history(USER)
        .iter()
        .filter(|m| {
            let now = m.current();
            now.text.contains(needle) && now.reply_markup.is_none()
        })
        .count()
}

/// Say `text`; wait for one more finished answer containing `needle`.
async fn ask(fake: &FakeBotApi, api: &FakeAgentApis, text: &str, needle: &str) {
    let before = answers(fake, needle);
    fake.push_text(USER, USER, text);
    assert!(
        fake.wait_for(|_| answers(fake, needle) > before, WAIT)
            .await,
        "an answer to {text:?}: {:?} / the model was asked: {:?}",
        sent(fake),
        asked(api)
    );
}

fn sent(fake: &FakeBotApi) -> Vec<String> {
    fake.sent_texts(USER)
}

/// The model requests so far: path and the end of the body.
fn asked(api: &FakeAgentApis) -> Vec<String> {
    api.requests()
        .iter()
        .map(|r| {
            let body = r.body.to_string();
            let tail: String = body.chars().rev().take(160).collect();
            format!("{} …{}", r.path, tail.chars().rev().collect::<String>())
        })
        .collect()
}

/// Whether a model request carrying `now` also carried `earlier` (the
/// conversation went on); None if no request carried `now`.
fn saw_together(api: &FakeAgentApis, now: &str, earlier: &str) -> Option<bool> {
    let bodies: Vec<String> = api
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .filter(|b| b.contains(now))
        .collect();
    if bodies.is_empty() {
        return None;
    }
    Some(bodies.iter().any(|b| b.contains(earlier)))
}

/// Answer, restart, answer again (continued, or a fresh start said),
/// /stop while the model is slow, answer, /new: what every agent must do.
async fn answer_restart_stop_new(
    fake: &FakeBotApi,
    api: &FakeAgentApis,
    data: &Path,
    row: &Row,
) -> TelegramBot {
    let bot = row.test_bot(fake, data).start().await.unwrap();
    ask(fake, api, "hello one", row.answer).await;
    bot.shutdown().await;
    let left = pids(&tree(&row.mark));
    assert!(
        gone(&row.mark, &left, STOP_LIMIT).await.is_some(),
        "the agent's processes end with telegate"
    );

    let bot = row.test_bot(fake, data).start().await.unwrap();
    ask(fake, api, "hello two", row.answer).await;
    let said_fresh = sent(fake).iter().any(|t| {
        t.contains("cannot continue a conversation") || t.contains("could not be resumed")
    });
    let continued = saw_together(api, "hello two", "hello one") == Some(true);
    eprintln!(
        "after the restart: {}",
        match (continued, said_fresh) {
            (true, _) => "continued",
            (false, true) => "started fresh (said so)",
            (false, false) => "started fresh SILENTLY",
        }
    );
    assert!(
        continued || said_fresh,
        "a restart continues or says it starts fresh: {:?}",
        sent(fake)
    );

    stop_while_slow(fake, api, row).await;
    ask(fake, api, "hello three", row.answer).await;

    fake.push_text(USER, USER, "/new");
    assert!(
        fake.wait_for(
            |_| sent(fake)
                .iter()
                .any(|t| t.contains("Started a fresh session")),
            WAIT
        )
        .await,
        "{:?}",
        sent(fake)
    );
    ask(fake, api, "hello four", row.answer).await;
    assert_eq!(
        saw_together(api, "hello four", "hello three"),
        Some(false),
        "after /new the model no longer sees the conversation"
    );
    bot
}

/// /stop while the agent waits for the model: told at once, the turn's
/// processes (for a CLI: all of them; for an ACP agent: those started
/// for the turn, the agent itself stays) gone within [`STOP_LIMIT`].
async fn stop_while_slow(fake: &FakeBotApi, api: &FakeAgentApis, row: &Row) {
    let idle = pids(&tree(&row.mark));
    fake.push_text(USER, USER, "REAL-SLOW take your time");
    let slow_asked = || {
        api.requests()
            .iter()
            .any(|r| r.body.to_string().contains("REAL-SLOW"))
    };
    assert!(
        fake.wait_for(|_| slow_asked(), WAIT).await,
        "the agent asked the model: {:?}",
        sent(fake)
    );
    let busy = tree(&row.mark);
    assert!(!busy.is_empty(), "the agent runs with its mark");
    let turn: BTreeSet<i32> = if row.is_acp() {
        pids(&busy).difference(&idle).copied().collect()
    } else {
        pids(&busy)
    };
    let asked_at = Instant::now();
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(|_| sent(fake).iter().any(|t| t.contains("Stopped")), WAIT)
            .await,
        "{:?}",
        sent(fake)
    );
    let told = asked_at.elapsed();
    let took = gone(&row.mark, &turn, STOP_LIMIT).await;
    let kept = pids(&tree(&row.mark)).intersection(&idle).count();
    eprintln!(
        "stop: told after {} ms, {} processes of the turn gone after {} ms; {kept} of the agent kept",
        told.as_millis(),
        turn.len(),
        took.map_or("(not gone)".to_string(), |t| t.as_millis().to_string()),
    );
    assert!(told < STOP_LIMIT, "/stop is told within {STOP_LIMIT:?}");
    assert!(
        took.is_some(),
        "the turn's processes are gone within {STOP_LIMIT:?}: {busy:?}"
    );
}

/// `REAL-PERMISSION touch <marker>`: a card whose button `is_allow`
/// names, nothing run before the press, the command run after it, and
/// the agent's answer `finished`.
async fn permission_by_button(
    fake: &FakeBotApi,
    api: &FakeAgentApis,
    work: &Path,
    is_allow: impl Fn(&str) -> bool,
    finished: &str,
) {
    let marker = work.join("permitted");
    fake.push_text(
        USER,
        USER,
        &format!("REAL-PERMISSION touch {}", marker.display()),
    );
    let allow = |b: &(i64, String, String)| is_allow(&b.1);
    assert!(
        fake.wait_for(|_| buttons(fake, USER).iter().any(allow), WAIT)
            .await,
        "a permission card: {:?} / the model was asked: {:?}",
        sent(fake),
        asked(api)
    );
    let (card, label, data) = buttons(fake, USER).into_iter().find(allow).unwrap();
    eprintln!(
        "card: {} / pressing {label}",
        message_text(fake, USER, card).replace('\n', " ")
    );
    assert!(!marker.exists(), "nothing ran before the answer");
    fake.push_callback_query(USER, USER, card, &data);
    assert!(
        fake.wait_for(|_| answers(fake, finished) > 0, WAIT).await,
        "{:?} / the model was asked: {:?}",
        sent(fake),
        asked(api)
    );
    assert!(marker.exists(), "the agent ran the allowed command");
    eprintln!("permission: allowed by button, the command ran");
}

/// The environment Claude Code needs against the fake Messages API.
fn claude_env(api: &FakeAgentApis, home: &Path, mark: &str) -> String {
    format!(
        "env = {{ ANTHROPIC_BASE_URL = \"{}\", ANTHROPIC_API_KEY = \"sk-ant-fake\", HOME = \"{}\", \
         DISABLE_AUTOUPDATER = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", \
         DISABLE_TELEMETRY = \"1\", TELEGATE_REAL_ROW = \"{mark}\" }}",
        api.url(),
        home.display(),
    )
}

/// A `CODEX_HOME` whose provider is the fake Responses API.
fn codex_home(api: &FakeAgentApis) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.toml"),
        format!(
            "model = \"fake-model\"\nmodel_provider = \"fake\"\n\n\
             [model_providers.fake]\nname = \"fake\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\nenv_key = \"CODEX_API_KEY\"\n",
            api.url()
        ),
    )
    .unwrap();
    home
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_claude_agent_acp_answers_continues_and_asks_on_the_card() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, home, work) = (tempdir(), tempdir(), tempdir());
    // The adapter starts sessions in Claude Code's `auto` mode, where a
    // classifier model lets most commands run unasked: `default` asks.
    std::fs::create_dir_all(home.path().join(".claude")).unwrap();
    std::fs::write(
        home.path().join(".claude/settings.json"),
        r#"{"permissions": {"defaultMode": "default"}}"#,
    )
    .unwrap();
    let mark = mark("claude-acp");
    let body = format!(
        "preset = \"claude-acp\"\nprogram = \"{}\"\nworkdir = \"{}\"\n{}",
        bin("claude-agent-acp").display(),
        work.path().display(),
        claude_env(&api, home.path(), &mark),
    );
    let row = Row::new(Backend::Acp(body), "ok", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    permission_by_button(
        &fake,
        &api,
        work.path(),
        |l| l.starts_with('✅'),
        "Claude finished.",
    )
    .await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_codex_acp_answers_and_continues() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, work) = (tempdir(), tempdir());
    let home = codex_home(&api);
    let mark = mark("codex-acp");
    let body = format!(
        "preset = \"codex-acp\"\nprogram = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ CODEX_HOME = \"{}\", CODEX_API_KEY = \"sk-codex-fake\", OPENAI_API_KEY = \"sk-codex-fake\", \
         TELEGATE_REAL_ROW = \"{mark}\" }}",
        bin("codex-acp").display(),
        work.path().display(),
        home.path().display()
    );
    let row = Row::new(Backend::Acp(body), "Codex answer", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_gemini_acp_answers_continues_and_asks_on_the_card() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, home, work) = (tempdir(), tempdir(), tempdir());
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(
        home.path().join(".gemini/settings.json"),
        r#"{"security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": false},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true}}"#,
    )
    .unwrap();
    let mark = mark("gemini");
    let body = format!(
        "preset = \"gemini\"\nprogram = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ GEMINI_API_KEY = \"fake-gemini-key\", GOOGLE_GEMINI_BASE_URL = \"{}\", HOME = \"{}\", \
         GEMINI_CLI_TRUST_WORKSPACE = \"true\", TELEGATE_REAL_ROW = \"{mark}\" }}",
        bin("gemini").display(),
        work.path().display(),
        api.url(),
        home.path().display()
    );
    let row = Row::new(Backend::Acp(body), "Gemini answer", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    permission_by_button(
        &fake,
        &api,
        work.path(),
        |l| l.starts_with('✅'),
        "Gemini finished.",
    )
    .await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_opencode_acp_answers_continues_and_asks_on_the_card() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, home, work) = (tempdir(), tempdir(), tempdir());
    let config = home.path().join("opencode.json");
    std::fs::write(
        &config,
        serde_json::json!({
            "model": "fake/fake-model",
            "small_model": "fake/fake-model",
            "autoupdate": false,
            "share": "disabled",
            "permission": {"bash": "ask"},
            "provider": {"fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Fake",
                "options": {"baseURL": format!("{}/v1", api.url()), "apiKey": "sk-fake"},
                "models": {"fake-model": {"name": "Fake model"}}
            }}
        })
        .to_string(),
    )
    .unwrap();
    let mark = mark("opencode");
    let h = home.path().display();
    let body = format!(
        "preset = \"opencode\"\nprogram = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ OPENCODE_CONFIG = \"{}\", HOME = \"{h}\", XDG_CONFIG_HOME = \"{h}/.config\", \
         XDG_DATA_HOME = \"{h}/.local/share\", XDG_CACHE_HOME = \"{h}/.cache\", XDG_STATE_HOME = \"{h}/.local/state\", \
         OPENCODE_DISABLE_MODELS_FETCH = \"1\", OPENCODE_DISABLE_AUTOUPDATE = \"1\", TELEGATE_REAL_ROW = \"{mark}\" }}",
        bin("opencode").display(),
        work.path().display(),
        config.display()
    );
    let row = Row::new(Backend::Acp(body), "OpenCode answer", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    permission_by_button(
        &fake,
        &api,
        work.path(),
        |l| l.starts_with('✅'),
        "OpenCode finished.",
    )
    .await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_claude_cli_answers_continues_stops_and_asks_on_the_card() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, home, work) = (tempdir(), tempdir(), tempdir());
    let mark = mark("claude");
    let body = format!(
        "preset = \"claude\"\nprogram = \"{}\"\npermission_prompt = true\npermission_helper = \"{}\"\n\
         workdir = \"{}\"\n{}",
        bin("claude").display(),
        env!("CARGO_BIN_EXE_telegate"),
        work.path().display(),
        claude_env(&api, home.path(), &mark),
    );
    let row = Row::new(Backend::Cli(body), "ok", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    permission_by_button(
        &fake,
        &api,
        work.path(),
        |l| l.contains("Approve"),
        "Claude finished.",
    )
    .await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_codex_cli_answers_continues_and_stops() {
    let (fake, api) = (FakeBotApi::start().await, FakeAgentApis::start().await);
    let (data, work) = (tempdir(), tempdir());
    let home = codex_home(&api);
    let mark = mark("codex");
    let body = format!(
        "preset = \"codex\"\nprogram = \"{}\"\nworkdir = \"{}\"\npass_env = [\"CODEX_API_KEY\"]\n\
         env = {{ CODEX_HOME = \"{}\", CODEX_API_KEY = \"sk-codex-fake\", TELEGATE_REAL_ROW = \"{mark}\" }}",
        bin("codex").display(),
        work.path().display(),
        home.path().display()
    );
    let row = Row::new(Backend::Cli(body), "Codex answer", &mark);
    let bot = answer_restart_stop_new(&fake, &api, data.path(), &row).await;
    bot.shutdown().await;
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
