//! Files leave only by an opened, checked handle (issue 21): a file swapped
//! for a symbolic link to a root-only file between the check and the
//! upload is never sent; with `run_as`, neither is a hard link to one.
//! Many sends race a thread that swaps the file in a loop; the fake Bot
//! API's recorded uploads must never hold the root-only bytes.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::fake_bot::FakeBotApi;
use telegate::delivery::files::TelegramFileSender;
use telegate::delivery::{Delivery, DeliveryConfig, RateLimits};
use telegate::media::handle::Reader;
use telegate::media::outbox::{FileRefusal, SendOutcome, Workspace};
use telegate::media::OutboxFiles;
use telegate::vocab::{Platform, SessionSource};

const USER: i64 = 42;
const SECRET: &[u8] = b"ROOT-ONLY-SECRET";
const HARMLESS: &[u8] = b"harmless";

fn fast_delivery(fake: &FakeBotApi) -> Delivery {
    Delivery::new(
        fake.bot(),
        DeliveryConfig {
            limits: RateLimits {
                per_chat_interval: Duration::from_millis(0),
                group_per_minute: 100_000,
                global_per_second: 100_000,
            },
            ..DeliveryConfig::default()
        },
    )
}

/// What the agent's user puts at `swap.txt`, in turn.
#[derive(Clone, Copy)]
enum Swap {
    Harmless,
    Symlink,
    HardLink,
}

/// Swap `root/swap.txt` through `cycle` (renamed into place, so the name
/// always exists) until `stop`, each for a while, so every kind is seen.
fn swapper(
    root: PathBuf,
    secret: PathBuf,
    cycle: Vec<Swap>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let staged = root.join(".staged");
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let _ = std::fs::remove_file(&staged);
            let swap = cycle[n % cycle.len()];
            match swap {
                Swap::Harmless => {
                    std::fs::write(&staged, HARMLESS).unwrap();
                    let public = std::os::unix::fs::PermissionsExt::from_mode(0o644);
                    std::fs::set_permissions(&staged, public).unwrap();
                }
                Swap::Symlink => std::os::unix::fs::symlink(&secret, &staged).unwrap(),
                Swap::HardLink => std::fs::hard_link(&secret, &staged).unwrap(),
            }
            std::fs::rename(&staged, root.join("swap.txt")).unwrap();
            // Every kind stays in place a while, so that each is seen by
            // some send even on a loaded machine (a link held only
            // between two renames was missed under load).
            std::thread::sleep(Duration::from_micros(300));
            n += 1;
        }
    })
}

/// Race 400 sends of `swap.txt` against the swapper; returns the outcomes.
async fn race(
    cycle: Vec<Swap>,
    reader: Option<Reader>,
) -> (FakeBotApi, Vec<Result<SendOutcome, FileRefusal>>) {
    use std::os::unix::fs::PermissionsExt;
    let fake = FakeBotApi::start().await;
    let outside = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let root = workspace.path().to_path_buf();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(root.join("swap.txt"), HARMLESS).unwrap();
    let sender = Arc::new(TelegramFileSender::new(fast_delivery(&fake)));
    let media = tempfile::tempdir().unwrap();
    let files = OutboxFiles::new(sender, None, media.path().to_path_buf());
    let to = SessionSource::dm(Platform::Telegram, USER);
    let workspace = Workspace::new(&root, reader);
    let stop = Arc::new(AtomicBool::new(false));
    let swapping = swapper(root.clone(), secret, cycle, stop.clone());
    let mut outcomes = Vec::new();
    for _ in 0..400 {
        let sent = files
            .send(&to, None, &workspace, Path::new("swap.txt"), None, "tool:")
            .await;
        outcomes.push(sent);
        // The swapper shares two cores with everything else.
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    (fake, outcomes)
}

fn assert_never_leaked(fake: &FakeBotApi, outcomes: &[Result<SendOutcome, FileRefusal>]) {
    let uploads = fake.files().uploads();
    let leaked = uploads.iter().filter(|u| u.bytes == SECRET).count();
    assert_eq!(
        leaked,
        0,
        "{leaked} of {} uploads were the root-only file",
        uploads.len()
    );
    assert!(
        uploads.iter().all(|u| u.bytes == HARMLESS),
        "only the harmless file went out"
    );
    let sent = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(SendOutcome::Sent)))
        .count();
    assert_eq!(sent, uploads.len());
    assert!(sent > 0, "some sends of the harmless file went through");
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, Err(FileRefusal::Link(_)))),
        "the race saw the symbolic link"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_swapped_for_a_symlink_to_a_root_only_file_is_never_sent() {
    let (fake, outcomes) = race(vec![Swap::Harmless, Swap::Symlink], None).await;
    assert_never_leaked(&fake, &outcomes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_run_as_neither_a_symlink_nor_a_hard_link_sends_a_root_only_file() {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    // Not this process's user: the secret (0600, ours) is not theirs.
    let reader = Reader {
        uid: me.wrapping_add(4242),
        gid: 4242,
    };
    let cycle = vec![
        Swap::Harmless,
        Swap::Symlink,
        Swap::Harmless,
        Swap::HardLink,
    ];
    let (fake, outcomes) = race(cycle, Some(reader)).await;
    assert_never_leaked(&fake, &outcomes);
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, Err(FileRefusal::Linked(_) | FileRefusal::Unreadable(_)))),
        "the race saw the hard link"
    );
}

/// An upload Telegram answers after 19 s (teloxide's client gave every
/// request 17 s) is not reported failed: its timeout grows with the file,
/// from a floor above that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_slower_than_seventeen_seconds_is_not_reported_failed() {
    use support::fake_bot::Failure;
    let fake = FakeBotApi::start().await;
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("report.txt"), b"slow").unwrap();
    let sender = Arc::new(TelegramFileSender::new(fast_delivery(&fake)));
    let media = tempfile::tempdir().unwrap();
    let files = OutboxFiles::new(sender, None, media.path().to_path_buf());
    let to = SessionSource::dm(Platform::Telegram, USER);
    fake.fail_next("sendDocument", 1, Failure::Delay(Duration::from_secs(19)));
    let sent = files
        .send(
            &to,
            None,
            &Workspace::new(workspace.path(), None),
            Path::new("report.txt"),
            None,
            "tool:",
        )
        .await;
    assert_eq!(sent, Ok(SendOutcome::Sent));
    let uploads = fake.files().uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].bytes, b"slow");
}

/// Without `[tools.terminal] workdir` the model is not offered
/// `send_file`: it never falls back to telegate's own directory (which
/// holds its config and database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_file_is_not_offered_without_a_workdir() {
    use support::fake_openai::{FakeOpenAi, Script};
    use support::test_bot::TestBot;
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let test_bot = |terminal: &str| {
        TestBot::new(&fake).users(&[USER]).toml(format!(
            "[delivery]\nper_chat_interval_ms = 1\n\n[store]\nin_memory = true\n\n\
             [agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"m\"\n\
             api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n\n[tools.terminal]\nenabled = true\n{terminal}\n",
            llm.base_url()
        ))
    };
    let workdir = tempfile::tempdir().unwrap();
    let with_workdir = format!("workdir = \"{}\"", workdir.path().display());
    for (terminal, offered) in [("", false), (with_workdir.as_str(), true)] {
        let bot = test_bot(terminal).start().await.unwrap();
        llm.push(Script::text("hello"));
        let done = llm.requests().len() + 1;
        fake.push_text(USER, USER, "hi");
        assert!(
            fake.wait_for(|_| llm.requests().len() >= done, Duration::from_secs(20))
                .await
        );
        let request = llm.requests().pop().unwrap();
        let names: Vec<String> = request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["function"]["name"].as_str().map(String::from))
            .collect();
        assert_eq!(
            names.iter().any(|n| n == "send_file"),
            offered,
            "{terminal}: {names:?}"
        );
        bot.shutdown().await;
    }
}
