//! Test agents: behaviour chosen by the message text, every start and
//! cancellation recorded.
//!
//! * `block...`   waits until cancelled;
//! * `slow:<ms>`  answers after `ms` milliseconds (cancellable), pinging progress;
//! * `silent`     hangs without any progress (for the watchdog);
//! * `fail`       returns a backend error;
//! * `fail after progress`  shows "half an answer", then fails the same way;
//! * `deaf:<ms>`  answers after `ms` milliseconds, ignoring cancellation;
//! * `trimmed:<n>`  answers, saying it left the `n` oldest history messages out;
//! * `gives up`   ends as cancelled on its own (as a CLI agent killed from
//!   outside does);
//! * `panic`      panics;
//! * `near:<n>`   answers plain text of exactly `n` UTF-16 units (emoji
//!   included), `nearbold:<n>` the same wrapped in `**…**`;
//! * anything else answers `answer:<text>` at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use telegate::agent::{Agent, AgentError, AgentReply, TurnRequest};

#[derive(Default)]
pub struct ScriptedAgent {
    pub started: AtomicUsize,
    pub cancelled: AtomicUsize,
    /// (chat id, text, session id) of every started turn, in start order.
    pub turns: Mutex<Vec<(i64, String, String)>>,
    /// The history (message contents) each started turn was given.
    pub histories: Mutex<Vec<Vec<String>>>,
    /// Says it keeps its conversation itself (as a CLI or ACP agent does),
    /// so the runner hands it no history.
    pub own_sessions: bool,
}

impl ScriptedAgent {
    pub fn new() -> Arc<Self> {
        Arc::new(ScriptedAgent::default())
    }

    /// An agent that keeps its conversation itself (see `own_sessions`).
    pub fn with_own_sessions() -> Arc<Self> {
        Arc::new(ScriptedAgent {
            own_sessions: true,
            ..ScriptedAgent::default()
        })
    }

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub fn turn_texts(&self) -> Vec<String> {
        self.turns
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.1.clone())
            .collect()
    }

    pub fn session_of(&self, text: &str) -> Option<String> {
        self.turns
            .lock()
            .unwrap()
            .iter()
            .find(|t| t.1 == text)
            .map(|t| t.2.clone())
    }
}

impl Agent for ScriptedAgent {
    fn name(&self) -> &str {
        "scripted"
    }

    fn reads_history(&self) -> bool {
        !self.own_sessions
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            self.started.fetch_add(1, Ordering::SeqCst);
            self.turns.lock().unwrap().push((
                turn.source.chat_id,
                turn.text.clone(),
                turn.session_id.to_string(),
            ));
            self.histories
                .lock()
                .unwrap()
                .push(turn.history.iter().map(|m| m.content.clone()).collect());
            let text = turn.text.clone();
            // A turn is cancelled either by its token or by its future being
            // dropped; the guard counts both.
            let mut ended_early = CountOnDrop(Some(&self.cancelled));
            let cancel = turn.cancel.clone();
            let wait = |d: Duration| {
                let cancel = cancel.clone();
                async move {
                    tokio::select! {
                        _ = cancel.cancelled() => Err(AgentError::Cancelled),
                        _ = tokio::time::sleep(d) => Ok(()),
                    }
                }
            };
            if text == "fail" || text == "panic" {
                ended_early.0 = None;
            }
            if text.starts_with("block") {
                wait(Duration::from_secs(3600)).await?;
            } else if let Some(ms) = text.strip_prefix("slow:") {
                let ms: u64 = ms
                    .split_whitespace()
                    .next()
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0);
                turn.progress.push_text("working…");
                wait(Duration::from_millis(ms)).await?;
            } else if let Some(spec) = text.strip_prefix("stream:") {
                // stream:<words>:<ms per word>
                let mut parts = spec.split(':');
                let words: usize = parts.next().and_then(|n| n.parse().ok()).unwrap_or(3);
                let ms: u64 = parts.next().and_then(|n| n.parse().ok()).unwrap_or(100);
                let mut all = String::new();
                for i in 0..words {
                    let word = format!("w{i} ");
                    turn.progress.push_text(&word);
                    all.push_str(&word);
                    wait(Duration::from_millis(ms)).await?;
                }
                ended_early.0 = None;
                return Ok(AgentReply::new(all.trim_end()));
            } else if let Some(size) = text.strip_prefix("long:") {
                let size: usize = size.parse().unwrap_or(9000);
                ended_early.0 = None;
                return Ok(AgentReply::new(long_markdown(size)));
            } else if let Some(units) = text.strip_prefix("near:") {
                ended_early.0 = None;
                return Ok(AgentReply::new(near_limit_text(
                    units.parse().unwrap_or(4096),
                )));
            } else if let Some(units) = text.strip_prefix("nearbold:") {
                ended_early.0 = None;
                let inner = near_limit_text(units.parse().unwrap_or(4096));
                return Ok(AgentReply::new(format!("**{inner}**")));
            } else if text == "silent" {
                wait(Duration::from_secs(3600)).await?;
            } else if text == "fail after progress" {
                turn.progress.push_text("half an answer");
                ended_early.0 = None;
                return Err(AgentError::Backend {
                    user_message: "The backend broke.".into(),
                    detail: "broke halfway".into(),
                });
            } else if let Some(ms) = text.strip_prefix("deaf:") {
                // Ignores its cancel token: answers after `ms` regardless.
                let ms: u64 = ms.parse().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            } else if let Some(n) = text.strip_prefix("trimmed:") {
                ended_early.0 = None;
                let mut reply = AgentReply::new(format!("answer:{text}"));
                reply.history_trimmed = n.parse().unwrap_or(0);
                return Ok(reply);
            } else if text == "gives up" {
                ended_early.0 = None;
                return Err(AgentError::Cancelled);
            } else if text == "fail" {
                return Err(AgentError::Backend {
                    user_message: "The backend broke.".into(),
                    detail: "stack trace that must not reach the user".into(),
                });
            } else if text == "panic" {
                panic!("the agent exploded");
            }
            ended_early.0 = None;
            Ok(AgentReply::new(format!("answer:{text}")))
        })
    }
}

struct CountOnDrop<'a>(Option<&'a AtomicUsize>);

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(counter) = self.0 {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A long Markdown reply with headings, bold, code blocks and emoji.
pub fn long_markdown(size: usize) -> String {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < size {
        i += 1;
        out.push_str(&format!(
            "## Part {i} 🚀\n\nSome **bold** text, some _italic_, a [link](https://example.com/{i}) and emoji 👩‍👩‍👧‍👦🇩🇪.\n\n```rust\nfn part_{i}() -> u32 {{\n    {i} // 😀 inside code\n}}\n```\n\n"
        ));
    }
    out
}

/// Plain text (no Markdown syntax, no spaces) of exactly `units` UTF-16
/// units: "ab😀" repeated (the emoji is a surrogate pair), padded with "z".
pub fn near_limit_text(units: usize) -> String {
    let mut out = String::new();
    let mut len = 0;
    while len + 4 <= units {
        out.push_str("ab😀");
        len += 4;
    }
    while len < units {
        out.push('z');
        len += 1;
    }
    out
}
