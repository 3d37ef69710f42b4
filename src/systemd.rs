//! systemd service notifications (`Type=notify`): `READY=1` once the bot
//! serves, `WATCHDOG=1` keep-alives while it is healthy, `STOPPING=1` when it
//! shuts down. Sent over `$NOTIFY_SOCKET` by the `sd-notify` crate; without
//! that variable (not under systemd) every call does nothing.
//!
//! This module owns what telegate tells its service manager. It must never
//! fail the bot: a notification that cannot be sent is logged and ignored.
//! A keep-alive is sent only after the store answered, so a wedged store
//! thread stops the pings and systemd restarts the service.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::StoreHealth;

fn send(states: &[NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "could not notify the service manager");
    }
}

/// Tell systemd the bot is up (updates are being taken).
pub fn ready() {
    send(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

/// Tell systemd the bot is shutting down.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// If systemd asked for a watchdog (`WatchdogSec=`), send `WATCHDOG=1` at
/// half its interval, each time after the store answered, until `stop`.
pub fn spawn_watchdog(store: StoreHealth, stop: CancellationToken) -> Option<JoinHandle<()>> {
    let period = sd_notify::watchdog_enabled()?;
    let every = (period / 2).max(Duration::from_millis(10));
    tracing::info!(?period, "systemd watchdog enabled");
    Some(tokio::spawn(async move {
        loop {
            let alive = store.ping().await;
            match alive {
                Ok(()) => send(&[NotifyState::Watchdog]),
                Err(error) => tracing::error!(%error, "store check failed; no watchdog keep-alive"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }))
}
