//! Several bots in one process (`[[bots]]`), each against its own fake
//! Bot API: each answers only its own chats with its own sessions (two
//! bots see the same chat ids, user ids and update ids), one bot's revoked
//! token or 429 storm leaves the others running, a restart recovers each
//! bot's inbox on its own, webhooks share one listener by path, and
//! `/metrics` and `/healthz` name each bot.

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::support::agents::ScriptedAgent;
use crate::support::fake_bot::{Failure, FakeBotApi, FakeConfig, Outcome};
use crate::support::recorder::eventually;
use crate::support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::transport::telegram::TelegramBot;

const USER: i64 = 42;
const WAIT: Duration = Duration::from_secs(20);

/// A fake Bot API for bot `id` (token `<id>:TEST`).
async fn fake(id: i64) -> FakeBotApi {
    FakeBotApi::start_with(FakeConfig {
        bot_id: id,
        username: format!("bot_{id}"),
        ..FakeConfig::default()
    })
    .await
}

async fn fakes(n: i64) -> Vec<FakeBotApi> {
    let mut fakes = Vec::new();
    for i in 0..n {
        fakes.push(fake(1000 + i).await);
    }
    fakes
}

fn bots(fakes: &[FakeBotApi], data_dir: &std::path::Path) -> TestBot {
    let refs: Vec<&FakeBotApi> = fakes.iter().collect();
    TestBot::bots(&refs)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[store]\ndata_dir = {:?}\n",
            data_dir.display().to_string()
        ))
}

async fn wait_text(fake: &FakeBotApi, chat: i64, text: &str) -> bool {
    fake.wait_for(|_| fake.sent_texts(chat).iter().any(|t| t == text), WAIT)
        .await
}

/// Wait until `bot` has no turn running or queued. An answer is visible
/// before its turn has ended, and a message sent in between finds the chat
/// busy (and is told "Interrupting the current task").
async fn idle(bot: &TelegramBot) -> bool {
    eventually(WAIT, || bot.engine.adapter.is_idle()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bots_answer_only_their_own_chats_with_their_own_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let agent = ScriptedAgent::new();
    let fleet = bots(&fakes, dir.path())
        .agent(agent.clone())
        .start_fleet()
        .await
        .unwrap();
    assert_eq!(fleet.bots.len(), 2);
    // The same private chat (the user's id) with each bot, the same
    // update ids in both fakes.
    fakes[0].push_text(USER, USER, "a1");
    fakes[1].push_text(USER, USER, "b1");
    assert!(wait_text(&fakes[0], USER, "answer:a1").await);
    assert!(wait_text(&fakes[1], USER, "answer:b1").await);
    assert!(idle(&fleet.bots[0]).await);
    fakes[0].push_text(USER, USER, "a2");
    assert!(wait_text(&fakes[0], USER, "answer:a2").await);
    assert!(idle(&fleet.bots[0]).await);
    assert_eq!(fakes[0].sent_texts(USER), ["answer:a1", "answer:a2"]);
    assert_eq!(fakes[1].sent_texts(USER), ["answer:b1"]);
    // Each bot keeps its own session for the same chat.
    let a1 = agent.session_of("a1").unwrap();
    assert_eq!(agent.session_of("a2").unwrap(), a1);
    assert_ne!(agent.session_of("b1").unwrap(), a1);
    let histories = agent.histories.lock().unwrap().clone();
    let a2_history = &histories[2];
    assert!(a2_history.iter().any(|m| m == "a1"), "{a2_history:?}");
    assert!(
        !a2_history.iter().any(|m| m.contains("b1")),
        "{a2_history:?}"
    );
    // /new with one bot leaves the other's conversation as it was.
    fakes[1].push_text(USER, USER, "/new");
    fakes[0].push_text(USER, USER, "a3");
    assert!(wait_text(&fakes[0], USER, "answer:a3").await);
    assert_eq!(agent.session_of("a3").unwrap(), a1);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_bots_in_one_group_each_answer_only_their_own_mentions() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(10).await;
    let fleet = bots(&fakes, dir.path())
        .agent(ScriptedAgent::new())
        .toml("[telegram]\n")
        .start_fleet()
        .await;
    // `[telegram]` beside `[[bots]]` may stay empty: nothing moved there.
    let fleet = fleet.unwrap();
    let group = -100_777;
    for (index, fake) in fakes.iter().enumerate() {
        fake.push_group_text(
            group,
            USER,
            &format!("@bot_{} hi{index}", 1000 + index),
            false,
        );
    }
    for (index, fake) in fakes.iter().enumerate() {
        // The leading mention is the bot's own: taken off the text.
        let want = format!("answer:hi{index}");
        assert!(
            fake.wait_for(|_| !fake.sent_texts(group).is_empty(), WAIT)
                .await,
            "bot {index} answered"
        );
        assert_eq!(fake.sent_texts(group), [want], "bot {index}");
    }
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_whose_token_is_refused_stops_alone() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(3).await;
    let unauthorized = || Failure::Api {
        code: 401,
        description: "Unauthorized".into(),
    };
    // Bot 0 is refused at start: left out, the others start.
    fakes[0].fail_next("getMe", 1, unauthorized());
    let fleet = bots(&fakes, dir.path())
        .agent(ScriptedAgent::new())
        .start_fleet()
        .await
        .unwrap();
    let names: Vec<&str> = fleet.bots.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["b1", "b2"]);
    let stop = CancellationToken::new();
    let serving = tokio::spawn({
        let stop = stop.clone();
        async move { fleet.serve_until(&stop).await }
    });
    fakes[1].push_text(USER, USER, "before");
    assert!(wait_text(&fakes[1], USER, "answer:before").await);
    // Bot 1's token is revoked while it runs: it stops, bot 2 goes on.
    fakes[1].fail_next("getUpdates", 10, unauthorized());
    assert!(
        fakes[1]
            .wait_until(
                |fake| fake
                    .calls_to("getUpdates")
                    .iter()
                    .filter(|c| matches!(c.outcome, Outcome::Error { code: 401, .. }))
                    .count()
                    >= 3,
                WAIT
            )
            .await
    );
    fakes[2].push_text(USER, USER, "still here");
    assert!(wait_text(&fakes[2], USER, "answer:still here").await);
    assert!(!serving.is_finished(), "the fleet runs while a bot is left");
    stop.cancel();
    serving.await.unwrap().unwrap();
    // Bot 1 polled no more after it was refused three times.
    let refused = fakes[1]
        .calls_to("getUpdates")
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Error { code: 401, .. }))
        .count();
    assert_eq!(refused, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bots_429_storm_does_not_hold_up_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let fleet = bots(&fakes, dir.path())
        .agent(ScriptedAgent::new())
        .start_fleet()
        .await
        .unwrap();
    // Bot 0's sends are refused for 30 s at a time.
    fakes[0].fail_next("sendMessage", 1000, Failure::RetryAfter(30));
    for n in 0..3 {
        fakes[0].push_text(USER + n, USER, &format!("a{n}"));
    }
    assert!(
        fakes[0]
            .wait_until(|fake| fake.calls_to("sendMessage").len() >= 3, WAIT)
            .await
    );
    // Bot 1 answers everything meanwhile: its pacing is its own.
    for n in 0..10 {
        fakes[1].push_text(USER + n, USER, &format!("b{n}"));
    }
    for n in 0..10 {
        assert!(wait_text(&fakes[1], USER + n, &format!("answer:b{n}")).await);
    }
    assert!(
        (0..3).all(|n| fakes[0].sent_texts(USER + n).is_empty()),
        "bot 0 is still waiting out its 429s"
    );
    assert!(fakes[0].violations_of_retry_after().is_empty());
    fakes[0].clear_failures();
    drop(fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_recovers_each_bots_inbox_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let first = ScriptedAgent::new();
    let fleet = bots(&fakes, dir.path())
        .agent(first.clone())
        .start_fleet()
        .await
        .unwrap();
    // The same update id, chat and user in both: each bot's own row.
    fakes[0].push_text(USER, USER, "block a");
    fakes[1].push_text(USER, USER, "block b");
    assert!(fakes[0].wait_until(|_| first.started() == 2, WAIT).await);
    // The shutdown cuts both turns short; they are resumed at the start.
    fleet.shutdown().await;
    let second = ScriptedAgent::new();
    let fleet = bots(&fakes, dir.path())
        .agent(second.clone())
        .start_fleet()
        .await
        .unwrap();
    assert!(fakes[0].wait_until(|_| second.started() >= 2, WAIT).await);
    let mut texts = second.turn_texts();
    texts.sort();
    assert_eq!(
        texts,
        ["block a", "block b"],
        "each resumed once, by its bot"
    );
    fleet.shutdown().await;
}

/// A free port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_of_two_bots_share_one_listener_each_on_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let port = free_port();
    let webhook = |name: &str| {
        format!(
            "mode = \"webhook\"\n[webhook]\nlisten = \"127.0.0.1:{port}\"\n\
             public_url = \"https://bots.example\"\nsecret_token = \"secret-{name}\"\n"
        )
    };
    let fleet = bots(&fakes, dir.path())
        .bot_toml(0, webhook("b0"))
        .bot_toml(1, webhook("b1"))
        .agent(ScriptedAgent::new())
        .start_fleet()
        .await
        .unwrap();
    assert_eq!(
        fakes[0].webhook_url().as_deref(),
        Some("https://bots.example/b0")
    );
    assert_eq!(
        fakes[1].webhook_url().as_deref(),
        Some("https://bots.example/b1")
    );
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    fakes[0].push_text(USER, USER, "via hook a");
    fakes[1].push_text(USER, USER, "via hook b");
    assert_eq!(fakes[0].deliver_to_webhook(listen).await, 1);
    assert_eq!(fakes[1].deliver_to_webhook(listen).await, 1);
    assert!(wait_text(&fakes[0], USER, "answer:via hook a").await);
    assert!(wait_text(&fakes[1], USER, "answer:via hook b").await);
    // One bot's secret on the other's path, an unknown path, a GET.
    let client = reqwest::Client::new();
    let post = |path: &str, secret: &str| {
        client
            .post(format!("http://{listen}{path}"))
            .header("X-Telegram-Bot-Api-Secret-Token", secret.to_string())
            .json(&serde_json::json!({"update_id": 1}))
            .send()
    };
    assert_eq!(post("/b1", "secret-b0").await.unwrap().status(), 401);
    assert_eq!(post("/b2", "secret-b0").await.unwrap().status(), 404);
    let get = client.get(format!("http://{listen}/b0")).send().await;
    assert_eq!(get.unwrap().status(), 405);
    assert_eq!(fakes[1].sent_texts(USER), ["answer:via hook b"]);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_healthz_name_each_bot() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let fleet = bots(&fakes, dir.path())
        .toml("[metrics]\nlisten = \"127.0.0.1:0\"\n")
        .agent(ScriptedAgent::new())
        .start_fleet()
        .await
        .unwrap();
    fakes[1].push_text(USER, USER, "count me");
    assert!(wait_text(&fakes[1], USER, "answer:count me").await);
    let addr = fleet.metrics_addr.expect("the fleet serves /metrics");
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metrics
            .matches("# TYPE telegate_turns_started_total counter")
            .count(),
        1,
        "{metrics}"
    );
    assert!(
        metrics.contains("telegate_turns_started_total{bot=\"b0\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("telegate_turns_started_total{bot=\"b1\"} 1"),
        "{metrics}"
    );
    let health: Value = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for key in ["b0.updates", "b0.store", "b1.updates", "b1.store"] {
        assert_eq!(health[key], "ok", "{health}");
    }
    assert_eq!(health["status"], "ok");
    fleet.shutdown().await;
}

/// Chats per bot in the kill -9 test (the same chat ids with both bots).
const KILL_CHATS: i64 = 40;

/// How often `text` is visible in `chat`.
fn shown(fake: &FakeBotApi, chat: i64, text: &str) -> usize {
    fake.sent_texts(chat).iter().filter(|t| *t == text).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_and_duplicates_nothing_across_bots() {
    use crate::support::binary::{until, Telegate};
    use telegate::transport::telegram::intake::AMBIGUOUS_SEND_NOTICE;
    let dir = tempfile::tempdir().unwrap();
    let fakes = fakes(2).await;
    let config = dir.path().join("bots.toml");
    let data = dir.path().join("data");
    // Telegram's default pacing (30 messages a second per bot): the kill
    // finds answers of many chats in flight.
    let refs: Vec<&FakeBotApi> = fakes.iter().collect();
    let settings = TestBot::bots(&refs).users(&[USER]).toml(format!(
        "[store]\ndata_dir = {:?}\n",
        data.display().to_string()
    ));
    std::fs::write(&config, settings.text()).unwrap();
    // Every message is waiting when the first process starts, with the
    // same chat ids (and the same update ids) at both bots.
    for chat in 1..=KILL_CHATS {
        for (index, fake) in fakes.iter().enumerate() {
            fake.push_text(chat, USER, &format!("bot {index} chat {chat}"));
        }
    }
    let answers = |fake: &FakeBotApi| {
        (1..=KILL_CHATS)
            .map(|chat| fake.sent_texts(chat).len())
            .sum::<usize>()
    };
    let mut first = Telegate::start("killed", &config, &fakes[0], None);
    let answering = until(|| answers(&fakes[0]) >= 5 && answers(&fakes[1]) >= 5).await;
    first.kill9().await;
    assert!(
        answering,
        "both bots answered before the kill\n{}",
        first.log()
    );
    let mut second = Telegate::start("restarted", &config, &fakes[0], None);
    second.ready(&fakes[0]).await;
    let everything =
        |fake: &FakeBotApi| (1..=KILL_CHATS).all(|chat| !fake.sent_texts(chat).is_empty());
    let done = until(|| fakes.iter().all(everything)).await;
    second.stop().await;
    assert!(
        done,
        "every chat of both bots got an answer\n{}",
        second.log()
    );
    for (index, fake) in fakes.iter().enumerate() {
        let other = 1 - index;
        for chat in 1..=KILL_CHATS {
            let answer = format!("echo: bot {index} chat {chat}");
            let count = shown(fake, chat, &answer);
            assert!(count <= 1, "bot {index} answered chat {chat} {count} times");
            // One whose send the kill cut is told instead (never resent).
            let told = fake
                .sent_texts(chat)
                .iter()
                .any(|t| t.contains(AMBIGUOUS_SEND_NOTICE));
            assert!(
                count == 1 || told,
                "bot {index} chat {chat} lost: {:?}",
                fake.sent_texts(chat)
            );
            let foreign = format!("echo: bot {other} chat {chat}");
            assert_eq!(
                shown(fake, chat, &foreign),
                0,
                "bot {index} answered bot {other}'s message"
            );
        }
    }
}
