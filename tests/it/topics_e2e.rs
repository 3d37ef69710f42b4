//! Forum topics as conversations, end to end against the fake Bot API
//! (`[telegram] topics`): `auto` creates a topic for /new and for a
//! message in the General topic, titled from the message and renamed to
//! the task's first line after the first answer; replies carry the topic's
//! `message_thread_id`; /stop in one topic leaves another's turn running;
//! a topic closed (service message) or deleted (a send refused) ends its
//! session; without the right to manage topics the message runs where it
//! was written, and the user is told why.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use support::agents::ScriptedAgent;
use support::fake_bot::{FakeBotApi, RecordedCall};
use support::test_bot::{TestBot, FAST_DELIVERY, FAST_GROUPS};
use telegate::transport::telegram::TelegramBot;

const WAIT: Duration = Duration::from_secs(10);
const USER: i64 = 42;
const FORUM: i64 = -1_001_000_000_777;

async fn start(fake: &FakeBotApi, topics: &str) -> (TelegramBot, Arc<ScriptedAgent>) {
    start_with(fake, topics, "").await
}

/// [`start`] with `extra` TOML merged in.
async fn start_with(
    fake: &FakeBotApi,
    topics: &str,
    extra: &str,
) -> (TelegramBot, Arc<ScriptedAgent>) {
    let test_bot = TestBot::new(fake)
        .users(&[USER])
        .toml(FAST_DELIVERY)
        .toml(FAST_GROUPS)
        .toml(format!(
            "[telegram]\nrequire_mention = false\ntopics = \"{topics}\"\n\n\
             [delivery]\ntyping_delay_ms = 0\nstreaming = \"edit\"\n\n[store]\nin_memory = true\n"
        ))
        .toml(extra);
    let agent = ScriptedAgent::new();
    let bot = test_bot
        .agent(agent.clone())
        .start()
        .await
        .expect("bot starts against the fake");
    (bot, agent)
}

fn thread_of(call: &RecordedCall) -> Option<i64> {
    call.body.get("message_thread_id").and_then(Value::as_i64)
}

/// The successful sends into `FORUM` whose text holds `needle`.
fn sends_with(fake: &FakeBotApi, needle: &str) -> Vec<RecordedCall> {
    fake.calls_to("sendMessage")
        .into_iter()
        .filter(|c| c.chat_id() == Some(FORUM) && c.outcome.is_ok())
        .filter(|c| c.text().is_some_and(|t| t.contains(needle)))
        .collect()
}

async fn wait_send(fake: &FakeBotApi, needle: &str) -> RecordedCall {
    let found = fake
        .wait_for(|_| !sends_with(fake, needle).is_empty(), WAIT)
        .await;
    assert!(
        found,
        "no send with {needle:?}: {:?}",
        fake.calls_to("sendMessage")
    );
    sends_with(fake, needle).remove(0)
}

async fn wait_cancelled(agent: &ScriptedAgent, n: usize) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if agent.cancelled() >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn wait_started(agent: &ScriptedAgent, n: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while agent.started() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} turns never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_creates_a_topic_on_new_named_from_the_task_and_answers_in_it() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let (bot, agent) = start(&fake, "auto").await;
    let task = "Fix the login bug in auth.rs where users get logged out after five minutes";
    fake.push_topic_text(FORUM, USER, None, &format!("/new {task}\nmore detail"));

    let answer = wait_send(&fake, "answer:Fix the login bug").await;
    let created = fake.calls_to("createForumTopic");
    assert_eq!(created.len(), 1, "one topic for one /new");
    let name = created[0].body["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(name, "Fix the login bug in auth.rs where…");
    let thread = thread_of(&answer).expect("the answer carries the topic's thread");
    // The answer is out: the rename may already have followed it.
    let now = fake.topics(FORUM)[&thread].name.clone();
    assert!(now == name || now == task, "{now:?}");
    assert_eq!(agent.turn_texts(), vec![format!("{task}\nmore detail")]);

    // After the first answer the topic is renamed to the task's first line.
    assert!(
        fake.wait_for(|_| fake.topics(FORUM)[&thread].name == task, WAIT)
            .await,
        "renamed: {:?}",
        fake.topics(FORUM)
    );

    // A message in that topic stays there (no new topic) and is answered there.
    fake.push_topic_text(FORUM, USER, Some(thread), "second");
    let second = wait_send(&fake, "answer:second").await;
    assert_eq!(thread_of(&second), Some(thread));

    // A message in the General topic gets a topic of its own.
    fake.push_topic_text(FORUM, USER, None, "hello from general");
    let general = wait_send(&fake, "answer:hello from general").await;
    let other = thread_of(&general).expect("answered in a new topic");
    assert_ne!(other, thread);
    assert_eq!(fake.topics(FORUM)[&other].name, "hello from general");
    assert_eq!(fake.calls_to("createForumTopic").len(), 2);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_new_opens_a_topic_renamed_after_its_first_answer() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let (bot, _agent) = start(&fake, "auto").await;
    fake.push_topic_text(FORUM, USER, None, "/new");
    assert!(
        fake.wait_for(|_| fake.topics(FORUM).len() == 1, WAIT).await,
        "a topic was created"
    );
    let (thread, topic) = fake.topics(FORUM).into_iter().next().expect("one topic");
    assert_eq!(topic.name, "New conversation");
    // The /new is answered in the new topic.
    assert!(
        fake.wait_for(
            |calls| calls.iter().any(|c| c.method == "sendMessage"
                && c.outcome.is_ok()
                && thread_of(c) == Some(thread)),
            WAIT
        )
        .await
    );
    fake.push_topic_text(FORUM, USER, Some(thread), "Refactor the parser\nplease");
    wait_send(&fake, "answer:Refactor the parser").await;
    assert!(
        fake.wait_for(
            |_| fake.topics(FORUM)[&thread].name == "Refactor the parser",
            WAIT
        )
        .await
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_in_one_topic_leaves_the_turn_of_another_running() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let a = fake.add_topic(FORUM, "A");
    let b = fake.add_topic(FORUM, "B");
    let (bot, agent) = start(&fake, "per-topic").await;
    fake.push_topic_text(FORUM, USER, Some(a), "block a");
    fake.push_topic_text(FORUM, USER, Some(b), "block b");
    wait_started(&agent, 2).await;
    assert_eq!(
        bot.engine.adapter.busy_keys().len(),
        2,
        "one slot per topic"
    );

    fake.push_topic_text(FORUM, USER, Some(a), "/stop");
    assert!(wait_cancelled(&agent, 1).await, "topic A's turn stopped");
    let stopped = wait_send(&fake, "top").await;
    assert_eq!(thread_of(&stopped), Some(a), "the reply is in topic A");
    // Topic B's turn still runs.
    let busy = bot.engine.adapter.busy_keys();
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert!(busy[0].as_str().contains(&format!(":{b}:")), "{busy:?}");
    assert!(bot.engine.runner.running_agent(&busy[0]).is_some());
    assert_eq!(agent.cancelled(), 1);
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_topic_ends_its_session_and_leaves_the_others() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let a = fake.add_topic(FORUM, "A");
    let b = fake.add_topic(FORUM, "B");
    let (bot, agent) = start(&fake, "auto").await;
    fake.push_topic_text(FORUM, USER, Some(a), "/in 2h remind: check the logs");
    wait_send(&fake, "check the logs").await;
    fake.push_topic_text(FORUM, USER, Some(a), "block a");
    fake.push_topic_text(FORUM, USER, Some(b), "block b");
    wait_started(&agent, 2).await;

    fake.close_topic_as_user(FORUM, USER, a);
    assert!(
        wait_cancelled(&agent, 1).await,
        "the closed topic's turn ended"
    );
    // Its job stays unless the user says so: a Delete button in General.
    let offer = wait_send(&fake, "scheduled job(s) are kept").await;
    assert_eq!(thread_of(&offer), None, "offered in the General topic");
    let (message, _, data) = support::buttons::wait_button(&fake, FORUM, "Also delete job").await;
    fake.push_callback_query(FORUM, USER, message, &data);
    let jobs = bot.engine.runner.jobs().expect("the schedule is on");
    let deadline = tokio::time::Instant::now() + WAIT;
    while !jobs.list(FORUM).await.expect("jobs listed").is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job was deleted by its button"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let busy = bot.engine.adapter.busy_keys();
    assert_eq!(busy.len(), 1, "{busy:?}");
    assert!(busy[0].as_str().contains(&format!(":{b}:")), "{busy:?}");

    // A deleted topic sends no update: the next request into it is refused
    // ("message thread not found", here the turn's typing), which ends it.
    fake.delete_topic_as_user(FORUM, b);
    assert!(
        wait_cancelled(&agent, 2).await,
        "the deleted topic's turn ended"
    );
    assert!(
        fake.wait_for(|_| bot.engine.adapter.busy_keys().is_empty(), WAIT)
            .await
    );
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_right_to_manage_topics_the_message_runs_where_it_was_written() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, false);
    let (bot, _agent) = start(&fake, "auto").await;
    fake.push_topic_text(FORUM, USER, None, "hello");
    let answer = wait_send(&fake, "answer:hello").await;
    assert_eq!(thread_of(&answer), None, "answered in the General topic");
    let refused = fake.calls_to("createForumTopic");
    assert_eq!(refused.len(), 1);
    assert!(!refused[0].outcome.is_ok());
    let told = wait_send(&fake, "could not create a topic").await;
    assert!(
        told.text()
            .is_some_and(|t| t.contains("not enough rights to create a topic")),
        "{told:?}"
    );
    assert!(fake.topics(FORUM).is_empty());
    bot.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_off_shares_one_slot_across_topics_and_answers_in_each_topic() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let a = fake.add_topic(FORUM, "A");
    let b = fake.add_topic(FORUM, "B");
    let (bot, agent) = start(&fake, "off").await;
    fake.push_topic_text(FORUM, USER, Some(a), "block a");
    wait_started(&agent, 1).await;
    // The same slot: /stop in B stops A's turn.
    fake.push_topic_text(FORUM, USER, Some(b), "/stop");
    assert!(wait_cancelled(&agent, 1).await);
    let stopped = wait_send(&fake, "top").await;
    assert_eq!(thread_of(&stopped), Some(b));
    assert!(fake.calls_to("createForumTopic").is_empty());
    bot.shutdown().await;
}

/// One member's burst in the General topic makes at most their cap of
/// topics a minute; the rest is answered in the General topic (nothing
/// lost), the member told once; another member still gets a topic, up to
/// the group's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_makes_at_most_the_cap_of_topics_and_the_rest_is_answered_in_general() {
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let (bot, _agent) = start_with(
        &fake,
        "auto",
        "[telegram]\nallowed_users = [42, 43]\ntopics_per_user_per_minute = 3\n\
         topics_per_group_per_minute = 4\n\n[sessions]\nbusy_mode = \"queue\"\n",
    )
    .await;
    for i in 0..8 {
        fake.push_topic_text(FORUM, USER, None, &format!("task {i}"));
    }
    for i in 0..8 {
        wait_send(&fake, &format!("answer:task {i}")).await;
    }
    let created = fake.calls_to("createForumTopic");
    assert_eq!(created.len(), 3, "the user's cap: {created:?}");
    let in_general = (0..8)
        .filter(|i| thread_of(&sends_with(&fake, &format!("answer:task {i}"))[0]).is_none())
        .count();
    assert_eq!(in_general, 5, "the rest answered where written");
    let told = sends_with(&fake, "at most 3 new topics a minute for you");
    assert_eq!(told.len(), 1, "told once: {told:?}");
    assert_eq!(thread_of(&told[0]), None);

    // Another member gets a topic; the group's cap (4) holds the next.
    fake.push_topic_text(FORUM, 43, None, "other 1");
    let other = wait_send(&fake, "answer:other 1").await;
    assert!(thread_of(&other).is_some(), "another member's topic");
    fake.push_topic_text(FORUM, 43, None, "other 2");
    let second = wait_send(&fake, "answer:other 2").await;
    assert_eq!(thread_of(&second), None, "the group's cap");
    wait_send(&fake, "at most 4 new topics a minute for this group").await;
    assert_eq!(fake.calls_to("createForumTopic").len(), 4);
    bot.shutdown().await;
}

/// A reply into a topic that is closed is not dropped: it goes to the
/// General topic, a line first saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_into_a_closed_topic_goes_to_the_general_topic() {
    use telegate::delivery::telegram::MOVED_TO_GENERAL;
    let fake = FakeBotApi::start().await;
    fake.make_forum(FORUM, true);
    let a = fake.add_topic(FORUM, "A");
    // No typing first: its refusal would end the topic's turn before the
    // answer is out.
    let (bot, _agent) =
        start_with(&fake, "per-topic", "[delivery]\ntyping_delay_ms = 60000\n").await;
    fake.close_topic_quietly(FORUM, a);
    fake.push_topic_text(FORUM, USER, Some(a), "hello");
    let answer = wait_send(&fake, "answer:hello").await;
    assert_eq!(thread_of(&answer), None, "answered in the General topic");
    let moved = wait_send(&fake, MOVED_TO_GENERAL).await;
    assert_eq!(thread_of(&moved), None);
    assert!(moved.seq < answer.seq, "the line says why first");
    bot.shutdown().await;
}
