//! An answer's sending keeps its limits and can be stopped (issue 21):
//! at most `max_answer_parts` messages (a longer answer's whole text
//! follows as `answer.md`), at most `max_files_per_answer` outbox files
//! (the rest said in one line), and /stop while the parts or files go out
//! ends the sending: the user is told in one line what was not sent,
//! /stop does not say "Nothing to stop", and the outbox records the
//! answer as delivered so nothing of it is sent later.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::fake_bot::{Failure, FakeBotApi};
use support::test_bot::{TestBot, FAST_DELIVERY};
use telegate::store::Store;

const WAIT: Duration = Duration::from_secs(30);
const USER: i64 = 42;

/// A bot with the command backend running `script` (`sh -c`), `extra`
/// appended to `[delivery]` (or more tables).
fn test_bot(fake: &FakeBotApi, data_dir: &Path, script: &str, extra: &str) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(format!("[delivery]\n{extra}"))
        .toml(format!(
            "[sessions]\nshutdown_grace_secs = 1\n\n\
             [store]\ndata_dir = \"{}\"\n\n\
             [agent]\nbackend = \"command\"\n\n\
             [agent.command]\nargv = [\"sh\", \"-c\", {script:?}]\noutput_cap_bytes = 1000000\n",
            data_dir.display(),
        ))
}

/// `n` paragraphs of 3000 letters each (one message each): the `k`th is
/// made of the `k`th letter.
fn paragraphs(n: usize) -> String {
    format!(
        "for c in $(echo abcdefghijklmnopqrstuvwxyz | fold -w1 | head -n {n}); do \
         head -c 3000 /dev/zero | tr '\\0' \"$c\"; printf '\\n\\n'; done"
    )
}

/// The bot's messages made of one repeated letter (the answer's parts).
fn parts(fake: &FakeBotApi) -> Vec<String> {
    fake.sent_texts(USER)
        .into_iter()
        .filter(|t| t.len() >= 3000 && t.chars().all(|c| c.is_ascii_lowercase()))
        .collect()
}

fn containing(fake: &FakeBotApi, needle: &str) -> Vec<String> {
    fake.sent_texts(USER)
        .into_iter()
        .filter(|t| t.contains(needle))
        .collect()
}

/// The first number in `text`.
fn first_number(text: &str) -> usize {
    text.split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_takes_at_most_its_parts_and_comes_whole_as_a_file() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, data.path(), &paragraphs(5), "max_answer_parts = 2");
    let bot = settings.start().await.unwrap();
    fake.push_text(USER, USER, "tell me everything");
    assert!(
        fake.wait_for(|_| !fake.files().uploads().is_empty(), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let sent = parts(&fake);
    assert_eq!(sent.len(), 2, "two messages");
    assert!(sent[0].starts_with('a') && sent[1].starts_with('b'));
    let uploads = fake.files().uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].method, "sendDocument");
    assert_eq!(uploads[0].file_name, "answer.md");
    let whole = String::from_utf8(uploads[0].bytes.clone()).unwrap();
    for letter in ["a", "b", "c", "d", "e"] {
        assert!(
            whole.contains(&letter.repeat(3000)),
            "the whole answer is in the file"
        );
    }
    let caption = uploads[0].caption.clone().unwrap_or_default();
    assert!(caption.contains("whole answer"), "{caption}");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_files_over_the_limit_are_reported_in_one_line() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let script =
        "i=0; while [ $i -lt 30 ]; do printf 'file %s' $i > \"$TELEGATE_OUTBOX/f$i.txt\"; \
                  i=$((i+1)); done; echo answered";
    let extra = "\n[media]\nmax_files_per_answer = 3";
    let bot = test_bot(&fake, data.path(), script, extra)
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "make files");
    assert!(
        fake.wait_for(|_| !containing(&fake, "were not sent").is_empty(), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(fake.files().uploads().len(), 3);
    let notes = containing(&fake, "were not sent");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("27 more files were not sent: at most 3 go with one answer"),
        "{notes:?}"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_a_batch_of_outbox_files_and_says_what_was_not_sent() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let script =
        "i=0; while [ $i -lt 40 ]; do printf 'file %s' $i > \"$TELEGATE_OUTBOX/f$i.txt\"; \
                  i=$((i+1)); done; echo answered";
    let extra = "\n[media]\nmax_files_per_answer = 50";
    // Each upload takes a while, as a real one does.
    fake.fail_next(
        "sendDocument",
        40,
        Failure::Delay(Duration::from_millis(300)),
    );
    let bot = test_bot(&fake, data.path(), script, extra)
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "make files");
    assert!(
        fake.wait_for(|_| fake.files().uploads().len() >= 2, WAIT)
            .await
    );
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(|_| !containing(&fake, "⏹ Stopped:").is_empty(), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(containing(&fake, "Nothing to stop").len(), 0);
    assert_eq!(containing(&fake, "Stopped sending the answer").len(), 1);
    let line = containing(&fake, "⏹ Stopped:").remove(0);
    assert!(line.ends_with("files were not sent."), "{line}");
    let uploaded = fake.files().uploads().len();
    assert!(uploaded < 40, "the batch was cut short");
    assert_eq!(first_number(&line), 40 - uploaded, "{line}");
    bot.shutdown().await;

    // After a restart nothing more of that answer goes out, and the chat
    // goes on.
    let bot = test_bot(&fake, data.path(), "echo fresh", extra)
        .start()
        .await
        .unwrap();
    fake.push_text(USER, USER, "again");
    assert!(
        fake.wait_for(|_| !containing(&fake, "fresh").is_empty(), WAIT)
            .await
    );
    assert_eq!(fake.files().uploads().len(), uploaded);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_an_answer_sent_in_parts_and_the_rest_is_never_sent() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let settings = test_bot(&fake, data.path(), &paragraphs(20), "max_answer_parts = 50");
    let bot = settings.start().await.unwrap();
    // Every message takes a while to be answered.
    fake.fail_next(
        "sendMessage",
        60,
        Failure::Delay(Duration::from_millis(200)),
    );
    fake.push_text(USER, USER, "tell me everything");
    assert!(fake.wait_for(|_| parts(&fake).len() >= 2, WAIT).await);
    fake.push_text(USER, USER, "/stop");
    assert!(
        fake.wait_for(|_| !containing(&fake, "⏹ Stopped:").is_empty(), WAIT)
            .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(containing(&fake, "Nothing to stop").len(), 0);
    assert_eq!(containing(&fake, "Stopped sending the answer").len(), 1);
    let line = containing(&fake, "⏹ Stopped:").remove(0);
    assert!(line.contains("of 20 parts of the answer"), "{line}");
    let sent = parts(&fake).len();
    assert!(sent < 20, "the answer was cut short");
    assert_eq!(first_number(&line), 20 - sent, "{line}");
    bot.shutdown().await;

    // The outbox records the answer as delivered: nothing of it is sent
    // again, whatever a restart finds.
    let answered = fake
        .calls_to("sendMessage")
        .iter()
        .find_map(|c| c.body.get("reply_parameters")?.get("message_id")?.as_i64())
        .expect("the first part quotes the message");
    let store = Store::open_async(settings.config().store.database_path())
        .await
        .unwrap()
        .for_bot(telegate::vocab::BotId(fake.config().bot_id));
    let entry = store
        .outbox()
        .reply_of(USER, answered)
        .await
        .unwrap()
        .unwrap();
    assert!(entry.delivered, "{entry:?}");
    assert_eq!(entry.reply_ids.len(), sent);
}
