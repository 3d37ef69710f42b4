//! `telegate run`: the instance lock, the file's bots started as a
//! [`Fleet`], systemd told (ready, watchdog, stopping), and SIGINT /
//! SIGTERM for a clean shutdown.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::wiring::fleet::Fleet;

/// `telegate run`: start the bot and serve until SIGINT or SIGTERM.
///
/// The signal handlers are installed before anything starts and stay
/// installed: a signal that arrives while the bot starts (recovery and
/// polling may already be running) leads to the same clean shutdown once
/// the start is done, instead of the default action killing the process;
/// and a second signal is never missed, whenever it comes.
pub async fn run(config: &Config) -> anyhow::Result<()> {
    run_with(config, false).await
}

/// `telegate run [--standby]`: like [`run`]; first takes the data
/// directory's lock ([`crate::instance_lock`]): fails at once naming the
/// holder, or with `standby` waits until the holder exits.
pub async fn run_with(config: &Config, standby: bool) -> anyhow::Result<()> {
    use crate::instance_lock::{InstanceLock, LockError};
    let stop = watch_signals();
    let _lock = if config.store.in_memory {
        None
    } else if standby {
        match InstanceLock::acquire_standby(&config.store.data_dir, &stop).await {
            Ok(lock) => Some(lock),
            Err(LockError::Cancelled) => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    } else {
        Some(InstanceLock::acquire(&config.store.data_dir)?)
    };
    let fleet = Fleet::start(config, |_| None)
        .await
        .context("the bot could not start")?;
    crate::systemd::ready();
    let watchdog = fleet
        .store_health()
        .and_then(|health| crate::systemd::spawn_watchdog(health, stop.clone()));
    let served = fleet.serve_until(&stop).await;
    crate::systemd::stopping();
    if let Some(watchdog) = watchdog {
        // It ends on `stop`; after every token was rejected `stop` never comes.
        watchdog.abort();
    }
    served?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Listen for SIGINT and SIGTERM from now on: the first cancels the
/// returned token, a second exits the process at once (code 130).
fn watch_signals() -> CancellationToken {
    let stop = CancellationToken::new();
    let mut signals = Signals::listen();
    let first = stop.clone();
    tokio::spawn(async move {
        signals.recv().await;
        tracing::info!("shutting down (send the signal again to exit at once)");
        first.cancel();
        signals.recv().await;
        // SQLite's write-ahead log keeps the database consistent; what
        // was not finished is resumed on the next start.
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130)
    });
    stop
}

/// SIGINT and SIGTERM, registered once. (A listener registered anew after
/// each signal would miss a signal arriving in between.)
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            Signals {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(listener: &mut Option<tokio::signal::unix::Signal>) {
                let received = match listener {
                    Some(listener) => listener.recv().await.is_some(),
                    None => false,
                };
                if !received {
                    std::future::pending::<()>().await;
                }
            }
            tokio::select! {
                () = next(&mut self.interrupt) => {}
                () = next(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
