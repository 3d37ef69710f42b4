//! First visible token: how soon the answer starts moving after a user
//! sends a message (issue 23).
//!
//! The agent's first token is ready at once (it pushes its first text the
//! moment its turn starts, then holds the turn a little before answering),
//! delivery has its default pacing, so everything between the update and
//! the first preview is telegate's. The figure is the time from the fake
//! Bot API handing the update out (the `getUpdates` answer that carries it)
//! to the fake recording the first request that shows model text: a
//! `sendMessageDraft` in a private chat (the default `auto` streaming), the
//! preview `sendMessage` in a group (edited in place), or the answer if it
//! came first (the turn runs 300 ms after its first token, so it should
//! not). p50/p99/max over
//! 100 trials each; then the same again with a turn already streaming in
//! another chat (its preview edited once a second meanwhile).
//!
//! Trials run one after another, each in one of a few dozen chats in turn
//! so no trial waits for its chat's own pacing from the trial before (the
//! previous message's answer is long out): the delay measured is the one a
//! user sees typing a message a few seconds after the last answer. A trial
//! ends at its first text; its answer follows at the chat's pacing (about
//! a second later), and every chat's answer is checked at the end of the
//! series (a missing one counts as lost). Waiting for each answer in turn
//! made a run take ten minutes.
//! telegate's CPU per trial (its runtime and store threads) is printed
//! beside it. Target: p99 ≤ 50 ms. Asserts nothing about time.

#[path = "support/allocator.rs"]
mod allocator;
#[path = "../tests/it/support/fake_bot/mod.rs"]
mod fake_bot;
#[path = "../tests/it/support/fake_files.rs"]
mod fake_files;
#[path = "support/figures.rs"]
mod figures;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fake_bot::{FakeBotApi, RecordedCall};
use figures::{figure, load_average, ms, quantile, us, Better, ThreadCpu};
use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};
use telegate::config::{Config, Purpose};
use telegate::engine::AgentSetup;
use telegate::transport::telegram::TelegramBot;

const TRIALS: usize = 100;
/// Chats the trials rotate over: each trial's chat last spoke a few
/// seconds before (its previous answer, sent about a second after its
/// first text at the chat's pacing, long out), a group at most a few times
/// a minute (within its 20 per minute).
const DM_CHATS: i64 = 40;
const GROUP_CHATS: i64 = 50;
/// Between two trials (a trial ends at its first text).
const GAP: Duration = Duration::from_millis(60);
const TARGET_P99: Duration = Duration::from_millis(50);
const FIRST_TEXT: &str = "Sure thing";
/// How long a turn runs after its first token: longer than the first
/// preview should take, so the answer itself is not what shows first.
const HOLD: Duration = Duration::from_millis(300);
const BUSY_TEXT: &str = "stream on";

/// The first token at once; then holds the turn briefly and answers. A
/// message saying [`BUSY_TEXT`] streams a word every 50 ms until stopped.
struct FastLlm;

impl Agent for FastLlm {
    fn name(&self) -> &str {
        "fast"
    }
    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            if turn.text.contains(BUSY_TEXT) {
                for i in 0.. {
                    turn.progress.push_text(&format!("word{i} "));
                    tokio::select! {
                        _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
            }
            turn.progress.push_text(FIRST_TEXT);
            tokio::select! {
                _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
                _ = tokio::time::sleep(HOLD) => {}
            }
            Ok(AgentReply::new(format!("{FIRST_TEXT}, done.")))
        })
    }
}

fn config(fake: &FakeBotApi, data_dir: &Path) -> Config {
    // Default delivery settings: the pacing and streaming a user gets.
    let text = format!(
        "[telegram]\ntoken = \"{}\"\napi_url = \"{}\"\nallow_all_users = true\n\n\
         [store]\ndata_dir = \"{}\"\n\n[log]\nlevel = \"error\"\n",
        fake.token(),
        fake.url(),
        data_dir.display()
    );
    Config::parse(Path::new("bench.toml"), &text, Purpose::Telegram, |_| None).expect("config")
}

#[derive(Clone, Copy, PartialEq)]
enum Chat {
    Private,
    Group,
}

impl Chat {
    fn id(self, n: i64) -> i64 {
        match self {
            Chat::Private => 10_000 + n,
            Chat::Group => -(10_000 + n),
        }
    }

    fn rotation(self) -> i64 {
        match self {
            Chat::Private => DM_CHATS,
            Chat::Group => GROUP_CHATS,
        }
    }

    fn push(self, fake: &FakeBotApi, chat: i64, text: &str) -> i64 {
        match self {
            Chat::Private => fake.push_text(chat, chat, text),
            Chat::Group => {
                fake.push_group_text(chat, 77, &format!("@telegate_test_bot {text}"), false)
            }
        }
    }

    /// A request showing model text in `chat`: a draft, the preview, or
    /// the answer itself (whichever comes first is what the user sees).
    fn shows_text(self, call: &RecordedCall, chat: i64) -> bool {
        matches!(call.method.as_str(), "sendMessageDraft" | "sendMessage")
            && call.chat_id() == Some(chat)
            && call.text().is_some_and(|t| t.contains(FIRST_TEXT))
    }

    fn label(self) -> &'static str {
        match self {
            Chat::Private => "dm",
            Chat::Group => "group",
        }
    }
}

fn answered(call: &RecordedCall, chat: i64, after: u64) -> bool {
    call.seq >= after
        && call.chat_id() == Some(chat)
        && matches!(call.method.as_str(), "sendMessage" | "editMessageText")
        && call.text().is_some_and(|t| t.contains("done."))
        && call.outcome.is_ok()
}

/// The `seq` the next recorded call gets (calls are numbered from 0).
fn next_seq(fake: &FakeBotApi) -> u64 {
    fake.calls_len() as u64
}

/// One trial: a message, then its first request showing model text. The
/// latency from the update handed out to that request, if both were seen.
/// The answer is not waited for here (it follows about a second later, at
/// the chat's pacing): [`series`] checks every answer at its end.
async fn trial(fake: &FakeBotApi, kind: Chat, chat: i64) -> Option<Duration> {
    let after = next_seq(fake);
    let id = kind.push(fake, chat, "hello there");
    let shown =
        |fake: &FakeBotApi| fake.count_calls(|c| c.seq >= after && kind.shows_text(c, chat)) > 0;
    if !fake.wait_until(shown, Duration::from_secs(30)).await {
        return None;
    }
    let handed_out = fake.handed_out_at(id)?;
    let shown = fake
        .calls_to("sendMessageDraft")
        .into_iter()
        .chain(fake.calls_to("sendMessage"))
        .filter(|c| c.seq >= after && kind.shows_text(c, chat))
        .map(|c| c.at)
        .min()?;
    Some(shown.saturating_duration_since(handed_out))
}

/// Waits until every chat in `chats` has its answer (sent after `after`);
/// returns how many never got one.
async fn unanswered(fake: &FakeBotApi, chats: &[i64], after: u64) -> usize {
    let all = |fake: &FakeBotApi| {
        chats
            .iter()
            .all(|&chat| fake.count_calls(|c| answered(c, chat, after)) > 0)
    };
    fake.wait_until(all, Duration::from_secs(60)).await;
    chats
        .iter()
        .filter(|&&chat| fake.count_calls(|c| answered(c, chat, after)) == 0)
        .count()
}

struct Series {
    latencies: Vec<Duration>,
    lost: usize,
    telegate_cpu: Duration,
}

async fn series(fake: &FakeBotApi, kind: Chat, round: i64) -> Series {
    // Every chat of the rotation known first (its session made), so the
    // trials measure a message in an ongoing conversation.
    let chats: Vec<i64> = (0..kind.rotation())
        .map(|n| kind.id(round * 1000 + n))
        .collect();
    let after = next_seq(fake);
    for &chat in &chats {
        kind.push(fake, chat, "hello there");
    }
    unanswered(fake, &chats, after).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let cpu_before = ThreadCpu::now();
    let after = next_seq(fake);
    let mut latencies = Vec::with_capacity(TRIALS);
    let mut lost = 0;
    for t in 0..TRIALS {
        let chat = chats[t % chats.len()];
        match trial(fake, kind, chat).await {
            Some(latency) => latencies.push(latency),
            None => lost += 1,
        }
        tokio::time::sleep(GAP).await;
    }
    // Every trial's answer came too (each chat's last one at least).
    lost += unanswered(fake, &chats, after).await;
    let telegate_cpu = ThreadCpu::now().since(&cpu_before).telegate();
    latencies.sort();
    Series {
        latencies,
        lost,
        telegate_cpu,
    }
}

fn report(kind: Chat, busy: bool, s: &Series) {
    let name = format!(
        "first_token/{}{}",
        kind.label(),
        if busy { "_busy" } else { "" }
    );
    let p = |q| quantile(&s.latencies, q);
    println!(
        "  {:<5} {:<32} p50 {:>6.1} ms, p99 {:>6.1} ms, max {:>6.1} ms (target p99 <= {} ms); \
         telegate CPU {:.0} us per trial{}",
        kind.label(),
        if busy {
            "with a turn streaming elsewhere:"
        } else {
            "alone:"
        },
        ms(p(0.5)),
        ms(p(0.99)),
        ms(p(1.0)),
        TARGET_P99.as_millis(),
        us(s.telegate_cpu) / TRIALS as f64,
        if s.lost > 0 {
            format!("; {} trials lost", s.lost)
        } else {
            String::new()
        }
    );
    figure(
        &format!("{name}/telegate_cpu_per_trial"),
        us(s.telegate_cpu) / TRIALS as f64,
        "us",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/p50"),
        ms(p(0.5)),
        "ms",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/p99"),
        ms(p(0.99)),
        "ms",
        Better::Lower,
        Some(ms(TARGET_P99)),
    );
    figure(
        &format!("{name}/max"),
        ms(p(1.0)),
        "ms",
        Better::Lower,
        None,
    );
    figure(
        &format!("{name}/lost"),
        s.lost as f64,
        "trials",
        Better::Lower,
        Some(0.0),
    );
}

async fn run() {
    let fake = FakeBotApi::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let bot = TelegramBot::start(
        &config(&fake, data.path()),
        Some(AgentSetup::without_tools(Arc::new(FastLlm))),
    )
    .await
    .expect("bot starts");
    println!(
        "first_token: update handed out by getUpdates -> first request showing model text \
         (draft in a private chat, preview in a group), default pacing, {TRIALS} trials each; load {:.1}",
        load_average()
    );
    for kind in [Chat::Private, Chat::Group] {
        let alone = series(&fake, kind, 1).await;
        report(kind, false, &alone);
        // A turn streaming in another chat the whole time.
        let busy_chat = 999;
        fake.push_text(busy_chat, busy_chat, BUSY_TEXT);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let busy = series(&fake, kind, 2).await;
        report(kind, true, &busy);
        fake.push_text(busy_chat, busy_chat, "/stop");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    bot.shutdown().await;
}

fn main() {
    // As the binary does.
    telegate::memory::tune_allocator();
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(run());
}
