//! The console transport: `telegate console`.
//!
//! Lines from stdin become messages of one local chat; replies are printed as
//! they arrive. It goes through the very same adapter and runner as Telegram,
//! so /stop, /new and queueing behave exactly as they do there. Works
//! interactively (with a prompt) and from a pipe (no prompt; at end of input
//! it waits for the running and queued turns to finish before exiting).

use std::io::Write;
use std::sync::{Mutex, PoisonError};

use futures::future::BoxFuture;

use crate::reply::{DeliveryError, Outbound, Reply, ReplyKind};
use crate::vocab::SessionSource;

/// Prints replies to a writer (stdout in the binary, a buffer in tests).
pub struct ConsoleOutbound {
    out: Mutex<Box<dyn Write + Send>>,
}

impl ConsoleOutbound {
    /// Print to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        ConsoleOutbound {
            out: Mutex::new(out),
        }
    }
}

/// How a reply is printed: notices and errors are marked so they stand out
/// from answers.
pub fn render_reply(reply: &Reply) -> String {
    match reply.kind {
        ReplyKind::Answer | ReplyKind::Command => reply.text.clone(),
        ReplyKind::Notice => format!("[{}]", reply.text),
        ReplyKind::Error => format!("[error] {}", reply.text),
    }
}

impl Outbound for ConsoleOutbound {
    fn deliver<'a>(
        &'a self,
        _to: &'a SessionSource,
        reply: Reply,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
            writeln!(out, "{}", render_reply(&reply))
                .and_then(|()| out.flush())
                .map_err(|e| DeliveryError::Unavailable(e.to_string()))
        })
    }
}
