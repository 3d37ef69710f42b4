//! Pairing and invite codes are not kept in plain text (issue 57, item 3):
//! `/pair CODE` and `/start CODE` are recorded in the inbox without the
//! code, a row replayed after a restart is answered as the bare command
//! (no code, no wrong try), and a code posted in a group is void.
//!
//! Assertions are on what the fakes and the store recorded, waited for.

use crate::support;

use std::path::Path;

use serde_json::Value;
use support::fake_bot::{ChatType, FakeBotApi};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use support::tools_bot::WAIT;
use telegate::access::Role;
use telegate::store::Store;
use telegate::transport::telegram::TelegramBot;
use telegate::vocab::InboxState;

const OWNER: i64 = 50;
const MEMBER: i64 = 60;
const STRANGER: i64 = 61;
const GROUP: i64 = -100;

fn bot_in(fake: &FakeBotApi, store: &str) -> TestBot {
    TestBot::new(fake)
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!("[store]\n{store}\n"))
}

fn in_dir(dir: &Path) -> String {
    format!("data_dir = \"{}\"", dir.display())
}

fn count(fake: &FakeBotApi, chat: i64, needle: &str) -> usize {
    fake.sent_texts(chat)
        .iter()
        .filter(|t| t.contains(needle))
        .count()
}

async fn wait_count(fake: &FakeBotApi, chat: i64, needle: &str, n: usize) {
    let seen = fake
        .wait_for(|_| count(fake, chat, needle) >= n, WAIT)
        .await;
    assert!(
        seen,
        "not {n} {needle:?} in {chat}: {:?}",
        fake.sent_texts(chat)
    );
}

/// The recorded payload of update `id`.
async fn payload(bot: &TelegramBot, id: i64) -> Value {
    bot.store
        .inbox()
        .inbox_entry(id)
        .await
        .unwrap()
        .expect("the update was recorded")
        .payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codes_stay_out_of_the_inbox_and_a_replayed_command_is_answered_without_one() {
    let fake = FakeBotApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let bot = bot_in(&fake, &in_dir(dir.path())).start().await.unwrap();
    let access = bot.engine.runner.access().unwrap();
    let pairing = access.pairing_code().await.unwrap();
    let paired = fake.push_text(OWNER, OWNER, &format!("/pair {pairing}"));
    wait_count(&fake, OWNER, "You are the owner", 1).await;
    let joining = access.invite(OWNER as u64, Role::User).await.unwrap().code;
    let joined = fake.push_text(MEMBER, MEMBER, &format!("/start {joining}"));
    wait_count(&fake, MEMBER, "You have access", 1).await;
    // A member's /start with a code is an ordinary command: answered, and
    // recorded (open until answered) without the code, which stays valid.
    let spare = access.invite(OWNER as u64, Role::User).await.unwrap().code;
    let greeted = fake.push_text(MEMBER, MEMBER, &format!("/start {spare}"));
    wait_count(&fake, MEMBER, "Hi! Messages you send", 1).await;
    let mut recorded = Vec::new();
    for (id, code, command) in [
        (paired, &pairing, "/pair"),
        (joined, &joining, "/start"),
        (greeted, &spare, "/start"),
    ] {
        let row = payload(&bot, id).await;
        assert!(!row.to_string().contains(code.as_str()), "{row}");
        assert_eq!(row["message"]["text"], command, "{row}");
        recorded.push(row);
    }
    bot.shutdown().await;

    // As if the previous process had recorded them and died before
    // answering: the owner's /pair and the member's /start replayed.
    {
        let path = bot_in(&fake, &in_dir(dir.path()))
            .config()
            .store
            .database_path();
        let store = Store::open_async(path)
            .await
            .unwrap()
            .for_bot(telegate::vocab::BotId(fake.config().bot_id));
        for (n, (chat, mut row)) in [(OWNER, recorded[0].clone()), (MEMBER, recorded[2].clone())]
            .into_iter()
            .enumerate()
        {
            let update_id = 9_000 + n as i64;
            let message_id = 9_000 + n as i64;
            row["update_id"] = update_id.into();
            row["message"]["message_id"] = message_id.into();
            let inbox = store.inbox();
            let new = inbox.record_update(
                update_id,
                chat,
                Some(message_id),
                row,
                InboxState::Received,
                None,
            );
            assert!(new.await.unwrap());
        }
        store.close().await.unwrap();
    }
    let bot = bot_in(&fake, &in_dir(dir.path())).start().await.unwrap();
    wait_count(&fake, OWNER, "You already have access", 1).await;
    wait_count(&fake, MEMBER, "Hi! Messages you send", 2).await;
    // The member's code was neither used nor voided by any of it.
    fake.push_text(STRANGER, STRANGER, &format!("/start {spare}"));
    wait_count(&fake, STRANGER, "You have access", 1).await;
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invite_posted_in_a_group_no_longer_works() {
    let fake = FakeBotApi::start().await;
    fake.register_chat(GROUP, ChatType::Group);
    let bot = bot_in(&fake, "in_memory = true").start().await.unwrap();
    let access = bot.engine.runner.access().unwrap();
    let pairing = access.pairing_code().await.unwrap();
    fake.push_text(OWNER, OWNER, &format!("/pair {pairing}"));
    wait_count(&fake, OWNER, "You are the owner", 1).await;
    let invite = access.invite(OWNER as u64, Role::User).await.unwrap().code;
    // A stranger's message in a group is ignored, and its code is void.
    let posted = fake.push_group_text(GROUP, STRANGER, &format!("/start {invite}"), false);
    let recorded = fake
        .wait_for(|_| fake.pending_updates_len() == 0, WAIT)
        .await;
    assert!(recorded, "the group message was taken");
    let row = payload(&bot, posted).await;
    assert!(!row.to_string().contains(invite.as_str()), "{row}");
    fake.push_text(STRANGER, STRANGER, &format!("/start {invite}"));
    wait_count(&fake, STRANGER, "That code is not valid", 1).await;
    assert!(!access.is_member(STRANGER as u64));
    bot.shutdown().await;
}
