//! Killable connections, for `Failure::Drop` and shutdown.

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::state::Shared;

/// Lets the fake close a connection from inside a handler. Once killed,
/// every read and write on the connection fails, so hyper gives up on it
/// without sending anything; a parked read is woken so idle keep-alive
/// connections close too.
#[derive(Default)]
pub(super) struct KillSwitch {
    pub(super) killed: AtomicBool,
    pub(super) read_waker: Mutex<Option<Waker>>,
}

impl KillSwitch {
    pub(super) fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        let waker = self
            .read_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub(super) fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    pub(super) fn check(&self) -> io::Result<()> {
        if self.is_killed() {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "killed by the fake Bot API",
            ))
        } else {
            Ok(())
        }
    }
}

/// Per-connection info handed to the handler via `ConnectInfo`.
#[derive(Clone)]
pub(super) struct ConnHandle(pub(super) Arc<KillSwitch>);

impl fmt::Debug for ConnHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnHandle")
            .field("killed", &self.0.is_killed())
            .finish()
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        stream.remote_addr().clone()
    }
}

pub(super) struct KillableListener {
    pub(super) inner: TcpListener,
    /// Weak so the server task doesn't keep the state alive after the
    /// handle is gone.
    pub(super) shared: Weak<Shared>,
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = ConnHandle;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, _)) = self.inner.accept().await else {
                // Transient (e.g. too many open files): back off briefly.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let switch = Arc::new(KillSwitch::default());
            if let Some(shared) = self.shared.upgrade() {
                shared.register_connection(&switch);
            }
            let io = KillableStream {
                inner: stream,
                switch: Arc::clone(&switch),
            };
            return (io, ConnHandle(switch));
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(ConnHandle(Arc::new(KillSwitch::default())))
    }
}

pub(super) struct KillableStream {
    pub(super) inner: TcpStream,
    pub(super) switch: Arc<KillSwitch>,
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Register before checking, so a kill in between still wakes us.
        *self
            .switch
            .read_waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.switch.check()?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
