//! The optional health and metrics listener: `GET /healthz` and
//! `GET /metrics` (configured by `[metrics] listen`, see
//! [`crate::metrics::MetricsConfig`]).
//!
//! Why a listener of its own: a supervisor or load balancer needs a cheap
//! "is it alive and connected" probe, and Prometheus needs something to
//! scrape, independently of whether Telegram reaches us by polling or by
//! webhook. [`serve`] binds before it returns, so a caller that asked for
//! port 0 learns the real address, and stops when its
//! [`CancellationToken`] is cancelled. Connections are capped and must
//! send their requests in time ([`crate::listener`], shared with the
//! webhook), so stalled clients cannot starve the probe.
//!
//! This module must never expose a secret or user content (the metrics are
//! numbers, the health body carries component names and short reasons),
//! never accept writes, never log per request, and never let a hanging
//! health check hang the probe: checks get [`CHECK_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::listener::{self, ListenerLimits};
use crate::metrics::Metrics;

/// The `Content-Type` of `/metrics` (Prometheus text format 0.0.4).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long `/healthz` waits for the health check before answering 503.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest reason shown for a failing component, in characters.
const MAX_REASON_CHARS: usize = 200;

/// The state of each component, as a [`HealthCheck`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// `(name, Ok(()) or Err(reason))` per component, e.g. `("store", Ok(()))`.
    /// Reasons are shown to whoever can reach the listener: never put a
    /// secret or user content in them.
    pub components: Vec<(String, Result<(), String>)>,
}

impl HealthReport {
    /// An empty report (healthy: nothing is failing).
    pub fn new() -> Self {
        HealthReport::default()
    }

    /// Add a healthy component.
    pub fn ok(mut self, name: impl Into<String>) -> Self {
        self.components.push((name.into(), Ok(())));
        self
    }

    /// Add a failing component and why.
    pub fn failing(mut self, name: impl Into<String>, reason: impl Into<String>) -> Self {
        self.components.push((name.into(), Err(reason.into())));
        self
    }

    /// Whether every component is healthy.
    pub fn is_healthy(&self) -> bool {
        self.components.iter().all(|(_, state)| state.is_ok())
    }
}

/// Something that can tell whether telegate is healthy.
pub trait HealthCheck: Send + Sync {
    /// Check every component. Should be quick; `/healthz` gives up after
    /// [`CHECK_TIMEOUT`].
    fn check(&self) -> BoxFuture<'_, HealthReport>;
}

/// A health check whose answer is set from outside: components start
/// healthy and are marked failing or healthy again by their owners (or by
/// tests).
#[derive(Debug, Default)]
pub struct StaticHealth {
    components: RwLock<Vec<(String, Result<(), String>)>>,
}

impl StaticHealth {
    /// Every named component healthy.
    pub fn healthy<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let components = names.into_iter().map(|n| (n.into(), Ok(()))).collect();
        StaticHealth {
            components: RwLock::new(components),
        }
    }

    /// Mark `name` healthy (added if unknown).
    pub fn set_ok(&self, name: &str) {
        self.set(name, Ok(()));
    }

    /// Mark `name` failing with `reason` (added if unknown).
    pub fn set_failing(&self, name: &str, reason: impl Into<String>) {
        self.set(name, Err(reason.into()));
    }

    fn set(&self, name: &str, state: Result<(), String>) {
        let mut components = self
            .components
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match components.iter_mut().find(|(n, _)| n == name) {
            Some((_, current)) => *current = state,
            None => components.push((name.to_string(), state)),
        }
    }

    /// The current report.
    pub fn report(&self) -> HealthReport {
        let components = self
            .components
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        HealthReport { components }
    }
}

impl HealthCheck for StaticHealth {
    fn check(&self) -> BoxFuture<'_, HealthReport> {
        let report = self.report();
        Box::pin(async move { report })
    }
}

/// A health check computed by a synchronous closure; see [`health_fn`].
pub struct FnHealth<F>(F);

/// Several named checks as one: each component reported as
/// `<name>.<component>` (several bots' `/healthz`).
pub struct NamedHealth(pub Vec<(String, Arc<dyn HealthCheck>)>);

impl HealthCheck for NamedHealth {
    fn check(&self) -> BoxFuture<'_, HealthReport> {
        Box::pin(async move {
            let mut report = HealthReport::new();
            for (name, check) in &self.0 {
                for (component, state) in check.check().await.components {
                    report
                        .components
                        .push((format!("{name}.{component}"), state));
                }
            }
            report
        })
    }
}

/// A [`HealthCheck`] from a closure, e.g.
/// `health_fn(move || HealthReport::new().ok("updates"))`.
pub fn health_fn<F>(check: F) -> FnHealth<F>
where
    F: Fn() -> HealthReport + Send + Sync,
{
    FnHealth(check)
}

impl<F> HealthCheck for FnHealth<F>
where
    F: Fn() -> HealthReport + Send + Sync,
{
    fn check(&self) -> BoxFuture<'_, HealthReport> {
        let report = (self.0)();
        Box::pin(async move { report })
    }
}

/// The listener's shared state and routes.
#[derive(Clone)]
pub struct HealthServer {
    metrics: Exposition,
    health: Arc<dyn HealthCheck>,
}

/// What `/metrics` renders: one registry, or several bots' labelled.
#[derive(Clone)]
enum Exposition {
    One(Metrics),
    PerBot(Arc<Vec<(String, Metrics)>>),
}

impl HealthServer {
    /// Serve `metrics` and `health`.
    pub fn new(metrics: Metrics, health: Arc<dyn HealthCheck>) -> Self {
        HealthServer {
            metrics: Exposition::One(metrics),
            health,
        }
    }

    /// Serve several bots: each one's metrics with a `bot` label
    /// ([`crate::metrics::render_labelled`]), and `health`.
    pub fn per_bot(bots: Vec<(String, Metrics)>, health: Arc<dyn HealthCheck>) -> Self {
        HealthServer {
            metrics: Exposition::PerBot(Arc::new(bots)),
            health,
        }
    }

    /// The routes: `GET /healthz`, `GET /metrics`, 404 for anything else.
    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .fallback(not_found)
            .with_state(self)
    }
}

/// Bind `listen`, then serve [`HealthServer`]'s routes within `limits`
/// until `shutdown` is cancelled. Returns the bound address (the real port
/// when `listen` asked for port 0) and the server task, which ends once
/// in-flight requests are answered.
pub async fn serve(
    listen: SocketAddr,
    limits: ListenerLimits,
    server: HealthServer,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), std::io::Error> {
    let (tcp, bound) = listener::bind(listen).await?;
    let task = listener::serve(tcp, server.router(), limits, "health/metrics", shutdown);
    tracing::info!(%bound, "health and metrics listener started");
    Ok((bound, task))
}

async fn healthz(State(server): State<HealthServer>) -> Response {
    let report = match tokio::time::timeout(CHECK_TIMEOUT, server.health.check()).await {
        Ok(report) => report,
        Err(_) => HealthReport::new().failing("health_check", "timed out"),
    };
    let status = if report.is_healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = health_body(&report);
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response()
}

async fn metrics(State(server): State<HealthServer>) -> Response {
    let text = match &server.metrics {
        Exposition::One(metrics) => metrics.render_prometheus(),
        Exposition::PerBot(bots) => crate::metrics::render_labelled(bots),
    };
    let headers = [
        (header::CONTENT_TYPE, METRICS_CONTENT_TYPE),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (StatusCode::OK, headers, text).into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

/// `{"status":"ok"|"unhealthy", "<component>":"ok"|"<reason>", …}`.
///
/// A failing component's value is its reason (never exactly `"ok"`); when
/// one name is reported twice, a failure wins over `ok`. `status` is
/// always the overall verdict, even if a component is named `status`.
fn health_body(report: &HealthReport) -> Value {
    let mut body = Map::new();
    for (name, state) in &report.components {
        let value = match state {
            Ok(()) => "ok".to_string(),
            Err(reason) => shown_reason(reason),
        };
        let keep_failure = body.get(name).is_some_and(|v| v != "ok");
        if !keep_failure {
            body.insert(name.clone(), Value::String(value));
        }
    }
    let verdict = if report.is_healthy() {
        "ok"
    } else {
        "unhealthy"
    };
    body.insert("status".to_string(), Value::String(verdict.to_string()));
    Value::Object(body)
}

/// A reason as shown: one line, bounded, and never `"ok"` or empty.
fn shown_reason(reason: &str) -> String {
    let line: String = reason
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_REASON_CHARS)
        .collect();
    match line.as_str() {
        "" => "unhealthy".to_string(),
        "ok" => "unhealthy: ok".to_string(),
        _ => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_report_says_ok_everywhere() {
        let report = HealthReport::new().ok("updates").ok("store");
        let body = health_body(&report);
        assert_eq!(
            body,
            serde_json::json!({"status": "ok", "updates": "ok", "store": "ok"})
        );
    }

    #[test]
    fn a_failing_component_shows_its_reason_and_wins_over_ok() {
        let report = HealthReport::new()
            .ok("updates")
            .failing("store", "database\nis locked")
            .ok("store");
        let body = health_body(&report);
        assert_eq!(body["status"], "unhealthy");
        assert_eq!(body["updates"], "ok");
        assert_eq!(body["store"], "database is locked");
    }

    #[test]
    fn a_failure_never_reads_as_ok_and_status_cannot_be_spoofed() {
        let report = HealthReport::new()
            .failing("a", "ok")
            .failing("b", "  ")
            .ok("status");
        let body = health_body(&report);
        assert_eq!(body["a"], "unhealthy: ok");
        assert_eq!(body["b"], "unhealthy");
        assert_eq!(body["status"], "unhealthy");
    }

    #[test]
    fn long_reasons_are_cut() {
        let reason = "x".repeat(10_000);
        assert_eq!(shown_reason(&reason).chars().count(), MAX_REASON_CHARS);
    }

    #[test]
    fn static_health_can_fail_and_recover() {
        let health = StaticHealth::healthy(["updates", "store"]);
        health.set_failing("store", "disk full");
        assert!(!health.report().is_healthy());
        health.set_ok("store");
        assert!(health.report().is_healthy());
        assert_eq!(health.report().components.len(), 2);
    }
}
