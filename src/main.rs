//! The `telegate` binary: `run`, `console` and `check-config`.
//!
//! This is the edge where errors become `anyhow` and exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use telegate::config::{Config, LogFormat, Purpose};

#[derive(Parser)]
#[command(
    name = "telegate",
    version,
    about = "An AI agent behind a Telegram chat"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the Telegram bot.
    Run {
        /// The configuration file.
        #[arg(long, short, default_value = "telegate.toml")]
        config: PathBuf,
    },
    /// Chat with the agent in this terminal (no Telegram needed).
    Console {
        /// The configuration file.
        #[arg(long, short, default_value = "telegate.toml")]
        config: PathBuf,
    },
    /// Validate the configuration without connecting anywhere.
    CheckConfig {
        /// The configuration file.
        #[arg(long, short, default_value = "telegate.toml")]
        config: PathBuf,
    },
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (path, purpose) = match &cli.command {
        Command::Run { config } | Command::CheckConfig { config } => (config, Purpose::Telegram),
        Command::Console { config } => (config, Purpose::Console),
    };
    let config = match Config::load(path, purpose) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    if let Command::CheckConfig { .. } = cli.command {
        println!("{}: OK\n{}", path.display(), config.summary());
        return ExitCode::SUCCESS;
    }
    // Before any thread exists: secrets out of the environment block, no
    // dumping, no capabilities that reach into our memory (see secrets.rs).
    let hardening = telegate::secrets::harden_process(&config.secret_env_names());
    init_logging(&config);
    if !hardening.undumpable || !hardening.problems.is_empty() {
        tracing::warn!(
            undumpable = hardening.undumpable,
            problems = ?hardening.problems,
            "could not fully protect telegate's memory from its child processes"
        );
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Console { .. } => telegate::transport::console::run(&config).await,
            Command::Run { .. } => telegate::transport::telegram::run(&config).await,
            Command::CheckConfig { .. } => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause once: many errors
/// repeat their source's text in their own message, and printing the chain
/// naively would show it again for every level.
fn error_chain(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || parts.iter().any(|shown| shown.contains(text)) {
            continue;
        }
        parts.push(text.to_string());
    }
    parts.join(": ")
}
