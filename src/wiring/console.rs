//! `telegate console` from the configuration: the console transport in
//! front of the configured engine.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::config::Config;
use crate::engine::report_lost_processes;
use crate::transport::console::ConsoleOutbound;
use crate::vocab::{MessageEvent, Platform, SessionSource};
use crate::wiring::engine::{build_agent_setup, open_engine};

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
    let engine = open_engine(config, setup, outbound.clone()).await?;
    if let Some(store) = engine.runner.store() {
        report_lost_processes(&store.processes, outbound.as_ref()).await;
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
    engine.runner.shutdown_agent().await;
    Ok(())
}
