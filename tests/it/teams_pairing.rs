//! Pairing on the built binary, from an empty data directory (issue 26,
//! item 1): the code the start prints pairs the first user, then stops
//! working; wrong codes are limited per user (in the store, so a restart
//! does not reset them); `telegate pair` adds a code to a running bot;
//! a restart keeps the owner; `kill -9` while the pairing is answered
//! leaves exactly one owner.
//!
//! Nothing waits for a time: every step waits (bounded) for what the fake
//! Bot API records, and replies of the same chat are compared only once
//! a later reply shows the earlier ones were handled.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use support::binary::{until, Telegate};
use support::fake_bot::{Failure, FakeBotApi};
use support::test_bot::TestBot;

const WAIT: Duration = Duration::from_secs(30);

fn toml_str(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

/// A bot nobody may use: no allowlist at all.
fn configure(dir: &Path, fake: &FakeBotApi) -> PathBuf {
    let text = TestBot::new(fake)
        .toml(format!(
            "[store]\ndata_dir = {data}\n\n\
             [delivery]\nper_chat_interval_ms = 1\ngroup_messages_per_minute = 100000\n\
             global_messages_per_second = 100000\n\n\
             [log]\nlevel = \"info\"\n",
            data = toml_str(&dir.join("data")),
        ))
        .text();
    let path = dir.join("telegate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The code in the last `/pair CODE` the process printed.
fn printed_code(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .filter_map(|line| line.split("/pair ").nth(1))
        .filter_map(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .find(|code| code.len() == 10)
        .map(str::to_string)
}

async fn code_of(telegate: &Telegate) -> String {
    telegate.wait_log("/pair ").await;
    printed_code(&telegate.log()).expect("the start printed a pairing code")
}

async fn wait_text(fake: &FakeBotApi, chat: i64, needle: &str, telegate: &Telegate) {
    let seen = fake
        .wait_for(
            |_| fake.sent_texts(chat).iter().any(|t| t.contains(needle)),
            WAIT,
        )
        .await;
    assert!(
        seen,
        "no {needle:?} sent to {chat}: {:?}\n{}",
        fake.sent_texts(chat),
        telegate.log()
    );
}

fn owners(dir: &Path) -> Vec<i64> {
    let conn = rusqlite::Connection::open(dir.join("data/telegate.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT user_id FROM members WHERE role = 'owner'")
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

fn count(fake: &FakeBotApi, chat: i64, needle: &str) -> usize {
    fake.sent_texts(chat)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_code_pairs_the_first_user_once_and_a_restart_keeps_the_owner() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = configure(dir.path(), &fake);
    let mut telegate = Telegate::start("first", &config, &fake, None);
    telegate.ready(&fake).await;
    let code = code_of(&telegate).await;
    assert!(
        telegate.log().contains("nobody may use the bot yet"),
        "{}",
        telegate.log()
    );
    // The banner says which bot the code is for (several bots may print
    // theirs side by side).
    let bot = format!("@{}", fake.config().username);
    assert!(
        telegate
            .log()
            .contains(&format!("Nobody may use the bot {bot} yet")),
        "{}",
        telegate.log()
    );

    // Before pairing, a message runs nothing: the sender is told their id.
    fake.push_text(100, 100, "hello?");
    wait_text(&fake, 100, "Your user id is 100", &telegate).await;
    // The code, typed in lower case with a space, pairs user 100.
    let typed = format!("{} {}", &code[..5].to_lowercase(), &code[5..]);
    fake.push_text(100, 100, &format!("/pair {typed}"));
    wait_text(&fake, 100, "You are the owner of this bot", &telegate).await;
    fake.push_text(100, 100, "now I may talk");
    wait_text(&fake, 100, "now I may talk", &telegate).await;
    // The same code again, from someone else: refused, no turn.
    fake.push_text(200, 200, &format!("/pair {code}"));
    wait_text(&fake, 200, "That code is not valid", &telegate).await;
    assert_eq!(owners(dir.path()), [100]);
    // The code was shown once: at the start, never again in the log.
    assert_eq!(
        telegate.log().matches(code.as_str()).count(),
        2,
        "stderr and the log line"
    );

    telegate.stop().await;
    let second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    fake.push_text(100, 100, "still the owner?");
    wait_text(&fake, 100, "still the owner?", &second).await;
    assert!(
        !second.log().contains("/pair "),
        "a paired bot prints no code:\n{}",
        second.log()
    );
    fake.push_text(200, 200, &format!("/pair {code}"));
    let refusals = until(|| count(&fake, 200, "That code is not valid") == 2).await;
    assert!(refusals, "{:?}", fake.sent_texts(200));
    assert_eq!(owners(dir.path()), [100]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_codes_are_limited_per_user_across_restarts_and_telegate_pair_adds_a_code() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = configure(dir.path(), &fake);
    let mut telegate = Telegate::start("first", &config, &fake, None);
    telegate.ready(&fake).await;
    let started_with = code_of(&telegate).await;
    // Four wrong tries, then a restart, then the fifth: the budget of 5
    // per hour is kept in the store.
    for attempt in 0..4 {
        fake.push_text(300, 300, &format!("/pair WRONGCODE{attempt}"));
    }
    let four = until(|| count(&fake, 300, "That code is not valid") == 4).await;
    assert!(four, "{:?}", fake.sent_texts(300));
    telegate.stop().await;
    let mut telegate = Telegate::start("second", &config, &fake, None);
    telegate.ready(&fake).await;
    fake.push_text(300, 300, "/pair WRONGCODE4");
    wait_text(&fake, 300, "cannot try another one this hour", &telegate).await;

    // A code made by `telegate pair` for the running bot.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_telegate"))
        .args(["pair", "--config"])
        .arg(&config)
        .env_remove("TELEGRAM_BOT_TOKEN")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh = printed_code(&stdout).expect("telegate pair prints a code");
    assert_ne!(fresh, started_with);

    // User 300 is out of tries: even the right code is not checked, and
    // not answered. User 400, behind them, pairs with it.
    fake.push_text(300, 300, &format!("/pair {fresh}"));
    fake.push_text(400, 400, &format!("/pair {fresh}"));
    wait_text(&fake, 400, "You are the owner of this bot", &telegate).await;
    assert_eq!(owners(dir.path()), [400]);
    let answered = fake.sent_texts(300);
    assert_eq!(
        answered.len(),
        5,
        "the sixth code got no answer at all: {answered:?}"
    );
    // Pairing is over: `telegate pair` says so.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_telegate"))
        .args(["pair", "--config"])
        .arg(&config)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("already has an owner (user 400)"),
        "{stderr}"
    );
    telegate.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_the_pairing_is_answered_leaves_exactly_one_owner() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = configure(dir.path(), &fake);
    let mut telegate = Telegate::start("first", &config, &fake, None);
    telegate.ready(&fake).await;
    let code = code_of(&telegate).await;
    // The answers to the pairing hang: the process is killed while it
    // answers, with the second user's try still behind it.
    let before = fake.calls_to("sendMessage").len();
    fake.fail_next("sendMessage", 2, Failure::Hang);
    fake.push_texts(&[
        (500, 500, format!("/pair {code}")),
        (600, 600, format!("/pair {code}")),
    ]);
    let answering = fake
        .wait_for(
            |calls| calls.iter().filter(|c| c.method == "sendMessage").count() > before,
            WAIT,
        )
        .await;
    assert!(answering, "{}", telegate.log());
    telegate.kill9().await;
    fake.clear_failures();
    let first_owners = owners(dir.path());
    assert_eq!(first_owners.len(), 1, "exactly one owner: {first_owners:?}");
    let owner = first_owners[0];
    let other = if owner == 500 { 600 } else { 500 };

    let second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    fake.push_text(owner, owner, "am I the owner?");
    wait_text(&fake, owner, "am I the owner?", &second).await;
    fake.push_text(other, other, &format!("/pair {code}"));
    wait_text(&fake, other, "That code is not valid", &second).await;
    assert_eq!(owners(dir.path()), [owner]);
}
