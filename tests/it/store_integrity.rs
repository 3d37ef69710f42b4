//! The store refuses what it must not use, and keeps what it must keep:
//!
//! * the built binary exits non-zero, naming the file and what to do, on a
//!   database with damaged pages (`PRAGMA quick_check`) and on one
//!   truncated to 0 bytes (the marker tells it from a fresh data directory);
//! * when the store cannot create a chat's session, the chat is told and
//!   `/healthz` reports it, instead of a memory-only session whose history
//!   would vanish at the next restart; once writes work again, so does the
//!   chat;
//! * a failing write of the intake (inbox rows), the ledger (message
//!   states), the outbox or the transcripts turns `/healthz` into a 503
//!   naming it, until a write of that kind works again (another kind
//!   working does not hide it);
//! * finished inbox rows older than `inbox_retention_days` are pruned at
//!   start, unfinished ones and transcripts stay;
//! * `[store] synchronous` reaches SQLite;
//! * `check-config` catches every new store and approval key.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use support::agents::ScriptedAgent;
use support::fake_bot::FakeBotApi;
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::store::{Store, TranscriptEntry};
use telegate::vocab::InboxState;

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(20);

/// USER's bot with `store` in its `[store]` table, `extra` more settings.
fn test_bot(fake: &FakeBotApi, store: &str, extra: &str) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!("[store]\n{store}\n\n{extra}\n"))
}

fn data_dir_line(dir: &Path) -> String {
    format!(
        "data_dir = {}",
        toml::Value::String(dir.display().to_string())
    )
}

/// Run `telegate run` on `text` until it exits (or `WAIT` passes);
/// returns (exit code, stderr).
async fn run_binary(dir: &Path, text: &str) -> (Option<i32>, String) {
    let config = dir.join("telegate.toml");
    std::fs::write(&config, text).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_telegate"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .env_remove("TELEGRAM_BOT_TOKEN")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("the binary exits by itself")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A database with a few sessions and transcripts, closed cleanly.
async fn make_database(path: &Path) {
    let store = Store::open_async(path).await.unwrap();
    for i in 0..200 {
        let id = format!("session-{i}");
        store
            .sessions()
            .get_or_create_session(&format!("key-{i}"), id.clone())
            .await
            .unwrap();
        store
            .transcripts()
            .append_many(&id, vec![TranscriptEntry::user("hello ".repeat(20))])
            .await
            .unwrap();
    }
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_damaged_pages_is_refused_with_its_path() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("telegate.db");
    make_database(&db).await;
    // Garbage over every page but the first (the schema stays readable).
    let len = std::fs::metadata(&db).unwrap().len() as usize;
    assert!(len > 3 * 4096, "a database of several pages");
    let mut bytes = std::fs::read(&db).unwrap();
    for (i, b) in bytes[4096..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    std::fs::write(&db, bytes).unwrap();

    let (code, stderr) = run_binary(
        dir.path(),
        &test_bot(&fake, &data_dir_line(&data), "[agent]\nbackend = \"echo\"").text(),
    )
    .await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(code.is_some(), "exited by itself: {stderr}");
    assert!(stderr.contains(&db.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("damaged") && stderr.contains("backup"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_truncated_to_zero_bytes_is_reported_not_recreated() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("telegate.db");
    make_database(&db).await;
    std::fs::File::create(&db).unwrap(); // truncates to 0 bytes
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0);

    let (code, stderr) = run_binary(
        dir.path(),
        &test_bot(&fake, &data_dir_line(&data), "[agent]\nbackend = \"echo\"").text(),
    )
    .await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains(&db.display().to_string()), "{stderr}");
    assert!(stderr.contains("empty (0 bytes)"), "{stderr}");
    assert_eq!(
        std::fs::metadata(&db).unwrap().len(),
        0,
        "the file is left as it was"
    );
}

async fn healthz(addr: std::net::SocketAddr) -> (u16, String) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let response = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_told_to_the_chat_and_to_healthz_never_papered_over() {
    let fake = FakeBotApi::start().await;
    let settings = test_bot(
        &fake,
        "in_memory = true",
        "[metrics]\nlisten = \"127.0.0.1:0\"",
    );
    let agent = ScriptedAgent::new();
    let bot = settings.agent(agent.clone()).start().await.unwrap();
    let addr = bot.metrics_addr.expect("the metrics listener runs");
    // Creating a session fails from now on (as on a full disk); the inbox
    // still records updates.
    support::store_faults::refuse_new_sessions(&bot.store).await;
    fake.push_text(USER, USER, "hello");
    let told = "I cannot save this conversation right now";
    assert!(
        fake.wait_for(
            |_| fake.sent_texts(USER).iter().any(|t| t.contains(told)),
            WAIT
        )
        .await
    );
    assert!(fake
        .sent_texts(USER)
        .iter()
        .all(|t| !t.contains("answer:hello")));
    assert!(
        bot.engine.runner.current_session(&key()).is_none(),
        "no memory-only session"
    );
    let (status, body) = healthz(addr).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("store") && body.contains("disk is full"),
        "{body}"
    );

    // Writes work again: the chat works and /healthz recovers.
    support::store_faults::allow_new_sessions(&bot.store).await;
    fake.push_text(USER, USER, "again");
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("answer:again")),
            WAIT
        )
        .await
    );
    let (status, body) = healthz(addr).await;
    assert_eq!(status, 200, "{body}");
    bot.shutdown().await;
}

/// Ask `/healthz` until its status is `status` and its body contains
/// `needle` (bounded); returns the body.
async fn wait_health(addr: std::net::SocketAddr, status: u16, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (got, body) = healthz(addr).await;
        if got == status && body.contains(needle) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/healthz never answered {status} with {needle:?}; last {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failing_kind_of_write_turns_healthz_503_until_it_works_again() {
    let fake = FakeBotApi::start().await;
    let settings = test_bot(
        &fake,
        "in_memory = true",
        "[metrics]\nlisten = \"127.0.0.1:0\"",
    );
    let bot = settings.agent(ScriptedAgent::new()).start().await.unwrap();
    let addr = bot.metrics_addr.expect("the metrics listener runs");
    let answered = |text: &str| {
        let fake = &fake;
        let answer = format!("answer:{text}");
        move |_: &[support::fake_bot::RecordedCall]| {
            fake.sent_texts(USER).iter().any(|t| t.contains(&answer))
        }
    };
    // (writer, the write that fails, what /healthz names)
    let writers = [
        ("intake", "INSERT", "inbox", "inbox writes are failing"),
        (
            "ledger",
            "UPDATE",
            "inbox",
            "message states writes are failing",
        ),
        ("outbox", "INSERT", "outbox", "outbox writes are failing"),
        (
            "transcript",
            "INSERT",
            "transcripts",
            "transcripts writes are failing",
        ),
    ];
    for (writer, event, table, named) in writers {
        wait_health(addr, 200, "\"store\":\"ok\"").await;
        support::store_faults::fail_writes(&bot.store, event, table).await;
        let failing = format!("while {writer} fails");
        fake.push_text(USER, USER, &failing);
        let body = wait_health(addr, 503, named).await;
        assert!(body.contains("disk is full"), "{writer}: {body}");

        // Writes of that kind work again: so does /healthz, once one is made.
        // (The message is answered first, so the next one cannot interrupt
        // its turn; the intake's is answered only once it can be recorded.)
        support::store_faults::allow_writes(&bot.store, event, table).await;
        assert!(fake.wait_for(answered(&failing), WAIT).await, "{writer}");
        let again = format!("after {writer}");
        fake.push_text(USER, USER, &again);
        assert!(fake.wait_for(answered(&again), WAIT).await, "{writer}");
        wait_health(addr, 200, "\"store\":\"ok\"").await;
    }
    bot.shutdown().await;
}

fn key() -> telegate::vocab::SessionKey {
    use telegate::vocab::{KeyPolicy, Platform, SessionKey, SessionSource};
    SessionKey::for_source(
        &SessionSource::dm(Platform::Telegram, USER),
        KeyPolicy::default(),
    )
}

async fn inbox_ids(store: &Store) -> Vec<i64> {
    store
        .call(|c| {
            let mut s =
                c.prepare("SELECT update_id FROM inbox WHERE update_id < 1000 ORDER BY update_id")?;
            let rows = s.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_finished_inbox_rows_are_pruned_at_start_and_transcripts_stay() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("telegate.db");
    {
        let store = Store::open_async(&db).await.unwrap();
        for (id, state, age_days) in [
            (1, InboxState::Answered, 10),
            (2, InboxState::Dropped, 10),
            (3, InboxState::Failed, 4),
            (4, InboxState::Answered, 1),
        ] {
            store
                .inbox()
                .record_update(id, -5, Some(id), serde_json::json!({}), state, None)
                .await
                .unwrap();
            store
                .call(move |c| {
                    Ok(c.execute(
                        "UPDATE inbox SET updated_at = updated_at - ?1 * 86400000 WHERE update_id = ?2",
                        rusqlite::params![age_days, id],
                    )?)
                })
                .await
                .unwrap();
        }
        store
            .transcripts()
            .append_many("old-session", vec![TranscriptEntry::user("kept")])
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let settings = test_bot(
        &fake,
        &format!("{}\ninbox_retention_days = 3", data_dir_line(dir.path())),
        "",
    );
    let bot = settings.agent(ScriptedAgent::new()).start().await.unwrap();
    let store = bot.store.clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    while inbox_ids(&store).await != vec![4] && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(inbox_ids(&store).await, vec![4]);
    assert_eq!(
        store
            .transcripts()
            .transcript_len("old-session")
            .await
            .unwrap(),
        1
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_reaches_sqlite() {
    let fake = FakeBotApi::start().await;
    for (setting, expected) in [
        ("", 1i64),
        ("synchronous = \"normal\"", 1),
        ("synchronous = \"full\"", 2),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let settings = test_bot(
            &fake,
            &format!("{}\n{setting}", data_dir_line(dir.path())),
            "",
        );
        let bot = settings.agent(ScriptedAgent::new()).start().await.unwrap();
        let level: i64 = bot
            .store
            .call(|c| Ok(c.pragma_query_value(None, "synchronous", |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(level, expected, "{setting:?}");
        bot.shutdown().await;
    }
}

/// `check-config` on `text`: (success, stdout + stderr).
fn check(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bot.toml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_telegate"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("TELEGRAM_BOT_TOKEN")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn check_config_catches_the_store_and_approver_keys() {
    let base = "[telegram]\ntoken = \"1:a\"\nallowed_users = [1, 2]\n";
    let (ok, out) = check(&format!(
        "{base}approvers = [2]\n[store]\ninbox_retention_days = 30\nsynchronous = \"full\"\n"
    ));
    assert!(ok, "{out}");
    assert!(out.contains("1 approver(s)"), "{out}");
    for (bad, needle) in [
        (
            "[store]\ninbox_retention_days = 0\n",
            "inbox_retention_days",
        ),
        (
            "[store]\ninbox_retention_days = 100000\n",
            "inbox_retention_days",
        ),
        ("[store]\nsynchronous = \"off\"\n", "unknown variant `off`"),
        ("[store]\ninbox_retention_days = -1\n", "bot.toml:5"),
    ] {
        let (ok, out) = check(&format!("{base}{bad}"));
        assert!(!ok, "{bad:?} passed: {out}");
        assert!(out.contains(needle), "{bad:?}: {out}");
    }
    let (ok, out) = check("[telegram]\ntoken = \"1:a\"\nallowed_users = [1]\napprovers = [9]\n");
    assert!(!ok, "{out}");
    assert!(out.contains("approvers lists 9"), "{out}");
    // In an allowed_chats group anyone may write, so any approver can reach the bot.
    let (ok, out) = check(
        "[telegram]\ntoken = \"1:a\"\nallowed_users = [1]\nallowed_chats = [-5]\napprovers = [9]\n",
    );
    assert!(ok, "{out}");
}
