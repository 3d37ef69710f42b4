//! The real ACP agents, by script (`scripts/real-agents.sh`, never in CI:
//! they need the npm packages it installs). Each test is `#[ignore]`d and
//! reads `TELEGATE_REAL_ACP_BIN`, the `node_modules/.bin` directory holding
//! `claude-agent-acp` and `codex-acp`. Everything else is fake and on
//! 127.0.0.1: the Bot API, the Anthropic Messages API behind Claude Code,
//! the Responses API behind Codex ([`FakeAgentApis`]).
//!
//! Each test runs the agent through the `acp` backend as a user would: an
//! answer, a restart of telegate that continues (or says it starts fresh),
//! `/new`; Claude's adapter also a permission request answered by button.

use std::path::{Path, PathBuf};
use std::time::Duration;

use telegate::config::{Config, Purpose};
use telegate::transport::telegram::TelegramBot;

use crate::support;
use support::buttons::{buttons, message_text};
use support::fake_agent_apis::FakeAgentApis;
use support::fake_bot::FakeBotApi;

const WAIT: Duration = Duration::from_secs(120);
const USER: i64 = 42;

fn bin(name: &str) -> PathBuf {
    let dir = std::env::var("TELEGATE_REAL_ACP_BIN")
        .expect("TELEGATE_REAL_ACP_BIN names node_modules/.bin (run scripts/real-agents.sh)");
    Path::new(&dir).join(name)
}

/// A bot on the acp backend with `acp` as the body of `[agent.acp]`.
fn acp_config(fake: &FakeBotApi, data: &Path, acp: &str) -> Config {
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallowed_users = [{USER}]\n\n\
         [delivery]\nper_chat_interval_ms = 1\nedit_interval_ms = 50\nglobal_messages_per_second = 100000\nstreaming = \"edit\"\n\n\
         [sessions]\nstall_timeout_secs = 150\nshutdown_grace_secs = 2\n\n\
         [agent]\nbackend = \"acp\"\n\n\
         [agent.acp]\nstart_timeout_secs = 90\n{acp}\n\n\
         [store]\ndata_dir = \"{}\"\n",
        fake.token(),
        fake.url(),
        data.display()
    );
    Config::parse(Path::new("real-acp.toml"), &text, Purpose::Telegram, |_| {
        None
    })
    .expect("valid config")
}

/// A finished message (no buttons left) containing `needle`, after the
/// first `skip` such messages.
async fn wait_answer(fake: &FakeBotApi, needle: &str, skip: usize) -> bool {
    fake.wait_for(
        |_| {
            fake.message_history(USER)
                .iter()
                .filter(|m| {
                    let now = m.current();
                    now.text.contains(needle) && now.reply_markup.is_none()
                })
                .count()
                > skip
        },
        WAIT,
    )
    .await
}

fn sent(fake: &FakeBotApi) -> Vec<String> {
    fake.sent_texts(USER)
}

/// Answer, restart, answer again (continued, or a fresh start said once),
/// /stop while the model is slow, answer, /new: what every agent must do. `trigger(n)` is the n-th
/// message, `answer(n)` what its reply contains.
async fn answer_restart_new(
    fake: &FakeBotApi,
    api: &FakeAgentApis,
    data: &Path,
    acp: &str,
    answer: impl Fn(usize) -> String,
) -> TelegramBot {
    let bot = TelegramBot::start(&acp_config(fake, data, acp))
        .await
        .unwrap();
    fake.push_text(USER, USER, "hello one");
    assert!(
        wait_answer(fake, &answer(1), 0).await,
        "first answer: {:?}",
        sent(fake)
    );
    bot.shutdown().await;

    let bot = TelegramBot::start(&acp_config(fake, data, acp))
        .await
        .unwrap();
    fake.push_text(USER, USER, "hello two");
    assert!(
        wait_answer(fake, &answer(2), usize::from(answer(1) == answer(2))).await,
        "answer after the restart: {:?}",
        sent(fake)
    );
    let fresh = sent(fake)
        .iter()
        .any(|t| t.contains("cannot continue a conversation"));
    eprintln!(
        "after the restart: {}",
        if fresh {
            "started fresh (said so)"
        } else {
            "continued"
        }
    );

    // /stop mid-answer: told at once, and the agent answers the next one.
    fake.push_text(USER, USER, "REAL-SLOW take your time");
    // The agent is waiting for the model (the fake holds that request).
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
    let asked = std::time::Instant::now();
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(|_| sent(fake).iter().any(|t| t.contains("Stopped")), WAIT)
            .await,
        "{:?}",
        sent(fake)
    );
    eprintln!("stop: told after {} ms", asked.elapsed().as_millis());
    let before = fake
        .message_history(USER)
        .iter()
        .filter(|m| m.current().text.contains(&answer(3)) && m.current().reply_markup.is_none())
        .count();
    fake.push_text(USER, USER, "hello three");
    assert!(
        wait_answer(fake, &answer(3), before).await,
        "an answer after /stop: {:?} / the model was asked: {:?}",
        sent(fake),
        api.requests()
            .iter()
            .map(|r| format!(
                "{} {}",
                r.path,
                r.body
                    .to_string()
                    .chars()
                    .rev()
                    .take(160)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect::<String>()
            ))
            .collect::<Vec<_>>()
    );

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
    bot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_claude_agent_acp_answers_continues_and_asks_on_the_card() {
    let fake = FakeBotApi::start().await;
    let api = FakeAgentApis::start().await;
    let data = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let acp = format!(
        "preset = \"claude-acp\"\nprogram = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ ANTHROPIC_BASE_URL = \"{}\", ANTHROPIC_API_KEY = \"sk-ant-fake\", HOME = \"{}\", \
         DISABLE_AUTOUPDATER = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", DISABLE_TELEMETRY = \"1\" }}",
        bin("claude-agent-acp").display(),
        work.path().display(),
        api.url(),
        home.path().display(),
    );
    let bot = answer_restart_new(&fake, &api, data.path(), &acp, |_| "ok".to_string()).await;

    let marker = work.path().join("permitted");
    fake.push_text(
        USER,
        USER,
        &format!("REAL-PERMISSION touch {}", marker.display()),
    );
    let allow_once = |b: &(i64, String, String)| b.1.starts_with("✅");
    assert!(
        fake.wait_for(|_| buttons(&fake, USER).iter().any(allow_once), WAIT)
            .await,
        "a permission card: {:?} / API paths: {:?}",
        sent(&fake),
        api.requests()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    );
    let (card, label, data_) = buttons(&fake, USER).into_iter().find(allow_once).unwrap();
    eprintln!(
        "card: {} / pressing {label}",
        message_text(&fake, USER, card)
    );
    assert!(!marker.exists(), "nothing ran before the answer");
    fake.push_callback_query(USER, USER, card, &data_);
    assert!(
        wait_answer(&fake, "Claude finished.", 0).await,
        "{:?}",
        sent(&fake)
    );
    assert!(marker.exists(), "Claude Code ran the allowed command");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm packages of scripts/real-agents.sh"]
async fn real_codex_acp_answers_and_continues() {
    let fake = FakeBotApi::start().await;
    let api = FakeAgentApis::start().await;
    let data = tempfile::tempdir().unwrap();
    let codex_home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        codex_home.path().join("config.toml"),
        format!(
            "model = \"fake-model\"\nmodel_provider = \"fake\"\n\n\
             [model_providers.fake]\nname = \"fake\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\nenv_key = \"CODEX_API_KEY\"\n",
            api.url()
        ),
    )
    .unwrap();
    let acp = format!(
        "preset = \"codex-acp\"\nprogram = \"{}\"\nworkdir = \"{}\"\n\
         env = {{ CODEX_HOME = \"{}\", CODEX_API_KEY = \"sk-codex-fake\", OPENAI_API_KEY = \"sk-codex-fake\" }}",
        bin("codex-acp").display(),
        work.path().display(),
        codex_home.path().display()
    );
    let bot = answer_restart_new(&fake, &api, data.path(), &acp, |_| {
        "Codex answer".to_string()
    })
    .await;
    bot.shutdown().await;
}
