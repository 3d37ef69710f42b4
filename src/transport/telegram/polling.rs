//! Long polling, with the offset moved only past recorded updates.
//!
//! teloxide's own polling listener confirms a batch as soon as it has read
//! it; a crash between that and the handlers would lose the batch. This
//! loop asks for updates with a raw `getUpdates` request (see
//! [`super::raw`]), records the whole batch through the intake (its
//! messages in one store call: one commit for up to a hundred updates
//! instead of one each), which feeds each new update in order to the
//! inbox listener the dispatcher reads, and only then asks for the next
//! batch with an offset past it. Updates
//! that were pending while the bot was down are fetched normally: nothing
//! is dropped at start.
//!
//! A 409 Conflict ("terminated by other getUpdates request") means another
//! process polls with the same token (a second instance elsewhere; on the
//! same data directory the instance lock prevents it). It is counted in
//! `/metrics` (`getupdates_conflicts_total`), logged at most once a minute
//! ([`ConflictLog`]) and backed off like any failure. It cannot make an
//! update run twice here: the offset still moves only past recorded
//! updates, and a recorded update id never runs again.

use std::time::Duration;

use teloxide::{ApiError, Bot, RequestError};
use tokio_util::sync::CancellationToken;

use super::health::UpdatesHealth;
use super::intake::Intake;
use super::parse::RawUpdate;
use crate::delivery::bot_api::{BotApi, REQUEST_TIMEOUT};

/// How long one `getUpdates` request may wait for news (seconds).
///
/// It must stay below the HTTP client's whole-request timeout
/// ([`REQUEST_TIMEOUT`], teloxide's 17 s, which neither client extends for
/// long polls): a longer poll is cut by the client in every quiet period,
/// which reads as a failure (a warning, `/healthz` 503, a growing backoff
/// during which no update is fetched).
const POLL_TIMEOUT_SECS: u32 = 10;
const _: () = assert!(POLL_TIMEOUT_SECS as u64 + 5 <= REQUEST_TIMEOUT.as_secs());

/// After this many `401 Unauthorized` answers in a row the token counts as
/// revoked: retrying cannot help, and the operator must be told.
pub const UNAUTHORIZED_LIMIT: u32 = 3;

/// Poll for the update types `allowed_updates` until `stop` fires,
/// reporting each poll's outcome to `health`.
/// After [`UNAUTHORIZED_LIMIT`] consecutive 401s it cancels `token_rejected`
/// and returns.
pub async fn poll(
    bot: Bot,
    allowed_updates: Vec<&'static str>,
    intake: Intake,
    health: UpdatesHealth,
    stop: CancellationToken,
    token_rejected: CancellationToken,
) {
    let mut offset: i32 = 0;
    let mut failures = Failures::default();
    let api = BotApi::new(bot);
    loop {
        // Each update's text: recorded exactly as Telegram sent it.
        let request = super::raw::get_updates(&api, offset, POLL_TIMEOUT_SECS, &allowed_updates);
        let batch = tokio::select! {
            _ = stop.cancelled() => return,
            batch = request => batch,
        };
        let updates = match batch {
            Ok(updates) => updates,
            Err(error) => {
                health.set(false);
                let Some(wait) = failures.after(&error, &intake) else {
                    token_rejected.cancel();
                    return;
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        failures.reset();
        health.set(true);
        let last = batch_offset(&updates, offset);
        // Record the whole batch first (one store call for its messages);
        // confirm it (move the offset) only after that.
        if !record_batch(&intake, &updates, &stop).await {
            return;
        }
        offset = last;
    }
}

/// The failures since the last batch that got through.
#[derive(Default)]
struct Failures {
    /// Failed polls in a row.
    failures: u32,
    /// 401 answers in a row.
    unauthorized: u32,
    /// When a 409 was last logged (kept across batches).
    conflicts: ConflictLog,
}

impl Failures {
    /// A batch got through (the conflict log keeps its interval).
    fn reset(&mut self) {
        self.failures = 0;
        self.unauthorized = 0;
    }

    /// Count a failed poll and log it: how long to wait before the next,
    /// or `None` once the token counts as rejected.
    fn after(&mut self, error: &RequestError, intake: &Intake) -> Option<Duration> {
        self.failures += 1;
        if matches!(error, RequestError::Api(teloxide::ApiError::InvalidToken)) {
            self.unauthorized += 1;
            if self.unauthorized >= UNAUTHORIZED_LIMIT {
                tracing::error!(
                    "the bot token was rejected by Telegram ({} times in a row): stopping",
                    self.unauthorized
                );
                return None;
            }
        } else {
            self.unauthorized = 0;
        }
        let wait = backoff(error, self.failures);
        if is_conflict(error) {
            intake.metrics().getupdates_conflicts.inc();
            if let Some(since) = self.conflicts.should_log(tokio::time::Instant::now()) {
                tracing::error!(
                    conflicts_since_last_log = since,
                    ?wait,
                    "getUpdates answered 409 Conflict: another process is polling with this bot token \
                     (a second telegate or another bot program). Only one may poll; stop the other one. \
                     Backing off; no update is answered twice here."
                );
            }
        } else {
            tracing::warn!(%error, ?wait, "getUpdates failed; retrying");
        }
        Some(wait)
    }
}

/// The offset that confirms every update of `updates` (from `offset`).
fn batch_offset(updates: &[RawUpdate], offset: i32) -> i32 {
    let mut last = offset;
    for raw in updates {
        match raw
            .head()
            .id_u64
            .map(|id| u32::try_from(id).unwrap_or(u32::MAX))
        {
            Some(id) => last = last.max(next_offset(id)),
            None => tracing::warn!("an update without update_id was skipped"),
        }
    }
    last
}

/// Record the batch, retrying each second until it is written: `false`
/// when `stop` came first.
async fn record_batch(intake: &Intake, updates: &[RawUpdate], stop: &CancellationToken) -> bool {
    loop {
        match intake.take_batch(updates).await {
            Ok(()) => return true,
            Err(error) => {
                tracing::error!(
                    updates = updates.len(),
                    %error,
                    "could not record a batch of updates; retrying before confirming it"
                );
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// The offset that confirms update `id` (Telegram's offsets are 32-bit
/// signed; ids beyond that saturate instead of wrapping to a negative offset,
/// which would mean "the last updates" and replay them).
fn next_offset(id: u32) -> i32 {
    i32::try_from(id).map_or(i32::MAX, |id| id.saturating_add(1))
}

/// 409 Conflict from getUpdates: another poller (or a webhook) is active.
fn is_conflict(error: &RequestError) -> bool {
    matches!(
        error,
        RequestError::Api(ApiError::TerminatedByOtherGetUpdates | ApiError::CantGetUpdates)
    )
}

/// How often a 409 Conflict may be logged.
const CONFLICT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Logs conflicts at most once per [`CONFLICT_LOG_INTERVAL`] (they repeat
/// every poll while the other poller runs), counting the ones in between.
#[derive(Debug, Default)]
pub struct ConflictLog {
    last: Option<tokio::time::Instant>,
    unlogged: u64,
}

impl ConflictLog {
    /// A conflict happened at `now`: `Some(n)` if it should be logged
    /// (`n` conflicts happened since the last log line, this one included).
    pub fn should_log(&mut self, now: tokio::time::Instant) -> Option<u64> {
        self.unlogged += 1;
        match self.last {
            Some(last) if now.duration_since(last) < CONFLICT_LOG_INTERVAL => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }
}

fn backoff(error: &RequestError, failures: u32) -> Duration {
    match error {
        RequestError::RetryAfter(seconds) => seconds.duration(),
        _ => Duration::from_millis(500 * 2u64.pow(failures.min(6))).min(Duration::from_secs(30)),
    }
}

#[cfg(test)]
mod tests {
    use super::{next_offset, ConflictLog};
    use std::time::Duration;

    #[test]
    fn conflicts_are_logged_at_most_once_a_minute() {
        let start = tokio::time::Instant::now();
        let mut log = ConflictLog::default();
        assert_eq!(log.should_log(start), Some(1));
        for s in 1..60 {
            assert_eq!(log.should_log(start + Duration::from_secs(s)), None);
        }
        assert_eq!(log.should_log(start + Duration::from_secs(60)), Some(60));
        assert_eq!(log.should_log(start + Duration::from_secs(61)), None);
    }

    #[test]
    fn offsets_never_wrap() {
        assert_eq!(next_offset(0), 1);
        assert_eq!(next_offset(41), 42);
        assert_eq!(next_offset(i32::MAX as u32), i32::MAX);
        assert_eq!(next_offset(u32::MAX), i32::MAX);
    }
}
