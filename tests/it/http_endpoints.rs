//! The health and metrics listener over real HTTP on 127.0.0.1: counters
//! move between scrapes, an unhealthy component turns `/healthz` into a 503
//! with its reason, unknown paths are 404, and cancelling the token stops
//! the server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use telegate::http::{
    serve, HealthCheck, HealthReport, HealthServer, StaticHealth, METRICS_CONTENT_TYPE,
};
use telegate::listener::ListenerLimits;
use telegate::metrics::{InboxCounts, Metrics};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const STOP_WITHIN: Duration = Duration::from_secs(5);

struct Server {
    base: String,
    metrics: Metrics,
    health: Arc<StaticHealth>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    bound: SocketAddr,
}

/// The defaults of `[metrics]`.
fn limits() -> ListenerLimits {
    telegate::metrics::MetricsConfig::default().limits()
}

async fn start() -> Server {
    let metrics = Metrics::new();
    let health = Arc::new(StaticHealth::healthy(["updates", "store"]));
    let shutdown = CancellationToken::new();
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = HealthServer::new(metrics.clone(), health.clone());
    let (bound, task) = serve(listen, limits(), server, shutdown.clone())
        .await
        .unwrap();
    assert!(bound.ip().is_loopback());
    assert_ne!(bound.port(), 0, "the real port is reported");
    Server {
        base: format!("http://{bound}"),
        metrics,
        health,
        shutdown,
        task,
        bound,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The value of the unlabelled sample `name` in a scrape.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok())?
        })
}

async fn scrape(client: &reqwest::Client, base: &str) -> String {
    let response = client.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(content_type, METRICS_CONTENT_TYPE);
    assert!(content_type.starts_with("text/plain; version=0.0.4"));
    response.text().await.unwrap()
}

async fn health(client: &reqwest::Client, base: &str) -> (u16, serde_json::Value) {
    let response = client.get(format!("{base}/healthz")).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn counters_move_between_scrapes() {
    let server = start().await;
    let client = client();
    let first = scrape(&client, &server.base).await;
    assert_eq!(sample(&first, "telegate_turns_started_total"), Some(0.0));
    assert!(first.contains("# TYPE telegate_turn_duration_seconds histogram"));

    server.metrics.turns_started.add(3);
    server.metrics.updates_duplicate.inc();
    server.metrics.queue_depth.set(4);
    server.metrics.set_inbox(InboxCounts {
        running: 2,
        ..InboxCounts::default()
    });
    server
        .metrics
        .turn_duration
        .observe(Duration::from_millis(1_500));

    let second = scrape(&client, &server.base).await;
    assert_eq!(sample(&second, "telegate_turns_started_total"), Some(3.0));
    assert_eq!(
        sample(&second, "telegate_updates_duplicate_total"),
        Some(1.0)
    );
    assert_eq!(sample(&second, "telegate_queue_depth"), Some(4.0));
    assert!(second.contains("telegate_inbox_messages{state=\"running\"} 2\n"));
    assert!(second.contains("telegate_turn_duration_seconds_bucket{le=\"2.5\"} 1\n"));
    assert_eq!(
        sample(&second, "telegate_turn_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        sample(&second, "telegate_turn_duration_seconds_sum"),
        Some(1.5)
    );
    server.shutdown.cancel();
}

#[tokio::test]
async fn healthz_is_200_when_everything_is_healthy() {
    let server = start().await;
    let (status, body) = health(&client(), &server.base).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        serde_json::json!({"status": "ok", "updates": "ok", "store": "ok"})
    );
    server.shutdown.cancel();
}

#[tokio::test]
async fn healthz_is_503_with_the_reason_while_a_component_fails() {
    let server = start().await;
    let client = client();
    server
        .health
        .set_failing("store", "database is locked (SQLITE_BUSY)");
    let (status, body) = health(&client, &server.base).await;
    assert_eq!(status, 503);
    assert_eq!(body["status"], "unhealthy");
    assert_eq!(body["updates"], "ok");
    assert_eq!(body["store"], "database is locked (SQLITE_BUSY)");

    server.health.set_ok("store");
    let (status, body) = health(&client, &server.base).await;
    assert_eq!(status, 200, "{body}");
    server.shutdown.cancel();
}

/// A check that never answers.
struct Hanging;

impl HealthCheck for Hanging {
    fn check(&self) -> BoxFuture<'_, HealthReport> {
        Box::pin(futures::future::pending())
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_health_check_is_a_503_not_a_hang() {
    let shutdown = CancellationToken::new();
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = HealthServer::new(Metrics::new(), Arc::new(Hanging));
    let (bound, _task) = serve(listen, limits(), server, shutdown.clone())
        .await
        .unwrap();
    // The paused clock auto-advances past the check timeout once every task
    // waits; the request itself needs no timer.
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{bound}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], "unhealthy");
    assert_eq!(body["health_check"], "timed out");
    shutdown.cancel();
}

#[tokio::test]
async fn unknown_paths_are_404() {
    let server = start().await;
    let client = client();
    for path in ["/", "/health", "/metrics/x", "/healthz/../metrics2"] {
        let response = client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path}");
    }
    server.shutdown.cancel();
}

#[tokio::test]
async fn cancelling_the_token_stops_the_server() {
    let server = start().await;
    let kept_alive = client();
    // A kept-alive connection must not keep the server running.
    scrape(&kept_alive, &server.base).await;
    server.shutdown.cancel();
    tokio::time::timeout(STOP_WITHIN, server.task)
        .await
        .expect("the server stops after cancel")
        .unwrap();
    let refused = tokio::net::TcpStream::connect(server.bound).await;
    assert!(refused.is_err(), "the port is closed after shutdown");
    let fresh = client()
        .get(format!("{}/healthz", server.base))
        .send()
        .await;
    assert!(fresh.is_err(), "no answer after shutdown");
}
