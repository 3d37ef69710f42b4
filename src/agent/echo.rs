//! The `echo` backend: answers with the message it was given.
//!
//! It exists so that `telegate console` and a fresh bot can be tried without
//! any LLM, and so that the whole pipeline can be exercised end to end. An
//! optional delay (streamed word by word) makes /stop and queueing visible.

use std::time::Duration;

use futures::future::BoxFuture;

use super::{Agent, AgentError, AgentReply, TurnRequest};

/// Replies "echo: <text>", optionally slowly.
#[derive(Clone, Debug, Default)]
pub struct EchoAgent {
    /// Total time a reply takes, spread over its words.
    pub delay: Duration,
}

impl Agent for EchoAgent {
    fn name(&self) -> &str {
        "echo"
    }

    fn reads_history(&self) -> bool {
        false
    }

    fn run(&self, turn: TurnRequest) -> BoxFuture<'_, Result<AgentReply, AgentError>> {
        Box::pin(async move {
            let reply = format!("echo: {}", turn.text);
            let words: Vec<&str> = reply.split_inclusive(' ').collect();
            let step = self.delay / (words.len().max(1) as u32);
            for word in words {
                if !step.is_zero() {
                    tokio::select! {
                        _ = turn.cancel.cancelled() => return Err(AgentError::Cancelled),
                        _ = tokio::time::sleep(step) => {}
                    }
                }
                turn.progress.push_text(word);
            }
            Ok(AgentReply::new(reply))
        })
    }
}
