//! Clients that send half a request and stall cannot starve the listeners
//! (the webhook and `/healthz` + `/metrics`):
//!
//! * a listener at its connection cap closes new connections at once, and
//!   serves again when the stalled ones go;
//! * stalled heads and idle connections are cut off by the header
//!   deadline, stalled bodies by the body deadline (408), while the test
//!   still holds them open: `/healthz` and a proper update get through;
//! * the webhook refuses a request without the secret from its head (401,
//!   before and without its body: not 408, not 413), and a body over the
//!   limit (413);
//! * the built binary, started with a low soft open-files limit, raises it
//!   to the hard one (`/proc/<pid>/limits`) and keeps answering `/healthz`
//!   and taking webhook updates through 1,100 stalled connections at its
//!   default caps.
//!
//! No timing is asserted: every wait is bounded generously, and the
//! deadlines under test are set far apart from those bounds.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::FakeBotApi;
use support::test_bot::TestBot;
use telegate::http::{serve, HealthServer, StaticHealth};
use telegate::listener::ListenerLimits;
use telegate::metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Upper bound of every wait.
const WAIT: Duration = Duration::from_secs(60);
/// A deadline no test waits for (the behaviour under test must come first).
const NEVER_SECS: u64 = 600;
const USER: i64 = 42;
const SECRET: &str = "s3cret";
/// The start of a request that never ends its head.
const HALF_HEAD: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: telegate\r\nX-Slow: ";

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Connect and send `bytes`, then hold the connection (errors ignored: a
/// full listener may have closed it already).
async fn stall(addr: SocketAddr, bytes: &[u8]) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let _ = stream.write_all(bytes).await;
    Some(stream)
}

async fn stall_many(addr: SocketAddr, bytes: &[u8], n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(stream) = stall(addr, bytes).await {
            held.push(stream);
        }
    }
    held
}

/// Read until the server closes (EOF or reset), bounded; returns what was
/// read, or `None` if the connection stayed open.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok()
        .map(|()| String::from_utf8_lossy(&got).into_owned())
}

/// Send a raw request and read the status code of the answer, bounded.
async fn raw_status(addr: SocketAddr, request: &[u8], within: Duration) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    stream.write_all(request).await.ok()?;
    let answer = read_until_closed(&mut stream, within).await?;
    answer.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap()
}

/// Ask `/healthz` until it answers 200 (each try bounded), within [`WAIT`].
async fn eventually_healthy(addr: SocketAddr) -> bool {
    let client = client();
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Ok(response) = client.get(format!("http://{addr}/healthz")).send().await {
            if response.status() == 200 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Deliver the queued updates to the webhook until one is accepted (each
/// try bounded), within [`WAIT`].
async fn eventually_delivered(fake: &FakeBotApi, webhook: SocketAddr) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let tried = tokio::time::timeout(Duration::from_secs(3), fake.deliver_to_webhook(webhook));
        if tried.await.is_ok_and(|accepted| accepted > 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn health_listener(limits: ListenerLimits) -> (SocketAddr, CancellationToken) {
    let shutdown = CancellationToken::new();
    let health = Arc::new(StaticHealth::healthy(["updates", "store"]));
    let server = HealthServer::new(Metrics::new(), health);
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (bound, _task) = serve(listen, limits, server, shutdown.clone())
        .await
        .unwrap();
    (bound, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_listener_closes_new_connections_and_serves_again_when_they_go() {
    let limits = ListenerLimits {
        max_connections: 4,
        header_timeout: Duration::from_secs(NEVER_SECS),
        body_timeout: Duration::from_secs(NEVER_SECS),
    };
    let (addr, shutdown) = health_listener(limits).await;
    let stalled = stall_many(addr, HALF_HEAD, 4).await;
    assert_eq!(stalled.len(), 4);
    // A fifth, complete request is closed unanswered: the cap, not a
    // deadline (none is due within the wait).
    let mut beyond = TcpStream::connect(addr).await.unwrap();
    let _ = beyond
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    assert_eq!(
        read_until_closed(&mut beyond, WAIT).await.as_deref(),
        Some(""),
        "a connection beyond the cap is closed unanswered"
    );
    // The stalled clients give up: their slots are free again.
    drop(stalled);
    assert!(eventually_healthy(addr).await);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_heads_and_idle_connections_are_cut_off_and_healthz_answers() {
    let limits = ListenerLimits {
        max_connections: 4,
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
    };
    let (addr, shutdown) = health_listener(limits).await;
    let mut stalled = stall_many(addr, HALF_HEAD, 12).await;
    stalled.extend(stall_many(addr, b"", 2).await);
    assert_eq!(stalled.len(), 14);
    // Every one is closed by the server (the cap or the header deadline),
    // while the test still holds them open.
    for stream in &mut stalled {
        assert!(
            read_until_closed(stream, WAIT).await.is_some(),
            "a stalled connection is cut off"
        );
    }
    assert!(eventually_healthy(addr).await, "/healthz answers again");
    // A kept-alive connection that stays idle is closed too.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut idle, WAIT).await;
    assert!(
        answer
            .as_deref()
            .is_some_and(|a| a.starts_with("HTTP/1.1 200")),
        "answered, then closed once idle: {answer:?}"
    );
    drop(stalled);
    shutdown.cancel();
}

fn webhook_bot(fake: &FakeBotApi, data_dir: &Path, webhook: u16, limits: &str) -> TestBot {
    TestBot::new(fake).users(&[USER]).toml(format!(
        "[telegram]\nmode = \"webhook\"\n\n[telegram.webhook]\nlisten = \"127.0.0.1:{webhook}\"\n\
         public_url = \"https://bot.example.com/telegram\"\nsecret_token = \"{SECRET}\"\n\
         max_connections = 2\n{limits}\n\
         [store]\ndata_dir = {data_dir}\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n{limits}\n",
        data_dir = toml::Value::String(data_dir.display().to_string()),
    ))
}

/// A webhook request's head: `secret` (if any) and a declared body length.
fn webhook_head(secret: Option<&str>, length: usize) -> Vec<u8> {
    let secret = secret
        .map(|s| format!("X-Telegram-Bot-Api-Secret-Token: {s}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /telegram HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         {secret}Content-Length: {length}\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_checks_the_secret_before_the_body_and_bounds_the_body() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The body deadline is short: a server that read the body before the
    // secret would answer 408 (or nothing), never 401.
    let limits = "connection_limit = 8\nheader_timeout_secs = 600\nbody_timeout_secs = 2\n";
    let settings = webhook_bot(&fake, dir.path(), free_port(), limits);
    let bot = settings.agent(ScriptedAgent::new()).start().await.unwrap();
    let webhook = bot.webhook_addr.unwrap();

    // No or a wrong secret, the body announced and never sent: 401.
    for secret in [None, Some("wrong")] {
        let head = webhook_head(secret, 100_000);
        assert_eq!(
            raw_status(webhook, &head, WAIT).await,
            Some(401),
            "{secret:?}"
        );
    }
    // Even when the announced body is over the limit: the secret first.
    let huge = webhook_head(Some("wrong"), 50 * 1024 * 1024);
    assert_eq!(raw_status(webhook, &huge, WAIT).await, Some(401));
    // With the secret, an announced body over the limit is refused unread.
    let huge = webhook_head(Some(SECRET), 50 * 1024 * 1024);
    assert_eq!(raw_status(webhook, &huge, WAIT).await, Some(413));
    // With the secret, a body that stops coming: 408 at its deadline.
    let mut partial = webhook_head(Some(SECRET), 1_000);
    partial.extend_from_slice(b"{\"update_id\":");
    assert_eq!(raw_status(webhook, &partial, WAIT).await, Some(408));
    // A body sent in full is taken.
    fake.push_text(USER, USER, "hello");
    assert_eq!(fake.deliver_to_webhook(webhook).await, 1);
    let answered = fake
        .wait_for(
            |_| {
                fake.sent_texts(USER)
                    .iter()
                    .any(|t| t.contains("answer:hello"))
            },
            WAIT,
        )
        .await;
    assert!(answered);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_clients_do_not_keep_updates_or_healthz_out() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let limits = "connection_limit = 4\nheader_timeout_secs = 1\nbody_timeout_secs = 1\n";
    let settings = webhook_bot(&fake, dir.path(), free_port(), limits);
    let bot = settings.agent(ScriptedAgent::new()).start().await.unwrap();
    let webhook = bot.webhook_addr.unwrap();
    let health = bot.metrics_addr.unwrap();

    // Beyond both caps: stalled bodies with a valid head (the secret: these
    // fill the webhook's slots first; only the body deadline frees them),
    // and without it, then stalled heads.
    let mut with_secret = webhook_head(Some(SECRET), 1_000);
    with_secret.extend_from_slice(b"{\"update_id\":");
    let mut held = stall_many(webhook, &with_secret, 5).await;
    let mut without = webhook_head(None, 1_000);
    without.extend_from_slice(b"{\"update_id\":");
    held.extend(stall_many(webhook, &without, 5).await);
    held.extend(stall_many(webhook, HALF_HEAD, 10).await);
    held.extend(stall_many(health, HALF_HEAD, 10).await);

    fake.push_text(USER, USER, "through");
    assert!(
        eventually_delivered(&fake, webhook).await,
        "a proper update gets through"
    );
    assert!(eventually_healthy(health).await, "/healthz answers");
    let answered = fake
        .wait_for(
            |_| {
                fake.sent_texts(USER)
                    .iter()
                    .any(|t| t.contains("answer:through"))
            },
            WAIT,
        )
        .await;
    assert!(answered);
    drop(held);
    bot.shutdown().await;
}

/// The soft and hard "Max open files" of a process.
fn open_files_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].parse().unwrap(), fields[4].parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_raises_its_open_files_limit_and_survives_1100_stalled_connections() {
    // The test itself holds about 1,300 sockets.
    let ours = telegate::listener::raise_open_files_limit().unwrap();
    if ours.now < 4096 {
        println!("SKIPPED: this process may open only {} files", ours.now);
        return;
    }
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (webhook_port, health_port) = (free_port(), free_port());
    // Default caps and deadlines.
    let text = TestBot::new(&fake)
        .users(&[USER])
        .toml(format!(
            "[telegram]\nmode = \"webhook\"\n\n[telegram.webhook]\nlisten = \"127.0.0.1:{webhook_port}\"\n\
             public_url = \"https://bot.example.com/telegram\"\nsecret_token = \"{SECRET}\"\n\n\
             [agent]\nbackend = \"echo\"\n\n[store]\ndata_dir = {data_dir}\n\n\
             [metrics]\nlisten = \"127.0.0.1:{health_port}\"\n",
            data_dir = toml::Value::String(dir.path().join("data").display().to_string()),
        ))
        .text();
    let config = dir.path().join("telegate.toml");
    std::fs::write(&config, text).unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_telegate"));
    command
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("TELEGRAM_WEBHOOK_SECRET")
        .env_remove("RUST_LOG");
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the
    // child before exec.
    unsafe {
        command.pre_exec(|| {
            // 512 open files allowed, up to 1024 if the process asks.
            let limit = libc::rlimit {
                rlim_cur: 512,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().unwrap();
    let pid = child.id().unwrap();
    let health: SocketAddr = format!("127.0.0.1:{health_port}").parse().unwrap();
    let webhook: SocketAddr = format!("127.0.0.1:{webhook_port}").parse().unwrap();
    assert!(eventually_healthy(health).await, "the binary starts");
    assert_eq!(open_files_limits(pid), (1024, 1024), "soft raised to hard");

    // More stalled connections than the process may open files.
    let mut held = stall_many(webhook, HALF_HEAD, 1_100).await;
    held.extend(stall_many(health, HALF_HEAD, 100).await);
    fake.push_text(USER, USER, "still here");
    assert!(
        eventually_delivered(&fake, webhook).await,
        "a proper update gets through"
    );
    assert!(eventually_healthy(health).await, "/healthz answers");
    let answered = fake
        .wait_for(
            |_| {
                fake.sent_texts(USER)
                    .iter()
                    .any(|t| t.contains("still here"))
            },
            WAIT,
        )
        .await;
    assert!(answered);
    drop(held);
    drop(child);
}
