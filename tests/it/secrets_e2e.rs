//! Secrets out of every child's reach, on the built binary (issue 10).
//!
//! `telegate run` is started as a child of this test (as whatever user runs
//! the tests: root here) against the fake Bot API and the fake OpenAI
//! server, with its secrets in the environment, in files and in a systemd
//! credentials directory. A probe program then runs as telegate's child, once
//! as the command backend and once as a terminal-tool command (foreground
//! and background), and tries to find the secrets in
//! `/proc/<telegate>/environ`, `/proc/<telegate>/cmdline` and telegate's
//! memory (`/proc/<telegate>/mem` via `maps`). It reports per source
//! `denied`, `clean` or `FOUND`; every source must be `denied` or `clean`.
//! The secrets themselves never leave the probe.
//!
//! The probe also lists its environment, which must be the minimal one.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::fake_bot::{Failure, FakeBotApi, FakeConfig};
use support::fake_files::voice_json;
use support::fake_openai::{last_user_contains, messages, tool_result_after, FakeOpenAi, Script};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(30);

/// Secrets unique enough that finding them anywhere is no accident.
const TOKEN: &str = "123:TokSecret_e2e_4f9a";
const WEBHOOK_SECRET: &str = "HookSecret_e2e_77c1";
const API_KEY: &str = "sk-KeySecret-e2e-90d3";

/// The probe: walks up to the telegate process, then reads its environ,
/// cmdline and memory looking for `secrets`.
fn probe_script(secrets: &[&str]) -> String {
    let list = secrets
        .iter()
        .map(|s| format!("b{s:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"#!/bin/sh
p=$$
while [ "$p" -gt 1 ]; do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = telegate ] && break
  p=$(cut -d' ' -f4 /proc/$p/stat)
done
echo "PROBE target=$(cat /proc/$p/comm) uid=$(id -u)"
echo "ENV $(env | cut -d= -f1 | sort | tr '\n' ' ')"
exec python3 - "$p" <<'PY'
import sys
pid = sys.argv[1]
secrets = [{list}]
def report(what, read):
    try:
        data = read()
    except PermissionError:
        print(what + "=denied"); return
    except OSError as e:
        print(what + "=error" + str(e.errno)); return
    print(what + "=" + ("FOUND" if any(s in data for s in secrets) else "clean"))
def memory():
    maps = open("/proc/%s/maps" % pid).read().splitlines()
    hits, readable = b"", 0
    with open("/proc/%s/mem" % pid, "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except OSError:
                continue
            readable += 1
            hits += b"".join(s for s in secrets if s in chunk)
    if readable == 0:
        raise PermissionError()
    return hits
report("environ", lambda: open("/proc/%s/environ" % pid, "rb").read())
report("cmdline", lambda: open("/proc/%s/cmdline" % pid, "rb").read())
report("mem", memory)
PY
"#
    )
}

/// What the probe found, checked: it ran against telegate, and no source
/// gave a secret away.
fn assert_nothing_found(output: &str) {
    assert!(
        output.contains("PROBE target=telegate"),
        "the probe did not find telegate: {output}"
    );
    for source in ["environ", "cmdline", "mem"] {
        let verdict = output
            .lines()
            .find_map(|line| line.trim().strip_prefix(&format!("{source}=")))
            .unwrap_or_else(|| panic!("no verdict for {source}: {output}"));
        assert!(
            verdict == "denied" || verdict == "clean",
            "a child read a secret through /proc/<telegate>/{source} ({verdict}):\n{output}"
        );
    }
    for secret in [TOKEN, WEBHOOK_SECRET, API_KEY] {
        assert!(!output.contains(secret), "{output}");
    }
}

/// The variable names the probe reported.
fn probe_env(output: &str) -> Vec<String> {
    output
        .lines()
        .find_map(|line| line.trim().strip_prefix("ENV "))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

struct Telegate {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Telegate {
    fn spawn(config: &Path, env: &[(&str, &str)]) -> Telegate {
        let mut command = Command::new(env!("CARGO_BIN_EXE_telegate"));
        command
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("TELEGRAM_BOT_TOKEN")
            .env_remove("TELEGRAM_WEBHOOK_SECRET")
            .env_remove("OPENAI_API_KEY")
            .env_remove("CREDENTIALS_DIRECTORY");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("the telegate binary starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        Telegate { child, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    async fn wait_exit(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("telegate exits in time")
            .expect("wait works")
    }
}

fn base_config(fake: &FakeBotApi, data_dir: &Path) -> String {
    format!(
        "[telegram]\napi_url = \"{url}\"\nallowed_users = [{USER}]\n\n\
         [delivery]\nper_chat_interval_ms = 1\ngroup_messages_per_minute = 100000\n\
         global_messages_per_second = 100000\nedit_interval_ms = 50\ntyping_interval_ms = 100\n\n\
         [store]\ndata_dir = {data_dir}\n\n",
        url = fake.url(),
        data_dir = toml::Value::String(data_dir.display().to_string()),
    )
}

/// Wait until the bot's messages in the chat contain `needle`; all of them.
async fn wait_text(fake: &FakeBotApi, needle: &str, telegate: &Telegate) -> String {
    let found = fake
        .wait_for(
            |_| fake.sent_texts(USER).iter().any(|t| t.contains(needle)),
            WAIT,
        )
        .await;
    let texts = fake.sent_texts(USER).join("\n---\n");
    assert!(
        found,
        "no {needle:?} in the chat: {texts}\nlog:\n{}",
        telegate.log()
    );
    texts
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_backend_program_cannot_read_telegates_secrets() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let probe = write(
        dir.path(),
        "probe.sh",
        &probe_script(&[TOKEN, WEBHOOK_SECRET, API_KEY]),
    );
    let config = format!(
        "{}[agent]\nbackend = \"command\"\n\n[agent.command]\nargv = [\"sh\", {probe}]\n\
         pass_env = [\"TELEGATE_TEST_PASSED\"]\n\n\
         [telegram.webhook]\nlisten = \"127.0.0.1:1\"\npublic_url = \"https://example.com/hook\"\n",
        base_config(&fake, &dir.path().join("data")),
        probe = toml::Value::String(probe.display().to_string()),
    );
    let config = write(dir.path(), "telegate.toml", &config);
    let mut telegate = Telegate::spawn(
        &config,
        &[
            ("TELEGRAM_BOT_TOKEN", TOKEN),
            ("TELEGRAM_WEBHOOK_SECRET", WEBHOOK_SECRET),
            ("OPENAI_API_KEY", API_KEY),
            ("TELEGATE_TEST_PASSED", "yes"),
            ("TELEGATE_TEST_NOT_PASSED", "no"),
        ],
    );
    fake.push_text(USER, USER, "probe please");
    let output = wait_text(&fake, "mem=", &telegate).await;
    assert_nothing_found(&output);
    let env = probe_env(&output);
    assert!(env.contains(&"PATH".to_string()), "{env:?}");
    assert!(env.contains(&"TELEGATE_TEST_PASSED".to_string()), "{env:?}");
    assert!(
        !env.contains(&"TELEGATE_TEST_NOT_PASSED".to_string()),
        "{env:?}"
    );
    telegate.child.start_kill().unwrap();
    telegate.wait_exit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_commands_cannot_read_telegates_secrets_from_files_or_credentials() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let probe = write(
        dir.path(),
        "probe.sh",
        &probe_script(&[TOKEN, WEBHOOK_SECRET, API_KEY]),
    );
    // The token comes from a systemd credential, the webhook secret and the
    // API key from files.
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    write(&credentials, "telegram_bot_token", &format!("{TOKEN}\n"));
    let key_file = write(dir.path(), "llm.key", &format!("{API_KEY}\n"));
    let secret_file = write(dir.path(), "hook.secret", WEBHOOK_SECRET);
    let config = format!(
        "{}[agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{llm}\"\nmodel = \"fake\"\n\
         api_key_file = {key_file}\n\n\
         [tools.terminal]\nenabled = true\napproval = \"never\"\n\n\
         [telegram.webhook]\nlisten = \"127.0.0.1:1\"\npublic_url = \"https://example.com/hook\"\n\
         secret_token_file = {secret_file}\n",
        base_config(&fake, &dir.path().join("data")),
        llm = llm.base_url(),
        key_file = toml::Value::String(key_file.display().to_string()),
        secret_file = toml::Value::String(secret_file.display().to_string()),
    );
    let config = write(dir.path(), "telegate.toml", &config);
    let command = format!("sh {}", probe.display());
    llm.push_when(
        last_user_contains("probe in the foreground"),
        Script::tool_call("terminal", &json!({ "command": command }).to_string(), "c1"),
    );
    llm.push_when(
        tool_result_after("probe in the foreground"),
        Script::text("foreground done"),
    );
    llm.push_when(
        last_user_contains("probe in the background"),
        Script::tool_call(
            "terminal",
            &json!({ "command": command, "background": true, "notify_on_complete": true })
                .to_string(),
            "c2",
        ),
    );
    llm.push_when(
        tool_result_after("probe in the background"),
        Script::text("background started"),
    );
    llm.push_when(
        last_user_contains("[telegate] Background process"),
        Script::text("background done"),
    );
    let mut telegate = Telegate::spawn(
        &config,
        &[("CREDENTIALS_DIRECTORY", &credentials.display().to_string())],
    );

    fake.push_text(USER, USER, "probe in the foreground");
    wait_text(&fake, "foreground done", &telegate).await;
    let foreground = llm.requests_matching(&tool_result_after("probe in the foreground"));
    let (_, result) = messages(&foreground[0]).pop().unwrap();
    assert_nothing_found(&result);
    let env = probe_env(&result);
    assert!(env.contains(&"PATH".to_string()), "{env:?}");
    assert!(
        !env.contains(&"CREDENTIALS_DIRECTORY".to_string()),
        "{env:?}"
    );

    fake.push_text(USER, USER, "probe in the background");
    wait_text(&fake, "background done", &telegate).await;
    let wakeup = llm.requests_matching(&last_user_contains("[telegate] Background process"));
    let (_, text) = messages(&wakeup[0]).pop().unwrap();
    assert_nothing_found(&text);

    // The key from the file was used.
    assert!(llm
        .authorizations()
        .iter()
        .all(|a| a.as_deref() == Some(&format!("Bearer {API_KEY}") as &str)));
    telegate.child.start_kill().unwrap();
    telegate.wait_exit().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_stops_the_bot_after_three_401s() {
    let fake = FakeBotApi::start_with(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[agent]\nbackend = \"echo\"\n",
        base_config(&fake, &dir.path().join("data"))
    );
    let config = write(dir.path(), "telegate.toml", &config);
    let mut telegate = Telegate::spawn(&config, &[("TELEGRAM_BOT_TOKEN", TOKEN)]);
    // Serving first: then the token is revoked.
    fake.push_text(USER, USER, "hello");
    wait_text(&fake, "hello", &telegate).await;
    let unauthorized = || Failure::Api {
        code: 401,
        description: "Unauthorized".to_string(),
    };
    fake.fail_next("getUpdates", 3, unauthorized());
    let status = telegate.wait_exit().await;
    assert!(!status.success(), "{status:?}");
    let log = telegate.log();
    assert!(log.contains("the bot token was rejected"), "{log}");
    assert!(!log.contains(TOKEN), "{log}");
    // It gave up after exactly three 401s in a row.
    assert_eq!(
        fake.calls_to("getUpdates")
            .iter()
            .filter(|c| c.outcome.error_code() == Some(401))
            .count(),
        3
    );
}

/// Send a voice note to the running binary and wait for the echo of its
/// transcript; returns the `Authorization` header the transcription
/// endpoint received.
async fn transcribed_authorization(
    fake: &FakeBotApi,
    llm: &FakeOpenAi,
    telegate: &Telegate,
    audio: &[u8],
    words: &str,
) -> Option<String> {
    llm.transcriber.register(audio, words);
    let file = fake.files().add(audio.to_vec(), "oga");
    let unique = fake.files().unique_id(&file);
    fake.push_media(USER, USER, voice_json(&file, &unique, audio.len()));
    wait_text(fake, words, telegate).await;
    let requests = llm.transcriber.requests();
    let request = requests
        .iter()
        .find(|r| r.file == audio)
        .unwrap_or_else(|| panic!("no transcription request: {requests:?}"));
    request.authorization.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transcription_key_reaches_the_endpoint_from_the_environment_or_a_file() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let transcription = |key_line: &str| {
        format!(
            "{}[agent]\nbackend = \"echo\"\n\n[media.transcription]\nbase_url = \"{}\"\n\
             model = \"whisper-test\"\n{key_line}\n",
            base_config(&fake, &dir.path().join("data")),
            llm.base_url(),
        )
    };
    // The example's own setting: the key in OPENAI_API_KEY, which telegate
    // scrubs from its environment at start.
    let config = write(
        dir.path(),
        "env.toml",
        &transcription("api_key_env = \"OPENAI_API_KEY\""),
    );
    let mut telegate = Telegate::spawn(
        &config,
        &[("TELEGRAM_BOT_TOKEN", TOKEN), ("OPENAI_API_KEY", API_KEY)],
    );
    let authorization = transcribed_authorization(
        &fake,
        &llm,
        &telegate,
        b"OggS voice with the key from the environment",
        "lights on please",
    )
    .await;
    assert_eq!(
        authorization.as_deref(),
        Some(&format!("Bearer {API_KEY}") as &str),
        "log:\n{}",
        telegate.log()
    );
    telegate.child.start_kill().unwrap();
    telegate.wait_exit().await;

    // From a file.
    let key_file = write(dir.path(), "whisper.key", &format!("{API_KEY}-file\n"));
    let config = write(
        dir.path(),
        "file.toml",
        &transcription(&format!(
            "api_key_file = {}",
            toml::Value::String(key_file.display().to_string())
        )),
    );
    let mut telegate = Telegate::spawn(&config, &[("TELEGRAM_BOT_TOKEN", TOKEN)]);
    let authorization = transcribed_authorization(
        &fake,
        &llm,
        &telegate,
        b"OggS voice with the key from a file",
        "water the plants",
    )
    .await;
    assert_eq!(
        authorization.as_deref(),
        Some(&format!("Bearer {API_KEY}-file") as &str),
        "log:\n{}",
        telegate.log()
    );
    assert!(!telegate.log().contains(API_KEY), "{}", telegate.log());
    telegate.child.start_kill().unwrap();
    telegate.wait_exit().await;
}
