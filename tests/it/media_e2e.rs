//! Media in, files out, end to end: the real bot against the fake Bot API
//! (which serves getFile and file bytes and records sendPhoto/sendDocument
//! uploads) and the fake LLM server (with its fake transcription
//! endpoint). Voice notes become text (and are echoed when asked), photos
//! reach a vision model as image parts with the exact bytes, text
//! documents are inlined, binary documents reach a command backend by
//! path, albums arrive as one turn, oversized files and a missing
//! transcription setup get clear messages, `send_file` and the outbox
//! directory deliver files, path escapes are refused, and a restart in the
//! middle of a download finishes the message once. How documents are read
//! (encodings, PDFs, cuts, what the user is told) is in `documents_e2e`,
//! which shares this file's helpers.

use crate::support;

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use support::fake_bot::{Failure, FakeBotApi};
use support::fake_files::{document_json, photo_json, voice_json};
use support::fake_openai::{last_user_contains, tool_result_after, FakeOpenAi, Script};
use support::test_bot::{TestBot, FAST_DELIVERY};

pub(crate) const WAIT: Duration = Duration::from_secs(20);
pub(crate) const USER: i64 = 42;

/// A bot on the fake servers; `agent` is the `[agent]` section and
/// whatever follows it.
pub(crate) fn test_bot(fake: &FakeBotApi, data_dir: &Path, agent: &str) -> TestBot {
    test_bot_with(fake, data_dir, "", "", agent)
}

/// [`test_bot`] with more `[telegram]` and `[sessions]` settings.
pub(crate) fn test_bot_with(
    fake: &FakeBotApi,
    data_dir: &Path,
    telegram: &str,
    sessions: &str,
    agent: &str,
) -> TestBot {
    TestBot::new(fake)
        .users(&[USER])
        .toml(format!("[telegram]\n{telegram}"))
        .toml(FAST_DELIVERY)
        .toml(format!(
            "[sessions]\nshutdown_grace_secs = 1\n{sessions}\n\n\
             [store]\ndata_dir = \"{}\"\n\n{agent}",
            data_dir.display()
        ))
}

pub(crate) fn openai(llm: &FakeOpenAi, vision: bool) -> String {
    format!(
        "[agent]\nbackend = \"openai\"\n\n[agent.openai]\nbase_url = \"{}\"\nmodel = \"m\"\n\
         api_key_env = \"TELEGATE_TEST_NO_SUCH_KEY\"\nvision = {vision}\n\n",
        llm.base_url()
    )
}

pub(crate) fn transcription(llm: &FakeOpenAi, echo: bool) -> String {
    format!(
        "[media.transcription]\nbase_url = \"{}\"\nmodel = \"whisper-test\"\nlanguage = \"en\"\n\
         echo_transcript = {echo}\n",
        llm.base_url()
    )
}

fn command(argv: &[&str]) -> String {
    let argv: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[agent]\nbackend = \"command\"\n\n[agent.command]\nargv = [{}]\n\n",
        argv.join(", ")
    )
}

pub(crate) fn sent_containing(fake: &FakeBotApi, needle: &str) -> Vec<String> {
    fake.sent_texts(USER)
        .into_iter()
        .filter(|t| t.contains(needle))
        .collect()
}

pub(crate) async fn wait_sent(fake: &FakeBotApi, needle: &str) -> bool {
    fake.wait_for(|_| !sent_containing(fake, needle).is_empty(), WAIT)
        .await
}

pub(crate) async fn wait_exact(fake: &FakeBotApi, text: &str) -> bool {
    fake.wait_for(|_| fake.sent_texts(USER).iter().any(|t| t == text), WAIT)
        .await
}

/// Nothing the chat was sent names a config key or section.
pub(crate) fn assert_no_setting_named(fake: &FakeBotApi) {
    for text in fake.sent_texts(USER) {
        for key in [
            "media.",
            "[media",
            "[agent",
            "max_file_bytes",
            "vision =",
            "telegram.",
            "config",
        ] {
            assert!(!text.contains(key), "{key:?} shown to the user: {text}");
        }
    }
}

/// The content of the last user message of a chat completions request.
pub(crate) fn last_user_content(request: &Value) -> Value {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap()["content"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_note_is_transcribed_echoed_and_answered() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let audio = b"OggS fake opus voice bytes".to_vec();
    llm.transcriber.register(&audio, "turn on the lights");
    let file = fake.files().add(audio.clone(), "oga");
    llm.push_when(
        last_user_contains("turn on the lights"),
        Script::text("Lights are on."),
    );
    let agent = format!("{}{}", openai(&llm, false), transcription(&llm, true));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    let unique = fake.files().unique_id(&file);
    fake.push_media(USER, USER, voice_json(&file, &unique, audio.len()));
    assert!(
        wait_sent(&fake, "Lights are on.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(
        sent_containing(&fake, "🎤"),
        vec!["🎤 turn on the lights".to_string()]
    );
    let requests = llm.transcriber.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].file, audio, "the bytes Telegram served");
    assert_eq!(requests[0].model.as_deref(), Some("whisper-test"));
    assert_eq!(requests[0].language.as_deref(), Some("en"));
    assert_eq!(
        last_user_content(&llm.requests()[0]),
        json!("turn on the lights")
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_note_resumed_after_a_restart_is_echoed_once() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let audio = b"OggS voice cut short by a restart".to_vec();
    llm.transcriber.register(&audio, "water the plants");
    let file = fake.files().add(audio.clone(), "oga");
    // The first run's turn never answers: the restart finds it unanswered.
    llm.push_when(last_user_contains("water the plants"), Script::Hang);
    let agent = format!("{}{}", openai(&llm, false), transcription(&llm, true));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    let unique = fake.files().unique_id(&file);
    fake.push_media(USER, USER, voice_json(&file, &unique, audio.len()));
    assert!(fake.wait_for(|_| !llm.requests().is_empty(), WAIT).await);
    assert_eq!(sent_containing(&fake, "🎤").len(), 1);
    bot.shutdown().await;

    llm.push_when(
        last_user_contains("water the plants"),
        Script::text("Plants watered."),
    );
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    assert!(
        wait_sent(&fake, "Plants watered.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(
        sent_containing(&fake, "🎤"),
        vec!["🎤 water the plants".to_string()],
        "the echo is not repeated by the resumed message"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voice_without_a_transcription_endpoint_is_refused_in_the_users_words() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let file = fake.files().add(b"voice".to_vec(), "oga");
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    fake.push_media(USER, USER, voice_json(&file, "u1", 5));
    assert!(wait_sent(&fake, "I cannot listen to voice").await);
    // The setting is the owner's business: the log names it, the chat not.
    assert_no_setting_named(&fake);
    // The chat keeps working, and the voice note never reached the model.
    fake.push_text(USER, USER, "hello");
    assert!(wait_exact(&fake, "ok").await);
    assert_eq!(llm.requests().len(), 1);
    assert_eq!(fake.files().downloads(), 0);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_reaches_a_vision_model_as_an_image_part_with_the_exact_bytes() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let image: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let file = fake.files().add(image.clone(), "jpg");
    let bot = test_bot(&fake, data.path(), &openai(&llm, true))
        .start()
        .await
        .unwrap();
    let mut media = photo_json(&file, "uphoto", image.len());
    media["caption"] = json!("what is this?");
    fake.push_media(USER, USER, media);
    assert!(fake.wait_for(|_| !llm.requests().is_empty(), WAIT).await);
    let content = last_user_content(&llm.requests()[0]);
    let parts = content.as_array().expect("content parts");
    assert_eq!(parts[0]["type"], "text");
    assert!(parts[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("what is this?"));
    assert_eq!(parts[1]["type"], "image_url");
    let expected = format!(
        "data:image/jpeg;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&image)
    );
    assert_eq!(parts[1]["image_url"]["url"], json!(expected));
    assert!(wait_exact(&fake, "ok").await);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_for_a_model_without_vision_gets_a_clear_message() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let file = fake.files().add(vec![1, 2, 3], "jpg");
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    fake.push_media(USER, USER, photo_json(&file, "u", 3));
    assert!(wait_sent(&fake, "cannot see images").await);
    assert_no_setting_named(&fake);
    fake.push_text(USER, USER, "hello");
    assert!(wait_exact(&fake, "ok").await);
    assert_eq!(llm.requests().len(), 1, "the photo never reached the model");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_document_is_inlined_with_its_name() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let log = "ERROR disk full\nWARN retrying\n";
    let file = fake.files().add(log.as_bytes().to_vec(), "txt");
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    let mut media = document_json(&file, "udoc", "app.log", "text/plain", log.len());
    media["caption"] = json!("why does it fail?");
    fake.push_media(USER, USER, media);
    assert!(wait_exact(&fake, "ok").await);
    let content = last_user_content(&llm.requests()[0]);
    let text = content.as_str().unwrap();
    assert!(text.starts_with("why does it fail?"), "{text}");
    assert!(text.contains("[file app.log (text/plain)]"), "{text}");
    assert!(text.contains("ERROR disk full\nWARN retrying"), "{text}");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_documents_path_reaches_a_command_backend() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = vec![0, 159, 146, 150, 255, 0, 1];
    let file = fake.files().add(bytes.clone(), "bin");
    let agent = command(&[
        "sh",
        "-c",
        // In a code block, so Markdown leaves the paths alone.
        "printf '```\\n'; printf 'arg=%s\\n' \"$@\"; printf 'env=%s\\n' \"$TELEGATE_FILES\"; printf '```\\n'",
        "sh",
        "{files}",
    ]);
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_media(
        USER,
        USER,
        document_json(&file, "ubin", "blob.dat", "application/octet-stream", 7),
    );
    assert!(
        wait_sent(&fake, "arg=").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    let answer = sent_containing(&fake, "arg=").remove(0);
    let arg = answer
        .lines()
        .find_map(|l| l.strip_prefix("arg="))
        .unwrap()
        .to_string();
    let env = answer
        .lines()
        .find_map(|l| l.strip_prefix("env="))
        .unwrap()
        .to_string();
    assert_eq!(arg, env, "{answer}");
    assert!(arg.starts_with(&data.path().join("media").display().to_string()));
    assert!(arg.ends_with("blob.dat"));
    assert_eq!(std::fs::read(&arg).unwrap(), bytes, "the exact bytes");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_album_arrives_as_one_turn() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let first = fake.files().add(vec![1; 10], "jpg");
    let second = fake.files().add(vec![2; 20], "jpg");
    let bot = test_bot(&fake, data.path(), &openai(&llm, true))
        .start()
        .await
        .unwrap();
    let mut a = photo_json(&first, "ua", 10);
    a["media_group_id"] = json!("album-1");
    a["caption"] = json!("compare these");
    let mut b = photo_json(&second, "ub", 20);
    b["media_group_id"] = json!("album-1");
    fake.push_media(USER, USER, a);
    fake.push_media(USER, USER, b);
    assert!(wait_exact(&fake, "ok").await);
    // A later message is its own turn: two requests in all, the first with
    // both pictures.
    llm.push_when(last_user_contains("next"), Script::text("second answer"));
    fake.push_text(USER, USER, "next");
    assert!(wait_sent(&fake, "second answer").await);
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let parts = last_user_content(&requests[0]);
    let images = parts
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "image_url")
        .count();
    assert_eq!(images, 2);
    assert!(parts[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("compare these"));
    // Every part of the album is closed in the inbox.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let counts = bot.store.inbox().inbox_counts().await.unwrap();
        if counts
            .iter()
            .all(|(state, n)| state.is_terminal() || *n == 0)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{counts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_files_get_a_clear_message_and_nothing_else_breaks() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    // Above the configured limit (announced in the update).
    let big = fake.files().add(vec![7; 10], "bin");
    // Telegram's own 20 MB limit (a raised max_file_bytes cannot help).
    let huge = fake
        .files()
        .add_with_size(vec![7; 10], "bin", 30 * 1024 * 1024);
    let agent = format!("{}[media]\nmax_file_bytes = 5\n", openai(&llm, false));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    // The refusal is slow to go out (Telegram answers it late): a message
    // sent meanwhile waits behind it in the chat's worker, and is answered.
    fake.fail_next("sendMessage", 1, Failure::Delay(Duration::from_millis(800)));
    fake.push_media(
        USER,
        USER,
        document_json(&big, "ubig", "big.bin", "application/octet-stream", 10),
    );
    fake.push_text(USER, USER, "and this?");
    assert!(wait_sent(&fake, "I can only read files of up to 5 bytes").await);
    assert_no_setting_named(&fake);
    assert!(
        wait_exact(&fake, "ok").await,
        "a message queued behind a refused file was lost: {:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;

    let agent = format!(
        "{}[media]\nmax_file_bytes = 100000000\n",
        openai(&llm, false)
    );
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_media(
        USER,
        USER,
        document_json(&huge, "uhuge", "huge.bin", "application/octet-stream", 0),
    );
    assert!(
        wait_sent(&fake, "up to 20 MB").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_no_setting_named(&fake);
    fake.push_text(USER, USER, "still there?");
    let answers = || fake.sent_texts(USER).iter().filter(|t| *t == "ok").count();
    assert!(fake.wait_for(|_| answers() == 2, WAIT).await);
    assert_eq!(llm.requests().len(), 2);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_under_way_at_shutdown_is_finished_and_not_repeated() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let big = fake.files().add(vec![7; 10], "bin");
    let agent = format!("{}[media]\nmax_file_bytes = 5\n", openai(&llm, false));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    // Telegram takes its time with the refusal (within the shutdown's
    // one-second grace); the bot is stopped meanwhile.
    fake.fail_next("sendMessage", 1, Failure::Delay(Duration::from_millis(500)));
    fake.push_media(
        USER,
        USER,
        document_json(&big, "ubig", "big.bin", "application/octet-stream", 10),
    );
    assert!(
        fake.wait_for(|_| !fake.calls_to("sendMessage").is_empty(), WAIT)
            .await
    );
    bot.shutdown().await;
    // The shutdown waited for the chat's worker: the refusal went out and
    // its message was closed, so the next start does not refuse it again.
    let refusal = "up to 5 bytes";
    assert_eq!(sent_containing(&fake, refusal).len(), 1);
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "hi");
    assert!(wait_exact(&fake, "ok").await, "{:?}", fake.sent_texts(USER));
    assert_eq!(
        sent_containing(&fake, refusal).len(),
        1,
        "{:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_file_delivers_workspace_files_and_refuses_escapes() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let png = b"\x89PNG\r\n\x1a\nfake image".to_vec();
    std::fs::write(workspace.path().join("chart.png"), &png).unwrap();
    std::fs::write(workspace.path().join("report.csv"), b"a,b\n1,2\n").unwrap();
    std::fs::write(outside.path().join("secret.txt"), b"secret").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        workspace.path().join("link.txt"),
    )
    .unwrap();
    let agent = format!(
        "{}[tools.terminal]\nenabled = true\nworkdir = \"{}\"\n",
        openai(&llm, false),
        workspace.path().display()
    );
    llm.push_when(
        last_user_contains("send them"),
        Script::tool_call(
            "send_file",
            r#"{"path": "chart.png", "caption": "the chart"}"#,
            "c1",
        ),
    );
    llm.push_when(
        tool_result_after("send them"),
        Script::tool_call("send_file", r#"{"path": "report.csv"}"#, "c2"),
    );
    llm.push_when(tool_result_after("send them"), Script::text("Both sent."));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "send them");
    assert!(wait_sent(&fake, "Both sent.").await);
    let uploads = fake.files().uploads();
    assert_eq!(uploads.len(), 2, "{uploads:?}");
    assert_eq!(uploads[0].method, "sendPhoto");
    assert_eq!(uploads[0].bytes, png);
    assert_eq!(uploads[0].caption.as_deref(), Some("the chart"));
    assert_eq!(uploads[1].method, "sendDocument");
    assert_eq!(uploads[1].file_name, "report.csv");

    for (n, path) in ["../secret.txt", "link.txt", "/etc/passwd"]
        .iter()
        .enumerate()
    {
        let ask = format!("leak {n}");
        llm.push_when(
            last_user_contains(&ask),
            Script::tool_call("send_file", &json!({ "path": path }).to_string(), "x"),
        );
        llm.push_when(
            tool_result_after(&ask),
            Script::text(&format!("refused {n}")),
        );
        fake.push_text(USER, USER, &ask);
        assert!(wait_sent(&fake, &format!("refused {n}")).await);
    }
    let results: Vec<String> = llm
        .requests()
        .iter()
        .filter_map(support::fake_openai::last_tool_result)
        .collect();
    assert!(
        results.iter().any(|r| r.contains("contains `..`")),
        "{results:?}"
    );
    for escaped in [
        "link.txt is a symbolic link",
        "/etc/passwd is outside the workspace",
    ] {
        assert!(results.iter().any(|r| r.contains(escaped)), "{results:?}");
    }
    assert_eq!(fake.files().uploads().len(), 2, "nothing more was sent");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_left_in_the_outbox_are_sent_after_the_answer() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = command(&[
        "sh",
        "-c",
        "printf 'made for %s' \"$1\" > \"$TELEGATE_OUTBOX/notes.txt\"; echo answered",
        "sh",
        "{message}",
    ]);
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "write notes");
    assert!(
        fake.wait_for(|_| !fake.files().uploads().is_empty(), WAIT)
            .await,
        "{:?} {:?}",
        fake.calls_to("sendDocument"),
        fake.sent_texts(USER)
    );
    let uploads = fake.files().uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!(uploads[0].method, "sendDocument");
    assert_eq!(uploads[0].file_name, "notes.txt");
    assert_eq!(uploads[0].bytes, b"made for write notes");
    let calls = fake.calls();
    let answer = calls
        .iter()
        .find(|c| c.text().is_some_and(|t| t.contains("answered")))
        .expect("the answer was sent");
    let upload = calls.iter().find(|c| c.method == "sendDocument").unwrap();
    assert!(upload.seq > answer.seq, "the file follows the answer");
    bot.shutdown().await;
}

/// A restart between the answer and its files: a file whose upload was
/// under way may have arrived, so it is not sent again (its sender is told);
/// a file not started yet is sent by the restart, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_files_cut_off_by_a_restart_are_sent_once_or_reported() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = command(&[
        "sh",
        "-c",
        "printf 'report' > \"$TELEGATE_OUTBOX/a.txt\"; printf 'notes' > \"$TELEGATE_OUTBOX/b.txt\"; echo answered",
    ]);
    // The first upload hangs until the process is gone: telegate stops
    // while a.txt is in flight and before b.txt was started.
    fake.fail_next("sendDocument", 1, Failure::Delay(Duration::from_secs(120)));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "write files");
    assert!(
        fake.wait_for(
            |calls| calls.iter().any(|c| c.method == "sendDocument"),
            WAIT
        )
        .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert!(wait_exact(&fake, "answered").await);
    bot.shutdown().await;
    assert!(fake.files().uploads().is_empty(), "a.txt is cut off");

    // The restart sends b.txt, and tells the user that a.txt may not have
    // arrived instead of sending it a second time.
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    assert!(
        fake.wait_for(|_| fake.files().uploads().len() == 1, WAIT)
            .await,
        "the file not started was never sent: {:?}",
        fake.calls_to("sendDocument")
    );
    let uploads = fake.files().uploads();
    assert_eq!(uploads[0].file_name, "b.txt");
    assert_eq!(uploads[0].bytes, b"notes");
    assert!(
        fake.wait_for(
            |_| fake
                .sent_texts(USER)
                .iter()
                .any(|t| t.contains("a.txt") && t.contains("may not have arrived")),
            WAIT
        )
        .await,
        "{:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;

    // Another restart sends nothing again, and the answer is not repeated.
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "again");
    assert!(
        fake.wait_for(|_| fake.files().uploads().len() == 3, WAIT)
            .await
    );
    let names: Vec<String> = fake
        .files()
        .uploads()
        .iter()
        .map(|u| u.file_name.clone())
        .collect();
    assert_eq!(names, ["b.txt", "a.txt", "b.txt"]);
    assert_eq!(
        fake.sent_texts(USER)
            .iter()
            .filter(|t| *t == "answered")
            .count(),
        2
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_download_finishes_the_message_once() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let log = "line one\nline two\n";
    let file = fake.files().add(log.as_bytes().to_vec(), "txt");
    let agent = openai(&llm, false);
    // Queue mode: the message sent during the download is answered after
    // the document, not in place of it.
    let settings = test_bot_with(&fake, data.path(), "", "busy_mode = \"queue\"", &agent);
    let bot = settings.start().await.unwrap();
    fake.files().hold_downloads();
    fake.push_media(
        USER,
        USER,
        document_json(&file, "ulog", "run.log", "text/plain", log.len()),
    );
    // getFile answered: the download itself is now held.
    assert!(fake.wait_for_ok_calls("getFile", 1, WAIT).await);
    // A message sent meanwhile is recorded and waits behind the document
    // in the chat's worker.
    fake.push_text(USER, USER, "meanwhile");
    assert!(
        fake.wait_for(|_| fake.pending_updates_len() == 0, WAIT)
            .await
    );
    bot.shutdown().await;
    fake.files().release_downloads();
    // The stopped bot's chat worker must not finish the download and run
    // the turn on its own (it once kept going on a token nobody cancelled),
    // nor go on to the message behind it while the bot shuts down.
    let mut late = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        late |= !llm.requests().is_empty() || fake.files().downloads() > 0;
    }
    assert!(!late, "the stopped bot went on with the message");

    llm.push_when(last_user_contains("line two"), Script::text("Read it."));
    let bot = settings.start().await.unwrap();
    assert!(
        wait_sent(&fake, "Read it.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    // The message behind it was kept for this start, and is answered once.
    assert!(wait_exact(&fake, "ok").await, "{:?}", fake.sent_texts(USER));
    // Once more through the chat: still exactly one turn for the document.
    fake.push_text(USER, USER, "anything else?");
    let answers = || fake.sent_texts(USER).iter().filter(|t| *t == "ok").count();
    assert!(fake.wait_for(|_| answers() == 2, WAIT).await);
    assert_eq!(sent_containing(&fake, "Read it.").len(), 1);
    assert_eq!(llm.requests().len(), 3);
    assert_eq!(fake.files().downloads(), 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_turn_does_not_send_a_file_twice() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("out.txt"), b"result").unwrap();
    let agent = format!(
        "{}[tools.terminal]\nenabled = true\nworkdir = \"{}\"\n",
        openai(&llm, false),
        workspace.path().display()
    );
    let send = || Script::tool_call("send_file", r#"{"path": "out.txt"}"#, "s1");
    llm.push_when(last_user_contains("send it"), send());
    // The turn is cut short by a restart after the file went out.
    llm.push_when(tool_result_after("send it"), Script::Hang);
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    fake.push_text(USER, USER, "send it");
    assert!(fake.wait_for(|_| llm.requests().len() == 2, WAIT).await);
    assert_eq!(fake.files().uploads().len(), 1);
    bot.shutdown().await;

    // Replayed after the restart: the model asks again, the file is not
    // sent again, and the model is told so.
    llm.push_when(last_user_contains("send it"), send());
    llm.push_when(tool_result_after("send it"), Script::text("Done."));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    assert!(
        wait_sent(&fake, "Done.").await,
        "{:?}",
        fake.sent_texts(USER)
    );
    assert_eq!(fake.files().uploads().len(), 1, "sent once");
    let last = llm.requests().last().cloned().unwrap();
    assert!(support::fake_openai::last_tool_result(&last)
        .unwrap()
        .contains("already sent"));
    bot.shutdown().await;
}
