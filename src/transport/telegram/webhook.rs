//! The webhook listener: Telegram POSTs updates; each is checked against the
//! secret token, recorded, fed to the dispatcher's inbox listener (only if
//! new), and only then answered with 200.
//!
//! Answering 200 tells Telegram the update is ours. So the answer waits for
//! the inbox write: a crash before it makes Telegram deliver the update
//! again, and a store failure answers 503 so Telegram retries later. A
//! missing or wrong secret gets 401 and touches nothing: the secret is
//! checked on the request's head, before a byte of its body is read, so a
//! stranger cannot make the listener wait for (or hold) a body. A body
//! longer than [`MAX_UPDATE_BYTES`] gets 413, one that does not arrive in
//! time 408 (the connection cap and the read deadlines are
//! [`crate::listener`]'s, shared with the metrics listener).
//!
//! Several bots of one process share a listener per address
//! ([`WebhookHub`]): each bot's path leads to its own secret and intake, so
//! a post with one bot's secret on another bot's path is refused like any
//! wrong secret, and an unknown path is 404.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::intake::Intake;
use super::parse::RawUpdate;
use crate::listener::{self, BodyError, ListenerLimits};
use crate::secrets::Secret;

/// The largest update body read (Telegram's are a few kilobytes; this is
/// axum's default limit, which the webhook had before).
pub const MAX_UPDATE_BYTES: usize = 2 * 1024 * 1024;

/// The header carrying the webhook's secret.
const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

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

/// Whether the request's head carries the secret.
fn has_secret(headers: &HeaderMap, secret: &Secret) -> bool {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    same_secret(given, secret.expose().as_bytes())
}

async fn receive(State(state): State<WebhookState>, request: Request) -> StatusCode {
    receive_for(&state, request).await
}

async fn receive_for(state: &WebhookState, request: Request) -> StatusCode {
    // The head first: the body of a request without the secret is never
    // read (answering drops it, and hyper closes the connection).
    if !has_secret(request.headers(), &state.secret) {
        tracing::warn!("webhook request with a missing or wrong secret refused");
        return StatusCode::UNAUTHORIZED;
    }
    let body = match listener::read_body(request.into_body(), MAX_UPDATE_BYTES).await {
        Ok(body) => body,
        Err(error) => {
            tracing::warn!(%error, "webhook body refused");
            return match error {
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::TimedOut => StatusCode::REQUEST_TIMEOUT,
                BodyError::Broken => StatusCode::BAD_REQUEST,
            };
        }
    };
    let raw: RawUpdate = match serde_json::from_slice(&body) {
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

/// Where and how the webhook listens.
pub struct WebhookListen<'a> {
    /// The address to bind.
    pub listen: SocketAddr,
    /// The path Telegram posts to.
    pub path: &'a str,
    /// The connection cap and read deadlines.
    pub limits: ListenerLimits,
}

/// Serve the webhook until `stop` fires. Returns the bound address and
/// the server task (which ends once its connections are drained).
pub async fn serve(
    at: WebhookListen<'_>,
    secret: Secret,
    intake: Intake,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let app = Router::new()
        .route(at.path, post(receive))
        .with_state(WebhookState { intake, secret });
    let (tcp, bound) = listener::bind(at.listen).await?;
    let task = listener::serve(tcp, app, at.limits, "webhook", stop);
    Ok((bound, task))
}

/// The paths of one shared listener: each bot's secret and intake.
type Routes = Arc<RwLock<HashMap<String, WebhookState>>>;

/// The webhook listeners of a process running several bots: bound once
/// per address before the bots start, each bot adding its path
/// ([`WebhookHub::route`]) and taking it away when it stops.
#[derive(Clone, Default)]
pub struct WebhookHub {
    listeners: Arc<HashMap<SocketAddr, (SocketAddr, Routes)>>,
}

impl std::fmt::Debug for WebhookHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookHub")
            .field("listeners", &self.listeners.len())
            .finish()
    }
}

impl WebhookHub {
    /// Bind each address (with the connection cap and deadlines given
    /// for it), serving until `stop`: the hub, and the listeners' tasks.
    pub async fn bind(
        addresses: &[(SocketAddr, ListenerLimits)],
        stop: CancellationToken,
    ) -> std::io::Result<(WebhookHub, Vec<JoinHandle<()>>)> {
        let mut listeners = HashMap::new();
        let mut tasks = Vec::new();
        for (listen, limits) in addresses {
            if listeners.contains_key(listen) {
                continue;
            }
            let routes: Routes = Arc::default();
            let app = Router::new()
                .fallback(receive_routed)
                .with_state(routes.clone());
            let (tcp, bound) = listener::bind(*listen).await?;
            tasks.push(listener::serve(tcp, app, *limits, "webhook", stop.clone()));
            listeners.insert(*listen, (bound, routes));
        }
        let hub = WebhookHub {
            listeners: Arc::new(listeners),
        };
        Ok((hub, tasks))
    }

    /// Take `at.path` on the listener bound for `at.listen` until `stop`:
    /// where it listens, and a task that ends once the path is given up.
    pub fn route(
        &self,
        at: WebhookListen<'_>,
        secret: Secret,
        intake: Intake,
        stop: CancellationToken,
    ) -> Result<(SocketAddr, JoinHandle<()>), String> {
        let Some((bound, routes)) = self.listeners.get(&at.listen) else {
            return Err(format!("no webhook listener was bound on {}", at.listen));
        };
        let path = at.path.to_string();
        {
            let mut table = routes.write().unwrap_or_else(PoisonError::into_inner);
            if table.contains_key(&path) {
                return Err(format!("the webhook path {path} on {} is taken", at.listen));
            }
            table.insert(path.clone(), WebhookState { intake, secret });
        }
        let routes = routes.clone();
        let task = tokio::spawn(async move {
            stop.cancelled().await;
            routes
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&path);
        });
        Ok((*bound, task))
    }
}

/// A shared listener's request: to the bot whose path it names (404 for
/// none, 405 for anything but a POST), then as on a bot's own listener.
async fn receive_routed(State(routes): State<Routes>, request: Request) -> StatusCode {
    let state = routes
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(request.uri().path())
        .cloned();
    match state {
        None => StatusCode::NOT_FOUND,
        Some(_) if request.method() != Method::POST => StatusCode::METHOD_NOT_ALLOWED,
        Some(state) => receive_for(&state, request).await,
    }
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
