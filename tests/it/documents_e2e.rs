//! Documents end to end: the real bot against the fake Bot API and the
//! fake LLM. Text in Latin-1 and UTF-16 is decoded and inlined, a
//! hand-written PDF's text reaches the model, a long text is inlined in
//! part with a marker and the user told once (also across a restart), a
//! PDF with no text or a broken one and binary files (also misnamed
//! `.txt`) are named to the model and told to the user in one sentence,
//! and nothing the fake LLM receives holds a server path unless a tool of
//! the model's can open it.

use serde_json::{json, Value};

use crate::media_e2e::{last_user_content, openai, sent_containing, test_bot, USER, WAIT};
use crate::support::fake_bot::FakeBotApi;
use crate::support::fake_files::{document_json, minimal_pdf, photo_json};
use crate::support::fake_openai::{last_user_contains, FakeOpenAi, Script};
use telegate::transport::telegram::TelegramBot;

/// Everything the fake LLM was sent, as one string.
fn everything_sent_to(llm: &FakeOpenAi) -> String {
    llm.requests()
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of the last user message of the `n`th request.
fn user_text(llm: &FakeOpenAi, n: usize) -> String {
    let content = last_user_content(&llm.requests()[n]);
    match content {
        Value::String(text) => text,
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        other => panic!("unexpected content {other}"),
    }
}

/// Wait for the `n`th "ok" answer.
async fn wait_answers(fake: &FakeBotApi, n: usize) -> bool {
    fake.wait_for(
        |_| fake.sent_texts(USER).iter().filter(|t| *t == "ok").count() >= n,
        WAIT,
    )
    .await
}

/// Send a document and wait for its answer (the `n`th "ok") and for its
/// message to be finished, so the next one finds the chat idle.
async fn send_document(
    fake: &FakeBotApi,
    bot: &TelegramBot,
    n: usize,
    bytes: Vec<u8>,
    name: &str,
    mime: &str,
) {
    let ext = name.rsplit_once('.').map_or("bin", |(_, e)| e);
    let size = bytes.len();
    let file = fake.files().add(bytes, ext);
    let unique = fake.files().unique_id(&file);
    fake.push_media(USER, USER, document_json(&file, &unique, name, mime, size));
    assert!(
        wait_answers(fake, n).await,
        "{name} was not answered: {:?}",
        fake.sent_texts(USER)
    );
    settle(bot).await;
}

/// Wait until every message in the inbox is finished.
async fn settle(bot: &TelegramBot) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let counts = bot.store.inbox().inbox_counts().await.unwrap();
        if counts
            .iter()
            .all(|(state, n)| state.is_terminal() || *n == 0)
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{counts:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_in_legacy_encodings_and_utf16_is_decoded_and_inlined() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    // Latin-1, as old Windows and Unix tools write it.
    let latin1 = b"Men\xfc du jour: caf\xe9 cr\xe8me, cr\xeape \xe0 la fran\xe7aise\n".to_vec();
    send_document(&fake, &bot, 1, latin1, "menu.txt", "text/plain").await;
    let text = user_text(&llm, 0);
    assert!(
        text.contains("[file menu.txt (text/plain)]")
            && text.contains("Menü du jour: café crème, crêpe à la française"),
        "{text}"
    );
    // UTF-16 with a byte-order mark, as Windows' Notepad and PowerShell
    // write it.
    let words = "Grüße aus Köln — 5 €\nzweite Zeile\n";
    let mut utf16 = vec![0xff, 0xfe];
    utf16.extend(words.encode_utf16().flat_map(u16::to_le_bytes));
    send_document(&fake, &bot, 2, utf16, "gruss.txt", "text/plain").await;
    let text = user_text(&llm, 1);
    assert!(
        text.contains("Grüße aus Köln — 5 €\nzweite Zeile"),
        "{text}"
    );
    assert!(!everything_sent_to(&llm).contains('\u{fffd}'));
    // Nothing to tell the user: the model read both whole.
    assert_eq!(fake.sent_texts(USER), ["ok", "ok"]);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdfs_text_reaches_the_model() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    let pdf = minimal_pdf(&["Invoice 2024-117", "Total due: 420 EUR"]);
    send_document(&fake, &bot, 1, pdf, "invoice.pdf", "application/pdf").await;
    let text = user_text(&llm, 0);
    assert!(
        text.contains("[file invoice.pdf (application/pdf)]"),
        "{text}"
    );
    assert!(
        text.contains("Invoice 2024-117") && text.contains("Total due: 420 EUR"),
        "{text}"
    );
    assert_eq!(fake.sent_texts(USER), ["ok"]);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_text_is_inlined_in_part_with_a_marker_and_the_user_told_once() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = format!("{}[media]\nmax_inline_bytes = 2048\n", openai(&llm, false));
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    let log: String = (0..500)
        .map(|n| format!("line {n:03}: request served in 12 ms\n"))
        .collect();
    send_document(&fake, &bot, 1, log.into_bytes(), "big.log", "text/plain").await;
    let text = user_text(&llm, 0);
    assert!(text.contains("line 000: request served"), "{text}");
    assert!(!text.contains("line 499"), "{text}");
    assert!(
        text.contains("[… cut: showing the first 1 KB of 16 KB]"),
        "{text}"
    );
    // The cut falls on a line boundary.
    let shown = text
        .lines()
        .filter(|l| l.starts_with("line "))
        .collect::<Vec<_>>();
    assert!(shown.iter().all(|l| l.ends_with("12 ms")), "{shown:?}");
    let told = sent_containing(&fake, "big.log");
    assert_eq!(
        told,
        ["📎 big.log is long, so I read only its first 1 KB of 16 KB."],
        "{:?}",
        fake.sent_texts(USER)
    );
    let sent = fake.sent_texts(USER);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[1], "ok", "told before the answer: {sent:?}");
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdf_without_text_or_a_broken_one_is_told_to_the_user() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, data.path(), &openai(&llm, false))
        .start()
        .await
        .unwrap();
    // A scanned page: an image, no text layer.
    send_document(
        &fake,
        &bot,
        1,
        minimal_pdf(&[]),
        "scan.pdf",
        "application/pdf",
    )
    .await;
    assert_eq!(
        sent_containing(&fake, "scan.pdf"),
        ["📎 I found no text in scan.pdf (perhaps it is scanned pages), so I could not read it."]
    );
    let text = user_text(&llm, 0);
    assert!(
        text.contains("[file scan.pdf (application/pdf, ") && text.contains("no text layer"),
        "{text}"
    );
    // Garbage that claims to be a PDF.
    let garbage = b"%PDF-1.7\n\x00\x01 this is not a PDF at all \xff\xfe".to_vec();
    send_document(&fake, &bot, 2, garbage, "broken.pdf", "application/pdf").await;
    assert_eq!(
        sent_containing(&fake, "broken.pdf"),
        ["📎 I could not read any text in broken.pdf."]
    );
    // Each is told once, before its answer.
    let sent = fake.sent_texts(USER);
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert!(
        sent[0].contains("scan.pdf") && sent[1] == "ok" && sent[2].contains("broken.pdf"),
        "{sent:?}"
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sees_no_server_path_it_cannot_open_and_the_user_hears_what_it_missed() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let bot = test_bot(&fake, data.path(), &openai(&llm, true))
        .start()
        .await
        .unwrap();
    let image: Vec<u8> = (0..=255u8).cycle().take(500).collect();
    let photo = fake.files().add(image, "jpg");
    let mut media = photo_json(&photo, "uphoto", 500);
    media["caption"] = json!("look");
    fake.push_media(USER, USER, media);
    assert!(wait_answers(&fake, 1).await);
    settle(&bot).await;
    // A binary file, and a binary file misnamed .txt.
    let blob = vec![0u8, 159, 146, 150, 255, 0, 1, 2];
    send_document(&fake, &bot, 2, blob, "blob.dat", "application/octet-stream").await;
    let misnamed: Vec<u8> = (0..600u32).map(|i| (i * 7 % 256) as u8).collect();
    send_document(&fake, &bot, 3, misnamed, "notes.txt", "text/plain").await;
    let everything = everything_sent_to(&llm);
    let root = data.path().display().to_string();
    assert!(
        !everything.contains(&root),
        "a server path reached the model: {everything}"
    );
    assert!(!everything.contains("saved at"), "{everything}");
    assert!(
        user_text(&llm, 0).starts_with("look\n\n[photo]"),
        "{}",
        user_text(&llm, 0)
    );
    assert!(
        user_text(&llm, 1).contains("[file blob.dat (application/octet-stream, 8 bytes): "),
        "{}",
        user_text(&llm, 1)
    );
    let misnamed_note = user_text(&llm, 2);
    assert!(
        misnamed_note.contains("binary data, not text"),
        "{misnamed_note}"
    );
    assert!(
        !misnamed_note.contains("```"),
        "no garbage inlined: {misnamed_note}"
    );
    assert_eq!(
        sent_containing(&fake, "📎"),
        [
            "📎 I could not read blob.dat: I can read text files and PDFs, not this kind of file.",
            "📎 I could not read notes.txt: it does not look like text.",
        ]
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_terminal_tool_the_model_gets_a_path_it_can_open() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    // The terminal works in the data directory: paths are relative to it.
    let agent = format!(
        "{}[tools.terminal]\nenabled = true\nworkdir = \"{}\"\n",
        openai(&llm, false),
        data.path().display()
    );
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    let blob = vec![0u8, 1, 2, 3, 255];
    send_document(
        &fake,
        &bot,
        1,
        blob.clone(),
        "blob.dat",
        "application/octet-stream",
    )
    .await;
    let text = user_text(&llm, 0);
    let at = text
        .split(" saved at ")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or_else(|| panic!("no path: {text}"));
    assert!(at.starts_with("media/"), "{text}");
    assert_eq!(std::fs::read(data.path().join(at)).unwrap(), blob);
    // The model can open it, so the user is not told it could not.
    assert_eq!(fake.sent_texts(USER), ["ok"]);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_model_missed_is_told_once_even_across_a_restart() {
    let fake = FakeBotApi::start().await;
    let llm = FakeOpenAi::start().await;
    let data = tempfile::tempdir().unwrap();
    let agent = openai(&llm, false);
    // The first run's turn never answers: the restart prepares the
    // message again.
    llm.push_when(last_user_contains("blob.dat"), Script::Hang);
    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    let blob = vec![0u8, 7, 0, 7, 255];
    let file = fake.files().add(blob, "dat");
    let unique = fake.files().unique_id(&file);
    fake.push_media(
        USER,
        USER,
        document_json(&file, &unique, "blob.dat", "application/octet-stream", 5),
    );
    assert!(fake.wait_for(|_| !llm.requests().is_empty(), WAIT).await);
    assert_eq!(sent_containing(&fake, "blob.dat").len(), 1);
    bot.shutdown().await;

    let bot = test_bot(&fake, data.path(), &agent).start().await.unwrap();
    assert!(wait_answers(&fake, 1).await, "{:?}", fake.sent_texts(USER));
    assert_eq!(llm.requests().len(), 2, "prepared and asked again");
    assert_eq!(
        sent_containing(&fake, "blob.dat").len(),
        1,
        "{:?}",
        fake.sent_texts(USER)
    );
    bot.shutdown().await;
}
