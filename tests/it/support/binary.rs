//! The built `telegate run` as a child of the test, for what only a real
//! process shows: a restart (a new process, counters from scratch),
//! `kill -9`, the umask, the children it leaves behind.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::fake_bot::FakeBotApi;

/// Upper bound of every wait here.
const WAIT: Duration = Duration::from_secs(30);

/// One `telegate run --config <file>` process (SIGKILLed if dropped).
pub struct Telegate {
    label: &'static str,
    child: Child,
    pid: libc::pid_t,
    /// The fake's next call number when this process started: calls from
    /// here on are this process's.
    pub first_seq: u64,
    log: Arc<Mutex<Vec<String>>>,
}

impl Telegate {
    /// Start the binary on `config`, with `umask` if given.
    pub fn start(
        label: &'static str,
        config: &Path,
        fake: &FakeBotApi,
        umask: Option<libc::mode_t>,
    ) -> Telegate {
        let first_seq = fake.calls().last().map_or(0, |c| c.seq + 1);
        let mut command = Command::new(env!("CARGO_BIN_EXE_telegate"));
        command
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .env("NO_COLOR", "1");
        for var in [
            "TELEGRAM_BOT_TOKEN",
            "TELEGRAM_WEBHOOK_SECRET",
            "OPENAI_API_KEY",
            "RUST_LOG",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            command.env_remove(var);
        }
        if let Some(mask) = umask {
            // SAFETY: umask is async-signal-safe and touches no memory.
            unsafe {
                command.pre_exec(move || {
                    libc::umask(mask);
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("the telegate binary starts");
        let pid = child.id().expect("a running child has a pid") as libc::pid_t;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Telegate {
            label,
            child,
            pid,
            first_seq,
            log,
        }
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }

    /// Wait until it polls for updates (its start, recovery included, is
    /// done by then).
    pub async fn ready(&self, fake: &FakeBotApi) {
        let first = self.first_seq;
        let polled = fake
            .wait_for(
                |calls| {
                    calls
                        .iter()
                        .any(|c| c.seq >= first && c.method == "getUpdates")
                },
                WAIT,
            )
            .await;
        assert!(polled, "{} never polled\n{}", self.label, self.log());
    }

    /// Wait until a log line contains `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let seen = until(|| self.log().contains(needle)).await;
        assert!(
            seen,
            "{} never logged {needle:?}\n{}",
            self.label,
            self.log()
        );
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        let sent = unsafe { libc::kill(self.pid, signal) };
        assert_eq!(sent, 0, "{}: kill({signal})", self.label);
    }

    async fn wait_exit(&mut self) -> ExitStatus {
        match tokio::time::timeout(WAIT, self.child.wait()).await {
            Ok(Ok(status)) => status,
            other => panic!("{} did not exit: {other:?}\n{}", self.label, self.log()),
        }
    }

    /// `kill -9`: no shutdown code runs.
    pub async fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        self.wait_exit().await;
    }

    /// SIGTERM, and a clean exit.
    pub async fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit().await;
        assert_eq!(
            status.code(),
            Some(0),
            "{} exited with {status}\n{}",
            self.label,
            self.log()
        );
    }
}

/// Wait (bounded) until `cond` holds.
pub async fn until(cond: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

/// `(pid, state, process group)` of every process `/proc` shows.
fn processes() -> Vec<(i32, char, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
            Some((
                pid,
                fields.first()?.chars().next()?,
                fields.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

/// The live (not zombie) processes of group `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|&(_, state, group)| group == pgid && state != 'Z' && state != 'X')
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    processes()
        .into_iter()
        .any(|(p, state, _)| p == pid && state != 'Z' && state != 'X')
}
