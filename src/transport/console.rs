//! The console transport: `telegate console`.
//!
//! Lines from stdin become messages of one local chat; replies are printed as
//! they arrive. It goes through the very same adapter and runner as Telegram,
//! so /stop, /new and queueing behave exactly as they do there. Works
//! interactively (with a prompt) and from a pipe (no prompt; at end of input
//! it waits for the running and queued turns to finish before exiting).

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::config::Config;
use crate::engine::{build_agent_setup, report_lost_processes, Engine};
use crate::reply::{DeliveryError, Outbound, Reply, ReplyKind};
use crate::vocab::{MessageEvent, Platform, SessionSource};

/// Prints replies to a writer (stdout in the binary, a buffer in tests).
pub struct ConsoleOutbound {
    out: Mutex<Box<dyn Write + Send>>,
}

impl ConsoleOutbound {
    /// Print to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        ConsoleOutbound {
            out: Mutex::new(out),
        }
    }
}

/// How a reply is printed: notices and errors are marked so they stand out
/// from answers.
pub fn render_reply(reply: &Reply) -> String {
    match reply.kind {
        ReplyKind::Answer | ReplyKind::Command => reply.text.clone(),
        ReplyKind::Notice => format!("[{}]", reply.text),
        ReplyKind::Error => format!("[error] {}", reply.text),
    }
}

impl Outbound for ConsoleOutbound {
    fn deliver<'a>(
        &'a self,
        _to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
            writeln!(out, "{}", render_reply(&reply))
                .and_then(|()| out.flush())
                .map_err(|e| DeliveryError::Unavailable(e.to_string()))
        })
    }
}

/// Run the console until end of input (or `/quit`).
pub async fn run(config: &Config) -> anyhow::Result<()> {
    // One process per data directory (see `instance_lock`).
    let _lock = match config.store.in_memory {
        true => None,
        false => Some(crate::instance_lock::InstanceLock::acquire(
            &config.store.data_dir,
        )?),
    };
    let interactive = std::io::stdin().is_terminal();
    let outbound = Arc::new(ConsoleOutbound::new(Box::new(std::io::stdout())));
    let setup = build_agent_setup(config).map_err(anyhow::Error::msg)?;
    let engine = Engine::open_setup(config, setup, outbound.clone()).await?;
    if let Some(store) = engine.runner.store() {
        report_lost_processes(store, outbound.as_ref()).await;
    }
    if interactive {
        eprintln!(
            "telegate console — backend {}. Type a message; /help for commands, /quit or Ctrl-D to leave.",
            engine.runner.backend_name()
        );
    }
    let source = SessionSource {
        user_id: Some(1),
        user_name: Some("console".to_string()),
        ..SessionSource::dm(Platform::Console, config.console.chat_id)
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut message_id = 0i64;
    while let Some(line) = lines.next_line().await? {
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/quit" || text == "/exit" {
            break;
        }
        message_id += 1;
        let event = MessageEvent::text(source.clone(), text).with_message_id(message_id);
        engine.adapter.handle_message(event).await;
    }
    // End of input: let running and queued turns finish.
    while !engine.adapter.is_idle() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
