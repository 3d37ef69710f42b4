//! The webhook listener: Telegram POSTs updates; each is checked against the
//! secret token, recorded, handed on, and only then answered with 200.
//!
//! Answering 200 tells Telegram the update is ours. So the answer waits for
//! the inbox write: a crash before it makes Telegram deliver the update
//! again, and a store failure answers 503 so Telegram retries later. A
//! missing or wrong secret gets 401 and touches nothing.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::intake::Intake;
use crate::config::Secret;

#[derive(Clone)]
struct WebhookState {
    intake: Intake,
    secret: Secret,
}

/// Compare without leaking where the first difference is.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn receive(State(state): State<WebhookState>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let given = headers
        .get("x-telegram-bot-api-secret-token")
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !same_secret(given, state.secret.expose().as_bytes()) {
        tracing::warn!("webhook request with a missing or wrong secret refused");
        return StatusCode::UNAUTHORIZED;
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw) => raw,
        Err(error) => {
            tracing::warn!(%error, "webhook body is not JSON; refused");
            return StatusCode::BAD_REQUEST;
        }
    };
    match state.intake.take(raw).await {
        Ok(_) => StatusCode::OK,
        Err(error) => {
            tracing::error!(%error, "could not record a webhook update; Telegram will retry");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

/// Serve the webhook on `listen` at `path` until `stop` fires. Returns the
/// bound address.
pub async fn serve(
    listen: SocketAddr,
    path: &str,
    secret: Secret,
    intake: Intake,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let app = Router::new()
        .route(path, post(receive))
        .with_state(WebhookState { intake, secret });
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "webhook server stopped");
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }
}
