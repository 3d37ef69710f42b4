use std::collections::{HashMap, HashSet};
use std::thread;

use super::*;

/// One parsed sample line.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// What a tiny 0.0.4 parser makes of a rendering.
#[derive(Debug, Default)]
struct Parsed {
    help: HashMap<String, String>,
    kind: HashMap<String, String>,
    samples: Vec<Sample>,
}

impl Parsed {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|s| s.value)
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut labels = Vec::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or(format!("label {pair:?}"))?;
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .ok_or(format!("unquoted label value {value:?}"))?;
        if !is_metric_name(key) {
            return Err(format!("label name {key:?}"));
        }
        labels.push((key.to_string(), value.to_string()));
    }
    Ok(labels)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let (series, value) = line.rsplit_once(' ').ok_or(format!("no value: {line:?}"))?;
    let value: f64 = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| format!("bad value in {line:?}"))?,
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => {
            let inner = rest.strip_suffix('}').ok_or(format!("labels: {line:?}"))?;
            (name, parse_labels(inner)?)
        }
    };
    if !is_metric_name(name) {
        return Err(format!("bad name in {line:?}"));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The family a sample belongs to (histogram samples carry a suffix).
fn family<'a>(parsed: &Parsed, name: &'a str) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if parsed.kind.get(base).map(String::as_str) == Some("histogram") {
                return base;
            }
        }
    }
    name
}

/// Parse a rendering, checking the structural rules along the way: HELP
/// then TYPE once per family, before its samples; every sample declared.
fn parse(text: &str) -> Result<Parsed, String> {
    let mut parsed = Parsed::default();
    if !text.ends_with('\n') {
        return Err("the last line has no newline".into());
    }
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').ok_or(format!("HELP: {line:?}"))?;
            if parsed.help.insert(name.into(), help.into()).is_some() {
                return Err(format!("second HELP for {name}"));
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or(format!("TYPE: {line:?}"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(format!("unknown type {kind}"));
            }
            if parsed.kind.insert(name.into(), kind.into()).is_some() {
                return Err(format!("second TYPE for {name}"));
            }
        } else if line.starts_with('#') || line.trim().is_empty() {
            return Err(format!("unexpected line {line:?}"));
        } else {
            let sample = parse_sample(line)?;
            let family = family(&parsed, &sample.name).to_string();
            if !parsed.help.contains_key(&family) || !parsed.kind.contains_key(&family) {
                return Err(format!("{} has no HELP/TYPE before it", sample.name));
            }
            parsed.samples.push(sample);
        }
    }
    Ok(parsed)
}

fn check_histogram(parsed: &Parsed, name: &str) -> Result<(), String> {
    let bucket = format!("{name}_bucket");
    let buckets: Vec<(f64, f64)> = parsed
        .samples
        .iter()
        .filter(|s| s.name == bucket)
        .map(|s| {
            let le = s.labels.iter().find(|(k, _)| k == "le").ok_or("no le")?;
            let bound = match le.1.as_str() {
                "+Inf" => f64::INFINITY,
                b => b.parse().map_err(|_| "bad le")?,
            };
            Ok((bound, s.value))
        })
        .collect::<Result<_, &str>>()?;
    if buckets
        .windows(2)
        .any(|w| w[0].0 >= w[1].0 || w[0].1 > w[1].1)
    {
        return Err(format!("{name}: buckets not increasing: {buckets:?}"));
    }
    let last = buckets.last().ok_or("no buckets")?;
    let count = parsed
        .value(&format!("{name}_count"), &[])
        .ok_or("no _count")?;
    parsed.value(&format!("{name}_sum"), &[]).ok_or("no _sum")?;
    if last.0 != f64::INFINITY || last.1 != count {
        return Err(format!("{name}: +Inf bucket {last:?} != count {count}"));
    }
    Ok(())
}

fn busy_registry() -> Metrics {
    let metrics = Metrics::new();
    metrics.turns_started.add(5);
    metrics.turns_finished.add(3);
    metrics.turns_failed.inc();
    metrics.turns_cancelled.inc();
    metrics.add_retry_after_wait(Duration::from_millis(2_500));
    metrics.busy_sessions.set(2);
    metrics.queue_depth.set(7);
    metrics.set_inbox(InboxCounts {
        received: 1,
        running: 2,
        answered: 3,
        failed: 4,
        dropped: 5,
    });
    for ms in [50, 100, 101, 700, 3_000, 3_000, 400_000] {
        metrics.turn_duration.observe(Duration::from_millis(ms));
    }
    metrics
}

#[test]
fn the_metrics_rendering_is_valid_exposition_format() {
    let text = busy_registry().render_prometheus();
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for name in parsed.kind.keys() {
        assert!(name.starts_with(PREFIX), "{name}");
        assert!(
            parsed.help.contains_key(name),
            "{name} has TYPE but no HELP"
        );
    }
    for (name, kind) in &parsed.kind {
        assert_eq!(
            kind == "counter",
            name.ends_with("_total"),
            "{name}: {kind}"
        );
    }
    for (name, _) in parsed.kind.iter().filter(|(_, k)| *k == "histogram") {
        check_histogram(&parsed, name).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

#[test]
fn every_named_metric_is_rendered() {
    let parsed = parse(&Metrics::new().render_prometheus()).unwrap();
    let names: HashSet<&str> = parsed.kind.keys().map(String::as_str).collect();
    for name in [
        "turns_started_total",
        "turns_finished_total",
        "turns_failed_total",
        "turns_cancelled_total",
        "stale_lock_heals_total",
        "watchdog_cancels_total",
        "generation_discards_total",
        "telegram_retry_after_total",
        "telegram_retry_after_wait_seconds_total",
        "delivery_failures_total",
        "wakeups_total",
        "updates_received_total",
        "updates_duplicate_total",
        "messages_refused_total",
        "getupdates_conflicts_total",
        "ambiguous_sends_total",
        "busy_sessions",
        "queue_depth",
        "inbox_messages",
        "turn_duration_seconds",
        "schedule_runs_total",
        "schedule_lag_milliseconds",
        "schedule_behind_seconds",
    ] {
        assert!(names.contains(format!("{PREFIX}{name}").as_str()), "{name}");
    }
}

#[test]
fn rendered_metrics_values_match_what_was_recorded() {
    let parsed = parse(&busy_registry().render_prometheus()).unwrap();
    let v = |name: &str, labels: &[(&str, &str)]| {
        parsed.value(&format!("{PREFIX}{name}"), labels).unwrap()
    };
    assert_eq!(v("turns_started_total", &[]), 5.0);
    assert_eq!(v("turns_finished_total", &[]), 3.0);
    assert_eq!(v("telegram_retry_after_wait_seconds_total", &[]), 2.5);
    assert_eq!(v("busy_sessions", &[]), 2.0);
    assert_eq!(v("queue_depth", &[]), 7.0);
    for (state, n) in [("received", 1.0), ("running", 2.0), ("dropped", 5.0)] {
        assert_eq!(v("inbox_messages", &[("state", state)]), n);
    }
    let bucket = |le: &str| v("turn_duration_seconds_bucket", &[("le", le)]);
    assert_eq!(bucket("0.1"), 2.0, "le is inclusive");
    assert_eq!(bucket("0.5"), 3.0);
    assert_eq!(bucket("1"), 4.0);
    assert_eq!(bucket("5"), 6.0);
    assert_eq!(bucket("300"), 6.0);
    assert_eq!(bucket("+Inf"), 7.0);
    assert_eq!(v("turn_duration_seconds_count", &[]), 7.0);
    assert_eq!(v("turn_duration_seconds_sum", &[]), 406.951);
}

#[test]
fn metrics_from_many_threads_add_up_exactly() {
    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 10_000;
    let metrics = Metrics::new();
    let workers: Vec<_> = (0..THREADS)
        .map(|i| {
            let metrics = metrics.clone();
            thread::spawn(move || {
                for n in 0..PER_THREAD {
                    metrics.turns_started.inc();
                    metrics.updates_received.add(2);
                    metrics.busy_sessions.inc();
                    metrics
                        .turn_duration
                        .observe(Duration::from_millis(n % 1000 + i));
                    metrics.busy_sessions.dec();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let total = THREADS * PER_THREAD;
    assert_eq!(metrics.turns_started.get(), total);
    assert_eq!(metrics.updates_received.get(), 2 * total);
    assert_eq!(metrics.busy_sessions.get(), 0);
    let snapshot = metrics.turn_duration.snapshot();
    assert_eq!(snapshot.count(), total);
    let expected_sum: u64 = (0..THREADS)
        .flat_map(|i| (0..PER_THREAD).map(move |n| (n % 1000 + i) * 1000))
        .sum();
    assert_eq!(snapshot.sum_micros, expected_sum);
}

#[test]
fn renders_racing_with_recording_stay_valid() {
    let metrics = Metrics::new();
    let writer = {
        let metrics = metrics.clone();
        thread::spawn(move || {
            for n in 0..20_000u64 {
                metrics
                    .turn_duration
                    .observe(Duration::from_millis(n % 400_000));
            }
        })
    };
    for _ in 0..50 {
        let text = metrics.render_prometheus();
        let parsed = parse(&text).unwrap();
        check_histogram(&parsed, "telegate_turn_duration_seconds").unwrap();
    }
    writer.join().unwrap();
}

#[test]
fn handles_share_one_registry_and_fresh_ones_do_not() {
    let a = Metrics::new();
    let b = a.clone();
    b.wakeups.inc();
    assert_eq!(a.wakeups.get(), 1);
    assert!(a.same_registry(&b));
    let other = Metrics::new();
    assert_eq!(other.wakeups.get(), 0);
    assert!(!a.same_registry(&other));
}

#[test]
fn gauges_never_wrap_below_zero() {
    let metrics = Metrics::new();
    metrics.queue_depth.dec();
    assert_eq!(metrics.queue_depth.get(), 0);
}

#[test]
fn huge_durations_land_in_the_inf_bucket() {
    let metrics = Metrics::new();
    metrics.turn_duration.observe(Duration::MAX);
    let snapshot = metrics.turn_duration.snapshot();
    assert_eq!(snapshot.cumulative[TURN_DURATION_BUCKETS.len() - 1], 0);
    assert_eq!(snapshot.count(), 1);
}

#[test]
fn delivery_stats_are_mirrored_by_a_collector_and_never_go_back() {
    let metrics = Metrics::new();
    let stats = Arc::new(std::sync::Mutex::new(DeliveryStats {
        retry_after_hits: 2,
        retry_after_wait_ms: 31_250,
        failures: 1,
        plain_fallbacks: 4,
        ..DeliveryStats::default()
    }));
    let source = Arc::clone(&stats);
    metrics.add_collector(move |m| {
        m.record_delivery(&source.lock().unwrap_or_else(PoisonError::into_inner))
    });
    let parsed = parse(&metrics.render_prometheus()).unwrap();
    let v = |p: &Parsed, name: &str| p.value(&format!("{PREFIX}{name}"), &[]).unwrap();
    assert_eq!(v(&parsed, "telegram_retry_after_total"), 2.0);
    assert_eq!(v(&parsed, "telegram_retry_after_wait_seconds_total"), 31.25);
    assert_eq!(v(&parsed, "delivery_failures_total"), 1.0);
    assert_eq!(v(&parsed, "delivery_plain_fallbacks_total"), 4.0);
    *stats.lock().unwrap() = DeliveryStats::default();
    let parsed = parse(&metrics.render_prometheus()).unwrap();
    assert_eq!(v(&parsed, "telegram_retry_after_total"), 2.0);
}

/// Every series `/metrics` showed before the move to prometheus-client,
/// with its type: dashboards and alerts keep working.
const SERIES_BEFORE_PROMETHEUS_CLIENT: &[(&str, &str)] = &[
    ("telegate_turns_started_total", "counter"),
    ("telegate_turns_finished_total", "counter"),
    ("telegate_turns_failed_total", "counter"),
    ("telegate_turns_cancelled_total", "counter"),
    ("telegate_stale_lock_heals_total", "counter"),
    ("telegate_watchdog_cancels_total", "counter"),
    ("telegate_generation_discards_total", "counter"),
    ("telegate_telegram_retry_after_total", "counter"),
    ("telegate_delivery_failures_total", "counter"),
    ("telegate_delivery_plain_fallbacks_total", "counter"),
    ("telegate_wakeups_total", "counter"),
    ("telegate_updates_received_total", "counter"),
    ("telegate_updates_duplicate_total", "counter"),
    ("telegate_messages_refused_total", "counter"),
    ("telegate_getupdates_conflicts_total", "counter"),
    // Added after the move: answers not resent after a restart.
    ("telegate_ambiguous_sends_total", "counter"),
    (
        "telegate_telegram_retry_after_wait_seconds_total",
        "counter",
    ),
    ("telegate_busy_sessions", "gauge"),
    ("telegate_queue_depth", "gauge"),
    // Added with scheduled jobs (issue 24).
    ("telegate_schedule_lag_milliseconds", "gauge"),
    ("telegate_schedule_behind_seconds", "gauge"),
    ("telegate_schedule_runs_total{outcome=answered}", "counter"),
    ("telegate_schedule_runs_total{outcome=failed}", "counter"),
    (
        "telegate_schedule_runs_total{outcome=skipped_late}",
        "counter",
    ),
    ("telegate_inbox_messages{state=received}", "gauge"),
    ("telegate_inbox_messages{state=running}", "gauge"),
    ("telegate_inbox_messages{state=answered}", "gauge"),
    ("telegate_inbox_messages{state=failed}", "gauge"),
    ("telegate_inbox_messages{state=dropped}", "gauge"),
    ("telegate_turn_duration_seconds_bucket{le=0.1}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=0.5}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=1}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=2.5}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=5}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=10}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=30}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=60}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=120}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=300}", "histogram"),
    ("telegate_turn_duration_seconds_bucket{le=inf}", "histogram"),
    ("telegate_turn_duration_seconds_sum", "histogram"),
    ("telegate_turn_duration_seconds_count", "histogram"),
];

#[test]
fn every_series_name_of_before_is_rendered_with_its_type_and_no_other() {
    let text = busy_registry().render_prometheus();
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let rendered: Vec<(String, String)> = parsed
        .samples
        .iter()
        .map(|sample| {
            let labels: Vec<String> = sample
                .labels
                .iter()
                .map(|(k, v)| match (k.as_str(), v.parse::<f64>()) {
                    // Bucket bounds compared as numbers ("1" == "1.0").
                    ("le", Ok(bound)) if bound.is_infinite() => "le=inf".to_string(),
                    ("le", Ok(bound)) => format!("le={bound}"),
                    _ => format!("{k}={v}"),
                })
                .collect();
            let series = if labels.is_empty() {
                sample.name.clone()
            } else {
                format!("{}{{{}}}", sample.name, labels.join(","))
            };
            let kind = parsed.kind[family(&parsed, &sample.name)].clone();
            (series, kind)
        })
        .collect();
    let expected: Vec<(String, String)> = SERIES_BEFORE_PROMETHEUS_CLIENT
        .iter()
        .map(|(series, kind)| (series.to_string(), kind.to_string()))
        .collect();
    let mut sorted_rendered = rendered.clone();
    sorted_rendered.sort();
    let mut sorted_expected = expected.clone();
    sorted_expected.sort();
    for (series, kind) in &expected {
        assert!(
            rendered.iter().any(|(s, k)| s == series && k == kind),
            "{series} ({kind}) is gone or changed type\n{text}"
        );
    }
    assert_eq!(sorted_rendered, sorted_expected, "\n{text}");
    // No sample carries anything but fixed label names.
    for sample in &parsed.samples {
        for (key, _) in &sample.labels {
            assert!(
                key == "state" || key == "le" || key == "outcome",
                "{key} in {}",
                sample.name
            );
        }
    }
}

#[test]
fn the_metrics_config_parses_and_validates() {
    let config: MetricsConfig = toml::from_str("listen = \"127.0.0.1:9464\"").unwrap();
    assert_eq!(config.listen, Some("127.0.0.1:9464".parse().unwrap()));
    let padded: MetricsConfig = toml::from_str("listen = \" 127.0.0.1:9464 \"").unwrap();
    assert_eq!(padded.listen, config.listen);
    let none: MetricsConfig = toml::from_str("").unwrap();
    assert_eq!(none.listen, None);
    assert!(none.validate().is_ok());
    let error = toml::from_str::<MetricsConfig>("listen = \"localhost\"")
        .unwrap_err()
        .to_string();
    assert!(error.contains("metrics.listen"), "{error}");
    assert!(toml::from_str::<MetricsConfig>("lisen = \"x\"").is_err());
}
