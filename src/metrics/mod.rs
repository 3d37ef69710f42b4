//! The metrics registry: counters, gauges and one histogram, rendered in the
//! Prometheus text format for `GET /metrics` (see [`crate::http`]) by the
//! Prometheus project's own Rust client, `prometheus-client` (an explicit
//! registry, no globals), which does the exposition format and escaping.
//! Every metric is declared once, in [`Registry::declare`].
//!
//! Why explicit instead of a global recorder: every component that counts
//! something is handed a [`Metrics`] (a cheap `Arc` clone), so tests build a
//! fresh registry each and can assert exact totals, two engines in one
//! process never mix their numbers, and the list of what telegate measures
//! is this file's [`Registry`] struct, not strings scattered over the code.
//! Every metric is a named, documented field; recording is a lock-free
//! atomic operation, so it may be called from any task or thread, in hot
//! paths, and never blocks.
//!
//! This module must never install anything process-global (no `static`
//! registry, no `metrics`-crate recorder), never hold a lock while a caller
//! records, and never carry anything user-supplied (message text, chat ids,
//! names, secrets) into a metric or a label: labels are fixed enums.
//!
//! The `[metrics]` config table ([`MetricsConfig`]) lives here too, so the
//! listener's settings and the registry stay in one place.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::gauge::Gauge as PromGauge;
use prometheus_client::metrics::MetricType;
use serde::Deserialize;

use crate::listener::{LimitSettings, ListenerLimits};

mod labelled;

pub use labelled::render_labelled;

/// Prefix of every metric name.
#[cfg(test)]
const PREFIX: &str = "telegate_";

/// `[metrics]`: the optional health and metrics HTTP listener.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address the `/healthz` and `/metrics` listener binds, e.g.
    /// `listen = "127.0.0.1:9464"`. Absent: no listener is started. The
    /// endpoints have no authentication; keep them on a private address.
    /// Parsed once, at load.
    #[serde(default, deserialize_with = "listen_address")]
    pub listen: Option<SocketAddr>,
    /// Connections served at once; more are closed at once.
    #[serde(default = "default_connection_limit")]
    pub connection_limit: usize,
    /// Seconds a request's head may take to arrive.
    #[serde(default = "default_timeout_secs")]
    pub header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive.
    #[serde(default = "default_timeout_secs")]
    pub body_timeout_secs: u64,
}

fn default_connection_limit() -> usize {
    64
}

fn default_timeout_secs() -> u64 {
    10
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            connection_limit: default_connection_limit(),
            header_timeout_secs: default_timeout_secs(),
            body_timeout_secs: default_timeout_secs(),
        }
    }
}

impl MetricsConfig {
    /// Check the table without binding anything (`listen` was checked
    /// when it was parsed).
    pub fn validate(&self) -> Result<(), String> {
        self.limit_settings().validate("metrics")
    }

    /// The listener's connection cap and read deadlines.
    pub fn limits(&self) -> ListenerLimits {
        ListenerLimits::from_settings(&self.limit_settings())
    }

    fn limit_settings(&self) -> LimitSettings {
        LimitSettings {
            connection_limit: self.connection_limit,
            header_timeout_secs: self.header_timeout_secs,
            body_timeout_secs: self.body_timeout_secs,
        }
    }
}

/// `metrics.listen`: an address to bind (surrounding blanks ignored).
fn listen_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.trim().parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "metrics.listen {text:?} is not an address like \"127.0.0.1:9464\""
        ))
    })
}

/// A handle to one registry; cheap to clone, shared by every component.
///
/// It dereferences to the [`Registry`], so recording reads
/// `metrics.turns_started.inc()`.
#[derive(Clone, Default)]
pub struct Metrics {
    inner: Arc<Registry>,
}

impl Metrics {
    /// A fresh registry with every metric at zero.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// Whether two handles share one registry.
    pub fn same_registry(&self, other: &Metrics) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Deref for Metrics {
    type Target = Registry;

    fn deref(&self) -> &Registry {
        &self.inner
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("turns_started", &self.turns_started.get())
            .field("turns_finished", &self.turns_finished.get())
            .finish_non_exhaustive()
    }
}

/// A monotonically increasing count (a `prometheus-client` counter; clones
/// share the value).
#[derive(Clone, Debug, Default)]
pub struct Counter(PromCounter<u64, AtomicU64>);

impl Counter {
    /// Add one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Add `n` (wraps only after 2^64 increments).
    pub fn add(&self, n: u64) {
        self.0.inc_by(n);
    }

    /// Raise the count to `total` if it is lower: for mirroring a total kept
    /// elsewhere (a snapshot never moves the counter backwards).
    pub fn raise_to(&self, total: u64) {
        self.0.inner().fetch_max(total, Ordering::Relaxed);
    }

    /// The current count.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// A value that goes up and down, usually set by its owner (a
/// `prometheus-client` gauge; clones share the value).
#[derive(Clone, Debug, Default)]
pub struct Gauge(PromGauge<u64, AtomicU64>);

impl Gauge {
    /// Set the value.
    pub fn set(&self, value: u64) {
        self.0.set(value);
    }

    /// Add one.
    pub fn inc(&self) {
        self.0.inner().fetch_add(1, Ordering::Relaxed);
    }

    /// Subtract one; stays at zero rather than wrapping.
    pub fn dec(&self) {
        // The closure never returns `None`, so this cannot fail.
        let _ = self
            .0
            .inner()
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
    }

    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

/// Upper bounds (inclusive, in seconds) of the turn-duration buckets; the
/// `+Inf` bucket follows implicitly.
pub const TURN_DURATION_BUCKETS: [f64; 10] =
    [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

/// The bucket bounds in microseconds, matching [`TURN_DURATION_BUCKETS`].
const BUCKET_BOUNDS_MICROS: [u64; 10] = [
    100_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
];

/// A histogram of durations with the fixed [`TURN_DURATION_BUCKETS`].
///
/// Each observation increments exactly one (non-cumulative) slot; the count
/// is the sum of the slots, so a scrape always shows `+Inf` bucket == count
/// even while observations race with it. The sum is kept in whole
/// microseconds so it can be added atomically and exactly.
#[derive(Clone, Debug, Default)]
pub struct Histogram(Arc<HistogramCells>);

#[derive(Debug, Default)]
struct HistogramCells {
    /// One slot per bound, then the overflow (`+Inf` only) slot.
    slots: [AtomicU64; BUCKET_BOUNDS_MICROS.len() + 1],
    sum_micros: AtomicU64,
}

/// A consistent-enough copy of a [`Histogram`] for rendering and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative counts per bound of [`TURN_DURATION_BUCKETS`], then `+Inf`.
    pub cumulative: Vec<u64>,
    /// Sum of all observations, in microseconds.
    pub sum_micros: u64,
}

impl HistogramSnapshot {
    /// Number of observations (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

impl Histogram {
    /// Record one duration.
    pub fn observe(&self, duration: Duration) {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let slot = BUCKET_BOUNDS_MICROS
            .iter()
            .position(|&bound| micros <= bound)
            .unwrap_or(BUCKET_BOUNDS_MICROS.len());
        self.0.slots[slot].fetch_add(1, Ordering::Relaxed);
        self.0.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Read the buckets (cumulated) and the sum.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0u64;
        let cumulative = self
            .0
            .slots
            .iter()
            .map(|slot| {
                running = running.wrapping_add(slot.load(Ordering::Relaxed));
                running
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            sum_micros: self.0.sum_micros.load(Ordering::Relaxed),
        }
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        // One load per slot: the +Inf bucket (added by the encoder from
        // `count`) always equals the sum of the slots rendered.
        let slots: Vec<u64> = self
            .0
            .slots
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .collect();
        let count = slots.iter().fold(0u64, |a, b| a.wrapping_add(*b));
        let buckets: Vec<(f64, u64)> = TURN_DURATION_BUCKETS
            .iter()
            .copied()
            .zip(slots.iter().copied())
            .collect();
        let sum = self.0.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A millisecond counter rendered in seconds.
#[derive(Debug)]
struct MillisAsSeconds(Counter);

impl EncodeMetric for MillisAsSeconds {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let seconds = self.0.get() as f64 / 1000.0;
        encoder.encode_counter::<NoLabelSet, f64, f64>(&seconds, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The inbox gauges, one series per state (`state` is a fixed enum).
#[derive(Debug)]
struct InboxGauges([Gauge; 5]);

impl EncodeMetric for InboxGauges {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for state in InboxState::ALL {
            let labels = [("state", state.as_str())];
            let value = self.0[inbox_index(state)].get();
            encoder.encode_family(&labels)?.encode_gauge(&value)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

use crate::vocab::InboxState;

/// The delivery engine's totals (`crate::delivery::Delivery::stats`), for
/// tests, `/metrics` ([`Registry::record_delivery`]) and benchmarks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryStats {
    /// 429 answers seen.
    pub retry_after_hits: u64,
    /// Total time Telegram asked us to wait, in milliseconds.
    pub retry_after_wait_ms: u64,
    /// Requests that failed for good.
    pub failures: u64,
    /// Messages resent as plain text after an entity error.
    pub plain_fallbacks: u64,
    /// Control requests (the replies to /stop, /new…) sent, and what they
    /// waited for before going out, in microseconds: the chat's turn (a
    /// request to the chat in flight), then its pacing. Benchmarks read
    /// these (`benches/stop_latency.rs`); `/metrics` does not show them.
    pub control_sends: u64,
    /// Microseconds control requests waited for the chat's turn.
    pub control_turn_wait_us: u64,
    /// Microseconds control requests waited for the chat's pacing.
    pub control_pace_wait_us: u64,
}

/// Scheduled runs by outcome, one series per `outcome` (a fixed enum).
#[derive(Clone, Debug, Default)]
pub struct ScheduleRuns {
    /// Runs whose answer (or reminder) was produced.
    pub answered: Counter,
    /// Runs whose turn failed.
    pub failed: Counter,
    /// Missed runs left out by `[schedule] catch_up`.
    pub skipped_late: Counter,
}

impl EncodeMetric for ScheduleRuns {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (outcome, counter) in [
            ("answered", &self.answered),
            ("failed", &self.failed),
            ("skipped_late", &self.skipped_late),
        ] {
            let labels = [("outcome", outcome)];
            encoder
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, u64, f64>(&counter.get(), None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The position of `state` in [`InboxState::ALL`] (the gauge index).
fn inbox_index(state: InboxState) -> usize {
    InboxState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}

/// Message counts per inbox state, as the inbox reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxCounts {
    /// Messages accepted but not started.
    pub received: u64,
    /// Messages whose turn is running.
    pub running: u64,
    /// Messages answered.
    pub answered: u64,
    /// Messages whose turn failed.
    pub failed: u64,
    /// Messages dropped.
    pub dropped: u64,
}

impl InboxCounts {
    /// The count for one state.
    pub fn get(&self, state: InboxState) -> u64 {
        match state {
            InboxState::Received => self.received,
            InboxState::Running => self.running,
            InboxState::Answered => self.answered,
            InboxState::Failed => self.failed,
            InboxState::Dropped => self.dropped,
        }
    }
}

/// A function run before each render to refresh mirrored values (e.g. the
/// delivery engine's [`DeliveryStats`]).
type Collector = Arc<dyn Fn(&Registry) + Send + Sync>;

/// Everything telegate measures. Reach it through a [`Metrics`] handle.
pub struct Registry {
    /// Turns that began running.
    pub turns_started: Counter,
    /// Turns that finished with an answer.
    pub turns_finished: Counter,
    /// Turns that ended with an error reported to the user.
    pub turns_failed: Counter,
    /// Turns cancelled (/stop, /new, /reset, an interrupting message).
    pub turns_cancelled: Counter,
    /// Stale session guards (owner task gone) healed by a later message.
    pub stale_lock_heals: Counter,
    /// Turns cancelled by the stall watchdog.
    pub watchdog_cancels: Counter,
    /// Outputs discarded because their turn's generation was no longer current.
    pub generation_discards: Counter,
    /// 429 `retry_after` answers from Telegram.
    pub telegram_retry_after: Counter,
    /// Total wait Telegram asked for in 429 answers, in milliseconds
    /// (rendered in seconds). Use [`Registry::add_retry_after_wait`].
    pub telegram_retry_after_wait_ms: Counter,
    /// Telegram requests that failed for good.
    pub delivery_failures: Counter,
    /// Messages resent as plain text after Telegram refused their entities.
    pub delivery_plain_fallbacks: Counter,
    /// Internal wakeup events delivered to a session.
    pub wakeups: Counter,
    /// Updates received from Telegram.
    pub updates_received: Counter,
    /// Updates Telegram redelivered that were recognised and ignored.
    pub updates_duplicate: Counter,
    /// Messages refused (queue full, not allowed) and reported to the user.
    pub messages_refused: Counter,
    /// getUpdates answered 409 Conflict: another poller uses the token.
    pub getupdates_conflicts: Counter,
    /// Answers found after a restart with their send started and its
    /// outcome unknown: recorded as failed, never sent again.
    pub ambiguous_sends: Counter,
    /// Sessions with a running turn (set by the adapter).
    pub busy_sessions: Gauge,
    /// Follow-ups waiting in all queues (set by the adapter).
    pub queue_depth: Gauge,
    /// How long turns took, from start to answer, failure or cancellation.
    pub turn_duration: Histogram,
    /// Scheduled runs by outcome.
    pub schedule_runs: ScheduleRuns,
    /// The latest scheduled run's lag from its instant to its hand-on, ms.
    pub schedule_lag_ms: Gauge,
    /// How far the scheduler is behind its earliest due job, in seconds
    /// (set by a collector from [`crate::schedule::SchedulerHealth`]).
    pub schedule_behind_seconds: Gauge,
    /// Inbox messages per state, indexed by [`InboxState`].
    inbox: [Gauge; 5],
    /// Refreshers run before each render.
    collectors: RwLock<Vec<Collector>>,
    /// The `prometheus-client` registry that renders the fields above (it
    /// holds clones sharing their values).
    prometheus: prometheus_client::registry::Registry,
}

impl Default for Registry {
    fn default() -> Self {
        let mut registry = Registry {
            turns_started: Counter::default(),
            turns_finished: Counter::default(),
            turns_failed: Counter::default(),
            turns_cancelled: Counter::default(),
            stale_lock_heals: Counter::default(),
            watchdog_cancels: Counter::default(),
            generation_discards: Counter::default(),
            telegram_retry_after: Counter::default(),
            telegram_retry_after_wait_ms: Counter::default(),
            delivery_failures: Counter::default(),
            delivery_plain_fallbacks: Counter::default(),
            wakeups: Counter::default(),
            updates_received: Counter::default(),
            updates_duplicate: Counter::default(),
            messages_refused: Counter::default(),
            getupdates_conflicts: Counter::default(),
            ambiguous_sends: Counter::default(),
            busy_sessions: Gauge::default(),
            queue_depth: Gauge::default(),
            turn_duration: Histogram::default(),
            schedule_runs: ScheduleRuns::default(),
            schedule_lag_ms: Gauge::default(),
            schedule_behind_seconds: Gauge::default(),
            inbox: Default::default(),
            collectors: RwLock::default(),
            prometheus: prometheus_client::registry::Registry::with_prefix("telegate"),
        };
        registry.declare();
        registry
    }
}

impl Registry {
    /// Add to the total `retry_after` wait.
    pub fn add_retry_after_wait(&self, wait: Duration) {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.telegram_retry_after_wait_ms.add(ms);
    }

    /// Set the inbox gauges from counts the inbox computed.
    pub fn set_inbox(&self, counts: InboxCounts) {
        for state in InboxState::ALL {
            self.inbox(state).set(counts.get(state));
        }
    }

    /// The gauge of one inbox state.
    pub fn inbox(&self, state: InboxState) -> &Gauge {
        &self.inbox[inbox_index(state)]
    }

    /// Mirror the delivery engine's totals into the `telegram_*` and
    /// `delivery_*` counters; a snapshot never moves them backwards. Feed
    /// those counters either through this mirror or by direct increments,
    /// not both, or the mirror hides the increments.
    pub fn record_delivery(&self, stats: &DeliveryStats) {
        self.telegram_retry_after.raise_to(stats.retry_after_hits);
        self.telegram_retry_after_wait_ms
            .raise_to(stats.retry_after_wait_ms);
        self.delivery_failures.raise_to(stats.failures);
        self.delivery_plain_fallbacks
            .raise_to(stats.plain_fallbacks);
    }

    /// Run `collect` before every render, e.g.
    /// `metrics.add_collector(move |m| m.record_delivery(&delivery.stats()))`.
    /// It must be quick, must not render (that would recurse) and should not
    /// capture a [`Metrics`] handle (it gets the registry as its argument;
    /// a captured handle would keep the registry alive forever).
    pub fn add_collector(&self, collect: impl Fn(&Registry) + Send + Sync + 'static) {
        self.collectors
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::new(collect));
    }

    fn run_collectors(&self) {
        // Copied out so no lock is held while a collector runs.
        let collectors: Vec<Collector> = self
            .collectors
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for collect in collectors {
            collect(self);
        }
    }

    /// Every metric in the Prometheus text exposition format 0.0.4.
    pub fn render_prometheus(&self) -> String {
        self.run_collectors();
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.prometheus);
        out
    }

    /// The one place a metric is declared: its name (without the
    /// `telegate_` prefix; counters get `_total`), its help and the field
    /// it renders. A new metric is a field above plus a line here.
    fn declare(&mut self) {
        let counters: [(&str, &str, &Counter); 16] = [
            (
                "turns_started",
                "Turns that began running",
                &self.turns_started,
            ),
            (
                "turns_finished",
                "Turns that finished with an answer",
                &self.turns_finished,
            ),
            (
                "turns_failed",
                "Turns that ended with an error",
                &self.turns_failed,
            ),
            (
                "turns_cancelled",
                "Turns cancelled by a command or an interrupting message",
                &self.turns_cancelled,
            ),
            (
                "stale_lock_heals",
                "Stale session guards healed by a later message",
                &self.stale_lock_heals,
            ),
            (
                "watchdog_cancels",
                "Turns cancelled by the stall watchdog",
                &self.watchdog_cancels,
            ),
            (
                "generation_discards",
                "Outputs discarded because their generation was no longer current",
                &self.generation_discards,
            ),
            (
                "telegram_retry_after",
                "429 retry_after answers from Telegram",
                &self.telegram_retry_after,
            ),
            (
                "delivery_failures",
                "Telegram requests that failed for good",
                &self.delivery_failures,
            ),
            (
                "delivery_plain_fallbacks",
                "Messages resent as plain text after an entity error",
                &self.delivery_plain_fallbacks,
            ),
            (
                "wakeups",
                "Internal wakeup events delivered to a session",
                &self.wakeups,
            ),
            (
                "updates_received",
                "Updates received from Telegram",
                &self.updates_received,
            ),
            (
                "updates_duplicate",
                "Redelivered updates recognised and ignored",
                &self.updates_duplicate,
            ),
            (
                "messages_refused",
                "Messages refused and reported to the user",
                &self.messages_refused,
            ),
            (
                "getupdates_conflicts",
                "getUpdates answered 409 Conflict (another poller uses the bot token).",
                &self.getupdates_conflicts,
            ),
            (
                "ambiguous_sends",
                "Answers whose send a restart cut short (they may have arrived): not sent again",
                &self.ambiguous_sends,
            ),
        ];
        let counters: Vec<(&str, &str, Counter)> = counters
            .into_iter()
            .map(|(name, help, counter)| (name, help, counter.clone()))
            .collect();
        let wait = MillisAsSeconds(self.telegram_retry_after_wait_ms.clone());
        let gauges = [
            (
                "busy_sessions",
                "Sessions with a running turn",
                self.busy_sessions.clone(),
            ),
            (
                "queue_depth",
                "Follow-up messages waiting in all queues",
                self.queue_depth.clone(),
            ),
            (
                "schedule_lag_milliseconds",
                "Lag of the latest scheduled run from its instant to its start",
                self.schedule_lag_ms.clone(),
            ),
            (
                "schedule_behind_seconds",
                "How far the scheduler is behind its earliest due job",
                self.schedule_behind_seconds.clone(),
            ),
        ];
        let inbox = InboxGauges(self.inbox.clone());
        let schedule_runs = self.schedule_runs.clone();
        let turn_duration = self.turn_duration.clone();
        let registry = &mut self.prometheus;
        for (name, help, counter) in counters {
            registry.register(name, help, counter.0);
        }
        registry.register(
            "telegram_retry_after_wait_seconds",
            "Total seconds Telegram asked telegate to wait in 429 answers",
            wait,
        );
        for (name, help, gauge) in gauges {
            registry.register(name, help, gauge.0);
        }
        registry.register("inbox_messages", "Inbox messages per state", inbox);
        registry.register(
            "schedule_runs",
            "Scheduled runs by outcome (answered, failed, skipped_late)",
            schedule_runs,
        );
        registry.register(
            "turn_duration_seconds",
            "Turn duration from start to answer, failure or cancellation",
            turn_duration,
        );
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
