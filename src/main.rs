//! The `telegate` binary: `run`, `console`, `check-config`, `init` and
//! `pair`.
//!
//! This is the edge where errors become `anyhow` and exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use telegate::config::{zero_config, Config, LogFormat, Purpose};

/// mimalloc instead of glibc's malloc (the `mimalloc` feature, on by
/// default). Cheaper per update (a turn's values are allocated on one
/// thread and freed on another, which glibc serialises), a little dearer
/// in idle memory: `Cargo.toml`'s `[features]` has the figures. The
/// benches that run the engine in process and the integration tests
/// declare the same allocator under the same feature, so they measure and
/// test what that build ships.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// The configuration file (default: telegate.toml if it exists,
        /// else built-in defaults plus the environment).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// If another telegate holds the data directory, wait and take over
        /// when it exits (instead of exiting with an error).
        #[arg(long)]
        standby: bool,
    },
    /// Chat with the agent in this terminal (no Telegram needed).
    Console {
        /// The configuration file (default: telegate.toml if it exists,
        /// else built-in defaults plus the environment).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Validate the configuration without connecting anywhere.
    CheckConfig {
        /// The configuration file (default: telegate.toml if it exists,
        /// else built-in defaults plus the environment).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Claude Code's permission-prompt MCP server (started by Claude Code
    /// from the config telegate hands it; not for use by hand).
    #[command(name = "permission-helper", hide = true)]
    PermissionHelper {
        /// telegate's private socket.
        #[arg(long)]
        socket: PathBuf,
    },
    /// Print a fresh pairing code for the bot of this data directory
    /// (running or not): the first user to send `/pair CODE` becomes its
    /// owner.
    Pair {
        /// The configuration file (default: telegate.toml if it exists,
        /// else built-in defaults plus the environment).
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// Which bot (its `name`), when several run on the data directory.
        #[arg(long)]
        bot: Option<String>,
    },
    /// Write a commented example configuration (never over an existing file).
    Init {
        /// Where to write it.
        #[arg(long, short, default_value = zero_config::DEFAULT_CONFIG_FILE)]
        config: PathBuf,
    },
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_logs())
        .with_writer(std::io::stderr);
    let _ = match config.log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Colour in the log only on a terminal, and not there either with
/// `NO_COLOR` set: journald and log files store escape codes as they are.
fn colour_logs() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    telegate::memory::tune_allocator();
    let cli = Cli::parse();
    let (path, purpose) = match &cli.command {
        Command::Run { config, .. } | Command::CheckConfig { config } => {
            (config, Purpose::Telegram)
        }
        Command::Console { config } | Command::Pair { config, .. } => (config, Purpose::Console),
        Command::PermissionHelper { socket } => return permission_helper(socket.clone()),
        Command::Init { config } => return init(config),
    };
    let config = match zero_config::load(path.as_deref(), purpose) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    match &cli.command {
        Command::Pair { bot, .. } => return pair(&config, bot.as_deref()),
        Command::CheckConfig { .. } => return check_config(&config),
        _ => {}
    }
    harden_and_log(&config);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Console { .. } => telegate::wiring::console::run(&config).await,
            Command::Run { standby, .. } => telegate::wiring::run::run_with(&config, standby).await,
            Command::CheckConfig { .. }
            | Command::Init { .. }
            | Command::Pair { .. }
            | Command::PermissionHelper { .. } => Ok(()),
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

/// `telegate init`: the commented example, never over an existing file.
fn init(config: &Path) -> ExitCode {
    match zero_config::init(config) {
        Ok(()) => {
            println!(
                "wrote {}: edit it, then `telegate run --config {}`",
                config.display(),
                config.display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

/// `telegate check-config`: where the configuration came from and what it
/// says.
fn check_config(config: &Config) -> ExitCode {
    println!(
        "{}: OK\n{}",
        match &config.source {
            zero_config::ConfigSource::File(path) => path.display().to_string(),
            zero_config::ConfigSource::Environment => "(environment)".to_string(),
        },
        config.summary()
    );
    ExitCode::SUCCESS
}

/// Before any thread exists: secrets out of the environment block, no
/// dumping, no capabilities that reach into our memory (see secrets.rs);
/// then logging, and the open-files limit raised.
fn harden_and_log(config: &Config) {
    let hardening = telegate::secrets::harden_process(&config.secret_env_names());
    init_logging(config);
    tracing::info!("{}", config.source.describe(config));
    if !hardening.undumpable || !hardening.problems.is_empty() {
        tracing::warn!(
            undumpable = hardening.undumpable,
            problems = ?hardening.problems,
            "could not fully protect telegate's memory from its child processes"
        );
    }
    // After the hardening (which must come before any thread), before the
    // runtime: the listeners' caps, not the default 1024 descriptors,
    // decide how many connections are served (see listener.rs).
    match telegate::listener::raise_open_files_limit() {
        Ok(files) => tracing::debug!(
            before = files.before,
            now = files.now,
            "open files soft limit set to the hard limit"
        ),
        Err(error) => tracing::warn!(%error, "could not raise the open files limit"),
    }
}

/// The helper mode: an MCP server on stdin/stdout that forwards Claude
/// Code's permission prompts to the running telegate (no config, no
/// secrets; see `telegate::tools::permission`).
fn permission_helper(socket: PathBuf) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(telegate::tools::permission::helper::run(socket)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `telegate pair`: a fresh pairing code written into the data
/// directory's database (next to a running bot, without its lock), shown
/// on stdout.
fn pair(config: &Config, bot: Option<&str>) -> ExitCode {
    if config.store.in_memory {
        eprintln!("error: store.in_memory = true: there is no database to pair through");
        return ExitCode::from(2);
    }
    match telegate::access::pairing::pair_in(&config.store.data_dir, &config.access, bot) {
        Ok(paired) => {
            println!(
                "{}",
                telegate::access::pairing::pairing_text(
                    &paired.code,
                    config.access.pairing_code_minutes,
                    paired.bot.as_deref()
                )
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
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
