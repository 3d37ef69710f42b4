//! Media is prepared off the chat's queue, end to end: while a download
//! hangs (the fake Bot API sends the headers and a first byte, then
//! nothing), a transcription hangs or an album's part is still coming in,
//! the chat's /status, /model, a button press, /stop and /new are answered
//! at once; /stop and /new cancel the preparation and its message is
//! reported stopped (its inbox row closed); messages sent after the media
//! still reach the session after it. Failures are told in the user's
//! words, and getFile's absolute paths are read from disk only from a
//! Bot API server configured as local.
//!
//! No test asserts on time: each waits for an event (a reply, a stalled
//! body, a hanging request) and checks what happened in what order while
//! the preparation was still hanging.

use crate::media_e2e::{
    assert_no_setting_named, last_user_content, openai, sent_containing, test_bot_with,
    transcription, wait_exact, wait_sent, USER, WAIT,
};
use crate::support;

use serde_json::{json, Value};
use support::fake_bot::FakeBotApi;
use support::fake_files::{document_json, photo_json, voice_json};
use support::fake_openai::{last_user_contains, FakeOpenAi, Script};
use telegate::transport::telegram::media::STOPPED_TEXT;
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::InboxState;

/// The openai agent with a choice of models (so /model shows buttons).
fn openai_with_models(llm: &FakeOpenAi) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"small\"\n\
         models = [\"small\", \"big\"]\napi_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\n\n",
        llm.base_url()
    )
}

/// The message id and callback data of the first button labelled `label`.
async fn wait_button(fake: &FakeBotApi, label: &str) -> (i64, String) {
    let find = || {
        for message in fake.message_history(USER) {
            let Some(markup) = &message.current().reply_markup else {
                continue;
            };
            let markup = match markup {
                Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
                other => other.clone(),
            };
            for row in markup["inline_keyboard"].as_array().into_iter().flatten() {
                for key in row.as_array().into_iter().flatten() {
                    if key["text"].as_str().is_some_and(|t| t.contains(label)) {
                        let data = key["callback_data"].as_str().unwrap_or_default();
                        return Some((message.message_id, data.to_string()));
                    }
                }
            }
        }
        None
    };
    assert!(
        fake.wait_for(|_| find().is_some(), WAIT).await,
        "{:?}",
        fake.sent_texts(USER)
    );
    find().unwrap()
}

/// Wait until update `update_id`'s inbox row is in `state`; its reason.
async fn wait_row(bot: &TelegramBot, update_id: i64, state: InboxState) -> Option<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let entry = bot
            .store
            .inbox()
            .inbox_entry(update_id)
            .await
            .unwrap()
            .unwrap();
        if entry.state == state {
            return entry.reason;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "row {update_id} stays {:?}",
            entry.state
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Every `.part` file under `dir`.
fn part_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "part") {
                found.push(path);
            }
        }
    }
    found
}

/// Position of the first text sent to the user that is `text`.
fn position(fake: &FakeBotApi, text: &str) -> usize {
    let texts = fake.sent_texts(USER);
    texts
        .iter()
        .position(|t| t == text)
        .unwrap_or_else(|| panic!("{text:?} never sent: {texts:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_download_holds_up_none_of_the_chats_controls_and_stop_cancels_it() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let text = "a document whose download hangs\n";
    let file = fake.files().add(text.as_bytes().to_vec(), "txt");
    let settings = test_bot_with(&fake, data.path(), "", "", &openai_with_models(&llm));
    let bot = settings.start().await.unwrap();
    fake.files().stall_bodies();
    let (document, _) = fake.push_media(
        USER,
        USER,
        document_json(&file, "uhung", "hung.txt", "text/plain", text.len()),
    );
    assert!(
        fake.wait_for(|_| fake.files().stalled_now() == 1, WAIT)
            .await
    );

    // While it hangs: /status, /model and a press of one of its buttons.
    fake.push_text(USER, USER, "/status");
    assert!(
        wait_sent(&fake, "Session:").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    fake.push_text(USER, USER, "/model");
    let (list, big) = wait_button(&fake, "big").await;
    fake.push_callback_query(USER, USER, list, &big);
    assert!(
        wait_sent(&fake, "Model: big").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(
        fake.files().stalled_now(),
        1,
        "answered while it still hung"
    );
    assert!(llm.requests().is_empty());

    // /stop cancels the download; the document is reported stopped.
    fake.push_text(USER, USER, "/stop");
    assert!(
        wait_exact(&fake, "⏹ Stopped.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(
        wait_exact(&fake, STOPPED_TEXT).await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(
        fake.wait_for(|_| fake.files().abandoned() == 1, WAIT).await,
        "the download was not given up"
    );
    let reason = wait_row(&bot, document, InboxState::Dropped).await;
    assert_eq!(reason.as_deref(), Some("stopped"));
    assert!(
        part_files(&data.path().join("media")).is_empty(),
        "the cancelled download left its .part file"
    );

    // The chat goes on; the stopped document never reached the model.
    fake.files().release_stalls();
    fake.push_text(USER, USER, "hello");
    assert!(wait_exact(&fake, "ok").await);
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(last_user_content(&requests[0]), json!("hello"));
    assert_eq!(requests[0]["model"], json!("big"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_after_a_hung_download_reaches_the_session_after_it() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let text = "the report, first\n";
    let file = fake.files().add(text.as_bytes().to_vec(), "txt");
    llm.push_when(
        last_user_contains("the report"),
        Script::text("Report read."),
    );
    let queue = "busy_mode = \"queue\"";
    let settings = test_bot_with(&fake, data.path(), "", queue, &openai(&llm, false));
    let bot = settings.start().await.unwrap();
    fake.files().stall_bodies();
    fake.push_media(
        USER,
        USER,
        document_json(&file, "urep", "report.txt", "text/plain", text.len()),
    );
    assert!(
        fake.wait_for(|_| fake.files().stalled_now() == 1, WAIT)
            .await
    );
    fake.push_text(USER, USER, "and this comes second");
    // Sent after the text and answered: by now the text is waiting.
    fake.push_text(USER, USER, "/status");
    assert!(wait_sent(&fake, "Session:").await);
    assert!(
        llm.requests().is_empty(),
        "the text went ahead of the document"
    );
    fake.files().release_stalls();
    assert!(wait_exact(&fake, "ok").await, "{:?}", fake.sent_texts(USER));
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let first = last_user_content(&requests[0]);
    assert!(
        first.as_str().unwrap().contains("the report, first"),
        "{first}"
    );
    assert_eq!(
        last_user_content(&requests[1]),
        json!("and this comes second")
    );
    assert!(position(&fake, "Report read.") < position(&fake, "ok"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_during_a_hung_download_stops_it_and_drops_what_waited_behind_it() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let text = "old session's document\n";
    let file = fake.files().add(text.as_bytes().to_vec(), "txt");
    let settings = test_bot_with(&fake, data.path(), "", "", &openai(&llm, false));
    let bot = settings.start().await.unwrap();
    fake.files().stall_bodies();
    let (document, _) = fake.push_media(
        USER,
        USER,
        document_json(&file, "uold", "old.txt", "text/plain", text.len()),
    );
    assert!(
        fake.wait_for(|_| fake.files().stalled_now() == 1, WAIT)
            .await
    );
    let meanwhile = fake.push_text(USER, USER, "meant for the old session");
    fake.push_text(USER, USER, "/new");
    assert!(
        wait_sent(&fake, "Started a fresh session").await,
        "no /new reply; sent: {:?}; calls: {:?}",
        fake.sent_texts(USER),
        fake.calls().iter().map(|c| &c.method).collect::<Vec<_>>()
    );
    let reply = sent_containing(&fake, "Started a fresh session").remove(0);
    assert!(reply.contains("The running task was stopped."), "{reply}");
    assert!(
        wait_exact(&fake, STOPPED_TEXT).await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(
        wait_sent(&fake, "1 message sent before the new session was dropped").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let stopped = wait_row(&bot, document, InboxState::Dropped).await;
    assert_eq!(stopped.as_deref(), Some("stopped"));
    let dropped = wait_row(&bot, meanwhile, InboxState::Dropped).await;
    assert_eq!(dropped.as_deref(), Some("a new session started"));
    fake.files().release_stalls();
    fake.push_text(USER, USER, "fresh start");
    assert!(wait_exact(&fake, "ok").await);
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(last_user_content(&requests[0]), json!("fresh start"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_transcription_shows_typing_holds_up_no_command_and_stop_cancels_it() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let audio = b"OggS a voice note the service never answers".to_vec();
    llm.transcriber.register(&audio, "never heard");
    llm.transcriber.hang();
    let file = fake.files().add(audio.clone(), "oga");
    let agent = format!("{}{}", openai(&llm, false), transcription(&llm, false));
    let bot = test_bot_with(&fake, data.path(), "", "", &agent)
        .start()
        .await
        .unwrap();
    let unique = fake.files().unique_id(&file);
    let (voice, _) = fake.push_media(USER, USER, voice_json(&file, &unique, audio.len()));
    assert!(
        fake.wait_for(|_| llm.transcriber.hanging_now() == 1, WAIT)
            .await
    );
    // The chat shows that work is under way.
    assert!(
        fake.wait_for(|_| !fake.calls_to("sendChatAction").is_empty(), WAIT)
            .await,
        "no typing while transcribing"
    );
    fake.push_text(USER, USER, "/status");
    assert!(wait_sent(&fake, "Session:").await);
    assert_eq!(llm.transcriber.hanging_now(), 1, "answered while it hung");
    fake.push_text(USER, USER, "/stop");
    assert!(
        wait_exact(&fake, "⏹ Stopped.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(wait_exact(&fake, STOPPED_TEXT).await);
    assert!(
        fake.wait_for(|_| llm.transcriber.hanging_now() == 0, WAIT)
            .await,
        "the transcription request was not given up"
    );
    let reason = wait_row(&bot, voice, InboxState::Dropped).await;
    assert_eq!(reason.as_deref(), Some("stopped"));
    llm.transcriber.release();
    fake.push_text(USER, USER, "typed instead");
    assert!(wait_exact(&fake, "ok").await);
    let requests = llm.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(last_user_content(&requests[0]), json!("typed instead"));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_album_with_a_hung_part_holds_up_no_command_and_keeps_its_place() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let first = fake.files().add(vec![1; 10], "jpg");
    let second = fake.files().add(vec![2; 20], "jpg");
    llm.push_when(
        last_user_contains("after the album"),
        Script::text("After."),
    );
    let queue = "busy_mode = \"queue\"";
    let bot = test_bot_with(&fake, data.path(), "", queue, &openai(&llm, true))
        .start()
        .await
        .unwrap();
    fake.files().stall_bodies();
    let mut a = photo_json(&first, "ua", 10);
    a["media_group_id"] = json!("album-hung");
    a["caption"] = json!("compare these");
    let mut b = photo_json(&second, "ub", 20);
    b["media_group_id"] = json!("album-hung");
    fake.push_media(USER, USER, a);
    fake.push_media(USER, USER, b);
    fake.push_text(USER, USER, "after the album");
    assert!(
        fake.wait_for(|_| fake.files().stalled_now() == 1, WAIT)
            .await
    );
    fake.push_text(USER, USER, "/status");
    assert!(wait_sent(&fake, "Session:").await);
    assert!(
        llm.requests().is_empty(),
        "the text went ahead of the album"
    );
    fake.files().release_stalls();
    assert!(
        wait_exact(&fake, "After.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let parts = last_user_content(&requests[0]);
    let images = parts
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "image_url")
        .count();
    assert_eq!(images, 2, "one turn with both pictures");
    assert_eq!(last_user_content(&requests[1]), json!("after the album"));
    // The album's answer (the fake's default) came first.
    assert!(position(&fake, "ok") < position(&fake, "After."));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transcription_is_told_in_the_users_words() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = format!("{}{}", openai(&llm, false), transcription(&llm, false));
    let bot = test_bot_with(&fake, data.path(), "", "", &agent)
        .start()
        .await
        .unwrap();
    // A recording the service cannot read (the fake answers 400 "Invalid
    // file format" for audio it does not know): the recording's fault,
    // not the setup's.
    let broken = fake.files().add(b"not audio at all".to_vec(), "oga");
    fake.push_media(USER, USER, voice_json(&broken, "ubroken", 16));
    assert!(
        wait_sent(&fake, "could not make out that recording").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    // A service refusing the key: the user is not told about settings.
    llm.transcriber.fail_with(401);
    let audio = b"OggS a fine recording".to_vec();
    llm.transcriber.register(&audio, "fine");
    let fine = fake.files().add(audio.clone(), "oga");
    fake.push_media(USER, USER, voice_json(&fine, "ufine", audio.len()));
    assert!(
        wait_sent(&fake, "cannot turn voice messages into text right now").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_no_setting_named(&fake);
    assert!(llm.requests().is_empty());
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_path_from_getfile_is_read_only_from_a_local_bot_api_server() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let server_disk = tempfile::tempdir().unwrap();
    let path = server_disk.path().join("document.txt");
    let content = "a file on this machine's disk\n";
    std::fs::write(&path, content).unwrap();
    let file = fake.files().add_on_disk(&path, content.len());
    let document = || document_json(&file, "udisk", "document.txt", "text/plain", content.len());

    // The cloud API (the default): an absolute path is refused.
    let cloud = test_bot_with(&fake, data.path(), "", "", &openai(&llm, false));
    let bot = cloud.start().await.unwrap();
    fake.push_media(USER, USER, document());
    assert!(
        wait_sent(&fake, "Telegram did not hand it out").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    fake.push_text(USER, USER, "hello");
    assert!(wait_exact(&fake, "ok").await);
    let requests = llm.requests();
    assert_eq!(requests.len(), 1);
    assert!(!requests[0].to_string().contains("this machine's disk"));
    bot.shutdown().await;

    // Configured as local: the file is read from disk.
    let local = test_bot_with(
        &fake,
        data.path(),
        "local_bot_api = true",
        "",
        &openai(&llm, false),
    );
    llm.push_when(
        last_user_contains("this machine's disk"),
        Script::text("Read from disk."),
    );
    let bot = local.start().await.unwrap();
    fake.push_media(USER, USER, document());
    assert!(
        wait_sent(&fake, "Read from disk.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;
}
