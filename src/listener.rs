//! How telegate serves HTTP: the one accept loop behind the webhook and the
//! health/metrics listener, with a cap on connections and read deadlines.
//!
//! Why not `axum::serve`: it has no header read timeout (hyper's needs a
//! timer, which it does not set), no body deadline and no connection cap,
//! so a thousand clients that send half a request and stall keep every
//! connection, and with it a file descriptor, until the process runs out
//! (`EMFILE`): nothing is accepted any more, `/healthz` included.
//!
//! What holds for every connection served here ([`serve`]):
//!
//! * at most [`ListenerLimits::max_connections`] at once; a connection
//!   beyond the cap is closed as soon as it is accepted (the client sees
//!   the close at once, instead of hanging in the kernel's backlog);
//! * a request's head (request line and headers) must arrive within
//!   [`ListenerLimits::header_timeout`], counted from the connection or the
//!   end of the previous request (an idle keep-alive connection is closed
//!   after that time too): hyper's `header_read_timeout`;
//! * a request's whole body must arrive within
//!   [`ListenerLimits::body_timeout`] of its head ([`DeadlineBody`]; not
//!   reset by each chunk, so trickling a byte at a time does not help);
//!   [`read_body`] also caps its size;
//! * HTTP/1.1 only (Telegram and Prometheus speak it; no h2 upgrade);
//! * on shutdown, requests in flight are answered, idle connections are
//!   closed, and whatever is left after [`drain_bound`] is cut off.
//!
//! [`raise_open_files_limit`] lifts the soft `RLIMIT_NOFILE` to the hard
//! one at start, so the caps, not the default 1024 descriptors, decide.
//!
//! This module must never read a body a handler did not ask for, never log
//! per request or per refused connection (a flood would flood the log: a
//! full listener is logged when it fills up, at most once per
//! [`FULL_LOG_INTERVAL`]), and never let an accept error end the loop.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::Router;
use futures::StreamExt;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// A full listener is logged at most this often.
pub const FULL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How long the loop waits after an accept error other than a failed
/// handshake (out of file descriptors, out of memory) before accepting
/// again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Largest accepted `connection_limit`.
const MAX_CONNECTION_LIMIT: usize = 65_536;
/// Largest accepted `header_timeout_secs` / `body_timeout_secs`.
const MAX_TIMEOUT_SECS: u64 = 600;

/// What one listener allows; see the module docs for what each bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Connections served at once; more are closed when accepted.
    pub max_connections: usize,
    /// Time for a request's head to arrive.
    pub header_timeout: Duration,
    /// Time for a request's whole body to arrive, from its head.
    pub body_timeout: Duration,
}

impl ListenerLimits {
    /// Limits from a config table's `connection_limit`,
    /// `header_timeout_secs` and `body_timeout_secs`.
    pub fn from_settings(settings: &LimitSettings) -> Self {
        ListenerLimits {
            max_connections: settings.connection_limit,
            header_timeout: Duration::from_secs(settings.header_timeout_secs),
            body_timeout: Duration::from_secs(settings.body_timeout_secs),
        }
    }
}

/// The keys every listener's config table has (`[telegram.webhook]`,
/// `[metrics]`), as written; [`ListenerLimits::from_settings`] reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSettings {
    /// `connection_limit`.
    pub connection_limit: usize,
    /// `header_timeout_secs`.
    pub header_timeout_secs: u64,
    /// `body_timeout_secs`.
    pub body_timeout_secs: u64,
}

impl LimitSettings {
    /// Check the values; `table` names the config table in the message
    /// (e.g. `"metrics"`).
    pub fn validate(&self, table: &str) -> Result<(), String> {
        if !(1..=MAX_CONNECTION_LIMIT).contains(&self.connection_limit) {
            return Err(format!(
                "{table}.connection_limit {} is out of range: use 1 to {MAX_CONNECTION_LIMIT}",
                self.connection_limit
            ));
        }
        for (key, secs) in [
            ("header_timeout_secs", self.header_timeout_secs),
            ("body_timeout_secs", self.body_timeout_secs),
        ] {
            if !(1..=MAX_TIMEOUT_SECS).contains(&secs) {
                return Err(format!(
                    "{table}.{key} {secs} is out of range: use 1 to {MAX_TIMEOUT_SECS} seconds"
                ));
            }
        }
        Ok(())
    }
}

/// How long a stopping listener waits for its connections: a request in
/// flight has had its head and body deadlines, and its handler gets this
/// much again.
pub fn drain_bound(limits: &ListenerLimits) -> Duration {
    limits.header_timeout + limits.body_timeout + Duration::from_secs(5)
}

/// Bind `listen`. Separate from [`serve`] so that a caller that asked for
/// port 0 learns the real address before anything is served.
pub async fn bind(listen: SocketAddr) -> io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// Serve `router` on `listener` within `limits` until `shutdown` is
/// cancelled; `name` names the listener in the log. The task ends once
/// the connections are drained (see [`drain_bound`]).
pub fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    name: &'static str,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(accept_loop(listener, router, limits, name, shutdown))
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    name: &'static str,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut full_logged: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            // Reap finished connection tasks so the set stays small.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) if is_handshake_error(&error) => continue,
            Err(error) => {
                tracing::warn!(listener = name, %error, "cannot accept connections; retrying");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Full: closed at once (dropping the stream closes it).
            drop(stream);
            if full_logged.is_none_or(|at| at.elapsed() >= FULL_LOG_INTERVAL) {
                full_logged = Some(Instant::now());
                tracing::warn!(
                    listener = name,
                    limit = limits.max_connections,
                    "connection limit reached: new connections are closed until some finish"
                );
            }
            continue;
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .serve_connection(TokioIo::new(stream), service(router.clone(), limits));
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            // A client that hangs up or times out is no error of ours.
            if let Err(error) = connection.await {
                tracing::trace!(listener = name, %error, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain_bound(&limits), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            "connections still open after the drain bound are cut off"
        );
    }
    connections.shutdown().await;
}

/// Errors of one connection's handshake, not of the listener.
fn is_handshake_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The hyper service of one connection: each request's body gets its
/// deadline, then the router answers.
fn service(
    router: Router,
    limits: ListenerLimits,
) -> impl hyper::service::Service<
    hyper::Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let deadline = Instant::now() + limits.body_timeout;
        let request: Request = request.map(|body| Body::new(DeadlineBody::new(body, deadline)));
        router.clone().oneshot(request)
    })
}

/// The body did not arrive within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimedOut;

/// A request body that fails with [`BodyTimedOut`] once `deadline` passes
/// (the whole body, not each chunk). The timer starts only when a handler
/// reads the body.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> DeadlineBody<B> {
    /// `inner`, due complete by `deadline`.
    pub fn new(inner: B, deadline: Instant) -> Self {
        DeadlineBody {
            inner,
            deadline,
            sleep: None,
        }
    }
}

impl<B> HttpBody for DeadlineBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why [`read_body`] gave up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the limit (declared or sent).
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// Not complete within the listener's body timeout.
    #[error("the request body did not arrive in time")]
    TimedOut,
    /// The connection broke or the framing was invalid.
    #[error("the request body could not be read")]
    Broken,
}

/// Read a whole body of at most `limit` bytes. A declared length over the
/// limit is refused before anything is read.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge(limit));
    }
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|error| body_error(&error))?;
        if bytes.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(bytes))
}

fn body_error(error: &axum::Error) -> BodyError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if current.is::<BodyTimedOut>() {
            return BodyError::TimedOut;
        }
        cause = current.source();
    }
    BodyError::Broken
}

/// The open-files limits before and after [`raise_open_files_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now (the hard limit, unless raising failed).
    pub now: u64,
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (the default soft
/// limit, 1024, is far below what the listeners' caps and the store need
/// under load; the hard limit is what the administrator allows). Call at
/// start; children inherit the raised limit, as they would
/// `LimitNOFILE=` of the systemd unit.
pub fn raise_open_files_limit() -> io::Result<OpenFiles> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(OpenFiles {
            before,
            now: before,
        });
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OpenFiles {
        before,
        now: limit.rlim_max,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(connection_limit: usize, header: u64, body: u64) -> LimitSettings {
        LimitSettings {
            connection_limit,
            header_timeout_secs: header,
            body_timeout_secs: body,
        }
    }

    #[test]
    fn limits_out_of_range_are_refused_with_their_key() {
        assert!(settings(64, 10, 10).validate("metrics").is_ok());
        let zero = settings(0, 10, 10).validate("metrics").unwrap_err();
        assert!(zero.contains("metrics.connection_limit 0"), "{zero}");
        let huge = settings(MAX_CONNECTION_LIMIT + 1, 10, 10).validate("m");
        assert!(huge.is_err());
        let header = settings(1, 0, 10).validate("telegram.webhook").unwrap_err();
        assert!(
            header.contains("telegram.webhook.header_timeout_secs 0"),
            "{header}"
        );
        let body = settings(1, 10, MAX_TIMEOUT_SECS + 1)
            .validate("m")
            .unwrap_err();
        assert!(body.contains("m.body_timeout_secs"), "{body}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_times_out_and_one_that_arrives_is_read() {
        let part = futures::stream::once(async { Ok::<_, io::Error>(Bytes::from_static(b"part")) });
        let body = Body::from_stream(part.chain(futures::stream::pending()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let reading = tokio::spawn(read_body(Body::new(DeadlineBody::new(body, deadline)), 100));
        // Never finished: the deadline ends it, however long it was fed.
        assert_eq!(reading.await.unwrap(), Err(BodyError::TimedOut));

        let complete = Body::new(DeadlineBody::new(Body::from("whole"), Instant::now()));
        assert_eq!(
            read_body(complete, 100).await.unwrap(),
            Bytes::from_static(b"whole")
        );
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        assert_eq!(
            read_body(Body::from("0123456789"), 9).await,
            Err(BodyError::TooLarge(9))
        );
        assert_eq!(
            read_body(Body::from("012345678"), 9).await.unwrap().len(),
            9
        );
    }

    fn open_files() -> libc::rlimit {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in raise_open_files_limit.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        limit
    }

    #[test]
    fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
        // One below the hard limit (so that other tests of this process
        // keep their room), then raised.
        let hard = open_files().rlim_max;
        let lowered = libc::rlimit {
            rlim_cur: hard - 1,
            rlim_max: hard,
        };
        // SAFETY: as in raise_open_files_limit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        let raised = raise_open_files_limit().unwrap();
        assert_eq!(
            raised,
            OpenFiles {
                before: hard - 1,
                now: hard
            }
        );
        assert_eq!(open_files().rlim_cur, hard);
        // Already at the hard limit: nothing to do.
        let again = raise_open_files_limit().unwrap();
        assert_eq!(
            again,
            OpenFiles {
                before: hard,
                now: hard
            }
        );
    }
}
