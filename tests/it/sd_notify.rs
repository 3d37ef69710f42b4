//! `Type=notify`: the built binary, started with a `NOTIFY_SOCKET` and a
//! `WATCHDOG_USEC` like systemd sets them, sends `READY=1` once it serves,
//! `WATCHDOG=1` keep-alives, and `STOPPING=1` on SIGTERM. The socket is a
//! datagram socket the test binds itself.

use crate::support;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::fake_bot::FakeBotApi;

const WAIT: Duration = Duration::from_secs(60);

/// Read datagrams until one contains `needle`; returns everything read.
fn read_until(socket: &UnixDatagram, needle: &str, seen: &mut Vec<String>) -> bool {
    let deadline = Instant::now() + WAIT;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                let hit = message.lines().any(|line| line == needle);
                seen.push(message);
                if hit {
                    return true;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
            Err(error) => panic!("recv: {error}"),
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_watchdog_and_stopping_reach_the_notify_socket() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_telegate"))
        .arg("run")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TELEGRAM_BOT_TOKEN", fake.token())
        .env("TELEGATE_API_URL", fake.url().to_string())
        .env("TELEGATE_ALLOWED_USERS", "42")
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "200000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child_pid = child.id();
    let (socket, seen) = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        assert!(
            read_until(&socket, "READY=1", &mut seen),
            "no READY: {seen:?}"
        );
        let ready_at = seen.len();
        assert!(
            read_until(&socket, "WATCHDOG=1", &mut seen),
            "no WATCHDOG: {seen:?}"
        );
        assert!(
            read_until(&socket, "WATCHDOG=1", &mut seen),
            "one WATCHDOG only: {seen:?}"
        );
        assert!(
            !seen[..ready_at - 1].iter().any(|m| m.contains("READY=1")),
            "READY once"
        );
        (socket, seen)
    })
    .await
    .unwrap();
    // READY comes after the bot connected and set itself up.
    assert!(!fake.calls_to("getMe").is_empty());
    unsafe {
        libc::kill(child_pid as libc::pid_t, libc::SIGTERM);
    }
    let stopping = tokio::task::spawn_blocking(move || {
        let mut seen = seen;
        let found = read_until(&socket, "STOPPING=1", &mut seen);
        (found, seen)
    })
    .await
    .unwrap();
    assert!(stopping.0, "no STOPPING: {:?}", stopping.1);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
