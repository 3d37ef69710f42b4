//! What a restart must not break, on the built binary (issue 21, items 5,
//! 7 and 9): only a new process counts its generations afresh, only
//! `kill -9` leaves children without their parent, only a real process
//! has a umask of its own.
//!
//! * a Stop button, and Telegram's stop control on a draft, from before a
//!   restart do not stop the new process's turn (a turn's generation is
//!   unique across restarts), nor does a button an older telegate stored;
//! * after `kill -9`, a command-backend program and a terminal background
//!   process are gone: the leader at once (parent-death signal), what it
//!   left in its group at the next start, before recovery runs the message
//!   again, so its side effect happens once;
//! * with umask 022 the data directory, the media and outbox directories
//!   are 0700 and the database files 0600, looser ones are tightened at
//!   start, and `history = "env-file"` files live under the data
//!   directory.
//!
//! Side effects wait for a file the test creates (never for a time), so
//! whether a leftover could still act is decided by the test, not by the
//! machine's speed.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use support::binary::{alive, group_members, until, Telegate};
use support::fake_bot::FakeBotApi;
use support::fake_openai::{last_user_contains, tool_result_after, FakeOpenAi, Script};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(30);

fn toml_str(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

/// The parts of every configuration here; `rest` adds the backend.
fn config_text(fake: &FakeBotApi, data_dir: &Path, streaming: &str, rest: &str) -> String {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[sessions]\nresume_interrupted = true\n\n\
             [store]\ndata_dir = {data_dir}\n\n\
             [delivery]\nstreaming = \"{streaming}\"\n\n\
             [log]\nlevel = \"info\"\n\n{rest}",
            data_dir = toml_str(data_dir),
        ))
        .text()
}

fn echo_backend(delay_ms: u64) -> String {
    format!("[agent]\nbackend = \"echo\"\n\n[agent.echo]\ndelay_ms = {delay_ms}\n")
}

/// Write the configuration (again) and return its path.
fn configure(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("telegate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn count_texts(fake: &FakeBotApi, needle: &str) -> usize {
    fake.sent_texts(USER)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

async fn wait_text(fake: &FakeBotApi, needle: &str, telegate: &Telegate) {
    let found = fake.wait_for(|_| count_texts(fake, needle) > 0, WAIT).await;
    assert!(
        found,
        "no {needle:?} in the chat: {:?}\n{}",
        fake.sent_texts(USER),
        telegate.log()
    );
}

/// The toasts (`answerCallbackQuery` texts) since call `since`.
fn toasts_since(fake: &FakeBotApi, since: u64) -> Vec<String> {
    fake.calls_to("answerCallbackQuery")
        .iter()
        .filter(|c| c.seq >= since)
        .map(|c| c.text().unwrap_or_default().to_string())
        .collect()
}

/// `(message id, callback data)` of a Stop button any version of a bot
/// message in the chat ever carried.
fn stop_button(fake: &FakeBotApi) -> Option<(i64, String)> {
    for message in fake.message_history(USER) {
        for version in &message.versions {
            let markup = match &version.reply_markup {
                Some(Value::String(raw)) => serde_json::from_str(raw).unwrap_or(Value::Null),
                Some(other) => other.clone(),
                None => continue,
            };
            for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
                for key in row.as_array().into_iter().flatten() {
                    if key["text"].as_str().unwrap_or_default().contains("Stop") {
                        let data = key["callback_data"].as_str().unwrap_or_default();
                        return Some((message.message_id, data.to_string()));
                    }
                }
            }
        }
    }
    None
}

/// A turn of the process that made call `since` or later is visibly
/// running in the chat ("typing…").
async fn wait_turn_running(fake: &FakeBotApi, since: u64, telegate: &Telegate) {
    let running = fake
        .wait_for(
            |calls| {
                calls.iter().any(|c| {
                    c.seq >= since && c.method == "sendChatAction" && c.chat_id() == Some(USER)
                })
            },
            WAIT,
        )
        .await;
    assert!(running, "the new turn never ran\n{}", telegate.log());
}

/// The new turn still runs: /stop stops it, and it is the only stop.
async fn stop_finds_the_turn_running(fake: &FakeBotApi, telegate: &Telegate) {
    fake.push_text(USER, USER, "/stop");
    wait_text(fake, "⏹ Stopped.", telegate).await;
    assert_eq!(count_texts(fake, "⏹ Stopped."), 1, "stopped once, by /stop");
    assert_eq!(count_texts(fake, "Nothing to stop"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_button_from_before_a_restart_does_not_stop_the_new_turn() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = configure(
        dir.path(),
        &config_text(&fake, &data, "edit", &echo_backend(300)),
    );
    let mut first = Telegate::start("first", &config, &fake, None);
    first.ready(&fake).await;
    fake.push_text(USER, USER, "first turn");
    wait_text(&fake, "echo: first turn", &first).await;
    let (preview, old_stop) = stop_button(&fake).expect("the preview had a Stop button");
    first.stop().await;

    // A new process; its first turn runs long.
    configure(
        dir.path(),
        &config_text(&fake, &data, "edit", &echo_backend(60_000)),
    );
    let mut second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    fake.push_text(USER, USER, "second turn");
    wait_turn_running(&fake, second.first_seq, &second).await;
    // Turn 1's button is pressed now, a day's button lifetime later.
    let since = fake.calls().last().map_or(0, |c| c.seq + 1);
    fake.push_callback_query(USER, USER, preview, &old_stop);
    let answered = fake
        .wait_for(|_| !toasts_since(&fake, since).is_empty(), WAIT)
        .await;
    assert!(answered, "the press was never answered\n{}", second.log());
    assert_eq!(
        toasts_since(&fake, since),
        vec!["Already finished.".to_string()],
        "a Stop button from before the restart named the new turn"
    );
    assert_eq!(count_texts(&fake, "⏹ Stopped."), 0);
    stop_finds_the_turn_running(&fake, &second).await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_button_stored_by_an_older_telegate_is_stale() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = configure(
        dir.path(),
        &config_text(&fake, &data, "edit", &echo_backend(60_000)),
    );
    // What an older telegate stored: the Stop button of its turn 1.
    {
        let store = telegate::store::Store::open_async(data.join("telegate.db"))
            .await
            .unwrap();
        store
            .buttons()
            .create_buttons(vec![telegate::store::NewButton {
                id: "oldstop1".into(),
                row_id: "oldrow1".into(),
                chat_id: USER,
                chat_type: "dm".into(),
                thread_id: None,
                owner_id: Some(USER as u64),
                owner_name: None,
                action: json!({"do": "stop", "generation": 1}),
                expires_at: telegate::store::now_ms() + 3_600_000,
            }])
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let mut bot = Telegate::start("upgraded", &config, &fake, None);
    bot.ready(&fake).await;
    fake.push_text(USER, USER, "a new turn");
    wait_turn_running(&fake, bot.first_seq, &bot).await;
    let since = fake.calls().last().map_or(0, |c| c.seq + 1);
    fake.push_callback_query(USER, USER, 1, "b:oldstop1");
    let answered = fake
        .wait_for(|_| !toasts_since(&fake, since).is_empty(), WAIT)
        .await;
    assert!(answered, "the press was never answered\n{}", bot.log());
    assert_eq!(
        toasts_since(&fake, since),
        vec!["Already finished.".to_string()]
    );
    stop_finds_the_turn_running(&fake, &bot).await;
    bot.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_stop_from_before_a_restart_does_not_stop_the_new_turn() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = configure(
        dir.path(),
        &config_text(&fake, &data, "draft", &echo_backend(300)),
    );
    let mut first = Telegate::start("first", &config, &fake, None);
    first.ready(&fake).await;
    fake.push_text(USER, USER, "first turn");
    wait_text(&fake, "echo: first turn", &first).await;
    let old_draft = fake
        .drafts(USER)
        .first()
        .expect("the turn streamed drafts")
        .0;
    first.stop().await;

    configure(
        dir.path(),
        &config_text(&fake, &data, "draft", &echo_backend(20_000)),
    );
    let mut second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    let drafted = fake.drafts(USER).len();
    fake.push_text(USER, USER, "second turn with enough words to draft soon");
    let streaming = fake
        .wait_for(|_| fake.drafts(USER).len() > drafted, WAIT)
        .await;
    assert!(streaming, "the new turn never drafted\n{}", second.log());
    // Telegram's stop control on the old draft, delivered now.
    fake.push_draft_stop(USER, old_draft);
    second
        .wait_log("draft stop for a turn already finished")
        .await;
    assert_eq!(count_texts(&fake, "⏹ Stopped."), 0);
    stop_finds_the_turn_running(&fake, &second).await;
    let new_draft = fake.drafts(USER)[drafted].0;
    assert_ne!(
        new_draft, old_draft,
        "the new turn's draft id is an old one"
    );
    second.stop().await;
}

/// A program that records its group (its pid, `$$`) in `leaders`, leaves a
/// child in its group that appends to `effects` once `go` exists, and
/// waits for it.
fn side_effect_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "echo $$ >> {d}/leaders; \
         ( while [ ! -e {d}/go ]; do sleep 0.05; done; echo effect >> {d}/effects ) & \
         wait; echo done"
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// After `kill -9`: the group's leader is gone at once, what it left in
/// its group is still there (the next start's job).
async fn leader_died_with_telegate(pgid: i32) {
    assert!(
        until(|| !alive(pgid)).await,
        "the program's leader {pgid} outlived telegate"
    );
    assert!(
        !group_members(pgid).is_empty(),
        "precondition: the leader's child outlives it"
    );
}

async fn group_gone(pgid: i32, telegate: &Telegate) {
    assert!(
        until(|| group_members(pgid).is_empty()).await,
        "processes of the killed run's group {pgid} still run after the restart: {:?}\n{}",
        group_members(pgid),
        telegate.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_program_killed_with_telegate_does_not_run_twice() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let backend = format!(
        "[agent]\nbackend = \"command\"\n\n[agent.command]\nargv = [\"sh\", \"-c\", {}]\n",
        toml::Value::String(side_effect_script(&work))
    );
    let config = configure(
        dir.path(),
        &config_text(&fake, &dir.path().join("data"), "edit", &backend),
    );
    let mut first = Telegate::start("first", &config, &fake, None);
    first.ready(&fake).await;
    fake.push_text(USER, USER, "do it once");
    assert!(until(|| lines(&work.join("leaders")).len() == 1).await);
    let pgid: i32 = lines(&work.join("leaders"))[0].parse().unwrap();
    assert!(until(|| group_members(pgid).len() >= 2).await);
    first.kill9().await;
    leader_died_with_telegate(pgid).await;

    // The restart kills the rest before recovery runs the message again.
    let mut second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    group_gone(pgid, &second).await;
    std::fs::write(work.join("go"), "").unwrap();
    wait_text(&fake, "done", &second).await;
    assert_eq!(lines(&work.join("leaders")).len(), 2, "run again once");
    assert_eq!(
        lines(&work.join("effects")),
        vec!["effect".to_string()],
        "the side effect happened once"
    );
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_background_process_dies_with_telegate() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let backend = format!(
        "[agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"fake\"\n\
         api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n\n\
         [tools.terminal]\nenabled = true\napproval = \"never\"\n",
        llm.base_url()
    );
    llm.push_when(
        last_user_contains("start the job"),
        Script::tool_call(
            "terminal",
            &json!({ "command": side_effect_script(&work), "background": true }).to_string(),
            "c1",
        ),
    );
    llm.push_when(
        tool_result_after("start the job"),
        Script::text("job started"),
    );
    let config = configure(
        dir.path(),
        &config_text(&fake, &dir.path().join("data"), "edit", &backend),
    );
    let mut first = Telegate::start("first", &config, &fake, None);
    first.ready(&fake).await;
    fake.push_text(USER, USER, "start the job");
    wait_text(&fake, "job started", &first).await;
    assert!(until(|| lines(&work.join("leaders")).len() == 1).await);
    let pgid: i32 = lines(&work.join("leaders"))[0].parse().unwrap();
    assert!(until(|| group_members(pgid).len() >= 2).await);
    first.kill9().await;
    leader_died_with_telegate(pgid).await;

    let mut second = Telegate::start("second", &config, &fake, None);
    second.ready(&fake).await;
    group_gone(pgid, &second).await;
    // Its owner hears that it is gone; nothing of it can act any more.
    wait_text(&fake, "was stopped with telegate", &second).await;
    std::fs::write(work.join("go"), "").unwrap();
    assert!(lines(&work.join("effects")).is_empty());
    second.stop().await;
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every directory under `root` (itself included).
fn directories(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.to_path_buf()];
    let mut next = 0;
    while next < found.len() {
        let dir = found[next].clone();
        next += 1;
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// The data directory and what is in it is telegate's user's alone.
fn assert_private(data: &Path) {
    for dir in directories(data) {
        assert_eq!(format!("{:o}", mode(&dir)), "700", "{}", dir.display());
    }
    for name in [
        "telegate.db",
        "telegate.db-wal",
        "telegate.db-shm",
        "telegate.db.created",
        "telegate.lock",
    ] {
        assert_eq!(format!("{:o}", mode(&data.join(name))), "600", "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_is_private_whatever_the_umask() {
    use support::fake_files::photo_json;
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Made by hand, readable by everyone: tightened at start.
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let backend = "[agent]\nbackend = \"command\"\n\n[agent.command]\n\
                   argv = [\"sh\", \"-c\", \"echo history=$TELEGATE_HISTORY_FILE\"]\n\
                   history = \"env-file\"\n";
    let config = configure(dir.path(), &config_text(&fake, &data, "edit", backend));
    let mut first = Telegate::start("first", &config, &fake, Some(0o022));
    first.ready(&fake).await;
    // A saved photo (media directory) and an answered turn (its outbox).
    let file = fake.files().add(vec![1, 2, 3], "jpg");
    let mut photo = photo_json(&file, "uphoto", 3);
    photo["caption"] = json!("a photo");
    fake.push_media(USER, USER, photo);
    wait_text(&fake, "history=", &first).await;
    let said = fake
        .sent_texts(USER)
        .into_iter()
        .find(|t| t.contains("history="))
        .unwrap();
    let history = PathBuf::from(said.trim().trim_start_matches("history="));
    assert!(
        history.starts_with(data.join("command-history")),
        "the history file is not under the data directory: {said}"
    );
    assert!(data.join("media").is_dir() && data.join("media/outbox").is_dir());
    assert!(
        directories(&data.join("media")).len() >= 4,
        "{:?}",
        directories(&data)
    );
    assert_private(&data);
    first.wait_log("tightened its permissions").await;
    first.stop().await;

    // Loosened by hand while stopped (and a history file left behind):
    // the next start tightens and clears them.
    for (path, loose) in [
        (data.clone(), 0o755),
        (data.join("telegate.db"), 0o644),
        (data.join("telegate.db.created"), 0o644),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).unwrap();
    }
    let leftover = data.join("command-history/telegate-history-1-2-0.json");
    std::fs::write(&leftover, "[]").unwrap();
    let mut second = Telegate::start("second", &config, &fake, Some(0o022));
    second.ready(&fake).await;
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join("telegate.db")), 0o600);
    assert_eq!(mode(&data.join("telegate.db.created")), 0o600);
    assert!(
        !leftover.exists(),
        "a history file left by a killed run stayed"
    );
    second.stop().await;
}
