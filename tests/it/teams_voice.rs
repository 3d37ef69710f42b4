//! Voice answers end to end (issue 26, item 5): the real bot against the
//! fake Bot API (which records `sendVoice` uploads and refuses a caption
//! past Telegram's 1024 characters) and the fake LLM server with its fake
//! speech endpoint (`/v1/audio/speech`, Ogg for `opus`). `/voice on`
//! answers with a voice note carrying the text as its caption; a longer
//! text follows the voice note; `/voice auto` speaks only to a spoken
//! message; an endpoint error or audio that is not Ogg falls back to the
//! text with one line saying so.
//!
//! Waits are on what the fakes recorded, never on timing.

use crate::media_e2e::{openai, test_bot, transcription, wait_sent, USER, WAIT};
use crate::support;

use support::fake_bot::FakeBotApi;
use support::fake_files::{voice_json, Upload};
use support::fake_openai::{last_user_contains, FakeOpenAi, Script};
use support::fake_speech::ogg_of;
use telegate::transport::telegram::TelegramBot;

const FELL_BACK: &str = "I could not answer with voice this time";

fn speech(llm: &FakeOpenAi) -> String {
    format!(
        "[media.speech]\nbase_url = \"{}\"\nmodel = \"tts-test\"\nvoice = \"nova\"\n",
        llm.base_url()
    )
}

fn voices(fake: &FakeBotApi) -> Vec<Upload> {
    fake.files()
        .uploads()
        .into_iter()
        .filter(|u| u.method == "sendVoice")
        .collect()
}

async fn start(fake: &FakeBotApi, llm: &FakeOpenAi, data: &std::path::Path) -> TelegramBot {
    let agent = format!(
        "{}{}{}",
        openai(llm, false),
        transcription(llm, false),
        speech(llm)
    );
    test_bot(fake, data, &agent).start().await.unwrap()
}

async fn says(bot: &TelegramBot, fake: &FakeBotApi, text: &str, needle: &str) {
    // The previous turn is over (answered, charged, recorded).
    let idle = support::recorder::eventually(WAIT, || bot.engine.adapter.busy_count() == 0).await;
    assert!(idle, "a turn is still running");
    fake.push_text(USER, USER, text);
    assert!(wait_sent(fake, needle).await, "{:?}", fake.sent_texts(USER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voice_on_answers_with_a_voice_note_whose_caption_is_the_text() {
    let (fake, llm) = (FakeBotApi::start().await, FakeOpenAi::start().await);
    let data = tempfile::tempdir().unwrap();
    let bot = start(&fake, &llm, data.path()).await;
    says(&bot, &fake, "/voice", "Voice answers: off").await;
    says(
        &bot,
        &fake,
        "/voice on",
        "I will answer you with voice notes",
    )
    .await;

    llm.push_when(
        last_user_contains("lights"),
        Script::text("The **lights** are on."),
    );
    fake.push_text(USER, USER, "lights?");
    let sent = fake.wait_for(|_| !voices(&fake).is_empty(), WAIT).await;
    assert!(sent, "no voice note: {:?}", fake.sent_texts(USER));
    let voice = &voices(&fake)[0];
    assert_eq!(voice.chat_id, USER);
    assert_eq!(
        voice.bytes,
        ogg_of("The lights are on."),
        "the spoken text, without markup"
    );
    assert_eq!(voice.caption.as_deref(), Some("The lights are on."));
    let asked = &llm.speaker.requests()[0].body;
    assert_eq!(asked["model"], "tts-test");
    assert_eq!(asked["voice"], "nova");
    assert_eq!(asked["response_format"], "opus");
    assert!(
        !fake
            .sent_texts(USER)
            .iter()
            .any(|t| t.contains("lights are on")),
        "the text went out a second time: {:?}",
        fake.sent_texts(USER)
    );

    // Longer than a caption may be: the voice note, then the text.
    let long = format!(
        "Here is the long story. {}",
        "It goes on and on. ".repeat(80)
    );
    llm.push_when(last_user_contains("story"), Script::text(&long));
    fake.push_text(USER, USER, "a story please");
    assert!(wait_sent(&fake, "Here is the long story.").await);
    assert_eq!(voices(&fake).len(), 2);
    assert_eq!(
        voices(&fake)[1].caption,
        None,
        "{:?}",
        voices(&fake)[1].caption
    );
    assert!(
        fake.calls_to("sendVoice").iter().all(|c| c.outcome.is_ok()),
        "Telegram refused a voice note"
    );

    // Off again: text.
    says(&bot, &fake, "/voice off", "I will answer you in text").await;
    llm.push_when(last_user_contains("plain"), Script::text("Plain text."));
    says(&bot, &fake, "plain please", "Plain text.").await;
    assert_eq!(voices(&fake).len(), 2);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_speaks_only_to_a_voice_message() {
    let (fake, llm) = (FakeBotApi::start().await, FakeOpenAi::start().await);
    let data = tempfile::tempdir().unwrap();
    let bot = start(&fake, &llm, data.path()).await;
    says(&bot, &fake, "/voice auto", "when you send me one").await;
    llm.push_when(last_user_contains("typed"), Script::text("Typed answer."));
    says(&bot, &fake, "typed question", "Typed answer.").await;
    assert!(voices(&fake).is_empty() && llm.speaker.requests().is_empty());

    let audio = b"OggS a spoken question".to_vec();
    llm.transcriber.register(&audio, "what time is it");
    let file = fake.files().add(audio.clone(), "oga");
    llm.push_when(last_user_contains("what time"), Script::text("Noon."));
    fake.push_media(
        USER,
        USER,
        voice_json(&file, &fake.files().unique_id(&file), audio.len()),
    );
    let sent = fake.wait_for(|_| !voices(&fake).is_empty(), WAIT).await;
    assert!(sent, "no voice note: {:?}", fake.sent_texts(USER));
    assert_eq!(voices(&fake)[0].caption.as_deref(), Some("Noon."));
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_error_or_audio_that_is_not_ogg_falls_back_to_text() {
    let (fake, llm) = (FakeBotApi::start().await, FakeOpenAi::start().await);
    let data = tempfile::tempdir().unwrap();
    let bot = start(&fake, &llm, data.path()).await;
    says(&bot, &fake, "/voice on", "voice notes").await;

    llm.speaker.fail_with(Some(500));
    llm.push_when(last_user_contains("first"), Script::text("First answer."));
    says(&bot, &fake, "first", "First answer.").await;
    let text = fake
        .sent_texts(USER)
        .into_iter()
        .find(|t| t.contains("First answer."))
        .unwrap();
    assert!(
        text.ends_with(&format!("🔇 ({FELL_BACK}, so here it is as text.)")),
        "{text}"
    );
    assert_eq!(text.matches("🔇").count(), 1, "{text}");

    // A server that answers MP3 whatever it is asked: not a voice note.
    llm.speaker.fail_with(None);
    llm.speaker.always_mp3(true);
    llm.push_when(last_user_contains("second"), Script::text("Second answer."));
    says(&bot, &fake, "second", "Second answer.").await;
    let text = fake
        .sent_texts(USER)
        .into_iter()
        .find(|t| t.contains("Second answer."))
        .unwrap();
    assert!(text.contains(FELL_BACK), "{text}");
    assert_eq!(llm.speaker.requests().len(), 2);
    assert!(voices(&fake).is_empty(), "{:?}", voices(&fake));
    for text in fake.sent_texts(USER) {
        assert!(
            !text.contains("media.") && !text.contains("HTTP"),
            "owner detail shown: {text}"
        );
    }
    bot.shutdown().await;
}
