//! Zero-config start and `telegate init`, driven as a process: the built
//! binary in an empty directory, with nothing but environment variables,
//! talks to the fake Bot API; `init` writes the example and never
//! overwrites.

use crate::support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::fake_bot::FakeBotApi;

const WAIT: Duration = Duration::from_secs(60);

/// Every variable a file-less start reads, removed so the host's
/// environment cannot leak into a test.
const ENV: &[&str] = &[
    "TELEGRAM_BOT_TOKEN",
    "TELEGATE_ALLOWED_USERS",
    "TELEGATE_API_URL",
    "TELEGATE_DATA_DIR",
    "TELEGATE_METRICS_LISTEN",
    "STATE_DIRECTORY",
    "CREDENTIALS_DIRECTORY",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "RUST_LOG",
    "NOTIFY_SOCKET",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

fn telegate(cwd: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_telegate"));
    cmd.current_dir(cwd).env("NO_COLOR", "1");
    for var in ENV {
        cmd.env_remove(var);
    }
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run_to_end(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

/// `telegate run` in `dir` with `env`; stderr goes to `dir/log`.
struct Running {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Running {
    fn start(dir: &Path, env: &[(&str, String)]) -> Running {
        let log = dir.join("log");
        let mut cmd = telegate(dir);
        // As a service runs it: no NO_COLOR, the log into a file.
        cmd.env_remove("NO_COLOR");
        cmd.arg("run")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, value) in env {
            cmd.env(name, value);
        }
        Running {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn wait_polling(&self, fake: &FakeBotApi) {
        let polled = fake
            .wait_for(|calls| calls.iter().any(|c| c.method == "getUpdates"), WAIT)
            .await;
        assert!(polled, "never polled\n{}", self.log());
    }

    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) -> String {
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let status = self.child.wait().unwrap();
        let log = self.log();
        assert!(status.success(), "exit {status:?}\n{log}");
        log
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn wait_sent(fake: &FakeBotApi, chat: i64, needle: &str, running: &Running) {
    let seen = fake
        .wait_for(
            |calls| {
                calls.iter().any(|c| {
                    c.method == "sendMessage"
                        && c.chat_id() == Some(chat)
                        && c.text().is_some_and(|t| t.contains(needle))
                })
            },
            WAIT,
        )
        .await;
    assert!(
        seen,
        "no {needle:?} sent to {chat}: {:?}\n{}",
        fake.sent_texts(chat),
        running.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_directory_and_the_environment_are_enough_to_run_the_bot() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let running = Running::start(
        dir.path(),
        &[
            ("TELEGRAM_BOT_TOKEN", fake.token()),
            ("TELEGATE_API_URL", fake.url().to_string()),
            ("TELEGATE_ALLOWED_USERS", "42, 43".to_string()),
        ],
    );
    running.wait_polling(&fake).await;
    fake.push_text(42, 42, "hello there");
    wait_sent(&fake, 42, "hello there", &running).await;
    // Someone not on the list is told their id, and gets no turn.
    fake.push_text(7, 7, "let me in");
    wait_sent(&fake, 7, "Your user id is 7", &running).await;
    let log = running.stop();
    let says: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("no config file"))
        .collect();
    assert_eq!(says.len(), 1, "one line names the config in use:\n{log}");
    assert!(says[0].contains("backend echo"), "{}", says[0]);
    assert!(says[0].contains("2 allowed user(s)"), "{}", says[0]);
    assert!(
        dir.path().join("telegate-data/telegate.db").exists(),
        "the database is kept in the default data directory"
    );
    assert!(!log.contains(&fake.token()), "the token is never logged");
    assert!(
        !log.contains('\u{1b}'),
        "a log that is not a terminal carries no colour codes:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_alone_starts_a_bot_that_shows_a_pairing_code_and_tells_each_sender_their_id() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let running = Running::start(
        dir.path(),
        &[
            ("TELEGRAM_BOT_TOKEN", fake.token()),
            ("TELEGATE_API_URL", fake.url().to_string()),
        ],
    );
    running.wait_polling(&fake).await;
    fake.push_text(42, 42, "hello");
    wait_sent(&fake, 42, "Your user id is 42", &running).await;
    let log = running.stop();
    assert!(
        log.lines()
            .any(|l| l.contains("nobody may use the bot yet") && l.contains("/pair")),
        "the log says how to pair:\n{log}"
    );
    assert!(!fake.sent_texts(42).iter().any(|t| t.contains("echo")));
}

#[test]
fn without_a_token_run_says_where_to_put_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(telegate(dir.path()).arg("run"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("TELEGRAM_BOT_TOKEN"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn the_backend_is_openai_when_its_environment_is_set_else_echo() {
    let dir = tempfile::tempdir().unwrap();
    let check = |extra: &[(&str, &str)]| {
        let mut cmd = telegate(dir.path());
        cmd.arg("check-config").env("TELEGRAM_BOT_TOKEN", "1:zero");
        for (name, value) in extra {
            cmd.env(name, value);
        }
        let out = run_to_end(&mut cmd);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let echo = check(&[]);
    assert!(echo.starts_with("(environment): OK"), "{echo}");
    assert!(echo.contains("agent: echo"), "{echo}");
    let openai = check(&[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]);
    assert!(openai.contains("agent: openai"), "{openai}");
    let keyed = check(&[("OPENAI_API_KEY", "sk-zero")]);
    assert!(keyed.contains("agent: openai"), "{keyed}");
    assert!(!keyed.contains("sk-zero"));
}

#[test]
fn init_writes_the_example_once_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_to_end(telegate(dir.path()).arg("init"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = dir.path().join("telegate.toml");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(
        mode & 0o777,
        0o600,
        "the file the token goes in is the owner's alone"
    );
    let written = std::fs::read_to_string(&path).unwrap();
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml"))
            .unwrap();
    assert_eq!(written, example);

    // The file found in the working directory is used without --config.
    let out = run_to_end(
        telegate(dir.path())
            .arg("check-config")
            .env("TELEGRAM_BOT_TOKEN", "1:zero"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("telegate.toml: OK"));

    // A second init leaves the user's edits alone.
    std::fs::write(&path, "# mine\n").unwrap();
    let out = run_to_end(telegate(dir.path()).arg("init"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("already exists"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n");

    // --config names another file.
    let out = run_to_end(telegate(dir.path()).args(["init", "--config", "other.toml"]));
    assert!(out.status.success());
    assert!(dir.path().join("other.toml").exists());
}
